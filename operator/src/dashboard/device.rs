//! The device list (paged) and the device page: labels, versions, OS, workloads and their status, the agent-upgrade
//! timeline (the up to 16 transitions the Device carries, drawn by time as an SVG timeline above their table of
//! times and typed reasons, and the latest error), task
//! results and the last heartbeat. Workload specs (and so their environment) are never read: the page shows only
//! what the device reports about each workload.

use super::alerts::Alert;
use super::html::{name, opt_name, page, pairs, parse_time, table, text, url_part, when};
use super::overview::{phase_name, some_alerts};
use super::state::State;
use super::timeline;
use crate::crd::tasks::TaskRun;
use crate::crd::Device;
use fleet_wire::kv as layout;
use fleet_wire::{
    AttemptId, DeviceId, DeviceWorkloadStatus, Heartbeat, SystemUpgradeStatus, Timestamp,
    Transition, UpgradePhase,
};
use futures::StreamExt;
use maud::{html, Markup};
use std::sync::Arc;

/// Devices per page of the device list.
pub const DEVICES_PER_PAGE: usize = 200;
/// Task runs whose result the device page reads (the newest).
pub const RUNS_ON_DEVICE_PAGE: usize = 20;

/// Page links `prev`/`next` for page `page` (0-based) of `total` items, `per` per page; `base` is the path and
/// query before `page=` (ending in `?` or `&`).
pub fn pager(base: &str, page: usize, per: usize, total: usize) -> Markup {
    let pages = total.div_ceil(per).max(1);
    html! {
        nav.pages {
            "page " (page + 1) " of " (pages) " (" (total) " in all) "
            @if page > 0 { a href={ (base) "page=" (page - 1) } { "previous" } }
            @if page + 1 < pages { a href={ (base) "page=" (page + 1) } { "next" } }
        }
    }
}

/// The device list: page `page`, only devices in upgrade phase `phase` when given.
pub fn list(
    devices: &[Arc<Device>],
    page_no: usize,
    phase: Option<&str>,
    last_heartbeat: &dyn Fn(&Device) -> Option<Timestamp>,
    now: Timestamp,
) -> String {
    let mut ds: Vec<&Arc<Device>> = devices
        .iter()
        .filter(|d| phase.is_none_or(|p| phase_name(d) == p))
        .collect();
    ds.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let base = match phase {
        Some(p) => format!("/devices?phase={}&", url_part(p)),
        None => "/devices?".into(),
    };
    let rows = ds
        .iter()
        .skip(page_no.saturating_mul(DEVICES_PER_PAGE))
        .take(DEVICES_PER_PAGE)
        .map(|d| {
            let n = d.metadata.name.as_deref().unwrap_or("");
            let s = d.status.clone().unwrap_or_default();
            let u = s.agent_upgrade.as_ref();
            vec![
                html! { a href={ "/devices/" (url_part(n)) } { (n) } },
                text(opt_name(s.agent_version.as_ref())),
                text(opt_name(s.architecture.as_ref())),
                text(phase_name(d)),
                text(opt_name(u.and_then(|u| u.reason.as_ref()))),
                when(last_heartbeat(d), now),
                text(
                    s.workloads
                        .as_ref()
                        .map(|w| {
                            format!(
                                "{} running, {} failed, {} pending",
                                w.running, w.failed, w.pending
                            )
                        })
                        .unwrap_or_else(|| "—".into()),
                ),
            ]
        });
    page(
        "Devices",
        html! {
            (pager(&base, page_no, DEVICES_PER_PAGE, ds.len()))
            (table(
                &["device", "agent", "arch", "upgrade", "reason", "last heartbeat", "workloads"],
                rows,
            ))
        },
    )
}

/// What the device page reads from NATS.
#[derive(Default)]
pub struct DeviceKv {
    /// `device-heartbeat/<id>`.
    pub heartbeat: Option<Heartbeat>,
    /// `device-workload-status/<id>`.
    pub workloads: Option<DeviceWorkloadStatus>,
    /// The device's result in each of the newest runs: (namespace, name, its status key's value).
    pub runs: Vec<(String, String, Option<SystemUpgradeStatus>)>,
    /// Reads that failed.
    pub errors: Vec<String>,
    /// The device's newest DeviceDiagnostics ([`super::diagnostics::select`]).
    pub diagnostics: Vec<Arc<crate::crd::diagnostics::DeviceDiagnostics>>,
}

