//! The TaskRun controller against a real kube-apiserver + etcd (one pair for this test binary, shared by its
//! tests) and a real nats-server per test. The tests play the devices: they write `device-info` (with or without
//! `AptFullUpgradeV1`) and `system-upgrade-status` keys as the agent would. Each test labels its objects
//! `fleet-test=<id>`, puts its TaskRuns in a namespace of its own and runs its operators with that label selector.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use async_nats::jetstream::{self, kv};
use fleet_operator::crd::tasks::TaskRun;
use fleet_operator::crd::{Device, DeviceGroup};
use fleet_operator::tasks::controller::{self, Options};
use fleet_rig::NatsServer;
use fleet_wire::kv as layout;
use fleet_wire::taskrun::plan_manifest_key;
use fleet_wire::{
    fixtures, AttemptId, Capability, DeviceId, SystemUpgradeAttempt, SystemUpgradePhase,
    SystemUpgradeStatus, TaskPlanManifest, TaskRunPhase, TaskRunReason, Timestamp,
};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use std::time::Duration;

mod kube_common;
use kube_common::{eventually, Fleet, API};

/// The TaskRun controller run alone, on a runtime of its own with its own device-info mirror (main runs it on the
/// operator's shared runtime).
fn spawn_controller(
    client: kube::Client,
    opts: controller::Options,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let rt = fleet_operator::runtime::Runtime::new(
            client,
            &opts.label_selector,
            &opts.nats_url,
            opts.nats.clone(),
        );
        let _ = controller::run_with(&rt, opts, controller::DeviceInfoSource::Own).await;
    })
}

impl Fleet {
    /// [`Fleet::start`], the buckets and a namespace of this test's own (named `run`).
    async fn new(id: &str) -> Self {
        let f = Fleet::start(id).await;
        // The buckets exactly as the operator creates them, so the test can write device keys first.
        fleet_operator::kv::ensure_buckets(&f.js, &Default::default())
            .await
            .expect("buckets");
        Api::<Namespace>::all(f.client.clone())
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": f.run}})).unwrap(),
            )
            .await
            .expect("namespace");
        f
    }

    fn options(&self, n: usize) -> Options {
        Options {
            nats_url: self.nats.url(),
            instance: Some(format!("op-{n}")),
            label_selector: Some(format!("fleet-test={}", self.run)),
            accept_timeout: fleet_operator::tasks::stall::DEFAULT_ACCEPT_TIMEOUT,
            nats: Default::default(),
        }
    }

    fn start_operator(&mut self) {
        let (client, opts) = (self.client.clone(), self.options(self.operators.len()));
        self.operators.push(spawn_controller(client, opts));
    }

    /// [`Self::start_operator`] with `--task-accept-timeout` set to `timeout`.
    fn start_operator_accepting_within(&mut self, timeout: Duration) {
        let (client, mut opts) = (self.client.clone(), self.options(self.operators.len()));
        opts.accept_timeout = timeout;
        self.operators.push(spawn_controller(client, opts));
    }

    /// A Device object with `labels`, and its `device-info` (with `AptFullUpgradeV1` when `capable`).
    async fn device(&self, base: &str, labels: serde_json::Value, capable: bool) -> DeviceId {
        let name = self.name(base);
        let d: Device = serde_json::from_value(json!({
            "apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "Device",
            "metadata": {"name": name, "labels": self.labels(labels)}, "spec": {}
        }))
        .unwrap();
        Api::<Device>::all(self.client.clone())
            .create(&PostParams::default(), &d)
            .await
            .expect("device");
        let mut info = fixtures::device_info();
        info.device_id = DeviceId::try_from(name.as_str()).unwrap();
        info.capabilities = match capable {
            true => vec![Capability::AgentUpgradeV1, Capability::AptFullUpgradeV1],
            false => vec![Capability::AgentUpgradeV1],
        };
        self.bucket(layout::DEVICE_INFO)
            .await
            .put(name.as_str(), serde_json::to_vec(&info).unwrap().into())
            .await
            .expect("info");
        info.device_id
    }

    async fn relabel(&self, device: &DeviceId, labels: serde_json::Value) {
        Api::<Device>::all(self.client.clone())
            .patch(
                device.as_str(),
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": labels}})),
            )
            .await
            .expect("relabel");
    }

    /// A DeviceGroup of this test's devices labelled `member=<base>`.
    async fn group(&self, base: &str) -> String {
        let name = self.name(base);
        let g: DeviceGroup = serde_json::from_value(json!({
            "apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "DeviceGroup",
            "metadata": {"name": name, "labels": self.labels(json!({}))},
            "spec": {"selector": {"matchLabels": {"fleet-test": self.run, "member": base}}}
        }))
        .unwrap();
        Api::<DeviceGroup>::all(self.client.clone())
            .create(&PostParams::default(), &g)
            .await
            .expect("group");
        name
    }

    fn runs(&self) -> Api<TaskRun> {
        Api::namespaced(self.client.clone(), &self.run)
    }

    /// Creates a TaskRun as a person would (the seed's example shape) and returns its UID.
    async fn task_run(&self, name: &str, spec: serde_json::Value) -> AttemptId {
        let r: TaskRun = serde_json::from_value(json!({
            "apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "TaskRun",
            "metadata": {"name": name, "labels": self.labels(json!({}))}, "spec": spec
        }))
        .unwrap();
        let r = self
            .runs()
            .create(&PostParams::default(), &r)
            .await
            .expect("task run");
        AttemptId::try_from(r.metadata.uid.unwrap().as_str()).unwrap()
    }

    async fn phase(&self, name: &str, want: TaskRunPhase) -> fleet_wire::TaskRunStatus {
        eventually(&format!("TaskRun {name} {want:?}"), || async {
            let s = self.runs().get(name).await.ok()?.status?.run;
            (s.phase == Some(want)).then_some(s)
        })
        .await
    }

    async fn bucket(&self, name: &str) -> kv::Store {
        self.js.get_key_value(name).await.expect("bucket")
    }

    async fn intent(&self, d: &DeviceId, run: &AttemptId) -> Option<SystemUpgradeAttempt> {
        let v = self
            .bucket(layout::SYSTEM_UPGRADE_INTENT)
            .await
            .get(layout::run_key(d, run))
            .await
            .expect("get")?;
        Some(serde_json::from_slice(&v).expect("attempt"))
    }

    /// Plays the device's agent: publishes a terminal status for `run`.
    async fn report(&self, d: &DeviceId, run: &AttemptId, ok: bool, heartbeat: Option<Timestamp>) {
        let mut s: SystemUpgradeStatus = fixtures::system_status();
        s.run_uid = *run;
        s.device_id = d.clone();
        s.accepted_at = Timestamp::now();
        s.completed_at = Some(Timestamp::now());
        s.first_heartbeat_after_completion = heartbeat;
        if !ok {
            s.phase = SystemUpgradePhase::Failed;
            s.reason = Some(fleet_wire::SystemUpgradeReason::AptFailed);
            s.error = Some(fleet_wire::BoundedText::lossy(
                "apt-get full-upgrade exited with 100",
            ));
        }
        self.bucket(layout::SYSTEM_UPGRADE_STATUS)
            .await
            .put(
                layout::run_key(d, run),
                serde_json::to_vec(&s).unwrap().into(),
            )
            .await
            .expect("status");
    }

    async fn succeed(&self, d: &DeviceId, run: &AttemptId) {
        self.report(d, run, true, Some(Timestamp::now())).await;
    }

    async fn stream_state(&self, bucket: &str) -> (u64, u64) {
        let mut s = self
            .js
            .get_stream(format!("KV_{bucket}"))
            .await
            .expect("stream");
        let st = s.info().await.expect("info").state.clone();
        (st.messages, st.last_sequence)
    }

    /// Starts the real `fleet-operator` binary for this test's objects; its log goes to `<dir>/<name>.log`.
    fn spawn_binary(&self, dir: &std::path::Path, name: &str) -> std::process::Child {
        self.spawn_binary_env(dir, name, &[])
    }

    /// [`Self::spawn_binary`] with extra environment variables.
    fn spawn_binary_env(
        &self,
        dir: &std::path::Path,
        name: &str,
        env: &[(&str, &str)],
    ) -> std::process::Child {
        let api = API.get().expect("apiserver");
        let kubeconfig = dir.join("kubeconfig");
        // The apiserver's own CA verifies it: no test turns certificate verification off.
        std::fs::write(&kubeconfig, api.kubeconfig(api.token())).unwrap();
        let log = std::fs::File::create(dir.join(format!("{name}.log"))).unwrap();
        std::process::Command::new(env!("CARGO_BIN_EXE_fleet-operator"))
            .env("KUBECONFIG", &kubeconfig)
            .env("FLEET_NATS_URL", self.nats.url())
            .env("FLEET_LABEL_SELECTOR", format!("fleet-test={}", self.run))
            .env("POD_NAME", name)
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start fleet-operator")
    }

    async fn events(&self, object: &str) -> Vec<(String, String)> {
        let events: Api<k8s_openapi::api::events::v1::Event> =
            Api::namespaced(self.client.clone(), &self.run);
        let list = events.list(&Default::default()).await.expect("events");
        list.items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(object))
            .map(|e| (e.type_.unwrap_or_default(), e.reason.unwrap_or_default()))
            .collect()
    }
}

