//! The operator against a real kube-apiserver + etcd (one pair for this whole test binary, shared by its tests)
//! and a real nats-server per test. Each test labels its objects with its own `fleet-test=<id>` and runs its
//! operators with that label selector, so tests run in parallel without seeing each other's objects.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use async_nats::jetstream::kv;
use fleet_operator::crd::{AgentRelease, Device, DeviceGroup, FleetDeployment};
use fleet_operator::deployments::engine::Options;
use fleet_wire::{
    fixtures, AgentUpgradeAttempt, AttemptId, BoundedText, DesiredState, DeviceId, DeviceInfo,
    DeviceWorkloadStatus, UpgradePhase, Version, WorkloadState, WorkloadStatus,
};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use std::time::Duration;

mod kube_common;
use kube_common::{eventually, kubectl, Fleet};

impl Fleet {
    async fn new(run: &str) -> Self {
        Fleet::start(run).await
    }

    fn start_operator(&mut self) {
        let opts = Options {
            nats_url: self.nats.url(),
            instance: Some(format!("op-{}", self.operators.len())),
            label_selector: Some(format!("fleet-test={}", self.run)),
            nats: Default::default(),
            secrets_namespace: None,
        };
        self.operators
            .push(kube_common::spawn_engine(self.client.clone(), opts));
    }

    fn meta(&self, name: &str, extra: serde_json::Value) -> serde_json::Value {
        json!({"name": name, "labels": self.labels(extra)})
    }

