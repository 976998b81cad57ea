//! The agent-upgrade intent: `AgentUpgradeAttempt`, written by the operator to `agent-upgrade-intent/<device>`.

use crate::digest::canonical_digest;
use crate::limits::ARTIFACT_MAX_BYTES;
use crate::{Architecture, Artifact, AttemptId, DeviceId, Sha256Hex, ValidationError, Version};
use serde::{Deserialize, Serialize};

/// Domain tag of [`AgentUpgradeAttempt::digest`].
pub const ATTEMPT_DIGEST_DOMAIN: &str = "harmony-fleet/agent-upgrade-attempt/v1";

/// A byte limit for an artifact: 1 byte up to the compiled ceiling [`ARTIFACT_MAX_BYTES`] (100 MiB).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "u64", into = "u64")]
pub struct ByteLimit(u64);

impl ByteLimit {
    /// The limit in bytes.
    pub fn bytes(self) -> u64 {
        self.0
    }
}

impl TryFrom<u64> for ByteLimit {
    type Error = ValidationError;
    fn try_from(n: u64) -> Result<Self, ValidationError> {
        if n == 0 || n > ARTIFACT_MAX_BYTES {
            Err(ValidationError::new(
                "byte limit",
                format!("{n} is outside 1..={ARTIFACT_MAX_BYTES} bytes (the 100 MiB ceiling)"),
            ))
        } else {
            Ok(Self(n))
        }
    }
}

impl From<ByteLimit> for u64 {
    fn from(b: ByteLimit) -> u64 {
        b.0
    }
}

/// One attempt to move one device's agent to a target version.
///
/// It carries no source version and no expiry: a device returning after months upgrades straight to the current
/// target. Every field is validated when the value is built or deserialized.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentUpgradeAttempt {
    /// The attempt's UUID; bound to [`Self::digest`] once accepted.
    pub attempt_id: AttemptId,
    /// The device this attempt is for.
    pub device_id: DeviceId,
    /// The version the candidate must report.
    pub target_version: Version,
    /// The architecture the artifact is built for.
    pub architecture: Architecture,
    /// Where to fetch the candidate.
    pub artifact: Artifact,
    /// Largest artifact accepted, in bytes.
    pub byte_limit: ByteLimit,
    /// SHA-256 of the artifact bytes (for OCI: of the single layer).
    pub sha256: Sha256Hex,
}

impl AgentUpgradeAttempt {
    /// Canonical content digest: binds the attempt id to everything else in the attempt.
    pub fn digest(&self) -> Sha256Hex {
        canonical_digest(ATTEMPT_DIGEST_DOMAIN, self)
    }

    /// Checks that this attempt is for `device` and `arch`; the agent rejects it otherwise.
    pub fn check_target(
        &self,
        device: &DeviceId,
        arch: Architecture,
    ) -> Result<(), ValidationError> {
        if &self.device_id != device {
            return Err(ValidationError::new(
                "device id",
                format!(
                    "attempt is for device {:?}, this is {:?}",
                    self.device_id.as_str(),
                    device.as_str()
                ),
            ));
        }
        if self.architecture != arch {
            return Err(ValidationError::new(
                "architecture",
                format!(
                    "attempt is for {}, this device is {}",
                    self.architecture, arch
                ),
            ));
        }
        Ok(())
    }

    /// The byte limit actually enforced: the attempt's, never above the compiled ceiling.
    pub fn effective_byte_limit(&self) -> u64 {
        self.byte_limit.bytes().min(ARTIFACT_MAX_BYTES)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;

    #[test]
    fn digest_binds_every_field() {
        let a = fixtures::attempt();
        let d = a.digest();
        let mut b = a.clone();
        b.target_version = Version::try_from("9.9.9").expect("v");
        assert_ne!(d, b.digest());
        let mut c = a.clone();
        c.byte_limit = ByteLimit::try_from(1).expect("limit");
        assert_ne!(d, c.digest());
        assert_eq!(d, a.clone().digest(), "deterministic");
    }

    #[test]
    fn byte_limits() {
        assert!(ByteLimit::try_from(ARTIFACT_MAX_BYTES).is_ok());
        assert!(ByteLimit::try_from(ARTIFACT_MAX_BYTES + 1).is_err());
        assert!(ByteLimit::try_from(0).is_err());
    }

    #[test]
    fn target_checks() {
        let a = fixtures::attempt();
        assert!(a.check_target(&a.device_id, Architecture::Arm64).is_ok());
        let other = DeviceId::try_from("device-2").expect("id");
        assert_eq!(
            a.check_target(&other, Architecture::Arm64)
                .expect_err("device")
                .field,
            "device id"
        );
        assert_eq!(
            a.check_target(&a.device_id, Architecture::Amd64)
                .expect_err("arch")
                .field,
            "architecture"
        );
    }

    #[test]
    fn rejects_unknown_fields_and_bad_values() {
        let mut v = serde_json::to_value(fixtures::attempt()).expect("json");
        v["extra"] = serde_json::json!(1);
        assert!(serde_json::from_value::<AgentUpgradeAttempt>(v).is_err());
        let mut v = serde_json::to_value(fixtures::attempt()).expect("json");
        v["byteLimit"] = serde_json::json!(ARTIFACT_MAX_BYTES + 1);
        let e = serde_json::from_value::<AgentUpgradeAttempt>(v)
            .expect_err("limit")
            .to_string();
        assert!(e.contains("byte limit"), "{e}");
    }
}
