//! The HTTP and TCP health probes the agent runs against a workload's published host port on `127.0.0.1`: one
//! deadline (the check's timeout) bounds the connection, the request and the answer together, and at most
//! [`STATUS_LINE_MAX_BYTES`] of the answer are read (only its status line counts). The probes due together run
//! as one [`batch`]: every answer is waited for with one `poll`, so a batch wakes the thread about as often as one
//! probe does. No retries: the check's `retries` are the schedule's ([`crate::health`]).

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// Most bytes of an HTTP answer read to find its status line.
pub const STATUS_LINE_MAX_BYTES: usize = 1024;

/// How long a batch sleeps once, after sending its requests, before it reads the answers: the answers that came
/// meanwhile (a local server answers a health request within milliseconds) are read in one wake-up, where waiting
/// for each as it comes would wake the thread once per answer.
pub const BATCH_SETTLE: Duration = Duration::from_millis(50);

fn remaining(deadline: Instant, what: &str, timeout: Duration) -> Result<Duration, String> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        Err(format!("{what}: no answer within {}", secs(timeout)))
    } else {
        Ok(left)
    }
}

fn secs(d: Duration) -> String {
    format!("{} s", d.as_secs_f32())
}

fn connect(host_port: u16, deadline: Instant, timeout: Duration) -> Result<TcpStream, String> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, host_port));
    let left = remaining(deadline, &format!("connecting to {addr}"), timeout)?;
    TcpStream::connect_timeout(&addr, left).map_err(|e| {
        if e.kind() == std::io::ErrorKind::TimedOut || e.kind() == std::io::ErrorKind::WouldBlock {
            format!("connecting to {addr}: no answer within {}", secs(timeout))
        } else {
            format!("connecting to {addr}: {e}")
        }
    })
}

/// Starts a connection to `addr` without waiting for it: the stream (non-blocking) and whether it is made already.
fn start_connect(addr: SocketAddr) -> std::io::Result<(TcpStream, bool)> {
    use std::os::fd::FromRawFd;
    let SocketAddr::V4(v4) = addr else {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not an IPv4 address",
        ));
    };
    // SAFETY: socket(2) with constant arguments; the result is checked before use.
    let fd = unsafe {
        libc::socket(
            libc::AF_INET,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a socket just made and owned by nothing else: the stream owns (and closes) it from here.
    let stream = unsafe { TcpStream::from_raw_fd(fd) };
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: v4.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*v4.ip()).to_be(),
        },
        sin_zero: [0; 8],
    };
    let len = libc::socklen_t::try_from(std::mem::size_of::<libc::sockaddr_in>())
        .unwrap_or(libc::socklen_t::MAX);
    // SAFETY: `sin` is a valid sockaddr_in of `len` bytes for the whole call, and `fd` an open socket.
    let r = unsafe {
        libc::connect(
            stream.as_raw_fd(),
            std::ptr::addr_of!(sin).cast::<libc::sockaddr>(),
            len,
        )
    };
    if r == 0 {
        return Ok((stream, true));
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        // Under way (an interrupted connect goes on too): `poll` says when it is made, `SO_ERROR` whether.
        Some(libc::EINPROGRESS) | Some(libc::EINTR) => Ok((stream, false)),
        _ => Err(e),
    }
}

/// A TCP connection to `127.0.0.1:host_port` is accepted within `timeout`.
pub fn tcp(host_port: u16, timeout: Duration) -> Result<(), String> {
    connect(host_port, Instant::now() + timeout, timeout).map(drop)
}

/// `GET path` on `127.0.0.1:host_port` answers 2xx or 3xx within `timeout` (HTTP/1.0, `Connection: close`; a
/// redirect is not followed: answering one is healthy, as Podman's and Kubernetes' probes count it).
pub fn http(host_port: u16, path: &str, timeout: Duration) -> Result<(), String> {
    batch(&[Probe {
        host_port,
        path: Some(path.to_owned()),
        timeout,
    }])
    .pop()
    .unwrap_or_else(|| Err("no result".into()))
}

/// One probe of a [`batch`]: `GET path` (HTTP) or, without a path, a TCP connection, to `127.0.0.1:host_port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// The published host port.
    pub host_port: u16,
    /// The HTTP path; `None` for a TCP probe.
    pub path: Option<String>,
    /// The bound of this probe.
    pub timeout: Duration,
}

