//! One validation per fleet kind, shared by the admission webhook ([`crate::webhook`]) and the operator, so that
//! both say the same thing: every problem at once, each named by its full path from the object's root
//! (`spec.rollout.soakSeconds: must be 0 to 86400, not 100000`). Pure.
//!
//! [`problems`] checks a raw object as the webhook receives it: fields its kind's schema does not know
//! ([`crate::schema`]), then the spec decoded field by field ([`typed`]: a value of the wrong type is named by its
//! path, not only by serde's words), then the kind's own rules. The operator, which holds typed objects, calls the
//! kind's rules directly (`spec_problems_*`), after the unknown fields its cache marked.

use crate::crd::diagnostics::DeviceDiagnosticsSpec;
use crate::crd::policy::WorkloadPolicySpec;
use crate::crd::tasks::{TaskRunSpec, TaskScheduleSpec};
use crate::crd::{AgentReleaseSpec, DeviceGroupSpec, DeviceSpec, FleetDeploymentSpec, Placement};
use serde::de::DeserializeOwned;
use serde_json::Value;

/// `rel` (a path below `base`: `a.b`, `[0].c`, or empty) as a path from the root.
pub fn join(base: &str, rel: &str) -> String {
    match (base.is_empty(), rel.is_empty(), rel.starts_with('[')) {
        (_, true, _) => base.to_owned(),
        (true, false, _) => rel.to_owned(),
        (false, false, true) => format!("{base}{rel}"),
        (false, false, false) => format!("{base}.{rel}"),
    }
}

/// `value` decoded as a `T`; on failure, the path below `value` of the field that failed (empty: `value` itself)
/// and why, in plain words ([`plain`]). serde's own error names no field, so a failed decoding is done again from
/// text laid out one field per line, and the line of the error names the field.
pub fn typed<T: DeserializeOwned>(value: &Value) -> Result<T, (String, String)> {
    let first = match T::deserialize(value) {
        Ok(t) => return Ok(t),
        Err(e) => e.to_string(),
    };
    let mut text = String::new();
    let mut lines = vec![String::new()];
    layout(value, "", &mut text, &mut lines);
    match serde_json::from_str::<T>(&text) {
        Ok(t) => Ok(t),
        Err(e) => {
            let path = lines
                .get(e.line().saturating_sub(1))
                .cloned()
                .unwrap_or_default();
            let message = e.to_string();
            let message = match message.rfind(" at line ") {
                Some(i) => message[..i].to_owned(),
                None => first,
            };
            Err((path, plain(&message)))
        }
    }
}

/// [`typed`], going on after a field that does not decode: that field is left out and `value` decoded again, so
/// that every such field is named, not only the first (serde stops at it). It stops at a failure that is not one
/// field's (a rule of the whole object, a missing field, an item of a list), and at most after
/// [`MAX_TYPE_PROBLEMS`].
pub fn typed_all<T: DeserializeOwned>(value: &Value) -> Result<T, Vec<(String, String)>> {
    let mut value = value.clone();
    let mut found: Vec<(String, String)> = Vec::new();
    loop {
        let (path, why) = match typed::<T>(&value) {
            Ok(t) if found.is_empty() => return Ok(t),
            Ok(_) => return Err(found),
            Err(e) => e,
        };
        // The field a missing-field error names was left out by us: its own problem is already named.
        let left_out = why
            .strip_prefix("missing field `")
            .and_then(|r| r.split('`').next())
            .is_some_and(|k| found.iter().any(|(p, _)| *p == join(&path, k)));
        if left_out {
            return Err(found);
        }
        let parent = path.rfind('.').map_or("", |i| &path[..i]);
        let key = path
            .rfind('.')
            .map_or(path.as_str(), |i| &path[i + 1..])
            .to_owned();
        let removable =
            !key.is_empty() && !key.contains('[') && found.len() + 1 < MAX_TYPE_PROBLEMS;
        let parent_pointer = pointer(parent);
        found.push((path, why));
        if !removable {
            return Err(found);
        }
        let removed = value
            .pointer_mut(&parent_pointer)
            .and_then(Value::as_object_mut)
            .and_then(|m| m.remove(&key));
        if removed.is_none() {
            return Err(found);
        }
    }
}

