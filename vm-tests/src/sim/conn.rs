//! One NATS connection and the devices on it (or, with `--token-dir`, a group of devices that each have a
//! connection of their own, [`crate::sim::device_conn`]). Four kinds of thread share it:
//!
//! - the **driver** owns the devices' state and sends every write: device info at start, heartbeats and workload
//!   statuses when their [`Schedule`] says, and the answers to what the watches queued (timed steps of an
//!   upgrade included);
//! - three **watches** subscribe to `$KV.<bucket>.>` of the buckets the operator writes for devices (every KV put
//!   is published on its key's subject, which is what the agent's plain-NATS watch listens to), keep the messages
//!   for this connection's devices, and queue them for the driver; with a connection per device, the group's
//!   one **I/O** thread ([`crate::sim::device_io`]) serves every device connection of the group instead, through
//!   fleet-auth's device API;
//! - the **acks** thread matches JetStream's acknowledgements to the writes in flight (with a connection per
//!   device, the I/O thread matches them, and this thread only times out those never answered).
//!
//! A write is a request on the key's subject `$KV.<bucket>.<key>` (what the agent sends: JetStream, or with a
//! device token fleet-auth's device API, answers it). Bounded: writes in flight ([`crate::sim::args::Args::max_in_flight`],
//! the driver waits for room), each acknowledgement ([`PUT_TIMEOUT`]), the queue of timed events, every
//! subscription's queue (the client drops and counts beyond it).

use crate::sim::args::Args;
use crate::sim::device_conn::DeviceConn;
use crate::sim::device_io;
use crate::sim::fleet::{device_id, fails, index_of};
use crate::sim::reply;
use crate::sim::schedule::Schedule;
use crate::sim::stats::{Kind, Stats};
use fleet_wire::kv;
use fleet_wire::{
    AgentUpgradeAttempt, AgentUpgradeStatus, AttemptId, DesiredState, DeviceId, Id128,
    SystemUpgradeAttempt, SystemUpgradeStatus, Timestamp, UpgradePhase, Version,
};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a write waits for its acknowledgement before it counts as an error (the agent's `PUT_TIMEOUT`).
pub const PUT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the driver waits for a device's first connection before its start-up writes (with a connection per
/// device).
pub const FIRST_CONNECT_WAIT: Duration = Duration::from_secs(120);
/// Timed events queued per connection at most (an upgrade is a handful per device); more are dropped and counted.
pub const MAX_EVENTS_PER_DEVICE: usize = 16;

/// What the driver does next for one device (index local to the connection).
enum Event {
    Desired(usize, DesiredState),
    AgentIntent(usize, AgentUpgradeAttempt),
    AgentStep(usize, AttemptId, usize),
    SystemIntent(usize, String, SystemUpgradeAttempt),
    SystemDone(usize, String),
    /// Its device info again: it is back after losing its connection (fleet-agent writes its device info again
    /// when it finds it missing from NATS, as after the device was retired and enrolled again).
    Info(usize),
}

struct Timed {
    at: Instant,
    order: u64,
    event: Event,
}
impl PartialEq for Timed {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.order) == (o.at, o.order)
    }
}
impl Eq for Timed {}
impl PartialOrd for Timed {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Timed {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.at, self.order).cmp(&(o.at, o.order))
    }
}

#[derive(Default)]
struct Events {
    heap: BinaryHeap<Reverse<Timed>>,
    order: u64,
}

/// One device's state, owned by the driver.
struct Device {
    id: DeviceId,
    fails: bool,
    version: Version,
    boot: Id128,
    beat: u64,
    desired: Option<DesiredState>,
    agent: Option<AgentUpgradeStatus>,
    /// System-upgrade runs by key; a finished run waits for the next heartbeat (`firstHeartbeatAfterCompletion`).
    runs: HashMap<String, SystemUpgradeStatus>,
    first_beat_due: Vec<String>,
}

