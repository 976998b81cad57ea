//! A real `fleetlock-server` process for tests and the benchmark, and a small blocking HTTP/1.1 client for the
//! FleetLock protocol over one keep-alive connection (the device-side client lives in fleet-updater).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

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

/// A keep-alive connection.
pub struct Conn {
    addr: SocketAddr,
    reader: BufReader<TcpStream>,
}

impl Conn {
    /// Connects with 10 s time-outs.
    pub fn connect(addr: SocketAddr) -> std::io::Result<Self> {
        let s = TcpStream::connect_timeout(&addr, Duration::from_secs(10))?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        s.set_write_timeout(Some(Duration::from_secs(30)))?;
        s.set_nodelay(true)?;
        Ok(Self {
            addr,
            reader: BufReader::new(s),
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

fn read_answer(r: &mut BufReader<TcpStream>) -> std::io::Result<Answer> {
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

/// A `fleetlock-server` child process on a free loopback port, killed (SIGKILL) on drop. For tests and the
/// benchmark, which pass the binary's path.
pub struct ServerProcess {
    child: Option<std::process::Child>,
    bin: std::path::PathBuf,
    config: std::path::PathBuf,
    log: std::path::PathBuf,
    rust_log: String,
    /// Where it listens.
    pub addr: SocketAddr,
}

/// A free loopback port (bind to port 0, read it, release it).
pub fn free_addr() -> std::io::Result<SocketAddr> {
    std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()
}

impl ServerProcess {
    /// Starts `bin --listen <free port> --config <config>` and waits until `/healthz` answers. Its log goes to
    /// `<config>.<port>.log`, at level `$FLEETLOCK_LOG` (default `warn`).
    pub fn start(bin: &std::path::Path, config: &std::path::Path) -> Result<Self, String> {
        let level = std::env::var("FLEETLOCK_LOG").unwrap_or_else(|_| "warn".into());
        Self::start_logging(bin, config, &level)
    }

    /// [`ServerProcess::start`] with the log filter `rust_log` (e.g. `info` to see grants and releases).
    pub fn start_logging(
        bin: &std::path::Path,
        config: &std::path::Path,
        rust_log: &str,
    ) -> Result<Self, String> {
        let addr = free_addr().map_err(|e| e.to_string())?;
        let mut s = Self {
            child: None,
            bin: bin.to_path_buf(),
            config: config.to_path_buf(),
            log: config.with_extension(format!("{}.log", addr.port())),
            rust_log: rust_log.to_owned(),
            addr,
        };
        s.restart()?;
        Ok(s)
    }

    /// Starts the process again on the same address (after [`ServerProcess::kill`]).
    pub fn restart(&mut self) -> Result<(), String> {
        self.kill();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| format!("{}: {e}", self.log.display()))?;
        let child = std::process::Command::new(&self.bin)
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
            if let Ok(a) =
                Conn::connect(self.addr).and_then(|mut c| c.request("GET", "/healthz", &[], b""))
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

    /// A new connection.
    pub fn conn(&self) -> std::io::Result<Conn> {
        Conn::connect(self.addr)
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
