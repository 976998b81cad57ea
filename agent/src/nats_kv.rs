//! The NATS side: connection with bounded attempts in a retry window (a token file is re-read on every connect),
//! the required KV buckets (opened, never created), bounded-time get and put, and a key watch that is re-created
//! after every reconnect.
//!
//! The client is the agent's own [`fleet_nats`] (core NATS only, one I/O thread per connection); it does not
//! reconnect by itself: when a connection closes, a thread of ours makes a new one.
//!
//! Every request uses a reply subject under the device's own inbox (`_INBOX.device.<device-id>`, the only reply
//! subjects fleet-auth lets a device subscribe to), so no device can read another's replies; requests share one
//! reply subscription per connection (`<inbox>.<token>.*`). The KV calls are made
//! here with core NATS (a JetStream client API would use `_INBOX.<random>`) and each names the device's
//! key in its subject, which is what the device's permissions allow (`fleet_wire::auth::device_permissions`):
//! opening a bucket and reading a key are direct gets, a write is a put acknowledged on the inbox, and a watch is a
//! subscription to the key's subject (every write is published there) followed by a direct get — no JetStream
//! consumer, whose deliver subject permissions could not scope. With a device token (the fleet-auth callout) a
//! device may subscribe below its inbox only: its watches then listen below a random watch inbox of each
//! connection, registered with fleet-auth's device API, which sends a notice there for every write to one of the
//! device's keys (`fleet_wire::device_api`); no other device can name that subject.

use crate::config::{NatsAuth, NatsConfig};
use fleet_wire::auth::{device_read_filter, direct_get_subject};
use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::io::Read;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// Time-out of one KV put (publish with acknowledgement).
pub const PUT_TIMEOUT: Duration = Duration::from_secs(5);
/// Time-out of one JetStream API request (open, get).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How many times a watch reads a key again after a write notice when the read shows no newer revision (a
/// direct get may be answered by a replica of a NATS cluster that has not applied the write yet), and the pause
/// between reads; a notice of a write JetStream refused (a lost compare-and-set) costs at most their product.
pub const FRESH_READS: u32 = 10;
/// See [`FRESH_READS`].
pub const FRESH_PAUSE: Duration = Duration::from_millis(50);
/// Keep-alive `PING` after this long without a frame from the server. With [`MAX_PINGS_OUT`] a link that died
/// silently (no FIN, no RST: a cut cable, a NAT that forgot the flow) is noticed within [`DEAD_LINK_BOUND`]. One
/// `PING` of 15 s rather than two of 10 s: an idle agent hears from the server at each heartbeat (default 30 s),
/// so between two heartbeats this costs its I/O thread one `PING` and its `PONG`, where two would cost two
/// (measured: about 6 more wake-ups a minute than the client's default of 30 s; docs/agent-config.md). A server
/// that takes 15 s to answer a `PING` is treated as gone.
pub const PING_INTERVAL: Duration = Duration::from_secs(15);
/// Unanswered keep-alive `PING`s after which the connection is closed and a new one made.
pub const MAX_PINGS_OUT: u32 = 1;
/// The longest a dead link goes unnoticed, counted from the server's last frame: the `PING`, then one more
/// interval for its `PONG` (30 s; it was 90 s with the client's defaults, two `PING`s of 30 s).
pub const DEAD_LINK_BOUND: Duration = Duration::from_secs(30);
const _: () =
    assert!(PING_INTERVAL.as_secs() * (MAX_PINGS_OUT as u64 + 1) == DEAD_LINK_BOUND.as_secs());

/// The shortest pause between reconnection attempts ([`reconnect_pause`]).
pub const RECONNECT_PAUSE_MIN: Duration = Duration::from_secs(1);
/// The longest pause between reconnection attempts ([`reconnect_pause`]).
pub const RECONNECT_PAUSE_MAX: Duration = Duration::from_secs(60);

/// The pause before a reconnection attempt, the first included, after `failed` failed attempts in a row: drawn at
/// random from 1 to 3 s, a range whose top doubles with each failure (1–5 s, 1–9 s, …) up to 1–60 s. A server
/// restart closes every device's connection at the same moment; with one fixed pause the whole fleet tries again
/// at the same instants and reaches the auth callout in bursts (measured with 2,000 simulated devices: 2–67
/// attempts refused in 6 of 15 storms with a fixed 2 s); drawn at random they arrive as a stream, and a fleet
/// larger than the callout admits within the server's authorization time-out spreads its retries further with
/// each refusal instead of repeating the burst.
pub fn reconnect_pause(failed: u32) -> Duration {
    let spread = (reconnect_pause_top(failed) - RECONNECT_PAUSE_MIN).as_millis() as u64;
    RECONNECT_PAUSE_MIN + Duration::from_millis(random_u64() % spread.max(1))
}

/// The top of [`reconnect_pause`]'s range after `failed` failures in a row.
pub fn reconnect_pause_top(failed: u32) -> Duration {
    (RECONNECT_PAUSE_MIN + RECONNECT_PAUSE_MIN * 2 * (1 << failed.min(6))).min(RECONNECT_PAUSE_MAX)
}

/// Largest token file read, in bytes.
pub const TOKEN_MAX_BYTES: u64 = 16 * 1024;

/// A connected client. Clones share one connection, which the client replaces with a new one (credentials read
/// again) when the old one closes.
#[derive(Clone)]
pub struct Nats {
    inner: Arc<Inner>,
    /// This device's reply-inbox prefix.
    inbox: String,
}

