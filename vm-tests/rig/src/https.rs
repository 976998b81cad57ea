//! An HTTPS server for tests (rustls, ring, a [`TestCa`] certificate) on a free loopback port, whose answers a
//! test scripts per request: a body, a declared length larger than what follows, an endless-ish stream without
//! length, a redirect, a stall after the headers, or a file streamed from disk.

use crate::tls::TestCa;
use rustls::{ServerConfig, ServerConnection, StreamOwned};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Largest request head the server reads, in bytes.
const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Largest request body the server reads, in bytes.
const MAX_BODY_BYTES: usize = 1024 * 1024;
/// Write chunk for streamed bodies.
const CHUNK: usize = 64 * 1024;
/// Longest a stalled answer holds its connection open.
const MAX_STALL: Duration = Duration::from_secs(600);

/// One request as the server saw it.
#[derive(Debug, Clone)]
pub struct Request {
    /// `GET`, `HEAD`, ...
    pub method: String,
    /// Path and query as sent.
    pub target: String,
    /// Headers in order, names lowercased.
    pub headers: Vec<(String, String)>,
    /// The body (at most 1 MiB is read).
    pub body: Vec<u8>,
}

impl Request {
    /// The first header called `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The path without the query.
    pub fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or("")
    }

    /// The decoded value of query parameter `key` (percent-decoding only; enough for tests).
    pub fn query(&self, key: &str) -> Option<String> {
        let q = self.target.split_once('?')?.1;
        q.split('&').find_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            (k == key).then(|| percent_decode(v))
        })
    }
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(v) => {
                        out.push(v);
                        i += 3;
                    }
                    Err(_) => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// What the server answers.
#[derive(Debug, Clone)]
pub enum Reply {
    /// A complete answer with `Content-Length`.
    Body {
        /// HTTP status.
        status: u16,
        /// Extra headers.
        headers: Vec<(String, String)>,
        /// The body.
        body: Arc<Vec<u8>>,
    },
    /// `200` declaring `declared` bytes but sending only `sent` (zeros) before closing.
    DeclaredLength {
        /// The `Content-Length` sent.
        declared: u64,
        /// Bytes actually sent.
        sent: u64,
    },
    /// `200` without `Content-Length`, streaming `bytes` bytes and then closing the connection.
    Unsized {
        /// Bytes sent.
        bytes: u64,
    },
    /// A redirect to `location`.
    Redirect {
        /// 301, 302, 307 or 308.
        status: u16,
        /// The `Location` header.
        location: String,
    },
    /// `200` with headers declaring `content_length`, then nothing until the client gives up (or 10 minutes).
    StallAfterHeaders {
        /// The `Content-Length` sent.
        content_length: u64,
    },
    /// `200` streaming a file with `Content-Length` (benchmarks).
    File(PathBuf),
    /// `status` with `headers`, sending `body[start..]` with `Content-Length: len - start`, but cutting the
    /// connection (TCP closed, no TLS close_notify) after `cut_after` bytes when set: a link that drops.
    Slice {
        /// HTTP status (200 or 206).
        status: u16,
        /// Extra headers (`Content-Range`, `ETag` …).
        headers: Vec<(String, String)>,
        /// The whole content.
        body: Arc<Vec<u8>>,
        /// First byte sent.
        start: usize,
        /// Bytes sent before the connection drops; `None`: all.
        cut_after: Option<u64>,
    },
}

impl Reply {
    /// `200` with `body`.
    pub fn ok(body: impl Into<Vec<u8>>) -> Self {
        Reply::Body {
            status: 200,
            headers: Vec::new(),
            body: Arc::new(body.into()),
        }
    }

    /// `status` with a short text body and extra `headers`.
    pub fn status(status: u16, headers: &[(&str, &str)]) -> Self {
        Reply::Body {
            status,
            headers: headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            body: Arc::new(format!("status {status}\n").into_bytes()),
        }
    }

