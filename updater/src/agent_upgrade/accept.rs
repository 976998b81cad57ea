//! Whether a new upgrade request may start a transaction: a pure decision over the journal.

use super::journal::Journal;
use fleet_wire::{AgentUpgradeAttempt, JournalPhase};

/// The decision for an upgrade request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Start a new transaction.
    Start,
    /// The same attempt (id and digest) as the journal's: answer its current status (idempotent).
    Current,
    /// The attempt id was seen with other content, or already finished earlier (never retried automatically).
    Conflict(String),
    /// `rollback-failed`: every new attempt is refused until root repair.
    Quarantined,
    /// Another transaction is still running.
    Busy,
}

/// Decides what an upgrade request for `attempt` does, given the journal.
pub fn decide(journal: Option<&Journal>, attempt: &AgentUpgradeAttempt) -> Decision {
    let Some(j) = journal else {
        return Decision::Start;
    };
    let digest = attempt.digest();
    if j.attempt.attempt_id == attempt.attempt_id {
        return if j.attempt_digest == digest {
            Decision::Current
        } else {
            Decision::Conflict(format!(
                "attempt {} was accepted with another content digest ({}); a reused attempt id is refused",
                attempt.attempt_id, j.attempt_digest
            ))
        };
    }
    if j.phase == JournalPhase::RollbackFailed {
        return Decision::Quarantined;
    }
    if let Some(e) = j
        .earlier_attempts
        .iter()
        .find(|e| e.attempt_id == attempt.attempt_id)
    {
        return Decision::Conflict(if e.attempt_digest == digest {
            format!(
                "attempt {} already ended ({:?}) and is never retried automatically; write a new attempt id",
                attempt.attempt_id, e.phase
            )
        } else {
            format!(
                "attempt {} was accepted earlier with another content digest; a reused attempt id is refused",
                attempt.attempt_id
            )
        });
    }
    if j.phase.accepts_new_attempt() {
        Decision::Start
    } else {
        Decision::Busy
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent_upgrade::machine::Event;
    use fleet_wire::{fixtures, AttemptId, UpgradeReason, Version};

    fn journal_in(phase_events: &[Event]) -> Journal {
        let mut j = Journal::begin(
            fixtures::attempt(),
            "/p".into(),
            "/x/fleet-agent-v1.2.0".into(),
            vec![],
            fixtures::t(0),
        );
        for e in phase_events {
            j.apply(*e, fixtures::t(1)).expect("legal");
        }
        j
    }

    #[test]
    fn decisions() {
        let a = fixtures::attempt();
        assert_eq!(decide(None, &a), Decision::Start);
        let preparing = journal_in(&[]);
        assert_eq!(decide(Some(&preparing), &a), Decision::Current);
        let mut changed = a.clone();
        changed.target_version = Version::try_from("1.3.0").expect("v");
        assert!(matches!(
            decide(Some(&preparing), &changed),
            Decision::Conflict(_)
        ));
        let mut other = a.clone();
        other.attempt_id = AttemptId::new_random();
        assert_eq!(decide(Some(&preparing), &other), Decision::Busy);
        let failed = journal_in(&[Event::PrepareFailed(UpgradeReason::DownloadFailed)]);
        assert_eq!(
            decide(Some(&failed), &a),
            Decision::Current,
            "failed is not retried"
        );
        assert_eq!(decide(Some(&failed), &other), Decision::Start);
        let quarantined = journal_in(&[Event::RestoreFailed]);
        assert_eq!(decide(Some(&quarantined), &other), Decision::Quarantined);
        assert_eq!(decide(Some(&quarantined), &a), Decision::Current);
        let mut next = Journal::begin(
            other.clone(),
            "/p".into(),
            "/x/fleet-agent-v1.2.0".into(),
            failed.successor_history(),
            fixtures::t(2),
        );
        next.apply(Event::Prepared, fixtures::t(3)).expect("legal");
        next.apply(Event::Ready, fixtures::t(4)).expect("legal");
        assert!(
            matches!(decide(Some(&next), &a), Decision::Conflict(m) if m.contains("never retried"))
        );
        assert!(
            matches!(decide(Some(&next), &changed), Decision::Conflict(m) if m.contains("another content"))
        );
    }
}
