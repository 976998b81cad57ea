//! Small helpers shared by the part launchers: locating binaries, free ports, waiting with a deadline.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The repository root (this crate lives at `vm-tests/rig`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap_or_else(|_| PathBuf::from("."))
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0")
        .unwrap_or_else(|e| panic!("cannot bind a free port on 127.0.0.1: {e}"));
    l.local_addr()
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("local_addr: {e}"))
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

/// Starts a small watchdog that kills `pids` once this process has exited: a part kept in a `static` is never
/// dropped, and a process killed outright drops nothing.
pub fn kill_when_gone(pids: &[u32]) {
    let script = "while kill -0 \"$0\" 2>/dev/null; do sleep 1; done; kill \"$@\" 2>/dev/null";
    let _ = std::process::Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg(std::process::id().to_string())
        .args(pids.iter().map(u32::to_string))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
}

/// Like [`kill_when_gone`], then removes `dir` once those processes have exited: a part held in a test binary's
/// `static` is never dropped, so without this its temporary directory (etcd's data) stays behind in /tmp.
pub fn kill_and_remove_when_gone(pids: &[u32], dir: &std::path::Path) {
    let script =
        "parent=$0; dir=$1; shift; while kill -0 \"$parent\" 2>/dev/null; do sleep 1; done; \
                  kill \"$@\" 2>/dev/null; for i in 1 2 3 4 5 6 7 8 9 10; do \
                  alive=; for p in \"$@\"; do kill -0 \"$p\" 2>/dev/null && alive=1; done; \
                  [ -z \"$alive\" ] && break; sleep 1; done; rm -rf -- \"$dir\"";
    let _ = std::process::Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg(std::process::id().to_string())
        .arg(dir)
        .args(pids.iter().map(u32::to_string))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
}

/// Polls `check` every 20 ms until it returns `Some` or `timeout` passes.
pub fn wait_for<T>(timeout: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
