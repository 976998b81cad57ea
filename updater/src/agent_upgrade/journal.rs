//! The durable journal of the current (or last) agent-upgrade transaction: versioned JSON, unknown fields refused,
//! validated on load, written with temp file + fsync + rename + directory fsync.

use super::machine::{self, Event, IllegalTransition};
use crate::durable;
use fleet_wire::{
    AgentUpgradeAttempt, AgentUpgradeStatus, AttemptId, BoundedText, CutoverStep, Id128,
    JournalPhase, Sha256Hex, Timestamp, Transition, Transitions, UnitName, UpgradePhase,
    UpgradeReason,
};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The journal format this build writes and reads.
pub const JOURNAL_FORMAT: u32 = 1;
/// Largest journal file read, in bytes.
pub const JOURNAL_MAX_BYTES: u64 = 256 * 1024;
/// Earlier attempts remembered so a reused attempt id is recognised.
pub const MAX_EARLIER_ATTEMPTS: usize = 32;
/// Longest symlink target stored, in bytes.
pub const LINK_MAX_BYTES: usize = 4096;

/// An attempt finished before the current one: its identity only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EarlierAttempt {
    /// Its id.
    pub attempt_id: AttemptId,
    /// Its canonical digest.
    pub attempt_digest: Sha256Hex,
    /// How it ended.
    pub phase: JournalPhase,
}

/// The journal file's content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Journal {
    /// Always [`JOURNAL_FORMAT`].
    pub format: u32,
    /// The attempt, as accepted.
    pub attempt: AgentUpgradeAttempt,
    /// Its canonical digest, bound to its id at acceptance.
    pub attempt_digest: Sha256Hex,
    /// The active symlink's exact target when the attempt was accepted: what a rollback restores.
    pub previous_link: String,
    /// The symlink target that selects the candidate.
    pub target_link: String,
    /// The durable phase.
    pub phase: JournalPhase,
    /// Why the phase was entered, when not the normal path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<UpgradeReason>,
    /// Progress detail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<BoundedText>,
    /// The latest error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<BoundedText>,
    /// When the attempt was accepted.
    pub started_at: Timestamp,
    /// How long stopping the old agent took.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_duration_ms: Option<u64>,
    /// When the cutover started the candidate (the public `starting` phase inside `activating`). Persisted so the
    /// public history keeps `starting` after commit or rollback: transitions are only ever appended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub starting_at: Option<Timestamp>,
    /// The newest transitions (at most 16), oldest first; the last one is the current phase.
    pub transitions: Transitions<Transition<JournalPhase>>,
    /// Attempts finished before this one (at most 32), oldest first.
    #[serde(default)]
    pub earlier_attempts: Vec<EarlierAttempt>,
}

/// The journal could not be read, or is not valid: the updater must not start.
#[derive(Debug, thiserror::Error)]
#[error(
    "journal {path} {why}. The updater does not start and infers nothing from the file system: as root, inspect \
     the journal, the active symlink /usr/local/bin/fleet-agent and the binaries in /usr/lib/harmony-fleet, then \
     repair as docs/updater.md (\"Root repair\") describes"
)]
pub struct JournalError {
    path: String,
    why: durable::ValidatedError,
}

