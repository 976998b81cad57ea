//! TLS of the operator's, fleet-auth's and fleetlock-server's NATS connections (async-nats): a CA file that
//! replaces the system roots, an optional client certificate (mTLS), TLS required once any is set (no plain
//! fallback, no option to skip verification), the files checked and named before connecting, and handshake
//! failures said in words. A leaf module: it imports nothing else of the operator, so every product folder may
//! use it.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::path::{Path, PathBuf};

/// Largest CA, certificate or key file read, in bytes.
pub const TLS_FILE_MAX_BYTES: u64 = 1024 * 1024;

/// Longest the start-up check of the certificates waits for one connection attempt.
const PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// TLS settings of one NATS client.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NatsTls {
    /// PEM file of the CA(s) the server's certificate must chain to; `None`: the system roots.
    pub ca_file: Option<PathBuf>,
    /// Client certificate and key (PEM) for a server that verifies clients.
    pub client: Option<(PathBuf, PathBuf)>,
}

impl NatsTls {
    /// Settings from the three optional files; `what` prefixes errors (e.g. `--nats-` or `store.`).
    pub fn new(
        ca_file: Option<PathBuf>,
        cert_file: Option<PathBuf>,
        key_file: Option<PathBuf>,
        what: &str,
    ) -> Result<Self, String> {
        let client = match (cert_file, key_file) {
            (Some(c), Some(k)) => Some((c, k)),
            (None, None) => None,
            _ => return Err(format!("{what}cert_file and {what}key_file go together")),
        };
        Ok(Self { ca_file, client })
    }

    /// True when nothing is configured.
    pub fn is_off(&self) -> bool {
        self.ca_file.is_none() && self.client.is_none()
    }

    /// Checks the files and sets them on `opts` with TLS required; unchanged when nothing is configured (a
    /// `tls://` URL then uses the system roots).
    pub fn apply(
        &self,
        opts: async_nats::ConnectOptions,
    ) -> Result<async_nats::ConnectOptions, String> {
        if self.is_off() {
            return Ok(opts);
        }
        let mut opts = opts.require_tls(true);
        if let Some(ca) = &self.ca_file {
            certificates(ca, "ca_file")?;
            opts = opts.add_root_certificates(ca.clone());
        }
        if let Some((cert, key)) = &self.client {
            certificates(cert, "cert_file")?;
            let pem = read(key, "key_file")?;
            PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
                format!(
                    "NATS key_file {}: no usable PRIVATE KEY block ({e})",
                    key.display()
                )
            })?;
            opts = opts.add_client_certificate(cert.clone(), key.clone());
        }
        Ok(opts)
    }

    /// One connection attempt with `opts` (built like the real ones, without retrying): a certificate the
    /// handshake refuses is an `Err` with the reason; anything else (unreachable, auth) is left to the caller's
    /// retrying connection. Nothing is tried when TLS is not configured.
    pub async fn refuse_bad_certificates(
        &self,
        url: &str,
        opts: async_nats::ConnectOptions,
    ) -> Result<(), String> {
        if self.is_off() {
            return Ok(());
        }
        let attempt =
            tokio::time::timeout(PROBE_TIMEOUT, opts.connect(crate::nats::servers(url))).await;
        if let Ok(Err(e)) = attempt {
            let words = self.explain(&e);
            if words.starts_with("TLS: ") {
                return Err(format!("NATS at {url}: {words}"));
            }
        }
        Ok(())
    }

    /// A connection error in words (its whole source chain): for a certificate the handshake refused, what is
    /// wrong and which file. The kind comes from the error's type ([`fleet_wire::tls_problem`]), not its text.
    pub fn explain(&self, error: &(dyn std::error::Error + 'static)) -> String {
        use fleet_wire::tls_problem::TlsProblem as P;
        let text = crate::nats::error_chain(error);
        let Some(problem) = fleet_wire::tls_problem::find(error) else {
            return text;
        };
        let hint = match problem {
            P::UnknownIssuer => {
                let ca = match &self.ca_file {
                    Some(p) => format!("the CA in {}", p.display()),
                    None => "the system's CAs (configure the fleet's CA file)".to_string(),
                };
                format!("the server's certificate is not signed by {ca} (unknown issuer)")
            }
            P::WrongName => {
                "the server's certificate is not valid for the host name or address of the URL \
                             (wrong host name)"
                    .into()
            }
            P::Expired => "the server's certificate has expired".into(),
            P::NotValidYet => {
                "the server's certificate is not valid yet (check this host's clock)".into()
            }
            P::ClientCertRequired => {
                "the server requires a client certificate (cert_file and key_file)".into()
            }
            P::NotTls => "the server did not answer with TLS; no plain fallback".into(),
        };
        format!("TLS: {hint}: {text}")
    }
}

fn read(path: &Path, what: &str) -> Result<Vec<u8>, String> {
    fleet_wire::bounded::read(path, TLS_FILE_MAX_BYTES).map_err(|e| format!("NATS {what} {e}"))
}

fn certificates(path: &Path, what: &str) -> Result<(), String> {
    let pem = read(path, what)?;
    let n = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("NATS {what} {}: not PEM certificates ({e})", path.display()))?
        .len();
    if n == 0 {
        return Err(format!(
            "NATS {what} {}: no CERTIFICATE block in the file",
            path.display()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_checked_and_named() {
        assert!(NatsTls::new(None, Some("/c".into()), None, "--nats-").is_err());
        let dir = tempfile::tempdir().expect("dir");
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "junk").expect("write");
        let t = NatsTls::new(Some(junk.clone()), None, None, "").expect("ok");
        let e = t
            .apply(async_nats::ConnectOptions::new())
            .expect_err("junk CA");
        assert!(e.contains("ca_file") && e.contains("junk.pem"), "{e}");
        let t = NatsTls::new(Some(dir.path().join("nope.pem")), None, None, "").expect("ok");
        let e = t
            .apply(async_nats::ConnectOptions::new())
            .expect_err("missing CA");
        assert!(e.contains("nope.pem"), "{e}");
        let unknown = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
        );
        let e = t.explain(&unknown);
        assert!(
            e.contains("not signed by the CA in") && e.contains("nope.pem"),
            "{e}"
        );
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "UnknownIssuer");
        assert_eq!(t.explain(&refused), "UnknownIssuer");
    }
}
