//! The durable journal of the current (or last) system-upgrade transaction, in its own file beside the
//! agent-upgrade journal: versioned JSON, unknown fields refused, validated on load, written with the shared
//! durable-write code (temp file + fsync + rename + directory fsync).

use super::machine::{self, Event, IllegalTransition};
use crate::durable;
use fleet_wire::{
    BoundedText, SystemJournalPhase, SystemUpgradeAttempt, SystemUpgradePhase, SystemUpgradeReason,
    SystemUpgradeStatus, Timestamp, Transition, Transitions,
};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The journal format this build writes and reads.
pub const FORMAT: u32 = 1;
/// Largest journal file read, in bytes.
pub const MAX_BYTES: u64 = 256 * 1024;
/// Earlier runs remembered, so a repeated run id is recognised and never runs apt again.
pub const MAX_EARLIER: usize = 64;
/// Longest boot id kept, in bytes (the kernel's is a 36-character UUID).
pub const MAX_BOOT_ID_BYTES: usize = 64;

/// One timed phase change of the journal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Step {
    /// The phase entered.
    pub phase: SystemJournalPhase,
    /// When.
    pub at: Timestamp,
    /// Why, for `repairing` and `failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<SystemUpgradeReason>,
}

/// A run finished before the current one: its identity and how it ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EarlierRun {
    /// The run UID (attempt id).
    pub run_uid: fleet_wire::AttemptId,
    /// How it ended.
    pub phase: SystemJournalPhase,
}

/// The journal file's content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SystemJournal {
    /// Always [`FORMAT`].
    pub format: u32,
    /// The attempt, as accepted.
    pub attempt: SystemUpgradeAttempt,
    /// The durable phase.
    pub phase: SystemJournalPhase,
    /// Why the phase was entered (repairing, failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<SystemUpgradeReason>,
    /// The latest error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<BoundedText>,
    /// The last lines apt/dpkg printed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_tail: Option<BoundedText>,
    /// Whether the upgrade needs (needed) a reboot.
    #[serde(default)]
    pub reboot_required: bool,
    /// When the attempt was accepted.
    pub accepted_at: Timestamp,
    /// The kernel's boot id of the boot that entered `rebooting`: a different boot id now means the reboot
    /// happened. Absent in journals written before it was recorded (and when the boot id could not be read):
    /// the coordinated-reboot client's marker decides then, as it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reboot_boot_id: Option<String>,
    /// The newest transitions (at most 16), oldest first; the last one is the current phase.
    pub transitions: Transitions<Step>,
    /// Runs finished before this one (at most 64), oldest first.
    #[serde(default)]
    pub earlier: Vec<EarlierRun>,
}

/// The journal could not be read or is not valid: the updater must not start.
#[derive(Debug, thiserror::Error)]
#[error(
    "system-upgrade journal {path} {why}. The updater does not start and infers nothing from the file system: as \
     root, inspect it (and `dpkg --audit`), then repair as docs/updater.md (\"Root repair\") describes"
)]
pub struct SystemJournalError {
    path: String,
    why: durable::ValidatedError,
}

/// What is wrong in a system-upgrade journal that parses (its own check, [`SystemJournal::validate`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SystemJournalInvalid {
    /// Another format.
    #[error("has format {0}; this updater reads format {FORMAT}")]
    Format(u32),
    /// The transition history.
    #[error(transparent)]
    History(#[from] durable::HistoryError),
    /// Too many earlier runs.
    #[error("more than {MAX_EARLIER} earlier runs")]
    TooManyEarlier,
    /// The boot id is empty or too long.
    #[error("has an empty boot id or one longer than {MAX_BOOT_ID_BYTES} bytes")]
    BootId,
}

impl SystemJournal {
    /// A new transaction in `accepted`.
    pub fn begin(attempt: SystemUpgradeAttempt, earlier: Vec<EarlierRun>, now: Timestamp) -> Self {
        let mut transitions = Transitions::default();
        transitions.push(Step {
            phase: SystemJournalPhase::Accepted,
            at: now,
            reason: None,
        });
        Self {
            format: FORMAT,
            attempt,
            phase: SystemJournalPhase::Accepted,
            reason: None,
            error: None,
            output_tail: None,
            reboot_required: false,
            accepted_at: now,
            reboot_boot_id: None,
            transitions,
            earlier,
        }
    }

