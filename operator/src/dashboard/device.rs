//! The device list (paged) and the device page: labels, versions, OS, workloads and their status, the agent-upgrade
//! timeline (the up to 16 transitions the Device carries, with times and typed reasons, and the latest error), task
//! results and the last heartbeat. Workload specs (and so their environment) are never read: the page shows only
//! what the device reports about each workload.

use super::alerts::Alert;
use super::html::{esc, name, opt_name, parse_time, url_part, when, Html};
use super::overview::{alert_list, phase_name};
use super::state::State;
use crate::crd::tasks::TaskRun;
use crate::crd::Device;
use fleet_wire::kv as layout;
use fleet_wire::{
    AttemptId, DeviceId, DeviceWorkloadStatus, Heartbeat, SystemUpgradeStatus, Timestamp,
};
use futures::StreamExt;
use std::sync::Arc;

/// Devices per page of the device list.
pub const DEVICES_PER_PAGE: usize = 200;
/// Task runs whose result the device page reads (the newest).
pub const RUNS_ON_DEVICE_PAGE: usize = 20;

/// Page links `prev`/`next` for page `page` (0-based) of `total` items, `per` per page; `base` ends in `?` or `&`.
pub fn pager(base: &str, page: usize, per: usize, total: usize) -> String {
    let pages = total.div_ceil(per).max(1);
    let mut o = format!(
        "<nav class=\"pages\">page {} of {pages} ({total} in all) ",
        page + 1
    );
    if page > 0 {
        o.push_str(&format!("<a href=\"{base}page={}\">previous</a>", page - 1));
    }
    if page + 1 < pages {
        o.push_str(&format!("<a href=\"{base}page={}\">next</a>", page + 1));
    }
    o.push_str("</nav>");
    o
}

/// The device list: page `page`, only devices in upgrade phase `phase` when given.
pub fn list(
    devices: &[Arc<Device>],
    page: usize,
    phase: Option<&str>,
    last_heartbeat: &dyn Fn(&Device) -> Option<Timestamp>,
    now: Timestamp,
) -> String {
    let mut ds: Vec<&Arc<Device>> = devices
        .iter()
        .filter(|d| phase.is_none_or(|p| phase_name(d) == p))
        .collect();
    ds.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let mut h = Html::page("Devices");
    let base = match phase {
        Some(p) => format!("/devices?phase={}&amp;", url_part(p)),
        None => "/devices?".into(),
    };
    h.raw(&pager(&base, page, DEVICES_PER_PAGE, ds.len()));
    h.table(
        &[
            "device",
            "agent",
            "arch",
            "upgrade",
            "reason",
            "last heartbeat",
            "workloads",
        ],
        ds.iter()
            .skip(page.saturating_mul(DEVICES_PER_PAGE))
            .take(DEVICES_PER_PAGE)
            .map(|d| {
                let n = d.metadata.name.as_deref().unwrap_or("");
                let s = d.status.clone().unwrap_or_default();
                let u = s.agent_upgrade.as_ref();
                vec![
                    format!("<a href=\"/devices/{}\">{}</a>", url_part(n), esc(n)),
                    opt_name(s.agent_version.as_ref()),
                    opt_name(s.architecture.as_ref()),
                    esc(&phase_name(d)),
                    opt_name(u.and_then(|u| u.reason.as_ref())),
                    when(last_heartbeat(d), now),
                    s.workloads
                        .as_ref()
                        .map(|w| {
                            format!(
                                "{} running, {} failed, {} pending",
                                w.running, w.failed, w.pending
                            )
                        })
                        .unwrap_or_else(|| "—".into()),
                ]
            }),
    );
    h.finish()
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
}

