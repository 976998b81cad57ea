//! The compiled-in apt policy: exactly which commands run, with which fixed options and environment, how long
//! each may take, how their output is kept (every line to journald, the last lines into the status) and how a
//! failure is classified. Nothing here takes an argument from a caller.

use crate::child::{self, Watchdog};
use fleet_wire::SystemUpgradeReason;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// Lines of output kept for the status (the whole output goes to journald).
pub const TAIL_LINES: usize = 20;
/// Longest line kept, in bytes (longer lines are cut; journald gets the cut line too).
pub const LINE_MAX_BYTES: usize = 512;
/// How long apt waits for the dpkg lock before failing with `apt-lock-held`, in seconds.
pub const LOCK_WAIT_SECS: u32 = 120;

/// One command of the policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// `apt-get update`: refresh the package lists; any unreachable repository fails the attempt.
    Update,
    /// `apt-get full-upgrade`: upgrade everything, keeping locally changed configuration files.
    FullUpgrade,
    /// `dpkg --configure -a`: finish configuring packages an interrupted or failed dpkg run left unpacked.
    ConfigurePending,
}

/// `-o DPkg::Lock::Timeout=<LOCK_WAIT_SECS>`, spelled out so that the policy reads as one table.
const LOCK_TIMEOUT: &str = "DPkg::Lock::Timeout=120";

impl Step {
    /// The program, looked up in the updater's fixed binary directory.
    pub fn program(self) -> &'static str {
        match self {
            Step::Update | Step::FullUpgrade => "apt-get",
            Step::ConfigurePending => "dpkg",
        }
    }

    /// The fixed arguments.
    pub fn args(self) -> &'static [&'static str] {
        match self {
            Step::Update => &["-q", "-y", "-o", LOCK_TIMEOUT, "--error-on=any", "update"],
            Step::FullUpgrade => &[
                "-q",
                "-y",
                "-o",
                LOCK_TIMEOUT,
                "-o",
                "Dpkg::Options::=--force-confdef",
                "-o",
                "Dpkg::Options::=--force-confold",
                "full-upgrade",
            ],
            Step::ConfigurePending => &["--force-confdef", "--force-confold", "--configure", "-a"],
        }
    }

    /// How long the command may run before it is killed (with its process group).
    pub fn bound(self) -> Duration {
        match self {
            Step::Update => Duration::from_secs(15 * 60),
            Step::FullUpgrade => Duration::from_secs(3 * 3600),
            Step::ConfigurePending => Duration::from_secs(3600),
        }
    }

    /// The command line, for logs and docs.
    pub fn command_line(self) -> String {
        format!("{} {}", self.program(), self.args().join(" "))
    }
}

/// The fixed environment of every command (nothing inherited).
pub const ENV: [(&str, &str); 5] = [
    (
        "PATH",
        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    ),
    ("LANG", "C.UTF-8"),
    ("LC_ALL", "C.UTF-8"),
    ("DEBIAN_FRONTEND", "noninteractive"),
    ("APT_LISTCHANGES_FRONTEND", "none"),
];

/// What a command's output said, collected line by line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Signals {
    /// The dpkg/apt lock was held by someone else.
    pub lock_held: bool,
    /// A repository or package download could not be reached.
    pub unreachable: bool,
    /// dpkg reported an error (or a previous run was interrupted).
    pub dpkg_error: bool,
    /// A kernel or the C library was unpacked: the device must reboot.
    pub reboot_package: bool,
}

impl Signals {
    /// Updates the flags from one output line. Pure.
    pub fn observe(&mut self, line: &str) {
        if line.contains("Could not get lock") || line.contains("Unable to acquire the dpkg") {
            self.lock_held = true;
        }
        if line.contains("Failed to fetch")
            || line.contains("Some index files failed to download")
            || line.contains("Temporary failure resolving")
            || line.contains("Could not connect to")
            || line.contains("Unable to fetch some archives")
            || (line.starts_with("E: The repository") && line.contains("does not have a Release"))
        {
            self.unreachable = true;
        }
        if line.contains("returned an error code")
            || line.contains("dpkg: error processing")
            || line.contains("dpkg was interrupted")
            || line.contains("Sub-process /usr/bin/dpkg")
        {
            self.dpkg_error = true;
        }
        if let Some(rest) = line.strip_prefix("Unpacking ") {
            if rest.starts_with("linux-image-")
                || rest.starts_with("libc6 ")
                || rest.starts_with("libc6:")
            {
                self.reboot_package = true;
            }
        }
    }

