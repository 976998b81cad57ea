//! The seam between the transaction and the artifact download: a small trait, with the production
//! implementation calling `crate::fetch` (HTTPS and OCI).

use fleet_wire::{AgentUpgradeAttempt, Sha256Hex, UpgradeReason};
use std::path::{Path, PathBuf};

/// A verified download: a new fsynced temporary file inside the directory the transaction gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Downloaded {
    /// The temporary file.
    pub path: PathBuf,
    /// Its SHA-256 (already checked against the attempt).
    pub sha256: Sha256Hex,
    /// Its size.
    pub bytes: u64,
}

/// A download failed; no temporary file is left behind.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct DownloadError {
    /// The typed reason for the status.
    pub reason: UpgradeReason,
    /// For a person.
    pub message: String,
}

/// Downloads an attempt's artifact into `tmp_dir`, enforcing its byte limit and SHA-256 while streaming.
pub trait Fetcher: Send + Sync {
    /// Fetches `attempt`'s artifact.
    fn fetch(
        &self,
        attempt: &AgentUpgradeAttempt,
        tmp_dir: &Path,
    ) -> Result<Downloaded, DownloadError>;
}

/// The production fetcher until the network download (`crate::fetch`) is wired in: every download fails.
#[derive(Debug, Clone, Default)]
pub struct NoNetwork;

impl Fetcher for NoNetwork {
    fn fetch(&self, _: &AgentUpgradeAttempt, _: &Path) -> Result<Downloaded, DownloadError> {
        Err(DownloadError {
            reason: UpgradeReason::DownloadFailed,
            message: "this updater build has no artifact download".into(),
        })
    }
}

/// The fetcher the daemon uses, trusting the PEM bundle `extra_ca_file` besides the system roots.
pub fn production(extra_ca_file: Option<&Path>) -> Result<Box<dyn Fetcher>, String> {
    if let Some(ca) = extra_ca_file {
        if !ca.is_file() {
            return Err(format!("extra_ca_file {} is not a file", ca.display()));
        }
    }
    Ok(Box::new(NoNetwork))
}
