//! Reading a small local file (a config, a key, a token, a PEM bundle) with a byte bound, so that a wrong path, a
//! huge file or an endless one (`/dev/zero`, a FIFO) is a clear error instead of an unbounded read. The tree's one
//! implementation: every process reads its small files through it.

use std::io::Read;
use std::path::{Path, PathBuf};

/// Why a bounded read failed. Displays as `<path>: <reason>`; callers put what the file is in front.
#[derive(Debug)]
pub enum ReadError {
    /// It could not be opened or read (missing, a permission, not UTF-8 for [`read_text`]).
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// It holds more than the bound.
    TooLarge {
        /// The file.
        path: PathBuf,
        /// The bound, in bytes.
        max: u64,
    },
}

impl ReadError {
    /// True when the file does not exist (callers with a default for a missing file branch on it).
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
    }
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Io { path, source } => write!(f, "{}: {source}", path.display()),
            Self::TooLarge { path, max } => {
                write!(f, "{}: larger than {max} bytes", path.display())
            }
        }
    }
}

impl std::error::Error for ReadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Io { source, .. } => Some(source),
            Self::TooLarge { .. } => None,
        }
    }
}

impl From<ReadError> for String {
    fn from(e: ReadError) -> Self {
        e.to_string()
    }
}

/// The bytes of `path`, at most `max` of them.
pub fn read(path: &Path, max: u64) -> Result<Vec<u8>, ReadError> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(max + 1).read_to_end(&mut bytes))
        .map_err(|source| io(path, source))?;
    check(path, bytes.len(), max)?;
    Ok(bytes)
}

/// The UTF-8 text of `path`, at most `max` bytes.
pub fn read_text(path: &Path, max: u64) -> Result<String, ReadError> {
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(max + 1).read_to_string(&mut text))
        .map_err(|source| io(path, source))?;
    check(path, text.len(), max)?;
    Ok(text)
}

fn io(path: &Path, source: std::io::Error) -> ReadError {
    ReadError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn check(path: &Path, len: usize, max: u64) -> Result<(), ReadError> {
    if len as u64 > max {
        return Err(ReadError::TooLarge {
            path: path.to_path_buf(),
            max,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_reads_name_the_path_and_stop_at_the_bound() {
        let tmp = tempfile::tempdir().expect("tmp");
        let dir = tmp.path();
        let p = dir.join("f");
        std::fs::write(&p, b"12345").expect("write");
        assert_eq!(read_text(&p, 5).expect("fits"), "12345");
        assert_eq!(read(&p, 5).expect("fits"), b"12345");
        let e = read_text(&p, 4).expect_err("too large");
        assert!(matches!(e, ReadError::TooLarge { max: 4, .. }), "{e:?}");
        assert_eq!(
            e.to_string(),
            format!("{}: larger than 4 bytes", p.display())
        );
        let e = read(&dir.join("missing"), 4).expect_err("missing");
        assert!(e.is_not_found() && e.to_string().contains("missing"), "{e}");
        // An endless file is cut at the bound, not read to its end.
        let e = read(Path::new("/dev/zero"), 1024).expect_err("endless");
        assert!(matches!(e, ReadError::TooLarge { max: 1024, .. }), "{e:?}");
        std::fs::write(&p, [0xff, 0xfe]).expect("write");
        let e = read_text(&p, 5).expect_err("not UTF-8");
        assert!(
            !e.is_not_found() && e.to_string().starts_with(&p.display().to_string()),
            "{e}"
        );
    }
}
