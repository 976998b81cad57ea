//! Every path the agent uses, derived from the root prefix (`/` on a device, a temp dir in tests).

use std::path::{Path, PathBuf};

/// Paths under one root prefix.
#[derive(Debug, Clone)]
pub struct Paths {
    root: PathBuf,
}

impl Paths {
    /// Paths under `root`.
    pub fn new(root: &Path) -> Self {
        Self {
            root: root.to_owned(),
        }
    }

    fn under(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    /// `<root>/var/lib/fleet-agent/agent.lock`: the process lock. In the state directory (the fleet-agent user's
    /// home, created by device setup) so it needs no runtime directory; `flock` ends with the process anyway.
    pub fn lock_file(&self) -> PathBuf {
        self.state_dir().join("agent.lock")
    }

    /// `<root>/var/lib/fleet-agent`: durable state (systemd `StateDirectory=fleet-agent`).
    pub fn state_dir(&self) -> PathBuf {
        self.under("var/lib/fleet-agent")
    }

    /// `<root>/var/lib/fleet-agent/upgrade-bindings.json`: attempt UUID → digest bindings.
    pub fn bindings_file(&self) -> PathBuf {
        self.state_dir().join("upgrade-bindings.json")
    }

    /// `<root>/run/fleet-updater/updater.sock`.
    pub fn updater_socket(&self) -> PathBuf {
        fleet_wire::socket::updater_socket(&self.root)
    }

    /// `<root>/etc/os-release`.
    pub fn os_release(&self) -> PathBuf {
        self.under("etc/os-release")
    }

    /// `<root>/etc/machine-id`.
    pub fn machine_id(&self) -> PathBuf {
        self.under("etc/machine-id")
    }
}