/// Reads the device page's keys: heartbeat, workload status and the status key of each of the newest
/// [`RUNS_ON_DEVICE_PAGE`] runs.
pub async fn read(state: &State, device: &DeviceId, runs: &[Arc<TaskRun>]) -> DeviceKv {
    let mut out = DeviceKv::default();
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

/// The device page.
pub fn render(d: &Device, kv: &DeviceKv, alerts: &[Alert], now: Timestamp) -> String {
    let n = d.metadata.name.as_deref().unwrap_or("");
    let s = d.status.clone().unwrap_or_default();
    let mut h = Html::page(&format!("Device {n}"));
    let mine: Vec<Alert> = alerts
        .iter()
        .filter(|a| matches!(&a.subject, super::alerts::Subject::Device(x) if x == n))
        .cloned()
        .collect();
    if !mine.is_empty() {
        alert_list(&mut h, &mine, now);
    }
    for e in &kv.errors {
        h.raw(&format!("<p class=\"bad\">Could not read: {}</p>", esc(e)));
    }
    let labels: Vec<String> = d
        .metadata
        .labels
        .iter()
        .flatten()
        .map(|(k, v)| format!("<code>{}={}</code>", esc(k), esc(v)))
        .collect();
    let heartbeat = match &kv.heartbeat {
        Some(hb) => format!(
            "{} (sequence {}, agent {})",
            when(Some(hb.at), now),
            hb.sequence,
            name(&hb.agent_version)
        ),
        None => when(s.last_heartbeat.as_deref().and_then(parse_time), now),
    };
    h.pairs([
        ("labels", labels.join(" ")),
        (
            "description",
            esc(d.spec.description.as_deref().unwrap_or("—")),
        ),
        ("agent version", opt_name(s.agent_version.as_ref())),
        ("architecture", opt_name(s.architecture.as_ref())),
        ("OS", esc(s.os.as_deref().unwrap_or("—"))),
        (
            "capabilities",
            s.capabilities
                .iter()
                .map(name)
                .collect::<Vec<_>>()
                .join(", "),
        ),
        ("last heartbeat", heartbeat),
    ]);

    h.raw("<h2>Workloads</h2>");
    match &kv.workloads {
        None => {
            h.raw("<p class=\"muted\">The device has not reported workloads.</p>");
        }
        Some(w) => {
            h.raw(&format!(
                "<p>Reported {} for generation {}.</p>",
                when(Some(w.at), now),
                w.generation
            ));
            h.table(
                &["workload", "state", "container", "error"],
                w.workloads.iter().map(|x| {
                    vec![
                        name(&x.name),
                        name(&x.state),
                        esc(x
                            .container_id
                            .as_deref()
                            .map(|c| &c[..c.len().min(12)])
                            .unwrap_or("—")),
                        x.error
                            .as_ref()
                            .map(|e| esc(&e.to_string()))
                            .unwrap_or_default(),
                    ]
                }),
            );
        }
    }

    h.raw("<h2>Agent upgrade</h2>");
    match &s.agent_upgrade {
        None => {
            h.raw("<p class=\"muted\">No agent upgrade attempted.</p>");
        }
        Some(u) => {
            let bad = matches!(
                u.phase,
                fleet_wire::UpgradePhase::Failed | fleet_wire::UpgradePhase::RollbackFailed
            );
            h.raw(&format!(
                "<p>Phase <b class=\"{}\" id=\"upgrade-phase\">{}</b>{} — target {}, attempt <code>{}</code> started {}.</p>",
                if bad { "bad" } else { "ok" },
                name(&u.phase),
                u.reason.as_ref().map(|r| format!(", reason <b>{}</b>", name(r))).unwrap_or_default(),
                opt_name(u.target_version.as_ref()),
                opt_name(u.attempt_id.as_ref()),
                when(Some(u.attempt_started_at), now)
            ));
            if let Some(e) = &u.error {
                h.raw(&format!(
                    "<p>Latest error: <span class=\"bad\" id=\"upgrade-error\">{}</span></p>",
                    esc(&e.to_string())
                ));
            }
            if let Some(dt) = &u.detail {
                h.raw(&format!("<p class=\"muted\">{}</p>", esc(&dt.to_string())));
            }
            if let Some(unit) = &u.journal_unit {
                h.raw(&format!(
                    "<p class=\"muted\">Its log: <code>journalctl -u {}</code></p>",
                    name(unit)
                ));
            }
            h.raw("<table id=\"upgrade-timeline\"><thead><tr><th>#</th><th>phase</th><th>at</th><th>reason</th></tr></thead><tbody>");
            for (i, t) in u.transitions.as_slice().iter().enumerate() {
                h.raw(&format!(
                    "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                    i + 1,
                    name(&t.phase),
                    when(Some(t.at), now),
                    opt_name(t.reason.as_ref())
                ));
            }
            h.raw("</tbody></table>");
        }
    }

    h.raw("<h2>Task results</h2>");
    let rows: Vec<Vec<String>> = kv
        .runs
        .iter()
        .filter_map(|(ns, run, st)| {
            let st = st.as_ref()?;
            Some(vec![
                format!(
                    "<a href=\"/runs/{}/{}\">{}/{}</a>",
                    url_part(ns),
                    url_part(run),
                    esc(ns),
                    esc(run)
                ),
                name(&st.phase),
                opt_name(st.reason.as_ref()),
                when(Some(st.accepted_at), now),
                when(st.completed_at, now),
                st.error
                    .as_ref()
                    .map(|e| esc(&e.to_string()))
                    .unwrap_or_default(),
            ])
        })
        .collect();
    if rows.is_empty() {
        h.raw(&format!(
            "<p class=\"muted\">No result in the newest {RUNS_ON_DEVICE_PAGE} task runs.</p>"
        ));
    } else {
        h.table(
            &["run", "phase", "reason", "accepted", "completed", "error"],
            rows,
        );
    }
    h.finish()
}
