//! Upgrade relay logic without I/O to NATS or the updater: validating an intent, the durable attempt-UUID →
//! digest bindings, and the statuses the agent writes itself (rejected, preparing, stopping).

use fleet_wire::{
    AgentUpgradeAttempt, AgentUpgradeStatus, Architecture, AttemptId, BoundedText, DeviceId,
    Sha256Hex, Timestamp, Transitions, UpgradePhase, UpgradeReason, Version,
};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Most bindings kept; the oldest are dropped first.
pub const MAX_BINDINGS: usize = 256;
/// Largest bindings file read, in bytes.
pub const BINDINGS_MAX_BYTES: u64 = 1024 * 1024;

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

/// One binding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Binding {
    /// The attempt UUID.
    pub attempt_id: String,
    /// Its canonical digest.
    pub digest: String,
    /// When it was bound.
    pub bound_at: Timestamp,
    /// Whether the updater accepted the request for it.
    #[serde(default)]
    pub accepted: bool,
}

/// The bindings file: `{"version":1,"bindings":[...]}`. Unknown fields are tolerated (an older release must read
/// what a newer one wrote, since rollback changes only the executable).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bindings {
    /// Format version (1).
    #[serde(default = "one")]
    pub version: u32,
    /// Bindings, oldest first.
    #[serde(default)]
    pub bindings: Vec<Binding>,
}

fn one() -> u32 {
    1
}

impl Bindings {
    /// The digest bound to `id`.
    pub fn digest_of(&self, id: &AttemptId) -> Option<&str> {
        let id = id.to_string();
        self.bindings
            .iter()
            .find(|b| b.attempt_id == id)
            .map(|b| b.digest.as_str())
    }

    /// The binding of `id`.
    pub fn get(&self, id: &AttemptId) -> Option<&Binding> {
        let id = id.to_string();
        self.bindings.iter().find(|b| b.attempt_id == id)
    }

    /// Binds `id` to `digest` (no-op when already bound), dropping the oldest beyond [`MAX_BINDINGS`].
    pub fn bind(&mut self, id: &AttemptId, digest: &Sha256Hex, at: Timestamp) {
        if self.digest_of(id).is_some() {
            return;
        }
        self.bindings.push(Binding {
            attempt_id: id.to_string(),
            digest: digest.to_string(),
            bound_at: at,
            accepted: false,
        });
        let excess = self.bindings.len().saturating_sub(MAX_BINDINGS);
        self.bindings.drain(..excess);
    }

    /// Marks `id` accepted by the updater.
    pub fn mark_accepted(&mut self, id: &AttemptId) {
        let id = id.to_string();
        for b in &mut self.bindings {
            if b.attempt_id == id {
                b.accepted = true;
            }
        }
    }

    /// Reads the file; a missing file is empty bindings, an unreadable one an error.
    pub fn load(path: &Path) -> Result<Bindings, String> {
        match std::fs::metadata(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Bindings::default()),
            Err(e) => return Err(format!("{}: {e}", path.display())),
            Ok(m) if m.len() > BINDINGS_MAX_BYTES => {
                return Err(format!(
                    "{} is larger than {BINDINGS_MAX_BYTES} bytes",
                    path.display()
                ))
            }
            Ok(_) => {}
        }
        let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        serde_json::from_slice(&bytes).map_err(|e| format!("{} is corrupt: {e}", path.display()))
    }

    /// Writes the file atomically and durably (the tree's one atomic write, `fleet_wire::durable`).
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let bytes = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        fleet_wire::durable::write_atomic(path, &bytes, 0o640)
    }
}

/// A fresh status for an attempt (or for no parsed attempt) in `phase`.
pub fn new_status(
    device: &DeviceId,
    attempt_id: Option<AttemptId>,
    target_version: Option<Version>,
    digest: Option<Sha256Hex>,
    phase: UpgradePhase,
    reason: Option<UpgradeReason>,
    now: Timestamp,
) -> AgentUpgradeStatus {
    let mut s = AgentUpgradeStatus {
        device_id: device.clone(),
        attempt_id,
        target_version,
        attempt_digest: digest,
        phase,
        reason,
        detail: None,
        error: None,
        attempt_started_at: now,
        phase_changed_at: now,
        drain_duration_ms: None,
        boot_id: crate::device::boot_id(),
        invocation_id: None,
        journal_unit: None,
        transitions: Transitions::default(),
    };
    s.enter(phase, now, reason);
    s
}

/// The status for a rejected intent: phase `failed`, reason `rejected`, with the error.
pub fn rejected_status(
    device: &DeviceId,
    d: &Decision,
    now: Timestamp,
) -> Option<AgentUpgradeStatus> {
    let Decision::Reject {
        attempt_id,
        target_version,
        digest,
        error,
    } = d
    else {
        return None;
    };
    let mut s = new_status(
        device,
        *attempt_id,
        target_version.clone(),
        digest.clone(),
        UpgradePhase::Failed,
        Some(UpgradeReason::Rejected),
        now,
    );
    s.error = Some(BoundedText::lossy(error));
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_wire::fixtures;

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

    #[test]
    fn bindings_round_trip_and_tolerate_unknown_fields() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("state/upgrade-bindings.json");
        assert_eq!(Bindings::load(&p).expect("missing"), Bindings::default());
        let a = fixtures::attempt();
        let mut b = Bindings::default();
        b.bind(&a.attempt_id, &a.digest(), fixtures::t(0));
        b.mark_accepted(&a.attempt_id);
        b.save(&p).expect("save");
        assert_eq!(Bindings::load(&p).expect("load"), b);
        let newer = r#"{"version":2,"future":1,"bindings":[{"attemptId":"x","digest":"y","boundAt":"2026-11-30T01:00:00Z","extra":true}]}"#;
        std::fs::write(&p, newer).expect("write");
        assert_eq!(Bindings::load(&p).expect("newer").bindings.len(), 1);
        std::fs::write(&p, "{").expect("write");
        assert!(Bindings::load(&p).is_err());
    }
}
