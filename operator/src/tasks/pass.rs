//! One TaskRun's pass as pure decisions, the way the deployments controller's `plan` is its own: [`decide`] says
//! what a pass does with a run (nothing, remove its leftover intents, drop the finalizer, write a status, or
//! advance it), [`plan_step`] how an advancing run gets its frozen plan, and [`advance`] what a running run's KV
//! view calls for (its status, the intents to write and to remove). [`super::controller`] gathers the inputs and
//! carries the steps out: the only I/O. Table-tested without NATS or Kubernetes.
//!
//! **The finalizer.** A run gets [`FINALIZER`] before its plan is created (or, for a plan an older operator
//! created, before anything more is released), so that deleting it while no operator runs still cancels it: the
//! object stays, with a `deletionTimestamp`, until an operator has removed the intents no device has taken. A run
//! never planned (invalid spec, no targets) never gets one. A terminal run's finalizer goes once its intents are
//! removed. A deleted run whose intents cannot be removed keeps the finalizer and is tried again, until its deadline:
//! from then on no device starts an intent of it (the agent and the updater refuse an attempt past its
//! `expiresAt`), so the finalizer goes without NATS.

use super::planning::{PlanError, Targets};
use super::progress::{self, Decision, DeviceState};
use fleet_wire::kv as layout;
use fleet_wire::{
    AttemptId, BoundedText, DeviceId, TaskOperation, TaskPlan, TaskRunPhase, TaskRunReason,
    TaskRunStatus, Timestamp,
};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

/// The finalizer the operator puts on each TaskRun it plans: removed once the run's unreleased intents are.
pub const FINALIZER: &str = "fleet.nationtech.io/cancel-intents";
/// First retry of planning after a group source error; doubled per failure up to [`RETRY_MAX`].
pub const RETRY_MIN: Duration = Duration::from_secs(1);
/// Longest wait between planning retries.
pub const RETRY_MAX: Duration = Duration::from_secs(60);
/// How soon a pass comes back to a run whose intents are still to be removed.
pub const CLEANUP_RETRY: Duration = Duration::from_secs(1);

/// What one pass decided for one run's status.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// The run's next status.
    pub status: TaskRunStatus,
    /// Why the run is held (the `Ready` condition's message), when it is.
    pub problem: Option<String>,
    /// The phase change's event note.
    pub note: Option<String>,
}

fn failed(reason: TaskRunReason, error: String, now: Timestamp) -> TaskRunStatus {
    TaskRunStatus {
        phase: Some(TaskRunPhase::Failed),
        completion_time: Some(now),
        reason: Some(reason),
        latest_error: Some(BoundedText::lossy(error)),
        ..Default::default()
    }
}

/// What the controller knows about a run when its pass starts.
#[derive(Debug, Clone)]
pub struct Facts<'a> {
    /// The run's phase: the one this process last wrote when terminal (the cache may lag), else its status's.
    pub phase: TaskRunPhase,
    /// Its status as cached.
    pub old: &'a TaskRunStatus,
    /// It has a `deletionTimestamp`.
    pub deleting: bool,
    /// It carries [`FINALIZER`].
    pub finalizer: bool,
    /// Why its spec may not be acted on ([`super::status::spec_check`]), if so.
    pub spec_problem: Option<String>,
    /// The NATS link is up.
    pub nats: bool,
    /// This process removed every intent the run had.
    pub cleaned: bool,
    /// A terminal run may look for its leftover intents now (fewer than `CLEANUPS_AT_ONCE` do, or its view is open).
    pub cleanup_slot: bool,
    /// Its deadline (creation + `deadlineSeconds`): the plan's `expiresAt`.
    pub expires: Timestamp,
    /// The intent bucket's age limit: a run that ended longer ago has no intent left.
    pub intent_age: Duration,
    /// Now.
    pub now: Timestamp,
}

/// What happens to the finalizer after a clean-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finalizer {
    /// The run has none.
    Absent,
    /// Removed once every intent is.
    RemoveWhenClean,
    /// Removed whatever the clean-up did (the run's deadline passed: no device starts its intents).
    Remove,
}

