//! Registry credentials and application secrets from Kubernetes Secrets, through the real operator loop, a real
//! kube-apiserver + etcd and a real nats-server: what each device's `device-secrets` key holds (only targeted
//! devices, only the registries their images name, values at the version their desired state names), rotation
//! (pull credentials rewritten at once, an application Secret staged through the rollout with its canary), the
//! capability gate (an agent without `WorkloadSpecV2` is not given the spec), removal, and no value in any status,
//! event or log line. The devices are played by writing what their agents publish into NATS.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use base64::Engine as _;
use fleet_operator::crd::{Device, DeviceGroup, FleetDeployment, PlacementStatus};
use fleet_wire::{
    Capability, DesiredState, DeviceId, DeviceSecrets, DeviceWorkloadStatus, Timestamp,
    WorkloadState, WorkloadStatus,
};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use std::sync::Mutex;
use std::time::Duration;

mod kube_common;
use kube_common::{eventually, kubectl, Fleet};

const IMAGE: &str = "registry.example:5000/team/app:1";
const REGISTRY: &str = "registry.example:5000";
// Distinct values, so that a grep for them finds only a leak.
const PASS1: &str = "pA55-first-9c1e7d";
const PASS2: &str = "pA55-second-4b8f2a";
const OTHER_PASS: &str = "pA55-other-registry-77d1";
const TOKEN1: &str = "t0ken-first-a5d2c9";
const TOKEN2: &str = "t0ken-second-e3f6b1";

/// Every log line of this test process (the operator runs in it), kept to grep for values.
static LOG: Mutex<Vec<String>> = Mutex::new(Vec::new());

struct Capture;

impl log::Log for Capture {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= log::Level::Debug
    }
    fn log(&self, r: &log::Record) {
        if self.enabled(r.metadata()) {
            let line = format!("{} {}: {}", r.level(), r.target(), r.args());
            LOG.lock().unwrap().push(line);
        }
    }
    fn flush(&self) {}
}

/// Every test of this binary starts with it, before anything logs (the shared client would set env_logger).
fn capture_logs() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        log::set_logger(&Capture).expect("the first logger");
        log::set_max_level(log::LevelFilter::Debug);
    });
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

fn docker_config(password: &str) -> serde_json::Value {
    json!({"auths": {
        REGISTRY: {"username": "fleet", "password": password},
        "https://other.example/v2/": {"auth": b64(&format!("robot:{OTHER_PASS}"))},
    }})
}

struct Rig {
    f: Fleet,
    ns: String,
    dep: String,
}

impl Rig {
    async fn secrets(&self) -> Api<Secret> {
        Api::namespaced(self.f.client.clone(), &self.ns)
    }

    async fn put_secret(&self, name: &str, type_: &str, data: serde_json::Value) {
        let s: Secret = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": name, "namespace": self.ns}, "type": type_, "stringData": data}))
        .unwrap();
        self.secrets()
            .await
            .patch(
                name,
                &PatchParams::apply("secrets-test").force(),
                &Patch::Apply(&s),
            )
            .await
            .expect("apply Secret");
    }

    async fn desired(&self, dev: &str) -> Option<DesiredState> {
        let store = self.f.bucket_when_made(fleet_wire::kv::DESIRED_STATE).await;
        let v = store.get(dev).await.ok()??;
        Some(serde_json::from_slice(&v).unwrap())
    }

    /// The `version` the device's desired state names for the `api` Secret (`None`: no `app` workload).
    async fn version(&self, dev: &str) -> Option<String> {
        let d = self.desired(dev).await?;
        let w = d.workloads.iter().find(|w| w.name.as_str() == "app")?;
        w.secrets[0].version.clone()
    }

    async fn device_secrets(&self, dev: &str) -> Option<DeviceSecrets> {
        let store = self
            .f
            .bucket_when_made(fleet_wire::kv::DEVICE_SECRETS)
            .await;
        let v = store.get(dev).await.ok()??;
        Some(serde_json::from_slice(&v).unwrap())
    }