/// The shared connection state.
struct Inner {
    cfg: NatsConfig,
    client_name: String,
    /// The current connection (`None` only before the first one).
    conn: RwLock<Option<fleet_nats::Client>>,
    /// Id of the connection attempt that is (or is becoming) current; callbacks of older ones are ignored.
    current: AtomicU64,
    /// Ids handed out so far.
    next_id: AtomicU64,
    /// Whether a reconnection thread is running.
    reconnecting: AtomicBool,
    /// Increases on every reconnect, so watches subscribe again on the new connection.
    reconnects: AtomicU64,
    /// The subscriptions that watch threads block on, by watch id: [`Nats::wake_watches`] unsubscribes them,
    /// which ends their blocking read (on a reconnect, or when the watches stop).
    watching: Mutex<BTreeMap<u64, fleet_nats::Subscription>>,
    /// Ids handed out to watch subscriptions so far.
    next_watch: AtomicU64,
    /// The reply subscription that requests share (made on first use, dropped when its connection closed).
    /// Requests take turns on it.
    replies: Mutex<Option<Replies>>,
    /// Whether watches listen for the device API's notices (a device token: the fleet-auth callout, whose device
    /// permissions allow subscriptions below the device's inbox only) rather than on the keys' own subjects.
    notices: bool,
    /// The watch inbox of the current connection (`<inbox>.<random token>`, registered with the device API) and
    /// the reconnect count it was made at.
    watch_inbox: Mutex<Option<(u64, String)>>,
}

/// One `<inbox>.<token>.*` subscription per connection for every request's answer, instead of a subscribe and an
/// unsubscribe around each request: one write per request instead of three, and fewer wake-ups.
struct Replies {
    /// The connection the subscription belongs to (requests are published on it too).
    conn: fleet_nats::Client,
    sub: fleet_nats::Subscription,
    /// `<inbox>.<token>`: request `n` is answered on `<base>.<n>`.
    base: String,
    next: u64,
    /// The reconnect count when it was made: after a reconnect it is made again on the new connection.
    epoch: u64,
}

/// A key's current value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// The key holds `bytes`.
    Put(Vec<u8>),
    /// The key was deleted or purged, or never existed.
    Absent,
}

/// A change seen by a watch or read by a get, with the stream revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// Stream sequence (0 when the key never existed).
    pub revision: u64,
    /// The value.
    pub value: Value,
}

/// Why the agent could not get going with NATS.
#[derive(Debug, thiserror::Error)]
pub enum NatsError {
    /// No connection within the retry window.
    #[error("could not connect to NATS at {urls} within {window:?} (last error: {last})")]
    Connect {
        /// The servers.
        urls: String,
        /// The retry window.
        window: Duration,
        /// The last attempt's error.
        last: String,
    },
    /// A required bucket could not be opened.
    #[error("KV bucket {bucket} cannot be opened: {message} (the operator creates the buckets; check that it ran)")]
    Bucket {
        /// The bucket.
        bucket: String,
        /// Why.
        message: String,
    },
    /// A required bucket does not exist (yet): nobody has created the buckets on this server.
    #[error("KV bucket {bucket} does not exist (create the buckets: `fleet-operator buckets`, docs/device-setup.md)")]
    BucketMissing {
        /// The bucket.
        bucket: String,
    },
}