    /// What a static file server with range support answers `req` for `body` (identified by `etag`): `206`
    /// with `Content-Range` for `Range: bytes=N-` (when `If-Range`, if sent, equals `etag`), `416` for a range
    /// past the end, else `200` with everything; the connection drops after `cut_after` bytes when set.
    pub fn ranged(req: &Request, body: Arc<Vec<u8>>, etag: &str, cut_after: Option<u64>) -> Self {
        let len = body.len();
        let mut headers = vec![
            ("ETag".to_string(), etag.to_string()),
            ("Accept-Ranges".to_string(), "bytes".to_string()),
        ];
        let from = req
            .header("range")
            .and_then(|r| r.strip_prefix("bytes="))
            .and_then(|r| r.strip_suffix('-'))
            .and_then(|n| n.parse::<usize>().ok())
            .filter(|_| req.header("if-range").is_none_or(|v| v == etag));
        match from {
            Some(n) if n >= len => Reply::Body {
                status: 416,
                headers: vec![("Content-Range".into(), format!("bytes */{len}"))],
                body: Arc::new(Vec::new()),
            },
            Some(n) => {
                headers.push((
                    "Content-Range".into(),
                    format!("bytes {n}-{}/{len}", len - 1),
                ));
                Reply::Slice {
                    status: 206,
                    headers,
                    body,
                    start: n,
                    cut_after,
                }
            }
            None => Reply::Slice {
                status: 200,
                headers,
                body,
                start: 0,
                cut_after,
            },
        }
    }

    /// The body bytes this answer puts on the wire (for counting transferred bytes in tests and benchmarks).
    pub fn body_bytes(&self) -> u64 {
        match self {
            Reply::Body { body, .. } => body.len() as u64,
            Reply::Slice {
                body,
                start,
                cut_after,
                ..
            } => {
                let rest = body.len().saturating_sub(*start) as u64;
                cut_after.map_or(rest, |c| c.min(rest))
            }
            Reply::DeclaredLength { sent, .. } => *sent,
            Reply::Unsized { bytes } => *bytes,
            Reply::StallAfterHeaders { .. } | Reply::Redirect { .. } => 0,
            Reply::File(p) => std::fs::metadata(p).map(|m| m.len()).unwrap_or(0),
        }
    }
}

type Handler = dyn Fn(&Request) -> Reply + Send + Sync + 'static;

/// A running HTTPS server; stopped on drop.
pub struct HttpsServer {
    port: u16,
    stop: Arc<AtomicBool>,
    requests: Arc<Mutex<Vec<Request>>>,
    accept: Option<JoinHandle<()>>,
}

