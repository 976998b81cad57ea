//! fleet-operator: CRDs and controllers for devices, groups, placement, agent releases and task runs, and the
//! read-only dashboard with alerts and `/metrics`. The FleetLock server (`operator/fleetlock`) and fleet-auth, the
//! NATS auth callout (`operator/auth`), are crates of their own that build without Kubernetes; what all three
//! share is `fleet-kit`.

pub mod dashboard;
// Shared by the controllers: caches, conditions, CRDs, KV, placement; then deployments and agent releases.
pub mod cache;
pub mod conditions;
pub mod crd;
pub mod deploy;
pub mod device_writes;
pub mod engine;
pub mod health;
pub mod kv;
pub mod memory;
pub mod metrics;
pub mod mirror;
pub mod nats_link;
pub use fleet_kit::{nats_password, nats_tls};
pub mod placement;
pub mod plan;
pub mod refusals;
pub mod release;
pub mod report;
pub mod rollout;
pub mod rollout_workloads;
pub mod schema;
pub mod tasks;
pub mod validate;
pub mod webhook;
