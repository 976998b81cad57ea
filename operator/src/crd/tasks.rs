//! The fleet task CRDs (`fleet.nationtech.io/v1alpha1`, namespaced): `TaskRun`, a finite job that freezes its
//! targets, runs once on each device and keeps a bounded terminal result (status: fleet-wire's `TaskRunStatus` plus
//! conditions); and `TaskSchedule`, which creates immutable TaskRuns on a UTC schedule.

use super::{is_zero, Placement};
use fleet_wire::{TaskRunPhase, TaskRunReason, TaskRunStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// When `obj` was created (its `creationTimestamp`; now if it has none yet): a run's deadline and a schedule's first
/// tick count from it.
pub fn created_at<K: kube::Resource>(obj: &K) -> fleet_wire::Timestamp {
    obj.meta()
        .creation_timestamp
        .as_ref()
        .map(|t| fleet_wire::Timestamp::from_unix_ms(t.0.as_millisecond().max(0) as u64))
        .unwrap_or_else(fleet_wire::Timestamp::now)
}

/// Largest `deadlineSeconds`: 30 days, the age limit of `system-upgrade-intent`, so that an intent never outlives
/// its own expiry unnoticed.
pub const MAX_DEADLINE_SECONDS: u64 = 30 * 24 * 3600;

/// The built-in system upgrade. Empty on purpose: apt, dpkg, repository and reboot policy are compiled into the
/// updater, so the API cannot carry package names, repositories, commands or reboot arguments.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SystemUpgradeV1 {}

/// `systemUpgradeV1` must be an empty object: the API server refuses any field in it (kept, not pruned, so that
/// `maxProperties: 0` sees it and the create fails instead of silently dropping the field).
fn empty_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object", "maxProperties": 0, "x-kubernetes-preserve-unknown-fields": true
    })
}

/// `deadlineSeconds`: 1 s up to [`MAX_DEADLINE_SECONDS`].
fn deadline_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "integer", "format": "int64", "minimum": 1, "maximum": MAX_DEADLINE_SECONDS
    })
}

/// Runs the built-in system upgrade once on every device that is a member of an allowed group AND matches
/// `targetSelector` AND advertises `AptFullUpgradeV1`. The spec cannot change after creation (admission webhook).
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "fleet.nationtech.io",
    version = "v1alpha1",
    kind = "TaskRun",
    namespaced,
    status = "TaskRunCrStatus",
    shortname = "ftr",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Targets","type":"integer","jsonPath":".status.targets"}"#,
    printcolumn = r#"{"name":"Succeeded","type":"integer","jsonPath":".status.succeeded"}"#,
    printcolumn = r#"{"name":"Failed","type":"integer","jsonPath":".status.failed"}"#,
    printcolumn = r#"{"name":"Stalled","type":"integer","jsonPath":".status.stalled"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.reason"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct TaskRunSpec {
    /// Which devices (the same rule as FleetDeployment and AgentRelease).
    #[serde(flatten)]
    pub placement: Placement,
    /// Seconds from the run's creation until its deadline; copied into every attempt as `expiresAt`.
    #[schemars(schema_with = "deadline_schema")]
    pub deadline_seconds: u64,
    /// The built-in `apt full-upgrade` (then a coordinated reboot when required): `{}`.
    #[schemars(schema_with = "empty_object")]
    pub system_upgrade_v1: SystemUpgradeV1,
}

/// A TaskRun's status: fleet-wire's bounded `TaskRunStatus` (phase, counts, times, one reason, the latest error)
/// and conditions. Never a per-device map: the per-device view lives in NATS KV.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TaskRunCrStatus {
    /// Phase, counts, times, reason, latest error.
    #[serde(flatten)]
    pub run: TaskRunStatus,
    /// Released devices that have not accepted their intent within the accept timeout ([`super::stall`]), while
    /// the run is running; absent when none (the `Progressing` condition names them).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub stalled: u32,
    /// `Ready` (True while planning or running normally and when complete; False with the failure reason),
    /// `Progressing` (False with reason `Stalled` naming the stalled devices) and `NatsReachable`.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// The spec as the operator first accepted it (at generation 1). The run acts only while its spec equals this:
    /// the admission webhook refuses spec edits, and without it the operator refuses to act on an edited run
    /// ([`super::status::spec_check`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frozen_spec: Option<serde_json::Value>,
}

impl crate::conditions::WithConditions for TaskRunCrStatus {
    fn conditions(&self) -> &[Condition] {
        &self.conditions
    }
}

