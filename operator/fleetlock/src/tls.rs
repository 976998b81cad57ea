//! HTTPS for fleetlock-server: the certificate chain and key from PEM files, re-read when either changes on disk so
//! that a rotated certificate is served without a restart (invalid new files keep the last good pair in force).

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

/// How the server listens: HTTPS from certificate files, or plain HTTP (only when asked for explicitly).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listener {
    /// TLS with this certificate chain and key (PEM files).
    Https(CertFiles),
    /// Plain HTTP: tokens and passwords cross the network readable.
    PlainHttp,
}

/// The PEM files of the served certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertFiles {
    /// The certificate chain, leaf first.
    pub cert: PathBuf,
    /// The leaf's private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// Serves the last good certificate and reloads it when the files change.
#[derive(Debug)]
pub struct CertReloader {
    files: CertFiles,
    provider: Arc<CryptoProvider>,
    current: RwLock<Arc<CertifiedKey>>,
    /// The file contents last looked at (good or not), so one change is judged and logged once.
    seen: Mutex<(String, String)>,
}

impl CertReloader {
    /// Loads the pair; `Err` names the file and what is wrong with it.
    pub fn new(files: CertFiles) -> Result<Self, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let texts = read_pair(&files)?;
        let key = certified_key(&files, &texts, &provider)?;
        Ok(Self {
            files,
            provider,
            current: RwLock::new(Arc::new(key)),
            seen: Mutex::new(texts),
        })
    }

    /// Re-reads the files; when they changed and are valid, they are served from the next handshake on.
    /// `Ok(true)`: a new certificate is in force; `Ok(false)`: nothing changed; `Err`: the change is invalid and
    /// the last good certificate stays (reported once per change).
    pub fn reload(&self) -> Result<bool, String> {
        let texts = read_pair(&self.files)?;
        {
            let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
            if *seen == texts {
                return Ok(false);
            }
            seen.clone_from(&texts);
        }
        let key = certified_key(&self.files, &texts, &self.provider)?;
        if let Ok(mut c) = self.current.write() {
            *c = Arc::new(key);
        }
        Ok(true)
    }

    /// The rustls server configuration (TLS 1.2 and 1.3, HTTP/1.1) that asks this reloader for its certificate.
    pub fn server_config(self: &Arc<Self>) -> Result<rustls::ServerConfig, String> {
        let mut c = rustls::ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?
            .with_no_client_auth()
            .with_cert_resolver(self.clone());
        c.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(c)
    }
}

impl ResolvesServerCert for CertReloader {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let c = self.current.read().unwrap_or_else(|p| p.into_inner());
        Some(c.clone())
    }
}

fn read_pair(files: &CertFiles) -> Result<(String, String), String> {
    let read = |p: &Path, what: &str| {
        super::config::read_bounded(p).map_err(|e| format!("TLS {what}: {e}"))
    };
    Ok((read(&files.cert, "certificate")?, read(&files.key, "key")?))
}

fn certified_key(
    files: &CertFiles,
    (cert, key): &(String, String),
    provider: &CryptoProvider,
) -> Result<CertifiedKey, String> {
    let cert_err = |why: String| format!("TLS certificate {}: {why}", files.cert.display());
    let key_err = |why: String| format!("TLS key {}: {why}", files.key.display());
    let chain = CertificateDer::pem_slice_iter(cert.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| cert_err(format!("not PEM certificates ({e})")))?;
    if chain.is_empty() {
        return Err(cert_err("no CERTIFICATE block in the file".into()));
    }
    let der = PrivateKeyDer::from_pem_slice(key.as_bytes())
        .map_err(|e| key_err(format!("no usable PRIVATE KEY block ({e})")))?;
    let signing = provider
        .key_provider
        .load_private_key(der)
        .map_err(|e| key_err(e.to_string()))?;
    let certified = CertifiedKey::new(chain, signing);
    certified.keys_match().map_err(|e| {
        format!(
            "TLS: the key {} does not belong to the certificate {} ({e})",
            files.key.display(),
            files.cert.display()
        )
    })?;
    Ok(certified)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(ca: &fleet_rig::tls::TestCa, name: &str) -> (String, String) {
        let c = ca.server_cert(name);
        let read = |p: &Path| std::fs::read_to_string(p).expect("read");
        (read(&c.cert_file), read(&c.key_file))
    }

    #[test]
    fn reload_keeps_the_last_good_pair_and_names_the_file() {
        let dir = tempfile::tempdir().expect("dir");
        let files = CertFiles {
            cert: dir.path().join("cert.pem"),
            key: dir.path().join("key.pem"),
        };
        let ca = fleet_rig::tls::TestCa::new();
        let (c1, k1) = pair(&ca, "one");
        std::fs::write(&files.cert, &c1).expect("write");
        std::fs::write(&files.key, &k1).expect("write");
        let r = Arc::new(CertReloader::new(files.clone()).expect("loads"));
        assert_eq!(r.reload(), Ok(false), "unchanged files");
        let first = r.current.read().expect("lock").cert.clone();

        // A new certificate without its key yet: refused, the old pair stays, and the same state is not re-judged.
        let (c2, k2) = pair(&ca, "two");
        std::fs::write(&files.cert, &c2).expect("write");
        let e = r.reload().expect_err("mismatch");
        assert!(e.contains("does not belong"), "{e}");
        assert_eq!(r.current.read().expect("lock").cert, first);
        assert_eq!(r.reload(), Ok(false));
        // The key follows: the new pair is served.
        std::fs::write(&files.key, &k2).expect("write");
        assert_eq!(r.reload(), Ok(true));
        assert_ne!(r.current.read().expect("lock").cert, first);

        std::fs::write(&files.cert, "garbage").expect("write");
        let e = r.reload().expect_err("garbage");
        assert!(
            e.contains("cert.pem") && e.contains("no CERTIFICATE"),
            "{e}"
        );
        std::fs::remove_file(&files.key).expect("rm");
        let e = r.reload().expect_err("gone");
        assert!(e.contains("key.pem"), "{e}");
        let e = CertReloader::new(files).expect_err("missing key");
        assert!(e.starts_with("TLS key") && e.contains("key.pem"), "{e}");
    }
}
