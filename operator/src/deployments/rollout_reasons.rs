//! The blocking-reason table test: a staged agent rollout walked pass by pass through the planner
//! ([`rollout::plan`], [`rollout::hold`]), asserting at every step the exact reason each device shows
//! ([`rollout::Wait`]) and the exact sentence its Device carries ([`blocking::reason`]).

use super::blocking::{self, Blocking, BlockingKind};
use crate::crd::RolloutSpec;
use crate::fleet::rollout::{self, Failure, Observed, Policy, Stall, Target, Wait};
use fleet_wire::{fixtures, BoundedText, DeviceId, Timestamp, UpgradePhase, UpgradeReason};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

const T0: u64 = 1_800_000_000_000;
fn t(secs: u64) -> Timestamp {
    Timestamp::from_unix_ms(T0 + secs * 1000)
}
fn id(s: &str) -> DeviceId {
    DeviceId::try_from(s).expect("id")
}

/// soak 60 s, maxUnavailable 1, maxFailures 1, heartbeat timeout 90 s.
fn policy() -> Policy {
    Policy::from_spec(Some(&RolloutSpec {
        soak_seconds: Some(60),
        max_unavailable: Some(IntOrString::Int(1)),
        max_failures: Some(IntOrString::Int(1)),
        heartbeat_timeout_seconds: Some(90),
    }))
    .expect("policy")
}

/// The fleet: canary `a`, then `b`, `c`, `d`, and `e`, silent since 0 s (a heartbeat at 0, none since).
struct Fleet {
    a: Observed,
    b: Observed,
    c: Observed,
    d: Observed,
    e: Observed,
    /// When every device but `e` last beat.
    beat: u64,
}

impl Fleet {
    fn targets(&self) -> Vec<Target> {
        let row = |name: &str, canary, observed, beat| Target {
            id: id(name),
            canary,
            observed,
            last_heartbeat: Some(t(beat)),
            low_space: None,
        };
        vec![
            row("a", true, self.a, self.beat),
            row("b", false, self.b, self.beat),
            row("c", false, self.c, self.beat),
            row("d", false, self.d, self.beat),
            row("e", false, self.e, 0),
        ]
    }
}

fn committed(at: u64, beat: u64) -> Observed {
    Observed::Committed {
        at: t(at),
        agent_started: Some(t(at)),
        heartbeat: Some(t(beat)),
        restarts: Some(0),
    }
}

fn waits(out: &rollout::Outcome) -> Vec<(&str, Wait)> {
    out.waits.iter().map(|(d, w)| (d.as_str(), *w)).collect()
}
fn released(out: &rollout::Outcome) -> Vec<&str> {
    out.release.iter().map(DeviceId::as_str).collect()
}

