//! The HTTP and TCP health probes the agent runs against a workload's published host port on `127.0.0.1`: one
//! deadline (the check's timeout) bounds the connection, the request and the answer together, and at most
//! [`STATUS_LINE_MAX_BYTES`] of the answer are read (only its status line counts). Blocking, no retries: the
//! check's `retries` are the schedule's ([`crate::health`]).

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// Most bytes of an HTTP answer read to find its status line.
pub const STATUS_LINE_MAX_BYTES: usize = 1024;

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

/// A TCP connection to `127.0.0.1:host_port` is accepted within `timeout`.
pub fn tcp(host_port: u16, timeout: Duration) -> Result<(), String> {
    connect(host_port, Instant::now() + timeout, timeout).map(drop)
}

/// `GET path` on `127.0.0.1:host_port` answers 2xx or 3xx within `timeout` (HTTP/1.0, `Connection: close`; a
/// redirect is not followed: answering one is healthy, as Podman's and Kubernetes' probes count it).
pub fn http(host_port: u16, path: &str, timeout: Duration) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    let what = format!("GET {path} on port {host_port}");
    let mut s = connect(host_port, deadline, timeout)?;
    let request = format!(
        "GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{host_port}\r\nUser-Agent: fleet-agent-health\r\nAccept: */*\r\nConnection: close\r\n\r\n"
    );
    let io = |e: std::io::Error| {
        if matches!(
            e.kind(),
            std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
        ) {
            format!("{what}: no answer within {}", secs(timeout))
        } else {
            format!("{what}: {e}")
        }
    };
    s.set_write_timeout(Some(remaining(deadline, &what, timeout)?))
        .map_err(io)?;
    s.write_all(request.as_bytes()).map_err(io)?;
    let mut buf = [0u8; STATUS_LINE_MAX_BYTES];
    let mut have = 0;
    let line_end = loop {
        if let Some(i) = buf[..have].windows(2).position(|w| w == b"\r\n") {
            break i;
        }
        if have == buf.len() {
            return Err(format!(
                "{what}: no HTTP status line in the first {STATUS_LINE_MAX_BYTES} bytes"
            ));
        }
        s.set_read_timeout(Some(remaining(deadline, &what, timeout)?))
            .map_err(io)?;
        match s.read(&mut buf[have..]).map_err(io)? {
            0 if have == 0 => {
                return Err(format!("{what}: the connection closed without an answer"))
            }
            // An answer without CRLF that ends: take what came as the line.
            0 => break have,
            n => have += n,
        }
    };
    let line = String::from_utf8_lossy(&buf[..line_end]);
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

    #[test]
    fn status_lines() {
        assert_eq!(status_code("HTTP/1.1 200 OK"), Some(200));
        assert_eq!(status_code("HTTP/1.0 404"), Some(404));
        assert_eq!(status_code("HTTP/2 2000 x"), None);
        assert_eq!(status_code("ICY 200 OK"), None);
    }
}
