//! The fleet overview page (devices by agent version, upgrade phase and heartbeat age; groups; task runs; alerts)
//! and the alert list it shares with the alerts page.

use super::alerts::{Alert, Subject};
use super::html::{age, page, table, text, url_part, when};
use crate::crd::tasks::TaskRun;
use crate::crd::{Device, DeviceGroup};
use fleet_wire::Timestamp;
use maud::{html, Markup};
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
pub fn subject_link(s: &Subject) -> Markup {
    match s {
        Subject::Device(d) => html! { "device " a href={ "/devices/" (url_part(d)) } { (d) } },
        Subject::Run { namespace, name } => html! {
            "task run " a href={ "/runs/" (url_part(namespace)) "/" (url_part(name)) } { (namespace) "/" (name) }
        },
        Subject::Holder { .. } | Subject::FleetLock => {
            html! { a href="/reboots" { (s.to_string()) } }
        }
    }
}

/// `alerts` as a list of boxes: title, subject, since when, detail and what to do.
pub fn alert_list(alerts: &[Alert], now: Timestamp) -> Markup {
    html! {
        @if alerts.is_empty() {
            p.ok { "No alerts." }
        }
        @for a in alerts {
            div.alert data-alert=(a.kind.as_str()) {
                h3 { (a.kind.title()) ": " (subject_link(&a.subject)) }
                p { "Since " (when(a.since, now)) ". " (a.detail) }
                p.muted { (a.kind.action()) }
            }
        }
    }
}

/// [`alert_list`] of the alerts `keep` selects, nothing when none.
pub fn some_alerts(alerts: &[Alert], keep: impl Fn(&Alert) -> bool, now: Timestamp) -> Markup {
    let mine: Vec<Alert> = alerts.iter().filter(|a| keep(a)).cloned().collect();
    html! {
        @if !mine.is_empty() { (alert_list(&mine, now)) }
    }
}

fn count_rows(m: BTreeMap<String, usize>) -> Vec<Vec<Markup>> {
    m.into_iter()
        .map(|(k, n)| vec![text(k), text(n.to_string())])
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
    let mut gs: Vec<_> = groups.iter().collect();
    gs.sort_by_key(|g| g.metadata.name.clone());
    let groups_table = table(
        &["group", "members", "ready"],
        gs.iter().map(|g| {
            let s = g.status.as_ref();
            let ready = s
                .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
                .map(|c| format!("{} ({})", c.status, c.reason))
                .unwrap_or_else(|| "—".into());
            vec![
                text(g.metadata.name.as_deref().unwrap_or("")),
                text(
                    s.and_then(|s| s.member_count)
                        .map(|n| n.to_string())
                        .unwrap_or_else(|| "—".into()),
                ),
                text(ready),
            ]
        }),
    );
    let mut by_phase = BTreeMap::new();
    for r in runs {
        *by_phase.entry(run_phase_name(r)).or_insert(0usize) += 1;
    }
    page(
        "Fleet overview",
        html! {
            p {
                (devices.len()) " devices, " (groups.len()) " groups, " (runs.len()) " task runs, "
                a href="/alerts" { (alerts.len()) " alerts" } "."
            }
            h2 { "Alerts" }
            (alert_list(alerts, now))
            h2 { "Devices by agent version" }
            (table(&["version", "devices"], count_rows(versions)))
            h2 { "Devices by agent-upgrade phase" }
            (table(
                &["phase", "devices"],
                phases.into_iter().map(|(p, n)| {
                    let bad = matches!(p.as_str(), "rollback-failed" | "failed");
                    vec![html! { span.bad[bad] { (p) } }, text(n.to_string())]
                }),
            ))
            h2 { "Devices by heartbeat age" }
            (table(
                &["last heartbeat", "devices"],
                ages.into_iter().map(|((_, l), n)| vec![text(l), text(n.to_string())]),
            ))
            p { a href="/devices" { "All " (devices.len()) " devices" } }
            h2 { "Groups" }
            (groups_table)
            h2 { "Task runs by phase" }
            (table(&["phase", "runs"], count_rows(by_phase)))
            p { a href="/runs" { "Task run history" } }
            h2 { "Rollouts" }
            p { a href="/releases" { "Agent releases" } " · " a href="/deployments" { "Deployments" } }
            p.muted {
                "Rendered at " (now) "; heartbeat ages come from the Device objects (written at most every "
                (age(Duration::from_secs(30))) ")."
            }
        },
    )
}
