//! The TaskRun admission check: refuses any change to a TaskRun's spec (the run UID identifies one immutable plan
//! and operation). The 1.20 API server has no CEL, so immutability is enforced here; [`crate::webhook`] serves it
//! and `operator/deploy/webhook.yaml` registers it.

use serde_json::Value;

/// The path the API server posts TaskRun `AdmissionReview`s to.
pub const PATH: &str = "/validate-taskrun";

/// The answer to one `AdmissionReview` request (pure): allowed unless an UPDATE changes `spec`.
pub fn review(request: &Value) -> Value {
    let uid = request.pointer("/request/uid");
    let op = request
        .pointer("/request/operation")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let new = request.pointer("/request/object/spec");
    let old = request.pointer("/request/oldObject/spec");
    let denied = op == "UPDATE" && new != old;
    crate::webhook::answer(
        uid,
        denied.then_some(
            "TaskRun spec is immutable: its UID names one frozen target plan and operation; create a new TaskRun instead",
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn review_table() {
        let spec = json!({"allowedGroups": ["p"], "targetSelector": {}, "deadlineSeconds": 60, "systemUpgradeV1": {}});
        let mut changed = spec.clone();
        changed["deadlineSeconds"] = json!(61);
        let req = |op: &str, new: &Value, old: Option<&Value>| {
            let mut r =
                json!({"request": {"uid": "u-1", "operation": op, "object": {"spec": new}}});
            if let Some(o) = old {
                r["request"]["oldObject"] = json!({"spec": o});
            }
            r
        };
        let cases = [
            (req("CREATE", &spec, None), true),
            (req("UPDATE", &spec, Some(&spec)), true),
            (req("UPDATE", &changed, Some(&spec)), false),
            (req("DELETE", &spec, Some(&changed)), true),
        ];
        for (i, (r, allowed)) in cases.iter().enumerate() {
            let out = review(r);
            assert_eq!(out["response"]["uid"], "u-1", "case {i}");
            assert_eq!(out["response"]["allowed"], *allowed, "case {i}");
            assert_eq!(out["kind"], "AdmissionReview");
        }
        let denied = review(&cases[2].0);
        assert!(denied["response"]["status"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("immutable")));
    }
}