fn spec(group: &str, deadline: u64) -> serde_json::Value {
    json!({"allowedGroups": [group], "targetSelector": {}, "deadlineSeconds": deadline, "systemUpgradeV1": {}})
}

/// What a person does: label devices, create a TaskRun, watch it with kubectl. Canaries are released first and
/// alone; once they succeed the rest follow; terminal intents are removed and statuses kept; the run completes
/// with bounded counts. Devices without `AptFullUpgradeV1` or outside the group are not planned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canaries_first_then_the_rest_complete() {
    let mut f = Fleet::new("complete").await;
    let group = f.group("prod").await;
    let c = f
        .device("c1", json!({"member": "prod", "canary": "true"}), true)
        .await;
    let o1 = f.device("o1", json!({"member": "prod"}), true).await;
    let o2 = f
        .device("o2", json!({"member": "prod", "canary": "false"}), true)
        .await;
    let old = f
        .device("old", json!({"member": "prod", "canary": "true"}), false)
        .await;
    let outside = f.device("out", json!({"member": "other"}), true).await;
    f.start_operator();
    let run = f.task_run("upgrade", spec(&group, 21600)).await;

    let s = f.phase("upgrade", TaskRunPhase::Running).await;
    assert_eq!((s.targets, s.succeeded, s.failed), (3, 0, 0));
    let plans = f.bucket(layout::TASK_PLANS).await;
    let m: TaskPlanManifest =
        serde_json::from_slice(&plans.get(plan_manifest_key(&run)).await.unwrap().unwrap())
            .unwrap();
    assert_eq!((m.canaries, m.others, m.chunks.len()), (1, 2, 1));
    let a = eventually("canary intent", || async { f.intent(&c, &run).await }).await;
    assert_eq!(a.run_uid, run);
    let created = f
        .runs()
        .get("upgrade")
        .await
        .unwrap()
        .metadata
        .creation_timestamp
        .unwrap();
    assert_eq!(
        a.expires_at.unix_ms() / 1000,
        (created.0.as_millisecond() / 1000 + 21600) as u64,
        "expiresAt = creation + deadlineSeconds"
    );
    // why: no event marks a pass that released nothing; a few of the operator's passes is the window
    tokio::time::sleep(Duration::from_millis(800)).await;
    for d in [&o1, &o2, &old, &outside] {
        assert!(
            f.intent(d, &run).await.is_none(),
            "{d} released before the canary succeeded"
        );
    }

    f.succeed(&c, &run).await;
    eventually("the others released", || async {
        Some((f.intent(&o1, &run).await?, f.intent(&o2, &run).await?))
    })
    .await;
    eventually("the canary's terminal intent removed", || async {
        f.intent(&c, &run).await.is_none().then_some(())
    })
    .await;
    eventually("the canary counted", || async {
        let s = f.runs().get("upgrade").await.ok()?.status?.run;
        (s.phase == Some(TaskRunPhase::Running) && s.succeeded == 1).then_some(())
    })
    .await;
    f.succeed(&o1, &run).await;
    f.succeed(&o2, &run).await;
    let s = f.phase("upgrade", TaskRunPhase::Complete).await;
    assert_eq!(
        (s.targets, s.succeeded, s.failed, s.reason),
        (3, 3, 0, None)
    );
    assert!(s.start_time.is_some() && s.completion_time.is_some());
    eventually("every terminal intent removed", || async {
        (f.intent(&o1, &run).await.is_none() && f.intent(&o2, &run).await.is_none()).then_some(())
    })
    .await;
    let statuses = f.bucket(layout::SYSTEM_UPGRADE_STATUS).await;
    for d in [&c, &o1, &o2] {
        assert!(
            statuses
                .get(layout::run_key(d, &run))
                .await
                .unwrap()
                .is_some(),
            "status kept"
        );
    }
    // Normal events for the phases a person follows
    let events = f.events("upgrade").await;
    assert!(
        events.contains(&("Normal".into(), "Running".into())),
        "{events:?}"
    );
    assert!(
        events.contains(&("Normal".into(), "Complete".into())),
        "{events:?}"
    );

    // The buckets are file-backed, keep one value per key and have byte and age limits.
    for (bucket, max_value, age_days) in [
        (layout::SYSTEM_UPGRADE_INTENT, 1024, 30),
        (layout::SYSTEM_UPGRADE_STATUS, 8 * 1024, 90),
        (layout::TASK_PLANS, 1024 * 1024, 90),
    ] {
        let mut stream = f.js.get_stream(format!("KV_{bucket}")).await.unwrap();
        let c = stream.info().await.unwrap().config.clone();
        let spec = layout::bucket(bucket).unwrap();
        assert_eq!(c.storage, jetstream::stream::StorageType::File, "{bucket}");
        assert_eq!(c.max_messages_per_subject, 1, "{bucket}");
        assert_eq!(c.max_message_size, max_value, "{bucket}");
        assert_eq!(
            c.max_bytes,
            layout::max_bytes(spec, layout::DEFAULT_FLEET_SIZE),
            "{bucket}"
        );
        assert_eq!(c.allow_rollup, spec.allow_rollup, "{bucket}");
        assert_eq!(
            c.max_age,
            Duration::from_secs(age_days * 24 * 3600),
            "{bucket}"
        );
        // a value over the limit is refused by the server
        let store = f.bucket(bucket).await;
        let too_big = vec![b'x'; max_value as usize + 1];
        assert!(
            store.put("too-big", too_big.into()).await.is_err(),
            "{bucket}"
        );
    }
}

