//! Staged FleetDeployment rollouts through the real operator loop, a real kube-apiserver + etcd and a real
//! nats-server. The devices are played by writing what their agents publish (`device-workload-status`: the
//! generation applied, each workload's state, spec digest and start) into NATS; everything the operator decides
//! is read back from NATS (each device's `device-desired-state` key) and from the API server (`kubectl get fdep`
//! included).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use fleet_operator::crd::{Device, DeviceGroup, FleetDeployment, PlacementStatus, RolloutPhase};
use fleet_wire::{
    BoundedText, DesiredState, DeviceId, DeviceWorkloadStatus, Timestamp, WorkloadState,
    WorkloadStatus,
};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use std::time::Duration;

mod kube_common;
use kube_common::{eventually, kubectl, Fleet};

const OLD: &str = "localhost/web:1";
const NEW: &str = "localhost/web:2";

struct Rig {
    f: Fleet,
    group: String,
    dep: String,
}

impl Rig {
    /// A group, three Devices (`can` labelled `canary=true`), an operator, and a deployment of `OLD` on all of
    /// them without a rollout section; returns once every device's key holds `OLD`.
    async fn new(run: &str) -> (Self, [String; 3]) {
        let f = Fleet::start(run).await;
        let group = f.name("fleet");
        let meta = json!({"name": group, "labels": f.labels(json!({}))});
        f.create::<DeviceGroup>(
            json!({"apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "DeviceGroup",
            "metadata": meta, "spec": {"selector": {"matchLabels": {"fleet-test": f.run}}}}),
        )
        .await;
        let dep = f.name("web");
        let mut r = Rig { f, group, dep };
        let devs = [r.f.name("can"), r.f.name("d1"), r.f.name("d2")];
        for (d, labels) in devs
            .iter()
            .zip([json!({"canary": "true"}), json!({}), json!({})])
        {
            let meta = json!({"name": d, "labels": r.f.labels(labels)});
            r.f.create::<Device>(
                json!({"apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "Device",
                "metadata": meta, "spec": {}}),
            )
            .await;
        }
        r.f.start_engine();
        let meta = json!({"name": r.dep, "labels": r.f.labels(json!({}))});
        r.f.create::<FleetDeployment>(
            json!({"apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "FleetDeployment",
            "metadata": meta, "spec": {"allowedGroups": [r.group],
                "workloads": [{"name": "web", "image": OLD}]}}),
        )
        .await;
        for d in &devs {
            r.wait_image(d, OLD).await;
            // every device runs the old spec
            r.report(d, WorkloadState::Running, Some(Timestamp::now()))
                .await;
        }
        (r, devs)
    }

    /// The device's desired-state key.
    async fn desired(&self, dev: &str) -> Option<DesiredState> {
        let store = self.f.bucket_when_made(fleet_wire::kv::DESIRED_STATE).await;
        let v = store.get(dev).await.ok()??;
        Some(serde_json::from_slice(&v).unwrap())
    }

    /// The image of the `web` workload in the device's key.
    async fn image(&self, dev: &str) -> Option<String> {
        let d = self.desired(dev).await?;
        d.workloads.first().map(|w| w.image.clone())
    }

    async fn wait_image(&self, dev: &str, image: &str) -> DesiredState {
        eventually(&format!("{dev} given {image}"), || async {
            self.desired(dev)
                .await
                .filter(|d| d.workloads.first().is_some_and(|w| w.image == image))
        })
        .await
    }

    /// What the device's agent publishes for the spec its key holds now: `web` in `state`, started at `started`
    /// (the device's clock), measured at `at` (now when `None`).
    async fn report_at(
        &self,
        dev: &str,
        state: WorkloadState,
        started: Option<Timestamp>,
        at: Timestamp,
    ) {
        let d = self.desired(dev).await.expect("a desired state");
        let w = &d.workloads[0];
        let failed = state == WorkloadState::Failed;
        let s = DeviceWorkloadStatus {
            device_id: DeviceId::try_from(dev).unwrap(),
            generation: d.generation,
            at,
            workloads: vec![WorkloadStatus {
                name: w.name.clone(),
                state,
                container_id: (!failed).then(|| "c".repeat(64)),
                spec_digest: (!failed).then(|| w.digest()),
                started_at: started.filter(|_| state == WorkloadState::Running),
                error: failed.then(|| {
                    BoundedText::lossy(format!(
                        "image {} could not be pulled: manifest unknown",
                        w.image
                    ))
                }),
                failure: None,
                restarts: None,
                health: None,
            }],
            desired_error: None,
        };
        let store = self
            .f
            .bucket_when_made(fleet_wire::kv::WORKLOAD_STATUS)
            .await;
        store
            .put(dev, serde_json::to_vec(&s).unwrap().into())
            .await
            .expect("put");
    }

