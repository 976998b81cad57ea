//! The event-driven I/O of `fleet-sim --token-dir`: one thread per group of devices (`--connections` groups) owns
//! every device connection of its group — non-blocking sockets in one epoll set (edge-triggered), each with its
//! rustls `ClientConnection` driven by hand (`read_tls`, `process_new_packets`, `write_tls`), the NATS framing of
//! the agent's own client ([`fleet_nats::proto`]: its sans-I/O parser and encoders), and its timers in one binary
//! heap (back-off, handshake deadline, keep-alive `PING`, watch refresh). Writes the group's driver sends arrive
//! through a [`Mailbox`] (a queue and an eventfd).
//!
//! A device's connection goes through [`Phase`]s, by the pure [`step`]: away → TCP connecting → waiting for the
//! server's `INFO` → TLS handshake → `CONNECT` with its token and a `PING` sent → admitted (the `PONG`): `SUB` to
//! its inbox, the watch registration, the direct gets of its watched keys and a `PING` sent → running (the
//! `PONG`: its subscription is in place). A refusal (`-ERR` to the `CONNECT`), a failure before admission, or
//! a lost connection goes back to away, for the agent's pause (`fleet_agent::nats_kv::reconnect_pause`: 1 to 3
//! s at random after a lost connection, growing with failed attempts in a row up to 1 to 60 s).

use crate::sim::conn::Shared;
use crate::sim::device_conn::DeviceConn;
use fleet_nats::proto::{self, Limits, ServerOp};
use fleet_wire::auth::{device_inbox_prefix, device_read_filter, direct_get_subject};
use fleet_wire::device_api::{noticed_buckets, watch_subject, WatchRegistration, WATCH_REFRESH};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// From the start of an attempt to its admission and subscription at most (fleet-nats' `connect_timeout`).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// A `PING` this often on a running connection (fleet-nats' `ping_interval`)...
pub const PING_INTERVAL: Duration = Duration::from_secs(30);
/// ...and the connection counts as lost with this many unanswered (fleet-nats' `max_pings_out`).
pub const MAX_PINGS_OUT: u32 = 2;
/// The one subscription of a device (`<inbox>.>`).
const SID: u64 = 1;
/// The epoll key of the mailbox's eventfd (devices are keyed by their index in the group).
const WAKE: u64 = u64::MAX;
/// A read buffer larger than this is given back once empty (a device's messages are small).
const KEEP_BUFFER: usize = 16 * 1024;

/// Where a device's connection is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// No connection; the next attempt is due when its timer fires (at once at start).
    Away,
    /// TCP connect in progress.
    Connecting,
    /// Connected; waiting for the server's `INFO`.
    Info,
    /// TLS handshake.
    Tls,
    /// `CONNECT` with its token and a `PING` sent: the `PONG` admits it, an `-ERR` refuses it.
    Hello,
    /// Admitted: `SUB`, watch registration, direct gets and a `PING` sent; the `PONG` says they are in place.
    Subscribing,
    /// Running: writes go out, answers and notices come in.
    Running,
}

/// What happened to a device's connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    /// Its timer fired (a back-off ended, a deadline passed).
    Timer,
    /// The TCP connection is up.
    Connected,
    /// The server's `INFO`; `tls`: TLS is to be started.
    Info {
        /// TLS is to be started.
        tls: bool,
    },
    /// The TLS handshake is done.
    TlsDone,
    /// A `PONG`.
    Pong,
    /// An `-ERR` from the server.
    Err,
    /// The connection closed or failed.
    Closed,
}

/// What the I/O thread does on a transition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Nothing.
    None,
    /// Start a TCP connection (its token read again).
    Connect,
    /// Start TLS.
    StartTls,
    /// Send `CONNECT` and `PING`.
    Hello,
    /// Admitted: count it, send `SUB`, the watch registration, the direct gets and a `PING`.
    Subscribe,
    /// The device is online: its driver's writes go out.
    Online,
    /// The keep-alive timer on a running connection: a `PING`, or lost when too many are unanswered.
    KeepAlive,
    /// Refused by the server before admission: close, count, back off.
    Refused,
    /// Failed before admission: close, count, back off.
    Failed,
    /// Lost after admission: close, back off 1 to 3 s.
    Lost,
}