/// Every step of a staged rollout: the exact reason per device. A device missing from a step's list has the
/// change (released now, soaking or healthy).
#[test]
fn every_step_of_a_staged_rollout_names_each_devices_reason() {
    use Wait::*;
    let p = policy();
    let mut f = Fleet {
        a: Observed::Pending,
        b: Observed::Pending,
        c: Observed::Pending,
        d: Observed::Pending,
        e: Observed::Pending,
        beat: 100,
    };
    let offline = Offline { since: t(0) };
    let canaries = Canaries {
        waiting: 1,
        canaries: 1,
    };
    let full = MaxUnavailable { busy: 1, max: 1 };

    // 100 s: the canary goes first; the rest wait for it, e because it is silent.
    let out = rollout::plan(&f.targets(), &p, t(100));
    assert_eq!(released(&out), ["a"]);
    assert_eq!(
        waits(&out),
        [
            ("b", canaries),
            ("c", canaries),
            ("d", canaries),
            ("e", offline)
        ]
    );

    // 110 s: the canary prepares.
    f.a = Observed::Updating(Some((UpgradePhase::Preparing, t(105))));
    f.beat = 110;
    let out = rollout::plan(&f.targets(), &p, t(110));
    assert!(released(&out).is_empty());
    assert_eq!(
        waits(&out),
        [
            ("a", Updating(Some((UpgradePhase::Preparing, t(105))))),
            ("b", canaries),
            ("c", canaries),
            ("d", canaries),
            ("e", offline)
        ]
    );

    // 130 s: the canary committed at 120 and soaks until 180; it is not in the list (it has the change).
    f.a = committed(120, 130);
    f.beat = 130;
    let out = rollout::plan(&f.targets(), &p, t(130));
    let soak = CanariesSoaking { until: t(180) };
    assert_eq!(
        waits(&out),
        [("b", soak), ("c", soak), ("d", soak), ("e", offline)]
    );

    // 181 s: a beat at 180 ends the soak: b goes, c and d wait for the one slot.
    f.a = committed(120, 180);
    f.beat = 180;
    let out = rollout::plan(&f.targets(), &p, t(181));
    assert_eq!(released(&out), ["b"]);
    assert_eq!(waits(&out), [("c", full), ("d", full), ("e", offline)]);

    // b prepares since 185 and stays there: updating, then stalled past 9 min + 60 s, holding its slot.
    f.b = Observed::Updating(Some((UpgradePhase::Preparing, t(185))));
    let preparing = Updating(Some((UpgradePhase::Preparing, t(185))));
    let stalled = Stalled(Stall::Phase {
        phase: UpgradePhase::Preparing,
        since: t(185),
    });
    for (now, b) in [
        (200, preparing),
        (185 + 600, preparing),
        (185 + 601, stalled),
    ] {
        f.beat = now;
        let out = rollout::plan(&f.targets(), &p, t(now));
        assert!(released(&out).is_empty(), "at {now}");
        assert_eq!(
            waits(&out),
            [("b", b), ("c", full), ("d", full), ("e", offline)],
            "at {now}"
        );
    }

    // b's download failed: one failure is within maxFailures (1), its slot goes to c.
    f.b = Observed::Failed;
    f.beat = 800;
    let out = rollout::plan(&f.targets(), &p, t(800));
    assert_eq!(released(&out), ["c"]);
    assert_eq!(
        waits(&out),
        [("b", Failed(Failure::Attempt)), ("d", full), ("e", offline)]
    );

    // c's upgrade failed and so did its rollback: two failures, more than maxFailures: halted.
    f.c = Observed::Failed;
    let out = rollout::plan(&f.targets(), &p, t(810));
    assert_eq!(
        out.halt.as_ref().map(|h| h.reason),
        Some(rollout::HaltReason::FailureThreshold)
    );
    assert_eq!(
        waits(&out),
        [
            ("b", Failed(Failure::Attempt)),
            ("c", Failed(Failure::Attempt)),
            ("d", Halted),
            ("e", Halted)
        ]
    );

    // A person repaired b and c by hand (they run the version now): the rule alone would release d, the halt
    // holds (same spec, same retry value), so d and e still wait for it.
    f.b = Observed::Current;
    f.c = Observed::Current;
    let mut out = rollout::plan(&f.targets(), &p, t(820));
    assert_eq!(released(&out), ["d"]);
    assert!(rollout::hold(&mut out, true));
    assert!(released(&out).is_empty());
    assert_eq!(waits(&out), [("d", Halted), ("e", Halted)]);

    // The retry lifts the halt: d goes, e (silent) still waits to be heard from.
    let out = rollout::plan(&f.targets(), &p, t(830));
    assert_eq!(released(&out), ["d"]);
    assert_eq!(waits(&out), [("e", offline)]);

    // d soaks; e heard from again: it waits for d's slot.
    f.d = committed(840, 850);
    f.e = Observed::Pending;
    f.beat = 850;
    let mut targets = f.targets();
    targets[4].last_heartbeat = Some(t(850));
    let out = rollout::plan(&targets, &p, t(850));
    assert_eq!(waits(&out), [("e", full)]);

    // e goes silent while updating: stalled (silent) after 90 s + 60 s without a heartbeat.
    targets[3].observed = committed(840, 900);
    targets[4].observed = Observed::Updating(None);
    targets[4].last_heartbeat = Some(t(901));
    let out = rollout::plan(&targets, &p, t(901 + 150));
    assert_eq!(waits(&out), [("e", Updating(None))]);
    let out = rollout::plan(&targets, &p, t(901 + 151));
    assert_eq!(
        waits(&out),
        [("e", Stalled(Stall::Silent { since: t(901) }))]
    );
}