/// Most problems [`typed_all`] names in one value.
pub const MAX_TYPE_PROBLEMS: usize = 20;

/// A path as [`join`] writes it (`a.b[2].c`) as a JSON pointer (`/a/b/2/c`).
fn pointer(path: &str) -> String {
    let mut out = String::new();
    for part in path.split('.').filter(|p| !p.is_empty()) {
        let mut pieces = part.split('[');
        if let Some(name) = pieces.next().filter(|n| !n.is_empty()) {
            out.push('/');
            out.push_str(&name.replace('~', "~0").replace('/', "~1"));
        }
        for index in pieces {
            out.push('/');
            out.push_str(index.trim_end_matches(']'));
        }
    }
    out
}

/// [`typed_all`] with each failure as a problem at `base` (the path of `value` from the object's root).
pub fn typed_at<T: DeserializeOwned>(value: &Value, base: &str) -> Result<T, Vec<String>> {
    typed_all(value).map_err(|all| {
        all.into_iter()
            .map(|(rel, why)| format!("{}: {why}", join(base, &rel)))
            .collect()
    })
}

/// Writes `v` as JSON with every field and item on a line of its own, recording each line's path in `lines`.
fn layout(v: &Value, path: &str, out: &mut String, lines: &mut Vec<String>) {
    let newline = |out: &mut String, lines: &mut Vec<String>, p: String| {
        out.push('\n');
        lines.push(p);
    };
    match v {
        Value::Object(m) => {
            out.push('{');
            for (i, (k, x)) in m.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                let child = join(path, k);
                newline(out, lines, child.clone());
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                layout(x, &child, out, lines);
            }
            newline(out, lines, path.to_owned());
            out.push('}');
        }
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                let child = format!("{path}[{i}]");
                newline(out, lines, child.clone());
                layout(x, &child, out, lines);
            }
            newline(out, lines, path.to_owned());
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// The range of a Rust integer type as serde names it (`u16`), in words.
fn range_of(ty: &str) -> Option<String> {
    let (lo, hi): (i128, i128) = match ty {
        "u8" => (0, u8::MAX.into()),
        "u16" => (0, u16::MAX.into()),
        "u32" => (0, u32::MAX.into()),
        "u64" | "usize" => (0, u64::MAX.into()),
        "i8" => (i8::MIN.into(), i8::MAX.into()),
        "i16" => (i16::MIN.into(), i16::MAX.into()),
        "i32" => (i32::MIN.into(), i32::MAX.into()),
        "i64" | "isize" => (i64::MIN.into(), i64::MAX.into()),
        _ => return None,
    };
    Some(format!("a whole number from {lo} to {hi}"))
}

/// What serde calls a value or a type (`integer `7``, `a sequence`), as a person would.
fn words(s: &str) -> String {
    let s = s.trim();
    if let Some(r) = range_of(s) {
        return r;
    }
    let tick = |p: &str| {
        s.strip_prefix(p)
            .map(|v| v.trim().trim_matches('`').to_owned())
    };
    if let Some(v) = tick("integer").or_else(|| tick("floating point")) {
        return format!("the number {v}");
    }
    if let Some(v) = tick("boolean") {
        return v;
    }
    if let Some(v) = s.strip_prefix("string ") {
        return format!("the string {v}");
    }
    match s {
        "map" | "a map" => "an object".into(),
        "sequence" | "a sequence" => "a list".into(),
        "unit value" | "null" => "null".into(),
        _ if s.starts_with("struct ") => "an object".into(),
        _ => s.to_owned(),
    }
}

