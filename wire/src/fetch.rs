//! The download helper's contract. The root updater never talks to an artifact server itself: it starts
//! `fleet-fetch` as the unprivileged agent user, writes one [`FetchRequest`] line to its stdin, and reads the
//! artifact's bytes from its stdout (checking the byte limit and the SHA-256 again on its side). On failure the
//! helper exits non-zero and its last stderr line is one [`FetchFailure`]. The updater and the helper ship in
//! one package but a running updater may start a newer helper after a package upgrade, so the shapes are pinned
//! by golden files like every other contract.

use crate::{Artifact, BoundedText, ByteLimit, Sha256Hex, UpgradeReason, ValidationError};
use serde::{Deserialize, Serialize};

/// The version of this contract; a helper refuses a request of another version.
pub const FETCH_PROTOCOL: u32 = 1;
/// Largest PEM bundle of extra trusted roots, in bytes.
pub const CA_BUNDLE_MAX_BYTES: usize = 4 * 1024 * 1024;
/// Largest request line the helper reads, in bytes (a full CA bundle, JSON-escaped, and the rest).
pub const FETCH_REQUEST_MAX_BYTES: usize =
    CA_BUNDLE_MAX_BYTES + CA_BUNDLE_MAX_BYTES / 8 + 64 * 1024;
/// Largest failure line the updater reads from the helper's stderr, in bytes.
pub const FETCH_FAILURE_MAX_BYTES: usize = 8 * 1024;

/// What to download: exactly the parts of an attempt the network side needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FetchRequest {
    /// Always [`FETCH_PROTOCOL`].
    pub protocol: u32,
    /// Where the artifact is.
    pub artifact: Artifact,
    /// SHA-256 of the artifact bytes (for OCI: of the single layer).
    pub sha256: Sha256Hex,
    /// Largest artifact accepted, in bytes (already capped at the compiled ceiling by the updater).
    pub byte_limit: ByteLimit,
    /// Roots trusted besides the system store, as PEM text (the updater reads its configured bundle as root,
    /// so the bundle's file need not be readable by the helper's user).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra_roots_pem: Option<String>,
}

impl FetchRequest {
    /// A request of the current protocol.
    pub fn new(
        artifact: Artifact,
        sha256: Sha256Hex,
        byte_limit: ByteLimit,
        extra_roots_pem: Option<String>,
    ) -> Self {
        Self {
            protocol: FETCH_PROTOCOL,
            artifact,
            sha256,
            byte_limit,
            extra_roots_pem,
        }
    }

    /// Parses one request line, refusing oversize input, another protocol and an oversize CA bundle.
    pub fn parse(line: &[u8]) -> Result<Self, ValidationError> {
        let err = |why: String| ValidationError::new("fetch request", why);
        if line.len() > FETCH_REQUEST_MAX_BYTES {
            return Err(err(format!("longer than {FETCH_REQUEST_MAX_BYTES} bytes")));
        }
        let r: FetchRequest = serde_json::from_slice(line).map_err(|e| err(e.to_string()))?;
        if r.protocol != FETCH_PROTOCOL {
            return Err(err(format!(
                "protocol {} is not {FETCH_PROTOCOL}: the updater and fleet-fetch come from different packages",
                r.protocol
            )));
        }
        if r.extra_roots_pem
            .as_ref()
            .is_some_and(|p| p.len() > CA_BUNDLE_MAX_BYTES)
        {
            return Err(err(format!(
                "the CA bundle is larger than {CA_BUNDLE_MAX_BYTES} bytes"
            )));
        }
        Ok(r)
    }
}

/// Why the helper failed, as the public status will carry it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FetchFailure {
    /// The typed reason (`download-failed`, `artifact-too-large`, `digest-mismatch`, `artifact-invalid`).
    pub reason: UpgradeReason,
    /// For a person; never holds a URL's query string.
    pub message: BoundedText,
}

impl FetchFailure {
    /// Parses one failure line, refusing oversize input.
    pub fn parse(line: &[u8]) -> Result<Self, ValidationError> {
        let err = |why: String| ValidationError::new("fetch failure", why);
        if line.len() > FETCH_FAILURE_MAX_BYTES {
            return Err(err(format!("longer than {FETCH_FAILURE_MAX_BYTES} bytes")));
        }
        serde_json::from_slice(line).map_err(|e| err(e.to_string()))
    }

    /// The reason the updater records: one of the four download reasons; anything else a (possibly
    /// compromised) helper claims becomes `download-failed`.
    pub fn download_reason(&self) -> UpgradeReason {
        match self.reason {
            UpgradeReason::ArtifactTooLarge
            | UpgradeReason::DigestMismatch
            | UpgradeReason::ArtifactInvalid => self.reason,
            _ => UpgradeReason::DownloadFailed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;

    fn request() -> FetchRequest {
        let a = fixtures::attempt();
        FetchRequest::new(a.artifact, a.sha256, a.byte_limit, None)
    }

    #[test]
    fn request_parse_bounds_and_protocol() {
        let ok = serde_json::to_vec(&request()).expect("json");
        assert_eq!(FetchRequest::parse(&ok).expect("parses"), request());
        let mut other = request();
        other.protocol = 2;
        let e = FetchRequest::parse(&serde_json::to_vec(&other).expect("json")).expect_err("v2");
        assert!(e.to_string().contains("protocol 2"), "{e}");
        let mut big = request();
        big.extra_roots_pem = Some("x".repeat(CA_BUNDLE_MAX_BYTES + 1));
        let e = FetchRequest::parse(&serde_json::to_vec(&big).expect("json")).expect_err("big");
        assert!(e.to_string().contains("CA bundle"), "{e}");
        assert!(FetchRequest::parse(&vec![b' '; FETCH_REQUEST_MAX_BYTES + 1]).is_err());
        assert!(FetchRequest::parse(b"{\"protocol\":1}").is_err());
    }

    #[test]
    fn failure_parse_bounds() {
        let f = FetchFailure {
            reason: UpgradeReason::DigestMismatch,
            message: BoundedText::lossy("artifact digest mismatch"),
        };
        let line = serde_json::to_vec(&f).expect("json");
        assert_eq!(FetchFailure::parse(&line).expect("parses"), f);
        assert!(FetchFailure::parse(&vec![b' '; FETCH_FAILURE_MAX_BYTES + 1]).is_err());
        assert!(FetchFailure::parse(b"thread 'main' panicked").is_err());
        let liar = FetchFailure {
            reason: UpgradeReason::Quarantined,
            message: BoundedText::lossy("x"),
        };
        assert_eq!(liar.download_reason(), UpgradeReason::DownloadFailed);
        assert_eq!(f.download_reason(), UpgradeReason::DigestMismatch);
    }
}