/// A canary that crash-loops during its soak halts the rollout: it shows its own failure, the others the halt.
#[test]
fn a_failing_canary_halts_the_others() {
    let p = policy();
    let f = Fleet {
        a: Observed::CrashLooping,
        b: Observed::Pending,
        c: Observed::Pending,
        d: Observed::Pending,
        e: Observed::Pending,
        beat: 100,
    };
    let out = rollout::plan(&f.targets(), &p, t(100));
    assert!(released(&out).is_empty());
    assert_eq!(
        waits(&out),
        [
            ("a", Wait::Failed(Failure::CrashLooping)),
            ("b", Wait::Halted),
            ("c", Wait::Halted),
            ("d", Wait::Halted),
            ("e", Wait::Halted)
        ]
    );
    let why = blocking::halt_why(out.halt.as_ref(), None);
    assert_eq!(why, "a canary failed: a (crash-looping)");
}

/// Without a rollout section every device is given the change at once: nobody waits, silent or not; a device
/// that was given it shows where it is.
#[test]
fn all_at_once_holds_nobody_back() {
    let f = Fleet {
        a: Observed::Pending,
        b: Observed::Updating(None),
        c: Observed::Pending,
        d: Observed::Current,
        e: Observed::Pending,
        beat: 100,
    };
    let out = rollout::plan(&f.targets(), &Policy::ALL_AT_ONCE, t(100));
    assert_eq!(released(&out), ["a", "c", "e"]);
    assert_eq!(waits(&out), [("b", Wait::Updating(None))]);
}

fn upgrade(
    phase: UpgradePhase,
    reason: UpgradeReason,
    error: &str,
) -> fleet_wire::AgentUpgradeStatus {
    let mut s = fixtures::upgrade_status();
    s.phase = phase;
    s.reason = Some(reason);
    s.error = Some(BoundedText::lossy(error));
    s.phase_changed_at = t(700);
    s
}

fn said(wait: Wait, failure: blocking::Reported) -> Blocking {
    blocking::reason(
        "AgentRelease/fleet-agent",
        wait,
        || "2 failed devices, more than maxFailures (1): b (attempt failed) and 1 more".into(),
        || failure,
    )
}

/// One row: the planner's wait and the device's report, then the kind, message, since and until it shows.
type Row = (
    Wait,
    blocking::Reported,
    BlockingKind,
    String,
    Option<String>,
    Option<String>,
);