    /// The failure reason of a failed `step`. Pure.
    pub fn reason(&self, step: Step) -> SystemUpgradeReason {
        if self.lock_held {
            SystemUpgradeReason::AptLockHeld
        } else if self.dpkg_error || step == Step::ConfigurePending {
            SystemUpgradeReason::DpkgError
        } else if self.unreachable {
            SystemUpgradeReason::RepositoryUnreachable
        } else {
            SystemUpgradeReason::AptFailed
        }
    }
}

/// How a command ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Exit code (`None`: killed by a signal or the bound).
    pub code: Option<i32>,
    /// The last [`TAIL_LINES`] lines of standard output and error, interleaved as they arrived.
    pub tail: Vec<String>,
    /// What the output said.
    pub signals: Signals,
    /// Set when the bound passed and the command was killed.
    pub timed_out: bool,
}

impl Outcome {
    /// True when the command exited 0.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }

    /// The tail as one bounded text, keeping the end when it is too long.
    pub fn tail_text(&self) -> fleet_wire::BoundedText {
        tail_text(&self.tail)
    }
}

/// Joins `lines` and keeps the end within the bounded-text limit (starting with `…` when cut).
pub fn tail_text(lines: &[String]) -> fleet_wire::BoundedText {
    let joined = lines.join("\n");
    let max = fleet_wire::limits::MAX_TEXT_CHARS - 1;
    let count = joined.chars().count();
    if count <= max + 1 {
        return fleet_wire::BoundedText::lossy(joined);
    }
    let kept: String = joined.chars().skip(count - max).collect();
    fleet_wire::BoundedText::lossy(format!("…{kept}"))
}

/// Runs the policy's commands from a fixed binary directory (`/usr/bin` on a device; tests point it at
/// scripts that record their arguments).
#[derive(Debug, Clone)]
pub struct Apt {
    bin_dir: PathBuf,
}

impl Default for Apt {
    fn default() -> Self {
        Self::new("/usr/bin")
    }
}

fn read_lines<R: Read + Send + 'static>(
    r: R,
    tx: mpsc::Sender<String>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut r = BufReader::new(r);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            // A line longer than the cap is read in pieces: memory stays bounded however the child writes.
            match (&mut r)
                .take(LINE_MAX_BYTES as u64)
                .read_until(b'\n', &mut buf)
            {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let line = String::from_utf8_lossy(&buf).trim_end().to_string();
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            }
        }
    })
}

impl Apt {
    /// The policy with programs from `bin_dir`.
    pub fn new(bin_dir: impl Into<PathBuf>) -> Self {
        Self {
            bin_dir: bin_dir.into(),
        }
    }

    /// Whether apt-get and dpkg are installed (the `AptFullUpgradeV1` capability).
    pub fn available(&self) -> bool {
        [Step::Update, Step::ConfigurePending]
            .iter()
            .all(|s| self.program(*s).is_file())
    }

    fn program(&self, step: Step) -> PathBuf {
        self.bin_dir.join(step.program())
    }

