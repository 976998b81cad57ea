//! Agent releases, as pure functions: which attempt (if any) a device needs, and how a release's devices are
//! doing. The CAS write itself is in [`crate::kv`].

use crate::fleet::rollout::Observed;
use crate::fleet::validate::Build;
use fleet_wire::{
    AgentUpgradeAttempt, AgentUpgradeStatus, AttemptId, Capability, DeviceId, DeviceInfo,
    Heartbeat, UpgradePhase,
};
use sha2::{Digest, Sha256};

/// Annotation on an AgentRelease that retries its failed devices: each new value gives every device whose
/// current attempt of the release `failed` one new attempt (`rollback-failed` devices are never retried). The
/// new attempt's id is derived from the release, the value and the device ([`retry_id`]), so the retry happens
/// once per value, across passes, replicas and operator restarts.
pub const RETRY_ANNOTATION: &str = "fleet.nationtech.io/retry";

/// The attempt id of `device`'s retry for the annotation value `token` of the release `release_uid`: a UUID
/// (version 4 layout) from SHA-256 of the three, so every replica and pass derives the same one.
pub fn retry_id(release_uid: &str, token: &str, device: &DeviceId) -> AttemptId {
    let mut h = Sha256::new();
    for part in [release_uid, token, device.as_str()] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    let digest = h.finalize();
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    let uuid = uuid::Builder::from_random_bytes(bytes).into_uuid();
    // A v4-layout UUID from 16 digest bytes is never nil and always canonical.
    AttemptId::try_from(uuid.hyphenated().to_string()).unwrap_or_else(|_| AttemptId::new_random())
}

/// The status the agent reported for `current`, if it is about that attempt.
fn status_of<'a>(
    current: Option<&AgentUpgradeAttempt>,
    status: Option<&'a AgentUpgradeStatus>,
) -> Option<&'a AgentUpgradeStatus> {
    let current = current?;
    status.filter(|s| s.attempt_id == Some(current.attempt_id))
}

/// A retry of a failed device's current attempt: the same attempt under [`retry_id`], when `retry` (that id) is
/// set, the current attempt `failed` (not `rollback-failed`) and is not already that retry.
pub fn retry_attempt(
    decision: &IntentDecision,
    current: Option<&AgentUpgradeAttempt>,
    status: Option<&AgentUpgradeStatus>,
    retry: Option<AttemptId>,
) -> Option<AgentUpgradeAttempt> {
    let (IntentDecision::Keep, Some(cur), Some(id)) = (decision, current, retry) else {
        return None;
    };
    let failed = status_of(current, status).is_some_and(|s| s.phase == UpgradePhase::Failed);
    (failed && cur.attempt_id != id).then(|| AgentUpgradeAttempt {
        attempt_id: id,
        ..cur.clone()
    })
}

/// What NATS says about a device for its release's rollout; `None` when the device cannot take the release
/// (nothing known yet, no build for it, incapable): such a device is not part of the rollout. `current` is the
/// device's intent when it is an attempt of this release's build (see [`attempt_matches`]).
pub fn observe(
    decision: &IntentDecision,
    current: Option<&AgentUpgradeAttempt>,
    status: Option<&AgentUpgradeStatus>,
    info: Option<&DeviceInfo>,
    heartbeat: Option<&Heartbeat>,
) -> Option<Observed> {
    let mine = status_of(current, status);
    let phase = mine.map(|s| s.phase);
    Some(match decision {
        IntentDecision::Unknown | IntentDecision::NoBuild | IntentDecision::Incapable => {
            return None
        }
        IntentDecision::Write(_) => Observed::Pending,
        IntentDecision::Keep | IntentDecision::UpToDate => match (mine, phase) {
            (Some(s), Some(UpgradePhase::Complete)) => {
                let version = current.map(|a| &a.target_version);
                Observed::Committed {
                    at: s.phase_changed_at,
                    agent_started: info.map(|i| i.published_at),
                    heartbeat: heartbeat
                        .filter(|h| Some(&h.agent_version) == version)
                        .map(|h| h.at),
                    // Restarts of the new version only: the old agent's info says nothing about it.
                    restarts: info
                        .filter(|i| Some(&i.agent_version) == version)
                        .and_then(|i| i.restarts),
                }
            }
            (_, Some(UpgradePhase::Failed | UpgradePhase::RollbackFailed)) => Observed::Failed,
            // Up to date with no report of this attempt (or none written): it ran the version before.
            (None, _) if *decision == IntentDecision::UpToDate => Observed::Current,
            _ => Observed::Updating(mine.map(|s| (s.phase, s.phase_changed_at))),
        },
    })
}

