//! fleet-operator: CRDs and controllers for devices, groups, placement, agent releases and task runs, and the
//! read-only dashboard with alerts and `/metrics`. The FleetLock server (`operator/fleetlock`) and fleet-auth, the
//! NATS auth callout (`operator/auth`), are crates of their own that build without Kubernetes; what all three
//! share is `fleet-kit`.

// The product folders: the deployments-and-releases controller, the task-run controller and scheduler, the
// dashboard.
pub mod dashboard;
pub mod deployments;
pub mod diagnostics;
pub mod tasks;
// Shared by them: the fleet's rules and writes (`fleet`: placement, rollouts, reports …), caches, conditions, every
// CRD, KV, the one NATS link, metrics, the admission webhook, a Device's blocking reasons and the TaskRun
// controller's, handed to the Device writer.
pub mod blocking;
pub mod cache;
pub mod conditions;
pub mod crd;
pub mod deploy;
pub mod fleet;
pub mod kv;
pub mod liveness;
pub mod memory;
pub mod metrics;
pub mod nats_link;
pub use fleet_kit::{nats_password, nats_tls};
pub mod refusals;
pub mod retire;
pub mod runtime;
pub mod schema;
pub mod secrets_source;
pub mod task_reasons;
pub mod validation;
pub mod webhook;
