//! The byte stream under the protocol: plain TCP or TLS (rustls 0.23, ring) over it, owned by one thread.
//!
//! After the handshake the socket is non-blocking and only the connection's I/O thread touches it. Reads drain
//! rustls' decrypted plaintext before the socket is read again and report "nothing more" only when both are
//! empty, so no decrypted frame can wait inside the TLS session while the thread sleeps in poll(2).

use crate::failure::tls_error;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;

/// PEM bundles of the system's CAs, tried in turn when no CA is given (Debian/Ubuntu, Fedora/RHEL, Alpine/SUSE).
const SYSTEM_CA_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
];
/// Largest system CA bundle read.
const SYSTEM_CA_MAX_BYTES: u64 = 4 * 1024 * 1024;

/// TLS settings, as PEM bytes (the caller reads and checks its files, naming them in its errors).
#[derive(Clone, Default)]
pub struct TlsOptions {
    /// CA certificates that replace the system's (the fleet's private CA).
    pub ca_pem: Option<Vec<u8>>,
    /// Client certificate chain and private key, shown to a server that asks (mTLS).
    pub client: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for TlsOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("TlsOptions")
            .field("ca_pem", &self.ca_pem.as_ref().map(Vec::len))
            .field("client", &self.client.is_some())
            .finish()
    }
}

fn certs(pem: &[u8], what: &str) -> io::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{what}: {e}")))?;
    if certs.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{what}: no CERTIFICATE block"),
        ));
    }
    Ok(certs)
}

fn system_roots() -> io::Result<Vec<u8>> {
    for path in SYSTEM_CA_BUNDLES {
        let mut bytes = Vec::new();
        if std::fs::File::open(path)
            .and_then(|f| f.take(SYSTEM_CA_MAX_BYTES).read_to_end(&mut bytes))
            .is_ok()
            && !bytes.is_empty()
        {
            return Ok(bytes);
        }
    }
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        format!(
            "no CA given and no system CA bundle ({})",
            SYSTEM_CA_BUNDLES.join(", ")
        ),
    ))
}

/// The rustls client configuration for `opts` (ring provider, TLS 1.2 and 1.3, verification always on).
pub fn client_config(opts: &TlsOptions) -> io::Result<Arc<rustls::ClientConfig>> {
    let ca = match &opts.ca_pem {
        Some(p) => p.clone(),
        None => system_roots()?,
    };
    let mut roots = rustls::RootCertStore::empty();
    for c in certs(&ca, "CA")? {
        // A system bundle may hold a certificate webpki cannot use; a given CA must be usable.
        if let Err(e) = roots.add(c) {
            if opts.ca_pem.is_some() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("CA: {e}"),
                ));
            }
        }
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| io::Error::other(e.to_string()))?
    .with_root_certificates(roots);
    let config = match &opts.client {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let chain = certs(cert, "client certificate")?;
            let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| {
                io::Error::new(io::ErrorKind::InvalidData, format!("client key: {e}"))
            })?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?
        }
    };
    Ok(Arc::new(config))
}

/// The connection's stream.
pub(crate) enum Transport {
    /// Plain TCP.
    Plain(TcpStream),
    /// TLS over TCP.
    Tls(TcpStream, Box<rustls::ClientConnection>),
}

impl Transport {
    /// Starts TLS on `sock` (still blocking, with its time-outs set) and completes the handshake.
    pub(crate) fn start_tls(
        mut sock: TcpStream,
        config: Arc<rustls::ClientConfig>,
        host: &str,
    ) -> io::Result<Transport> {
        let name = ServerName::try_from(host.to_owned()).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("TLS server name {host:?}: {e}"),
            )
        })?;
        let mut tls = rustls::ClientConnection::new(config, name).map_err(tls_error)?;
        while tls.is_handshaking() {
            tls.complete_io(&mut sock)?;
        }
        Ok(Transport::Tls(sock, Box::new(tls)))
    }

    /// The socket (for poll(2) and time-outs).
    pub(crate) fn socket(&self) -> &TcpStream {
        match self {
            Transport::Plain(s) | Transport::Tls(s, _) => s,
        }
    }

    /// Reads what is there into `buf`: `Ok(0)` at the end of the stream, `WouldBlock` only when neither the
    /// TLS session nor the socket has anything (on a blocking socket, waits for data as `read` does).
    pub(crate) fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Transport::Plain(s) => s.read(buf),
            Transport::Tls(s, tls) => loop {
                match tls.reader().read(buf) {
                    Ok(n) => return Ok(n),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
                if tls.read_tls(s)? == 0 {
                    return Ok(0);
                }
                let state = tls.process_new_packets().map_err(tls_error)?;
                if state.peer_has_closed() && state.plaintext_bytes_to_read() == 0 {
                    return Ok(0);
                }
                // The session may have something to send back (an alert, a key update).
                if tls.wants_write() {
                    match tls.write_tls(s) {
                        Ok(_) => {}
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                        Err(e) => return Err(e),
                    }
                }
            },
        }
    }

    /// Hands `data` to the stream: how much of it was taken (0 when the socket or the TLS buffer is full).
    pub(crate) fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        match self {
            Transport::Plain(s) => match s.write(data) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
                r => r,
            },
            Transport::Tls(s, tls) => {
                let n = tls.writer().write(data)?;
                Self::send_tls(s, tls)?;
                Ok(n)
            }
        }
    }

    fn send_tls(s: &mut TcpStream, tls: &mut rustls::ClientConnection) -> io::Result<()> {
        while tls.wants_write() {
            match tls.write_tls(s) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Sends TLS records already made; whether bytes still wait for the socket.
    pub(crate) fn pending(&mut self) -> io::Result<bool> {
        match self {
            Transport::Plain(_) => Ok(false),
            Transport::Tls(s, tls) => {
                Self::send_tls(s, tls)?;
                Ok(tls.wants_write())
            }
        }
    }

    /// Writes all of `data` on a blocking socket (the handshake phase).
    pub(crate) fn write_all_blocking(&mut self, data: &[u8]) -> io::Result<()> {
        match self {
            Transport::Plain(s) => s.write_all(data),
            Transport::Tls(s, tls) => {
                tls.writer().write_all(data)?;
                while tls.wants_write() {
                    tls.write_tls(s)?;
                }
                Ok(())
            }
        }
    }
}
