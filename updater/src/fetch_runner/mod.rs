//! The root side of the artifact download, and the seam between the transaction and it: a small trait, with
//! the production implementation running the unprivileged `fleet-fetch` helper (`crate::fetch_helper`) as the
//! agent user, resuming after the bytes already held ([`partial`]) when a try fails on the way.

pub mod partial;

use crate::child;
use crate::fetch_helper::FetchError;
use crate::users;
use fleet_wire::fetch::{ResumePoint, FETCH_FAILURE_MAX_BYTES, RESUME_POINT_MAX_BYTES};
use fleet_wire::limits::HTTPS_REQUEST_TIMEOUT;
use fleet_wire::{
    AgentUpgradeAttempt, ByteLimit, FetchFailure, FetchRequest, Sha256Hex, UpgradeReason,
};
use partial::Partial;
use std::io::{BufRead, BufReader, Read, Write};
use std::num::NonZeroU64;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A verified download: an fsynced file inside the directory the transaction gave, which the caller installs by
/// rename (or removes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Downloaded {
    /// The temporary file.
    pub path: PathBuf,
    /// Its SHA-256 (already checked against the attempt).
    pub sha256: Sha256Hex,
    /// Its size.
    pub bytes: u64,
}

/// A download failed; bytes are left behind only as a partial download a later fetch of the same artifact
/// resumes (after a failure that may pass), never as a file the caller could install.
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

/// The production fetcher: runs the `fleet-fetch` helper as the agent user and appends what it streams to the
/// artifact's partial download, enforcing the byte limit and the SHA-256 again on this side. The root updater so
/// never parses an artifact server's TLS, HTTP or OCI answers, and a compromised helper can do no more than fail
/// the download. A try that fails on the way (a dropped link, a time-out, a 5xx) is followed by another that
/// resumes after the bytes held, with backoff, within one deadline for the whole fetch.
#[derive(Debug, Clone)]
pub struct HelperFetcher {
    program: PathBuf,
    user: String,
    extra_roots_pem: Option<String>,
    deadline: Duration,
    margin: Duration,
    retry: Retry,
    resume: bool,
    max_bytes_per_sec: Option<NonZeroU64>,
}

/// Time a helper has, past the fetch's deadline, to report and exit before it is killed.
pub const HELPER_MARGIN: Duration = Duration::from_secs(30);

/// How often and how soon a failed try is followed by another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    /// Most tries of one fetch in all.
    pub max_tries: u32,
    /// Most tries in a row that add no byte beyond the most ever held (bytes a server sends again from zero
    /// are not progress).
    pub max_fruitless: u32,
    /// Pause after the first failure in a row; doubled after each further one.
    pub first_backoff: Duration,
    /// Longest pause.
    pub max_backoff: Duration,
}

impl Default for Retry {
    fn default() -> Self {
        Self {
            max_tries: 32,
            max_fruitless: 6,
            first_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(30),
        }
    }
}

impl Retry {
    /// The pause after the `in_a_row`-th failure in a row (1 = the first; a try that received bytes ends a
    /// row).
    pub fn backoff(&self, in_a_row: u32) -> Duration {
        let doublings = in_a_row.saturating_sub(1).min(16);
        self.first_backoff
            .saturating_mul(1 << doublings)
            .min(self.max_backoff)
    }

    /// What follows a failed try that may pass, given the count so far: another try after a pause, or the end.
    /// Pure, so the schedule the docs state is a unit test.
    pub fn after_failure(&self, count: &mut TryCount, progressed: bool) -> Option<Duration> {
        count.tries += 1;
        if progressed {
            count.fruitless = 0;
            count.in_a_row = 1;
        } else {
            count.fruitless += 1;
            count.in_a_row += 1;
        }
        (count.tries < self.max_tries && count.fruitless < self.max_fruitless)
            .then(|| self.backoff(count.in_a_row))
    }
}

/// Tries of one fetch so far, as [`Retry::after_failure`] counts them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TryCount {
    /// Tries that failed.
    pub tries: u32,
    /// Failed tries in a row that added no byte beyond the most ever held.
    pub fruitless: u32,
    /// Failures in a row for the pause (a try that added bytes starts a new row at 1).
    pub in_a_row: u32,
}

