//! The system-upgrade state machine: events, pure transitions between journal phases, the recovery plan for
//! each durable phase, and the decision on a `system-upgrade` request. No I/O here.

use super::journal::SystemJournal;
use fleet_wire::{SystemJournalPhase as P, SystemUpgradeAttempt, SystemUpgradeReason, Timestamp};

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

/// What the agent-upgrade side says, for the one-transaction-at-a-time rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AgentSide {
    /// An agent-upgrade transaction (or its start-up recovery) is running.
    pub busy: bool,
    /// The updater is quarantined (`rollback-failed`).
    pub quarantined: bool,
}

/// The decision on a `system-upgrade` request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Journal a new transaction and run it.
    Start,
    /// The journal's current attempt, same content: answer its status (idempotent, apt does not run again).
    Current,
    /// The id was seen with other content, or it already ended earlier: refused, apt does not run again.
    Conflict(String),
    /// `rollback-failed`: every new attempt is refused until root repair.
    Quarantined,
    /// `expiresAt` passed before acceptance: the attempt never starts.
    Expired,
    /// Another transaction (either kind) is running.
    Busy(&'static str),
}

/// Decides what a `system-upgrade` request for `attempt` does at `now`. Pure.
pub fn decide(
    journal: Option<&SystemJournal>,
    attempt: &SystemUpgradeAttempt,
    agent: AgentSide,
    now: Timestamp,
) -> Decision {
    if let Some(j) = journal {
        if j.attempt.run_uid == attempt.run_uid {
            return if &j.attempt == attempt {
                Decision::Current
            } else {
                Decision::Conflict(format!(
                    "run {} was accepted with other content; a reused run id is refused",
                    attempt.run_uid
                ))
            };
        }
        if let Some(e) = j.earlier.iter().find(|e| e.run_uid == attempt.run_uid) {
            return Decision::Conflict(format!(
                "run {} already ended ({:?}) on this device; an attempt id never runs apt twice",
                attempt.run_uid, e.phase
            ));
        }
    }
    if agent.quarantined {
        return Decision::Quarantined;
    }
    if now >= attempt.expires_at {
        return Decision::Expired;
    }
    if journal.is_some_and(|j| !j.phase.is_terminal()) {
        return Decision::Busy("another system upgrade is running");
    }
    if agent.busy {
        return Decision::Busy("an agent upgrade is running");
    }
    Decision::Start
}

#[cfg(test)]
mod tests {
    use super::Event::*;
    use super::*;
    use fleet_wire::fixtures;
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

    #[test]
    fn decisions() {
        let a = fixtures::system_attempt();
        let before = fixtures::t(100);
        let after = a.expires_at;
        let free = AgentSide::default();
        let busy = AgentSide {
            busy: true,
            quarantined: false,
        };
        let quarantined = AgentSide {
            busy: false,
            quarantined: true,
        };
        assert_eq!(decide(None, &a, free, before), Decision::Start);
        assert_eq!(decide(None, &a, free, after), Decision::Expired);
        assert!(matches!(decide(None, &a, busy, before), Decision::Busy(_)));
        assert_eq!(decide(None, &a, quarantined, before), Decision::Quarantined);

        let mut running = SystemJournal::begin(a.clone(), vec![], fixtures::t(10));
        // The same attempt is current whatever the clock and the other side say: it was accepted in time.
        assert_eq!(decide(Some(&running), &a, busy, after), Decision::Current);
        let mut changed = a.clone();
        changed.expires_at = fixtures::t(99_999);
        assert!(matches!(
            decide(Some(&running), &changed, free, before),
            Decision::Conflict(_)
        ));
        let mut other = a.clone();
        other.run_uid = fleet_wire::AttemptId::new_random();
        assert!(matches!(
            decide(Some(&running), &other, free, before),
            Decision::Busy(_)
        ));
        running.apply(Start, fixtures::t(11)).expect("legal");
        running
            .apply(Upgraded { reboot: false }, fixtures::t(12))
            .expect("legal");
        assert_eq!(
            decide(Some(&running), &other, free, before),
            Decision::Start
        );
        let next_one =
            SystemJournal::begin(other.clone(), running.successor_history(), fixtures::t(13));
        assert!(
            matches!(decide(Some(&next_one), &a, free, before), Decision::Conflict(m) if m.contains("already ended"))
        );
    }
}
