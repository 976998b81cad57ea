//! A running TaskRun's next step, as pure functions: which device results are accepted, which devices to release
//! next (canaries first), and when the run ends. No I/O; table-tested. The KV writes are in
//! [`super::controller`].

use fleet_wire::{
    AttemptId, DeviceId, SystemUpgradePhase, SystemUpgradeStatus, TaskPlan, TaskRunPhase,
    TaskRunReason, Timestamp,
};
use std::collections::BTreeSet;

/// One device's result for one run, as the operator accepts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing terminal (yet) for this run.
    Pending,
    /// Succeeded, and its first heartbeat after completion preceded the deadline.
    Succeeded,
    /// Failed (or succeeded too late): when, and why.
    Failed {
        /// When it was decided (the updater's completion, or the late heartbeat).
        at: Timestamp,
        /// Why, for the run's latest error.
        error: String,
    },
}

impl Outcome {
    /// True for a success or a failure.
    pub fn is_terminal(&self) -> bool {
        !matches!(self, Self::Pending)
    }
}

/// Accepts a device's status for run `run`: only a terminal status whose run and device match counts; a success
/// counts only once its first heartbeat after completion is recorded and precedes `expires_at`.
pub fn accept(
    status: &SystemUpgradeStatus,
    device: &DeviceId,
    run: &AttemptId,
    expires_at: Timestamp,
) -> Outcome {
    if &status.run_uid != run || &status.device_id != device {
        return Outcome::Pending;
    }
    match status.phase {
        SystemUpgradePhase::Failed => Outcome::Failed {
            at: status.completed_at.unwrap_or(status.accepted_at),
            error: format!(
                "{device}: {}{}",
                status
                    .reason
                    .and_then(|r| serde_json::to_value(r).ok())
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_else(|| "failed".into()),
                status
                    .error
                    .as_ref()
                    .map(|e| format!(": {e}"))
                    .unwrap_or_default()
            ),
        },
        SystemUpgradePhase::Succeeded => match status.first_heartbeat_after_completion {
            None => Outcome::Pending,
            Some(h) if h < expires_at => Outcome::Succeeded,
            Some(h) => Outcome::Failed {
                at: h,
                error: format!(
                    "{device}: succeeded, but its first heartbeat after completion ({h}) is not before the deadline ({expires_at})"
                ),
            },
        },
        _ => Outcome::Pending,
    }
}

/// What the operator knows about one planned device of the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceState {
    /// Its intent was written at some point (the key exists, or existed and was removed), or it reported a status
    /// for this run: never released again.
    pub released: bool,
    /// Its accepted result.
    pub outcome: Outcome,
}

/// Aggregates of the plan's devices.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Devices in the plan.
    pub targets: u32,
    /// Accepted successes.
    pub succeeded: u32,
    /// Accepted failures.
    pub failed: u32,
}

/// The run's next step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Write these devices' intents (each was re-checked as authorized just now).
    Release(Vec<DeviceId>),
    /// Nothing to do until a result arrives or the deadline passes.
    Wait,
    /// Authorization cannot be checked now (a group source error): release nothing, try again.
    Retry(String),
    /// The run ends.
    Finish {
        /// `Complete` or `Failed`.
        phase: TaskRunPhase,
        /// Why (`None` for Complete).
        reason: Option<TaskRunReason>,
        /// For the status's latest error.
        error: Option<String>,
    },
}

/// Why a planned device has no result yet, as the same step decided it (what its Device's `status.blocking` shows
/// for the run: [`super::blocking`]). A device with a success has none; a run that ends has none for any device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wait {
    /// Not a canary, not released: `waiting` of the `canaries` canaries have not succeeded yet.
    Canaries {
        /// Canaries without a success.
        waiting: u32,
        /// Canaries in the plan.
        canaries: u32,
    },
    /// Due for release and held: authorization cannot be re-checked (the message says why); retried each pass.
    Held(String),
    /// Its intent is written (this pass or before); no result yet.
    Given,
    /// Its result is a failure; the run goes on with the other devices.
    Failed {
        /// When it failed.
        at: Timestamp,
        /// Why.
        error: String,
    },
}

