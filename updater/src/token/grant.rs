//! The token request of the JWT-profile grant: POST the assertion to Zitadel's token endpoint over HTTPS (system
//! roots plus an optional extra CA, no redirects, one time-out, a bounded answer) and take `access_token` from the
//! answer. Errors carry the endpoint's `error` and a bounded `error_description`, never a token.

use fleet_wire::auth::NATS_TOKEN_MAX_BYTES;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use serde::Deserialize;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use ureq::tls::{Certificate, RootCerts, TlsConfig, TlsProvider};

/// The grant type of RFC 7523.
pub const GRANT_TYPE: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";
/// The largest answer read from the token endpoint, in bytes.
pub const RESPONSE_MAX_BYTES: u64 = 64 * 1024;
/// How much of an error description is quoted, in characters.
const DESCRIPTION_MAX_CHARS: usize = 200;

/// A token the endpoint issued. Its `Debug` hides the token.
pub struct Issued {
    /// The access token (the device's NATS token).
    pub token: String,
    /// Its lifetime in seconds, when the endpoint said.
    pub expires_in: Option<u64>,
}

impl std::fmt::Debug for Issued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issued")
            .field("token", &"<redacted>")
            .field("expires_in", &self.expires_in)
            .finish()
    }
}

#[derive(Deserialize)]
struct Answer {
    access_token: Option<String>,
    expires_in: Option<u64>,
    error: Option<String>,
    error_description: Option<String>,
}

/// The endpoint did not issue a token; the text names the endpoint (or the CA file), never a token.
#[derive(Debug, thiserror::Error)]
pub enum GrantError {
    /// The HTTPS client cannot be built: the CA file, or no trusted roots at all.
    #[error("{0}")]
    Trust(String),
    /// The request did not reach the endpoint.
    #[error("token endpoint {endpoint} unreachable: {source}")]
    Unreachable {
        /// The token endpoint.
        endpoint: String,
        /// The transport error.
        source: ureq::Error,
    },
    /// The answer could not be read.
    #[error("token endpoint {endpoint}: HTTP {code}, answer not read: {source}")]
    Unread {
        /// The token endpoint.
        endpoint: String,
        /// The HTTP status.
        code: u16,
        /// The read error.
        source: ureq::Error,
    },
    /// The endpoint answered without a usable token.
    #[error("token endpoint {endpoint}: {source}")]
    Refused {
        /// The token endpoint.
        endpoint: String,
        /// What its answer said.
        source: AnswerError,
    },
}

/// An answer of the token endpoint that holds no usable token (its `error`, bounded and printable).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnswerError {
    /// Not 200: `HTTP <code>` and the endpoint's `error: error_description` when it said.
    #[error("HTTP {code}{said}")]
    Status {
        /// The HTTP status.
        code: u16,
        /// `: error[: description]`, or empty.
        said: String,
    },
    /// 200 but not JSON of a token response.
    #[error("HTTP 200 but the answer is not a token response (JSON)")]
    NotJson,
    /// 200 without `access_token`.
    #[error("HTTP 200 but the answer has no access_token")]
    NoToken,
    /// The token's length is outside 1..=NATS_TOKEN_MAX_BYTES.
    #[error("the access_token is empty or longer than {max} bytes", max = NATS_TOKEN_MAX_BYTES)]
    BadLength,
    /// The token has characters a token file cannot carry.
    #[error("the access_token has whitespace or non-ASCII characters")]
    BadCharacters,
}

/// Asks `endpoint` for a token with `assertion` and `scope`, trusting the system roots and `ca_file`.
pub fn request(
    endpoint: &str,
    assertion: &str,
    scope: &str,
    ca_file: Option<&Path>,
    timeout: Duration,
) -> Result<Issued, GrantError> {
    let agent = agent(ca_file, timeout)?;
    let mut resp = agent
        .post(endpoint)
        .header("Accept", "application/json")
        .send_form([
            ("grant_type", GRANT_TYPE),
            ("scope", scope),
            ("assertion", assertion),
        ])
        .map_err(|source| GrantError::Unreachable {
            endpoint: endpoint.to_string(),
            source,
        })?;
    let code = resp.status().as_u16();
    let text = resp
        .body_mut()
        .with_config()
        .limit(RESPONSE_MAX_BYTES)
        .read_to_string()
        .map_err(|source| GrantError::Unread {
            endpoint: endpoint.to_string(),
            code,
            source,
        })?;
    parse_answer(code, &text).map_err(|source| GrantError::Refused {
        endpoint: endpoint.to_string(),
        source,
    })
}