/// A failed canary stops the rollout: the rest are never released; a Warning event says why. A late success
/// never reopens the run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canary_failure_stops_the_rest() {
    let mut f = Fleet::new("canaryfail").await;
    let group = f.group("prod").await;
    let c1 = f
        .device("c1", json!({"member": "prod", "canary": "true"}), true)
        .await;
    let c2 = f
        .device("c2", json!({"member": "prod", "canary": "true"}), true)
        .await;
    let o1 = f.device("o1", json!({"member": "prod"}), true).await;
    f.start_operator();
    let run = f.task_run("upgrade", spec(&group, 21600)).await;
    eventually("both canaries released", || async {
        Some((f.intent(&c1, &run).await?, f.intent(&c2, &run).await?))
    })
    .await;
    f.succeed(&c1, &run).await;
    f.report(&c2, &run, false, None).await;
    let s = f.phase("upgrade", TaskRunPhase::Failed).await;
    assert_eq!(s.reason, Some(TaskRunReason::CanaryFailed));
    assert_eq!((s.targets, s.succeeded, s.failed), (3, 1, 1));
    let e = s.latest_error.unwrap().to_string();
    assert!(e.contains(c2.as_str()) && e.contains("apt-failed"), "{e}");
    eventually("Warning CanaryFailed event", || async {
        f.events("upgrade")
            .await
            .contains(&("Warning".into(), "CanaryFailed".into()))
            .then_some(())
    })
    .await;
    // why: no event marks a pass that released nothing after the failure; a few passes is the window
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(
        f.intent(&o1, &run).await.is_none(),
        "the rest are not released"
    );
    assert!(
        f.intent(&c2, &run).await.is_none(),
        "terminal intents removed"
    );
    // a late success of the failed canary changes nothing
    f.succeed(&c2, &run).await;
    // why: no event marks the late success judged and ignored; a few passes is the window
    tokio::time::sleep(Duration::from_millis(800)).await;
    let s = f.runs().get("upgrade").await.unwrap().status.unwrap().run;
    assert_eq!(
        (s.phase, s.succeeded, s.failed),
        (Some(TaskRunPhase::Failed), 1, 1)
    );
}

/// A released device that never accepts its intent (no status for the run) is *stalled* once the accept timeout
/// passed: the run counts it and names it in `Progressing=False` (reason `Stalled`, a Warning event), the Device
/// says so in `status.stalled`; the device that accepted is not named. The intent's write time is NATS's, so an
/// operator started afresh reports the same stall with the same time. A status from the device clears it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_that_never_accepts_its_intent_is_stalled() {
    let mut f = Fleet::new("stalled").await;
    let group = f.group("prod").await;
    let taker = f.device("taker", json!({"member": "prod"}), true).await;
    let mute = f.device("mute", json!({"member": "prod"}), true).await;
    let timeout = Duration::from_secs(3);
    f.start_operator_accepting_within(timeout);
    let run = f.task_run("upgrade", spec(&group, 21600)).await;
    eventually("both released", || async {
        Some((f.intent(&taker, &run).await?, f.intent(&mute, &run).await?))
    })
    .await;
    let released = Timestamp::now();
    // The taker's agent accepts at once (the updater is upgrading); the mute one never answers.
    let accepted = |d: &DeviceId| {
        let mut s: SystemUpgradeStatus = fixtures::system_status();
        s.run_uid = run;
        s.device_id = d.clone();
        s.phase = SystemUpgradePhase::Upgrading;
        s.accepted_at = Timestamp::now();
        s.completed_at = None;
        s.first_heartbeat_after_completion = None;
        serde_json::to_vec(&s).unwrap()
    };
    let statuses = f.bucket(layout::SYSTEM_UPGRADE_STATUS).await;
    statuses
        .put(layout::run_key(&taker, &run), accepted(&taker).into())
        .await
        .unwrap();
    let runs = f.runs();
    let stalled_run = || async {
        let st = runs.get("upgrade").await.ok()?.status?;
        let c = st
            .conditions
            .iter()
            .find(|c| c.type_ == "Progressing")?
            .clone();
        Some((st.stalled, c.status, c.reason, c.message))
    };
    let (n, status, _, message) = eventually("the run reports the mute device stalled", || async {
        stalled_run().await.filter(|s| s.2 == "Stalled")
    })
    .await;
    assert!(
        Timestamp::now().since(released) >= timeout,
        "not stalled before the timeout"
    );
    assert_eq!((n, status.as_str()), (1, "False"));
    assert!(
        message.contains(mute.as_str()) && !message.contains(taker.as_str()),
        "{message}"
    );
    assert!(message.contains("within 3s"), "{message}");
    let devices = Api::<Device>::all(f.client.clone());
    let device_stall = |d: DeviceId| {
        let api = devices.clone();
        async move { api.get(d.as_str()).await.ok()?.status?.stalled }
    };
    let on_device = eventually("the Device says so", || device_stall(mute.clone())).await;
    assert_eq!(on_device.phase, "not-accepted");
    assert_eq!(
        on_device.task_run.as_deref(),
        Some(format!("{}/upgrade", f.run).as_str())
    );
    assert!(
        device_stall(taker.clone()).await.is_none(),
        "the device that accepted is not stalled"
    );
    eventually("Warning Stalled event", || async {
        f.events("upgrade")
            .await
            .contains(&("Warning".into(), "Stalled".into()))
            .then_some(())
    })
    .await;
    let s = f.runs().get("upgrade").await.unwrap().status.unwrap();
    assert_eq!(
        s.run.phase,
        Some(TaskRunPhase::Running),
        "stalled is not failed"
    );

    // A fresh operator judges from NATS: the same device, the same write time.
    f.kill_operators().await;
    f.start_operator_accepting_within(timeout);
    // why: the fresh operator's judgement has no event when it keeps the same value; its first passes are the window
    tokio::time::sleep(Duration::from_secs(2)).await;
    let again = device_stall(mute.clone()).await.expect("still stalled");
    assert_eq!(again.since, on_device.since, "the intent's time is NATS's");
    assert_eq!(stalled_run().await.map(|s| s.2).as_deref(), Some("Stalled"));

    // The device answers: no longer stalled, on the run or the Device.
    statuses
        .put(layout::run_key(&mute, &run), accepted(&mute).into())
        .await
        .unwrap();
    eventually("the stall clears", || async {
        let (n, status, reason, _) = stalled_run().await?;
        (n == 0 && status == "True" && reason == "Progressing").then_some(())
    })
    .await;
    eventually("the Device's stall clears", || async {
        device_stall(mute.clone()).await.is_none().then_some(())
    })
    .await;
}

/// Deleting a running TaskRun (`kubectl delete ftr`) cancels it: the intent the canary has not taken is removed
/// and nothing more is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_running_run_removes_its_intents() {
    let mut f = Fleet::new("cancel").await;
    let group = f.group("prod").await;
    let c1 = f
        .device("c1", json!({"member": "prod", "canary": "true"}), true)
        .await;
    let o1 = f.device("o1", json!({"member": "prod"}), true).await;
    f.start_operator();
    let run = f.task_run("upgrade", spec(&group, 21600)).await;
    eventually("the canary released", || async {
        f.intent(&c1, &run).await
    })
    .await;
    f.runs()
        .delete("upgrade", &Default::default())
        .await
        .expect("delete the run");
    eventually("the canary's intent removed", || async {
        f.intent(&c1, &run).await.is_none().then_some(())
    })
    .await;
    // why: no event marks a pass that wrote nothing after the delete; a few passes is the window
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(f.intent(&o1, &run).await.is_none(), "nothing more released");
    assert!(
        f.intent(&c1, &run).await.is_none(),
        "and nothing written again"
    );
}