/// Each planned device without a success, and why ([`Wait`]), in plan order.
pub type Waits = Vec<(DeviceId, Wait)>;

fn fail(reason: TaskRunReason, error: String) -> Decision {
    Decision::Finish {
        phase: TaskRunPhase::Failed,
        reason: Some(reason),
        error: Some(error),
    }
}

/// Decides a running run's next step from its frozen plan, each device's state, the devices authorized now
/// (`Err`: unknown) and the time. Canaries are released first and must all succeed before the others are released;
/// a failed or timed-out canary ends the run with `CanaryFailed`; a planned device no longer authorized when it is
/// due for release ends it with `TargetRevoked` (no other device is substituted). Returns the counts, the
/// decision, the latest device error and why each device without a success waits ([`Wait`]: none once the run
/// ends).
pub fn step(
    plan: &TaskPlan,
    state: impl Fn(&DeviceId) -> DeviceState,
    authorized: &Result<BTreeSet<DeviceId>, String>,
    now: Timestamp,
) -> (Counts, Decision, Option<String>, Waits) {
    let mut counts = Counts {
        targets: (plan.canaries.len() + plan.others.len()) as u32,
        ..Default::default()
    };
    let mut latest: Option<(Timestamp, String)> = None;
    let mut canary_failed = None;
    let mut canaries_done = true;
    let mut unreleased_canaries = Vec::new();
    let mut unreleased_others = Vec::new();
    let mut all_terminal = true;
    // Devices without a success, for their waits.
    let mut open = Vec::new();
    for (i, d) in plan.targets().enumerate() {
        let canary = i < plan.canaries.len();
        let s = state(d);
        if s.outcome != Outcome::Succeeded {
            let failure = match &s.outcome {
                Outcome::Failed { at, error } => Some((*at, error.clone())),
                _ => None,
            };
            open.push(Open {
                device: d.clone(),
                canary,
                released: s.released,
                failure,
            });
        }
        match &s.outcome {
            Outcome::Succeeded => counts.succeeded += 1,
            Outcome::Failed { at, error } => {
                counts.failed += 1;
                if latest.as_ref().is_none_or(|(t, _)| at >= t) {
                    latest = Some((*at, error.clone()));
                }
                if canary && canary_failed.is_none() {
                    canary_failed = Some(error.clone());
                }
            }
            Outcome::Pending => all_terminal = false,
        }
        if canary && s.outcome != Outcome::Succeeded {
            canaries_done = false;
        }
        if !s.released && !s.outcome.is_terminal() {
            match canary {
                true => unreleased_canaries.push(d.clone()),
                false => unreleased_others.push(d.clone()),
            }
        }
    }
    let latest = latest.map(|l| l.1);
    let expired = now >= plan.expires_at;
    let decision = if let Some(e) = canary_failed {
        fail(
            TaskRunReason::CanaryFailed,
            format!("canary {e}; the other devices are not released"),
        )
    } else if !canaries_done {
        if expired {
            let missing = plan
                .canaries
                .iter()
                .find(|c| state(c).outcome != Outcome::Succeeded)
                .map(|c| c.to_string())
                .unwrap_or_default();
            fail(
                TaskRunReason::CanaryFailed,
                format!("canary {missing} did not succeed before the deadline ({}); the other devices are not released", plan.expires_at),
            )
        } else {
            release(unreleased_canaries, authorized)
        }
    } else if !unreleased_others.is_empty() && !expired {
        release(unreleased_others, authorized)
    } else if all_terminal {
        match counts.failed {
            0 => Decision::Finish {
                phase: TaskRunPhase::Complete,
                reason: None,
                error: None,
            },
            n => fail(
                TaskRunReason::TargetFailed,
                format!(
                    "{n} of {} devices failed; latest: {}",
                    counts.targets,
                    latest.clone().unwrap_or_default()
                ),
            ),
        }
    } else if expired {
        let pending = counts.targets - counts.succeeded - counts.failed;
        match counts.failed {
            0 => fail(
                TaskRunReason::DeadlineExceeded,
                format!(
                    "{pending} devices did not succeed before the deadline ({})",
                    plan.expires_at
                ),
            ),
            n => fail(
                TaskRunReason::TargetFailed,
                format!(
                    "{n} devices failed and {pending} did not finish before the deadline; latest: {}",
                    latest.clone().unwrap_or_default()
                ),
            ),
        }
    } else {
        Decision::Wait
    };
    let waits = waits(open, &decision, plan.canaries.len() as u32, canaries_done);
    (counts, decision, latest, waits)
}