/// What a pass does with a run.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Nothing until the run changes.
    Idle,
    /// Remove [`FINALIZER`]: nothing of the run is left to remove.
    RemoveFinalizer,
    /// Remove every intent the run still has (a device whose updater already accepted its attempt finishes it; one
    /// that has not never starts it), then see to the finalizer; come back soon until that is done.
    CleanUp(Finalizer),
    /// Nothing now; look again at this time.
    Wait(Timestamp),
    /// Write this status and nothing else.
    Status(Report),
    /// Plan the run ([`plan_step`]) and advance it ([`advance`]).
    Advance,
}

/// A run's step in this pass. A deleted run is cancelled (its intents removed, nothing more released, no status
/// written); a terminal run only has its leftover intents removed; a run whose spec cannot be acted on, or with no
/// NATS, keeps its phase; any other advances.
pub fn decide(f: &Facts) -> Step {
    let terminal = f.phase.is_terminal();
    let ended = f.old.completion_time.unwrap_or(f.now);
    // Intents live at most as long as the bucket's age limit, so a run that ended before that has none left.
    let stale = terminal && f.now.since(ended) > f.intent_age;
    let finalizer_after = |f: &Facts| match f.finalizer {
        false => Step::Idle,
        true => Step::RemoveFinalizer,
    };
    if f.deleting {
        if f.cleaned || stale {
            return finalizer_after(f);
        }
        let past_deadline = f.now >= f.expires;
        if !f.nats {
            // Keep the finalizer until the intents can be removed; past the deadline no device starts them.
            return match past_deadline {
                true => finalizer_after(f),
                false => Step::Idle,
            };
        }
        return Step::CleanUp(match (f.finalizer, past_deadline) {
            (false, _) => Finalizer::Absent,
            (true, false) => Finalizer::RemoveWhenClean,
            (true, true) => Finalizer::Remove,
        });
    }
    if terminal {
        if stale || f.cleaned {
            return finalizer_after(f);
        }
        if !f.nats || !f.cleanup_slot {
            return Step::Wait(f.now.plus(CLEANUP_RETRY));
        }
        return Step::CleanUp(match f.finalizer {
            false => Finalizer::Absent,
            true => Finalizer::RemoveWhenClean,
        });
    }
    // Fail closed without the webhook: unknown fields, or a spec that is not the one frozen, stop the run where it
    // is (nothing planned, nothing released) until the spec is fixed.
    if let Some(problem) = &f.spec_problem {
        return Step::Status(Report {
            status: TaskRunStatus {
                phase: Some(f.phase),
                reason: Some(TaskRunReason::InvalidSpec),
                latest_error: Some(BoundedText::lossy(problem.clone())),
                ..f.old.clone()
            },
            problem: Some(problem.clone()),
            note: None,
        });
    }
    if !f.nats {
        return Step::Status(Report {
            status: TaskRunStatus {
                phase: Some(f.phase),
                ..f.old.clone()
            },
            problem: None,
            note: None,
        });
    }
    Step::Advance
}

/// What [`plan_step`] decides from.
#[derive(Debug, Clone)]
pub struct PlanFacts<'a> {
    /// The run's UID: the attempt id.
    pub uid: AttemptId,
    /// Its status as cached.
    pub old: &'a TaskRunStatus,
    /// Its plan as this process holds it or `task-plans` has it (`Err`: it could not be read).
    pub loaded: Result<Option<Arc<TaskPlan>>, String>,
    /// The device-info mirror has read every key (capabilities are known).
    pub info_synced: bool,
    /// Planning failures after group source errors so far, and when to try again.
    pub retry: Option<(u32, Timestamp)>,
    /// It carries [`FINALIZER`].
    pub finalizer: bool,
    /// Its deadline.
    pub expires: Timestamp,
    /// Now.
    pub now: Timestamp,
}

