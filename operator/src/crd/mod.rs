//! Every fleet CRD in `fleet.nationtech.io/v1alpha1`, the one module the product folders import them from: here
//! Device, DeviceGroup, FleetDeployment and AgentRelease; in [`tasks`], the namespaced TaskRun and TaskSchedule; in
//! [`policy`], the cluster-scoped WorkloadPolicy; all of them in [`all_crds`].
//!
//! All four are cluster-scoped: device ids are fleet-wide. Fields whose shape is a fleet-wire contract (workloads,
//! artifacts, the agent-upgrade status) are the fleet-wire types themselves, published in the CRD schema as objects
//! with `x-kubernetes-preserve-unknown-fields`; the operator validates them with fleet-wire's own constructors.

pub mod diagnostics;
pub mod policy;
pub mod tasks;

use fleet_wire::{AgentUpgradeStatus, Architecture, Capability, Version};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// For `skip_serializing_if`: a zero count is left out.
fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// The API group of every fleet CRD.
pub const GROUP: &str = "fleet.nationtech.io";

/// Schema of a field whose shape is defined (and validated) by fleet-wire: any object.
fn wire_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut m = serde_json::Map::new();
    m.insert("type".into(), "object".into());
    m.insert("x-kubernetes-preserve-unknown-fields".into(), true.into());
    schemars::Schema::from(m)
}

/// Schema of a list of fleet-wire objects.
fn wire_object_list(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut m = serde_json::Map::new();
    m.insert("type".into(), "array".into());
    m.insert("items".into(), wire_object(g).to_value());
    schemars::Schema::from(m)
}

/// Schema of a fleet-wire value serialized as a string (versions, artifacts, digests, architectures).
fn wire_string(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut m = serde_json::Map::new();
    m.insert("type".into(), "string".into());
    schemars::Schema::from(m)
}

/// Schema of an optional list of strings.
fn string_list(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut m = serde_json::Map::new();
    m.insert("type".into(), "array".into());
    m.insert("items".into(), serde_json::json!({"type": "string"}));
    schemars::Schema::from(m)
}

/// Annotation the operator puts on a Device it (re)creates for a device that already has workloads placed
/// (its Device object was deleted): while present, that device's desired state is held exactly as it is, so
/// deleting a Device never removes workloads by accident. A person labels the Device and removes the annotation
/// to hand the device back to placement.
pub const HOLD_ANNOTATION: &str = "fleet.nationtech.io/hold-workloads";

/// The finalizer the operator keeps on every Device it manages (added when it creates one, and to every Device it
/// finds without it): deleting the Device retires the device ([`crate::retire`], docs/device-lifecycle.md). The
/// operator records the device's tombstone, deletes its keys in every per-device bucket, then removes it.
pub const RETIRE_FINALIZER: &str = "fleet.nationtech.io/retire";

/// Annotation on a Device a person creates (`"true"`) to enrol a retired device again: the operator lifts the
/// device's tombstone for it. Only a Device created after the retirement counts (another uid than the one that was
/// deleted), so a stale view of the deleted object never lifts it, and the operator never sets it.
pub const ENROL_ANNOTATION: &str = "fleet.nationtech.io/enrol";

