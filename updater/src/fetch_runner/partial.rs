//! The updater's side of a resumable download: the bytes received so far for one artifact and the validators
//! of the response they came from, kept in the root-only download directory across link drops and updater
//! restarts. The SHA-256 state is rebuilt by re-hashing the held bytes when a partial download is reopened, so
//! the digest still binds the whole artifact; a partial file is handed out only once that digest matches.

use crate::durable::{self, Validated};
use crate::fetch_helper::{FetchError, Fetched};
use fleet_wire::fetch::{ResumePoint, Validators};
use fleet_wire::{Artifact, Sha256Hex};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The version of the state file's format.
pub const PARTIAL_FORMAT: u32 = 1;
/// Largest state file read, in bytes.
const STATE_MAX_BYTES: u64 = 16 * 1024;
/// Read buffer, as for every other stream of the artifact.
const BUF_BYTES: usize = 64 * 1024;

/// What is kept beside the held bytes: which artifact they belong to and the validators of the response they
/// came from. Written durably before any byte of that response is appended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PartialState {
    /// Always [`PARTIAL_FORMAT`].
    pub format: u32,
    /// Where the bytes come from.
    pub artifact: Artifact,
    /// The SHA-256 the whole artifact must have.
    pub sha256: Sha256Hex,
    /// The validators of the response the held bytes came from.
    pub validators: Validators,
}

impl Validated for PartialState {
    const MAX_BYTES: u64 = STATE_MAX_BYTES;
    fn check(&self) -> Result<(), String> {
        if self.format != PARTIAL_FORMAT {
            return Err(format!("format {} is not {PARTIAL_FORMAT}", self.format));
        }
        self.validators.validate().map_err(|e| e.to_string())
    }
}

/// The held bytes of one artifact's download and their running SHA-256.
pub struct Partial {
    part: PathBuf,
    state_path: PathBuf,
    file: File,
    hasher: Sha256,
    len: u64,
    limit: u64,
    artifact: Artifact,
    sha256: Sha256Hex,
    validators: Option<Validators>,
}

