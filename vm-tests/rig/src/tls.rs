//! A throw-away certificate authority for tests (rcgen, ECDSA P-256): its root as PEM file and DER, and server
//! certificates for `127.0.0.1`, `localhost` and `10.0.2.2` and client certificates (mTLS) issued by it, written to a temporary
//! directory.

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use std::path::{Path, PathBuf};

/// A test CA; its files live in a temporary directory removed on drop.
pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
    dir: tempfile::TempDir,
    ca_file: PathBuf,
}

/// A server certificate and key issued by a [`TestCa`].
pub struct ServerCert {
    /// The certificate chain (leaf only; the client trusts the CA).
    pub chain: Vec<CertificateDer<'static>>,
    /// The leaf's private key (PKCS#8).
    pub key: PrivateKeyDer<'static>,
    /// The leaf certificate as a PEM file.
    pub cert_file: PathBuf,
    /// The private key as a PEM file.
    pub key_file: PathBuf,
}

impl TestCa {
    /// Generates a new CA. Panics (failing the test) if generation fails.
    pub fn new() -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new())
            .unwrap_or_else(|e| panic!("CA params: {e}"));
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate().unwrap_or_else(|e| panic!("CA key: {e}"));
        // A name of its own per CA (from its key), as two real CAs would have: a certificate of another test CA is
        // then an unknown issuer to a client, not a bad signature from a same-named one.
        let tag: String = key.public_key_raw()[1..5]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        params
            .distinguished_name
            .push(DnType::CommonName, format!("Harmony Fleet test CA {tag}"));
        let issuer = CertifiedIssuer::self_signed(params, key)
            .unwrap_or_else(|e| panic!("CA certificate: {e}"));
        let dir = tempfile::Builder::new()
            .prefix("fleet-ca-")
            .tempdir()
            .unwrap_or_else(|e| panic!("temp dir for the test CA: {e}"));
        let ca_file = dir.path().join("ca.pem");
        std::fs::write(&ca_file, issuer.pem()).unwrap_or_else(|e| panic!("write CA: {e}"));
        Self {
            issuer,
            dir,
            ca_file,
        }
    }

    /// The CA certificate (DER), to add to a client's trusted roots.
    pub fn ca_der(&self) -> CertificateDer<'static> {
        self.issuer.der().clone()
    }

    /// The CA certificate as a PEM file (for `curl --cacert` or a CA-bundle setting).
    pub fn ca_file(&self) -> &Path {
        &self.ca_file
    }

    /// Issues a server certificate for `127.0.0.1`, `localhost` and `10.0.2.2` (the host as a QEMU user-network
    /// guest reaches it); `name` names its files.
    pub fn server_cert(&self, name: &str) -> ServerCert {
        let mut params = CertificateParams::new(vec![
            "127.0.0.1".into(),
            "localhost".into(),
            "10.0.2.2".into(),
        ])
        .unwrap_or_else(|e| panic!("server params: {e}"));
        params
            .distinguished_name
            .push(DnType::CommonName, "127.0.0.1");
        self.issue(params, name)
    }

    /// Issues a client certificate (extended key usage clientAuth) with common name `name`, for mTLS; its files
    /// are named `<name>-client.*`.
    pub fn client_cert(&self, name: &str) -> ServerCert {
        let mut params = CertificateParams::new(Vec::<String>::new())
            .unwrap_or_else(|e| panic!("client params: {e}"));
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.issue(params, &format!("{name}-client"))
    }

    /// Signs `params` with a new key and writes `<file_name>.crt` and `<file_name>.key`.
    fn issue(&self, params: CertificateParams, file_name: &str) -> ServerCert {
        let key = KeyPair::generate().unwrap_or_else(|e| panic!("key: {e}"));
        let cert = params
            .signed_by(&key, &self.issuer)
            .unwrap_or_else(|e| panic!("certificate {file_name}: {e}"));
        let cert_file = self.dir.path().join(format!("{file_name}.crt"));
        let key_file = self.dir.path().join(format!("{file_name}.key"));
        std::fs::write(&cert_file, cert.pem()).unwrap_or_else(|e| panic!("write cert: {e}"));
        std::fs::write(&key_file, key.serialize_pem()).unwrap_or_else(|e| panic!("write key: {e}"));
        ServerCert {
            chain: vec![cert.der().clone()],
            key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            cert_file,
            key_file,
        }
    }

    /// A ureq agent that trusts only this CA (for test clients such as registry pushes).
    pub fn client(&self) -> ureq::Agent {
        use ureq::tls::{Certificate, RootCerts, TlsConfig};
        let roots =
            RootCerts::new_with_certs(&[Certificate::from_der(self.ca_der().as_ref()).to_owned()]);
        ureq::Agent::config_builder()
            .tls_config(TlsConfig::builder().root_certs(roots).build())
            .http_status_as_error(false)
            .max_redirects(0)
            .timeout_global(Some(std::time::Duration::from_secs(60)))
            .build()
            .new_agent()
    }
}

impl Default for TestCa {
    fn default() -> Self {
        Self::new()
    }
}
