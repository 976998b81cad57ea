//! The updater's durable journal phases, their legal transitions and their mapping onto public phases.

use crate::{SystemUpgradePhase, UpgradePhase};
use serde::{Deserialize, Serialize};

/// A phase the updater persists before acting on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum JournalPhase {
    /// Download, verify, install, probe. Recovery: restore the previous link, record failed, start the previous
    /// service; a restore or start failure enters rollback-failed.
    Preparing,
    /// Stop, switch, start. Recovery: record rolling-back, restore the previous link, stop, start the previous.
    Activating,
    /// The target became ready. Recovery: keep the target.
    Committed,
    /// Restoring the previous agent. Recovery: restore the previous link and repeat stop/start.
    RollingBack,
    /// The attempt failed; the previous agent is active. Recovery: keep it; no automatic retry.
    Failed,
    /// Quarantine. Recovery: refuse every new attempt until direct root repair.
    RollbackFailed,
}

/// Where an `activating` cutover is, which decides its public phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CutoverStep {
    /// Waiting for systemd to stop the old agent.
    Stopping,
    /// The link is switched; waiting for the new agent's readiness.
    Starting,
}

impl JournalPhase {
    /// Every phase, for table tests and docs.
    pub const ALL: [JournalPhase; 6] = [
        Self::Preparing,
        Self::Activating,
        Self::Committed,
        Self::RollingBack,
        Self::Failed,
        Self::RollbackFailed,
    ];

    /// The legal transitions of the journal state machine. `failed -> rollback-failed` is the one way out of a
    /// terminal phase: recovery of an interrupted preparation records `failed` before it starts the previous
    /// service (the seed's order), and that start can still fail.
    pub fn can_move_to(self, next: JournalPhase) -> bool {
        use JournalPhase::*;
        matches!(
            (self, next),
            (Preparing, Activating | Failed | RollbackFailed)
                | (Activating, Committed | RollingBack)
                | (RollingBack, RollingBack | Failed | RollbackFailed)
                | (Failed, RollbackFailed)
        )
    }

    /// True when the attempt is over; a new attempt may start unless quarantined.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Committed | Self::Failed | Self::RollbackFailed)
    }

    /// True when a new attempt may replace this journal.
    pub fn accepts_new_attempt(self) -> bool {
        matches!(self, Self::Committed | Self::Failed)
    }

    /// The public phase, given where an `activating` cutover is.
    pub fn public(self, step: CutoverStep) -> UpgradePhase {
        match self {
            Self::Preparing => UpgradePhase::Preparing,
            Self::Activating => match step {
                CutoverStep::Stopping => UpgradePhase::Stopping,
                CutoverStep::Starting => UpgradePhase::Starting,
            },
            Self::Committed => UpgradePhase::Complete,
            Self::RollingBack => UpgradePhase::RollingBack,
            Self::Failed => UpgradePhase::Failed,
            Self::RollbackFailed => UpgradePhase::RollbackFailed,
        }
    }
}

/// A phase of the system-upgrade transaction the updater persists before acting on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SystemJournalPhase {
    /// Accepted; apt has not started. Recovery: run the upgrade (apt never ran for this attempt).
    Accepted,
    /// `apt-get update` / `apt-get full-upgrade` may be running. Recovery: record repairing, never run apt again.
    Upgrading,
    /// `dpkg --configure -a` repairs an interrupted or failed dpkg run. Recovery: run it again, then failed.
    Repairing,
    /// Packages are upgraded and a reboot is needed: the coordinated-reboot client runs (lock, reboot, release).
    /// Recovery: run the client again; after the reboot it waits for health and releases the lock.
    Rebooting,
    /// Done. Recovery: keep.
    Succeeded,
    /// Failed (see reason). Recovery: keep; an attempt id never runs apt twice.
    Failed,
}

impl SystemJournalPhase {
    /// Every phase, for table tests and docs.
    pub const ALL: [SystemJournalPhase; 6] = [
        Self::Accepted,
        Self::Upgrading,
        Self::Repairing,
        Self::Rebooting,
        Self::Succeeded,
        Self::Failed,
    ];