/// The transition of a device's connection on `input` in `phase` (pure).
pub fn step(phase: Phase, input: Input) -> (Phase, Action) {
    use Input as I;
    use Phase as P;
    match (phase, input) {
        (P::Away, I::Timer) => (P::Connecting, Action::Connect),
        (P::Away, _) => (P::Away, Action::None),
        (P::Connecting, I::Connected) => (P::Info, Action::None),
        (P::Info, I::Info { tls: true }) => (P::Tls, Action::StartTls),
        (P::Info, I::Info { tls: false }) | (P::Tls, I::TlsDone) => (P::Hello, Action::Hello),
        (P::Hello, I::Pong) => (P::Subscribing, Action::Subscribe),
        (P::Hello, I::Err) => (P::Away, Action::Refused),
        (P::Subscribing, I::Pong) => (P::Running, Action::Online),
        (P::Running, I::Pong) => (P::Running, Action::None),
        // Later INFOs (the server's updates, one right after CONNECT) change nothing.
        (P::Subscribing | P::Running, I::Info { .. }) => (phase, Action::None),
        (P::Running, I::Timer) => (P::Running, Action::KeepAlive),
        (P::Subscribing | P::Running, _) => (P::Away, Action::Lost),
        (P::Tls | P::Hello, I::Info { .. }) => (phase, Action::None),
        (P::Connecting | P::Info | P::Tls | P::Hello, _) => (P::Away, Action::Failed),
    }
}

/// The writes of a group's driver to its devices' connections, and the I/O thread's wake-up.
pub struct Mailbox {
    /// (device's index in the group, its connection's number, an encoded frame).
    queue: Mutex<Vec<(usize, u64, Vec<u8>)>>,
    wake: OwnedFd,
}

impl Mailbox {
    /// Queues `frame` for connection `conn` of device `k` (dropped if that connection is gone by then).
    pub fn send(&self, k: usize, conn: u64, frame: Vec<u8>) -> io::Result<()> {
        let first = {
            let mut q = self
                .queue
                .lock()
                .map_err(|_| io::Error::other("mailbox lock poisoned"))?;
            q.push((k, conn, frame));
            q.len() == 1
        };
        if first {
            let one = 1u64.to_ne_bytes();
            // SAFETY: an eventfd we own, and an 8-byte buffer.
            let r = unsafe { libc::write(self.wake.as_raw_fd(), one.as_ptr().cast(), 8) };
            if r < 0 {
                let e = io::Error::last_os_error();
                // EAGAIN: the counter is full, so the thread is woken anyway.
                if e.kind() != io::ErrorKind::WouldBlock {
                    return Err(e);
                }
            }
        }
        Ok(())
    }
}

/// A connection's socket, TLS session and buffers.
struct Net {
    sock: TcpStream,
    tls: Option<Box<rustls::ClientConnection>>,
    inbuf: Vec<u8>,
    out: Vec<u8>,
    limits: Limits,
}

/// One device of the group.
struct Slot {
    dev: Arc<DeviceConn>,
    sh: Arc<Shared>,
    phase: Phase,
    net: Option<Net>,
    /// Failed attempts in a row.
    failed: u32,
    /// Admitted at least once.
    before: bool,
    /// This connection's number (the driver's writes name it) and its inbox.
    conn: u64,
    inbox: String,
    pings_out: u32,
    /// The phase's timer: end of the back-off, the attempt's deadline, or the next keep-alive.
    due: Option<Instant>,
    /// The next watch registration (running only).
    refresh: Instant,
    /// The time this slot is in the heap for (older entries are stale).
    armed: Option<Instant>,
}

