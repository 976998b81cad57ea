//! The reboot marker: written (durably) after the lock is taken and before the reboot, with the boot id of the
//! boot that asked. A marker with another boot id proves the reboot happened.

use super::system::FileError;
use fleet_wire::Timestamp;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The marker file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Marker {
    /// Format version (1).
    pub version: u32,
    /// Boot id of the boot that took the lock.
    pub boot_id: String,
    /// When the lock was taken.
    pub taken_at: Timestamp,
    /// The server and group it was taken from.
    pub server: String,
    /// The group.
    pub group: String,
}

/// The marker could not be read, written or removed; the text names the file.
#[derive(Debug, thiserror::Error)]
pub enum MarkerError {
    /// Reading, writing or removing it failed.
    #[error(transparent)]
    File(#[from] FileError),
    /// It is larger than any marker.
    #[error("{}: too large", .0.display())]
    TooLarge(PathBuf),
    /// It is not a marker.
    #[error("{}: does not parse ({source}); remove it to start over", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// The JSON error.
        source: serde_json::Error,
    },
    /// The path has no parent directory.
    #[error("marker path has no parent")]
    NoParent,
    /// The marker does not serialize.
    #[error(transparent)]
    Encode(serde_json::Error),
}

/// Reads the marker (`None` if there is none).
pub fn read(path: &Path) -> Result<Option<Marker>, MarkerError> {
    match std::fs::read(path) {
        Ok(b) if b.len() > 64 * 1024 => Err(MarkerError::TooLarge(path.to_path_buf())),
        Ok(b) => serde_json::from_slice(&b)
            .map(Some)
            .map_err(|source| MarkerError::Parse {
                path: path.to_path_buf(),
                source,
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(FileError::at(path)(e).into()),
    }
}

/// Writes the marker durably (the tree's one atomic write, `fleet_wire::durable`).
pub fn write(path: &Path, m: &Marker) -> Result<(), MarkerError> {
    let dir = path.parent().ok_or(MarkerError::NoParent)?;
    std::fs::create_dir_all(dir).map_err(FileError::at(path))?;
    let bytes = serde_json::to_vec_pretty(m).map_err(MarkerError::Encode)?;
    fleet_wire::durable::write_atomic(path, &bytes, 0o644).map_err(FileError::at(path))?;
    Ok(())
}

/// Removes the marker durably.
pub fn remove(path: &Path) -> Result<(), MarkerError> {
    fleet_wire::durable::remove(path).map_err(FileError::at(path))?;
    Ok(())
}
