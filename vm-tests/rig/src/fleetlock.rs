//! A real `fleetlock-server` process for tests and the benchmark, and a small blocking HTTP/1.1 client for the
//! FleetLock protocol over one keep-alive connection, plain or TLS with a given CA (the device-side client lives in
//! fleet-updater).

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The server's log level: `$FLEETLOCK_LOG`, default `warn`.
fn default_log_level() -> String {
    std::env::var("FLEETLOCK_LOG").unwrap_or_else(|_| "warn".into())
}

/// Largest answer read, in bytes.
pub const MAX_RESPONSE_BYTES: usize = 4 * 1024 * 1024;

/// One answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// HTTP status.
    pub status: u16,
    /// Headers, names lower-cased.
    pub headers: Vec<(String, String)>,
    /// Body.
    pub body: Vec<u8>,
}

impl Answer {
    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The error kind of a JSON error answer.
    pub fn kind(&self) -> Option<String> {
        serde_json::from_slice::<serde_json::Value>(&self.body)
            .ok()?
            .get("kind")?
            .as_str()
            .map(str::to_owned)
    }
}

/// The ids holding a slot of group `default` in a FleetLock `/v1/status` answer (none for anything else).
pub fn default_holders(status: &serde_json::Value) -> Vec<String> {
    status["groups"]
        .as_array()
        .and_then(|g| g.iter().find(|g| g["name"] == "default"))
        .and_then(|g| g["holders"].as_array())
        .map(|h| {
            h.iter()
                .filter_map(|x| x["id"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// The connection's bytes: plain TCP or TLS over it.
enum Stream {
    Plain(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Self::Plain(s) => s.read(buf),
            Self::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Self::Plain(s) => s.write(buf),
            Self::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Self::Plain(s) => s.flush(),
            Self::Tls(s) => s.flush(),
        }
    }
}

/// A TLS client configuration that trusts only the CA certificates in `ca_file` (PEM).
pub fn trust_only(ca_file: &Path) -> Result<Arc<rustls::ClientConfig>, String> {
    let mut roots = rustls::RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(ca_file)
        .and_then(|i| i.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("CA {}: {e}", ca_file.display()))?;
    for c in certs {
        roots
            .add(c)
            .map_err(|e| format!("CA {}: {e}", ca_file.display()))?;
    }
    let c = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(Arc::new(c))
}

/// A keep-alive connection.
pub struct Conn {
    addr: SocketAddr,
    reader: BufReader<Stream>,
}

impl Conn {
    fn tcp(addr: SocketAddr) -> std::io::Result<TcpStream> {
        let s = TcpStream::connect_timeout(&addr, Duration::from_secs(10))?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        s.set_write_timeout(Some(Duration::from_secs(30)))?;
        s.set_nodelay(true)?;
        Ok(s)
    }

    /// Connects with 10 s time-outs (plain HTTP).
    pub fn connect(addr: SocketAddr) -> std::io::Result<Self> {
        Ok(Self {
            addr,
            reader: BufReader::new(Stream::Plain(Self::tcp(addr)?)),
        })
    }

    /// Plain HTTP over a stream the caller connected to `addr` (e.g. from a chosen source address), with the
    /// same time-outs as [`Conn::connect`].
    pub fn from_stream(addr: SocketAddr, s: TcpStream) -> std::io::Result<Self> {
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        s.set_write_timeout(Some(Duration::from_secs(30)))?;
        s.set_nodelay(true)?;
        Ok(Self {
            addr,
            reader: BufReader::new(Stream::Plain(s)),
        })
    }

    /// Connects over TLS, verifying the server's certificate for `addr`'s IP address with `tls`; the handshake
    /// completes (or fails, e.g. with an unknown issuer) before this returns.
    pub fn connect_tls(addr: SocketAddr, tls: Arc<rustls::ClientConfig>) -> std::io::Result<Self> {
        let tcp = Self::tcp(addr)?;
        let conn = rustls::ClientConnection::new(tls, ServerName::IpAddress(addr.ip().into()))
            .map_err(std::io::Error::other)?;
        let mut s = rustls::StreamOwned::new(conn, tcp);
        while s.conn.is_handshaking() {
            s.conn.complete_io(&mut s.sock)?;
        }
        Ok(Self {
            addr,
            reader: BufReader::new(Stream::Tls(Box::new(s))),
        })
    }

    /// Sends raw bytes and reads one answer.
    pub fn raw(&mut self, request: &[u8]) -> std::io::Result<Answer> {
        self.reader.get_mut().write_all(request)?;
        read_answer(&mut self.reader)
    }

    /// Sends a request with the given extra headers and body.
    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> std::io::Result<Answer> {
        let mut req = format!("{method} {path} HTTP/1.1\r\nhost: {}\r\n", self.addr);
        for (n, v) in headers {
            req.push_str(&format!("{n}: {v}\r\n"));
        }
        req.push_str(&format!("content-length: {}\r\n\r\n", body.len()));
        let mut bytes = req.into_bytes();
        bytes.extend_from_slice(body);
        self.raw(&bytes)
    }

    /// `POST /v1/pre-reboot` (lock) or `/v1/steady-state` (release) for `id` in `group`.
    pub fn fleetlock(&mut self, lock: bool, id: &str, group: &str) -> std::io::Result<Answer> {
        self.fleetlock_with(lock, id, group, &[])
    }

    /// Like [`Conn::fleetlock`] with extra headers (e.g. `authorization`).
    pub fn fleetlock_with(
        &mut self,
        lock: bool,
        id: &str,
        group: &str,
        extra: &[(&str, &str)],
    ) -> std::io::Result<Answer> {
        let path = if lock {
            "/v1/pre-reboot"
        } else {
            "/v1/steady-state"
        };
        let body = serde_json::json!({"client_params": {"id": id, "group": group}}).to_string();
        let mut headers = vec![("fleet-lock-protocol", "true")];
        headers.extend_from_slice(extra);
        self.request("POST", path, &headers, body.as_bytes())
    }
}

fn read_answer(r: &mut BufReader<impl Read>) -> std::io::Result<Answer> {
    let bad = |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, m.to_string());
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "connection closed",
        ));
    }
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| bad("bad status line"))?;
    let mut headers = Vec::new();
    let mut len = 0usize;
    loop {
        line.clear();
        r.read_line(&mut line)?;
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((n, v)) = l.split_once(':') {
            let n = n.trim().to_ascii_lowercase();
            let v = v.trim().to_string();
            if n == "content-length" {
                len = v.parse().map_err(|_| bad("bad content-length"))?;
            }
            headers.push((n, v));
        }
        if headers.len() > 100 {
            return Err(bad("too many headers"));
        }
    }
    if len > MAX_RESPONSE_BYTES {
        return Err(bad("answer too large"));
    }
    let mut body = vec![0; len];
    r.read_exact(&mut body)?;
    Ok(Answer {
        status,
        headers,
        body,
    })
}

