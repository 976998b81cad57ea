//! A simulated device's own NATS connection through the fleet-auth callout (`fleet-sim --token-dir`), used as
//! fleet-agent uses its connection with a device token (agent/src/nats_kv.rs): it connects with the token in
//! `<dir>/<device-id>` (read again at every connection, like the agent's token file), subscribes only below its
//! own inbox `_INBOX.device.<id>.<token>`, writes a key by publishing to `$KV.<bucket>.<key>` with a reply there
//! (fleet-auth's device API writes it and answers with JetStream's acknowledgement), registers that inbox with the
//! device API for notices of the keys the operator writes for it (again every [`WATCH_REFRESH`]), and reads a
//! noticed key with a direct get. After every connection it reads its watched keys, as the agent's watches do.
//!
//! When the connection closes it connects again after a pause drawn at random from 1 to 3 s, a range that grows with
//! each failed attempt in a row up to 1 to 60 s (the agent's own, `fleet_agent::nats_kv::reconnect_pause`), and
//! never gives up. One thread per device serves it (besides the client's I/O thread): connect, then everything that
//! arrives on its one subscription `<inbox>.>` — `<inbox>.ack.<n>` answers write `n`, `<inbox>.get` a direct get,
//! and `<inbox>.<bucket>.<key>` is a notice. (The agent has separate tokens for replies and notices; one inbox for
//! both costs a simulated device one subscription instead of several, and the server the same checks.)

use crate::sim::conn::Shared;
use fleet_wire::auth::{
    device_inbox_prefix, device_read_filter, direct_get_subject, NATS_TOKEN_MAX_BYTES,
};
use fleet_wire::device_api::{noticed_buckets, watch_subject, WatchRegistration, WATCH_REFRESH};
use fleet_wire::DeviceId;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Stack of a device's thread: it parses one message at a time (the default 2 MiB is reserved per thread, and
/// thousands of devices run).
const STACK_BYTES: usize = 256 * 1024;

/// One device's connection (none while it is away) and what it needs to make a new one.
pub struct DeviceConn {
    id: DeviceId,
    url: String,
    token_file: PathBuf,
    tls: Option<fleet_nats::TlsOptions>,
    live: Mutex<Option<Live>>,
    /// When it lost its connection, until a heartbeat is acknowledged on a new one.
    lost: Mutex<Option<Instant>>,
    /// Its device info was not written (sent while away, or refused): written again after the next
    /// acknowledged heartbeat, as fleet-agent writes its device info again when it finds it missing.
    info_missing: std::sync::atomic::AtomicBool,
}

/// A connection that is up, and the inbox its answers and notices arrive below.
struct Live {
    client: fleet_nats::Client,
    inbox: String,
}

impl DeviceConn {
    /// Device `id` of a server at `nats_url` (a `user:password@` in it is dropped: a device has only its token),
    /// with its token in `dir/<id>`.
    pub fn new(
        id: DeviceId,
        nats_url: &str,
        dir: &Path,
        tls: Option<fleet_nats::TlsOptions>,
    ) -> DeviceConn {
        DeviceConn {
            token_file: dir.join(id.as_str()),
            id,
            url: fleet_wire::auth::split_nats_url(nats_url).url,
            tls,
            live: Mutex::new(None),
            lost: Mutex::new(None),
            info_missing: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Its id.
    pub fn id(&self) -> &DeviceId {
        &self.id
    }

    /// A heartbeat of this device was acknowledged: how long after losing its connection, the first time since.
    pub fn heartbeat_acked(&self) -> Option<Duration> {
        self.lost.lock().ok()?.take().map(|t| t.elapsed())
    }

    /// Records whether its device info was written (`false`: not sent, or refused).
    pub fn info_written(&self, ok: bool) {
        self.info_missing.store(!ok, Ordering::SeqCst);
    }

    /// True once when its device info is missing (the caller writes it again).
    pub fn take_info_missing(&self) -> bool {
        self.info_missing.swap(false, Ordering::SeqCst)
    }

    /// Whether it has a connection now.
    pub fn online(&self) -> bool {
        self.live.lock().is_ok_and(|l| l.is_some())
    }

    /// Publishes write `n` (a KV put) with its reply on this device's inbox; `NotConnected` while away.
    pub fn publish_put(&self, subject: &str, n: u64, body: &[u8]) -> io::Result<()> {
        let live = self
            .live
            .lock()
            .map_err(|_| io::Error::other("device connection lock poisoned"))?;
        let Some(l) = live.as_ref() else {
            return Err(io::Error::new(
                io::ErrorKind::NotConnected,
                "device is away",
            ));
        };
        l.client
            .publish_request(subject, &format!("{}.ack.{n}", l.inbox), body)
    }

    fn options(&self) -> io::Result<fleet_nats::Options> {
        let mut o = fleet_nats::Options::new(&self.url);
        o.name = format!("fleet-sim-{}", self.id);
        o.auth = fleet_nats::Auth::Token(read_token(&self.token_file)?);
        o.tls = self.tls.clone();
        Ok(o)
    }
}

/// Starts device `d`'s thread (`k`: its index in its group, for the thread's name only).
pub(crate) fn spawn(d: Arc<DeviceConn>, k: usize, sh: Arc<Shared>) -> io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name(format!("sim-dev-{k}"))
        .stack_size(STACK_BYTES)
        .spawn(move || serve(&d, &sh))
}

/// Connects, serves the connection until it closes, and connects again, until the simulator stops.
fn serve(d: &DeviceConn, sh: &Shared) {
    let mut before = false;
    let mut failed = 0;
    while !sh.stop.load(Ordering::Relaxed) {
        let client = match d.options().and_then(|o| fleet_nats::connect(&o)) {
            Ok(c) => c,
            Err(e) => {
                if e.kind() == io::ErrorKind::PermissionDenied {
                    sh.stats.refused.fetch_add(1, Ordering::Relaxed);
                    // A line per refusal, with the server's words: the reconnect-storm bench tells refusals at
                    // the first connection from those after the restart by when they arrive.
                    println!("fleet-sim refused {}: {e}", d.id);
                } else {
                    sh.stats.connect_failed.fetch_add(1, Ordering::Relaxed);
                }
                failed += 1;
                pause(sh, fleet_agent::nats_kv::reconnect_pause(failed));
                continue;
            }
        };
        failed = 0;
        sh.stats.connects.fetch_add(1, Ordering::Relaxed);
        if before {
            sh.stats.reconnects.fetch_add(1, Ordering::Relaxed);
        }
        before = true;
        // Whatever ended the session (the server went away, a subscription refused), the next step is a new
        // connection after the agent's pause, as its reconnection thread does.
        let _ = session(d, sh, client);
        pause(sh, fleet_agent::nats_kv::reconnect_pause(0));
    }
}

/// Sleeps `d`, or less when the simulator stops.
fn pause(sh: &Shared, d: Duration) {
    let until = Instant::now() + d;
    while Instant::now() < until && !sh.stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(100).min(until - Instant::now()));
    }
}

