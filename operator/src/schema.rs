//! Unknown fields in fleet objects are refused, not pruned: the CRD schemas keep them
//! (`x-kubernetes-preserve-unknown-fields` on every object of the spec, see [`keep_unknown_fields`]) so that the
//! admission webhook sees them, and [`unknown_fields`] names each one by its path. Pure.
//!
//! Without the webhook (missing, bypassed, or an object stored before it was installed) the operator still sees
//! the kept fields: its caches mark them ([`mark_unknown`], `crate::cache`) and every controller refuses to act on
//! a marked object ([`refusal`]: `Ready=False`, reason `InvalidSpec`).
//!
//! Why not the API server alone: 1.20 prunes unknown fields while decoding a request, before admission, and has no
//! server-side `fieldValidation=Strict` (1.25+). A pruned typo (`devicez: [dev-2]`) would leave a valid-looking
//! object that means something else, so the schema keeps what it does not know and the webhook refuses it.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::OnceLock;

/// The annotation the operator's caches put on an object with unknown fields (their paths, a JSON list). In memory
/// only: the operator never writes it, and one set by a person is replaced by what the cache found.
pub const UNKNOWN_FIELDS_ANNOTATION: &str = "fleet.nationtech.io/unknown-fields";

/// Most unknown field paths one answer names (the count carries the rest).
pub const MAX_REPORTED: usize = 20;

/// Fields every object has at its root, checked by the API server itself.
const ROOT_FIELDS: [&str; 3] = ["apiVersion", "kind", "metadata"];

/// Marks the root and every object node of `spec` that lists `properties` with
/// `x-kubernetes-preserve-unknown-fields: true`, so the API server keeps unknown fields for the webhook to refuse.
/// `status` (written by the operator through its subresource) is left pruned.
pub fn keep_unknown_fields(crd: &mut CustomResourceDefinition) {
    for v in &mut crd.spec.versions {
        let Some(root) = v
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
        else {
            continue;
        };
        root.x_kubernetes_preserve_unknown_fields = Some(true);
        if let Some(spec) = root.properties.as_mut().and_then(|p| p.get_mut("spec")) {
            mark(spec);
        }
    }
}

fn mark(node: &mut JSONSchemaProps) {
    if let Some(props) = node.properties.as_mut() {
        node.x_kubernetes_preserve_unknown_fields = Some(true);
        props.values_mut().for_each(mark);
    }
    if let Some(JSONSchemaPropsOrArray::Schema(items)) = node.items.as_mut() {
        mark(items);
    }
    if let Some(JSONSchemaPropsOrBool::Schema(values)) = node.additional_properties.as_mut() {
        mark(values);
    }
}

/// The root schema of fleet kind `kind` (built once), or `None` for any other kind.
pub fn of(kind: &str) -> Option<&'static JSONSchemaProps> {
    static SCHEMAS: OnceLock<BTreeMap<String, JSONSchemaProps>> = OnceLock::new();
    SCHEMAS.get_or_init(schemas).get(kind)
}

/// Marks `meta` with `paths` (see [`UNKNOWN_FIELDS_ANNOTATION`]); with none, removes any mark.
pub fn mark_unknown(meta: &mut ObjectMeta, paths: &[String]) {
    let annotations = meta.annotations.get_or_insert_with(Default::default);
    annotations.remove(UNKNOWN_FIELDS_ANNOTATION);
    if !paths.is_empty() {
        let list = serde_json::to_string(paths).unwrap_or_default();
        annotations.insert(UNKNOWN_FIELDS_ANNOTATION.to_owned(), list);
    }
}

/// Why the operator refuses to act on `obj` (a cached fleet object, see [`mark_unknown`]): its unknown fields, as
/// the webhook would have named them; `None` when it has none.
pub fn refusal<K: kube::Resource<DynamicType = ()>>(obj: &K) -> Option<String> {
    unknown_problem(obj)
        .map(|m| format!("{m}; the operator acts on nothing in this object until it is fixed"))
}

/// The unknown fields the cache marked on `obj`, as one problem ([`unknown_message`]); `None` when it has none.
pub fn unknown_problem<K: kube::Resource<DynamicType = ()>>(obj: &K) -> Option<String> {
    let kind = K::kind(&());
    let list = obj
        .meta()
        .annotations
        .as_ref()?
        .get(UNKNOWN_FIELDS_ANNOTATION)?;
    let paths: Vec<String> = serde_json::from_str(list).ok()?;
    let root = of(&kind)?;
    (!paths.is_empty()).then(|| unknown_message(root, &paths))
}

