//! `fleet-agent`: keeps a device's Podman workloads equal to its desired state in NATS, reports device info,
//! heartbeat and workload status, and relays agent upgrades to `fleet-updater`. Blocking threads, explicit
//! time-outs, no async runtime.

pub mod agent;
pub mod config;
pub mod device;
pub mod device_secrets;
pub mod diagnostics;
pub mod health;
pub mod health_probe;
pub mod health_worker;
pub mod lock;
pub mod nats_kv;
pub mod nats_tls;
pub mod oom;
/// systemd notifications: the one `sd_notify` of the tree, in fleet-wire.
pub use fleet_wire::notify;
pub mod paths;
pub mod podman;
pub mod probe;
pub mod reconcile;
pub mod relay;
pub mod timing;
pub mod updater;
pub mod usage;
pub mod workload_worker;

/// The compiled version text (`FLEET_AGENT_VERSION` at build time, else the package version).
pub const VERSION: &str = env!("FLEET_AGENT_COMPILED_VERSION");

/// The compiled version, validated.
pub fn compiled_version() -> fleet_wire::Version {
    // build.rs validated it with the same rule; the fallback only guards a divergence of the two rules.
    fleet_wire::Version::try_from(VERSION).unwrap_or_else(|_| {
        fleet_wire::Version::try_from("0.0.0").unwrap_or_else(|_| unreachable!())
    })
}