    /// What the device's agent publishes for its desired state: `app` running since now.
    async fn report_running(&self, dev: &str) {
        let d = self.desired(dev).await.expect("a desired state");
        let s = DeviceWorkloadStatus {
            device_id: DeviceId::try_from(dev).unwrap(),
            generation: d.generation,
            at: Timestamp::now(),
            workloads: d
                .workloads
                .iter()
                .map(|w| WorkloadStatus {
                    name: w.name.clone(),
                    state: WorkloadState::Running,
                    container_id: Some("c".repeat(64)),
                    spec_digest: Some(w.digest()),
                    started_at: Some(Timestamp::from_unix_ms(Timestamp::now().unix_ms() - 1000)),
                    error: None,
                    failure: None,
                    restarts: None,
                    health: None,
                })
                .collect(),
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

    async fn status(&self) -> Option<PlacementStatus> {
        Api::<FleetDeployment>::all(self.f.client.clone())
            .get(&self.dep)
            .await
            .ok()?
            .status
    }

    async fn wait_ready(&self, reason: &str, fragment: &str) -> String {
        eventually(
            &format!("Ready reason {reason} with {fragment:?}"),
            || async {
                let s = self.status().await?;
                let c = s.conditions.iter().find(|c| c.type_ == "Ready")?;
                (c.reason == reason && c.message.contains(fragment)).then(|| c.message.clone())
            },
        )
        .await
    }
}

fn value_of<'a>(s: &'a DeviceSecrets, version: &str) -> Option<&'a str> {
    s.values
        .iter()
        .find(|v| v.secret == "api" && v.key == "token" && v.version == version)
        .map(|v| v.value.0.as_str())
}

