//! Task runs in the cluster (`fleet-tasks.md`): the `TaskRun` status a person reads with `kubectl`, and the frozen
//! target plan the operator creates atomically in `task-plans/<run-uid>` before the run enters `Running`.
//!
//! The CR status holds only bounded aggregates; the per-device target set lives in the plan, outside the CR. A plan
//! is stored in chunks ([`TaskPlanChunk`], key `<run-uid>.<chunk-sha256>`) named by one manifest
//! ([`TaskPlanManifest`], key `<run-uid>`) that is created last, so that a plan is not limited to one KV value and a
//! half-written plan is never loaded.

use crate::{
    AttemptId, BoundedText, DeviceId, Sha256Hex, TaskOperation, Timestamp, ValidationError,
};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Most devices one frozen plan may hold (at most [`MAX_PLAN_TARGETS`] / [`PLAN_CHUNK_TARGETS`] = 100 chunks).
pub const MAX_PLAN_TARGETS: usize = 1_000_000;
/// Most devices in one plan chunk: 10,000 device ids of at most 63 characters stay below the 1 MiB value limit of
/// `task-plans`.
pub const PLAN_CHUNK_TARGETS: usize = 10_000;

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
    /// Every phase, in order.
    pub const ALL: [TaskRunPhase; 4] =
        [Self::Planning, Self::Running, Self::Complete, Self::Failed];

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

impl TaskRunReason {
    /// Every reason.
    pub const ALL: [TaskRunReason; 7] = [
        Self::NoTargets,
        Self::TargetRevoked,
        Self::CanaryFailed,
        Self::TargetFailed,
        Self::DeadlineExceeded,
        Self::GroupSourceError,
        Self::InvalidSpec,
    ];
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

/// One stored part of a plan, key `<run-uid>.<sha256 of its bytes>` in `task-plans`. Written before the manifest
/// that names it; content-addressed, so two writers of the same part write the same key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TaskPlanChunk {
    /// The run this part belongs to.
    pub run_uid: AttemptId,
    /// Canaries in this part (chunks hold canaries first).
    pub canaries: Vec<DeviceId>,
    /// Other devices in this part.
    pub others: Vec<DeviceId>,
}

/// The manifest of a stored plan, key `<run-uid>` in `task-plans`: created once with KV create after every chunk it
/// names is written. A second writer's create fails and it loads this manifest's plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TaskPlanManifest {
    /// The run's UID.
    pub run_uid: AttemptId,
    /// What every target runs.
    pub operation: TaskOperation,
    /// Copied into every attempt as `expiresAt`.
    pub expires_at: Timestamp,
    /// When the plan was frozen.
    pub created_at: Timestamp,
    /// Canaries in the whole plan.
    pub canaries: u32,
    /// Other devices in the whole plan.
    pub others: u32,
    /// SHA-256 of each chunk's stored bytes, in plan order (canaries first).
    pub chunks: Vec<Sha256Hex>,
}

/// The key of a plan's manifest: `<run-uid>`.
pub fn plan_manifest_key(run: &AttemptId) -> String {
    run.to_string()
}

/// The key of one plan chunk: `<run-uid>.<sha256>`.
pub fn plan_chunk_key(run: &AttemptId, digest: &Sha256Hex) -> String {
    format!("{run}.{digest}")
}

/// SHA-256 of stored bytes.
fn bytes_digest(bytes: &[u8]) -> Sha256Hex {
    Sha256Hex::from_bytes(Sha256::digest(bytes).into())
}

impl TaskPlan {
    /// Splits the plan into its manifest and chunks of at most [`PLAN_CHUNK_TARGETS`] devices, each chunk as the
    /// exact bytes to store with their digest.
    pub fn to_stored(&self) -> (TaskPlanManifest, Vec<(Sha256Hex, Vec<u8>)>) {
        let mut chunks = Vec::new();
        let all: Vec<(&DeviceId, bool)> = self
            .canaries
            .iter()
            .map(|d| (d, true))
            .chain(self.others.iter().map(|d| (d, false)))
            .collect();
        for part in all.chunks(PLAN_CHUNK_TARGETS) {
            let chunk = TaskPlanChunk {
                run_uid: self.run_uid,
                canaries: part.iter().filter(|p| p.1).map(|p| p.0.clone()).collect(),
                others: part.iter().filter(|p| !p.1).map(|p| p.0.clone()).collect(),
            };
            // A validated in-memory value always serializes.
            let bytes = serde_json::to_vec(&chunk).unwrap_or_default();
            chunks.push((bytes_digest(&bytes), bytes));
        }
        let manifest = TaskPlanManifest {
            run_uid: self.run_uid,
            operation: self.operation,
            expires_at: self.expires_at,
            created_at: self.created_at,
            canaries: self.canaries.len() as u32,
            others: self.others.len() as u32,
            chunks: chunks.iter().map(|c| c.0.clone()).collect(),
        };
        (manifest, chunks)
    }