/// Where a connection's writes go.
pub(crate) enum Link {
    /// One connection for all its devices (the services' user); write `n` is answered on `<reply_base>.<n>`.
    Shared {
        client: fleet_nats::Client,
        reply_base: String,
    },
    /// A connection per device, by local index, through the auth callout.
    Own(Vec<Arc<DeviceConn>>),
}

/// The state every thread of a connection shares.
pub(crate) struct Shared {
    link: Link,
    pub(crate) stats: Arc<Stats>,
    pub(crate) stop: Arc<AtomicBool>,
    /// Local index of each of this connection's devices, by id.
    local: HashMap<String, usize>,
    /// Writes in flight: reply number → (kind, device's local index, sent).
    pending: Mutex<HashMap<u64, (Kind, usize, Instant)>>,
    room: Condvar,
    max_in_flight: usize,
    next_reply: AtomicU64,
    events: Mutex<Events>,
    wake: Condvar,
    max_events: usize,
}

/// A running connection.
pub struct Conn {
    shared: Arc<Shared>,
    /// Its threads.
    pub threads: Vec<JoinHandle<()>>,
    subs: Vec<fleet_nats::Subscription>,
}

impl Conn {
    /// Writes waiting for an acknowledgement now.
    pub fn in_flight(&self) -> u64 {
        self.shared
            .pending
            .lock()
            .map(|p| p.len() as u64)
            .unwrap_or(0)
    }
    /// Messages the client dropped from this connection's full subscription queues.
    pub fn dropped(&self) -> u64 {
        self.subs.iter().map(|s| s.dropped()).sum()
    }
    /// Why the connection ended, if it has (never with a connection per device: each reconnects by itself).
    pub fn closed(&self) -> Option<String> {
        match &self.shared.link {
            Link::Shared { client, .. } => client.closed(),
            Link::Own(_) => None,
        }
    }
    /// How many of its devices have a connection now (all of them over a shared connection).
    pub fn connected(&self) -> usize {
        match &self.shared.link {
            Link::Shared { .. } => self.shared.local.len(),
            Link::Own(devices) => devices.iter().filter(|d| d.online()).count(),
        }
    }
}

fn options(args: &Args, c: usize) -> io::Result<fleet_nats::Options> {
    let url = fleet_wire::auth::split_nats_url(&args.nats_url);
    let mut o = fleet_nats::Options::new(&url.url);
    o.name = format!("fleet-sim-{c}");
    if let Some((user, password)) = url.user_password {
        o.auth = fleet_nats::Auth::UserPassword { user, password };
    }
    o.tls = tls(args)?;
    // A watch sees every device's key (one subscription per bucket and connection): room for a write to each.
    o.sub_max_msgs = (2 * args.devices).clamp(1024, 1 << 20);
    o.sub_max_bytes = 256 << 20;
    Ok(o)
}

/// TLS trusting `--ca-file` only, when given.
pub(crate) fn tls(args: &Args) -> io::Result<Option<fleet_nats::TlsOptions>> {
    let Some(ca) = &args.ca_file else {
        return Ok(None);
    };
    let pem = std::fs::read(ca)
        .map_err(|e| io::Error::new(e.kind(), format!("--ca-file {}: {e}", ca.display())))?;
    Ok(Some(fleet_nats::TlsOptions {
        ca_pem: Some(pem),
        client: None,
    }))
}

