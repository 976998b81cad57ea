//! One pass, table-tested: placement, releases, groups, device statuses, policies, the TaskRun reasons.

/// A mirror's values, shared as the mirror shares them.
fn shared<T, const N: usize>(items: [(String, T); N]) -> BTreeMap<String, Arc<T>> {
    items.into_iter().map(|(k, v)| (k, Arc::new(v))).collect()
}

use super::*;
use fleet_wire::fixtures;
use serde_json::{json, Value};

fn obj<K: serde::de::DeserializeOwned>(kind: &str, name: &str, meta: Value, spec: Value) -> Arc<K> {
    let mut metadata = json!({"name": name, "generation": 1});
    for (k, v) in meta.as_object().into_iter().flatten() {
        metadata[k] = v.clone();
    }
    Arc::new(
        serde_json::from_value(
            json!({"apiVersion": "fleet.nationtech.io/v1alpha1", "kind": kind,
                "metadata": metadata, "spec": spec}),
        )
        .expect(kind),
    )
}
fn device(name: &str, labels: Value) -> Arc<Device> {
    obj("Device", name, json!({"labels": labels}), json!({}))
}
fn held(name: &str) -> Arc<Device> {
    obj(
        "Device",
        name,
        json!({"annotations": {HOLD_ANNOTATION: "true"}}),
        json!({}),
    )
}
fn group(name: &str, spec: Value) -> Arc<DeviceGroup> {
    obj("DeviceGroup", name, json!({}), spec)
}
fn deployment(name: &str, group: &str, image: &str) -> Arc<FleetDeployment> {
    obj(
        "FleetDeployment",
        name,
        json!({}),
        json!({"allowedGroups": [group], "workloads": [{"name": name, "image": image}]}),
    )
}
fn release(name: &str, group: &str) -> Arc<AgentRelease> {
    release_with(name, group, json!({}), Value::Null)
}
/// A release with metadata and a `rollout` section (`null`: none).
fn release_with(name: &str, group: &str, meta: Value, rollout: Value) -> Arc<AgentRelease> {
    let mut spec = json!({"allowedGroups": [group], "builds": [{"architecture": "arm64",
            "version": "2.0.0", "artifact": "https://example.com/a", "sha256": "a".repeat(64),
            "byteLimit": 1000}]});
    if !rollout.is_null() {
        spec["rollout"] = rollout;
    }
    obj("AgentRelease", name, meta, spec)
}
fn info(id: &str) -> (String, DeviceInfo) {
    let mut i = fixtures::device_info();
    i.device_id = DeviceId::try_from(id).expect("id");
    (id.to_owned(), i)
}
fn desired(id: &str, names: &[&str]) -> (String, DesiredState) {
    let ws = names.iter().map(|n| fixtures::workload(n)).collect();
    let s = DesiredState::new(DeviceId::try_from(id).expect("id"), 1, ws).expect("state");
    (id.to_owned(), s)
}
fn base() -> Snapshot {
    Snapshot {
        devices: vec![
            device("d1", json!({"site": "a"})),
            device("d2", json!({"site": "b"})),
        ],
        groups: vec![
            group(
                "site-a",
                json!({"selector": {"matchLabels": {"site": "a"}}}),
            ),
            group("all", json!({"selectAll": true})),
        ],
        ..Default::default()
    }
}

/// What a plan does, in words a table can hold.
#[derive(Debug, Default, PartialEq)]
struct Summary {
    desired: Vec<String>,
    intents: Vec<String>,
    ready: Vec<String>,
    counts: Vec<String>,
    new_devices: Vec<String>,
    ignored: Vec<String>,
    device_statuses: usize,
}