/// What each reason says on the Device, exactly: kind, message, since and until.
#[test]
fn each_reason_reads_exactly() {
    let download = blocking::upgrade_failure(Some(&upgrade(
        UpgradePhase::Failed,
        UpgradeReason::DownloadFailed,
        "connection refused",
    )));
    let rollback = blocking::upgrade_failure(Some(&upgrade(
        UpgradePhase::RollbackFailed,
        UpgradeReason::RestoreFailed,
        "start failed",
    )));
    let probe = blocking::upgrade_failure(Some(&upgrade(
        UpgradePhase::Failed,
        UpgradeReason::ProbeFailed,
        "exit 1",
    )));
    let none = || blocking::upgrade_failure(None);
    let since = |s: u64| Some(t(s).to_string());
    let rows: Vec<Row> = vec![
        (
            Wait::Halted,
            none(),
            BlockingKind::Halted,
            "AgentRelease/fleet-agent is halted (2 failed devices, more than maxFailures (1): b (attempt failed) and 1 more): no device gets it until a person acts; to resume, change its spec (a new generation) or set the annotation fleet.nationtech.io/retry=<new value> on it".into(),
            None,
            None,
        ),
        (
            Wait::Canaries { waiting: 1, canaries: 2 },
            none(),
            BlockingKind::WaitingForCanaries,
            "AgentRelease/fleet-agent waits for the canaries: 1 of 2 not updated yet".into(),
            None,
            None,
        ),
        (
            Wait::CanariesSoaking { until: t(180) },
            none(),
            BlockingKind::Soaking,
            format!("AgentRelease/fleet-agent waits for the canaries' soak, until {} at the earliest", t(180)),
            None,
            since(180),
        ),
        (
            Wait::MaxUnavailable { busy: 2, max: 2 },
            none(),
            BlockingKind::MaxUnavailable,
            "AgentRelease/fleet-agent waits: maxUnavailable reached, 2 of 2 devices updating or soaking".into(),
            None,
            None,
        ),
        (
            Wait::Offline { since: t(0) },
            none(),
            BlockingKind::Offline,
            format!("AgentRelease/fleet-agent waits until the device is heard from: offline since {} (its last heartbeat)", t(0)),
            since(0),
            None,
        ),
        (
            Wait::LowSpace(rollout::LowSpace { role: "containers", available_bytes: 120 << 20, floor_bytes: 256 << 20 }),
            none(),
            BlockingKind::NotEnoughSpace,
            "AgentRelease/fleet-agent waits for free space: 120 MiB free on containers, needs 256 MiB; free space on the device (its status.usage shows each filesystem)".into(),
            None,
            None,
        ),
        (
            Wait::Updating(Some((UpgradePhase::Stopping, t(50)))),
            none(),
            BlockingKind::Updating,
            format!("AgentRelease/fleet-agent is on its way: stopping since {}", t(50)),
            since(50),
            None,
        ),
        (
            Wait::Stalled(Stall::Phase { phase: UpgradePhase::Preparing, since: t(185) }),
            none(),
            BlockingKind::Stalled,
            format!("AgentRelease/fleet-agent is stalled in phase preparing since {}, longer than its bound of 10m", t(185)),
            since(185),
            None,
        ),
        (
            Wait::Stalled(Stall::Silent { since: t(901) }),
            none(),
            BlockingKind::Stalled,
            format!("AgentRelease/fleet-agent is stalled: given to the device, no heartbeat since {}", t(901)),
            since(901),
            None,
        ),
        (
            Wait::Failed(Failure::Attempt),
            download,
            BlockingKind::DownloadFailed,
            "AgentRelease/fleet-agent download failed with download-failed: connection refused; set the annotation fleet.nationtech.io/retry=<new value> on it to retry".into(),
            since(700),
            None,
        ),
        (
            Wait::Failed(Failure::Attempt),
            rollback,
            BlockingKind::RollbackFailed,
            "AgentRelease/fleet-agent rollback failed with restore-failed: start failed; never retried: the device needs a person (docs/updater.md)".into(),
            since(700),
            None,
        ),
        (
            Wait::Failed(Failure::Attempt),
            probe,
            BlockingKind::Failed,
            "AgentRelease/fleet-agent failed with probe-failed: exit 1; set the annotation fleet.nationtech.io/retry=<new value> on it to retry".into(),
            since(700),
            None,
        ),
        (
            Wait::Failed(Failure::CrashLooping),
            none(),
            BlockingKind::CrashLooping,
            "AgentRelease/fleet-agent runs on the device and keeps restarting: publish a fixed spec".into(),
            None,
            None,
        ),
        (
            Wait::Failed(Failure::Restarted),
            none(),
            BlockingKind::SoakFailed,
            "AgentRelease/fleet-agent runs on the device and restarted during its soak: publish a fixed spec".into(),
            None,
            None,
        ),
    ];
    for (wait, failure, kind, message, since, until) in rows {
        let got = said(wait, failure);
        assert_eq!(
            got,
            Blocking {
                kind,
                change: "AgentRelease/fleet-agent".into(),
                message,
                since,
                until,
            },
            "{wait:?}"
        );
    }
}

/// The list a Device holds is bounded and says how many more there are; a long error is cut.
#[test]
fn the_list_and_its_messages_are_bounded() {
    let one = said(Wait::Halted, blocking::upgrade_failure(None));
    let many = vec![one.clone(); blocking::MAX_BLOCKING + 3];
    let (listed, more) = blocking::listed(&many);
    assert_eq!((listed.len(), more), (blocking::MAX_BLOCKING, Some(3)));
    let two = vec![one; 2];
    let (listed, more) = blocking::listed(&two);
    assert_eq!((listed.len(), more), (2, None));
    let long = upgrade(
        UpgradePhase::Failed,
        UpgradeReason::DownloadFailed,
        &"x".repeat(1000),
    );
    let got = said(
        Wait::Failed(Failure::Attempt),
        blocking::upgrade_failure(Some(&long)),
    );
    // The device's error is cut, what to do is not.
    let kept = format!(
        "download-failed: {}…",
        "x".repeat(blocking::MAX_REPORTED_CHARS - 18)
    );
    assert_eq!(
        got.message,
        format!(
            "AgentRelease/fleet-agent download failed with {kept}; set the annotation \
             fleet.nationtech.io/retry=<new value> on it to retry"
        )
    );
    // A change whose name is very long: the whole message is cut.
    let long_name = format!("AgentRelease/{}", "n".repeat(500));
    let got = blocking::reason(
        &long_name,
        Wait::Halted,
        || "why".into(),
        || blocking::upgrade_failure(None),
    );
    assert_eq!(got.message.chars().count(), blocking::MAX_MESSAGE_CHARS);
    assert!(got.message.ends_with('…'));
}
