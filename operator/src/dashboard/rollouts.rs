//! Rollout pages: every AgentRelease (`/releases`) and FleetDeployment (`/deployments`) with its rollout phase, a
//! small progress bar and its counts; and one object's page with the bar, the canary and soak state, the devices
//! its status names as failing (each linked to its device page), its conditions and their history. Both kinds are cluster-scoped,
//! so an object's page is keyed by its name alone. Everything shown is the object's spec and status from the
//! operator's cache: every number is one the status carries, none is computed from the fleet.

use super::bars::{bar, Part};
use super::html::{age, name, page, pairs, parse_time, table, text, url_part, when};
use super::named_devices::{named, Named};
use super::runs::device_link;
use crate::conditions::{is_bad, was_bad, HALTED};
use crate::crd::{
    AgentRelease, ConditionChange, FleetDeployment, Placement, PlacementStatus, RolloutPhase,
    RolloutSpec, RolloutStatus, WorkloadHealth,
};
use fleet_wire::{DeviceId, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use maud::{html, Markup};
use std::sync::Arc;

/// A device's current agent-upgrade phase and reason, from its Device (the release page's last column).
pub type UpgradeOf<'a> = &'a dyn Fn(&DeviceId) -> Option<String>;

/// The two kinds these pages show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// AgentRelease, under `/releases`.
    Release,
    /// FleetDeployment, under `/deployments`.
    Deployment,
}

impl Kind {
    fn path(self) -> &'static str {
        match self {
            Kind::Release => "/releases",
            Kind::Deployment => "/deployments",
        }
    }

    fn title(self) -> &'static str {
        match self {
            Kind::Release => "Agent release",
            Kind::Deployment => "Deployment",
        }
    }
}

/// What the pages read of either kind.
struct View<'a> {
    kind: Kind,
    meta: &'a ObjectMeta,
    placement: &'a Placement,
    rollout: Option<&'a RolloutSpec>,
    status: Option<&'a PlacementStatus>,
}

impl<'a> View<'a> {
    fn release(r: &'a AgentRelease) -> Self {
        View {
            kind: Kind::Release,
            meta: &r.metadata,
            placement: &r.spec.placement,
            rollout: r.spec.rollout.as_ref(),
            status: r.status.as_ref(),
        }
    }

    fn deployment(d: &'a FleetDeployment) -> Self {
        View {
            kind: Kind::Deployment,
            meta: &d.metadata,
            placement: &d.spec.placement,
            rollout: d.spec.rollout.as_ref(),
            status: d.status.as_ref(),
        }
    }

    fn name(&self) -> &str {
        self.meta.name.as_deref().unwrap_or("")
    }

    fn rollout_status(&self) -> Option<&'a RolloutStatus> {
        self.status.and_then(|s| s.rollout.as_ref())
    }

    fn conditions(&self) -> &'a [Condition] {
        self.status.map(|s| s.conditions.as_slice()).unwrap_or(&[])
    }

    fn link(&self) -> Markup {
        let n = self.name();
        html! { a href={ (self.kind.path()) "/" (url_part(n)) } { (n) } }
    }
}

fn time(t: Option<&Time>) -> Option<Timestamp> {
    t.map(|t| Timestamp::from_unix_ms(t.0.as_millisecond().max(0) as u64))
}

fn int_or_string(v: &IntOrString) -> String {
    match v {
        IntOrString::Int(i) => i.to_string(),
        IntOrString::String(s) => s.clone(),
    }
}

/// The rollout's bar: healthy, soaking, updating, failed and pending devices, each part exactly the status's
/// count (`updated` is healthy plus soaking, and `stalled` is within updating, so neither is a part of its own).
pub fn rollout_bar(st: &RolloutStatus) -> Markup {
    bar(
        "devices in the rollout",
        &[
            Part::new("healthy", st.healthy.into(), "#070"),
            Part::new("soaking", st.soaking.into(), "#7b7"),
            Part::new("updating", st.updating.into(), "#48c"),
            Part::new("failed", st.failed.into(), "#b00"),
            Part::new("pending", st.pending.into(), "#bbb"),
        ],
    )
}

/// A deployment's workloads bar: running, failed and pending workloads, exactly `status.workloads`.
pub fn workloads_bar(w: &WorkloadHealth) -> Markup {
    bar(
        "workloads on their devices",
        &[
            Part::new("workloads running", w.running.into(), "#070"),
            Part::new("workloads failed", w.failed.into(), "#b00"),
            Part::new("workloads pending", w.pending.into(), "#bbb"),
        ],
    )
}