fn summary(p: &Plan) -> Summary {
    let ready = |kind: &str, name: String, wants: &[Want]| {
        let w = &wants[0];
        format!("{kind} {name}: {}", if w.ok { "Placed" } else { w.reason })
    };
    let mut s = Summary {
        desired: p
            .desired
            .iter()
            .map(|(d, ws)| {
                let names: Vec<&str> = ws.iter().map(|w| w.name.as_str()).collect();
                format!("{d}={}", names.join(","))
            })
            .collect(),
        intents: p
            .intents
            .iter()
            .map(|w| format!("{}->{}", w.device, w.attempt.target_version))
            .collect(),
        new_devices: p
            .new_devices
            .iter()
            .map(|n| format!("{}{}", n.id, if n.hold { " held" } else { "" }))
            .collect(),
        ignored: p.ignored.iter().map(|(n, _)| n.clone()).collect(),
        device_statuses: p.device_statuses.len(),
        ..Default::default()
    };
    for g in &p.groups {
        s.ready.push(ready("group", g.obj.name_any(), &g.wants));
        s.counts.push(format!(
            "group {}: {:?}",
            g.obj.name_any(),
            g.next.member_count
        ));
    }
    for d in &p.deployments {
        s.ready
            .push(ready("deployment", d.obj.name_any(), &d.wants));
    }
    for r in &p.releases {
        s.ready.push(ready("release", r.obj.name_any(), &r.wants));
        let n = &r.next;
        s.counts.push(format!(
            "release {}: {:?}/{:?}/{:?}/{:?}",
            r.obj.name_any(),
            n.targeted_devices,
            n.up_to_date,
            n.in_progress,
            n.failed
        ));
        if let Some(n) = n.superseded {
            s.counts
                .push(format!("release {}: superseded {n}", r.obj.name_any()));
        }
        if let Some(ro) = &n.rollout {
            s.counts.push(format!(
                "release {}: {:?} {}/{}/{}/{}",
                r.obj.name_any(),
                ro.phase,
                ro.updated,
                ro.healthy,
                ro.pending,
                ro.failed
            ));
        }
    }
    s
}

