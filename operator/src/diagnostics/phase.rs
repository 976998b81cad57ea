//! A request's phase, decided from what the operator knows (pure; the table test below is the specification):
//! the device's liveness, whether the request could be written, whether it waits in the queue ([`super::queue`]),
//! the device's answer, the 7-day expiry. A finished request (Complete, Failed) never changes again.

use super::queue::Queued;
use crate::crd::diagnostics::{DiagnosticsBundleStatus, DiagnosticsPhase};

/// How long a request waits for its device: the `diagnostics-request` bucket's age limit, after which the
/// device could not read it any more.
pub const EXPIRES_AFTER: std::time::Duration = std::time::Duration::from_secs(7 * 24 * 3600);

/// How long a request for a Device the operator has not seen waits for it before it fails with `no Device`.
pub const MISSING_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// What the operator knows of the device, from its Device object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceState {
    /// No Device of that name.
    Missing,
    /// No Device of that name in the cache yet, and the request is younger than [`MISSING_GRACE`]: the Device
    /// cache may lag behind the request's (a Device created just before its request).
    NotSeenYet,
    /// `Online=True`.
    Online,
    /// `Online=False` since then (the condition's `lastTransitionTime`).
    Offline(String),
    /// Not judged yet (no `Online` condition).
    Unjudged,
}

/// The device's answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// None yet.
    None,
    /// A bundle that answers this request.
    Bundle(Box<DiagnosticsBundleStatus>),
    /// A bundle at this request's key that does not parse or answers another request (why).
    Invalid(String),
}

/// Everything [`judge`] decides from.
#[derive(Debug, Clone)]
pub struct Facts<'a> {
    /// The object's device (for messages).
    pub device: &'a str,
    /// The phase the object has now.
    pub current: Option<DiagnosticsPhase>,
    /// Why the spec is not a valid request.
    pub spec_error: Option<&'a str>,
    /// Why NATS refused to store the request.
    pub write_error: Option<&'a str>,
    /// The device.
    pub device_state: DeviceState,
    /// The device's answer.
    pub answer: &'a Answer,
    /// When the request expires (RFC 3339).
    pub expires_at: &'a str,
    /// It has.
    pub expired: bool,
    /// Not written: it waits for another request of its device, or for the fleet's open requests
    /// ([`super::queue::decide`]).
    pub queued: Option<&'a Queued>,
}

/// Why a queued request is not written, for its message.
fn queue_reason(d: &str, q: &Queued) -> String {
    match q {
        Queued::Device { earlier } => format!(
            "waits for request {earlier}, which is open for device {d} (a device answers one request at a time)"
        ),
        Queued::Fleet { open, max } => {
            format!("{open} requests are open across the fleet (at most {max})")
        }
    }
}