/// serde's words for a decoding error in plain ones: `invalid value: integer `100000`, expected u16` is
/// `100000 is not a whole number from 0 to 65535`; `invalid type: integer `7`, expected a string` is `must be a
/// string, not the number 7`. Other messages are kept.
pub fn plain(message: &str) -> String {
    let split = |rest: &str| {
        rest.split_once(", expected ")
            .map(|(got, want)| (words(got), words(want)))
    };
    if let Some((got, want)) = message.strip_prefix("invalid type: ").and_then(split) {
        return format!("must be {want}, not {got}");
    }
    if let Some((got, want)) = message.strip_prefix("invalid value: ").and_then(split) {
        let got = got.strip_prefix("the number ").unwrap_or(&got).to_owned();
        return format!("{got} is not {want}");
    }
    message.to_owned()
}

/// Where the problems of a spec are reported: each `spec.<path>: <why>`.
pub type Problems = Vec<String>;

/// A placement's own problems (the same for FleetDeployment, AgentRelease, TaskRun and a TaskSchedule's
/// template), at `base` (`spec`, `spec.template`).
pub fn placement(p: &Placement, base: &str) -> Problems {
    let mut out = Vec::new();
    if p.allowed_groups.is_empty() {
        out.push(format!(
            "{}: must name at least one DeviceGroup",
            join(base, "allowedGroups")
        ));
    }
    if p.target_selector
        .match_expressions
        .as_ref()
        .is_some_and(|e| !e.is_empty())
    {
        out.push(format!(
            "{}: {}",
            join(base, "targetSelector.matchExpressions"),
            crate::fleet::placement::SelectorError::ExpressionsUnsupported
        ));
    }
    out
}

/// A FleetDeployment's spec: placement, workloads, image pull secrets and rollout.
pub fn deployment_spec(s: &FleetDeploymentSpec) -> Problems {
    crate::fleet::validate::deployment_problems(s)
        .err()
        .unwrap_or_default()
}

/// An AgentRelease's spec: placement, builds and rollout.
pub fn release_spec(s: &AgentReleaseSpec) -> Problems {
    crate::fleet::validate::release_problems(s)
        .err()
        .unwrap_or_default()
}

/// A DeviceGroup's spec: its device ids, and no `selectAll` beside a list or labels.
pub fn group_spec(s: &DeviceGroupSpec) -> Problems {
    let mut out = crate::fleet::placement::membership_problems(s);
    if s.selector
        .as_ref()
        .and_then(|sel| sel.match_expressions.as_ref())
        .is_some_and(|e| !e.is_empty())
    {
        out.push(format!(
            "spec.selector.matchExpressions: {}",
            crate::fleet::placement::SelectorError::ExpressionsUnsupported
        ));
    }
    out
}

/// A TaskRun's spec (at `base`: `spec`, or `spec.template` of a TaskSchedule).
pub fn run_spec(s: &TaskRunSpec, base: &str) -> Problems {
    let mut out = placement(&s.placement, base);
    if let Err(e) = crate::tasks::planning::deadline(s.deadline_seconds) {
        out.push(format!("{}: {e}", join(base, "deadlineSeconds")));
    }
    out
}

/// A TaskSchedule's spec: its schedule and its template.
pub fn schedule_spec(s: &TaskScheduleSpec) -> Problems {
    let mut out = Vec::new();
    if let Err((rel, why)) = crate::tasks::schedule::Schedule::check(&s.schedule) {
        out.push(format!("{}: {why}", join("spec.schedule", &rel)));
    }
    out.extend(run_spec(&s.template, "spec.template"));
    out
}

/// A WorkloadPolicy's spec.
pub fn policy_spec(s: &WorkloadPolicySpec) -> Problems {
    crate::deployments::policy::problems(s)
}

/// A DeviceDiagnostics' spec.
pub fn diagnostics_spec(s: &DeviceDiagnosticsSpec) -> Problems {
    crate::diagnostics::request::problems(s)
}