    /// The legal transitions of the system-upgrade journal.
    pub fn can_move_to(self, next: SystemJournalPhase) -> bool {
        use SystemJournalPhase::*;
        matches!(
            (self, next),
            (Accepted, Upgrading | Failed)
                | (Upgrading, Repairing | Rebooting | Succeeded | Failed)
                | (Repairing, Failed)
                | (Rebooting, Succeeded | Failed)
        )
    }

    /// True when nothing further happens to the attempt.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed)
    }

    /// The public phase (`repairing` is part of `upgrading` for the operator).
    pub fn public(self) -> SystemUpgradePhase {
        match self {
            Self::Accepted => SystemUpgradePhase::Accepted,
            Self::Upgrading | Self::Repairing => SystemUpgradePhase::Upgrading,
            Self::Rebooting => SystemUpgradePhase::Rebooting,
            Self::Succeeded => SystemUpgradePhase::Succeeded,
            Self::Failed => SystemUpgradePhase::Failed,
        }
    }
}

#[cfg(test)]
mod system_tests {
    use super::SystemJournalPhase::*;
    use super::*;

    /// The whole system-upgrade transition table, written out.
    #[test]
    fn system_transition_table() {
        let legal = [
            (Accepted, Upgrading),
            (Accepted, Failed),
            (Upgrading, Repairing),
            (Upgrading, Rebooting),
            (Upgrading, Succeeded),
            (Upgrading, Failed),
            (Repairing, Failed),
            (Rebooting, Succeeded),
            (Rebooting, Failed),
        ];
        for from in SystemJournalPhase::ALL {
            for to in SystemJournalPhase::ALL {
                assert_eq!(
                    from.can_move_to(to),
                    legal.contains(&(from, to)),
                    "{from:?} -> {to:?}"
                );
            }
            assert_eq!(
                from.is_terminal(),
                SystemJournalPhase::ALL
                    .iter()
                    .all(|n| !from.can_move_to(*n))
            );
            assert_eq!(from.is_terminal(), from.public().is_terminal());
        }
        assert_eq!(Repairing.public(), SystemUpgradePhase::Upgrading);
    }
}

#[cfg(test)]
mod tests {
    use super::JournalPhase::*;
    use super::*;

    /// The whole transition table, written out: a change to the state machine must change this test.
    #[test]
    fn transition_table() {
        let legal = [
            (Preparing, Activating),
            (Preparing, Failed),
            (Preparing, RollbackFailed),
            (Activating, Committed),
            (Activating, RollingBack),
            (RollingBack, RollingBack),
            (RollingBack, Failed),
            (RollingBack, RollbackFailed),
            (Failed, RollbackFailed),
        ];
        for from in JournalPhase::ALL {
            for to in JournalPhase::ALL {
                assert_eq!(
                    from.can_move_to(to),
                    legal.contains(&(from, to)),
                    "{from:?} -> {to:?}"
                );
            }
        }
    }

    #[test]
    fn public_mapping_and_gates() {
        assert_eq!(
            Activating.public(CutoverStep::Stopping),
            UpgradePhase::Stopping
        );
        assert_eq!(
            Activating.public(CutoverStep::Starting),
            UpgradePhase::Starting
        );
        assert_eq!(
            Committed.public(CutoverStep::Stopping),
            UpgradePhase::Complete
        );
        assert_eq!(
            RollbackFailed.public(CutoverStep::Starting),
            UpgradePhase::RollbackFailed
        );
        assert!(
            !RollbackFailed.accepts_new_attempt()
                && Failed.accepts_new_attempt()
                && !Preparing.accepts_new_attempt()
        );
        for p in JournalPhase::ALL {
            // Failed's one way out (a failed start after an interrupted preparation) is the exception.
            let only_out_is_quarantine = JournalPhase::ALL
                .iter()
                .all(|n| !p.can_move_to(*n) || *n == RollbackFailed);
            assert_eq!(
                p.is_terminal(),
                only_out_is_quarantine && p != Preparing && p != RollingBack,
                "{p:?}"
            );
        }
    }
}
