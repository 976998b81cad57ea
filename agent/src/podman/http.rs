//! A small, bounded HTTP/1.1 client over a Unix socket, enough for the libpod REST API.
//!
//! Why hand-written: ureq cannot dial Unix sockets without a custom transport, and the HTTP client crates that
//! can (hyper + hyperlocal) bring an async runtime, which the agent must not have. One request per connection
//! (`Connection: close`), explicit connect/read/write time-outs, and a response-size limit keep it small and safe.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// Largest response accepted, in bytes (headers and body).
pub const RESPONSE_MAX_BYTES: usize = 16 * 1024 * 1024;

/// A response.
#[derive(Debug)]
pub struct Response {
    /// HTTP status code.
    pub status: u16,
    /// The body (de-chunked).
    pub body: Vec<u8>,
}

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// Socket I/O failed or timed out.
    #[error("podman socket {0}")]
    Io(#[from] std::io::Error),
    /// The response was larger than the limit.
    #[error("podman response exceeds {RESPONSE_MAX_BYTES} bytes")]
    TooLarge,
    /// The response did not parse as HTTP/1.1.
    #[error("malformed HTTP response from podman: {0}")]
    Malformed(String),
    /// The caller stopped waiting (see [`request_until`]).
    #[error("abandoned while waiting for Podman")]
    Cancelled,
}

/// How often a waiting [`request_until`] asks whether to stop waiting.
pub const CANCEL_POLL: Duration = Duration::from_millis(200);

/// Sends one request and reads the whole response within `timeout`.
pub fn request(
    socket: &Path,
    method: &str,
    path_and_query: &str,
    body: Option<&[u8]>,
    timeout: Duration,
) -> Result<Response, HttpError> {
    request_until(socket, method, path_and_query, body, timeout, &|| false)
}

/// Like [`request`], but while waiting for the answer it asks `cancel` every [`CANCEL_POLL`] and gives up with
/// [`HttpError::Cancelled`] when it says so (a long image pull that a newer desired state made pointless).
pub fn request_until(
    socket: &Path,
    method: &str,
    path_and_query: &str,
    body: Option<&[u8]>,
    timeout: Duration,
    cancel: &dyn Fn() -> bool,
) -> Result<Response, HttpError> {
    let body = body.map(|b| ("application/json", b));
    request_with(socket, method, path_and_query, body, &[], timeout, cancel)
}

/// Like [`request_until`], with the body's content type (`body` is `(type, bytes)`) and extra request headers.
/// A header's value appears in no error (it may be a credential: `X-Registry-Auth`).
pub fn request_with(
    socket: &Path,
    method: &str,
    path_and_query: &str,
    body: Option<(&str, &[u8])>,
    headers: &[(&str, &str)],
    timeout: Duration,
    cancel: &dyn Fn() -> bool,
) -> Result<Response, HttpError> {
    let deadline = Instant::now() + timeout;
    let mut stream = send(socket, method, path_and_query, body, headers, timeout)?;
    let mut raw = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(HttpError::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("{method} {path_and_query}: no complete answer within {timeout:?}"),
            )));
        }
        stream.set_read_timeout(Some(left.min(CANCEL_POLL)))?;
        let n = match stream.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                if cancel() {
                    return Err(HttpError::Cancelled);
                }
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        if n == 0 {
            break;
        }
        if raw.len() + n > RESPONSE_MAX_BYTES {
            return Err(HttpError::TooLarge);
        }
        raw.extend_from_slice(&buf[..n]);
        // A whole answer by its own framing is not waited on for Podman's close: the close often comes as a
        // separate wake-up of this thread.
        if complete(&raw) {
            break;
        }
    }
    parse_response(&raw)
}

/// Whether `raw` holds a whole response by its framing: the head and `Content-Length` bytes of body, or a chunked
/// body up to its last (zero-size) chunk. A response framed by the connection's close alone is never complete
/// before the close.
fn complete(raw: &[u8]) -> bool {
    let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") else {
        return false;
    };
    let Ok(head) = parse_head(&raw[..end]) else {
        // Malformed: read to the close and let `parse_response` say why.
        return false;
    };
    let rest = &raw[end + 4..];
    if head.chunked {
        dechunk(rest).is_ok()
    } else if let Some(n) = head.length {
        rest.len() >= n
    } else {
        false
    }
}