/// A device of the fleet; its name is the device id. People set `metadata.labels`; the operator creates the
/// object when a device first reports and mirrors what the device reports into `status`.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "fleet.nationtech.io",
    version = "v1alpha1",
    kind = "Device",
    status = "DeviceStatus",
    shortname = "fdev",
    printcolumn = r#"{"name":"Version","type":"string","jsonPath":".status.agentVersion"}"#,
    printcolumn = r#"{"name":"Arch","type":"string","jsonPath":".status.architecture"}"#,
    printcolumn = r#"{"name":"Online","type":"string","jsonPath":".status.conditions[?(@.type==\"Online\")].status"}"#,
    printcolumn = r#"{"name":"OnlineChanged","type":"date","priority":1,"jsonPath":".status.conditions[?(@.type==\"Online\")].lastTransitionTime"}"#,
    printcolumn = r#"{"name":"Heartbeat","type":"string","jsonPath":".status.lastHeartbeat"}"#,
    printcolumn = r#"{"name":"Upgrade","type":"string","jsonPath":".status.agentUpgrade.phase"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.agentUpgrade.reason"}"#,
    printcolumn = r#"{"name":"Stalled","type":"string","jsonPath":".status.stalled.phase"}"#,
    printcolumn = r#"{"name":"Running","type":"integer","jsonPath":".status.workloads.running"}"#,
    printcolumn = r#"{"name":"Failed","type":"integer","jsonPath":".status.workloads.failed"}"#,
    printcolumn = r#"{"name":"Error","type":"string","priority":1,"jsonPath":".status.workloads.latestError"}"#,
    printcolumn = r#"{"name":"CrashLoop","type":"string","jsonPath":".status.crashLooping"}"#,
    printcolumn = r#"{"name":"AgentRestarts","type":"integer","priority":1,"jsonPath":".status.agentRestarts.count"}"#,
    printcolumn = r#"{"name":"Refused","type":"integer","jsonPath":".status.writesRefused.count"}"#,
    printcolumn = r#"{"name":"Hold","type":"string","jsonPath":".metadata.annotations.fleet\\.nationtech\\.io/hold-workloads"}"#,
    printcolumn = r#"{"name":"Waiting","type":"string","priority":1,"jsonPath":".status.blocking[0].message"}"#,
    printcolumn = r#"{"name":"Disk","type":"string","priority":1,"jsonPath":".status.usage.disk"}"#,
    printcolumn = r#"{"name":"Mem","type":"string","priority":1,"jsonPath":".status.usage.memory"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct DeviceSpec {
    /// Free-form note for people (for example where the device is installed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// What the device reports, mirrored from NATS KV by the operator.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeviceStatus {
    /// The running agent's version (`device-info`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "wire_string")]
    pub agent_version: Option<Version>,
    /// Architecture (`amd64`, `arm64`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "wire_string")]
    pub architecture: Option<Architecture>,
    /// Capabilities the agent advertises.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "string_list")]
    pub capabilities: Vec<Capability>,
    /// Operating system pretty name, when reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub os: Option<String>,
    /// Time of a recent heartbeat (RFC 3339, UTC): refreshed once an hour
    /// ([`crate::deployments::mirror::HEARTBEAT_REFRESH`]) or with any other status change; the dashboard and its alerts read
    /// liveness from the device-heartbeat bucket, not from here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_heartbeat: Option<String>,
    /// The agent-upgrade status (`agent-upgrade-status`): fleet-wire `AgentUpgradeStatus`, bounded by its
    /// constructors (phase, reason, latest error, at most 16 transitions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "wire_object")]
    pub agent_upgrade: Option<AgentUpgradeStatus>,
    /// Every workload the device reports (`device-workload-status`), counted; absent until it reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workloads: Option<WorkloadHealth>,
    /// Set while the device's agent upgrade has stayed in one phase longer than that phase's bound allows
    /// ([`crate::fleet::rollout::phase_bound`] plus [`crate::fleet::rollout::STALL_SLACK`]): the phase it is stuck in and since
    /// when (the device's own `phaseChangedAt`); or, with no stalled agent upgrade, while a running TaskRun's
    /// intent for it has gone unaccepted for longer than the accept timeout (phase `not-accepted`, `taskRun`
    /// naming the run, set by the TaskRun controller: [`crate::tasks::stall`]); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stalled: Option<Stalled>,
    /// fleet-auth refused some of this device's writes (over its share: size, run keys, write budget); absent
    /// when none was refused for an hour ([`crate::refusals`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writes_refused: Option<WritesRefused>,
    /// `Online`: True (reason `Heartbeating`) while the device is heard from, False (reason `Silent`) after 90 s
    /// (three missed 30-s heartbeats) without one; judged only once the operator watches the heartbeat bucket, by
    /// when NATS stored each heartbeat rather than by the device's clock (docs/crds.md). Written when it changes,
    /// never per heartbeat; `lastTransitionTime` is when the operator noticed the change (a silence within a
    /// minute, by its periodic pass). Absent until first judged.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// How far the device's clock runs ahead of NATS's, in seconds (negative: behind), measured from the latest
    /// heartbeat the operator saw arrive (its own time minus when NATS stored it); absent within 5 s. Rewritten
    /// only when it moves by more than 5 s. The operator corrects a heartbeat it finds in the bucket at a start by
    /// it, so a device known to run behind is not taken for silent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock_offset_seconds: Option<i64>,
    /// The agent's automatic restarts (`device-info`'s `restarts`: systemd's `NRestarts` of its unit when the
    /// running agent started); absent from agents that do not report them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_restarts: Option<AgentRestarts>,
    /// What on the device is crash-looping now: `agent` (its `agentRestarts.crashLooping`), `workloads` (some of its
    /// `workloads.crashLooping`), or `agent-and-workloads`; absent when nothing is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crash_looping: Option<CrashLooping>,
    /// Why the device does not have a change yet: one reason per FleetDeployment rollout, AgentRelease or running
    /// TaskRun it is not updated to, as that change's planner decided it (at most 16; docs/crds.md, "Why a device is
    /// not updated").
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blocking: Vec<crate::blocking::Blocking>,
    /// How many more reasons than `blocking` lists; absent when none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocking_more: Option<u32>,
    /// Disk, memory and load as the device last reported them (`device-usage`), rounded so that small changes
    /// write nothing ([`crate::fleet::usage`]); absent until it reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<UsageStatus>,
}

