//! Diagnostics of one device on request (docs/diagnostics.md): a person creates a `DeviceDiagnostics` object, the
//! operator writes a [`DiagnosticsRequest`] to `diagnostics-request/<device>.<request-uid>`, the device's agent
//! collects the items asked for — a fixed menu compiled in ([`Item`]), never a command, a path or a shell — and
//! writes one [`DiagnosticsBundle`] to `diagnostics-bundle/<device>.<request-uid>` through fleet-auth's device
//! API, which takes it only for a request that device was given. Every text is redacted on the device before it
//! leaves (`docs/diagnostics.md`, "Redaction") and bounded here: lines per section, bytes per section, bytes per
//! bundle ([`MAX_BUNDLE_BYTES`]), always keeping the newest lines and saying what was cut.

use crate::{AttemptId, DeviceId, Timestamp, ValidationError, WorkloadName};
use serde::{Deserialize, Serialize};

/// Most lines a request may ask for per section.
pub const MAX_LINES: u32 = 2_000;
/// Lines per section when a request names none.
pub const DEFAULT_LINES: u32 = 200;
/// Furthest back a request may reach (`sinceSeconds`): 30 days.
pub const MAX_SINCE_SECONDS: u64 = 30 * 24 * 3600;
/// Most workloads whose logs one request may name.
pub const MAX_WORKLOADS: usize = 16;
/// Most sections in a bundle: every item once, plus the logs of [`MAX_WORKLOADS`] workloads.
pub const MAX_SECTIONS: usize = Item::ALL.len() + MAX_WORKLOADS;
/// Largest text of one section, in bytes (its newest lines are kept).
pub const MAX_SECTION_BYTES: usize = 32 * 1024;
/// Largest bundle, in bytes of its JSON (the `diagnostics-bundle` bucket's value limit): one device message,
/// within the devices' `max_payload` ([`crate::auth::DEVICE_MAX_PAYLOAD`]) with room for headers.
pub const MAX_BUNDLE_BYTES: usize = 112 * 1024;
/// Largest request, in bytes of its JSON (the `diagnostics-request` bucket's value limit).
pub const MAX_REQUEST_BYTES: usize = 4 * 1024;
/// Largest error text of a section, in characters.
pub const MAX_ERROR_CHARS: usize = 512;

/// How many requests may be open (written, not yet answered and copied) at once across the fleet, for buckets
/// made for `fleet_size` devices: as many bundles of the largest size as the `diagnostics-bundle` bucket holds.
/// A device's share of that bucket is a 32nd of a bundle (bundles are rare), so it is the operator that
/// keeps the bucket from filling: it opens at most this many requests (the others wait, saying so) and deletes a
/// bundle once it has copied it.
pub fn max_open_requests(fleet_size: u64) -> u64 {
    let spec = crate::kv::bucket(crate::kv::DIAGNOSTICS_BUNDLE).expect("the bundle bucket");
    let per_bundle = MAX_BUNDLE_BYTES as u64 + 1024; // and the message's overhead
    (crate::kv::max_bytes(spec, fleet_size) as u64 / per_bundle).max(1)
}

/// What a request may ask for. Which process collects it is fixed ([`Item::collector`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Item {
    /// The newest log lines of fleet-owned containers (by workload name; every workload when none is named).
    WorkloadLogs,
    /// `podman ps` and inspect of the fleet-owned containers: name, image, state, restarts, exit code, health.
    Containers,
    /// Use of the file systems the device depends on (`/`, `/var`, Podman's storage): size, used, free.
    Disk,
    /// Memory and swap (`/proc/meminfo`'s totals) and the load average.
    Memory,
    /// The agent's journal (`fleet-agent.service`).
    AgentJournal,
    /// The updater's journal (`fleet-updater.service`).
    UpdaterJournal,
    /// The failed systemd units.
    FailedUnits,
    /// The last boot's watchdog verdict and the reboot diagnostics the watchdog keeps.
    BootDiagnostics,
    /// The updater's journal state: its agent-upgrade and system-upgrade transactions.
    UpdaterState,
}

