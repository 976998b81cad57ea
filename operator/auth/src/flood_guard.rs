//! The flood guard: what each device costs the servers, summed over all of its connections
//! ([`super::flood::Tracker`]), from two sources read as the system account's user: every poll, each server's
//! busiest connections of the devices' account (`$SYS.REQ.SERVER.PING.CONNZ`, sorted by messages received and bytes
//! delivered, and every few polls by subscriptions and undelivered bytes); and, as they happen, the account's
//! CONNECT and DISCONNECT events (`$SYS.ACCOUNT.<account>.CONNECT`/`.DISCONNECT`), so a connection is counted from
//! its start, a short-lived one by its final counters and a slow-consumer disconnect as a flood. A device over its
//! budget has every connection disconnected (`$SYS.REQ.SERVER.<id>.KICK`), its sessions refused for a cool-down
//! (the callout reads the same [`super::flood::Cooldowns`]; other replicas learn it on [`COOLDOWN_SUBJECT`]), and is
//! reported to the operator like a refused write (`fleet.device-refusals.<device>`, kind `flood`). The events also
//! keep each device's open connections for the callout's cap ([`super::flood::Admissions`]).

use super::flood::{Admissions, Budget, Closed, Conn, Cooldowns, Cooling, Flood, Tracker};
use fleet_wire::device_api::{refusals_subject, WriteRefused, FLOOD_KIND};
use fleet_wire::DeviceId;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Where replicas tell each other of a cool-down (system account).
pub const COOLDOWN_SUBJECT: &str = "fleet-auth.cooldowns";
/// Connections asked for per server, poll and sort order: the busiest.
pub const TOP_CONNECTIONS: usize = 512;
/// Servers' answers taken per poll at most.
pub const MAX_SERVERS: usize = 64;
/// Subscriptions and undelivered bytes are read every this many polls (two more sorted lists per server).
const COUNTS_EVERY_POLLS: u64 = 4;
/// How long a poll waits for the servers' answers.
const ANSWER_WINDOW: Duration = Duration::from_millis(750);
/// Time-out of one KICK.
const KICK_TIMEOUT: Duration = Duration::from_secs(2);
/// Every this many CONNZ requests, the answers are awaited for the whole window (servers that joined are found).
const DISCOVER_EVERY: u64 = 20;
/// When a new connection is looked at again after it connected (each pause after the previous look).
const WATCH_NEW_AT: [Duration; 4] = [
    Duration::from_millis(50),
    Duration::from_millis(100),
    Duration::from_millis(250),
    Duration::from_millis(500),
];
/// New connections watched at once at most.
const MAX_WATCHED: usize = 64;
/// Every this many polls the devices' open connections are checked against the servers' ([`reconcile`]).
const RECONCILE_EVERY_POLLS: u64 = 20;
/// A server that has not answered a CONNZ request for this long is gone (restarted: a new id).
const SERVER_GONE: Duration = Duration::from_secs(30);
/// Devices at their cap checked against the servers' lists per reconciliation at most.
const MAX_RECONCILED: usize = 100;
/// Connections of one device listed for a kick at most, per server.
const MAX_KICKED: usize = 1024;

/// The guard's settings, loaded.
#[derive(Clone)]
pub struct GuardSettings {
    /// System-account user (listed in `auth_callout.auth_users`).
    pub user: String,
    /// Its password.
    pub password: String,
    /// The budget and cool-downs.
    pub budget: Budget,
    /// Time between polls.
    pub interval: Duration,
}

#[derive(Deserialize)]
struct ServerAnswer {
    #[serde(default)]
    server: ServerInfo,
    #[serde(default)]
    data: Option<Connz>,
}

#[derive(Deserialize, Default)]
struct ServerInfo {
    #[serde(default)]
    id: String,
}

#[derive(Deserialize)]
struct Connz {
    #[serde(default)]
    connections: Vec<ConnInfo>,
}