impl Nats {
    /// Connects: attempts of at most `connect_timeout` each, repeated until `retry_window` has passed.
    ///
    /// Every connection is made here, with the credentials read at that moment (a `token_file` is read again):
    /// when a connection closes, a thread of ours connects anew, forever, swapping the new connection in. An
    /// expired token therefore costs at most one reconnect once a fresh one is on disk.
    pub fn connect(cfg: &NatsConfig, client_name: &str) -> Result<Nats, NatsError> {
        let inner = Arc::new(Inner {
            cfg: cfg.clone(),
            client_name: client_name.to_owned(),
            conn: RwLock::new(None),
            current: AtomicU64::new(0),
            next_id: AtomicU64::new(0),
            reconnecting: AtomicBool::new(false),
            reconnects: AtomicU64::new(0),
            watching: Mutex::new(BTreeMap::new()),
            next_watch: AtomicU64::new(0),
            replies: Mutex::new(None),
            notices: matches!(cfg.auth, NatsAuth::Token(_) | NatsAuth::TokenFile(_)),
            watch_inbox: Mutex::new(None),
        });
        let started = Instant::now();
        let urls = cfg.urls.join(",");
        let mut last;
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            match Inner::attempt(&inner) {
                Ok(()) => {
                    log::info!("connected to NATS ({urls}) on attempt {attempt}");
                    return Ok(Nats {
                        inner,
                        inbox: cfg.inbox_prefix.clone(),
                    });
                }
                Err(e) => {
                    last = e;
                    log::warn!("NATS connection attempt {attempt} to {urls} failed: {last}");
                }
            }
            let elapsed = started.elapsed();
            if elapsed >= cfg.retry_window {
                return Err(NatsError::Connect {
                    urls,
                    window: cfg.retry_window,
                    last,
                });
            }
            let pause = reconnect_pause(attempt - 1)
                .min(cfg.retry_window - elapsed)
                .max(Duration::from_millis(100));
            std::thread::sleep(pause);
        }
    }

    /// The current connection.
    fn conn(&self) -> io::Result<fleet_nats::Client> {
        self.inner
            .conn
            .read()
            .map_err(|_| io::Error::other("NATS connection lock poisoned"))?
            .clone()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotConnected, "not connected to NATS"))
    }

    /// Opens every bucket in `names` (a direct get of this device's key in each, of its probe key in a write-only
    /// bucket: it answers, found or not, only when the bucket exists); the first missing one is an error naming it.
    pub fn open_buckets(&self, names: &[&str]) -> Result<Buckets, NatsError> {
        let mut opened = BTreeSet::new();
        for name in names {
            let bucket_err = |message: String| NatsError::Bucket {
                bucket: (*name).to_owned(),
                message,
            };
            let filter = fleet_wire::kv::bucket(name)
                .and_then(|spec| device_read_filter(spec, &self.inner.cfg.device_id))
                .ok_or_else(|| {
                    bucket_err("not a bucket keyed by device in the KV layout".into())
                })?;
            let reply = self
                .request(&direct_get_subject(name, &filter), b"", REQUEST_TIMEOUT)
                .map_err(|e| {
                    // "No responders": no stream serves the bucket's direct gets, the bucket does not exist.
                    if e.kind() == io::ErrorKind::NotFound {
                        NatsError::BucketMissing {
                            bucket: (*name).to_owned(),
                        }
                    } else {
                        bucket_err(e.to_string())
                    }
                })?;
            match status(&reply).as_deref() {
                None | Some("404") => {}
                Some(code) => {
                    let why = description(&reply);
                    return Err(bucket_err(format!("direct get answered {code} {why}")));
                }
            }
            opened.insert((*name).to_owned());
        }
        Ok(Buckets {
            nats: self.clone(),
            opened,
        })
    }

    /// Runs `ops` as one batch of requests ([`Self::requests`]: all sent, then every answer awaited within
    /// [`PUT_TIMEOUT`]); the results in `ops`' order. Unlike [`Buckets::batch`], a get or put may name any bucket
    /// (one opened by another [`Buckets`]); an [`Op::Open`] probes a bucket as [`Self::open_buckets`] does
    /// ([`Self::opened`] makes the [`Buckets`]).
    pub fn batch(&self, ops: &[Op]) -> Vec<io::Result<Done>> {
        let device = &self.inner.cfg.device_id;
        let probe = |bucket: &str| {
            fleet_wire::kv::bucket(bucket)
                .and_then(|spec| device_read_filter(spec, device))
                .map(|filter| direct_get_subject(bucket, &filter))
        };
        let mut reqs: Vec<(String, Vec<u8>)> = Vec::new();
        let mut at: Vec<Option<usize>> = Vec::new();
        for op in ops {
            let subject = match op {
                Op::Get { bucket, key } => Some(get_subject(bucket, key)),
                Op::Put { bucket, key, .. } => Some(format!("$KV.{bucket}.{key}")),
                Op::Open { bucket } => probe(bucket),
            };
            at.push(subject.map(|subject| {
                let body = match op {
                    Op::Put { value, .. } => value.clone(),
                    _ => Vec::new(),
                };
                reqs.push((subject, body));
                reqs.len() - 1
            }));
        }
        let timeout = PUT_TIMEOUT.max(REQUEST_TIMEOUT);
        let mut got: Vec<Option<io::Result<fleet_nats::Message>>> = self
            .requests(&reqs, timeout)
            .into_iter()
            .map(Some)
            .collect();
        ops.iter()
            .zip(at)
            .map(|(op, i)| {
                let Some(m) = i.and_then(|i| got.get_mut(i)).and_then(Option::take) else {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        "not a bucket keyed by device in the KV layout",
                    ));
                };
                match op {
                    Op::Get { bucket, key } => m
                        .and_then(|m| read_answer(bucket, key, m))
                        .map(|(k, c)| Done::Got(k, c)),
                    Op::Put { bucket, key, .. } => {
                        m.and_then(|m| put_answer(bucket, key, &m)).map(Done::Put)
                    }
                    Op::Open { .. } => m.and_then(|m| match status(&m).as_deref() {
                        None | Some("404") => Ok(Done::Opened),
                        Some(code) => Err(io::Error::other(format!(
                            "direct get answered {code} {}",
                            description(&m)
                        ))),
                    }),
                }
            })
            .collect()
    }

    /// The buckets `names` from the results of their [`Op::Open`]s in a [`Self::batch`] (in the same order): all
    /// opened, or the first that is not, as [`Self::open_buckets`] says it.
    pub fn opened(
        &self,
        names: &[&str],
        results: impl IntoIterator<Item = io::Result<Done>>,
    ) -> Result<Buckets, NatsError> {
        let mut opened = BTreeSet::new();
        let mut results = results.into_iter();
        for name in names {
            match results.next() {
                Some(Ok(Done::Opened)) => {
                    opened.insert((*name).to_owned());
                }
                // "No responders": no stream serves the bucket's direct gets, the bucket does not exist.
                Some(Err(e)) if e.kind() == io::ErrorKind::NotFound => {
                    return Err(NatsError::BucketMissing {
                        bucket: (*name).to_owned(),
                    })
                }
                other => {
                    let message = match other {
                        Some(Err(e)) => e.to_string(),
                        _ => "not probed".to_owned(),
                    };
                    return Err(NatsError::Bucket {
                        bucket: (*name).to_owned(),
                        message,
                    });
                }
            }
        }
        Ok(Buckets {
            nats: self.clone(),
            opened,
        })
    }

    /// Flushes pending writes to the server and waits for its acknowledgement (a PONG), all within `timeout`.
    pub fn flush(&self, timeout: Duration) -> io::Result<()> {
        self.conn()?.flush(timeout)
    }

    /// How many times the client has reconnected.
    pub fn reconnect_count(&self) -> u64 {
        self.inner.reconnects.load(Ordering::SeqCst)
    }

    /// Wakes every watch thread (which blocks on its subscription without a time-out): a watch whose stop flag
    /// is set then ends, the others subscribe and read their keys again. Call it after setting a stop flag.
    pub fn wake_watches(&self) {
        self.inner.wake_watches();
    }

    /// What a watch of `bucket`/`key` subscribes to, and the prefix its messages' subjects carry before the key:
    /// the key's own subject (`$KV.<bucket>.<key>`), or with the device API (docs/auth.md) the notice subject
    /// below this connection's watch inbox, which no other device can name.
    fn watch_subjects(&self, bucket: &str, key: &str) -> io::Result<(String, String)> {
        let prefix = if self.inner.notices {
            format!("{}.{bucket}.", self.watch_inbox()?)
        } else {
            format!("$KV.{bucket}.")
        };
        Ok((format!("{prefix}{key}"), prefix))
    }

    /// This connection's watch inbox, made and registered with the device API on first use after each
    /// (re)connection.
    fn watch_inbox(&self) -> io::Result<String> {
        let epoch = self.reconnect_count();
        let mut slot = self
            .inner
            .watch_inbox
            .lock()
            .map_err(|_| io::Error::other("NATS watch lock poisoned"))?;
        if let Some((e, inbox)) = slot.as_ref() {
            if *e == epoch {
                return Ok(inbox.clone());
            }
        }
        let conn = self.conn()?;
        let inbox = format!("{}.{}", self.inbox, unique_token());
        self.register_watch_inbox(&conn, &inbox)?;
        *slot = Some((epoch, inbox.clone()));
        Ok(inbox)
    }

    fn register_watch_inbox(&self, conn: &fleet_nats::Client, inbox: &str) -> io::Result<()> {
        let body = serde_json::to_vec(&fleet_wire::device_api::WatchRegistration {
            inbox: inbox.to_owned(),
        })
        .map_err(io::Error::other)?;
        conn.publish(
            &fleet_wire::device_api::watch_subject(&self.inner.cfg.device_id),
            &body,
        )
    }

    /// Registers the current watch inbox with the device API again (the heartbeat calls it), so that a restarted
    /// fleet-auth sends notices again within a heartbeat; nothing without the device API.
    pub fn refresh_watches(&self) {
        if !self.inner.notices {
            return;
        }
        let current = self
            .inner
            .watch_inbox
            .lock()
            .ok()
            .and_then(|s| s.as_ref().map(|(_, inbox)| inbox.clone()));
        if let (Some(inbox), Ok(conn)) = (current, self.conn()) {
            if let Err(e) = self.register_watch_inbox(&conn, &inbox) {
                log::debug!("registering the watch inbox: {e}");
            }
        }
    }

    /// A fresh reply subject under this device's inbox.
    fn reply_subject(inbox: &str) -> String {
        format!("{inbox}.{}", unique_token())
    }

    /// Publishes `body` to `subject` with a reply subject of this device's and waits at most `timeout` for the
    /// answer. A "no responders" status (nothing serves the subject) is an error.
    fn request(
        &self,
        subject: &str,
        body: &[u8],
        timeout: Duration,
    ) -> io::Result<fleet_nats::Message> {
        let got = match self.request_once(subject, body, timeout) {
            // The shared reply subscription belonged to a connection that has closed: once more on the current.
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {
                self.request_once(subject, body, timeout)
            }
            r => r,
        };
        Self::answered(subject, timeout, got)
    }

    /// Several requests at once on the shared reply subscription: all are published, then every answer is waited
    /// for within one `timeout`, so the requests of one tick cost the connection's thread and the caller about
    /// the wake-ups of one (the server's answers come back together) instead of one round trip each. The results
    /// are in `reqs`' order, each as [`Self::request`] gives it.
    fn requests(
        &self,
        reqs: &[(String, Vec<u8>)],
        timeout: Duration,
    ) -> Vec<io::Result<fleet_nats::Message>> {
        if reqs.is_empty() {
            return Vec::new();
        }
        let mut got = self.requests_once(reqs, timeout);
        // The shared reply subscription belonged to a connection that has closed: once more on the current.
        if got
            .iter()
            .any(|r| matches!(r, Err(e) if e.kind() == io::ErrorKind::ConnectionReset))
        {
            got = self.requests_once(reqs, timeout);
        }
        got.into_iter()
            .zip(reqs)
            .map(|(r, (subject, _))| Self::answered(subject, timeout, r))
            .collect()
    }

    /// A request's answer as the caller sees it: a time-out says what was asked, "no responders" is `NotFound`.
    fn answered(
        subject: &str,
        timeout: Duration,
        got: io::Result<fleet_nats::Message>,
    ) -> io::Result<fleet_nats::Message> {
        let msg = got.map_err(|e| {
            if e.kind() == io::ErrorKind::TimedOut {
                io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "no answer to {subject} within {timeout:?} (not permitted, or server busy)"
                    ),
                )
            } else {
                e
            }
        })?;
        if status(&msg).as_deref() == Some("503") {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("no responders for {subject}"),
            ));
        }
        Ok(msg)
    }

    /// [`Self::requests`] on the shared reply subscription once; every result `ConnectionReset` when that
    /// subscription's connection has closed (it is dropped, as in [`Self::request_once`]).
    fn requests_once(
        &self,
        reqs: &[(String, Vec<u8>)],
        timeout: Duration,
    ) -> Vec<io::Result<fleet_nats::Message>> {
        let all = |kind: io::ErrorKind, why: &str| -> Vec<io::Result<fleet_nats::Message>> {
            reqs.iter()
                .map(|_| Err(io::Error::new(kind, why.to_owned())))
                .collect()
        };
        let Ok(mut slot) = self.inner.replies.lock() else {
            return all(io::ErrorKind::Other, "NATS reply lock poisoned");
        };
        let epoch = self.reconnect_count();
        if slot.as_ref().is_some_and(|r| r.epoch != epoch) {
            *slot = None;
        }
        let r = match slot.as_mut() {
            Some(r) => r,
            None => {
                let made = self.conn().and_then(|conn| {
                    let base = Self::reply_subject(&self.inbox);
                    let sub = conn.subscribe(&format!("{base}.*"))?;
                    Ok((conn, sub, base))
                });
                match made {
                    Ok((conn, sub, base)) => slot.insert(Replies {
                        conn,
                        sub,
                        base,
                        next: 0,
                        epoch,
                    }),
                    Err(e) => return all(e.kind(), &e.to_string()),
                }
            }
        };
        let mut waiting: BTreeMap<String, usize> = BTreeMap::new();
        for (i, (subject, body)) in reqs.iter().enumerate() {
            r.next += 1;
            let reply = format!("{}.{}", r.base, r.next);
            if let Err(e) = r.conn.publish_request(subject, &reply, body) {
                *slot = None;
                return all(io::ErrorKind::ConnectionReset, &e.to_string());
            }
            waiting.insert(reply, i);
        }
        let mut out: Vec<Option<io::Result<fleet_nats::Message>>> =
            reqs.iter().map(|_| None).collect();
        let deadline = Instant::now() + timeout;
        while !waiting.is_empty() {
            match r
                .sub
                .next_timeout(deadline.saturating_duration_since(Instant::now()))
            {
                Ok(m) => {
                    // Else a late answer to an earlier request that timed out.
                    if let Some(i) = waiting.remove(&m.subject) {
                        out[i] = Some(Ok(m));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::TimedOut => break,
                Err(e) => {
                    *slot = None;
                    return all(io::ErrorKind::ConnectionReset, &e.to_string());
                }
            }
        }
        out.into_iter()
            .map(|r| r.unwrap_or_else(|| Err(io::Error::new(io::ErrorKind::TimedOut, "no answer"))))
            .collect()
    }

    /// One request on the shared reply subscription (made here on first use). `ConnectionReset`: that
    /// subscription's connection has closed; it is dropped, so the next call makes one on the current connection.
    fn request_once(
        &self,
        subject: &str,
        body: &[u8],
        timeout: Duration,
    ) -> io::Result<fleet_nats::Message> {
        let mut slot = self
            .inner
            .replies
            .lock()
            .map_err(|_| io::Error::other("NATS reply lock poisoned"))?;
        let epoch = self.reconnect_count();
        if slot.as_ref().is_some_and(|r| r.epoch != epoch) {
            *slot = None;
        }
        let r = match slot.as_mut() {
            Some(r) => r,
            None => {
                let conn = self.conn()?;
                let base = Self::reply_subject(&self.inbox);
                let sub = conn.subscribe(&format!("{base}.*"))?;
                slot.insert(Replies {
                    conn,
                    sub,
                    base,
                    next: 0,
                    epoch,
                })
            }
        };
        r.next += 1;
        let reply = format!("{}.{}", r.base, r.next);
        let reset = |e: io::Error| io::Error::new(io::ErrorKind::ConnectionReset, e.to_string());
        if let Err(e) = r.conn.publish_request(subject, &reply, body) {
            *slot = None;
            return Err(reset(e));
        }
        let deadline = Instant::now() + timeout;
        loop {
            match r
                .sub
                .next_timeout(deadline.saturating_duration_since(Instant::now()))
            {
                Ok(m) if m.subject == reply => return Ok(m),
                // A late answer to an earlier request that timed out.
                Ok(_) => continue,
                Err(e) if e.kind() == io::ErrorKind::TimedOut => return Err(e),
                Err(e) => {
                    *slot = None;
                    return Err(reset(e));
                }
            }
        }
    }
}

impl Inner {
    /// One connection attempt (bounded by `connect_timeout`); on success it becomes the current connection.
    fn attempt(this: &Arc<Inner>) -> Result<(), String> {
        let id = this.next_id.fetch_add(1, Ordering::SeqCst) + 1;
        this.current.store(id, Ordering::SeqCst);
        let cfg = &this.cfg;
        let mut opts = fleet_nats::Options::new(&cfg.urls.join(","));
        opts.name = this.client_name.clone();
        opts.connect_timeout = cfg.connect_timeout;
        opts.ping_interval = PING_INTERVAL;
        opts.max_pings_out = MAX_PINGS_OUT;
        opts.auth = match &cfg.auth {
            NatsAuth::None => fleet_nats::Auth::None,
            NatsAuth::UserPassword { user, password } => fleet_nats::Auth::UserPassword {
                user: user.clone(),
                password: password.expose().to_owned(),
            },
            NatsAuth::Token(t) => fleet_nats::Auth::Token(t.expose().to_owned()),
            // Read now: every connection of ours reads the file again, so a rotated token is used.
            NatsAuth::TokenFile(path) => {
                fleet_nats::Auth::Token(read_token(path).map_err(|e| e.to_string())?)
            }
        };
        crate::nats_tls::apply(&mut opts, &cfg.tls)?;
        let on_close = Arc::downgrade(this);
        opts.on_closed = Some(Arc::new(move |why: &str| {
            if let Some(inner) = on_close.upgrade() {
                // A connection that has been replaced (or abandoned) is not reconnected.
                if inner.current.load(Ordering::SeqCst) == id {
                    Inner::reconnect(&inner, why);
                }
            }
        }));
        let conn =
            fleet_nats::connect(&opts).map_err(|e| crate::nats_tls::explain(&e, &cfg.tls))?;
        let mut slot = this
            .conn
            .write()
            .map_err(|_| "NATS connection lock poisoned".to_owned())?;
        // Unless it closed at once and a newer attempt has taken over.
        if this.current.load(Ordering::SeqCst) == id {
            *slot = Some(conn);
        }
        Ok(())
    }

    /// Ends the blocking read of every watch subscription (unsubscribing it); each watch thread then checks its
    /// stop flag and the reconnect count, and subscribes and reads its key again.
    fn wake_watches(&self) {
        let subs = match self.watching.lock() {
            Ok(mut w) => std::mem::take(&mut *w),
            Err(_) => return,
        };
        for (_, sub) in subs {
            let _ = sub.unsubscribe();
        }
    }

    /// Registers `sub` as a watch subscription to wake; returns its id.
    fn register_watch(&self, sub: &fleet_nats::Subscription) -> u64 {
        let id = self.next_watch.fetch_add(1, Ordering::SeqCst);
        if let Ok(mut w) = self.watching.lock() {
            w.insert(id, sub.clone());
        }
        id
    }

    /// Forgets watch subscription `id` (already gone after a wake).
    fn unregister_watch(&self, id: u64) {
        if let Ok(mut w) = self.watching.lock() {
            w.remove(&id);
        }
    }

    /// Starts the reconnection thread unless one runs: new connections until one succeeds.
    fn reconnect(this: &Arc<Inner>, why: &str) {
        if this.reconnecting.swap(true, Ordering::SeqCst) {
            return;
        }
        log::warn!("NATS connection closed ({why}); connecting anew in 1 to 3 s");
        let weak = Arc::downgrade(this);
        let spawned = std::thread::Builder::new()
            .name("nats-reconnect".into())
            .spawn(move || {
                let mut failed = 0;
                loop {
                    // The first attempt waits too: a server restart closes the whole fleet's connections at once,
                    // and a device that reaches the restarted server before the auth callout has subscribed again
                    // is refused when the server's authorization time-out passes (1 in 2 storms of 2,000 devices).
                    std::thread::sleep(reconnect_pause(failed));
                    let Some(inner) = weak.upgrade() else { return };
                    match Inner::attempt(&inner) {
                        Ok(()) => {
                            inner.reconnecting.store(false, Ordering::SeqCst);
                            inner.reconnects.fetch_add(1, Ordering::SeqCst);
                            inner.wake_watches();
                            log::info!("reconnected to NATS (new connection)");
                            return;
                        }
                        Err(e) => {
                            failed += 1;
                            log::warn!(
                                "NATS reconnection failed ({failed} in a row): {e}; retrying in 1 to {} s",
                                reconnect_pause_top(failed).as_secs()
                            );
                        }
                    }
                }
            });
        if let Err(e) = spawned {
            this.reconnecting.store(false, Ordering::SeqCst);
            log::error!("cannot start the NATS reconnection thread: {e}");
        }
    }
}

/// 64 random bits (see [`random_bytes`]).
fn random_u64() -> u64 {
    let mut bytes = [0u8; 8];
    random_bytes(&mut bytes);
    u64::from_le_bytes(bytes)
}

/// 128 random bits in hex: reply subjects that no other client of this device (the probe, a previous run) uses.
fn unique_token() -> String {
    let mut bytes = [0u8; 16];
    random_bytes(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Fills `bytes` from the system's random device, or, without one, from the clock, the process and a counter
/// (unique enough for reply subjects and spread enough for pauses).
fn random_bytes(bytes: &mut [u8]) {
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(bytes))
        .is_err()
    {
        // No random device: unique enough from the clock, the process and a counter.
        static COUNT: AtomicU64 = AtomicU64::new(0);
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos() as u64;
        let n = (u64::from(std::process::id()) << 32) | COUNT.fetch_add(1, Ordering::Relaxed);
        for (i, b) in bytes.iter_mut().enumerate() {
            let word = if i % 16 < 8 { t } else { n };
            *b = word.to_le_bytes()[i % 8];
        }
    }
}

/// Reads the token file (bounded, trimmed, non-empty). The token is never logged.
pub(crate) fn read_token(path: &std::path::Path) -> io::Result<String> {
    let text = fleet_wire::bounded::read_text(path, TOKEN_MAX_BYTES).map_err(|e| {
        let kind = match &e {
            fleet_wire::bounded::ReadError::Io { source, .. } => source.kind(),
            fleet_wire::bounded::ReadError::TooLarge { .. } => io::ErrorKind::InvalidData,
        };
        io::Error::new(kind, format!("token file {e}"))
    })?;
    let token = text.trim();
    if token.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("token file {} is empty", path.display()),
        ));
    }
    Ok(token.to_owned())
}