    async fn device(&self, name: &str, labels: serde_json::Value) {
        let meta = self.meta(name, labels);
        self.create::<Device>(json!({"apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "Device", "metadata": meta, "spec": {}}))
            .await;
    }

    async fn group(&self, name: &str, selector: serde_json::Value) {
        let meta = self.meta(name, json!({}));
        self.create::<DeviceGroup>(json!({"apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "DeviceGroup", "metadata": meta, "spec": {"selector": selector}}))
            .await;
    }

    async fn bucket(&self, name: &str) -> kv::Store {
        eventually(
            &format!("bucket {name} created by the operator"),
            || async { self.js.get_key_value(name).await.ok() },
        )
        .await
    }

    async fn desired(&self, device: &str) -> Option<DesiredState> {
        let store = self.bucket(fleet_wire::kv::DESIRED_STATE).await;
        let v = store.get(device).await.ok()??;
        Some(serde_json::from_slice(&v).expect("desired state"))
    }

    async fn ready_reason<K>(&self, name: &str) -> Option<String>
    where
        K: kube::Resource<DynamicType = ()>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug
            + serde::Serialize,
    {
        let obj = Api::<K>::all(self.client.clone()).get(name).await.ok()?;
        let v = serde_json::to_value(obj).ok()?;
        let conds = v.pointer("/status/conditions")?.as_array()?.clone();
        conds
            .iter()
            .find(|c| c["type"] == "Ready")
            .map(|c| c["reason"].as_str().unwrap_or_default().to_owned())
    }
}

fn workload_names(s: &DesiredState) -> Vec<String> {
    s.workloads
        .iter()
        .map(|w| w.name.as_str().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn placement_writes_kv_and_follows_labels() {
    let mut f = Fleet::new("place").await;
    let (d1, d2, d3) = (f.name("cam-1"), f.name("cam-2"), f.name("gw-1"));
    f.device(&d1, json!({"site": "a"})).await;
    f.device(&d2, json!({"site": "b"})).await;
    f.device(&d3, json!({"site": "a", "role": "gw"})).await;
    let group = f.name("all");
    f.group(&group, json!({"matchLabels": {"fleet-test": f.run}}))
        .await;
    let broken = f.name("broken");
    f.group(
        &broken,
        json!({"matchExpressions": [{"key": "site", "operator": "Exists"}]}),
    )
    .await;
    let dep = f.name("web");
    let meta = f.meta(&dep, json!({}));
    f.create::<FleetDeployment>(json!({
        "apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "FleetDeployment", "metadata": meta,
        "spec": {"allowedGroups": [group], "targetSelector": {"matchLabels": {"site": "a"}},
                 "workloads": [{"name": "web", "image": "localhost/web:1"}]}
    }))
    .await;
    f.start_operator();

    // apply CRs -> NATS KV written (buckets created by the operator)
    let s1 = eventually("d1 desired state", || async {
        f.desired(&d1)
            .await
            .filter(|s| workload_names(s) == ["web"])
    })
    .await;
    assert_eq!(s1.device_id.as_str(), d1);
    eventually("gw-1 desired state", || async {
        f.desired(&d3)
            .await
            .filter(|s| workload_names(s) == ["web"])
    })
    .await;
    let s2 = eventually("d2 empty desired state", || async { f.desired(&d2).await }).await;
    assert!(s2.workloads.is_empty(), "site=b is not targeted: {s2:?}");
    eventually("deployment Ready=Placed", || async {
        (f.ready_reason::<FleetDeployment>(&dep).await.as_deref() == Some("Placed")).then_some(())
    })
    .await;

    // change a device label -> placement follows, generation increases
    Api::<Device>::all(f.client.clone())
        .patch(
            &d2,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"site": "a"}}})),
        )
        .await
        .expect("label");
    let s2b = eventually("d2 follows its label", || async {
        f.desired(&d2)
            .await
            .filter(|s| workload_names(s) == ["web"])
    })
    .await;
    assert!(s2b.generation > s2.generation);
    Api::<Device>::all(f.client.clone())
        .patch(
            &d1,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"site": "c"}}})),
        )
        .await
        .expect("label");
    eventually("d1 loses the workload", || async {
        f.desired(&d1).await.filter(|s| s.workloads.is_empty())
    })
    .await;

    // a group whose source errors is not an empty group: condition on the group and on a deployment using it,
    // and the devices keep what they run
    let dep2 = f.name("broken-dep");
    let meta = f.meta(&dep2, json!({}));
    f.create::<FleetDeployment>(json!({
        "apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "FleetDeployment", "metadata": meta,
        "spec": {"allowedGroups": [broken], "workloads": [{"name": "web", "image": "localhost/web:2"}]}
    }))
    .await;
    eventually("broken group condition", || async {
        (f.ready_reason::<DeviceGroup>(&broken).await.as_deref() == Some("GroupSourceError"))
            .then_some(())
    })
    .await;
    eventually("deployment on a broken group", || async {
        (f.ready_reason::<FleetDeployment>(&dep2).await.as_deref() == Some("GroupSourceError"))
            .then_some(())
    })
    .await;

    // matchExpressions in targetSelector fails closed with InvalidSpec; running workloads are held
    Api::<FleetDeployment>::all(f.client.clone())
        .patch(
            &dep,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"targetSelector": {"matchLabels": null, "matchExpressions": [{"key": "site", "operator": "In", "values": ["a"]}]}}})),
        )
        .await
        .expect("patch");
    eventually("InvalidSpec condition", || async {
        (f.ready_reason::<FleetDeployment>(&dep).await.as_deref() == Some("InvalidSpec"))
            .then_some(())
    })
    .await;
    let held = f.desired(&d2).await.expect("d2");
    assert_eq!(
        workload_names(&held),
        ["web"],
        "workloads are held while the spec is invalid"
    );
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(f.client.clone(), "default");
    eventually("InvalidSpec event", || async {
        let list = events.list(&Default::default()).await.ok()?;
        list.items
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("InvalidSpec")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(dep.as_str())
            })
            .then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_status_follows_nats() {
    let mut f = Fleet::new("status").await;
    f.start_operator();
    let name = f.name("pi");
    let info_store = f.bucket(fleet_wire::kv::DEVICE_INFO).await;
    let mut info = fixtures::device_info();
    info.device_id = DeviceId::try_from(name.as_str()).unwrap();
    info_store
        .put(name.as_str(), serde_json::to_vec(&info).unwrap().into())
        .await
        .expect("put info");
    // the Device is created (with the operator's selector labels) and its status mirrors the report
    let devices: Api<Device> = Api::all(f.client.clone());
    eventually("Device status mirrors device-info", || async {
        let d = devices.get(&name).await.ok()?;
        (d.status?.agent_version?.as_str() == "1.1.0").then_some(())
    })
    .await;
    // a device reports a new version -> the Device status follows
    info.agent_version = Version::try_from("1.2.0").unwrap();
    info_store
        .put(name.as_str(), serde_json::to_vec(&info).unwrap().into())
        .await
        .expect("put info");
    let mut hb = fixtures::heartbeat();
    hb.device_id = info.device_id.clone();
    hb.agent_version = info.agent_version.clone();
    f.bucket(fleet_wire::kv::DEVICE_HEARTBEAT)
        .await
        .put(name.as_str(), serde_json::to_vec(&hb).unwrap().into())
        .await
        .expect("put heartbeat");
    let mut st = fixtures::failed_status();
    st.device_id = info.device_id.clone();
    f.bucket(fleet_wire::kv::AGENT_UPGRADE_STATUS)
        .await
        .put(name.as_str(), serde_json::to_vec(&st).unwrap().into())
        .await
        .expect("put status");
    let status = eventually("Device status follows", || async {
        let s = devices.get(&name).await.ok()?.status?;
        (s.agent_version.as_ref()?.as_str() == "1.2.0"
            && s.agent_upgrade.is_some()
            && s.last_heartbeat.is_some())
        .then_some(s)
    })
    .await;
    let up = status.agent_upgrade.expect("upgrade");
    assert_eq!(up.phase, UpgradePhase::Failed);
    assert_eq!(up.transitions, st.transitions);
    assert_eq!(status.last_heartbeat, Some(hb.at.to_string()));

    // a routine heartbeat ten minutes later (same version) is no Device write: liveness is read from the
    // operator's heartbeat mirror, and lastHeartbeat is refreshed hourly
    let first_beat = hb.at;
    let beat = |hb: &fleet_wire::Heartbeat| serde_json::to_vec(hb).unwrap();
    hb.at = hb.at.plus(Duration::from_secs(600));
    f.bucket(fleet_wire::kv::DEVICE_HEARTBEAT)
        .await
        .put(name.as_str(), beat(&hb).into())
        .await
        .expect("put heartbeat");
    // a beat that carries a new agent version is a change: written at once (the routine one before it is not)
    // why: no event marks the routine beat judged and not written; a window before the next beat (not coalesced)
    tokio::time::sleep(Duration::from_secs(3)).await;
    hb.at = hb.at.plus(Duration::from_secs(30));
    hb.agent_version = Version::try_from("1.3.0").unwrap();
    f.bucket(fleet_wire::kv::DEVICE_HEARTBEAT)
        .await
        .put(name.as_str(), beat(&hb).into())
        .await
        .expect("put heartbeat");
    let status = eventually("the heartbeat's new version on the Device", || async {
        let s = devices.get(&name).await.ok()?.status?;
        (s.agent_version.as_ref()?.as_str() == "1.3.0").then_some(s)
    })
    .await;
    assert_eq!(
        status.last_heartbeat,
        Some(first_beat.to_string()),
        "a heartbeat within the hour's refresh was written to the Device"
    );

    // a new attempt's record without reason, error or invocation id: the Device shows exactly that record, with
    // nothing left over from the failed one
    let mut next = fixtures::upgrade_status();
    next.device_id = info.device_id.clone();
    next.attempt_id = Some(AttemptId::new_random());
    assert!(next.reason.is_none() && next.error.is_none() && next.invocation_id.is_none());
    f.bucket(fleet_wire::kv::AGENT_UPGRADE_STATUS)
        .await
        .put(name.as_str(), serde_json::to_vec(&next).unwrap().into())
        .await
        .expect("put status");
    let up = eventually("Device shows the new attempt", || async {
        let u = devices.get(&name).await.ok()?.status?.agent_upgrade?;
        (u.attempt_id == next.attempt_id).then_some(u)
    })
    .await;
    assert_eq!(up, next, "the Device mirrors the current record exactly");
    let raw = Api::<Device>::all(f.client.clone())
        .get(&name)
        .await
        .expect("get");
    let v = serde_json::to_value(raw).unwrap();
    let rec = v.pointer("/status/agentUpgrade").expect("agentUpgrade");
    for stale in ["reason", "error", "invocationId", "drainDurationMs"] {
        assert!(rec.get(stale).is_none(), "stale {stale} kept: {rec}");
    }
    // that record has been `preparing` since the fixture's epoch, far beyond the phase's bound: the Device says
    // it is stalled, in which phase and since when, and `kubectl get fdev` shows it
    assert_eq!(
        v.pointer("/status/stalled"),
        Some(
            &serde_json::json!({"phase": "preparing", "since": next.phase_changed_at.to_string()})
        ),
        "{v}"
    );
    let table = kubectl_get(&["fdev", &name]);
    assert_eq!(cell(&table, "STALLED"), "preparing", "{table}");
    // a phase entered just now is within its bound: not stalled
    next.phase_changed_at = fleet_wire::Timestamp::now();
    f.bucket(fleet_wire::kv::AGENT_UPGRADE_STATUS)
        .await
        .put(name.as_str(), serde_json::to_vec(&next).unwrap().into())
        .await
        .expect("put status");
    eventually("stalled gone with a fresh phase", || async {
        let s = devices.get(&name).await.ok()?.status?;
        (s.agent_upgrade.as_ref()?.phase_changed_at == next.phase_changed_at && s.stalled.is_none())
            .then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_in_source_error_has_no_member_count() {
    let mut f = Fleet::new("grouperr").await;
    f.start_operator();
    let group = f.name("site");
    f.group(&group, json!({"matchLabels": {"fleet-test": f.run}}))
        .await;
    let groups: Api<DeviceGroup> = Api::all(f.client.clone());
    // no devices at all: a valid group has 0 members
    eventually("memberCount 0", || async {
        (groups.get(&group).await.ok()?.status?.member_count == Some(0)).then_some(())
    })
    .await;
    // the selector breaks while there are still no devices: a source error, and no count at all (not 0)
    groups
        .patch(
            &group,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"selector": {"matchExpressions": [
                {"key": "site", "operator": "In", "values": ["a"]}]}}})),
        )
        .await
        .expect("patch group");
    let s = eventually("GroupSourceError", || async {
        let s = groups.get(&group).await.ok()?.status?;
        s.conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.reason == "GroupSourceError")
            .then_some(s)
    })
    .await;
    assert_eq!(s.member_count, None, "a group in source error has no count");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_operators_write_each_attempt_once() {
    const N: usize = 12;
    let mut f = Fleet::new("release").await;
    let group = f.name("fleet");
    f.group(&group, json!({"matchLabels": {"fleet-test": f.run}}))
        .await;
    let mut names = vec![];
    for i in 0..N {
        let n = f.name(&format!("dev-{i}"));
        f.device(&n, json!({})).await;
        names.push(n);
    }
    // the operators create the buckets; write device info once they exist
    f.start_operator();
    f.start_operator();
    let info_store = f.bucket(fleet_wire::kv::DEVICE_INFO).await;
    for n in &names {
        let mut info: DeviceInfo = fixtures::device_info();
        info.device_id = DeviceId::try_from(n.as_str()).unwrap();
        info.agent_version = Version::try_from("1.0.0").unwrap();
        info_store
            .put(n.as_str(), serde_json::to_vec(&info).unwrap().into())
            .await
            .expect("info");
    }
    // one device already runs the release
    let mut info = fixtures::device_info();
    let current = f.name("current");
    info.device_id = DeviceId::try_from(current.as_str()).unwrap();
    info.agent_version = Version::try_from("2.0.0").unwrap();
    f.device(&current, json!({})).await;
    info_store
        .put(current.as_str(), serde_json::to_vec(&info).unwrap().into())
        .await
        .expect("info");

    let rel = f.name("v2");
    let meta = f.meta(&rel, json!({}));
    let a = fixtures::attempt();
    f.create::<AgentRelease>(json!({
        "apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "AgentRelease", "metadata": meta,
        "spec": {"allowedGroups": [group], "builds": [{"architecture": "arm64", "version": "2.0.0",
                 "artifact": a.artifact.to_string(), "sha256": a.sha256.as_str(), "byteLimit": 20_000_000}]}
    }))
    .await;
    let intents = f.bucket(fleet_wire::kv::AGENT_UPGRADE_INTENT).await;
    let attempts: Vec<(u64, AgentUpgradeAttempt)> =
        eventually("an attempt per outdated device", || async {
            let mut out = vec![];
            for n in &names {
                let e = intents.entry(n.as_str()).await.ok()??;
                out.push((e.revision, serde_json::from_slice(&e.value).ok()?));
            }
            Some(out)
        })
        .await;
    for (n, (_, a)) in names.iter().zip(&attempts) {
        assert_eq!(a.device_id.as_str(), n);
        assert_eq!(a.target_version.as_str(), "2.0.0");
    }
    assert!(
        intents.get(current.as_str()).await.expect("get").is_none(),
        "up-to-date device gets no attempt"
    );
    let ids: std::collections::BTreeSet<AttemptId> =
        attempts.iter().map(|(_, a)| a.attempt_id).collect();
    assert_eq!(ids.len(), N, "each attempt has its own UUID");

    // a failed attempt for the same release is reused, not retried
    let mut failed = fixtures::failed_status();
    failed.device_id = attempts[0].1.device_id.clone();
    failed.attempt_id = Some(attempts[0].1.attempt_id);
    f.bucket(fleet_wire::kv::AGENT_UPGRADE_STATUS)
        .await
        .put(
            names[0].as_str(),
            serde_json::to_vec(&failed).unwrap().into(),
        )
        .await
        .expect("status");
    let releases: Api<AgentRelease> = Api::all(f.client.clone());
    let status = eventually("release status counts the failure", || async {
        let s = releases.get(&rel).await.ok()?.status?;
        (s.failed == Some(1) && s.up_to_date == Some(1) && s.targeted_devices == Some(N as u32 + 1))
            .then_some(s)
    })
    .await;
    // a release with a failed device says so in a condition a person notices, and in a Warning event
    let degraded = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Degraded")
        .expect("Degraded condition");
    assert_eq!(
        (degraded.status.as_str(), degraded.reason.as_str()),
        ("True", "DevicesFailed")
    );
    assert!(
        degraded
            .message
            .contains(&format!("{} failed: start-failed", names[0])),
        "{}",
        degraded.message
    );
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(f.client.clone(), "default");
    eventually("DevicesFailed Warning event", || async {
        let list = events.list(&Default::default()).await.ok()?;
        list.items
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("DevicesFailed")
                    && e.type_.as_deref() == Some("Warning")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(rel.as_str())
            })
            .then_some(())
    })
    .await;
    // nudge both operators with unrelated changes, then check that nothing was written twice
    for i in 0..3 {
        releases
            .patch(
                &rel,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {"nudge": i.to_string()}}})),
            )
            .await
            .expect("nudge");
        // why: spaces the nudges so each is its own pass (the stream sequence below counts the writes)
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // Every write to the bucket takes one stream sequence number: N means each attempt was written once.
    let mut stream =
        f.js.get_stream(format!("KV_{}", fleet_wire::kv::AGENT_UPGRADE_INTENT))
            .await
            .expect("stream");
    let last = stream
        .info()
        .await
        .expect("stream info")
        .state
        .last_sequence;
    assert_eq!(
        last as usize, N,
        "two operators wrote {last} intents for {N} devices"
    );
    for (n, (rev, a)) in names.iter().zip(&attempts) {
        let e = intents
            .entry(n.as_str())
            .await
            .expect("entry")
            .expect("present");
        assert_eq!(e.revision, *rev, "{n} rewritten");
        let now: AgentUpgradeAttempt = serde_json::from_slice(&e.value).unwrap();
        assert_eq!(&now, a);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_unreachable_is_a_condition_and_an_event() {
    let mut f = Fleet::new("nonats").await;
    let group = f.name("all");
    f.group(&group, json!({"matchLabels": {"fleet-test": f.run}}))
        .await;
    let dep = f.name("web");
    let meta = f.meta(&dep, json!({}));
    f.create::<FleetDeployment>(json!({
        "apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "FleetDeployment", "metadata": meta,
        "spec": {"allowedGroups": [group], "workloads": [{"name": "web", "image": "localhost/web:1"}]}
    }))
    .await;
    // an operator pointed at a port where nothing listens
    let opts = Options {
        nats_url: format!("nats://127.0.0.1:{}", fleet_rig::free_port()),
        instance: None,
        label_selector: Some(format!("fleet-test={}", f.run)),
        nats: Default::default(),
        secrets_namespace: None,
    };
    f.operators
        .push(kube_common::spawn_engine(f.client.clone(), opts));
    let deployments: Api<FleetDeployment> = Api::all(f.client.clone());
    let cond = eventually("NatsReachable=False", || async {
        let s = deployments.get(&dep).await.ok()?.status?;
        s.conditions
            .into_iter()
            .find(|c| c.type_ == "NatsReachable" && c.status == "False")
    })
    .await;
    assert_eq!(cond.reason, "NatsUnreachable");
    assert!(
        cond.message.contains("connect to nats://127.0.0.1:"),
        "{}",
        cond.message
    );
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(f.client.clone(), "default");
    eventually("NatsUnreachable event", || async {
        let list = events.list(&Default::default()).await.ok()?;
        list.items
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("NatsUnreachable")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(dep.as_str())
            })
            .then_some(())
    })
    .await;
    // the event belongs to the object (kind, name, uid), so `kubectl describe` shows it
    let uid = deployments.get(&dep).await.unwrap().metadata.uid;
    let list = events.list(&Default::default()).await.unwrap();
    let ev = list
        .items
        .iter()
        .find(|e| {
            e.reason.as_deref() == Some("NatsUnreachable")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(dep.as_str())
        })
        .unwrap();
    let regarding = ev.regarding.clone().unwrap();
    assert_eq!(
        (
            regarding.kind.as_deref(),
            regarding.uid,
            regarding.namespace
        ),
        (Some("FleetDeployment"), uid, None)
    );
    let (ok, out, err) = kubectl(&["describe", "fdep", &dep], "");
    assert!(ok, "{err}");
    let events_section = out.split("Events:").nth(1).unwrap_or_default();
    assert!(
        events_section.contains("NatsUnreachable"),
        "kubectl describe shows no event:\n{out}"
    );
    // the event belongs to the object (kind, name, uid), so `kubectl describe` shows it
    let uid = deployments.get(&dep).await.unwrap().metadata.uid;
    let list = events.list(&Default::default()).await.unwrap();
    let ev = list
        .items
        .iter()
        .find(|e| {
            e.reason.as_deref() == Some("NatsUnreachable")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(dep.as_str())
        })
        .unwrap();
    let regarding = ev.regarding.clone().unwrap();
    assert_eq!(
        (
            regarding.kind.as_deref(),
            regarding.uid,
            regarding.namespace
        ),
        (Some("FleetDeployment"), uid, None)
    );
    let (ok, out, err) = kubectl(&["describe", "fdep", &dep], "");
    assert!(ok, "{err}");
    let events_section = out.split("Events:").nth(1).unwrap_or_default();
    assert!(
        events_section.contains("NatsUnreachable"),
        "kubectl describe shows no event:\n{out}"
    );
}