/// One connection's life: subscribe below a new inbox, register it, read the watched keys, then serve.
fn session(d: &DeviceConn, sh: &Shared, client: fleet_nats::Client) -> io::Result<()> {
    let inbox = format!("{}.{}", device_inbox_prefix(&d.id), unique_token());
    let sub = client.subscribe(&format!("{inbox}.>"))?;
    register(d, &client, &inbox)?;
    for spec in noticed_buckets() {
        if let Some(filter) = device_read_filter(spec, &d.id) {
            client.publish_request(
                &direct_get_subject(spec.name, &filter),
                &format!("{inbox}.get"),
                b"",
            )?;
        }
    }
    if let Ok(mut live) = d.live.lock() {
        *live = Some(Live {
            client: client.clone(),
            inbox: inbox.clone(),
        });
    }
    let mut refresh = Instant::now() + WATCH_REFRESH;
    let ended = loop {
        if sh.stop.load(Ordering::Relaxed) {
            break Ok(());
        }
        match sub.next_timeout(Duration::from_millis(500)) {
            Ok(m) => on_message(sh, &client, &inbox, &m),
            Err(e) if e.kind() == io::ErrorKind::TimedOut => {}
            Err(e) => break Err(e),
        }
        if Instant::now() >= refresh {
            refresh = Instant::now() + WATCH_REFRESH;
            // A restarted fleet-auth knows this device's inbox again within one refresh.
            if let Err(e) = register(d, &client, &inbox) {
                break Err(e);
            }
        }
    };
    // Stopping keeps the connection counted (the last counter line shows the devices connected at the end).
    if !sh.stop.load(Ordering::Relaxed) {
        if let Ok(mut live) = d.live.lock() {
            *live = None;
        }
        if let Ok(mut lost) = d.lost.lock() {
            lost.get_or_insert_with(Instant::now);
        }
    }
    sh.stats.dropped.fetch_add(sub.dropped(), Ordering::Relaxed);
    ended
}

/// Registers `inbox` for the device API's notices.
fn register(d: &DeviceConn, client: &fleet_nats::Client, inbox: &str) -> io::Result<()> {
    let body = serde_json::to_vec(&WatchRegistration {
        inbox: inbox.to_owned(),
    })
    .map_err(io::Error::other)?;
    client.publish(&watch_subject(&d.id), &body)
}

/// An answer, a direct get's value, or a notice (then the key is read).
fn on_message(sh: &Shared, client: &fleet_nats::Client, inbox: &str, m: &fleet_nats::Message) {
    let Some(rest) = m
        .subject
        .strip_prefix(inbox)
        .and_then(|r| r.strip_prefix('.'))
    else {
        return;
    };
    if let Some(n) = rest.strip_prefix("ack.") {
        if let Ok(n) = n.parse() {
            sh.on_ack(n, m);
        }
    } else if rest == "get" {
        // The answer names its key (none on a 404: nothing written there yet).
        let Some((bucket, key)) = m
            .headers
            .as_ref()
            .and_then(|h| h.get("Nats-Subject"))
            .and_then(|s| s.trim().strip_prefix("$KV."))
            .and_then(|s| s.split_once('.'))
        else {
            return;
        };
        sh.on_put(bucket, key, m);
    } else if let Some((bucket, key)) = rest.split_once('.') {
        // A notice carries no value: read the key, as the agent's watch does.
        if noticed_buckets().any(|b| b.name == bucket) {
            let subject = direct_get_subject(bucket, &format!("$KV.{bucket}.{key}"));
            let _ = client.publish_request(&subject, &format!("{inbox}.get"), b"");
        }
    }
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

/// The token in `path` (bounded, trimmed, non-empty).
fn read_token(path: &Path) -> io::Result<String> {
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| {
            f.take(NATS_TOKEN_MAX_BYTES as u64 + 1)
                .read_to_string(&mut text)
        })
        // Not the file's own error kind: a file we may not read is not the server refusing the device.
        .map_err(|e| io::Error::other(format!("token file {}: {e}", path.display())))?;
    let token = text.trim();
    if token.is_empty() || text.len() > NATS_TOKEN_MAX_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("token file {}: empty or too large", path.display()),
        ));
    }
    Ok(token.to_owned())
}
