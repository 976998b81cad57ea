//! Task runs in the cluster (`fleet-tasks.md`): the `TaskRun` status a person reads with `kubectl`, and the frozen
//! target plan the operator creates atomically in `task-plans/<run-uid>` before the run enters `Running`.
//!
//! The CR status holds only bounded aggregates; the per-device target set lives in the plan, outside the CR.

use crate::{AttemptId, BoundedText, DeviceId, TaskOperation, Timestamp, ValidationError};
use serde::{Deserialize, Serialize};

/// Most devices one frozen plan may hold (keeps the plan inside one 1 MiB KV value).
pub const MAX_PLAN_TARGETS: usize = 10_000;

/// The one phase of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TaskRunPhase {
    /// Freezing the matching devices into a plan.
    Planning,
    /// Intents released (canaries first); waiting for terminal device results.
    Running,
    /// Every target succeeded.
    Complete,
    /// Stopped: see reason. A terminal run never advances.
    Failed,
}

impl TaskRunPhase {
    /// True when the run never changes again.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Complete | Self::Failed)
    }

    /// Legal phase changes: Planning → Running | Failed; Running → Complete | Failed.
    pub fn can_move_to(self, next: TaskRunPhase) -> bool {
        use TaskRunPhase::*;
        matches!(
            (self, next),
            (Planning, Running | Failed) | (Running, Complete | Failed)
        )
    }
}

/// Why a run is where it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TaskRunReason {
    /// No authorized device supporting the operation matched.
    NoTargets,
    /// A planned device lost group authorization before its intent was released.
    TargetRevoked,
    /// A canary failed, went missing or timed out: the rest were not released.
    CanaryFailed,
    /// A device reported failure.
    TargetFailed,
    /// The deadline passed before every target succeeded.
    DeadlineExceeded,
    /// A group source failed; planning is retried (never turned into `NoTargets`).
    GroupSourceError,
    /// The spec is invalid (for example `matchExpressions`, which fails closed until implemented).
    InvalidSpec,
}

/// The `TaskRun` status: aggregates only, never a per-device map.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct TaskRunStatus {
    /// Current phase (absent until the operator first sees the run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<TaskRunPhase>,
    /// Devices in the frozen plan.
    #[serde(default)]
    pub targets: u32,
    /// Devices that succeeded.
    #[serde(default)]
    pub succeeded: u32,
    /// Devices that failed.
    #[serde(default)]
    pub failed: u32,
    /// When the run entered Running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Timestamp>,
    /// When it became terminal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Timestamp>,
    /// Why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<TaskRunReason>,
    /// The latest error, bounded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latest_error: Option<BoundedText>,
}

/// The frozen target plan of one run. Created once (KV create, never updated), so concurrent operator instances
/// load the same plan; canary membership is frozen with it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(
    rename_all = "camelCase",
    deny_unknown_fields,
    try_from = "RawTaskPlan"
)]
pub struct TaskPlan {
    /// The run's UID (also every device attempt's id).
    pub run_uid: AttemptId,
    /// What every target runs.
    pub operation: TaskOperation,
    /// Copied into every attempt as `expiresAt`.
    pub expires_at: Timestamp,
    /// Devices labelled `canary=true` at planning time: released first, all must succeed.
    pub canaries: Vec<DeviceId>,
    /// The remaining devices, released after every canary succeeded.
    pub others: Vec<DeviceId>,
    /// When the plan was frozen.
    pub created_at: Timestamp,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawTaskPlan {
    run_uid: AttemptId,
    operation: TaskOperation,
    expires_at: Timestamp,
    canaries: Vec<DeviceId>,
    others: Vec<DeviceId>,
    created_at: Timestamp,
}

impl TryFrom<RawTaskPlan> for TaskPlan {
    type Error = ValidationError;
    fn try_from(r: RawTaskPlan) -> Result<Self, ValidationError> {
        TaskPlan::new(
            r.run_uid,
            r.operation,
            r.expires_at,
            r.canaries,
            r.others,
            r.created_at,
        )
    }
}

impl TaskPlan {
    /// Builds a plan: non-empty, bounded, and no device in it twice.
    pub fn new(
        run_uid: AttemptId,
        operation: TaskOperation,
        expires_at: Timestamp,
        canaries: Vec<DeviceId>,
        others: Vec<DeviceId>,
        created_at: Timestamp,
    ) -> Result<Self, ValidationError> {
        let total = canaries.len() + others.len();
        if total == 0 {
            return Err(ValidationError::new(
                "task plan",
                "has no targets (the run fails with NoTargets instead)",
            ));
        }
        if total > MAX_PLAN_TARGETS {
            return Err(ValidationError::new(
                "task plan",
                format!("more than {MAX_PLAN_TARGETS} targets"),
            ));
        }
        let mut all: Vec<&DeviceId> = canaries.iter().chain(others.iter()).collect();
        all.sort_unstable();
        if let Some(w) = all.windows(2).find(|w| w[0] == w[1]) {
            return Err(ValidationError::new(
                "task plan",
                format!("device {} appears twice", w[0]),
            ));
        }
        Ok(Self {
            run_uid,
            operation,
            expires_at,
            canaries,
            others,
            created_at,
        })
    }

    /// Every target, canaries first.
    pub fn targets(&self) -> impl Iterator<Item = &DeviceId> {
        self.canaries.iter().chain(self.others.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::TaskRunPhase::*;
    use super::*;
    use crate::fixtures;

    #[test]
    fn phase_table() {
        let all = [Planning, Running, Complete, Failed];
        let legal = [
            (Planning, Running),
            (Planning, Failed),
            (Running, Complete),
            (Running, Failed),
        ];
        for a in all {
            for b in all {
                assert_eq!(a.can_move_to(b), legal.contains(&(a, b)), "{a:?} -> {b:?}");
            }
            assert_eq!(a.is_terminal(), all.iter().all(|b| !a.can_move_to(*b)));
        }
    }

    #[test]
    fn plans_are_non_empty_and_unique() {
        let run = AttemptId::new_random();
        let d = |s: &str| DeviceId::try_from(s).expect("id");
        let op = TaskOperation::AptFullUpgradeV1;
        let (t0, t1) = (fixtures::t(0), fixtures::t(100));
        assert!(TaskPlan::new(run, op, t1, vec![], vec![], t0).is_err());
        assert!(TaskPlan::new(run, op, t1, vec![d("a")], vec![d("a")], t0).is_err());
        let p = TaskPlan::new(run, op, t1, vec![d("c")], vec![d("a"), d("b")], t0).expect("plan");
        assert_eq!(
            p.targets().map(DeviceId::as_str).collect::<Vec<_>>(),
            ["c", "a", "b"]
        );
    }
}
