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

/// The production fetcher: HTTPS and anonymous OCI pulls through [`crate::fetch`].
#[derive(Debug, Clone)]
pub struct NetworkFetcher {
    cfg: crate::fetch::FetchConfig,
}

impl Fetcher for NetworkFetcher {
    fn fetch(
        &self,
        attempt: &AgentUpgradeAttempt,
        tmp_dir: &Path,
    ) -> Result<Downloaded, DownloadError> {
        crate::fetch::fetch(attempt, tmp_dir, &self.cfg)
            .map(|f| Downloaded {
                path: f.path,
                sha256: f.sha256,
                bytes: f.bytes,
            })
            .map_err(|e| DownloadError {
                reason: e.reason(),
                message: e.to_string(),
            })
    }
}

/// The fetcher the daemon uses, trusting the PEM bundle `extra_ca_file` besides the system roots.
pub fn production(extra_ca_file: Option<&Path>) -> Result<Box<dyn Fetcher>, String> {
    let mut cfg = crate::fetch::FetchConfig::default();
    if let Some(ca) = extra_ca_file {
        cfg = cfg
            .with_ca_file(ca)
            .map_err(|e| format!("extra_ca_file: {e}"))?;
    }
    Ok(Box::new(NetworkFetcher { cfg }))
}