/// The spec problems of kind `kind`'s `spec` (raw JSON): decoded field by field, then its kind's rules. Nothing for
/// a kind that is not a fleet kind.
pub fn spec_problems(kind: &str, spec: &Value) -> Problems {
    fn run<T: DeserializeOwned>(spec: &Value, rules: impl Fn(&T) -> Problems) -> Problems {
        match typed_at::<T>(spec, "spec") {
            Ok(s) => rules(&s),
            Err(e) => e,
        }
    }
    match kind {
        "Device" => run::<DeviceSpec>(spec, |_| vec![]),
        "DeviceGroup" => run(spec, group_spec),
        "FleetDeployment" => run(spec, deployment_spec),
        "AgentRelease" => run(spec, release_spec),
        "TaskRun" => run(spec, |s| run_spec(s, "spec")),
        "TaskSchedule" => schedule_raw(spec),
        "WorkloadPolicy" => run(spec, policy_spec),
        "DeviceDiagnostics" => run(spec, diagnostics_spec),
        _ => vec![],
    }
}

/// A TaskSchedule's schedule is checked even when its template does not decode, and the other way round.
fn schedule_raw(spec: &Value) -> Problems {
    if let Ok(s) = typed::<TaskScheduleSpec>(spec) {
        return schedule_spec(&s);
    }
    let mut out = Vec::new();
    match spec.get("schedule") {
        Some(v) => {
            if let Err((rel, why)) = crate::tasks::schedule::Schedule::check(v) {
                out.push(format!("{}: {why}", join("spec.schedule", &rel)));
            }
        }
        None => out.push("spec.schedule: missing".into()),
    }
    match spec.get("template") {
        Some(t) => match typed_at::<TaskRunSpec>(t, "spec.template") {
            Ok(t) => out.extend(run_spec(&t, "spec.template")),
            Err(e) => out.extend(e),
        },
        None => out.push("spec.template: missing".into()),
    }
    if let Err(e) = typed_at::<bool>(
        spec.get("suspend").unwrap_or(&Value::Bool(false)),
        "spec.suspend",
    ) {
        out.extend(e);
    }
    out
}

/// Every problem of `object`, a fleet object of kind `kind` as a client sent it: its unknown fields (one problem
/// naming them all, [`crate::schema::unknown_message`]), then its spec's problems ([`spec_problems`]). Empty: valid
/// (or not a fleet kind).
pub fn problems(kind: &str, object: &Value) -> Problems {
    let Some(root) = crate::schema::of(kind) else {
        return vec![];
    };
    let mut out = Vec::new();
    let unknown = crate::schema::unknown_fields(root, object);
    if !unknown.is_empty() {
        out.push(crate::schema::unknown_message(root, &unknown));
    }
    match object.get("spec") {
        Some(spec) => out.extend(spec_problems(kind, spec)),
        None if kind != "Device" => out.push("spec: missing".into()),
        None => {}
    }
    out
}

/// Why the operator refuses to act on `obj`, a cached object: the unknown fields its cache marked
/// ([`crate::schema::unknown_problem`]) and `spec` (its spec's problems, by the kind's own rules), all of them;
/// `None`: valid.
pub fn refusal_of<K: kube::Resource<DynamicType = ()>>(obj: &K, spec: Problems) -> Option<String> {
    let all: Problems = crate::schema::unknown_problem(obj)
        .into_iter()
        .chain(spec)
        .collect();
    refusal(&all)
}

