//! The deployments-and-releases controller: the control loop ([`engine`]) over Devices, DeviceGroups,
//! FleetDeployments and AgentReleases and the NATS buckets; its pure parts — the pass's [`plan`], agent releases,
//! the WorkloadPolicy check ([`policy`]), workload health and the Device status mirrored from NATS — and its Device
//! writes ([`device_writes`]). Placement, staged rollouts, spec validation, usage and the writes to the Kubernetes
//! API that the other product folders share are in [`crate::fleet`].

pub mod blocking;
pub mod capability;
pub mod device_writes;
pub mod engine;
pub mod health;
pub mod mirror;
pub mod plan;
pub mod policy;
pub mod release;
#[cfg(test)]
mod rollout_reasons;
pub mod rollout_workloads;
pub mod secrets;