    /// Rebuilds a plan from its manifest and the stored bytes of every chunk it names (in its order): each chunk
    /// must match its digest and run, and the counts must match, so a partial or altered plan is an error.
    pub fn from_stored(
        manifest: &TaskPlanManifest,
        chunks: &[Vec<u8>],
    ) -> Result<TaskPlan, ValidationError> {
        let err = |m: String| ValidationError::new("stored task plan", m);
        if chunks.len() != manifest.chunks.len() {
            return Err(err(format!(
                "{} chunks read, the manifest names {}",
                chunks.len(),
                manifest.chunks.len()
            )));
        }
        let (mut canaries, mut others) = (Vec::new(), Vec::new());
        for (bytes, want) in chunks.iter().zip(&manifest.chunks) {
            if &bytes_digest(bytes) != want {
                return Err(err(format!("chunk {want} does not match its digest")));
            }
            let c: TaskPlanChunk =
                serde_json::from_slice(bytes).map_err(|e| err(format!("chunk {want}: {e}")))?;
            if c.run_uid != manifest.run_uid {
                return Err(err(format!("chunk {want} belongs to run {}", c.run_uid)));
            }
            canaries.extend(c.canaries);
            others.extend(c.others);
        }
        if canaries.len() != manifest.canaries as usize || others.len() != manifest.others as usize
        {
            return Err(err(format!(
                "chunks hold {} canaries and {} others, the manifest says {} and {}",
                canaries.len(),
                others.len(),
                manifest.canaries,
                manifest.others
            )));
        }
        TaskPlan::new(
            manifest.run_uid,
            manifest.operation,
            manifest.expires_at,
            canaries,
            others,
            manifest.created_at,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::TaskRunPhase::*;
    use super::*;
    use crate::fixtures;

    #[test]
    fn phase_table() {
        let all = TaskRunPhase::ALL;
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

    #[test]
    fn stored_plans_round_trip_and_refuse_partial_or_altered_chunks() {
        let run = AttemptId::new_random();
        let ids = |n: usize, p: &str| {
            (0..n)
                .map(|i| DeviceId::try_from(format!("{p}-{i}").as_str()).expect("id"))
                .collect::<Vec<_>>()
        };
        let (t0, t1) = (fixtures::t(0), fixtures::t(100));
        let op = TaskOperation::AptFullUpgradeV1;
        let plan = TaskPlan::new(run, op, t1, ids(3, "c"), ids(25_000, "d"), t0).expect("plan");
        let (m, chunks) = plan.to_stored();
        assert_eq!(chunks.len(), 3);
        assert!(chunks.iter().all(|c| c.1.len() < 1024 * 1024));
        assert_eq!((m.canaries, m.others), (3, 25_000));
        let bytes: Vec<Vec<u8>> = chunks.iter().map(|c| c.1.clone()).collect();
        assert_eq!(TaskPlan::from_stored(&m, &bytes), Ok(plan.clone()));
        // a missing chunk, a swapped one, an altered one, another run's manifest: refused
        assert!(TaskPlan::from_stored(&m, &bytes[..2]).is_err());
        let swapped = vec![bytes[1].clone(), bytes[0].clone(), bytes[2].clone()];
        assert!(TaskPlan::from_stored(&m, &swapped).is_err());
        let mut altered = bytes.clone();
        altered[2][20] ^= 1;
        assert!(TaskPlan::from_stored(&m, &altered).is_err());
        let mut other = m.clone();
        other.run_uid = AttemptId::new_random();
        assert!(TaskPlan::from_stored(&other, &bytes).is_err());
        let mut wrong_count = m.clone();
        wrong_count.canaries = 2;
        assert!(TaskPlan::from_stored(&wrong_count, &bytes).is_err());
        // the largest chunk stays below the 1 MiB value limit even with the longest ids, and so does the manifest
        // of the largest plan (built directly: a million-device plan is too slow for a debug or emulated run)
        let long = |i: usize| DeviceId::try_from(format!("{i:063}").as_str()).expect("id");
        let chunk = TaskPlanChunk {
            run_uid: run,
            canaries: vec![],
            others: (0..PLAN_CHUNK_TARGETS).map(long).collect(),
        };
        assert!(serde_json::to_vec(&chunk).expect("json").len() < 1024 * 1024);
        let manifest = TaskPlanManifest {
            chunks: vec![m.chunks[0].clone(); MAX_PLAN_TARGETS / PLAN_CHUNK_TARGETS],
            ..m
        };
        assert!(serde_json::to_vec(&manifest).expect("json").len() < 64 * 1024);
        // the size is checked first, so one id repeated is enough
        let too_many = vec![DeviceId::try_from("d").expect("id"); MAX_PLAN_TARGETS + 1];
        let e = TaskPlan::new(run, op, t1, vec![], too_many, t0).expect_err("too many");
        assert!(e.to_string().contains("more than 1000000 targets"), "{e}");
    }
}