/// How an advancing run gets its plan.
#[derive(Debug, Clone, PartialEq)]
pub enum PlanStep {
    /// The plan exists: advance with it.
    Use(Arc<TaskPlan>),
    /// Add [`FINALIZER`] first (nothing more this pass: the write changes the object, the next pass plans).
    AddFinalizer,
    /// Store this plan (KV create: another replica's plan, when it was first, is the one used).
    Create(TaskPlan),
    /// A group source failed: record the failure and plan again at `at`.
    Retry {
        /// Failures so far, this one included.
        failures: u32,
        /// When to plan again.
        at: Timestamp,
        /// The status to write meanwhile.
        report: Report,
    },
    /// Write this status instead (still planning, or failed).
    Report(Report),
}

/// A `Planning` status: `problem` holds the run back (a group source error), `err` is a passing error.
pub fn planning(problem: Option<String>, err: Option<String>) -> Report {
    Report {
        status: TaskRunStatus {
            phase: Some(TaskRunPhase::Planning),
            reason: problem.as_ref().map(|_| TaskRunReason::GroupSourceError),
            latest_error: err.or(problem.clone()).map(BoundedText::lossy),
            ..Default::default()
        },
        problem,
        note: None,
    }
}

/// The run's plan step. A run that entered Running has a plan: it is never planned a second time, and never goes
/// back to Planning. A new plan is made from `targets` (called only when the run is due to be planned) and only
/// once the run carries [`FINALIZER`], as is a stored plan used.
pub fn plan_step(f: PlanFacts, targets: impl FnOnce() -> Result<Targets, PlanError>) -> PlanStep {
    let fail = |reason, error: String| {
        PlanStep::Report(Report {
            status: failed(reason, error, f.now),
            problem: None,
            note: None,
        })
    };
    let use_plan = |p: Arc<TaskPlan>| match f.finalizer {
        true => PlanStep::Use(p),
        false => PlanStep::AddFinalizer,
    };
    if f.old.phase == Some(TaskRunPhase::Running) {
        let error = match f.loaded {
            Ok(Some(p)) => return use_plan(p),
            Ok(None) => format!(
                "the plan of run {} is missing from {}",
                f.uid,
                layout::TASK_PLANS
            ),
            Err(e) => e,
        };
        if f.now >= f.expires {
            return fail(TaskRunReason::DeadlineExceeded, error);
        }
        return PlanStep::Report(Report {
            status: TaskRunStatus {
                latest_error: Some(BoundedText::lossy(error)),
                ..f.old.clone()
            },
            problem: None,
            note: None,
        });
    }
    match f.loaded {
        Ok(Some(p)) => return use_plan(p),
        Ok(None) => {}
        Err(e) => return PlanStep::Report(planning(None, Some(e))),
    }
    if !f.info_synced {
        return PlanStep::Report(planning(None, None));
    }
    if let Some((_, at)) = f.retry {
        if f.now < at {
            let last = f.old.latest_error.clone();
            return PlanStep::Report(planning(
                Some(last.map(String::from).unwrap_or_default()),
                None,
            ));
        }
    }
    if f.now >= f.expires {
        let last = f.old.latest_error.clone();
        return fail(
            TaskRunReason::DeadlineExceeded,
            format!(
                "planning did not finish before the deadline ({}){}",
                f.expires,
                last.map(|e| format!("; latest error: {e}"))
                    .unwrap_or_default()
            ),
        );
    }
    let targets = match targets() {
        Ok(t) => t,
        Err(PlanError::InvalidSpec(m)) => return fail(TaskRunReason::InvalidSpec, m),
        Err(e @ PlanError::NoTargets { .. }) => {
            return fail(TaskRunReason::NoTargets, e.to_string())
        }
        Err(PlanError::GroupSource(m)) => {
            let n = f.retry.map_or(0, |r| r.0);
            let delay = RETRY_MIN.saturating_mul(1 << n.min(6)).min(RETRY_MAX);
            return PlanStep::Retry {
                failures: n + 1,
                at: f.now.plus(delay),
                report: planning(
                    Some(format!("{m}; planning is retried (attempt {})", n + 1)),
                    None,
                ),
            };
        }
    };
    let plan = match TaskPlan::new(
        f.uid,
        TaskOperation::AptFullUpgradeV1,
        f.expires,
        targets.canaries,
        targets.others,
        f.now,
    ) {
        Ok(p) => p,
        Err(e) => return fail(TaskRunReason::InvalidSpec, e.to_string()),
    };
    match f.finalizer {
        true => PlanStep::Create(plan),
        false => PlanStep::AddFinalizer,
    }
}

