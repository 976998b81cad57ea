//! Making a connection (servers tried in turn within one deadline: TCP, `INFO`, TLS, `CONNECT`, `PING`/`PONG`)
//! and the connection's one I/O thread, which owns the socket and the TLS session from then on.
//!
//! The I/O thread sleeps in poll(2) on the socket and on the wake-up socket pair the callers write to, with a
//! time-out that is the next keep-alive `PING` (so an idle connection wakes once per
//! [`crate::Options::ping_interval`]). It ends the connection when the server closes it, breaks the protocol or
//! a bound, leaves [`crate::Options::max_pings_out`] `PING`s unanswered, or does not take our bytes for
//! [`crate::Options::write_timeout`].

use crate::client::{Client, Frame, Owner, Shared};
use crate::failure::{Attempts, PlainServer};
use crate::proto::{self, Limits, ServerInfo, ServerOp};
use crate::transport::{self, Transport};
use crate::{Auth, Message, Options};
use std::collections::VecDeque;
use std::io::{self, Read};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// Bytes read from the stream at a time.
const READ_CHUNK: usize = 64 * 1024;
/// Reads in a row before the thread looks at its outbox again (then it polls without waiting).
const READS_PER_TURN: usize = 64;
/// Bytes moved from the outbox to the write buffer at a time.
const WRITE_BATCH: usize = 256 * 1024;

/// One server of the list: `nats://host:port`, `tls://host:port` or `host[:port]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerAddr {
    /// `tls://`: TLS is required.
    pub tls: bool,
    /// Host name or address (no brackets).
    pub host: String,
    /// Port (4222 when not given).
    pub port: u16,
}

impl ServerAddr {
    /// Parses one URL.
    pub fn parse(url: &str) -> io::Result<ServerAddr> {
        let bad = |why: &str| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("NATS URL {url:?}: {why}"),
            )
        };
        let url = url.trim();
        let (tls, rest) = if let Some(r) = url.strip_prefix("tls://") {
            (true, r)
        } else if let Some(r) = url.strip_prefix("nats://") {
            (false, r)
        } else if url.contains("://") {
            return Err(bad("the scheme must be nats:// or tls://"));
        } else {
            (false, url)
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.contains('@') {
            return Err(bad(
                "credentials in the URL are not supported (set them in the configuration)",
            ));
        }
        if rest.contains('/') || rest.is_empty() {
            return Err(bad("expected host[:port]"));
        }
        let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
            let (h, p) = v6.split_once(']').ok_or_else(|| bad("unclosed ["))?;
            (h, p.strip_prefix(':'))
        } else {
            match rest.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (rest, None),
            }
        };
        let port = match port {
            None => 4222,
            Some(p) => p.parse().map_err(|_| bad("bad port"))?,
        };
        if host.is_empty() {
            return Err(bad("no host"));
        }
        Ok(ServerAddr {
            tls,
            host: host.to_owned(),
            port,
        })
    }

    fn display(&self) -> String {
        let scheme = if self.tls { "tls" } else { "nats" };
        if self.host.contains(':') {
            format!("{scheme}://[{}]:{}", self.host, self.port)
        } else {
            format!("{scheme}://{}:{}", self.host, self.port)
        }
    }
}

/// Where the next connection starts in the server list, so that a dead first server does not take every
/// attempt's time.
static ROTATE: AtomicUsize = AtomicUsize::new(0);

/// Connects to one of `opts.urls` within `opts.connect_timeout` (each server gets an equal share of what is
/// left) and starts the connection's I/O thread.
pub fn connect(opts: &Options) -> io::Result<Client> {
    let servers = opts
        .urls
        .iter()
        .map(|u| ServerAddr::parse(u))
        .collect::<io::Result<Vec<_>>>()?;
    if servers.is_empty() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "no NATS URL"));
    }
    let deadline = Instant::now() + opts.connect_timeout;
    let n = servers.len();
    let start = ROTATE.fetch_add(1, Ordering::Relaxed) % n;
    let mut errors = Vec::new();
    let mut kind = io::ErrorKind::TimedOut;
    // The server is named only when there are several, as before.
    let name = |s: &ServerAddr| (n > 1).then(|| s.display());
    for k in 0..n {
        let s = &servers[(start + k) % n];
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            let e = io::Error::new(io::ErrorKind::TimedOut, "not tried (time-out)");
            errors.push((Some(s.display()), e));
            continue;
        }
        let share = left / (n - k) as u32;
        match connect_one(s, opts, Instant::now() + share) {
            Ok(c) => return Ok(c),
            Err(e) => {
                kind = e.kind();
                errors.push((name(s), e));
            }
        }
    }
    Err(io::Error::new(kind, Attempts(errors)))
}