/// The whole life of a deployment with a pull Secret and an application Secret: delivered to its targeted capable
/// devices only, for its image's registry only; a rotated pull Secret rewritten to every targeted device without
/// a rollout; a rotated application Secret staged (the canary first, a device held back keeps its old value); a
/// removed Secret fails the deployment closed; a removed deployment takes its credentials and values with it. No
/// value appears in the CR, events or any log line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_reach_only_targeted_devices_rotate_and_go() {
    capture_logs();
    let f = Fleet::start("sec").await;
    let ns = f.name("sec");
    Api::<Namespace>::all(f.client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
        )
        .await
        .expect("namespace");
    let dep = f.name("app");
    let mut r = Rig { f, ns, dep };

    // Devices: a canary and one more in the deployment, one outside it, one with an agent before WorkloadSpecV2.
    let group = r.f.name("fleet");
    let meta = json!({"name": group, "labels": r.f.labels(json!({}))});
    r.f.create::<DeviceGroup>(
        json!({"apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "DeviceGroup",
        "metadata": meta, "spec": {"selector": {"matchLabels": {"fleet-test": r.f.run}}}}),
    )
    .await;
    let [can, d1, out, old] = [
        r.f.name("can"),
        r.f.name("d1"),
        r.f.name("out"),
        r.f.name("old"),
    ];
    // The buckets first (as `fleet-operator buckets` makes them), so that the devices report before the operator.
    fleet_operator::kv::ensure_buckets(&r.f.js, &Default::default())
        .await
        .expect("buckets");
    let info = r.f.bucket_when_made(fleet_wire::kv::DEVICE_INFO).await;
    for (d, labels, v2) in [
        (&can, json!({"canary": "true", "role": "app"}), true),
        (&d1, json!({"role": "app"}), true),
        (&out, json!({}), true),
        (&old, json!({"role": "app"}), false),
    ] {
        let meta = json!({"name": d, "labels": r.f.labels(labels)});
        r.f.create::<Device>(
            json!({"apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "Device",
            "metadata": meta, "spec": {}}),
        )
        .await;
        let mut i = fleet_wire::fixtures::device_info();
        i.device_id = DeviceId::try_from(d.as_str()).unwrap();
        i.agent_version =
            fleet_wire::Version::try_from(if v2 { "2.0.0" } else { "1.0.0" }).unwrap();
        if v2 {
            i.capabilities.push(Capability::WorkloadSpecV2);
        }
        info.put(d, serde_json::to_vec(&i).unwrap().into())
            .await
            .expect("device info");
    }
    r.put_secret(
        "regcred",
        "kubernetes.io/dockerconfigjson",
        json!({".dockerconfigjson": docker_config(PASS1).to_string()}),
    )
    .await;
    r.put_secret("api", "Opaque", json!({"token": TOKEN1}))
        .await;
    let v1 = r
        .secrets()
        .await
        .get("api")
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let opts = fleet_operator::deployments::engine::Options {
        nats_url: r.f.nats.url(),
        instance: Some("op-secrets".into()),
        label_selector: Some(format!("fleet-test={}", r.f.run)),
        nats: Default::default(),
        secrets_namespace: Some(r.ns.clone()),
    };
    r.f.operators
        .push(kube_common::spawn_engine(r.f.client.clone(), opts));
    let meta = json!({"name": r.dep, "labels": r.f.labels(json!({}))});
    r.f.create::<FleetDeployment>(
        json!({"apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "FleetDeployment",
        "metadata": meta, "spec": {"allowedGroups": [group], "targetSelector": {"matchLabels": {"role": "app"}},
            "imagePullSecrets": [{"name": "regcred"}],
            "rollout": {"soakSeconds": 0, "maxFailures": 1},
            "workloads": [{"name": "app", "image": IMAGE, "secrets": [
                {"secret": "api", "key": "token", "env": "API_TOKEN"},
                {"secret": "api", "key": "token", "file": "/run/secrets/token", "uid": 1000}]}]}}),
    )
    .await;

    // The canary first, at the Secret's version; its key holds the credentials of its image's registry only and
    // the value at that version.
    eventually("the canary given the spec at v1", || async {
        (r.version(&can).await? == v1).then_some(())
    })
    .await;
    let s = r
        .device_secrets(&can)
        .await
        .expect("the canary's device-secrets");
    assert_eq!(s.registries.keys().collect::<Vec<_>>(), [REGISTRY]);
    assert_eq!(s.registries[REGISTRY].username, "fleet");
    assert_eq!(s.registries[REGISTRY].password.0, PASS1);
    assert_eq!(value_of(&s, &v1), Some(b64(TOKEN1).as_str()));
    assert_eq!(s.values.len(), 1, "one value for both uses of one key");
    r.report_running(&can).await;
    eventually("d1 given the spec after the canary", || async {
        (r.version(&d1).await? == v1).then_some(())
    })
    .await;
    r.report_running(&d1).await;
    let s1 = r.device_secrets(&d1).await.expect("d1's device-secrets");
    assert_eq!(value_of(&s1, &v1), Some(b64(TOKEN1).as_str()));

    // Outside the deployment: nothing. An older agent: not given the spec, reported by name and as failed.
    let m = r.wait_ready("Placed", "cannot honour secrets").await;
    assert!(
        m.contains(&format!(
            "device {old}'s agent 1.0.0 cannot honour secrets (upgrade its agent"
        )),
        "{m}"
    );
    assert_eq!(r.status().await.unwrap().rollout.unwrap().failed, 1);
    for d in [&out, &old] {
        assert!(
            r.device_secrets(d).await.is_none(),
            "{d} got device-secrets"
        );
        assert!(r.version(d).await.is_none(), "{d} got the workload");
    }
    let desired_json = serde_json::to_string(&r.desired(&can).await.unwrap()).unwrap();
    for v in [TOKEN1, PASS1] {
        assert!(!desired_json.contains(v) && !desired_json.contains(&b64(v)));
    }

    // A rotated pull Secret: rewritten to every targeted device in the next pass, no rollout (no new generation).
    let generations = (
        r.desired(&can).await.unwrap().generation,
        r.desired(&d1).await.unwrap().generation,
    );
    let rotated_at = std::time::Instant::now();
    r.put_secret(
        "regcred",
        "kubernetes.io/dockerconfigjson",
        json!({".dockerconfigjson": docker_config(PASS2).to_string()}),
    )
    .await;
    for d in [&can, &d1] {
        eventually(&format!("{d}'s pull credentials rotated"), || async {
            let s = r.device_secrets(d).await?;
            (s.registries.get(REGISTRY)?.password.0 == PASS2).then_some(())
        })
        .await;
    }
    // Woken by the Secret's watch, not found by the periodic pass (a minute: engine::RESYNC).
    assert!(
        rotated_at.elapsed() < fleet_operator::deployments::engine::RESYNC / 4,
        "the rotation took {:?}",
        rotated_at.elapsed()
    );
    assert_eq!(
        (
            r.desired(&can).await.unwrap().generation,
            r.desired(&d1).await.unwrap().generation
        ),
        generations
    );

    // A rotated application Secret: a new version, staged — the canary first; d1, held back, keeps v1's value.
    r.put_secret("api", "Opaque", json!({"token": TOKEN2}))
        .await;
    let v2 = r
        .secrets()
        .await
        .get("api")
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    assert_ne!(v1, v2);
    eventually("the canary given v2", || async {
        (r.version(&can).await? == v2).then_some(())
    })
    .await;
    let s = r.device_secrets(&can).await.unwrap();
    assert_eq!(value_of(&s, &v2), Some(b64(TOKEN2).as_str()));
    assert_eq!(
        value_of(&s, &v1),
        None,
        "v1's value goes with the spec that named it"
    );
    // why: no event marks a pass that gave d1 nothing before the canary ran; a few passes is the window
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        r.version(&d1).await.as_deref(),
        Some(v1.as_str()),
        "d1 before the canary ran v2"
    );
    let s1 = r.device_secrets(&d1).await.unwrap();
    assert_eq!(
        value_of(&s1, &v1),
        Some(b64(TOKEN1).as_str()),
        "d1 keeps v1's value"
    );
    assert_eq!(value_of(&s1, &v2), None);
    assert_eq!(s1.registries[REGISTRY].password.0, PASS2);
    r.report_running(&can).await;
    eventually("d1 given v2 after the canary", || async {
        (r.version(&d1).await? == v2).then_some(())
    })
    .await;
    let s1 = r.device_secrets(&d1).await.unwrap();
    assert_eq!(value_of(&s1, &v2), Some(b64(TOKEN2).as_str()));
    assert_eq!(s1.values.len(), 1);

    // A removed Secret: the deployment fails closed, naming it; nothing changes on the devices.
    let before = (
        r.desired(&can).await.unwrap(),
        r.device_secrets(&can).await.unwrap(),
    );
    r.secrets()
        .await
        .delete("api", &DeleteParams::default())
        .await
        .expect("delete Secret");
    let m = r.wait_ready("SecretMissing", "does not exist").await;
    assert!(m.contains(&format!("Secret {}/api", r.ns)), "{m}");
    // why: no event marks a pass that changed nothing after the Secret went; a few passes is the window
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(r.desired(&can).await.unwrap(), before.0);
    assert_eq!(r.device_secrets(&can).await.unwrap(), before.1);

    // A version written in the CR is refused: it is the operator's to set (the webhook calls the same check).
    let bad = r.f.name("pinned");
    let meta = json!({"name": bad, "labels": r.f.labels(json!({}))});
    r.f.create::<FleetDeployment>(
        json!({"apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "FleetDeployment",
        "metadata": meta, "spec": {"allowedGroups": [group],
            "workloads": [{"name": "pinned", "image": IMAGE, "secrets": [
                {"secret": "api", "key": "token", "env": "API_TOKEN", "version": "1"}]}]}}),
    )
    .await;
    eventually("the pinned version refused", || async {
        let s = Api::<FleetDeployment>::all(r.f.client.clone())
            .get(&bad)
            .await
            .ok()?
            .status?;
        let c = s.conditions.iter().find(|c| c.type_ == "Ready")?;
        (c.reason == "InvalidSpec"
            && c.message
                .contains("secrets[0].version: set by the operator"))
        .then_some(())
    })
    .await;

    // No value in the CR, its events, or any log line of the run.
    let (ok, yaml, err) = kubectl(&["get", "fdep", &r.dep, "-o", "yaml"], "");
    assert!(ok, "{err}");
    let (ok, events, err) = kubectl(&["get", "events", "-A", "-o", "yaml"], "");
    assert!(ok, "{err}");
    assert!(
        events.contains("SecretMissing"),
        "the removed Secret's Warning event is there to grep"
    );
    let logs = LOG.lock().unwrap().join("\n");
    assert!(
        logs.contains("device-secrets") || logs.contains("registry credentials"),
        "the log is captured"
    );
    for v in [PASS1, PASS2, OTHER_PASS, TOKEN1, TOKEN2] {
        for text in [v.to_owned(), b64(v)] {
            assert!(!yaml.contains(&text), "the CR shows a value");
            assert!(!events.contains(&text), "an event shows a value");
            assert!(!logs.contains(&text), "a log line shows a value");
        }
    }

    // The deployment removed: its workloads and its devices' device-secrets keys go.
    Api::<FleetDeployment>::all(r.f.client.clone())
        .delete(&r.dep, &DeleteParams::default())
        .await
        .expect("delete deployment");
    for d in [&can, &d1] {
        eventually(&format!("{d}'s device-secrets removed"), || async {
            r.device_secrets(d).await.is_none().then_some(())
        })
        .await;
        assert!(r.version(d).await.is_none());
    }
    r.f.kill_operators().await;
    let logs = LOG.lock().unwrap().join("\n");
    for v in [PASS1, PASS2, OTHER_PASS, TOKEN1, TOKEN2] {
        assert!(
            !logs.contains(v) && !logs.contains(&b64(v)),
            "a log line shows a value"
        );
    }
}

