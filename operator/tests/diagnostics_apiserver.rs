//! DeviceDiagnostics through the real diagnostics controller, a real kube-apiserver + etcd, the operator's real
//! admission webhook and a real nats-server: a request becomes `diagnostics-request/<device>.<uid>`, a bundle
//! written to `diagnostics-bundle` lands in status (Complete) and the request key goes; an offline device's
//! request waits and says so, then completes when the device is back; a bundle that answers another request fails
//! the request, one for an unknown request is ignored; a finished request is deleted after its TTL; the spec is
//! immutable; who may ask is RBAC (a user without `fleet-diagnostics-requester` gets 403). A device has one open
//! request at a time (a later one waits, naming the open one, and is written once that finishes); at most
//! `max_open_requests` are open across the fleet (the others queued); a bundle key is deleted once copied into
//! status, and the sweep deletes request and bundle keys whose object is gone.
//!
//! The device is played by writing its bundle into NATS as the services' user (the agent's path through fleet-auth
//! is tested end to end in vm-tests), and its liveness by writing the Device's `Online` condition as the
//! deployments controller does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use fleet_operator::crd::diagnostics::{DeviceDiagnostics, DiagnosticsPhase};
use fleet_operator::crd::Device;
use fleet_wire::diagnostics::{DiagnosticsBundle, DiagnosticsRequest, Item, Section};
use fleet_wire::{AttemptId, DeviceId, Timestamp};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

mod kube_common;
use kube_common::{eventually, kubectl, Fleet};

/// A test's fleet with the diagnostics controller running on an operator runtime of its own, and the webhook
/// registered (and answering) for its objects.
struct World {
    f: Fleet,
    _webhook: kube_common::Webhook,
}

impl World {
    async fn start(run: &str) -> Self {
        let mut f = Fleet::start(run).await;
        // Buckets sized for a small fleet: JetStream reserves every bucket's byte limit on the disk, and the
        // default 10,000 devices would reserve about 3 GB per test.
        let nats = fleet_operator::kv::NatsSettings {
            buckets: fleet_operator::kv::Buckets::new(None, Some(100)).unwrap(),
            ..Default::default()
        };
        fleet_operator::kv::ensure_buckets(&f.js, &nats.buckets)
            .await
            .expect("buckets");
        spawn_controller(&mut f);
        let webhook = f.webhook().await;
        let w = Self {
            f,
            _webhook: webhook,
        };
        // The API server loads the webhook configuration asynchronously: wait for its first refusal (a typo).
        let probe = w.f.name("probe");
        eventually("the webhook refuses a typo", || async {
            // Raw JSON through kubectl: a typed create would drop the typo before sending it.
            let o = json!({"apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "DeviceDiagnostics",
                "metadata": {"name": probe, "labels": w.f.labels(json!({}))},
                "spec": {"device": "dev-x", "linez": 5}});
            let (ok, _, err) = kubectl(&["create", "-f", "-"], &o.to_string());
            if ok {
                // Not refused yet: the object went in with its typo; remove it and try again.
                let _ = kubectl(&["delete", "fdiag", &probe], "");
                return None;
            }
            err.contains("spec.linez").then_some(())
        })
        .await;
        w
    }

    /// Stops the diagnostics controller (as an operator that stopped: what it knew is lost).
    fn stop_controller(&mut self) {
        for o in self.f.operators.drain(..) {
            o.abort();
        }
    }

    fn api(&self) -> Api<DeviceDiagnostics> {
        Api::all(self.f.client.clone())
    }

    /// A Device named `base` (made unique), `online` or offline since an hour ago.
    async fn device(&self, base: &str, online: bool) -> String {
        let name = self.f.name(base);
        self.f
            .create::<Device>(
                json!({"apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "Device",
                "metadata": {"name": name, "labels": self.f.labels(json!({}))}, "spec": {}}),
            )
            .await;
        self.set_online(&name, online).await;
        name
    }