/// The status code of a header-only status message (`404`, `503`, `100` …).
fn status(msg: &fleet_nats::Message) -> Option<String> {
    msg.headers.as_ref().and_then(|h| h.status.clone())
}

/// The text after a status code.
fn description(msg: &fleet_nats::Message) -> String {
    msg.headers
        .as_ref()
        .and_then(|h| h.description.clone())
        .unwrap_or_default()
}

fn header(msg: &fleet_nats::Message, name: &str) -> Option<String> {
    msg.headers
        .as_ref()
        .and_then(|h| h.get(name).map(str::to_owned))
}

/// A JetStream API answer: its JSON, or the API error it carries.
fn api_result(data: &[u8]) -> io::Result<serde_json::Value> {
    let v: serde_json::Value = serde_json::from_slice(data).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("JetStream answer is not JSON: {e}"),
        )
    })?;
    if let Some(err) = v.get("error") {
        let code = err.get("err_code").and_then(|c| c.as_u64()).unwrap_or(0);
        let text = err
            .get("description")
            .and_then(|d| d.as_str())
            .unwrap_or("unknown error");
        let kind = if err.get("code").and_then(|c| c.as_u64()) == Some(404) {
            io::ErrorKind::NotFound
        } else {
            io::ErrorKind::Other
        };
        return Err(io::Error::new(
            kind,
            format!("{text} (JetStream error {code})"),
        ));
    }
    Ok(v)
}

