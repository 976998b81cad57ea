//! Small helpers shared by the part launchers: locating binaries, free ports, processes (waiting is `wait.rs`).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The repository root (this crate lives at `vm-tests/rig`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap_or_else(|_| PathBuf::from("."))
}

/// A TCP port on 127.0.0.1 that was free a moment ago, taken from below the kernel's ephemeral range.
///
/// Why not port 0: a port the kernel handed out and that was released is back in the ephemeral pool, so
/// before the part binds it an outgoing connection (a route between cluster nodes, a client) or another
/// test's `bind(0)` may take it, and the part dies with "address already in use" (seen in CI). Ports below
/// the ephemeral range are never picked for outgoing connections; a process-wide cursor keeps one process's
/// ports distinct, and its start depends on the PID so test binaries running side by side start apart.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static CURSOR: AtomicU32 = AtomicU32::new(u32::MAX);
    let (lo, hi) = non_ephemeral_range();
    let span = u32::from(hi - lo);
    let _ = CURSOR.compare_exchange(
        u32::MAX,
        (std::process::id().wrapping_mul(7919)) % span,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    for _ in 0..span {
        let n = CURSOR.fetch_add(1, Ordering::SeqCst) % span;
        let port = lo + n as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() && claim_port(port) {
            return port;
        }
    }
    panic!("no free port on 127.0.0.1 in {lo}..{hi}");
}

/// Claims `port` for this process against the other test processes (scripts/test runs binaries side by side): a
/// file `<tmp>/fleet-rig-ports/<port>` holding the owner's PID, taken over once that process is gone. Without it a
/// port a test keeps while its server is stopped (`NatsServer::stop` then `start_again`) looks free to another
/// process, whose new server then answers on it — or fails to bind — and goes away under the first test (seen as
/// "connection refused" right after a start when two binaries ran at once).
fn claim_port(port: u16) -> bool {
    use std::io::Write;
    let dir = std::env::temp_dir().join("fleet-rig-ports");
    let _ = std::fs::create_dir_all(&dir);
    let file = dir.join(port.to_string());
    for _ in 0..2 {
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&file)
        {
            Ok(mut f) => return write!(f, "{}", std::process::id()).is_ok(),
            Err(_) => {
                let owner = std::fs::read_to_string(&file)
                    .ok()
                    .and_then(|s| s.trim().parse::<u32>().ok());
                let gone = match owner {
                    Some(pid) if pid == std::process::id() => return true,
                    Some(pid) => !Path::new(&format!("/proc/{pid}")).exists(),
                    // Being written this moment, or left half-written by a crash long ago.
                    None => std::fs::metadata(&file)
                        .and_then(|m| m.modified())
                        .ok()
                        .and_then(|t| t.elapsed().ok())
                        .is_some_and(|age| age > Duration::from_secs(10)),
                };
                if !gone {
                    return false;
                }
                let _ = std::fs::remove_file(&file);
            }
        }
    }
    false
}

/// The ports the rig hands out: from 10000 up to the start of the kernel's ephemeral range
/// (`net.ipv4.ip_local_port_range`, 32768 by default), or 10000..30000 if that range starts too low.
fn non_ephemeral_range() -> (u16, u16) {
    const LO: u16 = 10_000;
    let start = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    if start >= LO + 5_000 {
        (LO, start)
    } else {
        (LO, 30_000)
    }
}

/// Finds `name`: the environment variable `env_var` if set, then each of `candidates`, then `PATH`.
/// Panics with `install_hint` when it is nowhere: a missing part fails the test loudly.
pub fn require_binary(
    name: &str,
    env_var: &str,
    candidates: &[PathBuf],
    install_hint: &str,
) -> PathBuf {
    if let Some(p) = std::env::var_os(env_var) {
        let p = PathBuf::from(p);
        assert!(
            p.is_file(),
            "{env_var}={} does not exist. {install_hint}",
            p.display()
        );
        return p;
    }
    if let Some(p) = candidates.iter().find(|p| p.is_file()) {
        return p.clone();
    }
    let on_path = std::env::var_os("PATH")
        .map(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join(name))
                .find(|p| p.is_file())
        })
        .unwrap_or_default();
    on_path.unwrap_or_else(|| panic!("`{name}` is not installed (looked at ${env_var}, {candidates:?} and PATH). {install_hint}"))
}

/// Copies an executable to `to` (mode 0755, replaced atomically) so that this process can run it at once.
///
/// Why a child `install` and not `std::fs::copy`: while this process holds the copy open for writing, another
/// test thread's fork inherits that descriptor until its exec, and running the copy in that window fails with
/// "Text file busy" (seen in CI). The copy's writer is the child, which nothing here forks from.
pub fn install_executable(from: &Path, to: &Path) {
    let tmp = to.with_extension(format!("tmp{}", std::process::id()));
    let out = std::process::Command::new("install")
        .arg("-m")
        .arg("0755")
        .arg(from)
        .arg(&tmp)
        .output()
        .unwrap_or_else(|e| panic!("cannot run install (coreutils): {e}"));
    assert!(
        out.status.success(),
        "install {from:?} {tmp:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::rename(&tmp, to).unwrap_or_else(|e| panic!("rename {tmp:?} to {to:?}: {e}"));
}

/// `<pid>:<start time>` (field 22 of `/proc/<pid>/stat`, in clock ticks since boot): which process a pid was when
/// the watchdog was set, so that a pid reused by another test binary's process (test binaries run side by side,
/// `scripts/test`) is never killed. The shell side reads the same field (`alive` in [`WATCH`]).
fn tagged(pid: u32) -> String {
    let start = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(") ")
                .and_then(|(_, rest)| rest.split_whitespace().nth(19).map(str::to_owned))
        })
        .unwrap_or_default();
    format!("{pid}:{start}")
}

