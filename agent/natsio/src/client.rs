//! The client's API: [`Client`] (publish, subscribe, flush; clones share one connection) and [`Subscription`].
//!
//! Callers never touch the socket: they encode a frame and hand it to the connection's I/O thread through a
//! bounded queue ([`Outbox`]), waking it with a byte on a socket pair; the I/O thread alone reads, writes and
//! runs the TLS session. Messages arrive in a bounded queue per subscription; when one is full the message is
//! dropped and counted ([`Subscription::dropped`]) so a slow reader never stalls the socket (nats-server would
//! otherwise disconnect the client as a slow consumer).

use crate::proto::{self, Headers};
use std::collections::{HashMap, VecDeque};
use std::io::{self, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// A message received on a subscription.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// Its subject.
    pub subject: String,
    /// Its reply subject.
    pub reply: Option<String>,
    /// Its headers (status messages such as `503` no responders carry only headers).
    pub headers: Option<Headers>,
    /// Its payload.
    pub data: Vec<u8>,
}

/// A frame for the I/O thread.
pub(crate) enum Frame {
    /// Bytes to send.
    Data(Vec<u8>),
    /// A `PING`; its `PONG` is signalled on the sender (`None`: a keep-alive of the I/O thread).
    Ping(Option<mpsc::SyncSender<()>>),
}

/// Frames waiting for the I/O thread, bounded in bytes.
pub(crate) struct Outbox {
    pub(crate) frames: VecDeque<Frame>,
    pub(crate) bytes: usize,
    /// Why the connection ended; set once, by the I/O thread.
    pub(crate) closed: Option<String>,
}

/// One subscription's queue.
pub(crate) struct SubQueue {
    pub(crate) sid: u64,
    state: Mutex<SubState>,
    ready: Condvar,
    dropped: AtomicU64,
    max_msgs: usize,
    max_bytes: usize,
}

struct SubState {
    msgs: VecDeque<Message>,
    bytes: usize,
    /// Unsubscribed or the connection ended: `next` returns what is queued, then nothing.
    closed: bool,
}

impl SubQueue {
    fn lock(&self) -> MutexGuard<'_, SubState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `m` unless the queue is full (then it is dropped and counted). Never blocks for long: the I/O
    /// thread calls it.
    pub(crate) fn deliver(&self, m: Message) {
        let mut s = self.lock();
        if s.closed {
            return;
        }
        if s.msgs.len() >= self.max_msgs || s.bytes + m.data.len() > self.max_bytes {
            let n = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            if n.is_power_of_two() {
                log::warn!(
                    "NATS subscription {}: its queue is full ({} messages, {} bytes); {n} message(s) dropped",
                    self.sid,
                    s.msgs.len(),
                    s.bytes
                );
            }
            return;
        }
        s.bytes += m.data.len();
        s.msgs.push_back(m);
        // Notified after the lock is released: a reader woken while it is held would block on it at once (a
        // second wake-up per message).
        drop(s);
        self.ready.notify_one();
    }

    pub(crate) fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_all();
    }
}

/// What the callers and the I/O thread share.
pub(crate) struct Shared {
    pub(crate) outbox: Mutex<Outbox>,
    /// Signalled when the outbox has room again (or the connection ended).
    pub(crate) space: Condvar,
    pub(crate) max_outbox: usize,
    /// Written to wake the I/O thread; `wake_pending` avoids a write per frame.
    pub(crate) wake_tx: UnixStream,
    pub(crate) wake_pending: AtomicBool,
    pub(crate) subs: Mutex<HashMap<u64, Arc<SubQueue>>>,
    next_sid: AtomicU64,
    /// Set when every [`Client`] is gone: the I/O thread closes the connection.
    pub(crate) shutdown: AtomicBool,
    pub(crate) max_payload: usize,
    pub(crate) write_timeout: Duration,
    pub(crate) sub_max_msgs: usize,
    pub(crate) sub_max_bytes: usize,
}

