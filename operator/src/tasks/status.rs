//! A TaskRun's status: the next status as a pure function of what the controller decided, and the write (a status
//! merge patch guarded by the object's resourceVersion, so that a replica acting on a stale view never overwrites
//! a newer phase) with Warning events for conditions that turned False and Normal events for phase changes.

use super::crd::{TaskRun, TaskRunCrStatus};
use crate::conditions::{self, Want};
use crate::report::MANAGER;
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
/// with the run's reason when failed, or when planning or a release waits on a group source error (`problem`).
pub fn ready(
    phase: TaskRunPhase,
    reason: Option<TaskRunReason>,
    problem: Option<&str>,
    message: String,
) -> Want {
    let (ok, r) = match (phase, reason, problem) {
        (TaskRunPhase::Failed, r, _) => (false, r.map(reason_name).unwrap_or("Failed")),
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

/// The next status: `run` as computed, conditions merged so that unchanged ones keep their transition time.
pub fn next(
    old: &TaskRunCrStatus,
    run: fleet_wire::TaskRunStatus,
    wants: &[Want],
    generation: Option<i64>,
    now: &Time,
) -> TaskRunCrStatus {
    TaskRunCrStatus {
        run,
        conditions: conditions::merge(&old.conditions, wants, generation, now),
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
            "status": crate::report::merge_diff(
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
}
