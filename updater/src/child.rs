//! Running a child process with a hard time bound: its own process group, bounded captured output, killed
//! (with its whole group) on time-out; optionally as an unprivileged user with a clean environment.

use crate::users::UserIds;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

/// A child that exited within its bound.
#[derive(Debug)]
pub struct Finished {
    /// Its exit status.
    pub status: ExitStatus,
    /// Its standard output, at most the byte bound given.
    pub stdout: Vec<u8>,
    /// Its standard error, at most the byte bound given.
    pub stderr: Vec<u8>,
}

impl Finished {
    /// The last 400 characters or so of stderr, for an error message: printable only (control characters and
    /// invalid UTF-8 become `?`, line breaks ` | `), so a child's raw bytes never reach a status.
    pub fn stderr_tail(&self) -> String {
        printable_tail(&self.stderr, 400)
    }
}

/// The last `max_chars` characters of `bytes` as one printable line.
pub fn printable_tail(bytes: &[u8], max_chars: usize) -> String {
    let s = String::from_utf8_lossy(bytes);
    let chars: Vec<char> = s.trim().chars().collect();
    let start = chars.len().saturating_sub(max_chars);
    let mut out = String::with_capacity(max_chars);
    for &c in &chars[start..] {
        match c {
            '\n' => out.push_str(" | "),
            c if c.is_control() || c == char::REPLACEMENT_CHARACTER => out.push('?'),
            c => out.push(c),
        }
    }
    out
}

/// Why a bounded child did not finish.
#[derive(Debug, thiserror::Error)]
pub enum ChildError {
    /// It could not be started.
    #[error("could not start {program}: {source}")]
    Spawn {
        /// The program.
        program: String,
        /// The error.
        source: std::io::Error,
    },
    /// It ran past its bound and was killed.
    #[error("{program} did not finish within {bound:?} and was killed")]
    TimedOut {
        /// The program.
        program: String,
        /// The bound.
        bound: Duration,
    },
    /// Waiting for it failed.
    #[error("waiting for {program} failed: {source}")]
    Wait {
        /// The program.
        program: String,
        /// The error.
        source: std::io::Error,
    },
}

/// Makes `cmd` run as `user` (supplementary groups, gid, uid) with a clean environment, in `/`.
pub fn as_user(cmd: &mut Command, user: &UserIds) {
    cmd.env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", &user.home)
        .env("USER", &user.name)
        .env("LOGNAME", &user.name)
        .env("LANG", "C.UTF-8")
        .current_dir("/");
    let (uid, gid, groups) = (user.uid, user.gid, user.groups.clone());
    // SAFETY: the closure runs between fork and exec and only makes async-signal-safe system calls on data
    // prepared before the fork. Groups first, then gid, then uid: each step needs the privilege the next drops.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setgroups(groups.len(), groups.as_ptr()) != 0
                || libc::setgid(gid) != 0
                || libc::setuid(uid) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Kills a child's process group when its bound passes, unless stopped first.
pub struct Watchdog {
    stop: mpsc::Sender<()>,
    fired: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Watchdog {
    /// Starts watching the process group of `pid` (a child spawned with `process_group(0)`).
    pub fn start(pid: u32, bound: Duration) -> Self {
        let (stop, rx) = mpsc::channel::<()>();
        let fired = Arc::new(AtomicBool::new(false));
        let f = fired.clone();
        let thread = thread::spawn(move || {
            if let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(bound) {
                f.store(true, Ordering::SeqCst);
                kill_group(pid);
            }
        });
        Self {
            stop,
            fired,
            thread: Some(thread),
        }
    }

    /// Stops watching; true if the bound had passed and the group was killed.
    pub fn stop(mut self) -> bool {
        self.halt();
        self.fired.load(Ordering::SeqCst)
    }

    fn halt(&mut self) {
        let _ = self.stop.send(());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.halt();
    }
}

/// Reads `r` to its end on a thread, keeping at most `max` bytes.
pub fn reader<R: Read + Send + 'static>(mut r: R, max: usize) -> thread::JoinHandle<Vec<u8>> {
    thread::spawn(move || {
        let mut kept = Vec::new();
        let mut buf = [0u8; 8192];
        loop {
            match r.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let room = max.saturating_sub(kept.len());
                    kept.extend_from_slice(&buf[..n.min(room)]);
                }
            }
        }
        kept
    })
}