impl Shared {
    pub(crate) fn new(wake_tx: UnixStream, max_payload: usize, opts: &crate::Options) -> Shared {
        Shared {
            outbox: Mutex::new(Outbox {
                frames: VecDeque::new(),
                bytes: 0,
                closed: None,
            }),
            space: Condvar::new(),
            max_outbox: opts.max_outbox_bytes,
            wake_tx,
            wake_pending: AtomicBool::new(false),
            subs: Mutex::new(HashMap::new()),
            next_sid: AtomicU64::new(1),
            shutdown: AtomicBool::new(false),
            max_payload,
            write_timeout: opts.write_timeout,
            sub_max_msgs: opts.sub_max_msgs,
            sub_max_bytes: opts.sub_max_bytes,
        }
    }

    pub(crate) fn lock_outbox(&self) -> MutexGuard<'_, Outbox> {
        self.outbox.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn lock_subs(&self) -> MutexGuard<'_, HashMap<u64, Arc<SubQueue>>> {
        self.subs.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn wake(&self) {
        if !self.wake_pending.swap(true, Ordering::SeqCst) {
            // A full socket pair already holds a wake-up.
            let _ = (&self.wake_tx).write(&[1]);
        }
    }

    /// Queues `frame` (of `len` bytes) for the I/O thread, waiting until `deadline` for room: a frame always
    /// fits an empty queue, so one larger than the bound still goes, alone.
    fn send(&self, frame: Frame, len: usize, deadline: Instant) -> io::Result<()> {
        let mut out = self.lock_outbox();
        loop {
            if let Some(why) = &out.closed {
                return Err(closed_error(why));
            }
            if out.bytes == 0 || out.bytes + len <= self.max_outbox {
                break;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "NATS send queue stayed full (server not reading)",
                ));
            }
            out = self
                .space
                .wait_timeout(out, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        out.bytes += len;
        out.frames.push_back(frame);
        drop(out);
        self.wake();
        Ok(())
    }

    fn send_data(&self, bytes: Vec<u8>) -> io::Result<()> {
        let len = bytes.len();
        self.send(Frame::Data(bytes), len, Instant::now() + self.write_timeout)
    }
}

pub(crate) fn closed_error(why: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotConnected,
        format!("NATS connection closed: {why}"),
    )
}

fn invalid(e: proto::ProtoError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, e.to_string())
}

/// Ends the connection when the last [`Client`] clone is dropped.
pub(crate) struct Owner(pub(crate) Arc<Shared>);

impl Drop for Owner {
    fn drop(&mut self) {
        self.0.shutdown.store(true, Ordering::SeqCst);
        self.0.wake();
    }
}

/// A connection to a NATS server. Clones share it; it closes when the last clone is dropped, or when the server
/// goes away (then [`crate::Options::on_closed`] is called, and every call fails: make a new connection).
#[derive(Clone)]
pub struct Client {
    pub(crate) owner: Arc<Owner>,
}

impl Client {
    fn shared(&self) -> &Shared {
        &self.owner.0
    }

    /// Why the connection ended, once it has.
    pub fn closed(&self) -> Option<String> {
        self.shared().lock_outbox().closed.clone()
    }