/// Connects connection `c` of `args.connections`, serving the devices `i` in `args.first..args.first +
/// args.devices` with `i % connections == c`, and starts its threads. With `--token-dir`, starts instead one I/O
/// thread for these devices, which connects each with its own token (and again whenever its connection is lost).
pub fn start(args: &Args, c: usize, stats: Arc<Stats>, stop: Arc<AtomicBool>) -> io::Result<Conn> {
    let indices: Vec<usize> = (args.first..args.first + args.devices)
        .filter(|i| i % args.connections == c)
        .collect();
    let mut worker = None;
    let link = match &args.token_dir {
        None => {
            let client = fleet_nats::connect(&options(args, c)?)?;
            let reply_base = format!("_INBOX.fleet-sim.{}.{c}", std::process::id());
            Link::Shared { client, reply_base }
        }
        Some(dir) => {
            let w = device_io::Worker::new(&args.nats_url, tls(args)?.as_ref(), stop.clone())?;
            let mailbox = w.mailbox();
            worker = Some(w);
            Link::Own(
                indices
                    .iter()
                    .enumerate()
                    .map(|(k, &i)| Arc::new(DeviceConn::new(device_id(i), k, dir, mailbox.clone())))
                    .collect(),
            )
        }
    };
    let local = indices
        .iter()
        .enumerate()
        .map(|(k, &i)| (device_id(i).as_str().to_owned(), k))
        .collect();
    let shared = Arc::new(Shared {
        link,
        stats,
        stop,
        local,
        pending: Mutex::new(HashMap::new()),
        room: Condvar::new(),
        max_in_flight: args.max_in_flight,
        next_reply: AtomicU64::new(0),
        events: Mutex::new(Events::default()),
        wake: Condvar::new(),
        max_events: MAX_EVENTS_PER_DEVICE * indices.len() + 1024,
    });
    let mut subs = vec![];
    let mut threads = vec![];
    match &shared.link {
        Link::Shared { client, reply_base } => {
            let replies = client.subscribe(&format!("{reply_base}.*"))?;
            subs.push(replies.clone());
            for bucket in [
                kv::DESIRED_STATE,
                kv::AGENT_UPGRADE_INTENT,
                kv::SYSTEM_UPGRADE_INTENT,
            ] {
                let sub = client.subscribe(&format!("$KV.{bucket}.>"))?;
                subs.push(sub.clone());
                let sh = shared.clone();
                threads.push(spawn(&format!("sim-watch-{c}"), move || {
                    watch(&sh, bucket, &sub)
                })?);
            }
            // Subscriptions are in place before the first write, so no intent written in answer is missed.
            client.flush(Duration::from_secs(10))?;
            let sh = shared.clone();
            threads.push(spawn(&format!("sim-acks-{c}"), move || {
                acks(&sh, Some(&replies))
            })?);
        }
        Link::Own(devices) => {
            if let Some(mut w) = worker {
                for d in devices {
                    w.add(d.clone(), shared.clone());
                }
                threads.push(spawn(&format!("sim-io-{c}"), move || w.run())?);
            }
            let sh = shared.clone();
            threads.push(spawn(&format!("sim-acks-{c}"), move || acks(&sh, None))?);
        }
    }
    let devices: Vec<Device> = indices
        .iter()
        .map(|&i| Device {
            id: device_id(i),
            fails: fails(i, args.fail_fraction),
            version: Version::try_from(reply::START_VERSION).unwrap_or_else(|_| unreachable!()),
            boot: reply::boot_id(i),
            beat: 0,
            desired: None,
            agent: None,
            runs: HashMap::new(),
            first_beat_due: vec![],
        })
        .collect();
    let sh = shared.clone();
    let (hb, st) = (args.heartbeat, args.status);
    threads.push(spawn(&format!("sim-driver-{c}"), move || {
        Driver { sh, devices }.run(hb, st)
    })?);
    Ok(Conn {
        shared,
        threads,
        subs,
    })
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> io::Result<JoinHandle<()>> {
    std::thread::Builder::new().name(name.to_owned()).spawn(f)
}

impl Shared {
    fn push(&self, at: Instant, event: Event) {
        let Ok(mut ev) = self.events.lock() else {
            return;
        };
        if ev.heap.len() >= self.max_events {
            self.stats.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        ev.order += 1;
        let order = ev.order;
        ev.heap.push(Reverse(Timed { at, order, event }));
        self.wake.notify_one();
    }

    /// Sends one write of device `k` and returns at once (its acknowledgement is counted where it arrives); waits
    /// for room when [`Self::max_in_flight`] writes are unacknowledged, at most [`PUT_TIMEOUT`]. A device without a
    /// connection at the moment does not send it (counted as offline).
    fn put(&self, k: usize, kind: Kind, bucket: &str, key: &str, value: &impl serde::Serialize) {
        if let Link::Own(devices) = &self.link {
            if !devices[k].online() {
                if kind == Kind::Info {
                    devices[k].info_written(false);
                }
                self.stats.offline.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
        let Ok(body) = serde_json::to_vec(value) else {
            self.stats.error(kind);
            return;
        };
        let n = self.next_reply.fetch_add(1, Ordering::Relaxed);
        {
            let Ok(mut p) = self.pending.lock() else {
                return;
            };
            let deadline = Instant::now() + PUT_TIMEOUT;
            while p.len() >= self.max_in_flight {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() || self.stop.load(Ordering::Relaxed) {
                    self.stats.error(kind);
                    return;
                }
                p = match self.room.wait_timeout(p, left) {
                    Ok((p, _)) => p,
                    Err(_) => return,
                };
            }
            p.insert(n, (kind, k, Instant::now()));
        }
        self.stats.sent(kind);
        let subject = format!("$KV.{bucket}.{key}");
        let sent = match &self.link {
            Link::Shared { client, reply_base } => {
                client.publish_request(&subject, &format!("{reply_base}.{n}"), &body)
            }
            Link::Own(devices) => devices[k].publish_put(&subject, n, &body),
        };
        if sent.is_err() {
            if let Ok(mut p) = self.pending.lock() {
                p.remove(&n);
            }
            if let (Link::Own(devices), Kind::Info) = (&self.link, kind) {
                devices[k].info_written(false);
            }
            self.stats.error(kind);
        }
    }

    /// Counts the answer `m` to write `n`: acknowledged (JetStream's ack, also as the device API relays it) or an
    /// error (a status, or an answer in JetStream's error shape: a refused write).
    pub(crate) fn on_ack(&self, n: u64, m: &fleet_nats::Message) {
        let Some((kind, k, sent)) = self.pending.lock().ok().and_then(|mut p| p.remove(&n)) else {
            return; // answered after its time-out: already counted
        };
        self.room.notify_one();
        let ok = m
            .headers
            .as_ref()
            .and_then(|h| h.status.as_deref())
            .is_none()
            && serde_json::from_slice::<serde_json::Value>(&m.data)
                .ok()
                .is_some_and(|v| v.get("seq").is_some() && v.get("error").is_none());
        if let (Link::Own(devices), Kind::Info) = (&self.link, kind) {
            devices[k].info_written(ok);
        }
        if ok {
            self.stats.acked(kind);
            if let (Link::Own(devices), Kind::Heartbeat) = (&self.link, kind) {
                if devices[k].take_info_missing() {
                    self.push(Instant::now(), Event::Info(k));
                }
            }
            if kind == Kind::Heartbeat {
                self.stats.heartbeat_ack.record(sent.elapsed());
                if let Link::Own(devices) = &self.link {
                    if let Some(after) = devices[k].heartbeat_acked() {
                        // A line per device back after losing its connection: the reconnect-storm bench times
                        // each device by when this line arrives.
                        self.stats.back.fetch_add(1, Ordering::Relaxed);
                        println!(
                            "fleet-sim back {} after_ms={}",
                            devices[k].id(),
                            after.as_millis()
                        );
                        self.push(Instant::now(), Event::Info(k));
                    }
                }
            }
        } else {
            self.stats.error(kind);
        }
    }

    /// Counts writes unanswered after [`PUT_TIMEOUT`] as errors; false once the lock is poisoned.
    fn sweep(&self) -> bool {
        let expired: Vec<Kind> = match self.pending.lock() {
            Ok(mut p) => {
                let old: Vec<u64> = p
                    .iter()
                    .filter(|(_, (_, _, t))| t.elapsed() >= PUT_TIMEOUT)
                    .map(|(n, _)| *n)
                    .collect();
                old.iter()
                    .filter_map(|n| p.remove(n))
                    .map(|(kind, _, _)| kind)
                    .collect()
            }
            Err(_) => return false,
        };
        for k in &expired {
            self.stats.error(*k);
        }
        if !expired.is_empty() {
            self.room.notify_all();
        }
        true
    }

    /// Queues for the driver what the operator wrote to `key` of `bucket` (one of the three it writes for
    /// devices), when the key is one of this connection's devices'; `m` carries the value (a KV message, or a
    /// direct get's answer) and its `KV-Operation`.
    pub(crate) fn on_put(&self, bucket: &str, key: &str, m: &fleet_nats::Message) {
        let device = key.split('.').next().unwrap_or(key);
        let Some(&k) = self.local.get(device) else {
            return;
        };
        if index_of(device).is_none() {
            return;
        }
        // A delete or purge (the operator removing a terminal intent) asks nothing of the device.
        let op = m.headers.as_ref().and_then(|h| h.get("KV-Operation"));
        if matches!(op, Some("DEL") | Some("PURGE")) {
            return;
        }
        self.stats.received.fetch_add(1, Ordering::Relaxed);
        let bad = || self.stats.bad_values.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        match bucket {
            kv::DESIRED_STATE => match serde_json::from_slice(&m.data) {
                Ok(d) => self.push(now, Event::Desired(k, d)),
                Err(_) => {
                    bad();
                }
            },
            kv::AGENT_UPGRADE_INTENT => match serde_json::from_slice(&m.data) {
                Ok(a) => self.push(now, Event::AgentIntent(k, a)),
                Err(_) => {
                    bad();
                }
            },
            kv::SYSTEM_UPGRADE_INTENT => match serde_json::from_slice(&m.data) {
                Ok(a) => self.push(now, Event::SystemIntent(k, key.to_owned(), a)),
                Err(_) => {
                    bad();
                }
            },
            _ => {}
        }
    }
}

/// Matches acknowledgements on `sub` (a shared connection's replies) to writes; a write unanswered after
/// [`PUT_TIMEOUT`] is an error. Without `sub` (a connection per device, whose threads match their own), it only
/// times writes out.
fn acks(sh: &Shared, sub: Option<&fleet_nats::Subscription>) {
    let mut last_sweep = Instant::now();
    while !sh.stop.load(Ordering::Relaxed) {
        match sub.map(|s| s.next_timeout(Duration::from_millis(500))) {
            Some(Ok(m)) => {
                if let Some(n) = m
                    .subject
                    .rsplit('.')
                    .next()
                    .and_then(|n| n.parse::<u64>().ok())
                {
                    sh.on_ack(n, &m);
                }
            }
            Some(Err(e)) if e.kind() == io::ErrorKind::TimedOut => {}
            Some(Err(_)) => return,
            None => std::thread::sleep(Duration::from_millis(500)),
        }
        if last_sweep.elapsed() >= Duration::from_secs(1) {
            last_sweep = Instant::now();
            if !sh.sweep() {
                return;
            }
        }
    }
}

/// Queues the operator's writes to this connection's devices for the driver.
fn watch(sh: &Shared, bucket: &'static str, sub: &fleet_nats::Subscription) {
    let prefix = format!("$KV.{bucket}.");
    while !sh.stop.load(Ordering::Relaxed) {
        let m = match sub.next_timeout(Duration::from_millis(500)) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::TimedOut => continue,
            Err(_) => return,
        };
        if let Some(key) = m.subject.strip_prefix(&prefix) {
            sh.on_put(bucket, key, &m);
        }
    }
}

struct Driver {
    sh: Arc<Shared>,
    devices: Vec<Device>,
}

impl Driver {
    fn run(mut self, heartbeat: Duration, status: Duration) {
        // At start each device writes its info, a workload status and a heartbeat, one after the other, as the
        // agent does when it starts (fleet-agent's event loop: status and heartbeat before its first wait); all
        // devices as fast as the in-flight bound lets (the onboarding the bench times). A device with a connection
        // of its own starts once it has one (the agent's first writes follow its first connection), or after
        // [`FIRST_CONNECT_WAIT`] without one (its writes then count as offline).
        let until = Instant::now() + FIRST_CONNECT_WAIT;
        for k in 0..self.devices.len() {
            if let Link::Own(devices) = &self.sh.link {
                while !devices[k].online() && Instant::now() < until {
                    if self.sh.stop.load(Ordering::Relaxed) {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
            if self.sh.stop.load(Ordering::Relaxed) {
                return;
            }
            self.send_info(k);
            self.send_first_workload_status(k);
            self.send_heartbeat(k);
        }
        let start = Instant::now();
        let n = self.devices.len();
        let mut beats = Schedule::spread(n, heartbeat, start, 0.0);
        // Statuses half an interval after the heartbeats, so the two do not land together.
        let mut statuses = Schedule::spread(n, status, start, 0.5);
        while !self.sh.stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            while let Some((k, due)) = beats.pop_due(now) {
                self.sh
                    .stats
                    .heartbeat_late
                    .record(now.saturating_duration_since(due));
                self.send_heartbeat(k);
                beats.sent(k, Instant::now());
            }
            while let Some((k, _)) = statuses.pop_due(now) {
                self.send_workload_status(k);
                statuses.sent(k, Instant::now());
            }
            self.run_events(now);
            let next = [beats.next_due(), statuses.next_due(), self.next_event()]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or(now + Duration::from_secs(1))
                .min(Instant::now() + Duration::from_millis(500));
            let Ok(ev) = self.sh.events.lock() else {
                return;
            };
            let wait = next.saturating_duration_since(Instant::now());
            let due_now = ev
                .heap
                .peek()
                .is_some_and(|Reverse(t)| t.at <= Instant::now());
            if !wait.is_zero() && !due_now {
                let _ = self.sh.wake.wait_timeout(ev, wait);
            }
        }
    }

    fn next_event(&self) -> Option<Instant> {
        self.sh
            .events
            .lock()
            .ok()?
            .heap
            .peek()
            .map(|Reverse(t)| t.at)
    }

    fn run_events(&mut self, now: Instant) {
        loop {
            let e = {
                let Ok(mut ev) = self.sh.events.lock() else {
                    return;
                };
                match ev.heap.peek() {
                    Some(Reverse(t)) if t.at <= now => ev.heap.pop().map(|Reverse(t)| t.event),
                    _ => None,
                }
            };
            match e {
                Some(e) => self.on(e),
                None => return,
            }
        }
    }

    fn on(&mut self, e: Event) {
        let now = Instant::now();
        match e {
            Event::Desired(k, d) => {
                let d_dev = &self.devices[k];
                if d.device_id != d_dev.id {
                    self.sh.stats.bad_values.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                if d_dev
                    .desired
                    .as_ref()
                    .is_some_and(|c| c.generation == d.generation && *c == d)
                {
                    return;
                }
                self.devices[k].desired = Some(d);
                self.send_workload_status(k);
            }
            Event::AgentIntent(k, a) => {
                let dev = &self.devices[k];
                if a.device_id != dev.id {
                    self.sh.stats.bad_values.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                if dev
                    .agent
                    .as_ref()
                    .is_some_and(|s| s.attempt_id.as_ref() == Some(&a.attempt_id))
                {
                    return; // the same attempt again (a resync, a rewrite): already answered
                }
                let s = reply::agent_accepted(&a, &dev.boot, Timestamp::now());
                self.sh.put(
                    k,
                    Kind::Agent,
                    kv::AGENT_UPGRADE_STATUS,
                    dev.id.as_str(),
                    &s,
                );
                self.devices[k].agent = Some(s);
                let first = reply::agent_steps(self.devices[k].fails)[0].0;
                self.sh
                    .push(now + first, Event::AgentStep(k, a.attempt_id, 0));
            }
            Event::AgentStep(k, id, i) => {
                let fails = self.devices[k].fails;
                let steps = reply::agent_steps(fails);
                let dev = &mut self.devices[k];
                let Some(s) = dev.agent.take() else { return };
                if s.attempt_id.as_ref() != Some(&id) || i >= steps.len() {
                    dev.agent = Some(s);
                    return;
                }
                let (_, phase, reason) = steps[i];
                let s = reply::agent_step(s, phase, reason, Timestamp::now());
                let target = s.target_version.clone();
                self.sh.put(
                    k,
                    Kind::Agent,
                    kv::AGENT_UPGRADE_STATUS,
                    dev.id.as_str(),
                    &s,
                );
                dev.agent = Some(s);
                if phase == UpgradePhase::Starting {
                    // The new agent starts and publishes its device info, with the new version, before the
                    // updater commits it (as fleet-agent does): an info published after the commit would be a
                    // restart of the new agent, which fails a staged rollout's soak.
                    if let Some(v) = target {
                        dev.version = v;
                    }
                    dev.beat = 0;
                    self.send_info(k);
                }
                if let Some((delay, _, _)) = steps.get(i + 1) {
                    self.sh.push(now + *delay, Event::AgentStep(k, id, i + 1));
                }
            }
            Event::SystemIntent(k, key, a) => {
                let dev = &mut self.devices[k];
                if a.device_id != dev.id || dev.runs.contains_key(&key) {
                    return;
                }
                let s = reply::system_accepted(&a, Timestamp::now());
                self.sh
                    .put(k, Kind::System, kv::SYSTEM_UPGRADE_STATUS, &key, &s);
                let accepted = !s.phase.is_terminal();
                // Runs a device keeps (bounded as the bucket's share is: 16 per device).
                if dev.runs.len() >= kv::RUNS_PER_DEVICE as usize {
                    if let Some(old) = dev.runs.keys().next().cloned() {
                        dev.runs.remove(&old);
                    }
                }
                dev.runs.insert(key.clone(), s);
                if accepted {
                    self.sh
                        .push(now + reply::SYSTEM_RUN, Event::SystemDone(k, key));
                }
            }
            Event::Info(k) => self.send_info(k),
            Event::SystemDone(k, key) => {
                let dev = &mut self.devices[k];
                let Some(s) = dev.runs.remove(&key) else {
                    return;
                };
                let s = reply::system_done(s, dev.fails, Timestamp::now());
                self.sh
                    .put(k, Kind::System, kv::SYSTEM_UPGRADE_STATUS, &key, &s);
                dev.runs.insert(key.clone(), s);
                dev.first_beat_due.push(key);
            }
        }
    }

    fn send_info(&mut self, k: usize) {
        let d = &self.devices[k];
        let info = reply::device_info(&d.id, &d.version, &d.boot, Timestamp::now());
        self.sh
            .put(k, Kind::Info, kv::DEVICE_INFO, d.id.as_str(), &info);
    }

    fn send_heartbeat(&mut self, k: usize) {
        let d = &mut self.devices[k];
        d.beat += 1;
        let at = Timestamp::now();
        let h = reply::heartbeat(&d.id, &d.version, &d.boot, d.beat, at);
        self.sh
            .put(k, Kind::Heartbeat, kv::DEVICE_HEARTBEAT, d.id.as_str(), &h);
        // A finished system upgrade records the first heartbeat after it, as the agent does.
        for key in std::mem::take(&mut d.first_beat_due) {
            if let Some(s) = d.runs.get_mut(&key) {
                s.first_heartbeat_after_completion = Some(at);
                self.sh
                    .put(k, Kind::System, kv::SYSTEM_UPGRADE_STATUS, &key, &*s);
            }
        }
    }

    fn send_first_workload_status(&mut self, k: usize) {
        let d = &self.devices[k];
        let s = reply::first_workload_status(&d.id, Timestamp::now());
        self.sh
            .put(k, Kind::Workload, kv::WORKLOAD_STATUS, d.id.as_str(), &s);
    }

    fn send_workload_status(&mut self, k: usize) {
        let d = &self.devices[k];
        // Before its first desired state a device has nothing to report.
        let Some(desired) = &d.desired else { return };
        let s = reply::workload_status(desired, d.fails, Timestamp::now());
        self.sh
            .put(k, Kind::Workload, kv::WORKLOAD_STATUS, d.id.as_str(), &s);
    }
}
