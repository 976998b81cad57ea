//! The boot watchdog (seed `coordinated-reboots.md`, "A host stuck at System is booting up"): some minutes into a
//! boot, if the host is not up, write diagnostics first, then reboot — at most `max_reboots` watchdog reboots in
//! `window_hours`, counted across boots. Past that cap the host stays up for a person and says so.

pub mod cli;
pub mod config;
pub mod decide;
pub mod history;

use crate::reboot::diag;
use crate::reboot::system::{CommandError, FileError, Paths, System};
pub use config::WatchdogConfig;
use decide::{Decision, Health, Observation};
use fleet_wire::Timestamp;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Time bound of each command the watchdog runs.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

/// Sections the watchdog adds to the common diagnostics (jobs, failed units, ordering cycles, state, bootc status,
/// mounts).
const EXTRA_SECTIONS: &[diag::Section] = &[
    (
        "user sessions",
        "systemctl",
        &["status", "--no-pager", "systemd-user-sessions.service"],
    ),
    (
        "mount units",
        "systemctl",
        &["list-units", "--type=mount", "--all", "--no-pager"],
    ),
    // What an interrupted apt or dpkg run left half-installed or half-configured.
    ("dpkg audit", "dpkg", &["--audit"]),
    ("apt and dpkg processes", "pgrep", &["-a", "apt|dpkg"]),
    ("dpkg log", "tail", &["-n", "30", "/var/log/dpkg.log"]),
];

/// Every path the watchdog writes, derived from the root prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchdogPaths {
    root: PathBuf,
}

impl WatchdogPaths {
    /// Paths under `root` (`/` on a device).
    pub fn new(root: &Path) -> Self {
        Self {
            root: root.to_path_buf(),
        }
    }
    /// The diagnostics directory.
    pub fn diagnostics_dir(&self) -> PathBuf {
        self.root.join("var/log/fleet-boot-watchdog")
    }
    /// The record of watchdog reboots, kept across boots.
    pub fn history(&self) -> PathBuf {
        self.root.join("var/lib/fleet-boot-watchdog/reboots.json")
    }
    /// The login message a person sees on the console while the cap holds (Debian's pam_motd reads it).
    pub fn motd(&self) -> PathBuf {
        self.root.join("run/motd.d/fleet-boot-watchdog")
    }
}

/// What one run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The host is up: nothing written.
    Up,
    /// Shutting down or in rescue mode: left alone.
    LeftAlone(String),
    /// Not up; diagnostics written; rebooting is off in the configuration.
    Diagnosed(PathBuf),
    /// Not up; diagnostics written, the reboot recorded and requested.
    Rebooting(PathBuf),
    /// Not up; diagnostics written; the cap holds, so the host stays up.
    CapReached(PathBuf),
}

