//! The deployments-and-releases controller: the control loop ([`engine`]) over Devices, DeviceGroups,
//! FleetDeployments and AgentReleases and the NATS buckets; its pure parts — placement, the pass's [`plan`], agent
//! releases, staged rollouts, spec validation, the WorkloadPolicy check ([`policy`]), workload health and the
//! Device status mirrored from NATS — and its writes to the Kubernetes API ([`report`], [`device_writes`]).

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