/// What a running run's synced view calls for.
#[derive(Debug, Clone, PartialEq)]
pub struct Advance {
    /// Its status (a write error is added by the controller).
    pub report: Report,
    /// Devices whose intents to write.
    pub release: Vec<DeviceId>,
    /// Intent keys to remove: those of devices with a result (their statuses stay).
    pub remove: Vec<String>,
    /// Why each device without a success waits, as this step decided ([`progress::Wait`]).
    pub waits: progress::Waits,
}

/// The status of a running run whose view is not read yet: the counts already reported stand.
pub fn unsynced(plan: &TaskPlan, reported: Option<&TaskRunStatus>) -> Report {
    let Advance { report, .. } = start(plan);
    Report {
        status: reported
            .filter(|s| s.phase == Some(TaskRunPhase::Running))
            .cloned()
            .unwrap_or(report.status),
        ..report
    }
}

fn start(plan: &TaskPlan) -> Advance {
    let targets = (plan.canaries.len() + plan.others.len()) as u32;
    Advance {
        report: Report {
            status: TaskRunStatus {
                phase: Some(TaskRunPhase::Running),
                targets,
                start_time: Some(plan.created_at),
                ..Default::default()
            },
            problem: None,
            note: Some(format!(
                "plan frozen: {targets} devices, {} canaries",
                plan.canaries.len()
            )),
        },
        release: vec![],
        remove: vec![],
        waits: vec![],
    }
}

