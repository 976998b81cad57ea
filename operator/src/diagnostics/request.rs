//! What a `DeviceDiagnostics` object asks, as fleet-wire's [`DiagnosticsRequest`], and where it is written: one
//! function for the admission webhook and the controller alike, so that what the webhook lets in is exactly what
//! the operator writes.

use crate::crd::diagnostics::{DeviceDiagnostics, DeviceDiagnosticsSpec};
use fleet_wire::diagnostics::{DiagnosticsRequest, Item};
use fleet_wire::{AttemptId, DeviceId, Timestamp, ValidationError, WorkloadName};

/// The request `spec` makes (made at `requested_at`), checked against fleet-wire's bounds; the error names the
/// field (`spec.items[2]: …`).
pub fn of(
    spec: &DeviceDiagnosticsSpec,
    requested_at: Timestamp,
) -> Result<DiagnosticsRequest, String> {
    let r = build(spec, requested_at);
    let errors = problems_of(spec, &r);
    match errors.is_empty() {
        true => Ok(r),
        false => Err(errors.join("; ")),
    }
}

/// Every problem of `spec`, each with its full path (`spec.items[1]: …`); empty: valid.
pub fn problems(spec: &DeviceDiagnosticsSpec) -> Vec<String> {
    problems_of(spec, &build(spec, Timestamp::now()))
}

/// The request `spec` asks for, its invalid entries left out (they are [`problems_of`]).
fn build(spec: &DeviceDiagnosticsSpec, requested_at: Timestamp) -> DiagnosticsRequest {
    let mut items = Vec::with_capacity(spec.items.len());
    for name in &spec.items {
        if let Some(item) = Item::ALL.into_iter().find(|it| it.name() == name) {
            if !items.contains(&item) {
                items.push(item);
            }
        }
    }
    DiagnosticsRequest {
        items,
        workloads: spec
            .workloads
            .iter()
            .filter_map(|w| WorkloadName::try_from(w.as_str()).ok())
            .collect(),
        lines: spec.lines,
        since_seconds: spec.since_seconds,
        requested_at,
    }
}

fn problems_of(spec: &DeviceDiagnosticsSpec, r: &DiagnosticsRequest) -> Vec<String> {
    let mut errors = Vec::new();
    if let Err(e) = DeviceId::try_from(spec.device.as_str()) {
        errors.push(format!("spec.device: {e}"));
    }
    let mut seen = Vec::new();
    for (i, name) in spec.items.iter().enumerate() {
        match Item::ALL.into_iter().find(|it| it.name() == name) {
            None => errors.push(format!("spec.items[{i}]: {name:?} is not an item")),
            Some(item) if seen.contains(&item) => {
                errors.push(format!("spec.items[{i}]: {name:?} is named twice"))
            }
            Some(item) => seen.push(item),
        }
    }
    for (i, w) in spec.workloads.iter().enumerate() {
        if let Err(e) = WorkloadName::try_from(w.as_str()) {
            errors.push(format!("spec.workloads[{i}]: {e}"));
        }
    }
    if let Err(e) = r.validate() {
        errors.push(format!("spec.{}: {}", e.field, e.reason));
    }
    if spec.ttl_seconds_after_finished > crate::crd::diagnostics::MAX_TTL_SECONDS {
        errors.push(format!(
            "spec.ttlSecondsAfterFinished: {} is over {} (7 days)",
            spec.ttl_seconds_after_finished,
            crate::crd::diagnostics::MAX_TTL_SECONDS
        ));
    }
    errors
}

/// The object's request id: its UID (a UUID, so that a deleted and re-created object of the same name is another
/// request).
pub fn id(obj: &DeviceDiagnostics) -> Result<AttemptId, ValidationError> {
    AttemptId::try_from(obj.metadata.uid.as_deref().unwrap_or_default())
}

/// The object's KV key in both buckets, `<device>.<uid>`; `None` when its device or UID is not valid.
pub fn key(obj: &DeviceDiagnostics) -> Option<(DeviceId, AttemptId, String)> {
    let device = DeviceId::try_from(obj.spec.device.as_str()).ok()?;
    let uid = id(obj).ok()?;
    let key = fleet_wire::kv::run_key(&device, &uid);
    Some((device, uid, key))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(v: serde_json::Value) -> DeviceDiagnosticsSpec {
        serde_json::from_value(v).expect("spec")
    }

    #[test]
    fn a_spec_becomes_the_request_or_names_its_bad_field() {
        let at = Timestamp::from_unix_ms(1_000);
        let r = of(&spec(serde_json::json!({"device": "dev-1"})), at).expect("valid");
        assert_eq!((r.lines, r.items.len(), r.since_seconds), (200, 0, None));
        let r = of(
            &spec(
                serde_json::json!({"device": "dev-1", "items": ["disk", "workloadLogs"],
                "workloads": ["web"], "lines": 5, "sinceSeconds": 60}),
            ),
            at,
        )
        .expect("valid");
        assert_eq!(r.items, vec![Item::Disk, Item::WorkloadLogs]);
        let cases = [
            (serde_json::json!({"device": "Dev_1"}), "spec.device"),
            (
                serde_json::json!({"device": "d", "items": ["shell"]}),
                "spec.items[0]",
            ),
            (
                serde_json::json!({"device": "d", "items": ["disk", "disk"]}),
                "spec.items[1]",
            ),
            (
                serde_json::json!({"device": "d", "workloads": ["a b"]}),
                "spec.workloads[0]",
            ),
            (serde_json::json!({"device": "d", "lines": 0}), "spec.lines"),
            (
                serde_json::json!({"device": "d", "lines": 2001}),
                "spec.lines",
            ),
            (
                serde_json::json!({"device": "d", "sinceSeconds": 0}),
                "spec.sinceSeconds",
            ),
            (
                serde_json::json!({"device": "d", "ttlSecondsAfterFinished": 604801}),
                "spec.ttlSecondsAfterFinished",
            ),
        ];
        for (v, field) in cases {
            let e = of(&spec(v.clone()), at).expect_err(&v.to_string());
            assert!(e.starts_with(field), "{v}: {e}");
        }
    }
}