    /// Writes the Device's `Online` condition as the deployments controller does.
    async fn set_online(&self, device: &str, online: bool) {
        let (status, reason, at) = if online {
            ("True", "Heartbeating", Timestamp::now())
        } else {
            (
                "False",
                "Silent",
                Timestamp::from_unix_ms(Timestamp::now().unix_ms() - 3_600_000),
            )
        };
        let patch = json!({"status": {"conditions": [{"type": "Online", "status": status, "reason": reason,
            "message": "set by the test", "lastTransitionTime": at.to_string()}]}});
        Api::<Device>::all(self.f.client.clone())
            .patch_status(device, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("Device status");
    }

    /// Creates a DeviceDiagnostics named `base` (made unique) with `spec`; returns its name and request key.
    async fn ask(&self, base: &str, spec: serde_json::Value) -> (String, String) {
        let name = self.f.name(base);
        let o: DeviceDiagnostics = self
            .f
            .create(
                json!({"apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "DeviceDiagnostics",
                "metadata": {"name": name, "labels": self.f.labels(json!({}))}, "spec": spec}),
            )
            .await;
        let key = format!("{}.{}", o.spec.device, o.metadata.uid.unwrap());
        (name, key)
    }

    /// Waits until `name` is in `phase`; returns its message.
    async fn phase(&self, name: &str, phase: DiagnosticsPhase) -> DeviceDiagnostics {
        eventually(&format!("{name} {phase:?}"), || async {
            let o = self.api().get(name).await.ok()?;
            (o.status.as_ref()?.phase? == phase).then_some(o)
        })
        .await
    }

    /// The bundle at `key`, as bytes.
    async fn bundle_bytes(&self, key: &str) -> Option<Vec<u8>> {
        let store = self
            .f
            .js
            .get_key_value(fleet_wire::kv::DIAGNOSTICS_BUNDLE)
            .await
            .unwrap();
        store.get(key).await.unwrap().map(|b| b.to_vec())
    }

    /// `name`'s status message.
    async fn message(&self, name: &str) -> Option<String> {
        self.api().get(name).await.ok()?.status?.message
    }

    async fn request(&self, key: &str) -> Option<DiagnosticsRequest> {
        let store = self
            .f
            .js
            .get_key_value(fleet_wire::kv::DIAGNOSTICS_REQUEST)
            .await
            .unwrap();
        let bytes = store.get(key).await.unwrap()?;
        Some(DiagnosticsRequest::parse(&bytes).expect("a valid request"))
    }

    /// Writes `bundle` at `key` as the device's answer.
    async fn answer(&self, key: &str, bundle: &mut DiagnosticsBundle) {
        self.f
            .js
            .get_key_value(fleet_wire::kv::DIAGNOSTICS_BUNDLE)
            .await
            .unwrap()
            .put(key, bundle.to_bounded_json().into())
            .await
            .expect("bundle");
    }
}

/// Starts the diagnostics controller on an operator runtime of its own (its own caches and NATS link), with buckets
/// sized for 100 devices (JetStream reserves every bucket's byte limit on the disk, and the default 10,000 devices
/// would reserve about 3 GB per test).
fn spawn_controller(f: &mut Fleet) {
    let nats = fleet_operator::kv::NatsSettings {
        buckets: fleet_operator::kv::Buckets::new(None, Some(100)).unwrap(),
        ..Default::default()
    };
    let rt = fleet_operator::runtime::Runtime::new(
        f.client.clone(),
        &Some(format!("fleet-test={}", f.run)),
        &f.nats.url(),
        nats,
    );
    f.operators.push(tokio::spawn(async move {
        let r = fleet_operator::diagnostics::controller::run_with(&rt).await;
        panic!("the diagnostics controller ended: {r:?}");
    }));
}

fn bundle(device: &str, request: &str, text: &str) -> DiagnosticsBundle {
    DiagnosticsBundle {
        device: DeviceId::try_from(device).unwrap(),
        request: AttemptId::try_from(request).unwrap(),
        collected_at: Timestamp::now(),
        sections: vec![
            Section::new(Item::Disk, None, text, 10),
            Section::failed(Item::Memory, None, "not collected here"),
        ],
        redacted: 1,
        cut: false,
    }
}

fn uid_of(key: &str) -> &str {
    key.split_once('.').unwrap().1
}

/// Create → Pending with the request in KV; the bundle → Complete with its sections, the request key gone; the
/// spec cannot change; a request for a Device that does not exist fails and is deleted after its TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_is_answered_and_its_spec_is_immutable() {
    let w = World::start("diag-answer").await;
    let dev = w.device("dev", true).await;
    let (name, key) = w
        .ask(
            "ask",
            json!({"device": dev, "items": ["disk", "memory"], "lines": 10}),
        )
        .await;
    let o = w.phase(&name, DiagnosticsPhase::Pending).await;
    let status = o.status.unwrap();
    assert!(status.message.unwrap().contains("online"));
    assert!(status.requested_at.is_some());
    let r = eventually("the request in KV", || w.request(&key)).await;
    assert_eq!((r.items, r.lines), (vec![Item::Disk, Item::Memory], 10));

