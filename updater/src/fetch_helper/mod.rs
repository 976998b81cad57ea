//! The helper side of the artifact download: fetching a candidate agent artifact — a direct `https://` URL or
//! an anonymous `oci://` pull — bounded in bytes and time and verified by SHA-256 while streaming
//! (docs/artifacts.md). In production this code runs in the unprivileged `fleet-fetch` helper as the agent user
//! ([`serve`]); the root side (`crate::fetch_runner`) runs the helper, reads its bytes from a pipe, checks them
//! again and writes the file.

pub mod cli;
mod client;
mod download;
mod error;
mod https;
mod oci;
mod range;
pub mod rate;
mod serve;

pub use download::{stream_to_temp, ReadErrorMap, Streamed};
pub use error::FetchError;
pub use oci::{BLOB_MAX_REDIRECTS, TOKEN_MAX_BYTES, TOKEN_RESPONSE_MAX_BYTES};
pub use serve::serve;

use fleet_wire::fetch::ResumePoint;
use fleet_wire::fetch::CA_BUNDLE_MAX_BYTES;
use fleet_wire::limits::{HTTPS_CONNECT_TIMEOUT, HTTPS_REQUEST_TIMEOUT};
use fleet_wire::{AgentUpgradeAttempt, Artifact, Sha256Hex};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use std::io::Write;
use std::num::NonZeroU64;
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
    /// Bandwidth cap of the artifact's body, in bytes per second ([`rate`]); `None`: no cap.
    pub max_bytes_per_sec: Option<NonZeroU64>,
}

impl Default for FetchConfig {
    fn default() -> Self {
        Self {
            extra_roots: Vec::new(),
            connect_timeout: HTTPS_CONNECT_TIMEOUT,
            request_timeout: HTTPS_REQUEST_TIMEOUT,
            max_bytes_per_sec: None,
        }
    }
}

impl FetchConfig {
    /// Adds every certificate of the PEM bundle at `path` to the trusted roots (the system roots stay trusted).
    pub fn with_ca_file(self, path: &Path) -> Result<Self, FetchError> {
        let pem = read_ca_bundle(path)?;
        self.with_ca_pem(&pem, &path.display().to_string())
    }

    /// Adds every certificate of the PEM text `pem` (from `bundle`, for messages) to the trusted roots.
    pub fn with_ca_pem(mut self, pem: &str, bundle: &str) -> Result<Self, FetchError> {
        self.extra_roots.extend(parse_ca_pem(pem, bundle)?);
        Ok(self)
    }
}

/// Reads and checks the PEM bundle at `path` (at most [`CA_BUNDLE_MAX_BYTES`], at least one certificate).
pub fn read_ca_bundle(path: &Path) -> Result<String, FetchError> {
    let err = |detail: String| FetchError::CaFile {
        bundle: path.display().to_string(),
        detail,
    };
    // A CA bundle is small; refuse to read something that is not.
    let pem = crate::bounded::read_text(path, CA_BUNDLE_MAX_BYTES as u64).map_err(|e| {
        err(match e {
            crate::bounded::ReadError::Io { source, .. } => source.to_string(),
            crate::bounded::ReadError::TooLarge { max, .. } => {
                format!("larger than {max} bytes: too large for a CA bundle")
            }
        })
    })?;
    parse_ca_pem(&pem, &path.display().to_string())?;
    Ok(pem)
}

fn parse_ca_pem(pem: &str, bundle: &str) -> Result<Vec<CertificateDer<'static>>, FetchError> {
    let err = |detail: String| FetchError::CaFile {
        bundle: bundle.to_owned(),
        detail,
    };
    let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| err(e.to_string()))?;
    if certs.is_empty() {
        return Err(err("holds no PEM certificate".into()));
    }
    Ok(certs)
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

/// How a fetch begins: after which held bytes, and whether the start line is written first.
#[derive(Debug, Clone, Copy, Default)]
pub struct Start<'a> {
    /// Resume after these bytes (with these validators) when the server can continue them.
    pub resume: Option<&'a ResumePoint>,
    /// Write the start line (protocol 2) before the bytes.
    pub announce: bool,
}

/// Downloads `artifact` into `out`: the byte limit is enforced on a declared size before the body is read and
/// while streaming, and the SHA-256 is computed while streaming and compared with `sha256` whenever the whole
/// artifact is streamed (a resumed body is checked by the updater, which holds the beginning). `write_err` maps
/// a failed write to `out`. This is what `fleet-fetch` runs, as the agent user, writing to the updater's pipe.
pub fn fetch_to(
    artifact: &Artifact,
    sha256: &Sha256Hex,
    limit: u64,
    start: Start<'_>,
    cfg: &FetchConfig,
    out: &mut impl Write,
    write_err: impl Fn(std::io::Error) -> FetchError,
) -> Result<Streamed, FetchError> {
    let client = client::Client::new(cfg)?;
    let Start { resume, announce } = start;
    match artifact {
        Artifact::Https(url) => https::fetch(
            &client, url, sha256, limit, resume, announce, out, write_err,
        ),
        Artifact::Oci(r) => oci::fetch(&client, r, sha256, limit, resume, announce, out, write_err),
    }
}

/// Downloads the attempt's artifact in this process into a new temporary file in `tmp_dir` (mode 0600,
/// fsynced) with [`fetch_to`]'s checks. On any error no temporary file is left behind.
pub fn fetch(
    attempt: &AgentUpgradeAttempt,
    tmp_dir: &Path,
    cfg: &FetchConfig,
) -> Result<Fetched, FetchError> {
    let limit = attempt.effective_byte_limit();
    download::into_temp(tmp_dir, |file, io| {
        fetch_to(
            &attempt.artifact,
            &attempt.sha256,
            limit,
            Start::default(),
            cfg,
            file,
            io,
        )
    })
}
