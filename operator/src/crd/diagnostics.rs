//! The `DeviceDiagnostics` CRD (`fleet.nationtech.io/v1alpha1`, cluster-scoped): one request for diagnostics of
//! one device (fleet-wire's `DiagnosticsRequest`: a fixed menu of items, never a command, a path or a shell) and,
//! in its status, the device's answer. Who may ask is ordinary RBAC on this kind; reading a bundle is `get` on the
//! object. The controller is [`crate::diagnostics`]; docs/diagnostics.md is what a person reads.

use fleet_wire::diagnostics::{Item, DEFAULT_LINES, MAX_LINES, MAX_SINCE_SECONDS, MAX_WORKLOADS};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Longest `ttlSecondsAfterFinished`: 7 days, the `diagnostics-request` bucket's age limit.
pub const MAX_TTL_SECONDS: u64 = 7 * 24 * 3600;
/// `ttlSecondsAfterFinished` when none is given: a day, as long as the bundle stays in NATS.
pub const DEFAULT_TTL_SECONDS: u64 = 24 * 3600;

fn default_lines() -> u32 {
    DEFAULT_LINES
}

fn default_ttl() -> u64 {
    DEFAULT_TTL_SECONDS
}

/// `items`: names of fleet-wire `Item`s, each at most once.
fn items_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let names: Vec<&str> = Item::ALL.iter().map(|i| i.name()).collect();
    schemars::json_schema!({
        "type": "array", "maxItems": Item::ALL.len(),
        "items": {"type": "string", "enum": names}
    })
}

/// `workloads`: workload names (fleet-wire checks their shape), at most `MAX_WORKLOADS`.
fn workloads_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array", "maxItems": MAX_WORKLOADS, "items": {"type": "string"}
    })
}

fn lines_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "integer", "format": "int32", "minimum": 1, "maximum": MAX_LINES, "default": DEFAULT_LINES
    })
}

fn since_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "integer", "format": "int64", "minimum": 1, "maximum": MAX_SINCE_SECONDS
    })
}

fn ttl_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "integer", "format": "int64", "minimum": 0, "maximum": MAX_TTL_SECONDS,
        "default": DEFAULT_TTL_SECONDS
    })
}

/// A string with no default in the schema: the 1.20 API server takes an empty string in a CRD (a default, a
/// value) for null and refuses it, so empty texts are left out instead.
fn plain_string(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"type": "string"})
}

/// Asks device `device` for diagnostics once. The spec cannot change after creation (admission webhook): the
/// object's UID names the one request written to the device.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "fleet.nationtech.io",
    version = "v1alpha1",
    kind = "DeviceDiagnostics",
    plural = "devicediagnostics",
    status = "DeviceDiagnosticsStatus",
    shortname = "fdiag",
    printcolumn = r#"{"name":"Device","type":"string","jsonPath":".spec.device"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Message","type":"string","priority":1,"jsonPath":".status.message"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct DeviceDiagnosticsSpec {
    /// The device (its Device's name, the device id).
    pub device: String,
    /// What to collect (`workloadLogs`, `containers`, `disk`, `memory`, `agentJournal`, `updaterJournal`,
    /// `failedUnits`, `bootDiagnostics`, `updaterState`); every item when absent or empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "items_schema")]
    pub items: Vec<String>,
    /// The workloads whose logs `workloadLogs` collects (at most 16); every fleet workload of the device when
    /// absent or empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "workloads_schema")]
    pub workloads: Vec<String>,
    /// Newest lines per section, 1 to 2,000 (default 200).
    #[serde(default = "default_lines")]
    #[schemars(schema_with = "lines_schema")]
    pub lines: u32,
    /// Only what was logged in the last this many seconds (1 up to 30 days); everything kept when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "since_schema")]
    pub since_seconds: Option<u64>,
    /// Seconds after the request finished (Complete or Failed) until the operator deletes this object, bundle and
    /// all: 0 up to 7 days (default a day).
    #[serde(default = "default_ttl")]
    #[schemars(schema_with = "ttl_schema")]
    pub ttl_seconds_after_finished: u64,
}

/// Where a request is.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum DiagnosticsPhase {
    /// Written for the device, which is online (or not judged yet): waiting for its answer. Or queued, not
    /// written yet: another request of the device is open, or the fleet's limit of open requests is reached
    /// (`message` says which).
    Pending,
    /// The device is offline: the request waits for it (up to 7 days).
    Waiting,
    /// The device answered: the bundle is in `status.bundle`.
    Complete,
    /// No answer will come: no such Device, an invalid spec, 7 days unanswered, a bundle that does not answer
    /// this request, or a write NATS refused (`message` says which).
    Failed,
}

impl DiagnosticsPhase {
    /// Complete or Failed: nothing more happens but the deletion after `ttlSecondsAfterFinished`.
    pub fn finished(self) -> bool {
        matches!(self, Self::Complete | Self::Failed)
    }
}

/// One collected section, as the device sent it (its text redacted and bounded on the device).
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DiagnosticsSection {
    /// The item (`disk`, `workloadLogs`, …).
    pub item: String,
    /// The workload, for `workloadLogs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload: Option<String>,
    /// The text, newest lines last (at most 32 KiB); absent when empty.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(schema_with = "plain_string")]
    pub text: String,
    /// Older lines were left out to stay within the bounds.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cut: bool,
    /// Why the item could not be collected (whole or in part).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The device's answer (fleet-wire's `DiagnosticsBundle`, at most 112 KiB of JSON).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DiagnosticsBundleStatus {
    /// When the device collected it (the device's clock; RFC 3339, UTC).
    pub collected_at: String,
    /// How many strings the device redacted.
    #[serde(default)]
    pub redacted: u32,
    /// Some section was cut to fit the bundle's bound.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cut: bool,
    /// The sections, in the menu's order.
    #[serde(default)]
    pub sections: Vec<DiagnosticsSection>,
}

impl From<fleet_wire::diagnostics::DiagnosticsBundle> for DiagnosticsBundleStatus {
    fn from(b: fleet_wire::diagnostics::DiagnosticsBundle) -> Self {
        Self {
            collected_at: b.collected_at.to_string(),
            redacted: b.redacted,
            cut: b.cut,
            sections: b
                .sections
                .into_iter()
                .map(|s| DiagnosticsSection {
                    item: s.item.name().to_owned(),
                    workload: s.workload.map(|w| w.as_str().to_owned()),
                    text: s.text,
                    cut: s.cut,
                    error: s.error.filter(|e| !e.is_empty()),
                })
                .collect(),
        }
    }
}

/// What the operator observed of a request.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeviceDiagnosticsStatus {
    /// Pending, Waiting, Complete or Failed; absent until the operator has seen the object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<DiagnosticsPhase>,
    /// Why it is in that phase, for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When the request was written for the device (RFC 3339, UTC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_at: Option<String>,
    /// When it finished (Complete or Failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<String>,
    /// The device's answer, once Complete.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bundle: Option<DiagnosticsBundleStatus>,
}