    // The spec is immutable (the webhook); metadata may change.
    let e = w
        .api()
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"lines": 11}})),
        )
        .await
        .expect_err("a spec change is refused");
    assert!(
        matches!(&e, kube::Error::Api(s) if s.message.contains("immutable")),
        "{e}"
    );
    w.api()
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"annotations": {"note": "x"}}})),
        )
        .await
        .expect("an annotation may change");

    w.answer(&key, &mut bundle(&dev, uid_of(&key), "/ 10G 4G free\n<b>&"))
        .await;
    let o = w.phase(&name, DiagnosticsPhase::Complete).await;
    let status = o.status.unwrap();
    assert!(status.completed_at.is_some());
    let b = status.bundle.expect("the bundle in status");
    assert_eq!(b.redacted, 1);
    assert_eq!(b.sections.len(), 2);
    assert_eq!(
        (b.sections[0].item.as_str(), b.sections[0].text.as_str()),
        ("disk", "/ 10G 4G free\n<b>&")
    );
    assert_eq!(b.sections[1].error.as_deref(), Some("not collected here"));
    eventually("the request key gone", || async {
        w.request(&key).await.is_none().then_some(())
    })
    .await;

    // No such Device: Failed at once, deleted ttlSecondsAfterFinished (1 s) later.
    let (gone, gone_key) = w
        .ask(
            "nodev",
            json!({"device": w.f.name("missing"), "ttlSecondsAfterFinished": 1}),
        )
        .await;
    let o = w.phase(&gone, DiagnosticsPhase::Failed).await;
    assert!(o.status.unwrap().message.unwrap().contains("no Device"));
    assert!(
        w.request(&gone_key).await.is_none(),
        "nothing written for it"
    );
    eventually("the finished request deleted after its TTL", || async {
        matches!(w.api().get(&gone).await, Err(kube::Error::Api(e)) if e.code == 404).then_some(())
    })
    .await;
    // The answered one (TTL a day by default) stays.
    assert!(w.api().get(&name).await.is_ok());
}

/// A request whose Device the operator has not seen yet (its Device cache may lag behind its DeviceDiagnostics
/// cache, or the Device is created just after the request) waits `MISSING_GRACE` (10 s) for it before it fails with
/// `no Device`: the Device created then, the request is written and answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_created_just_after_its_request_is_waited_for() {
    let w = World::start("diag-late").await;
    let dev = w.f.name("late");
    let (name, key) = w.ask("ask", json!({"device": dev})).await;
    let want = format!("no Device {dev} seen yet; the request fails if none appears within 10 s");
    eventually("the request waits for its Device", || async {
        w.message(&name).await?.starts_with(&want).then_some(())
    })
    .await;
    assert!(
        w.request(&key).await.is_none(),
        "nothing written for it yet"
    );
    assert_eq!(w.device("late", true).await, dev);
    eventually("the request in KV", || w.request(&key)).await;
    w.answer(&key, &mut bundle(&dev, uid_of(&key), "late"))
        .await;
    let o = w.phase(&name, DiagnosticsPhase::Complete).await;
    assert_eq!(o.status.unwrap().bundle.unwrap().sections[0].text, "late");
}

/// An offline device's request waits and says until when; the device comes back → Pending → its bundle → Complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offline_device_is_waited_for() {
    let w = World::start("diag-offline").await;
    let dev = w.device("dev", false).await;
    let (name, key) = w.ask("ask", json!({"device": dev})).await;
    let o = w.phase(&name, DiagnosticsPhase::Waiting).await;
    let m = o.status.unwrap().message.unwrap();
    assert!(
        m.contains(&format!("device {dev} has been offline since"))
            && m.contains("the request waits for it until"),
        "{m}"
    );
    // Written all the same: the device reads it when it is back.
    eventually("the request in KV", || w.request(&key)).await;
    w.set_online(&dev, true).await;
    w.phase(&name, DiagnosticsPhase::Pending).await;
    w.answer(&key, &mut bundle(&dev, uid_of(&key), "back"))
        .await;
    let o = w.phase(&name, DiagnosticsPhase::Complete).await;
    assert_eq!(o.status.unwrap().bundle.unwrap().sections[0].text, "back");
}

