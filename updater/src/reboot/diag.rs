//! The diagnostics snapshot written under `/var/log/fleet-reboot/` before every reboot: job list, failed units,
//! ordering cycles, mounts and bootc status. Each section and the number of files kept are bounded.

use super::system::{Paths, System};
use std::fmt::Write;
use std::path::PathBuf;
use std::time::Duration;

/// Largest section, in bytes.
pub const MAX_SECTION_BYTES: usize = 64 * 1024;
/// Snapshots kept (oldest removed first).
pub const KEEP_FILES: usize = 10;

fn bounded(s: &str) -> &str {
    if s.len() <= MAX_SECTION_BYTES {
        return s;
    }
    let mut end = MAX_SECTION_BYTES;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Writes one snapshot and returns its path.
pub fn snapshot(sys: &dyn System, paths: &Paths, reason: &str) -> Result<PathBuf, String> {
    let t = Duration::from_secs(10);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "fleet-reboot diagnostics at {}\nreason: {reason}\n",
        fleet_wire::Timestamp::now()
    );
    let sections: [(&str, &str, &[&str]); 5] = [
        ("jobs", "systemctl", &["list-jobs", "--no-pager"]),
        ("failed units", "systemctl", &["--failed", "--no-pager"]),
        (
            "ordering cycles",
            "journalctl",
            &[
                "-b",
                "--no-pager",
                "-q",
                "-n",
                "200",
                "-g",
                "ordering cycle",
            ],
        ),
        ("system state", "systemctl", &["is-system-running"]),
        ("bootc status", "bootc", &["status"]),
    ];
    for (title, program, args) in sections {
        let body = match sys.run(program, args, t) {
            Ok(o) => String::from_utf8_lossy(&o.stdout).into_owned(),
            Err(e) => format!("(not run: {e})"),
        };
        let _ = writeln!(
            out,
            "== {title}: {program} {}\n{}\n",
            args.join(" "),
            bounded(&body)
        );
    }
    let mounts = std::fs::read_to_string(paths.mounts()).unwrap_or_else(|e| format!("({e})"));
    let _ = writeln!(out, "== mounts\n{}", bounded(&mounts));
    let dir = paths.diagnostics_dir();
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = dir.join(format!(
        "reboot-{}.log",
        fleet_wire::Timestamp::now().unix_ms()
    ));
    std::fs::write(&path, out).map_err(|e| format!("{}: {e}", path.display()))?;
    prune(&dir);
    Ok(path)
}

fn prune(dir: &std::path::Path) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut files: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("reboot-") && n.ends_with(".log"))
        })
        .collect();
    files.sort();
    let excess = files.len().saturating_sub(KEEP_FILES);
    for p in files.into_iter().take(excess) {
        let _ = std::fs::remove_file(p);
    }
}