/// The subject of a direct get of `bucket`/`key`.
fn get_subject(bucket: &str, key: &str) -> String {
    direct_get_subject(bucket, &format!("$KV.{bucket}.{key}"))
}

/// A direct get's answer: the key read (its `Nats-Subject`) and its value, absent on a 404.
fn read_answer(bucket: &str, key: &str, msg: fleet_nats::Message) -> io::Result<(String, Change)> {
    match status(&msg).as_deref() {
        None => {}
        Some("404") => {
            return Ok((
                key.to_owned(),
                Change {
                    revision: 0,
                    value: Value::Absent,
                },
            ))
        }
        Some(code) => {
            let why = description(&msg);
            return Err(io::Error::other(format!(
                "direct get {bucket}/{key}: status {code} {why}"
            )));
        }
    }
    let revision = header(&msg, "Nats-Sequence")
        .and_then(|s| s.trim().parse::<u64>().ok())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("direct get {bucket}/{key}: no Nats-Sequence header"),
            )
        })?;
    let read = header(&msg, "Nats-Subject")
        .and_then(|s| {
            s.trim()
                .strip_prefix(&format!("$KV.{bucket}."))
                .map(str::to_owned)
        })
        .unwrap_or_else(|| key.to_owned());
    let value = match header(&msg, "KV-Operation").as_deref() {
        Some("DEL") | Some("PURGE") => Value::Absent,
        _ => Value::Put(msg.data),
    };
    Ok((read, Change { revision, value }))
}

