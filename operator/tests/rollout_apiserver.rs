//! Staged AgentRelease rollouts through the real operator loop, a real kube-apiserver + etcd and a real
//! nats-server: the devices are played by writing what their agents and updaters publish (`device-info`,
//! `agent-upgrade-status`, `device-heartbeat`) into NATS, as the other apiserver tests do; everything the
//! operator decides is read back from NATS and from the API server (`kubectl get frel` included).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use fleet_operator::crd::{AgentRelease, Device, DeviceGroup, PlacementStatus, RolloutPhase};
use fleet_wire::{
    fixtures, AgentUpgradeAttempt, AgentUpgradeStatus, DeviceId, DeviceInfo, Heartbeat, Timestamp,
    UpgradePhase, Version,
};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use std::time::Duration;

mod kube_common;
use kube_common::{eventually, kubectl, Fleet};

const OLD: &str = "1.0.0";
const NEW: &str = "2.0.0";

/// The test's fleet with helpers that play the devices.
struct Rig {
    f: Fleet,
    group: String,
}

impl Rig {
    async fn new(run: &str) -> Self {
        let f = Fleet::start(run).await;
        let group = f.name("fleet");
        let meta = json!({"name": group, "labels": f.labels(json!({}))});
        f.create::<DeviceGroup>(
            json!({"apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "DeviceGroup",
            "metadata": meta, "spec": {"selector": {"matchLabels": {"fleet-test": f.run}}}}),
        )
        .await;
        Rig { f, group }
    }

    async fn put<T: serde::Serialize>(&self, bucket: &str, key: &str, v: &T) {
        self.f
            .bucket_when_made(bucket)
            .await
            .put(key, serde_json::to_vec(v).unwrap().into())
            .await
            .expect("put");
    }

