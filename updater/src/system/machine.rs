//! The system-upgrade state machine: events, pure transitions between journal phases and the recovery plan for
//! each durable phase. No I/O here. (Whether a request may start one: `super::accept`.)

use fleet_wire::{SystemJournalPhase as P, SystemUpgradeReason};

/// Something that happened to a system-upgrade transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// apt is about to run (journaled before the first command starts).
    Start,
    /// `apt-get full-upgrade` succeeded; `reboot` says whether the device must reboot.
    Upgraded {
        /// A reboot is needed (`/run/reboot-required`, a kernel or libc upgrade).
        reboot: bool,
    },
    /// An apt command failed in a way that leaves dpkg consistent.
    AptFailed(SystemUpgradeReason),
    /// dpkg failed or the updater found `upgrading` at start-up: `dpkg --configure -a` runs next.
    NeedsRepair(SystemUpgradeReason),
    /// `dpkg --configure -a` finished (successfully or not); the attempt fails with the recorded reason.
    Repaired(SystemUpgradeReason),
    /// The coordinated reboot happened and the host is healthy again (or the lock was released).
    Rebooted,
    /// The reboot cannot happen on this device.
    RebootFailed(SystemUpgradeReason),
}

/// An event that is not legal in a phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("event {event:?} is not legal in system-upgrade phase {phase:?}")]
pub struct IllegalTransition {
    /// The phase.
    pub phase: P,
    /// The event.
    pub event: Event,
}

/// The phase (and reason) `event` moves `phase` to. Every result is legal for [`P::can_move_to`].
pub fn next(phase: P, event: Event) -> Result<(P, Option<SystemUpgradeReason>), IllegalTransition> {
    use Event::*;
    let to = match (phase, event) {
        (P::Accepted, Start) => (P::Upgrading, None),
        (P::Upgrading, Upgraded { reboot: true }) => (P::Rebooting, None),
        (P::Upgrading, Upgraded { reboot: false }) => (P::Succeeded, None),
        (P::Upgrading, AptFailed(r)) => (P::Failed, Some(r)),
        (P::Upgrading, NeedsRepair(r)) => (P::Repairing, Some(r)),
        (P::Repairing, Repaired(r)) => (P::Failed, Some(r)),
        (P::Rebooting, Rebooted) => (P::Succeeded, None),
        (P::Rebooting, RebootFailed(r)) => (P::Failed, Some(r)),
        _ => return Err(IllegalTransition { phase, event }),
    };
    if phase.can_move_to(to.0) {
        Ok(to)
    } else {
        Err(IllegalTransition { phase, event })
    }
}

/// What start-up does with a durable phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recovery {
    /// `succeeded`, `failed`: nothing.
    Keep,
    /// `accepted`: apt never started for this attempt; run the upgrade.
    Run,
    /// `upgrading`: apt was interrupted. Journal `repairing` (reason interrupted) before readiness, then run
    /// `dpkg --configure -a` and end `failed`; apt never runs again for this attempt.
    Interrupted,
    /// `repairing`: run `dpkg --configure -a` again, then end `failed`.
    Repair,
    /// `rebooting`: run the coordinated-reboot client again (after the reboot it releases the lock).
    Reboot,
}

/// The recovery for `phase`.
pub fn recovery(phase: P) -> Recovery {
    match phase {
        P::Accepted => Recovery::Run,
        P::Upgrading => Recovery::Interrupted,
        P::Repairing => Recovery::Repair,
        P::Rebooting => Recovery::Reboot,
        P::Succeeded | P::Failed => Recovery::Keep,
    }
}

#[cfg(test)]
mod tests {
    use super::Event::*;
    use super::*;
    use fleet_wire::SystemUpgradeReason as R;

    const EVENTS: [Event; 8] = [
        Start,
        Upgraded { reboot: true },
        Upgraded { reboot: false },
        AptFailed(R::AptLockHeld),
        NeedsRepair(R::Interrupted),
        Repaired(R::Interrupted),
        Rebooted,
        RebootFailed(R::RebootRefused),
    ];

    /// The whole table: a change to the state machine must change this test.
    #[test]
    fn transition_table() {
        let legal: [(P, Event, P, Option<R>); 8] = [
            (P::Accepted, Start, P::Upgrading, None),
            (P::Upgrading, Upgraded { reboot: true }, P::Rebooting, None),
            (P::Upgrading, Upgraded { reboot: false }, P::Succeeded, None),
            (
                P::Upgrading,
                AptFailed(R::AptLockHeld),
                P::Failed,
                Some(R::AptLockHeld),
            ),
            (
                P::Upgrading,
                NeedsRepair(R::Interrupted),
                P::Repairing,
                Some(R::Interrupted),
            ),
            (
                P::Repairing,
                Repaired(R::Interrupted),
                P::Failed,
                Some(R::Interrupted),
            ),
            (P::Rebooting, Rebooted, P::Succeeded, None),
            (
                P::Rebooting,
                RebootFailed(R::RebootRefused),
                P::Failed,
                Some(R::RebootRefused),
            ),
        ];
        for from in P::ALL {
            for ev in EVENTS {
                let want = legal
                    .iter()
                    .find(|(f, e, _, _)| *f == from && *e == ev)
                    .map(|(_, _, to, r)| (*to, *r));
                match (next(from, ev), want) {
                    (Ok(got), Some(want)) => assert_eq!(got, want, "{from:?} + {ev:?}"),
                    (Err(_), None) => {}
                    (got, want) => panic!("{from:?} + {ev:?}: got {got:?}, want {want:?}"),
                }
            }
        }
    }

    #[test]
    fn recovery_table() {
        assert_eq!(recovery(P::Accepted), Recovery::Run);
        assert_eq!(recovery(P::Upgrading), Recovery::Interrupted);
        assert_eq!(recovery(P::Repairing), Recovery::Repair);
        assert_eq!(recovery(P::Rebooting), Recovery::Reboot);
        assert_eq!(recovery(P::Succeeded), Recovery::Keep);
        assert_eq!(recovery(P::Failed), Recovery::Keep);
    }
}