/// A device's usage as its Device shows it (docs/crds.md, "Device: resources"). Percentages are rewritten when
/// they move by a whole point (memory: 5 points) from what is shown, sizes by 10 %, the load by half or by 1, and
/// everything at once when `diskFull` or `memoryPressure` changes.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UsageStatus {
    /// Every filesystem for the `Disk` column, those at or above 90 % with their free space: `root 41%,
    /// agentState 41%, containers 96% (12 MiB free)`.
    pub disk: String,
    /// The fullest filesystem's used percent (as `df` rounds: up; blocks reserved for root count as used).
    pub disk_used_percent: u32,
    /// Its role: `root`, `agentState` or `containers`.
    pub disk_role: String,
    /// True while some filesystem is at or above 90 % used (fleet-wire's `DISK_ALERT_PERCENT`): the dashboard
    /// alerts `DeviceDiskFull`.
    #[serde(default)]
    pub disk_full: bool,
    /// Every filesystem reported: root, agentState, containers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub filesystems: Vec<FilesystemStatus>,
    /// Memory for the `Mem` column: `40% available` or `3% available, pressure 12%`.
    pub memory: String,
    /// `MemAvailable` in percent of `MemTotal`.
    pub memory_available_percent: u32,
    /// `/proc/pressure/memory` `some avg10`, in percent; absent where the kernel has PSI off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_pressure_percent: Option<u32>,
    /// True while memory is under pressure (pressure at or above 10 %, or less than 5 % available: fleet-wire's
    /// `MemoryUsage::under_pressure`): the dashboard alerts `DeviceMemoryPressure`.
    #[serde(default)]
    pub memory_pressure: bool,
    /// The 1-minute load average, e.g. `0.42`.
    pub load1m: String,
    /// Online CPUs.
    pub cpus: u32,
}

/// One filesystem of a device.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FilesystemStatus {
    /// `root`, `agentState`, `containers` (or `unknown`: a role this operator does not know).
    pub role: String,
    /// Used percent (as `df` rounds: up).
    pub used_percent: u32,
    /// Bytes available to unprivileged users, to two significant digits.
    pub available_bytes: u64,
    /// Size in bytes, to two significant digits.
    pub size_bytes: u64,
}

/// A device agent's restarts.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentRestarts {
    /// Automatic restarts after a failure since the unit was last started by a person, a boot or a cutover.
    pub count: u32,
    /// When the running agent started (`device-info`'s `publishedAt`, the device's clock; RFC 3339, UTC).
    pub since: String,
    /// True while the agent counts as crash-looping by fleet-wire's rule, judged on the operator's pass: at least 3
    /// restarts, the latest start (`since`) within 10 minutes.
    #[serde(default)]
    pub crash_looping: bool,
}

/// What on a device is crash-looping.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum CrashLooping {
    /// The agent keeps restarting.
    Agent,
    /// Some workloads' containers keep restarting.
    Workloads,
    /// Both.
    AgentAndWorkloads,
}

