//! `https://` artifacts: one GET, redirects refused, declared size checked before the body is read.

use super::client::{content_length, redact, Client, Response};
use super::download::stream_to_temp;
use super::{FetchError, Fetched};
use fleet_wire::{HttpsUrl, Sha256Hex};
use std::path::Path;

/// Downloads `url` into a temporary file in `tmp_dir`, verified against `expected`.
pub(crate) fn fetch(
    client: &Client,
    url: &HttpsUrl,
    expected: &Sha256Hex,
    limit: u64,
    tmp_dir: &Path,
) -> Result<Fetched, FetchError> {
    let url = url.as_str();
    let resp = client.get(url, None, None, &[])?;
    check_success(&resp, url)?;
    check_declared(&resp, limit)?;
    stream_to_temp(
        resp.into_body().into_reader(),
        tmp_dir,
        limit,
        expected,
        "artifact",
        |e| client.map_read_error(url, e),
    )
}

/// A 2xx passes; a 3xx is a refused redirect; anything else is an HTTP failure.
pub(crate) fn check_success(resp: &Response, url: &str) -> Result<(), FetchError> {
    let status = resp.status().as_u16();
    match status {
        200..=299 => Ok(()),
        300..=399 => Err(FetchError::Redirected {
            url: redact(url),
            status,
        }),
        _ => Err(FetchError::Status {
            url: redact(url),
            status,
        }),
    }
}

/// Refuses a response whose `Content-Length` is above `limit` before reading any of it.
pub(crate) fn check_declared(resp: &Response, limit: u64) -> Result<(), FetchError> {
    match content_length(resp) {
        Some(declared) if declared > limit => Err(FetchError::DeclaredTooLarge { declared, limit }),
        _ => Ok(()),
    }
}