/// A probe waiting for its connection (both kinds) or its answer (HTTP).
struct Waiting {
    at: usize,
    stream: TcpStream,
    /// The connection is not made yet (a TCP probe is done once it is).
    connecting: bool,
    /// `127.0.0.1:<port>`.
    addr: SocketAddr,
    request: Vec<u8>,
    sent: usize,
    answer: Vec<u8>,
    deadline: Instant,
    what: String,
    timeout: Duration,
}

/// Runs `probes` at once in this thread, each bounded by its own timeout: every connection is started without
/// waiting for it (a connection the loopback has not made yet is waited for with the others, in one `poll`), every
/// request is sent, the thread sleeps [`BATCH_SETTLE`] once, and every answer is read without blocking, with one
/// `poll` over all the sockets for those still missing. A batch therefore costs about the wake-ups of one probe,
/// not one per probe (nor one per connection: waiting for each in turn cost the health thread up to one wake-up
/// per probe). The results are in `probes`' order.
pub fn batch(probes: &[Probe]) -> Vec<Result<(), String>> {
    let mut out: Vec<Option<Result<(), String>>> = vec![None; probes.len()];
    let mut waiting = Vec::new();
    for (at, p) in probes.iter().enumerate() {
        let deadline = Instant::now() + p.timeout;
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, p.host_port));
        let (stream, connected) = match start_connect(addr) {
            Ok(s) => s,
            Err(e) => {
                out[at] = Some(Err(format!("connecting to {addr}: {e}")));
                continue;
            }
        };
        if connected && p.path.is_none() {
            out[at] = Some(Ok(()));
            continue;
        }
        let what = match &p.path {
            Some(path) => format!("GET {path} on port {}", p.host_port),
            None => format!("connecting to {addr}"),
        };
        waiting.push(Waiting {
            at,
            stream,
            connecting: !connected,
            addr,
            request: p
                .path
                .as_ref()
                .map(|path| format!(
                    "GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{}\r\nUser-Agent: fleet-agent-health\r\nAccept: */*\r\nConnection: close\r\n\r\n",
                    p.host_port
                ).into_bytes())
                .unwrap_or_default(),
            sent: 0,
            answer: Vec::with_capacity(256),
            deadline,
            what,
            timeout: p.timeout,
        });
    }
    let mut settled = false;
    while !waiting.is_empty() {
        let now = Instant::now();
        waiting.retain_mut(|w| {
            let done = progress(w).or_else(|| {
                (now >= w.deadline).then(|| {
                    let what = if w.connecting {
                        format!("connecting to {}", w.addr)
                    } else {
                        w.what.clone()
                    };
                    Err(format!("{what}: no answer within {}", secs(w.timeout)))
                })
            });
            match done {
                Some(r) => {
                    out[w.at] = Some(r);
                    false
                }
                None => true,
            }
        });
        let Some(first) = waiting.iter().map(|w| w.deadline).min() else {
            break;
        };
        if !settled
            && waiting
                .iter()
                .all(|w| !w.connecting && w.sent == w.request.len())
        {
            settled = true;
            std::thread::sleep(BATCH_SETTLE.min(first.saturating_duration_since(Instant::now())));
            continue;
        }
        let mut fds: Vec<libc::pollfd> = waiting
            .iter()
            .map(|w| libc::pollfd {
                fd: w.stream.as_raw_fd(),
                events: if w.connecting || w.sent < w.request.len() {
                    libc::POLLOUT
                } else {
                    libc::POLLIN
                },
                revents: 0,
            })
            .collect();
        // Rounded up, so that a deadline less than a millisecond away is waited for, not spun on.
        let wait = first.saturating_duration_since(Instant::now());
        let ms = libc::c_int::try_from(wait.as_micros().div_ceil(1000)).unwrap_or(libc::c_int::MAX);
        let n = libc::nfds_t::try_from(fds.len()).unwrap_or(libc::nfds_t::MAX);
        // SAFETY: `fds` is a live, exclusively borrowed array of `n` pollfd for the whole call.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), n, ms) };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                for w in waiting.drain(..) {
                    out[w.at] = Some(Err(format!("{}: {e}", w.what)));
                }
            }
        }
    }
    out.into_iter()
        .map(|r| r.unwrap_or_else(|| Err("no result".into())))
        .collect()
}

