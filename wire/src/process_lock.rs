//! The process lock every device daemon takes before it touches its state: an exclusive `flock` (std's
//! `File::try_lock`) on a file of its state directory, held for the process lifetime and released by the kernel
//! when the process exits, however it exits.

use std::fs::{File, OpenOptions, TryLockError};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The held lock; released when dropped or when the process exits.
#[derive(Debug)]
pub struct ProcessLock {
    _file: File,
    path: PathBuf,
}

/// Why the lock could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another process of the same program holds it.
    #[error("another {program} holds {path}; only one may run (stop it first: systemctl stop {program})")]
    Held {
        /// The lock file.
        path: PathBuf,
        /// The program (and unit) name, for the message.
        program: &'static str,
    },
    /// The file could not be opened.
    #[error("cannot open lock file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

impl ProcessLock {
    /// Takes the lock on `path` for `program` without waiting, creating the file and its directory when missing.
    pub fn acquire(path: &Path, program: &'static str) -> Result<Self, LockError> {
        let io = |source| LockError::Io {
            path: path.to_owned(),
            source,
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        // std opens with O_CLOEXEC: a child (systemctl, the download helper) never inherits the lock.
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(path)
            .map_err(io)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                return Err(LockError::Held {
                    path: path.to_owned(),
                    program,
                })
            }
            Err(TryLockError::Error(e)) => return Err(io(e)),
        }
        Ok(Self {
            _file: file,
            path: path.to_owned(),
        })
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_lock_is_refused() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("run/x.lock");
        let first = ProcessLock::acquire(&p, "fleet-x").expect("first");
        let second = ProcessLock::acquire(&p, "fleet-x").expect_err("second");
        assert!(matches!(second, LockError::Held { .. }), "{second}");
        assert!(
            second.to_string().contains("another fleet-x holds"),
            "{second}"
        );
        drop(first);
        ProcessLock::acquire(&p, "fleet-x").expect("after release");
    }
}