/// A run that could not do its work (diagnostics not written, the record not saved, a failed reboot command).
#[derive(Debug, thiserror::Error)]
pub enum WatchdogError {
    /// The diagnostics snapshot was not written.
    #[error(transparent)]
    Diagnostics(#[from] FileError),
    /// The reboot record was not saved.
    #[error(transparent)]
    History(#[from] history::HistoryError),
    /// `systemctl` could not be run.
    #[error(transparent)]
    Command(#[from] CommandError),
    /// `systemctl reboot` failed.
    #[error("systemctl reboot failed ({0:?})")]
    RebootFailed(Option<i32>),
}

/// Reads what the host says about its boot.
pub fn observe(sys: &dyn System, paths: &Paths) -> Observation {
    let state = sys
        .run("systemctl", &["is-system-running"], COMMAND_TIMEOUT)
        .map(|o| o.text())
        .unwrap_or_else(|e| format!("unknown ({e})"));
    let user_sessions = sys
        .run(
            "systemctl",
            &["is-active", "systemd-user-sessions.service"],
            COMMAND_TIMEOUT,
        )
        .map(|o| o.text())
        .unwrap_or_else(|e| format!("unknown ({e})"));
    Observation {
        state,
        user_sessions,
        nologin: paths.nologin().exists(),
    }
}

/// One run: observe, decide, write diagnostics first, then reboot or hold.
pub fn run(
    cfg: &WatchdogConfig,
    sys: &dyn System,
    now: Timestamp,
) -> Result<Outcome, WatchdogError> {
    let paths = Paths::new(&cfg.root);
    let wpaths = WatchdogPaths::new(&cfg.root);
    let obs = observe(sys, &paths);
    let why = match decide::health(&obs) {
        Health::Up => {
            log::info!("the host is up ({}): nothing to do", obs.state);
            return Ok(Outcome::Up);
        }
        Health::LeaveAlone(why) => {
            log::info!("left alone: {why}");
            return Ok(Outcome::LeftAlone(why));
        }
        Health::NotUp(why) => why,
    };
    log::warn!("the host is not up: {why}");
    // A record that cannot be read counts as a full cap: never risk a reboot loop on a damaged file.
    let history = history::load(&wpaths.history());
    let decision = match &history {
        Ok(h) => decide::decide(cfg, h, now),
        Err(e) => Decision::CapReached {
            count: 0,
            note: format!("the reboot record is unreadable ({e}); not rebooting"),
        },
    };
    let reason = format!("not up: {why}\ndecision: {}", decision.describe(cfg));
    let kind = diag::Kind {
        dir: wpaths.diagnostics_dir(),
        prefix: "boot",
        title: "fleet-boot-watchdog",
        extra: EXTRA_SECTIONS,
    };
    let file = diag::write(sys, &paths, &kind, &reason)?;
    log::info!("diagnostics written to {}", file.display());
    match decision {
        Decision::Diagnose => Ok(Outcome::Diagnosed(file)),
        Decision::CapReached { .. } => {
            let text = format!(
                "fleet-boot-watchdog: this host did not finish booting ({why}).\n{}\nDiagnostics: {}\n",
                decision.describe(cfg),
                file.display()
            );
            if let Some(dir) = wpaths.motd().parent() {
                let _ = std::fs::create_dir_all(dir);
            }
            if let Err(e) = std::fs::write(wpaths.motd(), text) {
                log::warn!("{}: {e}", wpaths.motd().display());
            }
            log::error!("{}", decision.describe(cfg));
            Ok(Outcome::CapReached(file))
        }
        Decision::Reboot => {
            let mut h = history.unwrap_or_default();
            h.record(now);
            history::save(&wpaths.history(), &h)?;
            log::warn!("rebooting ({})", decision.describe(cfg));
            let out = sys.run("systemctl", &["reboot"], COMMAND_TIMEOUT)?;
            if out.code != Some(0) {
                return Err(WatchdogError::RebootFailed(out.code));
            }
            Ok(Outcome::Rebooting(file))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reboot::system::Output;
    use std::sync::Mutex;

    /// Answers `systemctl is-system-running` and `is-active` as a host stuck in its boot; records every call.
    struct Stuck {
        calls: Mutex<Vec<String>>,
        reboot_code: i32,
        /// Whether `bootc` is installed (a bootc host).
        bootc: bool,
    }

    impl System for Stuck {
        fn run(&self, program: &str, args: &[&str], _t: Duration) -> Result<Output, CommandError> {
            let cmd = format!("{program} {}", args.join(" "));
            self.calls
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(cmd.clone());
            let (code, out) = match cmd.as_str() {
                "systemctl is-system-running" => (1, "starting"),
                "systemctl is-active systemd-user-sessions.service" => (3, "inactive"),
                "systemctl list-jobs --no-pager" => {
                    (0, "JOB UNIT\n12 mnt-hang.mount start running\n")
                }
                "systemctl reboot" => (self.reboot_code, ""),
                "bootc status" if self.bootc => (
                    0,
                    "booted: quay.io/example/os:42\nstaged: quay.io/example/os:43\n",
                ),
                _ => return Err(CommandError::not_installed(program)),
            };
            Ok(Output {
                code: Some(code),
                stdout: out.as_bytes().to_vec(),
            })
        }
    }

    fn stuck(reboot_code: i32) -> Stuck {
        Stuck {
            calls: Mutex::new(vec![]),
            reboot_code,
            bootc: false,
        }
    }

    #[test]
    fn a_bootc_host_s_diagnostics_carry_its_images_and_others_say_bootc_is_not_there() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cfg = WatchdogConfig {
            reboot: false,
            root: dir.path().to_path_buf(),
            ..WatchdogConfig::default()
        };
        let now = Timestamp::from_unix_ms(1_800_000_000_000);
        let sys = Stuck {
            bootc: true,
            ..stuck(0)
        };
        let Ok(Outcome::Diagnosed(file)) = run(&cfg, &sys, now) else {
            panic!("expected diagnostics")
        };
        let text = std::fs::read_to_string(&file).expect("diagnostics");
        assert!(
            text.contains("== bootc status: bootc status\nbooted: quay.io/example/os:42\nstaged: quay.io/example/os:43"),
            "{text}"
        );

        let Ok(Outcome::Diagnosed(file)) = run(&cfg, &stuck(0), now) else {
            panic!("expected diagnostics")
        };
        let text = std::fs::read_to_string(&file).expect("diagnostics");
        assert!(
            text.contains("== bootc status: bootc status\n(not run: bootc: not installed)"),
            "{text}"
        );
    }

    #[test]
    fn diagnostics_first_then_one_reboot_then_the_cap_holds() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cfg = WatchdogConfig {
            max_reboots: 1,
            root: dir.path().to_path_buf(),
            ..WatchdogConfig::default()
        };
        let w = WatchdogPaths::new(dir.path());
        let now = Timestamp::from_unix_ms(1_800_000_000_000);

        let sys = stuck(0);
        let Ok(Outcome::Rebooting(file)) = run(&cfg, &sys, now) else {
            panic!("expected a reboot")
        };
        let text = std::fs::read_to_string(&file).expect("diagnostics");
        assert!(text.contains("is-system-running says starting"), "{text}");
        assert!(text.contains("12 mnt-hang.mount start running"), "{text}");
        assert!(text.contains("== dpkg audit"), "{text}");
        let calls = sys.calls.lock().expect("calls").clone();
        let diag_at = calls
            .iter()
            .position(|c| c == "dpkg --audit")
            .expect("diag");
        let reboot_at = calls
            .iter()
            .position(|c| c == "systemctl reboot")
            .expect("reboot");
        assert!(
            diag_at < reboot_at,
            "diagnostics after the reboot: {calls:?}"
        );
        assert_eq!(
            history::load(&w.history()).expect("history").reboots,
            vec![now]
        );

        // The next boot is stuck too: the cap holds, the host stays up and says so.
        let sys = stuck(0);
        let later = Timestamp::from_unix_ms(now.unix_ms() + 60_000);
        let Ok(Outcome::CapReached(file)) = run(&cfg, &sys, later) else {
            panic!("expected the cap")
        };
        assert!(!sys
            .calls
            .lock()
            .expect("calls")
            .iter()
            .any(|c| c == "systemctl reboot"));
        let text = std::fs::read_to_string(&file).expect("diagnostics");
        assert!(
            text.contains("reboot cap reached: 1 watchdog reboot(s) in the last 24 h"),
            "{text}"
        );
        let motd = std::fs::read_to_string(w.motd()).expect("motd");
        assert!(
            motd.contains("did not finish booting") && motd.contains("stays up"),
            "{motd}"
        );
        assert_eq!(
            history::load(&w.history()).expect("history").reboots.len(),
            1
        );

        // A damaged record never reboots.
        std::fs::write(w.history(), b"{").expect("write");
        let sys = stuck(0);
        assert!(matches!(run(&cfg, &sys, later), Ok(Outcome::CapReached(_))));
        assert!(!sys
            .calls
            .lock()
            .expect("calls")
            .iter()
            .any(|c| c == "systemctl reboot"));
    }

    #[test]
    fn a_failed_reboot_command_is_an_error_after_the_record() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cfg = WatchdogConfig {
            root: dir.path().to_path_buf(),
            ..WatchdogConfig::default()
        };
        let e = run(&cfg, &stuck(1), Timestamp::now())
            .expect_err("reboot failed")
            .to_string();
        assert!(e.contains("systemctl reboot failed"), "{e}");
        // Recorded before the attempt: a reboot that happens anyway still counts.
        let h = history::load(&WatchdogPaths::new(dir.path()).history()).expect("history");
        assert_eq!(h.reboots.len(), 1);
    }
}
