//! The updater's durable state files: the crash-safe write itself is the tree's one implementation in
//! `fleet_wire::durable` (re-exported here); this module adds the versioned JSON files that check themselves.

pub use fleet_wire::durable::{
    ensure_dir, fsync_dir, install_atomic, replace_symlink, write_atomic,
};
use std::fs::File;
use std::io;
use std::path::Path;

/// A versioned JSON state file that checks itself after parsing (the two journals).
pub trait Validated: serde::de::DeserializeOwned {
    /// Largest file read, in bytes.
    const MAX_BYTES: u64;
    /// Checks what deserialization cannot.
    fn check(&self) -> Result<(), String>;
}

/// Parses and checks `bytes`; the error says why, for a message that names the file.
pub fn parse_validated<T: Validated>(bytes: &[u8]) -> Result<T, String> {
    if bytes.len() as u64 > T::MAX_BYTES {
        return Err(format!("is larger than {} bytes", T::MAX_BYTES));
    }
    let v: T = serde_json::from_slice(bytes).map_err(|e| format!("does not parse: {e}"))?;
    v.check().map_err(|e| format!("is not valid: {e}"))?;
    Ok(v)
}

/// Reads, parses and checks the file at `path`; `Ok(None)` when it does not exist.
pub fn load_validated<T: Validated>(path: &Path) -> Result<Option<T>, String> {
    use std::io::Read;
    let mut bytes = Vec::new();
    match File::open(path).and_then(|f| f.take(T::MAX_BYTES + 1).read_to_end(&mut bytes)) {
        Ok(_) => parse_validated(&bytes).map(Some),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("cannot be read: {e}")),
    }
}
