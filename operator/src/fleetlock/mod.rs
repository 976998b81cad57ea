//! The FleetLock coordinated-reboot lock server: the protocol of Zincati and airlock over HTTP, groups with
//! slots, durable holders (file store with group commit, or NATS JetStream KV with compare-and-set for HA),
//! config reload, status, metrics, optional auth, TTL and admin release. Runs with no Kubernetes at all:
//! `fleetlock-server --listen <addr:port> --config <path>`. See `docs/fleetlock.md`.

pub mod audit;
pub mod auth;
pub mod config;
pub mod http;
pub mod metrics;
pub mod server;
pub mod state;
pub mod store;

pub use config::Config;
pub use server::run;