/// Interprets the endpoint's answer: a token on 200, else the endpoint's error. Pure.
pub fn parse_answer(code: u16, text: &str) -> Result<Issued, AnswerError> {
    let answer: Option<Answer> = serde_json::from_str(text).ok();
    if code != 200 {
        let said = match answer.and_then(|a| a.error.map(|e| (e, a.error_description))) {
            Some((error, description)) => format!(
                ": {}{}",
                printable(&error),
                description
                    .map(|d| format!(": {}", printable(&d)))
                    .unwrap_or_default()
            ),
            None => String::new(),
        };
        return Err(AnswerError::Status { code, said });
    }
    let answer = answer.ok_or(AnswerError::NotJson)?;
    let token = answer.access_token.ok_or(AnswerError::NoToken)?;
    if token.is_empty() || token.len() > NATS_TOKEN_MAX_BYTES {
        return Err(AnswerError::BadLength);
    }
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(AnswerError::BadCharacters);
    }
    Ok(Issued {
        token,
        expires_in: answer.expires_in,
    })
}

/// `s` shortened, with control characters replaced: safe to log.
fn printable(s: &str) -> String {
    s.chars()
        .take(DESCRIPTION_MAX_CHARS)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

fn agent(ca_file: Option<&Path>, timeout: Duration) -> Result<ureq::Agent, GrantError> {
    let native = rustls_native_certs::load_native_certs();
    let mut roots: Vec<Certificate<'static>> = native
        .certs
        .iter()
        .map(|c| Certificate::from_der(c.as_ref()).to_owned())
        .collect();
    if let Some(path) = ca_file {
        let pem = crate::fetch_helper::read_ca_bundle(path)
            .map_err(|e| GrantError::Trust(format!("ca_file: {e}")))?;
        for c in CertificateDer::pem_slice_iter(pem.as_bytes()) {
            let c = c.map_err(|e| GrantError::Trust(format!("ca_file {}: {e}", path.display())))?;
            roots.push(Certificate::from_der(c.as_ref()).to_owned());
        }
    }
    if roots.is_empty() {
        return Err(GrantError::Trust(
            "no trusted roots (system store empty and no ca_file)".into(),
        ));
    }
    let tls = TlsConfig::builder()
        .provider(TlsProvider::Rustls)
        .root_certs(RootCerts::Specific(Arc::new(roots)))
        .build();
    Ok(ureq::Agent::config_builder()
        .https_only(true)
        .max_redirects(0)
        .http_status_as_error(false)
        .timeout_global(Some(timeout))
        .user_agent(concat!("fleet-token/", env!("CARGO_PKG_VERSION")))
        .tls_config(tls)
        .build()
        .into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_read_as_tokens_or_errors() {
        let ok = parse_answer(
            200,
            r#"{"access_token":"eyJ.a.b","token_type":"Bearer","expires_in":43199}"#,
        )
        .expect("token");
        assert_eq!((ok.token.as_str(), ok.expires_in), ("eyJ.a.b", Some(43199)));
        assert!(!format!("{ok:?}").contains("eyJ"));
        for (code, body, want) in [
            (
                400,
                r#"{"error":"invalid_grant","error_description":"assertion\nexpired"}"#,
                "HTTP 400: invalid_grant: assertion?expired",
            ),
            (500, "oops", "HTTP 500"),
            (200, "<html>", "not a token response"),
            (200, r#"{"token_type":"Bearer"}"#, "no access_token"),
            (200, r#"{"access_token":""}"#, "empty"),
            (200, r#"{"access_token":"a b"}"#, "whitespace"),
        ] {
            let e = parse_answer(code, body).expect_err(body).to_string();
            assert!(e.contains(want), "{body}: {e}");
        }
        let long = format!(
            r#"{{"access_token":"{}"}}"#,
            "a".repeat(NATS_TOKEN_MAX_BYTES + 1)
        );
        assert!(parse_answer(200, &long).is_err());
    }
}