impl CrashLooping {
    /// What is crash-looping given whether the agent is and whether some workloads are (`None`: nothing).
    pub fn of(agent: bool, workloads: bool) -> Option<Self> {
        match (agent, workloads) {
            (true, true) => Some(Self::AgentAndWorkloads),
            (true, false) => Some(Self::Agent),
            (false, true) => Some(Self::Workloads),
            (false, false) => None,
        }
    }
}

/// Where a device's agent upgrade is stuck.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Stalled {
    /// The phase (`preparing`, `stopping`, `starting`, `rolling-back`; `not-accepted` for a TaskRun's intent).
    pub phase: String,
    /// Since when it has been in it (RFC 3339, UTC; for a TaskRun: when NATS stored the intent).
    pub since: String,
    /// The TaskRun (`namespace/name`) whose system-upgrade intent the device has not accepted; absent for an
    /// agent upgrade.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_run: Option<String>,
}

/// A device's refused writes, from fleet-auth's reports (`fleet.device-refusals.<device>`).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WritesRefused {
    /// Refused writes since `since` (the count is written at most once a minute).
    pub count: u64,
    /// When the first of them was reported (RFC 3339, UTC).
    pub since: String,
    /// When the latest was reported.
    pub last_at: String,
    /// The latest refused write's bucket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket: Option<String>,
    /// Its kind: `over-budget`, `too-large`, `unknown-run`, `bad-key`, `not-writable`, or `flood` (fleet-auth's
    /// flood guard disconnected the device and refuses it for a cool-down; it stays `flood`, with its text, until
    /// the device has been quiet long enough for this field to go).
    pub kind: String,
    /// fleet-auth's text (e.g. `value of 9000 bytes is over device-info's limit of 8192 bytes`).
    pub reason: String,
}

/// Workload counts and the latest error, folded from `device-workload-status` by [`crate::deployments::health`].
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadHealth {
    /// Running with the desired spec.
    pub running: u32,
    /// The agent's last reconcile failed (e.g. the image could not be pulled) or the container exited.
    pub failed: u32,
    /// Not reported yet, starting, or being replaced.
    pub pending: u32,
    /// Of the failed, those whose container Podman keeps restarting (`crash-looping`: at least 3 restarts, the
    /// latest within 10 minutes); absent when none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub crash_looping: u32,
    /// The last error reported for the first failing workload: `device: workload: error` on a FleetDeployment
    /// (devices by name), `workload: error` on a Device; at most 1,024 characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latest_error: Option<String>,
}

/// A named set of devices: every Device (`selectAll: true`), or the Devices listed in `devices` plus those whose
/// labels match `selector`. Nothing is implied: a group with none of the three selects no device (condition
/// `Ready=False`, reason `EmptySelector`), so a mistyped or forgotten field never selects the whole fleet.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "fleet.nationtech.io",
    version = "v1alpha1",
    kind = "DeviceGroup",
    status = "DeviceGroupStatus",
    shortname = "fdg",
    printcolumn = r#"{"name":"Members","type":"integer","jsonPath":".status.memberCount"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct DeviceGroupSpec {
    /// Every Device is a member: the one way to select the whole fleet. Cannot be combined with `selector` or
    /// `devices` (condition `Ready=False`, reason `InvalidSpec`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub select_all: bool,
    /// Devices whose labels match: `matchLabels` is a conjunction; an empty or absent selector selects no device;
    /// `matchExpressions` is not supported yet and makes the group's source fail (condition `Ready=False`,
    /// reason `GroupSourceError`), which is never treated as an empty group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    /// Device ids that are members whatever their labels (each a fleet-wire `DeviceId`); an id with no Device yet
    /// becomes a member when its Device appears.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "string_list")]
    pub devices: Vec<String>,
}

/// Resolution of a group.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeviceGroupStatus {
    /// Number of member devices; absent while the source errors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member_count: Option<u32>,
    /// `Ready`: True when resolved (even to zero members); False with reason `EmptySelector` (selects nothing),
    /// `InvalidSpec` or `GroupSourceError` otherwise.
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// Where a deployment or release goes: devices in at least one allowed group AND matching `targetSelector`.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Placement {
    /// DeviceGroups this object may target (at least one); a device outside all of them is never targeted.
    pub allowed_groups: Vec<String>,
    /// Narrows the authorized devices: `matchLabels` is a conjunction; empty selects every authorized device;
    /// `matchExpressions` fails closed (condition `Ready=False`, reason `InvalidSpec`).
    #[serde(default)]
    pub target_selector: LabelSelector,
}