/// Connects and sends one request (`Connection: close`); the caller reads the answer from the stream.
pub fn send(
    socket: &Path,
    method: &str,
    path_and_query: &str,
    body: Option<(&str, &[u8])>,
    headers: &[(&str, &str)],
    timeout: Duration,
) -> Result<UnixStream, HttpError> {
    let mut stream = UnixStream::connect(socket)?;
    stream.set_write_timeout(Some(timeout.min(Duration::from_secs(10))))?;
    let mut head = format!(
        "{method} {path_and_query} HTTP/1.1\r\nHost: d\r\nConnection: close\r\nUser-Agent: fleet-agent\r\n"
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    let body = body.map(|(kind, b)| {
        head.push_str(&format!(
            "Content-Type: {kind}\r\nContent-Length: {}\r\n",
            b.len()
        ));
        b
    });
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    if let Some(b) = body {
        stream.write_all(b)?;
    }
    stream.flush()?;
    Ok(stream)
}

/// A response's status line and the headers that say how its body is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    /// HTTP status code.
    pub status: u16,
    /// `Transfer-Encoding: chunked`.
    pub chunked: bool,
    /// `Content-Length`, if given.
    pub length: Option<usize>,
}

/// Parses the head of a response (the bytes before its blank line).
pub fn parse_head(head: &[u8]) -> Result<Head, HttpError> {
    let bad = |m: &str| HttpError::Malformed(m.to_owned());
    let head = std::str::from_utf8(head).map_err(|_| bad("headers are not UTF-8"))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    let status: u16 = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .filter(|_| status_line.starts_with("HTTP/1."))
        .ok_or_else(|| bad("bad status line"))?;
    let mut chunked = false;
    let mut length: Option<usize> = None;
    for l in lines {
        let Some((k, v)) = l.split_once(':') else {
            continue;
        };
        let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
        if k == "transfer-encoding" && v.to_ascii_lowercase().contains("chunked") {
            chunked = true;
        } else if k == "content-length" {
            length = Some(v.parse().map_err(|_| bad("bad content-length"))?);
        }
    }
    Ok(Head {
        status,
        chunked,
        length,
    })
}

/// Parses a complete `Connection: close` response.
pub fn parse_response(raw: &[u8]) -> Result<Response, HttpError> {
    let bad = |m: &str| HttpError::Malformed(m.to_owned());
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| bad("no end of headers"))?;
    let Head {
        status,
        chunked,
        length,
    } = parse_head(&raw[..end])?;
    let rest = &raw[end + 4..];
    let body = if chunked {
        dechunk(rest)?
    } else if let Some(n) = length {
        if rest.len() < n {
            return Err(bad("body shorter than content-length"));
        }
        rest[..n].to_vec()
    } else {
        rest.to_vec()
    };
    Ok(Response { status, body })
}

fn dechunk(mut s: &[u8]) -> Result<Vec<u8>, HttpError> {
    let bad = |m: &str| HttpError::Malformed(m.to_owned());
    let mut out = Vec::new();
    loop {
        let nl = s
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or_else(|| bad("chunk size line"))?;
        let size_text = std::str::from_utf8(&s[..nl]).map_err(|_| bad("chunk size"))?;
        let size_hex = size_text.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_hex, 16).map_err(|_| bad("chunk size"))?;
        s = &s[nl + 2..];
        if size == 0 {
            return Ok(out);
        }
        if s.len() < size {
            return Err(bad("truncated chunk"));
        }
        out.extend_from_slice(&s[..size]);
        s = s.get(size + 2..).unwrap_or(&[]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_length_and_chunked_bodies() {
        let r =
            parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA").expect("len");
        assert_eq!((r.status, r.body.as_slice()), (200, &b"ok"[..]));
        let r = parse_response(
            b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=1\r\nde\r\n0\r\n\r\n",
        )
        .expect("chunked");
        assert_eq!((r.status, r.body.as_slice()), (201, &b"abcde"[..]));
        assert!(parse_response(b"garbage").is_err());
        assert!(parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nab").is_err());
    }

    #[test]
    fn a_response_is_complete_by_its_framing() {
        let whole = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
        assert!(complete(whole));
        for cut in 0..whole.len() {
            assert!(!complete(&whole[..cut]), "{cut}");
        }
        let chunked: &[u8] =
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
        assert!(complete(chunked));
        // Before its zero-size chunk's line is whole, it is not.
        let last = chunked.len() - 2;
        for cut in 0..last {
            assert!(!complete(&chunked[..cut]), "{cut}");
        }
        // Framed by the close alone: never complete before it.
        assert!(!complete(b"HTTP/1.0 200 OK\r\n\r\nanything"));
        assert!(!complete(b"garbage\r\n\r\n"));
    }
}