fn remaining(deadline: Instant) -> io::Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "connection attempt timed out",
        ));
    }
    Ok(left)
}

/// Reads until one whole frame is there (socket time-outs set to what is left of `deadline`).
fn read_op(
    t: &mut Transport,
    buf: &mut Vec<u8>,
    limits: &Limits,
    deadline: Instant,
) -> io::Result<ServerOp> {
    let mut chunk = vec![0u8; 16 * 1024];
    loop {
        if let Some((op, n)) = proto::parse(buf, limits)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?
        {
            buf.drain(..n);
            return Ok(op);
        }
        t.socket().set_read_timeout(Some(remaining(deadline)?))?;
        match t.read(&mut chunk) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the server closed the connection",
                ))
            }
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no answer from the server within the connect time-out",
                ))
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

fn connect_json(opts: &Options, tls: bool) -> String {
    let mut v = serde_json::json!({
        "verbose": false,
        "pedantic": false,
        "tls_required": tls,
        "name": opts.name,
        "lang": "rust-fleet-nats",
        "version": env!("CARGO_PKG_VERSION"),
        "protocol": 1,
        "echo": true,
        "headers": true,
        "no_responders": true,
    });
    match &opts.auth {
        Auth::None => {}
        Auth::Token(t) => v["auth_token"] = t.clone().into(),
        Auth::UserPassword { user, password } => {
            v["user"] = user.clone().into();
            v["pass"] = password.clone().into();
        }
    }
    v.to_string()
}

fn connect_one(server: &ServerAddr, opts: &Options, deadline: Instant) -> io::Result<Client> {
    let mut sock = None;
    let mut last = io::Error::new(io::ErrorKind::NotFound, "the host name has no address");
    for addr in (server.host.as_str(), server.port).to_socket_addrs()? {
        match TcpStream::connect_timeout(&addr, remaining(deadline)?) {
            Ok(s) => {
                sock = Some(s);
                break;
            }
            Err(e) => last = e,
        }
    }
    let sock = sock.ok_or(last)?;
    sock.set_nodelay(true)?;
    sock.set_write_timeout(Some(remaining(deadline)?))?;
    let mut t = Transport::Plain(sock);
    let mut buf = Vec::new();
    let mut limits = Limits::default();
    let info: ServerInfo = match read_op(&mut t, &mut buf, &limits, deadline)? {
        ServerOp::Info(i) => *i,
        other => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the server did not start with INFO ({other:?})"),
            ))
        }
    };
    let tls = server.tls || opts.tls.is_some() || info.tls_required;
    if tls {
        if !info.offers_tls() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                PlainServer(server.display()),
            ));
        }
        if !buf.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the server sent more before the TLS handshake",
            ));
        }
        let config = transport::client_config(&opts.tls.clone().unwrap_or_default())?;
        let Transport::Plain(sock) = t else {
            return Err(io::Error::other("TLS started twice"));
        };
        sock.set_read_timeout(Some(remaining(deadline)?))?;
        t = Transport::start_tls(sock, config, &server.host)?;
    }
    limits.max_payload = info.max_payload();
    let mut hello = format!("CONNECT {}\r\n", connect_json(opts, tls)).into_bytes();
    hello.extend_from_slice(proto::PING);
    t.socket().set_write_timeout(Some(remaining(deadline)?))?;
    t.write_all_blocking(&hello)?;
    loop {
        match read_op(&mut t, &mut buf, &limits, deadline)? {
            ServerOp::Pong => break,
            ServerOp::Ping => t.write_all_blocking(proto::PONG)?,
            ServerOp::Err(text) => {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!("the server refused the connection: {text}"),
                ))
            }
            ServerOp::Info(_) | ServerOp::Ok => {}
            ServerOp::Msg(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "a message before the connection was set up",
                ))
            }
        }
    }
    t.socket().set_nonblocking(true)?;
    let (wake_tx, wake_rx) = UnixStream::pair()?;
    wake_tx.set_nonblocking(true)?;
    wake_rx.set_nonblocking(true)?;
    let shared = Arc::new(Shared::new(wake_tx, limits.max_payload, opts));
    let io_thread = Io {
        t,
        shared: shared.clone(),
        wake_rx,
        inbuf: buf,
        limits,
        out: Vec::new(),
        out_pos: 0,
        pongs: VecDeque::new(),
        on_closed: opts.on_closed.clone(),
        ping_interval: opts.ping_interval,
        max_pings_out: opts.max_pings_out,
        pings_out: 0,
        next_ping: Instant::now() + opts.ping_interval,
        last_progress: Instant::now(),
        server: server.display(),
    };
    std::thread::Builder::new()
        .name("nats-io".into())
        .spawn(move || io_thread.run())?;
    Ok(Client {
        owner: Arc::new(Owner(shared)),
    })
}