/// The process that collects an [`Item`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Collector {
    /// The agent (unprivileged: Podman's API, `/proc`, `statvfs`).
    Agent,
    /// The updater (root: the system journal, systemd, its own state), asked over its socket.
    Updater,
}

impl Item {
    /// Every item, in the order sections are written.
    pub const ALL: [Item; 9] = [
        Item::WorkloadLogs,
        Item::Containers,
        Item::Disk,
        Item::Memory,
        Item::AgentJournal,
        Item::UpdaterJournal,
        Item::FailedUnits,
        Item::BootDiagnostics,
        Item::UpdaterState,
    ];

    /// The name used in requests and bundles.
    pub fn name(self) -> &'static str {
        match self {
            Item::WorkloadLogs => "workloadLogs",
            Item::Containers => "containers",
            Item::Disk => "disk",
            Item::Memory => "memory",
            Item::AgentJournal => "agentJournal",
            Item::UpdaterJournal => "updaterJournal",
            Item::FailedUnits => "failedUnits",
            Item::BootDiagnostics => "bootDiagnostics",
            Item::UpdaterState => "updaterState",
        }
    }

    /// Who collects it.
    pub fn collector(self) -> Collector {
        match self {
            Item::WorkloadLogs | Item::Containers | Item::Disk | Item::Memory => Collector::Agent,
            Item::AgentJournal
            | Item::UpdaterJournal
            | Item::FailedUnits
            | Item::BootDiagnostics
            | Item::UpdaterState => Collector::Updater,
        }
    }
}

/// What the operator asks one device for, at `diagnostics-request/<device>.<request-uid>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DiagnosticsRequest {
    /// The items; every item when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub items: Vec<Item>,
    /// The workloads whose logs are collected; every fleet workload of the device when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub workloads: Vec<WorkloadName>,
    /// Newest lines per section (1 to [`MAX_LINES`]).
    pub lines: u32,
    /// Only what was logged in the last this many seconds (at most [`MAX_SINCE_SECONDS`]); everything kept when
    /// absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_seconds: Option<u64>,
    /// When the request was made (for the device's log and the bundle).
    pub requested_at: Timestamp,
}

impl DiagnosticsRequest {
    /// Checks the bounds; the error names the field.
    pub fn validate(&self) -> Result<(), ValidationError> {
        if !(1..=MAX_LINES).contains(&self.lines) {
            return Err(ValidationError::new(
                "lines",
                format!("{} is not within 1..={MAX_LINES}", self.lines),
            ));
        }
        if let Some(s) = self.since_seconds {
            if s == 0 || s > MAX_SINCE_SECONDS {
                return Err(ValidationError::new(
                    "sinceSeconds",
                    format!("{s} is not within 1..={MAX_SINCE_SECONDS} (30 days)"),
                ));
            }
        }
        if self.workloads.len() > MAX_WORKLOADS {
            return Err(ValidationError::new(
                "workloads",
                format!(
                    "{} workloads named (at most {MAX_WORKLOADS})",
                    self.workloads.len()
                ),
            ));
        }
        if self.items.len() > Item::ALL.len() {
            return Err(ValidationError::new(
                "items",
                format!("{} items (at most {})", self.items.len(), Item::ALL.len()),
            ));
        }
        Ok(())
    }

    /// The items to collect, each once, in [`Item::ALL`]'s order.
    pub fn items(&self) -> Vec<Item> {
        Item::ALL
            .into_iter()
            .filter(|i| self.items.is_empty() || self.items.contains(i))
            .collect()
    }

    /// Parses a request read from the bucket, refusing one over [`MAX_REQUEST_BYTES`] or out of bounds.
    pub fn parse(bytes: &[u8]) -> Result<Self, ValidationError> {
        if bytes.len() > MAX_REQUEST_BYTES {
            return Err(ValidationError::new(
                "diagnostics request",
                format!("{} bytes (at most {MAX_REQUEST_BYTES})", bytes.len()),
            ));
        }
        let r: Self = serde_json::from_slice(bytes)
            .map_err(|e| ValidationError::new("diagnostics request", e.to_string()))?;
        r.validate()?;
        Ok(r)
    }
}