/// What is wrong in a journal that parses (its own check, [`Journal::validate`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JournalInvalid {
    /// Another format.
    #[error("has format {0}; this updater reads format {JOURNAL_FORMAT}")]
    Format(u32),
    /// The attempt is not the one its digest names.
    #[error("attemptDigest does not match the attempt's canonical digest")]
    Digest,
    /// A link (named) is empty, too long or has control characters.
    #[error("{0} must be 1 to {LINK_MAX_BYTES} bytes without control characters")]
    Link(&'static str),
    /// The target link is not the target version's binary (the suffix it must end in).
    #[error("targetLink does not end in {0}")]
    TargetLink(String),
    /// The transition history.
    #[error(transparent)]
    History(#[from] durable::HistoryError),
    /// `startingAt` before the cutover.
    #[error("startingAt is set before the cutover began")]
    StartingAt,
    /// Too many earlier attempts.
    #[error("more than {MAX_EARLIER_ATTEMPTS} earlier attempts")]
    TooManyEarlier,
}

/// Writing the journal failed.
#[derive(Debug, thiserror::Error)]
#[error("writing journal {path} failed: {source}")]
pub struct JournalWriteError {
    path: String,
    source: std::io::Error,
}

fn check_link(name: &'static str, link: &str) -> Result<(), JournalInvalid> {
    if link.is_empty() || link.len() > LINK_MAX_BYTES || link.chars().any(|c| c.is_control()) {
        return Err(JournalInvalid::Link(name));
    }
    Ok(())
}

impl Journal {
    /// A new transaction in `preparing`.
    pub fn begin(
        attempt: AgentUpgradeAttempt,
        previous_link: String,
        target_link: String,
        earlier_attempts: Vec<EarlierAttempt>,
        now: Timestamp,
    ) -> Self {
        let mut transitions = Transitions::default();
        transitions.push(Transition {
            phase: JournalPhase::Preparing,
            at: now,
            reason: None,
        });
        Self {
            format: JOURNAL_FORMAT,
            attempt_digest: attempt.digest(),
            attempt,
            previous_link,
            target_link,
            phase: JournalPhase::Preparing,
            reason: None,
            detail: None,
            error: None,
            started_at: now,
            drain_duration_ms: None,
            starting_at: None,
            transitions,
            earlier_attempts,
        }
    }

    /// The earlier attempts a successor remembers: these plus this one, bounded.
    pub fn successor_history(&self) -> Vec<EarlierAttempt> {
        let mut v = self.earlier_attempts.clone();
        v.push(EarlierAttempt {
            attempt_id: self.attempt.attempt_id,
            attempt_digest: self.attempt_digest.clone(),
            phase: self.phase,
        });
        let excess = v.len().saturating_sub(MAX_EARLIER_ATTEMPTS);
        v.drain(..excess);
        v
    }

    /// Applies `event` at `now` (pure: the caller persists).
    pub fn apply(&mut self, event: Event, now: Timestamp) -> Result<(), IllegalTransition> {
        let (phase, reason) = machine::next(self.phase, event)?;
        self.phase = phase;
        self.reason = reason;
        self.transitions.push(Transition {
            phase,
            at: now,
            reason,
        });
        Ok(())
    }

    /// When the current phase was entered.
    pub fn phase_changed_at(&self) -> Timestamp {
        self.transitions.last().map_or(self.started_at, |t| t.at)
    }

    /// Checks everything deserialization cannot: format, digest binding, links, transition history.
    pub fn validate(&self) -> Result<(), JournalInvalid> {
        if self.format != JOURNAL_FORMAT {
            return Err(JournalInvalid::Format(self.format));
        }
        if self.attempt.digest() != self.attempt_digest {
            return Err(JournalInvalid::Digest);
        }
        check_link("previousLink", &self.previous_link)?;
        check_link("targetLink", &self.target_link)?;
        let suffix = format!("/fleet-agent-v{}", self.attempt.target_version);
        if !self.target_link.ends_with(&suffix) {
            return Err(JournalInvalid::TargetLink(suffix));
        }
        durable::check_history(
            self.transitions.as_slice(),
            |t| (t.phase, t.at, &t.reason),
            (self.phase, &self.reason),
            JournalPhase::Preparing,
            JournalPhase::can_move_to,
        )?;
        if let Some(at) = self.starting_at {
            if self.phase == JournalPhase::Preparing || at < self.started_at {
                return Err(JournalInvalid::StartingAt);
            }
        }
        if self.earlier_attempts.len() > MAX_EARLIER_ATTEMPTS {
            return Err(JournalInvalid::TooManyEarlier);
        }
        Ok(())
    }

    /// Parses and validates journal bytes; `origin` names the file in errors.
    pub fn parse(bytes: &[u8], origin: &str) -> Result<Self, JournalError> {
        durable::parse_validated(bytes).map_err(|why| JournalError {
            path: origin.into(),
            why,
        })
    }

    /// Reads the journal at `path`; `Ok(None)` when there is none (no transaction ever ran).
    pub fn load(path: &Path) -> Result<Option<Self>, JournalError> {
        durable::load_validated(path).map_err(|why| JournalError {
            path: path.display().to_string(),
            why,
        })
    }

    /// The file's bytes (pretty JSON, one trailing newline).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec_pretty(self).unwrap_or_default();
        v.push(b'\n');
        v
    }

    /// Writes the journal to `path` durably.
    pub fn store(&self, path: &Path) -> Result<(), JournalWriteError> {
        let err = |source| JournalWriteError {
            path: path.display().to_string(),
            source,
        };
        if let Some(dir) = path.parent() {
            durable::ensure_dir(dir, 0o700).map_err(err)?;
        }
        durable::write_atomic(path, &self.to_bytes(), 0o600).map_err(err)
    }

    /// The public status of this transaction. Its transitions are the journal's, with `activating` shown as
    /// `stopping` and, once the candidate was started, a `starting` transition right after it (kept after commit
    /// or rollback: a person reads what happened, in order).
    pub fn public(
        &self,
        boot_id: Option<Id128>,
        invocation_id: Option<Id128>,
        journal_unit: Option<UnitName>,
    ) -> AgentUpgradeStatus {
        let starting = |at| Transition {
            phase: UpgradePhase::Starting,
            at,
            reason: None,
        };
        let mut transitions = Transitions::default();
        for t in self.transitions.as_slice() {
            let phase = t.phase.public(CutoverStep::Stopping);
            let reason = match phase {
                UpgradePhase::Stopping => Some(UpgradeReason::Updater),
                _ => t.reason,
            };
            transitions.push(Transition {
                phase,
                at: t.at,
                reason,
            });
            if let (JournalPhase::Activating, Some(at)) = (t.phase, self.starting_at) {
                transitions.push(starting(at));
            }
        }
        let (mut phase, mut changed, mut reason) = (
            self.phase.public(CutoverStep::Stopping),
            self.phase_changed_at(),
            self.reason,
        );
        if phase == UpgradePhase::Stopping {
            reason = Some(UpgradeReason::Updater);
        }
        if let (JournalPhase::Activating, Some(at)) = (self.phase, self.starting_at) {
            phase = UpgradePhase::Starting;
            changed = at;
            reason = None;
        }
        AgentUpgradeStatus {
            device_id: self.attempt.device_id.clone(),
            attempt_id: Some(self.attempt.attempt_id),
            target_version: Some(self.attempt.target_version.clone()),
            attempt_digest: Some(self.attempt_digest.clone()),
            phase,
            reason,
            detail: self.detail.clone(),
            error: self.error.clone(),
            attempt_started_at: self.started_at,
            phase_changed_at: changed,
            drain_duration_ms: self.drain_duration_ms,
            boot_id,
            invocation_id,
            journal_unit,
            transitions,
        }
    }
}

