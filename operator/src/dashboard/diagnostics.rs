//! The device page's diagnostics: the device's newest DeviceDiagnostics requests (name, phase, age, message) and
//! the sections of its newest answered one, each in a collapsible block. Every text came from the device (redacted
//! there): maud escapes it.

use super::html::{parse_time, table, text, when};
use crate::crd::diagnostics::{DeviceDiagnostics, DiagnosticsPhase};
use fleet_wire::Timestamp;
use maud::{html, Markup};
use std::sync::Arc;

/// Most requests listed.
pub const SHOWN: usize = 5;

/// The device's requests for the page, newest first: the [`SHOWN`] newest, plus its newest Complete one when that
/// is older (its bundle is shown).
pub fn select(all: &[Arc<DeviceDiagnostics>], device: &str) -> Vec<Arc<DeviceDiagnostics>> {
    let mut mine: Vec<&Arc<DeviceDiagnostics>> =
        all.iter().filter(|o| o.spec.device == device).collect();
    mine.sort_by_key(|o| std::cmp::Reverse(crate::crd::tasks::created_at(o.as_ref())));
    let complete = mine
        .iter()
        .position(|o| phase(o) == Some(DiagnosticsPhase::Complete));
    let mut out: Vec<Arc<DeviceDiagnostics>> =
        mine.iter().take(SHOWN).map(|o| (*o).clone()).collect();
    if let Some(i) = complete.filter(|i| *i >= SHOWN) {
        out.push(mine[i].clone());
    }
    out
}

fn phase(o: &DeviceDiagnostics) -> Option<DiagnosticsPhase> {
    o.status.as_ref().and_then(|s| s.phase)
}

/// The section for `list` (from [`select`]).
pub fn section(list: &[Arc<DeviceDiagnostics>], now: Timestamp) -> Markup {
    let newest_complete = list
        .iter()
        .find(|o| phase(o) == Some(DiagnosticsPhase::Complete));
    html! {
        section #diagnostics {
            h2 { "Diagnostics" }
            @if list.is_empty() {
                p.muted { "No diagnostics requested for this device (docs/diagnostics.md: a DeviceDiagnostics object)." }
            } @else {
                (table(
                    &["request", "phase", "age", "message"],
                    list.iter().take(SHOWN).map(|o| {
                        let s = o.status.clone().unwrap_or_default();
                        vec![
                            text(o.metadata.name.as_deref().unwrap_or_default()),
                            text(s.phase.map(|p| format!("{p:?}")).unwrap_or_else(|| "—".into())),
                            when(Some(crate::crd::tasks::created_at(o.as_ref())), now),
                            text(s.message.unwrap_or_default()),
                        ]
                    }),
                ))
            }
            @if let Some(o) = newest_complete {
                @if let Some(b) = o.status.as_ref().and_then(|s| s.bundle.as_ref()) {
                    h3 {
                        "Bundle of " (o.metadata.name.as_deref().unwrap_or_default())
                        ", collected " (when(parse_time(&b.collected_at), now))
                        @if b.redacted > 0 { ", " (b.redacted) @if b.redacted == 1 { " string redacted" } @else { " strings redacted" } }
                        @if b.cut { ", cut to fit" }
                    }
                    @for s in &b.sections {
                        details data-section=(s.item) {
                            summary {
                                (s.item)
                                @if let Some(w) = &s.workload { " " (w) }
                                @if s.cut { " (older lines cut)" }
                                @if let Some(e) = &s.error { " — " span.bad { (e) } }
                            }
                            pre { (s.text) }
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(
        name: &str,
        device: &str,
        created_s: u64,
        status: serde_json::Value,
    ) -> Arc<DeviceDiagnostics> {
        let created = Timestamp::from_unix_ms(created_s * 1000).to_string();
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "DeviceDiagnostics",
                "metadata": {"name": name, "creationTimestamp": created},
                "spec": {"device": device}, "status": status
            }))
            .expect("object"),
        )
    }

    /// Newest first, at most five, the newest answered one's sections escaped in collapsible blocks; another
    /// device's requests are not shown.
    #[test]
    fn the_newest_requests_and_the_newest_bundle_escaped() {
        let now = Timestamp::from_unix_ms(10_000_000);
        let bundle = serde_json::json!({"phase": "Complete", "message": "answered",
            "bundle": {"collectedAt": "2026-12-07T10:00:00Z", "redacted": 2, "sections": [
                {"item": "disk", "text": "/ 10G <script>alert(1)</script> & more"},
                {"item": "workloadLogs", "workload": "web", "text": "line", "cut": true},
                {"item": "memory", "error": "<b>no /proc</b>"}]}});
        let mut all = vec![obj("old-answer", "pi-1", 100, bundle.clone())];
        for i in 0..6 {
            all.push(obj(
                &format!("later-{i}"),
                "pi-1",
                200 + i,
                serde_json::json!({"phase": "Pending", "message": "waiting"}),
            ));
        }
        all.push(obj("other-device", "pi-2", 900, bundle));
        let list = select(&all, "pi-1");
        let names: Vec<&str> = list
            .iter()
            .map(|o| o.metadata.name.as_deref().unwrap_or_default())
            .collect();
        assert_eq!(
            names,
            [
                "later-5",
                "later-4",
                "later-3",
                "later-2",
                "later-1",
                "old-answer"
            ]
        );
        let page = section(&list, now).into_string();
        assert!(
            !page.contains("other-device") && !page.contains("later-0"),
            "{page}"
        );
        // Only five rows in the table; the answered one's bundle below it.
        assert_eq!(page.matches("<tr>").count(), 6, "{page}");
        assert!(page.contains("Bundle of old-answer"), "{page}");
        assert!(page.contains("2 strings redacted"), "{page}");
        assert!(
            page.contains("&lt;script&gt;alert(1)&lt;/script&gt; &amp; more"),
            "{page}"
        );
        assert!(!page.contains("<script>"), "{page}");
        assert!(page.contains(r#"<details data-section="workloadLogs"><summary>workloadLogs web (older lines cut)"#), "{page}");
        assert!(page.contains("&lt;b&gt;no /proc&lt;/b&gt;"), "{page}");
        let none = section(&select(&all, "pi-9"), now).into_string();
        assert!(none.contains("No diagnostics requested"), "{none}");
    }
}
