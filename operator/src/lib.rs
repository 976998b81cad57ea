//! fleet-operator: CRDs and controllers for devices, groups, placement and agent releases; the FleetLock
//! server, which runs with no Kubernetes at all; and fleet-auth, the NATS auth callout for device identity.

pub mod auth;
pub mod fleetlock;
// operator (issue 6)
pub mod conditions;
pub mod crd;
pub mod deploy;
pub mod engine;
pub mod kv;
pub mod mirror;
pub mod placement;
pub mod release;
pub mod report;
pub mod validate;