impl HttpsServer {
    /// Serves every request with `handler`, using a certificate from `ca`.
    pub fn start(ca: &TestCa, handler: impl Fn(&Request) -> Reply + Send + Sync + 'static) -> Self {
        let cert = ca.server_cert("https-server");
        let config =
            ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .and_then(|b| {
                    b.with_no_client_auth()
                        .with_single_cert(cert.chain, cert.key)
                })
                .unwrap_or_else(|e| panic!("rustls server config: {e}"));
        let config = Arc::new(config);
        let listener =
            TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("bind 127.0.0.1:0: {e}"));
        let port = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("local_addr: {e}"))
            .port();
        listener
            .set_nonblocking(true)
            .unwrap_or_else(|e| panic!("nonblocking: {e}"));
        let stop = Arc::new(AtomicBool::new(false));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let handler: Arc<Handler> = Arc::new(handler);
        let accept = {
            let (stop, requests) = (stop.clone(), requests.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((tcp, _)) => {
                            let (config, handler, stop, requests) = (
                                config.clone(),
                                handler.clone(),
                                stop.clone(),
                                requests.clone(),
                            );
                            std::thread::spawn(move || {
                                let _ = serve(tcp, config, &*handler, &stop, &requests);
                            });
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            std::thread::sleep(Duration::from_millis(5))
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
            })
        };
        Self {
            port,
            stop,
            requests,
            accept: Some(accept),
        }
    }

    /// Answers every request with `reply`.
    pub fn serve(ca: &TestCa, reply: Reply) -> Self {
        Self::start(ca, move |_| reply.clone())
    }

    /// The port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `https://127.0.0.1:<port><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("https://127.0.0.1:{}{path}", self.port)
    }

    /// Every request received so far.
    pub fn requests(&self) -> Vec<Request> {
        self.requests.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

impl Drop for HttpsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

fn serve(
    tcp: TcpStream,
    config: Arc<ServerConfig>,
    handler: &Handler,
    stop: &AtomicBool,
    requests: &Mutex<Vec<Request>>,
) -> std::io::Result<()> {
    tcp.set_nonblocking(false)?;
    tcp.set_read_timeout(Some(Duration::from_secs(30)))?;
    tcp.set_nodelay(true)?;
    let conn = ServerConnection::new(config).map_err(std::io::Error::other)?;
    let mut reader = BufReader::new(StreamOwned::new(conn, tcp));
    let req = read_request(&mut reader)?;
    if let Ok(mut r) = requests.lock() {
        r.push(req.clone());
    }
    let reply = handler(&req);
    let s = reader.get_mut();
    let head_only = req.method == "HEAD";
    match reply {
        Reply::Body {
            status,
            headers,
            body,
        } => {
            let mut head = head_line(status, Some(body.len() as u64));
            for (k, v) in headers {
                head.push_str(&format!("{k}: {v}\r\n"));
            }
            s.write_all(format!("{head}\r\n").as_bytes())?;
            if !head_only {
                for c in body.chunks(CHUNK) {
                    s.write_all(c)?;
                }
            }
        }
        Reply::DeclaredLength { declared, sent } => {
            s.write_all(format!("{}\r\n", head_line(200, Some(declared))).as_bytes())?;
            write_pattern(s, sent)?;
        }
        Reply::Unsized { bytes } => {
            s.write_all(format!("{}\r\n", head_line(200, None)).as_bytes())?;
            write_pattern(s, bytes)?;
        }
        Reply::Redirect { status, location } => {
            let head = head_line(status, Some(0));
            s.write_all(format!("{head}Location: {location}\r\n\r\n").as_bytes())?;
        }
        Reply::StallAfterHeaders { content_length } => {
            s.write_all(format!("{}\r\n", head_line(200, Some(content_length))).as_bytes())?;
            s.flush()?;
            let until = Instant::now() + MAX_STALL;
            while Instant::now() < until && !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Reply::Slice {
            status,
            headers,
            body,
            start,
            cut_after,
        } => {
            let rest = body.get(start..).unwrap_or_default();
            let mut head = head_line(status, Some(rest.len() as u64));
            for (k, v) in headers {
                head.push_str(&format!("{k}: {v}\r\n"));
            }
            s.write_all(format!("{head}\r\n").as_bytes())?;
            let send = cut_after.map_or(rest.len(), |c| rest.len().min(c as usize));
            if !head_only {
                for c in rest[..send].chunks(CHUNK) {
                    s.write_all(c)?;
                }
            }
            if send < rest.len() && !head_only {
                // The link drops: no close_notify, the TCP connection just ends.
                s.flush()?;
                let _ = s.sock.shutdown(std::net::Shutdown::Both);
                return Ok(());
            }
        }
        Reply::File(path) => {
            let mut f = std::fs::File::open(&path)?;
            let len = f.metadata()?.len();
            s.write_all(format!("{}\r\n", head_line(200, Some(len))).as_bytes())?;
            let mut buf = vec![0u8; CHUNK];
            loop {
                let n = f.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                s.write_all(&buf[..n])?;
            }
        }
    }
    s.flush()?;
    s.conn.send_close_notify();
    s.flush()?;
    Ok(())
}

fn head_line(status: u16, len: Option<u64>) -> String {
    let mut h = format!("HTTP/1.1 {status} Test\r\nConnection: close\r\n");
    if let Some(l) = len {
        h.push_str(&format!("Content-Length: {l}\r\n"));
    }
    h
}

fn write_pattern(s: &mut impl Write, mut bytes: u64) -> std::io::Result<()> {
    let buf = vec![0x5au8; CHUNK];
    while bytes > 0 {
        let n = bytes.min(CHUNK as u64) as usize;
        s.write_all(&buf[..n])?;
        bytes -= n as u64;
    }
    Ok(())
}

fn read_request(r: &mut impl BufRead) -> std::io::Result<Request> {
    let bad = |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, m.to_string());
    let mut lines = Vec::new();
    let mut total = 0;
    loop {
        let mut line = String::new();
        let n = r
            .by_ref()
            .take(MAX_HEAD_BYTES as u64)
            .read_line(&mut line)?;
        total += n;
        if n == 0 || total > MAX_HEAD_BYTES {
            return Err(bad("incomplete or oversized request head"));
        }
        let line = line.trim_end().to_owned();
        if line.is_empty() {
            break;
        }
        lines.push(line);
    }
    let first = lines.first().ok_or_else(|| bad("empty request"))?;
    let mut parts = first.split(' ');
    let method = parts.next().unwrap_or("").to_owned();
    let target = parts.next().unwrap_or("").to_owned();
    let headers: Vec<(String, String)> = lines[1..]
        .iter()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let mut req = Request {
        method,
        target,
        headers,
        body: Vec::new(),
    };
    let len: usize = req
        .header("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    if len > 0 {
        r.take(len.min(MAX_BODY_BYTES) as u64)
            .read_to_end(&mut req.body)?;
    }
    Ok(req)
}
