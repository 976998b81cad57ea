//! A TaskRun's status: the next status as a pure function of what the controller decided, and the write (a status
//! merge patch guarded by the object's resourceVersion, so that a replica acting on a stale view never overwrites
//! a newer phase) with Warning events for conditions that turned False and Normal events for phase changes.

use crate::conditions::{self, Want};
use crate::crd::tasks::{TaskRun, TaskRunCrStatus};
use crate::fleet::report::MANAGER;
use fleet_wire::{TaskRunPhase, TaskRunReason};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Client, Resource, ResourceExt};

/// The condition reason of a run reason.
pub fn reason_name(r: TaskRunReason) -> &'static str {
    use TaskRunReason::*;
    match r {
        NoTargets => "NoTargets",
        TargetRevoked => "TargetRevoked",
        CanaryFailed => "CanaryFailed",
        TargetFailed => "TargetFailed",
        DeadlineExceeded => "DeadlineExceeded",
        GroupSourceError => "GroupSourceError",
        InvalidSpec => "InvalidSpec",
    }
}

/// The `Ready` condition for a run in `phase`: True while planning or running normally and when complete; False
/// with the run's reason when failed, with `InvalidSpec` while the operator refuses to act on the run (reason
/// `InvalidSpec` before the run ended, the message in `problem`), or when planning or a release waits on a group
/// source error (`problem`).
pub fn ready(
    phase: TaskRunPhase,
    reason: Option<TaskRunReason>,
    problem: Option<&str>,
    message: String,
) -> Want {
    let (ok, r) = match (phase, reason, problem) {
        (TaskRunPhase::Failed, r, _) => (false, r.map(reason_name).unwrap_or("Failed")),
        // Refused before it was acted on: unknown fields, or a spec that is not the one frozen (`spec_check`).
        (_, Some(TaskRunReason::InvalidSpec), _) => {
            (false, reason_name(TaskRunReason::InvalidSpec))
        }
        (_, _, Some(_)) => (false, reason_name(TaskRunReason::GroupSourceError)),
        (TaskRunPhase::Planning, ..) => (true, "Planning"),
        (TaskRunPhase::Running, ..) => (true, "Running"),
        (TaskRunPhase::Complete, ..) => (true, "Complete"),
    };
    Want {
        type_: conditions::READY,
        ok,
        reason: r,
        message: problem.map(str::to_owned).unwrap_or(message),
    }
}

/// Stalled devices of a running run, for its status: how many, and the first few named
/// ([`super::stall::Stalls::examples`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StallReport {
    /// How many.
    pub count: u32,
    /// The first [`super::stall::STALL_EXAMPLES`], `dev (intent written …)`.
    pub examples: Vec<String>,
    /// The accept timeout they exceeded.
    pub timeout: std::time::Duration,
}

/// The `Progressing` condition for a run in `phase`: True while planning and while running with every released
/// device accepting; False with reason `Stalled` naming the devices that have not accepted their intent within
/// the timeout (a problem: a Warning event); False with `Complete` or `Failed` once the run ended (no problem).
pub fn progressing(phase: TaskRunPhase, stalled: &StallReport) -> Want {
    let (ok, reason, message) = match phase {
        TaskRunPhase::Planning => (true, "Planning", "freezing the target plan".to_owned()),
        TaskRunPhase::Running if stalled.count > 0 => {
            let more = (stalled.count as usize).saturating_sub(stalled.examples.len());
            let tail = if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            };
            (
                false,
                conditions::REASON_STALLED,
                format!(
                    "{} released devices have not accepted their intent within {}: {}{tail}; see each Device's status.stalled",
                    stalled.count,
                    humantime::format_duration(stalled.timeout),
                    stalled.examples.join(", ")
                ),
            )
        }
        TaskRunPhase::Running => (
            true,
            conditions::REASON_PROGRESSING,
            "released devices accept their intents".to_owned(),
        ),
        TaskRunPhase::Complete => (false, "Complete", "the run ended".to_owned()),
        TaskRunPhase::Failed => (false, "Failed", "the run ended".to_owned()),
    };
    Want {
        type_: conditions::PROGRESSING,
        ok,
        reason,
        message,
    }
}