/// A put's acknowledgement: the revision written.
fn put_answer(bucket: &str, key: &str, msg: &fleet_nats::Message) -> io::Result<u64> {
    let ack = api_result(&msg.data)?;
    ack.get("seq").and_then(|s| s.as_u64()).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("put {bucket}/{key}: acknowledgement without seq"),
        )
    })
}

/// One request of a [`Buckets::batch`].
#[derive(Debug, Clone)]
pub enum Op {
    /// [`Buckets::get`] of `bucket`/`key`.
    Get {
        /// The bucket.
        bucket: String,
        /// The key.
        key: String,
    },
    /// [`Buckets::put`] of `value` at `bucket`/`key`.
    Put {
        /// The bucket.
        bucket: String,
        /// The key.
        key: String,
        /// The value.
        value: Vec<u8>,
    },
    /// Whether `bucket` exists, probed as [`Nats::open_buckets`] does (see [`Nats::opened`]).
    Open {
        /// The bucket.
        bucket: String,
    },
}

/// What one [`Op`] of a [`Buckets::batch`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Done {
    /// A get's key read (for a filter such as `<device-id>.>`, the newest matching key, as
    /// [`Buckets::get_keyed`] says) and value.
    Got(String, Change),
    /// A put's revision.
    Put(u64),
    /// The bucket exists.
    Opened,
}

