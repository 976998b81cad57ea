//! Task run history: every TaskRun (paged) with phase, counts, canary outcome, start and end; and a run's page
//! with its per-device results, read one page at a time from the frozen plan (the manifest, then only the plan
//! chunks that hold the page's devices) and each device's `system-upgrade-intent` / `system-upgrade-status` key.
//! A 100,000-device plan is never loaded whole.

use super::alerts::{Alert, Subject};
use super::bars::{bar, Part};
use super::device::pager;
use super::html::{name, opt_name, page, pairs, table, text, url_part, when};
use super::overview::some_alerts;
use super::state::Buckets;
use crate::crd::tasks::TaskRun;
use crate::kv::NatsError;
use fleet_wire::kv as layout;
use fleet_wire::taskrun::{plan_chunk_key, plan_manifest_key, PLAN_CHUNK_TARGETS};
use fleet_wire::{
    AttemptId, DeviceId, Sha256Hex, SystemUpgradeStatus, TaskPlanChunk, TaskPlanManifest,
    TaskRunPhase, TaskRunReason, Timestamp,
};
use futures::StreamExt;
use maud::{html, Markup};
use sha2::Digest;
use std::sync::Arc;

/// Runs per page of the history.
pub const RUNS_PER_PAGE: usize = 50;
/// Devices per page of a run.
pub const DEVICES_PER_RUN_PAGE: usize = 200;
/// Key reads in flight for one page.
const READS_IN_FLIGHT: usize = 16;

fn ts(t: &Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>) -> Option<Timestamp> {
    t.as_ref()
        .map(|t| Timestamp::from_unix_ms(t.0.as_millisecond().max(0) as u64))
}

/// How the canaries went, from the run's status: `failed` (the run stopped), `passed` (the rest were released or
/// the run completed), `pending`, or `—` before a plan exists.
pub fn canary_outcome(r: &TaskRun) -> &'static str {
    let Some(s) = r.status.as_ref().map(|s| &s.run) else {
        return "—";
    };
    match (s.phase, s.reason) {
        (_, Some(TaskRunReason::CanaryFailed)) => "failed",
        (Some(TaskRunPhase::Complete), _) => "passed",
        (Some(TaskRunPhase::Running), _) if s.succeeded > 0 => "passed or none",
        (Some(TaskRunPhase::Running), _) => "pending",
        (Some(TaskRunPhase::Failed), _) if s.succeeded > 0 => "passed or none",
        _ => "—",
    }
}

/// A link to a run's page.
pub fn run_link(ns: &str, n: &str) -> Markup {
    html! { a href={ "/runs/" (url_part(ns)) "/" (url_part(n)) } { (ns) "/" (n) } }
}

/// A link to a device's page.
pub fn device_link(d: &str) -> Markup {
    html! { a href={ "/devices/" (url_part(d)) } { (d) } }
}

/// The history page.
pub fn list(runs: &[Arc<TaskRun>], page_no: usize, alerts: &[Alert], now: Timestamp) -> String {
    let mut rs: Vec<&Arc<TaskRun>> = runs.iter().collect();
    rs.sort_by(|a, b| {
        b.metadata
            .creation_timestamp
            .cmp(&a.metadata.creation_timestamp)
            .then_with(|| a.metadata.name.cmp(&b.metadata.name))
    });
    let rows = rs
        .iter()
        .skip(page_no.saturating_mul(RUNS_PER_PAGE))
        .take(RUNS_PER_PAGE)
        .map(|r| {
            let ns = r.metadata.namespace.as_deref().unwrap_or("");
            let n = r.metadata.name.as_deref().unwrap_or("");
            let s = r.status.clone().unwrap_or_default().run;
            let bad = s.phase == Some(TaskRunPhase::Failed);
            vec![
                run_link(ns, n),
                html! { span.bad[bad] { (opt_name(s.phase.as_ref())) } },
                text(opt_name(s.reason.as_ref())),
                text(s.targets.to_string()),
                text(s.succeeded.to_string()),
                text(s.failed.to_string()),
                text(canary_outcome(r)),
                when(s.start_time.or(ts(&r.metadata.creation_timestamp)), now),
                when(s.completion_time, now),
            ]
        });
    page(
        "Task runs",
        html! {
            (some_alerts(alerts, |a| matches!(a.subject, Subject::Run { .. }), now))
            (pager("/runs?", page_no, RUNS_PER_PAGE, rs.len()))
            (table(
                &["run", "phase", "reason", "targets", "succeeded", "failed", "canaries", "started", "ended"],
                rows,
            ))
        },
    )
}

