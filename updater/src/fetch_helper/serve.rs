//! The helper's side of the fetch contract (`fleet-fetch`, run by the updater as the agent user): read one
//! `FetchRequest` line from stdin, stream the verified artifact to stdout, or describe the failure.

use super::{fetch_to, FetchConfig, FetchError, Start};
use fleet_wire::fetch::{FetchFailure, FETCH_PROTOCOL, FETCH_REQUEST_MAX_BYTES};
use fleet_wire::{BoundedText, FetchRequest, UpgradeReason};
use std::io::{Read, Write};
use std::time::Duration;

fn failure(reason: UpgradeReason, message: impl AsRef<str>) -> FetchFailure {
    FetchFailure {
        reason,
        message: BoundedText::lossy(message),
        transient: false,
    }
}

impl From<FetchError> for FetchFailure {
    fn from(e: FetchError) -> Self {
        FetchFailure {
            transient: e.is_transient(),
            ..failure(e.reason(), e.to_string())
        }
    }
}

/// Serves one request: reads it from `input` (bounded), then streams the artifact to `out` — for protocol 2
/// after one start line saying where the bytes begin. The caller prints the failure as one JSON line on stderr
/// and exits non-zero.
pub fn serve(input: impl Read, out: &mut impl Write) -> Result<u64, FetchFailure> {
    let mut protocol = FETCH_PROTOCOL;
    serve_request(input, out, &mut protocol).map_err(|mut f| {
        // A protocol-1 updater knows no `transient`: it would not parse the line.
        f.transient &= protocol == FETCH_PROTOCOL;
        f
    })
}

fn serve_request(
    input: impl Read,
    out: &mut impl Write,
    protocol: &mut u32,
) -> Result<u64, FetchFailure> {
    let mut line = Vec::new();
    input
        .take(FETCH_REQUEST_MAX_BYTES as u64 + 1)
        .read_to_end(&mut line)
        .map_err(|e| {
            failure(
                UpgradeReason::DownloadFailed,
                format!("reading the request: {e}"),
            )
        })?;
    let req = FetchRequest::parse(line.trim_ascii_end())
        .map_err(|e| failure(UpgradeReason::DownloadFailed, e.to_string()))?;
    *protocol = req.protocol;
    let mut cfg = FetchConfig::default();
    if let Some(ms) = req.time_left_ms {
        cfg.request_timeout = cfg.request_timeout.min(Duration::from_millis(ms));
    }
    cfg.max_bytes_per_sec = req.max_bytes_per_sec.and_then(std::num::NonZeroU64::new);
    if let Some(pem) = &req.extra_roots_pem {
        cfg = cfg.with_ca_pem(pem, "from the updater's extra_ca_file")?;
    }
    let pipe = |source| FetchError::Io {
        target: "the updater's pipe".into(),
        source,
    };
    let streamed = fetch_to(
        &req.artifact,
        &req.sha256,
        req.byte_limit.bytes(),
        Start {
            resume: req.resume.as_ref(),
            announce: req.protocol == FETCH_PROTOCOL,
        },
        &cfg,
        out,
        pipe,
    )?;
    Ok(streamed.bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_wire::fixtures;

    #[test]
    fn bad_requests_fail_before_any_network() {
        let mut out = Vec::new();
        let f = serve(&b"{not json"[..], &mut out).expect_err("malformed");
        assert_eq!(f.reason, UpgradeReason::DownloadFailed);
        assert!(
            f.message.as_str().contains("fetch request"),
            "{}",
            f.message
        );
        let a = fixtures::attempt();
        let mut req = FetchRequest::new(a.artifact, a.sha256, a.byte_limit, None);
        req.extra_roots_pem = Some("not a certificate".into());
        let f = serve(&serde_json::to_vec(&req).expect("json")[..], &mut out).expect_err("pem");
        assert!(
            f.message.as_str().contains("no PEM certificate"),
            "{}",
            f.message
        );
        assert!(out.is_empty());
    }
}
