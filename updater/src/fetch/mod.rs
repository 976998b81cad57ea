//! Fetching a candidate agent artifact — a direct `https://` URL or an anonymous `oci://` pull — into a new
//! temporary file, bounded in bytes and time and verified by SHA-256 while streaming (docs/artifacts.md).

mod client;
mod download;
mod error;
mod https;
mod oci;

pub use error::FetchError;
pub use oci::{BLOB_MAX_REDIRECTS, TOKEN_MAX_BYTES, TOKEN_RESPONSE_MAX_BYTES};

use fleet_wire::limits::{HTTPS_CONNECT_TIMEOUT, HTTPS_REQUEST_TIMEOUT};
use fleet_wire::{AgentUpgradeAttempt, Artifact, Sha256Hex};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How the updater reaches artifact servers.
#[derive(Debug, Clone)]
pub struct FetchConfig {
    /// Roots trusted in addition to the system store (`/etc/ssl/certs` via rustls-native-certs).
    pub extra_roots: Vec<CertificateDer<'static>>,
    /// TCP connect (and name resolution) time-out.
    pub connect_timeout: Duration,
    /// Bound on the whole fetch: every request of it, headers and body.
    pub request_timeout: Duration,
}

impl Default for FetchConfig {
    fn default() -> Self {
        Self {
            extra_roots: Vec::new(),
            connect_timeout: HTTPS_CONNECT_TIMEOUT,
            request_timeout: HTTPS_REQUEST_TIMEOUT,
        }
    }
}

impl FetchConfig {
    /// Adds every certificate of the PEM bundle at `path` to the trusted roots (the system roots stay trusted).
    pub fn with_ca_file(mut self, path: &Path) -> Result<Self, FetchError> {
        let err = |detail: String| FetchError::CaFile {
            path: path.to_owned(),
            detail,
        };
        // A CA bundle is small; refuse to parse something that is not.
        let meta = std::fs::metadata(path).map_err(|e| err(e.to_string()))?;
        if meta.len() > 4 * 1024 * 1024 {
            return Err(err(format!(
                "{} bytes is too large for a CA bundle",
                meta.len()
            )));
        }
        let certs = CertificateDer::pem_file_iter(path)
            .map_err(|e| err(e.to_string()))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| err(e.to_string()))?;
        if certs.is_empty() {
            return Err(err("holds no PEM certificate".into()));
        }
        self.extra_roots.extend(certs);
        Ok(self)
    }
}

/// A downloaded, verified artifact in a temporary file the caller now owns (and must rename or remove).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetched {
    /// The temporary file, inside the `tmp_dir` given to [`fetch`], mode 0600, fsynced.
    pub path: PathBuf,
    /// SHA-256 of its bytes (equal to the attempt's).
    pub sha256: Sha256Hex,
    /// Its size in bytes.
    pub bytes: u64,
}

/// Downloads the attempt's artifact into a new temporary file in `tmp_dir`.
///
/// The byte limit is `attempt.effective_byte_limit()`, enforced on a declared size before the body is read and
/// while streaming; the SHA-256 is computed while streaming and compared with `attempt.sha256`; the file is
/// fsynced. On any error no temporary file is left behind.
pub fn fetch(
    attempt: &AgentUpgradeAttempt,
    tmp_dir: &Path,
    cfg: &FetchConfig,
) -> Result<Fetched, FetchError> {
    let limit = attempt.effective_byte_limit();
    let client = client::Client::new(cfg)?;
    let result = match &attempt.artifact {
        Artifact::Https(url) => https::fetch(&client, url, &attempt.sha256, limit, tmp_dir),
        Artifact::Oci(r) => oci::fetch(&client, r, &attempt.sha256, limit, tmp_dir),
    };
    match &result {
        Ok(f) => log::info!(
            "attempt {}: fetched {} bytes, sha256 {} verified",
            attempt.attempt_id,
            f.bytes,
            f.sha256
        ),
        Err(e) => log::warn!("attempt {}: fetch failed: {e}", attempt.attempt_id),
    }
    result
}