/// A running run's step from its frozen plan, each device's state ([`progress::step`]), the devices authorized now,
/// the run's intent keys still in KV and the time.
pub fn advance(
    plan: &TaskPlan,
    state: impl Fn(&DeviceId) -> DeviceState,
    authorized: &Result<BTreeSet<DeviceId>, String>,
    live_intents: Vec<String>,
    now: Timestamp,
) -> Advance {
    let mut a = start(plan);
    let (counts, decision, latest, waits) = progress::step(plan, &state, authorized, now);
    a.waits = waits;
    // Terminal devices' intents are removed; their statuses stay.
    a.remove = live_intents
        .into_iter()
        .filter(|k| {
            layout::parse_run_key(k)
                .ok()
                .is_some_and(|(d, _)| state(&d).outcome.is_terminal())
        })
        .collect();
    let status = &mut a.report.status;
    status.succeeded = counts.succeeded;
    status.failed = counts.failed;
    status.latest_error = latest.map(BoundedText::lossy);
    match decision {
        Decision::Wait => {}
        Decision::Retry(m) => a.report.problem = Some(m),
        Decision::Finish {
            phase,
            reason,
            error,
        } => {
            status.phase = Some(phase);
            status.reason = reason;
            status.completion_time = Some(now);
            if let Some(e) = error {
                status.latest_error = Some(BoundedText::lossy(e));
            }
        }
        Decision::Release(devices) => a.release = devices,
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tasks::progress::Outcome;
    use fleet_wire::fixtures;
    use std::cell::Cell;

    fn id(s: &str) -> DeviceId {
        DeviceId::try_from(s).expect("id")
    }
    fn run() -> AttemptId {
        AttemptId::try_from(fixtures::RUN).expect("run")
    }
    /// Seconds after [`fixtures::t`]'s origin.
    fn t(s: u64) -> Timestamp {
        fixtures::t(s)
    }
    const DAY: u64 = 24 * 3600;

    fn status(phase: TaskRunPhase) -> TaskRunStatus {
        TaskRunStatus {
            phase: Some(phase),
            completion_time: phase.is_terminal().then(|| t(100)),
            ..Default::default()
        }
    }

    fn report(r: &Report) -> String {
        let s = &r.status;
        let mut out = format!("{:?}", s.phase.unwrap_or(TaskRunPhase::Planning));
        if let Some(reason) = s.reason {
            out += &format!(" {reason:?}");
        }
        if let Some(e) = &s.latest_error {
            out += &format!(" error={e}");
        }
        if let Some(p) = &r.problem {
            out += &format!(" problem={p}");
        }
        out
    }

    fn step(s: &Step) -> String {
        match s {
            Step::Idle => "Idle".into(),
            Step::RemoveFinalizer => "RemoveFinalizer".into(),
            Step::CleanUp(f) => format!("CleanUp({f:?})"),
            Step::Wait(at) => format!("Wait({at})"),
            Step::Status(r) => format!("Status({})", report(r)),
            Step::Advance => "Advance".into(),
        }
    }

    /// Every kind of run a pass meets, deleted or not, with and without NATS and the finalizer.
    #[test]
    fn decide_table() {
        let running = status(TaskRunPhase::Running);
        let complete = status(TaskRunPhase::Complete);
        let planning = TaskRunStatus::default();
        let base = |old| Facts {
            phase: old_phase(old),
            old,
            deleting: false,
            finalizer: true,
            spec_problem: None,
            nats: true,
            cleaned: false,
            cleanup_slot: true,
            expires: t(1000),
            intent_age: Duration::from_secs(30 * DAY),
            now: t(500),
        };
        fn old_phase(s: &TaskRunStatus) -> TaskRunPhase {
            s.phase.unwrap_or(TaskRunPhase::Planning)
        }
        type Case<'a> = (&'static str, Facts<'a>, String);
        let with = |old, f: &dyn Fn(&mut Facts)| {
            let mut x = base(old);
            f(&mut x);
            x
        };
        let cases: Vec<Case> = vec![
            ("a new run advances (plans)", with(&planning, &|f| f.finalizer = false), "Advance".into()),
            ("a running run advances", base(&running), "Advance".into()),
            (
                "no NATS: the phase stands, nothing else",
                with(&running, &|f| f.nats = false),
                "Status(Running)".into(),
            ),
            (
                "a spec it may not act on holds the run where it is",
                with(&running, &|f| f.spec_problem = Some("spec changed".into())),
                "Status(Running InvalidSpec error=spec changed problem=spec changed)".into(),
            ),
            (
                "terminal with intents left: removed, then the finalizer",
                base(&complete),
                "CleanUp(RemoveWhenClean)".into(),
            ),
            (
                "terminal, of an older operator (no finalizer): intents removed",
                with(&complete, &|f| f.finalizer = false),
                "CleanUp(Absent)".into(),
            ),
            (
                "terminal, too many clean-ups under way: later",
                with(&complete, &|f| f.cleanup_slot = false),
                format!("Wait({})", t(501)),
            ),
            (
                "terminal, no NATS: later",
                with(&complete, &|f| f.nats = false),
                format!("Wait({})", t(501)),
            ),
            (
                "terminal and clean: the finalizer goes",
                with(&complete, &|f| f.cleaned = true),
                "RemoveFinalizer".into(),
            ),
            (
                "terminal and clean, no finalizer: nothing",
                with(&complete, &|f| {
                    f.cleaned = true;
                    f.finalizer = false
                }),
                "Idle".into(),
            ),
            (
                "terminal longer than intents live: nothing left, the finalizer goes",
                with(&complete, &|f| f.now = t(100 + 31 * DAY)),
                "RemoveFinalizer".into(),
            ),
            (
                "deleted while running: cancelled, the finalizer kept until the intents are gone",
                with(&running, &|f| f.deleting = true),
                "CleanUp(RemoveWhenClean)".into(),
            ),
            (
                "deleted, a spec problem does not hold the cancel",
                with(&running, &|f| {
                    f.deleting = true;
                    f.spec_problem = Some("spec changed".into())
                }),
                "CleanUp(RemoveWhenClean)".into(),
            ),
            (
                "deleted and clean: the finalizer goes",
                with(&running, &|f| {
                    f.deleting = true;
                    f.cleaned = true
                }),
                "RemoveFinalizer".into(),
            ),
            (
                "deleted, no NATS, before the deadline: the finalizer holds the object",
                with(&running, &|f| {
                    f.deleting = true;
                    f.nats = false
                }),
                "Idle".into(),
            ),
            (
                "deleted, no NATS, past the deadline: no device starts its intents, the finalizer goes",
                with(&running, &|f| {
                    f.deleting = true;
                    f.nats = false;
                    f.now = t(1000)
                }),
                "RemoveFinalizer".into(),
            ),
            (
                "deleted past the deadline with NATS: intents removed, the finalizer goes whatever that did",
                with(&running, &|f| {
                    f.deleting = true;
                    f.now = t(2000)
                }),
                "CleanUp(Remove)".into(),
            ),
            (
                "deleted, never planned (no finalizer): intents looked for, nothing to hold",
                with(&planning, &|f| {
                    f.deleting = true;
                    f.finalizer = false
                }),
                "CleanUp(Absent)".into(),
            ),
            (
                "deleted, never planned, no NATS: nothing",
                with(&planning, &|f| {
                    f.deleting = true;
                    f.finalizer = false;
                    f.nats = false
                }),
                "Idle".into(),
            ),
            (
                "deleted terminal run long ended: the finalizer goes",
                with(&complete, &|f| {
                    f.deleting = true;
                    f.nats = false;
                    f.expires = t(100 + 40 * DAY);
                    f.now = t(100 + 31 * DAY)
                }),
                "RemoveFinalizer".into(),
            ),
        ];
        let mut wrong = vec![];
        for (name, facts, want) in &cases {
            let got = step(&decide(facts));
            if &got != want {
                wrong.push(format!("{name}: got {got}, want {want}"));
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    fn plan(canaries: &[&str], others: &[&str]) -> TaskPlan {
        TaskPlan::new(
            run(),
            TaskOperation::AptFullUpgradeV1,
            t(1000),
            canaries.iter().map(|d| id(d)).collect(),
            others.iter().map(|d| id(d)).collect(),
            t(500),
        )
        .expect("plan")
    }

    fn plan_summary(s: &PlanStep) -> String {
        let names = |v: &[DeviceId]| v.iter().map(|d| d.as_str().to_owned()).collect::<Vec<_>>();
        let devices = |p: &TaskPlan| {
            format!(
                "canaries {:?} others {:?}",
                names(&p.canaries),
                names(&p.others)
            )
        };
        match s {
            PlanStep::Use(p) => format!("Use({})", devices(p)),
            PlanStep::AddFinalizer => "AddFinalizer".into(),
            PlanStep::Create(p) => format!("Create({})", devices(p)),
            PlanStep::Retry {
                failures,
                at,
                report: r,
            } => format!("Retry({failures} at {at}: {})", report(r)),
            PlanStep::Report(r) => format!("Report({})", report(r)),
        }
    }

    /// How a run gets its plan: held or stored, made once with the finalizer on, or a status instead; `targets` is
    /// consulted only when a plan is to be made.
    #[test]
    fn plan_step_table() {
        let running = status(TaskRunPhase::Running);
        let planning_st = TaskRunStatus::default();
        let stored = Arc::new(plan(&["c1"], &["o1"]));
        let held = TaskRunStatus {
            latest_error: Some(BoundedText::lossy("group prod: source down")),
            ..Default::default()
        };
        let base = |old| PlanFacts {
            uid: run(),
            old,
            loaded: Ok(None),
            info_synced: true,
            retry: None,
            finalizer: true,
            expires: t(1000),
            now: t(500),
        };
        let ok = || {
            Ok(Targets {
                canaries: vec![id("c1")],
                others: vec![id("o1"), id("o2")],
            })
        };
        type Targeted = fn() -> Result<Targets, PlanError>;
        let group_down: Targeted = || Err(PlanError::GroupSource("group prod: source down".into()));
        let none: Targeted = || {
            Err(PlanError::NoTargets {
                groups: vec!["prod".into()],
            })
        };
        let invalid: Targeted = || {
            Err(PlanError::InvalidSpec(
                "spec.deadlineSeconds: must be 1 to 2592000, not 0".into(),
            ))
        };
        let with = |old, f: &dyn Fn(&mut PlanFacts)| {
            let mut x = base(old);
            f(&mut x);
            x
        };
        let loaded = |f: &mut PlanFacts| f.loaded = Ok(Some(stored.clone()));
        let missing = format!("the plan of run {} is missing from task-plans", run());
        // (case, facts, targets, want, targets consulted)
        let cases: Vec<(&str, PlanFacts, Targeted, String, bool)> = vec![
            (
                "running: its stored plan is used",
                with(&running, &loaded),
                ok,
                "Use(canaries [\"c1\"] others [\"o1\"])".into(),
                false,
            ),
            (
                "running, planned by an operator without finalizers: the finalizer first",
                with(&running, &|f| {
                    loaded(f);
                    f.finalizer = false
                }),
                ok,
                "AddFinalizer".into(),
                false,
            ),
            (
                "running, plan missing: never planned again, the error shown",
                base(&running),
                ok,
                format!("Report(Running error={missing})"),
                false,
            ),
            (
                "running, plan unreadable past the deadline: failed",
                with(&running, &|f| {
                    f.loaded = Err("task-plans: timed out".into());
                    f.now = t(1000)
                }),
                ok,
                "Report(Failed DeadlineExceeded error=task-plans: timed out)".into(),
                false,
            ),
            (
                "planning, another replica stored the plan: used",
                with(&planning_st, &loaded),
                ok,
                "Use(canaries [\"c1\"] others [\"o1\"])".into(),
                false,
            ),
            (
                "planning, the plan bucket unreadable: still planning",
                with(&planning_st, &|f| f.loaded = Err("task-plans: timed out".into())),
                ok,
                "Report(Planning error=task-plans: timed out)".into(),
                false,
            ),
            (
                "device info not read yet: still planning",
                with(&planning_st, &|f| f.info_synced = false),
                ok,
                "Report(Planning)".into(),
                false,
            ),
            (
                "a retry not due yet: held with the last error",
                with(&held, &|f| f.retry = Some((2, t(501)))),
                ok,
                "Report(Planning GroupSourceError error=group prod: source down problem=group prod: source down)"
                    .into(),
                false,
            ),
            (
                "planning past the deadline: failed",
                with(&held, &|f| f.now = t(1000)),
                ok,
                format!(
                    "Report(Failed DeadlineExceeded error=planning did not finish before the deadline ({}); \
                     latest error: group prod: source down)",
                    t(1000)
                ),
                false,
            ),
            (
                "no target: failed, never planned (no finalizer)",
                with(&planning_st, &|f| f.finalizer = false),
                none,
                "Report(Failed NoTargets error=no device in [\"prod\"] matches targetSelector and advertises \
                 AptFullUpgradeV1)"
                    .into(),
                true,
            ),
            (
                "an invalid spec: failed, never planned",
                with(&planning_st, &|f| f.finalizer = false),
                invalid,
                "Report(Failed InvalidSpec error=spec.deadlineSeconds: must be 1 to 2592000, not 0)".into(),
                true,
            ),
            (
                "a group source error: retried in 1 s",
                base(&planning_st),
                group_down,
                format!(
                    "Retry(1 at {}: Planning GroupSourceError error=group prod: source down; planning is retried \
                     (attempt 1) problem=group prod: source down; planning is retried (attempt 1))",
                    t(501)
                ),
                true,
            ),
            (
                "a fourth group source error: retried in 8 s",
                with(&planning_st, &|f| f.retry = Some((3, t(500)))),
                group_down,
                format!(
                    "Retry(4 at {}: Planning GroupSourceError error=group prod: source down; planning is retried \
                     (attempt 4) problem=group prod: source down; planning is retried (attempt 4))",
                    t(508)
                ),
                true,
            ),
            (
                "targets found, no finalizer yet: the finalizer before the plan",
                with(&planning_st, &|f| f.finalizer = false),
                ok,
                "AddFinalizer".into(),
                true,
            ),
            (
                "targets found with the finalizer on: the plan is created",
                base(&planning_st),
                ok,
                "Create(canaries [\"c1\"] others [\"o1\", \"o2\"])".into(),
                true,
            ),
        ];
        let mut wrong = vec![];
        for (name, facts, targets, want, consulted) in cases {
            let called = Cell::new(false);
            let got = plan_summary(&plan_step(facts, || {
                called.set(true);
                targets()
            }));
            if got != want || called.get() != consulted {
                wrong.push(format!(
                    "{name}: got {got} (targets consulted: {}), want {want} ({consulted})",
                    called.get()
                ));
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    /// What a running run's view calls for: releases, removals of finished devices' intents, the status.
    #[test]
    fn advance_table() {
        let p = plan(&["c1"], &["o1", "o2"]);
        let key = |d: &str| layout::run_key(&id(d), &run());
        let all: Result<BTreeSet<DeviceId>, String> =
            Ok(["c1", "o1", "o2"].into_iter().map(id).collect());
        let released = |done: &'static [&'static str], out: Outcome| {
            move |d: &DeviceId| DeviceState {
                released: done.contains(&d.as_str()),
                outcome: match done.contains(&d.as_str()) {
                    true => out.clone(),
                    false => Outcome::Pending,
                },
            }
        };
        let summary = |a: Advance| {
            format!(
                "{} {}/{}/{} release {:?} remove {:?}",
                report(&a.report),
                a.report.status.targets,
                a.report.status.succeeded,
                a.report.status.failed,
                a.release.iter().map(|d| d.as_str()).collect::<Vec<_>>(),
                a.remove
            )
        };
        let fail = Outcome::Failed {
            at: t(600),
            error: "apt-get full-upgrade exited with 100".into(),
        };
        let cases: Vec<(&str, String, String)> = vec![
            (
                "nothing released: the canary alone",
                summary(advance(&p, released(&[], Outcome::Pending), &all, vec![], t(500))),
                "Running 3/0/0 release [\"c1\"] remove []".into(),
            ),
            (
                "the canary succeeded: its intent removed, the others released",
                summary(advance(
                    &p,
                    released(&["c1"], Outcome::Succeeded),
                    &all,
                    vec![key("c1")],
                    t(600),
                )),
                "Running 3/1/0 release [\"o1\", \"o2\"] remove [\"c1.0d9f5a62-3b1e-4f7a-8c2d-5e6f7a8b9c0d\"]"
                    .into(),
            ),
            (
                "the canary failed: the run fails, nothing more released",
                summary(advance(&p, released(&["c1"], fail), &all, vec![key("c1")], t(700))),
                "Failed CanaryFailed error=canary apt-get full-upgrade exited with 100; the other devices are not \
                 released 3/0/1 release [] \
                 remove [\"c1.0d9f5a62-3b1e-4f7a-8c2d-5e6f7a8b9c0d\"]"
                    .into(),
            ),
            (
                "all succeeded: complete",
                summary(advance(
                    &p,
                    released(&["c1", "o1", "o2"], Outcome::Succeeded),
                    &all,
                    vec![],
                    t(700),
                )),
                "Complete 3/3/0 release [] remove []".into(),
            ),
            (
                "authorization unknown: nothing released, the run held",
                summary(advance(
                    &p,
                    released(&[], Outcome::Pending),
                    &Err("group prod: source down".into()),
                    vec![],
                    t(500),
                )),
                "Running problem=cannot re-check group authorization before release: group prod: source down \
                 3/0/0 release [] remove []"
                    .into(),
            ),
        ];
        let mut wrong = vec![];
        for (name, got, want) in cases {
            if got != want {
                wrong.push(format!("{name}: got {got}\n   want {want}"));
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    /// A view not read yet keeps the counts a Running status already shows.
    #[test]
    fn an_unread_view_keeps_the_reported_counts() {
        let p = plan(&["c1"], &["o1"]);
        let shown = TaskRunStatus {
            targets: 2,
            succeeded: 1,
            ..status(TaskRunPhase::Running)
        };
        assert_eq!(unsynced(&p, Some(&shown)).status, shown);
        let fresh = TaskRunStatus {
            phase: Some(TaskRunPhase::Running),
            targets: 2,
            start_time: Some(t(500)),
            ..Default::default()
        };
        assert_eq!(unsynced(&p, None).status, fresh);
        assert_eq!(unsynced(&p, Some(&TaskRunStatus::default())).status, fresh);
    }
}
