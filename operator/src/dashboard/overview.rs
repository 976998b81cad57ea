//! The fleet overview page (alerts; pictures of the fleet: devices by agent version and by heartbeat age,
//! workloads by state, the rollouts not complete and the running task runs, each a [`bar`]; devices by
//! agent-upgrade phase; groups; task runs by phase) and the alert list it shares with the alerts page. Every count
//! is [`fleet_counts`]' from the caches, the same `/metrics` exports.

use super::alerts::{Alert, Subject};
use super::bars::{bar, Part};
use super::fleet_counts::{self as counts, Workloads, OTHER, RELEASE};
use super::html::{name, page, table, text, url_part, when};
use super::rollouts::rollout_bar;
use super::runs::{progress, run_link};
use crate::crd::tasks::TaskRun;
use crate::crd::{AgentRelease, Device, DeviceGroup, FleetDeployment};
use fleet_wire::Timestamp;
use maud::{html, Markup};
use std::collections::BTreeMap;
use std::sync::Arc;

/// A link to the page of what `s` names.
pub fn subject_link(s: &Subject) -> Markup {
    match s {
        Subject::Device(d) => html! { "device " a href={ "/devices/" (url_part(d)) } { (d) } },
        Subject::Workload { device, workload } => html! {
            "workload " (workload) " on device " a href={ "/devices/" (url_part(device)) } { (device) }
        },
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
                // "Since <time> (<age> ago): <detail>", the detail being the rest of the sentence.
                p {
                    @if a.since.is_some() { "Since " (when(a.since, now)) ": " }
                    (a.detail)
                }
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
        .map(|u| crate::fleet::rollout::phase_word(u.phase))
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

/// Parts of the agent-versions bar besides [`OTHER`].
pub const VERSION_PARTS: usize = 8;
/// Colours of the version parts, most devices first; [`OTHER`] is grey.
pub const VERSION_COLOURS: [&str; VERSION_PARTS] = [
    "#23395d", "#48c", "#7b7", "#c80", "#a5a", "#0aa", "#b55", "#070",
];
/// Colours of the heartbeat-age parts, youngest first, then over a day and never.
const AGE_COLOURS: [&str; 6] = ["#070", "#7b7", "#c80", "#d50", "#b00", "#999"];

/// The objects the overview shows, from the dashboard's caches.
pub struct Objects<'a> {
    /// Devices.
    pub devices: &'a [Arc<Device>],
    /// DeviceGroups.
    pub groups: &'a [Arc<DeviceGroup>],
    /// TaskRuns.
    pub runs: &'a [Arc<TaskRun>],
    /// AgentReleases.
    pub releases: &'a [Arc<AgentRelease>],
    /// FleetDeployments.
    pub deployments: &'a [Arc<FleetDeployment>],
    /// The agent-version samples of the last day, oldest first.
    pub version_history: &'a [super::version_history::Sample],
}

/// A bar the browser test and the unit tests find by `data-bar`.
fn marked(id: &str, b: Markup) -> Markup {
    html! { div data-bar=(id) { (b) } }
}

/// The agent-versions bar: one part per version, most devices first, at most [`VERSION_PARTS`] and the rest as
/// [`OTHER`].
pub fn versions_bar(versions: &BTreeMap<String, u64>) -> Markup {
    let parts: Vec<Part> = counts::top(versions, VERSION_PARTS)
        .into_iter()
        .enumerate()
        .map(|(i, (v, n))| {
            let colour = if v == OTHER && i == VERSION_PARTS {
                "#bbb"
            } else {
                VERSION_COLOURS[i % VERSION_PARTS]
            };
            Part::new(v, n, colour)
        })
        .collect();
    bar("devices by agent version", &parts)
}

/// The heartbeat-age bar: every bucket of [`counts::heartbeat_ages`], youngest first.
pub fn ages_bar(ages: &[(&'static str, u64)]) -> Markup {
    let parts: Vec<Part> = ages
        .iter()
        .zip(AGE_COLOURS)
        .map(|((l, n), c)| Part::new(*l, *n, c))
        .collect();
    bar("devices by heartbeat age", &parts)
}

/// The fleet's workloads bar: running, failed (not crash-looping), crash-looping and pending, summed over the
/// Devices ([`Workloads::by_state`]).
pub fn fleet_workloads_bar(w: &Workloads) -> Markup {
    let colour = |state| match state {
        "running" => "#070",
        "failed" => "#b00",
        "crash-looping" => "#600",
        _ => "#bbb",
    };
    let parts: Vec<Part> = w
        .by_state()
        .into_iter()
        .map(|(state, n)| Part::new(format!("workloads {state}"), n, colour(state)))
        .collect();
    bar("workloads on the fleet", &parts)
}

/// The path of a rollout's page.
fn rollout_path(kind: &str, n: &str) -> String {
    let base = if kind == RELEASE {
        "/releases/"
    } else {
        "/deployments/"
    };
    format!("{base}{}", url_part(n))
}

/// The overview page.
pub fn render(
    o: &Objects,
    alerts: &[Alert],
    last_heartbeat: &dyn Fn(&Device) -> Option<Timestamp>,
    now: Timestamp,
) -> String {
    let devices = o.devices;
    let versions = counts::versions(devices);
    let ages = counts::heartbeat_ages(devices, last_heartbeat, now);
    let workloads = counts::workloads(devices);
    let mut phases = BTreeMap::new();
    for d in devices {
        *phases.entry(phase_name(d)).or_insert(0usize) += 1;
    }
    // Devices whose Device shows a full disk or memory pressure (status.usage, decided by the operator).
    let usage = |f: fn(&crate::crd::UsageStatus) -> bool| {
        devices
            .iter()
            .filter(|d| {
                d.status
                    .as_ref()
                    .and_then(|s| s.usage.as_ref())
                    .is_some_and(f)
            })
            .count()
    };
    let (disk_full, memory_pressure) = (usage(|u| u.disk_full), usage(|u| u.memory_pressure));
    let mut gs: Vec<_> = o.groups.iter().collect();
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
    for r in o.runs {
        *by_phase.entry(run_phase_name(r)).or_insert(0usize) += 1;
    }
    let rollouts = counts::not_complete(o.releases, o.deployments);
    let rollout_rows = rollouts.iter().map(|r| {
        let id = format!("{}/{}", r.kind, r.name);
        vec![
            text(if r.kind == RELEASE {
                "agent release"
            } else {
                "deployment"
            }),
            html! { a href=(rollout_path(r.kind, r.name)) { (r.name) } },
            text(name(&r.status.phase)),
            html! { div.minibar { (marked(&id, rollout_bar(r.status))) } },
        ]
    });
    let running = counts::running(o.runs);
    let run_rows = running.iter().map(|r| {
        let ns = r.metadata.namespace.as_deref().unwrap_or("");
        let n = r.metadata.name.as_deref().unwrap_or("");
        let st = r.status.clone().unwrap_or_default().run;
        vec![
            run_link(ns, n),
            html! { div.minibar { (marked(&format!("TaskRun/{ns}/{n}"), progress(&st))) } },
        ]
    });
    page(
        "Fleet overview",
        html! {
            p {
                (devices.len()) " devices, " (o.groups.len()) " groups, " (o.runs.len()) " task runs, "
                a href="/alerts" { (alerts.len()) " alerts" } "."
            }
            h2 { "Alerts" }
            (alert_list(alerts, now))
            h2 { "Devices by agent version" }
            (marked("agent-versions", versions_bar(&versions)))
            (table(
                &["version", "devices"],
                versions.iter().map(|(v, n)| vec![text(v), text(n.to_string())]),
            ))
            h3 { "Over the last day" }
            div data-chart="version-history" { (super::version_history::chart(o.version_history)) }
            h2 { "Devices by heartbeat age" }
            (marked("heartbeat-ages", ages_bar(&ages)))
            h2 { "Workloads" }
            (marked("workloads", fleet_workloads_bar(&workloads)))
            p.muted {
                "Summed over the " (workloads.devices) " devices that report workloads (each Device's status)."
            }
            h2 { "Resources" }
            p #resources {
                span #disk-full-count { (disk_full) } " devices with a filesystem at or above "
                (fleet_wire::usage::DISK_ALERT_PERCENT) " % used, "
                span #memory-pressure-count { (memory_pressure) } " under memory pressure"
                " (each is an alert above; the device page shows its disk, memory and load)."
            }
            h2 { "Rollouts not complete" }
            @if rollouts.is_empty() {
                p.muted { "None: every agent release and deployment with a rollout is complete." }
            } @else {
                (table(&["kind", "name", "phase", "progress"], rollout_rows))
            }
            p { a href="/releases" { "Agent releases" } " · " a href="/deployments" { "Deployments" } }
            h2 { "Running task runs" }
            @if running.is_empty() {
                p.muted { "None." }
            } @else {
                (table(&["run", "progress"], run_rows))
            }
            h2 { "Devices by agent-upgrade phase" }
            (table(
                &["phase", "devices"],
                phases.into_iter().map(|(p, n)| {
                    let bad = matches!(p.as_str(), "rollback-failed" | "failed");
                    vec![html! { span.bad[bad] { (p) } }, text(n.to_string())]
                }),
            ))
            p { a href="/devices" { "All " (devices.len()) " devices" } }
            h2 { "Groups" }
            (groups_table)
            h2 { "Task runs by phase" }
            (table(&["phase", "runs"], count_rows(by_phase)))
            p { a href="/runs" { "Task run history" } }
            p.muted {
                "Rendered at " (now) "; heartbeat ages come from the operator's mirror of the device-heartbeat "
                "bucket, workloads from the Device objects' status."
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dashboard::bars::legend;
    use serde_json::json;

    fn device(name: &str, status: serde_json::Value) -> Arc<Device> {
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "Device",
                "metadata": {"name": name}, "spec": {}, "status": status
            }))
            .unwrap(),
        )
    }

    fn release(name: &str, phase: &str, counts: [u32; 5]) -> Arc<AgentRelease> {
        let [healthy, soaking, updating, failed, pending] = counts;
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "AgentRelease",
                "metadata": {"name": name},
                "spec": {"allowedGroups": ["g"], "builds": []},
                "status": {"rollout": {"phase": phase, "updated": healthy + soaking, "healthy": healthy,
                    "soaking": soaking, "updating": updating, "stalled": 0, "failed": failed, "pending": pending}}
            }))
            .unwrap(),
        )
    }

    fn deployment(name: &str, status: serde_json::Value) -> Arc<FleetDeployment> {
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "FleetDeployment",
                "metadata": {"name": name},
                "spec": {"allowedGroups": ["g"], "workloads": []}, "status": status
            }))
            .unwrap(),
        )
    }

    fn run(name: &str, status: serde_json::Value) -> Arc<TaskRun> {
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "TaskRun",
                "metadata": {"name": name, "namespace": "ops"},
                "spec": {"allowedGroups": ["g"], "deadlineSeconds": 600, "systemUpgradeV1": {}},
                "status": status
            }))
            .unwrap(),
        )
    }

    fn pairs(v: &[(&str, u64)]) -> Vec<(String, u64)> {
        v.iter().map(|(k, n)| (k.to_string(), *n)).collect()
    }

    /// An alert's box reads as one sentence: "Since <time> (<age> ago): <detail>", or the detail alone without a
    /// time (it read "Since …. has not accepted …").
    #[test]
    fn an_alert_reads_as_one_sentence() {
        let now = Timestamp::from_unix_ms(2_000_000_000_000);
        let since = Timestamp::from_unix_ms(2_000_000_000_000 - 180_000);
        let alert = |since| Alert {
            kind: crate::dashboard::alerts::AlertKind::DeviceStalled,
            subject: Subject::Device("dev-1".into()),
            since,
            detail: "has not accepted the system-upgrade intent of TaskRun ops/upgrade".into(),
        };
        let html = alert_list(&[alert(Some(since))], now).into_string();
        assert!(
            html.contains("ago)</span>: has not accepted the system-upgrade intent"),
            "{html}"
        );
        assert!(!html.contains(". has not"), "{html}");
        let html = alert_list(&[alert(None)], now).into_string();
        assert!(
            html.contains("<p>has not accepted") && !html.contains("Since"),
            "{html}"
        );
    }

    /// Every bar on the overview shows exactly the counts of the hand-built fleet (distinct numbers, so a part
    /// showing another's count is caught), the same [`fleet_counts`] computes for `/metrics`.
    #[test]
    fn bars_show_the_fleets_counts() {
        let now = Timestamp::from_unix_ms(2_000_000_000_000);
        let w = |r: u32, f: u32, p: u32| json!({"running": r, "failed": f, "pending": p});
        let looping = json!({"running": 0, "failed": 6, "pending": 0, "crashLooping": 4});
        let devices = vec![
            device(
                "a",
                json!({"agentVersion": "2.0.0", "workloads": w(3, 1, 0)}),
            ),
            device(
                "b",
                json!({"agentVersion": "2.0.0", "workloads": w(2, 0, 4)}),
            ),
            device("c", json!({"agentVersion": "2.0.0"})),
            device(
                "d",
                json!({"agentVersion": "1.0.0", "workloads": w(5, 2, 1)}),
            ),
            device("e", json!({"agentVersion": "1.0.0", "workloads": looping})),
            device("f", json!(null)),
        ];
        let beats: BTreeMap<&str, u64> =
            BTreeMap::from([("a", 5), ("b", 10), ("c", 120), ("d", 7200), ("e", 90_000)]);
        let last = |d: &Device| {
            let secs = beats.get(d.metadata.name.as_deref()?)?;
            Some(Timestamp::from_unix_ms(now.unix_ms() - secs * 1000))
        };
        let releases = vec![
            release("agent-2", "Halted", [1, 2, 3, 4, 5]),
            release("agent-1", "Complete", [9, 0, 0, 0, 0]),
        ];
        let deployments = vec![
            deployment(
                "web",
                json!({"rollout": {"phase": "Soaking", "updated": 6, "healthy": 2, "soaking": 4,
                    "updating": 0, "stalled": 0, "failed": 0, "pending": 7}}),
            ),
            deployment("plain", json!({"workloads": w(1, 0, 0)})),
        ];
        let runs = vec![
            run(
                "nightly",
                json!({"phase": "Running", "targets": 10, "succeeded": 6, "failed": 1}),
            ),
            run(
                "old",
                json!({"phase": "Failed", "targets": 3, "succeeded": 0, "failed": 3}),
            ),
        ];
        let o = Objects {
            devices: &devices,
            groups: &[],
            runs: &runs,
            releases: &releases,
            deployments: &deployments,
            version_history: &[],
        };
        let html = render(&o, &[], &last, now);
        let bar = |id: &str| legend(&html, id).unwrap_or_else(|| panic!("no bar {id}: {html}"));

        let versions = bar("agent-versions");
        assert_eq!(
            versions,
            pairs(&[("2.0.0", 3), ("1.0.0", 2), ("unknown", 1)])
        );
        let from_caches = counts::versions(&devices);
        assert_eq!(versions, counts::top(&from_caches, VERSION_PARTS));
        for (v, n) in &from_caches {
            // The table below the bar lists the same numbers.
            assert!(
                html.contains(&format!("<td>{v}</td><td>{n}</td>")),
                "{v} {n}: {html}"
            );
        }
        assert_eq!(
            bar("heartbeat-ages"),
            pairs(&[
                ("under 1 minute", 2),
                ("1–5 minutes", 1),
                ("5–60 minutes", 0),
                ("1–24 hours", 1),
                ("over 24 hours", 1),
                ("never", 1),
            ])
        );
        assert_eq!(
            bar("heartbeat-ages").iter().map(|(_, n)| n).sum::<u64>(),
            devices.len() as u64
        );
        assert_eq!(
            bar("workloads"),
            pairs(&[
                ("workloads running", 10),
                ("workloads failed", 5),
                ("workloads crash-looping", 4),
                ("workloads pending", 5),
            ])
        );
        assert!(html.contains("Summed over the 4 devices"), "{html}");

        // Rollouts not complete: the halted release and the soaking deployment, each linked, with its counts.
        assert_eq!(
            bar("AgentRelease/agent-2"),
            pairs(&[
                ("healthy", 1),
                ("soaking", 2),
                ("updating", 3),
                ("failed", 4),
                ("pending", 5)
            ])
        );
        assert_eq!(
            bar("FleetDeployment/web"),
            pairs(&[
                ("healthy", 2),
                ("soaking", 4),
                ("updating", 0),
                ("failed", 0),
                ("pending", 7)
            ])
        );
        assert!(html.contains("href=\"/releases/agent-2\""), "{html}");
        assert!(html.contains("href=\"/deployments/web\""), "{html}");
        for gone in ["agent-1", "plain"] {
            assert!(
                !html.contains(gone),
                "{gone} is not an open rollout: {html}"
            );
        }
        // Running task runs: only the running one, its bar the status's counts.
        assert_eq!(
            bar("TaskRun/ops/nightly"),
            pairs(&[("succeeded", 6), ("failed", 1), ("not finished", 3)])
        );
        assert!(html.contains("href=\"/runs/ops/nightly\""), "{html}");
        assert!(legend(&html, "TaskRun/ops/old").is_none(), "{html}");
    }

    #[test]
    fn many_versions_become_eight_parts_and_other() {
        let devices: Vec<Arc<Device>> = (0..12u64)
            .flat_map(|v| {
                // Version 1.<v>.0 on v + 1 devices: the largest come first.
                (0..=v).map(move |i| {
                    device(
                        &format!("d{v}-{i}"),
                        json!({"agentVersion": format!("1.{v}.0")}),
                    )
                })
            })
            .collect();
        let o = Objects {
            devices: &devices,
            groups: &[],
            runs: &[],
            releases: &[],
            deployments: &[],
            version_history: &[],
        };
        let html = render(&o, &[], &|_| None, Timestamp::now());
        let parts = legend(&html, "agent-versions").unwrap();
        assert_eq!(parts.len(), VERSION_PARTS + 1, "{parts:?}");
        assert_eq!(parts[0], ("1.11.0".to_owned(), 12));
        assert_eq!(parts[VERSION_PARTS], (OTHER.to_owned(), 1 + 2 + 3 + 4));
        assert_eq!(
            parts.iter().map(|(_, n)| n).sum::<u64>(),
            devices.len() as u64
        );
        assert!(html.contains("None: every agent release"), "{html}");
    }
}
