//! The FleetLock client: `pre-reboot` and `steady-state` against the configured server. Anything but a 200 —
//! including an unreachable server or a certificate that does not verify — means "no". `status` reads the
//! server's status document (no lock taken). HTTPS trusts the system roots plus the config's `ca_file`.

use super::config::RebootConfig;
use fleet_wire::fleetlock::{
    ClientParams, ErrorBody, LockRequest, ServerStatus, PRE_REBOOT_PATH, PROTOCOL_HEADER,
    STATUS_PATH, STEADY_STATE_PATH,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use ureq::tls::{Certificate, RootCerts, TlsConfig, TlsProvider};

/// Largest status document read, in bytes.
const STATUS_MAX_BYTES: u64 = 1024 * 1024;

/// Who this client is in requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// App-specific machine id (never the raw machine id).
    pub id: String,
    /// Hostname, sent as an extension so the server can match members by name.
    pub hostname: Option<String>,
}

/// A FleetLock server.
pub struct LockClient {
    base: String,
    group: String,
    token: Option<String>,
    agent: ureq::Agent,
}

/// Largest CA file read, in bytes.
const CA_FILE_MAX_BYTES: u64 = 1024 * 1024;

/// A `ca_file` that cannot be used: names the file and what is wrong.
#[derive(Debug, thiserror::Error)]
pub enum CaFileError {
    /// It could not be read.
    #[error("ca_file {0}")]
    Read(#[from] crate::bounded::ReadError),
    /// It is not PEM.
    #[error("ca_file {}: not PEM certificates ({source})", path.display())]
    NotPem {
        /// The file.
        path: std::path::PathBuf,
        /// The PEM error.
        source: rustls::pki_types::pem::Error,
    },
    /// It holds no certificate.
    #[error("ca_file {}: no CERTIFICATE block in the file", .0.display())]
    Empty(std::path::PathBuf),
}

/// A request the FleetLock server did not grant, or could not be asked.
#[derive(Debug, thiserror::Error)]
pub enum FleetLockError {
    /// The client cannot be built: its CA file.
    #[error(transparent)]
    CaFile(#[from] CaFileError),
    /// The request did not reach the server (with a hint when its certificate did not verify).
    #[error("FleetLock server {base} unreachable: {source}{hint}")]
    Unreachable {
        /// The server's base URL.
        base: String,
        /// The transport error.
        source: ureq::Error,
        /// What to do about a certificate that did not verify (empty otherwise).
        hint: &'static str,
    },
    /// The server answered, but not with what was asked for: `path: why`.
    #[error("{0}")]
    Answer(String),
}

/// The CA certificates of a PEM file; `Err` names the file and what is wrong.
pub fn read_ca_file(path: &Path) -> Result<Vec<CertificateDer<'static>>, CaFileError> {
    let pem = crate::bounded::read(path, CA_FILE_MAX_BYTES)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| CaFileError::NotPem {
            path: path.to_path_buf(),
            source,
        })?;
    if certs.is_empty() {
        return Err(CaFileError::Empty(path.to_path_buf()));
    }
    Ok(certs)
}

/// Says why a request did not reach the server, with a hint when the server's certificate did not verify (chosen
/// by the error's type, [`fleet_wire::tls_problem`], not by its text).
fn unreachable(base: &str, e: ureq::Error) -> FleetLockError {
    use fleet_wire::tls_problem::{classify, find, TlsProblem as P};
    let problem = match &e {
        ureq::Error::Rustls(r) => classify(r),
        ureq::Error::Io(io) => find(io),
        _ => None,
    };
    let hint = match problem {
        Some(P::UnknownIssuer) => {
            " (the server's certificate is not signed by a CA this host trusts: set ca_file to the CA that issued it)"
        }
        Some(P::WrongName) => " (the server's certificate is not valid for the host name or address in `server`)",
        Some(P::Expired) => " (the server's certificate has expired)",
        Some(P::NotValidYet) => " (the server's certificate is not valid yet: is this host's clock behind?)",
        Some(P::NotTls) => " (the server does not speak HTTPS: is `server` an http:// URL?)",
        Some(P::ClientCertRequired) | None => "",
    };
    FleetLockError::Unreachable {
        base: base.to_string(),
        source: e,
        hint,
    }
}

