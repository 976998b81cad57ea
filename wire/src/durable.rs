//! The one crash-safe write every process shares (feature `os`): temporary file beside the target, fsync,
//! atomic rename, fsync of the parent directory; the same for symlinks. The updater's journals and binaries, the
//! reboot marker, the agent's upgrade bindings and the FleetLock file store all write through here.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{symlink, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// The directory holding `path` (an error for a bare name: the rename must stay inside one directory).
fn parent(path: &Path) -> io::Result<&Path> {
    path.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path has no parent"))
}

/// A fresh temporary name next to `path` (same directory, so the final rename is atomic). Its name starts with
/// `.<file name>.tmp-`, which [`remove_stale_temps`] recognises.
pub fn temp_beside(path: &Path) -> io::Result<PathBuf> {
    let dir = parent(path)?;
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path has no file name"))?;
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    Ok(dir.join(format!(
        ".{}.tmp-{}-{n}",
        name.to_string_lossy(),
        std::process::id()
    )))
}

/// Removes temporary files [`temp_beside`] left next to `path` (a crash between stage and commit).
pub fn remove_stale_temps(path: &Path) {
    let (Ok(dir), Some(name)) = (parent(path), path.file_name()) else {
        return;
    };
    let prefix = format!(".{}.tmp-", name.to_string_lossy());
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().starts_with(&prefix) {
                let _ = fs::remove_file(e.path());
            }
        }
    }
}

/// fsyncs a directory, making a rename or create inside it durable.
pub fn fsync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// The first half of an atomic write: creates `tmp` (it must not exist) with `mode`, writes `bytes`, fsyncs.
/// On error `tmp` is removed.
pub fn stage(tmp: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(tmp)?;
        f.write_all(bytes)?;
        // The umask may have narrowed `mode` at creation.
        f.set_permissions(fs::Permissions::from_mode(mode))?;
        f.sync_all()
    })();
    if result.is_err() {
        let _ = fs::remove_file(tmp);
    }
    result
}

/// The second half: renames the staged `tmp` over `path` and fsyncs the directory.
pub fn commit(tmp: &Path, path: &Path) -> io::Result<()> {
    fs::rename(tmp, path)?;
    fsync_dir(parent(path)?)
}

/// Writes `bytes` to `path` atomically and durably with permission bits `mode`.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    let tmp = temp_beside(path)?;
    stage(&tmp, bytes, mode)?;
    commit(&tmp, path).inspect_err(|_| {
        let _ = fs::remove_file(&tmp);
    })
}

/// Moves an already written file `src` (same file system) to `dest` atomically and durably, with `mode`.
pub fn install_atomic(src: &Path, dest: &Path, mode: u32) -> io::Result<()> {
    let f = File::open(src)?;
    f.set_permissions(fs::Permissions::from_mode(mode))?;
    f.sync_all()?;
    drop(f);
    commit(src, dest)
}

/// Points the symlink `link` at `target` atomically: a temporary symlink, rename over `link`, directory fsync.
pub fn replace_symlink(link: &Path, target: &Path) -> io::Result<()> {
    let tmp = temp_beside(link)?;
    symlink(target, &tmp)?;
    commit(&tmp, link).inspect_err(|_| {
        let _ = fs::remove_file(&tmp);
    })
}

/// Removes `path` durably (directory fsync); a missing file is not an error.
pub fn remove(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Ok(()) => fsync_dir(parent(path)?),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Creates `dir` (and parents) with `mode` if missing.
pub fn ensure_dir(dir: &Path, mode: u32) -> io::Result<()> {
    if !dir.is_dir() {
        fs::create_dir_all(dir)?;
        fs::set_permissions(dir, fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temps(dir: &Path) -> usize {
        fs::read_dir(dir)
            .expect("ls")
            .filter(|e| {
                e.as_ref()
                    .map(|e| e.file_name().to_string_lossy().contains(".tmp-"))
                    .unwrap_or(false)
            })
            .count()
    }

    #[test]
    fn atomic_writes_links_and_removal() {
        let d = tempfile::tempdir().expect("tmp");
        let p = d.path().join("j.json");
        write_atomic(&p, b"one", 0o600).expect("write");
        write_atomic(&p, b"two", 0o640).expect("rewrite");
        assert_eq!(fs::read(&p).expect("read"), b"two");
        assert_eq!(
            fs::metadata(&p).expect("meta").permissions().mode() & 0o777,
            0o640
        );
        let link = d.path().join("active");
        replace_symlink(&link, Path::new("/a")).expect("link");
        replace_symlink(&link, Path::new("/b")).expect("relink");
        assert_eq!(fs::read_link(&link).expect("readlink"), Path::new("/b"));
        assert_eq!(temps(d.path()), 0);
        // A crash between stage and commit leaves a temporary file, which is recognised and removed.
        let tmp = temp_beside(&p).expect("tmp");
        stage(&tmp, b"three", 0o600).expect("stage");
        assert_eq!(fs::read(&p).expect("read"), b"two", "not committed yet");
        remove_stale_temps(&p);
        assert_eq!(temps(d.path()), 0);
        // Staging refuses an existing temporary file instead of writing through it.
        fs::write(&tmp, b"x").expect("plant");
        assert!(stage(&tmp, b"y", 0o600).is_err());
        remove(&p).expect("remove");
        remove(&p).expect("removing again is fine");
        assert!(!p.exists());
        assert!(write_atomic(Path::new("bare"), b"x", 0o600).is_err());
    }
}
