//! "Why isn't it updating?": a Device's `status.blocking`, one typed reason per change it does not have yet
//! (docs/crds.md, "Device: why it is not updating"). Each reason is the rollout planner's own decision for the
//! device ([`rollout::Wait`], from [`rollout::plan`] and [`rollout::hold`]), worded here with what the device
//! reported about it (the failed attempt's reason and error); nothing is judged a second time. Pure; table-tested
//! in `rollout_reasons.rs`.

use crate::conditions::Want;
use crate::fleet::rollout::{self, Failure, Stall, Wait};
use fleet_wire::{
    AgentUpgradeStatus, DeviceWorkloadStatus, FailureReason, Timestamp, UpgradePhase,
    UpgradeReason, WorkloadState,
};
use serde::Serialize;
use std::time::Duration;

// The entry and its bounds are shared with the TaskRun controller's reasons (crate::blocking); re-exported so that
// the rollouts' code and tests name them as before.
pub use crate::blocking::{
    change, cut, listed, Blocking, BlockingKind, MAX_BLOCKING, MAX_MESSAGE_CHARS,
    MAX_REPORTED_CHARS,
};

/// Why a halted rollout halted, for its devices' messages: from this pass's halt, or from the condition a held
/// halt keeps ([`rollout::hold`]).
pub fn halt_why(halt: Option<&rollout::Halt>, kept: Option<&Want>) -> String {
    match (halt, kept) {
        (Some(h), _) => {
            let first = h.devices.first().map(String::as_str).unwrap_or("?");
            let more = h.failed.saturating_sub(1);
            let tail = if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            };
            match h.reason {
                rollout::HaltReason::CanaryFailed => format!("a canary failed: {first}{tail}"),
                rollout::HaltReason::FailureThreshold => format!(
                    "{} failed devices, more than maxFailures ({}): {first}{tail}",
                    h.failed, h.tolerated
                ),
            }
        }
        (None, Some(w)) if w.reason == rollout::HaltReason::FailureThreshold.as_str() => {
            "more failed devices than maxFailures".into()
        }
        (None, Some(_)) => "a canary failed".into(),
        (None, None) => "it halted".into(),
    }
}

/// What a failed device reported about its failure: the kind it maps to, the error and since when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reported {
    /// [`BlockingKind::DownloadFailed`], [`BlockingKind::RollbackFailed`] or [`BlockingKind::Failed`].
    pub kind: BlockingKind,
    /// `probe-failed: <error>`, `web: <error>`.
    pub what: String,
    /// When the failure was reported (the device's clock).
    pub since: Option<Timestamp>,
}

