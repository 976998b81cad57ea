//! Why a fetch failed, and the public [`UpgradeReason`] each failure maps to.

use fleet_wire::{Sha256Hex, UpgradeReason};

/// A failed fetch. URLs in these messages never carry a query string (it may hold a signed storage token).
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The PEM bundle of extra trusted roots could not be read or held no certificate.
    #[error("extra CA bundle {bundle}: {detail}; point the updater's CA setting at a readable PEM file of root certificates")]
    CaFile {
        /// The bundle's path, or where it came from.
        bundle: String,
        /// What was wrong with it.
        detail: String,
    },
    /// Neither the system store nor the extra CA bundle provided a trusted root.
    #[error("no trusted root certificates: the system store (/etc/ssl/certs) is empty and no extra CA bundle is configured; install ca-certificates")]
    NoRoots,
    /// Connecting, TLS, or reading the response failed.
    #[error("request to {url} failed: {detail}")]
    Transport {
        /// The URL, without its query.
        url: String,
        /// The transport's error.
        detail: String,
        /// Whether trying again may pass (a dropped connection, not a certificate).
        transient: bool,
    },
    /// The connect time-out or the whole-request deadline passed.
    #[error(
        "request to {url} timed out ({detail}); check the network path to the artifact server"
    )]
    TimedOut {
        /// The URL, without its query.
        url: String,
        /// Which time-out.
        detail: String,
    },
    /// The server answered with a status other than success.
    #[error("{url} answered HTTP {status}; {}", status_hint(*status))]
    Status {
        /// The URL, without its query.
        url: String,
        /// The HTTP status.
        status: u16,
    },
    /// The server answered with a redirect, which is refused (blob downloads excepted, see docs/artifacts.md).
    #[error("{url} answered with a redirect (HTTP {status}); redirects are refused: publish the artifact at its final https:// URL")]
    Redirected {
        /// The URL, without its query.
        url: String,
        /// The HTTP status.
        status: u16,
    },
    /// The response declared more bytes than the limit; nothing was downloaded.
    #[error("the artifact declares {declared} bytes, more than its limit of {limit} bytes")]
    DeclaredTooLarge {
        /// Declared size in bytes (Content-Length or the OCI layer size).
        declared: u64,
        /// The enforced limit in bytes.
        limit: u64,
    },
    /// The body went past the limit while streaming.
    #[error("the artifact exceeded its limit of {limit} bytes while downloading")]
    StreamedTooLarge {
        /// The enforced limit in bytes.
        limit: u64,
    },
    /// A digest did not match.
    #[error("{what} digest mismatch: expected sha256:{expected}, got sha256:{actual}")]
    DigestMismatch {
        /// What was checked: `artifact`, `manifest` or `layer`.
        what: &'static str,
        /// The digest that was required.
        expected: Sha256Hex,
        /// The digest that was found.
        actual: Sha256Hex,
    },
    /// The OCI manifest is not a Harmony agent artifact (type, layer count, media type, size, JSON).
    #[error("not a Harmony agent artifact: {0}")]
    Invalid(String),
    /// The registry's anonymous token challenge could not be satisfied.
    #[error("registry token: {0}")]
    Auth(String),
    /// The download helper broke its protocol with the updater (a missing or wrong start line).
    #[error("the download helper broke its protocol: {0}")]
    Helper(String),
    /// Writing the download (the temporary file, or the helper's pipe to the updater) failed.
    #[error("writing the download to {target}: {source}")]
    Io {
        /// Where it was written: the temporary directory, or the pipe.
        target: String,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// What a person checks after an HTTP status: the server's health for one that may pass (it was tried again),
/// the artifact's URL and access for a refusal.
fn status_hint(status: u16) -> &'static str {
    match status {
        408 | 500..=599 => {
            "the artifact server failed or timed out (tried again with backoff, docs/artifacts.md); check its health and logs"
        }
        429 => "the artifact server is rate-limiting this device (tried again with backoff, docs/artifacts.md); check its request limits",
        _ => "check that the artifact exists and is readable anonymously",
    }
}