/// One collected item.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Section {
    /// What it is.
    pub item: Item,
    /// The workload, for [`Item::WorkloadLogs`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload: Option<WorkloadName>,
    /// The text (redacted), newest lines last.
    pub text: String,
    /// Older lines or bytes were left out to stay within the bounds (lines asked for, [`MAX_SECTION_BYTES`],
    /// [`MAX_BUNDLE_BYTES`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cut: bool,
    /// Why the item could not be collected (whole or in part); at most [`MAX_ERROR_CHARS`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Section {
    /// A section of `text` keeping its newest `lines` lines and at most [`MAX_SECTION_BYTES`] bytes (cut at a
    /// line start where one falls within the bound, else at a character boundary).
    pub fn new(item: Item, workload: Option<WorkloadName>, text: &str, lines: u32) -> Self {
        let (text, cut) = tail(text, lines as usize, MAX_SECTION_BYTES);
        Self {
            item,
            workload,
            text,
            cut,
            error: None,
        }
    }

    /// A section that could not be collected.
    pub fn failed(item: Item, workload: Option<WorkloadName>, error: impl AsRef<str>) -> Self {
        Self {
            item,
            workload,
            text: String::new(),
            cut: false,
            error: Some(bounded_chars(error.as_ref(), MAX_ERROR_CHARS)),
        }
    }

    /// The section's title as shown to a person: `workloadLogs web`, `disk`, ….
    pub fn title(&self) -> String {
        match &self.workload {
            Some(w) => format!("{} {}", self.item.name(), w.as_str()),
            None => self.item.name().to_owned(),
        }
    }
}

/// What a device answers, at `diagnostics-bundle/<device>.<request-uid>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DiagnosticsBundle {
    /// The device (the key's; the operator checks they match).
    pub device: DeviceId,
    /// The request answered (the key's).
    pub request: AttemptId,
    /// When the device collected it.
    pub collected_at: Timestamp,
    /// The sections, in [`Item::ALL`]'s order.
    pub sections: Vec<Section>,
    /// How many strings were redacted.
    #[serde(default)]
    pub redacted: u32,
    /// Some section was cut to fit [`MAX_BUNDLE_BYTES`] (each section also says so).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cut: bool,
}

impl DiagnosticsBundle {
    /// The bundle as JSON of at most [`MAX_BUNDLE_BYTES`]: while it is larger, the largest section loses its
    /// oldest lines (and is marked cut). Sections beyond [`MAX_SECTIONS`] are dropped first.
    pub fn to_bounded_json(&mut self) -> Vec<u8> {
        if self.sections.len() > MAX_SECTIONS {
            self.sections.truncate(MAX_SECTIONS);
            self.cut = true;
        }
        loop {
            let bytes = serde_json::to_vec(self).expect("a bundle serializes");
            if bytes.len() <= MAX_BUNDLE_BYTES {
                return bytes;
            }
            let over = bytes.len() - MAX_BUNDLE_BYTES;
            let largest = self
                .sections
                .iter_mut()
                .max_by_key(|s| s.text.len())
                .expect("a bundle over its bound has a section");
            // JSON escapes can make a byte of text up to six of JSON: cut at least the excess, and at least an
            // eighth of the text, so the loop ends in a few rounds.
            let keep = largest
                .text
                .len()
                .saturating_sub(over.max(largest.text.len() / 8).max(1));
            let (text, _) = tail(&largest.text, usize::MAX, keep);
            largest.text = text;
            largest.cut = true;
            self.cut = true;
        }
    }

