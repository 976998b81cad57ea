//! The reboot a system upgrade needs, through the coordinated-reboot client (`crate::reboot`, FleetLock):
//! window, health and lock rules as `fleet-reboot`, diagnostics written first. A trait so that updater tests can
//! script the outcomes; whole-device tests use the real client against a real fleetlock-server.

use crate::reboot::{self, Outcome, RebootConfig, RunOptions};
use std::path::PathBuf;

/// One run of the coordinated-reboot chain for a device that needs a reboot.
pub trait Rebooter: Send + Sync {
    /// `Ok(NotNow)`: try again later; `Ok(Rebooting)`: the reboot was requested; `Ok(Released)`: the reboot
    /// happened, the host is healthy and the lock is released; `Err`: this device cannot reboot (an operator
    /// must fix the configuration or the host).
    fn step(&self) -> Result<Outcome, String>;
}

/// The real client with the configuration file `fleet-reboot` uses.
#[derive(Debug, Clone)]
pub struct Coordinated {
    config: PathBuf,
}

impl Coordinated {
    /// The client configured by `config` (`<root>/etc/harmony-fleet/fleet-reboot.yaml` on a device).
    pub fn new(config: impl Into<PathBuf>) -> Self {
        Self {
            config: config.into(),
        }
    }
}

impl Rebooter for Coordinated {
    fn step(&self) -> Result<Outcome, String> {
        let cfg = RebootConfig::load(&self.config).map_err(|e| {
            format!("the upgrade needs a reboot, but the coordinated-reboot configuration is unusable: {e}")
        })?;
        reboot::run_once(
            &cfg,
            &reboot::system::Host,
            RunOptions {
                reboot_needed: true,
                now: None,
            },
        )
    }
}