/// `kubectl get <what> -o wide` against the shared API server, verifying it with the rig's CA, as a person runs it.
fn kubectl_get(what: &[&str]) -> String {
    let mut args = vec!["get"];
    args.extend_from_slice(what);
    args.extend_from_slice(&["-o", "wide"]);
    let (ok, stdout, stderr) = kubectl(&args, "");
    assert!(ok, "kubectl get {what:?}: {stderr}");
    stdout
}

/// The first row's cell under `column` of a kubectl table (cells are aligned to their header and may be
/// empty).
fn cell(table: &str, column: &str) -> String {
    let mut lines = table.lines();
    let header = lines.next().expect("header");
    let row = lines.next().expect("a row");
    let start = header
        .find(column)
        .unwrap_or_else(|| panic!("{column} in {table}"));
    let rest = row.get(start..).unwrap_or_default();
    if rest.starts_with(' ') {
        return String::new();
    }
    rest.split_whitespace()
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// A workload that cannot be pulled on a device shows on the FleetDeployment (running / failed / pending and the
/// device's error, in `kubectl get fdep`) and on the Device, from what the agent reports in
/// `device-workload-status`; a fixed report turns the counts back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workload_health_shows_on_the_deployment_and_the_device() {
    let mut f = Fleet::new("health").await;
    f.start_operator();
    let (d1, d2) = (f.name("h1"), f.name("h2"));
    f.device(&d1, json!({"site": "a"})).await;
    f.device(&d2, json!({"site": "a"})).await;
    let group = f.name("site-a");
    f.group(
        &group,
        json!({"matchLabels": {"site": "a", "fleet-test": f.run}}),
    )
    .await;
    let dep = f.name("web");
    let meta = f.meta(&dep, json!({}));
    f.create::<FleetDeployment>(json!({"apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "FleetDeployment",
        "metadata": meta, "spec": {"allowedGroups": [group], "workloads": [
            {"name": "web", "image": "localhost/web:1"}, {"name": "db", "image": "localhost/db:1"}]}}))
    .await;
    let deps: Api<FleetDeployment> = Api::all(f.client.clone());
    // nothing reported yet: all four placements pending
    eventually("4 pending", || async {
        let w = deps.get(&dep).await.ok()?.status?.workloads?;
        ((w.running, w.failed, w.pending) == (0, 0, 4)).then_some(())
    })
    .await;
    // d1 runs both; d2 runs web and cannot pull db (the agent's wording)
    let desired = f.desired(&d1).await.expect("desired state");
    let spec = |n: &str| {
        desired
            .workloads
            .iter()
            .find(|w| w.name.as_str() == n)
            .unwrap()
            .clone()
    };
    let status = |name: &str, db: WorkloadState, error: Option<&str>| {
        let (web, dbs) = (spec("web"), spec("db"));
        DeviceWorkloadStatus {
            device_id: DeviceId::try_from(name).unwrap(),
            generation: 1,
            at: fleet_wire::Timestamp::now(),
            workloads: vec![
                WorkloadStatus {
                    name: web.name.clone(),
                    state: WorkloadState::Running,
                    container_id: Some("c1".into()),
                    spec_digest: Some(web.digest()),
                    started_at: None,
                    error: None,
                    failure: None,
                    restarts: None,
                    health: None,
                },
                WorkloadStatus {
                    name: dbs.name.clone(),
                    state: db,
                    container_id: None,
                    spec_digest: None,
                    started_at: None,
                    error: error.map(BoundedText::lossy),
                    failure: None,
                    restarts: None,
                    health: None,
                },
            ],
            desired_error: None,
        }
    };
    let store = f.bucket(fleet_wire::kv::WORKLOAD_STATUS).await;
    let pull = "image localhost/db:1 could not be pulled: manifest unknown";
    for (name, s) in [
        (&d1, status(&d1, WorkloadState::Running, None)),
        (&d2, status(&d2, WorkloadState::Failed, Some(pull))),
    ] {
        store
            .put(name.as_str(), serde_json::to_vec(&s).unwrap().into())
            .await
            .expect("put workload status");
    }
    let w = eventually("3 running, 1 failed", || async {
        let w = deps.get(&dep).await.ok()?.status?.workloads?;
        ((w.running, w.failed, w.pending) == (3, 1, 0)).then_some(w)
    })
    .await;
    assert_eq!(w.latest_error, Some(format!("{d2}: db: {pull}")));
    let devices: Api<Device> = Api::all(f.client.clone());
    let summary = eventually("the Device summarizes its workloads", || async {
        devices.get(&d2).await.ok()?.status?.workloads
    })
    .await;
    assert_eq!(
        (summary.running, summary.failed, summary.pending),
        (1, 1, 0)
    );
    assert_eq!(summary.latest_error, Some(format!("db: {pull}")));

    // what a person sees
    let table = kubectl_get(&["fdep", &dep]);
    for (col, want) in [
        ("RUNNING", "3"),
        ("WORKLOADSFAILED", "1"),
        ("WORKLOADSPENDING", "0"),
    ] {
        assert_eq!(cell(&table, col), want, "{col} in\n{table}");
    }
    assert!(
        table.contains("manifest unknown"),
        "the error in -o wide:\n{table}"
    );
    let table = kubectl_get(&["fdev", &d2]);
    assert!(
        table.contains("db: image localhost/db:1 could not be pulled"),
        "{table}"
    );
    // a failing workload is a condition and a Warning event about the deployment itself (kind, name, uid), which
    // `kubectl describe` shows
    let obj = deps.get(&dep).await.expect("the deployment");
    let degraded = obj
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Degraded"))
        .cloned()
        .expect("Degraded condition");
    let message = format!("1 of 4 workloads failed on their devices; first: {d2}: db: {pull}");
    assert_eq!(
        (
            degraded.status.as_str(),
            degraded.reason.as_str(),
            degraded.message.as_str()
        ),
        ("True", "WorkloadsFailed", message.as_str())
    );
    let uid = obj.metadata.uid.clone().expect("uid");
    let core: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(f.client.clone(), "default");
    let ev = eventually(
        "WorkloadsFailed Warning event about the deployment",
        || async {
            let list = core.list(&Default::default()).await.ok()?;
            list.items.into_iter().find(|e| {
                e.reason.as_deref() == Some("WorkloadsFailed")
                    && e.involved_object.uid.as_deref() == Some(uid.as_str())
            })
        },
    )
    .await;
    assert_eq!(
        (
            ev.type_.as_deref(),
            ev.involved_object.kind.as_deref(),
            ev.involved_object.name.as_deref(),
            ev.message.as_deref()
        ),
        (
            Some("Warning"),
            Some("FleetDeployment"),
            Some(dep.as_str()),
            Some(message.as_str())
        )
    );
    let (ok, described, err) = kubectl(&["describe", "fdep", &dep], "");
    assert!(ok, "{err}");
    let events_section = described.split("Events:").nth(1).unwrap_or_default();
    assert!(
        events_section.contains("WorkloadsFailed")
            && events_section.contains("1 of 4 workloads failed"),
        "kubectl describe fdep shows the event:\n{described}"
    );

    // the device recovers: no failure and no error left
    store
        .put(
            d2.as_str(),
            serde_json::to_vec(&status(&d2, WorkloadState::Running, None))
                .unwrap()
                .into(),
        )
        .await
        .expect("put workload status");
    let w = eventually("4 running", || async {
        let w = deps.get(&dep).await.ok()?.status?.workloads?;
        (w.running == 4).then_some(w)
    })
    .await;
    assert_eq!((w.failed, w.pending, w.latest_error), (0, 0, None));
    let degraded = eventually("Degraded=False once none fails", || async {
        let s = deps.get(&dep).await.ok()?.status?;
        s.conditions
            .into_iter()
            .find(|c| c.type_ == "Degraded" && c.status == "False")
    })
    .await;
    assert_eq!(
        (degraded.reason.as_str(), degraded.message.as_str()),
        ("NoFailures", "no workload has failed on a targeted device")
    );
}

