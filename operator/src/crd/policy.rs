//! The `WorkloadPolicy` CRD (`fleet.nationtech.io/v1alpha1`, cluster-scoped): which hardware and privileges the
//! workloads of FleetDeployments may ask for — device nodes, supplementary groups, added capabilities, host paths
//! as volumes, privileged mode. A workload asking for none of these needs no policy. The rules and the check are
//! [`crate::deployments::policy`]; docs/crds.md, "WorkloadPolicy", is what a person reads.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Allows what it lists to the workloads of every FleetDeployment it applies to: one whose namespace is listed in
/// `namespaces` (absent or empty: any namespace, and cluster-scoped FleetDeployments, which have none) and whose
/// every `allowedGroups` entry is listed in `groups`. Several policies that apply add up. Host PID, IPC and network
/// namespaces are not offered by a workload at all, so no policy can allow them.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "fleet.nationtech.io",
    version = "v1alpha1",
    kind = "WorkloadPolicy",
    shortname = "fwp",
    printcolumn = r#"{"name":"Groups","type":"string","jsonPath":".spec.groups"}"#,
    printcolumn = r#"{"name":"Namespaces","type":"string","priority":1,"jsonPath":".spec.namespaces"}"#,
    printcolumn = r#"{"name":"Devices","type":"string","jsonPath":".spec.devices"}"#,
    printcolumn = r#"{"name":"Capabilities","type":"string","jsonPath":".spec.capabilities"}"#,
    printcolumn = r#"{"name":"SupplementalGroups","type":"string","priority":1,"jsonPath":".spec.supplementalGroups"}"#,
    printcolumn = r#"{"name":"HostPaths","type":"string","priority":1,"jsonPath":".spec.hostPaths[*].path"}"#,
    printcolumn = r#"{"name":"Privileged","type":"boolean","jsonPath":".spec.privileged"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadPolicySpec {
    /// Namespaces of the FleetDeployments it applies to; absent or empty: any (FleetDeployments are cluster-scoped
    /// today and have no namespace: a policy that lists namespaces applies to none of them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "super::string_list")]
    pub namespaces: Vec<String>,
    /// DeviceGroup names: it applies to a FleetDeployment only when every one of the deployment's `allowedGroups`
    /// is listed here (a deployment that may reach other devices too is not covered). Required.
    #[schemars(schema_with = "super::string_list")]
    pub groups: Vec<String>,
    /// Device nodes allowed: exact paths under `/dev/` (`/dev/ttyS0`), or a prefix ending in `*`
    /// (`/dev/ttyUSB*`, which also matches `/dev/ttyUSB0` and anything below a directory it names).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "super::string_list")]
    pub devices: Vec<String>,
    /// Supplementary groups allowed (a workload's `groups`), by the same name or gid the workload gives.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "super::string_list")]
    pub supplemental_groups: Vec<String>,
    /// Added Linux capabilities allowed, without `CAP_` (`NET_ADMIN`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "super::string_list")]
    pub capabilities: Vec<String>,
    /// Host directories (and files) a workload may mount as volumes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub host_paths: Vec<HostPathAllowance>,
    /// Privileged mode allowed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub privileged: bool,
}

/// One host path a workload may mount: `path` itself and everything below it (`/srv/data` allows
/// `/srv/data/in`, never `/srv/database`).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostPathAllowance {
    /// Absolute host path, without `..`, `.` or a trailing `/` (`/` itself allows every host path).
    pub path: String,
    /// Required, so that nobody allows a writable mount by leaving it out: `true` allows read-only mounts only,
    /// `false` allows writable ones too.
    pub read_only: bool,
}
