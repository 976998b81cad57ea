//! What more than one product folder (deployments, tasks, dashboard) needs, moved out of them so that none imports
//! another: the fleet's rules as pure functions and the writes every controller makes.

/// Label selectors, group membership, which devices an object targets and each device's desired workloads.
pub mod placement;
/// Writes to the Kubernetes API every controller makes: status patches, Warning events, Device creation.
pub mod report;
/// Staged rollouts: which devices get a change now, the rollout's phase and counts, and why it halted.
pub mod rollout;
/// A device's usage as its Device shows it (in steps) and as a staged rollout reads it (the free-space floor).
pub mod usage;
/// Spec validation: the JSON of FleetDeployment and AgentRelease specs into fleet-wire types, or what is wrong.
pub mod validate;