fn strs(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn plan_table() {
    type Case = (&'static str, Snapshot, Summary);
    let mut cases: Vec<Case> = Vec::new();

    let mut s = base();
    s.deployments = vec![deployment("web", "site-a", "nginx:1")];
    cases.push((
        "placement",
        s,
        Summary {
            desired: strs(&["d1=web", "d2="]),
            ready: strs(&[
                "group site-a: Placed",
                "group all: Placed",
                "deployment web: Placed",
            ]),
            counts: strs(&["group site-a: Some(1)", "group all: Some(2)"]),
            ..Default::default()
        },
    ));

    let mut s = base();
    s.deployments = vec![deployment("web", "site-a", "Nginx:Bad:x")];
    s.desired = shared([desired("d1", &["web"]), desired("d2", &[])]);
    cases.push((
        "an invalid spec holds what runs",
        s,
        Summary {
            desired: strs(&["d1=web", "d2="]),
            ready: strs(&[
                "group site-a: Placed",
                "group all: Placed",
                "deployment web: InvalidSpec",
            ]),
            counts: strs(&["group site-a: Some(1)", "group all: Some(2)"]),
            ..Default::default()
        },
    ));

    let mut s = base();
    s.groups = vec![group("empty", json!({"selector": {}}))];
    s.deployments = vec![deployment("web", "empty", "nginx:1")];
    s.desired = shared([desired("d1", &["web"])]);
    cases.push((
        "an empty selector holds, never selects all",
        s,
        Summary {
            desired: strs(&["d1=web", "d2="]),
            ready: strs(&[
                "group empty: EmptySelector",
                "deployment web: GroupSourceError",
            ]),
            counts: strs(&["group empty: None"]),
            ..Default::default()
        },
    ));

    let mut s = base();
    s.devices.push(held("d3"));
    s.desired = shared([desired("d3", &["old"])]);
    cases.push((
        "a held device keeps its state",
        s,
        Summary {
            desired: strs(&["d1=", "d2=", "d3=old"]),
            ready: strs(&["group site-a: Placed", "group all: Placed"]),
            counts: strs(&["group site-a: Some(1)", "group all: Some(3)"]),
            ..Default::default()
        },
    ));

    let mut s = base();
    // r-b is newer and sorts last by name: the newer one wins, whatever the names
    s.releases = vec![
        release_with(
            "r-a",
            "site-a",
            json!({"creationTimestamp": "2026-12-01T09:00:00Z", "uid": "u-a"}),
            Value::Null,
        ),
        release_with(
            "r-b",
            "all",
            json!({"creationTimestamp": "2026-12-01T10:00:00Z", "uid": "u-b"}),
            Value::Null,
        ),
    ];
    s.info = shared([info("d1"), info("d2")]);
    cases.push((
        "releases: the newest owns a device, the older reports it superseded and keeps its counts",
        s,
        Summary {
            desired: strs(&["d1=", "d2="]),
            intents: strs(&["d1->2.0.0", "d2->2.0.0"]),
            ready: strs(&[
                "group site-a: Placed",
                "group all: Placed",
                "release r-b: Placed",
                "release r-a: Placed",
            ]),
            counts: strs(&[
                "group site-a: Some(1)",
                "group all: Some(2)",
                "release r-b: Some(2)/Some(0)/Some(2)/Some(0)",
                "release r-b: Progressing 0/0/2/0",
                "release r-a: Some(0)/Some(0)/Some(0)/Some(0)",
                "release r-a: superseded 1",
                "release r-a: Complete 0/0/0/0",
            ]),
            device_statuses: 2,
            ..Default::default()
        },
    ));

    let mut s = base();
    s.devices = vec![
        device("d1", json!({"site": "a", "canary": "true"})),
        device("d2", json!({"site": "a"})),
        device("d3", json!({"site": "a", "canary": "false"})),
    ];
    s.releases = vec![release_with(
        "r",
        "all",
        json!({}),
        json!({"soakSeconds": 60}),
    )];
    s.info = shared([info("d1"), info("d2"), info("d3")]);
    cases.push((
        "a staged release gives the change to its canary only",
        s,
        Summary {
            desired: strs(&["d1=", "d2=", "d3="]),
            intents: strs(&["d1->2.0.0"]),
            ready: strs(&[
                "group site-a: Placed",
                "group all: Placed",
                "release r: Placed",
            ]),
            counts: strs(&[
                "group site-a: Some(3)",
                "group all: Some(3)",
                "release r: Some(3)/Some(0)/Some(1)/Some(0)",
                "release r: Progressing 0/0/3/0",
            ]),
            device_statuses: 3,
            ..Default::default()
        },
    ));

    let mut s = base();
    s.releases = vec![release_with(
        "r",
        "all",
        json!({}),
        json!({"maxUnavailable": "150%"}),
    )];
    cases.push((
        "an invalid rollout section is InvalidSpec",
        s,
        Summary {
            desired: strs(&["d1=", "d2="]),
            ready: strs(&[
                "group site-a: Placed",
                "group all: Placed",
                "release r: InvalidSpec",
            ]),
            counts: strs(&[
                "group site-a: Some(1)",
                "group all: Some(2)",
                "release r: None/None/None/None",
            ]),
            ..Default::default()
        },
    ));

    let mut s = base();
    s.releases = vec![release("r", "site-a")];
    s.info = shared([info("d1")]);
    let mut kept = fixtures::attempt();
    kept.device_id = DeviceId::try_from("d1").expect("id");
    kept.target_version = fleet_wire::Version::try_from("2.0.0").expect("v");
    kept.artifact = "https://example.com/a".parse().expect("artifact");
    kept.byte_limit = fleet_wire::ByteLimit::try_from(1000).expect("limit");
    kept.sha256 = fleet_wire::Sha256Hex::try_from("a".repeat(64).as_str()).expect("sha");
    let mut failed = fixtures::failed_status();
    failed.attempt_id = Some(kept.attempt_id);
    s.intents = shared([("d1".to_owned(), kept)]);
    s.upgrades = shared([("d1".to_owned(), failed)]);
    cases.push((
        "a failed attempt is kept and counted, not retried",
        s,
        Summary {
            desired: strs(&["d1=", "d2="]),
            ready: strs(&[
                "group site-a: Placed",
                "group all: Placed",
                "release r: Placed",
            ]),
            counts: strs(&[
                "group site-a: Some(1)",
                "group all: Some(2)",
                "release r: Some(1)/Some(0)/Some(0)/Some(1)",
                "release r: Failed 0/0/0/1",
            ]),
            device_statuses: 1,
            ..Default::default()
        },
    ));

    let mut s = base();
    s.devices.push(device("Bad_Name", json!({})));
    s.info = shared([info("d1"), info("d8"), info("d9")]);
    s.desired = shared([desired("d9", &["web"])]);
    cases.push((
        "devices that reported are created; held when they run workloads",
        s,
        Summary {
            desired: strs(&["d1=", "d2="]),
            ready: strs(&["group site-a: Placed", "group all: Placed"]),
            counts: strs(&["group site-a: Some(1)", "group all: Some(2)"]),
            new_devices: strs(&["d8", "d9 held"]),
            ignored: strs(&["Bad_Name"]),
            device_statuses: 1,
            ..Default::default()
        },
    ));

    for (what, snapshot, want) in cases {
        let mut ids = 0u32;
        let p = plan(&snapshot, Timestamp::now(), &mut || {
            ids += 1;
            AttemptId::new_random()
        });
        assert_eq!(summary(&p), want, "{what}");
        // decide_intent names a new attempt at most once per device that needs one (a staged rollout holds
        // some back)
        assert!(ids as usize >= p.intents.len(), "{what}");
    }
}

#[test]
fn messages_say_why() {
    let mut s = base();
    s.groups
        .push(group("listed", json!({"devices": ["d2", "d7"]})));
    s.groups.push(group("empty", json!({})));
    s.deployments = vec![deployment("web", "empty", "nginx:1")];
    s.desired = shared([desired("d1", &["web"])]);
    let p = plan(&s, Timestamp::now(), &mut AttemptId::new_random);
    let msg = |name: &str| {
        let g = p
            .groups
            .iter()
            .find(|g| g.obj.name_any() == name)
            .expect(name);
        g.wants[0].message.clone()
    };
    assert_eq!(msg("listed"), "1 device; listed but no Device yet: d7");
    assert!(
        msg("empty").contains("selects no device"),
        "{}",
        msg("empty")
    );
    let d = &p.deployments[0].wants[0].message;
    assert!(
        d.contains("selects no device") && d.contains("kept unchanged"),
        "{d}"
    );
}

#[test]
fn finish_adds_nats_second_and_skips_unchanged() {
    let mut s = base();
    s.deployments = vec![deployment("web", "site-a", "nginx:1")];
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let ok = conditions::nats_reachable(None);
    let p = plan(&s, Timestamp::now(), &mut AttemptId::new_random);
    let (_, _, next) = p.deployments[0].clone().finish(&ok, &now).expect("changed");
    let types: Vec<&str> = next.conditions.iter().map(|c| c.type_.as_str()).collect();
    assert_eq!(types, ["Ready", "NatsReachable", "Degraded"]);
    // the same plan against the status it produced writes nothing
    let mut written = (*s.deployments[0]).clone();
    written.status = Some(next);
    s.deployments = vec![Arc::new(written)];
    let p = plan(&s, Timestamp::now(), &mut AttemptId::new_random);
    assert!(p.deployments[0].clone().finish(&ok, &now).is_none());
    // an unreachable NATS is a change
    let down = conditions::nats_reachable(Some("connection refused"));
    assert!(p.deployments[0].clone().finish(&down, &now).is_some());
}

#[test]
fn intent_write_decides_again_only_when_the_key_changed() {
    let mut s = base();
    s.releases = vec![release("r", "site-a")];
    s.info = shared([info("d1")]);
    let p = plan(&s, Timestamp::now(), &mut AttemptId::new_random);
    let w = &p.intents[0];
    assert_eq!(
        w.decide(None),
        Some(w.attempt.clone()),
        "unchanged: as planned"
    );
    // another replica wrote an attempt for the same build: keep it
    let mut theirs = w.attempt.clone();
    theirs.attempt_id = AttemptId::new_random();
    assert_eq!(w.decide(Some(&theirs)), None);
    // another replica wrote something else: decide again, a new attempt
    let mut other = theirs.clone();
    other.target_version = fleet_wire::Version::try_from("9.0.0").expect("v");
    let again = w.decide(Some(&other)).expect("a new attempt");
    assert_ne!(again.attempt_id, w.attempt.attempt_id);
    assert_eq!(again.target_version.as_str(), "2.0.0");
}

/// A deployment asking for a device and a capability that no WorkloadPolicy allows is `NotAllowed`: nothing
/// new is placed, what runs under its workload names is held; a policy for its group lets it proceed.
#[test]
fn what_no_policy_allows_is_held_until_one_does() {
    let mut s = base();
    let mut i = fixtures::device_info();
    i.device_id = DeviceId::try_from("d1").expect("id");
    i.capabilities.push(fleet_wire::Capability::WorkloadSpecV2);
    s.info = shared([("d1".to_owned(), i)]);
    s.desired = shared([desired("d1", &["serial"])]);
    let before = s.desired["d1"].workloads.clone();
    s.deployments = vec![obj(
        "FleetDeployment",
        "serial",
        json!({}),
        json!({"allowedGroups": ["site-a"], "workloads": [{"name": "serial", "image": "localhost/serial:2",
                "devices": ["/dev/ttyS0"], "capabilities": ["NET_ADMIN"]}]}),
    )];
    let p = plan(&s, Timestamp::now(), &mut AttemptId::new_random);
    let ready = &p.deployments[0].wants[0];
    assert_eq!(ready.reason, conditions::REASON_NOT_ALLOWED);
    assert!(
            ready.message.starts_with("spec.workloads[0] (serial): device /dev/ttyS0 and capability NET_ADMIN are not allowed for groups [site-a]: no WorkloadPolicy applies")
                && ready.message.ends_with("workloads already placed are kept unchanged"),
            "{}",
            ready.message
        );
    assert_eq!(
        p.desired[&DeviceId::try_from("d1").expect("id")][..],
        before[..]
    );

    s.policies = vec![obj(
        "WorkloadPolicy",
        "serial",
        json!({}),
        json!({"groups": ["site-a", "all"], "devices": ["/dev/ttyS*"], "capabilities": ["NET_ADMIN"]}),
    )];
    let p = plan(&s, Timestamp::now(), &mut AttemptId::new_random);
    assert!(
        p.deployments[0].wants[0].ok,
        "{:?}",
        p.deployments[0].wants[0]
    );
    let placed = &p.desired[&DeviceId::try_from("d1").expect("id")];
    assert_eq!(placed[0].devices, ["/dev/ttyS0"]);
    assert_eq!(placed[0].capabilities, ["NET_ADMIN"]);
}

/// The TaskRun controller's reasons (crate::task_reasons) reach a Device's status.blocking through this one
/// writer, after the rollouts' own; a pass that decides the same list writes nothing, and the list goes once the
/// run gives the device nothing more.
#[test]
fn task_reasons_are_listed_by_the_one_device_writer() {
    use crate::blocking::{Blocking, BlockingKind};
    let now = Timestamp::now();
    let mut s = base();
    let mut report = fixtures::workload_status();
    report.device_id = DeviceId::try_from("d1").expect("id");
    s.workloads = shared([("d1".to_owned(), report)]);
    let waiting = Blocking {
        kind: BlockingKind::WaitingForCanaries,
        change: "TaskRun/fleet/upgrade-1".into(),
        message: "TaskRun/fleet/upgrade-1 waits for its canaries: 1 of 1 have not succeeded yet"
            .into(),
        since: None,
        until: None,
    };
    // Published, with no run left unjudged.
    let published = |devices| {
        Arc::new(crate::task_reasons::Published {
            devices,
            kept: crate::task_reasons::Kept::Changes(Default::default()),
        })
    };
    let mut tasks = crate::task_reasons::ByDevice::new();
    tasks.insert(
        "d1".into(),
        crate::task_reasons::Listed {
            shown: vec![waiting.clone()],
            more: 0,
        },
    );
    s.task_reasons = published(tasks);
    let written = |p: &Plan, name: &str| {
        p.device_statuses
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, st)| st.clone())
    };
    let p = plan(&s, now, &mut AttemptId::new_random);
    let d1 = written(&p, "d1").expect("d1's status");
    assert_eq!(d1.blocking, std::slice::from_ref(&waiting));
    assert_eq!(d1.blocking_more, None);
    // d2 reported nothing: left alone
    assert_eq!(written(&p, "d2"), None);
    // the cache shows it: the same list again writes nothing
    let mut shown = (*s.devices[0]).clone();
    shown.status = Some(d1.clone());
    s.devices[0] = Arc::new(shown);
    let p = plan(&s, now, &mut AttemptId::new_random);
    assert_eq!(written(&p, "d1"), None);
    // the run ended: the entry goes
    s.task_reasons = published(Default::default());
    let p = plan(&s, now, &mut AttemptId::new_random);
    let d1 = written(&p, "d1").expect("d1's status without the reason");
    assert!(d1.blocking.is_empty(), "{:?}", d1.blocking);
}

// Staged deployments over several passes.
mod staged;