/// The operator's finalizer cancels a run deleted while no operator runs: the run planned (its finalizer on), the
/// canary succeeded and the others released, the operator is stopped and the run deleted. The object stays, with
/// its deletionTimestamp, and so do the intents no device has taken; once an operator starts, it removes them and
/// then its finalizer, and the object goes. A run never planned (no targets) has no finalizer: deleted with no
/// operator, it goes at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_run_with_no_operator_cancels_it_once_one_starts() {
    const FINALIZER: &str = fleet_operator::tasks::pass::FINALIZER;
    let mut f = Fleet::new("finalizer").await;
    let group = f.group("prod").await;
    let empty = f.group("nobody").await;
    let c1 = f
        .device("c1", json!({"member": "prod", "canary": "true"}), true)
        .await;
    let o1 = f.device("o1", json!({"member": "prod"}), true).await;
    let o2 = f.device("o2", json!({"member": "prod"}), true).await;
    f.start_operator();
    let run = f.task_run("upgrade", spec(&group, 21600)).await;
    eventually("the canary released", || async {
        f.intent(&c1, &run).await
    })
    .await;
    f.succeed(&c1, &run).await;
    eventually("the others released", || async {
        Some((f.intent(&o1, &run).await?, f.intent(&o2, &run).await?))
    })
    .await;
    let finalizers = |name: &'static str| {
        let runs = f.runs();
        async move { runs.get(name).await.unwrap().metadata.finalizers }
    };
    assert_eq!(
        finalizers("upgrade").await,
        Some(vec![FINALIZER.to_owned()])
    );
    f.task_run("nothing", spec(&empty, 21600)).await;
    let s = f.phase("nothing", TaskRunPhase::Failed).await;
    assert_eq!(s.reason, Some(TaskRunReason::NoTargets));
    assert_eq!(
        finalizers("nothing").await,
        None,
        "never planned: no finalizer"
    );

    for o in f.operators.drain(..) {
        o.abort();
        let _ = o.await;
    }
    f.runs()
        .delete("upgrade", &Default::default())
        .await
        .expect("delete the run");
    f.runs()
        .delete("nothing", &Default::default())
        .await
        .expect("delete the unplanned run");
    assert!(
        f.runs().get_opt("nothing").await.unwrap().is_none(),
        "a run without the finalizer goes at once"
    );
    // why: no event marks the finalizer kept and nothing released; a few passes is the window
    tokio::time::sleep(Duration::from_secs(2)).await;
    let held = f.runs().get("upgrade").await.expect("still there");
    assert!(held.metadata.deletion_timestamp.is_some());
    assert_eq!(held.metadata.finalizers, Some(vec![FINALIZER.to_owned()]));
    assert!(f.intent(&o1, &run).await.is_some(), "o1's intent stays");
    assert!(f.intent(&o2, &run).await.is_some(), "o2's intent stays");

    f.start_operator();
    eventually("the unreleased intents removed", || async {
        (f.intent(&o1, &run).await.is_none() && f.intent(&o2, &run).await.is_none()).then_some(())
    })
    .await;
    eventually("the run gone", || async {
        f.runs()
            .get_opt("upgrade")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    let status = f
        .bucket(layout::SYSTEM_UPGRADE_STATUS)
        .await
        .get(layout::run_key(&c1, &run))
        .await
        .unwrap();
    assert!(status.is_some(), "the canary's result stays");
    // why: no event marks a pass that wrote nothing; a few passes is the window
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(
        f.intent(&o1, &run).await.is_none() && f.intent(&c1, &run).await.is_none(),
        "nothing written again"
    );
}

/// A canary that never reports times out: the run fails with CanaryFailed at its deadline; a success reported
/// afterwards (even one whose heartbeat precedes the deadline) leaves the run Failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_canary_times_out_and_late_success_stays_failed() {
    let mut f = Fleet::new("timeout").await;
    let group = f.group("prod").await;
    let c = f
        .device("c1", json!({"member": "prod", "canary": "true"}), true)
        .await;
    let o = f.device("o1", json!({"member": "prod"}), true).await;
    f.start_operator();
    let run = f.task_run("upgrade", spec(&group, 4)).await;
    eventually("canary intent", || async { f.intent(&c, &run).await }).await;
    let s = f.phase("upgrade", TaskRunPhase::Failed).await;
    assert_eq!(s.reason, Some(TaskRunReason::CanaryFailed));
    assert!(s.latest_error.unwrap().to_string().contains("deadline"));
    assert!(f.intent(&o, &run).await.is_none());
    f.succeed(&c, &run).await;
    // why: no event marks the late success judged and ignored; a few passes is the window
    tokio::time::sleep(Duration::from_millis(800)).await;
    let s = f.runs().get("upgrade").await.unwrap().status.unwrap().run;
    assert_eq!((s.phase, s.succeeded), (Some(TaskRunPhase::Failed), 0));
    assert!(f.intent(&o, &run).await.is_none());

    // Without canaries: a device whose success is recorded with a heartbeat after the deadline does not count.
    let l = f
        .device("l1", json!({"member": "prod", "lone": "yes"}), true)
        .await;
    let run2 = f.task_run("late", json!({"allowedGroups": [group], "targetSelector": {"matchLabels": {"lone": "yes"}}, "deadlineSeconds": 3, "systemUpgradeV1": {}})).await;
    let a = eventually("intent", || async { f.intent(&l, &run2).await }).await;
    f.report(
        &l,
        &run2,
        true,
        Some(a.expires_at.plus(Duration::from_secs(1))),
    )
    .await;
    let s = f.phase("late", TaskRunPhase::Failed).await;
    assert_eq!(s.reason, Some(TaskRunReason::TargetFailed));
    assert_eq!((s.succeeded, s.failed), (0, 1));
    assert!(s
        .latest_error
        .unwrap()
        .to_string()
        .contains("not before the deadline"));
}

/// A planned device whose group membership is revoked before its release fails the run with TargetRevoked; no
/// other device is substituted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoked_target_fails_the_run() {
    let mut f = Fleet::new("revoked").await;
    let group = f.group("prod").await;
    let c = f
        .device("c1", json!({"member": "prod", "canary": "true"}), true)
        .await;
    let o = f.device("o1", json!({"member": "prod"}), true).await;
    f.start_operator();
    let run = f.task_run("upgrade", spec(&group, 21600)).await;
    eventually("canary intent", || async { f.intent(&c, &run).await }).await;
    // o1 leaves the group after planning; a new member joins (it must not be substituted)
    f.relabel(&o, json!({"member": "elsewhere"})).await;
    let newcomer = f.device("n1", json!({"member": "prod"}), true).await;
    // why: no status shows the operator saw the relabel and the newcomer (watch cache); a moment before success
    tokio::time::sleep(Duration::from_millis(500)).await;
    f.succeed(&c, &run).await;
    let s = f.phase("upgrade", TaskRunPhase::Failed).await;
    assert_eq!(s.reason, Some(TaskRunReason::TargetRevoked));
    assert!(s.latest_error.unwrap().to_string().contains(o.as_str()));
    assert_eq!((s.targets, s.succeeded), (2, 1));
    assert!(f.intent(&o, &run).await.is_none());
    assert!(f.intent(&newcomer, &run).await.is_none());
}