/// A planned device without a success, as [`step`] saw it.
struct Open {
    device: DeviceId,
    canary: bool,
    released: bool,
    /// When and why it failed, if it did.
    failure: Option<(Timestamp, String)>,
}

/// Why each open device waits, from the step's `decision`.
fn waits(open: Vec<Open>, decision: &Decision, canaries: u32, canaries_done: bool) -> Waits {
    if matches!(decision, Decision::Finish { .. }) {
        return vec![];
    }
    let waiting = open.iter().filter(|o| o.canary).count() as u32;
    let due: BTreeSet<&DeviceId> = match decision {
        Decision::Release(v) => v.iter().collect(),
        _ => BTreeSet::new(),
    };
    open.into_iter()
        .map(|o| {
            let Open {
                device: d,
                canary,
                released,
                failure,
            } = o;
            let w = match (failure, released, decision) {
                (Some((at, error)), ..) => Wait::Failed { at, error },
                (None, true, _) => Wait::Given,
                (None, false, _) if due.contains(&d) => Wait::Given,
                // Others wait for the canaries whatever holds the canaries.
                (None, false, _) if !canary && !canaries_done => {
                    Wait::Canaries { waiting, canaries }
                }
                (None, false, Decision::Retry(why)) => Wait::Held(why.clone()),
                // Not reached: an unreleased device past the canaries is due, so released or held.
                (None, false, _) => Wait::Given,
            };
            (d, w)
        })
        .collect()
}