#[derive(Deserialize)]
struct ConnInfo {
    cid: u64,
    #[serde(default)]
    in_msgs: u64,
    #[serde(default)]
    out_bytes: u64,
    #[serde(default)]
    pending_bytes: u64,
    /// Subscriptions held now (CONNZ `subscriptions`).
    #[serde(default)]
    subscriptions: u64,
    #[serde(default)]
    uptime: String,
    /// For a user fleet-auth admitted: the `name` of the user JWT it issued, the device id (the client cannot
    /// set it; its CONNECT `name` is a different field).
    #[serde(default)]
    authorized_user: String,
}

/// A CONNECT or DISCONNECT event of the devices' account (`client.user` is the device, as CONNZ's
/// `authorized_user`; `sent` is what the client sent, `received` what it was delivered).
#[derive(Deserialize)]
struct Event {
    #[serde(default)]
    server: ServerInfo,
    client: EventClient,
    #[serde(default)]
    sent: Stats,
    #[serde(default)]
    received: Stats,
    #[serde(default)]
    reason: String,
}

#[derive(Deserialize)]
struct EventClient {
    #[serde(default)]
    id: u64,
    #[serde(default)]
    user: String,
    #[serde(default)]
    start: Option<String>,
    #[serde(default)]
    stop: Option<String>,
}

#[derive(Deserialize, Default)]
struct Stats {
    #[serde(default)]
    msgs: u64,
    #[serde(default)]
    bytes: u64,
}