/// No match fails with NoTargets; matchExpressions fails closed with InvalidSpec; a group source error is retried
/// (never NoTargets) and the run plans once the group resolves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_targets_invalid_spec_and_group_source_retry() {
    let mut f = Fleet::new("planning").await;
    let group = f.group("prod").await;
    f.device("old", json!({"member": "prod"}), false).await;
    f.start_operator();
    f.task_run("none", spec(&group, 600)).await;
    f.task_run("expr", json!({"allowedGroups": [group], "targetSelector": {"matchExpressions": [{"key": "a", "operator": "Exists"}]}, "deadlineSeconds": 600, "systemUpgradeV1": {}})).await;
    let late = f.name("late");
    let run = f.task_run("waits", spec(&late, 600)).await;
    let s = f.phase("none", TaskRunPhase::Failed).await;
    assert_eq!((s.reason, s.targets), (Some(TaskRunReason::NoTargets), 0));
    let s = f.phase("expr", TaskRunPhase::Failed).await;
    assert_eq!(s.reason, Some(TaskRunReason::InvalidSpec));
    assert!(s
        .latest_error
        .unwrap()
        .to_string()
        .contains("matchExpressions"));
    let s = eventually("GroupSourceError while planning", || async {
        let st = f.runs().get("waits").await.ok()?.status?;
        let c = st.conditions.iter().find(|c| c.type_ == "Ready")?.clone();
        (c.reason == "GroupSourceError" && c.status == "False").then_some(st.run)
    })
    .await;
    assert_eq!(s.phase, Some(TaskRunPhase::Planning));
    assert_eq!(s.reason, Some(TaskRunReason::GroupSourceError));
    assert!(s.latest_error.unwrap().to_string().contains(&late));
    // the group appears with a capable member: planning succeeds on a retry
    let d = f.device("new", json!({"member": "late"}), true).await;
    f.group("late").await;
    let s = f.phase("waits", TaskRunPhase::Running).await;
    assert_eq!(s.targets, 1);
    eventually("intent", || async { f.intent(&d, &run).await }).await;
}

/// Kills its process (SIGKILL) on drop.
struct Proc(std::process::Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn synced(dir: &std::path::Path, name: &str) {
    let path = dir.join(format!("{name}.log"));
    eventually(&format!("{name} synced"), || async {
        std::fs::read_to_string(&path)
            .ok()?
            .contains("task runs: caches synced")
            .then_some(())
    })
    .await;
}

/// Two real fleet-operator processes on one run write one plan and release the canary once; both are SIGKILLed
/// after the canary's release; a new process resumes from the plan and the KV keys, releases the rest without
/// releasing the canary again, and completes the run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_processes_share_one_plan_and_resume_after_sigkill() {
    let f = Fleet::new("procs").await;
    let dir = tempfile::tempdir().unwrap();
    let group = f.group("prod").await;
    let c = f
        .device("c1", json!({"member": "prod", "canary": "true"}), true)
        .await;
    let o1 = f.device("o1", json!({"member": "prod"}), true).await;
    let o2 = f.device("o2", json!({"member": "prod"}), true).await;
    let mut a = Proc(f.spawn_binary(dir.path(), "a"));
    let mut b = Proc(f.spawn_binary(dir.path(), "b"));
    synced(dir.path(), "a").await;
    synced(dir.path(), "b").await;
    let run = f.task_run("upgrade", spec(&group, 21600)).await;
    eventually("canary intent", || async { f.intent(&c, &run).await }).await;
    f.phase("upgrade", TaskRunPhase::Running).await;
    let plans = f.bucket(layout::TASK_PLANS).await;
    let manifest = plans.entry(plan_manifest_key(&run)).await.unwrap().unwrap();
    // why: no event marks a pass that wrote no second plan or intent; the window before counting the streams
    tokio::time::sleep(Duration::from_secs(1)).await;
    // one chunk and one manifest in the plan bucket; the canary's intent written once
    let (messages, _) = f.stream_state(layout::TASK_PLANS).await;
    assert_eq!(messages, 2, "one plan: one chunk and one manifest");
    assert_eq!(f.stream_state(layout::SYSTEM_UPGRADE_INTENT).await.1, 1);
    for p in [&mut a, &mut b] {
        p.0.kill().unwrap(); // SIGKILL
        p.0.wait().unwrap();
    }
    f.succeed(&c, &run).await;
    let _c2 = Proc(f.spawn_binary(dir.path(), "c"));
    eventually("the rest released after the restart", || async {
        Some((f.intent(&o1, &run).await?, f.intent(&o2, &run).await?))
    })
    .await;
    f.succeed(&o1, &run).await;
    f.succeed(&o2, &run).await;
    let s = f.phase("upgrade", TaskRunPhase::Complete).await;
    assert_eq!((s.targets, s.succeeded), (3, 3));
    eventually("intents removed", || async {
        (f.stream_state(layout::SYSTEM_UPGRADE_INTENT).await.0 == 3).then_some(())
    })
    .await;
    // 3 creates + 3 removals: no device was released twice across three operator processes
    assert_eq!(f.stream_state(layout::SYSTEM_UPGRADE_INTENT).await.1, 6);
    // what `kubectl get ftr` shows: the server-side table with the CRD's printer columns
    let req = http::Request::get(format!(
        "/apis/fleet.nationtech.io/v1alpha1/namespaces/{}/taskruns/upgrade",
        f.run
    ))
    .header("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
    .body(vec![])
    .unwrap();
    let table: serde_json::Value =
        serde_json::from_str(&f.client.request_text(req).await.expect("table")).unwrap();
    let columns: Vec<&str> = table["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        columns,
        [
            "Name",
            "Phase",
            "Targets",
            "Succeeded",
            "Failed",
            "Stalled",
            "Reason",
            "Age"
        ]
    );
    let cells = &table["rows"][0]["cells"];
    assert_eq!(
        (&cells[1], &cells[2], &cells[3], &cells[4]),
        (&json!("Complete"), &json!(3), &json!(3), &json!(0))
    );
    let now = plans.entry(plan_manifest_key(&run)).await.unwrap().unwrap();
    assert_eq!(
        now.revision, manifest.revision,
        "the plan was never rewritten"
    );
}

/// The admission webhook over HTTPS, registered with `operator/deploy/webhook.yaml` (`Fleet::webhook`: its
/// clientConfig pointed at 127.0.0.1 with the test CA): a spec change is refused with a clear message, a label change is not; the CRD
/// schema refuses fields in `systemUpgradeV1` and a zero deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spec_edit_refused_by_the_webhook() {
    let f = Fleet::new("webhook").await;
    let hooks = f.webhook().await;

    f.task_run("upgrade", spec("prod", 600)).await;
    let err = eventually("spec change refused", || async {
        match f
            .runs()
            .patch(
                "upgrade",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"deadlineSeconds": 601}})),
            )
            .await
        {
            Err(kube::Error::Api(s)) if s.message.contains("immutable") => Some(s),
            Err(e) => panic!("unexpected error: {e}"),
            // the API server may not have loaded the new configuration yet: undo and try again
            Ok(_) => {
                f.runs()
                    .patch(
                        "upgrade",
                        &PatchParams::default(),
                        &Patch::Merge(json!({"spec": {"deadlineSeconds": 600}})),
                    )
                    .await
                    .ok();
                None
            }
        }
    })
    .await;
    assert!(
        err.message.contains("create a new TaskRun"),
        "{}",
        err.message
    );
    let r = f.runs().get("upgrade").await.unwrap();
    assert_eq!(r.spec.deadline_seconds, 600);
    // metadata may change
    f.runs()
        .patch(
            "upgrade",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"note": "x"}}})),
        )
        .await
        .expect("label change allowed");

    // the schema: nothing can be said inside systemUpgradeV1, the deadline is at least 1 s
    for bad in [
        json!({"allowedGroups": ["p"], "deadlineSeconds": 60, "systemUpgradeV1": {"packages": ["openssl"]}}),
        json!({"allowedGroups": ["p"], "deadlineSeconds": 0, "systemUpgradeV1": {}}),
    ] {
        // raw JSON: the Rust type refuses the packages field itself
        let raw =
            kube::api::DynamicObject::new("bad", &kube::api::ApiResource::erase::<TaskRun>(&()))
                .within(&f.run)
                .data(json!({"spec": bad}));
        let api: Api<kube::api::DynamicObject> = Api::namespaced_with(
            f.client.clone(),
            &f.run,
            &kube::api::ApiResource::erase::<TaskRun>(&()),
        );
        let e = api
            .create(&PostParams::default(), &raw)
            .await
            .expect_err("refused by the schema");
        assert!(format!("{e}").contains("spec."), "{e}");
    }
    hooks.remove().await;
}