/// Reads the device page's keys: heartbeat, workload status and the status key of each of the newest
/// [`RUNS_ON_DEVICE_PAGE`] runs.
pub async fn read(state: &State, device: &DeviceId, runs: &[Arc<TaskRun>]) -> DeviceKv {
    let diagnostics = super::diagnostics::select(&state.diagnostics.state(), device.as_str());
    let mut out = DeviceKv {
        diagnostics,
        ..Default::default()
    };
    let b = match state.buckets() {
        Ok(b) => b,
        Err(e) => {
            out.errors.push(e.to_string());
            return out;
        }
    };
    match b.get(layout::DEVICE_HEARTBEAT, device.as_str()).await {
        Ok(v) => out.heartbeat = v,
        Err(e) => out.errors.push(e.to_string()),
    }
    match b.get(layout::WORKLOAD_STATUS, device.as_str()).await {
        Ok(v) => out.workloads = v,
        Err(e) => out.errors.push(e.to_string()),
    }
    let mut newest: Vec<&Arc<TaskRun>> = runs.iter().collect();
    newest.sort_by(|a, b| {
        b.metadata
            .creation_timestamp
            .cmp(&a.metadata.creation_timestamp)
    });
    let keys: Vec<(String, String, Option<AttemptId>)> = newest
        .into_iter()
        .take(RUNS_ON_DEVICE_PAGE)
        .map(|r| {
            (
                r.metadata.namespace.clone().unwrap_or_default(),
                r.metadata.name.clone().unwrap_or_default(),
                r.metadata
                    .uid
                    .as_deref()
                    .and_then(|u| AttemptId::try_from(u).ok()),
            )
        })
        .collect();
    let results: Vec<_> = futures::stream::iter(keys)
        .map(|(ns, name, uid)| {
            let b = b.clone();
            async move {
                let r = match uid {
                    Some(uid) => {
                        b.get::<SystemUpgradeStatus>(
                            layout::SYSTEM_UPGRADE_STATUS,
                            &layout::run_key(device, &uid),
                        )
                        .await
                    }
                    None => Ok(None),
                };
                (ns, name, r)
            }
        })
        .buffered(8)
        .collect()
        .await;
    for (ns, name, r) in results {
        match r {
            Ok(s) => out.runs.push((ns, name, s)),
            Err(e) => out.errors.push(e.to_string()),
        }
    }
    out
}

/// The agent's restarts (`status.agentRestarts`): the count since its latest start, in red with `crash-looping`
/// while fleet-wire's rule holds at `now`.
pub fn agent_restarts(a: Option<&crate::crd::AgentRestarts>, now: Timestamp) -> Markup {
    let Some(a) = a else {
        return text("—");
    };
    let looping = fleet_wire::workload::is_crash_looping(a.count, parse_time(&a.since), now);
    html! {
        @if looping {
            b.bad #agent-crash-looping { "crash-looping" } ": " span.bad { (a.count) }
        } @else {
            (a.count)
        }
        " automatic restarts; the running agent started "
        (when(parse_time(&a.since), now))
    }
}

/// Each filesystem the device reports (`status.usage`), fullest first; one at or above the alert threshold in red
/// (`data-disk-full`), with the free-space floor a staged rollout holds it to.
pub fn disk(u: Option<&crate::crd::UsageStatus>) -> Markup {
    let Some(u) = u else {
        return text("not reported");
    };
    let alert = u32::from(fleet_wire::usage::DISK_ALERT_PERCENT);
    let mut fs: Vec<&crate::crd::FilesystemStatus> = u.filesystems.iter().collect();
    fs.sort_by_key(|f| std::cmp::Reverse(f.used_percent));
    html! {
        @for (i, f) in fs.iter().enumerate() {
            @if i > 0 { "; " }
            @let words = format!(
                "{} {}% used, {} free of {}",
                f.role,
                f.used_percent,
                crate::fleet::usage::size(f.available_bytes),
                crate::fleet::usage::size(f.size_bytes)
            );
            @if f.used_percent >= alert {
                b.bad data-disk-full=(f.role) { (words) }
            } @else {
                (words)
            }
        }
    }
}

