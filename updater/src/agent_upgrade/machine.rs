//! The agent-upgrade transaction's state machine: events, pure transitions between journal phases, and the
//! recovery plan for each durable phase (the seed's recovery table). No I/O here. The system upgrade has its own
//! (`crate::system::machine`): other phases, events and recovery; only the shape is alike.

use fleet_wire::{JournalPhase, UpgradeReason};

/// Something that happened to a transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// Download, install and probe succeeded: start the cutover.
    Prepared,
    /// Preparation failed; the previous agent was never touched.
    PrepareFailed(UpgradeReason),
    /// The target became ready under systemd.
    Ready,
    /// Stopping the old or starting the new agent failed.
    CutoverFailed(UpgradeReason),
    /// The updater found this phase at start-up: it was interrupted.
    Interrupted,
    /// The previous agent is selected and started again.
    RolledBack(UpgradeReason),
    /// Restoring the previous link or starting the previous agent failed.
    RestoreFailed,
}

/// An event that is not legal in a phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("event {event:?} is not legal in journal phase {phase:?}")]
pub struct IllegalTransition {
    /// The phase.
    pub phase: JournalPhase,
    /// The event.
    pub event: Event,
}

/// The phase (and reason) that `event` moves `phase` to. Every result is also legal for
/// [`JournalPhase::can_move_to`].
pub fn next(
    phase: JournalPhase,
    event: Event,
) -> Result<(JournalPhase, Option<UpgradeReason>), IllegalTransition> {
    use Event::*;
    use JournalPhase as P;
    let to = match (phase, event) {
        (P::Preparing, Prepared) => (P::Activating, None),
        (P::Preparing, PrepareFailed(r)) => (P::Failed, Some(r)),
        // Recovery of an interrupted preparation: the previous agent runs again.
        (P::Preparing, RolledBack(r)) => (P::Failed, Some(r)),
        (P::Preparing, RestoreFailed) => (P::RollbackFailed, Some(UpgradeReason::RestoreFailed)),
        (P::Activating, Ready) => (P::Committed, None),
        (P::Activating, CutoverFailed(r)) => (P::RollingBack, Some(r)),
        (P::Activating, Interrupted) => (P::RollingBack, Some(UpgradeReason::Interrupted)),
        (P::RollingBack, Interrupted) => (P::RollingBack, Some(UpgradeReason::Interrupted)),
        (P::RollingBack, RolledBack(r)) => (P::Failed, Some(r)),
        (P::RollingBack, RestoreFailed) => (P::RollbackFailed, Some(UpgradeReason::RestoreFailed)),
        // Recovery of an interrupted preparation recorded `failed`, then starting the previous agent failed.
        (P::Failed, RestoreFailed) => (P::RollbackFailed, Some(UpgradeReason::RestoreFailed)),
        _ => return Err(IllegalTransition { phase, event }),
    };
    if phase.can_move_to(to.0) {
        Ok(to)
    } else {
        Err(IllegalTransition { phase, event })
    }
}

/// What start-up recovery does for a durable phase (the seed's table, row by row).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recovery {
    /// `committed` keeps the target; `failed` keeps the previous agent (no automatic retry); no journal: nothing.
    Keep,
    /// `preparing`: restore the previous link, record `failed`, start the previous service; a restore or start
    /// failure enters `rollback-failed`.
    RestoreAndStart,
    /// `activating`: record `rolling-back`, restore the previous link, stop, start the previous service.
    RollBack,
    /// `rolling-back`: restore the previous link and repeat stop/start.
    RepeatRollBack,
    /// `rollback-failed`: refuse every new attempt until direct root repair.
    Quarantine,
}

/// The recovery for `phase`.
pub fn recovery(phase: JournalPhase) -> Recovery {
    match phase {
        JournalPhase::Preparing => Recovery::RestoreAndStart,
        JournalPhase::Activating => Recovery::RollBack,
        JournalPhase::Committed | JournalPhase::Failed => Recovery::Keep,
        JournalPhase::RollingBack => Recovery::RepeatRollBack,
        JournalPhase::RollbackFailed => Recovery::Quarantine,
    }
}

#[cfg(test)]
mod tests {
    use super::Event::*;
    use super::*;
    use fleet_wire::JournalPhase as P;
    use fleet_wire::UpgradeReason as R;

    const EVENTS: [Event; 7] = [
        Prepared,
        PrepareFailed(R::DownloadFailed),
        Ready,
        CutoverFailed(R::StartFailed),
        Interrupted,
        RolledBack(R::Interrupted),
        RestoreFailed,
    ];

    /// The whole table: a change to the state machine must change this test.
    #[test]
    fn transition_table() {
        let legal: [(P, Event, P, Option<R>); 11] = [
            (P::Preparing, Prepared, P::Activating, None),
            (
                P::Preparing,
                PrepareFailed(R::DownloadFailed),
                P::Failed,
                Some(R::DownloadFailed),
            ),
            (
                P::Preparing,
                RolledBack(R::Interrupted),
                P::Failed,
                Some(R::Interrupted),
            ),
            (
                P::Preparing,
                RestoreFailed,
                P::RollbackFailed,
                Some(R::RestoreFailed),
            ),
            (P::Activating, Ready, P::Committed, None),
            (
                P::Activating,
                CutoverFailed(R::StartFailed),
                P::RollingBack,
                Some(R::StartFailed),
            ),
            (
                P::Activating,
                Interrupted,
                P::RollingBack,
                Some(R::Interrupted),
            ),
            (
                P::RollingBack,
                Interrupted,
                P::RollingBack,
                Some(R::Interrupted),
            ),
            (
                P::RollingBack,
                RolledBack(R::Interrupted),
                P::Failed,
                Some(R::Interrupted),
            ),
            (
                P::RollingBack,
                RestoreFailed,
                P::RollbackFailed,
                Some(R::RestoreFailed),
            ),
            (
                P::Failed,
                RestoreFailed,
                P::RollbackFailed,
                Some(R::RestoreFailed),
            ),
        ];
        for from in P::ALL {
            for ev in EVENTS {
                let want = legal
                    .iter()
                    .find(|(f, e, _, _)| *f == from && *e == ev)
                    .map(|(_, _, to, r)| (*to, *r));
                match (next(from, ev), want) {
                    (Ok(got), Some(want)) => {
                        assert_eq!(got, want, "{from:?} + {ev:?}");
                        assert!(from.can_move_to(got.0));
                    }
                    (Err(_), None) => {}
                    (got, want) => panic!("{from:?} + {ev:?}: got {got:?}, want {want:?}"),
                }
            }
        }
    }

    #[test]
    fn recovery_table() {
        assert_eq!(recovery(P::Preparing), Recovery::RestoreAndStart);
        assert_eq!(recovery(P::Activating), Recovery::RollBack);
        assert_eq!(recovery(P::Committed), Recovery::Keep);
        assert_eq!(recovery(P::RollingBack), Recovery::RepeatRollBack);
        assert_eq!(recovery(P::Failed), Recovery::Keep);
        assert_eq!(recovery(P::RollbackFailed), Recovery::Quarantine);
    }
}
