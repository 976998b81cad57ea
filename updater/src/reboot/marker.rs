//! The reboot marker: written (durably) after the lock is taken and before the reboot, with the boot id of the
//! boot that asked. A marker with another boot id proves the reboot happened.

use fleet_wire::Timestamp;
use serde::{Deserialize, Serialize};
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

/// Writes the marker durably (the tree's one atomic write, `fleet_wire::durable`).
pub fn write(path: &Path, m: &Marker) -> Result<(), String> {
    let dir = path.parent().ok_or("marker path has no parent")?;
    let io = |e: std::io::Error| format!("{}: {e}", path.display());
    std::fs::create_dir_all(dir).map_err(io)?;
    let bytes = serde_json::to_vec_pretty(m).map_err(|e| e.to_string())?;
    fleet_wire::durable::write_atomic(path, &bytes, 0o644).map_err(io)
}

/// Removes the marker durably.
pub fn remove(path: &Path) -> Result<(), String> {
    fleet_wire::durable::remove(path).map_err(|e| format!("{}: {e}", path.display()))
}