impl JsonSchema for TaskRunCrStatus {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "TaskRunCrStatus".into()
    }

    fn json_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let conditions = g.subschema_for::<Vec<Condition>>();
        // The names exactly as fleet-wire serializes them.
        let names = |v: Vec<serde_json::Value>| serde_json::Value::Array(v);
        let phases = names(
            TaskRunPhase::ALL
                .iter()
                .filter_map(|p| serde_json::to_value(p).ok())
                .collect(),
        );
        let reasons = names(
            TaskRunReason::ALL
                .iter()
                .filter_map(|r| serde_json::to_value(r).ok())
                .collect(),
        );
        schemars::json_schema!({
            "type": "object",
            "properties": {
                "phase": {"type": "string", "enum": phases},
                "targets": {"type": "integer", "format": "uint32", "minimum": 0},
                "succeeded": {"type": "integer", "format": "uint32", "minimum": 0},
                "failed": {"type": "integer", "format": "uint32", "minimum": 0},
                "startTime": {"type": "string", "format": "date-time"},
                "completionTime": {"type": "string", "format": "date-time"},
                "reason": {"type": "string", "enum": reasons},
                "latestError": {"type": "string", "maxLength": fleet_wire::limits::MAX_TEXT_CHARS},
                "stalled": {"type": "integer", "format": "uint32", "minimum": 0},
                "conditions": conditions,
                "frozenSpec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
            }
        })
    }
}

/// `schedule`: one of `daily`, `weekly`, `yearly`, `cron`, validated by [`super::schedule::Schedule::parse`]
/// (kept whole, not pruned, so that a field such as a time zone makes the spec invalid instead of vanishing).
fn schedule_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"type": "object", "x-kubernetes-preserve-unknown-fields": true})
}

/// Creates a TaskRun from `template` at every tick of `schedule` (UTC): at most one active run (a tick during it is
/// skipped), at most one catch-up run after an outage, none while suspended.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "fleet.nationtech.io",
    version = "v1alpha1",
    kind = "TaskSchedule",
    namespaced,
    status = "TaskScheduleStatus",
    shortname = "fts",
    printcolumn = r#"{"name":"Schedule","type":"string","jsonPath":".status.expression"}"#,
    printcolumn = r#"{"name":"Suspend","type":"boolean","jsonPath":".spec.suspend"}"#,
    printcolumn = r#"{"name":"Active","type":"string","jsonPath":".status.activeRun"}"#,
    printcolumn = r#"{"name":"Last","type":"date","jsonPath":".status.lastScheduleTime"}"#,
    printcolumn = r#"{"name":"Next","type":"string","jsonPath":".status.nextTick"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct TaskScheduleSpec {
    /// `{daily: {at: "03:00"}}`, `{weekly: {day: Sunday, at: "03:00"}}`, `{yearly: {month: 1, day: 1, at:
    /// "00:00"}}` or `{cron: "0 3 * * 0"}`; always UTC.
    #[schemars(schema_with = "schedule_schema")]
    pub schedule: serde_json::Value,
    /// No new runs while true (an active run goes on).
    #[serde(default)]
    pub suspend: bool,
    /// The spec of every run.
    pub template: TaskRunSpec,
}

/// A TaskSchedule's status (bounded: names and times, one counter).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskScheduleStatus {
    /// The five-field UTC cron expression the schedule runs on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expression: Option<String>,
    /// The last tick handled (a run created, or the tick skipped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_schedule_time: Option<String>,
    /// The newest of its runs that completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_successful_run: Option<String>,
    /// Its run that is not terminal yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_run: Option<String>,
    /// Ticks skipped (a run was active, or the schedule was suspended).
    #[serde(default)]
    pub skipped_ticks: u64,
    /// The next tick.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_tick: Option<String>,
    /// `Ready`: True when the schedule is valid, False with reason `InvalidSpec` otherwise.
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

impl crate::conditions::WithConditions for TaskScheduleStatus {
    fn conditions(&self) -> &[Condition] {
        &self.conditions
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_schema_names_every_phase_and_reason() {
        let s = serde_json::to_value(schemars::schema_for!(TaskRunCrStatus)).expect("schema");
        let p = &s["properties"];
        assert_eq!(p["phase"]["enum"].as_array().map(Vec::len), Some(4));
        assert_eq!(p["reason"]["enum"][0], "NoTargets");
        assert_eq!(p["reason"]["enum"].as_array().map(Vec::len), Some(7));
    }

    #[test]
    fn spec_refuses_fields_in_system_upgrade() {
        let ok: TaskRunSpec = serde_json::from_value(serde_json::json!({
            "allowedGroups": ["production"], "targetSelector": {"matchLabels": {"device-id": "device-1"}},
            "deadlineSeconds": 21600, "systemUpgradeV1": {}
        }))
        .expect("seed example");
        assert_eq!(ok.placement.allowed_groups, ["production"]);
        assert!(serde_json::from_value::<TaskRunSpec>(serde_json::json!({
            "allowedGroups": ["p"], "deadlineSeconds": 1, "systemUpgradeV1": {"packages": ["x"]}
        }))
        .is_err());
    }
}
