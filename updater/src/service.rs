//! The narrow service-manager interface the cutover needs, and its production implementation (`systemctl`).

use crate::child;
use fleet_wire::UnitName;
use std::process::Command;
use std::time::Duration;

/// A service operation failed or ran past its bound.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ServiceError(pub String);

/// Stops and starts the agent's unit. `start` returns once the unit is active (after `READY=1` for
/// `Type=notify`), or fails.
pub trait ServiceManager: Send + Sync {
    /// Stops `unit`, waiting at most `bound`; returns once it is inactive.
    fn stop(&self, unit: &UnitName, bound: Duration) -> Result<(), ServiceError>;
    /// Starts `unit`, waiting at most `bound`; returns once it is active.
    fn start(&self, unit: &UnitName, bound: Duration) -> Result<(), ServiceError>;
}

/// `systemctl` of the host's system manager.
#[derive(Debug, Clone, Default)]
pub struct Systemctl;

const OUTPUT_MAX_BYTES: usize = 16 * 1024;

fn systemctl(args: &[&str], bound: Duration) -> Result<child::Finished, ServiceError> {
    let mut cmd = Command::new("systemctl");
    cmd.args(args);
    let f = child::run_bounded(&mut cmd, bound, OUTPUT_MAX_BYTES)
        .map_err(|e| ServiceError(e.to_string()))?;
    if f.status.success() {
        Ok(f)
    } else {
        Err(ServiceError(format!(
            "systemctl {} failed ({}): {}",
            args.join(" "),
            f.status,
            f.stderr_tail()
        )))
    }
}

impl ServiceManager for Systemctl {
    fn stop(&self, unit: &UnitName, bound: Duration) -> Result<(), ServiceError> {
        systemctl(&["stop", unit.as_str()], bound).map(|_| ())
    }

    fn start(&self, unit: &UnitName, bound: Duration) -> Result<(), ServiceError> {
        systemctl(&["start", unit.as_str()], bound).map(|_| ())
    }
}