/// The plan store on a real nats-server: two writers of different plans for one run end with the same plan (the
/// first manifest), the loser's own chunks are removed; a run with chunks but no manifest (a writer that died
/// half-way) has no plan; a manifest whose chunk is gone is an error, never a partial plan; 100,000 devices work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_store_is_atomic_and_chunked() {
    use fleet_operator::tasks::store::{self, Created, StoreError};
    use fleet_wire::taskrun::plan_chunk_key;
    use fleet_wire::{TaskOperation, TaskPlan};
    let nats = NatsServer::start();
    let (_c, js) = fleet_operator::kv::connect(&nats.url(), &Default::default())
        .await
        .unwrap();
    let stores = fleet_operator::kv::ensure_buckets(&js, &Default::default())
        .await
        .unwrap();
    let plans = &stores[layout::TASK_PLANS];
    let ids = |n: usize, p: &str| -> Vec<DeviceId> {
        (0..n)
            .map(|i| DeviceId::try_from(format!("{p}-{i:06}").as_str()).unwrap())
            .collect()
    };
    let plan = |run: AttemptId, canaries: Vec<DeviceId>, others: Vec<DeviceId>| {
        let now = Timestamp::now();
        TaskPlan::new(
            run,
            TaskOperation::AptFullUpgradeV1,
            now.plus(Duration::from_secs(60)),
            canaries,
            others,
            now,
        )
        .unwrap()
    };

    // two writers with different views race; both end with one plan
    let run = AttemptId::new_random();
    let (a, b) = (
        plan(run, ids(1, "c"), ids(15_000, "a")),
        plan(run, vec![], ids(12_000, "b")),
    );
    let (ra, rb) = tokio::join!(store::create(plans, &a), store::create(plans, &b));
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    let winner = match (&ra, &rb) {
        (Created::Written(p), Created::Loaded(q)) | (Created::Loaded(q), Created::Written(p)) => {
            assert_eq!(p, q);
            p.clone()
        }
        other => panic!("exactly one writer wins: {other:?}"),
    };
    assert_eq!(
        store::load(plans, &run).await.unwrap(),
        Some(winner.clone())
    );
    let loser = if winner == a { &b } else { &a };
    for (d, _) in loser.to_stored().1 {
        assert!(
            plans.get(plan_chunk_key(&run, &d)).await.unwrap().is_none(),
            "the loser's chunks are removed"
        );
    }

    // chunks without a manifest: no plan
    let half = AttemptId::new_random();
    let p = plan(half, vec![], ids(20_000, "h"));
    let (_, chunks) = p.to_stored();
    plans
        .put(
            plan_chunk_key(&half, &chunks[0].0),
            chunks[0].1.clone().into(),
        )
        .await
        .unwrap();
    assert_eq!(store::load(plans, &half).await.unwrap(), None);
    // a manifest whose chunk is missing: an error, not a partial plan
    store::create(plans, &p).await.unwrap();
    plans
        .purge(plan_chunk_key(&half, &chunks[1].0))
        .await
        .unwrap();
    assert!(matches!(
        store::load(plans, &half).await,
        Err(StoreError::Invalid { .. })
    ));

    // 100,000 devices: 10 chunks, each under the bucket's value limit
    let big = AttemptId::new_random();
    let p = plan(big, ids(10, "k"), ids(100_000, "device"));
    assert!(matches!(
        store::create(plans, &p).await.unwrap(),
        Created::Written(_)
    ));
    let m: TaskPlanManifest =
        serde_json::from_slice(&plans.get(plan_manifest_key(&big)).await.unwrap().unwrap())
            .unwrap();
    assert_eq!((m.canaries, m.others, m.chunks.len()), (10, 100_000, 11));
    assert_eq!(store::load(plans, &big).await.unwrap(), Some(p));
}

/// An operator that dies right after creating the plan (before the run says Running), or half-way through a
/// release, is replaced by one that loads the same plan and releases every device exactly once.
#[cfg(feature = "fault-injection")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_killed_after_plan_create_or_mid_release_resumes() {
    let f = Fleet::new("crash").await;
    let dir = tempfile::tempdir().unwrap();
    let group = f.group("prod").await;
    let mut devices = vec![];
    for i in 0..6 {
        devices.push(
            f.device(&format!("d{i}"), json!({"member": "prod"}), true)
                .await,
        );
    }
    let plans = f.bucket(layout::TASK_PLANS).await;
    let mut intents_written = 0;
    for (n, point) in ["plan-created", "mid-release"].into_iter().enumerate() {
        let name = format!("run-{n}");
        let mut dying = Proc(f.spawn_binary_env(
            dir.path(),
            &format!("dying-{n}"),
            &[("FLEET_OPERATOR_CRASH_AT", point)],
        ));
        let run = f.task_run(&name, spec(&group, 21600)).await;
        let status = tokio::task::spawn_blocking(move || dying.0.wait().unwrap())
            .await
            .unwrap();
        assert!(!status.success(), "{point}: the operator aborted");
        let manifest = plans.entry(plan_manifest_key(&run)).await.unwrap().unwrap();
        let phase = f
            .runs()
            .get(&name)
            .await
            .unwrap()
            .status
            .and_then(|s| s.run.phase);
        let seq = f.stream_state(layout::SYSTEM_UPGRADE_INTENT).await.1;
        match point {
            "plan-created" => {
                assert_ne!(phase, Some(TaskRunPhase::Running), "crashed before Running");
                assert_eq!(seq, intents_written, "nothing released before the crash");
            }
            // the first half was sent (how much of it reached the server before the abort varies), the rest not
            _ => assert!(
                seq < intents_written + 6,
                "crashed half-way: {} of 6 released",
                seq - intents_written
            ),
        }
        let _next = Proc(f.spawn_binary(dir.path(), &format!("next-{n}")));
        let s = f.phase(&name, TaskRunPhase::Running).await;
        assert_eq!(s.targets, 6);
        for d in &devices {
            eventually("released", || async { f.intent(d, &run).await }).await;
        }
        intents_written += 6;
        assert_eq!(
            f.stream_state(layout::SYSTEM_UPGRADE_INTENT).await.1,
            intents_written,
            "{point}: every device released exactly once"
        );
        let now = plans.entry(plan_manifest_key(&run)).await.unwrap().unwrap();
        assert_eq!(now.revision, manifest.revision, "{point}: the same plan");
        for d in &devices {
            f.succeed(d, &run).await;
        }
        f.phase(&name, TaskRunPhase::Complete).await;
        eventually("intents removed", || async {
            let removed =
                f.stream_state(layout::SYSTEM_UPGRADE_INTENT).await.1 == intents_written + 6;
            removed.then_some(())
        })
        .await;
        intents_written += 6;
    }
}

