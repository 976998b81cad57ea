//! The narrow seam to the host: the commands the client runs (`systemctl`, `bootc`, `journalctl`) and the paths
//! it reads and writes, all under a root prefix. Tests use a scripted [`System`] for fault injection.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Largest command output kept, in bytes.
pub const MAX_OUTPUT_BYTES: u64 = 1024 * 1024;

/// What a command printed and how it ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Output {
    /// Exit code (`None`: killed by a signal or the time-out).
    pub code: Option<i32>,
    /// Standard output (bounded).
    pub stdout: Vec<u8>,
}

impl Output {
    /// Standard output as trimmed text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).trim().to_string()
    }
}

/// A command that could not be run (not installed, or waiting for it failed): says `program: why`.
#[derive(Debug, thiserror::Error)]
#[error("{program}: {source}")]
pub struct CommandError {
    /// The program.
    pub program: String,
    /// Why it did not run.
    #[source]
    pub source: std::io::Error,
}

impl CommandError {
    /// `program` is not there (scripted hosts in tests say so for commands they do not answer).
    pub fn not_installed(program: &str) -> Self {
        Self {
            program: program.to_string(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "not installed"),
        }
    }
}

/// A file the client reads or writes that could not be: says `path: why`.
#[derive(Debug, thiserror::Error)]
#[error("{}: {source}", path.display())]
pub struct FileError {
    /// The file (or directory).
    pub path: PathBuf,
    /// What went wrong.
    #[source]
    pub source: std::io::Error,
}

impl FileError {
    /// An adapter for `map_err`: the error names `path`.
    pub fn at(path: &Path) -> impl FnOnce(std::io::Error) -> Self + '_ {
        move |source| Self {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Runs host commands.
pub trait System {
    /// Runs `program args…` with a time-out. `Err` if it could not be started (e.g. not installed).
    fn run(&self, program: &str, args: &[&str], timeout: Duration) -> Result<Output, CommandError>;
}

/// The real host.
#[derive(Debug, Default, Clone, Copy)]
pub struct Host;

impl System for Host {
    fn run(&self, program: &str, args: &[&str], timeout: Duration) -> Result<Output, CommandError> {
        let failed = |source| CommandError {
            program: program.to_string(),
            source,
        };
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(failed)?;
        let stdout = child.stdout.take();
        let reader = std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(s) = stdout {
                let _ = s.take(MAX_OUTPUT_BYTES).read_to_end(&mut buf);
            }
            buf
        });
        let deadline = Instant::now() + timeout;
        let code = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status.code(),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Ok(None) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    log::warn!("{program}: no exit within {timeout:?}, killed");
                    break None;
                }
                Err(e) => return Err(failed(e)),
            }
        };
        let stdout = reader.join().unwrap_or_default();
        Ok(Output { code, stdout })
    }
}

/// Every path the client uses, derived from the root prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Paths {
    root: PathBuf,
}

impl Paths {
    /// Paths under `root` (`/` on a real host).
    pub fn new(root: &Path) -> Self {
        Self {
            root: root.to_path_buf(),
        }
    }

    fn p(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    /// The kernel's boot id.
    pub fn boot_id(&self) -> PathBuf {
        self.p("proc/sys/kernel/random/boot_id")
    }
    /// The kernel's hostname.
    pub fn hostname(&self) -> PathBuf {
        self.p("proc/sys/kernel/hostname")
    }
    /// systemd's machine id.
    pub fn machine_id(&self) -> PathBuf {
        self.p("etc/machine-id")
    }
    /// Debian's flag that an upgrade wants a reboot.
    pub fn reboot_required(&self) -> PathBuf {
        self.p("run/reboot-required")
    }
    /// A flag asking for a reboot that nothing in the product writes (a person or another tool may); deleted once
    /// the host is healthy after the reboot. A system upgrade needs none: its journal records the reboot it needs
    /// and `--upgrade-step` skips the "something staged" check.
    pub fn reboot_flag(&self) -> PathBuf {
        self.p("var/lib/fleet-updater/reboot-required")
    }
    /// Present while logins are refused (the host is still booting or shutting down).
    pub fn nologin(&self) -> PathBuf {
        self.p("run/nologin")
    }
    /// The marker written before a reboot.
    pub fn marker(&self) -> PathBuf {
        self.p("var/lib/fleet-reboot/marker.json")
    }
    /// The lock every run holds for its whole run (timer, `--after-boot`, `--upgrade-step`).
    pub fn run_lock(&self) -> PathBuf {
        self.p("run/fleet-reboot/run.lock")
    }
    /// The system-upgrade journal fleet-updater writes (read here by `--upgrade-step` only).
    pub fn system_journal(&self) -> PathBuf {
        crate::paths::Paths::new(&self.root).system_journal()
    }
    /// Diagnostics snapshots.
    pub fn diagnostics_dir(&self) -> PathBuf {
        self.p("var/log/fleet-reboot")
    }
    /// The mount table.
    pub fn mounts(&self) -> PathBuf {
        self.p("proc/self/mounts")
    }
}

/// Reads a small text file, trimmed (at most 64 KiB).
pub fn read_small(path: &Path) -> Result<String, FileError> {
    let mut s = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(64 * 1024).read_to_string(&mut s))
        .map_err(FileError::at(path))?;
    Ok(s.trim().to_string())
}