/// The opened buckets.
#[derive(Clone)]
pub struct Buckets {
    nats: Nats,
    opened: BTreeSet<String>,
}

fn store_missing(bucket: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("bucket {bucket} was not opened"),
    )
}

impl Buckets {
    fn check(&self, bucket: &str) -> io::Result<()> {
        if self.opened.contains(bucket) {
            Ok(())
        } else {
            Err(store_missing(bucket))
        }
    }

    /// Reads `key` with a direct get of its last value (bounded by [`REQUEST_TIMEOUT`]).
    pub fn get(&self, bucket: &str, key: &str) -> io::Result<Change> {
        self.get_keyed(bucket, key).map(|(_, c)| c)
    }

    /// Like [`Self::get`], also naming the key read: for a filter such as `<device-id>.>` the direct get answers
    /// the newest matching key's value, and its `Nats-Subject` header says which key that is.
    pub fn get_keyed(&self, bucket: &str, key: &str) -> io::Result<(String, Change)> {
        self.check(bucket)?;
        self.read_keyed(bucket, key)
    }

    /// Like [`Self::get`] for a bucket that was not opened at start-up because it may not exist (an optional
    /// one such as `device-secrets`): a missing bucket (no responders) reads as an absent key.
    pub fn get_optional(&self, bucket: &str, key: &str) -> io::Result<Change> {
        match self.read_keyed(bucket, key) {
            Ok((_, c)) => Ok(c),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Change {
                revision: 0,
                value: Value::Absent,
            }),
            Err(e) => Err(e),
        }
    }

    fn read_keyed(&self, bucket: &str, key: &str) -> io::Result<(String, Change)> {
        let msg = self
            .nats
            .request(&get_subject(bucket, key), b"", REQUEST_TIMEOUT)?;
        read_answer(bucket, key, msg)
    }

    /// Runs `ops` as one batch of requests ([`Nats::requests`]: all sent, then every answer awaited within
    /// [`PUT_TIMEOUT`]), each as [`Self::get`] or [`Self::put`] would; the results in `ops`' order.
    pub fn batch(&self, ops: &[Op]) -> Vec<io::Result<Done>> {
        let unopened = |op: &&Op| match op {
            Op::Get { bucket, .. } | Op::Put { bucket, .. } => self.check(bucket).is_err(),
            Op::Open { .. } => false,
        };
        if let Some(Op::Get { bucket, .. } | Op::Put { bucket, .. }) = ops.iter().find(unopened) {
            return ops.iter().map(|_| Err(store_missing(bucket))).collect();
        }
        self.nats.batch(ops)
    }

    /// Reads `key` after a notice that it was written: again (up to [`FRESH_READS`] times, [`FRESH_PAUSE`] apart)
    /// while the read shows no revision newer than `seen`, since on a NATS cluster the replica answering a
    /// direct get may not have applied that write yet. The last read is returned either way.
    fn get_newer(&self, bucket: &str, key: &str, seen: Option<u64>) -> io::Result<Change> {
        let mut tries = 1;
        loop {
            let c = self.get(bucket, key)?;
            if seen.is_none_or(|s| c.revision > s) || tries >= FRESH_READS {
                return Ok(c);
            }
            tries += 1;
            std::thread::sleep(FRESH_PAUSE);
        }
    }

    /// Writes `key` and waits (at most [`PUT_TIMEOUT`]) for JetStream's acknowledgement; returns the revision.
    pub fn put(&self, bucket: &str, key: &str, value: &[u8]) -> io::Result<u64> {
        self.check(bucket)?;
        let msg = self
            .nats
            .request(&format!("$KV.{bucket}.{key}"), value, PUT_TIMEOUT)?;
        put_answer(bucket, key, &msg)
    }

    /// What a watch needs: a subscription where [`Self::watch`] listens for `key` (its subject, or with the device
    /// API this connection's watch inbox) and a direct get (what the probe checks).
    pub fn probe_watch(&self, bucket: &str, key: &str) -> io::Result<()> {
        self.check(bucket)?;
        let (subject, _) = self.nats.watch_subjects(bucket, key)?;
        let sub = self.nats.conn()?.subscribe(&subject)?;
        let got = self.get(bucket, key);
        let _ = sub.unsubscribe();
        got.map(|_| ())
    }

    /// Watches `key` (or `<prefix>.>`) on a thread: its current value first (when it exists), then every change,
    /// each passed to `send` until it returns false or `stop` is set (set it, then call [`Nats::wake_watches`]).
    /// Changes are noticed through the key's subject (every write is published there; with the device API, its
    /// notice below this connection's watch inbox, see [`Nats::watch_subjects`]) and read with a direct
    /// get, so the revision is the stream's. The thread sleeps on the subscription with no time-out (an idle
    /// watch costs no wake-ups); a reconnect wakes it to subscribe and read again, and callers still re-read the
    /// key periodically, so a missed change is only late, never lost.
    pub fn watch(
        &self,
        bucket: &str,
        key: &str,
        stop: Arc<AtomicBool>,
        send: impl Fn(Change) -> bool + Send + 'static,
    ) -> io::Result<std::thread::JoinHandle<()>> {
        self.watch_keys(bucket, key, stop, move |_, c| send(c))
    }

    /// Like [`Self::watch`], with each change's key: for a filter such as `<device-id>.>`, the newest key's value
    /// first, then every key written.
    pub fn watch_keys(
        &self,
        bucket: &str,
        key: &str,
        stop: Arc<AtomicBool>,
        send: impl Fn(String, Change) -> bool + Send + 'static,
    ) -> io::Result<std::thread::JoinHandle<()>> {
        self.check(bucket)?;
        let this = self.clone();
        let (bucket, key) = (bucket.to_owned(), key.to_owned());
        std::thread::Builder::new()
            .name(format!("watch-{bucket}"))
            .spawn(move || {
                // The newest revision read per key, so that a read older than the write it was noticed for is
                // read again ([`FRESH_READS`]).
                let mut seen: BTreeMap<String, u64> = BTreeMap::new();
                while !stop.load(Ordering::SeqCst) {
                    let epoch = this.nats.reconnect_count();
                    let (subject, prefix) = match this.nats.watch_subjects(&bucket, &key) {
                        Ok(s) => s,
                        Err(e) => {
                            log::debug!("watch {bucket}/{key}: {e}; retrying");
                            std::thread::sleep(Duration::from_secs(1));
                            continue;
                        }
                    };
                    let sub = match this.nats.conn().and_then(|c| c.subscribe(&subject)) {
                        Ok(s) => s,
                        Err(e) => {
                            log::debug!("watch {bucket}/{key}: {e}; retrying");
                            std::thread::sleep(Duration::from_secs(1));
                            continue;
                        }
                    };
                    // Registered before the read, so a reconnect from now on wakes this subscription.
                    let id = this.nats.inner.register_watch(&sub);
                    let woken = |sub: fleet_nats::Subscription| {
                        this.nats.inner.unregister_watch(id);
                        let _ = sub.unsubscribe();
                    };
                    if this.nats.reconnect_count() != epoch {
                        woken(sub);
                        continue;
                    }
                    // The current value, as a consumer delivering the last value per key would.
                    match this.get_keyed(&bucket, &key) {
                        Ok((k, c)) if c.revision > 0 => {
                            seen.insert(k.clone(), c.revision);
                            if !send(k, c) {
                                woken(sub);
                                return;
                            }
                        }
                        // Absent: a notice of its first write is followed by a read that must find it.
                        Ok((k, _)) => {
                            seen.entry(k).or_insert(0);
                        }
                        Err(e) => log::debug!("watch {bucket}/{key}: {e}"),
                    }
                    // Blocks until a write, a wake (stop, reconnect) or the connection's close: no timed polling.
                    while let Some(msg) = sub.next() {
                        if stop.load(Ordering::SeqCst) {
                            break;
                        }
                        // The written key (one of several under a `<prefix>.>` watch); read it for its revision.
                        let Some(changed) = msg.subject.strip_prefix(&prefix) else {
                            continue;
                        };
                        crate::timing::mark("delivered", format_args!("bucket={bucket}"));
                        match this.get_newer(&bucket, changed, seen.get(changed).copied()) {
                            Ok(c) => {
                                seen.insert(changed.to_owned(), c.revision);
                                crate::timing::mark(
                                    "read",
                                    format_args!("bucket={bucket} rev={}", c.revision),
                                );
                                if !send(changed.to_owned(), c) {
                                    woken(sub);
                                    return;
                                }
                            }
                            Err(e) => log::warn!("watch {bucket}/{changed}: {e}"),
                        }
                    }
                    woken(sub);
                    if !stop.load(Ordering::SeqCst) && this.nats.reconnect_count() == epoch {
                        // The connection closed and its replacement is not there yet.
                        std::thread::sleep(Duration::from_secs(1));
                    }
                }
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconnect_pauses_spread_further_with_each_failure_up_to_a_minute() {
        let tops: Vec<u64> = (0..9).map(|f| reconnect_pause_top(f).as_secs()).collect();
        assert_eq!(tops, [3, 5, 9, 17, 33, 60, 60, 60, 60]);
        for failed in [1, 4, 7, u32::MAX] {
            let top = reconnect_pause_top(failed);
            let pauses: Vec<Duration> = (0..200).map(|_| reconnect_pause(failed)).collect();
            assert!(
                pauses.iter().all(|p| *p >= RECONNECT_PAUSE_MIN && *p < top),
                "{failed}: {pauses:?}"
            );
            assert!(pauses.iter().any(|p| *p > top / 2), "{failed}: {pauses:?}");
        }
    }

    #[test]
    fn reconnect_pauses_are_spread_over_one_to_three_seconds() {
        let pauses: Vec<Duration> = (0..500).map(|_| reconnect_pause(0)).collect();
        let (lo, hi) = (RECONNECT_PAUSE_MIN, RECONNECT_PAUSE_MIN * 3);
        assert!(pauses.iter().all(|p| *p >= lo && *p < hi), "{pauses:?}");
        // Spread, not one fixed pause: a fleet that lost its server at one moment does not come back in step.
        let early = pauses
            .iter()
            .filter(|p| **p < Duration::from_secs(2))
            .count();
        assert!((100..400).contains(&early), "{early} of 500 below 2 s");
    }

    #[test]
    fn token_file_is_read_trimmed_and_bounded() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("nats-token");
        std::fs::write(&p, "  eyJ.token.sig\n").expect("write");
        assert_eq!(read_token(&p).expect("token"), "eyJ.token.sig");
        std::fs::write(&p, "\n").expect("write");
        let e = read_token(&p).expect_err("empty");
        assert!(
            e.to_string().contains("is empty") && !e.to_string().contains("eyJ"),
            "{e}"
        );
        std::fs::write(&p, "x".repeat(TOKEN_MAX_BYTES as usize + 1)).expect("write");
        assert!(read_token(&p)
            .expect_err("big")
            .to_string()
            .contains("larger than"));
        let e = read_token(&dir.path().join("missing")).expect_err("missing");
        assert!(e.to_string().contains("missing"), "{e}");
    }

    #[test]
    fn api_errors_are_named() {
        let e = api_result(
            br#"{"error":{"code":404,"err_code":10059,"description":"stream not found"}}"#,
        )
        .expect_err("error");
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(e
            .to_string()
            .contains("stream not found (JetStream error 10059)"));
        assert_eq!(
            api_result(br#"{"stream":"KV_x","seq":7}"#).expect("ack")["seq"],
            7
        );
        assert!(api_result(b"not json").is_err());
    }
}