/// The next status: `run` as computed with `stalled` devices, conditions merged so that unchanged ones keep their
/// transition time, the frozen spec kept (or `frozen`, once accepted).
pub fn next(
    old: &TaskRunCrStatus,
    run: fleet_wire::TaskRunStatus,
    stalled: u32,
    wants: &[Want],
    generation: Option<i64>,
    now: &Time,
    frozen: Option<serde_json::Value>,
) -> TaskRunCrStatus {
    TaskRunCrStatus {
        stalled: match run.phase {
            Some(TaskRunPhase::Running) => stalled,
            _ => 0,
        },
        run,
        conditions: conditions::merge(&old.conditions, wants, generation, now),
        frozen_spec: old.frozen_spec.clone().or(frozen),
    }
}

/// Longest value shown for one changed field.
const MAX_VALUE_CHARS: usize = 120;

/// Whether the operator may act on `run`. `Ok` carries the spec to freeze (or already frozen); `Err` says why not:
/// fields its schema does not know ([`crate::schema::refusal`]), a spec that differs from the one frozen in status
/// (each changed field named, with what it was and is), or a spec edited before the operator froze it (its
/// generation is past 1). Pure.
pub fn spec_check(run: &TaskRun) -> Result<serde_json::Value, String> {
    // Unknown fields with every other problem of the spec, as the webhook names them.
    if crate::schema::unknown_problem(run).is_some() {
        let spec = crate::validation::run_spec(&run.spec, "spec");
        return Err(crate::validation::refusal_of(run, spec).unwrap_or_default());
    }
    let current = serde_json::to_value(&run.spec).map_err(|e| format!("spec: {e}"))?;
    const IMMUTABLE: &str = "a TaskRun's spec is immutable (its UID names one frozen plan): the operator acts on nothing in this run until the spec is as it was; or delete it and create a new TaskRun";
    match run.status.as_ref().and_then(|s| s.frozen_spec.as_ref()) {
        Some(f) if *f == current => Ok(current),
        Some(f) => {
            let mut changed = Vec::new();
            diff("spec", f, &current, &mut changed);
            Err(format!(
                "spec changed after the run froze it: {}; {IMMUTABLE}",
                changed.join(", ")
            ))
        }
        None => match run.metadata.generation {
            Some(g) if g > 1 => Err(format!(
                "spec changed after creation (generation {g}), before the operator froze it; {IMMUTABLE}"
            )),
            _ => Ok(current),
        },
    }
}

fn shown(v: Option<&serde_json::Value>) -> String {
    let s = v.map_or_else(|| "absent".to_owned(), |v| v.to_string());
    if s.chars().count() <= MAX_VALUE_CHARS {
        s
    } else {
        let mut t: String = s.chars().take(MAX_VALUE_CHARS - 1).collect();
        t.push('…');
        t
    }
}

/// The paths at which `was` and `now` differ (objects field by field, anything else whole), with both values.
fn diff(path: &str, was: &serde_json::Value, now: &serde_json::Value, out: &mut Vec<String>) {
    use serde_json::Value;
    if let (Value::Object(a), Value::Object(b)) = (was, now) {
        let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
        for k in keys {
            let at = format!("{path}.{k}");
            match (a.get(k), b.get(k)) {
                (Some(x), Some(y)) => diff(&at, x, y, out),
                (x, y) => out.push(format!("{at} (was {}, now {})", shown(x), shown(y))),
            }
        }
    } else if was != now {
        out.push(format!(
            "{path} (was {}, now {})",
            shown(Some(was)),
            shown(Some(now))
        ));
    }
}