    /// Parses a bundle read from the bucket and checks it answers `request` of `device`.
    pub fn parse(
        bytes: &[u8],
        device: &DeviceId,
        request: &AttemptId,
    ) -> Result<Self, ValidationError> {
        if bytes.len() > MAX_BUNDLE_BYTES {
            return Err(ValidationError::new(
                "diagnostics bundle",
                format!("{} bytes (at most {MAX_BUNDLE_BYTES})", bytes.len()),
            ));
        }
        let b: Self = serde_json::from_slice(bytes)
            .map_err(|e| ValidationError::new("diagnostics bundle", e.to_string()))?;
        if &b.device != device || &b.request != request {
            return Err(ValidationError::new(
                "diagnostics bundle",
                format!(
                    "answers {}.{} where {device}.{request} was asked",
                    b.device, b.request
                ),
            ));
        }
        if b.sections.len() > MAX_SECTIONS {
            return Err(ValidationError::new(
                "diagnostics bundle",
                format!("{} sections (at most {MAX_SECTIONS})", b.sections.len()),
            ));
        }
        Ok(b)
    }
}

/// The newest `lines` lines of `text` within `max_bytes` bytes, and whether anything was left out. A cut inside
/// a line keeps the line's end from a character boundary.
pub fn tail(text: &str, lines: usize, max_bytes: usize) -> (String, bool) {
    let body = text.strip_suffix('\n').unwrap_or(text);
    if lines == 0 {
        return (String::new(), !body.is_empty());
    }
    // `end` is the exclusive end of the next line to take, walking back from the newest.
    let mut end = body.len();
    let mut kept_start = body.len();
    let mut count = 0;
    while count < lines {
        let from = body[..end].rfind('\n').map_or(0, |i| i + 1);
        if body.len() - from > max_bytes {
            break;
        }
        kept_start = from;
        count += 1;
        if from == 0 {
            break;
        }
        end = from - 1;
    }
    if count == 0 {
        // Not even the newest line fits: its end, from a character boundary.
        kept_start = body.len().saturating_sub(max_bytes);
        while !body.is_char_boundary(kept_start) {
            kept_start += 1;
        }
    }
    let kept = &body[kept_start..];
    let cut = kept_start > 0;
    (kept.to_owned(), cut)
}

