//! Status conditions, as pure functions: one desired condition per type; the transition time is kept while the
//! status stays the same, so an unchanged condition compares equal and causes no write.

use crate::crd::ConditionChange;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// A fleet object's status, which carries conditions.
pub trait WithConditions {
    /// The conditions.
    fn conditions(&self) -> &[Condition];
}

impl WithConditions for crate::crd::DeviceGroupStatus {
    fn conditions(&self) -> &[Condition] {
        &self.conditions
    }
}

impl WithConditions for crate::crd::PlacementStatus {
    fn conditions(&self) -> &[Condition] {
        &self.conditions
    }
}

/// Condition type: the object is doing what it asks for.
pub const READY: &str = "Ready";
/// Condition type: the operator can reach NATS.
pub const NATS_REACHABLE: &str = "NatsReachable";
/// Condition type (AgentRelease): True while targeted devices failed their current attempt; (FleetDeployment)
/// True while some of its workloads failed on their devices. Unlike the others it is bad when True, as Kubernetes' own `*Degraded`/`*Pressure` conditions are.
pub const DEGRADED: &str = "Degraded";
/// Condition type (AgentRelease): True while its rollout gives devices the change or waits for their soak; False
/// once complete or halted. Never a problem by itself (`Halted` is).
pub const PROGRESSING: &str = "Progressing";
/// Condition type (AgentRelease): True while the rollout is halted (a failed canary, too many failures); bad when
/// True, like `Degraded`.
pub const HALTED: &str = "Halted";
/// Condition type (AgentRelease): True while a newer AgentRelease has taken some of its targeted devices;
/// informational (the newer release is what a person asked for last).
pub const SUPERSEDED: &str = "Superseded";

/// Condition type (Device): the device is heard from ([`crate::liveness`]).
pub const ONLINE: &str = "Online";

/// Reason: placed (or resolved) successfully.
pub const REASON_PLACED: &str = "Placed";
/// Reason: the spec is invalid.
pub const REASON_INVALID_SPEC: &str = "InvalidSpec";
/// Reason (FleetDeployment): its workloads ask for hardware or privileges no WorkloadPolicy allows.
pub const REASON_NOT_ALLOWED: &str = "NotAllowed";
/// Reason: a group's source errored (never treated as an empty group).
pub const REASON_GROUP_SOURCE: &str = "GroupSourceError";
/// Reason: a workload name or a device is claimed by another object.
pub const REASON_CONFLICT: &str = "Conflict";
/// Reason: NATS answered.
pub const REASON_NATS_OK: &str = "Connected";
/// Reason: NATS did not answer.
pub const REASON_NATS_UNREACHABLE: &str = "NatsUnreachable";
/// Reason (Degraded=True): devices failed their current attempt.
pub const REASON_DEVICES_FAILED: &str = "DevicesFailed";
/// Reason (FleetDeployment, Degraded=True): some of its workloads failed on their devices.
pub const REASON_WORKLOADS_FAILED: &str = "WorkloadsFailed";
/// Reason (Degraded=False): no targeted device (or workload) has failed.
pub const REASON_NO_FAILURES: &str = "NoFailures";
/// Reason (Progressing=True): devices are being given the change or are updating.
pub const REASON_PROGRESSING: &str = "Progressing";
/// Reason (Progressing=True): waiting for updated devices' soak.
pub const REASON_SOAKING: &str = "Soaking";
/// Reason (Progressing=False): some devices stay in one upgrade phase longer than its bounds allow.
pub const REASON_STALLED: &str = "Stalled";
/// Reason (Progressing=False): every device in the rollout is done.
pub const REASON_COMPLETE: &str = "RolloutComplete";
/// Reason (Progressing=False): every device in the rollout is done and none runs the change (all failed).
pub const REASON_ROLLOUT_FAILED: &str = "RolloutFailed";
/// Reason (Progressing=False, Halted=False/True): the rollout is halted / not halted.
pub const REASON_HALTED: &str = "Halted";
/// Reason (Halted=False): nothing halts the rollout.
pub const REASON_NOT_HALTED: &str = "NotHalted";
/// Reason (Superseded): a newer AgentRelease targets some of the same devices / none does.
pub const REASON_NEWER_RELEASE: &str = "NewerRelease";
/// Reason (Device, Online=True): its heartbeats arrive.
pub const REASON_HEARTBEATING: &str = "Heartbeating";
/// Reason (Device, Online=False): no heartbeat for longer than [`crate::liveness::OFFLINE_AFTER`].
pub const REASON_SILENT: &str = "Silent";
/// Most characters of a condition message (the API server's own limit is 32 KiB; people read these).
pub const MAX_MESSAGE_CHARS: usize = 1024;

