//! Streams a body through a fixed buffer with the byte limit and SHA-256 checked on the way: to the helper's
//! stdout, or into a new temporary file (fsynced, removed again on any error) on the updater's side.

use super::{FetchError, Fetched};
use fleet_wire::fetch::ResumePoint;
use fleet_wire::Sha256Hex;
use sha2::{Digest, Sha256};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Read buffer: fixed, so memory stays flat whatever the artifact size.
const BUF_BYTES: usize = 64 * 1024;

/// A temporary file that is removed on drop unless [`TempFile::keep`] was called.
pub(crate) struct TempFile {
    path: PathBuf,
    file: Option<File>,
}

impl TempFile {
    /// Creates `.fleet-fetch-<pid>-<n>.part` (mode 0600, never an existing file) in `dir`.
    pub(crate) fn create(dir: &Path) -> Result<Self, FetchError> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let io = |source| FetchError::Io {
            target: dir.display().to_string(),
            source,
        };
        let mut last = None;
        for _ in 0..16 {
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0);
            let path = dir.join(format!(
                ".fleet-fetch-{}-{n}-{nanos:08x}.part",
                std::process::id()
            ));
            match OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
            {
                Ok(file) => {
                    return Ok(Self {
                        path,
                        file: Some(file),
                    })
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
                Err(e) => return Err(io(e)),
            }
        }
        Err(io(last.unwrap_or_else(|| {
            std::io::Error::other("no free temporary file name")
        })))
    }

    /// Keeps the file and returns its path.
    fn keep(mut self) -> PathBuf {
        self.file = None;
        std::mem::take(&mut self.path)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.path.as_os_str().is_empty() {
            self.file = None;
            if let Err(e) = std::fs::remove_file(&self.path) {
                log::warn!("cannot remove {}: {e}", self.path.display());
            }
        }
    }
}

/// Where a streamed body's read errors are mapped (network) versus write errors (disk).
pub trait ReadErrorMap {
    /// Maps an error from the body reader.
    fn map(&self, e: std::io::Error) -> FetchError;
}

impl<F: Fn(std::io::Error) -> FetchError> ReadErrorMap for F {
    fn map(&self, e: std::io::Error) -> FetchError {
        self(e)
    }
}

/// A body streamed through the checks: its SHA-256 (equal to the one expected) and size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Streamed {
    /// SHA-256 of the bytes.
    pub sha256: Sha256Hex,
    /// How many bytes.
    pub bytes: u64,
}

/// Writes the helper's start line (protocol 2): where the bytes that follow begin, and their validators.
pub(crate) fn begin(
    out: &mut impl Write,
    start: &ResumePoint,
    write_err: impl Fn(std::io::Error) -> FetchError,
) -> Result<(), FetchError> {
    let mut line = serde_json::to_vec(start).map_err(|e| write_err(std::io::Error::other(e)))?;
    line.push(b'\n');
    out.write_all(&line).map_err(write_err)
}

/// Copies `body` to `out` through a fixed buffer, failing once more than `limit` bytes arrive, then checks the
/// SHA-256 against `expected` if given (`what` names it in the error; a resumed body is only part of what the
/// digest covers, so the updater checks it on the whole). `write_err` maps a failed write to `out`.
pub(crate) fn stream(
    body: impl Read,
    out: &mut impl Write,
    limit: u64,
    expected: Option<&Sha256Hex>,
    what: &'static str,
    read_err: impl ReadErrorMap,
    write_err: impl Fn(std::io::Error) -> FetchError,
) -> Result<Streamed, FetchError> {
    let mut hasher = Sha256::new();
    let mut total: u64 = 0;
    // One more byte than the limit tells an oversize body from one of exactly the limit.
    let mut body = body.take(limit.saturating_add(1));
    let mut buf = vec![0u8; BUF_BYTES];
    loop {
        let n = match body.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(read_err.map(e)),
        };
        total += n as u64;
        if total > limit {
            return Err(FetchError::StreamedTooLarge { limit });
        }
        let chunk = &buf[..n];
        hasher.update(chunk);
        out.write_all(chunk).map_err(&write_err)?;
    }
    out.flush().map_err(&write_err)?;
    let actual = Sha256Hex::from_bytes(hasher.finalize().into());
    if let Some(expected) = expected.filter(|e| **e != actual) {
        return Err(FetchError::DigestMismatch {
            what,
            expected: expected.clone(),
            actual,
        });
    }
    Ok(Streamed {
        sha256: actual,
        bytes: total,
    })
}

/// Runs `write` on a new temporary file in `dir` (giving it the error mapping for the file), then fsyncs the
/// file. On any error the file is removed again.
pub fn into_temp(
    dir: &Path,
    write: impl FnOnce(&mut File, &dyn Fn(std::io::Error) -> FetchError) -> Result<Streamed, FetchError>,
) -> Result<Fetched, FetchError> {
    let mut tmp = TempFile::create(dir)?;
    let io = |source| FetchError::Io {
        target: dir.display().to_string(),
        source,
    };
    let streamed = {
        let file = tmp
            .file
            .as_mut()
            .ok_or_else(|| io(std::io::Error::other("temporary file already closed")))?;
        let s = write(file, &io)?;
        file.sync_all().map_err(io)?;
        s
    };
    Ok(Fetched {
        path: tmp.keep(),
        sha256: streamed.sha256,
        bytes: streamed.bytes,
    })
}

/// Streams `body` into a new temporary file in `dir` with [`stream`]'s checks (see [`into_temp`]).
pub fn stream_to_temp(
    body: impl Read,
    dir: &Path,
    limit: u64,
    expected: &Sha256Hex,
    what: &'static str,
    read_err: impl ReadErrorMap,
) -> Result<Fetched, FetchError> {
    into_temp(dir, |file, io| {
        stream(body, file, limit, Some(expected), what, read_err, io)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sha(b: &[u8]) -> Sha256Hex {
        Sha256Hex::from_bytes(Sha256::digest(b).into())
    }

    fn no_read_err(e: std::io::Error) -> FetchError {
        FetchError::Transport {
            url: "test".into(),
            detail: e.to_string(),
            transient: true,
        }
    }

    #[test]
    fn streams_exact_limit_and_refuses_one_more() {
        let dir = tempfile::tempdir().expect("tmp");
        let data = vec![7u8; 200_000];
        let f = stream_to_temp(
            &data[..],
            dir.path(),
            200_000,
            &sha(&data),
            "artifact",
            no_read_err,
        )
        .expect("exact limit");
        assert_eq!(f.bytes, 200_000);
        assert_eq!(std::fs::read(&f.path).expect("read"), data);
        std::fs::remove_file(&f.path).expect("rm");
        let e = stream_to_temp(
            &data[..],
            dir.path(),
            199_999,
            &sha(&data),
            "artifact",
            no_read_err,
        )
        .expect_err("over");
        assert!(
            matches!(e, FetchError::StreamedTooLarge { limit: 199_999 }),
            "{e}"
        );
        let e = stream_to_temp(
            &data[..],
            dir.path(),
            1 << 20,
            &sha(b"x"),
            "artifact",
            no_read_err,
        )
        .expect_err("digest");
        assert!(matches!(e, FetchError::DigestMismatch { .. }), "{e}");
        assert_eq!(
            std::fs::read_dir(dir.path()).expect("ls").count(),
            0,
            "temp files left"
        );
    }
}