/// Whether `name` is one of the files this module keeps: `<64 hex>.part` or `<64 hex>.json`.
pub fn is_resumable_name(name: &str) -> bool {
    let Some((stem, ext)) = name.split_once('.') else {
        return false;
    };
    (ext == "part" || ext == "json")
        && stem.len() == 64
        && stem.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

impl Partial {
    /// Opens the partial download of `sha256` from `artifact` in `dir` (`<sha256>.part` and `<sha256>.json`,
    /// names derived from the validated digest): the held bytes are re-hashed; bytes without a state of the same
    /// artifact, or more than `limit`, are dropped. Partial downloads of other artifacts are removed, so the
    /// directory never holds more than one.
    pub fn open(
        dir: &Path,
        artifact: &Artifact,
        sha256: &Sha256Hex,
        limit: u64,
    ) -> Result<Self, FetchError> {
        let io = |source| FetchError::Io {
            target: dir.display().to_string(),
            source,
        };
        let part = dir.join(format!("{sha256}.part"));
        let state_path = dir.join(format!("{sha256}.json"));
        remove_others(dir, sha256);
        let state = match durable::load_validated::<PartialState>(&state_path) {
            Ok(Some(s)) if &s.artifact == artifact && &s.sha256 == sha256 => Some(s.validators),
            Ok(Some(_)) => {
                log::info!(
                    "{}: held bytes of another artifact URL; starting from zero",
                    part.display()
                );
                None
            }
            Ok(None) => None,
            Err(e) => {
                log::warn!("{} {e}; starting from zero", state_path.display());
                None
            }
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&part)
            .map_err(io)?;
        let mut p = Partial {
            part,
            state_path,
            file,
            hasher: Sha256::new(),
            len: 0,
            limit,
            artifact: artifact.clone(),
            sha256: sha256.clone(),
            validators: state,
        };
        if p.validators.is_none() {
            p.reset()?;
            return Ok(p);
        }
        p.rehash()?;
        if p.len > 0 {
            log::info!(
                "{}: {} bytes held from an earlier try, re-hashed",
                p.part.display(),
                p.len
            );
        }
        Ok(p)
    }

    fn io(&self, source: std::io::Error) -> FetchError {
        FetchError::Io {
            target: self.part.display().to_string(),
            source,
        }
    }

    /// Rebuilds the SHA-256 state from the held bytes; more than the limit drops them.
    fn rehash(&mut self) -> Result<(), FetchError> {
        self.file.seek(SeekFrom::Start(0)).map_err(|e| self.io(e))?;
        let mut hasher = Sha256::new();
        let mut len: u64 = 0;
        let mut buf = vec![0u8; BUF_BYTES];
        let mut r = (&self.file).take(self.limit + 1);
        loop {
            let n = match r.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.io(e)),
            };
            hasher.update(&buf[..n]);
            len += n as u64;
        }
        if len > self.limit {
            return self.reset();
        }
        self.file
            .seek(SeekFrom::Start(len))
            .map_err(|e| self.io(e))?;
        self.hasher = hasher;
        self.len = len;
        Ok(())
    }

    /// Bytes held.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether no byte is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Where a download resumes: after the held bytes, with their validators (`None`: from zero).
    pub fn resume_point(&self) -> Option<ResumePoint> {
        let validators = self.validators.clone()?;
        (self.len > 0).then_some(ResumePoint {
            offset: self.len,
            validators,
        })
    }

    /// Drops the held bytes and their state: the next download starts from zero.
    pub fn reset(&mut self) -> Result<(), FetchError> {
        self.file.set_len(0).map_err(|e| self.io(e))?;
        self.file.seek(SeekFrom::Start(0)).map_err(|e| self.io(e))?;
        self.file.sync_all().map_err(|e| self.io(e))?;
        self.hasher = Sha256::new();
        self.len = 0;
        self.validators = None;
        match std::fs::remove_file(&self.state_path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(self.io(e)),
        }
        Ok(())
    }

    /// Starts taking the bytes of a response that begins at `start.offset` (0: the whole artifact, the held
    /// bytes are dropped; otherwise exactly the held length). The validators are stored durably before any
    /// byte of the response is appended, so held bytes always carry the validators they came with.
    pub fn begin(&mut self, start: &ResumePoint) -> Result<(), FetchError> {
        if start.offset == 0 {
            self.reset()?;
        } else if start.offset != self.len || self.validators.is_none() {
            return Err(FetchError::Helper(format!(
                "it resumed at byte {}, the updater holds {}",
                start.offset, self.len
            )));
        }
        start
            .validators
            .validate()
            .map_err(|e| FetchError::Helper(format!("its start line: {e}")))?;
        if let Some(total) = start.validators.total.filter(|t| *t > self.limit) {
            return Err(FetchError::DeclaredTooLarge {
                declared: total,
                limit: self.limit,
            });
        }
        if self.validators.as_ref() != Some(&start.validators) {
            let state = PartialState {
                format: PARTIAL_FORMAT,
                artifact: self.artifact.clone(),
                sha256: self.sha256.clone(),
                validators: start.validators.clone(),
            };
            let json = serde_json::to_vec(&state).map_err(|e| self.io(std::io::Error::other(e)))?;
            durable::write_atomic(&self.state_path, &json, 0o600).map_err(|e| self.io(e))?;
            self.validators = Some(start.validators.clone());
        }
        Ok(())
    }

    /// Appends `body` to the held bytes through a fixed buffer, hashing on the way; more than the limit in all
    /// fails. Returns how many bytes this call appended, also on error (through `appended`).
    pub fn append_from(
        &mut self,
        mut body: impl Read,
        appended: &mut u64,
    ) -> Result<(), FetchError> {
        let mut buf = vec![0u8; BUF_BYTES];
        loop {
            let n = match body.read(&mut buf) {
                Ok(0) => return Ok(()),
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    return Err(FetchError::Transport {
                        url: "the download helper's pipe".into(),
                        detail: e.to_string(),
                        transient: false,
                    })
                }
            };
            if self.len + n as u64 > self.limit {
                return Err(FetchError::StreamedTooLarge { limit: self.limit });
            }
            self.file.write_all(&buf[..n]).map_err(|e| self.io(e))?;
            self.hasher.update(&buf[..n]);
            self.len += n as u64;
            *appended += n as u64;
        }
    }

    /// Makes the held bytes durable (after a failed try, so that a restart finds them).
    pub fn sync(&mut self) -> Result<(), FetchError> {
        self.file.sync_data().map_err(|e| self.io(e))
    }

    /// The SHA-256 of the held bytes.
    pub fn sha256(&self) -> Sha256Hex {
        Sha256Hex::from_bytes(self.hasher.clone().finalize().into())
    }

    /// Hands out the held bytes as a verified download once their SHA-256 is the artifact's: fsynced, the state
    /// removed; the caller now owns the file (installs it by rename or removes it) and drops this value.
    /// Otherwise a digest mismatch, and nothing changes.
    pub fn finish(&mut self) -> Result<Fetched, FetchError> {
        let actual = self.sha256();
        if actual != self.sha256 {
            return Err(FetchError::DigestMismatch {
                what: "artifact",
                expected: self.sha256.clone(),
                actual,
            });
        }
        self.file.sync_all().map_err(|e| self.io(e))?;
        let _ = std::fs::remove_file(&self.state_path);
        Ok(Fetched {
            path: self.part.clone(),
            sha256: actual,
            bytes: self.len,
        })
    }

    /// Removes the held bytes and their state.
    pub fn discard(self) {
        for p in [&self.state_path, &self.part] {
            match std::fs::remove_file(p) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => log::warn!("cannot remove {}: {e}", p.display()),
            }
        }
    }

    /// Keeps the held bytes for a later try (durably), or removes them when there are none.
    pub fn keep(mut self) {
        if self.len == 0 || self.validators.is_none() {
            return self.discard();
        }
        if let Err(e) = self.sync() {
            log::warn!("{e}");
        }
    }
}

