//! fleet-operator: CRDs and controllers for devices, groups, placement and agent releases; and the FleetLock
//! server, which runs with no Kubernetes at all.

pub mod fleetlock;