/// The I/O thread of one group.
pub struct Worker {
    epoll: OwnedFd,
    mailbox: Arc<Mailbox>,
    slots: Vec<Slot>,
    heap: BinaryHeap<Reverse<(Instant, usize)>>,
    addrs: Vec<SocketAddr>,
    host: String,
    url_tls: bool,
    tls: Option<Arc<rustls::ClientConfig>>,
    stop: Arc<AtomicBool>,
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

impl Worker {
    /// A thread's worth of device connections to the server at `nats_url` (its first server; a `user:password@`
    /// is dropped), over TLS trusting `tls`'s CA when given.
    pub fn new(
        nats_url: &str,
        tls: Option<&fleet_nats::TlsOptions>,
        stop: Arc<AtomicBool>,
    ) -> io::Result<Worker> {
        let url = fleet_wire::auth::split_nats_url(nats_url).url;
        let first = url.split(',').next().unwrap_or(&url);
        let server = fleet_nats::ServerAddr::parse(first)?;
        let addrs: Vec<SocketAddr> = (server.host.as_str(), server.port)
            .to_socket_addrs()?
            .collect();
        if addrs.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{}: no address", server.host),
            ));
        }
        // SAFETY: plain system calls; the descriptors are owned at once.
        let epoll = unsafe { OwnedFd::from_raw_fd(cvt(libc::epoll_create1(libc::EPOLL_CLOEXEC))?) };
        // SAFETY: as above.
        let wake = unsafe {
            OwnedFd::from_raw_fd(cvt(libc::eventfd(
                0,
                libc::EFD_NONBLOCK | libc::EFD_CLOEXEC,
            ))?)
        };
        add(epoll.as_raw_fd(), wake.as_raw_fd(), WAKE)?;
        Ok(Worker {
            epoll,
            mailbox: Arc::new(Mailbox {
                queue: Mutex::new(Vec::new()),
                wake,
            }),
            slots: Vec::new(),
            heap: BinaryHeap::new(),
            addrs,
            host: server.host,
            url_tls: server.tls,
            tls: tls.map(fleet_nats::client_config).transpose()?,
            stop,
        })
    }

    /// Where the group's driver sends its writes.
    pub fn mailbox(&self) -> Arc<Mailbox> {
        self.mailbox.clone()
    }

    /// Adds device `dev` (its index in the group is the number of devices added before), connecting at once.
    pub(crate) fn add(&mut self, dev: Arc<DeviceConn>, sh: Arc<Shared>) {
        let now = Instant::now();
        let k = self.slots.len();
        self.slots.push(Slot {
            dev,
            sh,
            phase: Phase::Away,
            net: None,
            failed: 0,
            before: false,
            conn: 0,
            inbox: String::new(),
            pings_out: 0,
            due: Some(now),
            refresh: now,
            armed: None,
        });
        self.arm(k);
    }

    /// Serves every device until the simulator stops (connections are then dropped: the last counter line still
    /// counts them connected).
    pub fn run(mut self) {
        let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 1024];
        while !self.stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            while let Some(&Reverse((at, k))) = self.heap.peek() {
                if at > now {
                    break;
                }
                self.heap.pop();
                if self.slots[k].armed == Some(at) {
                    self.slots[k].armed = None;
                    self.on_timer(k, now);
                    self.arm(k);
                }
            }
            let wait = self
                .heap
                .peek()
                .map(|Reverse((at, _))| at.saturating_duration_since(Instant::now()))
                .unwrap_or(Duration::from_millis(200))
                .min(Duration::from_millis(200));
            // Rounded up: a timer never fires a little early and spins.
            let ms = wait.as_micros().div_ceil(1000) as libc::c_int;
            // SAFETY: the buffer holds `events.len()` entries.
            let n = unsafe {
                libc::epoll_wait(
                    self.epoll.as_raw_fd(),
                    events.as_mut_ptr(),
                    events.len() as libc::c_int,
                    ms,
                )
            };
            if n < 0 {
                if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                eprintln!("fleet-sim: epoll_wait: {}", io::Error::last_os_error());
                return;
            }
            for e in &events[..n as usize] {
                let key = e.u64;
                if key == WAKE {
                    self.drain_mailbox();
                } else {
                    self.on_ready(key as usize);
                    self.arm(key as usize);
                }
            }
        }
    }

    /// Puts slot `k` in the heap for its earliest timer, unless already there for it or earlier.
    fn arm(&mut self, k: usize) {
        let s = &mut self.slots[k];
        let refresh = (s.phase == Phase::Running).then_some(s.refresh);
        let Some(at) = [s.due, refresh].into_iter().flatten().min() else {
            return;
        };
        if s.armed.is_some_and(|a| a <= at) {
            return;
        }
        s.armed = Some(at);
        self.heap.push(Reverse((at, k)));
    }

    fn drain_mailbox(&mut self) {
        let mut count = [0u8; 8];
        // SAFETY: an eventfd we own, and an 8-byte buffer (EAGAIN when already read: harmless).
        let _ = unsafe { libc::read(self.mailbox.wake.as_raw_fd(), count.as_mut_ptr().cast(), 8) };
        let frames = match self.mailbox.queue.lock() {
            Ok(mut q) => std::mem::take(&mut *q),
            Err(_) => return,
        };
        let mut touched = Vec::new();
        for (k, conn, frame) in frames {
            let s = &mut self.slots[k];
            if s.conn != conn || s.phase != Phase::Running {
                continue; // its connection is gone: the write times out, as the agent's would
            }
            if let Some(net) = s.net.as_mut() {
                net.out.extend_from_slice(&frame);
                touched.push(k);
            }
        }
        touched.dedup();
        for k in touched {
            self.flush(k);
        }
    }

    /// Feeds `input` to slot `k` and does what the transition says.
    fn feed(&mut self, k: usize, input: Input) {
        let (phase, action) = step(self.slots[k].phase, input);
        self.slots[k].phase = phase;
        let now = Instant::now();
        match action {
            Action::None => {}
            Action::Connect => {
                self.slots[k].due = Some(now + CONNECT_TIMEOUT);
                if let Err(e) = self.connect(k) {
                    if e.kind() == io::ErrorKind::InvalidData {
                        println!("fleet-sim {}: {e}", self.slots[k].dev.id());
                    }
                    self.feed(k, Input::Closed);
                }
            }
            Action::StartTls => {
                if let Err(e) = self.start_tls(k) {
                    println!("fleet-sim {} TLS: {e}", self.slots[k].dev.id());
                    self.feed(k, Input::Closed);
                }
            }
            Action::Hello => {
                let s = &mut self.slots[k];
                let tls = s.net.as_ref().is_some_and(|n| n.tls.is_some());
                match s.dev.hello(tls) {
                    Ok(mut hello) => {
                        hello.extend_from_slice(proto::PING);
                        if let Some(net) = s.net.as_mut() {
                            net.out.extend_from_slice(&hello);
                        }
                        self.flush(k);
                    }
                    Err(e) => {
                        println!("fleet-sim {}: {e}", s.dev.id());
                        self.feed(k, Input::Closed);
                    }
                }
            }
            Action::Subscribe => {
                let s = &mut self.slots[k];
                s.failed = 0;
                s.sh.stats.connects.fetch_add(1, Ordering::Relaxed);
                if s.before {
                    s.sh.stats.reconnects.fetch_add(1, Ordering::Relaxed);
                }
                s.before = true;
                s.conn = next_conn();
                s.inbox = format!("{}.{}", device_inbox_prefix(s.dev.id()), unique_token());
                match subscribe_frames(s.dev.id(), &s.inbox) {
                    Ok(frames) => {
                        if let Some(net) = s.net.as_mut() {
                            net.out.extend_from_slice(&frames);
                        }
                        s.refresh = now + WATCH_REFRESH;
                        self.flush(k);
                    }
                    Err(e) => {
                        println!("fleet-sim {}: {e}", s.dev.id());
                        self.feed(k, Input::Closed);
                    }
                }
            }
            Action::Online => {
                let s = &mut self.slots[k];
                s.pings_out = 0;
                s.due = Some(now + PING_INTERVAL);
                s.dev.set_online(Some((s.inbox.clone(), s.conn)));
            }
            Action::KeepAlive => {
                let s = &mut self.slots[k];
                if s.due.is_some_and(|d| d <= now) {
                    if s.pings_out >= MAX_PINGS_OUT {
                        self.feed(k, Input::Closed);
                        return;
                    }
                    s.pings_out += 1;
                    s.due = Some(now + PING_INTERVAL);
                    if let Some(net) = s.net.as_mut() {
                        net.out.extend_from_slice(proto::PING);
                    }
                }
                if s.refresh <= now {
                    // A restarted fleet-auth knows this device's inbox again within one refresh.
                    s.refresh = now + WATCH_REFRESH;
                    if let (Ok(frame), Some(net)) =
                        (register_frame(s.dev.id(), &s.inbox), s.net.as_mut())
                    {
                        net.out.extend_from_slice(&frame);
                    }
                }
                self.flush(k);
            }
            Action::Refused | Action::Failed | Action::Lost => {
                let s = &mut self.slots[k];
                s.net = None; // closes the socket, which leaves the epoll set
                let pause = match action {
                    Action::Lost => {
                        s.dev.set_online(None);
                        0
                    }
                    Action::Refused => {
                        s.sh.stats.refused.fetch_add(1, Ordering::Relaxed);
                        s.failed += 1;
                        s.failed
                    }
                    _ => {
                        s.sh.stats.connect_failed.fetch_add(1, Ordering::Relaxed);
                        s.failed += 1;
                        s.failed
                    }
                };
                s.due = Some(now + fleet_agent::nats_kv::reconnect_pause(pause));
            }
        }
    }

    fn on_timer(&mut self, k: usize, now: Instant) {
        let s = &self.slots[k];
        let due = s.due.is_some_and(|d| d <= now);
        let refresh = s.phase == Phase::Running && s.refresh <= now;
        if due || refresh {
            self.feed(k, Input::Timer);
        }
    }

    /// Starts slot `k`'s TCP connection (non-blocking).
    fn connect(&mut self, k: usize) -> io::Result<()> {
        let s = &mut self.slots[k];
        let addr = self.addrs[k % self.addrs.len()];
        let sock = connect_nonblocking(&addr)?;
        add(self.epoll.as_raw_fd(), sock.as_raw_fd(), k as u64)?;
        s.net = Some(Net {
            sock,
            tls: None,
            inbuf: Vec::new(),
            out: Vec::new(),
            limits: Limits::default(),
        });
        Ok(())
    }

    fn start_tls(&mut self, k: usize) -> io::Result<()> {
        let config = match &self.tls {
            Some(c) => c.clone(),
            None => fleet_nats::client_config(&fleet_nats::TlsOptions::default())?,
        };
        let name = rustls::pki_types::ServerName::try_from(self.host.clone())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        let tls = rustls::ClientConnection::new(config, name).map_err(io::Error::other)?;
        let net = self.slots[k]
            .net
            .as_mut()
            .ok_or_else(|| io::Error::other("no connection"))?;
        if !net.inbuf.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the server sent more before the TLS handshake",
            ));
        }
        net.tls = Some(Box::new(tls));
        self.flush(k);
        Ok(())
    }

    /// The socket of slot `k` is ready (or an event of its previous socket arrived late: harmless).
    fn on_ready(&mut self, k: usize) {
        if self.slots[k].phase == Phase::Connecting {
            let Some(net) = self.slots[k].net.as_ref() else {
                return;
            };
            match net.sock.take_error() {
                Ok(None) if net.sock.peer_addr().is_ok() => self.feed(k, Input::Connected),
                Ok(None) => return, // still connecting
                _ => {
                    self.feed(k, Input::Closed);
                    return;
                }
            }
        }
        let closed = match self.slots[k].net.as_mut() {
            Some(net) => read_in(net),
            None => return,
        };
        let closed = match closed {
            Ok(c) => c,
            Err(_) => {
                self.feed(k, Input::Closed);
                return;
            }
        };
        if self.slots[k].phase == Phase::Tls
            && self.slots[k]
                .net
                .as_ref()
                .and_then(|n| n.tls.as_ref())
                .is_some_and(|t| !t.is_handshaking())
        {
            self.feed(k, Input::TlsDone);
        }
        if let Err(e) = self.parse(k) {
            println!("fleet-sim {}: {e}", self.slots[k].dev.id());
            self.feed(k, Input::Closed);
            return;
        }
        if closed {
            self.feed(k, Input::Closed);
            return;
        }
        self.flush(k);
    }

    /// Handles every complete frame read on slot `k`.
    fn parse(&mut self, k: usize) -> Result<(), proto::ProtoError> {
        let mut used = 0;
        loop {
            let phase = self.slots[k].phase;
            // Before TLS is up only `INFO` arrives in the clear; nothing is parsed while handshaking.
            if phase == Phase::Tls {
                break;
            }
            let tls_wanted = self.url_tls || self.tls.is_some();
            let Some(net) = self.slots[k].net.as_mut() else {
                return Ok(());
            };
            let Some((op, n)) = proto::parse(&net.inbuf[used..], &net.limits)? else {
                break;
            };
            used += n;
            match op {
                ServerOp::Info(info) => {
                    net.limits.max_payload = info.max_payload();
                    let tls = tls_wanted || info.tls_required;
                    if phase == Phase::Info {
                        if tls && !info.offers_tls() {
                            return Err(proto::ProtoError::Malformed(
                                "TLS is required and the server offers none".into(),
                            ));
                        }
                        net.inbuf.drain(..used);
                        used = 0;
                    }
                    self.feed(k, Input::Info { tls });
                }
                ServerOp::Ping => net.out.extend_from_slice(proto::PONG),
                ServerOp::Pong => {
                    self.slots[k].pings_out = 0;
                    self.feed(k, Input::Pong);
                }
                ServerOp::Ok => {}
                ServerOp::Err(text) => {
                    if phase == Phase::Hello {
                        // A line per refusal, with the server's words: the reconnect-storm bench tells refusals
                        // at the first connection from those after the restart by when they arrive.
                        println!(
                            "fleet-sim refused {}: the server refused the connection: {text}",
                            self.slots[k].dev.id()
                        );
                    }
                    self.feed(k, Input::Err);
                }
                ServerOp::Msg(m) => {
                    if let Some(frame) = self.on_message(k, m) {
                        if let Some(net) = self.slots[k].net.as_mut() {
                            net.out.extend_from_slice(&frame);
                        }
                    }
                }
            }
        }
        if let Some(net) = self.slots[k].net.as_mut() {
            net.inbuf.drain(..used);
            if net.inbuf.is_empty() && net.inbuf.capacity() > KEEP_BUFFER {
                net.inbuf = Vec::new();
            }
        }
        Ok(())
    }

    /// An answer, a direct get's value, or a notice (then the frame that reads the key).
    fn on_message(&self, k: usize, m: proto::Msg) -> Option<Vec<u8>> {
        let s = &self.slots[k];
        let m = fleet_nats::Message {
            subject: m.subject,
            reply: m.reply,
            headers: m.headers,
            data: m.payload,
        };
        let rest = m
            .subject
            .strip_prefix(s.inbox.as_str())
            .and_then(|r| r.strip_prefix('.'))?;
        if let Some(n) = rest.strip_prefix("ack.") {
            if let Ok(n) = n.parse() {
                s.sh.on_ack(n, &m);
            }
        } else if rest == "get" {
            // The answer names its key (none on a 404: nothing written there yet).
            let (bucket, key) = m
                .headers
                .as_ref()
                .and_then(|h| h.get("Nats-Subject"))
                .and_then(|s| s.trim().strip_prefix("$KV."))
                .and_then(|s| s.split_once('.'))?;
            s.sh.on_put(bucket, key, &m);
        } else if let Some((bucket, key)) = rest.split_once('.') {
            // A notice carries no value: read the key, as the agent's watch does.
            if noticed_buckets().any(|b| b.name == bucket) {
                let subject = direct_get_subject(bucket, &format!("$KV.{bucket}.{key}"));
                return proto::publish(&subject, Some(&format!("{}.get", s.inbox)), None, b"").ok();
            }
        }
        None
    }

    /// Sends what slot `k` has to send, as far as the socket takes it.
    fn flush(&mut self, k: usize) {
        let Some(net) = self.slots[k].net.as_mut() else {
            return;
        };
        if write_out(net).is_err() {
            self.feed(k, Input::Closed);
        }
    }
}