/// Writes `next` as `run`'s status unless it equals the current one; the patch carries the object's
/// resourceVersion, so it fails with 409 Conflict if the object changed since it was read. Publishes a Warning
/// event per condition that just turned False and a Normal event when the phase changes.
pub async fn write(
    client: &Client,
    recorder: &Recorder,
    run: &TaskRun,
    next: &TaskRunCrStatus,
    phase_note: Option<String>,
) -> Result<bool, kube::Error> {
    let old = run.status.clone().unwrap_or_default();
    if &old == next {
        return Ok(false);
    }
    let ns = run.namespace().unwrap_or_default();
    let api: Api<TaskRun> = Api::namespaced(client.clone(), &ns);
    api.patch_status(
        &run.name_any(),
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({
            "metadata": {"resourceVersion": run.resource_version()},
            // Only the differences, with `null` for what the new status lacks: nothing stale stays behind.
            // (An absent status is `null`, not a default one, so the first write carries every field.)
            "status": crate::fleet::report::merge_diff(
                &serde_json::to_value(&run.status).map_err(kube::Error::SerdeError)?,
                &serde_json::to_value(next).map_err(kube::Error::SerdeError)?,
            ),
        })),
    )
    .await?;
    let reference = run.object_ref(&());
    let mut events: Vec<Event> = conditions::newly_failing(&old.conditions, &next.conditions)
        .into_iter()
        .map(|c| Event {
            type_: EventType::Warning,
            reason: c.reason.clone(),
            note: Some(c.message.clone()),
            action: "Run".into(),
            secondary: None,
        })
        .collect();
    if old.run.phase != next.run.phase {
        if let (Some(p), Some(note)) = (next.run.phase, phase_note) {
            if p != TaskRunPhase::Failed {
                events.push(Event {
                    type_: EventType::Normal,
                    reason: format!("{p:?}"),
                    note: Some(note),
                    action: "Run".into(),
                    secondary: None,
                });
            }
        }
    }
    for ev in events {
        // Events are best effort: the status carries the same information.
        if let Err(e) = recorder.publish(&ev, &reference).await {
            log::warn!(
                "{MANAGER}: event {} for TaskRun {ns}/{}: {e}",
                ev.reason,
                run.name_any()
            );
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_table() {
        use TaskRunPhase::*;
        type Case<'a> = (
            TaskRunPhase,
            Option<TaskRunReason>,
            Option<&'a str>,
            bool,
            &'a str,
        );
        let cases: Vec<Case> = vec![
            (Planning, None, None, true, "Planning"),
            (
                Planning,
                None,
                Some("group x broken"),
                false,
                "GroupSourceError",
            ),
            (Running, None, None, true, "Running"),
            (
                Running,
                None,
                Some("group x broken"),
                false,
                "GroupSourceError",
            ),
            (Complete, None, None, true, "Complete"),
            (
                Failed,
                Some(TaskRunReason::NoTargets),
                None,
                false,
                "NoTargets",
            ),
            (
                Failed,
                Some(TaskRunReason::TargetRevoked),
                Some("x"),
                false,
                "TargetRevoked",
            ),
        ];
        for (i, (p, r, problem, ok, reason)) in cases.into_iter().enumerate() {
            let w = ready(p, r, problem, "m".into());
            assert_eq!((w.ok, w.reason), (ok, reason), "case {i}");
        }
    }

    #[test]
    fn progressing_table() {
        use TaskRunPhase::*;
        let none = StallReport::default();
        let two = StallReport {
            count: 12,
            examples: vec!["a (intent written x)".into(), "b (intent written y)".into()],
            timeout: std::time::Duration::from_secs(120),
        };
        let cases = [
            (Planning, &none, true, "Planning"),
            (Running, &none, true, "Progressing"),
            (Running, &two, false, "Stalled"),
            // a finished run is not stalled, whatever was counted last
            (Complete, &two, false, "Complete"),
            (Failed, &two, false, "Failed"),
        ];
        for (i, (p, s, ok, reason)) in cases.into_iter().enumerate() {
            let w = progressing(p, s);
            assert_eq!((w.ok, w.reason), (ok, reason), "case {i}");
            let w = w.clone();
            let now = Time(k8s_openapi::jiff::Timestamp::now());
            let c = conditions::merge(&[], &[w], None, &now);
            assert_eq!(conditions::is_bad(&c[0]), reason == "Stalled", "case {i}");
        }
        assert_eq!(
            progressing(Running, &two).message,
            "12 released devices have not accepted their intent within 2m: a (intent written x), b (intent \
             written y) and 10 more; see each Device's status.stalled"
        );
    }

    /// A run the cache marked with an unknown field is refused naming it and every other problem of its spec, the
    /// list the admission webhook gives.
    #[test]
    fn spec_check_names_unknown_fields_and_every_other_problem() {
        let mut run: TaskRun = serde_json::from_value(serde_json::json!({
            "apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "TaskRun",
            "metadata": {"name": "r", "namespace": "ops", "generation": 1},
            "spec": {"allowedGroups": [], "deadlineSeconds": 0, "systemUpgradeV1": {}}
        }))
        .expect("run");
        crate::schema::mark_unknown(&mut run.metadata, &["spec.retries".to_string()]);
        let e = spec_check(&run).expect_err("refused");
        assert!(
            e.starts_with("unknown field spec.retries ")
                && e.contains("; spec.allowedGroups: must name at least one DeviceGroup; spec.deadlineSeconds: must be 1 to 2592000, not 0; the operator acts on nothing in this object until it is fixed"),
            "{e}"
        );
    }
}