/// A Device removed without its retirement (the operator stopped, its finalizer removed by hand, then deleted:
/// `kubectl delete fdev` itself retires the device, docs/device-lifecycle.md) whose device runs workloads: the
/// operator recreates it (the device still reports) with the hold annotation and without its old labels, and holds
/// the device's desired state exactly as it was; a person labels it and removes the annotation, and placement takes
/// over again without the workloads ever leaving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_device_keeps_its_workloads_until_released() {
    let mut f = Fleet::new("devdel").await;
    f.start_operator();
    let d1 = f.name("del-1");
    f.device(&d1, json!({"site": "a"})).await;
    let group = f.name("site-a");
    f.group(
        &group,
        json!({"matchLabels": {"site": "a", "fleet-test": f.run}}),
    )
    .await;
    let dep = f.name("web");
    let meta = f.meta(&dep, json!({}));
    f.create::<FleetDeployment>(json!({"apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "FleetDeployment",
        "metadata": meta, "spec": {"allowedGroups": [group], "workloads": [{"name": "web", "image": "localhost/web:1"}]}}))
    .await;
    let mut info = fixtures::device_info();
    info.device_id = DeviceId::try_from(d1.as_str()).unwrap();
    f.bucket(fleet_wire::kv::DEVICE_INFO)
        .await
        .put(d1.as_str(), serde_json::to_vec(&info).unwrap().into())
        .await
        .expect("put info");
    let before = eventually("web placed", || async {
        f.desired(&d1)
            .await
            .filter(|s| workload_names(s) == ["web"])
    })
    .await;
    let devices: Api<Device> = Api::all(f.client.clone());
    let finalized = eventually("the retirement finalizer on the Device", || async {
        let d = devices.get(&d1).await.ok()?;
        d.metadata
            .finalizers
            .as_ref()?
            .contains(&fleet_operator::crd::RETIRE_FINALIZER.to_owned())
            .then_some(d)
    })
    .await;
    let old_uid = finalized.metadata.uid;
    f.kill_operators().await;
    devices
        .patch(
            &d1,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("remove the finalizer by hand");
    devices
        .delete(&d1, &Default::default())
        .await
        .expect("delete Device");
    f.start_operator();
    // recreated, held, and a pass that saw it held has run (it wrote the mirrored status after the desired states)
    let again = eventually("Device recreated, held, status mirrored", || async {
        let d = devices.get(&d1).await.ok()?;
        (d.metadata.uid != old_uid
            && d.metadata
                .annotations
                .as_ref()?
                .get(fleet_operator::crd::HOLD_ANNOTATION)?
                == "true"
            && d.status.as_ref()?.agent_version.is_some())
        .then_some(d)
    })
    .await;
    assert_eq!(
        again.metadata.labels.as_ref().and_then(|l| l.get("site")),
        None,
        "the old labels are gone with the old object"
    );
    assert_eq!(
        f.desired(&d1).await,
        Some(before.clone()),
        "the held device's desired state is untouched"
    );
    // what a person sees: the Hold column
    let table = kubectl_get(&["fdev", &d1]);
    assert_eq!(cell(&table, "HOLD"), "true", "{table}");
    let deps: Api<FleetDeployment> = Api::all(f.client.clone());
    eventually("the deployment no longer targets it", || async {
        (deps.get(&dep).await.ok()?.status?.targeted_devices == Some(0)).then_some(())
    })
    .await;
    assert_eq!(f.desired(&d1).await, Some(before.clone()), "still held");

    // a person labels it and releases the hold: targeted again, the workload never left
    devices
        .patch(
            &d1,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"site": "a"},
                "annotations": {fleet_operator::crd::HOLD_ANNOTATION: null}}})),
        )
        .await
        .expect("release");
    eventually("targeted again", || async {
        (deps.get(&dep).await.ok()?.status?.targeted_devices == Some(1)).then_some(())
    })
    .await;
    assert_eq!(f.desired(&d1).await, Some(before), "no change written");
}