/// `s` shortened to `max` characters (ending in `…`), control characters but newline and tab replaced.
fn bounded_chars(s: &str, max: usize) -> String {
    let mut out: String = s
        .chars()
        .map(|c| {
            if c.is_control() && c != '\n' && c != '\t' {
                '\u{fffd}'
            } else {
                c
            }
        })
        .take(max + 1)
        .collect();
    if out.chars().count() > max {
        out = out.chars().take(max.saturating_sub(1)).collect();
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn tail_keeps_the_newest_lines_within_both_bounds() {
        assert_eq!(tail("a\nb\nc\n", 2, 100), ("b\nc".into(), true));
        assert_eq!(tail("a\nb\nc", 3, 100), ("a\nb\nc".into(), false));
        assert_eq!(tail("a\nb\nc", 10, 100), ("a\nb\nc".into(), false));
        assert_eq!(tail("aaaa\nbb\ncc", 10, 5), ("bb\ncc".into(), true));
        // The last line alone is over the bound: its end.
        assert_eq!(tail("xxxxxxxx", 10, 3), ("xxx".into(), true));
        assert_eq!(tail("", 10, 3), (String::new(), false));
        // A multi-byte character is never split.
        let (t, cut) = tail("ééé", 10, 3);
        assert!(cut && t == "é", "{t:?}");
    }

    proptest! {
        #[test]
        fn tail_is_a_suffix_within_bounds(text in "[a-zé\n]{0,200}", lines in 0usize..20, max in 0usize..80) {
            let (t, cut) = tail(&text, lines, max);
            let body = text.strip_suffix('\n').unwrap_or(&text);
            prop_assert!(body.ends_with(&t));
            prop_assert!(t.len() <= max);
            prop_assert!(t.lines().count() <= lines.max(1));
            prop_assert_eq!(cut, t.len() < body.len());
        }
    }

    fn bundle(text: &str, sections: usize) -> DiagnosticsBundle {
        DiagnosticsBundle {
            device: DeviceId::try_from("dev-a").expect("id"),
            request: AttemptId::new_random(),
            collected_at: Timestamp::from_unix_ms(1),
            sections: (0..sections)
                .map(|_| Section::new(Item::WorkloadLogs, None, text, MAX_LINES))
                .collect(),
            redacted: 0,
            cut: false,
        }
    }

    #[test]
    fn a_bundle_is_cut_to_its_bound_and_says_so() {
        // Escapes make control characters six bytes of JSON each: the worst case for the bound.
        let noisy: String = "\u{1}".repeat(MAX_SECTION_BYTES);
        for text in [noisy.as_str(), &"line\n".repeat(100_000)] {
            let mut b = bundle(text, MAX_SECTIONS + 3);
            let json = b.to_bounded_json();
            assert!(json.len() <= MAX_BUNDLE_BYTES, "{}", json.len());
            assert!(b.cut && b.sections.len() == MAX_SECTIONS);
            let back = DiagnosticsBundle::parse(&json, &b.device, &b.request).expect("parses");
            assert!(back.sections.iter().any(|s| s.cut));
        }
        let mut small = bundle("hello\n", 2);
        let json = small.to_bounded_json();
        assert!(!small.cut && json.len() < 1000);
    }

    #[test]
    fn a_bundle_for_another_device_or_request_is_refused() {
        let mut b = bundle("x", 1);
        let json = b.to_bounded_json();
        let other = DeviceId::try_from("dev-b").expect("id");
        assert!(DiagnosticsBundle::parse(&json, &other, &b.request).is_err());
        assert!(DiagnosticsBundle::parse(&json, &b.device, &AttemptId::new_random()).is_err());
        assert!(
            DiagnosticsBundle::parse(&vec![b' '; MAX_BUNDLE_BYTES + 1], &b.device, &b.request)
                .is_err()
        );
    }

    #[test]
    fn requests_are_bounded_and_name_the_field() {
        let ok = DiagnosticsRequest {
            items: vec![],
            workloads: vec![],
            lines: DEFAULT_LINES,
            since_seconds: None,
            requested_at: Timestamp::from_unix_ms(1),
        };
        assert_eq!(ok.items(), Item::ALL.to_vec());
        let json = serde_json::to_vec(&ok).expect("json");
        assert_eq!(DiagnosticsRequest::parse(&json).expect("parses"), ok);
        for (bad, field) in [
            (
                DiagnosticsRequest {
                    lines: 0,
                    ..ok.clone()
                },
                "lines",
            ),
            (
                DiagnosticsRequest {
                    lines: MAX_LINES + 1,
                    ..ok.clone()
                },
                "lines",
            ),
            (
                DiagnosticsRequest {
                    since_seconds: Some(0),
                    ..ok.clone()
                },
                "sinceSeconds",
            ),
            (
                DiagnosticsRequest {
                    since_seconds: Some(MAX_SINCE_SECONDS + 1),
                    ..ok.clone()
                },
                "sinceSeconds",
            ),
        ] {
            assert_eq!(bad.validate().expect_err(field).field, field);
        }
        let some = DiagnosticsRequest {
            items: vec![Item::Disk, Item::WorkloadLogs],
            ..ok.clone()
        };
        assert_eq!(some.items(), vec![Item::WorkloadLogs, Item::Disk]);
        assert!(DiagnosticsRequest::parse(
            br#"{"lines":1,"requestedAt":"2026-12-07T10:00:00.000Z","command":"sh"}"#
        )
        .is_err());
        assert!(DiagnosticsRequest::parse(
            br#"{"lines":1,"requestedAt":"2026-12-07T10:00:00.000Z","items":["shell"]}"#
        )
        .is_err());
    }

    #[test]
    fn item_names_are_their_serde_names() {
        for i in Item::ALL {
            assert_eq!(
                serde_json::to_value(i).expect("json"),
                serde_json::Value::String(i.name().into())
            );
        }
    }
}