/// Podman workloads placed on devices.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "fleet.nationtech.io",
    version = "v1alpha1",
    kind = "FleetDeployment",
    status = "PlacementStatus",
    shortname = "fdep",
    printcolumn = r#"{"name":"Devices","type":"integer","jsonPath":".status.targetedDevices"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.rollout.phase"}"#,
    printcolumn = r#"{"name":"Updating","type":"integer","jsonPath":".status.rollout.updating"}"#,
    printcolumn = r#"{"name":"Updated","type":"integer","jsonPath":".status.rollout.updated"}"#,
    printcolumn = r#"{"name":"Healthy","type":"integer","jsonPath":".status.rollout.healthy"}"#,
    printcolumn = r#"{"name":"Pending","type":"integer","jsonPath":".status.rollout.pending"}"#,
    printcolumn = r#"{"name":"Failed","type":"integer","jsonPath":".status.rollout.failed"}"#,
    printcolumn = r#"{"name":"CrashLooping","type":"integer","priority":1,"jsonPath":".status.rollout.crashLooping"}"#,
    printcolumn = r#"{"name":"Running","type":"integer","jsonPath":".status.workloads.running"}"#,
    printcolumn = r#"{"name":"WorkloadsFailed","type":"integer","jsonPath":".status.workloads.failed"}"#,
    printcolumn = r#"{"name":"WorkloadsPending","type":"integer","priority":1,"jsonPath":".status.workloads.pending"}"#,
    printcolumn = r#"{"name":"Error","type":"string","priority":1,"jsonPath":".status.workloads.latestError"}"#,
    printcolumn = r#"{"name":"Halted","type":"string","priority":1,"jsonPath":".status.conditions[?(@.type==\"Halted\")].message"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct FleetDeploymentSpec {
    /// Which devices.
    #[serde(flatten)]
    pub placement: Placement,
    /// The workloads, each a fleet-wire `WorkloadSpec`, unique by name across every deployment on a device.
    /// Kept as JSON here and validated by [`crate::fleet::validate`], so that one invalid object gets an `InvalidSpec`
    /// condition instead of breaking the watch of every FleetDeployment.
    #[schemars(schema_with = "wire_object_list")]
    pub workloads: Vec<serde_json::Value>,
    /// Staged rollout of a change to `workloads`; absent: every targeted device at once. Same fields and rule as
    /// an AgentRelease's ([`RolloutSpec`]); devices not given the change yet keep the previous workloads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutSpec>,
    /// Secrets of type `kubernetes.io/dockerconfigjson` (Kubernetes' shape: `[{name}]`) in the operator's secrets
    /// namespace (`--secrets-namespace`, docs/secrets.md) whose registry credentials the targeted devices pull this
    /// deployment's images with: only the entries of the registries its images name reach a device.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_pull_secrets: Vec<SecretReference>,
}

/// A Secret named by a FleetDeployment (in the operator's secrets namespace).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretReference {
    /// The Secret's name.
    pub name: String,
}

/// Status of a placed object (FleetDeployment or AgentRelease).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlacementStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Devices targeted; absent when placement failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub targeted_devices: Option<u32>,
    /// AgentRelease only: devices already running their desired version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub up_to_date: Option<u32>,
    /// AgentRelease only: devices whose current attempt failed (never retried automatically).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<u32>,
    /// AgentRelease only: devices with an attempt in progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_progress: Option<u32>,
    /// FleetDeployment only: its workloads on the targeted devices (one per device and workload), counted from
    /// what the devices report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workloads: Option<WorkloadHealth>,
    /// AgentRelease only: targeted devices taken by a newer AgentRelease that targets them too (see
    /// docs/crds.md, "Two releases, one device"); absent when none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub superseded: Option<u32>,
    /// Where the rollout stands ([`crate::fleet::rollout`]): on an AgentRelease counted over the devices it owns, on a
    /// FleetDeployment (only with a `rollout` section) over its targeted devices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutStatus>,
    /// `Ready` (reasons `Placed`, `InvalidSpec`, `GroupSourceError`, `Conflict`) and `NatsReachable`; on a
    /// FleetDeployment also `Degraded` (True, reason `WorkloadsFailed`, while some of its workloads failed on their
    /// devices, and with a `rollout` section `Progressing` and `Halted`); on an AgentRelease also `Degraded`,
    /// `Progressing`, `Halted` and (when some of its devices are taken by a newer release) `Superseded`.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// The latest changes of the conditions (a condition appearing, or changing its status or reason), oldest
    /// first, at most 32 (`conditions::MAX_HISTORY`); written with the change itself, so it costs no write.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub condition_history: Vec<ConditionChange>,
}