/// The phase and message to show; `None`: the request finished, nothing changes.
pub fn judge(f: &Facts) -> Option<(DiagnosticsPhase, String)> {
    use DiagnosticsPhase::*;
    if f.current.is_some_and(DiagnosticsPhase::finished) {
        return None;
    }
    let d = f.device;
    Some(if let Some(e) = f.spec_error {
        (Failed, format!("invalid request: {e}"))
    } else if let Answer::Bundle(b) = f.answer {
        // A section is cut for its own bound (lines, 32 KiB) as well as for the bundle's: count them.
        let cut = b.sections.iter().filter(|s| s.cut).count();
        (
            Complete,
            format!(
                "device {d} answered with {} sections, collected at {}{}",
                b.sections.len(),
                b.collected_at,
                match cut {
                    0 => String::new(),
                    n => format!(" ({n} cut to their bounds: their oldest lines left out)"),
                }
            ),
        )
    } else if let Answer::Invalid(why) = f.answer {
        (
            Failed,
            format!("device {d} answered with a bundle that does not answer this request: {why}"),
        )
    } else if let Some(e) = f.write_error {
        (
            Failed,
            format!("NATS refused the request for device {d}: {e}"),
        )
    } else if f.device_state == DeviceState::Missing {
        (Failed, format!("no Device {d}"))
    } else if f.device_state == DeviceState::NotSeenYet {
        (
            Pending,
            format!(
                "no Device {d} seen yet; the request fails if none appears within {} s of its creation",
                MISSING_GRACE.as_secs()
            ),
        )
    } else if let (true, Some(q)) = (f.expired, f.queued) {
        (
            Failed,
            format!(
                "expired: still queued by {}, never written for device {d}: {}",
                f.expires_at,
                queue_reason(d, q)
            ),
        )
    } else if f.expired {
        (
            Failed,
            format!("expired: device {d} did not answer by {}", f.expires_at),
        )
    } else if let Some(q) = f.queued {
        (
            Pending,
            format!(
                "queued: {}; written for device {d} once that changes",
                queue_reason(d, q)
            ),
        )
    } else if let DeviceState::Offline(since) = &f.device_state {
        (
            Waiting,
            format!(
                "device {d} has been offline since {since}; the request waits for it until {}",
                f.expires_at
            ),
        )
    } else if f.device_state == DeviceState::Online {
        (
            Pending,
            format!("written for device {d}, which is online; waiting for its answer"),
        )
    } else {
        (
            Pending,
            format!(
                "written for device {d} (its liveness is not judged yet); waiting for its answer"
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use DiagnosticsPhase::*;

    /// (current, spec error, write error, device, answer, expired, expected phase, words in the message)
    type Row<'a> = (
        Option<DiagnosticsPhase>,
        Option<&'a str>,
        Option<&'a str>,
        DeviceState,
        &'a Answer,
        bool,
        Option<DiagnosticsPhase>,
        &'a str,
    );

    #[test]
    fn a_complete_message_counts_the_sections_cut_to_their_own_bound() {
        let section = |cut| crate::crd::diagnostics::DiagnosticsSection {
            item: "workloadLogs".into(),
            workload: None,
            text: "x".into(),
            cut,
            error: None,
        };
        // The bundle itself was not cut: one section was, for its own 32 KiB.
        let answer = Answer::Bundle(Box::new(DiagnosticsBundleStatus {
            collected_at: "2026-12-07T10:00:00Z".into(),
            sections: vec![section(true), section(false)],
            ..Default::default()
        }));
        let f = Facts {
            device: "d",
            current: None,
            spec_error: None,
            write_error: None,
            device_state: DeviceState::Online,
            answer: &answer,
            expires_at: "later",
            expired: false,
            queued: None,
        };
        let (phase, message) = judge(&f).expect("judged");
        assert_eq!(phase, DiagnosticsPhase::Complete);
        assert!(
            message.ends_with("(1 cut to their bounds: their oldest lines left out)"),
            "{message}"
        );
    }

    #[test]
    fn phase_table() {
        let bundle = Answer::Bundle(Box::new(DiagnosticsBundleStatus {
            collected_at: "2026-12-07T10:00:00Z".into(),
            sections: vec![],
            ..Default::default()
        }));
        let invalid = Answer::Invalid("answers d.x".into());
        let none = Answer::None;
        let off = DeviceState::Offline("2026-12-07T09:00:00Z".into());
        // (current, spec error, write error, device, answer, expired) -> phase, words in the message
        let rows: Vec<Row> = vec![
            (
                None,
                None,
                None,
                DeviceState::Online,
                &none,
                false,
                Some(Pending),
                "which is online",
            ),
            (
                None,
                None,
                None,
                DeviceState::Unjudged,
                &none,
                false,
                Some(Pending),
                "not judged yet",
            ),
            (
                None,
                None,
                None,
                off.clone(),
                &none,
                false,
                Some(Waiting),
                "offline since 2026-12-07T09:00:00Z; the request waits for it until 2026-12-14",
            ),
            (
                Some(Waiting),
                None,
                None,
                DeviceState::Online,
                &none,
                false,
                Some(Pending),
                "online",
            ),
            (
                Some(Pending),
                None,
                None,
                off.clone(),
                &none,
                false,
                Some(Waiting),
                "offline",
            ),
            (
                Some(Pending),
                None,
                None,
                DeviceState::Online,
                &bundle,
                false,
                Some(Complete),
                "0 sections",
            ),
            (
                Some(Waiting),
                None,
                None,
                off.clone(),
                &bundle,
                false,
                Some(Complete),
                "answered",
            ),
            (
                Some(Pending),
                None,
                None,
                DeviceState::Online,
                &invalid,
                false,
                Some(Failed),
                "does not answer",
            ),
            (
                None,
                Some("spec.lines: 0"),
                None,
                DeviceState::Online,
                &none,
                false,
                Some(Failed),
                "invalid request",
            ),
            (
                None,
                None,
                Some("maximum bytes exceeded"),
                DeviceState::Online,
                &none,
                false,
                Some(Failed),
                "NATS refused",
            ),
            (
                None,
                None,
                None,
                DeviceState::Missing,
                &none,
                false,
                Some(Failed),
                "no Device dev-1",
            ),
            (
                None,
                None,
                None,
                DeviceState::NotSeenYet,
                &none,
                false,
                Some(Pending),
                "no Device dev-1 seen yet; the request fails if none appears within 10 s",
            ),
            (
                Some(Waiting),
                None,
                None,
                off.clone(),
                &none,
                true,
                Some(Failed),
                "expired",
            ),
            (
                Some(Pending),
                None,
                None,
                DeviceState::Online,
                &none,
                true,
                Some(Failed),
                "expired",
            ),
            // Finished requests never change.
            (
                Some(Complete),
                None,
                None,
                DeviceState::Missing,
                &invalid,
                true,
                None,
                "",
            ),
            (
                Some(Failed),
                None,
                None,
                DeviceState::Online,
                &bundle,
                false,
                None,
                "",
            ),
        ];
        for (i, (current, spec_error, write_error, device_state, answer, expired, phase, words)) in
            rows.into_iter().enumerate()
        {
            let f = Facts {
                device: "dev-1",
                current,
                spec_error,
                write_error,
                device_state,
                answer,
                expires_at: "2026-12-14T09:00:00Z",
                expired,
                queued: None,
            };
            let got = judge(&f);
            assert_eq!(got.as_ref().map(|g| g.0), phase, "row {i}");
            if let Some((_, m)) = got {
                assert!(m.contains(words), "row {i}: {m}");
            }
        }
    }

    /// (current, device, answer, expired, queued, expected phase, words in the message)
    type QueuedRow<'a> = (
        Option<DiagnosticsPhase>,
        DeviceState,
        &'a Answer,
        bool,
        &'a Queued,
        Option<DiagnosticsPhase>,
        &'a str,
    );

    #[test]
    fn queued_table() {
        let by_device = Queued::Device {
            earlier: "first".into(),
        };
        let by_fleet = Queued::Fleet { open: 72, max: 72 };
        let bundle = Answer::Bundle(Box::default());
        let none = Answer::None;
        let off = DeviceState::Offline("2026-12-07T09:00:00Z".into());
        // (current, device, answer, expired, queued) -> phase, exact message
        let rows: Vec<QueuedRow> = vec![
            (
                None,
                DeviceState::Online,
                &none,
                false,
                &by_device,
                Some(Pending),
                "queued: waits for request first, which is open for device dev-1 (a device answers one request at \
                 a time); written for device dev-1 once that changes",
            ),
            (
                Some(Pending),
                DeviceState::Online,
                &none,
                false,
                &by_fleet,
                Some(Pending),
                "queued: 72 requests are open across the fleet (at most 72); written for device dev-1 once that \
                 changes",
            ),
            // Queued is Pending whatever the device's liveness: nothing is written for it yet.
            (
                Some(Waiting),
                off.clone(),
                &none,
                false,
                &by_fleet,
                Some(Pending),
                "queued: 72 requests are open",
            ),
            (
                None,
                DeviceState::Unjudged,
                &none,
                false,
                &by_device,
                Some(Pending),
                "queued: waits for request first",
            ),
            // Seven days in the queue: Failed, saying it was never written.
            (
                Some(Pending),
                DeviceState::Online,
                &none,
                true,
                &by_fleet,
                Some(Failed),
                "expired: still queued by 2026-12-14T09:00:00Z, never written for device dev-1: 72 requests are \
                 open across the fleet (at most 72)",
            ),
            // A missing Device fails before the queue is told.
            (
                None,
                DeviceState::Missing,
                &none,
                false,
                &by_device,
                Some(Failed),
                "no Device dev-1",
            ),
            // An answer completes it (the controller queues no answered request; the decision holds anyway).
            (
                Some(Pending),
                DeviceState::Online,
                &bundle,
                false,
                &by_device,
                Some(Complete),
                "answered",
            ),
            // Finished: nothing changes.
            (
                Some(Complete),
                DeviceState::Online,
                &none,
                false,
                &by_device,
                None,
                "",
            ),
        ];
        for (i, (current, device_state, answer, expired, queued, phase, words)) in
            rows.into_iter().enumerate()
        {
            let f = Facts {
                device: "dev-1",
                current,
                spec_error: None,
                write_error: None,
                device_state,
                answer,
                expires_at: "2026-12-14T09:00:00Z",
                expired,
                queued: Some(queued),
            };
            let got = judge(&f);
            assert_eq!(got.as_ref().map(|g| g.0), phase, "row {i}");
            if let Some((_, m)) = got {
                assert!(m.contains(words), "row {i}: {m}");
            }
        }
    }
}
