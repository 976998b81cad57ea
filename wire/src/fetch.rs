//! The download helper's contract. The root updater never talks to an artifact server itself: it starts
//! `fleet-fetch` as the unprivileged agent user, writes one [`FetchRequest`] line to its stdin, and reads the
//! artifact's bytes from its stdout (checking the byte limit and the SHA-256 again on its side). On failure the
//! helper exits non-zero and its last stderr line is one [`FetchFailure`]. The updater and the helper ship in
//! one package but a running updater may start a newer helper after a package upgrade, so the shapes are pinned
//! by golden files like every other contract.
//!
//! Protocol 2 adds resumable downloads: the request may carry a [`ResumePoint`] (the bytes the updater already
//! holds and the validators of the response they came from), and the helper's stdout starts with one
//! [`ResumePoint`] line saying where the bytes that follow begin (the requested offset, or 0 when the server
//! ignored the range or the content changed) before the raw bytes. A protocol-1 request gets the raw bytes only.

use crate::{Artifact, BoundedText, ByteLimit, Sha256Hex, UpgradeReason, ValidationError};
use serde::{Deserialize, Serialize};

/// The version of this contract the updater speaks; a helper serves this one and [`FETCH_PROTOCOL_V1`].
pub const FETCH_PROTOCOL: u32 = 2;
/// The first version (no resume, no start line), still served for an updater started before a package upgrade.
pub const FETCH_PROTOCOL_V1: u32 = 1;
/// Largest [`ResumePoint`] line (the helper's start line), in bytes.
pub const RESUME_POINT_MAX_BYTES: usize = 4 * 1024;
/// Longest `ETag` or `Last-Modified` value kept as a validator, in bytes.
pub const VALIDATOR_MAX_BYTES: usize = 512;
/// Largest PEM bundle of extra trusted roots, in bytes.
pub const CA_BUNDLE_MAX_BYTES: usize = 4 * 1024 * 1024;
/// Largest request line the helper reads, in bytes (a full CA bundle, JSON-escaped, and the rest).
pub const FETCH_REQUEST_MAX_BYTES: usize =
    CA_BUNDLE_MAX_BYTES + CA_BUNDLE_MAX_BYTES / 8 + 64 * 1024;
/// Largest failure line the updater reads from the helper's stderr, in bytes.
pub const FETCH_FAILURE_MAX_BYTES: usize = 8 * 1024;
/// Lowest bandwidth cap accepted, in bytes per second (1 KiB/s): below it a cap is taken for a mistake (kbit/s or
/// KiB/s written where bytes/s are meant) rather than slept through.
pub const MAX_BYTES_PER_SEC_FLOOR: u64 = 1024;

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
    /// Protocol 2: resume after the bytes the updater already holds (a `Range` request guarded by `If-Range`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume: Option<ResumePoint>,
    /// Protocol 2: what is left of the whole fetch's deadline (all tries), in milliseconds; the helper never
    /// waits longer than this nor than `HTTPS_REQUEST_TIMEOUT`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_left_ms: Option<u64>,
    /// Protocol 2: the bandwidth cap of the artifact body, in bytes per second (the updater's
    /// `download_max_bytes_per_sec`), at least [`MAX_BYTES_PER_SEC_FLOOR`]; absent: no cap. A helper that predates
    /// the cap refuses the key (an unknown field), so only an updater and helper of one package send and serve it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes_per_sec: Option<u64>,
}

/// What identifies one version of an artifact's content at its server, so that bytes of one response are
/// never spliced to bytes of another: the total size and the `ETag` / `Last-Modified` the server sent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Validators {
    /// The whole artifact's size in bytes, when the server declared it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total: Option<u64>,
    /// The `ETag` header as sent (quotes included; a weak `W/` tag is kept but never used in `If-Range`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etag: Option<String>,
    /// The `Last-Modified` header as sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_modified: Option<String>,
}