/// The root schema of each fleet kind (`DeviceGroup` → its `openAPIV3Schema`).
pub fn schemas() -> BTreeMap<String, JSONSchemaProps> {
    crate::crd::all_crds()
        .into_iter()
        .filter_map(|crd| {
            let kind = crd.spec.names.kind.clone();
            let root = crd
                .spec
                .versions
                .into_iter()
                .next()?
                .schema?
                .open_api_v3_schema?;
            Some((kind, root))
        })
        .collect()
}

/// Every field of `object` that `root` (a fleet kind's schema) does not know, as paths (`spec.devicez`,
/// `spec.selector.matchLabel`, `spec.builds[1].sha`), in document order. A node with `properties` is closed; a map
/// (`additionalProperties`) checks its values; a node with neither (fleet-wire objects, validated by fleet-wire's
/// own types) is open.
pub fn unknown_fields(root: &JSONSchemaProps, object: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let Some(fields) = object.as_object() else {
        return out;
    };
    let props = root.properties.as_ref();
    for (k, v) in fields {
        if ROOT_FIELDS.contains(&k.as_str()) {
            continue;
        }
        match props.and_then(|p| p.get(k)) {
            Some(schema) => walk(schema, v, k, &mut out),
            None => out.push(k.clone()),
        }
    }
    out
}

fn walk(schema: &JSONSchemaProps, value: &Value, path: &str, out: &mut Vec<String>) {
    match value {
        Value::Object(fields) => {
            if let Some(props) = &schema.properties {
                for (k, v) in fields {
                    let at = format!("{path}.{k}");
                    match props.get(k) {
                        Some(s) => walk(s, v, &at, out),
                        None => out.push(at),
                    }
                }
            } else if let Some(JSONSchemaPropsOrBool::Schema(values)) =
                &schema.additional_properties
            {
                for (k, v) in fields {
                    walk(values, v, &format!("{path}.{k}"), out);
                }
            }
        }
        Value::Array(items) => {
            if let Some(JSONSchemaPropsOrArray::Schema(s)) = &schema.items {
                for (i, v) in items.iter().enumerate() {
                    walk(s, v, &format!("{path}[{i}]"), out);
                }
            }
        }
        _ => {}
    }
}

/// The denial message for `paths` (non-empty) on `kind` `name`: each path, bounded to [`MAX_REPORTED`], and
/// what the known fields are where the first one was found.
pub fn denial(kind: &str, name: &str, root: &JSONSchemaProps, paths: &[String]) -> String {
    format!("{kind} {name:?}: {}", unknown_message(root, paths))
}

/// [`denial`] without the object's kind and name (for the object's own condition).
pub fn unknown_message(root: &JSONSchemaProps, paths: &[String]) -> String {
    let shown: Vec<&str> = paths
        .iter()
        .take(MAX_REPORTED)
        .map(String::as_str)
        .collect();
    let more = paths.len() - shown.len();
    let tail = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    let noun = if paths.len() == 1 { "field" } else { "fields" };
    let mut msg = format!(
        "unknown {noun} {}{tail} (refused rather than silently dropped; see docs/crds.md)",
        shown.join(", ")
    );
    if let Some(known) = paths.first().and_then(|p| known_beside(root, p)) {
        msg.push_str(&format!("; known fields there: {}", known.join(", ")));
    }
    msg
}