fn rollout_counts(st: &RolloutStatus) -> String {
    format!(
        "{} updated ({} healthy, {} soaking), {} updating ({} stalled), {} pending, {} failed",
        st.updated, st.healthy, st.soaking, st.updating, st.stalled, st.pending, st.failed
    )
}

fn workload_counts(w: &WorkloadHealth) -> String {
    format!(
        "{} running, {} failed, {} pending",
        w.running, w.failed, w.pending
    )
}

fn opt_count(n: Option<u32>) -> String {
    n.map(|n| n.to_string()).unwrap_or_else(|| "—".into())
}

/// The conditions that report a problem ([`is_bad`]) as `Type: Reason`, the message as the tooltip.
fn problems(conditions: &[Condition]) -> Markup {
    let bad: Vec<&Condition> = conditions.iter().filter(|c| is_bad(c)).collect();
    html! {
        @if bad.is_empty() { span.muted { "—" } }
        @for (i, c) in bad.iter().enumerate() {
            @if i > 0 { br; }
            span.bad title=(c.message) data-condition=(c.type_) { (c.type_) ": " (c.reason) }
        }
    }
}

fn phase_cell(v: &View) -> Markup {
    match (v.status, v.rollout_status()) {
        (None, _) => html! { span.muted { "no status yet" } },
        (Some(_), None) => html! { span.muted { "no rollout" } },
        (Some(_), Some(r)) => {
            let bad = matches!(
                r.phase,
                crate::crd::RolloutPhase::Halted | crate::crd::RolloutPhase::Failed
            );
            html! { span.bad[bad] { (name(&r.phase)) } }
        }
    }
}

fn small(bar: Markup) -> Markup {
    html! { div.minibar { (bar) } }
}

/// `/releases`: every AgentRelease, by name.
pub fn releases(list: &[Arc<AgentRelease>]) -> String {
    let mut rs: Vec<View> = list.iter().map(|r| View::release(r)).collect();
    rs.sort_by(|a, b| a.name().cmp(b.name()));
    let rows = rs.iter().map(|v| {
        let s = v.status;
        vec![
            v.link(),
            phase_cell(v),
            v.rollout_status()
                .map(|r| small(rollout_bar(r)))
                .unwrap_or_else(|| text("—")),
            text(v.rollout_status().map(rollout_counts).unwrap_or_default()),
            text(opt_count(s.and_then(|s| s.targeted_devices))),
            text(opt_count(s.and_then(|s| s.up_to_date))),
            problems(v.conditions()),
        ]
    });
    page(
        "Agent releases",
        html! {
            p { (rs.len()) " AgentReleases (cluster-scoped)." }
            (table(
                &["release", "phase", "progress", "devices in the rollout", "targeted", "up to date", "problems"],
                rows,
            ))
        },
    )
}

/// `/deployments`: every FleetDeployment, by name.
pub fn deployments(list: &[Arc<FleetDeployment>]) -> String {
    let mut ds: Vec<View> = list.iter().map(|d| View::deployment(d)).collect();
    ds.sort_by(|a, b| a.name().cmp(b.name()));
    let rows = ds.iter().map(|v| {
        let s = v.status;
        let w = s.and_then(|s| s.workloads.as_ref());
        // Without a rollout section the workloads are the deployment's progress.
        let progress = match (v.rollout_status(), w) {
            (Some(r), _) => small(rollout_bar(r)),
            (None, Some(w)) => small(workloads_bar(w)),
            (None, None) => text("—"),
        };
        vec![
            v.link(),
            phase_cell(v),
            progress,
            text(v.rollout_status().map(rollout_counts).unwrap_or_default()),
            text(w.map(workload_counts).unwrap_or_default()),
            text(opt_count(s.and_then(|s| s.targeted_devices))),
            problems(v.conditions()),
        ]
    });
    page(
        "Deployments",
        html! {
            p { (ds.len()) " FleetDeployments (cluster-scoped)." }
            (table(
                &["deployment", "phase", "progress", "devices in the rollout", "workloads", "targeted", "problems"],
                rows,
            ))
        },
    )
}