/// A TaskSchedule against the real API server, with the scheduler's clock moved by the test (no TaskRun controller
/// runs, so the test marks runs terminal itself): a tick creates one run owned by the schedule; a tick while it is
/// active is skipped; a scheduler stopped across three ticks creates exactly one catch-up run on start; suspension
/// stops new runs and leaves the active one alone; two schedulers create one run per tick.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_schedule_ticks_skips_catches_up_and_suspends() {
    use fleet_operator::crd::tasks::TaskSchedule;
    use fleet_operator::tasks::scheduler;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    let f = Fleet::new("schedule").await;
    let clock = Arc::new(AtomicU64::new(Timestamp::now().unix_ms()));
    let start = |n: usize| {
        let c = clock.clone();
        let opts = scheduler::Options {
            instance: Some(format!("sched-{n}")),
            label_selector: Some(format!("fleet-test={}", f.run)),
            clock: Arc::new(move || Timestamp::from_unix_ms(c.load(Ordering::SeqCst))),
            resync: Duration::from_millis(200),
        };
        tokio::spawn(scheduler::run(f.client.clone(), opts))
    };
    let schedules: Api<TaskSchedule> = Api::namespaced(f.client.clone(), &f.run);
    let s: TaskSchedule = serde_json::from_value(json!({
        "apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "TaskSchedule",
        "metadata": {"name": "hourly", "labels": f.labels(json!({}))},
        "spec": {"schedule": {"cron": "0 * * * *"}, "template": spec("prod", 600)}
    }))
    .unwrap();
    schedules.create(&PostParams::default(), &s).await.unwrap();
    let owned = || async {
        let mut names: Vec<String> = f
            .runs()
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|r| {
                r.metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .any(|o| o.kind == "TaskSchedule" && o.name == "hourly")
            })
            .map(|r| r.metadata.name.unwrap())
            .collect();
        names.sort();
        names
    };
    let status = || async {
        schedules
            .get("hourly")
            .await
            .unwrap()
            .status
            .unwrap_or_default()
    };
    let to_next_tick = || async {
        let next: Timestamp = eventually("next tick", || async {
            status().await.next_tick?.parse().ok()
        })
        .await;
        clock.store(next.unix_ms() + 1000, Ordering::SeqCst);
        next
    };
    let complete = |name: String| {
        let runs = f.runs();
        async move {
            runs.patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"phase": "Complete"}})),
            )
            .await
            .unwrap();
        }
    };

    let a = start(0);
    let st = eventually("schedule status", || async {
        let s = status().await;
        s.expression.is_some().then_some(s)
    })
    .await;
    assert_eq!(st.expression.as_deref(), Some("0 * * * *"));
    assert!(owned().await.is_empty(), "no run before the first tick");

    // a tick: one run, owned, named after the tick
    let t1 = to_next_tick().await;
    let first = eventually("first run", || async { owned().await.first().cloned() }).await;
    assert_eq!(first, format!("hourly-{}", t1.unix_ms() / 60_000));
    eventually("active run in status", || async {
        (status().await.active_run.as_deref() == Some(first.as_str())).then_some(())
    })
    .await;

    // a tick while it is active: skipped
    to_next_tick().await;
    eventually("skipped tick", || async {
        (status().await.skipped_ticks == 1).then_some(())
    })
    .await;
    assert_eq!(owned().await.len(), 1);

    // stopped across three ticks: one catch-up run on start
    complete(first.clone()).await;
    a.abort();
    let now = clock.load(Ordering::SeqCst);
    clock.store(now + 3 * 3600 * 1000, Ordering::SeqCst);
    let b = start(1);
    eventually("one catch-up run", || async {
        (owned().await.len() == 2).then_some(())
    })
    .await;
    // why: 'exactly one catch-up run' has no later event; a few scheduler passes is the window
    tokio::time::sleep(Duration::from_millis(800)).await;
    let runs = owned().await;
    assert_eq!(runs.len(), 2, "exactly one catch-up run: {runs:?}");
    let catch_up = runs.iter().find(|n| **n != first).unwrap().clone();
    eventually("last successful run", || async {
        (status().await.last_successful_run.as_deref() == Some(first.as_str())).then_some(())
    })
    .await;

    // suspended: no new run, the active one is left alone
    schedules
        .patch(
            "hourly",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"suspend": true}})),
        )
        .await
        .unwrap();
    // why: no status shows the scheduler saw the suspend (its watch cache); a moment before the clock moves
    tokio::time::sleep(Duration::from_millis(500)).await;
    to_next_tick().await;
    eventually("skipped while suspended", || async {
        (status().await.skipped_ticks == 2).then_some(())
    })
    .await;
    assert_eq!(owned().await.len(), 2);
    assert!(
        f.runs().get(&catch_up).await.is_ok(),
        "the active run goes on"
    );

    // two schedulers: one run per tick
    complete(catch_up).await;
    let c = start(2);
    schedules
        .patch(
            "hourly",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"suspend": false}})),
        )
        .await
        .unwrap();
    // why: no status shows the scheduler saw the resume (its watch cache); a moment before the clock moves
    tokio::time::sleep(Duration::from_millis(500)).await;
    to_next_tick().await;
    eventually("the next run", || async {
        (owned().await.len() == 3).then_some(())
    })
    .await;
    // why: 'one run for the tick' has no later event; a few passes of both schedulers is the window
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(
        owned().await.len(),
        3,
        "two schedulers created one run for the tick"
    );
    let events = f.events("hourly").await;
    assert!(
        events.contains(&("Normal".into(), "Created".into())),
        "{events:?}"
    );
    assert!(
        events.contains(&("Normal".into(), "Skipped".into())),
        "{events:?}"
    );
    b.abort();
    c.abort();
}

/// NATS unreachable: the run stays Planning (nothing is planned without the devices' reports) and says why in
/// `NatsReachable=False` with a Warning event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_unreachable_keeps_the_run_planning() {
    let mut f = Fleet::new("nonats").await;
    let group = f.group("prod").await;
    f.device("d1", json!({"member": "prod"}), true).await;
    let mut opts = f.options(0);
    opts.nats_url = format!("nats://127.0.0.1:{}", fleet_rig::free_port());
    f.operators.push(spawn_controller(f.client.clone(), opts));
    f.task_run("upgrade", spec(&group, 600)).await;
    let st = eventually("NatsReachable=False", || async {
        let st = f.runs().get("upgrade").await.ok()?.status?;
        st.conditions
            .iter()
            .any(|c| {
                c.type_ == "NatsReachable" && c.status == "False" && c.reason == "NatsUnreachable"
            })
            .then_some(st)
    })
    .await;
    assert_eq!(st.run.phase, Some(TaskRunPhase::Planning));
    assert_eq!(st.run.targets, 0);
    eventually("NatsUnreachable event", || async {
        f.events("upgrade")
            .await
            .contains(&("Warning".into(), "NatsUnreachable".into()))
            .then_some(())
    })
    .await;
}