impl LockClient {
    /// A client for `server` (base URL) and `group`; HTTPS verifies the server with the system roots plus the
    /// certificates of `ca_file`. `Err` names a CA file that cannot be used.
    pub fn new(
        server: &str,
        group: &str,
        token: Option<String>,
        timeout: Duration,
        ca_file: Option<&Path>,
    ) -> Result<Self, FleetLockError> {
        let extra = match ca_file {
            Some(p) => read_ca_file(p)?,
            None => Vec::new(),
        };
        let native = rustls_native_certs::load_native_certs();
        let roots: Vec<Certificate<'static>> = native
            .certs
            .iter()
            .chain(extra.iter())
            .map(|c| Certificate::from_der(c.as_ref()).to_owned())
            .collect();
        let tls = TlsConfig::builder()
            .provider(TlsProvider::Rustls)
            .root_certs(RootCerts::Specific(Arc::new(roots)))
            .build();
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(timeout))
            .http_status_as_error(false)
            .tls_config(tls)
            .build()
            .into();
        Ok(Self {
            base: server.trim_end_matches('/').to_string(),
            group: group.to_string(),
            token,
            agent,
        })
    }

    /// The client `cfg` describes (server, group, token, CA file) with the per-request `timeout`.
    pub fn from_config(cfg: &RebootConfig, timeout: Duration) -> Result<Self, FleetLockError> {
        Self::new(
            &cfg.server,
            &cfg.group,
            cfg.token.clone(),
            timeout,
            cfg.ca_file.as_deref(),
        )
    }

    fn post(&self, path: &str, who: &Identity) -> Result<(), FleetLockError> {
        let body = serde_json::to_vec(&LockRequest {
            client_params: ClientParams {
                id: who.id.clone(),
                group: self.group.clone(),
                hostname: who.hostname.clone(),
            },
        })
        .map_err(|e| FleetLockError::Answer(e.to_string()))?;
        let url = format!("{}{path}", self.base);
        let mut req = self
            .agent
            .post(&url)
            .header(PROTOCOL_HEADER, "true")
            .content_type("application/json");
        if let Some(t) = &self.token {
            req = req.header("authorization", &format!("Bearer {t}"));
        }
        let mut resp = req
            .send(&body[..])
            .map_err(|e| unreachable(&self.base, e))?;
        let code = resp.status().as_u16();
        if code == 200 {
            return Ok(());
        }
        let text = resp
            .body_mut()
            .with_config()
            .limit(64 * 1024)
            .read_to_string()
            .unwrap_or_default();
        Err(FleetLockError::Answer(
            match serde_json::from_str::<ErrorBody>(&text) {
                Ok(e) => format!("{}: {} ({})", path, e.kind.as_str(), e.value),
                Err(_) => format!("{path}: HTTP {code}"),
            },
        ))
    }

    /// Asks for a slot.
    pub fn pre_reboot(&self, who: &Identity) -> Result<(), FleetLockError> {
        self.post(PRE_REBOOT_PATH, who)
    }

    /// Reads `GET /v1/status` with this client's credentials: reaches the server and proves the token without
    /// taking or giving back a slot.
    pub fn status(&self) -> Result<ServerStatus, FleetLockError> {
        let url = format!("{}{STATUS_PATH}", self.base);
        let mut req = self.agent.get(&url);
        if let Some(t) = &self.token {
            req = req.header("authorization", &format!("Bearer {t}"));
        }
        let mut resp = req.call().map_err(|e| unreachable(&self.base, e))?;
        let code = resp.status().as_u16();
        let text = resp
            .body_mut()
            .with_config()
            .limit(STATUS_MAX_BYTES)
            .read_to_string()
            .map_err(|e| {
                FleetLockError::Answer(format!("{STATUS_PATH}: HTTP {code}, body unreadable: {e}"))
            })?;
        if code != 200 {
            return Err(FleetLockError::Answer(
                match serde_json::from_str::<ErrorBody>(&text) {
                    Ok(e) => format!("{STATUS_PATH}: {} ({})", e.kind.as_str(), e.value),
                    Err(_) => format!(
                        "{STATUS_PATH}: HTTP {code} (is {} a FleetLock server?)",
                        self.base
                    ),
                },
            ));
        }
        serde_json::from_str(&text).map_err(|e| {
            FleetLockError::Answer(format!(
                "{STATUS_PATH}: not a FleetLock status document ({e}); is {} a FleetLock server?",
                self.base
            ))
        })
    }

    /// Gives the slot back.
    pub fn steady_state(&self, who: &Identity) -> Result<(), FleetLockError> {
        self.post(STEADY_STATE_PATH, who)
    }
}