/// What the status says about the canaries: it counts them nowhere, but a failed canary always halts the rollout
/// with reason `CanaryFailed`, and `Halted=False` means nothing halts it.
fn canaries(conditions: &[Condition]) -> &'static str {
    match conditions.iter().find(|c| c.type_ == HALTED) {
        Some(c) if c.status == "True" && c.reason == "CanaryFailed" => {
            "a canary failed: the rollout is halted"
        }
        Some(c) if c.status == "False" => "no canary failed",
        _ => "— (the status names canaries only when one fails)",
    }
}

fn rollout_spec(r: Option<&RolloutSpec>) -> String {
    let Some(r) = r else {
        return "none: every targeted device at once, never halted".into();
    };
    let or_default = |v: Option<String>, d: &str| v.unwrap_or_else(|| format!("{d} (default)"));
    format!(
        "soakSeconds {}, maxUnavailable {}, maxFailures {}, heartbeatTimeoutSeconds {}",
        or_default(r.soak_seconds.map(|s| s.to_string()), "0"),
        or_default(r.max_unavailable.as_ref().map(int_or_string), "100%"),
        or_default(r.max_failures.as_ref().map(int_or_string), "0"),
        or_default(r.heartbeat_timeout_seconds.map(|s| s.to_string()), "90"),
    )
}

fn failing_table(named: &[Named], upgrade_of: Option<UpgradeOf>) -> Markup {
    if named.is_empty() {
        return html! { p.muted { "The status names no failing or stalled device." } };
    }
    let mut head = vec!["device", "named by", "what the status says"];
    if upgrade_of.is_some() {
        head.push("its agent upgrade now");
    }
    let rows = named.iter().map(|n| {
        let mut row = vec![
            html! { span data-failing-device=(n.device.as_str()) { (device_link(n.device.as_str())) } },
            text(&n.condition),
            text(&n.why),
        ];
        if let Some(f) = upgrade_of {
            row.push(text(f(&n.device).unwrap_or_else(|| "—".into())));
        }
        row
    });
    table(&head, rows)
}

fn conditions_table(conditions: &[Condition], now: Timestamp) -> Markup {
    if conditions.is_empty() {
        return html! { p.muted { "No conditions yet." } };
    }
    table(
        &["type", "status", "reason", "message", "since"],
        conditions.iter().map(|c| {
            vec![
                html! { span.bad[is_bad(c)] data-condition=(c.type_) { (c.type_) } },
                text(&c.status),
                text(&c.reason),
                text(&c.message),
                when(time(Some(&c.last_transition_time)), now),
            ]
        }),
    )
}

/// The soak: how many devices soak, and when the first soak ends (`soakEndsAt`, by that device's clock).
fn soak(r: &RolloutStatus, seconds: u32, now: Timestamp) -> Markup {
    let end = r.soak_ends_at.as_deref().and_then(parse_time);
    html! {
        (r.soaking) " devices in their soak of " (seconds) " s"
        @if let Some(end) = end {
            "; the first ends " span #soak-ends data-at=(end) {
                @if end > now { "in " (age(end.since(now))) } @else { "now" }
            }
            " (" (end) ", by the device's clock; it counts as healthy at its first heartbeat after that)"
        }
    }
}

/// The devices the status names as next, linked, and how many more wait.
fn next(r: &RolloutStatus) -> Markup {
    if r.next.is_empty() {
        return text(if r.phase == RolloutPhase::Halted {
            "nobody: the rollout is halted"
        } else {
            "—"
        });
    }
    let more = (r.pending as usize).saturating_sub(r.next.len());
    html! {
        @for (i, d) in r.next.iter().enumerate() {
            @if i > 0 { ", " }
            span data-next=(d) { (device_link(d)) }
        }
        @if more > 0 { " and " (more) " more" }
    }
}

/// The condition history, newest first; rows that reported a problem are marked.
fn history_table(history: &[ConditionChange], now: Timestamp) -> Markup {
    if history.is_empty() {
        return html! { p.muted { "No condition changes recorded yet." } };
    }
    table(
        &["when", "type", "status", "reason", "message"],
        history.iter().rev().map(|c| {
            vec![
                when(time(Some(&c.time)), now),
                html! { span.bad[was_bad(c)] data-history=(c.type_) { (c.type_) } },
                text(&c.status),
                text(&c.reason),
                text(&c.message),
            ]
        }),
    )
}

