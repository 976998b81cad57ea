//! The reboot marker: written (durably) after the lock is taken and before the reboot, with the boot id of the
//! boot that asked. A marker with another boot id proves the reboot happened.

use fleet_wire::Timestamp;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::Path;

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

/// Reads the marker (`None` if there is none).
pub fn read(path: &Path) -> Result<Option<Marker>, String> {
    match std::fs::read(path) {
        Ok(b) if b.len() > 64 * 1024 => Err(format!("{}: too large", path.display())),
        Ok(b) => serde_json::from_slice(&b).map(Some).map_err(|e| {
            format!(
                "{}: does not parse ({e}); remove it to start over",
                path.display()
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// Writes the marker: temporary file, fsync, rename, directory fsync.
pub fn write(path: &Path, m: &Marker) -> Result<(), String> {
    let dir = path.parent().ok_or("marker path has no parent")?;
    let io = |e: std::io::Error| format!("{}: {e}", path.display());
    std::fs::create_dir_all(dir).map_err(io)?;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp).map_err(io)?;
    f.write_all(&serde_json::to_vec_pretty(m).map_err(|e| e.to_string())?)
        .map_err(io)?;
    f.sync_all().map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io)
}

/// Removes the marker durably.
pub fn remove(path: &Path) -> Result<(), String> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    }
    if let Some(dir) = path.parent() {
        let _ = std::fs::File::open(dir).and_then(|d| d.sync_all());
    }
    Ok(())
}
