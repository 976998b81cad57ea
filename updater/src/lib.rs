//! fleet-updater: the root updater. It owns the crash-safe agent-upgrade transaction and the system-upgrade task,
//! and listens on a Unix socket that only the `fleet-agent` group may use. Blocking threads, no NATS client.

pub mod fetch_helper;
pub mod reboot;
pub mod token;

pub mod agent_upgrade;
pub mod boot_watchdog;
/// Bounded reads of small files: the tree's one implementation, in fleet-wire.
pub use fleet_wire::bounded;
pub mod child;
/// The command line of every program: the tree's one parser, in fleet-wire.
pub use fleet_wire::cli;
pub mod config;
pub mod diagnostics;
pub mod durable;
pub mod fault;
pub mod fetch_runner;
/// systemd notifications: the one `sd_notify` of the tree, in fleet-wire.
pub use fleet_wire::notify;
pub mod paths;
pub mod peer;
pub mod run;
pub mod service;
pub mod socket;
pub mod system;
pub mod tools;
pub mod users;