fn wire_word<T: Serialize>(v: T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// An agent upgrade's failure, from the status the device reported for the attempt.
pub fn upgrade_failure(status: Option<&AgentUpgradeStatus>) -> Reported {
    let Some(s) = status else {
        return Reported {
            kind: BlockingKind::Failed,
            what: "no report".into(),
            since: None,
        };
    };
    let kind = match (s.phase, s.reason) {
        (UpgradePhase::RollbackFailed, _) => BlockingKind::RollbackFailed,
        (_, Some(UpgradeReason::DownloadFailed)) => BlockingKind::DownloadFailed,
        _ => BlockingKind::Failed,
    };
    let reason = s
        .reason
        .map(wire_word)
        .unwrap_or_else(|| wire_word(s.phase));
    let what = match &s.error {
        Some(e) => format!("{reason}: {e}"),
        None => reason,
    };
    Reported {
        kind,
        what: cut(what, MAX_REPORTED_CHARS),
        since: Some(s.phase_changed_at),
    }
}

/// A deployment's failure on a device, from its workload report (the first failed or exited workload of `names`);
/// `incapable` when its agent cannot honour the spec (its version, when known).
pub fn workload_failure(
    report: Option<&DeviceWorkloadStatus>,
    names: &[&str],
    incapable: Option<&Option<String>>,
) -> Reported {
    if let Some(version) = incapable {
        let agent = version.as_deref().unwrap_or("of unknown version");
        return Reported {
            kind: BlockingKind::Failed,
            what: format!("its agent ({agent}) cannot honour the spec; upgrade the agent"),
            since: None,
        };
    }
    let failed = report.and_then(|r| {
        r.workloads.iter().find(|w| {
            names.contains(&w.name.as_str())
                && matches!(w.state, WorkloadState::Failed | WorkloadState::Exited)
        })
    });
    let Some(w) = failed else {
        return Reported {
            kind: BlockingKind::Failed,
            what: "a workload failed".into(),
            since: None,
        };
    };
    let pull = w
        .failure
        .as_ref()
        .is_some_and(|f| f.reason == FailureReason::ImagePullFailed);
    let word = match &w.failure {
        Some(f) => wire_word(f.reason),
        None => wire_word(w.state),
    };
    let what = match &w.error {
        Some(e) => format!("{}: {word}: {e}", w.name.as_str()),
        None => format!("{}: {word}", w.name.as_str()),
    };
    Reported {
        kind: if pull {
            BlockingKind::DownloadFailed
        } else {
            BlockingKind::Failed
        },
        what: cut(what, MAX_REPORTED_CHARS),
        since: report.map(|r| r.at),
    }
}

/// How a person resumes a halted rollout (both lift any halt: docs/crds.md, "Rollouts").
fn resume() -> String {
    format!(
        "to resume, change its spec (a new generation) or set the annotation {}=<new value> on it",
        super::release::RETRY_ANNOTATION
    )
}

fn minutes(d: Duration) -> String {
    humantime::format_duration(Duration::from_secs(d.as_secs() / 60 * 60)).to_string()
}

/// The reason a device shows for `change` given the planner's `wait`; `why` says why a halted rollout halted
/// ([`halt_why`]), `failure` what the device reported about a failed attempt (read only for
/// [`Failure::Attempt`]).
pub fn reason(
    change: &str,
    wait: Wait,
    why: impl FnOnce() -> String,
    failure: impl FnOnce() -> Reported,
) -> Blocking {
    let at = |t: Timestamp| Some(t.to_string());
    let (kind, message, since, until) = match wait {
        Wait::Halted => (
            BlockingKind::Halted,
            format!(
                "{change} is halted ({}): no device gets it until a person acts; {}",
                why(),
                resume()
            ),
            None,
            None,
        ),
        Wait::Canaries { waiting, canaries } => (
            BlockingKind::WaitingForCanaries,
            format!("{change} waits for the canaries: {waiting} of {canaries} not updated yet"),
            None,
            None,
        ),
        Wait::CanariesSoaking { until } => (
            BlockingKind::Soaking,
            format!("{change} waits for the canaries' soak, until {until} at the earliest"),
            None,
            at(until),
        ),
        Wait::MaxUnavailable { busy, max } => (
            BlockingKind::MaxUnavailable,
            format!(
                "{change} waits: maxUnavailable reached, {busy} of {max} devices updating or soaking"
            ),
            None,
            None,
        ),
        Wait::Offline { since } => (
            BlockingKind::Offline,
            format!(
                "{change} waits until the device is heard from: offline since {since} (its last heartbeat)"
            ),
            at(since),
            None,
        ),
        Wait::LowSpace(low) => (
            BlockingKind::NotEnoughSpace,
            format!(
                "{change} waits for free space: {} free on {}, needs {} MiB; free space on the device (its \
                 status.usage shows each filesystem)",
                crate::fleet::usage::size(low.available_bytes),
                low.role,
                // The floor exactly (a whole number of MiB), not cut to two digits.
                low.floor_bytes >> 20
            ),
            None,
            None,
        ),
        Wait::Updating(Some((phase, since))) => (
            BlockingKind::Updating,
            format!("{change} is on its way: {} since {since}", rollout::phase_word(phase)),
            at(since),
            None,
        ),
        Wait::Updating(None) => (
            BlockingKind::Updating,
            format!("{change} is on its way: given to the device, not running yet"),
            None,
            None,
        ),
        Wait::Stalled(Stall::Phase { phase, since }) => (
            BlockingKind::Stalled,
            format!(
                "{change} is stalled in phase {} since {since}, longer than its bound of {}",
                rollout::phase_word(phase),
                minutes(rollout::phase_bound(phase).unwrap_or_default() + rollout::STALL_SLACK)
            ),
            at(since),
            None,
        ),
        Wait::Stalled(Stall::Silent { since }) => (
            BlockingKind::Stalled,
            format!("{change} is stalled: given to the device, no heartbeat since {since}"),
            at(since),
            None,
        ),
        Wait::Failed(Failure::Attempt) => {
            let r = failure();
            let action = match r.kind {
                BlockingKind::RollbackFailed => {
                    "never retried: the device needs a person (docs/updater.md)".to_owned()
                }
                _ => format!(
                    "set the annotation {}=<new value> on it to retry",
                    super::release::RETRY_ANNOTATION
                ),
            };
            let word = match r.kind {
                BlockingKind::DownloadFailed => "download failed",
                BlockingKind::RollbackFailed => "rollback failed",
                _ => "failed",
            };
            (
                r.kind,
                format!("{change} {word} with {}; {action}", r.what),
                r.since.and_then(at),
                None,
            )
        }
        Wait::Failed(f) => {
            let (kind, what) = match f {
                Failure::CrashLooping => (BlockingKind::CrashLooping, "keeps restarting"),
                Failure::Unhealthy => (BlockingKind::Unhealthy, "fails its health check"),
                Failure::Restarted => (BlockingKind::SoakFailed, "restarted during its soak"),
                Failure::Silent | Failure::Attempt => {
                    (BlockingKind::SoakFailed, "sent no heartbeat during its soak")
                }
            };
            (
                kind,
                format!("{change} runs on the device and {what}: publish a fixed spec"),
                None,
                None,
            )
        }
    };
    Blocking {
        kind,
        change: change.to_owned(),
        message: cut(message, MAX_MESSAGE_CHARS),
        since,
        until,
    }
}