    /// Runs `step` for run `run` (named in every log line), within its bound. `Err` only when it could not start.
    pub fn run(&self, step: Step, run: &str) -> Result<Outcome, crate::child::ChildError> {
        let program = self.program(step);
        log::info!("run {run}: running {}", step.command_line());
        let mut cmd = Command::new(&program);
        cmd.args(step.args())
            .env_clear()
            .envs(ENV)
            .current_dir(Path::new("/"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let mut child = cmd
            .spawn()
            .map_err(|source| crate::child::ChildError::Spawn {
                program: program.display().to_string(),
                source,
            })?;
        let (tx, rx) = mpsc::channel();
        let readers: Vec<_> = [
            child.stdout.take().map(|s| read_lines(s, tx.clone())),
            child.stderr.take().map(|s| read_lines(s, tx.clone())),
        ]
        .into_iter()
        .flatten()
        .collect();
        drop(tx);
        let watchdog = Watchdog::start(child.id(), step.bound());
        let mut tail: std::collections::VecDeque<String> = Default::default();
        let mut signals = Signals::default();
        for line in rx {
            log::info!("run {run}: {}: {line}", step.program());
            signals.observe(&line);
            if tail.len() == TAIL_LINES {
                tail.pop_front();
            }
            tail.push_back(line);
        }
        let status = child.wait();
        let timed_out = watchdog.stop();
        child::kill_group(child.id());
        for r in readers {
            let _ = r.join();
        }
        let code = status.ok().and_then(|s| s.code());
        log::info!(
            "run {run}: {} exited with {code:?}{}",
            step.program(),
            if timed_out {
                " (killed: bound passed)"
            } else {
                ""
            }
        );
        Ok(Outcome {
            code: if timed_out { None } else { code },
            tail: tail.into(),
            signals,
            timed_out,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn classification_table() {
        let cases: [(&[&str], Step, SystemUpgradeReason); 6] = [
            (
                &["E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 7 (apt-get)"],
                Step::FullUpgrade,
                SystemUpgradeReason::AptLockHeld,
            ),
            (
                &["E: Failed to fetch file:/srv/repo/./Packages  File not found"],
                Step::Update,
                SystemUpgradeReason::RepositoryUnreachable,
            ),
            (
                &["dpkg: error processing package x (--configure):", "E: Sub-process /usr/bin/dpkg returned an error code (1)"],
                Step::FullUpgrade,
                SystemUpgradeReason::DpkgError,
            ),
            (
                &["E: dpkg was interrupted, you must manually run 'dpkg --configure -a' to correct the problem."],
                Step::FullUpgrade,
                SystemUpgradeReason::DpkgError,
            ),
            (&["anything"], Step::ConfigurePending, SystemUpgradeReason::DpkgError),
            (&["E: something else"], Step::FullUpgrade, SystemUpgradeReason::AptFailed),
        ];
        for (lines, step, want) in cases {
            let mut s = Signals::default();
            lines.iter().for_each(|l| s.observe(l));
            assert_eq!(s.reason(step), want, "{lines:?}");
        }
        let mut s = Signals::default();
        s.observe("Unpacking linux-image-6.1.0-28-amd64 (6.1.119-1) ...");
        assert!(s.reboot_package);
        let mut s = Signals::default();
        s.observe("Unpacking libc6:amd64 (2.36-9+deb12u9) over (2.36-9+deb12u8) ...");
        assert!(s.reboot_package);
        let mut s = Signals::default();
        s.observe("Unpacking libc6-dev:amd64 (2.36) ...");
        assert!(!s.reboot_package);
    }

    #[test]
    fn the_policy_is_fixed() {
        assert_eq!(
            Step::FullUpgrade.command_line(),
            "apt-get -q -y -o DPkg::Lock::Timeout=120 -o Dpkg::Options::=--force-confdef -o \
             Dpkg::Options::=--force-confold full-upgrade"
        );
        assert_eq!(
            LOCK_TIMEOUT,
            format!("DPkg::Lock::Timeout={LOCK_WAIT_SECS}")
        );
        assert!(Step::Update.args().contains(&"--error-on=any"));
    }

    #[test]
    fn runs_with_a_clean_environment_and_keeps_the_tail() {
        let d = tempfile::tempdir().expect("tmp");
        let script = d.path().join("apt-get");
        std::fs::write(
            &script,
            "#!/bin/sh\n\
             i=0; while [ $i -lt 50 ]; do echo line $i; i=$((i+1)); done\necho 'E: Could not get lock x' >&2\nexit 100\n",
        )
        .expect("write");
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let apt = Apt::new(d.path());
        assert!(!apt.available(), "no dpkg");
        let out = apt.run(Step::Update, "t").expect("runs");
        assert_eq!(out.code, Some(100));
        assert_eq!(out.tail.len(), TAIL_LINES);
        assert!(out.tail.iter().any(|l| l == "line 49"));
        assert_eq!(
            out.signals.reason(Step::Update),
            SystemUpgradeReason::AptLockHeld
        );
        let long: Vec<String> = (0..200)
            .map(|i| format!("a fairly long line number {i}"))
            .collect();
        let t = tail_text(&long);
        assert!(t.as_str().starts_with('…') && t.as_str().ends_with("number 199"));
        assert_eq!(
            t.as_str().chars().count(),
            fleet_wire::limits::MAX_TEXT_CHARS
        );
    }
}
