//! Validating an agent-upgrade intent for this device against the local bindings: reject, known or new. Pure.

use super::Bindings;
use fleet_wire::{AgentUpgradeAttempt, Architecture, AttemptId, DeviceId, Sha256Hex, Version};

/// What to do with an intent value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Refuse it: write a failed/rejected status, never send it to the updater.
    Reject {
        /// The attempt id, when it could be read.
        attempt_id: Option<AttemptId>,
        /// The target, when the attempt parsed.
        target_version: Option<Version>,
        /// The digest, when the attempt parsed.
        digest: Option<Sha256Hex>,
        /// Why, for a person.
        error: String,
    },
    /// Valid and already bound to this digest.
    Known(Box<AgentUpgradeAttempt>),
    /// Valid and never seen: bind it, publish `preparing`, send it.
    New(Box<AgentUpgradeAttempt>),
}

/// Validates an intent for this device and architecture against the local bindings. Pure.
pub fn evaluate(
    bytes: &[u8],
    device: &DeviceId,
    arch: Architecture,
    bindings: &Bindings,
) -> Decision {
    let reject =
        |attempt_id, attempt: Option<&AgentUpgradeAttempt>, error: String| Decision::Reject {
            attempt_id,
            target_version: attempt.map(|a| a.target_version.clone()),
            digest: attempt.map(AgentUpgradeAttempt::digest),
            error,
        };
    let value: serde_json::Value = match serde_json::from_slice(bytes) {
        Ok(v) => v,
        Err(e) => return reject(None, None, format!("intent is malformed JSON: {e}")),
    };
    let id = match value.get("attemptId").and_then(|v| v.as_str()) {
        None => return reject(None, None, "intent has no attemptId string".into()),
        Some(s) => match AttemptId::try_from(s) {
            Ok(id) => id,
            Err(e) => {
                return reject(
                    None,
                    None,
                    format!("intent has an invalid attempt UUID: {e}"),
                )
            }
        },
    };
    let attempt: AgentUpgradeAttempt = match serde_json::from_value(value) {
        Ok(a) => a,
        Err(e) => {
            return reject(
                Some(id),
                None,
                format!("intent is not a valid AgentUpgradeAttempt: {e}"),
            )
        }
    };
    if let Err(e) = attempt.check_target(device, arch) {
        return reject(Some(id), Some(&attempt), format!("intent rejected: {e}"));
    }
    let digest = attempt.digest();
    match bindings.digest_of(&id) {
        Some(d) if d != digest.as_str() => reject(
            Some(id),
            Some(&attempt),
            format!("attempt id {id} was already used with other content (digest {d}); a new attempt needs a new UUID"),
        ),
        Some(_) => Decision::Known(Box::new(attempt)),
        None => Decision::New(Box::new(attempt)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::relay::agent_upgrade::rejected_status;
    use fleet_wire::{fixtures, UpgradePhase, UpgradeReason};

    fn json(a: &AgentUpgradeAttempt) -> Vec<u8> {
        serde_json::to_vec(a).expect("json")
    }

    #[test]
    fn evaluation_table() {
        let d = fixtures::device();
        let a = fixtures::attempt();
        let arch = Architecture::Arm64;
        let empty = Bindings::default();
        let mut bound = Bindings::default();
        bound.bind(&a.attempt_id, &a.digest(), fixtures::t(0));
        let mut other = a.clone();
        other.target_version = Version::try_from("9.9.9").expect("v");
        let mut bad_uuid = serde_json::to_value(&a).expect("v");
        bad_uuid["attemptId"] = "not-a-uuid".into();
        let bad_uuid = serde_json::to_vec(&bad_uuid).expect("json");
        let is_reject = |dec: &Decision, needle: &str| match dec {
            Decision::Reject { error, .. } => error.contains(needle),
            _ => false,
        };
        assert!(matches!(
            evaluate(&json(&a), &d, arch, &empty),
            Decision::New(_)
        ));
        assert!(matches!(
            evaluate(&json(&a), &d, arch, &bound),
            Decision::Known(_)
        ));
        assert!(is_reject(
            &evaluate(&json(&other), &d, arch, &bound),
            "already used"
        ));
        assert!(is_reject(
            &evaluate(b"{not json", &d, arch, &empty),
            "malformed"
        ));
        assert!(is_reject(&evaluate(&bad_uuid, &d, arch, &empty), "UUID"));
        assert!(is_reject(
            &evaluate(&json(&a), &d, Architecture::Amd64, &empty),
            "architecture"
        ));
        let d2 = DeviceId::try_from("device-2").expect("id");
        assert!(is_reject(&evaluate(&json(&a), &d2, arch, &empty), "device"));
        let s = rejected_status(&d, &evaluate(b"[]", &d, arch, &empty), fixtures::t(1))
            .expect("status");
        assert_eq!(
            (s.phase, s.reason),
            (UpgradePhase::Failed, Some(UpgradeReason::Rejected))
        );
        assert!(s.error.is_some());
    }
}