/// The Ready message of a FleetDeployment's condition.
async fn ready_message(f: &Fleet, name: &str) -> Option<String> {
    let d = Api::<FleetDeployment>::all(f.client.clone())
        .get(name)
        .await
        .ok()?;
    d.status?
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.message)
}

/// Invalid specs: every error is reported at once; a new object does not claim to keep placed workloads; a
/// placed deployment whose image is mistyped keeps what runs (held by workload name) and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_specs_report_every_error_and_hold_what_runs() {
    let mut f = Fleet::new("invalid").await;
    f.start_operator();
    let d1 = f.name("inv-1");
    f.device(&d1, json!({"site": "a"})).await;
    let group = f.name("site-a");
    f.group(
        &group,
        json!({"matchLabels": {"site": "a", "fleet-test": f.run}}),
    )
    .await;
    let new = f.name("new");
    let meta = f.meta(&new, json!({}));
    f.create::<FleetDeployment>(
        json!({"apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "FleetDeployment",
        "metadata": meta, "spec": {"allowedGroups": [group], "workloads": [
            {"name": "a", "image": "Nginx:Latest:bad"}, {"name": "b", "image": "nginx latest"}]}}),
    )
    .await;
    let m = eventually("InvalidSpec on the new object", || async {
        ready_message(&f, &new)
            .await
            .filter(|m| m.contains("workloads[0]"))
    })
    .await;
    assert!(
        m.contains("workloads[1]") && m.contains("whitespace"),
        "{m}"
    );
    assert!(m.contains("one :tag"), "{m}");
    assert!(!m.contains("kept unchanged"), "{m}");
    assert!(m.contains("nothing is placed"), "{m}");

    let web = f.name("web");
    let meta = f.meta(&web, json!({}));
    f.create::<FleetDeployment>(json!({"apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "FleetDeployment",
        "metadata": meta, "spec": {"allowedGroups": [group], "workloads": [{"name": "web", "image": "localhost/web:1"}]}}))
    .await;
    let placed = eventually("web placed", || async {
        f.desired(&d1)
            .await
            .filter(|s| workload_names(s) == ["web"])
    })
    .await;
    Api::<FleetDeployment>::all(f.client.clone())
        .patch(
            &web,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"workloads": [{"name": "web", "image": "localhost/Web:2"}]}}),
            ),
        )
        .await
        .expect("patch");
    let m = eventually("InvalidSpec on the placed object", || async {
        ready_message(&f, &web)
            .await
            .filter(|m| m.contains("not a valid image reference"))
    })
    .await;
    assert!(m.contains("kept unchanged"), "{m}");
    assert_eq!(
        f.desired(&d1).await,
        Some(placed),
        "the running workload is held"
    );
}

