//! "Why isn't it updating?" for TaskRuns: the entry a device's `status.blocking` gets for a running run it has no
//! success of yet. The reason is the run's own step for the device ([`progress::Wait`], decided by
//! [`progress::step`] with the release), worded here with what the device reported for the run (its phase and since
//! when) and the accept check ([`stall::judge`], the same that sets `status.stalled`); nothing is judged a second
//! time. Only what the task planner decides shows: it has no slot bound (every other device is released at once
//! after the canaries), no schedule of its own (a TaskSchedule creates runs; a run exists only from its tick on)
//! and does not wait for a device to be online (an offline device is released and shows as not accepting, then
//! stalled). A run that ended (Complete or Failed) gives no device anything more, so it has no entry. Pure;
//! table-tested below. How the entries reach the Device: [`crate::task_reasons`].

use super::progress::Wait;
use super::stall::{self, Accept};
use crate::blocking::{cut, Blocking, BlockingKind, MAX_MESSAGE_CHARS, MAX_REPORTED_CHARS};
use fleet_wire::{DeviceId, SystemUpgradePhase, SystemUpgradeStatus, Timestamp};
use std::time::Duration;

/// A run as `status.blocking[].change` names it: `TaskRun/<namespace>/<name>` (runs are namespaced).
pub fn change(namespace: &str, name: &str) -> String {
    format!("TaskRun/{namespace}/{name}")
}

/// What the device reported for a run it was given, and its intent as the accept check sees it.
#[derive(Debug, Clone)]
pub struct Given {
    /// Its status for the run, when it reported one.
    pub status: Option<SystemUpgradeStatus>,
    /// Its intent ([`stall::judge`] decides from it, as for `status.stalled`).
    pub seen: stall::Seen,
    /// Now.
    pub now: Timestamp,
    /// The accept timeout.
    pub timeout: Duration,
}

fn phase_word(p: SystemUpgradePhase) -> &'static str {
    match p {
        SystemUpgradePhase::Accepted => "accepted",
        SystemUpgradePhase::Upgrading => "upgrading",
        SystemUpgradePhase::Rebooting => "rebooting",
        SystemUpgradePhase::Succeeded => "succeeded",
        SystemUpgradePhase::Failed => "failed",
    }
}

/// The entry for `change` from the run's `wait` for the device; `given` is read only for [`Wait::Given`].
pub fn reason(change: &str, wait: &Wait, given: impl FnOnce() -> Given) -> Blocking {
    let at = |t: Timestamp| Some(t.to_string());
    let (kind, message, since) = match wait {
        Wait::Canaries { waiting, canaries } => (
            BlockingKind::WaitingForCanaries,
            format!(
                "{change} waits for its canaries: {waiting} of {canaries} have not succeeded yet"
            ),
            None,
        ),
        Wait::Held(why) => (
            BlockingKind::Halted,
            format!(
                "{change} is held, nothing more is released: {}; it resumes by itself once the groups can be \
                 read (fix the DeviceGroup's source)",
                cut(why.clone(), MAX_REPORTED_CHARS)
            ),
            None,
        ),
        Wait::Failed { at: when, error } => (
            BlockingKind::Failed,
            format!(
                "{change} failed on this device with {}; the run goes on with the others, create a new TaskRun \
                 to try it again",
                cut(error.clone(), MAX_REPORTED_CHARS)
            ),
            at(*when),
        ),
        Wait::Given => given_reason(change, given()),
    };
    Blocking {
        kind,
        change: change.to_owned(),
        message: cut(message, MAX_MESSAGE_CHARS),
        since,
        until: None,
    }
}