/// A bundle at a request's key that answers another request fails that request (Failed, saying so); a bundle at
/// the key of a request nobody made is ignored (the other request stays Pending, queued behind the first, and is
/// written once the first failed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bundle_for_another_request_does_not_complete_one() {
    let w = World::start("diag-wrong").await;
    let dev = w.device("dev", true).await;
    let (a, key_a) = w.ask("a", json!({"device": dev})).await;
    let (b, key_b) = w.ask("b", json!({"device": dev})).await;
    w.phase(&a, DiagnosticsPhase::Pending).await;
    w.phase(&b, DiagnosticsPhase::Pending).await;
    let stranger = AttemptId::new_random().to_string();
    // A request nobody made: ignored.
    w.answer(
        &format!("{dev}.{stranger}"),
        &mut bundle(&dev, &stranger, "x"),
    )
    .await;
    // At a's key, a bundle that says it answers b: a fails.
    w.answer(&key_a, &mut bundle(&dev, uid_of(&key_b), "x"))
        .await;
    let o = w.phase(&a, DiagnosticsPhase::Failed).await;
    let s = o.status.unwrap();
    assert!(
        s.message.unwrap().contains("does not answer this request"),
        "a"
    );
    assert!(s.bundle.is_none());
    let o = w.api().get(&b).await.unwrap();
    assert_eq!(
        o.status.unwrap().phase,
        Some(DiagnosticsPhase::Pending),
        "b is untouched"
    );
    eventually("a's request key gone", || async {
        w.request(&key_a).await.is_none().then_some(())
    })
    .await;
    // b waited for a (one open request per device) and is written once a finished.
    eventually("b's request written", || w.request(&key_b)).await;
}

/// Who may ask is RBAC: a user without `fleet-diagnostics-requester` (docs/diagnostics.md) gets 403 on create; with
/// it, create and get succeed (reading a bundle is `get`) and delete is still refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asking_needs_the_requester_role() {
    let f = Fleet::start("diag-rbac").await;
    let doc = std::fs::read_to_string(fleet_rig::workspace_root().join("docs/diagnostics.md"))
        .expect("docs/diagnostics.md");
    let role = doc
        .split("```")
        .find(|b| {
            b.contains("name: fleet-diagnostics-requester") && b.contains("kind: ClusterRole")
        })
        .expect("the role example in docs/diagnostics.md");
    let role = role.trim_start_matches("yaml").trim_start_matches("sh");
    let yaml = role
        .split_once("<<'EOF'\n")
        .map_or(role, |(_, y)| y)
        .split("\nEOF")
        .next()
        .unwrap();
    let (ok, _, err) = kubectl(&["apply", "-f", "-"], yaml);
    assert!(ok, "kubectl apply the role: {err}");
    let alice = f.name("alice");
    let nobody = f.name("nobody");
    let (ok, _, err) = kubectl(
        &[
            "create",
            "clusterrolebinding",
            &f.name("alice-asks"),
            "--clusterrole=fleet-diagnostics-requester",
            &format!("--user={alice}"),
        ],
        "",
    );
    assert!(ok, "bind: {err}");
    let obj = |n: &str| {
        json!({"apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "DeviceDiagnostics",
            "metadata": {"name": f.name(n)}, "spec": {"device": "dev-1"}})
        .to_string()
    };
    let (ok, _, err) = kubectl(&["--as", &nobody, "create", "-f", "-"], &obj("by-nobody"));
    assert!(!ok && err.contains("forbidden"), "{err}");
    // RBAC is loaded asynchronously too: the binding may take a moment to apply.
    let made = f.name("by-alice");
    eventually("alice may ask", || async {
        let (ok, _, _) = kubectl(&["--as", &alice, "create", "-f", "-"], &obj("by-alice"));
        ok.then_some(())
    })
    .await;
    let (ok, out, err) = kubectl(&["--as", &alice, "get", "fdiag", &made, "-o", "name"], "");
    assert!(ok && out.contains(&made), "{err}");
    let (ok, _, err) = kubectl(&["--as", &alice, "delete", "fdiag", &made], "");
    assert!(!ok && err.contains("forbidden"), "{err}");
    let (ok, _, err) = kubectl(&["delete", "fdiag", &made], "");
    assert!(ok, "{err}");
}