/// The I/O thread's state.
struct Io {
    t: Transport,
    shared: Arc<Shared>,
    wake_rx: UnixStream,
    /// Bytes read and not parsed yet (less than one frame after each parse).
    inbuf: Vec<u8>,
    limits: Limits,
    /// Bytes to write, from `out_pos` on.
    out: Vec<u8>,
    out_pos: usize,
    /// One entry per `PING` written and not answered, oldest first.
    pongs: VecDeque<Option<mpsc::SyncSender<()>>>,
    on_closed: Option<crate::ClosedCallback>,
    ping_interval: Duration,
    max_pings_out: u32,
    pings_out: u32,
    next_ping: Instant,
    /// Last time the stream took bytes (or there was nothing to write).
    last_progress: Instant,
    server: String,
}

impl Io {
    fn run(mut self) {
        let ended = self.serve();
        let why = match &ended {
            Ok(()) => "closed by the client".to_owned(),
            Err(e) => e.clone(),
        };
        {
            let mut out = self.shared.lock_outbox();
            out.closed = Some(why.clone());
            // Dropping queued pings ends their flushes with "closed".
            out.frames.clear();
            out.bytes = 0;
        }
        self.shared.space.notify_all();
        self.pongs.clear();
        for (_, q) in self.shared.lock_subs().drain() {
            q.close();
        }
        let _ = self.t.socket().shutdown(std::net::Shutdown::Both);
        if let Err(e) = ended {
            log::warn!("NATS connection to {} closed: {e}", self.server);
            if let Some(cb) = &self.on_closed {
                cb(&e);
            }
        }
    }