/// The admission webhook registered from `deploy/webhook.yaml`: a mistyped field is refused by
/// `kubectl apply` naming it (never pruned into "select everything"); the object a person once applied
/// (`devices: [dev-2], selector: {}`) places on dev-2 only; an empty selector selects nothing and says so
/// (condition, event, `kubectl get fdg`); `selectAll: true` selects every device; an existing group that selected
/// everything by an empty selector turns visibly into `EmptySelector` and its deployment holds what runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_groups_select_explicitly_and_typos_are_refused() {
    let mut f = Fleet::new("groups").await;
    let hooks = f.webhook().await;
    f.start_operator();
    let (d1, d2, d3) = (f.name("grp-1"), f.name("grp-2"), f.name("grp-3"));
    for d in [&d1, &d2, &d3] {
        f.device(d, json!({"site": "a"})).await;
    }
    let groups: Api<DeviceGroup> = Api::all(f.client.clone());

    // the typo: refused with the field's path, as a person sees it from kubectl (the API server loads the webhook
    // configuration asynchronously: an object created before that is deleted and applied again)
    let typo = f.name("typo");
    let yaml = format!(
        "apiVersion: fleet.nationtech.io/v1alpha1\nkind: DeviceGroup\nmetadata:\n  name: {typo}\n  labels: {{fleet-test: {}}}\nspec:\n  devicez: [{d2}]\n  selector: {{}}\n",
        f.run
    );
    let refused = eventually("the typo refused by the webhook", || async {
        match kubectl(&["apply", "-f", "-"], &yaml) {
            (false, _, stderr) => Some(stderr),
            (true, _, _) => {
                kubectl(&["delete", "fdg", &typo], "");
                None
            }
        }
    })
    .await;
    assert!(
        refused.contains(&format!(
            "DeviceGroup \"{typo}\": unknown field spec.devicez"
        )) && refused.contains("known fields there: devices, selectAll, selector"),
        "{refused}"
    );
    assert!(groups.get(&typo).await.is_err(), "nothing was stored");
    // nested fields too, through the API
    let raw: DeviceGroup = serde_json::from_value(
        json!({"apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "DeviceGroup",
        "metadata": f.meta(&f.name("nested"), json!({})), "spec": {}}),
    )
    .unwrap();
    let mut raw = serde_json::to_value(raw).unwrap();
    raw["spec"] = json!({"selector": {"matchLabel": {"site": "a"}}});
    let dynamic: Api<kube::api::DynamicObject> = Api::all_with(
        f.client.clone(),
        &kube::api::ApiResource::erase::<DeviceGroup>(&()),
    );
    let e = dynamic
        .create(
            &PostParams::default(),
            &serde_json::from_value(raw).unwrap(),
        )
        .await
        .expect_err("nested typo refused");
    assert!(format!("{e}").contains("spec.selector.matchLabel"), "{e}");
    // at the root too (a misspelt `spec`), and for every fleet kind
    let devices: Api<kube::api::DynamicObject> = Api::all_with(
        f.client.clone(),
        &kube::api::ApiResource::erase::<Device>(&()),
    );
    let raw = json!({"apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "Device",
        "metadata": f.meta(&f.name("grp-9"), json!({})), "spec": {}, "sepc": {"description": "x"}});
    let e = devices
        .create(
            &PostParams::default(),
            &serde_json::from_value(raw).unwrap(),
        )
        .await
        .expect_err("root typo refused");
    assert!(format!("{e}").contains("unknown field sepc"), "{e}");

    // the object: an explicit list and an empty selector place on dev-2 only
    let listed = f.name("listed");
    f.create::<DeviceGroup>(
        json!({"apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "DeviceGroup",
        "metadata": f.meta(&listed, json!({})), "spec": {"devices": [d2], "selector": {}}}),
    )
    .await;
    let web = f.name("web");
    f.create::<FleetDeployment>(json!({"apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "FleetDeployment",
        "metadata": f.meta(&web, json!({})), "spec": {"allowedGroups": [listed], "workloads": [{"name": "web", "image": "localhost/web:1"}]}}))
    .await;
    eventually("web placed on dev-2", || async {
        (workload_names(&f.desired(&d2).await?) == ["web"]).then_some(())
    })
    .await;
    for d in [&d1, &d3] {
        let s = eventually("an explicit empty state", || f.desired(d)).await;
        assert!(s.workloads.is_empty(), "{d} is not listed: {s:?}");
    }
    let s = groups.get(&listed).await.unwrap().status.unwrap();
    assert_eq!(s.member_count, Some(1));
    // an update that adds an unknown field is refused as well, and changes nothing
    let e = groups
        .patch(
            &listed,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"devices": [d1], "devicez": [d3]}})),
        )
        .await
        .expect_err("update refused");
    assert!(format!("{e}").contains("spec.devicez"), "{e}");
    assert_eq!(
        groups.get(&listed).await.unwrap().spec.devices,
        std::slice::from_ref(&d2)
    );

    // an empty selector selects nothing and says so
    let empty = f.name("empty");
    f.group(&empty, json!({})).await;
    let s = eventually("EmptySelector", || async {
        let s = groups.get(&empty).await.ok()?.status?;
        s.conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "False" && c.reason == "EmptySelector")
            .then_some(s)
    })
    .await;
    assert_eq!(s.member_count, None);
    let ready = s.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert!(
        ready.message.contains("selects no device") && ready.message.contains("selectAll: true"),
        "{}",
        ready.message
    );
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(f.client.clone(), "default");
    eventually("EmptySelector event", || async {
        let list = events.list(&Default::default()).await.ok()?;
        list.items
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("EmptySelector")
                    && e.type_.as_deref() == Some("Warning")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(empty.as_str())
            })
            .then_some(())
    })
    .await;
    let table = kubectl_get(&["fdg", &empty]);
    assert_eq!(
        (cell(&table, "READY"), cell(&table, "REASON")),
        ("False".into(), "EmptySelector".into()),
        "{table}"
    );

    // selectAll selects every device; a deployment on it reaches all three
    let all = f.name("all");
    f.create::<DeviceGroup>(
        json!({"apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "DeviceGroup",
        "metadata": f.meta(&all, json!({})), "spec": {"selectAll": true}}),
    )
    .await;
    eventually("3 members", || async {
        (groups.get(&all).await.ok()?.status?.member_count == Some(3)).then_some(())
    })
    .await;
    let fleetwide = f.name("fleetwide");
    f.create::<FleetDeployment>(json!({"apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "FleetDeployment",
        "metadata": f.meta(&fleetwide, json!({})), "spec": {"allowedGroups": [all], "workloads": [{"name": "agent-side", "image": "localhost/side:1"}]}}))
    .await;
    for d in [&d1, &d2, &d3] {
        eventually("placed everywhere", || async {
            f.desired(d)
                .await?
                .workloads
                .iter()
                .any(|w| w.name.as_str() == "agent-side")
                .then_some(())
        })
        .await;
    }

    // a group written for the old meaning (an empty selector, no selectAll) becomes visible, not a silent
    // teardown: EmptySelector on the group, GroupSourceError on its deployment, and the workloads stay
    groups
        .patch(
            &all,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"selectAll": null, "selector": {}}})),
        )
        .await
        .expect("patch");
    let m = eventually("the deployment holds", || async {
        let m = ready_message(&f, &fleetwide).await?;
        m.contains("kept unchanged").then_some(m)
    })
    .await;
    assert!(m.contains("selects no device"), "{m}");
    assert_eq!(
        f.ready_reason::<DeviceGroup>(&all).await.as_deref(),
        Some("EmptySelector")
    );
    for d in [&d1, &d2, &d3] {
        let s = f.desired(d).await.expect("desired");
        assert!(
            s.workloads.iter().any(|w| w.name.as_str() == "agent-side"),
            "{d} keeps its workload: {s:?}"
        );
    }
    hooks.remove().await;
}

