//! The device's own items of a diagnostics bundle that need no Podman: file-system use (`statvfs`) and memory
//! (`/proc/meminfo`, `/proc/loadavg`). Each read is bounded.

use std::ffi::CString;
use std::path::Path;

/// Largest `/proc` file read.
const PROC_MAX_BYTES: u64 = 64 * 1024;

/// `1.5 GiB`: bytes for a person.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// `<path> size=… used=… free=… use=…%` of the file system holding `path` (free: what an unprivileged process
/// may still use, as `df` shows it).
pub fn disk_line(path: &str) -> Result<String, String> {
    let c = CString::new(path).map_err(|_| format!("{path}: not a path"))?;
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `s` a writable statvfs.
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut s) };
    if rc != 0 {
        return Err(format!("{path}: {}", std::io::Error::last_os_error()));
    }
    let unit = s.f_frsize as u64;
    let size = s.f_blocks as u64 * unit;
    let used = size.saturating_sub(s.f_bfree as u64 * unit);
    let avail = s.f_bavail as u64 * unit;
    let pct = if used + avail == 0 {
        0
    } else {
        (used * 100).div_ceil(used + avail)
    };
    Ok(format!(
        "{path} size={} used={} free={} use={pct}%",
        human(size),
        human(used),
        human(avail)
    ))
}

/// The `disk` item: `/`, `/var` and Podman's storage (when known), one line each; the errors of those that
/// could not be read.
pub fn disk(graph_root: Option<&str>) -> (String, Vec<String>) {
    let mut lines = Vec::new();
    let mut errors = Vec::new();
    for p in ["/", "/var"].into_iter().chain(graph_root) {
        match disk_line(p) {
            Ok(l) => lines.push(l),
            Err(e) => errors.push(e),
        }
    }
    (lines.join("\n"), errors)
}

/// The `memory` item from `/proc`.
pub fn memory() -> Result<String, String> {
    let read = |p: &str| {
        fleet_wire::bounded::read_text(Path::new(p), PROC_MAX_BYTES).map_err(|e| e.to_string())
    };
    let meminfo = read("/proc/meminfo")?;
    let loadavg = read("/proc/loadavg")?;
    Ok(memory_text(&meminfo, &loadavg))
}

/// The memory lines of `/proc/meminfo` the bundle shows, and the load average.
pub fn memory_text(meminfo: &str, loadavg: &str) -> String {
    let mut out = Vec::new();
    for key in ["MemTotal", "MemAvailable", "SwapTotal", "SwapFree"] {
        let kib = meminfo.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == key)
                .then(|| v.split_whitespace().next()?.parse::<u64>().ok())
                .flatten()
        });
        match kib {
            Some(k) => out.push(format!("{key}: {}", human(k * 1024))),
            None => out.push(format!("{key}: unknown")),
        }
    }
    let f: Vec<&str> = loadavg.split_whitespace().collect();
    if f.len() >= 4 {
        out.push(format!(
            "load average: {} {} {} (1, 5, 15 min); runnable/threads {}",
            f[0], f[1], f[2], f[3]
        ));
    }
    out.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_and_load_are_read_from_proc_text() {
        let meminfo = "MemTotal:        2048000 kB\nMemFree: 1 kB\nMemAvailable:    1024000 kB\nSwapTotal: 0 kB\n";
        let text = memory_text(meminfo, "0.10 0.20 0.30 1/234 5678\n");
        assert_eq!(
            text,
            "MemTotal: 2.0 GiB\nMemAvailable: 1000.0 MiB\nSwapTotal: 0 B\nSwapFree: unknown\nload average: 0.10 0.20 0.30 (1, 5, 15 min); runnable/threads 1/234"
        );
        assert!(memory()
            .expect("this machine's /proc")
            .contains("MemTotal: "));
    }

    #[test]
    fn disk_use_of_the_root_is_read() {
        let (text, errors) = disk(Some("/no/such/dir"));
        assert!(text.starts_with("/ size="), "{text}");
        assert!(text.contains("\n/var size="), "{text}");
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(human(1536), "1.5 KiB");
    }
}