    async fn report(&self, dev: &str, state: WorkloadState, started: Option<Timestamp>) {
        self.report_at(dev, state, started, Timestamp::now()).await;
    }

    /// Changes the deployment to `NEW` with a rollout section.
    async fn change(&self, rollout: serde_json::Value) {
        Api::<FleetDeployment>::all(self.f.client.clone())
            .patch(
                &self.dep,
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"spec": {"workloads": [{"name": "web", "image": NEW}],
                    "rollout": rollout}}),
                ),
            )
            .await
            .expect("patch");
    }

    async fn status(&self) -> Option<PlacementStatus> {
        Api::<FleetDeployment>::all(self.f.client.clone())
            .get(&self.dep)
            .await
            .ok()?
            .status
    }

    /// Waits for the rollout `phase` with `(updated, healthy, pending, failed)`.
    async fn wait_rollout(
        &self,
        phase: RolloutPhase,
        counts: (u32, u32, u32, u32),
    ) -> PlacementStatus {
        let mut last = None;
        let what = format!("{}: {phase:?} {counts:?}", self.dep);
        let found = tokio::time::timeout(kube_common::DEADLINE, async {
            loop {
                if let Some(s) = self.status().await {
                    if let Some(r) = &s.rollout {
                        if r.phase == phase && (r.updated, r.healthy, r.pending, r.failed) == counts
                        {
                            return s;
                        }
                    }
                    last = Some(s);
                }
                // why: pacing of the bounded poll
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await;
        found.unwrap_or_else(|_| panic!("timed out waiting for {what}; last status {last:#?}"))
    }

    /// Writes to the desired-state bucket so far (each write takes one stream sequence number).
    async fn desired_writes(&self) -> u64 {
        let mut stream = self
            .f
            .js
            .get_stream(format!("KV_{}", fleet_wire::kv::DESIRED_STATE))
            .await
            .expect("stream");
        stream.info().await.expect("info").state.last_sequence
    }

    /// `kubectl get fdep` as a person runs it: the row's cells under the given columns.
    fn columns(&self, columns: &[&str]) -> Vec<String> {
        let (ok, table, stderr) = kubectl(&["get", "fdep", &self.dep], "");
        assert!(ok, "kubectl get fdep: {stderr}");
        let mut lines = table.lines();
        let header: Vec<&str> = lines.next().expect("header").split_whitespace().collect();
        let row: Vec<&str> = lines.next().expect("row").split_whitespace().collect();
        columns
            .iter()
            .map(|c| {
                let i = header
                    .iter()
                    .position(|h| h == c)
                    .unwrap_or_else(|| panic!("{c} in {table}"));
                row.get(i).copied().unwrap_or_default().to_owned()
            })
            .collect()
    }
}

fn condition<'a>(
    s: &'a PlacementStatus,
    type_: &str,
) -> &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
    s.conditions
        .iter()
        .find(|c| c.type_ == type_)
        .unwrap_or_else(|| panic!("{type_} in {s:#?}"))
}

const COLUMNS: [&str; 5] = ["PHASE", "UPDATED", "HEALTHY", "PENDING", "FAILED"];