impl Validators {
    /// Checks the bounds: header values of visible ASCII and spaces, at most [`VALIDATOR_MAX_BYTES`].
    pub fn validate(&self) -> Result<(), ValidationError> {
        for (name, v) in [("etag", &self.etag), ("lastModified", &self.last_modified)] {
            if let Some(v) = v {
                if v.is_empty()
                    || v.len() > VALIDATOR_MAX_BYTES
                    || !v.bytes().all(|b| (0x20..0x7f).contains(&b))
                {
                    return Err(ValidationError::new(
                        "validators",
                        format!("{name} is empty, longer than {VALIDATOR_MAX_BYTES} bytes or not visible ASCII"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Whether the content these validators name can be the one `other` names: every validator both sides
    /// know must be equal, and at least one must be known on both sides.
    pub fn same_content(&self, other: &Validators) -> bool {
        let pairs = [
            (
                self.total.map(|t| t.to_string()),
                other.total.map(|t| t.to_string()),
            ),
            (self.etag.clone(), other.etag.clone()),
            (self.last_modified.clone(), other.last_modified.clone()),
        ];
        let mut compared = 0;
        for (a, b) in pairs {
            if let (Some(a), Some(b)) = (a, b) {
                if a != b {
                    return false;
                }
                compared += 1;
            }
        }
        compared > 0
    }
}

/// Where a download's bytes begin, with the validators of the response they come from: in a request, the
/// bytes the updater holds; as the helper's start line, where the bytes that follow begin.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ResumePoint {
    /// Bytes already held (request) or skipped (start line): 0 means the whole artifact follows.
    pub offset: u64,
    /// The content's validators.
    pub validators: Validators,
}

impl ResumePoint {
    /// Parses one start line, refusing oversize input and out-of-bound validators.
    pub fn parse(line: &[u8]) -> Result<Self, ValidationError> {
        let err = |why: String| ValidationError::new("resume point", why);
        if line.len() > RESUME_POINT_MAX_BYTES {
            return Err(err(format!("longer than {RESUME_POINT_MAX_BYTES} bytes")));
        }
        let p: ResumePoint = serde_json::from_slice(line).map_err(|e| err(e.to_string()))?;
        p.validators.validate()?;
        if p.validators.total.is_some_and(|t| t < p.offset) {
            return Err(err("the offset lies beyond the total size".into()));
        }
        Ok(p)
    }
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
            resume: None,
            time_left_ms: None,
            max_bytes_per_sec: None,
        }
    }

    /// Parses one request line, refusing oversize input, an unknown protocol, protocol-2 fields in a protocol-1
    /// request, bad resume validators and an oversize CA bundle.
    pub fn parse(line: &[u8]) -> Result<Self, ValidationError> {
        let err = |why: String| ValidationError::new("fetch request", why);
        if line.len() > FETCH_REQUEST_MAX_BYTES {
            return Err(err(format!("longer than {FETCH_REQUEST_MAX_BYTES} bytes")));
        }
        let r: FetchRequest = serde_json::from_slice(line).map_err(|e| err(e.to_string()))?;
        if r.protocol != FETCH_PROTOCOL && r.protocol != FETCH_PROTOCOL_V1 {
            return Err(err(format!(
                "protocol {} is neither {FETCH_PROTOCOL} nor {FETCH_PROTOCOL_V1}: the updater and fleet-fetch come from different packages",
                r.protocol
            )));
        }
        if r.protocol == FETCH_PROTOCOL_V1
            && (r.resume.is_some() || r.time_left_ms.is_some() || r.max_bytes_per_sec.is_some())
        {
            return Err(err(format!(
                "resume, timeLeftMs and maxBytesPerSec need protocol {FETCH_PROTOCOL}"
            )));
        }
        if let Some(cap) = r.max_bytes_per_sec.filter(|c| *c < MAX_BYTES_PER_SEC_FLOOR) {
            return Err(err(format!(
                "maxBytesPerSec {cap} is below the floor of {MAX_BYTES_PER_SEC_FLOOR} bytes per second"
            )));
        }
        if let Some(p) = &r.resume {
            p.validators.validate()?;
            if p.offset > r.byte_limit.bytes() {
                return Err(err("the resume offset lies beyond the byte limit".into()));
            }
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
    /// Protocol 2: the failure may pass (a dropped connection, a time-out, a 5xx): the updater tries again
    /// with a resume point. Absent means false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub transient: bool,
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
        other.protocol = 3;
        let e = FetchRequest::parse(&serde_json::to_vec(&other).expect("json")).expect_err("v3");
        assert!(e.to_string().contains("protocol 3"), "{e}");
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
            transient: false,
        };
        let line = serde_json::to_vec(&f).expect("json");
        assert_eq!(FetchFailure::parse(&line).expect("parses"), f);
        assert!(FetchFailure::parse(&vec![b' '; FETCH_FAILURE_MAX_BYTES + 1]).is_err());
        assert!(FetchFailure::parse(b"thread 'main' panicked").is_err());
        let liar = FetchFailure {
            reason: UpgradeReason::Quarantined,
            message: BoundedText::lossy("x"),
            transient: true,
        };
        assert_eq!(liar.download_reason(), UpgradeReason::DownloadFailed);
        assert_eq!(f.download_reason(), UpgradeReason::DigestMismatch);
    }

    #[test]
    fn protocol_1_requests_still_parse_but_carry_no_resume() {
        let mut v1 = request();
        v1.protocol = FETCH_PROTOCOL_V1;
        let line = serde_json::to_vec(&v1).expect("json");
        assert_eq!(FetchRequest::parse(&line).expect("v1"), v1);
        v1.resume = Some(ResumePoint::default());
        let e =
            FetchRequest::parse(&serde_json::to_vec(&v1).expect("json")).expect_err("v1+resume");
        assert!(e.to_string().contains("need protocol 2"), "{e}");
        let mut r = request();
        r.resume = Some(ResumePoint {
            offset: r.byte_limit.bytes() + 1,
            validators: Validators::default(),
        });
        assert!(FetchRequest::parse(&serde_json::to_vec(&r).expect("json")).is_err());
        let mut v1 = request();
        v1.protocol = FETCH_PROTOCOL_V1;
        v1.max_bytes_per_sec = Some(MAX_BYTES_PER_SEC_FLOOR);
        assert!(FetchRequest::parse(&serde_json::to_vec(&v1).expect("json")).is_err());
    }

    #[test]
    fn the_bandwidth_cap_has_a_floor() {
        let mut r = request();
        for (cap, ok) in [
            (MAX_BYTES_PER_SEC_FLOOR, true),
            (256 * 1024, true),
            (u64::MAX, true),
            (MAX_BYTES_PER_SEC_FLOOR - 1, false),
            (0, false),
        ] {
            r.max_bytes_per_sec = Some(cap);
            let parsed = FetchRequest::parse(&serde_json::to_vec(&r).expect("json"));
            assert_eq!(parsed.is_ok(), ok, "{cap}: {parsed:?}");
        }
    }

    #[test]
    fn validators_table() {
        let v = |total: Option<u64>, etag: Option<&str>, lm: Option<&str>| Validators {
            total,
            etag: etag.map(str::to_owned),
            last_modified: lm.map(str::to_owned),
        };
        let table = [
            (v(Some(5), None, None), v(Some(5), None, None), true),
            (v(Some(5), None, None), v(Some(6), None, None), false),
            (
                v(Some(5), Some("\"a\""), None),
                v(Some(5), Some("\"b\""), None),
                false,
            ),
            (
                v(None, Some("\"a\""), None),
                v(Some(5), Some("\"a\""), None),
                true,
            ),
            (v(None, None, Some("x")), v(None, None, Some("y")), false),
            // Nothing known on both sides: never the same content.
            (v(None, Some("\"a\""), None), v(Some(5), None, None), false),
            (v(None, None, None), v(None, None, None), false),
        ];
        for (a, b, same) in table {
            assert_eq!(a.same_content(&b), same, "{a:?} vs {b:?}");
            assert_eq!(b.same_content(&a), same, "symmetric");
        }
        assert!(v(None, Some(""), None).validate().is_err());
        assert!(v(None, Some("a\nb"), None).validate().is_err());
        assert!(v(None, None, Some(&"x".repeat(VALIDATOR_MAX_BYTES + 1)))
            .validate()
            .is_err());
    }

    #[test]
    fn resume_point_parse_bounds() {
        let p = ResumePoint {
            offset: 3,
            validators: Validators {
                total: Some(10),
                etag: Some("\"e\"".into()),
                last_modified: None,
            },
        };
        let line = serde_json::to_vec(&p).expect("json");
        assert_eq!(ResumePoint::parse(&line).expect("parses"), p);
        assert!(ResumePoint::parse(br#"{"offset":11,"validators":{"total":10}}"#).is_err());
        assert!(ResumePoint::parse(br#"{"offset":1,"validators":{},"x":1}"#).is_err());
        assert!(ResumePoint::parse(&vec![b' '; RESUME_POINT_MAX_BYTES + 1]).is_err());
        assert!(ResumePoint::parse(b"\x00\x01 binary").is_err());
    }
}