/// A fleet object created raw through the API (no Rust type in between to drop fields), labelled for this test.
async fn create_raw<K>(f: &Fleet, name: &str, spec: serde_json::Value)
where
    K: kube::Resource<DynamicType = ()>,
{
    let resource = kube::api::ApiResource::erase::<K>(&());
    let api: Api<kube::api::DynamicObject> = Api::all_with(f.client.clone(), &resource);
    let mut obj = kube::api::DynamicObject::new(name, &resource).data(json!({ "spec": spec }));
    obj.metadata.labels = serde_json::from_value(f.labels(json!({}))).unwrap();
    api.create(&PostParams::default(), &obj)
        .await
        .expect("stored: no webhook is registered");
}

/// Fail closed without the webhook (none is registered here): objects stored with unknown fields — the issue's
/// `targetSelector: {matchLabel: …}`, which the typed spec reads as "every device of the group" — are refused by
/// the operator itself: `Ready=False`, reason `InvalidSpec`, the field named; the deployment places nothing, the
/// release writes no intent, the mistyped group resolves to no member list (its deployment waits on it), while a
/// correct deployment beside them is placed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_webhook_unknown_fields_are_refused_by_the_operator() {
    let mut f = Fleet::new("closed").await;
    let (a, b) = (f.name("closed-a"), f.name("closed-b"));
    f.device(&a, json!({"site": "a"})).await;
    f.device(&b, json!({"site": "b"})).await;
    let all = f.name("all");
    create_raw::<DeviceGroup>(&f, &all, json!({"selectAll": true})).await;
    f.start_operator();
    // each device reports, so that a release would write it an intent
    let info_store = f.bucket(fleet_wire::kv::DEVICE_INFO).await;
    for d in [&a, &b] {
        let mut info: DeviceInfo = fixtures::device_info();
        info.device_id = DeviceId::try_from(d.as_str()).unwrap();
        info.agent_version = Version::try_from("1.0.0").unwrap();
        info_store
            .put(d.as_str(), serde_json::to_vec(&info).unwrap().into())
            .await
            .expect("info");
    }

    let web = f.name("web");
    create_raw::<FleetDeployment>(
        &f,
        &web,
        json!({"allowedGroups": [all], "targetSelector": {"matchLabel": {"site": "a"}},
               "workloads": [{"name": "web", "image": "localhost/web:1"}]}),
    )
    .await;
    let ok = f.name("ok");
    create_raw::<FleetDeployment>(
        &f,
        &ok,
        json!({"allowedGroups": [all], "targetSelector": {"matchLabels": {"site": "a"}},
               "workloads": [{"name": "ok", "image": "localhost/ok:1"}]}),
    )
    .await;
    let typo_group = f.name("typo-group");
    create_raw::<DeviceGroup>(
        &f,
        &typo_group,
        json!({"selector": {"matchLabel": {"site": "b"}}}),
    )
    .await;
    let via = f.name("via");
    create_raw::<FleetDeployment>(
        &f,
        &via,
        json!({"allowedGroups": [typo_group], "workloads": [{"name": "via", "image": "localhost/via:1"}]}),
    )
    .await;
    let rel = f.name("rel");
    let at = fixtures::attempt();
    create_raw::<AgentRelease>(
        &f,
        &rel,
        json!({"allowedGroups": [all], "targetSelector": {"matchLabel": {"site": "a"}},
               "builds": [{"architecture": "arm64", "version": "2.0.0", "artifact": at.artifact.to_string(),
                           "sha256": at.sha256.as_str(), "byteLimit": 20_000_000}]}),
    )
    .await;

    let placed = eventually("the correct deployment placed", || async {
        f.desired(&a).await.filter(|s| workload_names(s) == ["ok"])
    })
    .await;
    let condition = |reason: Option<String>, want: &str| {
        assert_eq!(reason.as_deref(), Some("InvalidSpec"), "{want}");
    };
    let web_message = eventually("the deployment refused", || async {
        ready_message(&f, &web)
            .await
            .filter(|m| m.contains("unknown field"))
    })
    .await;
    condition(f.ready_reason::<FleetDeployment>(&web).await, "web");
    assert!(
        web_message.starts_with("unknown field spec.targetSelector.matchLabel (refused rather than silently dropped; see docs/crds.md); known fields there: matchExpressions, matchLabels; the operator acts on nothing in this object until it is fixed"),
        "{web_message}"
    );
    let group_message = eventually("the group refused", || async {
        let g = Api::<DeviceGroup>::all(f.client.clone())
            .get(&typo_group)
            .await
            .ok()?;
        g.status?
            .conditions
            .into_iter()
            .find(|c| c.type_ == "Ready" && c.reason == "InvalidSpec")
            .map(|c| c.message)
    })
    .await;
    assert!(
        group_message.contains("unknown field spec.selector.matchLabel"),
        "{group_message}"
    );
    assert_eq!(
        f.ready_reason::<FleetDeployment>(&via).await.as_deref(),
        Some("GroupSourceError")
    );
    let rel_reason = eventually("the release refused", || async {
        f.ready_reason::<AgentRelease>(&rel)
            .await
            .filter(|r| r != "Placed")
    })
    .await;
    condition(Some(rel_reason), "release");
    // nothing of the refused objects reached a device
    assert_eq!(f.desired(&a).await, Some(placed));
    assert!(
        f.desired(&b).await.is_none_or(|s| s.workloads.is_empty()),
        "nothing placed on {b}"
    );
    let intents = f.bucket(fleet_wire::kv::AGENT_UPGRADE_INTENT).await;
    for d in [&a, &b] {
        assert!(
            intents.get(d.as_str()).await.unwrap().is_none(),
            "an agent-upgrade intent for {d}"
        );
    }
}
