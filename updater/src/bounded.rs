//! Reading a small local file (a config, a key) with a byte bound, so that a wrong path or a huge file is a clear
//! error instead of an unbounded read.

use std::io::Read;
use std::path::Path;

/// The bytes of `path`, at most `max` of them; errors name the path.
pub fn read(path: &Path, max: u64) -> Result<Vec<u8>, String> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(max + 1).read_to_end(&mut bytes))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    check(path, bytes.len(), max)?;
    Ok(bytes)
}

/// The UTF-8 text of `path`, at most `max` bytes; errors name the path.
pub fn read_text(path: &Path, max: u64) -> Result<String, String> {
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(max + 1).read_to_string(&mut text))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    check(path, text.len(), max)?;
    Ok(text)
}

fn check(path: &Path, len: usize, max: u64) -> Result<(), String> {
    if len as u64 > max {
        return Err(format!("{}: larger than {max} bytes", path.display()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_reads_name_the_path() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("f");
        std::fs::write(&p, b"12345").expect("write");
        assert_eq!(read_text(&p, 5).expect("fits"), "12345");
        assert_eq!(read(&p, 5).expect("fits"), b"12345");
        let e = read_text(&p, 4).expect_err("too large");
        assert!(
            e.ends_with("larger than 4 bytes") && e.contains(&p.display().to_string()),
            "{e}"
        );
        let e = read(&dir.path().join("missing"), 4).expect_err("missing");
        assert!(e.contains("missing"), "{e}");
    }
}
