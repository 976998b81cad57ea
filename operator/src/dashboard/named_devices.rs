//! The devices a FleetDeployment's or AgentRelease's status names as failing or stuck. The status has no list
//! field for them: the operator names up to ten in the messages of `Halted=True`, `Degraded=True` and
//! `Progressing=False` (reason `Stalled`), and a deployment's first failing device in `Degraded` (reason
//! `WorkloadsFailed`). This reads those lists back (the formats of `deployments::plan`), so a rollout page can
//! link each device; only words that are valid device ids become links, and a message that does not have the
//! shape yields nothing (the page prints every condition's message as it is anyway).

use crate::conditions::{
    DEGRADED, HALTED, MAX_MESSAGE_CHARS, PROGRESSING, REASON_DEVICES_FAILED, REASON_STALLED,
    REASON_WORKLOADS_FAILED,
};
use fleet_wire::DeviceId;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

/// One device a condition names, with what the message says about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Named {
    /// The device.
    pub device: DeviceId,
    /// The condition's type (`Halted`, `Degraded`, `Progressing`).
    pub condition: String,
    /// What the message says about the device, e.g. `agent restarted during its soak`, `failed: start-failed`.
    pub why: String,
}

/// Where a condition's list of devices starts, if it names devices.
fn list_of(c: &Condition) -> Option<&str> {
    let m = c.message.as_str();
    match (c.type_.as_str(), c.status.as_str(), c.reason.as_str()) {
        // `{what}: id (why), id (why) and N more; no further device gets the change…`
        (HALTED, "True", _) => Some(m.split_once(": ")?.1),
        // `N of M devices failed the agent upgrade: id failed: reason, … and N more; see each Device's…`
        (DEGRADED, "True", REASON_DEVICES_FAILED) => Some(m.split_once(": ")?.1),
        // `{counts}; stalled beyond their phase's bounds: id (preparing for 12m), …; see each Device's…`
        (PROGRESSING, "False", REASON_STALLED) => {
            Some(m.split_once("stalled beyond their phase's bounds: ")?.1)
        }
        _ => None,
    }
}

/// `text` without a trailing ` and N more`.
fn without_more(text: &str) -> &str {
    match text.rsplit_once(" and ") {
        Some((head, tail))
            if tail
                .strip_suffix(" more")
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())) =>
        {
            head
        }
        _ => text,
    }
}

/// Every device `conditions` name as failing or stuck, in the conditions' order (a device named by two
/// conditions is listed under each).
pub fn named(conditions: &[Condition]) -> Vec<Named> {
    let mut out = Vec::new();
    for c in conditions {
        if c.type_ == DEGRADED && c.status == "True" && c.reason == REASON_WORKLOADS_FAILED {
            // `N of M workloads failed on their devices; first: device: workload: error`
            if let Some((id, why)) = c
                .message
                .split_once("; first: ")
                .and_then(|(_, first)| first.split_once(": "))
            {
                if let Ok(device) = DeviceId::try_from(id) {
                    out.push(Named {
                        device,
                        condition: c.type_.clone(),
                        why: why.to_owned(),
                    });
                }
            }
            continue;
        }
        let Some(rest) = list_of(c) else { continue };
        let (list, complete) = match rest.split_once("; ") {
            Some((list, _)) => (list, true),
            // Cut at the message limit: the last item may be cut too.
            None => (
                rest,
                !(c.message.chars().count() >= MAX_MESSAGE_CHARS && rest.ends_with('…')),
            ),
        };
        let items: Vec<&str> = without_more(list).split(", ").collect();
        let keep = if complete {
            items.len()
        } else {
            items.len().saturating_sub(1)
        };
        for item in &items[..keep] {
            let (id, why) = item.split_once(' ').unwrap_or((item, ""));
            let Ok(device) = DeviceId::try_from(id) else {
                continue;
            };
            let why = why.trim();
            let why = why
                .strip_prefix('(')
                .and_then(|w| w.strip_suffix(')'))
                .unwrap_or(why);
            out.push(Named {
                device,
                condition: c.type_.clone(),
                why: why.to_owned(),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cond(type_: &str, status: &str, reason: &str, message: &str) -> Condition {
        serde_json::from_value(
            serde_json::json!({"type": type_, "status": status, "reason": reason,
            "message": message, "lastTransitionTime": "2026-12-01T10:00:00Z"}),
        )
        .unwrap()
    }

    fn ids(n: &[Named]) -> Vec<(&str, &str, &str)> {
        n.iter()
            .map(|n| (n.device.as_str(), n.condition.as_str(), n.why.as_str()))
            .collect()
    }

    #[test]
    fn the_operators_messages_name_their_devices() {
        let conds = [
            cond(
                "Halted",
                "True",
                "FailureThreshold",
                "2 failed devices, more than maxFailures (1): pi-1 (attempt failed), pi-2 (no heartbeat during \
                 its soak) and 3 more; no further device gets the change, updated devices keep it. To retry \
                 failed attempts set the annotation fleet.nationtech.io/retry=<new value>",
            ),
            cond(
                "Degraded",
                "True",
                "DevicesFailed",
                "2 of 5 devices failed the agent upgrade: pi-7 failed: start-failed, pi-8 rollback-failed; see \
                 each Device's status.agentUpgrade",
            ),
            cond(
                "Progressing",
                "False",
                "Stalled",
                "1 updated (1 healthy, 0 soaking), 1 updating, 0 pending, 0 failed; stalled beyond their \
                 phase's bounds: pi-4 (preparing for 12m); see each Device's status.agentUpgrade",
            ),
            cond("Ready", "True", "Placed", "pi-9 (attempt failed)"),
            cond("Halted", "False", "NotHalted", "nothing halts the rollout"),
        ];
        assert_eq!(
            ids(&named(&conds)),
            [
                ("pi-1", "Halted", "attempt failed"),
                ("pi-2", "Halted", "no heartbeat during its soak"),
                ("pi-7", "Degraded", "failed: start-failed"),
                ("pi-8", "Degraded", "rollback-failed"),
                ("pi-4", "Progressing", "preparing for 12m"),
            ]
        );
    }

    #[test]
    fn a_deployments_first_failing_device() {
        let c = cond(
            "Degraded",
            "True",
            "WorkloadsFailed",
            "1 of 3 workloads failed on their devices; first: device-1: web: image x could not be pulled: nope",
        );
        assert_eq!(
            ids(&named(&[c])),
            [(
                "device-1",
                "Degraded",
                "web: image x could not be pulled: nope"
            )]
        );
    }

    #[test]
    fn words_that_are_no_device_ids_and_cut_items_are_not_named() {
        let c = cond(
            "Halted",
            "True",
            "CanaryFailed",
            "a canary failed: <b>x</b> (attempt failed), pi-1 (attempt failed); no further device",
        );
        assert_eq!(ids(&named(&[c])), [("pi-1", "Halted", "attempt failed")]);
        // A message at the limit, cut inside its list: the cut item is dropped.
        let mut long = "a canary failed: ".to_owned();
        while long.chars().count() < MAX_MESSAGE_CHARS - 20 {
            long.push_str("pi-1 (attempt failed), ");
        }
        while long.chars().count() < MAX_MESSAGE_CHARS - 1 {
            long.push('p');
        }
        long.push('…');
        let n = named(&[cond("Halted", "True", "CanaryFailed", &long)]);
        assert!(!n.is_empty());
        assert!(n.iter().all(|n| n.device.as_str() == "pi-1"), "{n:?}");
    }
}
