//! The process lock: an exclusive lock (std's `File::try_lock`, `flock` on Linux) on
//! `<root>/var/lib/fleet-agent/agent.lock`, held for the process lifetime, so only one agent mutates workloads.

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
    /// Another agent holds it.
    #[error("another fleet-agent holds {0}; only one agent may run (stop it first: systemctl stop fleet-agent)")]
    Held(PathBuf),
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
    /// Takes the lock without waiting, creating the file and its directory when missing.
    pub fn acquire(path: &Path) -> Result<Self, LockError> {
        let io = |source| LockError::Io {
            path: path.to_owned(),
            source,
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC)
            .open(path)
            .map_err(io)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => return Err(LockError::Held(path.to_owned())),
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
        let p = dir.path().join("run/agent.lock");
        let first = ProcessLock::acquire(&p).expect("first");
        let second = ProcessLock::acquire(&p).expect_err("second");
        assert!(matches!(second, LockError::Held(_)), "{second}");
        drop(first);
        ProcessLock::acquire(&p).expect("after release");
    }
}
