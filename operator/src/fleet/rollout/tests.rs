//! The staged-rollout rule, table-tested.

use super::*;

const T0: u64 = 1_800_000_000_000;
fn t(secs: u64) -> Timestamp {
    Timestamp::from_unix_ms(T0 + secs * 1000)
}
fn committed(at: u64, started: Option<u64>, beat: Option<u64>) -> Observed {
    Observed::Committed {
        at: t(at),
        agent_started: started.map(t),
        heartbeat: beat.map(t),
        restarts: None,
    }
}
fn targets(spec: &[(&str, bool, Observed)]) -> Vec<Target> {
    spec.iter()
        .map(|(id, canary, observed)| Target {
            id: DeviceId::try_from(*id).expect("id"),
            canary: *canary,
            observed: *observed,
            last_heartbeat: None,
            low_space: None,
        })
        .collect()
}
fn policy(soak: u32, max_unavailable: IntOrString, max_failures: IntOrString) -> Policy {
    Policy::from_spec(Some(&RolloutSpec {
        soak_seconds: Some(soak),
        max_unavailable: Some(max_unavailable),
        max_failures: Some(max_failures),
        heartbeat_timeout_seconds: None,
    }))
    .expect("policy")
}
fn n(v: i32) -> IntOrString {
    IntOrString::Int(v)
}
fn pct(v: &str) -> IntOrString {
    IntOrString::String(v.into())
}

#[test]
fn standing_table() {
    let p = policy(300, n(1), n(0));
    let cases: Vec<(Observed, u64, Standing)> = vec![
        (Observed::Pending, 0, Standing::Pending),
        (Observed::Updating(None), 0, Standing::Updating),
        (Observed::Current, 0, Standing::Healthy),
        (Observed::Failed, 0, Standing::Failed(Failure::Attempt)),
        // committed at 100, started at 90 (before its commit), beating: soaking until a beat at 400
        (committed(100, Some(90), Some(130)), 140, Standing::Soaking),
        (committed(100, Some(90), Some(400)), 410, Standing::Healthy),
        // no beat of the new version yet, just committed: soaking, not silent
        (committed(100, Some(90), None), 150, Standing::Soaking),
        // silent for longer than the timeout (90 s) since the commit
        (
            committed(100, Some(90), None),
            191,
            Standing::Failed(Failure::Silent),
        ),
        (
            committed(100, Some(90), Some(130)),
            221,
            Standing::Failed(Failure::Silent),
        ),
        // the agent restarted 30 s after its commit: failed, whatever the heartbeats say
        (
            committed(100, Some(130), Some(500)),
            510,
            Standing::Failed(Failure::Restarted),
        ),
        // a restart after the soak ended is no failure (a reboot next week)
        (committed(100, Some(450), Some(500)), 510, Standing::Healthy),
    ];
    for (i, (o, now, want)) in cases.into_iter().enumerate() {
        assert_eq!(standing(o, &p, t(now)), want, "case {i}");
    }
    // soak 0: healthy on commit unless restarted since
    let p0 = policy(0, n(1), n(0));
    assert_eq!(
        standing(committed(100, Some(90), None), &p0, t(101)),
        Standing::Healthy
    );
    assert_eq!(
        standing(committed(100, Some(101), None), &p0, t(102)),
        Standing::Healthy,
        "soak 0 has no window a restart can fall into"
    );
}

#[test]
fn policy_table() {
    assert_eq!(Policy::from_spec(None), Ok(Policy::ALL_AT_ONCE));
    let empty = Policy::from_spec(Some(&RolloutSpec::default())).expect("defaults");
    assert_eq!(
        empty,
        Policy {
            staged: true,
            soak: Duration::ZERO,
            max_unavailable: Amount::Percent(100),
            max_failures: Amount::Count(0),
            heartbeat_timeout: Duration::from_secs(90),
        }
    );
    let bad = |r: RolloutSpec, frag: &str| {
        let e = Policy::from_spec(Some(&r)).expect_err(frag);
        assert!(e.contains(frag), "{e}");
    };
    bad(
        RolloutSpec {
            soak_seconds: Some(MAX_SECONDS + 1),
            ..Default::default()
        },
        "soakSeconds",
    );
    bad(
        RolloutSpec {
            max_unavailable: Some(pct("101%")),
            ..Default::default()
        },
        "maxUnavailable",
    );
    bad(
        RolloutSpec {
            max_failures: Some(pct("ten")),
            ..Default::default()
        },
        "maxFailures",
    );
    bad(
        RolloutSpec {
            max_failures: Some(n(-1)),
            ..Default::default()
        },
        "maxFailures",
    );
    bad(
        RolloutSpec {
            heartbeat_timeout_seconds: Some(1),
            ..Default::default()
        },
        "heartbeatTimeoutSeconds",
    );
    assert_eq!(Amount::Percent(25).of(10), 2);
    assert_eq!(Amount::Percent(100).of(3), 3);
    assert_eq!(Amount::Count(2).of(100), 2);
}

