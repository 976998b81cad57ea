//! Staged deployments over several passes: the canary first, halts that hold, devices that leave.

use super::*;

/// A staged deployment through its passes: the canary gets the new spec and the rest keep the old one in
/// their desired state; after the canary's soak one more; a failed canary halts, and the halt holds after it
/// recovers until the retry annotation changes, which gives the failed device the spec again.
#[test]
fn staged_deployment_holds_the_rest_until_the_canary_soaked() {
    use fleet_wire::{WorkloadState, WorkloadStatus};
    let staged = |image: &str, meta: Value, status: Option<PlacementStatus>| {
        let mut d: FleetDeployment = (*obj::<FleetDeployment>(
            "FleetDeployment",
            "web",
            meta,
            json!({"allowedGroups": ["all"], "workloads": [{"name": "web", "image": image}],
                    "rollout": {"soakSeconds": 60, "maxUnavailable": 1}}),
        ))
        .clone();
        d.status = status;
        Arc::new(d)
    };
    let spec_of = |d: &FleetDeployment| validate::deployment_workloads(&d.spec).expect("valid");
    let old = spec_of(&staged("nginx:1", json!({}), None));
    let new = spec_of(&staged("nginx:2", json!({}), None));
    let key = |id: &str, generation, ws: &[WorkloadSpec]| {
        let s = DesiredState::new(DeviceId::try_from(id).expect("id"), generation, ws.to_vec());
        (id.to_owned(), s.expect("state"))
    };
    let now = Timestamp::now();
    let report = |id: &str, generation, state, started: u64| {
        let mut r = fixtures::workload_status();
        r.device_id = DeviceId::try_from(id).expect("id");
        r.generation = generation;
        r.at = now;
        r.workloads = vec![WorkloadStatus {
            name: new[0].name.clone(),
            state,
            container_id: None,
            spec_digest: (state == WorkloadState::Running).then(|| new[0].digest()),
            started_at: Some(Timestamp::from_unix_ms(now.unix_ms() - started * 1000)),
            error: None,
            failure: None,
            restarts: None,
            health: None,
        }];
        (id.to_owned(), r)
    };
    let images = |p: &Plan| -> Vec<String> {
        p.desired
            .iter()
            .map(|(d, ws)| {
                format!(
                    "{d}={}",
                    ws.iter().map(|w| w.image.as_str()).collect::<String>()
                )
            })
            .collect()
    };
    let rollout_of = |p: &Plan| {
        let d = &p.deployments[0];
        let r = d.next.rollout.clone().expect("status.rollout");
        let halted = d
            .wants
            .iter()
            .find(|w| w.type_ == conditions::HALTED)
            .cloned();
        (r, halted.expect("Halted wanted"))
    };
    // What each device's status.blocking gets: `device=kind`.
    let waiting = |p: &Plan| -> Vec<String> {
        p.blocking
            .iter()
            .flat_map(|(d, bs)| bs.iter().map(move |b| (d, b)))
            .map(|(d, b)| {
                assert_eq!(b.change, "FleetDeployment/web");
                let kind = serde_json::to_value(b.kind).expect("kind");
                format!("{d}={}", kind.as_str().unwrap_or_default())
            })
            .collect()
    };
    let mut s = base();
    s.devices = vec![
        device("d1", json!({"canary": "true"})),
        device("d2", json!({})),
        device("d3", json!({})),
    ];
    s.deployments = vec![staged("nginx:2", json!({}), None)];
    s.desired = shared([key("d1", 1, &old), key("d2", 1, &old), key("d3", 1, &old)]);
    let p = plan(&s, now, &mut AttemptId::new_random);
    assert_eq!(images(&p), ["d1=nginx:2", "d2=nginx:1", "d3=nginx:1"]);
    assert_eq!(
        waiting(&p),
        ["d2=waitingForCanaries", "d3=waitingForCanaries"]
    );
    let (r, halted) = rollout_of(&p);
    assert_eq!((r.phase, r.pending), (RolloutPhase::Progressing, 3));
    assert!(!halted.ok);

    // the canary took it and runs it for 30 s: soaking, nobody else
    s.desired
        .insert("d1".into(), Arc::new(key("d1", 2, &new).1));
    s.workloads = shared([report("d1", 2, WorkloadState::Running, 30)]);
    let p = plan(&s, now, &mut AttemptId::new_random);
    assert_eq!(images(&p), ["d1=nginx:2", "d2=nginx:1", "d3=nginx:1"]);
    assert_eq!(rollout_of(&p).0.phase, RolloutPhase::Soaking);
    assert_eq!(waiting(&p), ["d2=soaking", "d3=soaking"]);
    let soak_end = Timestamp::from_unix_ms(now.unix_ms() + 30_000).to_string();
    assert_eq!(
        p.blocking[&DeviceId::try_from("d2").expect("id")][0].until,
        Some(soak_end)
    );
    // The device that reported gets the reason in its status (the others reported nothing: left alone).
    let d2_status = p.device_statuses.iter().find(|(n, _)| n == "d2");
    assert_eq!(d2_status, None, "d2 reported nothing yet");
    // its next report (the same workloads, a later time) ends the soak: it must wake the loop
    assert_eq!(
        p.heartbeat_watch
            .iter()
            .map(|d| d.as_str())
            .collect::<Vec<_>>(),
        ["d1"]
    );

    // 60 s: healthy; d2 is next, d3 waits
    s.workloads = shared([report("d1", 2, WorkloadState::Running, 60)]);
    let p = plan(&s, now, &mut AttemptId::new_random);
    assert_eq!(images(&p), ["d1=nginx:2", "d2=nginx:2", "d3=nginx:1"]);
    assert_eq!(rollout_of(&p).0.healthy, 1);
    assert_eq!(waiting(&p), ["d3=maxUnavailable"]);
    // d3 reports: its status carries the reason, and a pass that decides the same writes nothing new.
    s.workloads = shared([
        report("d1", 2, WorkloadState::Running, 60),
        report("d3", 1, WorkloadState::Running, 600),
    ]);
    let p = plan(&s, now, &mut AttemptId::new_random);
    let (_, d3) = p
        .device_statuses
        .iter()
        .find(|(n, _)| n == "d3")
        .expect("d3's status");
    assert_eq!(
        d3.blocking
            .iter()
            .map(|b| b.message.as_str())
            .collect::<Vec<_>>(),
        ["FleetDeployment/web waits: maxUnavailable reached, 1 of 1 devices updating or soaking"]
    );
    let mut again = s.clone();
    let mut d3_obj = (*again.devices[2]).clone();
    d3_obj.status = Some(d3.clone());
    again.devices[2] = Arc::new(d3_obj);
    let p = plan(&again, now, &mut AttemptId::new_random);
    assert!(p.device_statuses.iter().all(|(n, _)| n != "d3"));

    // the canary's workload failed: halted, the rest keep the old spec
    s.workloads = shared([report("d1", 2, WorkloadState::Failed, 0)]);
    let p = plan(&s, now, &mut AttemptId::new_random);
    assert_eq!(images(&p), ["d1=nginx:2", "d2=nginx:1", "d3=nginx:1"]);
    assert_eq!(waiting(&p), ["d1=failed", "d2=halted", "d3=halted"]);
    let (r, halted) = rollout_of(&p);
    assert_eq!((r.phase, r.failed), (RolloutPhase::Halted, 1));
    assert!(halted.ok && halted.reason == "CanaryFailed", "{halted:?}");
    assert!(halted.message.contains("d1"), "{}", halted.message);
    let ok = conditions::nats_reachable(None);
    let at = Time(k8s_openapi::jiff::Timestamp::now());
    let (_, _, halted_status) = p.deployments[0].clone().finish(&ok, &at).expect("status");

    // it recovers: the halt holds (the status says Halted for this spec)
    s.deployments = vec![staged("nginx:2", json!({}), Some(halted_status.clone()))];
    s.workloads = shared([report("d1", 2, WorkloadState::Running, 600)]);
    let p = plan(&s, now, &mut AttemptId::new_random);
    assert_eq!(images(&p), ["d1=nginx:2", "d2=nginx:1", "d3=nginx:1"]);
    assert_eq!(waiting(&p), ["d2=halted", "d3=halted"]);
    let (r, halted) = rollout_of(&p);
    assert_eq!(r.phase, RolloutPhase::Halted);
    assert!(halted.ok && halted.message.contains("d1"), "{halted:?}");
    assert!(p.bump.is_empty());

    // a retry with the canary still failing gives it the spec again (a new generation) and lifts the halt
    let retry = json!({"annotations": {release::RETRY_ANNOTATION: "1"}});
    s.deployments = vec![staged(
        "nginx:2",
        retry.clone(),
        Some(halted_status.clone()),
    )];
    s.workloads = shared([report("d1", 2, WorkloadState::Failed, 0)]);
    let p = plan(&s, now, &mut AttemptId::new_random);
    assert_eq!(
        p.bump.iter().map(DeviceId::as_str).collect::<Vec<_>>(),
        ["d1"]
    );
    let (r, halted) = rollout_of(&p);
    assert_eq!(
        (r.phase, r.updating, r.retry.as_deref()),
        (RolloutPhase::Progressing, 1, Some("1"))
    );
    assert_eq!(
        waiting(&p),
        [
            "d1=updating",
            "d2=waitingForCanaries",
            "d3=waitingForCanaries"
        ]
    );
    assert!(!halted.ok);

    // a retry after the canary recovered: the rollout goes on
    s.workloads = shared([report("d1", 2, WorkloadState::Running, 600)]);
    let p = plan(&s, now, &mut AttemptId::new_random);
    assert_eq!(images(&p), ["d1=nginx:2", "d2=nginx:2", "d3=nginx:1"]);
    assert!(p.bump.is_empty());

    // an invalid rollout section is InvalidSpec and places nothing new
    let mut bad = (*staged("nginx:3", json!({}), None)).clone();
    bad.spec.rollout = Some(crate::crd::RolloutSpec {
        soak_seconds: Some(rollout::MAX_SECONDS + 1),
        ..Default::default()
    });
    s.deployments = vec![Arc::new(bad)];
    let p = plan(&s, now, &mut AttemptId::new_random);
    assert_eq!(
        p.deployments[0].wants[0].reason,
        conditions::REASON_INVALID_SPEC
    );
    assert!(p.deployments[0].wants[0].message.contains("soakSeconds"));
    assert_eq!(images(&p), ["d1=nginx:2", "d2=nginx:1", "d3=nginx:1"]);
}

