//! fleet-updater: the root updater. It owns the crash-safe agent-upgrade transaction and the system-upgrade task,
//! and listens on a Unix socket that only the `fleet-agent` group may use. Blocking threads, no NATS client.

pub mod fetch;
pub mod reboot;