    /// The earlier runs a successor remembers: these plus this one, bounded.
    pub fn successor_history(&self) -> Vec<EarlierRun> {
        let mut v = self.earlier.clone();
        v.push(EarlierRun {
            run_uid: self.attempt.run_uid,
            phase: self.phase,
        });
        let excess = v.len().saturating_sub(MAX_EARLIER);
        v.drain(..excess);
        v
    }

    /// Applies `event` at `now` (pure: the caller persists).
    pub fn apply(&mut self, event: Event, now: Timestamp) -> Result<(), IllegalTransition> {
        self.apply_in_boot(event, now, None)
    }

    /// Applies `event` at `now` in the boot `boot_id` (the kernel's, `None` if it could not be read), which is
    /// recorded when the event enters `rebooting` (pure: the caller persists).
    pub fn apply_in_boot(
        &mut self,
        event: Event,
        now: Timestamp,
        boot_id: Option<&str>,
    ) -> Result<(), IllegalTransition> {
        let (phase, reason) = machine::next(self.phase, event)?;
        if let Event::Upgraded { reboot } = event {
            self.reboot_required = reboot;
        }
        if phase == SystemJournalPhase::Rebooting && self.phase != phase {
            self.reboot_boot_id = boot_id
                .filter(|b| !b.is_empty() && b.len() <= MAX_BOOT_ID_BYTES)
                .map(str::to_owned);
        }
        self.phase = phase;
        self.reason = reason;
        self.transitions.push(Step {
            phase,
            at: now,
            reason,
        });
        Ok(())
    }

    /// Whether the reboot happened, seen from the boot `boot_id`: `Some(true)` when `rebooting` was entered in
    /// another boot, `Some(false)` in this one, `None` when no boot id was recorded.
    pub fn rebooted_since(&self, boot_id: &str) -> Option<bool> {
        self.reboot_boot_id.as_deref().map(|b| b != boot_id)
    }

    /// Checks what deserialization cannot: format, transition history.
    pub fn validate(&self) -> Result<(), SystemJournalInvalid> {
        if self.format != FORMAT {
            return Err(SystemJournalInvalid::Format(self.format));
        }
        durable::check_history(
            self.transitions.as_slice(),
            |t| (t.phase, t.at, &t.reason),
            (self.phase, &self.reason),
            SystemJournalPhase::Accepted,
            SystemJournalPhase::can_move_to,
        )?;
        if self.earlier.len() > MAX_EARLIER {
            return Err(SystemJournalInvalid::TooManyEarlier);
        }
        if self
            .reboot_boot_id
            .as_ref()
            .is_some_and(|b| b.is_empty() || b.len() > MAX_BOOT_ID_BYTES)
        {
            return Err(SystemJournalInvalid::BootId);
        }
        Ok(())
    }

    /// Parses and validates journal bytes; `origin` names the file in errors.
    pub fn parse(bytes: &[u8], origin: &str) -> Result<Self, SystemJournalError> {
        durable::parse_validated(bytes).map_err(|why| SystemJournalError {
            path: origin.into(),
            why,
        })
    }

    /// Reads the journal at `path`; `Ok(None)` when no system upgrade ever ran.
    pub fn load(path: &Path) -> Result<Option<Self>, SystemJournalError> {
        durable::load_validated(path).map_err(|why| SystemJournalError {
            path: path.display().to_string(),
            why,
        })
    }

    /// Writes the journal to `path` durably.
    pub fn store(&self, path: &Path) -> std::io::Result<()> {
        if let Some(dir) = path.parent() {
            durable::ensure_dir(dir, 0o700)?;
        }
        let mut bytes = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        bytes.push(b'\n');
        durable::write_atomic(path, &bytes, 0o600)
    }

    /// When the attempt ended, if it has.
    pub fn completed_at(&self) -> Option<Timestamp> {
        self.phase
            .is_terminal()
            .then(|| self.transitions.last().map_or(self.accepted_at, |t| t.at))
    }

    /// The public status. `detail` is in-memory progress.
    pub fn public(&self, detail: Option<&str>) -> SystemUpgradeStatus {
        let mut transitions: Transitions<Transition<SystemUpgradePhase>> = Transitions::default();
        for t in self.transitions.as_slice() {
            let phase = t.phase.public();
            // `repairing` is part of `upgrading` publicly: one entry.
            if transitions.last().map(|l| l.phase) != Some(phase) {
                transitions.push(Transition {
                    phase,
                    at: t.at,
                    reason: None,
                });
            }
        }
        SystemUpgradeStatus {
            run_uid: self.attempt.run_uid,
            device_id: self.attempt.device_id.clone(),
            phase: self.phase.public(),
            reason: self.reason.filter(|_| self.phase.is_terminal()),
            error: self.error.clone(),
            accepted_at: self.accepted_at,
            completed_at: self.completed_at(),
            first_heartbeat_after_completion: None,
            reboot_required: self.reboot_required,
            detail: detail.map(BoundedText::lossy),
            output_tail: self.output_tail.clone(),
            transitions,
        }
    }
}