/// The files of an HTTPS server process and the CA its clients trust.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// The served certificate chain (PEM).
    pub cert: PathBuf,
    /// Its key (PEM).
    pub key: PathBuf,
    /// The CA the test's clients trust (PEM).
    pub ca: PathBuf,
}

/// A `fleetlock-server` child process on a free loopback port, killed (SIGKILL) on drop. For tests and the
/// benchmark, which pass the binary's path.
pub struct ServerProcess {
    child: Option<std::process::Child>,
    bin: std::path::PathBuf,
    config: std::path::PathBuf,
    log: std::path::PathBuf,
    rust_log: String,
    tls: Option<(TlsFiles, Arc<rustls::ClientConfig>)>,
    /// Where it listens.
    pub addr: SocketAddr,
}

/// A 3-node NATS cluster (its meta leader elected) and `<dir>/config.yaml`: the NATS store on it with a bucket of 3
/// copies, then `yaml`.
pub fn nats_cluster_config(
    dir: &Path,
    yaml: &str,
) -> Result<(crate::NatsCluster, PathBuf), String> {
    let cluster = crate::NatsCluster::start(3);
    cluster.wait_meta_leader(Duration::from_secs(30));
    let cfg = dir.join("config.yaml");
    let store = format!(
        "store: {{kind: nats, url: \"{}\", replicas: 3}}\n",
        cluster.url_list()
    );
    std::fs::write(&cfg, store + yaml).map_err(|e| format!("{}: {e}", cfg.display()))?;
    Ok((cluster, cfg))
}

