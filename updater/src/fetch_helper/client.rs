//! The HTTPS client every fetch uses: ureq + rustls (ring), system roots plus extra roots, redirects never
//! followed by the library, a connect time-out and one deadline for the whole fetch.

use super::rate::Capped;
use super::{FetchConfig, FetchError};
use std::num::NonZeroU64;
use std::sync::Arc;
use std::time::{Duration, Instant};
use ureq::tls::{Certificate, RootCerts, TlsConfig, TlsProvider};
use ureq::{Agent, Body};

/// One fetch's client: the agent and the deadline shared by all of the fetch's requests.
pub(crate) struct Client {
    agent: Agent,
    deadline: Instant,
    request_timeout: Duration,
    max_bytes_per_sec: Option<NonZeroU64>,
}

/// An HTTP response whose body has not been read yet.
pub(crate) type Response = ureq::http::Response<Body>;

impl Client {
    /// Builds the client; the deadline starts now.
    pub(crate) fn new(cfg: &FetchConfig) -> Result<Self, FetchError> {
        let native = rustls_native_certs::load_native_certs();
        if !native.errors.is_empty() {
            log::debug!(
                "{} errors while loading the system root store (kept {} roots)",
                native.errors.len(),
                native.certs.len()
            );
        }
        let roots: Vec<Certificate<'static>> = native
            .certs
            .iter()
            .chain(cfg.extra_roots.iter())
            .map(|c| Certificate::from_der(c.as_ref()).to_owned())
            .collect();
        if roots.is_empty() {
            return Err(FetchError::NoRoots);
        }
        let tls = TlsConfig::builder()
            .provider(TlsProvider::Rustls)
            .root_certs(RootCerts::Specific(Arc::new(roots)))
            .build();
        let config = Agent::config_builder()
            .https_only(true)
            // A 3xx comes back as a response and is refused (or, for blobs only, followed by hand).
            .max_redirects(0)
            .http_status_as_error(false)
            .timeout_resolve(Some(cfg.connect_timeout))
            .timeout_connect(Some(cfg.connect_timeout))
            // Ask for the bytes as stored: the digest is over the artifact, not a transfer encoding.
            .accept_encoding("")
            .user_agent(concat!("fleet-updater/", env!("CARGO_PKG_VERSION")))
            .max_idle_connections(0)
            .tls_config(tls)
            .build();
        Ok(Self {
            agent: Agent::new_with_config(config),
            deadline: Instant::now() + cfg.request_timeout,
            request_timeout: cfg.request_timeout,
            max_bytes_per_sec: cfg.max_bytes_per_sec,
        })
    }

    /// The artifact's body to stream, under the fetch's bandwidth cap (if any) from now.
    pub(crate) fn artifact_body(&self, resp: Response) -> Capped<impl std::io::Read> {
        Capped::new(resp.into_body().into_reader(), self.max_bytes_per_sec)
    }

    /// GET `url` with optional `Accept`, bearer token and `extra` headers (a range), bounded by what is left of
    /// the fetch's deadline.
    pub(crate) fn get(
        &self,
        url: &str,
        accept: Option<&str>,
        bearer: Option<&str>,
        query: &[(&str, &str)],
        extra: &[(&str, String)],
    ) -> Result<Response, FetchError> {
        let left = self
            .deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or_else(|| self.timed_out(url))?;
        let mut req = self.agent.get(url);
        if let Some(a) = accept {
            req = req.header("Accept", a);
        }
        if let Some(t) = bearer {
            req = req.header("Authorization", format!("Bearer {t}"));
        }
        for (k, v) in query {
            req = req.query(k, v);
        }
        for (k, v) in extra {
            req = req.header(*k, v);
        }
        log::debug!("GET {}", redact(url));
        req.config()
            .timeout_global(Some(left))
            .build()
            .call()
            .map_err(|e| self.map_error(url, e))
    }

    /// Maps a ureq error (also one wrapped in an `io::Error` by a body reader) to a fetch error.
    pub(crate) fn map_error(&self, url: &str, e: ureq::Error) -> FetchError {
        match e {
            ureq::Error::Timeout(which) => FetchError::TimedOut {
                url: redact(url),
                detail: format!(
                    "{which}; the whole fetch is bounded at {} s",
                    self.request_timeout.as_secs_f32()
                ),
            },
            ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::TimedOut => self.timed_out(url),
            other => FetchError::Transport {
                url: redact(url),
                // A dropped or refused connection, a lost name server or a stalled body may pass on a flaky
                // link; a certificate or protocol violation (too many headers, a bad chunk length) will not:
                // the same server answers the same way again.
                transient: match &other {
                    ureq::Error::Io(io) => transient_io(io.kind()),
                    ureq::Error::HostNotFound
                    | ureq::Error::ConnectionFailed
                    | ureq::Error::BodyStalled => true,
                    _ => false,
                },
                detail: other.to_string(),
            },
        }
    }

    /// Maps a body read error.
    pub(crate) fn map_read_error(&self, url: &str, e: std::io::Error) -> FetchError {
        self.map_error(url, ureq::Error::from(e))
    }

    fn timed_out(&self, url: &str) -> FetchError {
        FetchError::TimedOut {
            url: redact(url),
            detail: format!(
                "the whole fetch is bounded at {} s",
                self.request_timeout.as_secs_f32()
            ),
        }
    }
}

/// Whether an I/O error of this kind may pass on a flaky link (a TLS failure arrives as `InvalidData`: no).
fn transient_io(kind: std::io::ErrorKind) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        kind,
        ConnectionReset
            | ConnectionAborted
            | ConnectionRefused
            | BrokenPipe
            | UnexpectedEof
            | TimedOut
            | NotConnected
            | HostUnreachable
            | NetworkUnreachable
            | NetworkDown
            | AddrNotAvailable
    )
}

/// The URL without query or fragment: presigned storage URLs carry credentials there.
pub(crate) fn redact(url: &str) -> String {
    match url.find(['?', '#']) {
        Some(i) => format!("{}?…", &url[..i]),
        None => url.to_owned(),
    }
}

/// The declared `Content-Length`, if any and parseable.
pub(crate) fn content_length(resp: &Response) -> Option<u64> {
    resp.headers()
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
}

/// The head of `resp` as the range logic sees it.
pub(crate) fn range_head(resp: &Response) -> super::range::Head<'_> {
    super::range::Head {
        status: resp.status().as_u16(),
        content_length: content_length(resp),
        content_range: header(resp, "content-range"),
        etag: header(resp, "etag"),
        last_modified: header(resp, "last-modified"),
    }
}

/// A header as text, if present and visible ASCII.
pub(crate) fn header<'a>(resp: &'a Response, name: &str) -> Option<&'a str> {
    resp.headers().get(name).and_then(|v| v.to_str().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_queries() {
        assert_eq!(redact("https://a/b?X-Amz-Signature=s"), "https://a/b?…");
        assert_eq!(redact("https://a/b"), "https://a/b");
    }
}
