//! The FleetLock coordinated-reboot lock server: the protocol of Zincati and airlock over HTTPS (plain HTTP only
//! when asked for), groups with slots, durable holders (file store with group commit, or NATS JetStream KV with
//! compare-and-set for HA), config reload, certificate reload, status with recent lock history, metrics, optional auth, TTL and admin
//! release. Runs with no Kubernetes at all: `fleetlock-server --listen <addr:port> --config <path> --tls-cert <pem>
//! --tls-key <pem>`. See `docs/fleetlock.md`.

pub mod audit;
pub mod auth;
pub mod config;
pub mod conns;
pub mod http;
pub mod metrics;
pub mod recent;
pub mod server;
pub mod state;
pub mod store;
pub mod tls;

pub use config::Config;
pub use server::run;
pub use tls::{CertFiles, Listener};