/// A run whose spec the operator refuses to act on (unknown fields, or not the spec it froze: `InvalidSpec`) releases
/// nothing more: each device of `entries` not given the run yet (waiting for the canaries, or held) is held by the
/// spec instead, until it is fixed. The devices given the run keep their entries.
pub fn spec_held(change: &str, problem: &str, entries: &mut [(DeviceId, Blocking)]) {
    for (_, b) in entries.iter_mut() {
        if matches!(
            b.kind,
            BlockingKind::WaitingForCanaries | BlockingKind::Halted
        ) {
            *b = Blocking {
                kind: BlockingKind::Halted,
                change: change.to_owned(),
                message: cut(
                    format!(
                        "{change} is held, nothing more is released: the operator does not act on its spec ({}); \
                         restore the spec it froze (a TaskRun's spec cannot change: create a new TaskRun instead)",
                        cut(problem.to_owned(), MAX_REPORTED_CHARS)
                    ),
                    MAX_MESSAGE_CHARS,
                ),
                since: None,
                until: None,
            };
        }
    }
}

fn given_reason(change: &str, g: Given) -> (BlockingKind, String, Option<String>) {
    if let Some(s) = &g.status {
        // The phase it is in since it entered it (its latest transition; its acceptance before any).
        let since = s
            .transitions
            .last()
            .filter(|t| t.phase == s.phase)
            .map_or(s.accepted_at, |t| t.at);
        let detail = s
            .detail
            .as_ref()
            .map(|d| format!(" ({})", cut(d.to_string(), MAX_REPORTED_CHARS)))
            .unwrap_or_default();
        let message = match s.phase {
            // Counted once its first heartbeat after completion is recorded (progress::accept).
            SystemUpgradePhase::Succeeded => format!(
                "{change} succeeded on the device at {since}; counted once its first heartbeat after that arrives"
            ),
            p => format!("{change} is on its way: {} since {since}{detail}", phase_word(p)),
        };
        return (BlockingKind::Updating, message, Some(since.to_string()));
    }
    match stall::judge(g.seen, g.now, g.timeout) {
        Accept::Stalled { since } => (
            BlockingKind::Stalled,
            format!(
                "{change} is stalled: its intent, written at {since}, has not been accepted within {} (is the \
                 device online, its agent and updater running?)",
                humantime::format_duration(g.timeout)
            ),
            Some(since.to_string()),
        ),
        Accept::Waiting { .. } => {
            let written = g.seen.written.unwrap_or(g.now);
            (
                BlockingKind::Updating,
                format!(
                    "{change} is on its way: given to the device at {written}, not accepted yet (stalled after {})",
                    humantime::format_duration(g.timeout)
                ),
                Some(written.to_string()),
            )
        }
        Accept::Unjudged => (
            BlockingKind::Updating,
            format!("{change} is on its way: given to the device, not accepted yet"),
            None,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tasks::progress::{self, DeviceState, Outcome};
    use fleet_wire::{
        fixtures, AttemptId, BoundedText, SystemUpgradeReason, TaskOperation, TaskPlan, Transition,
        Transitions,
    };
    use std::collections::{BTreeMap, BTreeSet};

    const TIMEOUT: Duration = Duration::from_secs(120);

    fn id(s: &str) -> DeviceId {
        DeviceId::try_from(s).expect("id")
    }
    fn run() -> AttemptId {
        AttemptId::try_from(fixtures::RUN).expect("run")
    }
    fn t(s: u64) -> Timestamp {
        fixtures::t(s)
    }

    /// What the run's view holds for one device: its intent (written at, `None`: never released) and its status.
    #[derive(Clone, Default)]
    struct Dev {
        written: Option<u64>,
        status: Option<SystemUpgradeStatus>,
    }

    fn released(at: u64) -> Dev {
        Dev {
            written: Some(at),
            status: None,
        }
    }

    /// Released at 10 and reported `phase` (entered at `since`; terminal ones completed then).
    fn reported(phase: SystemUpgradePhase, since: u64, device: &str) -> Dev {
        let mut transitions = Transitions::default();
        transitions.push(Transition {
            phase: SystemUpgradePhase::Accepted,
            at: t(11),
            reason: None,
        });
        if phase != SystemUpgradePhase::Accepted {
            transitions.push(Transition {
                phase,
                at: t(since),
                reason: None,
            });
        }
        let done = matches!(
            phase,
            SystemUpgradePhase::Succeeded | SystemUpgradePhase::Failed
        );
        Dev {
            written: Some(10),
            status: Some(SystemUpgradeStatus {
                run_uid: run(),
                device_id: id(device),
                phase,
                reason: (phase == SystemUpgradePhase::Failed)
                    .then_some(SystemUpgradeReason::AptFailed),
                error: (phase == SystemUpgradePhase::Failed)
                    .then(|| BoundedText::lossy("apt-get full-upgrade exited with 100")),
                accepted_at: t(11),
                completed_at: done.then(|| t(since)),
                first_heartbeat_after_completion: None,
                reboot_required: false,
                detail: (phase == SystemUpgradePhase::Rebooting)
                    .then(|| BoundedText::lossy("waiting for a reboot slot")),
                output_tail: None,
                transitions,
            }),
        }
    }

    /// Succeeded at `since` with its first heartbeat after completion recorded.
    fn succeeded(since: u64, device: &str) -> Dev {
        let mut d = reported(SystemUpgradePhase::Succeeded, since, device);
        if let Some(s) = d.status.as_mut() {
            s.first_heartbeat_after_completion = Some(t(since + 1));
        }
        d
    }

    /// One pass of the planner over the run (canaries c1, c2; others o1, o2; deadline t(1000)) at `now`: each
    /// device's entry, `device kind: message [since]`, in plan order.
    fn pass(devs: &[(&str, Dev)], auth: Result<(), &str>, now: u64) -> Vec<String> {
        let plan = TaskPlan::new(
            run(),
            TaskOperation::AptFullUpgradeV1,
            t(1000),
            vec![id("c1"), id("c2")],
            vec![id("o1"), id("o2")],
            t(0),
        )
        .expect("plan");
        let view: BTreeMap<DeviceId, Dev> = devs.iter().map(|(d, v)| (id(d), v.clone())).collect();
        let state = |d: &DeviceId| {
            let v = view.get(d).cloned().unwrap_or_default();
            DeviceState {
                released: v.written.is_some() || v.status.is_some(),
                outcome: v
                    .status
                    .as_ref()
                    .map(|s| progress::accept(s, d, &run(), plan.expires_at))
                    .unwrap_or(Outcome::Pending),
            }
        };
        let all: BTreeSet<DeviceId> = ["c1", "c2", "o1", "o2"].into_iter().map(id).collect();
        let auth = auth.map(|_| all).map_err(str::to_owned);
        let (_, _, _, waits) = progress::step(&plan, state, &auth, t(now));
        let change = change("fleet", "upgrade-1");
        waits
            .iter()
            .map(|(d, w)| {
                let b = reason(&change, w, || {
                    let v = view.get(d).cloned().unwrap_or_default();
                    Given {
                        seen: stall::Seen {
                            live: v.written.is_some(),
                            written: v.written.map(t),
                            reported: v.status.is_some(),
                        },
                        status: v.status,
                        now: t(now),
                        timeout: TIMEOUT,
                    }
                });
                let kind = serde_json::to_value(b.kind).expect("kind");
                let since = b.since.map(|s| format!(" [{s}]")).unwrap_or_default();
                format!("{d} {}: {}{since}", kind.as_str().unwrap_or("?"), b.message)
            })
            .collect()
    }

    /// A run walked step by step (canaries first, then the others), with the exact entry every device without a
    /// success shows at each step: what the planner decided for it, nothing judged again. The planner has no slot
    /// bound, no schedule and no offline gate: an offline device is released like any other and shows as not
    /// accepting, then stalled.
    #[test]
    fn a_run_walked_step_by_step() {
        use SystemUpgradePhase::*;
        let r = "TaskRun/fleet/upgrade-1";
        let canaries =
            |n: u32| format!("{r} waits for its canaries: {n} of 2 have not succeeded yet");
        let cases: Vec<(&str, Vec<String>, Vec<String>)> = vec![
            (
                "nothing released: the canaries are released this pass, the others wait for them",
                pass(&[], Ok(()), 5),
                vec![
                    format!("c1 updating: {r} is on its way: given to the device, not accepted yet"),
                    format!("c2 updating: {r} is on its way: given to the device, not accepted yet"),
                    format!("o1 waitingForCanaries: {}", canaries(2)),
                    format!("o2 waitingForCanaries: {}", canaries(2)),
                ],
            ),
            (
                "the canaries' intents read back: c1 not accepted yet, c2 upgrading",
                pass(&[("c1", released(10)), ("c2", reported(Upgrading, 12, "c2"))], Ok(()), 20),
                vec![
                    format!(
                        "c1 updating: {r} is on its way: given to the device at 2026-11-30T01:00:10.000Z, not \
                         accepted yet (stalled after 2m) [2026-11-30T01:00:10.000Z]"
                    ),
                    format!(
                        "c2 updating: {r} is on its way: upgrading since 2026-11-30T01:00:12.000Z \
                         [2026-11-30T01:00:12.000Z]"
                    ),
                    format!("o1 waitingForCanaries: {}", canaries(2)),
                    format!("o2 waitingForCanaries: {}", canaries(2)),
                ],
            ),
            (
                "c1 is offline and never accepts: stalled after the timeout; c2 succeeded: 1 of 2 canaries left",
                pass(&[("c1", released(10)), ("c2", succeeded(60, "c2"))], Ok(()), 131),
                vec![
                    format!(
                        "c1 stalled: {r} is stalled: its intent, written at 2026-11-30T01:00:10.000Z, has not been \
                         accepted within 2m (is the device online, its agent and updater running?) \
                         [2026-11-30T01:00:10.000Z]"
                    ),
                    format!("o1 waitingForCanaries: {}", canaries(1)),
                    format!("o2 waitingForCanaries: {}", canaries(1)),
                ],
            ),
            (
                "c1 back, succeeded but its heartbeat after completion not recorded yet: still counted pending",
                pass(
                    &[("c1", reported(Succeeded, 140, "c1")), ("c2", succeeded(60, "c2"))],
                    Ok(()),
                    141,
                ),
                vec![
                    format!(
                        "c1 updating: {r} succeeded on the device at 2026-11-30T01:02:20.000Z; counted once its \
                         first heartbeat after that arrives [2026-11-30T01:02:20.000Z]"
                    ),
                    format!("o1 waitingForCanaries: {}", canaries(1)),
                    format!("o2 waitingForCanaries: {}", canaries(1)),
                ],
            ),
            (
                "both canaries succeeded but the groups cannot be read: the others are held",
                pass(
                    &[("c1", succeeded(140, "c1")), ("c2", succeeded(60, "c2"))],
                    Err("group prod: source down"),
                    150,
                ),
                vec![
                    format!(
                        "o1 halted: {r} is held, nothing more is released: cannot re-check group authorization \
                         before release: group prod: source down; it resumes by itself once the groups can be \
                         read (fix the DeviceGroup's source)"
                    ),
                    format!(
                        "o2 halted: {r} is held, nothing more is released: cannot re-check group authorization \
                         before release: group prod: source down; it resumes by itself once the groups can be \
                         read (fix the DeviceGroup's source)"
                    ),
                ],
            ),
            (
                "the groups read again: the others are released this pass",
                pass(
                    &[("c1", succeeded(140, "c1")), ("c2", succeeded(60, "c2"))],
                    Ok(()),
                    160,
                ),
                vec![
                    format!("o1 updating: {r} is on its way: given to the device, not accepted yet"),
                    format!("o2 updating: {r} is on its way: given to the device, not accepted yet"),
                ],
            ),
            (
                "o1 failed, o2 waits for its reboot slot: the run goes on",
                pass(
                    &[
                        ("c1", succeeded(140, "c1")),
                        ("c2", succeeded(60, "c2")),
                        ("o1", reported(Failed, 200, "o1")),
                        ("o2", reported(Rebooting, 210, "o2")),
                    ],
                    Ok(()),
                    220,
                ),
                vec![
                    format!(
                        "o1 failed: {r} failed on this device with o1: apt-failed: apt-get full-upgrade exited \
                         with 100; the run goes on with the others, create a new TaskRun to try it again \
                         [2026-11-30T01:03:20.000Z]"
                    ),
                    format!(
                        "o2 updating: {r} is on its way: rebooting since 2026-11-30T01:03:30.000Z (waiting for a \
                         reboot slot) [2026-11-30T01:03:30.000Z]"
                    ),
                ],
            ),
            (
                "o2 succeeded: the run ends (TargetFailed) and gives no device anything more: no entry",
                pass(
                    &[
                        ("c1", succeeded(140, "c1")),
                        ("c2", succeeded(60, "c2")),
                        ("o1", reported(Failed, 200, "o1")),
                        ("o2", succeeded(230, "o2")),
                    ],
                    Ok(()),
                    240,
                ),
                vec![],
            ),
            (
                "a canary failed: the run ends (CanaryFailed), the others are never released: no entry",
                pass(&[("c1", reported(Failed, 50, "c1")), ("c2", released(10))], Ok(()), 60),
                vec![],
            ),
            (
                "a canary missed the deadline: the run ends: no entry",
                pass(&[("c1", released(10)), ("c2", succeeded(60, "c2"))], Ok(()), 1000),
                vec![],
            ),
        ];
        let mut wrong = vec![];
        for (name, got, want) in cases {
            if got != want {
                wrong.push(format!("{name}:\n  got  {got:#?}\n  want {want:#?}"));
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    /// A refused spec holds the devices not given the run yet; a device given it keeps its entry.
    #[test]
    fn a_refused_spec_holds_the_devices_not_given_the_run() {
        let r = change("fleet", "upgrade-1");
        let given = || Given {
            status: None,
            seen: stall::Seen {
                live: true,
                written: None,
                reported: false,
            },
            now: t(20),
            timeout: TIMEOUT,
        };
        let mut entries = vec![
            (id("c1"), reason(&r, &progress::Wait::Given, given)),
            (
                id("o1"),
                reason(
                    &r,
                    &progress::Wait::Canaries {
                        waiting: 1,
                        canaries: 1,
                    },
                    given,
                ),
            ),
        ];
        let c1 = entries[0].1.clone();
        spec_held(&r, "spec.extra: unknown field", &mut entries);
        assert_eq!(entries[0].1, c1);
        assert_eq!(entries[1].1.kind, BlockingKind::Halted);
        assert_eq!(
            entries[1].1.message,
            "TaskRun/fleet/upgrade-1 is held, nothing more is released: the operator does not act on its spec \
             (spec.extra: unknown field); restore the spec it froze (a TaskRun's spec cannot change: create a new \
             TaskRun instead)"
        );
    }

    /// Every part a device reports is cut, so that what to do always shows, and the message stays bounded.
    #[test]
    fn reported_texts_are_cut() {
        let long = "x".repeat(1000);
        let b = reason(
            &change("fleet", "upgrade-1"),
            &progress::Wait::Failed {
                at: t(1),
                error: long.clone(),
            },
            || unreachable!("read only for a given device"),
        );
        assert!(b.message.chars().count() <= crate::blocking::MAX_MESSAGE_CHARS);
        assert!(
            b.message.ends_with("create a new TaskRun to try it again"),
            "{}",
            b.message
        );
        let held = reason(
            &change("fleet", &"n".repeat(300)),
            &progress::Wait::Held(long),
            || unreachable!(),
        );
        assert_eq!(
            held.message.chars().count(),
            crate::blocking::MAX_MESSAGE_CHARS
        );
        assert!(held.message.ends_with('…'));
    }
}
