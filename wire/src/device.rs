//! What a device reports about itself: device info (`device-info/<device>`) and heartbeat
//! (`device-heartbeat/<device>`). Unknown fields are tolerated so that an older operator reads a newer agent.

use crate::{Architecture, BoundedText, DeviceId, Id128, Timestamp, Version};
use serde::{Deserialize, Serialize};

/// Something a device's agent and updater can do, advertised so the operator only targets capable devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Capability {
    /// Agent self-upgrade from `https://` artifacts.
    AgentUpgradeV1,
    /// Agent self-upgrade from `oci://` artifacts (needs an updater with OCI support).
    OciArtifactsV1,
    /// The built-in `apt full-upgrade` system upgrade task.
    AptFullUpgradeV1,
    /// Workload specs with `resources`, `secrets`, `devices`, `groups`, `capabilities` and `privileged`, and
    /// registry credentials from `device-secrets` for its pulls.
    WorkloadSpecV2,
    /// A capability this reader does not know (reported by a newer device).
    #[serde(other)]
    Unknown,
}

/// The operating system, from `/etc/os-release`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OsInfo {
    /// `ID`, e.g. `debian` or `raspbian`.
    pub id: BoundedText,
    /// `VERSION_ID`, e.g. `12`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version_id: Option<BoundedText>,
    /// `PRETTY_NAME`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pretty_name: Option<BoundedText>,
}

/// Device information, published by the agent at start-up.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceInfo {
    /// The device.
    pub device_id: DeviceId,
    /// The running agent's compiled version.
    pub agent_version: Version,
    /// The device's architecture.
    pub architecture: Architecture,
    /// Its operating system.
    pub os: OsInfo,
    /// What it can do.
    pub capabilities: Vec<Capability>,
    /// The current boot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<Id128>,
    /// When this was published.
    pub published_at: Timestamp,
    /// systemd's `NRestarts` of `fleet-agent.service` when this agent process started: its automatic restarts
    /// after a failure since the unit was last started by a person, a boot or a cutover — so, after a cutover,
    /// the new version's crashes. Device info is published once per agent process, so `publishedAt` is the
    /// latest start. Absent from agents before it was added, and where systemd did not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restarts: Option<u32>,
    /// The id this device's FleetLock client (`fleet-reboot`, the updater's reboots) sends as its `client_params.id`
    /// ([`crate::fleetlock::client_id`] of its machine id), so the operator's Reboots page can show a slot's holder
    /// as the device it is. Absent from agents before it was added and where `/etc/machine-id` could not be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reboot_client_id: Option<Id128>,
}

/// A device's tombstone (bucket `device-retired`, key `<device-id>`), written by the operator when a person deletes
/// the device's Device object: the device is retired. Its keys in every per-device bucket are deleted after it is
/// written; the operator never creates a Device for it again, and fleet-auth refuses its identity at the callout
/// and its writes at the device API, until an explicit enrolment removes it (docs/device-lifecycle.md).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceRetirement {
    /// The device.
    pub device_id: DeviceId,
    /// When the operator recorded it (the operator's clock).
    pub retired_at: Timestamp,
    /// The `metadata.uid` of the Device object whose deletion retired it: an enrolment is a Device created since,
    /// with another uid, so a stale view of the deleted object can never lift the tombstone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_uid: Option<String>,
}

/// A liveness beat, published at a fixed interval.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Heartbeat {
    /// The device.
    pub device_id: DeviceId,
    /// When it was sent.
    pub at: Timestamp,
    /// The running agent's version.
    pub agent_version: Version,
    /// The current boot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<Id128>,
    /// Increases by one per beat within one agent process.
    pub sequence: u64,
}
