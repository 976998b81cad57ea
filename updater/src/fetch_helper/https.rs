//! `https://` artifacts: one GET (two when a resume has to start over), redirects refused, declared size
//! checked before the body is read.

use super::client::{range_head, redact, Client, Response};
use super::download::{begin, stream, Streamed};
use super::range::{decide, request_headers, Decision};
use super::FetchError;
use fleet_wire::fetch::ResumePoint;
use fleet_wire::{HttpsUrl, Sha256Hex};
use std::io::Write;

/// Downloads `url` into `out`, verified against `expected` (when the whole artifact is streamed), resuming
/// after `resume` when the server can continue those bytes. With `announce`, the start line goes first.
#[allow(clippy::too_many_arguments)]
pub(crate) fn fetch(
    client: &Client,
    url: &HttpsUrl,
    expected: &Sha256Hex,
    limit: u64,
    resume: Option<&ResumePoint>,
    announce: bool,
    out: &mut impl Write,
    write_err: impl Fn(std::io::Error) -> FetchError,
) -> Result<Streamed, FetchError> {
    let url = url.as_str();
    let (resp, start) = get_resumed(resume, limit, url, |headers| {
        client.get(url, None, None, &[], headers)
    })?;
    if announce {
        begin(out, &start, &write_err)?;
    }
    stream(
        client.artifact_body(resp),
        out,
        limit.saturating_sub(start.offset),
        (start.offset == 0).then_some(expected),
        "artifact",
        |e| client.map_read_error(url, e),
        write_err,
    )
}

/// GETs with a range after `resume` (if any) and decides the answer; when the server cannot continue the held
/// bytes, GETs once more without a range. Returns the response to stream and where its body begins.
pub(crate) fn get_resumed(
    resume: Option<&ResumePoint>,
    limit: u64,
    url: &str,
    mut get: impl FnMut(&[(&str, String)]) -> Result<Response, FetchError>,
) -> Result<(Response, ResumePoint), FetchError> {
    let mut resume = resume.filter(|p| p.offset > 0);
    loop {
        let resp = get(&request_headers(resume))?;
        match decide(resume, &range_head(&resp), limit)? {
            Decision::Stream(start) => {
                if start.offset > 0 {
                    log::info!("{}: resuming after {} bytes", redact(url), start.offset);
                } else if let Some(held) = resume {
                    log::info!(
                        "{}: the server sent the whole artifact; the {} bytes held are dropped",
                        redact(url),
                        held.offset
                    );
                }
                return Ok((resp, start));
            }
            Decision::Restart(why) if resume.is_some() => {
                log::info!("{}: cannot resume ({why}); starting from zero", redact(url));
                resume = None;
            }
            Decision::Restart(why) => {
                return Err(FetchError::Transport {
                    url: redact(url),
                    detail: why,
                    transient: false,
                })
            }
            Decision::NotOk => {
                check_success(&resp, url)?;
                return Err(FetchError::Status {
                    url: redact(url),
                    status: resp.status().as_u16(),
                });
            }
        }
    }
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