/// The watchdog's shell functions: `alive TAG` is true while the process of a [`tagged`] pid runs.
const WATCH: &str = "alive() { p=${1%%:*}; s=${1#*:}; [ -n \"$s\" ] && \
    [ \"$(sed 's/.*) //' /proc/$p/stat 2>/dev/null | cut -d' ' -f20)\" = \"$s\" ]; }; ";

/// Starts a small watchdog that kills `pids` once this process has exited: a part kept in a `static` is never
/// dropped, and a process killed outright drops nothing. Only the processes those pids were are killed.
pub fn kill_when_gone(pids: &[u32]) {
    let script = format!(
        "{WATCH}while kill -0 \"$0\" 2>/dev/null; do sleep 1; done; \
         for t in \"$@\"; do alive \"$t\" && kill \"${{t%%:*}}\" 2>/dev/null; done"
    );
    let _ = std::process::Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg(std::process::id().to_string())
        .args(pids.iter().map(|p| tagged(*p)))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
}

/// Like [`kill_when_gone`], then removes `dir` once those processes have exited: a part held in a test binary's
/// `static` is never dropped, so without this its temporary directory (etcd's data) stays behind in /tmp.
pub fn kill_and_remove_when_gone(pids: &[u32], dir: &std::path::Path) {
    let script = format!(
        "{WATCH}parent=$0; dir=$1; shift; while kill -0 \"$parent\" 2>/dev/null; do sleep 1; done; \
         for t in \"$@\"; do alive \"$t\" && kill \"${{t%%:*}}\" 2>/dev/null; done; \
         for i in 1 2 3 4 5 6 7 8 9 10; do \
         still=; for t in \"$@\"; do alive \"$t\" && still=1; done; \
         [ -z \"$still\" ] && break; sleep 1; done; rm -rf -- \"$dir\""
    );
    let _ = std::process::Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg(std::process::id().to_string())
        .arg(dir)
        .args(pids.iter().map(|p| tagged(*p)))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
}

/// Established TCP connections of process `pid` to port `port` on any address: its socket inodes
/// (`/proc/<pid>/fd`) that `/proc/net/tcp` or `tcp6` lists with that remote port. 0 when `pid` is gone.
pub fn tcp_connections_to(pid: u32, port: u16) -> usize {
    let inodes: std::collections::HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .filter_map(|e| {
            let l = std::fs::read_link(e.ok()?.path()).ok()?;
            Some(
                l.to_str()?
                    .strip_prefix("socket:[")?
                    .strip_suffix(']')?
                    .to_owned(),
            )
        })
        .collect();
    let want = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .map(|t| {
            t.lines()
                .skip(1)
                .filter(|l| {
                    // sl, local address, remote address, state (01: established), …, inode (10th column)
                    let c: Vec<&str> = l.split_whitespace().collect();
                    c.len() > 9 && c[2].ends_with(&want) && c[3] == "01" && inodes.contains(c[9])
                })
                .count()
        })
        .sum()
}

/// 128 random bits as hex, from the kernel (tokens must not be guessable from a PID).
pub fn random_hex() -> String {
    use std::io::Read;
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .unwrap_or_else(|e| panic!("read /dev/urandom: {e}"));
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The watchdog kills the process its pid was, and never a process that only has a reused pid's number.
    #[test]
    fn the_watchdog_kills_only_the_process_it_was_set_for() {
        let alive = |tag: &str| {
            std::process::Command::new("sh")
                .arg("-c")
                .arg(format!("{WATCH}alive \"$0\""))
                .arg(tag)
                .status()
                .unwrap()
                .success()
        };
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let tag = tagged(child.id());
        assert!(alive(&tag), "{tag}");
        // The same pid with another start time is another process.
        let (pid, start) = tag.split_once(':').unwrap();
        let other = format!("{pid}:{}", start.parse::<u64>().unwrap() + 1);
        assert!(!alive(&other), "{other}");
        assert!(
            !alive(&format!("{pid}:")),
            "an unknown start time is never alive"
        );
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!alive(&tag), "{tag} after it exited");
    }

    #[test]
    fn a_port_claimed_by_a_live_process_is_refused_and_one_of_a_gone_process_taken_over() {
        let dir = std::env::temp_dir().join("fleet-rig-ports");
        std::fs::create_dir_all(&dir).unwrap();
        // Ports above the rig's range: no free_port of another test process hands them out.
        let (live, gone, fresh) = (65_001u16, 65_002u16, 65_003u16);
        std::fs::write(dir.join(live.to_string()), "1").unwrap();
        std::fs::write(dir.join(gone.to_string()), "4194303").unwrap();
        let _ = std::fs::remove_file(dir.join(fresh.to_string()));
        assert!(!claim_port(live), "PID 1 holds it");
        assert!(claim_port(gone));
        assert!(claim_port(fresh));
        let me = std::process::id().to_string();
        assert_eq!(
            std::fs::read_to_string(dir.join(gone.to_string())).unwrap(),
            me
        );
        assert_eq!(
            std::fs::read_to_string(dir.join(fresh.to_string())).unwrap(),
            me
        );
        for p in [live, gone, fresh] {
            let _ = std::fs::remove_file(dir.join(p.to_string()));
        }
    }
}
