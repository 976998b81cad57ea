//! Fleet tasks on the device: the system-upgrade attempt (`system-upgrade-intent/<device>.<run-uid>`) and its
//! status (`system-upgrade-status/<device>.<run-uid>`).

use crate::status::Transition;
use crate::{AttemptId, BoundedText, DeviceId, Timestamp, Transitions};
use serde::{Deserialize, Serialize};

/// A built-in task operation. The API carries no package names, repositories, commands or reboot arguments:
/// apt, dpkg, repository and reboot policy are compiled into the updater.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TaskOperation {
    /// `apt-get update` + `apt-get full-upgrade` non-interactively, then a coordinated reboot when required.
    AptFullUpgradeV1,
}

/// One system-upgrade attempt for one device. The task run's UID is the attempt id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SystemUpgradeAttempt {
    /// The TaskRun's UID, which is also this attempt's id.
    pub run_uid: AttemptId,
    /// The device.
    pub device_id: DeviceId,
    /// What to run.
    pub operation: TaskOperation,
    /// The run's deadline: an attempt not accepted by then never starts. It does not interrupt apt once accepted.
    pub expires_at: Timestamp,
}

impl SystemUpgradeAttempt {
    /// True once the attempt's deadline has passed at `now`: an attempt not accepted by then never starts.
    pub fn has_expired(&self, now: Timestamp) -> bool {
        now >= self.expires_at
    }
}

/// Phase of a system upgrade on a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SystemUpgradePhase {
    /// The updater accepted the attempt and journaled it.
    Accepted,
    /// apt/dpkg are running.
    Upgrading,
    /// Packages are upgraded; waiting for a coordinated reboot slot or rebooting.
    Rebooting,
    /// Done (and rebooted when required).
    Succeeded,
    /// Failed; see reason and error.
    Failed,
}

impl SystemUpgradeStatus {
    /// A status for an attempt the updater never accepted (expired, rejected, refused): phase `failed`, with
    /// `acceptedAt` and `completedAt` both the time of the decision.
    pub fn refused(
        run_uid: AttemptId,
        device_id: DeviceId,
        reason: SystemUpgradeReason,
        error: impl AsRef<str>,
        at: Timestamp,
    ) -> Self {
        let mut transitions = Transitions::default();
        transitions.push(Transition {
            phase: SystemUpgradePhase::Failed,
            at,
            reason: None,
        });
        Self {
            run_uid,
            device_id,
            phase: SystemUpgradePhase::Failed,
            reason: Some(reason),
            error: Some(BoundedText::lossy(error)),
            accepted_at: at,
            completed_at: Some(at),
            first_heartbeat_after_completion: None,
            reboot_required: false,
            detail: None,
            output_tail: None,
            transitions,
        }
    }
}

impl SystemUpgradePhase {
    /// True when nothing further happens to the attempt.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed)
    }
}

/// Why a system upgrade failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SystemUpgradeReason {
    /// The attempt reached the device after `expiresAt`.
    Expired,
    /// The attempt was invalid or for another device.
    Rejected,
    /// apt or dpkg exited non-zero.
    AptFailed,
    /// The updater was interrupted and could not resume.
    Interrupted,
    /// The coordinated reboot did not happen.
    RebootFailed,
    /// The dpkg/apt lock stayed held by another process past the updater's wait.
    AptLockHeld,
    /// dpkg failed to unpack or configure a package (the updater ran `dpkg --configure -a` afterwards).
    DpkgError,
    /// `apt-get update` or a package download could not reach a repository.
    RepositoryUnreachable,
    /// The upgrade needs a reboot, but this device cannot take one (no coordinated-reboot configuration, or
    /// the reboot client reported an error an operator must fix).
    RebootRefused,
}

/// Status of one system-upgrade attempt, published by the agent from the updater's journal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SystemUpgradeStatus {
    /// The TaskRun's UID (the attempt id).
    pub run_uid: AttemptId,
    /// The device.
    pub device_id: DeviceId,
    /// Current phase.
    pub phase: SystemUpgradePhase,
    /// Why, for `failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<SystemUpgradeReason>,
    /// The latest error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<BoundedText>,
    /// When the updater accepted the attempt.
    pub accepted_at: Timestamp,
    /// When the updater finished (succeeded or failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<Timestamp>,
    /// The agent's first heartbeat after the updater completed; success counts only if it precedes the deadline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_heartbeat_after_completion: Option<Timestamp>,
    /// Whether the upgrade required a reboot.
    #[serde(default)]
    pub reboot_required: bool,
    /// Progress detail for a person (what runs now, or why the reboot waits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<BoundedText>,
    /// The last lines apt/dpkg printed (bounded; the whole output is in the updater's journald log).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_tail: Option<BoundedText>,
    /// The most recent transitions, oldest first, at most 16.
    pub transitions: Transitions<Transition<SystemUpgradePhase>>,
}

#[cfg(test)]
mod tests {
    use crate::fixtures::{system_attempt, t};

    /// The one expiry rule the agent's relay and the updater's acceptance share: an attempt still starts the second
    /// before its deadline and never at or after it.
    #[test]
    fn an_attempt_expires_at_its_deadline() {
        let a = system_attempt();
        assert_eq!(a.expires_at, t(21600));
        assert!(!a.has_expired(t(0)));
        assert!(!a.has_expired(t(21599)));
        assert!(a.has_expired(t(21600)));
        assert!(a.has_expired(t(21601)));
    }
}
