//! Installing a fetched candidate as `<root>/usr/lib/harmony-fleet/fleet-agent-v<version>` (0755, fsync, rename,
//! directory fsync), and re-verifying an already-present binary.

use crate::durable;
use fleet_wire::{Sha256Hex, UpgradeReason};
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::Path;

/// Installing or re-verifying failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct InstallError {
    /// `install-failed` or `digest-mismatch`.
    pub reason: UpgradeReason,
    /// For a person.
    pub message: String,
}

/// SHA-256 of the file at `path`, reading at most `limit` bytes (more is an error).
pub fn sha256_file(path: &Path, limit: u64) -> std::io::Result<(Sha256Hex, u64)> {
    let f = std::fs::File::open(path)?;
    let mut r = f.take(limit + 1);
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut n: u64 = 0;
    loop {
        let k = r.read(&mut buf)?;
        if k == 0 {
            break;
        }
        n += k as u64;
        if n > limit {
            return Err(std::io::Error::other(format!("larger than {limit} bytes")));
        }
        h.update(&buf[..k]);
    }
    Ok((Sha256Hex::from_bytes(h.finalize().into()), n))
}

/// Checks that the binary at `dest` has `sha256` (at most `limit` bytes).
pub fn reverify(dest: &Path, sha256: &Sha256Hex, limit: u64) -> Result<(), InstallError> {
    let (got, _) = sha256_file(dest, limit).map_err(|e| InstallError {
        reason: UpgradeReason::InstallFailed,
        message: format!("re-verifying {}: {e}", dest.display()),
    })?;
    if &got != sha256 {
        return Err(InstallError {
            reason: UpgradeReason::DigestMismatch,
            message: format!(
                "{} is already present with SHA-256 {got}, the attempt expects {sha256}; remove it as root",
                dest.display()
            ),
        });
    }
    Ok(())
}

/// Moves the verified download `fetched` to `dest` atomically and durably, mode 0755.
pub fn install(fetched: &Path, dest: &Path) -> Result<(), InstallError> {
    durable::install_atomic(fetched, dest, 0o755).map_err(|e| {
        let _ = std::fs::remove_file(fetched);
        InstallError {
            reason: UpgradeReason::InstallFailed,
            message: format!("installing {}: {e}", dest.display()),
        }
    })
}
