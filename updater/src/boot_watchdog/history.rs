//! The record of watchdog reboots, kept across boots in `/var/lib/fleet-boot-watchdog/reboots.json` and written
//! durably before every reboot: what the loop cap counts.

use crate::durable;
use crate::reboot::system::FileError;
use fleet_wire::Timestamp;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Records kept (the newest); far more than any sensible cap.
pub const MAX_RECORDS: usize = 64;
/// Largest record file read, in bytes.
pub const MAX_BYTES: u64 = 64 * 1024;

/// Watchdog reboots, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct History {
    /// When each watchdog reboot was requested (UTC).
    pub reboots: Vec<Timestamp>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    version: u32,
    #[serde(flatten)]
    history: History,
}

impl History {
    /// Adds a reboot at `now`, dropping the oldest beyond [`MAX_RECORDS`].
    pub fn record(&mut self, now: Timestamp) {
        self.reboots.push(now);
        let excess = self.reboots.len().saturating_sub(MAX_RECORDS);
        self.reboots.drain(..excess);
    }
}

/// The record could not be read or written; the text names the file.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    /// Reading it failed (not a missing file: that is an empty record).
    #[error(transparent)]
    Read(#[from] crate::bounded::ReadError),
    /// It is not a record.
    #[error("{}: {source}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// The JSON error.
        source: serde_json::Error,
    },
    /// A version this program does not know.
    #[error("{}: unknown version {version}", path.display())]
    Version {
        /// The file.
        path: PathBuf,
        /// Its version.
        version: u32,
    },
    /// The path has no parent directory.
    #[error("{}: no parent directory", .0.display())]
    NoParent(PathBuf),
    /// Writing it (or its directory) failed.
    #[error(transparent)]
    Write(#[from] FileError),
    /// The record does not serialize.
    #[error(transparent)]
    Encode(serde_json::Error),
}

/// Reads the record; a missing file is an empty record.
pub fn load(path: &Path) -> Result<History, HistoryError> {
    let raw = match crate::bounded::read(path, MAX_BYTES) {
        Ok(raw) => raw,
        Err(e) if e.is_not_found() => return Ok(History::default()),
        Err(e) => return Err(e.into()),
    };
    let file: File = serde_json::from_slice(&raw).map_err(|source| HistoryError::Parse {
        path: path.to_path_buf(),
        source,
    })?;
    if file.version != 1 {
        return Err(HistoryError::Version {
            path: path.to_path_buf(),
            version: file.version,
        });
    }
    Ok(file.history)
}

/// Writes the record durably (temporary file, fsync, rename, directory fsync).
pub fn save(path: &Path, history: &History) -> Result<(), HistoryError> {
    let dir = path
        .parent()
        .ok_or_else(|| HistoryError::NoParent(path.to_path_buf()))?;
    durable::ensure_dir(dir, 0o755).map_err(FileError::at(dir))?;
    let file = File {
        version: 1,
        history: history.clone(),
    };
    let bytes = serde_json::to_vec(&file).map_err(HistoryError::Encode)?;
    durable::write_atomic(path, &bytes, 0o644).map_err(FileError::at(path))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_bounded_and_refusals() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state/reboots.json");
        assert_eq!(load(&path).expect("missing is empty"), History::default());
        let mut h = History::default();
        for i in 0..70 {
            h.record(Timestamp::from_unix_ms(1_000 + i));
        }
        assert_eq!(h.reboots.len(), MAX_RECORDS);
        assert_eq!(h.reboots[0], Timestamp::from_unix_ms(1_006));
        save(&path, &h).expect("save");
        assert_eq!(load(&path).expect("load"), h);
        std::fs::write(&path, br#"{"version":2,"reboots":[]}"#).expect("write");
        assert!(load(&path)
            .expect_err("version")
            .to_string()
            .contains("unknown version 2"));
        std::fs::write(&path, b"{").expect("write");
        assert!(load(&path).is_err());
        std::fs::write(&path, vec![b' '; MAX_BYTES as usize + 1]).expect("write");
        assert!(load(&path)
            .expect_err("size")
            .to_string()
            .contains("larger than"));
    }
}