/// The fetcher the daemon uses: the helper `program` run as `user`, trusting the PEM bundle `extra_ca_file`
/// (read and checked now, as root) besides the system roots.
pub fn production(
    program: PathBuf,
    user: &str,
    extra_ca_file: Option<&Path>,
) -> Result<HelperFetcher, String> {
    let extra_roots_pem = extra_ca_file
        .map(crate::fetch_helper::read_ca_bundle)
        .transpose()
        .map_err(|e| format!("extra_ca_file: {e}"))?;
    Ok(HelperFetcher {
        program,
        user: user.to_owned(),
        extra_roots_pem,
        deadline: HTTPS_REQUEST_TIMEOUT,
        margin: HELPER_MARGIN,
        retry: Retry::default(),
        resume: true,
        max_bytes_per_sec: None,
    })
}

/// One helper run, as this side saw it.
struct Try {
    /// Whether the helper streamed every byte and this side accepted them.
    outcome: Result<(), DownloadError>,
    /// Whether another try may pass.
    transient: bool,
    /// Bytes appended to the partial download.
    appended: u64,
    /// Where the helper's bytes began (0: from zero).
    began_at: Option<u64>,
}

impl HelperFetcher {
    /// The same fetcher with another network deadline for the whole fetch and another margin for the helper
    /// to report past it (tests).
    pub fn with_deadline(mut self, deadline: Duration, margin: Duration) -> Self {
        self.deadline = deadline;
        self.margin = margin;
        self
    }

    /// The same fetcher with another retry policy (tests, benchmarks).
    pub fn with_retry(mut self, retry: Retry) -> Self {
        self.retry = retry;
        self
    }

    /// The same fetcher with resuming on or off; off, every try starts from zero (the benchmark's reference for
    /// what resuming saves).
    pub fn with_resume(mut self, resume: bool) -> Self {
        self.resume = resume;
        self
    }