/// Sends what is left of the request and reads what has come of the answer, without blocking; the result once
/// the status line is in (or the connection failed or ended). A TCP probe's result once its connection is made.
fn progress(w: &mut Waiting) -> Option<Result<(), String>> {
    use std::io::ErrorKind::{Interrupted, WouldBlock};
    if w.connecting {
        match w.stream.take_error() {
            Ok(None) => {}
            Ok(Some(e)) | Err(e) => return Some(Err(format!("connecting to {}: {e}", w.addr))),
        }
        if w.stream.peer_addr().is_err() {
            return None;
        }
        w.connecting = false;
        if w.request.is_empty() {
            return Some(Ok(()));
        }
    }
    while w.sent < w.request.len() {
        match w.stream.write(&w.request[w.sent..]) {
            Ok(0) => return Some(Err(format!("{}: the connection closed", w.what))),
            Ok(n) => w.sent += n,
            Err(e) if e.kind() == WouldBlock => return None,
            Err(e) if e.kind() == Interrupted => {}
            Err(e) => return Some(Err(format!("{}: {e}", w.what))),
        }
    }
    let mut chunk = [0u8; STATUS_LINE_MAX_BYTES];
    loop {
        if let Some(i) = w.answer.windows(2).position(|x| x == b"\r\n") {
            return Some(judge(&w.what, &w.answer[..i]));
        }
        if w.answer.len() >= STATUS_LINE_MAX_BYTES {
            return Some(Err(format!(
                "{}: no HTTP status line in the first {STATUS_LINE_MAX_BYTES} bytes",
                w.what
            )));
        }
        let room = STATUS_LINE_MAX_BYTES - w.answer.len();
        match w.stream.read(&mut chunk[..room]) {
            Ok(0) if w.answer.is_empty() => {
                return Some(Err(format!(
                    "{}: the connection closed without an answer",
                    w.what
                )))
            }
            // An answer without CRLF that ends: what came is the line.
            Ok(0) => return Some(judge(&w.what, &w.answer)),
            Ok(n) => w.answer.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == WouldBlock => return None,
            Err(e) if e.kind() == Interrupted => {}
            Err(e) => return Some(Err(format!("{}: {e}", w.what))),
        }
    }
}

/// A status line's verdict: 2xx and 3xx are healthy.
fn judge(what: &str, line: &[u8]) -> Result<(), String> {
    let line = String::from_utf8_lossy(line);
    let code = status_code(&line)
        .ok_or_else(|| format!("{what}: not an HTTP answer ({:?})", trimmed(&line)))?;
    if (200..400).contains(&code) {
        Ok(())
    } else {
        Err(format!("{what} answered HTTP {code}"))
    }
}

/// The status code of an HTTP/1.x status line (`HTTP/1.1 503 Service Unavailable` → 503).
fn status_code(line: &str) -> Option<u16> {
    let mut parts = line.split(' ');
    let version = parts.next()?;
    if !version.starts_with("HTTP/") {
        return None;
    }
    let code = parts.next()?;
    if code.len() != 3 {
        return None;
    }
    code.parse().ok()
}