/// Reads what the socket has (decrypted when TLS is on) into `net.inbuf`; true when the peer closed.
fn read_in(net: &mut Net) -> io::Result<bool> {
    let mut buf = [0u8; 16 * 1024];
    match net.tls.as_mut() {
        None => loop {
            match net.sock.read(&mut buf) {
                Ok(0) => return Ok(true),
                Ok(n) => net.inbuf.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
            check_len(&net.inbuf, &net.limits)?;
        },
        Some(tls) => loop {
            let eof = match tls.read_tls(&mut net.sock) {
                Ok(0) => true,
                Ok(_) => false,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            tls.process_new_packets().map_err(io::Error::other)?;
            loop {
                match tls.reader().read(&mut buf) {
                    Ok(0) => return Ok(true), // close_notify
                    Ok(n) => net.inbuf.extend_from_slice(&buf[..n]),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => return Err(e),
                }
            }
            if eof {
                return Ok(true);
            }
            check_len(&net.inbuf, &net.limits)?;
        },
    }
}

/// Bounds a device's unparsed input: one frame at most (its parse runs after the read).
fn check_len(inbuf: &[u8], limits: &Limits) -> io::Result<()> {
    if inbuf.len() > 4 * (limits.max_payload + limits.max_control_line) + (1 << 20) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "too much unparsed input",
        ));
    }
    Ok(())
}

