//! The seam between the transaction and the artifact download: a small trait, with the production
//! implementation running the `fleet-fetch` helper (`crate::fetch::helper`) as the agent user.

use crate::child;
use crate::fetch::{stream_to_temp, FetchError};
use crate::users;
use fleet_wire::fetch::FETCH_FAILURE_MAX_BYTES;
use fleet_wire::limits::HTTPS_REQUEST_TIMEOUT;
use fleet_wire::{
    AgentUpgradeAttempt, ByteLimit, FetchFailure, FetchRequest, Sha256Hex, UpgradeReason,
};
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

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

impl From<&FetchError> for DownloadError {
    fn from(e: &FetchError) -> Self {
        DownloadError {
            reason: e.reason(),
            message: e.to_string(),
        }
    }
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

/// The production fetcher: runs the `fleet-fetch` helper as the agent user and writes what it streams into a
/// temporary file, enforcing the byte limit and the SHA-256 again on this side. The root updater so never parses
/// an artifact server's TLS, HTTP or OCI answers, and a compromised helper can do no more than fail the download.
#[derive(Debug, Clone)]
pub struct HelperFetcher {
    program: PathBuf,
    user: String,
    extra_roots_pem: Option<String>,
    bound: Duration,
}

/// The helper's whole run is bounded: its own deadline for the fetch, plus time to report.
pub const HELPER_BOUND: Duration = Duration::from_secs(HTTPS_REQUEST_TIMEOUT.as_secs() + 30);

/// The fetcher the daemon uses: the helper `program` run as `user`, trusting the PEM bundle `extra_ca_file`
/// (read and checked now, as root) besides the system roots.
pub fn production(
    program: PathBuf,
    user: &str,
    extra_ca_file: Option<&Path>,
) -> Result<HelperFetcher, String> {
    let extra_roots_pem = extra_ca_file
        .map(crate::fetch::read_ca_bundle)
        .transpose()
        .map_err(|e| format!("extra_ca_file: {e}"))?;
    Ok(HelperFetcher {
        program,
        user: user.to_owned(),
        extra_roots_pem,
        bound: HELPER_BOUND,
    })
}

impl HelperFetcher {
    /// The same fetcher with another bound on the helper's run (tests).
    pub fn with_bound(mut self, bound: Duration) -> Self {
        self.bound = bound;
        self
    }

    fn command(&self) -> Result<Command, DownloadError> {
        let user = users::user_by_name(&self.user)
            .map_err(|e| download_failed(format!("download helper user: {e}")))?;
        let mut cmd = Command::new(&self.program);
        child::as_user(&mut cmd, &user);
        // The system roots' location, if the service sets it, holds for the helper too.
        for var in ["SSL_CERT_FILE", "SSL_CERT_DIR"] {
            if let Some(v) = std::env::var_os(var) {
                cmd.env(var, v);
            }
        }
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        Ok(cmd)
    }
}

fn download_failed(message: String) -> DownloadError {
    DownloadError {
        reason: UpgradeReason::DownloadFailed,
        message,
    }
}

impl Fetcher for HelperFetcher {
    fn fetch(
        &self,
        attempt: &AgentUpgradeAttempt,
        tmp_dir: &Path,
    ) -> Result<Downloaded, DownloadError> {
        let limit = attempt.effective_byte_limit();
        let request = FetchRequest::new(
            attempt.artifact.clone(),
            attempt.sha256.clone(),
            ByteLimit::try_from(limit).map_err(|e| download_failed(e.to_string()))?,
            self.extra_roots_pem.clone(),
        );
        let mut line = serde_json::to_vec(&request)
            .map_err(|e| download_failed(format!("encoding the fetch request: {e}")))?;
        line.push(b'\n');
        let program = self.program.display().to_string();
        let mut proc = self.command()?.spawn().map_err(|e| {
            download_failed(format!(
                "cannot start the download helper {program}: {e} (it is installed beside fleet-updater)"
            ))
        })?;
        let pid = proc.id();
        let watchdog = child::Watchdog::start(pid, self.bound);
        let stderr = proc
            .stderr
            .take()
            .map(|e| child::reader(e, FETCH_FAILURE_MAX_BYTES));
        // The helper reads its whole request before writing anything; a helper that died early shows in its status.
        if let Some(mut stdin) = proc.stdin.take() {
            let _ = stdin.write_all(&line);
        }
        let received = match proc.stdout.take() {
            Some(out) => stream_to_temp(
                out,
                tmp_dir,
                limit,
                &attempt.sha256,
                "artifact",
                |e: std::io::Error| FetchError::Transport {
                    url: "the download helper's pipe".into(),
                    detail: e.to_string(),
                },
            ),
            None => Err(FetchError::Invalid(
                "no pipe from the download helper".into(),
            )),
        };
        if received.is_err() {
            // Too much, or the wrong bytes: the helper has nothing more to say.
            child::kill_group(pid);
        }
        let status = proc.wait();
        let timed_out = watchdog.stop();
        child::kill_group(pid);
        let stderr = stderr.and_then(|h| h.join().ok()).unwrap_or_default();
        let reported = last_line(&stderr).and_then(|l| FetchFailure::parse(l).ok());
        let verdict = match (&status, &received) {
            _ if timed_out => Err(download_failed(format!(
                "the download did not finish within {:?}; the helper was killed",
                self.bound
            ))),
            (Err(e), _) => Err(download_failed(format!("waiting for {program}: {e}"))),
            (Ok(s), Ok(_)) if s.success() => Ok(()),
            // This side's checks failed: too many bytes (the helper was stopped), or wrong bytes from a
            // helper that claims success.
            (Ok(s), Err(e)) if s.success() || matches!(e, FetchError::StreamedTooLarge { .. }) => {
                Err(e.into())
            }
            // The helper failed: its own account is the most precise one.
            (Ok(s), _) => Err(match reported {
                Some(f) => DownloadError {
                    reason: f.download_reason(),
                    message: f.message.to_string(),
                },
                None => download_failed(format!(
                    "the download helper {program} failed ({s}): {}",
                    String::from_utf8_lossy(last_line(&stderr).unwrap_or_default())
                )),
            }),
        };
        if let (Err(_), Ok(f)) = (&verdict, &received) {
            // Bytes this side accepted, but the run as a whole failed: they are not installed.
            let _ = std::fs::remove_file(&f.path);
        }
        match verdict.and_then(|()| received.map_err(|e| DownloadError::from(&e))) {
            Ok(f) => {
                log::info!(
                    "attempt {}: fetched {} bytes, sha256 {} verified",
                    attempt.attempt_id,
                    f.bytes,
                    f.sha256
                );
                Ok(Downloaded {
                    path: f.path,
                    sha256: f.sha256,
                    bytes: f.bytes,
                })
            }
            Err(e) => {
                log::warn!("attempt {}: download failed: {e}", attempt.attempt_id);
                Err(e)
            }
        }
    }
}

/// The last non-empty line of a helper's stderr (its failure report comes last).
fn last_line(stderr: &[u8]) -> Option<&[u8]> {
    stderr
        .split(|&b| b == b'\n')
        .rev()
        .find(|l| !l.trim_ascii().is_empty())
}