/// Most entries of a status's condition history.
pub const MAX_HISTORY: usize = 32;
/// Most characters of a message kept in the history (the current condition has the whole message).
pub const MAX_HISTORY_MESSAGE_CHARS: usize = 256;

/// A condition the operator wants to be true now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Want {
    /// Type.
    pub type_: &'static str,
    /// The condition's status: true for "True" (which is bad for [`DEGRADED`], see [`is_bad`]).
    pub ok: bool,
    /// PascalCase reason.
    pub reason: &'static str,
    /// Human message.
    pub message: String,
}

/// The `NatsReachable` condition: True, or False with the error (`None`: NATS answered).
pub fn nats_reachable(error: Option<&str>) -> Want {
    match error {
        None => Want {
            type_: NATS_REACHABLE,
            ok: true,
            reason: REASON_NATS_OK,
            message: "NATS KV answered".into(),
        },
        Some(e) => Want {
            type_: NATS_REACHABLE,
            ok: false,
            reason: REASON_NATS_UNREACHABLE,
            message: format!(
                "{e}; the operator retries; check the NATS URL and that NATS is running"
            ),
        },
    }
}

/// `s` shortened to `max` characters, ending in `…` when cut.
pub fn bounded(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_owned()
    } else {
        let mut t: String = s.chars().take(max - 1).collect();
        t.push('…');
        t
    }
}

/// `history` followed by one entry for each condition of `next` that is new or whose status or reason differs
/// from `existing` (a message alone, which carries counts, is no change), keeping the newest [`MAX_HISTORY`].
pub fn record(
    history: &[ConditionChange],
    existing: &[Condition],
    next: &[Condition],
    now: &Time,
) -> Vec<ConditionChange> {
    let changed = next.iter().filter(|c| {
        !existing
            .iter()
            .any(|o| o.type_ == c.type_ && o.status == c.status && o.reason == c.reason)
    });
    let mut out: Vec<ConditionChange> = history.to_vec();
    out.extend(changed.map(|c| ConditionChange {
        time: now.clone(),
        type_: c.type_.clone(),
        status: c.status.clone(),
        reason: c.reason.clone(),
        message: bounded(&c.message, MAX_HISTORY_MESSAGE_CHARS),
    }));
    let excess = out.len().saturating_sub(MAX_HISTORY);
    out.drain(..excess);
    out
}

/// Builds the condition list from `wants`, keeping `lastTransitionTime` of `existing` conditions whose status did
/// not change (so an unchanged list is equal to the existing one).
pub fn merge(
    existing: &[Condition],
    wants: &[Want],
    generation: Option<i64>,
    now: &Time,
) -> Vec<Condition> {
    wants
        .iter()
        .map(|w| {
            let status = if w.ok { "True" } else { "False" };
            let old = existing.iter().find(|c| c.type_ == w.type_);
            let last_transition_time = match old {
                Some(c) if c.status == status => c.last_transition_time.clone(),
                _ => now.clone(),
            };
            Condition {
                type_: w.type_.to_owned(),
                status: status.to_owned(),
                reason: w.reason.to_owned(),
                message: bounded(&w.message, MAX_MESSAGE_CHARS),
                observed_generation: generation,
                last_transition_time,
            }
        })
        .collect()
}

/// Whether a condition reports a problem: False for the positive types, True for `Degraded` and `Halted`;
/// `Progressing` only when False for `Stalled` (a finished rollout is no problem, a halt says so in `Halted`);
/// `Superseded` never.
pub fn is_bad(c: &Condition) -> bool {
    bad(&c.type_, &c.status, &c.reason)
}

/// [`is_bad`] for an entry of the condition history.
pub fn was_bad(c: &ConditionChange) -> bool {
    bad(&c.type_, &c.status, &c.reason)
}

fn bad(type_: &str, status: &str, reason: &str) -> bool {
    match type_ {
        DEGRADED | HALTED => status == "True",
        PROGRESSING => status == "False" && reason == REASON_STALLED,
        SUPERSEDED => false,
        _ => status == "False",
    }
}