    /// A device (Device object with `labels`) whose agent runs `version`, started at `started`.
    async fn device(&self, name: &str, labels: serde_json::Value) {
        let meta = json!({"name": name, "labels": self.f.labels(labels)});
        self.f.create::<Device>(
            json!({"apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "Device", "metadata": meta, "spec": {}}),
        )
        .await;
    }

    async fn agent_started(&self, name: &str, version: &str, at: Timestamp) {
        let mut info: DeviceInfo = fixtures::device_info();
        info.device_id = DeviceId::try_from(name).unwrap();
        info.agent_version = Version::try_from(version).unwrap();
        info.published_at = at;
        self.put(fleet_wire::kv::DEVICE_INFO, name, &info).await;
    }

    async fn heartbeat(&self, name: &str, version: &str, at: Timestamp) {
        let mut h: Heartbeat = fixtures::heartbeat();
        h.device_id = DeviceId::try_from(name).unwrap();
        h.agent_version = Version::try_from(version).unwrap();
        h.at = at;
        self.put(fleet_wire::kv::DEVICE_HEARTBEAT, name, &h).await;
    }

    async fn intent(&self, name: &str) -> Option<AgentUpgradeAttempt> {
        let v = self
            .f
            .bucket_when_made(fleet_wire::kv::AGENT_UPGRADE_INTENT)
            .await
            .get(name)
            .await
            .ok()??;
        Some(serde_json::from_slice(&v).unwrap())
    }

    /// The updater's status for `a` in `phase`, entered at `at`.
    async fn status(&self, a: &AgentUpgradeAttempt, phase: UpgradePhase, at: Timestamp) {
        let mut s: AgentUpgradeStatus = if phase == UpgradePhase::Failed {
            fixtures::failed_status()
        } else {
            fixtures::upgrade_status()
        };
        s.device_id = a.device_id.clone();
        s.attempt_id = Some(a.attempt_id);
        s.target_version = Some(a.target_version.clone());
        s.phase = phase;
        s.phase_changed_at = at;
        self.put(
            fleet_wire::kv::AGENT_UPGRADE_STATUS,
            a.device_id.as_str(),
            &s,
        )
        .await;
    }

    /// What a good upgrade of `name` publishes: the new agent starts, the updater commits, it beats.
    async fn commit(&self, a: &AgentUpgradeAttempt, at: Timestamp) {
        let name = a.device_id.as_str();
        self.agent_started(name, NEW, at).await;
        self.status(
            a,
            UpgradePhase::Complete,
            at.plus(Duration::from_millis(500)),
        )
        .await;
        self.heartbeat(name, NEW, at.plus(Duration::from_secs(1)))
            .await;
    }

    async fn release(&self, name: &str, rollout: serde_json::Value) {
        let a = fixtures::attempt();
        let meta = json!({"name": name, "labels": self.f.labels(json!({}))});
        self.f.create::<AgentRelease>(json!({
            "apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "AgentRelease", "metadata": meta,
            "spec": {"allowedGroups": [self.group], "rollout": rollout,
                "builds": [{"architecture": "arm64", "version": NEW, "artifact": a.artifact.to_string(),
                    "sha256": a.sha256.as_str(), "byteLimit": 20_000_000}]}
        }))
        .await;
    }

    async fn release_status(&self, name: &str) -> Option<PlacementStatus> {
        Api::<AgentRelease>::all(self.f.client.clone())
            .get(name)
            .await
            .ok()?
            .status
    }

    /// Waits for the release's rollout `phase` with `(updated, healthy, pending, failed)`.
    async fn wait_rollout(
        &self,
        name: &str,
        phase: RolloutPhase,
        counts: (u32, u32, u32, u32),
    ) -> PlacementStatus {
        let mut last = None;
        let what = format!("{name}: {phase:?} {counts:?}");
        let found = tokio::time::timeout(kube_common::DEADLINE, async {
            loop {
                if let Some(s) = self.release_status(name).await {
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

    /// Writes to the intent bucket so far (each write takes one stream sequence number).
    async fn intent_writes(&self) -> u64 {
        let mut stream = self
            .f
            .js
            .get_stream(format!("KV_{}", fleet_wire::kv::AGENT_UPGRADE_INTENT))
            .await
            .expect("stream");
        stream.info().await.expect("info").state.last_sequence
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

/// `kubectl get frel <name>` as a person runs it: the row's cells under the given columns.
fn kubectl_columns(name: &str, columns: &[&str]) -> Vec<String> {
    let (ok, table, stderr) = kubectl(&["get", "frel", name], "");
    assert!(ok, "kubectl get frel: {stderr}");
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

/// A good staged release: the canary first, its soak, then the other two one at a time (`maxUnavailable: 1`),
/// each step visible in `kubectl get frel`; the operator killed in the middle resumes without giving anyone the
/// release twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn canary_soak_then_one_at_a_time_across_an_operator_kill() {
    let mut r = Rig::new("roll-good").await;
    let (c, d1, d2) = (r.f.name("can"), r.f.name("d1"), r.f.name("d2"));
    r.device(&c, json!({"canary": "true"})).await;
    r.device(&d1, json!({})).await;
    r.device(&d2, json!({})).await;
    r.f.start_engine();
    let t0 = Timestamp::now();
    for n in [&c, &d1, &d2] {
        r.agent_started(n, OLD, t0).await;
        r.heartbeat(n, OLD, t0).await;
    }
    let rel = r.f.name("v2");
    r.release(&rel, json!({"soakSeconds": 3, "maxUnavailable": 1}))
        .await;

    // only the canary is given the release
    let a_c = eventually("canary intent", || r.intent(&c)).await;
    let st = r
        .wait_rollout(&rel, RolloutPhase::Progressing, (0, 0, 2, 0))
        .await;
    assert_eq!(condition(&st, "Halted").status, "False");
    assert_eq!(
        kubectl_columns(&rel, &["PHASE", "UPDATED", "HEALTHY", "PENDING", "FAILED"]),
        ["Progressing", "0", "0", "2", "0"]
    );
    // the canary commits: it soaks; the others still wait
    let t1 = Timestamp::now();
    r.commit(&a_c, t1).await;
    r.wait_rollout(&rel, RolloutPhase::Soaking, (1, 0, 2, 0))
        .await;
    assert_eq!(
        kubectl_columns(&rel, &["PHASE", "UPDATED", "HEALTHY", "PENDING"]),
        ["Soaking", "1", "0", "2"]
    );
    // why: no event marks a pass that released nothing during the soak; a few passes is the window
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        r.intent(&d1).await.is_none() && r.intent(&d2).await.is_none(),
        "released before the canary's soak"
    );
    // a heartbeat after the soak: one more device (the first by id), not two
    r.heartbeat(&c, NEW, t1.plus(Duration::from_secs(4))).await;
    let a_1 = eventually("d1 intent", || r.intent(&d1)).await;
    r.wait_rollout(&rel, RolloutPhase::Progressing, (1, 1, 1, 0))
        .await;
    assert!(
        r.intent(&d2).await.is_none(),
        "maxUnavailable 1 gave two devices the release"
    );
    assert_eq!(r.intent_writes().await, 2);

    // the operator dies mid-rollout; a new one takes over from what NATS says
    r.f.kill_operators().await;
    r.f.start_engine();
    // why: no event marks the new operator's passes that released nothing; its first passes are the window
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        r.intent(&d2).await.is_none(),
        "a restarted operator released d2 while d1 updates"
    );
    assert_eq!(
        r.intent_writes().await,
        2,
        "a restarted operator wrote an intent again"
    );

    let t2 = Timestamp::now();
    r.commit(&a_1, t2).await;
    r.heartbeat(&d1, NEW, t2.plus(Duration::from_secs(4))).await;
    let a_2 = eventually("d2 intent", || r.intent(&d2)).await;
    let t3 = Timestamp::now();
    r.commit(&a_2, t3).await;
    r.heartbeat(&d2, NEW, t3.plus(Duration::from_secs(4))).await;
    let st = r
        .wait_rollout(&rel, RolloutPhase::Complete, (3, 3, 0, 0))
        .await;
    assert_eq!(condition(&st, "Progressing").reason, "RolloutComplete");
    assert_eq!(
        kubectl_columns(&rel, &["PHASE", "UPDATED", "HEALTHY", "PENDING", "FAILED"]),
        ["Complete", "3", "3", "0", "0"]
    );
    // each device was given the release exactly once
    assert_eq!(r.intent_writes().await, 3);
    assert_eq!(
        [a_c.attempt_id, a_1.attempt_id, a_2.attempt_id]
            .map(|a| a.to_string())
            .len(),
        3
    );
}

/// A canary whose new agent commits and then restarts during its soak (a latent bug) halts the release with the
/// canary named: condition, Warning event, metric, and the other devices never get an intent. A failed canary
/// attempt retried by the documented annotation gets one new attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canary_that_restarts_in_its_soak_halts_and_a_retry_annotation_retries_once() {
    let mut r = Rig::new("roll-halt").await;
    let (c, d1, d2) = (r.f.name("can"), r.f.name("d1"), r.f.name("d2"));
    r.device(&c, json!({"canary": "true"})).await;
    r.device(&d1, json!({})).await;
    r.device(&d2, json!({})).await;
    r.f.start_engine();
    let t0 = Timestamp::now();
    for n in [&c, &d1, &d2] {
        r.agent_started(n, OLD, t0).await;
        r.heartbeat(n, OLD, t0).await;
    }
    let rel = r.f.name("v2");
    r.release(&rel, json!({"soakSeconds": 600, "maxUnavailable": 1}))
        .await;
    let a_c = eventually("canary intent", || r.intent(&c)).await;
    let t1 = Timestamp::now();
    r.commit(&a_c, t1).await;
    r.wait_rollout(&rel, RolloutPhase::Soaking, (1, 0, 2, 0))
        .await;
    // 30 s later (in the device's clock) the agent exits and systemd starts it again
    r.agent_started(&c, NEW, t1.plus(Duration::from_secs(30)))
        .await;
    let st = r
        .wait_rollout(&rel, RolloutPhase::Halted, (0, 0, 2, 1))
        .await;
    let halted = condition(&st, "Halted");
    assert_eq!(
        (halted.status.as_str(), halted.reason.as_str()),
        ("True", "CanaryFailed")
    );
    assert!(
        halted
            .message
            .contains(&format!("{c} (agent restarted during its soak)")),
        "{}",
        halted.message
    );
    assert_eq!(condition(&st, "Progressing").status, "False");
    // The condition history tells the rollout's story in order: it progressed, then the canary halted it (the
    // halt's entry is the condition as written, at its transition time).
    let story: Vec<(&str, &str, &str)> = st
        .condition_history
        .iter()
        .filter(|h| h.type_ == "Progressing" || h.type_ == "Halted")
        .map(|h| (h.type_.as_str(), h.status.as_str(), h.reason.as_str()))
        .collect();
    let at = |want: (&str, &str, &str)| story.iter().position(|x| *x == want);
    let (soaking, halt) = (
        at(("Progressing", "True", "Soaking")),
        at(("Halted", "True", "CanaryFailed")),
    );
    assert!(
        soaking.is_some() && halt.is_some() && soaking < halt,
        "history: {story:?}"
    );
    let entry = st
        .condition_history
        .iter()
        .rfind(|h| h.type_ == "Halted" && h.status == "True")
        .expect("the halt in the history");
    // History entries keep a message of at most MAX_HISTORY_MESSAGE_CHARS (cut with an ellipsis).
    let bound = fleet_operator::conditions::MAX_HISTORY_MESSAGE_CHARS;
    let kept: String = if halted.message.chars().count() <= bound {
        halted.message.clone()
    } else {
        halted
            .message
            .chars()
            .take(bound - 1)
            .chain(['…'])
            .collect()
    };
    assert_eq!(
        (&entry.time, entry.message.as_str()),
        (&halted.last_transition_time, kept.as_str())
    );
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(r.f.client.clone(), "default");
    let ev = eventually("CanaryFailed Warning event", || async {
        let list = events.list(&Default::default()).await.ok()?;
        list.items.into_iter().find(|e| {
            e.reason.as_deref() == Some("CanaryFailed")
                && e.type_.as_deref() == Some("Warning")
                && e.regarding.as_ref().and_then(|x| x.name.as_deref()) == Some(rel.as_str())
        })
    })
    .await;
    // the event belongs to the release (kind and uid, as `kubectl describe` finds it) and says what the
    // condition says, word for word
    let regarding = ev.regarding.clone().expect("regarding");
    let uid = Api::<AgentRelease>::all(r.f.client.clone())
        .get(&rel)
        .await
        .expect("the release")
        .metadata
        .uid;
    assert_eq!(
        (regarding.kind.as_deref(), regarding.uid, ev.note.as_deref()),
        (Some("AgentRelease"), uid, Some(halted.message.as_str()))
    );
    let halts = fleet_operator::metrics::global()
        .rollout_halts
        .get_or_create(&vec![
            ("kind", "AgentRelease".to_owned()),
            ("reason", "CanaryFailed".to_owned()),
        ])
        .get();
    assert!(halts >= 1, "halt metric: {halts}");
    assert_eq!(
        kubectl_columns(&rel, &["PHASE", "FAILED", "PENDING"]),
        ["Halted", "1", "2"]
    );
    // why: no event marks a pass of a halted rollout that released nothing; a few passes is the window
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        r.intent(&d1).await.is_none() && r.intent(&d2).await.is_none(),
        "a halted rollout released a device"
    );

    // a second release: its canary's attempt fails (rolled back): halted, then retried once per annotation value
    let rel2 = r.f.name("v2b");
    let c2 = r.f.name("can2");
    r.device(&c2, json!({"canary": "true", "wave": "2"})).await;
    r.agent_started(&c2, OLD, t0).await;
    // rel2 is newer: it takes every device; the first release keeps its own view of what it still owns
    r.release(&rel2, json!({})).await;
    let first = eventually("c2 intent", || async {
        r.intent(&c2)
            .await
            .filter(|a| a.target_version.as_str() == NEW)
    })
    .await;
    r.status(&first, UpgradePhase::Failed, Timestamp::now())
        .await;
    let st = eventually("rel2 halted on the failed canary", || async {
        let s = r.release_status(&rel2).await?;
        (s.rollout.as_ref()?.phase == RolloutPhase::Halted).then_some(s)
    })
    .await;
    assert!(condition(&st, "Halted")
        .message
        .contains(&format!("{c2} (attempt failed)")));
    let before = r.intent_writes().await;
    Api::<AgentRelease>::all(r.f.client.clone())
        .patch(
            &rel2,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"fleet.nationtech.io/retry": "1"}}})),
        )
        .await
        .expect("annotate");
    let retried = eventually("a new attempt for the failed canary", || async {
        r.intent(&c2)
            .await
            .filter(|a| a.attempt_id != first.attempt_id)
    })
    .await;
    assert_eq!(retried.target_version, first.target_version);
    // why: lets the operator's passes after the retry run first (no event marks them)
    tokio::time::sleep(Duration::from_secs(2)).await;
    // one new attempt per value: the retried one is kept, even when it fails again
    r.status(&retried, UpgradePhase::Failed, Timestamp::now())
        .await;
    // why: no event marks a pass that made no second attempt; a few passes is the window
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        r.intent(&c2).await.map(|a| a.attempt_id),
        Some(retried.attempt_id)
    );
    assert_eq!(
        r.intent_writes().await,
        before + 1,
        "the retry wrote more than one attempt"
    );
}