    /// The same fetcher with a bandwidth cap on the artifact's body, in bytes per second (the configuration's
    /// `download_max_bytes_per_sec`; `None`: no cap); the helper applies it to every try.
    pub fn with_max_bytes_per_sec(mut self, cap: Option<NonZeroU64>) -> Self {
        self.max_bytes_per_sec = cap;
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

    /// Runs the helper once, resuming after what `partial` holds, with `left` of the network deadline.
    fn try_once(
        &self,
        attempt: &AgentUpgradeAttempt,
        partial: &mut Partial,
        left: Duration,
    ) -> Try {
        let failed = |e: DownloadError, transient: bool| Try {
            outcome: Err(e),
            transient,
            appended: 0,
            began_at: None,
        };
        let limit = attempt.effective_byte_limit();
        let byte_limit = match ByteLimit::try_from(limit) {
            Ok(l) => l,
            Err(e) => return failed(download_failed(e.to_string()), false),
        };
        let mut request = FetchRequest::new(
            attempt.artifact.clone(),
            attempt.sha256.clone(),
            byte_limit,
            self.extra_roots_pem.clone(),
        );
        request.resume = partial.resume_point().filter(|_| self.resume);
        request.time_left_ms = Some(u64::try_from(left.as_millis()).unwrap_or(u64::MAX));
        request.max_bytes_per_sec = self.max_bytes_per_sec.map(NonZeroU64::get);
        let mut line = match serde_json::to_vec(&request) {
            Ok(l) => l,
            Err(e) => {
                return failed(
                    download_failed(format!("encoding the fetch request: {e}")),
                    false,
                )
            }
        };
        line.push(b'\n');
        let program = self.program.display().to_string();
        let mut proc = match self.command().and_then(|mut c| {
            c.spawn().map_err(|e| {
                download_failed(format!(
                    "cannot start the download helper {program}: {e} (it is installed beside fleet-updater)"
                ))
            })
        }) {
            Ok(p) => p,
            Err(e) => return failed(e, false),
        };
        let pid = proc.id();
        let bound = left + self.margin;
        let watchdog = child::Watchdog::start(pid, bound);
        let stderr = proc
            .stderr
            .take()
            .map(|e| child::reader(e, FETCH_FAILURE_MAX_BYTES));
        // The helper reads its whole request before writing anything; a helper that died early shows in its status.
        if let Some(mut stdin) = proc.stdin.take() {
            let _ = stdin.write_all(&line);
        }
        let mut appended = 0;
        let mut began_at = None;
        let received = match proc.stdout.take() {
            Some(out) => {
                let mut out = BufReader::new(out);
                read_start(&mut out).and_then(|start| match start {
                    // Nothing at all: the helper failed before a response; its report says why.
                    None => Ok(false),
                    Some(start) => {
                        partial.begin(&start)?;
                        began_at = Some(start.offset);
                        partial.append_from(out, &mut appended).map(|()| true)
                    }
                })
            }
            None => Err(FetchError::Invalid(
                "no pipe from the download helper".into(),
            )),
        };
        if received.is_err() {
            // Too much, a broken start line, or a pipe or disk failure: the helper has nothing more to say.
            child::kill_group(pid);
        }
        let status = proc.wait();
        let timed_out = watchdog.stop();
        child::kill_group(pid);
        let stderr = stderr.and_then(|h| h.join().ok()).unwrap_or_default();
        let reported = last_line(&stderr).and_then(|l| FetchFailure::parse(l).ok());
        let (outcome, transient) = match (&status, received) {
            // Past the deadline: the bytes so far are kept for a later attempt to resume.
            _ if timed_out => (
                Err(download_failed(format!(
                    "the helper was killed at the download's deadline (its try had {} s left)",
                    bound.as_secs_f64().round()
                ))),
                true,
            ),
            (Err(e), _) => (
                Err(download_failed(format!("waiting for {program}: {e}"))),
                false,
            ),
            (Ok(s), Ok(true)) if s.success() => (Ok(()), false),
            (Ok(s), Ok(false)) if s.success() => (
                Err(download_failed(format!(
                    "the download helper {program} exited without sending the artifact"
                ))),
                false,
            ),
            // This side's checks failed (and stopped the helper): too many bytes, a broken start line, the
            // disk.
            (Ok(_), Err(e)) => (Err(DownloadError::from(&e)), false),
            // The helper failed: its own account is the most precise one.
            (Ok(s), _) => match reported {
                Some(f) => (
                    Err(DownloadError {
                        reason: f.download_reason(),
                        message: f.message.to_string(),
                    }),
                    f.transient && f.download_reason() == UpgradeReason::DownloadFailed,
                ),
                None => (
                    Err(download_failed(format!(
                        "the download helper {program} failed ({s}): {}",
                        String::from_utf8_lossy(last_line(&stderr).unwrap_or_default())
                    ))),
                    false,
                ),
            },
        };
        Try {
            outcome,
            transient,
            appended,
            began_at,
        }
    }
}

/// Reads the helper's start line (at most `RESUME_POINT_MAX_BYTES` and a newline); `None` when the pipe ends
/// before any byte.
fn read_start(out: &mut impl BufRead) -> Result<Option<ResumePoint>, FetchError> {
    let mut line = Vec::new();
    out.take(RESUME_POINT_MAX_BYTES as u64 + 1)
        .read_until(b'\n', &mut line)
        .map_err(|e| FetchError::Transport {
            url: "the download helper's pipe".into(),
            detail: e.to_string(),
            transient: false,
        })?;
    if line.is_empty() {
        return Ok(None);
    }
    if line.last() != Some(&b'\n') {
        return Err(FetchError::Helper("it sent no start line".into()));
    }
    ResumePoint::parse(line.trim_ascii_end())
        .map(Some)
        .map_err(|e| FetchError::Helper(format!("its start line: {e}")))
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
        let id = &attempt.attempt_id;
        let deadline = Instant::now() + self.deadline;
        let mut partial = Partial::open(
            tmp_dir,
            &attempt.artifact,
            &attempt.sha256,
            attempt.effective_byte_limit(),
        )
        .map_err(|e| DownloadError::from(&e))?;
        if let Some(cap) = self.max_bytes_per_sec {
            log::info!(
                "attempt {id}: downloading at most {cap} bytes/s (download_max_bytes_per_sec), {} bytes held",
                partial.len()
            );
        }
        let mut tries = 0u32;
        let mut count = TryCount::default();
        // The most bytes ever held: a server that ignores Range sends the same bytes from zero again, which
        // is no progress.
        let mut most_held = partial.len();
        let mut resumed = false;
        let mut restarted_after_mismatch = false;
        let mut last: Option<DownloadError> = None;
        let result = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let last = last.map(|e| format!("{e}; ")).unwrap_or_default();
                break Err((
                    download_failed(format!(
                        "{last}the download did not finish within {:?} ({tries} tries); {} bytes are kept to resume",
                        self.deadline,
                        partial.len()
                    )),
                    true,
                ));
            }
            tries += 1;
            let t = self.try_once(attempt, &mut partial, left);
            resumed |= t.began_at.is_some_and(|o| o > 0);
            match t.outcome {
                Ok(()) => match partial.finish() {
                    Ok(f) => break Ok(f),
                    Err(e) => {
                        // Spliced bytes that do not add up (content changed under the same validators): once,
                        // the whole artifact from zero decides.
                        if resumed && !restarted_after_mismatch {
                            log::warn!(
                                "attempt {id}: {e} after resuming; downloading again from zero"
                            );
                            restarted_after_mismatch = true;
                            resumed = false;
                            if let Err(e) = partial.reset() {
                                break Err((DownloadError::from(&e), false));
                            }
                            continue;
                        }
                        break Err((DownloadError::from(&e), false));
                    }
                },
                Err(e) => {
                    let progressed = partial.len() > most_held;
                    most_held = most_held.max(partial.len());
                    let next = if t.transient {
                        self.retry.after_failure(&mut count, progressed)
                    } else {
                        None
                    };
                    let Some(pause) = next else {
                        break Err((e, t.transient));
                    };
                    let pause = pause.min(deadline.saturating_duration_since(Instant::now()));
                    log::info!(
                        "attempt {id}: download try {tries} failed after {} bytes received ({e}); {} bytes held, next try in {pause:?}",
                        t.appended,
                        partial.len()
                    );
                    std::thread::sleep(pause);
                    last = Some(e);
                }
            }
        };
        match result {
            Ok(f) => {
                log::info!(
                    "attempt {id}: fetched {} bytes in {tries} tries, sha256 {} verified",
                    f.bytes,
                    f.sha256
                );
                Ok(Downloaded {
                    path: f.path,
                    sha256: f.sha256,
                    bytes: f.bytes,
                })
            }
            Err((e, keep)) => {
                if keep {
                    partial.keep();
                } else {
                    partial.discard();
                }
                log::warn!("attempt {id}: download failed: {e}");
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let r = Retry::default();
        let table = [
            (0, 1),
            (1, 1),
            (2, 2),
            (3, 4),
            (4, 8),
            (5, 16),
            (6, 30),
            (40, 30),
        ];
        for (n, secs) in table {
            assert_eq!(
                r.backoff(n),
                Duration::from_secs(secs),
                "failure {n} in a row"
            );
        }
    }

    #[test]
    fn the_default_schedule_is_the_documented_one() {
        // docs/artifacts.md: after failures that receive nothing, 6 tries with pauses of 1, 2, 4, 8 and 16 s.
        let r = Retry::default();
        let mut count = TryCount::default();
        let mut pauses = Vec::new();
        while let Some(p) = r.after_failure(&mut count, false) {
            pauses.push(p.as_secs());
        }
        assert_eq!(count.tries, 6);
        assert_eq!(pauses, [1, 2, 4, 8, 16]);
        // A try that adds bytes starts the row again; 32 tries in all at most.
        let mut count = TryCount::default();
        let mut tries = 1;
        while r.after_failure(&mut count, tries % 3 == 0).is_some() {
            tries += 1;
        }
        assert_eq!((tries, count.tries), (32, 32));
        let mut count = TryCount::default();
        assert_eq!(
            r.after_failure(&mut count, true),
            Some(Duration::from_secs(1))
        );
        assert_eq!(
            r.after_failure(&mut count, false),
            Some(Duration::from_secs(2))
        );
    }

    #[test]
    fn start_lines() {
        let mut ok = &b"{\"offset\":0,\"validators\":{\"total\":3}}\nabc"[..];
        let p = read_start(&mut ok).expect("parses").expect("a line");
        assert_eq!(p.validators.total, Some(3));
        assert_eq!(ok, b"abc", "the bytes after the line stay in the reader");
        assert_eq!(read_start(&mut &b""[..]).expect("empty"), None);
        for bad in [
            &b"raw artifact bytes"[..],
            b"{\"offset\":1}\n",
            b"not json\n",
        ] {
            let e = read_start(&mut &bad[..]).expect_err("refused");
            assert!(matches!(e, FetchError::Helper(_)), "{e}");
        }
        let long = vec![b'x'; RESUME_POINT_MAX_BYTES + 10];
        assert!(read_start(&mut &long[..]).is_err());
    }
}