/// The message of `problems` for an object's own condition: all of them, and that the operator acts on nothing in
/// the object until they are fixed.
pub fn refusal(problems: &[String]) -> Option<String> {
    (!problems.is_empty()).then(|| {
        format!(
            "{}; the operator acts on nothing in this object until it is fixed",
            problems.join("; ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn typed_names_the_field_that_does_not_decode() {
        let cases: Vec<(Value, &str, &str)> = vec![
            (
                json!({"name": "web", "image": "nginx:1", "ports": [{"hostPort": 100000, "containerPort": 80}]}),
                "ports[0].hostPort",
                "100000 is not a whole number from 0 to 65535",
            ),
            (
                json!({"name": "web", "image": 100000}),
                "image",
                "must be a string, not the number 100000",
            ),
            (
                json!({"name": "web", "image": "nginx:1", "env": {"A": 1}}),
                "env.A",
                "must be a string, not the number 1",
            ),
            (json!({"name": "web"}), "", "missing field `image`"),
            (
                json!({"name": "web", "image": "nginx:1", "healthCheck": {"command": ["x"], "retrys": 3}}),
                "healthCheck.retrys",
                "unknown field `retrys`",
            ),
        ];
        for (i, (v, path, why)) in cases.into_iter().enumerate() {
            let (p, w) = typed::<fleet_wire::WorkloadSpec>(&v).expect_err("invalid");
            assert_eq!(p, path, "case {i}: {w}");
            assert!(w.starts_with(why), "case {i}: {w}");
        }
        // every field that does not decode, not only the first; a field left out is not named again as missing
        let all = typed_all::<fleet_wire::WorkloadSpec>(&json!({"name": "web", "image": "nginx:1",
            "env": {"PORT": 8080, "MODE": true}, "ports": [{"hostPort": 100000, "containerPort": 80}]}))
        .expect_err("invalid");
        assert_eq!(
            all,
            [
                (
                    "env.MODE".to_owned(),
                    "must be a string, not true".to_owned()
                ),
                (
                    "env.PORT".to_owned(),
                    "must be a string, not the number 8080".to_owned()
                ),
                (
                    "ports[0].hostPort".to_owned(),
                    "100000 is not a whole number from 0 to 65535".to_owned()
                ),
            ]
        );
        assert_eq!(
            typed::<u32>(&json!(-1)).expect_err("negative").1,
            "-1 is not a whole number from 0 to 4294967295"
        );
        assert_eq!(
            typed::<Vec<String>>(&json!(["a", true])).expect_err("bool"),
            ("[1]".to_owned(), "must be a string, not true".to_owned())
        );
    }

    /// (kind, spec, every problem expected, in order)
    #[test]
    fn every_problem_of_every_kind_with_its_full_path() {
        let sha = "a".repeat(64);
        let cases: Vec<(&str, Value, Vec<&str>)> = vec![
            ("Device", json!({"description": "rack 4"}), vec![]),
            ("Device", json!({"description": 4}), vec!["spec.description: must be a string, not the number 4"]),
            (
                "FleetDeployment",
                json!({"allowedGroups": ["g"], "workloads": [],
                       "rollout": {"soakSeconds": 100000, "maxUnavailable": "150%", "maxFailures": -1, "heartbeatTimeoutSeconds": 5}}),
                vec![
                    "spec.rollout.soakSeconds: must be 0 to 86400, not 100000",
                    "spec.rollout.maxUnavailable: must be a count (0 or more) or a percentage from \"0%\" to \"100%\", not \"150%\"",
                    "spec.rollout.maxFailures: must be a count (0 or more) or a percentage from \"0%\" to \"100%\", not -1",
                    "spec.rollout.heartbeatTimeoutSeconds: must be 10 to 86400, not 5",
                ],
            ),
            (
                "FleetDeployment",
                json!({"allowedGroups": [], "workloads": [{"name": "a", "image": "nginx:1", "ports": [{"hostPort": 100000, "containerPort": 80}]},
                                                          {"name": "b", "image": 100000}],
                       "rollout": {"soakSeconds": 100000}}),
                vec![
                    "spec.allowedGroups: must name at least one DeviceGroup",
                    "spec.workloads[0].ports[0].hostPort: 100000 is not a whole number from 0 to 65535",
                    "spec.workloads[1].image: must be a string, not the number 100000",
                    "spec.rollout.soakSeconds: must be 0 to 86400, not 100000",
                ],
            ),
            (
                "FleetDeployment",
                json!({"allowedGroups": ["g"], "workloads": [], "rollout": {"soakSeconds": 5000000000u64}}),
                vec!["spec.rollout.soakSeconds: 5000000000 is not a whole number from 0 to 4294967295"],
            ),
            (
                "AgentRelease",
                json!({"allowedGroups": ["g"], "builds": [{"architecture": "riscv", "version": "1.0.0",
                       "artifact": "https://example.com/a", "sha256": sha, "byteLimit": 10}],
                       "rollout": {"maxFailures": "ten"}}),
                vec![
                    "spec.builds[0].architecture: \"riscv\" is not amd64 or arm64",
                    "spec.rollout.maxFailures: must be a count (0 or more) or a percentage from \"0%\" to \"100%\", not \"ten\"",
                ],
            ),
            (
                "DeviceGroup",
                json!({"selectAll": true, "devices": ["dev-1", "Bad Id", "dev-1"], "selector": {"matchLabels": {"site": "a"}}}),
                vec![
                    "spec.selectAll: true selects every device and cannot be combined with selector or devices",
                    "spec.devices[1]: ",
                    "spec.devices[2]: \"dev-1\" appears twice",
                ],
            ),
            ("DeviceGroup", json!({"devices": ["dev-1"]}), vec![]),
            (
                "TaskRun",
                json!({"allowedGroups": [], "deadlineSeconds": 0, "systemUpgradeV1": {}}),
                vec![
                    "spec.allowedGroups: must name at least one DeviceGroup",
                    "spec.deadlineSeconds: must be 1 to 2592000, not 0",
                ],
            ),
            (
                "TaskSchedule",
                json!({"schedule": {"daily": {"at": "25:00"}},
                       "template": {"allowedGroups": ["g"], "deadlineSeconds": 0, "systemUpgradeV1": {}}}),
                vec![
                    "spec.schedule.daily.at: \"25:00\" must be HH:MM (UTC, 00:00 to 23:59)",
                    "spec.template.deadlineSeconds: must be 1 to 2592000, not 0",
                ],
            ),
            (
                "TaskSchedule",
                json!({"schedule": {"cron": "61 * * * *"},
                       "template": {"allowedGroups": ["g"], "deadlineSeconds": "soon", "systemUpgradeV1": {}}}),
                vec![
                    "spec.schedule.cron: \"61 * * * *\": ",
                    "spec.template.deadlineSeconds: must be a whole number from 0 to 18446744073709551615, not the string \"soon\"",
                ],
            ),
            (
                "TaskSchedule",
                json!({"schedule": {"daily": {"at": 300}},
                       "template": {"allowedGroups": ["g"], "deadlineSeconds": 60, "systemUpgradeV1": {}}}),
                vec!["spec.schedule.daily.at: must be a string, not the number 300"],
            ),
            (
                "WorkloadPolicy",
                json!({"groups": [], "capabilities": ["CAP_SYS_ADMIN"]}),
                vec!["spec.groups: ", "spec.capabilities[0]: "],
            ),
            (
                "DeviceDiagnostics",
                json!({"device": "Bad Id", "items": ["disk", "disk", "shell"], "workloads": ["../x"], "ttlSecondsAfterFinished": 999999999}),
                vec![
                    "spec.device: ",
                    "spec.items[1]: \"disk\" is named twice",
                    "spec.items[2]: \"shell\" is not an item",
                    "spec.workloads[0]: ",
                    "spec.ttlSecondsAfterFinished: ",
                ],
            ),
        ];
        for (i, (kind, spec, want)) in cases.into_iter().enumerate() {
            let got = spec_problems(kind, &spec);
            assert_eq!(got.len(), want.len(), "case {i} ({kind}): {got:#?}");
            for (g, w) in got.iter().zip(&want) {
                assert!(
                    g.starts_with(w),
                    "case {i} ({kind}): {g:?} does not start with {w:?}"
                );
            }
        }
    }

    #[test]
    fn unknown_fields_and_spec_problems_together() {
        let p = problems(
            "FleetDeployment",
            &json!({"metadata": {"name": "d"}, "spec": {"allowedGroups": ["g"], "workloads": [], "extra": 1,
                    "rollout": {"soakSeconds": 100000, "maxUnavailable": "150%"}}}),
        );
        assert_eq!(p.len(), 3, "{p:#?}");
        assert!(p[0].starts_with("unknown field spec.extra "), "{}", p[0]);
        assert!(p[1].starts_with("spec.rollout.soakSeconds: "), "{}", p[1]);
        assert!(
            p[2].starts_with("spec.rollout.maxUnavailable: "),
            "{}",
            p[2]
        );
        assert!(problems("ConfigMap", &json!({"data": {}})).is_empty());
    }
}