/// One change of a condition, as `status.conditionHistory` keeps it.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConditionChange {
    /// When the operator wrote the change.
    pub time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
    /// The condition's type.
    #[serde(rename = "type")]
    pub type_: String,
    /// Its new status: `True`, `False` or `Unknown`.
    pub status: String,
    /// Its new reason.
    pub reason: String,
    /// Its message then (at most 256 characters, `conditions::MAX_HISTORY_MESSAGE_CHARS`).
    pub message: String,
}

/// How a change reaches its devices: `canary=true` devices first, the rest after every canary stayed healthy for
/// `soakSeconds`, at most `maxUnavailable` at once, halting on a failed canary or on more than `maxFailures` failed
/// devices among the rest. Absent: every targeted device at once and no halt (see docs/crds.md).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutSpec {
    /// Seconds each updated device must stay healthy after its update before it counts as healthy (a release:
    /// committed, heartbeating as the new version, its agent not restarted; a deployment: every workload of it
    /// running the new spec, not restarted); 0 up to 86,400. Default 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub soak_seconds: Option<u32>,
    /// Most non-canary devices updating or soaking at once: a count (`2`) or a percentage of the devices in the
    /// rollout (`"25%"`, rounded down, at least 1). Default `"100%"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<IntOrString>,
    /// Most failed non-canary devices tolerated: one more halts the rollout. A count or a percentage of the
    /// devices in the rollout (rounded down). Default 0: the first failure halts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_failures: Option<IntOrString>,
    /// A device in its soak whose latest heartbeat (a deployment: its latest workload status) is older than this
    /// many seconds counts as failed while it stays silent; 10 up to 86,400. Default 90 (three of the agent's
    /// default 30 s intervals).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_timeout_seconds: Option<u32>,
}

/// The phase of a rollout.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum RolloutPhase {
    /// Devices are being given the change or are updating.
    #[default]
    Progressing,
    /// Nothing is updating; updated devices are in their soak before more devices are released.
    Soaking,
    /// A failed canary or too many failures: no further device gets the change (condition `Halted`).
    Halted,
    /// Every device in the rollout runs the change (or failed within `maxFailures`).
    Complete,
    /// Nothing is left to give the change or to wait for, and no device runs it: every device in the rollout
    /// failed (a release without a `rollout` section, which never halts, whose every device failed).
    Failed,
}

/// Rollout counts over the devices in the rollout (targeted, owned, able to take the release).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStatus {
    /// Progressing, Soaking, Halted, Complete or Failed.
    pub phase: RolloutPhase,
    /// Running the change: soaking or healthy.
    pub updated: u32,
    /// Updated and past the soak (or already running the change before this release).
    pub healthy: u32,
    /// Updated, within the soak.
    pub soaking: u32,
    /// Given the change, not committed yet.
    pub updating: u32,
    /// Of `updating`: in one upgrade phase for longer than its bounds allow (condition `Progressing=False`,
    /// reason `Stalled`).
    #[serde(default)]
    pub stalled: u32,
    /// Not given the change yet.
    pub pending: u32,
    /// Failed the attempt, or restarted / fell silent during the soak, or crash-looping.
    pub failed: u32,
    /// Of `failed`: crash-looping (an updated agent, or a deployment's container, that keeps restarting: at least
    /// 3 restarts, the latest within 10 minutes); absent when none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub crash_looping: u32,
    /// When the first soak of a soaking device ends: its commit (a deployment: its workload's start) plus
    /// `soakSeconds`, by that device's clock; absent while no device soaks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub soak_ends_at: Option<String>,
    /// The devices that get the change next, in order (canaries first, then the rest by name), at most 5; empty
    /// when the rollout is halted or nobody waits.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub next: Vec<String>,
    /// FleetDeployment only: the `fleet.nationtech.io/retry` annotation's value this status was decided under. A
    /// halt holds (even after the failed devices recover) until the annotation changes or the spec does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<String>,
    /// While halted: every failed device that halted it, with why (`attemptFailed`, `restarted`, `silent`,
    /// `crashLooping`, `unhealthy`), when they are at most 20 (none listed past that). A halt whose every cause is a
    /// device silent during its soak that has since left the rollout (retired, deleted, or no longer in its
    /// groups) lifts by itself (docs/crds.md, "Rollouts"); any other keeps it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub halted_by: Vec<HaltCause>,
}

