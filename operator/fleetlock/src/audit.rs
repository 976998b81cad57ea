//! The audit log: one JSON line per admin release or TTL expiry, appended and fsynced; rotated once at 10 MiB.

use fleet_wire::fleetlock::AuditRecord;
use std::io::Write;
use std::path::Path;

/// Size at which the log is rotated to `<path>.1`, in bytes.
pub const ROTATE_BYTES: u64 = 10 * 1024 * 1024;

/// Appends one record durably.
pub fn append(path: &Path, record: &AuditRecord) -> Result<(), String> {
    let io = |e: std::io::Error| format!("audit log {}: {e}", path.display());
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    if std::fs::metadata(path)
        .map(|m| m.len() > ROTATE_BYTES)
        .unwrap_or(false)
    {
        let mut old = path.as_os_str().to_owned();
        old.push(".1");
        std::fs::rename(path, old).map_err(io)?;
    }
    let mut line = serde_json::to_vec(record).map_err(|e| e.to_string())?;
    line.push(b'\n');
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(io)?;
    f.write_all(&line).map_err(io)?;
    f.sync_data().map_err(io)
}
