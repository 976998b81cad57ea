//! `https://` artifacts: one GET, redirects refused, declared size checked before the body is read.

use super::client::{content_length, redact, Client, Response};
use super::download::{stream, Streamed};
use super::FetchError;
use fleet_wire::{HttpsUrl, Sha256Hex};
use std::io::Write;

/// Downloads `url` into `out`, verified against `expected`.
pub(crate) fn fetch(
    client: &Client,
    url: &HttpsUrl,
    expected: &Sha256Hex,
    limit: u64,
    out: &mut impl Write,
    write_err: impl Fn(std::io::Error) -> FetchError,
) -> Result<Streamed, FetchError> {
    let url = url.as_str();
    let resp = client.get(url, None, None, &[])?;
    check_success(&resp, url)?;
    check_declared(&resp, limit)?;
    stream(
        resp.into_body().into_reader(),
        out,
        limit,
        expected,
        "artifact",
        |e| client.map_read_error(url, e),
        write_err,
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
