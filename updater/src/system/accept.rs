//! Whether a `system-upgrade` request may start a transaction: a pure decision over the system journal, the
//! attempt's expiry and the agent-upgrade side (one mutating transaction at a time).

use super::journal::SystemJournal;
use fleet_wire::{SystemUpgradeAttempt, Timestamp};

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
    if attempt.has_expired(now) {
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
    use super::*;
    use crate::system::machine::Event::*;
    use fleet_wire::fixtures;

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