/// What to do about one device's `agent-upgrade-intent` key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IntentDecision {
    /// The device already runs the desired version.
    UpToDate,
    /// Nothing is known about the device yet (no device info): wait.
    Unknown,
    /// The release has no build for the device's architecture.
    NoBuild,
    /// The device's agent does not advertise `AgentUpgradeV1` (or `OciArtifactsV1` for an `oci://` artifact).
    Incapable,
    /// The current intent already is an attempt for this build: keep it, whatever its status (a failed attempt
    /// is reused, never retried automatically).
    Keep,
    /// Write this new attempt (new UUID).
    Write(AgentUpgradeAttempt),
}

/// True when `a` asks for exactly `build` on `device`.
pub fn attempt_matches(a: &AgentUpgradeAttempt, device: &DeviceId, build: &Build) -> bool {
    &a.device_id == device
        && a.architecture == build.architecture
        && a.target_version == build.version
        && a.artifact == build.artifact
        && a.sha256 == build.sha256
        && a.byte_limit == build.byte_limit
}

/// Decides one device's intent from its reported info, the release's builds and the current intent.
pub fn decide_intent(
    device: &DeviceId,
    info: Option<&DeviceInfo>,
    builds: &[Build],
    current: Option<&AgentUpgradeAttempt>,
    new_id: impl FnOnce() -> AttemptId,
) -> IntentDecision {
    let Some(info) = info else {
        return IntentDecision::Unknown;
    };
    let Some(build) = builds.iter().find(|b| b.architecture == info.architecture) else {
        return IntentDecision::NoBuild;
    };
    if info.agent_version == build.version {
        return IntentDecision::UpToDate;
    }
    let needs = match build.artifact {
        fleet_wire::Artifact::Https(_) => Capability::AgentUpgradeV1,
        fleet_wire::Artifact::Oci(_) => Capability::OciArtifactsV1,
    };
    if !info.capabilities.contains(&Capability::AgentUpgradeV1)
        || !info.capabilities.contains(&needs)
    {
        return IntentDecision::Incapable;
    }
    if current.is_some_and(|a| attempt_matches(a, device, build)) {
        return IntentDecision::Keep;
    }
    IntentDecision::Write(AgentUpgradeAttempt {
        attempt_id: new_id(),
        device_id: device.clone(),
        target_version: build.version.clone(),
        architecture: build.architecture,
        artifact: build.artifact.clone(),
        byte_limit: build.byte_limit,
        sha256: build.sha256.clone(),
    })
}

/// Counts for an AgentRelease's status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReleaseCounts {
    /// Devices targeted.
    pub targeted: u32,
    /// Running the desired version.
    pub up_to_date: u32,
    /// Current attempt failed or its rollback failed.
    pub failed: u32,
    /// Current attempt not terminal yet (or written and not yet picked up).
    pub in_progress: u32,
}

/// Aggregates one device into `counts`: its decision, and the status the agent reported for the current attempt.
/// Returns true when the device counted as failed.
pub fn count_device(
    counts: &mut ReleaseCounts,
    decision: &IntentDecision,
    current: Option<&AgentUpgradeAttempt>,
    status: Option<&AgentUpgradeStatus>,
) -> bool {
    counts.targeted += 1;
    match decision {
        IntentDecision::UpToDate => counts.up_to_date += 1,
        IntentDecision::Write(_) => counts.in_progress += 1,
        IntentDecision::Keep => {
            let same = |s: &&AgentUpgradeStatus| {
                s.attempt_id.is_some() && s.attempt_id == current.map(|a| a.attempt_id)
            };
            match status.filter(same).map(|s| s.phase) {
                Some(UpgradePhase::Failed | UpgradePhase::RollbackFailed) => {
                    counts.failed += 1;
                    return true;
                }
                _ => counts.in_progress += 1,
            }
        }
        IntentDecision::Unknown | IntentDecision::NoBuild | IntentDecision::Incapable => {}
    }
    false
}

