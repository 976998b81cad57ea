//! Clean-up of guests: killing and removing a guest's cgroup tree, and sweeping what guests of dead test
//! processes left behind.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

pub(super) fn sigkill(pid: u32) {
    let _ = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .stderr(Stdio::null())
        .status();
}

fn pid_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Removes what guests of dead test processes left behind (their network namespaces and cgroups, killing what
/// still runs in them); names carry the owning test process's PID. Every new guest runs it first.
pub fn sweep_stale() {
    let Ok(entries) = fs::read_dir("/run/netns") else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let Some(pid) = name
            .strip_prefix("fleet-vm-")
            .and_then(|r| r.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !pid_alive(pid) {
            let _ = Command::new("ip").args(["netns", "del", &name]).output();
            for root in ["/sys/fs/cgroup/unified", "/sys/fs/cgroup/systemd"] {
                remove_cgroup(&Path::new(root).join(&name));
            }
        }
    }
}

/// Kills every process in a cgroup tree and removes it, deepest first.
pub(super) fn remove_cgroup(dir: &Path) {
    if !dir.is_dir() {
        return;
    }
    let _ = fs::write(dir.join("cgroup.kill"), "1");
    for _ in 0..100 {
        let mut alive = false;
        for procs in cgroup_procs_files(dir) {
            for pid in fs::read_to_string(&procs).unwrap_or_default().lines() {
                if let Ok(pid) = pid.trim().parse::<u32>() {
                    alive = true;
                    sigkill(pid);
                }
            }
        }
        if !alive {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut dirs = vec![];
    collect_dirs(dir, &mut dirs);
    dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
    for d in dirs {
        let _ = fs::remove_dir(&d);
    }
}

fn cgroup_procs_files(dir: &Path) -> Vec<PathBuf> {
    let mut dirs = vec![];
    collect_dirs(dir, &mut dirs);
    dirs.into_iter().map(|d| d.join("cgroup.procs")).collect()
}

fn collect_dirs(dir: &Path, out: &mut Vec<PathBuf>) {
    out.push(dir.to_path_buf());
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                collect_dirs(&e.path(), out);
            }
        }
    }
}