/// Reads `r` to its end on a thread, keeping its last `max` bytes (for output whose newest part matters, such as a
/// log printed oldest first).
pub fn tail_reader<R: Read + Send + 'static>(mut r: R, max: usize) -> thread::JoinHandle<Vec<u8>> {
    thread::spawn(move || {
        let mut kept = Vec::new();
        let mut buf = [0u8; 8192];
        loop {
            match r.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    kept.extend_from_slice(&buf[..n]);
                    // Dropping the front only once it is twice the bound keeps the copying linear.
                    if kept.len() > max.saturating_mul(2).max(8192) {
                        kept.drain(..kept.len() - max);
                    }
                }
            }
        }
        let excess = kept.len().saturating_sub(max);
        kept.drain(..excess);
        kept
    })
}

/// Kills the process group `pid` (SIGKILL).
pub fn kill_group(pid: u32) {
    if let Ok(pid) = libc::pid_t::try_from(pid) {
        // SAFETY: kill(2) on our own child's process group; ESRCH when it is gone is harmless.
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
        }
    }
}

/// Runs `cmd` (stdin null, output captured up to `max_output` bytes each) and waits at most `bound`.
pub fn run_bounded(
    cmd: &mut Command,
    bound: Duration,
    max_output: usize,
) -> Result<Finished, ChildError> {
    run(cmd, bound, max_output, false)
}

/// As [`run_bounded`], but keeps the last `max_output` bytes of standard output instead of the first.
pub fn run_bounded_tail(
    cmd: &mut Command,
    bound: Duration,
    max_output: usize,
) -> Result<Finished, ChildError> {
    run(cmd, bound, max_output, true)
}

/// Spawns `cmd`, trying again for a moment while the program is busy being written (`ETXTBSY`): a program written
/// just before it runs (an agent candidate before its probe) can be held open for writing by a child that another
/// thread forked meanwhile, until that child's exec closes it — a race of fork/exec, not a fault of the program.
fn spawn(cmd: &mut Command) -> std::io::Result<std::process::Child> {
    let mut tries = 0;
    loop {
        match cmd.spawn() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < 50 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            other => return other,
        }
    }
}

fn run(
    cmd: &mut Command,
    bound: Duration,
    max_output: usize,
    keep_tail: bool,
) -> Result<Finished, ChildError> {
    let program = cmd.get_program().to_string_lossy().into_owned();
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut child = spawn(cmd).map_err(|source| ChildError::Spawn {
        program: program.clone(),
        source,
    })?;
    let pid = child.id();
    let out = child.stdout.take().map(|s| {
        if keep_tail {
            tail_reader(s, max_output)
        } else {
            reader(s, max_output)
        }
    });
    let err = child.stderr.take().map(|s| reader(s, max_output));
    let watchdog = Watchdog::start(pid, bound);
    let waited = child.wait();
    let status = if watchdog.stop() {
        Err(ChildError::TimedOut {
            program: program.clone(),
            bound,
        })
    } else {
        waited.map_err(|source| ChildError::Wait {
            program: program.clone(),
            source,
        })
    };
    // Leftovers of the child's group would hold the pipes open: they go with it.
    kill_group(pid);
    let stdout = out.and_then(|h| h.join().ok()).unwrap_or_default();
    let stderr = err.and_then(|h| h.join().ok()).unwrap_or_default();
    Ok(Finished {
        status: status?,
        stdout,
        stderr,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn captures_and_kills() {
        let f = run_bounded(
            Command::new("sh").args(["-c", "echo out; echo err >&2; exit 3"]),
            Duration::from_secs(10),
            1024,
        )
        .expect("runs");
        assert_eq!(f.status.code(), Some(3));
        assert_eq!(f.stdout, b"out\n");
        assert_eq!(f.stderr_tail(), "err");
        let started = std::time::Instant::now();
        let e = run_bounded(
            Command::new("sh").args(["-c", "sleep 30 & sleep 30"]),
            Duration::from_millis(300),
            1024,
        )
        .expect_err("times out");
        assert!(matches!(e, ChildError::TimedOut { .. }), "{e}");
        assert!(started.elapsed() < Duration::from_secs(10));
        let big = run_bounded(
            Command::new("sh").args(["-c", "head -c 100000 /dev/zero"]),
            Duration::from_secs(10),
            10,
        )
        .expect("runs");
        assert_eq!(big.stdout.len(), 10);
        // The tail variant keeps the newest bytes, across many reads.
        let tail = run_bounded_tail(
            Command::new("sh").args(["-c", "seq 1 100000"]),
            Duration::from_secs(10),
            13,
        )
        .expect("runs");
        assert_eq!(tail.stdout, b"99999\n100000\n");
    }
}
