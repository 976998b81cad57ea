//! The set-up the failure scenarios share: a one-device fleet (NATS, the operator's side, an artifact server)
//! whose device runs v1, with the real v2 agent placed in the guest so that a candidate can be a small wrapper
//! script around it that breaks exactly one behaviour.

use crate::builds::{self, V1, V2};
use crate::fleet::{start_nats, Artifacts, Device, Operator};
use fleet_rig::callout::FleetNats;
use fleet_wire::AgentUpgradeAttempt;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

/// Where versioned agent binaries live in the guest.
pub const LIB: &str = "/usr/lib/harmony-fleet";
/// Where the real v2 agent is placed in the guest, for wrapper candidates to `exec`.
pub const REAL_V2: &str = "/opt/fleet-test/fleet-agent-real-v2";

/// A v1 device with the real v2 agent at [`REAL_V2`]. Fields drop in order: the guest goes before the NATS
/// server it talks to.
pub struct Scene {
    /// The device, running v1.
    pub device: Device,
    /// The artifact server candidates are published on.
    pub artifacts: Artifacts,
    /// The operator's side of NATS.
    pub operator: Operator,
    /// The NATS server (with the auth callout unless switched off).
    pub nats: FleetNats,
    dir: tempfile::TempDir,
}

impl Scene {
    /// Boots and installs the v1 device, and places the real v2 agent in it.
    pub fn v1_with_real_v2() -> Self {
        let nats = start_nats();
        let operator = Operator::new(&nats);
        let artifacts = Artifacts::start();
        let device = Device::install(&nats, &operator, V1, Some(&artifacts));
        device
            .guest
            .install_file(&builds::agent(V2), REAL_V2, 0o755);
        Self {
            device,
            artifacts,
            operator,
            nats,
            dir: tempfile::tempdir().expect("temp dir"),
        }
    }

    /// Writes a candidate "binary" `name` that runs the shell `body` (an ELF, see
    /// [`crate::builds::script_candidate`]), which usually `exec`s [`REAL_V2`].
    pub fn wrapper(&self, name: &str, body: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        std::fs::write(&p, crate::builds::script_candidate(body)).expect("write candidate");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        p
    }

    /// Publishes the wrapper `name` (see [`Self::wrapper`]) and returns a v2 attempt for it.
    pub fn v2_attempt(&self, name: &str, body: &str) -> AgentUpgradeAttempt {
        let candidate = self.wrapper(name, body);
        self.artifacts
            .attempt(&candidate, &format!("fleet-agent-v2-{name}"), V2)
    }
}