/// The sweep deletes a request key whose DeviceDiagnostics is gone (no object in the cluster has its UID) and keeps
/// the key of an object that exists, even one its cache does not know (another operator's label selector).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweep_deletes_requests_whose_object_is_gone() {
    let w = World::start("diag-sweep").await;
    let dev = w.device("dev", true).await;
    let (name, key) = w.ask("kept", json!({"device": dev})).await;
    w.phase(&name, DiagnosticsPhase::Pending).await;
    let store =
        w.f.js
            .get_key_value(fleet_wire::kv::DIAGNOSTICS_REQUEST)
            .await
            .unwrap();
    let orphan = format!("{dev}.{}", AttemptId::new_random());
    let request = DiagnosticsRequest {
        items: vec![],
        workloads: vec![],
        lines: 5,
        since_seconds: None,
        requested_at: Timestamp::now(),
    };
    store
        .put(&orphan, serde_json::to_vec(&request).unwrap().into())
        .await
        .unwrap();
    // Known to no cache here: the object's UID is found by the sweep's own list.
    let bundles =
        w.f.js
            .get_key_value(fleet_wire::kv::DIAGNOSTICS_BUNDLE)
            .await
            .unwrap();
    let orphan_bundle = format!("{dev}.{}", AttemptId::new_random());
    w.answer(
        &orphan_bundle,
        &mut bundle(&dev, uid_of(&orphan_bundle), "orphan"),
    )
    .await;
    let deleted = fleet_operator::diagnostics::sweep::run(
        &w.f.client,
        &[&store, &bundles],
        &Default::default(),
    )
    .await
    .expect("sweep");
    assert_eq!(deleted, 2);
    assert!(w.request(&orphan).await.is_none(), "the orphan is gone");
    assert!(
        w.bundle_bytes(&orphan_bundle).await.is_none(),
        "the orphan bundle is gone"
    );
    assert!(
        w.request(&key).await.is_some(),
        "the object's request stays"
    );
}

/// One open request per device: a second request for the same device is not written while the first is open, and
/// says it waits for it; once the first is answered (Complete, its bundle key deleted), the second is written and
/// answered in turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_has_one_open_request_at_a_time() {
    let w = World::start("diag-one").await;
    let dev = w.device("dev", true).await;
    // Names in creation order also when both are created within one second (the queue's order: creation, then
    // name).
    let (first, key1) = w.ask("a-first", json!({"device": dev})).await;
    let (second, key2) = w.ask("b-second", json!({"device": dev})).await;
    eventually("the first request in KV", || w.request(&key1)).await;
    let want = format!(
        "queued: waits for request {first}, which is open for device {dev} (a device answers one request at a \
         time); written for device {dev} once that changes"
    );
    eventually("the second says it waits for the first", || async {
        (w.message(&second).await? == want).then_some(())
    })
    .await;
    let o = w.api().get(&second).await.unwrap();
    assert_eq!(o.status.unwrap().phase, Some(DiagnosticsPhase::Pending));
    assert!(
        w.request(&key2).await.is_none(),
        "the second is not written while the first is open"
    );
    let m = w.message(&first).await.unwrap();
    assert!(m.starts_with(&format!("written for device {dev}")), "{m}");

    w.answer(&key1, &mut bundle(&dev, uid_of(&key1), "one"))
        .await;
    let o = w.phase(&first, DiagnosticsPhase::Complete).await;
    assert_eq!(o.status.unwrap().bundle.unwrap().sections[0].text, "one");
    eventually("the first's bundle key deleted once copied", || async {
        w.bundle_bytes(&key1).await.is_none().then_some(())
    })
    .await;
    eventually("the first's request key deleted", || async {
        w.request(&key1).await.is_none().then_some(())
    })
    .await;
    eventually("the second written", || w.request(&key2)).await;
    eventually("the second says it is written", || async {
        w.message(&second)
            .await?
            .starts_with(&format!("written for device {dev}"))
            .then_some(())
    })
    .await;
    w.answer(&key2, &mut bundle(&dev, uid_of(&key2), "two"))
        .await;
    let o = w.phase(&second, DiagnosticsPhase::Complete).await;
    assert_eq!(o.status.unwrap().bundle.unwrap().sections[0].text, "two");
    eventually("the second's bundle key deleted", || async {
        w.bundle_bytes(&key2).await.is_none().then_some(())
    })
    .await;
}