/// Releases `due` if every one of them is authorized now; otherwise the run fails with `TargetRevoked`.
fn release(due: Vec<DeviceId>, authorized: &Result<BTreeSet<DeviceId>, String>) -> Decision {
    if due.is_empty() {
        return Decision::Wait;
    }
    match authorized {
        Err(e) => Decision::Retry(format!(
            "cannot re-check group authorization before release: {e}"
        )),
        Ok(ok) => match due.iter().find(|d| !ok.contains(*d)) {
            Some(d) => fail(
                TaskRunReason::TargetRevoked,
                format!("device {d} is no longer a member of an allowed group; no other device is substituted"),
            ),
            None => Decision::Release(due),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_wire::{fixtures, BoundedText, SystemUpgradeReason, TaskOperation};
    use std::collections::BTreeMap;

    fn id(s: &str) -> DeviceId {
        DeviceId::try_from(s).expect("id")
    }
    fn run() -> AttemptId {
        AttemptId::try_from(fixtures::RUN).expect("run")
    }

    #[test]
    fn acceptance_table() {
        let dev = fixtures::device();
        let ok = fixtures::system_status(); // succeeded, heartbeat at t(470)
        let deadline = fixtures::t(1000);
        let with = |f: &dyn Fn(&mut SystemUpgradeStatus)| {
            let mut s = ok.clone();
            f(&mut s);
            s
        };
        let failed = with(&|s| {
            s.phase = SystemUpgradePhase::Failed;
            s.reason = Some(SystemUpgradeReason::AptFailed);
            s.error = Some(BoundedText::lossy("exit 100"));
            s.first_heartbeat_after_completion = None;
        });
        let cases: Vec<(SystemUpgradeStatus, Timestamp, &str)> = vec![
            (ok.clone(), deadline, "Succeeded"),
            // heartbeat not recorded yet: not counted
            (
                with(&|s| s.first_heartbeat_after_completion = None),
                deadline,
                "Pending",
            ),
            // heartbeat at or after the deadline: a late success is a failure
            (ok.clone(), fixtures::t(470), "Failed"),
            (ok.clone(), fixtures::t(400), "Failed"),
            // another run's or another device's status is not this device's result
            (
                with(&|s| s.run_uid = AttemptId::new_random()),
                deadline,
                "Pending",
            ),
            (with(&|s| s.device_id = id("other")), deadline, "Pending"),
            (
                with(&|s| s.phase = SystemUpgradePhase::Upgrading),
                deadline,
                "Pending",
            ),
            (
                with(&|s| s.phase = SystemUpgradePhase::Rebooting),
                deadline,
                "Pending",
            ),
            (failed.clone(), deadline, "Failed"),
            // a failure counts whenever it arrives
            (failed, fixtures::t(1), "Failed"),
        ];
        for (i, (s, exp, want)) in cases.into_iter().enumerate() {
            let got = match accept(&s, &dev, &run(), exp) {
                Outcome::Pending => "Pending",
                Outcome::Succeeded => "Succeeded",
                Outcome::Failed { error, .. } => {
                    assert!(error.starts_with("device-1: "), "case {i}: {error}");
                    "Failed"
                }
            };
            assert_eq!(got, want, "case {i}");
        }
    }

    type S = (bool, Outcome);
    const NEW: S = (false, Outcome::Pending);
    const OUT: S = (true, Outcome::Pending);
    const OK: S = (true, Outcome::Succeeded);
    fn bad(at: u64) -> S {
        (
            true,
            Outcome::Failed {
                at: fixtures::t(at),
                error: format!("boom {at}"),
            },
        )
    }

    /// Plan: canaries c1, c2; others o1, o2; expires at t(100).
    fn decide(
        canaries: &[&str],
        states: &[(&str, S)],
        auth: Result<&[&str], &str>,
        now: u64,
    ) -> (Counts, Decision) {
        let others: Vec<DeviceId> = ["o1", "o2"].iter().map(|s| id(s)).collect();
        let plan = TaskPlan::new(
            run(),
            TaskOperation::AptFullUpgradeV1,
            fixtures::t(100),
            canaries.iter().map(|s| id(s)).collect(),
            others,
            fixtures::t(0),
        )
        .expect("plan");
        let map: BTreeMap<DeviceId, S> = states.iter().map(|(d, s)| (id(d), s.clone())).collect();
        let auth = auth
            .map(|a| a.iter().map(|s| id(s)).collect())
            .map_err(str::to_owned);
        let (c, d, _, _) = step(
            &plan,
            |d| {
                let (released, outcome) = map.get(d).cloned().unwrap_or(NEW);
                DeviceState { released, outcome }
            },
            &auth,
            fixtures::t(now),
        );
        (c, d)
    }

    fn name(d: &Decision) -> String {
        match d {
            Decision::Release(v) => format!(
                "Release {}",
                v.iter().map(|d| d.as_str()).collect::<Vec<_>>().join(",")
            ),
            Decision::Wait => "Wait".into(),
            Decision::Retry(_) => "Retry".into(),
            Decision::Finish { phase, reason, .. } => format!("{phase:?} {reason:?}"),
        }
    }

    #[test]
    fn release_table() {
        let all: &[&str] = &["c1", "c2", "o1", "o2"];
        let cc: &[&str] = &["c1", "c2"];
        type Case<'a> = (
            &'a [&'a str],
            Vec<(&'a str, S)>,
            Result<&'a [&'a str], &'a str>,
            u64,
            &'a str,
        );
        let cases: Vec<Case> = vec![
            // canaries first, only them
            (cc, vec![], Ok(all), 1, "Release c1,c2"),
            (cc, vec![("c1", OUT), ("c2", OUT)], Ok(all), 1, "Wait"),
            // a released canary is never released again, even with its intent removed
            (cc, vec![("c1", OUT)], Ok(all), 1, "Release c2"),
            // one canary done, one running: the others wait
            (cc, vec![("c1", OK), ("c2", OUT)], Ok(all), 1, "Wait"),
            // every canary succeeded: the others follow
            (
                cc,
                vec![("c1", OK), ("c2", OK)],
                Ok(all),
                1,
                "Release o1,o2",
            ),
            // a failed canary stops the run at once
            (
                cc,
                vec![("c1", bad(5)), ("c2", OUT)],
                Ok(all),
                1,
                "Failed Some(CanaryFailed)",
            ),
            // a missing canary times out
            (
                cc,
                vec![("c1", OK), ("c2", OUT)],
                Ok(all),
                100,
                "Failed Some(CanaryFailed)",
            ),
            (cc, vec![], Ok(all), 100, "Failed Some(CanaryFailed)"),
            // no canary: the whole plan at once
            (&[], vec![], Ok(all), 1, "Release o1,o2"),
            // revoked before its release: the run fails, nothing substituted
            (
                cc,
                vec![("c1", OK), ("c2", OK)],
                Ok(&["c1", "c2", "o1"]),
                1,
                "Failed Some(TargetRevoked)",
            ),
            // revoked after its release: nothing to re-check
            (
                cc,
                vec![("c1", OK), ("c2", OK), ("o1", OUT), ("o2", OUT)],
                Ok(&["o1"]),
                1,
                "Wait",
            ),
            (
                cc,
                vec![("c1", OUT)],
                Ok(&["c1"]),
                1,
                "Failed Some(TargetRevoked)",
            ),
            // authorization unknown: retry, never a release
            (cc, vec![], Err("group broken"), 1, "Retry"),
            (
                cc,
                vec![("c1", OK), ("c2", OK), ("o1", OUT), ("o2", OUT)],
                Err("x"),
                1,
                "Wait",
            ),
            // results
            (
                &[],
                vec![("o1", OK), ("o2", OK)],
                Ok(all),
                1,
                "Complete None",
            ),
            (
                &[],
                vec![("o1", OK), ("o2", bad(3))],
                Ok(all),
                1,
                "Failed Some(TargetFailed)",
            ),
            (&[], vec![("o1", OK), ("o2", OUT)], Ok(all), 50, "Wait"),
            (
                &[],
                vec![("o1", OK), ("o2", OUT)],
                Ok(all),
                100,
                "Failed Some(DeadlineExceeded)",
            ),
            (
                &[],
                vec![("o1", bad(3)), ("o2", OUT)],
                Ok(all),
                100,
                "Failed Some(TargetFailed)",
            ),
            // after the deadline nothing more is released
            (
                &[],
                vec![("o1", OK)],
                Ok(all),
                100,
                "Failed Some(DeadlineExceeded)",
            ),
            // a device that reported without its intent being seen is not released again
            (
                &[],
                vec![("o1", (false, Outcome::Succeeded)), ("o2", OK)],
                Ok(all),
                1,
                "Complete None",
            ),
        ];
        for (i, (canaries, states, auth, now, want)) in cases.into_iter().enumerate() {
            let (_, d) = decide(canaries, &states, auth, now);
            assert_eq!(name(&d), want, "case {i}");
        }
        let (c, _) = decide(cc, &[("c1", OK), ("c2", bad(9)), ("o1", OUT)], Ok(all), 1);
        assert_eq!(
            c,
            Counts {
                targets: 4,
                succeeded: 1,
                failed: 1
            }
        );
    }

    #[test]
    fn latest_error_is_the_newest_failure() {
        let plan = fixtures::task_plan();
        let (_, d, latest, _) = step(
            &plan,
            |d| DeviceState {
                released: true,
                outcome: Outcome::Failed {
                    at: fixtures::t(if d.as_str() == "device-2" { 50 } else { 10 }),
                    error: d.to_string(),
                },
            },
            &Ok(BTreeSet::new()),
            fixtures::t(0),
        );
        assert_eq!(latest.as_deref(), Some("device-2"));
        assert!(matches!(
            d,
            Decision::Finish {
                reason: Some(TaskRunReason::CanaryFailed),
                ..
            }
        ));
    }
}