/// How a failed device reads in a condition message: its id, phase and typed reason (`dev-1 failed: probe-failed`).
pub fn describe_failure(device: &DeviceId, status: Option<&AgentUpgradeStatus>) -> String {
    let word = |v: serde_json::Result<serde_json::Value>| {
        v.ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default()
    };
    match status {
        Some(s) => match s.reason {
            Some(r) => format!(
                "{device} {}: {}",
                word(serde_json::to_value(s.phase)),
                word(serde_json::to_value(r))
            ),
            None => format!("{device} {}", word(serde_json::to_value(s.phase))),
        },
        None => device.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_wire::{fixtures, Architecture, ByteLimit, Version};

    fn build(arch: Architecture, v: &str) -> Build {
        let a = fixtures::attempt();
        Build {
            architecture: arch,
            version: Version::try_from(v).expect("v"),
            artifact: a.artifact,
            sha256: a.sha256,
            byte_limit: ByteLimit::try_from(1_000_000).expect("limit"),
        }
    }
    fn info(arch: Architecture, v: &str, caps: &[Capability]) -> DeviceInfo {
        let mut i = fixtures::device_info();
        i.architecture = arch;
        i.agent_version = Version::try_from(v).expect("v");
        i.capabilities = caps.to_vec();
        i
    }
    fn fixed_id() -> AttemptId {
        AttemptId::try_from("6f1c1a2e-8a51-4a3b-9a70-0e0c6c4e2f11").expect("uuid")
    }

    #[test]
    fn decision_table() {
        let dev = fixtures::device();
        let builds = vec![
            build(Architecture::Arm64, "2.0.0"),
            build(Architecture::Amd64, "2.0.1"),
        ];
        let up = [Capability::AgentUpgradeV1];
        let matching = match decide_intent(
            &dev,
            Some(&info(Architecture::Arm64, "1.0.0", &up)),
            &builds,
            None,
            fixed_id,
        ) {
            IntentDecision::Write(a) => a,
            other => panic!("{other:?}"),
        };
        let mut stale = matching.clone();
        stale.target_version = Version::try_from("1.5.0").expect("v");
        let mut other_device = matching.clone();
        other_device.device_id = DeviceId::try_from("other").expect("id");

        let cases: Vec<(Option<DeviceInfo>, Option<&AgentUpgradeAttempt>, &str)> = vec![
            (None, None, "Unknown"),
            (
                Some(info(Architecture::Arm64, "2.0.0", &up)),
                None,
                "UpToDate",
            ),
            (
                Some(info(Architecture::Arm64, "2.0.0", &up)),
                Some(&stale),
                "UpToDate",
            ),
            (
                Some(info(Architecture::Amd64, "2.0.1", &up)),
                None,
                "UpToDate",
            ),
            (
                Some(info(Architecture::Arm64, "1.0.0", &[])),
                None,
                "Incapable",
            ),
            (Some(info(Architecture::Arm64, "1.0.0", &up)), None, "Write"),
            // the same build already written (failed or not): reused, not retried
            (
                Some(info(Architecture::Arm64, "1.0.0", &up)),
                Some(&matching),
                "Keep",
            ),
            // a downgrade is a difference too
            (
                Some(info(Architecture::Arm64, "3.0.0", &up)),
                Some(&matching),
                "Keep",
            ),
            // another build or another device's attempt: replaced with a new attempt
            (
                Some(info(Architecture::Arm64, "1.0.0", &up)),
                Some(&stale),
                "Write",
            ),
            (
                Some(info(Architecture::Arm64, "1.0.0", &up)),
                Some(&other_device),
                "Write",
            ),
        ];
        for (i, (inf, cur, want)) in cases.into_iter().enumerate() {
            let got = decide_intent(&dev, inf.as_ref(), &builds, cur, fixed_id);
            let name = match &got {
                IntentDecision::UpToDate => "UpToDate",
                IntentDecision::Unknown => "Unknown",
                IntentDecision::NoBuild => "NoBuild",
                IntentDecision::Incapable => "Incapable",
                IntentDecision::Keep => "Keep",
                IntentDecision::Write(a) => {
                    assert!(attempt_matches(a, &dev, &builds[0]), "case {i}");
                    "Write"
                }
            };
            assert_eq!(name, want, "case {i}");
        }
        let only_amd = vec![build(Architecture::Amd64, "2.0.1")];
        assert_eq!(
            decide_intent(
                &dev,
                Some(&info(Architecture::Arm64, "1.0.0", &up)),
                &only_amd,
                None,
                fixed_id
            ),
            IntentDecision::NoBuild
        );
    }

    #[test]
    fn counts_table() {
        let a = fixtures::attempt();
        let mut failed = fixtures::failed_status();
        failed.attempt_id = Some(a.attempt_id);
        let mut running = fixtures::upgrade_status();
        running.attempt_id = Some(a.attempt_id);
        running.phase = UpgradePhase::Preparing;
        let mut old_failed = fixtures::failed_status();
        old_failed.attempt_id = Some(AttemptId::new_random());
        let mut c = ReleaseCounts::default();
        let counted_failed = [
            count_device(&mut c, &IntentDecision::UpToDate, None, None),
            count_device(&mut c, &IntentDecision::Keep, Some(&a), Some(&failed)),
            count_device(&mut c, &IntentDecision::Keep, Some(&a), Some(&running)),
            count_device(&mut c, &IntentDecision::Keep, Some(&a), Some(&old_failed)),
            count_device(&mut c, &IntentDecision::Write(a.clone()), None, None),
            count_device(&mut c, &IntentDecision::Unknown, None, None),
        ];
        assert_eq!(counted_failed, [false, true, false, false, false, false]);
        let dev = DeviceId::try_from("dev-1").expect("id");
        let text = describe_failure(&dev, Some(&failed));
        assert_eq!(text, "dev-1 failed: start-failed");
        assert_eq!(describe_failure(&dev, None), "dev-1");
        assert_eq!(
            c,
            ReleaseCounts {
                targeted: 6,
                up_to_date: 1,
                failed: 1,
                in_progress: 3
            }
        );
    }
}