/// One row: the devices (id, canary, observed), the policy, now (seconds), then what the pass must decide:
/// released devices, phase, (updated, healthy, soaking, updating, pending, failed), halt reason.
type Row = (
    &'static str,
    Vec<(&'static str, bool, Observed)>,
    Policy,
    u64,
    Vec<&'static str>,
    RolloutPhase,
    (u32, u32, u32, u32, u32, u32),
    Option<HaltReason>,
);

#[test]
fn plan_table() {
    use Observed::{Current, Failed, Pending};
    #[allow(non_upper_case_globals)]
    const Updating: Observed = Observed::Updating(None);
    use RolloutPhase::*;
    let staged = policy(300, n(1), n(0));
    let soaked = committed(100, Some(90), Some(400));
    let soaking = committed(100, Some(90), Some(130));
    let crashed = committed(100, Some(130), Some(140));
    let rows: Vec<Row> = vec![
        (
            "no rollout section: everyone at once, failures never halt",
            vec![
                ("a", true, Pending),
                ("b", false, Pending),
                ("c", false, Failed),
            ],
            Policy::ALL_AT_ONCE,
            0,
            vec!["a", "b"],
            Progressing,
            (0, 0, 0, 0, 2, 1),
            None,
        ),
        (
            "no rollout section, every device failed: the rollout failed, not complete",
            vec![("a", false, Failed), ("b", false, Failed)],
            Policy::ALL_AT_ONCE,
            0,
            vec![],
            RolloutPhase::Failed,
            (0, 0, 0, 0, 0, 2),
            None,
        ),
        (
            "canaries first, all of them at once",
            vec![
                ("a", true, Pending),
                ("b", false, Pending),
                ("c", true, Pending),
            ],
            staged,
            0,
            vec!["a", "c"],
            Progressing,
            (0, 0, 0, 0, 3, 0),
            None,
        ),
        (
            "a canary updating: the rest wait",
            vec![("a", true, Updating), ("b", false, Pending)],
            staged,
            0,
            vec![],
            Progressing,
            (0, 0, 0, 1, 1, 0),
            None,
        ),
        (
            "a canary in its soak: the rest wait",
            vec![("a", true, soaking), ("b", false, Pending)],
            staged,
            140,
            vec![],
            Soaking,
            (1, 0, 1, 0, 1, 0),
            None,
        ),
        (
            "every canary soaked: the rest follow, one at a time",
            vec![
                ("a", true, soaked),
                ("b", false, Pending),
                ("c", false, Pending),
            ],
            staged,
            410,
            vec!["b"],
            Progressing,
            (1, 1, 0, 0, 2, 0),
            None,
        ),
        (
            "one of the rest soaking with maxUnavailable 1: nobody else",
            vec![
                ("a", true, soaked),
                ("b", false, soaking),
                ("c", false, Pending),
            ],
            staged,
            140,
            vec![],
            Soaking,
            (2, 1, 1, 0, 1, 0),
            None,
        ),
        (
            "maxUnavailable 50% of 5 is 2: one updating leaves room for one",
            vec![
                ("a", true, Current),
                ("b", false, Updating),
                ("c", false, Pending),
                ("d", false, Pending),
                ("e", false, Pending),
            ],
            policy(300, pct("50%"), n(0)),
            0,
            vec!["c"],
            Progressing,
            (1, 1, 0, 1, 3, 0),
            None,
        ),
        (
            "maxUnavailable 10% of 3 rounds down to 0 but releases at least one",
            vec![
                ("b", false, Pending),
                ("c", false, Pending),
                ("d", false, Pending),
            ],
            policy(0, pct("10%"), n(0)),
            0,
            vec!["b"],
            Progressing,
            (0, 0, 0, 0, 3, 0),
            None,
        ),
        (
            "no canary among the targets: the rest start at once",
            vec![("b", false, Pending), ("c", false, Pending)],
            policy(0, n(5), n(0)),
            0,
            vec!["b", "c"],
            Progressing,
            (0, 0, 0, 0, 2, 0),
            None,
        ),
        (
            "a failed canary halts: nobody else",
            vec![("a", true, Failed), ("b", false, Pending)],
            staged,
            0,
            vec![],
            Halted,
            (0, 0, 0, 0, 1, 1),
            Some(HaltReason::CanaryFailed),
        ),
        (
            "a canary whose agent restarted in its soak halts, even with maxFailures",
            vec![("a", true, crashed), ("b", false, Pending)],
            policy(300, n(1), n(10)),
            150,
            vec![],
            Halted,
            (0, 0, 0, 0, 1, 1),
            Some(HaltReason::CanaryFailed),
        ),
        (
            "one failure among the rest within maxFailures 1: the rollout goes on",
            vec![
                ("a", true, soaked),
                ("b", false, Failed),
                ("c", false, Pending),
            ],
            policy(300, n(1), n(1)),
            410,
            vec!["c"],
            Progressing,
            (1, 1, 0, 0, 1, 1),
            None,
        ),
        (
            "failures beyond maxFailures 0 halt; what is updating keeps going",
            vec![
                ("a", true, soaked),
                ("b", false, Failed),
                ("c", false, Updating),
                ("d", false, Pending),
            ],
            policy(300, n(2), n(0)),
            410,
            vec![],
            Halted,
            (1, 1, 0, 1, 1, 1),
            Some(HaltReason::FailureThreshold),
        ),
        (
            "maxFailures as a percentage: 25% of 8 is 2, a third failure halts",
            vec![
                ("a", false, Failed),
                ("b", false, Failed),
                ("c", false, Failed),
                ("d", false, Pending),
                ("e", false, Pending),
                ("f", false, Pending),
                ("g", false, Pending),
                ("h", false, Pending),
            ],
            policy(0, n(8), pct("25%")),
            0,
            vec![],
            Halted,
            (0, 0, 0, 0, 5, 3),
            Some(HaltReason::FailureThreshold),
        ),
        (
            "everyone healthy or failed within the threshold: complete",
            vec![
                ("a", true, soaked),
                ("b", false, Current),
                ("c", false, Failed),
            ],
            policy(300, n(1), n(1)),
            410,
            vec![],
            Complete,
            (2, 2, 0, 0, 0, 1),
            None,
        ),
    ];
    for (name, devices, policy, now, release, phase, counts, halt) in rows {
        let out = plan(&targets(&devices), &policy, t(now));
        let released: Vec<&str> = out.release.iter().map(DeviceId::as_str).collect();
        assert_eq!(released, release, "{name}");
        assert_eq!(out.status.phase, phase, "{name}");
        let s = &out.status;
        assert_eq!(
            (s.updated, s.healthy, s.soaking, s.updating, s.pending, s.failed),
            counts,
            "{name}"
        );
        assert_eq!(out.halt.as_ref().map(|h| h.reason), halt, "{name}");
    }
}

/// The status says who is next and when the first soak ends.
#[test]
fn next_and_soak_end() {
    let staged = policy(300, n(1), n(0));
    // A canary soaking since 100: its soak ends at 400; the rest wait, in order, at most NEXT_SHOWN.
    let mut devices = vec![("a", true, committed(100, Some(90), Some(130)))];
    let names = ["b", "c", "d", "e", "f", "g", "h"];
    devices.extend(names.iter().map(|id| (*id, false, Observed::Pending)));
    let out = plan(&targets(&devices), &staged, t(140));
    assert_eq!(out.status.next, names[..NEXT_SHOWN]);
    assert_eq!(out.status.soak_ends_at, Some(t(400).to_string()));
    // Soaked: b is released now, so c is next; no soak left.
    devices[0].2 = committed(100, Some(90), Some(410));
    let out = plan(&targets(&devices), &staged, t(410));
    assert_eq!(out.release, [DeviceId::try_from("b").unwrap()]);
    assert_eq!(out.status.next.first().map(String::as_str), Some("c"));
    assert_eq!(out.status.soak_ends_at, None);
    // Halted: nobody is next.
    devices[0].2 = Observed::Failed;
    let out = plan(&targets(&devices), &staged, t(410));
    assert!(out.halt.is_some() && out.status.next.is_empty());
}

#[test]
fn halt_names_the_devices_and_why() {
    let devices = vec![
        ("a", true, committed(100, Some(130), Some(140))),
        ("b", true, Observed::Failed),
        ("c", false, Observed::Pending),
    ];
    let out = plan(&targets(&devices), &policy(300, n(1), n(0)), t(150));
    let halt = out.halt.expect("halted");
    assert_eq!(
        halt.devices,
        ["a (agent restarted during its soak)", "b (attempt failed)"]
    );
    assert_eq!((halt.failed, halt.tolerated), (2, 0));
}

#[test]
fn stalled_devices_are_named_with_their_phase() {
    let devices = vec![
        // preparing for 10 min: within 9 min + 1 min slack
        (
            "a",
            false,
            Observed::Updating(Some((UpgradePhase::Preparing, t(0)))),
        ),
        // starting for 6 min: more than 4 min 15 s + 1 min
        (
            "b",
            false,
            Observed::Updating(Some((UpgradePhase::Starting, t(240)))),
        ),
        // not reported yet: not judged
        ("c", false, Observed::Updating(None)),
    ];
    let out = plan(&targets(&devices), &policy(0, n(3), n(0)), t(600));
    assert_eq!(out.stalled, (vec!["b (starting for 6m)".to_owned()], 1));
    let later = plan(&targets(&devices), &policy(0, n(3), n(0)), t(601));
    assert_eq!(later.stalled.1, 2, "{:?}", later.stalled);
    assert_eq!(phase_bound(UpgradePhase::Complete), None);
}

/// The position is a function of NATS alone: replaying the passes of a rollout, with each pass's releases
/// turned into written intents (as the engine does), never releases a device twice and releases the rest only
/// after the canary's soak.
#[test]
fn replayed_passes_release_each_device_once() {
    let p = policy(60, n(1), n(0));
    let mut devices = targets(&[
        ("a", true, Observed::Pending),
        ("b", false, Observed::Pending),
        ("c", false, Observed::Pending),
    ]);
    let mut released: Vec<(u64, String)> = vec![];
    for now in 0..400u64 {
        // Devices commit 10 s after release and beat every 10 s; a "restarted operator" is just the next pass.
        for d in devices.iter_mut() {
            if let Observed::Updating(_) = d.observed {
                let at = released
                    .iter()
                    .find(|(_, id)| id == d.id.as_str())
                    .map(|(s, _)| *s)
                    .expect("released");
                if now >= at + 10 {
                    d.observed = committed(at + 10, Some(at + 5), Some(now - now % 10));
                }
            } else if let Observed::Committed {
                at, agent_started, ..
            } = d.observed
            {
                d.observed = Observed::Committed {
                    at,
                    agent_started,
                    heartbeat: Some(t(now - now % 10)),
                    restarts: Some(0),
                };
            }
        }
        let out = plan(&devices, &p, t(now));
        for id in out.release {
            assert!(
                !released.iter().any(|(_, r)| r == id.as_str()),
                "{id} released twice"
            );
            released.push((now, id.to_string()));
            let d = devices.iter_mut().find(|d| d.id == id).expect("device");
            d.observed = Observed::Updating(None);
        }
    }
    let order: Vec<&str> = released.iter().map(|(_, id)| id.as_str()).collect();
    assert_eq!(order, ["a", "b", "c"]);
    // a commits at 10 and soaks 60 s: b goes when a beat at 70 or later arrives; b commits at 80, c goes at 140.
    assert_eq!(released[1].0, 70);
    assert_eq!(released[2].0, 140);
    let last = plan(&devices, &p, t(400));
    assert_eq!(last.status.phase, RolloutPhase::Complete);
}

fn agent(at: u64, started: u64, beat: u64, restarts: u32) -> Observed {
    Observed::Committed {
        at: t(at),
        agent_started: Some(t(started)),
        heartbeat: Some(t(beat)),
        restarts: Some(restarts),
    }
}

/// Health over time for an agent: a restart inside the soak fails it, a crash loop fails it during the soak
/// or after, one restart after a clean soak does not, and the old agent's restarts say nothing.
#[test]
fn agent_restarts_table() {
    let p = policy(60, n(1), n(0));
    let window = fleet_wire::workload::CRASH_LOOP_WINDOW.as_secs();
    let rows: Vec<(&str, Observed, u64, Standing)> = vec![
        (
            "no restart, soaking",
            agent(100, 100, 150, 0),
            150,
            Standing::Soaking,
        ),
        (
            "no restart, soaked",
            agent(100, 100, 170, 0),
            170,
            Standing::Healthy,
        ),
        (
            "restarted once inside the soak",
            agent(100, 130, 150, 1),
            150,
            Standing::Failed(Failure::Restarted),
        ),
        (
            "restarted once after a clean soak: an incident, not a loop",
            agent(100, 300, 310, 1),
            310,
            Standing::Healthy,
        ),
        (
            "crash-looping after the soak window (the path that lifted the halt)",
            agent(100, 300, 310, 3),
            310,
            Standing::Failed(Failure::CrashLooping),
        ),
        (
            "three restarts long ago, up since for longer than the window",
            agent(100, 300, 300 + window + 5, 3),
            300 + window + 5,
            Standing::Healthy,
        ),
        (
            "the old agent's restarts (its info is older than the commit)",
            agent(100, 90, 170, 7),
            170,
            Standing::Healthy,
        ),
    ];
    for (name, observed, now, want) in rows {
        assert_eq!(standing(observed, &p, t(now)), want, "{name}");
    }
}

// Halts: the hold rule, crash loops, silence, free space, devices that left, what lifts a halt.
mod halts;