/// One device's row of a run page.
pub struct DeviceResult {
    /// The device.
    pub device: DeviceId,
    /// A canary of this run.
    pub canary: bool,
    /// Its intent was written (present, or removed after a result).
    pub released: bool,
    /// What its agent reported for this run.
    pub status: Option<SystemUpgradeStatus>,
}

/// One page of a run's plan.
pub struct PlanPage {
    /// Devices in the plan.
    pub total: usize,
    /// Canaries in the plan.
    pub canaries: usize,
    /// The page's devices, in plan order (canaries first).
    pub rows: Vec<DeviceResult>,
}

fn invalid(op: String, message: String) -> NatsError {
    NatsError { op, message }
}

/// Reads page `page` of run `run`'s plan: the manifest, the chunks holding that page (each checked against its
/// digest), then the page's intent and status keys. `Ok(None)` while the run has no plan.
pub async fn read_plan_page(
    b: &Arc<Buckets>,
    run: &AttemptId,
    page: usize,
) -> Result<Option<PlanPage>, NatsError> {
    let Some(m) = b
        .get::<TaskPlanManifest>(layout::TASK_PLANS, &plan_manifest_key(run))
        .await?
    else {
        return Ok(None);
    };
    let canaries = m.canaries as usize;
    let total = canaries + m.others as usize;
    let start = page.saturating_mul(DEVICES_PER_RUN_PAGE).min(total);
    let end = (start + DEVICES_PER_RUN_PAGE).min(total);
    // Every chunk but the last holds exactly PLAN_CHUNK_TARGETS devices (fleet-wire's TaskPlan::to_stored).
    let mut devices: Vec<(DeviceId, bool)> = Vec::with_capacity(end - start);
    if start < end {
        for c in start / PLAN_CHUNK_TARGETS..=(end - 1) / PLAN_CHUNK_TARGETS {
            let Some(digest) = m.chunks.get(c) else {
                return Err(invalid(
                    format!("read plan of run {run}"),
                    format!(
                        "the manifest names {} chunks, chunk {c} needed",
                        m.chunks.len()
                    ),
                ));
            };
            let key = plan_chunk_key(run, digest);
            let op = format!("read {}/{key}", layout::TASK_PLANS);
            let bytes = b
                .raw(layout::TASK_PLANS, &key)
                .await?
                .ok_or_else(|| invalid(op.clone(), "missing".into()))?;
            if &Sha256Hex::from_bytes(sha2::Sha256::digest(&bytes).into()) != digest {
                return Err(invalid(op, "does not match its digest".into()));
            }
            let chunk: TaskPlanChunk = serde_json::from_slice(&bytes)
                .map_err(|e| invalid(op.clone(), format!("invalid chunk: {e}")))?;
            let first = c * PLAN_CHUNK_TARGETS;
            let all = chunk
                .canaries
                .into_iter()
                .map(|d| (d, true))
                .chain(chunk.others.into_iter().map(|d| (d, false)));
            for (i, d) in all.enumerate() {
                if (start..end).contains(&(first + i)) {
                    devices.push(d);
                }
            }
        }
    }
    let reads: Vec<Result<DeviceResult, NatsError>> = futures::stream::iter(devices)
        .map(|(device, canary)| {
            let b = b.clone();
            async move {
                let key = layout::run_key(&device, run);
                let status: Option<SystemUpgradeStatus> =
                    b.get(layout::SYSTEM_UPGRADE_STATUS, &key).await?;
                let released =
                    status.is_some() || b.on_record(layout::SYSTEM_UPGRADE_INTENT, &key).await?;
                Ok(DeviceResult {
                    device,
                    canary,
                    released,
                    status,
                })
            }
        })
        .buffered(READS_IN_FLIGHT)
        .collect()
        .await;
    Ok(Some(PlanPage {
        total,
        canaries,
        rows: reads.into_iter().collect::<Result<_, _>>()?,
    }))
}

/// The run's progress bar: succeeded, failed and not finished yet (the plan's targets less both; saturating, so
/// a status whose counts disagree draws no negative part), all exactly the status's counts.
pub fn progress(run: &fleet_wire::taskrun::TaskRunStatus) -> Markup {
    let open = run
        .targets
        .saturating_sub(run.succeeded)
        .saturating_sub(run.failed);
    bar(
        "devices",
        &[
            Part::new("succeeded", run.succeeded.into(), "#070"),
            Part::new("failed", run.failed.into(), "#b00"),
            Part::new("not finished", open.into(), "#bbb"),
        ],
    )
}

