//! Crash-safe file system writes: temporary file, fsync, atomic rename, fsync of the parent directory.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{symlink, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A fresh temporary name next to `path` (same directory, so the final rename is atomic).
fn temp_beside(path: &Path) -> io::Result<PathBuf> {
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

fn parent(path: &Path) -> io::Result<&Path> {
    path.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path has no parent"))
}

/// fsyncs a directory, making a rename or create inside it durable.
pub fn fsync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Writes `bytes` to `path` atomically and durably with permission bits `mode`.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    let tmp = temp_beside(path)?;
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.set_permissions(fs::Permissions::from_mode(mode))?;
        f.sync_all()?;
        drop(f);
        fs::rename(&tmp, path)?;
        fsync_dir(parent(path)?)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Moves an already written file `src` (same file system) to `dest` atomically and durably, with `mode`.
pub fn install_atomic(src: &Path, dest: &Path, mode: u32) -> io::Result<()> {
    let f = File::open(src)?;
    f.set_permissions(fs::Permissions::from_mode(mode))?;
    f.sync_all()?;
    drop(f);
    fs::rename(src, dest)?;
    fsync_dir(parent(dest)?)
}

/// Points the symlink `link` at `target` atomically: a temporary symlink, rename over `link`, directory fsync.
pub fn replace_symlink(link: &Path, target: &Path) -> io::Result<()> {
    let tmp = temp_beside(link)?;
    symlink(target, &tmp)?;
    if let Err(e) = fs::rename(&tmp, link) {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    fsync_dir(parent(link)?)
}

/// Creates `dir` (and parents) with `mode` if missing.
pub fn ensure_dir(dir: &Path, mode: u32) -> io::Result<()> {
    if !dir.is_dir() {
        fs::create_dir_all(dir)?;
        fs::set_permissions(dir, fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

/// A versioned JSON state file that checks itself after parsing (the two journals).
pub trait Validated: serde::de::DeserializeOwned {
    /// Largest file read, in bytes.
    const MAX_BYTES: u64;
    /// Checks what deserialization cannot.
    fn check(&self) -> Result<(), String>;
}

/// Parses and checks `bytes`; the error says why, for a message that names the file.
pub fn parse_validated<T: Validated>(bytes: &[u8]) -> Result<T, String> {
    if bytes.len() as u64 > T::MAX_BYTES {
        return Err(format!("is larger than {} bytes", T::MAX_BYTES));
    }
    let v: T = serde_json::from_slice(bytes).map_err(|e| format!("does not parse: {e}"))?;
    v.check().map_err(|e| format!("is not valid: {e}"))?;
    Ok(v)
}

/// Reads, parses and checks the file at `path`; `Ok(None)` when it does not exist.
pub fn load_validated<T: Validated>(path: &Path) -> Result<Option<T>, String> {
    use std::io::Read;
    let mut bytes = Vec::new();
    match File::open(path).and_then(|f| f.take(T::MAX_BYTES + 1).read_to_end(&mut bytes)) {
        Ok(_) => parse_validated(&bytes).map(Some),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("cannot be read: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_writes_and_links() {
        let d = tempfile::tempdir().expect("tmp");
        let p = d.path().join("j.json");
        write_atomic(&p, b"one", 0o600).expect("write");
        write_atomic(&p, b"two", 0o600).expect("rewrite");
        assert_eq!(fs::read(&p).expect("read"), b"two");
        assert_eq!(
            fs::metadata(&p).expect("meta").permissions().mode() & 0o777,
            0o600
        );
        let link = d.path().join("active");
        replace_symlink(&link, Path::new("/a")).expect("link");
        replace_symlink(&link, Path::new("/b")).expect("relink");
        assert_eq!(fs::read_link(&link).expect("readlink"), Path::new("/b"));
        let leftovers = fs::read_dir(d.path())
            .expect("ls")
            .filter(|e| {
                e.as_ref()
                    .map(|e| e.file_name().to_string_lossy().contains(".tmp-"))
                    .unwrap_or(false)
            })
            .count();
        assert_eq!(leftovers, 0);
    }
}
