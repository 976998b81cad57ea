//! fleet-operator: CRDs and controllers for devices, groups, placement and agent releases; and the FleetLock
//! server, which runs with no Kubernetes at all.

pub mod fleetlock;
// Deployments, agent releases and the device mirror.
pub mod conditions;
pub mod crd;
pub mod deploy;
pub mod engine;
pub mod health;
pub mod kv;
pub mod mirror;
pub mod placement;
pub mod release;
pub mod report;
pub mod validate;