/// A device that leaves a staged deployment while it soaks (its Device deleted, its device retired, or its
/// label gone from the group) is dropped from the counts and the failure threshold: the rollout goes on with
/// the others. A halt recorded while it soaked silent lifts once it left, with an event saying why; a halt from
/// a real failure (a crash loop) holds when its device leaves.
#[test]
fn a_device_that_left_the_rollout_is_gone_not_failed() {
    use fleet_wire::{WorkloadState, WorkloadStatus};
    let staged = |status: Option<PlacementStatus>| {
        let mut d: FleetDeployment = (*obj::<FleetDeployment>(
            "FleetDeployment",
            "web",
            json!({}),
            json!({"allowedGroups": ["site-a"], "workloads": [{"name": "web", "image": "nginx:2"}],
                    "rollout": {"soakSeconds": 300, "maxUnavailable": 1}}),
        ))
        .clone();
        d.status = status;
        Arc::new(d)
    };
    let new = validate::deployment_workloads(&staged(None).spec).expect("valid");
    let mut old = new.clone();
    old[0].image = "nginx:1".into();
    let key = |id: &str, generation, ws: &[WorkloadSpec]| {
        let s = DesiredState::new(DeviceId::try_from(id).expect("id"), generation, ws.to_vec());
        (id.to_owned(), s.expect("state"))
    };
    let now = Timestamp::now();
    let ago = |secs: u64| Timestamp::from_unix_ms(now.unix_ms() - secs * 1000);
    // Reported `at` seconds ago, running the new spec since `started` seconds ago (or crash-looping).
    let report = |id: &str, state, started: u64, at: u64| {
        let mut r = fixtures::workload_status();
        r.device_id = DeviceId::try_from(id).expect("id");
        r.generation = 2;
        r.at = ago(at);
        r.workloads = vec![WorkloadStatus {
            name: new[0].name.clone(),
            state,
            container_id: None,
            spec_digest: Some(new[0].digest()),
            started_at: Some(ago(started)),
            error: None,
            failure: None,
            restarts: None,
            health: None,
        }];
        (id.to_owned(), r)
    };
    let image_of = |p: &Plan, id: &str| {
        p.desired[&DeviceId::try_from(id).expect("id")][0]
            .image
            .clone()
    };
    let rollout_of = |p: &Plan| p.deployments[0].next.rollout.clone().expect("rollout");
    let mut s = base();
    let site_a = json!({"site": "a"});
    s.devices = vec![
        device("d1", json!({"site": "a", "canary": "true"})),
        device("d2", site_a.clone()),
        device("d3", site_a.clone()),
    ];
    s.desired = shared([key("d1", 2, &new), key("d2", 2, &new), key("d3", 1, &old)]);
    // d1 soaked long ago; d2 took the change 120 s ago and has been silent for 100 s of its 300-s soak.
    s.workloads = shared([
        report("d1", WorkloadState::Running, 900, 0),
        report("d2", WorkloadState::Running, 120, 100),
    ]);
    s.deployments = vec![staged(None)];
    let p = plan(&s, now, &mut AttemptId::new_random);
    let r = rollout_of(&p);
    assert_eq!((r.phase, r.failed), (RolloutPhase::Halted, 1));
    assert_eq!(
        r.halted_by,
        [crate::crd::HaltCause {
            device: "d2".into(),
            failure: "silent".into()
        }]
    );
    assert_eq!(image_of(&p, "d3"), "nginx:1");
    let ok = conditions::nats_reachable(None);
    let at = Time(k8s_openapi::jiff::Timestamp::now());
    let (_, _, halted) = p.deployments[0].clone().finish(&ok, &at).expect("status");
    s.deployments = vec![staged(Some(halted.clone()))];
    // Still there and silent: the halt holds, no event.
    let p = plan(&s, now, &mut AttemptId::new_random);
    assert_eq!(rollout_of(&p).phase, RolloutPhase::Halted);
    assert!(p.events.is_empty());

    // It leaves, three ways: each lifts the halt (an event says why) and d3 gets the change.
    let mut deleted = (*device("d2", site_a.clone())).clone();
    deleted.metadata.deletion_timestamp = Some(at.clone());
    let ways: Vec<(&str, Snapshot)> = vec![
        ("deleted (retiring)", {
            let mut s = s.clone();
            s.devices[1] = Arc::new(deleted.clone());
            s
        }),
        ("retired", {
            let mut s = s.clone();
            let tomb = fleet_wire::DeviceRetirement {
                device_id: DeviceId::try_from("d2").expect("id"),
                retired_at: now,
                device_uid: None,
            };
            s.retired = shared([("d2".to_owned(), tomb)]);
            s
        }),
        ("its label removed", {
            let mut s = s.clone();
            s.devices[1] = device("d2", json!({}));
            s
        }),
    ];
    for (how, s) in ways {
        let p = plan(&s, now, &mut AttemptId::new_random);
        let r = rollout_of(&p);
        assert_eq!(
            (r.phase, r.failed, r.healthy, r.soaking),
            (RolloutPhase::Progressing, 0, 1, 0),
            "{how}"
        );
        assert!(r.halted_by.is_empty(), "{how}");
        assert_eq!(
            image_of(&p, "d3"),
            "nginx:2",
            "{how}: d3 is given the change"
        );
        assert_eq!(p.events.len(), 1, "{how}");
        assert_eq!(p.events[0].reason, REASON_HALT_LIFTED);
        assert!(
            p.events[0]
                .message
                .contains("d2 (no heartbeat during its soak)"),
            "{}",
            p.events[0].message
        );
        let halted_want = p.deployments[0]
            .wants
            .iter()
            .find(|w| w.type_ == conditions::HALTED)
            .expect("Halted");
        assert!(!halted_want.ok, "{how}: {halted_want:?}");
        if how == "retired" || how == "deleted (retiring)" {
            assert!(
                p.new_devices.is_empty() && p.device_statuses.iter().all(|(n, _)| n != "d2"),
                "{how}: no Device made or written for it"
            );
        }
    }

    // A real failure: d2 crash-loops, the rollout halts; d2 then leaves and the halt holds.
    s.deployments = vec![staged(None)];
    s.workloads = shared([
        report("d1", WorkloadState::Running, 900, 0),
        report("d2", WorkloadState::CrashLooping, 10, 0),
    ]);
    let p = plan(&s, now, &mut AttemptId::new_random);
    assert_eq!(rollout_of(&p).phase, RolloutPhase::Halted);
    let (_, _, crashed) = p.deployments[0].clone().finish(&ok, &at).expect("status");
    let mut gone = s.clone();
    gone.devices[1] = Arc::new(deleted.clone());
    gone.deployments = vec![staged(Some(crashed))];
    let p = plan(&gone, now, &mut AttemptId::new_random);
    let r = rollout_of(&p);
    assert_eq!((r.phase, r.failed), (RolloutPhase::Halted, 0), "held");
    assert_eq!(
        r.halted_by,
        [crate::crd::HaltCause {
            device: "d2".into(),
            failure: "crashLooping".into()
        }],
        "the kept halt keeps its causes"
    );
    assert!(p.events.is_empty());
    assert_eq!(image_of(&p, "d3"), "nginx:1");

    // Leaving while soaking, before any halt: not counted, no halt, d3 next.
    s.deployments = vec![staged(None)];
    s.workloads = shared([
        report("d1", WorkloadState::Running, 900, 0),
        report("d2", WorkloadState::Running, 30, 0),
    ]);
    s.devices[1] = Arc::new(deleted);
    let p = plan(&s, now, &mut AttemptId::new_random);
    let r = rollout_of(&p);
    assert_eq!(
        (r.phase, r.failed, r.soaking),
        (RolloutPhase::Progressing, 0, 0)
    );
    assert_eq!(image_of(&p, "d3"), "nginx:2");
}