/// The facts and sections both kinds' pages share, with `extra` rows of the kind's own.
fn render(
    v: &View,
    extra: Vec<(&'static str, Markup)>,
    upgrade_of: Option<UpgradeOf>,
    now: Timestamp,
) -> String {
    let title = format!("{} {}", v.kind.title(), v.name());
    let Some(s) = v.status else {
        return page(
            &title,
            html! {
                p.muted #no-status { "No status yet: the operator has not written one." }
                (pairs([
                    ("groups", text(v.placement.allowed_groups.join(", "))),
                    ("rollout", text(rollout_spec(v.rollout))),
                ]))
            },
        );
    };
    let r = s.rollout.as_ref();
    let phase = r
        .map(|r| name(&r.phase))
        .unwrap_or_else(|| "— (no rollout status)".into());
    let mut rows = vec![
        ("phase", html! { b #rollout-phase { (phase) } }),
        ("progress", r.map(rollout_bar).unwrap_or_else(|| text("—"))),
        (
            "devices in the rollout",
            text(r.map(rollout_counts).unwrap_or_else(|| "—".into())),
        ),
        ("canaries", text(canaries(&s.conditions))),
        (
            "soak",
            match r {
                Some(r) => soak(r, v.rollout.and_then(|x| x.soak_seconds).unwrap_or(0), now),
                None => text("—"),
            },
        ),
        ("next", r.map(next).unwrap_or_else(|| text("—"))),
        ("rollout spec", text(rollout_spec(v.rollout))),
        ("targeted devices", text(opt_count(s.targeted_devices))),
    ];
    rows.extend(extra);
    rows.extend([
        ("groups", text(v.placement.allowed_groups.join(", "))),
        (
            "generation",
            text(format!(
                "status of generation {}, object at {}",
                opt_count(s.observed_generation.and_then(|g| u32::try_from(g).ok())),
                opt_count(v.meta.generation.and_then(|g| u32::try_from(g).ok())),
            )),
        ),
        (
            "created",
            when(time(v.meta.creation_timestamp.as_ref()), now),
        ),
    ]);
    page(
        &title,
        html! {
            (pairs(rows))
            h2 { "Failing devices" }
            (failing_table(&named(&s.conditions), upgrade_of))
            h2 { "Conditions" }
            (conditions_table(&s.conditions, now))
            h2 { "Condition history" }
            (history_table(&s.condition_history, now))
        },
    )
}

/// An AgentRelease's page; `upgrade_of`: a device's current agent-upgrade phase and reason (from its Device).
pub fn release(r: &AgentRelease, upgrade_of: UpgradeOf, now: Timestamp) -> String {
    let v = View::release(r);
    let s = v.status.cloned().unwrap_or_default();
    let builds = html! {
        @for (i, b) in r.spec.builds.iter().enumerate() {
            @if i > 0 { br; }
            (b.architecture) " " (b.version)
        }
    };
    let extra = vec![
        ("builds", builds),
        (
            "devices",
            text(format!(
                "{} up to date, {} in progress, {} failed, {} superseded by a newer release",
                opt_count(s.up_to_date),
                opt_count(s.in_progress),
                opt_count(s.failed),
                s.superseded.unwrap_or(0)
            )),
        ),
    ];
    render(&v, extra, Some(upgrade_of), now)
}

/// A FleetDeployment's page.
pub fn deployment(d: &FleetDeployment, now: Timestamp) -> String {
    let v = View::deployment(d);
    let w = v.status.and_then(|s| s.workloads.as_ref());
    let latest = w.and_then(|w| w.latest_error.as_deref());
    let extra = vec![
        (
            "workloads",
            match w {
                Some(w) => html! { (workloads_bar(w)) },
                None => text("—"),
            },
        ),
        (
            "latest workload error",
            match latest {
                Some(e) => html! { span.bad { (e) } },
                None => text("—"),
            },
        ),
        (
            "retry",
            text(
                v.rollout_status()
                    .and_then(|r| r.retry.clone())
                    .unwrap_or_else(|| "—".into()),
            ),
        ),
    ];
    render(&v, extra, None, now)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn release_with(status: serde_json::Value) -> AgentRelease {
        serde_json::from_value(json!({
            "apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "AgentRelease",
            "metadata": {"name": "agent-2", "generation": 3},
            "spec": {"allowedGroups": ["pilot"], "rollout": {"soakSeconds": 600, "maxUnavailable": "25%"},
                "builds": [{"architecture": "arm64", "version": "2.0.0", "artifact": "https://a.example/x",
                    "sha256": "00", "byteLimit": 1000}]},
            "status": status
        }))
        .unwrap()
    }

    fn deployment_with(status: serde_json::Value) -> FleetDeployment {
        serde_json::from_value(json!({
            "apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "FleetDeployment",
            "metadata": {"name": "web"},
            "spec": {"allowedGroups": ["site-a"], "workloads": [], "rollout": {}},
            "status": status
        }))
        .unwrap()
    }

    fn has_count(html: &str, part: &str, n: u32) -> bool {
        html.contains(&format!("data-part=\"{part}\" data-count=\"{n}\""))
    }

    /// Distinct counts, so a part showing another field's number is caught.
    fn rollout_json() -> serde_json::Value {
        json!({"phase": "Halted", "updated": 7, "healthy": 4, "soaking": 3, "updating": 2, "stalled": 1,
               "pending": 11, "failed": 5})
    }

    #[test]
    fn release_page_bar_is_the_status_counts_and_names_failing_devices() {
        let r = release_with(json!({
            "observedGeneration": 3, "targetedDevices": 25, "upToDate": 4, "failed": 5, "inProgress": 2,
            "rollout": rollout_json(),
            "conditions": [
                {"type": "Halted", "status": "True", "reason": "CanaryFailed", "lastTransitionTime": "2026-12-01T10:00:00Z",
                 "message": "a canary failed: pi-1 (agent restarted during its soak); no further device gets the change"},
                {"type": "Degraded", "status": "True", "reason": "DevicesFailed", "lastTransitionTime": "2026-12-01T10:00:00Z",
                 "message": "1 of 25 devices failed the agent upgrade: pi-7 failed: start-failed; see each Device's status.agentUpgrade"}
            ]
        }));
        let st = r.status.clone().unwrap().rollout.unwrap();
        let upgrade =
            |d: &DeviceId| (d.as_str() == "pi-7").then(|| "failed: start-failed".to_owned());
        let html = release(&r, &upgrade, Timestamp::now());
        for (part, n) in [
            ("healthy", st.healthy),
            ("soaking", st.soaking),
            ("updating", st.updating),
            ("failed", st.failed),
            ("pending", st.pending),
        ] {
            assert!(has_count(&html, part, n), "{part} {n} in {html}");
        }
        assert!(
            html.contains("<b id=\"rollout-phase\">Halted</b>"),
            "{html}"
        );
        assert!(
            html.contains("a canary failed: the rollout is halted"),
            "{html}"
        );
        assert!(html.contains("3 devices in their soak of 600 s"), "{html}");
        for d in ["pi-1", "pi-7"] {
            assert!(
                html.contains(&format!("<a href=\"/devices/{d}\">{d}</a>")),
                "{d}: {html}"
            );
        }
        assert!(html.contains("agent restarted during its soak"), "{html}");
        assert!(
            html.contains("2026-12-01T10:00:00"),
            "transition time: {html}"
        );
        // The list shows the same counts in its small bar, and the problem conditions.
        let list = releases(&[Arc::new(r)]);
        assert!(has_count(&list, "failed", st.failed) && has_count(&list, "pending", st.pending));
        assert!(list.contains("Halted: CanaryFailed") && list.contains("Degraded: DevicesFailed"));
        assert!(list.contains("href=\"/releases/agent-2\""), "{list}");
    }

    #[test]
    fn the_page_says_when_the_soak_ends_and_who_is_next() {
        let now = Timestamp::now();
        let end = now.plus(std::time::Duration::from_secs(8 * 60 + 30));
        let d = deployment_with(json!({
            "rollout": {"phase": "Soaking", "updated": 1, "healthy": 0, "soaking": 1, "updating": 0,
                "pending": 7, "failed": 0, "soakEndsAt": end.to_string(), "next": ["pi-2", "pi-3"]},
            "conditions": []
        }));
        let html = deployment(&d, now);
        assert!(
            html.contains(&format!(
                r#"<span id="soak-ends" data-at="{end}">in 8m</span>"#
            )),
            "{html}"
        );
        for dev in ["pi-2", "pi-3"] {
            assert!(
                html.contains(&format!(
                    r#"<span data-next="{dev}"><a href="/devices/{dev}">{dev}</a></span>"#
                )),
                "{dev}: {html}"
            );
        }
        assert!(html.contains("and 5 more"), "7 pending, 2 named: {html}");
        let halted = deployment_with(
            json!({"rollout": {"phase": "Halted", "updated": 0, "healthy": 0,
            "soaking": 0, "updating": 0, "pending": 3, "failed": 1}, "conditions": []}),
        );
        let html = deployment(&halted, now);
        assert!(html.contains("nobody: the rollout is halted"), "{html}");
        assert!(!html.contains("soak-ends"), "{html}");
    }

    #[test]
    fn the_condition_history_is_shown_newest_first_with_problems_marked() {
        let r = release_with(json!({
            "conditions": [],
            "conditionHistory": [
                {"time": "2026-12-01T09:00:00Z", "type": "Progressing", "status": "True", "reason": "Progressing",
                 "message": "giving 2 canaries the change"},
                {"time": "2026-12-01T10:00:00Z", "type": "Halted", "status": "True", "reason": "CanaryFailed",
                 "message": "a canary failed: pi-1"}
            ]
        }));
        let html = release(&r, &|_| None, Timestamp::now());
        let halted = html
            .find("a canary failed: pi-1")
            .expect("the halt is listed");
        let progressing = html.find("giving 2 canaries").expect("the start is listed");
        assert!(halted < progressing, "newest first: {html}");
        assert!(
            html.contains(r#"<span class="bad" data-history="Halted">"#),
            "a halt is a problem: {html}"
        );
        assert!(
            html.contains(r#"data-history="Progressing">"#)
                && !html.contains(r#"class="bad" data-history="Progressing""#),
            "progress is none: {html}"
        );
        assert!(html.contains("2026-12-01T10:00:00"), "{html}");
        let none = release(
            &release_with(json!({"conditions": []})),
            &|_| None,
            Timestamp::now(),
        );
        assert!(none.contains("No condition changes recorded yet"), "{none}");
    }

    #[test]
    fn deployment_page_bars_are_the_status_counts() {
        let d = deployment_with(json!({
            "targetedDevices": 25, "rollout": rollout_json(),
            "workloads": {"running": 13, "failed": 6, "pending": 9,
                          "latestError": "pi-3: web: image x could not be pulled"},
            "conditions": [
                {"type": "Degraded", "status": "True", "reason": "WorkloadsFailed", "lastTransitionTime": "2026-12-01T10:00:00Z",
                 "message": "6 of 28 workloads failed on their devices; first: pi-3: web: image x could not be pulled"}
            ]
        }));
        let html = deployment(&d, Timestamp::now());
        for (part, n) in [
            ("healthy", 4),
            ("soaking", 3),
            ("updating", 2),
            ("failed", 5),
            ("pending", 11),
            ("workloads running", 13),
            ("workloads failed", 6),
            ("workloads pending", 9),
        ] {
            assert!(has_count(&html, part, n), "{part} {n} in {html}");
        }
        assert!(
            html.contains("<a href=\"/devices/pi-3\">pi-3</a>"),
            "{html}"
        );
        let list = deployments(&[Arc::new(d)]);
        assert!(has_count(&list, "soaking", 3), "{list}");
        assert!(list.contains("href=\"/deployments/web\""), "{list}");
    }

    #[test]
    fn without_a_rollout_section_a_deployment_shows_its_workloads() {
        let d = deployment_with(json!({"workloads": {"running": 2, "failed": 1, "pending": 0}}));
        let list = deployments(&[Arc::new(d.clone())]);
        assert!(has_count(&list, "workloads failed", 1), "{list}");
        assert!(list.contains("no rollout"), "{list}");
        let html = deployment(&d, Timestamp::now());
        assert!(
            !html.contains("data-part=\"healthy\""),
            "no invented rollout bar: {html}"
        );
    }

    #[test]
    fn a_missing_status_renders() {
        let r = release_with(serde_json::Value::Null);
        assert!(r.status.is_none());
        let html = release(&r, &|_| None, Timestamp::now());
        assert!(html.contains("id=\"no-status\""), "{html}");
        assert!(
            !html.contains("data-count"),
            "no bar without counts: {html}"
        );
        assert!(releases(&[Arc::new(r)]).contains("no status yet"));
        let d = deployment_with(serde_json::Value::Null);
        assert!(deployment(&d, Timestamp::now()).contains("id=\"no-status\""));
        assert!(deployments(&[Arc::new(d)]).contains("no status yet"));
        // An empty status (no rollout, no conditions) renders too.
        let empty = release_with(json!({}));
        let html = release(&empty, &|_| None, Timestamp::now());
        assert!(
            html.contains("no rollout status") && html.contains("No conditions yet"),
            "{html}"
        );
    }
}