/// Writes `net.out` (through TLS when on) until done or the socket is full.
fn write_out(net: &mut Net) -> io::Result<()> {
    match net.tls.as_mut() {
        None => {
            let mut done = 0;
            while done < net.out.len() {
                match net.sock.write(&net.out[done..]) {
                    Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                    Ok(n) => done += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            net.out.drain(..done);
        }
        Some(tls) => loop {
            if !net.out.is_empty() && !tls.is_handshaking() {
                let n = tls.writer().write(&net.out)?;
                net.out.drain(..n);
            }
            if !tls.wants_write() {
                break;
            }
            match tls.write_tls(&mut net.sock) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        },
    }
    if net.out.capacity() > KEEP_BUFFER && net.out.is_empty() {
        net.out = Vec::new();
    }
    Ok(())
}

/// `SUB <inbox>.>`, the watch registration, a direct get of each watched key, and a `PING`.
fn subscribe_frames(id: &fleet_wire::DeviceId, inbox: &str) -> io::Result<Vec<u8>> {
    let mut out = proto::subscribe(&format!("{inbox}.>"), SID).map_err(io::Error::other)?;
    out.extend_from_slice(&register_frame(id, inbox)?);
    for spec in noticed_buckets() {
        if let Some(filter) = device_read_filter(spec, id) {
            out.extend_from_slice(
                &proto::publish(
                    &direct_get_subject(spec.name, &filter),
                    Some(&format!("{inbox}.get")),
                    None,
                    b"",
                )
                .map_err(io::Error::other)?,
            );
        }
    }
    out.extend_from_slice(proto::PING);
    Ok(out)
}

/// Registers `inbox` for the device API's notices.
fn register_frame(id: &fleet_wire::DeviceId, inbox: &str) -> io::Result<Vec<u8>> {
    let body = serde_json::to_vec(&WatchRegistration {
        inbox: inbox.to_owned(),
    })
    .map_err(io::Error::other)?;
    proto::publish(&watch_subject(id), None, None, &body).map_err(io::Error::other)
}

/// A number per admitted connection of this process.
fn next_conn() -> u64 {
    static COUNT: AtomicU64 = AtomicU64::new(1);
    COUNT.fetch_add(1, Ordering::Relaxed)
}

/// 32 hex digits, unique per connection of this process (the inbox token; no other device may subscribe below
/// this device's inbox anyway).
fn unique_token() -> String {
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos() as u64;
    let n = COUNT.fetch_add(1, Ordering::Relaxed);
    format!("{t:016x}{:08x}{:08x}", std::process::id(), n as u32)
}

/// Adds `fd` to the epoll set, edge-triggered, for reading and writing.
fn add(epoll: RawFd, fd: RawFd, key: u64) -> io::Result<()> {
    let mut ev = libc::epoll_event {
        events: (libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLRDHUP | libc::EPOLLET) as u32,
        u64: key,
    };
    // SAFETY: valid descriptors and event.
    cvt(unsafe { libc::epoll_ctl(epoll, libc::EPOLL_CTL_ADD, fd, &mut ev) })?;
    Ok(())
}

/// A TCP connection to `addr` started without waiting (EINPROGRESS), no Nagle.
fn connect_nonblocking(addr: &SocketAddr) -> io::Result<TcpStream> {
    let family = match addr {
        SocketAddr::V4(_) => libc::AF_INET,
        SocketAddr::V6(_) => libc::AF_INET6,
    };
    // SAFETY: a plain system call; the descriptor is owned at once.
    let sock = unsafe {
        TcpStream::from_raw_fd(cvt(libc::socket(
            family,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        ))?)
    };
    // SAFETY: zeroed sockaddr structures are valid; each is filled for its family and passed with its size.
    let r = unsafe {
        match addr {
            SocketAddr::V4(a) => {
                let mut sa: libc::sockaddr_in = std::mem::zeroed();
                sa.sin_family = libc::AF_INET as libc::sa_family_t;
                sa.sin_port = a.port().to_be();
                sa.sin_addr.s_addr = u32::from_ne_bytes(a.ip().octets());
                libc::connect(
                    sock.as_raw_fd(),
                    (&sa as *const libc::sockaddr_in).cast(),
                    std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
                )
            }
            SocketAddr::V6(a) => {
                let mut sa: libc::sockaddr_in6 = std::mem::zeroed();
                sa.sin6_family = libc::AF_INET6 as libc::sa_family_t;
                sa.sin6_port = a.port().to_be();
                sa.sin6_addr.s6_addr = a.ip().octets();
                sa.sin6_scope_id = a.scope_id();
                libc::connect(
                    sock.as_raw_fd(),
                    (&sa as *const libc::sockaddr_in6).cast(),
                    std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t,
                )
            }
        }
    };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINPROGRESS) {
            return Err(e);
        }
    }
    sock.set_nodelay(true)?;
    Ok(sock)
}