impl durable::Validated for Journal {
    const MAX_BYTES: u64 = JOURNAL_MAX_BYTES;
    fn check(&self) -> Result<(), String> {
        self.validate().map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_wire::fixtures;

    fn journal() -> Journal {
        let a = fixtures::attempt();
        Journal::begin(
            a,
            "/usr/lib/harmony-fleet/fleet-agent-v1.1.0".into(),
            "/usr/lib/harmony-fleet/fleet-agent-v1.2.0".into(),
            vec![],
            fixtures::t(0),
        )
    }

    #[test]
    fn round_trips_and_validates() {
        let mut j = journal();
        j.apply(Event::Prepared, fixtures::t(10)).expect("legal");
        let back = Journal::parse(&j.to_bytes(), "t").expect("valid");
        assert_eq!(back, j);
        assert!(j.apply(Event::Prepared, fixtures::t(11)).is_err());
        let mut bad = j.clone();
        bad.attempt_digest = Sha256Hex::from_bytes([0; 32]);
        assert!(Journal::parse(&bad.to_bytes(), "t").is_err());
        let mut bad = j.clone();
        bad.phase = JournalPhase::Committed;
        assert!(Journal::parse(&bad.to_bytes(), "t").is_err());
        let mut v = serde_json::to_value(&j).expect("json");
        v["surprise"] = serde_json::json!(1);
        let e = Journal::parse(&serde_json::to_vec(&v).expect("json"), "/j")
            .expect_err("unknown field")
            .to_string();
        assert!(e.contains("/j") && e.contains("inspect"), "{e}");
    }

    #[test]
    fn public_status_follows_the_cutover_step_and_keeps_starting() {
        let mut j = journal();
        j.apply(Event::Prepared, fixtures::t(10)).expect("legal");
        let s = j.public(None, None, None);
        assert_eq!(s.phase, UpgradePhase::Stopping);
        j.starting_at = Some(fixtures::t(12));
        let s = j.public(None, None, None);
        assert_eq!(s.phase, UpgradePhase::Starting);
        assert_eq!(s.phase_changed_at, fixtures::t(12));
        let phases = |s: &AgentUpgradeStatus| -> Vec<UpgradePhase> {
            s.transitions.as_slice().iter().map(|t| t.phase).collect()
        };
        use UpgradePhase as P;
        assert_eq!(phases(&s), [P::Preparing, P::Stopping, P::Starting]);
        let back = Journal::parse(&j.to_bytes(), "t").expect("valid");
        assert_eq!(back.starting_at, Some(fixtures::t(12)));
        // Append-only: after commit (or a rollback) the history still shows `starting`, in order.
        let mut rolled = j.clone();
        j.apply(Event::Ready, fixtures::t(20)).expect("legal");
        let s = j.public(None, None, None);
        assert_eq!(s.phase, P::Complete);
        assert_eq!(
            phases(&s),
            [P::Preparing, P::Stopping, P::Starting, P::Complete]
        );
        rolled
            .apply(
                Event::CutoverFailed(UpgradeReason::StartFailed),
                fixtures::t(21),
            )
            .expect("legal");
        assert_eq!(
            phases(&rolled.public(None, None, None)),
            [P::Preparing, P::Stopping, P::Starting, P::RollingBack]
        );
        let mut bad = journal();
        bad.starting_at = Some(fixtures::t(12));
        assert!(Journal::parse(&bad.to_bytes(), "t").is_err());
    }
}