/// A spec change with `soakSeconds: 3, maxUnavailable: 1`: the canary first, its soak on the workload's own start,
/// then the other two one at a time, each step in `kubectl get fdep`; devices not given the change keep the old
/// spec in their keys; an operator killed in the middle resumes from NATS and the CR and writes nobody's key again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spec_change_goes_to_the_canary_then_one_at_a_time_across_an_operator_kill() {
    let (mut r, [c, d1, d2]) = Rig::new("droll-good").await;
    let before = r.desired_writes().await;
    r.change(json!({"soakSeconds": 3, "maxUnavailable": 1}))
        .await;

    // only the canary's key gets the new spec; the others keep the old one
    r.wait_image(&c, NEW).await;
    let st = r
        .wait_rollout(RolloutPhase::Progressing, (0, 0, 2, 0))
        .await;
    assert_eq!(condition(&st, "Halted").status, "False");
    assert_eq!(r.columns(&COLUMNS), ["Progressing", "0", "0", "2", "0"]);
    assert_eq!(r.image(&d1).await.as_deref(), Some(OLD));
    assert_eq!(r.image(&d2).await.as_deref(), Some(OLD));

    // the canary runs it: soaking; the others still wait
    let t1 = Timestamp::now();
    r.report(&c, WorkloadState::Running, Some(t1)).await;
    r.wait_rollout(RolloutPhase::Soaking, (1, 0, 2, 0)).await;
    assert_eq!(r.columns(&COLUMNS), ["Soaking", "1", "0", "2", "0"]);
    // why: no event marks a pass that gave nobody the change during the soak; a few passes is the window
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        r.image(&d1).await.as_deref(),
        Some(OLD),
        "given before the canary's soak"
    );

    // a report 4 s after its start: healthy; one more device (the first by id), not two
    r.report_at(
        &c,
        WorkloadState::Running,
        Some(t1),
        t1.plus(Duration::from_secs(4)),
    )
    .await;
    r.wait_image(&d1, NEW).await;
    r.wait_rollout(RolloutPhase::Progressing, (1, 1, 1, 0))
        .await;
    assert_eq!(r.columns(&COLUMNS), ["Progressing", "1", "1", "1", "0"]);
    assert_eq!(
        r.image(&d2).await.as_deref(),
        Some(OLD),
        "maxUnavailable 1 gave two devices the change"
    );
    assert_eq!(r.desired_writes().await, before + 2);

    // the operator dies mid-rollout; a new one takes over from what NATS and the CR say
    r.f.kill_operators().await;
    r.f.start_engine();
    // why: no event marks the new operator's passes that gave d2 nothing; its first passes are the window
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        r.image(&d2).await.as_deref(),
        Some(OLD),
        "a restarted operator gave d2 the change while d1 updates"
    );
    assert_eq!(
        r.desired_writes().await,
        before + 2,
        "a restarted operator wrote a key again"
    );
    r.wait_rollout(RolloutPhase::Progressing, (1, 1, 1, 0))
        .await;

    let t2 = Timestamp::now();
    r.report(&d1, WorkloadState::Running, Some(t2)).await;
    r.wait_rollout(RolloutPhase::Soaking, (2, 1, 1, 0)).await;
    r.report_at(
        &d1,
        WorkloadState::Running,
        Some(t2),
        t2.plus(Duration::from_secs(4)),
    )
    .await;
    r.wait_image(&d2, NEW).await;
    let t3 = Timestamp::now();
    r.report_at(
        &d2,
        WorkloadState::Running,
        Some(t3),
        t3.plus(Duration::from_secs(4)),
    )
    .await;
    let st = r.wait_rollout(RolloutPhase::Complete, (3, 3, 0, 0)).await;
    assert_eq!(condition(&st, "Progressing").reason, "RolloutComplete");
    assert_eq!(r.columns(&COLUMNS), ["Complete", "3", "3", "0", "0"]);
    // each device's key was given the new spec exactly once
    assert_eq!(r.desired_writes().await, before + 3);
    for d in [&c, &d1, &d2] {
        assert_eq!(r.image(d).await.as_deref(), Some(NEW));
    }
}