impl durable::Validated for SystemJournal {
    const MAX_BYTES: u64 = MAX_BYTES;
    fn check(&self) -> Result<(), String> {
        self.validate().map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_wire::fixtures;

    #[test]
    fn round_trips_validates_and_maps_to_public() {
        let mut j = SystemJournal::begin(fixtures::system_attempt(), vec![], fixtures::t(10));
        j.apply(Event::Start, fixtures::t(11)).expect("legal");
        j.apply(
            Event::NeedsRepair(SystemUpgradeReason::Interrupted),
            fixtures::t(12),
        )
        .expect("legal");
        let bytes = serde_json::to_vec(&j).expect("json");
        assert_eq!(SystemJournal::parse(&bytes, "t").expect("valid"), j);
        let s = j.public(Some("running dpkg --configure -a"));
        assert_eq!(s.phase, SystemUpgradePhase::Upgrading);
        assert_eq!(s.reason, None, "reason only once terminal");
        assert_eq!(s.transitions.len(), 2);
        j.apply(
            Event::Repaired(SystemUpgradeReason::Interrupted),
            fixtures::t(13),
        )
        .expect("legal");
        let s = j.public(None);
        assert_eq!(
            (s.phase, s.reason, s.completed_at),
            (
                SystemUpgradePhase::Failed,
                Some(SystemUpgradeReason::Interrupted),
                Some(fixtures::t(13))
            )
        );
        let mut bad = j.clone();
        bad.phase = SystemJournalPhase::Succeeded;
        assert!(SystemJournal::parse(&serde_json::to_vec(&bad).expect("json"), "t").is_err());
        let mut v = serde_json::to_value(&j).expect("json");
        v["surprise"] = serde_json::json!(1);
        let e = SystemJournal::parse(&serde_json::to_vec(&v).expect("json"), "/j")
            .expect_err("unknown field")
            .to_string();
        assert!(e.contains("/j") && e.contains("inspect"), "{e}");
    }

    #[test]
    fn the_boot_that_entered_rebooting_is_recorded_and_old_journals_load_without_it() {
        let mut j = SystemJournal::begin(fixtures::system_attempt(), vec![], fixtures::t(10));
        j.apply_in_boot(Event::Start, fixtures::t(11), Some("boot-a"))
            .expect("legal");
        assert_eq!(
            j.reboot_boot_id, None,
            "recorded only on entering rebooting"
        );
        j.apply_in_boot(
            Event::Upgraded { reboot: true },
            fixtures::t(12),
            Some("boot-a"),
        )
        .expect("legal");
        assert_eq!(j.reboot_boot_id.as_deref(), Some("boot-a"));
        assert_eq!(j.rebooted_since("boot-a"), Some(false));
        assert_eq!(j.rebooted_since("boot-b"), Some(true));
        let bytes = serde_json::to_vec(&j).expect("json");
        assert_eq!(SystemJournal::parse(&bytes, "t").expect("valid"), j);
        // A journal written before the boot id was recorded loads; nothing is decided from it.
        let mut old = serde_json::to_value(&j).expect("json");
        old.as_object_mut().expect("object").remove("rebootBootId");
        let old = SystemJournal::parse(&serde_json::to_vec(&old).expect("json"), "t")
            .expect("an old journal loads");
        assert_eq!(
            (old.phase, old.rebooted_since("boot-b")),
            (SystemJournalPhase::Rebooting, None)
        );
        // An unreadable boot id records none; a too long one is refused on load.
        let mut k = SystemJournal::begin(fixtures::system_attempt(), vec![], fixtures::t(10));
        k.apply(Event::Start, fixtures::t(11)).expect("legal");
        k.apply(Event::Upgraded { reboot: true }, fixtures::t(12))
            .expect("legal");
        assert_eq!(k.rebooted_since("boot-b"), None);
        k.reboot_boot_id = Some("x".repeat(MAX_BOOT_ID_BYTES + 1));
        assert!(SystemJournal::parse(&serde_json::to_vec(&k).expect("json"), "t").is_err());
    }
}