/// Raises this process's soft limit of open files to its hard limit (a device costs one); returns the limit.
pub fn raise_fd_limit() -> u64 {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid rlimit structure.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) } != 0 {
        return 0;
    }
    if l.rlim_cur < l.rlim_max {
        l.rlim_cur = l.rlim_max;
        // SAFETY: as above.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &l) } != 0 {
            return 0;
        }
    }
    l.rlim_cur
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The way in, a refusal, a failure before admission, a loss after it, and the keep-alive.
    #[test]
    fn a_connection_goes_through_its_phases() {
        let mut p = Phase::Away;
        let mut actions = vec![];
        for i in [
            Input::Timer,
            Input::Connected,
            Input::Info { tls: true },
            Input::TlsDone,
            Input::Pong,
            Input::Pong,
            Input::Timer,
            Input::Pong,
        ] {
            let (q, a) = step(p, i);
            p = q;
            actions.push(a);
        }
        assert_eq!(p, Phase::Running);
        assert_eq!(
            actions,
            [
                Action::Connect,
                Action::None,
                Action::StartTls,
                Action::Hello,
                Action::Subscribe,
                Action::Online,
                Action::KeepAlive,
                Action::None
            ]
        );
        assert_eq!(
            step(Phase::Info, Input::Info { tls: false }),
            (Phase::Hello, Action::Hello)
        );
        assert_eq!(
            step(Phase::Hello, Input::Err),
            (Phase::Away, Action::Refused)
        );
        for p in [Phase::Connecting, Phase::Info, Phase::Tls, Phase::Hello] {
            assert_eq!(
                step(p, Input::Closed),
                (Phase::Away, Action::Failed),
                "{p:?}"
            );
            assert_eq!(
                step(p, Input::Timer),
                (Phase::Away, Action::Failed),
                "{p:?}"
            );
        }
        for p in [Phase::Subscribing, Phase::Running] {
            assert_eq!(step(p, Input::Closed), (Phase::Away, Action::Lost), "{p:?}");
            assert_eq!(step(p, Input::Err), (Phase::Away, Action::Lost), "{p:?}");
        }
        assert_eq!(
            step(Phase::Subscribing, Input::Timer),
            (Phase::Away, Action::Lost)
        );
        assert_eq!(
            step(Phase::Away, Input::Closed),
            (Phase::Away, Action::None)
        );
    }
}