/// A TaskRun or TaskSchedule created raw through the API (no Rust type in between to drop fields).
async fn create_raw(f: &Fleet, kind: &str, name: &str, spec: serde_json::Value) {
    let resource = match kind {
        "TaskRun" => kube::api::ApiResource::erase::<TaskRun>(&()),
        _ => kube::api::ApiResource::erase::<fleet_operator::crd::tasks::TaskSchedule>(&()),
    };
    let api: Api<kube::api::DynamicObject> =
        Api::namespaced_with(f.client.clone(), &f.run, &resource);
    let mut obj = kube::api::DynamicObject::new(name, &resource)
        .within(&f.run)
        .data(json!({ "spec": spec }));
    obj.metadata.labels = serde_json::from_value(f.labels(json!({}))).unwrap();
    api.create(&PostParams::default(), &obj)
        .await
        .expect("stored: no webhook is registered");
}

/// The Ready condition (reason, message) of TaskRun `name`.
async fn run_ready(f: &Fleet, name: &str) -> Option<(String, String)> {
    let r = f.runs().get(name).await.ok()?;
    r.status?
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| (c.reason, c.message))
}

/// Fail closed without the webhook (none is registered here): the operator itself refuses a TaskRun with an
/// unknown field (the issue's `targetSelector: {matchLabel: …}`, which the typed spec reads as "every device"):
/// `Ready=False`, reason `InvalidSpec`, the field named, no plan, no intent. A running TaskRun whose spec is edited
/// is held the same way, naming the field with what it was and is: the canary's success releases nobody while the
/// spec differs from the frozen one, and the rest are released once it is as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_webhook_unknown_fields_and_spec_edits_stop_the_run() {
    let mut f = Fleet::new("closed").await;
    let group = f.group("prod").await;
    let c = f
        .device("c1", json!({"member": "prod", "canary": "true"}), true)
        .await;
    let o = f.device("o1", json!({"member": "prod"}), true).await;
    f.start_operator();

    // the typo: refused by the operator, nothing planned or released
    let mut typo = spec(&group, 600);
    typo["targetSelector"] = json!({"matchLabel": {"canary": "true"}});
    create_raw(&f, "TaskRun", "typo", typo).await;
    let (reason, message) = eventually("the typo refused", || async {
        run_ready(&f, "typo").await.filter(|(r, _)| r != "Planning")
    })
    .await;
    assert_eq!(reason, "InvalidSpec", "{message}");
    assert!(
        message.starts_with("unknown field spec.targetSelector.matchLabel (refused rather than silently dropped; see docs/crds.md); known fields there: matchExpressions, matchLabels; the operator acts on nothing in this object until it is fixed"),
        "{message}"
    );
    let r = f.runs().get("typo").await.unwrap();
    let st = r.status.clone().unwrap().run;
    assert_eq!(st.reason, Some(fleet_wire::TaskRunReason::InvalidSpec));
    assert_ne!(st.phase, Some(TaskRunPhase::Running));
    let typo_uid = AttemptId::try_from(r.metadata.uid.unwrap().as_str()).unwrap();
    let plans = f.bucket(layout::TASK_PLANS).await;
    assert!(
        plans
            .get(plan_manifest_key(&typo_uid))
            .await
            .unwrap()
            .is_none(),
        "no plan for a refused run"
    );
    for d in [&c, &o] {
        assert!(f.intent(d, &typo_uid).await.is_none(), "{d} released");
    }

    // an edit of a running run: held, the field named
    let run = f.task_run("edited", spec(&group, 600)).await;
    f.phase("edited", TaskRunPhase::Running).await;
    eventually("canary intent", || async { f.intent(&c, &run).await }).await;
    f.runs()
        .patch(
            "edited",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"allowedGroups": [group, "production"]}})),
        )
        .await
        .expect("stored: no webhook is registered");
    let (reason, message) = eventually("the edit refused", || async {
        run_ready(&f, "edited")
            .await
            .filter(|(r, _)| r != "Running")
    })
    .await;
    assert_eq!(reason, "InvalidSpec", "{message}");
    assert_eq!(
        message,
        format!("spec changed after the run froze it: spec.allowedGroups (was [\"{group}\"], now [\"{group}\",\"production\"]); a TaskRun's spec is immutable (its UID names one frozen plan): the operator acts on nothing in this run until the spec is as it was; or delete it and create a new TaskRun")
    );
    f.succeed(&c, &run).await;
    // why: no event marks a pass that released nothing for the changed spec; a few passes is the window
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        f.intent(&o, &run).await.is_none(),
        "released while the spec differs from the frozen one"
    );
    let st = f.runs().get("edited").await.unwrap().status.unwrap().run;
    assert_eq!(
        (st.phase, st.reason, st.succeeded),
        (
            Some(TaskRunPhase::Running),
            Some(fleet_wire::TaskRunReason::InvalidSpec),
            0
        )
    );
    // as it was: the run goes on
    f.runs()
        .patch(
            "edited",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"allowedGroups": [group]}})),
        )
        .await
        .unwrap();
    eventually("the rest released once the spec is as frozen", || async {
        f.intent(&o, &run).await
    })
    .await;
    // The intent is written before the status that says so: wait for the status, not for a race.
    eventually("Ready says Running again", || async {
        run_ready(&f, "edited")
            .await
            .filter(|(reason, _)| reason == "Running")
    })
    .await;
}

/// Fail closed without the webhook: a TaskSchedule with the issue's `suspended: true` (for `suspend`) schedules
/// nothing, however many ticks pass, and says why (`Ready=False`, `InvalidSpec`, the field named).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_webhook_a_mistyped_schedule_creates_no_run() {
    use fleet_operator::crd::tasks::TaskSchedule;
    use fleet_operator::tasks::scheduler;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    let f = Fleet::new("sched-typo").await;
    let clock = Arc::new(AtomicU64::new(Timestamp::now().unix_ms()));
    let c = clock.clone();
    let opts = scheduler::Options {
        instance: Some("sched".into()),
        label_selector: Some(format!("fleet-test={}", f.run)),
        clock: Arc::new(move || Timestamp::from_unix_ms(c.load(Ordering::SeqCst))),
        resync: Duration::from_millis(200),
    };
    let scheduler = tokio::spawn(scheduler::run(f.client.clone(), opts));
    let mut s = json!({"schedule": {"cron": "* * * * *"}, "template": spec("prod", 600)});
    s["suspended"] = json!(true);
    create_raw(&f, "TaskSchedule", "often", s).await;
    let schedules: Api<TaskSchedule> = Api::namespaced(f.client.clone(), &f.run);
    let ready = eventually("the schedule refused", || async {
        let s = schedules.get("often").await.ok()?.status?;
        s.conditions.into_iter().find(|c| c.type_ == "Ready")
    })
    .await;
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "InvalidSpec")
    );
    assert!(
        ready
            .message
            .starts_with("unknown field spec.suspended (refused rather than silently dropped; see docs/crds.md); known fields there: schedule, suspend, template"),
        "{}",
        ready.message
    );
    // five ticks later: still no run
    clock.fetch_add(5 * 60_000, Ordering::SeqCst);
    // why: no event marks a scheduler pass that created nothing for an invalid spec; a few passes is the window
    tokio::time::sleep(Duration::from_secs(2)).await;
    let runs = f.runs().list(&Default::default()).await.unwrap().items;
    assert!(runs.is_empty(), "runs created: {runs:?}");
    let st = schedules.get("often").await.unwrap().status.unwrap();
    assert_eq!(st.next_tick, None);
    scheduler.abort();
}