/// A client of the shared API server as the operator's service account (`fleet_rig::kube::OPERATOR_USER`), whose
/// rights are exactly what `operator/deploy/rbac.yaml` grants.
async fn operator_client() -> kube::Client {
    let api = kube_common::API.get().expect("apiserver started");
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&api.kubeconfig(api.operator_token()))
        .expect("kubeconfig");
    let cfg = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("client config");
    kube::Client::try_from(cfg).expect("client")
}

/// With `operator/deploy/rbac.yaml` as deployed and no `--secrets-namespace`: the operator, as its own service
/// account, reads the Secrets of `harmony-fleet-secrets` and delivers them, and may read no Secret of its own
/// namespace `harmony-fleet` (its NATS password lives there) nor of any other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deployed_rbac_reads_the_secrets_namespace_only() {
    capture_logs();
    let f = Fleet::start("secrbac").await;
    let rbac = fleet_rig::workspace_root().join("operator/deploy/rbac.yaml");
    let (ok, _, err) = kubectl(&["apply", "-f", &rbac.display().to_string()], "");
    assert!(ok, "kubectl apply rbac.yaml: {err}");
    let secret = f.name("api");
    for ns in ["harmony-fleet-secrets", "harmony-fleet"] {
        let s: Secret = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": secret, "namespace": ns}, "stringData": {"token": TOKEN1}}))
        .unwrap();
        Api::<Secret>::namespaced(f.client.clone(), ns)
            .create(&PostParams::default(), &s)
            .await
            .expect("create Secret");
    }
    let op = operator_client().await;
    for ns in ["harmony-fleet", "default"] {
        let e = Api::<Secret>::namespaced(op.clone(), ns)
            .get(&secret)
            .await
            .expect_err("the operator may not read it");
        assert!(
            matches!(&e, kube::Error::Api(s) if s.code == 403),
            "{ns}: {e}"
        );
    }
    fleet_operator::kv::ensure_buckets(&f.js, &Default::default())
        .await
        .expect("buckets");
    let dev = f.name("dev");
    let meta = json!({"name": dev, "labels": f.labels(json!({}))});
    f.create::<Device>(
        json!({"apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "Device",
        "metadata": meta, "spec": {}}),
    )
    .await;
    let mut i = fleet_wire::fixtures::device_info();
    i.device_id = DeviceId::try_from(dev.as_str()).unwrap();
    i.capabilities.push(Capability::WorkloadSpecV2);
    f.bucket_when_made(fleet_wire::kv::DEVICE_INFO)
        .await
        .put(&dev, serde_json::to_vec(&i).unwrap().into())
        .await
        .expect("device info");
    let group = f.name("fleet");
    let meta = json!({"name": group, "labels": f.labels(json!({}))});
    f.create::<DeviceGroup>(
        json!({"apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "DeviceGroup",
        "metadata": meta, "spec": {"devices": [dev]}}),
    )
    .await;
    let dep = f.name("app");
    let meta = json!({"name": dep, "labels": f.labels(json!({}))});
    f.create::<FleetDeployment>(
        json!({"apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "FleetDeployment",
        "metadata": meta, "spec": {"allowedGroups": [group],
            "workloads": [{"name": "app", "image": IMAGE, "secrets": [
                {"secret": secret, "key": "token", "env": "API_TOKEN"}]}]}}),
    )
    .await;
    let opts = fleet_operator::deployments::engine::Options {
        nats_url: f.nats.url(),
        instance: Some("op-rbac".into()),
        label_selector: Some(format!("fleet-test={}", f.run)),
        nats: Default::default(),
        secrets_namespace: None,
    };
    let mut f = f;
    f.operators.push(kube_common::spawn_engine(op, opts));
    let store = f.bucket_when_made(fleet_wire::kv::DEVICE_SECRETS).await;
    let delivered: DeviceSecrets = eventually("the value delivered", || async {
        let v = store.get(&dev).await.ok()??;
        serde_json::from_slice(&v).ok()
    })
    .await;
    assert_eq!(delivered.values.len(), 1);
    assert_eq!(delivered.values[0].value.0, b64(TOKEN1));
    for ns in ["harmony-fleet-secrets", "harmony-fleet"] {
        Api::<Secret>::namespaced(f.client.clone(), ns)
            .delete(&secret, &DeleteParams::default())
            .await
            .expect("delete Secret");
    }
}