/// The property names of the object that holds `path`'s last field.
fn known_beside(root: &JSONSchemaProps, path: &str) -> Option<Vec<String>> {
    let mut node = root;
    let parts: Vec<&str> = path.split('.').collect();
    for part in &parts[..parts.len().saturating_sub(1)] {
        let (name, indexed) = match part.split_once('[') {
            Some((n, _)) => (n, true),
            None => (*part, false),
        };
        node = node.properties.as_ref()?.get(name)?;
        if indexed {
            node = match node.items.as_ref()? {
                JSONSchemaPropsOrArray::Schema(s) => s,
                JSONSchemaPropsOrArray::Schemas(_) => return None,
            };
        }
    }
    let mut known: Vec<String> = node.properties.as_ref()?.keys().cloned().collect();
    if std::ptr::eq(node, root) {
        known.extend(ROOT_FIELDS.iter().map(|s| s.to_string()));
        known.sort();
    }
    Some(known)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema(kind: &str) -> JSONSchemaProps {
        schemas().remove(kind).expect("kind")
    }

    #[test]
    fn unknown_fields_table() {
        let cases: Vec<(&str, Value, Vec<&str>)> = vec![
            ("DeviceGroup", json!({"spec": {"selectAll": true}}), vec![]),
            (
                "DeviceGroup",
                json!({"apiVersion": "x", "kind": "DeviceGroup", "metadata": {"name": "a", "labels": {"x": "y"}},
                       "spec": {"devices": ["dev-2"], "selector": {"matchLabels": {"site": "a"}}}}),
                vec![],
            ),
            // a misspelt top-level field (`devicez` for `devices`), and nested ones
            (
                "DeviceGroup",
                json!({"spec": {"devicez": ["dev-2"], "selector": {}}}),
                vec!["spec.devicez"],
            ),
            (
                "DeviceGroup",
                json!({"spec": {"selector": {"matchLabel": {"a": "b"}, "matchExpressions": [{"key": "k", "operator": "In", "valuez": []}]}}}),
                vec![
                    "spec.selector.matchExpressions[0].valuez",
                    "spec.selector.matchLabel",
                ],
            ),
            ("Device", json!({"spec": {}, "sepc": {}}), vec!["sepc"]),
            (
                "AgentRelease",
                json!({"spec": {"allowedGroups": ["a"], "builds": [{"architecture": "amd64"}, {"sha": "x"}]}}),
                vec!["spec.builds[1].sha"],
            ),
            // fleet-wire objects are open here: fleet-wire's own types validate them
            (
                "FleetDeployment",
                json!({"spec": {"allowedGroups": ["a"], "targetSelector": {}, "workloads": [{"name": "w", "image": "x", "extra": 1}]}}),
                vec![],
            ),
            (
                "FleetDeployment",
                json!({"spec": {"allowedGroups": ["a"], "targetSelecter": {}, "workloads": []}}),
                vec!["spec.targetSelecter"],
            ),
            (
                "TaskRun",
                json!({"spec": {"allowedGroups": ["a"], "deadlineSeconds": 60, "systemUpgradeV1": {}, "retries": 3}}),
                vec!["spec.retries"],
            ),
            (
                "TaskSchedule",
                json!({"spec": {"suspend": true, "schedul": "x", "template": {"retries": 1}}}),
                vec!["spec.schedul", "spec.template.retries"],
            ),
        ];
        for (i, (kind, obj, want)) in cases.into_iter().enumerate() {
            assert_eq!(unknown_fields(&schema(kind), &obj), want, "case {i}");
        }
    }

    #[test]
    fn denial_names_paths_and_known_fields() {
        let root = schema("DeviceGroup");
        let paths = unknown_fields(&root, &json!({"spec": {"devicez": ["dev-2"]}}));
        let m = denial("DeviceGroup", "g", &root, &paths);
        assert_eq!(
            m,
            "DeviceGroup \"g\": unknown field spec.devicez (refused rather than silently dropped; see docs/crds.md); known fields there: devices, selectAll, selector"
        );
        let many: Vec<String> = (0..25).map(|i| format!("spec.x{i}")).collect();
        let m = denial("DeviceGroup", "g", &root, &many);
        assert!(
            m.contains("spec.x19 and 5 more") && !m.contains("spec.x20"),
            "{m}"
        );
        let m = denial("Device", "d", &schema("Device"), &["sepc".to_string()]);
        assert!(
            m.ends_with("known fields there: apiVersion, kind, metadata, spec, status"),
            "{m}"
        );
    }

    #[test]
    fn every_spec_object_keeps_unknown_fields_and_status_does_not() {
        for crd in crate::crd::all_crds() {
            let root = crd.spec.versions[0]
                .schema
                .clone()
                .unwrap()
                .open_api_v3_schema
                .unwrap();
            assert_eq!(root.x_kubernetes_preserve_unknown_fields, Some(true));
            let props = root.properties.unwrap();
            fn check(n: &JSONSchemaProps, want: bool) {
                if let Some(p) = &n.properties {
                    assert_eq!(
                        n.x_kubernetes_preserve_unknown_fields.unwrap_or(false),
                        want
                    );
                    p.values().for_each(|c| check(c, want));
                }
                if let Some(JSONSchemaPropsOrArray::Schema(s)) = &n.items {
                    check(s, want);
                }
            }
            check(&props["spec"], true);
            if let Some(status) = props.get("status") {
                check(status, false);
            }
        }
    }
}
