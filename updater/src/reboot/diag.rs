//! The diagnostics snapshot written under `/var/log/fleet-reboot/` before every reboot: job list, failed units,
//! ordering cycles, mounts and bootc status; the boot watchdog's snapshots (`crate::boot_watchdog`) share the
//! common sections. Each section and the number of files kept are bounded; each file is written durably.

use super::system::{FileError, Paths, System};
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

/// One command section: title, program, arguments.
pub type Section = (&'static str, &'static str, &'static [&'static str]);

/// Who writes a snapshot: its directory, file prefix, title and the sections it adds to the common ones.
#[derive(Debug, Clone)]
pub struct Kind {
    /// Where the snapshots go.
    pub dir: PathBuf,
    /// File names are `<prefix>-<unix ms>.log`.
    pub prefix: &'static str,
    /// The program named in the first line.
    pub title: &'static str,
    /// Sections after the common ones (jobs, failed units, ordering cycles, system state, bootc status).
    pub extra: &'static [Section],
}

const COMMON: &[Section] = &[
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
    // On a bootc host, the booted, staged and rollback images: whether the boot that failed is a new image.
    // Elsewhere the section says the command is not there.
    ("bootc status", "bootc", &["status"]),
];

/// Writes one fleet-reboot snapshot and returns its path.
pub fn snapshot(sys: &dyn System, paths: &Paths, reason: &str) -> Result<PathBuf, FileError> {
    let kind = Kind {
        dir: paths.diagnostics_dir(),
        prefix: "reboot",
        title: "fleet-reboot",
        extra: &[],
    };
    write(sys, paths, &kind, reason)
}

/// Writes one snapshot of `kind` durably (the host may reboot right after) and returns its path.
pub fn write(
    sys: &dyn System,
    paths: &Paths,
    kind: &Kind,
    reason: &str,
) -> Result<PathBuf, FileError> {
    let t = Duration::from_secs(10);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} diagnostics at {}\nreason: {reason}\n",
        kind.title,
        fleet_wire::Timestamp::now()
    );
    for (title, program, args) in COMMON.iter().chain(kind.extra) {
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
    let dir = &kind.dir;
    std::fs::create_dir_all(dir).map_err(FileError::at(dir))?;
    let path = dir.join(format!(
        "{}-{}.log",
        kind.prefix,
        fleet_wire::Timestamp::now().unix_ms()
    ));
    crate::durable::write_atomic(&path, out.as_bytes(), 0o640).map_err(FileError::at(&path))?;
    prune(dir, kind.prefix);
    Ok(path)
}

fn prune(dir: &std::path::Path, prefix: &str) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut files: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("{prefix}-")) && n.ends_with(".log"))
        })
        .collect();
    files.sort();
    let excess = files.len().saturating_sub(KEEP_FILES);
    for p in files.into_iter().take(excess) {
        let _ = std::fs::remove_file(p);
    }
}