/// Removes the partial downloads of other artifacts (only names this module creates).
fn remove_others(dir: &Path, keep: &Sha256Hex) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let ours = keep.to_string();
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        if is_resumable_name(name) && !name.starts_with(&ours) {
            log::info!("removing the partial download {name} of another artifact");
            let _ = std::fs::remove_file(e.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_wire::fixtures;

    fn sha(b: &[u8]) -> Sha256Hex {
        Sha256Hex::from_bytes(Sha256::digest(b).into())
    }

    fn validators(etag: &str) -> Validators {
        Validators {
            total: Some(10),
            etag: Some(etag.into()),
            last_modified: None,
        }
    }

    fn point(offset: u64, etag: &str) -> ResumePoint {
        ResumePoint {
            offset,
            validators: validators(etag),
        }
    }

    #[test]
    fn held_bytes_survive_a_reopen_and_the_digest_binds_the_whole() {
        let dir = tempfile::tempdir().expect("tmp");
        let data = b"0123456789";
        let a = fixtures::attempt().artifact;
        let mut p = Partial::open(dir.path(), &a, &sha(data), 10).expect("open");
        assert_eq!(p.resume_point(), None);
        p.begin(&point(0, "\"e\"")).expect("begin");
        let mut n = 0;
        p.append_from(&data[..4], &mut n).expect("append");
        assert_eq!(n, 4);
        p.keep();

        // As after an updater restart: the held bytes are re-hashed and resumed with their validators.
        let mut p = Partial::open(dir.path(), &a, &sha(data), 10).expect("reopen");
        assert_eq!(p.resume_point(), Some(point(4, "\"e\"")));
        let e = p.begin(&point(3, "\"e\"")).expect_err("wrong offset");
        assert!(matches!(e, FetchError::Helper(_)), "{e}");
        p.begin(&point(4, "\"e\"")).expect("resume");
        p.append_from(&data[4..], &mut n).expect("append");
        let f = p.finish().expect("verified");
        assert_eq!(std::fs::read(&f.path).expect("read"), data);
        assert_eq!((f.bytes, f.sha256), (10, sha(data)));
        assert!(!dir.path().join(format!("{}.json", sha(data))).exists());
    }

    #[test]
    fn wrong_bytes_never_finish_and_limits_hold() {
        let dir = tempfile::tempdir().expect("tmp");
        let a = fixtures::attempt().artifact;
        let mut p = Partial::open(dir.path(), &a, &sha(b"right"), 5).expect("open");
        p.begin(&point(0, "\"e\""))
            .expect_err("total 10 above the limit 5");
        p.begin(&ResumePoint::default()).expect("no total");
        let mut n = 0;
        p.append_from(&b"wrong"[..], &mut n).expect("append");
        let e = p.finish().expect_err("mismatch");
        assert!(matches!(e, FetchError::DigestMismatch { .. }), "{e}");
        let e = p
            .append_from(&b"x"[..], &mut n)
            .expect_err("over the limit");
        assert!(
            matches!(e, FetchError::StreamedTooLarge { limit: 5 }),
            "{e}"
        );
        p.discard();
        assert_eq!(std::fs::read_dir(dir.path()).expect("ls").count(), 0);
    }

    #[test]
    fn bytes_of_another_artifact_or_without_state_start_over() {
        let dir = tempfile::tempdir().expect("tmp");
        let data = b"0123456789";
        let a = fixtures::attempt().artifact;
        let mut p = Partial::open(dir.path(), &a, &sha(data), 10).expect("open");
        p.begin(&point(0, "\"e\"")).expect("begin");
        p.append_from(&data[..4], &mut 0).expect("append");
        p.keep();
        // Another URL for the same digest: not resumed.
        let other: Artifact = "https://elsewhere.example.com/agent".parse().expect("url");
        let p = Partial::open(dir.path(), &other, &sha(data), 10).expect("open");
        assert_eq!((p.len(), p.resume_point()), (0, None));
        p.keep();
        // Bytes without a state (a corrupt one): not resumed.
        let mut p = Partial::open(dir.path(), &a, &sha(data), 10).expect("open");
        p.begin(&point(0, "\"e\"")).expect("begin");
        p.append_from(&data[..4], &mut 0).expect("append");
        p.keep();
        std::fs::write(dir.path().join(format!("{}.json", sha(data))), b"{").expect("corrupt");
        let p = Partial::open(dir.path(), &a, &sha(data), 10).expect("open");
        assert_eq!(p.resume_point(), None);
        p.keep();
        // Another artifact's partial download is removed; foreign names are left alone.
        let mut p = Partial::open(dir.path(), &a, &sha(data), 10).expect("open");
        p.begin(&point(0, "\"e\"")).expect("begin");
        p.append_from(&data[..4], &mut 0).expect("append");
        p.keep();
        std::fs::write(dir.path().join("unrelated"), b"x").expect("write");
        let q = Partial::open(dir.path(), &a, &sha(b"other"), 10).expect("open");
        q.keep();
        let mut left: Vec<_> = std::fs::read_dir(dir.path())
            .expect("ls")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, vec!["unrelated".to_string()]);
    }

    #[test]
    fn partial_names() {
        assert!(is_resumable_name(&format!("{}.part", "a".repeat(64))));
        assert!(is_resumable_name(&format!("{}.json", "0".repeat(64))));
        assert!(!is_resumable_name(&format!("{}.part", "A".repeat(64))));
        assert!(!is_resumable_name(".fleet-fetch-1-2-3.part"));
        assert!(!is_resumable_name(&format!("{}.tmp", "a".repeat(64))));
    }
}