fn trimmed(s: &str) -> String {
    s.chars().take(64).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A one-shot server on a free port answering every connection with `answer` (after `delay`).
    fn serve(answer: &'static [u8], delay: Duration) -> u16 {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("addr").port();
        std::thread::spawn(move || {
            for c in l.incoming().take(1) {
                let Ok(mut c) = c else { continue };
                let mut req = [0u8; 512];
                let _ = c.read(&mut req);
                std::thread::sleep(delay);
                let _ = c.write_all(answer);
            }
        });
        port
    }

    fn free_port() -> u16 {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    }

    #[test]
    fn http_answers() {
        let t = Duration::from_secs(2);
        let ok = serve(b"HTTP/1.1 204 No Content\r\n\r\n", Duration::ZERO);
        assert_eq!(http(ok, "/healthz", t), Ok(()));
        let redirect = serve(
            b"HTTP/1.0 302 Found\r\nLocation: /x\r\n\r\n",
            Duration::ZERO,
        );
        assert_eq!(http(redirect, "/", t), Ok(()));
        let bad = serve(b"HTTP/1.1 503 Service Unavailable\r\n\r\n", Duration::ZERO);
        let e = http(bad, "/healthz", t).expect_err("503");
        assert_eq!(e, format!("GET /healthz on port {bad} answered HTTP 503"));
        let junk = serve(b"SSH-2.0-OpenSSH\r\n", Duration::ZERO);
        assert!(http(junk, "/", t)
            .expect_err("junk")
            .contains("not an HTTP answer"));
        let closed = serve(b"", Duration::ZERO);
        assert!(http(closed, "/", t)
            .expect_err("closed")
            .contains("closed without an answer"));
        // An endless first line is cut at the byte limit.
        static LONG: [u8; 4096] = [b'x'; 4096];
        let long = serve(&LONG, Duration::ZERO);
        assert!(http(long, "/", t)
            .expect_err("long")
            .contains("first 1024 bytes"));
    }

    #[test]
    fn timeouts_and_refusals() {
        let slow = serve(b"HTTP/1.1 200 OK\r\n\r\n", Duration::from_millis(1500));
        let started = Instant::now();
        let e = http(slow, "/", Duration::from_millis(300)).expect_err("slow");
        assert!(e.contains("no answer within 0.3 s"), "{e}");
        assert!(started.elapsed() < Duration::from_secs(1), "bounded");
        let nobody = free_port();
        let e = tcp(nobody, Duration::from_secs(1)).expect_err("refused");
        assert!(
            e.starts_with(&format!("connecting to 127.0.0.1:{nobody}: ")),
            "{e}"
        );
        let e = http(nobody, "/", Duration::from_secs(1)).expect_err("refused");
        assert!(e.contains("connecting to"), "{e}");
        let up = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = up.local_addr().expect("addr").port();
        assert_eq!(tcp(port, Duration::from_secs(1)), Ok(()));
    }

    /// A batch waits for every answer at once: a slow server costs its own timeout, not the others' time, and the
    /// results keep the probes' order.
    #[test]
    fn a_batch_runs_its_probes_together() {
        let ok = serve(b"HTTP/1.1 200 OK\r\n\r\n", Duration::from_millis(200));
        let bad = serve(b"HTTP/1.1 500 Oops\r\n\r\n", Duration::from_millis(200));
        let slow = serve(b"HTTP/1.1 200 OK\r\n\r\n", Duration::from_secs(3));
        let up = TcpListener::bind("127.0.0.1:0").expect("bind");
        let tcp_port = up.local_addr().expect("addr").port();
        let nobody = free_port();
        let probe = |host_port, path: Option<&str>, ms| Probe {
            host_port,
            path: path.map(str::to_owned),
            timeout: Duration::from_millis(ms),
        };
        let started = Instant::now();
        let r = batch(&[
            probe(ok, Some("/a"), 2000),
            probe(bad, Some("/b"), 2000),
            probe(slow, Some("/c"), 600),
            probe(tcp_port, None, 1000),
            probe(nobody, Some("/d"), 1000),
        ]);
        let took = started.elapsed();
        assert_eq!(r[0], Ok(()));
        assert_eq!(r[1], Err(format!("GET /b on port {bad} answered HTTP 500")));
        assert_eq!(
            r[2],
            Err(format!("GET /c on port {slow}: no answer within 0.6 s"))
        );
        assert_eq!(r[3], Ok(()));
        assert!(r[4]
            .as_ref()
            .expect_err("refused")
            .starts_with("connecting to"));
        // Together: the 200-ms servers and the 600-ms timeout overlap.
        assert!(took < Duration::from_millis(1500), "{took:?}");
        assert!(batch(&[]).is_empty());
    }

    #[test]
    fn status_lines() {
        assert_eq!(status_code("HTTP/1.1 200 OK"), Some(200));
        assert_eq!(status_code("HTTP/1.0 404"), Some(404));
        assert_eq!(status_code("HTTP/2 2000 x"), None);
        assert_eq!(status_code("ICY 200 OK"), None);
    }
}
