//! fleet-operator: CRDs and controllers for devices, groups, placement, agent releases and task runs; the
//! FleetLock server, which runs with no Kubernetes at all; and fleet-auth, the NATS auth callout for device identity; and the read-only dashboard with alerts and `/metrics`.

pub mod auth;
pub mod dashboard;
pub mod fleetlock;
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
pub mod nats_password;
pub mod nats_tls;
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