/// Conditions that just turned bad (or appeared bad), see [`is_bad`]: each deserves a Warning event.
pub fn newly_failing<'a>(existing: &[Condition], next: &'a [Condition]) -> Vec<&'a Condition> {
    next.iter()
        .filter(|c| is_bad(c))
        .filter(|c| {
            !existing
                .iter()
                .any(|o| o.type_ == c.type_ && is_bad(o) && o.reason == c.reason)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Time {
        Time(s.parse().expect("time"))
    }
    fn want(ok: bool, reason: &'static str) -> Want {
        Want {
            type_: READY,
            ok,
            reason,
            message: "m".into(),
        }
    }

    #[test]
    fn merge_and_events_table() {
        let t0 = t("2026-11-30T01:00:00Z");
        let t1 = t("2026-11-30T02:00:00Z");
        let first = merge(&[], &[want(true, REASON_PLACED)], Some(1), &t0);
        assert_eq!(first[0].last_transition_time, t0);
        assert!(newly_failing(&[], &first).is_empty());
        // same status: identical list, no event
        let same = merge(&first, &[want(true, REASON_PLACED)], Some(1), &t1);
        assert_eq!(same, first);
        // turns False: new transition time and one event
        let bad = merge(&first, &[want(false, REASON_INVALID_SPEC)], Some(2), &t1);
        assert_eq!(bad[0].last_transition_time, t1);
        assert_eq!(newly_failing(&first, &bad).len(), 1);
        // stays False for the same reason: no second event
        let still = merge(&bad, &[want(false, REASON_INVALID_SPEC)], Some(2), &t0);
        assert_eq!(still[0].last_transition_time, t1);
        assert!(newly_failing(&bad, &still).is_empty());
        // False for another reason: an event again
        let other = merge(&bad, &[want(false, REASON_GROUP_SOURCE)], Some(2), &t0);
        assert_eq!(newly_failing(&bad, &other).len(), 1);
        // Degraded is bad when True: an event when it turns True, none when it is False
        let degraded = |ok: bool, reason| Want {
            type_: DEGRADED,
            ok,
            reason,
            message: "m".into(),
        };
        let calm = merge(&[], &[degraded(false, REASON_NO_FAILURES)], None, &t0);
        assert!(newly_failing(&[], &calm).is_empty());
        let hurt = merge(&calm, &[degraded(true, REASON_DEVICES_FAILED)], None, &t1);
        assert_eq!(newly_failing(&calm, &hurt).len(), 1);
        assert!(newly_failing(&hurt, &hurt).is_empty());
        // long messages are bounded
        let long = Want {
            message: "x".repeat(5000),
            ..want(true, REASON_PLACED)
        };
        assert_eq!(
            merge(&[], &[long], None, &t0)[0].message.chars().count(),
            MAX_MESSAGE_CHARS
        );
    }

    /// Which passes add to the history: a new condition, a status change, a reason change; not a message change.
    #[test]
    fn history_records_changes_only_and_stays_bounded() {
        let (t0, t1) = (t("2026-11-30T01:00:00Z"), t("2026-11-30T02:00:00Z"));
        let first = merge(&[], &[want(true, REASON_PLACED)], Some(1), &t0);
        let h = record(&[], &[], &first, &t0);
        assert_eq!(h.len(), 1);
        assert_eq!(
            (h[0].status.as_str(), h[0].reason.as_str()),
            ("True", "Placed")
        );
        assert_eq!(h[0].time, t0);
        // Same status and reason, another message: nothing recorded.
        let msg = merge(
            &first,
            &[Want {
                message: "other".into(),
                ..want(true, REASON_PLACED)
            }],
            Some(1),
            &t1,
        );
        assert_eq!(record(&h, &first, &msg, &t1), h);
        // A status change, then a reason change with the same status: one entry each, oldest first.
        let bad = merge(&msg, &[want(false, REASON_INVALID_SPEC)], Some(2), &t1);
        let h2 = record(&h, &msg, &bad, &t1);
        assert_eq!(h2.len(), 2);
        assert_eq!(
            (h2[1].status.as_str(), h2[1].reason.as_str(), &h2[1].time),
            ("False", "InvalidSpec", &t1)
        );
        let other = merge(&bad, &[want(false, REASON_GROUP_SOURCE)], Some(2), &t1);
        assert_eq!(record(&h2, &bad, &other, &t1)[2].reason, "GroupSourceError");
        // Bounded: the newest MAX_HISTORY stay, and long messages are cut.
        let mut h = Vec::new();
        let mut cur: Vec<Condition> = Vec::new();
        for i in 0..(MAX_HISTORY + 5) {
            let w = Want {
                message: "y".repeat(1000),
                ..want(i % 2 == 0, REASON_PLACED)
            };
            let next = merge(&cur, &[w], None, &t0);
            h = record(&h, &cur, &next, &t0);
            cur = next;
        }
        assert_eq!(h.len(), MAX_HISTORY);
        assert_eq!(
            h.last().map(|c| c.status.as_str()),
            Some("True"),
            "the newest is kept"
        );
        assert_eq!(h[0].message.chars().count(), MAX_HISTORY_MESSAGE_CHARS);
    }
}