/// An operator that starts counts the request keys that exist as open, whoever wrote them: with its request B's key
/// already in KV (written by another replica, or by this operator before it restarted) and an older request A of
/// the same device not written, the operator that starts does not write A (the device would read only the newer
/// key) but says A waits for B; once B is answered, A is written and answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_that_starts_counts_the_keys_that_exist() {
    let mut w = World::start("diag-restart").await;
    w.stop_controller();
    let dev = w.device("dev", true).await;
    let (a, key_a) = w.ask("a-older", json!({"device": dev})).await;
    let (b, key_b) = w.ask("b-newer", json!({"device": dev})).await;
    let request = DiagnosticsRequest {
        items: vec![],
        workloads: vec![],
        lines: 200,
        since_seconds: None,
        requested_at: Timestamp::now(),
    };
    w.f.js
        .get_key_value(fleet_wire::kv::DIAGNOSTICS_REQUEST)
        .await
        .unwrap()
        .put(&key_b, serde_json::to_vec(&request).unwrap().into())
        .await
        .unwrap();
    spawn_controller(&mut w.f);
    let want = format!("queued: waits for request {b}, which is open for device {dev}");
    eventually("the older one waits for the open one", || async {
        w.message(&a).await?.starts_with(&want).then_some(())
    })
    .await;
    assert!(w.request(&key_a).await.is_none(), "a is not written");
    w.answer(&key_b, &mut bundle(&dev, uid_of(&key_b), "b"))
        .await;
    w.phase(&b, DiagnosticsPhase::Complete).await;
    eventually("a written once b finished", || w.request(&key_a)).await;
    w.answer(&key_a, &mut bundle(&dev, uid_of(&key_a), "a"))
        .await;
    let o = w.phase(&a, DiagnosticsPhase::Complete).await;
    assert_eq!(o.status.unwrap().bundle.unwrap().sections[0].text, "a");
}

/// The fleet-wide cap: with buckets for 100 devices, `max_open_requests(100)` (72: the bundle bucket's 8 MiB floor
/// holds 72 bundles of 112 KiB) requests are open at once. More requests than that, and than one pass writes for
/// (`MAX_WRITES_PER_PASS`), each for its own device: the oldest 72 are written, the others say they are queued;
/// every bundle of the written ones, all arriving at once, completes its request (none is lost between passes) and
/// is deleted, the queued ones are written in turn, and every one ends Complete with its own text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_requests_than_the_fleet_cap_are_queued_and_all_complete() {
    let w = World::start("diag-many").await;
    let cap = fleet_wire::diagnostics::max_open_requests(100) as usize;
    assert_eq!(cap, 72);
    let n = fleet_operator::diagnostics::controller::MAX_WRITES_PER_PASS + 10;
    assert!(n > cap);
    let mut asked = vec![];
    for i in 0..n {
        // Zero-padded names: creation order, also within one second.
        let dev = w.device(&format!("dev-{i:03}"), true).await;
        let (name, key) = w
            .ask(
                &format!("many-{i:03}"),
                json!({"device": dev, "items": ["disk"]}),
            )
            .await;
        asked.push((dev, name, key));
    }
    let (open, queued) = asked.split_at(cap);
    for (_, _, key) in open {
        eventually("the oldest requests in KV", || w.request(key)).await;
    }
    let want = format!("queued: {cap} requests are open across the fleet (at most {cap})");
    for (_, name, key) in queued {
        eventually("the others queued", || async {
            w.message(name).await?.starts_with(&want).then_some(())
        })
        .await;
        assert!(w.request(key).await.is_none(), "{name} is not written");
    }
    for (dev, _, key) in open {
        w.answer(key, &mut bundle(dev, uid_of(key), key)).await;
    }
    for (dev, _, key) in queued {
        eventually("the queued requests written once others finish", || {
            w.request(key)
        })
        .await;
        w.answer(key, &mut bundle(dev, uid_of(key), key)).await;
    }
    for (_, name, key) in &asked {
        let o = w.phase(name, DiagnosticsPhase::Complete).await;
        assert_eq!(&o.status.unwrap().bundle.unwrap().sections[0].text, key);
    }
    for (_, _, key) in &asked {
        eventually("every bundle key deleted", || async {
            w.bundle_bytes(key).await.is_none().then_some(())
        })
        .await;
    }
}
