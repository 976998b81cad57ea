//! The public agent-upgrade status: what the agent mirrors into `agent-upgrade-status/<device>` and the Device CR.

use crate::{
    AttemptId, BoundedText, DeviceId, Id128, Sha256Hex, Timestamp, Transitions, UnitName, Version,
};
use serde::{Deserialize, Serialize};

/// Public phase of an agent upgrade.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum UpgradePhase {
    /// Downloading, verifying, installing and probing the candidate; the old agent keeps reconciling.
    Preparing,
    /// The old agent is being stopped.
    Stopping,
    /// The new agent is being started; it commits on systemd readiness.
    Starting,
    /// Committed: the target is the active agent.
    Complete,
    /// The previous binary is being restored.
    RollingBack,
    /// The attempt failed; the previous agent is active. Never retried automatically.
    Failed,
    /// Restoring the previous agent failed: quarantined until direct root repair.
    RollbackFailed,
}

impl UpgradePhase {
    /// True for phases after which nothing further happens to this attempt.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Complete | Self::Failed | Self::RollbackFailed)
    }
}

/// Why a phase was entered, as a closed set a controller can branch on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum UpgradeReason {
    /// The intent was invalid (wrong device, architecture, malformed, reused UUID with other content).
    Rejected,
    /// The updater refused a new attempt because it is quarantined (`rollback-failed`).
    Quarantined,
    /// The updater is busy with another attempt.
    Busy,
    /// The agent is being stopped by the updater for a cutover.
    Updater,
    /// The agent is being stopped by someone else (shutdown, operator).
    Shutdown,
    /// The download failed (connection, TLS, HTTP status, redirect, time-out).
    DownloadFailed,
    /// The artifact exceeded its byte limit, declared or streamed.
    ArtifactTooLarge,
    /// The artifact's SHA-256 (or an OCI digest) did not match.
    DigestMismatch,
    /// The OCI manifest was not a Harmony agent artifact.
    ArtifactInvalid,
    /// Writing or re-verifying the versioned binary failed.
    InstallFailed,
    /// The candidate's `--self-test` failed or timed out.
    ProbeFailed,
    /// The candidate reported another version than the target.
    VersionMismatch,
    /// Stopping the old agent failed or timed out.
    StopFailed,
    /// Starting the new agent failed or it never became ready.
    StartFailed,
    /// The updater was interrupted (crash or power loss) and recovery rolled back.
    Interrupted,
    /// Restoring the previous link or starting the previous agent failed.
    RestoreFailed,
    /// The agent could not reach the updater: the attempt is still pending (phase `preparing`) and is delivered
    /// when the updater answers again. Never a failure.
    UpdaterUnreachable,
}

/// One timed phase change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Transition<P> {
    /// The phase entered.
    pub phase: P,
    /// When it was entered (UTC).
    pub at: Timestamp,
    /// Why, when not the normal path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<UpgradeReason>,
}

impl<P: Copy> crate::Transitions<Transition<P>> {
    /// The phases entered, oldest first.
    pub fn phases(&self) -> Vec<P> {
        self.as_slice().iter().map(|t| t.phase).collect()
    }
}

/// Public status of one agent-upgrade attempt.
///
/// `attemptId`, `targetVersion` and `attemptDigest` are absent only for an intent rejected before it could be
/// parsed (phase `failed`, reason `rejected`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentUpgradeStatus {
    /// The device.
    pub device_id: DeviceId,
    /// The attempt's UUID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt_id: Option<AttemptId>,
    /// The version being installed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_version: Option<Version>,
    /// Canonical digest of the attempt's content.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt_digest: Option<Sha256Hex>,
    /// Current phase.
    pub phase: UpgradePhase,
    /// Why the current phase was entered, when not the normal path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<UpgradeReason>,
    /// Progress detail for a person.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<BoundedText>,
    /// The latest error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<BoundedText>,
    /// When the attempt was accepted.
    pub attempt_started_at: Timestamp,
    /// When the current phase was entered.
    pub phase_changed_at: Timestamp,
    /// How long the old agent's SIGTERM drain took, once completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_duration_ms: Option<u64>,
    /// Boot id of the device when the status was produced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<Id128>,
    /// systemd invocation id of the unit named in `journalUnit`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invocation_id: Option<Id128>,
    /// The one journald unit whose log tells this attempt's story (`journalctl -u <unit>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub journal_unit: Option<UnitName>,
    /// The most recent transitions, oldest first, at most 16.
    pub transitions: Transitions<Transition<UpgradePhase>>,
}

impl AgentUpgradeStatus {
    /// Moves to `phase` at `at` for `reason`, recording the transition.
    pub fn enter(&mut self, phase: UpgradePhase, at: Timestamp, reason: Option<UpgradeReason>) {
        self.phase = phase;
        self.phase_changed_at = at;
        self.reason = reason;
        self.transitions.push(Transition { phase, at, reason });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;

    #[test]
    fn enter_records_bounded_transitions() {
        let mut s = fixtures::upgrade_status();
        for _ in 0..20 {
            s.enter(
                UpgradePhase::Stopping,
                fixtures::t(5),
                Some(UpgradeReason::Updater),
            );
        }
        assert_eq!(s.transitions.len(), crate::limits::MAX_TRANSITIONS);
        assert_eq!(s.phase, UpgradePhase::Stopping);
        assert!(UpgradePhase::Complete.is_terminal() && !UpgradePhase::Starting.is_terminal());
    }
}
