//! The updater's durable state files: the crash-safe write itself is the tree's one implementation in
//! `fleet_wire::durable` (re-exported here); this module adds the versioned JSON files that check themselves.

pub use fleet_wire::durable::{
    ensure_dir, fsync_dir, install_atomic, remove_stale_temps, replace_symlink, write_atomic,
};
use std::fs::File;
use std::io;
use std::path::Path;

/// A transition history that breaks a rule of [`check_history`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HistoryError {
    /// The newest transition is not the current phase and reason.
    #[error("the last transition does not match phase and reason")]
    LastMismatch,
    /// A complete history does not start at the first phase (named).
    #[error("the first transition is not {0}")]
    First(String),
    /// A step the machine does not allow (phases named).
    #[error("illegal transition {from} -> {to}")]
    Illegal {
        /// The phase left.
        from: String,
        /// The phase entered.
        to: String,
    },
    /// A step goes back in time.
    #[error("transitions are not in time order")]
    TimeOrder,
}

/// A state file that cannot be used: the text follows the file's name ("journal X is larger than …").
#[derive(Debug, thiserror::Error)]
pub enum ValidatedError {
    /// Larger than its bound.
    #[error("is larger than {0} bytes")]
    TooLarge(u64),
    /// Not JSON of its shape.
    #[error("does not parse: {0}")]
    Parse(serde_json::Error),
    /// Parsed, but its own check failed.
    #[error("is not valid: {0}")]
    Invalid(String),
    /// It could not be read.
    #[error("cannot be read: {0}")]
    Read(io::Error),
}

/// Checks a journal's transition history (oldest first): the last entry is the current `phase` and `reason`, the
/// first is `first` unless older entries were dropped (the history holds the newest 16), every step is `legal`
/// and none goes back in time. Shared by the agent-upgrade and system-upgrade journals.
pub fn check_history<T, P, R>(
    steps: &[T],
    parts: impl Fn(&T) -> (P, fleet_wire::Timestamp, &Option<R>),
    current: (P, &Option<R>),
    first: P,
    legal: impl Fn(P, P) -> bool,
) -> Result<(), HistoryError>
where
    P: Copy + PartialEq + std::fmt::Debug,
    R: PartialEq,
{
    match steps.last().map(&parts) {
        Some((phase, _, reason)) if phase == current.0 && reason == current.1 => {}
        _ => return Err(HistoryError::LastMismatch),
    }
    if steps.len() < fleet_wire::limits::MAX_TRANSITIONS
        && steps.first().map(|s| parts(s).0) != Some(first)
    {
        return Err(HistoryError::First(format!("{first:?}")));
    }
    for w in steps.windows(2) {
        let ((from, at0, _), (to, at1, _)) = (parts(&w[0]), parts(&w[1]));
        if !legal(from, to) {
            return Err(HistoryError::Illegal {
                from: format!("{from:?}"),
                to: format!("{to:?}"),
            });
        }
        if at1 < at0 {
            return Err(HistoryError::TimeOrder);
        }
    }
    Ok(())
}

/// A versioned JSON state file that checks itself after parsing (the two journals).
pub trait Validated: serde::de::DeserializeOwned {
    /// Largest file read, in bytes.
    const MAX_BYTES: u64;
    /// Checks what deserialization cannot.
    fn check(&self) -> Result<(), String>;
}

/// Parses and checks `bytes`; the error says why, for a message that names the file.
pub fn parse_validated<T: Validated>(bytes: &[u8]) -> Result<T, ValidatedError> {
    if bytes.len() as u64 > T::MAX_BYTES {
        return Err(ValidatedError::TooLarge(T::MAX_BYTES));
    }
    let v: T = serde_json::from_slice(bytes).map_err(ValidatedError::Parse)?;
    v.check().map_err(ValidatedError::Invalid)?;
    Ok(v)
}

/// Reads, parses and checks the file at `path`; `Ok(None)` when it does not exist.
pub fn load_validated<T: Validated>(path: &Path) -> Result<Option<T>, ValidatedError> {
    use std::io::Read;
    let mut bytes = Vec::new();
    match File::open(path).and_then(|f| f.take(T::MAX_BYTES + 1).read_to_end(&mut bytes)) {
        Ok(_) => parse_validated(&bytes).map(Some),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(ValidatedError::Read(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::{check_history, HistoryError};
    use fleet_wire::fixtures::t;
    use fleet_wire::JournalPhase::{self, *};

    fn check(steps: &[(JournalPhase, u64)], current: JournalPhase) -> Result<(), HistoryError> {
        let steps: Vec<(JournalPhase, fleet_wire::Timestamp, Option<()>)> =
            steps.iter().map(|(p, s)| (*p, t(*s), None)).collect();
        check_history(
            &steps,
            |s| (s.0, s.1, &s.2),
            (current, &None),
            Preparing,
            JournalPhase::can_move_to,
        )
    }

    #[test]
    fn history_rules() {
        check(
            &[(Preparing, 0), (Activating, 1), (Committed, 2)],
            Committed,
        )
        .expect("legal");
        for (steps, current, why) in [
            (&[(Preparing, 0), (Activating, 1)][..], Committed, "last"),
            (&[(Activating, 0)][..], Activating, "first"),
            (&[(Preparing, 0), (Committed, 1)][..], Committed, "illegal"),
            (
                &[(Preparing, 5), (Activating, 1)][..],
                Activating,
                "time order",
            ),
            (&[][..], Preparing, "last"),
        ] {
            let e = check(steps, current).expect_err(why).to_string();
            assert!(e.contains(why), "{e}");
        }
    }
}
