//! The staged-rollout rule's halts, silence and free space, table-tested.

use super::*;

fn halted_status(generation: i64, retry: Option<&str>) -> PlacementStatus {
    PlacementStatus {
        observed_generation: Some(generation),
        rollout: Some(RolloutStatus {
            phase: RolloutPhase::Halted,
            retry: retry.map(str::to_owned),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The halt rule: every path that lifted a halt by itself keeps it; only a new spec or a new retry value
/// lifts it; a pass that finds failures now halts afresh.
#[test]
fn halt_rule_table() {
    let p = policy(60, n(1), n(0));
    // The canary a restarted inside its soak (100..160) and again at 170; by now its latest start and beats
    // are past the soak's end, so a pass that remembered nothing would call it healthy and release b.
    let recovered = || {
        targets(&[
            ("a", true, agent(100, 170, 400, 2)),
            ("b", false, Observed::Pending),
        ])
    };
    let left = || targets(&[("b", false, Observed::Pending)]);
    let failing = || {
        targets(&[
            ("a", true, agent(100, 130, 150, 1)),
            ("b", false, Observed::Pending),
        ])
    };
    let progressing = PlacementStatus {
        observed_generation: Some(1),
        rollout: Some(RolloutStatus::default()),
        ..Default::default()
    };
    type HaltRow = (
        &'static str,
        Option<PlacementStatus>,
        i64,
        Option<&'static str>,
        Vec<Target>,
        u64,
        RolloutPhase,
        Vec<&'static str>,
        bool,
    );
    let rows: Vec<HaltRow> = vec![
        (
            "the soak window passed: the restart is no longer inside it",
            Some(halted_status(1, None)),
            1,
            None,
            recovered(),
            400,
            RolloutPhase::Halted,
            vec![],
            true,
        ),
        (
            "the failed device left the targets",
            Some(halted_status(1, None)),
            1,
            None,
            left(),
            400,
            RolloutPhase::Halted,
            vec![],
            true,
        ),
        (
            "the same retry value as the halt was decided under",
            Some(halted_status(1, Some("1"))),
            1,
            Some("1"),
            recovered(),
            400,
            RolloutPhase::Halted,
            vec![],
            true,
        ),
        (
            "still failing: a fresh halt, not a kept one",
            Some(halted_status(1, None)),
            1,
            None,
            failing(),
            150,
            RolloutPhase::Halted,
            vec![],
            false,
        ),
        (
            "a new spec (generation 2) lifts it",
            Some(halted_status(1, None)),
            2,
            None,
            recovered(),
            400,
            RolloutPhase::Progressing,
            vec!["b"],
            false,
        ),
        (
            "a new retry value lifts it",
            Some(halted_status(1, None)),
            1,
            Some("1"),
            recovered(),
            400,
            RolloutPhase::Progressing,
            vec!["b"],
            false,
        ),
        (
            "not halted before: nothing to hold",
            Some(progressing),
            1,
            None,
            recovered(),
            400,
            RolloutPhase::Progressing,
            vec!["b"],
            false,
        ),
        (
            "no status yet",
            None,
            1,
            None,
            recovered(),
            400,
            RolloutPhase::Progressing,
            vec!["b"],
            false,
        ),
    ];
    for (name, old, generation, token, devices, now, phase, release, kept) in rows {
        let holds = !retry_requested(old.as_ref(), token)
            && halt_holds(old.as_ref(), Some(generation), token);
        let mut out = plan(&devices, &p, t(now));
        assert_eq!(hold(&mut out, holds), kept, "{name}");
        let released: Vec<&str> = out.release.iter().map(DeviceId::as_str).collect();
        assert_eq!((out.status.phase, released), (phase, release), "{name}");
        if phase == RolloutPhase::Halted {
            assert!(
                out.status.next.is_empty(),
                "{name}: nobody is next while halted"
            );
        }
    }
}

/// The field's crash loop, replayed pass by pass: an agent that commits, becomes ready and exits 20 s after
/// every start (systemd restarts it 2 s later), soak 60 s, one canary among three. The canary halts the
/// rollout and the halt holds for ten minutes of passes, the status carried from pass to pass as the
/// operator reads it back. The hold and the agent's restart count each keep it on their own; without both
/// (an agent that reports no restarts, no hold: the code before them) the same passes release the next
/// device, as in the field.
#[test]
fn a_crash_looping_canary_halts_for_good() {
    let p = policy(60, n(1), n(0));
    let observed_at = |now: u64, reports: bool| {
        // Commit at 5; starts at 5, 27, 49, …; a beat every 10 s while up.
        let started = 5 + (now.saturating_sub(5) / 22) * 22;
        let restarts = ((started - 5) / 22) as u32;
        let beat = now.max(started).min(started + 20);
        let mut o = agent(5, started, beat - (beat - started) % 10, restarts);
        if let (Observed::Committed { restarts, .. }, false) = (&mut o, reports) {
            *restarts = None;
        }
        o
    };
    for (with_hold, reports) in [(true, true), (true, false), (false, true), (false, false)] {
        let mut old: Option<PlacementStatus> = None;
        let mut first_halt = None;
        let mut released = Vec::new();
        for now in (5..=605).step_by(5) {
            let devices = targets(&[
                ("a", true, observed_at(now, reports)),
                ("b", false, Observed::Pending),
                ("c", false, Observed::Pending),
            ]);
            let holds = with_hold && halt_holds(old.as_ref(), Some(1), None);
            let mut out = plan(&devices, &p, t(now));
            hold(&mut out, holds);
            released.extend(out.release.iter().map(|d| d.to_string()));
            if out.status.phase == RolloutPhase::Halted {
                first_halt.get_or_insert(now);
            }
            if with_hold && first_halt.is_some() {
                assert_eq!(out.status.phase, RolloutPhase::Halted, "at {now} s");
            }
            old = Some(PlacementStatus {
                observed_generation: Some(1),
                rollout: Some(out.status),
                ..Default::default()
            });
        }
        assert!(first_halt.is_some_and(|h| h <= 30), "{first_halt:?}");
        if with_hold || reports {
            assert!(
                released.is_empty(),
                "hold {with_hold}, restarts reported {reports}: released {released:?}"
            );
        } else {
            assert!(
                !released.is_empty(),
                "without both the loop should have lifted the halt"
            );
        }
    }
}

/// Silence in a staged rollout: a silent pending device is passed over (it gets the change once heard from
/// again), an updating one silent for longer than the timeout plus the slack is named stalled and keeps its
/// maxUnavailable slot (it may be mid-update); without a rollout section silence changes nothing.
#[test]
fn silent_devices_wait_and_updating_ones_stall() {
    let p = policy(300, n(1), n(0));
    let with_beat = |id: &str, canary, observed, beat: u64| Target {
        last_heartbeat: Some(t(beat)),
        ..targets(&[(id, canary, observed)]).remove(0)
    };
    let soaked = committed(100, Some(90), Some(400));
    let devices = vec![
        with_beat("a", true, soaked, 400),
        with_beat("b", false, Observed::Pending, 300),
        with_beat("c", false, Observed::Pending, 400),
    ];
    let out = plan(&devices, &p, t(410));
    let released: Vec<&str> = out.release.iter().map(DeviceId::as_str).collect();
    assert_eq!(released, ["c"], "b has been silent for 110 s");
    assert_eq!((out.status.pending, out.stalled.1), (2, 0));
    assert!(
        !out.status.next.contains(&"b".to_owned()),
        "{:?}",
        out.status.next
    );
    // Heard from again: b is next in line.
    let mut back = devices.clone();
    back[1].last_heartbeat = Some(t(405));
    let out = plan(&back, &p, t(410));
    let released: Vec<&str> = out.release.iter().map(DeviceId::as_str).collect();
    assert_eq!(released, ["b"]);
    // b went silent while updating: stalled after 90 s + 60 s of silence, and it keeps its slot.
    let mut updating = devices.clone();
    updating[1].observed = Observed::Updating(None);
    updating[1].last_heartbeat = Some(t(400));
    let out = plan(&updating, &p, t(400 + 150));
    assert_eq!((out.stalled.1, out.release.len()), (0, 0), "150 s: not yet");
    let out = plan(&updating, &p, t(400 + 151));
    assert_eq!(out.stalled, (vec!["b (silent for 2m)".to_owned()], 1));
    assert!(
        out.release.is_empty(),
        "the stalled device keeps the only slot"
    );
    assert_eq!(out.status.stalled, 1);
    // No rollout section: everyone is given the change at once, silent or not.
    let out = plan(&devices, &Policy::ALL_AT_ONCE, t(410));
    assert_eq!(out.release.len(), 2);
}

/// Time alone makes a silent updating device stalled: the pass tells the control loop when, so that a pass
/// then names it (a health_e2e run named it 205 s after its last heartbeat, a resync after the 150 s bound).
#[test]
fn the_next_change_is_the_instant_a_silent_device_becomes_stalled() {
    let p = policy(300, n(1), n(0));
    let mut devices = targets(&[
        ("a", true, committed(100, Some(90), Some(400))),
        ("b", false, Observed::Updating(None)),
    ]);
    devices[0].last_heartbeat = Some(t(400));
    devices[1].last_heartbeat = Some(t(395));
    // At 480 b, heard at 395, is the next to outlive the 90 s timeout (then a at 490, whose soak is over: a
    // cheap pass that changes nothing); after both, b's stall at 395 + 90 + 60.
    let at = |now| plan(&devices, &p, t(now)).next_change;
    assert_eq!(at(480), Some(t(485).plus(Duration::from_millis(10))));
    let next = at(500).expect("b becomes stalled");
    assert_eq!(next, t(545).plus(Duration::from_millis(10)));
    assert_eq!(plan(&devices, &p, next).stalled.1, 1);
    assert_eq!(at(546), None, "nothing more changes by time alone");
}

/// Free space in a staged rollout: a pending device short of the floor is passed over without failing and
/// without holding a maxUnavailable slot (the next device takes it), shows why, and is given the change once it
/// reports room; a halt names it halted like everyone else; without a rollout section it changes nothing.
#[test]
fn devices_short_of_space_wait_without_a_slot() {
    let p = policy(300, n(1), n(0));
    let low = LowSpace {
        role: "containers",
        available_bytes: 120 << 20,
        floor_bytes: 256 << 20,
    };
    let soaked = committed(100, Some(90), Some(400));
    let mut devices = targets(&[
        ("a", true, soaked),
        ("b", false, Observed::Pending),
        ("c", false, Observed::Pending),
    ]);
    devices[1].low_space = Some(low);
    let out = plan(&devices, &p, t(410));
    let released: Vec<&str> = out.release.iter().map(DeviceId::as_str).collect();
    assert_eq!(released, ["c"], "b is short of space: c takes the one slot");
    assert_eq!((out.status.pending, out.status.failed), (2, 0));
    assert!(out.status.next.is_empty(), "{:?}", out.status.next);
    let waits: Vec<(&str, Wait)> = out.waits.iter().map(|(d, w)| (d.as_str(), *w)).collect();
    assert_eq!(waits, [("b", Wait::LowSpace(low))]);
    assert_eq!(out.status.phase, RolloutPhase::Progressing);
    // c updated and healthy: b still waits, and the rollout is not complete while it does.
    devices[2].observed = Observed::Current;
    let out = plan(&devices, &p, t(420));
    assert!(out.release.is_empty());
    assert_eq!(out.status.phase, RolloutPhase::Progressing);
    // Room again: b gets the change.
    devices[1].low_space = None;
    let out = plan(&devices, &p, t(430));
    let released: Vec<&str> = out.release.iter().map(DeviceId::as_str).collect();
    assert_eq!(released, ["b"]);
    // A canary short of space holds the rest at the canary stage (it is not failed: no halt).
    let mut canary_low = targets(&[
        ("a", true, Observed::Pending),
        ("b", false, Observed::Pending),
    ]);
    canary_low[0].low_space = Some(low);
    let out = plan(&canary_low, &p, t(10));
    assert!(out.release.is_empty() && out.halt.is_none());
    let waits: Vec<(&str, Wait)> = out.waits.iter().map(|(d, w)| (d.as_str(), *w)).collect();
    assert_eq!(
        waits,
        [
            ("a", Wait::LowSpace(low)),
            (
                "b",
                Wait::Canaries {
                    waiting: 1,
                    canaries: 1
                }
            )
        ]
    );
    // A held halt: it waits for the halt like everyone else.
    let mut halted = plan(&devices_low(&low), &p, t(410));
    assert!(hold(&mut halted, true));
    assert!(
        halted.waits.iter().all(|(_, w)| *w == Wait::Halted),
        "{:?}",
        halted.waits
    );
    // No rollout section: everyone is given the change at once.
    let out = plan(&devices_low(&low), &Policy::ALL_AT_ONCE, t(410));
    assert_eq!(out.release.len(), 2);
}

fn devices_low(low: &LowSpace) -> Vec<Target> {
    let mut d = targets(&[
        ("a", true, committed(100, Some(90), Some(400))),
        ("b", false, Observed::Pending),
        ("c", false, Observed::Pending),
    ]);
    d[1].low_space = Some(*low);
    d
}

/// A device that leaves the rollout (retired, deleted, ungrouped) is gone, not failed: a pass over the devices
/// that remain counts only them, and a soaking device that left takes no maxUnavailable slot and halts nothing.
#[test]
fn a_device_that_left_is_not_counted() {
    let p = policy(300, n(1), n(0));
    let all = targets(&[
        ("a", true, committed(0, Some(0), Some(400))),
        ("b", false, committed(100, Some(100), Some(100))),
        ("c", false, Observed::Pending),
    ]);
    // b soaks and has been silent for 300 s: the rollout halts on it.
    let out = plan(&all, &p, t(400));
    assert_eq!(out.status.phase, RolloutPhase::Halted);
    assert_eq!(
        out.status.halted_by,
        [crate::crd::HaltCause {
            device: "b".into(),
            failure: "silent".into()
        }]
    );
    // b left: c is given the change at once, nothing failed.
    let left: Vec<Target> = all
        .iter()
        .filter(|t| t.id.as_str() != "b")
        .cloned()
        .collect();
    let out = plan(&left, &p, t(400));
    let released: Vec<&str> = out.release.iter().map(DeviceId::as_str).collect();
    assert_eq!(
        (out.status.phase, out.status.failed, released),
        (RolloutPhase::Progressing, 0, vec!["c"])
    );
    assert!(out.status.halted_by.is_empty());
}

/// The lift rule over a recorded halt: it lifts only when every cause was silence in a soak and every such
/// device has left; any other cause, a device still there, or causes not all listed keep it.
#[test]
fn a_halt_lifts_only_when_every_cause_was_silent_and_left() {
    let halted = |causes: &[(&str, &str)]| PlacementStatus {
        observed_generation: Some(1),
        rollout: Some(RolloutStatus {
            phase: RolloutPhase::Halted,
            halted_by: causes
                .iter()
                .map(|(d, f)| crate::crd::HaltCause {
                    device: (*d).into(),
                    failure: (*f).into(),
                })
                .collect(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let present = |ids: &'static [&'static str]| move |d: &str| ids.contains(&d);
    type Row = (
        &'static str,
        PlacementStatus,
        &'static [&'static str],
        Option<Vec<String>>,
    );
    let rows: Vec<Row> = vec![
        (
            "the silent device left",
            halted(&[("b", "silent")]),
            &["a", "c"],
            Some(vec!["b".into()]),
        ),
        (
            "two silent devices, both left",
            halted(&[("b", "silent"), ("d", "silent")]),
            &["a"],
            Some(vec!["b".into(), "d".into()]),
        ),
        (
            "the silent device is still there",
            halted(&[("b", "silent")]),
            &["a", "b"],
            None,
        ),
        (
            "one of two silent devices left",
            halted(&[("b", "silent"), ("d", "silent")]),
            &["d"],
            None,
        ),
        (
            "a crash loop that left keeps it",
            halted(&[("b", "crashLooping")]),
            &[],
            None,
        ),
        (
            "a failed attempt that left keeps it",
            halted(&[("b", "attemptFailed")]),
            &[],
            None,
        ),
        (
            "a restart in the soak that left keeps it",
            halted(&[("b", "restarted")]),
            &[],
            None,
        ),
        (
            "an unhealthy workload that left keeps it",
            halted(&[("b", "unhealthy")]),
            &[],
            None,
        ),
        (
            "silence and a real failure, both left",
            halted(&[("b", "silent"), ("d", "unhealthy")]),
            &[],
            None,
        ),
        (
            "causes not listed (more than 20): kept",
            halted(&[]),
            &[],
            None,
        ),
    ];
    for (name, old, here, want) in rows {
        assert_eq!(left_silent(Some(&old), &present(here)), want, "{name}");
    }
    let mut progressing = halted(&[("b", "silent")]);
    progressing.rollout.as_mut().unwrap().phase = RolloutPhase::Progressing;
    assert_eq!(
        left_silent(Some(&progressing), &|_| false),
        None,
        "not halted"
    );
    assert_eq!(left_silent(None, &|_| false), None, "no status");
    // More failed devices than HALT_CAUSES: none recorded, so such a halt never lifts by itself.
    let many: Vec<(String, bool, Observed)> = (0..=HALT_CAUSES)
        .map(|i| (format!("d{i:02}"), false, Observed::Failed))
        .collect();
    let many: Vec<(&str, bool, Observed)> =
        many.iter().map(|(d, c, o)| (d.as_str(), *c, *o)).collect();
    let out = plan(&targets(&many), &policy(0, n(1), n(0)), t(10));
    assert_eq!(out.status.phase, RolloutPhase::Halted);
    assert!(out.status.halted_by.is_empty());
}

/// A halt is retryable only when an attempt failed: a soak failure (a crash loop, a restart, silence) is not
/// made healthy by a retry, and the halt's message must not propose one.
#[test]
fn only_failed_attempts_are_retryable() {
    let p = policy(60, n(1), n(0));
    let halt_of = |canary: Observed| {
        plan(
            &targets(&[("a", true, canary), ("b", false, Observed::Pending)]),
            &p,
            t(150),
        )
        .halt
        .expect("halted")
    };
    assert!(halt_of(Observed::Failed).retryable);
    let looping = halt_of(Observed::CrashLooping);
    assert!(!looping.retryable);
    let counted = plan(
        &targets(&[
            ("a", true, Observed::CrashLooping),
            ("b", false, Observed::Failed),
        ]),
        &p,
        t(150),
    );
    assert_eq!(
        (counted.status.failed, counted.status.crash_looping),
        (2, 1)
    );
    assert_eq!(looping.devices, ["a (crash-looping)"]);
    assert!(
        !halt_of(agent(100, 130, 150, 1)).retryable,
        "restarted in its soak"
    );
}