impl FetchError {
    /// Whether trying again (resuming) may pass: a dropped or failed connection, a time-out, a server error
    /// or overload. Never a refusal of the artifact itself.
    pub fn is_transient(&self) -> bool {
        match self {
            FetchError::Transport { transient, .. } => *transient,
            FetchError::TimedOut { .. } => true,
            FetchError::Status { status, .. } => matches!(status, 408 | 429 | 500..=599),
            _ => false,
        }
    }

    /// The typed reason the public status carries for this failure.
    pub fn reason(&self) -> UpgradeReason {
        match self {
            FetchError::DeclaredTooLarge { .. } | FetchError::StreamedTooLarge { .. } => {
                UpgradeReason::ArtifactTooLarge
            }
            FetchError::DigestMismatch { .. } => UpgradeReason::DigestMismatch,
            FetchError::Invalid(_) => UpgradeReason::ArtifactInvalid,
            FetchError::CaFile { .. }
            | FetchError::NoRoots
            | FetchError::Transport { .. }
            | FetchError::TimedOut { .. }
            | FetchError::Status { .. }
            | FetchError::Redirected { .. }
            | FetchError::Auth(_)
            | FetchError::Helper(_)
            | FetchError::Io { .. } => UpgradeReason::DownloadFailed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_hints_fit_the_status() {
        let text = |status| {
            FetchError::Status {
                url: "u".into(),
                status,
            }
            .to_string()
        };
        assert!(text(404).contains("readable anonymously"), "{}", text(404));
        for s in [408, 500, 503, 429] {
            assert!(!text(s).contains("readable anonymously"), "{}", text(s));
            assert!(text(s).contains("tried again"), "{}", text(s));
        }
    }

    #[test]
    fn reasons() {
        let d = Sha256Hex::from_bytes([0; 32]);
        let table: Vec<(FetchError, UpgradeReason)> = vec![
            (FetchError::NoRoots, UpgradeReason::DownloadFailed),
            (
                FetchError::Redirected {
                    url: "u".into(),
                    status: 302,
                },
                UpgradeReason::DownloadFailed,
            ),
            (
                FetchError::TimedOut {
                    url: "u".into(),
                    detail: "d".into(),
                },
                UpgradeReason::DownloadFailed,
            ),
            (
                FetchError::DeclaredTooLarge {
                    declared: 2,
                    limit: 1,
                },
                UpgradeReason::ArtifactTooLarge,
            ),
            (
                FetchError::StreamedTooLarge { limit: 1 },
                UpgradeReason::ArtifactTooLarge,
            ),
            (
                FetchError::DigestMismatch {
                    what: "layer",
                    expected: d.clone(),
                    actual: d,
                },
                UpgradeReason::DigestMismatch,
            ),
            (
                FetchError::Invalid("x".into()),
                UpgradeReason::ArtifactInvalid,
            ),
            (FetchError::Auth("x".into()), UpgradeReason::DownloadFailed),
        ];
        let transient = [
            (
                FetchError::Status {
                    url: "u".into(),
                    status: 503,
                },
                true,
            ),
            (
                FetchError::Status {
                    url: "u".into(),
                    status: 429,
                },
                true,
            ),
            (
                FetchError::Status {
                    url: "u".into(),
                    status: 404,
                },
                false,
            ),
            (
                FetchError::Transport {
                    url: "u".into(),
                    detail: "reset".into(),
                    transient: true,
                },
                true,
            ),
            (
                FetchError::Transport {
                    url: "u".into(),
                    detail: "certificate".into(),
                    transient: false,
                },
                false,
            ),
            (
                FetchError::TimedOut {
                    url: "u".into(),
                    detail: "d".into(),
                },
                true,
            ),
            (FetchError::StreamedTooLarge { limit: 1 }, false),
            (FetchError::Invalid("x".into()), false),
        ];
        for (e, t) in transient {
            assert_eq!(e.is_transient(), t, "{e}");
        }
        for (e, r) in table {
            assert_eq!(e.reason(), r, "{e}");
        }
    }
}
