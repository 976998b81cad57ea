//! The fleet overview page (devices by agent version, upgrade phase and heartbeat age; groups; task runs; alerts)
//! and the alert list it shares with the alerts page.

use super::alerts::{Alert, Subject};
use super::html::{age, esc, url_part, when, Html};
use crate::crd::tasks::TaskRun;
use crate::crd::{Device, DeviceGroup};
use fleet_wire::Timestamp;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// Heartbeat-age buckets of the overview, upper bounds exclusive.
const AGE_BUCKETS: [(u64, &str); 4] = [
    (60, "under 1 minute"),
    (5 * 60, "1–5 minutes"),
    (3600, "5–60 minutes"),
    (86400, "1–24 hours"),
];

/// A link to the page of what `s` names.
pub fn subject_link(s: &Subject) -> String {
    match s {
        Subject::Device(d) => format!("device <a href=\"/devices/{}\">{}</a>", url_part(d), esc(d)),
        Subject::Run { namespace, name } => format!(
            "task run <a href=\"/runs/{}/{}\">{}/{}</a>",
            url_part(namespace),
            url_part(name),
            esc(namespace),
            esc(name)
        ),
        Subject::Holder { .. } | Subject::FleetLock => {
            format!("<a href=\"/reboots\">{}</a>", esc(&s.to_string()))
        }
    }
}

/// Appends `alerts` as a list of boxes: title, subject, since when, detail and what to do.
pub fn alert_list(h: &mut Html, alerts: &[Alert], now: Timestamp) {
    if alerts.is_empty() {
        h.raw("<p class=\"ok\">No alerts.</p>");
        return;
    }
    for a in alerts {
        h.raw(&format!(
            "<div class=\"alert\" data-alert=\"{}\"><h3>{}: {}</h3><p>Since {}. {}</p><p class=\"muted\">{}</p></div>",
            a.kind.as_str(),
            esc(a.kind.title()),
            subject_link(&a.subject),
            when(a.since, now),
            esc(&a.detail),
            esc(a.kind.action())
        ));
    }
}

fn count_rows(m: BTreeMap<String, usize>) -> Vec<Vec<String>> {
    m.into_iter()
        .map(|(k, n)| vec![esc(&k), n.to_string()])
        .collect()
}

/// The upgrade phase of a device as shown (`none` before its first attempt).
pub fn phase_name(d: &Device) -> String {
    d.status
        .as_ref()
        .and_then(|s| s.agent_upgrade.as_ref())
        .map(|u| crate::deployments::rollout::phase_word(u.phase))
        .unwrap_or_else(|| "none".into())
}

/// The phase of a TaskRun as shown (`Pending` before the operator first wrote its status).
pub fn run_phase_name(r: &TaskRun) -> String {
    r.status
        .as_ref()
        .and_then(|s| s.run.phase)
        .and_then(|p| serde_json::to_value(p).ok())
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| "Pending".into())
}

/// The overview page.
pub fn render(
    devices: &[Arc<Device>],
    groups: &[Arc<DeviceGroup>],
    runs: &[Arc<TaskRun>],
    alerts: &[Alert],
    last_heartbeat: &dyn Fn(&Device) -> Option<Timestamp>,
    now: Timestamp,
) -> String {
    let mut h = Html::page("Fleet overview");
    h.raw(&format!(
        "<p>{} devices, {} groups, {} task runs, <a href=\"/alerts\">{} alerts</a>.</p>",
        devices.len(),
        groups.len(),
        runs.len(),
        alerts.len()
    ));
    h.raw("<h2>Alerts</h2>");
    alert_list(&mut h, alerts, now);

    let (mut versions, mut phases, mut ages) = (BTreeMap::new(), BTreeMap::new(), BTreeMap::new());
    for d in devices {
        let s = d.status.as_ref();
        let v = s
            .and_then(|s| s.agent_version.as_ref())
            .map(|v| v.to_string())
            .unwrap_or_else(|| "unknown".into());
        *versions.entry(v).or_insert(0usize) += 1;
        *phases.entry(phase_name(d)).or_insert(0usize) += 1;
        let hb = last_heartbeat(d);
        let bucket = match hb {
            None => (u64::MAX, "never".to_string()),
            Some(t) => {
                let secs = now.since(t).as_secs();
                AGE_BUCKETS
                    .iter()
                    .find(|(max, _)| secs < *max)
                    .map(|(max, l)| (*max, (*l).to_string()))
                    .unwrap_or((u64::MAX - 1, "over 24 hours".into()))
            }
        };
        *ages.entry(bucket).or_insert(0usize) += 1;
    }
    h.raw("<h2>Devices by agent version</h2>");
    h.table(&["version", "devices"], count_rows(versions));
    h.raw("<h2>Devices by agent-upgrade phase</h2>");
    h.table(
        &["phase", "devices"],
        phases.into_iter().map(|(p, n)| {
            let cls = match p.as_str() {
                "rollback-failed" | "failed" => " class=\"bad\"",
                _ => "",
            };
            vec![format!("<span{cls}>{}</span>", esc(&p)), n.to_string()]
        }),
    );
    h.raw("<h2>Devices by heartbeat age</h2>");
    h.table(
        &["last heartbeat", "devices"],
        ages.into_iter()
            .map(|((_, l), n)| vec![esc(&l), n.to_string()]),
    );
    h.raw(&format!(
        "<p><a href=\"/devices\">All {} devices</a></p>",
        devices.len()
    ));

    h.raw("<h2>Groups</h2>");
    let mut gs: Vec<_> = groups.iter().collect();
    gs.sort_by_key(|g| g.metadata.name.clone());
    h.table(
        &["group", "members", "ready"],
        gs.iter().map(|g| {
            let s = g.status.as_ref();
            let ready = s
                .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
                .map(|c| format!("{} ({})", c.status, c.reason))
                .unwrap_or_else(|| "—".into());
            vec![
                esc(g.metadata.name.as_deref().unwrap_or("")),
                s.and_then(|s| s.member_count)
                    .map(|n| n.to_string())
                    .unwrap_or_else(|| "—".into()),
                esc(&ready),
            ]
        }),
    );

    h.raw("<h2>Task runs by phase</h2>");
    let mut by_phase = BTreeMap::new();
    for r in runs {
        *by_phase.entry(run_phase_name(r)).or_insert(0usize) += 1;
    }
    h.table(&["phase", "runs"], count_rows(by_phase));
    h.raw("<p><a href=\"/runs\">Task run history</a></p>");
    h.raw(&format!(
        "<p class=\"muted\">Rendered at {now}; heartbeat ages come from the Device objects (written at most every \
         {}).</p>",
        age(Duration::from_secs(30))
    ));
    h.finish()
}