/// Two AgentReleases on the same devices: the newer owns them, whatever the names; the older keeps its counts
/// and conditions and says which devices were taken (`Superseded`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_releases_the_newest_wins_and_the_older_keeps_its_status() {
    let mut r = Rig::new("roll-overlap").await;
    let (a, b) = (r.f.name("a"), r.f.name("b"));
    r.device(&a, json!({"site": "x"})).await;
    r.device(&b, json!({"site": "y"})).await;
    r.f.start_engine();
    let t0 = Timestamp::now();
    for n in [&a, &b] {
        r.agent_started(n, OLD, t0).await;
    }
    // the older release's name sorts last, the newer's first: name order must not matter
    let older = r.f.name("z-old");
    r.release(&older, serde_json::Value::Null).await;
    eventually("the older release's attempt on b", || r.intent(&b)).await;
    // creation timestamps have one-second resolution
    // why: creation timestamps have one-second resolution: the newer release must be a second younger
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let newer = r.f.name("a-new");
    let meta = json!({"name": newer, "labels": r.f.labels(json!({}))});
    let art = fixtures::attempt();
    r.f.create::<AgentRelease>(json!({
        "apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "AgentRelease", "metadata": meta,
        "spec": {"allowedGroups": [r.group], "targetSelector": {"matchLabels": {"site": "x"}},
            "builds": [{"architecture": "arm64", "version": "3.0.0", "artifact": art.artifact.to_string(),
                "sha256": art.sha256.as_str(), "byteLimit": 20_000_000}]}
    }))
    .await;
    let taken = eventually("the newer release's attempt on a", || async {
        r.intent(&a)
            .await
            .filter(|x| x.target_version.as_str() == "3.0.0")
    })
    .await;
    let old = eventually("the older release reports a superseded device", || async {
        let s = r.release_status(&older).await?;
        (s.superseded == Some(1)).then_some(s)
    })
    .await;
    let sup = condition(&old, "Superseded");
    assert_eq!(
        (sup.status.as_str(), sup.reason.as_str()),
        ("True", "NewerRelease")
    );
    assert!(
        sup.message.contains(&format!("{a} (by {newer})")),
        "{}",
        sup.message
    );
    // its own counts and conditions are all there
    assert_eq!(condition(&old, "Ready").status, "True");
    assert_eq!(old.targeted_devices, Some(1));
    assert_eq!(old.rollout.as_ref().map(|x| x.updating), Some(1));
    for t in ["Degraded", "Progressing", "Halted", "NatsReachable"] {
        condition(&old, t);
    }
    let new = r
        .wait_rollout(&newer, RolloutPhase::Progressing, (0, 0, 0, 0))
        .await;
    assert_eq!(condition(&new, "Ready").status, "True");
    assert!(new.conditions.iter().all(|c| c.type_ != "Superseded"));
    // b stays the older release's
    assert_eq!(
        r.intent(&b)
            .await
            .map(|x| x.target_version.as_str().to_owned()),
        Some(NEW.into())
    );
    assert_eq!(r.intent(&a).await, Some(taken));
}