/// The value of the first line of a Prometheus text that starts with `series` (a name, or a name with its labels
/// such as `fleetlock_connections_refused_total{reason="per-client"}`), if it is a whole number.
pub fn metric(text: &str, series: &str) -> Option<u64> {
    text.lines()
        .filter(|l| l.starts_with(series))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

/// A free loopback port (bind to port 0, read it, release it).
pub fn free_addr() -> std::io::Result<SocketAddr> {
    std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()
}

impl ServerProcess {
    /// Starts `bin --listen <free port> --config <config> --plain-http` and waits until `/healthz` answers. Its
    /// log goes to `<config>.<port>.log`, at level `$FLEETLOCK_LOG` (default `warn`).
    pub fn start(bin: &std::path::Path, config: &std::path::Path) -> Result<Self, String> {
        Self::start_with(bin, config, None, &default_log_level())
    }

    /// [`ServerProcess::start`] with the log filter `rust_log` (e.g. `info` to see grants and releases).
    pub fn start_logging(
        bin: &std::path::Path,
        config: &std::path::Path,
        rust_log: &str,
    ) -> Result<Self, String> {
        Self::start_with(bin, config, None, rust_log)
    }

    /// Like [`ServerProcess::start`], serving HTTPS with `tls`'s certificate; its connections trust only `tls.ca`.
    pub fn start_tls(
        bin: &std::path::Path,
        config: &std::path::Path,
        tls: TlsFiles,
    ) -> Result<Self, String> {
        Self::start_with(bin, config, Some(tls), &default_log_level())
    }

    fn start_with(
        bin: &std::path::Path,
        config: &std::path::Path,
        tls: Option<TlsFiles>,
        rust_log: &str,
    ) -> Result<Self, String> {
        let addr = free_addr().map_err(|e| e.to_string())?;
        let tls = match tls {
            Some(t) => {
                let client = trust_only(&t.ca)?;
                Some((t, client))
            }
            None => None,
        };
        let mut s = Self {
            child: None,
            bin: bin.to_path_buf(),
            config: config.to_path_buf(),
            log: config.with_extension(format!("{}.log", addr.port())),
            rust_log: rust_log.to_owned(),
            tls,
            addr,
        };
        s.restart()?;
        Ok(s)
    }

    /// `https://…` or `http://…` with the address.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// Starts the process again on the same address (after [`ServerProcess::kill`]).
    pub fn restart(&mut self) -> Result<(), String> {
        self.kill();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| format!("{}: {e}", self.log.display()))?;
        let mut cmd = std::process::Command::new(&self.bin);
        match &self.tls {
            Some((t, _)) => cmd
                .arg("--tls-cert")
                .arg(&t.cert)
                .arg("--tls-key")
                .arg(&t.key),
            None => cmd.arg("--plain-http"),
        };
        let child = cmd
            .arg("--listen")
            .arg(self.addr.to_string())
            .arg("--config")
            .arg(&self.config)
            .env("RUST_LOG", &self.rust_log)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("{}: {e}", self.bin.display()))?;
        self.child = Some(child);
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(a) = self
                .conn()
                .and_then(|mut c| c.request("GET", "/healthz", &[], b""))
            {
                if a.status == 200 {
                    return Ok(());
                }
            }
            if let Some(Ok(Some(st))) = self.child.as_mut().map(|c| c.try_wait()) {
                let text = std::fs::read_to_string(&self.log).unwrap_or_default();
                return Err(format!("fleetlock-server exited with {st}: {text}"));
            }
            if std::time::Instant::now() > deadline {
                return Err("fleetlock-server not healthy within 30 s".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL, and wait for the process to go.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// A new connection (over TLS trusting only the CA, when the server serves HTTPS).
    pub fn conn(&self) -> std::io::Result<Conn> {
        match &self.tls {
            Some((_, client)) => Conn::connect_tls(self.addr, client.clone()),
            None => Conn::connect(self.addr),
        }
    }

    /// `GET /metrics` on a new connection: the Prometheus text.
    pub fn metrics(&self) -> std::io::Result<String> {
        Ok(self.conn()?.request("GET", "/metrics", &[], b"")?.text())
    }

    /// The ids holding a slot in any group (`GET /v1/status` on a new connection), sorted.
    pub fn holder_ids(&self) -> Result<Vec<String>, String> {
        let a = self
            .conn()
            .and_then(|mut c| c.request("GET", "/v1/status", &[], b""))
            .map_err(|e| e.to_string())?;
        if a.status != 200 {
            return Err(format!("status {}: {}", a.status, a.text()));
        }
        let v: serde_json::Value = serde_json::from_slice(&a.body).map_err(|e| e.to_string())?;
        let mut ids: Vec<String> = v["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["holders"].as_array().cloned().unwrap_or_default())
            .filter_map(|h| h["id"].as_str().map(str::to_string))
            .collect();
        ids.sort();
        Ok(ids)
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}
