//! TLS of the agent's NATS connection: the `ca_file` / `cert_file` / `key_file` of `[nats]` checked and handed to
//! the client (verification always on, no plain fallback once TLS is configured), and handshake failures said in
//! words that name the file to look at.

use crate::config::NatsTls;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::path::Path;

/// Largest CA, certificate or key file read, in bytes.
pub const TLS_FILE_MAX_BYTES: u64 = 1024 * 1024;

fn read(path: &Path, what: &str) -> Result<Vec<u8>, String> {
    fleet_wire::bounded::read(path, TLS_FILE_MAX_BYTES).map_err(|e| format!("nats.{what} {e}"))
}

fn certificates(path: &Path, what: &str) -> Result<Vec<u8>, String> {
    let pem = read(path, what)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("nats.{what} {}: not PEM certificates ({e})", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "nats.{what} {}: no CERTIFICATE block in the file",
            path.display()
        ));
    }
    Ok(pem)
}

/// Checks the configured files (readable, PEM with what they must hold) so that a mistake is reported with the
/// file's name before any connection, then sets them on `opts`: the CA replaces the system roots, the client
/// certificate is shown to a server that asks (mTLS), and TLS is required — a server that offers only plain
/// connections is refused. Without TLS settings `opts` is left as it is (a `tls://` URL then uses the system
/// roots). The files are read again on every connection attempt, like the token file.
pub fn apply(opts: &mut fleet_nats::Options, tls: &NatsTls) -> Result<(), String> {
    if tls.is_off() {
        return Ok(());
    }
    let mut t = fleet_nats::TlsOptions::default();
    if let Some(ca) = &tls.ca_file {
        t.ca_pem = Some(certificates(ca, "ca_file")?);
    }
    if let Some(c) = &tls.client {
        let cert = certificates(&c.cert_file, "cert_file")?;
        let key = read(&c.key_file, "key_file")?;
        PrivateKeyDer::from_pem_slice(&key).map_err(|e| {
            format!(
                "nats.key_file {}: no usable PRIVATE KEY block ({e})",
                c.key_file.display()
            )
        })?;
        t.client = Some((cert, key));
    }
    opts.tls = Some(t);
    Ok(())
}

/// A connection error in words: for a certificate the handshake refused, what is wrong and which file to check.
/// The kind comes from the error's type ([`fleet_nats::tls_problem`]), not from its text.
pub fn explain(error: &std::io::Error, tls: &NatsTls) -> String {
    use fleet_nats::TlsProblem as P;
    let Some(problem) = fleet_nats::tls_problem(error) else {
        return error.to_string();
    };
    let hint = match problem {
        P::UnknownIssuer => {
            let ca = match &tls.ca_file {
                Some(p) => format!("the CA in nats.ca_file {}", p.display()),
                None => "the system's CAs (set nats.ca_file to the fleet's CA)".to_string(),
            };
            format!("the server's certificate is not signed by {ca} (unknown issuer)")
        }
        P::WrongName => "the server's certificate is not valid for the host name or address in nats.urls \
                         (wrong host name)"
            .into(),
        P::Expired => "the server's certificate has expired".into(),
        P::NotValidYet => "the server's certificate is not valid yet (check the device's clock)".into(),
        P::ClientCertRequired => {
            "the server requires a client certificate: set nats.cert_file and nats.key_file".into()
        }
        P::NotTls => {
            "the server did not answer with TLS (is it a TLS-enabled nats-server?); no plain fallback".into()
        }
    };
    format!("TLS: {hint}: {error}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ClientCert;
    use std::path::PathBuf;

    #[test]
    fn handshake_errors_are_explained() {
        use rustls::CertificateError as C;
        let tls = NatsTls {
            ca_file: Some(PathBuf::from("/etc/harmony-fleet/nats-ca.pem")),
            client: None,
        };
        let data = |e: rustls::Error| std::io::Error::new(std::io::ErrorKind::InvalidData, e);
        for (err, words) in [
            (
                data(rustls::Error::InvalidCertificate(C::UnknownIssuer)),
                "not signed by the CA in nats.ca_file /etc/harmony-fleet/nats-ca.pem",
            ),
            (
                data(rustls::Error::InvalidCertificate(C::NotValidForName)),
                "wrong host name",
            ),
            (
                data(rustls::Error::InvalidCertificate(C::Expired)),
                "has expired",
            ),
            (
                data(rustls::Error::InvalidCertificate(C::NotValidYet)),
                "check the device's clock",
            ),
            (
                data(rustls::Error::AlertReceived(
                    rustls::AlertDescription::CertificateRequired,
                )),
                "set nats.cert_file",
            ),
            (
                data(rustls::Error::InvalidMessage(
                    rustls::InvalidMessage::InvalidContentType,
                )),
                "no plain fallback",
            ),
        ] {
            let e = explain(&err, &tls);
            assert!(e.contains(words) && e.contains(&err.to_string()), "{e}");
        }
        // The words alone explain nothing: only the error's kind does.
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "UnknownIssuer");
        assert_eq!(explain(&refused, &tls), "UnknownIssuer");
    }

    #[test]
    fn bad_files_are_named() {
        let dir = tempfile::tempdir().expect("dir");
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "hello").expect("write");
        let missing = dir.path().join("missing.pem");
        let opts = || fleet_nats::Options::new("tls://127.0.0.1:1");
        let tls = |ca: &Path| NatsTls {
            ca_file: Some(ca.to_path_buf()),
            client: None,
        };
        let e = apply(&mut opts(), &tls(&missing)).expect_err("missing");
        assert!(
            e.starts_with("nats.ca_file") && e.contains("missing.pem"),
            "{e}"
        );
        let e = apply(&mut opts(), &tls(&junk)).expect_err("junk");
        assert!(
            e.contains("junk.pem") && e.contains("no CERTIFICATE"),
            "{e}"
        );
        let ca = fleet_rig::tls::TestCa::new();
        let c = ca.client_cert("device-1");
        let mtls = NatsTls {
            ca_file: Some(ca.ca_file().to_path_buf()),
            client: Some(ClientCert {
                cert_file: c.cert_file.clone(),
                key_file: junk.clone(),
            }),
        };
        let e = apply(&mut opts(), &mtls).expect_err("bad key");
        assert!(
            e.starts_with("nats.key_file") && e.contains("junk.pem"),
            "{e}"
        );
        let ok = NatsTls {
            client: Some(ClientCert {
                cert_file: c.cert_file,
                key_file: c.key_file,
            }),
            ..mtls
        };
        assert!(apply(&mut opts(), &ok).is_ok());
    }
}
