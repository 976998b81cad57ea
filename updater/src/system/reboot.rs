//! The reboot a system upgrade needs, through the coordinated-reboot client `fleet-reboot` (`crate::reboot`,
//! FleetLock): window, health and lock rules as its timer's runs, diagnostics written first. Run as a program
//! beside this executable, so the root daemon carries no HTTPS, YAML or time-zone code while it idles (about
//! 0.6 MiB of its resident memory). A trait so that updater tests can script the outcomes; whole-device tests use
//! the real program against a real fleetlock-server.

use crate::child::{self, ChildError};
use crate::reboot::Outcome;
use fleet_wire::SystemUpgradeReason;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// One run of the coordinated-reboot chain for a device that needs a reboot.
pub trait Rebooter: Send + Sync {
    /// `Ok(NotNow)`: try again later; `Ok(Rebooting)`: the reboot was requested; `Ok(Released)`: the reboot
    /// happened, the host is healthy and the lock is released; `Err`: this device cannot reboot, and why.
    fn step(&self) -> Result<Outcome, StepError>;
}

/// Why a device cannot take the reboot its upgrade needs; the status reason says which.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepError {
    /// The client ran and refused: its configuration is missing or wrong, or it reported an error an operator
    /// must fix (`reboot-refused`).
    Refused(String),
    /// The client did not run to an answer: missing, killed, past its time bound, or no outcome printed
    /// (`reboot-failed`).
    ClientFailed(String),
}

impl StepError {
    /// The status reason a person reads.
    pub fn reason(&self) -> SystemUpgradeReason {
        match self {
            Self::Refused(_) => SystemUpgradeReason::RebootRefused,
            Self::ClientFailed(_) => SystemUpgradeReason::RebootFailed,
        }
    }
}

impl std::fmt::Display for StepError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Refused(m) | Self::ClientFailed(m) => f.write_str(m),
        }
    }
}

/// The longest one step may take: `health_wait` at its largest (1 h, after a reboot) plus 10 min for the
/// checks and lock calls, each bounded by the config's `timeout` (at most 60 s).
pub const STEP_BOUND: Duration = Duration::from_secs(3600 + 600);

/// Bytes kept of the program's stdout and stderr each.
const MAX_OUTPUT: usize = 64 * 1024;

/// The real client: `fleet-reboot --upgrade-step` with the configuration file its timer uses.
#[derive(Debug, Clone)]
pub struct Coordinated {
    program: PathBuf,
    config: PathBuf,
}

impl Coordinated {
    /// `program` (`fleet-reboot`) configured by `config` (`<root>/etc/harmony-fleet/fleet-reboot.yaml` on a
    /// device).
    pub fn new(program: impl Into<PathBuf>, config: impl Into<PathBuf>) -> Self {
        Self {
            program: program.into(),
            config: config.into(),
        }
    }
}

impl Rebooter for Coordinated {
    fn step(&self) -> Result<Outcome, StepError> {
        let mut cmd = Command::new(&self.program);
        cmd.arg("--config").arg(&self.config).arg("--upgrade-step");
        let done = child::run_bounded(&mut cmd, STEP_BOUND, MAX_OUTPUT).map_err(|e| {
            StepError::ClientFailed(match e {
                ChildError::Spawn { .. } => format!(
                    "the upgrade needs a reboot, but the coordinated-reboot client cannot run: {e} (it is \
                     installed beside fleet-updater)"
                ),
                e => format!(
                    "the upgrade needs a reboot, but the coordinated-reboot client failed: {e}"
                ),
            })
        })?;
        if !done.status.success() {
            return Err(StepError::Refused(format!(
                "the upgrade needs a reboot, but {} {}: {}",
                self.program.display(),
                done.status,
                done.stderr_tail()
            )));
        }
        parse_outcome(&done.stdout).ok_or_else(|| {
            StepError::ClientFailed(format!(
                "{} printed no outcome: {}",
                self.program.display(),
                child::printable_tail(&done.stdout, 400)
            ))
        })
    }
}

/// The outcome `fleet-reboot --upgrade-step` printed: its last line of JSON.
fn parse_outcome(stdout: &[u8]) -> Option<Outcome> {
    let text = std::str::from_utf8(stdout).ok()?;
    serde_json::from_str(text.lines().rev().find(|l| !l.trim().is_empty())?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcome_lines() {
        for o in [
            Outcome::NotNow("outside the window".into()),
            Outcome::Rebooting,
            Outcome::Released,
        ] {
            let line = serde_json::to_string(&o).unwrap();
            assert_eq!(
                parse_outcome(format!("noise\n{line}\n").as_bytes()),
                Some(o)
            );
        }
        assert_eq!(
            serde_json::to_string(&Outcome::NotNow("x".into())).unwrap(),
            r#"{"outcome":"not-now","reason":"x"}"#
        );
        assert_eq!(parse_outcome(b"{\"outcome\":\"reboot-now\"}"), None);
        assert_eq!(parse_outcome(b""), None);
    }
}