/// A run's page; `plan`: page `page` of its plan, `None` while it has none, or why it could not be read.
pub fn render(
    r: &TaskRun,
    plan: Result<Option<PlanPage>, String>,
    page_no: usize,
    alerts: &[Alert],
    now: Timestamp,
) -> String {
    let ns = r.metadata.namespace.as_deref().unwrap_or("");
    let n = r.metadata.name.as_deref().unwrap_or("");
    let s = r.status.clone().unwrap_or_default();
    let run = &s.run;
    let facts = pairs([
        ("uid", text(r.metadata.uid.as_deref().unwrap_or("—"))),
        (
            "phase",
            html! { b #run-phase { (opt_name(run.phase.as_ref())) } },
        ),
        (
            "reason",
            html! { span #run-reason { (opt_name(run.reason.as_ref())) } },
        ),
        (
            "devices",
            text(format!(
                "{} targets, {} succeeded, {} failed",
                run.targets, run.succeeded, run.failed
            )),
        ),
        ("progress", progress(run)),
        ("canaries", text(canary_outcome(r))),
        ("groups", text(r.spec.placement.allowed_groups.join(", "))),
        (
            "deadline",
            text(format!("{} s after creation", r.spec.deadline_seconds)),
        ),
        ("created", when(ts(&r.metadata.creation_timestamp), now)),
        ("started", when(run.start_time, now)),
        ("ended", when(run.completion_time, now)),
        (
            "latest error",
            match &run.latest_error {
                Some(e) => html! { span.bad { (e.to_string()) } },
                None => text("—"),
            },
        ),
        (
            "conditions",
            html! {
                @for (i, c) in s.conditions.iter().enumerate() {
                    @if i > 0 { br; }
                    (c.type_) "=" (c.status) " (" (c.reason) "): " (c.message)
                }
            },
        ),
    ]);
    let devices = match plan {
        Err(e) => html! { p.bad { "Could not read the plan: " (e) } },
        Ok(None) => {
            html! { p.muted { "No plan yet (the run is planning, or found no targets)." } }
        }
        Ok(Some(p)) => {
            let base = format!("/runs/{}/{}?", url_part(ns), url_part(n));
            let rows = p.rows.iter().map(|d| {
                let st = d.status.as_ref();
                let phase = match (st, d.released) {
                    (Some(st), _) => name(&st.phase),
                    (None, true) => "released, no report yet".into(),
                    (None, false) => "not released".into(),
                };
                let failed = st.is_some_and(|s| s.phase == fleet_wire::SystemUpgradePhase::Failed);
                vec![
                    device_link(d.device.as_str()),
                    text(if d.canary { "canary" } else { "" }),
                    html! { span.bad[failed] { (phase) } },
                    text(opt_name(st.and_then(|s| s.reason.as_ref()))),
                    when(st.map(|s| s.accepted_at), now),
                    when(st.and_then(|s| s.completed_at), now),
                    when(st.and_then(|s| s.first_heartbeat_after_completion), now),
                    text(
                        st.and_then(|s| s.error.as_ref())
                            .map(|e| e.to_string())
                            .unwrap_or_default(),
                    ),
                ]
            });
            html! {
                p { (p.total) " devices in the frozen plan, " (p.canaries) " of them canaries." }
                (pager(&base, page_no, DEVICES_PER_RUN_PAGE, p.total))
                (table(
                    &["device", "role", "phase", "reason", "accepted", "completed", "first heartbeat after", "error"],
                    rows,
                ))
            }
        }
    };
    page(
        &format!("Task run {ns}/{n}"),
        html! {
            (some_alerts(
                alerts,
                |a| matches!(&a.subject, Subject::Run { namespace, name } if namespace == ns && name == n),
                now,
            ))
            (facts)
            h2 { "Devices" }
            (devices)
        },
    )
}

#[cfg(test)]
mod progress_tests {
    use super::*;
    use fleet_wire::taskrun::TaskRunStatus;

    #[test]
    fn bar_counts_are_the_status_counts() {
        let run = TaskRunStatus {
            targets: 10,
            succeeded: 6,
            failed: 1,
            ..Default::default()
        };
        let s = progress(&run).into_string();
        for (part, n) in [("succeeded", 6), ("failed", 1), ("not finished", 3)] {
            let want = format!("data-part=\"{part}\" data-count=\"{n}\"");
            assert!(s.contains(&want), "{want} in {s}");
        }
        // Counts that disagree (more finished than targets) draw no negative part.
        let odd = TaskRunStatus {
            targets: 2,
            succeeded: 3,
            failed: 1,
            ..Default::default()
        };
        assert!(progress(&odd)
            .into_string()
            .contains("data-part=\"not finished\" data-count=\"0\""));
    }
}