    fn check_size(&self, len: usize) -> io::Result<()> {
        let max = self.shared().max_payload;
        if len > max {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("message of {len} bytes is larger than the server's max_payload {max}"),
            ));
        }
        Ok(())
    }

    /// Publishes `data` to `subject`.
    pub fn publish(&self, subject: &str, data: &[u8]) -> io::Result<()> {
        self.publish_with(subject, None, None, data)
    }

    /// Publishes `data` to `subject` with a reply subject (a request whose answer the caller subscribed to).
    pub fn publish_request(&self, subject: &str, reply: &str, data: &[u8]) -> io::Result<()> {
        self.publish_with(subject, Some(reply), None, data)
    }

    /// Publishes with an optional reply subject and headers. Returns once the frame is queued for the I/O thread
    /// (waiting at most [`crate::Options::write_timeout`] for room); [`Self::flush`] waits for the server.
    pub fn publish_with(
        &self,
        subject: &str,
        reply: Option<&str>,
        headers: Option<&Headers>,
        data: &[u8],
    ) -> io::Result<()> {
        let header_len = match headers {
            Some(h) => h.encode().map_err(invalid)?.len(),
            None => 0,
        };
        self.check_size(data.len() + header_len)?;
        let frame = proto::publish(subject, reply, headers, data).map_err(invalid)?;
        self.shared().send_data(frame)
    }

    /// Subscribes to `subject` (wildcards allowed).
    pub fn subscribe(&self, subject: &str) -> io::Result<Subscription> {
        let shared = &self.owner.0;
        let sid = shared.next_sid.fetch_add(1, Ordering::SeqCst);
        let frame = proto::subscribe(subject, sid).map_err(invalid)?;
        let q = Arc::new(SubQueue {
            sid,
            state: Mutex::new(SubState {
                msgs: VecDeque::new(),
                bytes: 0,
                closed: false,
            }),
            ready: Condvar::new(),
            dropped: AtomicU64::new(0),
            max_msgs: shared.sub_max_msgs,
            max_bytes: shared.sub_max_bytes,
        });
        {
            // Registered before the SUB goes out, so no message for it can arrive unrouted; refused on a closed
            // connection (whose I/O thread no longer closes queues).
            let out = shared.lock_outbox();
            if let Some(why) = &out.closed {
                return Err(closed_error(why));
            }
            shared.lock_subs().insert(sid, q.clone());
        }
        if let Err(e) = shared.send_data(frame) {
            shared.lock_subs().remove(&sid);
            return Err(e);
        }
        Ok(Subscription {
            handle: Arc::new(SubHandle {
                q,
                shared: self.owner.0.clone(),
            }),
        })
    }

    /// Sends everything queued so far and waits for the server's `PONG` to a `PING` sent after it: the whole
    /// flush, queueing included, is bounded by `timeout`.
    pub fn flush(&self, timeout: Duration) -> io::Result<()> {
        let deadline = Instant::now() + timeout;
        let (tx, rx) = mpsc::sync_channel(1);
        self.shared()
            .send(Frame::Ping(Some(tx)), proto::PING.len(), deadline)?;
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(()) => Ok(()),
            Err(mpsc::RecvTimeoutError::Timeout) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("NATS flush not answered within {timeout:?}"),
            )),
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(closed_error(
                &self.closed().unwrap_or_else(|| "during the flush".into()),
            )),
        }
    }
}

/// Unsubscribes when the last clone of its [`Subscription`] is dropped.
struct SubHandle {
    q: Arc<SubQueue>,
    shared: Arc<Shared>,
}

impl SubHandle {
    fn unsubscribe(&self) -> io::Result<()> {
        let was = self.shared.lock_subs().remove(&self.q.sid);
        self.q.close();
        if was.is_some() {
            self.shared.send_data(proto::unsubscribe(self.q.sid))?;
        }
        Ok(())
    }
}

impl Drop for SubHandle {
    fn drop(&mut self) {
        let _ = self.unsubscribe();
    }
}

/// A subscription. Clones share it (one thread may block in [`Self::next`] while another unsubscribes, which
/// ends that wait); it is unsubscribed when the last clone is dropped.
#[derive(Clone)]
pub struct Subscription {
    handle: Arc<SubHandle>,
}

impl Subscription {
    /// The next message; `None` once unsubscribed or the connection has ended (and the queue is empty).
    pub fn next(&self) -> Option<Message> {
        let q = &self.handle.q;
        let mut s = q.lock();
        loop {
            if let Some(m) = s.msgs.pop_front() {
                s.bytes -= m.data.len();
                return Some(m);
            }
            if s.closed {
                return None;
            }
            s = q.ready.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// The next message within `timeout`: `TimedOut`, or `NotConnected` once unsubscribed or closed.
    pub fn next_timeout(&self, timeout: Duration) -> io::Result<Message> {
        let deadline = Instant::now() + timeout;
        let q = &self.handle.q;
        let mut s = q.lock();
        loop {
            if let Some(m) = s.msgs.pop_front() {
                s.bytes -= m.data.len();
                return Ok(m);
            }
            if s.closed {
                return Err(closed_error("subscription ended"));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no message within the time-out",
                ));
            }
            s = q
                .ready
                .wait_timeout(s, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Unsubscribes (every clone): a blocked [`Self::next`] returns `None`.
    pub fn unsubscribe(&self) -> io::Result<()> {
        self.handle.unsubscribe()
    }

    /// Messages dropped because this subscription's queue was full.
    pub fn dropped(&self) -> u64 {
        self.handle.q.dropped.load(Ordering::Relaxed)
    }
}