/// A canary whose new workload fails halts the rollout (condition, Warning event, metric, `kubectl get fdep`);
/// the other two keep the old spec in their keys; the halt holds after the canary recovers, until the retry
/// annotation gives the canary the spec again. An out-of-range rollout section is `InvalidSpec`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_canary_halts_the_others_keep_the_old_spec_and_a_retry_resumes() {
    let (r, [c, d1, d2]) = Rig::new("droll-halt").await;
    r.change(json!({"soakSeconds": 600, "maxUnavailable": 1}))
        .await;
    r.wait_image(&c, NEW).await;
    r.report(&c, WorkloadState::Failed, None).await;
    let st = r.wait_rollout(RolloutPhase::Halted, (0, 0, 2, 1)).await;
    let halted = condition(&st, "Halted");
    assert_eq!(
        (halted.status.as_str(), halted.reason.as_str()),
        ("True", "CanaryFailed")
    );
    assert!(halted.message.contains(&c), "{}", halted.message);
    assert!(
        halted.message.contains("fleet.nationtech.io/retry"),
        "{}",
        halted.message
    );
    assert_eq!(condition(&st, "Progressing").status, "False");
    assert_eq!(r.columns(&COLUMNS), ["Halted", "0", "0", "2", "1"]);
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(r.f.client.clone(), "default");
    let ev = eventually("CanaryFailed Warning event", || async {
        let list = events.list(&Default::default()).await.ok()?;
        list.items.into_iter().find(|e| {
            e.reason.as_deref() == Some("CanaryFailed")
                && e.type_.as_deref() == Some("Warning")
                && e.regarding.as_ref().and_then(|x| x.name.as_deref()) == Some(r.dep.as_str())
        })
    })
    .await;
    assert_eq!(
        ev.regarding.and_then(|x| x.kind).as_deref(),
        Some("FleetDeployment")
    );
    let halts = fleet_operator::metrics::global()
        .rollout_halts
        .get_or_create(&vec![
            ("kind", "FleetDeployment".to_owned()),
            ("reason", "CanaryFailed".to_owned()),
        ])
        .get();
    assert!(halts >= 1, "halt metric: {halts}");
    // why: no event marks a pass of a halted rollout that changed nothing; a few passes is the window
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(r.image(&d1).await.as_deref(), Some(OLD));
    assert_eq!(r.image(&d2).await.as_deref(), Some(OLD));

    // the canary recovers on its own (the registry came back): the halt holds until a person says so
    r.report(&c, WorkloadState::Running, Some(Timestamp::now()))
        .await;
    // why: no event marks a pass that kept the halt after the recovery; a few passes is the window
    tokio::time::sleep(Duration::from_secs(3)).await;
    let st = r.status().await.expect("status");
    assert_eq!(
        st.rollout.as_ref().map(|x| x.phase),
        Some(RolloutPhase::Halted)
    );
    assert_eq!(condition(&st, "Halted").status, "True");

    // it fails again; the retry annotation gives it the spec again (a new generation, same workloads) and lifts
    // the halt; once it runs it soaks, and the others still keep the old spec
    r.report(&c, WorkloadState::Failed, None).await;
    let gen_before = r.desired(&c).await.expect("key").generation;
    Api::<FleetDeployment>::all(r.f.client.clone())
        .patch(
            &r.dep,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"fleet.nationtech.io/retry": "1"}}})),
        )
        .await
        .expect("annotate");
    let again = eventually("the canary's key written again", || async {
        r.desired(&c).await.filter(|d| d.generation > gen_before)
    })
    .await;
    assert_eq!(again.workloads[0].image, NEW);
    let st = r
        .wait_rollout(RolloutPhase::Progressing, (0, 0, 2, 0))
        .await;
    assert_eq!(condition(&st, "Halted").status, "False");
    assert_eq!(
        st.rollout.as_ref().and_then(|x| x.retry.as_deref()),
        Some("1")
    );
    r.report(&c, WorkloadState::Running, Some(Timestamp::now()))
        .await;
    r.wait_rollout(RolloutPhase::Soaking, (1, 0, 2, 0)).await;
    // one retry per value: the key is not written again
    // why: no event marks a pass that wrote no second retry; a few passes is the window
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        r.desired(&c).await.map(|d| d.generation),
        Some(again.generation)
    );
    assert_eq!(r.image(&d1).await.as_deref(), Some(OLD));
    assert_eq!(r.image(&d2).await.as_deref(), Some(OLD));

    // out of range: InvalidSpec, nothing new placed
    Api::<FleetDeployment>::all(r.f.client.clone())
        .patch(
            &r.dep,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"workloads": [{"name": "web", "image": "localhost/web:3"}],
                "rollout": {"maxUnavailable": "150%"}}}),
            ),
        )
        .await
        .expect("patch");
    let st = eventually("InvalidSpec", || async {
        let s = r.status().await?;
        s.conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.reason == "InvalidSpec")
            .then_some(s)
    })
    .await;
    assert!(condition(&st, "Ready").message.contains("maxUnavailable"));
    // why: no event marks a pass that acted on nothing for an invalid spec; a few passes is the window
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(r.image(&c).await.as_deref(), Some(NEW));
    assert_eq!(r.image(&d1).await.as_deref(), Some(OLD));
}
