//! The DeviceDiagnostics admission check, served on the unknown-field path ([`crate::webhook::FIELDS_PATH`]): a
//! spec that is not a valid request is refused on create, and any change to the spec on update (the object's UID
//! names the one request written to the device; a changed spec would no longer say what was asked). The 1.20 API
//! server has no CEL rules (`self == oldSelf`), so immutability is enforced here; without the webhook the operator
//! acts on the spec it first wrote and ignores later edits.

use serde_json::Value;

/// Why `request` (an `AdmissionReview` of a DeviceDiagnostics) is refused; `None`: allowed.
pub fn problem(request: &Value) -> Option<String> {
    let new = request.pointer("/request/object/spec")?;
    if let Some(old) = request.pointer("/request/oldObject/spec") {
        if old != new {
            return Some(
                "spec is immutable: the object's UID names the one request written to the device; create another \
                 DeviceDiagnostics instead"
                    .into(),
            );
        }
        return None;
    }
    let spec: crate::crd::diagnostics::DeviceDiagnosticsSpec =
        match serde_json::from_value(new.clone()) {
            Ok(s) => s,
            Err(e) => return Some(format!("spec: {e}")),
        };
    super::request::of(&spec, fleet_wire::Timestamp::now()).err()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn create_is_checked_and_update_must_keep_the_spec() {
        let spec = json!({"device": "dev-1", "lines": 10});
        let mut changed = spec.clone();
        changed["lines"] = json!(11);
        let req = |new: &Value, old: Option<&Value>| {
            let mut r = json!({"request": {"object": {"spec": new}}});
            if let Some(o) = old {
                r["request"]["oldObject"] = json!({"spec": o});
            }
            r
        };
        assert_eq!(problem(&req(&spec, None)), None);
        assert_eq!(problem(&req(&spec, Some(&spec))), None);
        assert!(problem(&req(&changed, Some(&spec))).is_some_and(|m| m.contains("immutable")));
        assert!(
            problem(&req(&json!({"device": "dev-1", "items": ["shell"]}), None))
                .is_some_and(|m| m.contains("spec.items[0]"))
        );
        // Through the webhook's path: a typo is named, an edit refused.
        let review = |new: &Value, old: Option<&Value>| {
            let mut r = req(new, old);
            r["request"]["kind"] = json!({"kind": "DeviceDiagnostics"});
            r["request"]["object"]["metadata"] = json!({"name": "d"});
            crate::webhook::fields_review(&r, None)["response"].clone()
        };
        let typo = review(&json!({"device": "dev-1", "linez": 5}), None);
        assert_eq!(typo["allowed"], false);
        assert!(
            typo["status"]["message"]
                .as_str()
                .unwrap_or_default()
                .contains("spec.linez"),
            "{typo}"
        );
        let edit = review(&changed, Some(&spec));
        assert!(
            edit["status"]["message"]
                .as_str()
                .unwrap_or_default()
                .contains("immutable"),
            "{edit}"
        );
        assert_eq!(review(&spec, None)["allowed"], true);
        // An object being deleted (status or metadata updates of a finished one) keeps its spec: allowed.
        assert_eq!(problem(&json!({"request": {}})), None);
    }
}