/// One failed device that halted a rollout.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HaltCause {
    /// The device.
    pub device: String,
    /// Why it counts as failed: `attemptFailed`, `restarted`, `silent`, `crashLooping` or `unhealthy`.
    pub failure: String,
}

/// The desired agent version for one architecture. Plain strings here, validated into fleet-wire types by
/// [`crate::fleet::validate`] (an invalid build gets an `InvalidSpec` condition).
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReleaseBuild {
    /// `amd64` or `arm64` (fleet-wire `Architecture`).
    pub architecture: String,
    /// The version the agent must report after the upgrade (fleet-wire `Version`).
    pub version: String,
    /// `https://…` or `oci://…` (fleet-wire `Artifact`).
    pub artifact: String,
    /// SHA-256 of the artifact bytes (64 lowercase hex digits).
    pub sha256: String,
    /// Largest artifact accepted, in bytes (1 up to 100 MiB).
    pub byte_limit: u64,
}

/// The desired agent release: one build per architecture, placed like a FleetDeployment.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "fleet.nationtech.io",
    version = "v1alpha1",
    kind = "AgentRelease",
    status = "PlacementStatus",
    shortname = "frel",
    printcolumn = r#"{"name":"Devices","type":"integer","jsonPath":".status.targetedDevices"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.rollout.phase"}"#,
    printcolumn = r#"{"name":"Updating","type":"integer","jsonPath":".status.rollout.updating"}"#,
    printcolumn = r#"{"name":"Updated","type":"integer","jsonPath":".status.rollout.updated"}"#,
    printcolumn = r#"{"name":"Healthy","type":"integer","jsonPath":".status.rollout.healthy"}"#,
    printcolumn = r#"{"name":"Pending","type":"integer","jsonPath":".status.rollout.pending"}"#,
    printcolumn = r#"{"name":"Failed","type":"integer","jsonPath":".status.rollout.failed"}"#,
    printcolumn = r#"{"name":"CrashLooping","type":"integer","priority":1,"jsonPath":".status.rollout.crashLooping"}"#,
    printcolumn = r#"{"name":"UpToDate","type":"integer","priority":1,"jsonPath":".status.upToDate"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Degraded","type":"string","jsonPath":".status.conditions[?(@.type==\"Degraded\")].status"}"#,
    printcolumn = r#"{"name":"Halted","type":"string","priority":1,"jsonPath":".status.conditions[?(@.type==\"Halted\")].message"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct AgentReleaseSpec {
    /// Which devices.
    #[serde(flatten)]
    pub placement: Placement,
    /// One build per architecture.
    pub builds: Vec<ReleaseBuild>,
    /// Staged rollout; absent: every targeted device at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutSpec>,
}

/// Every CRD, in the order crdgen writes them, with unknown spec fields kept for the webhook to refuse.
pub fn all_crds(
) -> Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>
{
    use kube::CustomResourceExt;
    let mut crds = vec![
        Device::crd(),
        DeviceGroup::crd(),
        FleetDeployment::crd(),
        AgentRelease::crd(),
        tasks::TaskRun::crd(),
        tasks::TaskSchedule::crd(),
        policy::WorkloadPolicy::crd(),
        diagnostics::DeviceDiagnostics::crd(),
    ];
    // Unknown spec fields reach the admission webhook, which refuses them (crate::schema), instead of being pruned.
    crds.iter_mut().for_each(crate::schema::keep_unknown_fields);
    crds
}