/// A cool-down as replicas share it.
#[derive(Serialize, Deserialize)]
struct CooldownNotice {
    device: DeviceId,
    until: u64,
    strikes: u32,
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The device of a connection of the devices' account: its authorized user, when it is a device id.
pub fn device_of(authorized_user: &str) -> Option<DeviceId> {
    DeviceId::try_from(authorized_user).ok()
}

/// A time as nats-server writes it (RFC 3339 with fractions, `Z` or a `±hh:mm` offset: a client's `start` is in
/// the server's local zone).
fn parse_time(s: &str) -> Option<std::time::SystemTime> {
    if s.ends_with('Z') {
        return humantime::parse_rfc3339(s).ok();
    }
    let (base, offset) = s.split_at(s.len().checked_sub(6)?);
    let sign = match offset.as_bytes().first()? {
        b'+' => 1i64,
        b'-' => -1,
        _ => return None,
    };
    let (h, m) = offset[1..].split_once(':')?;
    let secs = sign * (h.parse::<i64>().ok()? * 3600 + m.parse::<i64>().ok()? * 60);
    let local = humantime::parse_rfc3339_weak(base).ok()?;
    let shift = Duration::from_secs(secs.unsigned_abs());
    if secs >= 0 {
        local.checked_sub(shift)
    } else {
        local.checked_add(shift)
    }
}

/// How long a connection lived, from its event's `start` and `stop`.
fn lifetime_ms(start: Option<&str>, stop: Option<&str>) -> Option<u64> {
    let d = parse_time(stop?)?
        .duration_since(parse_time(start?)?)
        .ok()?;
    u64::try_from(d.as_millis()).ok()
}

/// What the guard's tasks share.
struct Shared {
    system: async_nats::Client,
    fleet: async_nats::Client,
    account: String,
    budget: Budget,
    cooldowns: Arc<Mutex<Cooldowns>>,
    admissions: Arc<Mutex<Admissions>>,
    tracker: Mutex<Tracker>,
    started: Instant,
    /// The most servers that answered one CONNZ request.
    servers: AtomicUsize,
    /// CONNZ requests made.
    asked: AtomicU64,
    /// Servers by when they last answered.
    live: Mutex<std::collections::HashMap<String, Instant>>,
    /// New connections being looked at again ([`WATCH_NEW_AT`]).
    watching: Arc<tokio::sync::Semaphore>,
    /// Itself, for the tasks that watch new connections.
    me: std::sync::Weak<Shared>,
}

impl Shared {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

/// Runs the guard until its connection ends. `system` is the system user's connection, `fleet` the buckets'
/// account connection the reports go on; `admissions` is the callout's view of each device's open connections.
pub async fn run(
    system: async_nats::Client,
    fleet: async_nats::Client,
    account: String,
    settings: GuardSettings,
    cooldowns: Arc<Mutex<Cooldowns>>,
    admissions: Arc<Mutex<Admissions>>,
    mut retirements: tokio::sync::mpsc::Receiver<DeviceId>,
) -> Result<(), String> {
    let budget = settings.budget;
    let subscribe = |subject: String| {
        let system = system.clone();
        async move {
            system
                .subscribe(subject.clone())
                .await
                .map_err(|e| format!("subscribe {subject}: {e}"))
        }
    };
    let mut notices = subscribe(COOLDOWN_SUBJECT.to_owned()).await?;
    let mut connects = subscribe(format!("$SYS.ACCOUNT.{account}.CONNECT")).await?;
    let mut disconnects = subscribe(format!("$SYS.ACCOUNT.{account}.DISCONNECT")).await?;
    let shared = Arc::new_cyclic(|me| Shared {
        system,
        fleet,
        account,
        budget,
        cooldowns,
        admissions,
        tracker: Mutex::new(Tracker::default()),
        started: Instant::now(),
        servers: AtomicUsize::new(0),
        asked: AtomicU64::new(0),
        live: Mutex::new(Default::default()),
        watching: Arc::new(tokio::sync::Semaphore::new(MAX_WATCHED)),
        me: me.clone(),
    });
    let learned = {
        let shared = shared.clone();
        async move {
            while let Some(m) = notices.next().await {
                if let Ok(n) = serde_json::from_slice::<CooldownNotice>(&m.payload) {
                    if let Ok(mut c) = shared.cooldowns.lock() {
                        let cooling = Cooling {
                            until: n.until,
                            strikes: n.strikes,
                        };
                        c.learn(&n.device, cooling, unix_now(), &shared.budget);
                    }
                }
            }
        }
    };
    let opened = {
        let shared = shared.clone();
        async move {
            while let Some(m) = connects.next().await {
                if let Ok(e) = serde_json::from_slice::<Event>(&m.payload) {
                    connected(&shared, e).await;
                }
            }
        }
    };
    let ended = {
        let shared = shared.clone();
        async move {
            while let Some(m) = disconnects.next().await {
                if let Ok(e) = serde_json::from_slice::<Event>(&m.payload) {
                    disconnected(&shared, e).await;
                }
            }
        }
    };
    // A device just retired: every connection it has open is cut (the callout refuses it from now on).
    let retiring = {
        let shared = shared.clone();
        async move {
            while let Some(device) = retirements.recv().await {
                cut_retired(&shared, &device).await;
            }
            std::future::pending::<()>().await
        }
    };
    let polls = async move {
        let mut ticker = tokio::time::interval(settings.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut poll = 0u64;
        loop {
            ticker.tick().await;
            poll += 1;
            let counts = poll % COUNTS_EVERY_POLLS == 1;
            let sorts: &[&str] = if counts {
                &["msgs_from", "bytes_to", "subs", "pending"]
            } else {
                &["msgs_from", "bytes_to"]
            };
            let asks = sorts.iter().map(|sort| {
                let ask = serde_json::json!({
                    "acc": shared.account, "sort": sort, "limit": TOP_CONNECTIONS, "auth": true,
                });
                connz(&shared, ask)
            });
            let mut conns = Vec::new();
            for answer in futures::future::join_all(asks).await {
                match answer {
                    Ok(c) => conns.extend(c),
                    Err(e) => log::warn!("flood guard: {e}"),
                }
            }
            let floods = match shared.tracker.lock() {
                Ok(mut t) => t.observe(&conns, shared.now_ms(), &shared.budget, counts),
                Err(_) => return,
            };
            for f in floods {
                act(&shared, f).await;
            }
            if poll.is_multiple_of(RECONCILE_EVERY_POLLS) {
                reconcile(&shared).await;
            }
        }
    };
    tokio::select! {
        () = retiring => Err("the retirements' queue ended".into()),
        () = learned => Err(format!("the {COOLDOWN_SUBJECT} subscription ended (NATS connection closed)")),
        () = opened => Err("the CONNECT events' subscription ended (NATS connection closed)".into()),
        () = ended => Err("the DISCONNECT events' subscription ended (NATS connection closed)".into()),
        () = polls => Ok(()),
    }
}

/// Keeps the callout's view of each device's open connections true when events were lost: the connections of a
/// server that has not answered for [`SERVER_GONE`] are forgotten (a restarted server has a new id and its old
/// connections sent no DISCONNECT), and each device at its cap is checked against the servers' own list.
async fn reconcile(shared: &Shared) {
    let live: HashSet<String> = match shared.live.lock() {
        Ok(mut l) => {
            l.retain(|_, at| at.elapsed() < SERVER_GONE);
            l.keys().cloned().collect()
        }
        Err(_) => return,
    };
    // No server answered (fleet-auth's own connection is down): nothing is known, nothing is forgotten.
    if live.is_empty() {
        return;
    }
    let full = match shared.admissions.lock() {
        Ok(mut a) => {
            a.keep_servers(&live);
            a.full(&shared.budget)
        }
        Err(_) => return,
    };
    for device in full.into_iter().take(MAX_RECONCILED) {
        let ask = serde_json::json!({
            "acc": shared.account, "user": device.as_str(), "limit": MAX_KICKED, "auth": true,
        });
        if let Ok(conns) = connz(shared, ask).await {
            let open = conns.into_iter().map(|c| (c.server, c.cid)).collect();
            if let Ok(mut a) = shared.admissions.lock() {
                a.replace(&device, open);
            }
        }
    }
}

/// A device's connection opened: counted from zero, and the device's oldest connections over its cap are
/// disconnected (the newest is the one a device uses; see [`Admissions`]).
async fn connected(shared: &Shared, e: Event) {
    let Some(device) = device_of(&e.client.user) else {
        return;
    };
    let (server, cid) = (e.server.id, e.client.id);
    // Admitted by the callout just before the device's cool-down began (the verdict's cut listed its connections a
    // moment before this one existed): it is cut now, as the cool-down says.
    let cooling = shared
        .cooldowns
        .lock()
        .ok()
        .and_then(|c| c.cooling(&device, unix_now()));
    if let Some(cooling) = cooling {
        let system = shared.system.clone();
        // In a task of its own, as the displaced ones below: the events keep flowing meanwhile.
        tokio::spawn(async move {
            let kicked = kick(&system, &server, cid).await;
            let until = humantime::format_rfc3339_seconds(
                std::time::UNIX_EPOCH + Duration::from_secs(cooling.until),
            );
            log::warn!(
                "flood guard: device {device} (cid {cid} on server {server}) {kicked}: connected while it cools \
                 down (refused until {until})"
            );
        });
        return;
    }
    if let Ok(mut t) = shared.tracker.lock() {
        t.connected(&server, cid, &device);
    }
    let displaced = shared.admissions.lock().map_or_else(
        |_| Vec::new(),
        |mut a| a.opened(&device, &server, cid, &shared.budget),
    );
    // A new connection is looked at again shortly after it connected (a reconnect flood floods at once and is
    // gone before the next poll), while few are being watched; in a reconnect storm the polls judge the rest.
    if let Ok(permit) = shared.watching.clone().try_acquire_owned() {
        if let Some(me) = shared.me.upgrade() {
            let server = server.clone();
            tokio::spawn(async move {
                let _permit = permit;
                let ask = serde_json::json!({ "cid": cid, "auth": true });
                let subject = format!("$SYS.REQ.SERVER.{server}.CONNZ");
                for pause in WATCH_NEW_AT {
                    tokio::time::sleep(pause).await;
                    let Ok(conns) = connz_of(&me, &subject, ask.clone(), 1).await else {
                        return;
                    };
                    let Some(c) = conns.into_iter().find(|c| c.cid == cid) else {
                        return;
                    };
                    let floods = match me.tracker.lock() {
                        Ok(mut t) => t.sighting(&[c], me.now_ms(), &me.budget),
                        Err(_) => return,
                    };
                    if let Some(f) = floods.into_iter().next() {
                        act(&me, f).await;
                        return;
                    }
                }
            });
        }
    }
    if !displaced.is_empty() {
        let (system, max) = (shared.system.clone(), shared.budget.max_connections);
        tokio::spawn(async move {
            for (old_server, old_cid) in displaced {
                let kicked = kick(&system, &old_server, old_cid).await;
                log::info!(
                    "flood guard: device {device} (cid {old_cid} on server {old_server}) {kicked}: displaced by its \
                     newer connection cid {cid} on server {server}, over its limit of {max} connections"
                );
            }
        });
    }
}

/// A device's connection ended: what it did since it was last seen is charged; a slow consumer is a flood.
async fn disconnected(shared: &Shared, e: Event) {
    let device = device_of(&e.client.user);
    if let (Some(d), Ok(mut a)) = (&device, shared.admissions.lock()) {
        a.ended(d, &e.server.id, e.client.id);
    }
    let closed = Closed {
        server: e.server.id,
        cid: e.client.id,
        device,
        in_msgs: e.sent.msgs,
        out_bytes: e.received.bytes,
        age_ms: lifetime_ms(e.client.start.as_deref(), e.client.stop.as_deref()),
        reason: e.reason,
    };
    let flood = match shared.tracker.lock() {
        Ok(mut t) => t.closed(&closed, shared.now_ms(), &shared.budget),
        Err(_) => None,
    };
    // Acted on in a task of its own: the events keep flowing while the device's connections are listed and kicked.
    if let (Some(f), Some(me)) = (flood, shared.me.upgrade()) {
        tokio::spawn(async move { act(&me, f).await });
    }
}

/// Every server's connections of the devices' account that `ask` (a CONNZ request) selects. The answers are
/// awaited until as many servers as ever answered have (then a flood is acted on at once), or [`ANSWER_WINDOW`]
/// passes (every [`DISCOVER_EVERY`]th request waits the whole window, so servers that join are found).
async fn connz(shared: &Shared, ask: serde_json::Value) -> Result<Vec<Conn>, String> {
    let asked = shared.asked.fetch_add(1, Ordering::Relaxed);
    let known = shared.servers.load(Ordering::Relaxed);
    let expected = if asked.is_multiple_of(DISCOVER_EVERY) {
        MAX_SERVERS
    } else {
        known.clamp(1, MAX_SERVERS)
    };
    connz_of(shared, "$SYS.REQ.SERVER.PING.CONNZ", ask, expected).await
}

/// [`connz`] asked on `subject` (every server, or one: `$SYS.REQ.SERVER.<id>.CONNZ`), awaiting `expected` answers.
async fn connz_of(
    shared: &Shared,
    subject: &str,
    ask: serde_json::Value,
    expected: usize,
) -> Result<Vec<Conn>, String> {
    let system = &shared.system;
    let inbox = system.new_inbox();
    let mut answers = system
        .subscribe(inbox.clone())
        .await
        .map_err(|e| format!("subscribe {inbox}: {e}"))?;
    system
        .publish_with_reply(subject.to_owned(), inbox, ask.to_string().into())
        .await
        .map_err(|e| format!("ask CONNZ: {e}"))?;
    let mut conns = Vec::new();
    let deadline = tokio::time::Instant::now() + ANSWER_WINDOW;
    let mut answered = 0;
    while answered < expected {
        let Ok(Some(m)) = tokio::time::timeout_at(deadline, answers.next()).await else {
            break;
        };
        answered += 1;
        let a: ServerAnswer = match serde_json::from_slice(&m.payload) {
            Ok(a) => a,
            Err(e) => {
                log::warn!("flood guard: a CONNZ answer is not understood: {e}");
                continue;
            }
        };
        if let Ok(mut live) = shared.live.lock() {
            live.insert(a.server.id.clone(), Instant::now());
        }
        let Some(data) = a.data else { continue };
        conns.extend(data.connections.into_iter().map(|c| Conn {
            server: a.server.id.clone(),
            cid: c.cid,
            device: device_of(&c.authorized_user),
            in_msgs: c.in_msgs,
            out_bytes: c.out_bytes,
            pending_bytes: c.pending_bytes,
            subscriptions: c.subscriptions,
            age_secs: super::flood::uptime_secs(&c.uptime),
        }));
    }
    shared.servers.fetch_max(answered, Ordering::Relaxed);
    Ok(conns)
}

/// Disconnects connection `cid` of server `server`; says how it went.
async fn kick(system: &async_nats::Client, server: &str, cid: u64) -> String {
    let subject = format!("$SYS.REQ.SERVER.{server}.KICK");
    let body = serde_json::json!({ "cid": cid }).to_string();
    match tokio::time::timeout(KICK_TIMEOUT, system.request(subject, body.into())).await {
        Ok(Ok(m)) if !m.payload.windows(7).any(|w| w == b"\"error\"") => "disconnected".to_owned(),
        // Gone already (it closed, or another replica kicked it).
        Ok(Ok(m))
            if m.payload
                .windows(9)
                .any(|w| w.eq_ignore_ascii_case(b"not found")) =>
        {
            "disconnected".to_owned()
        }
        Ok(Ok(m)) => format!(
            "could not be disconnected ({})",
            String::from_utf8_lossy(&m.payload[..m.payload.len().min(200)])
        ),
        Ok(Err(e)) => format!("could not be disconnected ({e})"),
        Err(_) => "could not be disconnected (no answer)".to_owned(),
    }
}

/// Disconnects every connection of `device`: those the events told of, and those the servers list under its name
/// now. The connections (server, cid), each kick's outcome (`disconnected` or why not) in the same order, and why
/// the servers could not be asked, if so.
async fn kick_all(
    shared: &Shared,
    device: &DeviceId,
) -> (Vec<(String, u64)>, Vec<String>, Option<String>) {
    let mut targets = shared
        .admissions
        .lock()
        .map(|a| a.open_of(device))
        .unwrap_or_default();
    let ask = serde_json::json!({
        "acc": shared.account, "user": device.as_str(), "limit": MAX_KICKED, "auth": true,
    });
    let listing = match connz(shared, ask).await {
        Ok(conns) => {
            targets.extend(conns.into_iter().map(|c| (c.server, c.cid)));
            None
        }
        Err(e) => Some(e.to_string()),
    };
    targets.sort();
    targets.dedup();
    let results =
        futures::future::join_all(targets.iter().map(|(s, cid)| kick(&shared.system, s, *cid)))
            .await;
    (targets, results, listing)
}

/// Disconnects every connection of a device that was just retired (those the events told of, and those the servers
/// list under its name now), and logs how that went.
async fn cut_retired(shared: &Shared, device: &DeviceId) {
    let (_, results, listing) = kick_all(shared, device).await;
    if let Some(e) = listing {
        log::warn!("retired device {device}: listing its connections: {e}");
    }
    let cut = results.iter().filter(|r| *r == "disconnected").count();
    match results.iter().find(|r| *r != "disconnected") {
        None => log::info!(
            "retired device {device}: {cut} open connections disconnected; the callout refuses it from now on"
        ),
        Some(why) => log::warn!(
            "retired device {device}: {cut} of {} open connections disconnected, one {why}; its writes are refused",
            results.len()
        ),
    }
}

/// A device over its budget: its cool-down starts (the callout refuses it from now on), every connection of it is
/// disconnected, the other replicas and the operator are told.
async fn act(shared: &Shared, flood: Flood) {
    let Flood { device, over } = flood;
    let budget = &shared.budget;
    let now = unix_now();
    // Already cooling (the counters of the connections just kicked, another replica's verdict): its connections
    // are disconnected again, but it is neither struck nor reported twice.
    let Some((cooling, already)) = shared.cooldowns.lock().ok().map(|mut c| {
        let already = c.cooling(&device, now).is_some();
        (c.strike(&device, now, budget), already)
    }) else {
        return;
    };
    let (targets, results, listing) = kick_all(shared, &device).await;
    if let Some(e) = listing {
        log::warn!("flood guard: listing device {device}'s connections: {e}");
    }
    let cut = results.iter().filter(|r| *r == "disconnected").count();
    let failed: Vec<&String> = results.iter().filter(|r| *r != "disconnected").collect();
    // The report's and the log's shape stays `disconnected: <why>; …` (the operator shows it as it comes).
    let kicked = match (cut, failed.first()) {
        (0, None) => "disconnected (no connection open any more)".to_owned(),
        (_, None) => "disconnected".to_owned(),
        (_, Some(why)) => format!("disconnected {cut}, {} {why}", failed.len()),
    };
    let until = humantime::format_rfc3339_seconds(
        std::time::UNIX_EPOCH + Duration::from_secs(cooling.until),
    );
    let reason = format!(
        "{kicked}: {}; all {} of its connections cut, and refused until {until} (flood {} in a row)",
        over.describe(budget),
        targets.len(),
        cooling.strikes,
    );
    // Which connections: the first (its cid and server), and how many more.
    let which = match targets.split_first() {
        Some(((server, cid), [])) => {
            format!(" (cid {cid} on server {server})")
        }
        Some(((server, cid), more)) => {
            format!(" (cid {cid} on server {server} and {} more)", more.len())
        }
        None => String::new(),
    };
    if already {
        log::debug!("flood guard: device {device}, cooling already: {reason}");
        return;
    }
    log::warn!("flood guard: device {device}{which} {reason}");
    let notice = CooldownNotice {
        device: device.clone(),
        until: cooling.until,
        strikes: cooling.strikes,
    };
    if let Ok(b) = serde_json::to_vec(&notice) {
        let _ = shared.system.publish(COOLDOWN_SUBJECT, b.into()).await;
    }
    let report = WriteRefused {
        device_id: device.clone(),
        bucket: None,
        kind: FLOOD_KIND.into(),
        reason,
        count: 1,
    };
    if let Ok(b) = serde_json::to_vec(&report) {
        let _ = shared
            .fleet
            .publish(refusals_subject(&device), b.into())
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_device_is_the_authorized_user() {
        assert_eq!(
            device_of("dev-a").map(|d| d.to_string()),
            Some("dev-a".into())
        );
        assert_eq!(device_of("../x"), None);
        assert_eq!(device_of(""), None);
    }

    #[test]
    fn events_are_read_and_times_in_any_zone() {
        let e: Event = serde_json::from_str(
            r#"{"type":"io.nats.server.advisory.v1.client_disconnect","server":{"name":"n","id":"NABC"},
               "client":{"start":"2026-12-07T05:00:00.5+02:00","stop":"2026-12-07T03:00:01.75Z","id":9,
               "acc":"DEVICES","user":"dev-a"},"sent":{"msgs":30000,"bytes":1},"received":{"msgs":2,"bytes":16384},
               "reason":"Slow Consumer (Pending Bytes)"}"#,
        )
        .unwrap();
        assert_eq!(
            (e.server.id.as_str(), e.client.id, e.client.user.as_str()),
            ("NABC", 9, "dev-a")
        );
        assert_eq!((e.sent.msgs, e.received.bytes), (30_000, 16_384));
        assert_eq!(
            lifetime_ms(e.client.start.as_deref(), e.client.stop.as_deref()),
            Some(1_250)
        );
        assert_eq!(e.reason, "Slow Consumer (Pending Bytes)");
        assert!(parse_time("2026-12-07T03:00:00-01:30").is_some());
        assert_eq!(parse_time("yesterday"), None);
        assert_eq!(lifetime_ms(None, Some("2026-12-07T03:00:01Z")), None);
    }

    #[test]
    fn a_connz_answer_is_read() {
        let a: ServerAnswer = serde_json::from_str(
            r#"{"server":{"name":"n","id":"NABC"},"data":{"server_id":"NABC","now":"x","connections":[
               {"cid":5,"in_msgs":42,"name":"dev-b","authorized_user":"dev-a"},{"cid":6}]}}"#,
        )
        .unwrap();
        assert_eq!(a.server.id, "NABC");
        let c = a.data.unwrap().connections;
        assert_eq!((c[0].cid, c[0].in_msgs, c.len()), (5, 42, 2));
        assert_eq!(c[0].authorized_user, "dev-a");
        assert!(c[1].authorized_user.is_empty());
    }
}