    /// Runs until the client shuts the connection (`Ok`) or it fails (why).
    fn serve(&mut self) -> Result<(), String> {
        // What came after the handshake's PONG.
        self.dispatch()?;
        let mut more_to_read = false;
        loop {
            if self.shared.shutdown.load(Ordering::SeqCst) {
                return Ok(());
            }
            let now = Instant::now();
            if now >= self.next_ping {
                if self.pings_out >= self.max_pings_out {
                    return Err(format!(
                        "no answer to {} PINGs (server not responding)",
                        self.pings_out
                    ));
                }
                self.pings_out += 1;
                self.out.extend_from_slice(proto::PING);
                self.pongs.push_back(None);
                self.next_ping = now + self.ping_interval;
            }
            let writing = self.write().map_err(|e| format!("write: {e}"))?;
            let now = Instant::now();
            let mut wait = self.next_ping.saturating_duration_since(now);
            if writing {
                let stalled = now.saturating_duration_since(self.last_progress);
                if stalled >= self.shared.write_timeout {
                    return Err(format!("the server took none of our bytes for {stalled:?}"));
                }
                wait = wait.min(self.shared.write_timeout - stalled);
            }
            if more_to_read {
                wait = Duration::ZERO;
            }
            let sock_events = libc::POLLIN | if writing { libc::POLLOUT } else { 0 };
            let mut fds = [
                libc::pollfd {
                    fd: self.t.socket().as_raw_fd(),
                    events: sock_events,
                    revents: 0,
                },
                libc::pollfd {
                    fd: self.wake_rx.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            let ms = wait
                .as_millis()
                .saturating_add(u128::from(!wait.subsec_nanos().is_multiple_of(1_000_000)));
            let ms = i32::try_from(ms).unwrap_or(i32::MAX);
            // SAFETY: `fds` is a valid array of two pollfd for the duration of the call.
            let r = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
            if r < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(format!("poll: {e}"));
            }
            if fds[1].revents != 0 {
                // Drained, then cleared, then the outbox is read (at the top of the next turn): a frame queued
                // before the clear is taken then, one queued after it writes a new wake-up byte.
                let mut sink = [0u8; 64];
                while matches!((&self.wake_rx).read(&mut sink), Ok(n) if n > 0) {}
                self.shared.wake_pending.store(false, Ordering::SeqCst);
            }
            if more_to_read || fds[0].revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0
            {
                more_to_read = self.read()?;
            }
        }
    }

    /// Moves queued frames into the write buffer (up to a batch), freeing room in the outbox.
    fn take_frames(&mut self) {
        let mut out = self.shared.lock_outbox();
        let mut freed = 0;
        while self.out.len() - self.out_pos < WRITE_BATCH {
            let Some(f) = out.frames.pop_front() else {
                break;
            };
            match f {
                Frame::Data(bytes) => {
                    freed += bytes.len();
                    self.out.extend_from_slice(&bytes);
                }
                Frame::Ping(waiter) => {
                    freed += proto::PING.len();
                    self.out.extend_from_slice(proto::PING);
                    self.pongs.push_back(waiter);
                }
            }
        }
        out.bytes -= freed;
        drop(out);
        if freed > 0 {
            self.shared.space.notify_all();
        }
    }

    /// Writes what the stream takes; whether bytes are still waiting.
    fn write(&mut self) -> io::Result<bool> {
        loop {
            if self.out_pos == self.out.len() {
                self.out.clear();
                self.out_pos = 0;
                self.take_frames();
                if self.out.is_empty() {
                    break;
                }
            }
            let n = self.t.write(&self.out[self.out_pos..])?;
            if n == 0 {
                break;
            }
            self.out_pos += n;
            self.last_progress = Instant::now();
        }
        if self.out_pos > WRITE_BATCH {
            self.out.drain(..self.out_pos);
            self.out_pos = 0;
        }
        let pending = self.out_pos < self.out.len() || self.t.pending()?;
        if !pending {
            self.last_progress = Instant::now();
        }
        Ok(pending)
    }

    /// Reads and handles what has arrived; whether there may be more (the turn's read budget ran out).
    fn read(&mut self) -> Result<bool, String> {
        let mut chunk = vec![0u8; READ_CHUNK];
        for _ in 0..READS_PER_TURN {
            match self.t.read(&mut chunk) {
                Ok(0) => return Err("the server closed the connection".into()),
                Ok(n) => {
                    self.inbuf.extend_from_slice(&chunk[..n]);
                    self.dispatch()?;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("read: {e}")),
            }
        }
        Ok(true)
    }

    /// Handles every whole frame in the input buffer.
    fn dispatch(&mut self) -> Result<(), String> {
        let mut pos = 0;
        let result = loop {
            match proto::parse(&self.inbuf[pos..], &self.limits) {
                Ok(Some((op, n))) => {
                    pos += n;
                    // Anything from the server shows it is there.
                    self.pings_out = 0;
                    self.handle(op);
                }
                Ok(None) => break Ok(()),
                Err(e) => break Err(e.to_string()),
            }
        };
        if pos > 0 {
            // A keep-alive PING is only for a server that has been silent for a whole interval: while replies and
            // messages arrive, none is sent (no wake-up of its own), and a silent server is still found within
            // `max_pings_out + 1` intervals of its last frame.
            self.next_ping = Instant::now() + self.ping_interval;
        }
        self.inbuf.drain(..pos);
        result
    }

    fn handle(&mut self, op: ServerOp) {
        match op {
            ServerOp::Ping => self.out.extend_from_slice(proto::PONG),
            ServerOp::Pong => {
                if let Some(Some(tx)) = self.pongs.pop_front() {
                    let _ = tx.try_send(());
                }
            }
            ServerOp::Msg(m) => {
                let q = self.shared.lock_subs().get(&m.sid).cloned();
                if let Some(q) = q {
                    q.deliver(Message {
                        subject: m.subject,
                        reply: m.reply,
                        headers: m.headers,
                        data: m.payload,
                    });
                }
            }
            // Permission violations leave the connection open; errors that end it are followed by the close.
            ServerOp::Err(text) => log::warn!("NATS server {}: -ERR {text}", self.server),
            ServerOp::Info(_) | ServerOp::Ok => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let p = |u: &str| ServerAddr::parse(u).expect(u);
        assert_eq!(
            p("tls://nats.example:4443"),
            ServerAddr {
                tls: true,
                host: "nats.example".into(),
                port: 4443
            }
        );
        assert_eq!(p("nats://127.0.0.1").port, 4222);
        assert_eq!(p("10.0.0.1:5000").host, "10.0.0.1");
        assert_eq!(p("tls://[::1]:4222").host, "::1");
        for bad in [
            "http://x",
            "nats://u:p@x:1",
            "nats://",
            "nats://x:port",
            "nats://x/y",
        ] {
            assert!(ServerAddr::parse(bad).is_err(), "{bad}");
        }
    }
}
