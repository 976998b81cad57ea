//! The device page's answer to "why isn't it updating?", at its top: the Device's `status.blocking` (one reason per
//! change the device does not have yet, as its planner decided it: deployments/blocking.rs, tasks/blocking.rs), each
//! with its change, kind, sentence and time, and how many more the status did not list.

use super::html::{parse_time, when};
use crate::blocking::BlockingKind;
use crate::crd::DeviceStatus;
use fleet_wire::Timestamp;
use maud::{html, Markup};

/// True for the kinds that need a person (the row shows in red).
fn needs_a_person(kind: BlockingKind) -> bool {
    matches!(
        kind,
        BlockingKind::Halted
            | BlockingKind::Stalled
            | BlockingKind::DownloadFailed
            | BlockingKind::RollbackFailed
            | BlockingKind::Failed
            | BlockingKind::SoakFailed
            | BlockingKind::CrashLooping
            | BlockingKind::Unhealthy
    )
}

fn kind_name(kind: BlockingKind) -> String {
    serde_json::to_value(kind)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// The section: a table of the reasons, or a line saying none is listed.
pub fn section(s: &DeviceStatus, now: Timestamp) -> Markup {
    html! {
        section #blocking {
            h2 { "Why it is not updated" }
            @if s.blocking.is_empty() {
                p.muted { "No rollout or running TaskRun holds a change back from this device." }
            } @else {
                table {
                    thead { tr { th { "change" } th { "reason" } th { "why" } th { "since" } th { "until" } } }
                    tbody {
                        @for b in &s.blocking {
                            tr data-blocking=(kind_name(b.kind)) {
                                td { code { (b.change) } }
                                td {
                                    @if needs_a_person(b.kind) {
                                        b.bad { (kind_name(b.kind)) }
                                    } @else {
                                        (kind_name(b.kind))
                                    }
                                }
                                td { (b.message) }
                                td { (when(b.since.as_deref().and_then(parse_time), now)) }
                                td { (b.until.as_deref().unwrap_or("—")) }
                            }
                        }
                    }
                }
                @if let Some(more) = s.blocking_more {
                    p.muted { "and " (more) " more changes the Device does not list" }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blocking::Blocking;

    #[test]
    fn reasons_show_with_their_kind_and_sentence() {
        let now = Timestamp::from_unix_ms(1_800_000_000_000);
        let none = section(&DeviceStatus::default(), now).into_string();
        assert!(
            none.contains("No rollout or running TaskRun holds a change back"),
            "{none}"
        );
        let s = DeviceStatus {
            blocking: vec![
                Blocking {
                    kind: BlockingKind::Soaking,
                    change: "AgentRelease/fleet-agent".into(),
                    message: "AgentRelease/fleet-agent waits for the canaries' soak, until <t>"
                        .into(),
                    since: None,
                    until: Some("2027-01-15T08:00:00.000Z".into()),
                },
                Blocking {
                    kind: BlockingKind::RollbackFailed,
                    change: "AgentRelease/other".into(),
                    message: "rollback failed".into(),
                    since: Some(now.to_string()),
                    until: None,
                },
            ],
            blocking_more: Some(3),
            ..Default::default()
        };
        let html = section(&s, now).into_string();
        assert!(html.contains(r#"<tr data-blocking="soaking">"#), "{html}");
        assert!(html.contains("until &lt;t&gt;"), "escaped: {html}");
        assert!(html.contains("2027-01-15T08:00:00.000Z"), "{html}");
        assert!(
            html.contains(r#"<b class="bad">rollbackFailed</b>"#),
            "{html}"
        );
        assert!(!html.contains(r#"<b class="bad">soaking</b>"#), "{html}");
        assert!(html.contains("and 3 more"), "{html}");
    }
}