/// Memory as the Device shows it, in red under pressure (`data-memory-pressure`).
pub fn memory(u: Option<&crate::crd::UsageStatus>) -> Markup {
    match u {
        None => text("not reported"),
        Some(u) if u.memory_pressure => html! {
            b.bad data-memory-pressure="" { (u.memory) ": under pressure" }
        },
        Some(u) => text(&u.memory),
    }
}

/// The agent-upgrade transitions as timeline marks; failed and rolled-back phases are the bad ones.
pub fn upgrade_marks(transitions: &[Transition<UpgradePhase>]) -> Vec<timeline::Mark> {
    transitions
        .iter()
        .map(|t| timeline::Mark {
            at: t.at,
            phase: name(&t.phase),
            bad: matches!(
                t.phase,
                UpgradePhase::Failed | UpgradePhase::RollingBack | UpgradePhase::RollbackFailed
            ),
        })
        .collect()
}

/// The device page.
pub fn render(d: &Device, kv: &DeviceKv, alerts: &[Alert], now: Timestamp) -> String {
    let n = d.metadata.name.as_deref().unwrap_or("");
    let s = d.status.clone().unwrap_or_default();
    let heartbeat = match &kv.heartbeat {
        Some(hb) => html! {
            (when(Some(hb.at), now)) " (sequence " (hb.sequence) ", agent " (name(&hb.agent_version)) ")"
        },
        None => when(s.last_heartbeat.as_deref().and_then(parse_time), now),
    };
    let facts = pairs([
        (
            "labels",
            html! {
                @for (i, (k, v)) in d.metadata.labels.iter().flatten().enumerate() {
                    @if i > 0 { " " }
                    code { (k) "=" (v) }
                }
            },
        ),
        (
            "description",
            text(d.spec.description.as_deref().unwrap_or("—")),
        ),
        ("agent version", text(opt_name(s.agent_version.as_ref()))),
        ("architecture", text(opt_name(s.architecture.as_ref()))),
        ("OS", text(s.os.as_deref().unwrap_or("—"))),
        (
            "capabilities",
            text(
                s.capabilities
                    .iter()
                    .map(name)
                    .collect::<Vec<_>>()
                    .join(", "),
            ),
        ),
        ("last heartbeat", heartbeat),
        (
            "agent restarts",
            agent_restarts(s.agent_restarts.as_ref(), now),
        ),
        ("disk", disk(s.usage.as_ref())),
        ("memory", memory(s.usage.as_ref())),
        (
            "load (1 min)",
            text(
                s.usage
                    .as_ref()
                    .map(|u| format!("{} on {} CPUs", u.load1m, u.cpus))
                    .unwrap_or_else(|| "—".into()),
            ),
        ),
    ]);
    let workloads = match &kv.workloads {
        None => html! { p.muted { "The device has not reported workloads." } },
        Some(w) => html! {
            p { "Reported " (when(Some(w.at), now)) " for generation " (w.generation) "." }
            @if let Some(e) = &w.desired_error {
                p.bad data-desired-error="" { "The agent cannot honour its latest desired state: " (e.as_str()) }
            }
            (table(
                &["workload", "state", "restarts", "container", "error"],
                w.workloads.iter().map(|x| {
                    let looping = matches!(
                        x.state,
                        fleet_wire::WorkloadState::CrashLooping | fleet_wire::WorkloadState::OomKilled
                    );
                    vec![
                        text(name(&x.name)),
                        html! {
                            @if looping {
                                b.bad data-crash-looping=(name(&x.name)) { (name(&x.state)) }
                            } @else {
                                (name(&x.state))
                            }
                        },
                        html! {
                            @match x.restarts {
                                None => "—",
                                Some(r) => {
                                    @let shown = match (r.last_exit_code, r.oom_killed) {
                                        (_, true) => format!("{} (last killed: out of memory)", r.count),
                                        (Some(c), false) => format!("{} (last exit code {c})", r.count),
                                        (None, false) => r.count.to_string(),
                                    };
                                    @if looping { span.bad { (shown) } } @else { (shown) }
                                },
                            }
                        },
                        text(
                            x.container_id
                                .as_deref()
                                .map(|c| &c[..c.len().min(12)])
                                .unwrap_or("—"),
                        ),
                        text(x.error.as_ref().map(|e| e.to_string()).unwrap_or_default()),
                    ]
                }),
            ))
        },
    };
    let upgrade = match &s.agent_upgrade {
        None => html! { p.muted { "No agent upgrade attempted." } },
        Some(u) => {
            let bad = matches!(
                u.phase,
                fleet_wire::UpgradePhase::Failed | fleet_wire::UpgradePhase::RollbackFailed
            );
            html! {
                p {
                    "Phase " b.bad[bad].ok[!bad] #upgrade-phase { (name(&u.phase)) }
                    @if let Some(r) = &u.reason { ", reason " b { (name(r)) } }
                    " — target " (opt_name(u.target_version.as_ref()))
                    ", attempt " code { (opt_name(u.attempt_id.as_ref())) }
                    " started " (when(Some(u.attempt_started_at), now)) "."
                }
                @if let Some(e) = &u.error {
                    p { "Latest error: " span.bad #upgrade-error { (e.to_string()) } }
                }
                @if let Some(dt) = &u.detail {
                    p.muted { (dt.to_string()) }
                }
                @if let Some(unit) = &u.journal_unit {
                    p.muted { "Its log: " code { "journalctl -u " (name(unit)) } }
                }
                (timeline::timeline("agent-upgrade transitions", &upgrade_marks(u.transitions.as_slice())))
                table #upgrade-timeline {
                    thead { tr { th { "#" } th { "phase" } th { "at" } th { "reason" } } }
                    tbody {
                        @for (i, t) in u.transitions.as_slice().iter().enumerate() {
                            tr {
                                td { (i + 1) }
                                td { (name(&t.phase)) }
                                td { (when(Some(t.at), now)) }
                                td { (opt_name(t.reason.as_ref())) }
                            }
                        }
                    }
                }
            }
        }
    };
    let results: Vec<Vec<Markup>> = kv
        .runs
        .iter()
        .filter_map(|(ns, run, st)| {
            let st = st.as_ref()?;
            Some(vec![
                html! { a href={ "/runs/" (url_part(ns)) "/" (url_part(run)) } { (ns) "/" (run) } },
                text(name(&st.phase)),
                text(opt_name(st.reason.as_ref())),
                when(Some(st.accepted_at), now),
                when(st.completed_at, now),
                text(st.error.as_ref().map(|e| e.to_string()).unwrap_or_default()),
            ])
        })
        .collect();
    page(
        &format!("Device {n}"),
        html! {
            (some_alerts(alerts, |a| matches!(&a.subject, super::alerts::Subject::Device(x) | super::alerts::Subject::Workload { device: x, .. } if x == n), now))
            (super::blocking::section(&s, now))
            @for e in &kv.errors {
                p.bad { "Could not read: " (e) }
            }
            (facts)
            h2 { "Workloads" }
            (workloads)
            h2 { "Agent upgrade" }
            (upgrade)
            h2 { "Task results" }
            @if results.is_empty() {
                p.muted { "No result in the newest " (RUNS_ON_DEVICE_PAGE) " task runs." }
            } @else {
                (table(&["run", "phase", "reason", "accepted", "completed", "error"], results))
            }
            (super::diagnostics::section(&kv.diagnostics, now))
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_wire::fixtures;

    /// A crash-looping agent and workload show in red with their restarts and the workload's last exit code; a
    /// calm agent shows its count without either.
    #[test]
    fn crash_loops_show_in_red() {
        let now = Timestamp::now();
        let device = |since: Timestamp| -> Device {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "Device",
                "metadata": {"name": "pi-7"}, "spec": {},
                "status": {"agentRestarts": {"count": 5, "since": since.to_string(), "crashLooping": true}}
            }))
            .expect("device")
        };
        let kv = DeviceKv {
            workloads: Some(fixtures::workload_status_crash_looping()),
            ..Default::default()
        };
        let page = render(&device(now), &kv, &[], now);
        assert!(
            page.contains(r#"<b class="bad" id="agent-crash-looping">crash-looping</b>: <span class="bad">5</span>"#),
            "{page}"
        );
        assert!(
            page.contains(r#"<b class="bad" data-crash-looping="web">crash-looping</b>"#),
            "{page}"
        );
        assert!(
            page.contains(r#"<span class="bad">7 (last exit code 3)</span>"#),
            "{page}"
        );
        // The agent's latest start 11 minutes ago: no longer crash-looping (judged now, whatever was written).
        let calm = render(
            &device(Timestamp::from_unix_ms(now.unix_ms() - 11 * 60 * 1000)),
            &DeviceKv::default(),
            &[],
            now,
        );
        assert!(!calm.contains("agent-crash-looping"), "{calm}");
        assert!(calm.contains("<td>5 automatic restarts"), "{calm}");
    }

    /// An OOM kill shows in red as `oom-killed` with "out of memory" in the restarts, and a desired state the agent
    /// cannot honour is said above the table.
    #[test]
    fn oom_kills_and_unreadable_desired_states_show() {
        let now = Timestamp::now();
        let d: Device = serde_json::from_value(serde_json::json!({
            "apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "Device",
            "metadata": {"name": "pi-7"}, "spec": {}, "status": {}
        }))
        .expect("device");
        let mut w = fixtures::workload_status_crash_looping();
        w.workloads[0].state = fleet_wire::WorkloadState::OomKilled;
        w.workloads[0]
            .restarts
            .as_mut()
            .expect("restarts")
            .oom_killed = true;
        w.desired_error = Some(fleet_wire::BoundedText::lossy(
            "unknown field `futureField` <b>",
        ));
        let kv = DeviceKv {
            workloads: Some(w),
            ..Default::default()
        };
        let page = render(&d, &kv, &[], now);
        assert!(
            page.contains(r#"<b class="bad" data-crash-looping="web">oom-killed</b>"#),
            "{page}"
        );
        assert!(page.contains("7 (last killed: out of memory)"), "{page}");
        assert!(
            page.contains(
                "cannot honour its latest desired state: unknown field `futureField` &lt;b&gt;"
            ),
            "{page}"
        );
    }

    /// The device page shows each filesystem, memory and load from status.usage; a full filesystem and memory
    /// pressure in red.
    #[test]
    fn usage_shows_with_what_is_full() {
        let now = Timestamp::now();
        let d: Device = serde_json::from_value(serde_json::json!({
            "apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "Device",
            "metadata": {"name": "pi-7"}, "spec": {},
            "status": {"usage": {
                "disk": "96% containers, 41 MiB free", "diskUsedPercent": 96, "diskRole": "containers",
                "diskFull": true, "memory": "3% available", "memoryAvailablePercent": 3, "memoryPressure": true,
                "load1m": "0.42", "cpus": 4,
                "filesystems": [
                    {"role": "root", "usedPercent": 25, "availableBytes": 6442450944u64, "sizeBytes": 8589934592u64},
                    {"role": "containers", "usedPercent": 96, "availableBytes": 42991616, "sizeBytes": 1073741824}
                ]
            }}
        }))
        .expect("device");
        let page = render(&d, &DeviceKv::default(), &[], now);
        assert!(
            page.contains(r#"<b class="bad" data-disk-full="containers">containers 96% used, 41 MiB free of 1.0 GiB</b>; root 25% used, 6.0 GiB free of 8.0 GiB"#),
            "{page}"
        );
        assert!(
            page.contains(r#"data-memory-pressure="">3% available: under pressure"#),
            "{page}"
        );
        assert!(page.contains("0.42 on 4 CPUs"), "{page}");
    }
}
