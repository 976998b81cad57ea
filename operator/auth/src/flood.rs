//! Flood detection, pure: what each device costs the server, summed over all of its connections, from nats-server's
//! own counters (CONNZ every poll; the system account's CONNECT and DISCONNECT events as they happen), the
//! cool-downs of devices cut off for going over their budget, and the callout's admission rule (a cap on a
//! device's connections and on how often it is admitted).
//!
//! NATS bounds a connection's subscriptions and payload itself (the devices' account `limits`, docs/auth.md), but
//! has no message-rate limit and no per-identity bound: one device's token can open many connections, each short
//! enough to be gone before a poll sees it, or hold subscriptions whose answers it never reads. So every counter is
//! charged to the device from the connection's start: a connection first seen by a poll is charged what it sent
//! since it connected (scaled to the budget's window when it is older than that), a closed one what it sent since
//! it was last seen, and a disconnect the server made for a slow consumer is a flood in itself.

use fleet_wire::DeviceId;
use std::collections::{HashMap, HashSet};

/// Connections remembered at most (twice the fleet size this project is measured for, 100,000 devices; past it a
/// connection is judged from its first sighting by its uptime).
pub const MAX_TRACKED: usize = 200_000;
/// Devices remembered at most (budgets, cool-downs, admissions).
pub const MAX_DEVICES: usize = 200_000;
/// Devices in cool-down remembered at most.
pub const MAX_COOLING: usize = MAX_DEVICES;
/// A connection not seen for this many polls (and no event) is forgotten; its device's live count with it.
const FORGET_AFTER_POLLS: u64 = 600;

/// What one device may cost, summed over its connections, and what happens past it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Messages a second a device may send.
    pub max_msgs_per_sec: u64,
    /// The margin: a device may run this many seconds' worth of its budgets ahead (a burst), so a device steadily
    /// under its rate is never cut off by the jitter of the polls.
    pub burst_secs: u64,
    /// Bytes a second the server may deliver to a device.
    pub max_bytes_out_per_sec: u64,
    /// Bytes the server may hold for a device's connections, undelivered.
    pub max_pending_bytes: u64,
    /// Subscriptions a device may hold over all of its connections.
    pub max_subscriptions: u64,
    /// Connections a device may have open at once.
    pub max_connections: u64,
    /// Admissions of a device in a row (the callout's reconnect budget)...
    pub connects_burst: u64,
    /// ...then one every this many seconds.
    pub connect_every_secs: u64,
    /// The first cool-down, seconds; each repeat within [`Budget::max_cooldown_secs`] doubles it.
    pub cooldown_secs: u64,
    /// The longest cool-down, seconds; a device with no flood for this long starts again at the first.
    pub max_cooldown_secs: u64,
}

/// One connection of a CONNZ answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conn {
    /// The server's id (what KICK is addressed to).
    pub server: String,
    /// The connection id on that server.
    pub cid: u64,
    /// The device: the name of the user JWT fleet-auth issued (none: not a device's connection).
    pub device: Option<DeviceId>,
    /// Messages received from the client since it connected.
    pub in_msgs: u64,
    /// Bytes delivered to the client since it connected.
    pub out_bytes: u64,
    /// Bytes waiting to be written to the client now.
    pub pending_bytes: u64,
    /// Subscriptions it holds now.
    pub subscriptions: u64,
    /// Seconds since it connected (CONNZ `uptime`), when known.
    pub age_secs: Option<u64>,
}

/// A connection that ended (a DISCONNECT event).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Closed {
    /// The server's id.
    pub server: String,
    /// The connection id.
    pub cid: u64,
    /// Its device.
    pub device: Option<DeviceId>,
    /// Messages it sent over its whole life.
    pub in_msgs: u64,
    /// Bytes delivered to it over its whole life.
    pub out_bytes: u64,
    /// How long it lived, milliseconds, when known.
    pub age_ms: Option<u64>,
    /// The server's reason (`Slow Consumer (Pending Bytes)`, `Client Closed` …).
    pub reason: String,
}

/// Why a device is over its budget.
#[derive(Debug, Clone, PartialEq)]
pub enum Over {
    /// Sent more messages than its rate and burst allow.
    Messages {
        /// Messages charged in this sighting.
        msgs: u64,
        /// Over how many milliseconds (since the device was last charged).
        over_ms: u64,
    },
    /// Had more bytes delivered than its rate and burst allow.
    BytesOut {
        /// Bytes charged in this sighting.
        bytes: u64,
        /// Over how many milliseconds.
        over_ms: u64,
    },
    /// Its connections hold more undelivered bytes than allowed.
    Pending(u64),
    /// Its connections hold more subscriptions than allowed.
    Subscriptions(u64),
    /// The server disconnected one of its connections as a slow consumer.
    SlowConsumer(String),
}

impl Over {
    /// The log's and report's text (`budget` names the limits).
    pub fn describe(&self, budget: &Budget) -> String {
        // "<rate> a second over <time>", or for a device first counted now (no interval) what its connections
        // did since they were last counted.
        let over = |n: u64, ms: u64, what: &str| match ms {
            0 => format!("{n} {what} at once"),
            ms => format!(
                "{} {what} a second over {ms} ms ({n} {what})",
                n.saturating_mul(1000) / ms,
            ),
        };
        match self {
            Over::Messages { msgs, over_ms } => format!(
                "{}, over its budget of {} messages a second with a {} s burst",
                over(*msgs, *over_ms, "messages"),
                budget.max_msgs_per_sec,
                budget.burst_secs
            ),
            Over::BytesOut { bytes, over_ms } => format!(
                "{} delivered, over its budget of {} bytes a second with a {} s burst",
                over(*bytes, *over_ms, "bytes"),
                budget.max_bytes_out_per_sec,
                budget.burst_secs
            ),
            Over::Pending(b) => format!(
                "{b} bytes it does not read held by the server, over its limit of {}",
                budget.max_pending_bytes
            ),
            Over::Subscriptions(n) => format!(
                "{n} subscriptions, over its limit of {} summed over its connections",
                budget.max_subscriptions
            ),
            Over::SlowConsumer(reason) => {
                format!("the server disconnected it as a slow consumer ({reason})")
            }
        }
    }
}

/// A device over its budget.
#[derive(Debug, Clone, PartialEq)]
pub struct Flood {
    /// The device.
    pub device: DeviceId,
    /// How.
    pub over: Over,
}

/// A budget that refills at `rate` a second up to `rate * burst_secs` (milli-units, so that no fraction is lost).
#[derive(Debug, Clone, Copy)]
struct Bucket {
    level_milli: i128,
    at_ms: u64,
}

impl Bucket {
    fn full(rate: u64, burst_secs: u64, now_ms: u64) -> Self {
        Self {
            level_milli: i128::from(rate) * i128::from(burst_secs) * 1000,
            at_ms: now_ms,
        }
    }

    /// Takes `n`, counted since the previous charge, and refills for that time; false when that leaves it below
    /// zero. The refill and the charge are netted before the cap: what was sent was sent while it refilled, so a
    /// steady rate under the budget never empties it however far apart the polls are. Returns the milliseconds
    /// since the previous charge too.
    fn charge(&mut self, n: u64, rate: u64, burst_secs: u64, now_ms: u64) -> (bool, u64) {
        let cap = i128::from(rate) * i128::from(burst_secs) * 1000;
        let since = now_ms.saturating_sub(self.at_ms);
        self.level_milli = (self.level_milli + i128::from(since) * i128::from(rate)
            - i128::from(n) * 1000)
            .min(cap);
        self.at_ms = self.at_ms.max(now_ms);
        (self.level_milli >= 0, since)
    }
}

#[derive(Debug, Clone, Copy)]
struct Seen {
    in_msgs: u64,
    out_bytes: u64,
    poll: u64,
}

#[derive(Debug)]
struct DeviceBudget {
    msgs: Bucket,
    bytes: Bucket,
}

/// Connection counters poll to poll, and each device's budget.
#[derive(Debug, Default)]
pub struct Tracker {
    conns: HashMap<(String, u64), (DeviceId, Seen)>,
    devices: HashMap<DeviceId, DeviceBudget>,
    polls: u64,
}

/// The part of `total` (counted over `age_secs`, whole seconds rounded down as CONNZ's `uptime`) that falls in the
/// last `window_secs`, assuming an even rate: a connection first seen long after it connected is judged by its
/// average, not its life's total. Its age is taken as the next whole second, so the share never exceeds what its
/// average rate sends in the window.
fn recent_share(total: u64, age_secs: Option<u64>, window_secs: u64) -> u64 {
    match age_secs.map(|a| a.saturating_add(1)) {
        Some(age) if age > window_secs => {
            u64::try_from(u128::from(total) * u128::from(window_secs) / u128::from(age))
                .unwrap_or(u64::MAX)
        }
        // Younger than the window, or of unknown age but seen for the first time: all of it is recent.
        _ => total,
    }
}

impl Tracker {
    /// A new connection of `device` (a CONNECT event): its counters start at zero now.
    pub fn connected(&mut self, server: &str, cid: u64, device: &DeviceId) {
        let key = (server.to_owned(), cid);
        if self.conns.len() < MAX_TRACKED || self.conns.contains_key(&key) {
            let seen = Seen {
                in_msgs: 0,
                out_bytes: 0,
                poll: self.polls,
            };
            self.conns.insert(key, (device.clone(), seen));
        }
    }

    /// Charges `device` `msgs` and `bytes` at `now_ms`; the flood, if that takes it over.
    fn charge(
        &mut self,
        device: &DeviceId,
        msgs: u64,
        bytes: u64,
        now_ms: u64,
        budget: &Budget,
    ) -> Option<Over> {
        if !self.devices.contains_key(device) && self.devices.len() >= MAX_DEVICES {
            // Full: forget the devices charged longest ago (their buckets have long refilled).
            let mut ages: Vec<u64> = self.devices.values().map(|d| d.msgs.at_ms).collect();
            ages.sort_unstable();
            let cut = ages[ages.len() / 2];
            self.devices.retain(|_, d| d.msgs.at_ms > cut);
        }
        let b = self.devices.entry(device.clone()).or_insert(DeviceBudget {
            msgs: Bucket::full(budget.max_msgs_per_sec, budget.burst_secs, now_ms),
            bytes: Bucket::full(budget.max_bytes_out_per_sec, budget.burst_secs, now_ms),
        });
        let (msgs_ok, over_ms) =
            b.msgs
                .charge(msgs, budget.max_msgs_per_sec, budget.burst_secs, now_ms);
        let (bytes_ok, _) = b.bytes.charge(
            bytes,
            budget.max_bytes_out_per_sec,
            budget.burst_secs,
            now_ms,
        );
        let over = if !msgs_ok {
            Some(Over::Messages { msgs, over_ms })
        } else if !bytes_ok {
            Some(Over::BytesOut { bytes, over_ms })
        } else {
            None
        };
        if over.is_some() {
            // Judged once: it is cooled down now, and starts with a full budget when it is back.
            self.devices.remove(device);
        }
        over
    }

    /// Takes one poll's connections at `now_ms` (a monotonic clock); returns each device over its budget (one
    /// flood per device). `counts` says whether this poll's answer covers subscriptions and pending bytes.
    pub fn observe(
        &mut self,
        conns: &[Conn],
        now_ms: u64,
        budget: &Budget,
        counts: bool,
    ) -> Vec<Flood> {
        self.polls += 1;
        self.judge(conns, now_ms, budget, counts)
    }

    /// Takes connections seen outside the polls (a new connection looked at again shortly after it connected), as
    /// [`Tracker::observe`] does, without counting a poll.
    pub fn sighting(&mut self, conns: &[Conn], now_ms: u64, budget: &Budget) -> Vec<Flood> {
        self.judge(conns, now_ms, budget, false)
    }

    fn judge(&mut self, conns: &[Conn], now_ms: u64, budget: &Budget, counts: bool) -> Vec<Flood> {
        let poll = self.polls;
        let window = budget.burst_secs;
        let mut charges: HashMap<DeviceId, (u64, u64)> = HashMap::new();
        let mut held: HashMap<DeviceId, (u64, u64)> = HashMap::new();
        let mut counted = HashSet::new();
        for c in conns {
            let Some(device) = &c.device else { continue };
            let key = (c.server.clone(), c.cid);
            // One connection may be in several of the poll's sorted lists.
            if !counted.insert(key.clone()) {
                continue;
            }
            let (msgs, bytes) = match self.conns.get(&key) {
                Some((d, s)) if d == device && c.in_msgs >= s.in_msgs => (
                    c.in_msgs - s.in_msgs,
                    c.out_bytes.saturating_sub(s.out_bytes),
                ),
                // First sighting (or a cid reused by a new connection): what it did since it connected.
                _ => (
                    recent_share(c.in_msgs, c.age_secs, window),
                    recent_share(c.out_bytes, c.age_secs, window),
                ),
            };
            let e = charges.entry(device.clone()).or_default();
            e.0 = e.0.saturating_add(msgs);
            e.1 = e.1.saturating_add(bytes);
            let h = held.entry(device.clone()).or_default();
            h.0 = h.0.saturating_add(c.subscriptions);
            h.1 = h.1.saturating_add(c.pending_bytes);
            if self.conns.len() < MAX_TRACKED || self.conns.contains_key(&key) {
                let seen = Seen {
                    in_msgs: c.in_msgs,
                    out_bytes: c.out_bytes,
                    poll,
                };
                self.conns.insert(key, (device.clone(), seen));
            }
        }
        let mut floods = Vec::new();
        let mut devices: Vec<&DeviceId> = charges.keys().collect();
        devices.sort();
        for device in devices {
            let (msgs, bytes) = charges[device];
            let over = self
                .charge(device, msgs, bytes, now_ms, budget)
                .or_else(|| {
                    let (subs, pending) = held.get(device).copied().unwrap_or_default();
                    if counts && subs > budget.max_subscriptions {
                        Some(Over::Subscriptions(subs))
                    } else if counts && pending > budget.max_pending_bytes {
                        Some(Over::Pending(pending))
                    } else {
                        None
                    }
                });
            if let Some(over) = over {
                floods.push(Flood {
                    device: device.clone(),
                    over,
                });
            }
        }
        self.conns
            .retain(|_, (_, s)| poll.saturating_sub(s.poll) < FORGET_AFTER_POLLS);
        floods
    }

    /// Takes a connection that ended at `now_ms`: charges what it did since it was last seen; a slow consumer
    /// is a flood.
    pub fn closed(&mut self, c: &Closed, now_ms: u64, budget: &Budget) -> Option<Flood> {
        let seen = self.conns.remove(&(c.server.clone(), c.cid));
        let device = c.device.clone()?;
        let (msgs, bytes) = match seen {
            Some((d, s)) if d == device => (
                c.in_msgs.saturating_sub(s.in_msgs),
                c.out_bytes.saturating_sub(s.out_bytes),
            ),
            _ => {
                let age = c.age_ms.map(|ms| ms / 1000);
                (
                    recent_share(c.in_msgs, age, budget.burst_secs),
                    recent_share(c.out_bytes, age, budget.burst_secs),
                )
            }
        };
        let over = self.charge(&device, msgs, bytes, now_ms, budget);
        let over = over.or_else(|| {
            c.reason
                .to_ascii_lowercase()
                .contains("slow consumer")
                .then(|| Over::SlowConsumer(c.reason.clone()))
        });
        over.map(|over| Flood { device, over })
    }

    /// Connections remembered (for the bound's test).
    pub fn tracked(&self) -> usize {
        self.conns.len()
    }
}

/// Parses CONNZ's `uptime` (`1y2d3h4m5s`, `4m5s`, `0s`: whole seconds) into seconds.
pub fn uptime_secs(s: &str) -> Option<u64> {
    let mut total = 0u64;
    let mut n = 0u64;
    let mut digits = false;
    for ch in s.chars() {
        if let Some(d) = ch.to_digit(10) {
            n = n.checked_mul(10)?.checked_add(u64::from(d))?;
            digits = true;
            continue;
        }
        let unit = match ch {
            'y' => 365 * 86_400,
            'd' => 86_400,
            'h' => 3_600,
            'm' => 60,
            's' => 1,
            _ => return None,
        };
        if !digits {
            return None;
        }
        total = total.checked_add(n.checked_mul(unit)?)?;
        (n, digits) = (0, false);
    }
    (!digits && !s.is_empty()).then_some(total)
}

/// One device's cool-down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cooling {
    /// Refused until (Unix seconds).
    pub until: u64,
    /// Floods in a row (each no longer than the longest cool-down after the previous one's end).
    pub strikes: u32,
}

/// Devices refused for a cool-down after a flood (Unix seconds: replicas share them).
#[derive(Debug, Default)]
pub struct Cooldowns {
    devices: HashMap<DeviceId, Cooling>,
}

impl Cooldowns {
    /// Records a flood of `device` at `now`; returns its cool-down.
    pub fn strike(&mut self, device: &DeviceId, now: u64, budget: &Budget) -> Cooling {
        let strikes = match self.devices.get(device) {
            Some(c) if now < c.until.saturating_add(budget.max_cooldown_secs) => {
                // Kicked again while cooling (another replica, a session admitted just before): no new strike.
                if now < c.until {
                    return *c;
                }
                c.strikes.saturating_add(1)
            }
            _ => 1,
        };
        let secs = budget
            .cooldown_secs
            .saturating_mul(1u64 << (strikes - 1).min(20))
            .min(budget.max_cooldown_secs);
        let c = Cooling {
            until: now.saturating_add(secs),
            strikes,
        };
        self.insert(device, c, now, budget);
        c
    }

    /// Takes a cool-down another replica decided (the later end wins).
    pub fn learn(&mut self, device: &DeviceId, c: Cooling, now: u64, budget: &Budget) {
        if self.devices.get(device).is_some_and(|o| o.until >= c.until) {
            return;
        }
        self.insert(device, c, now, budget);
    }

    fn insert(&mut self, device: &DeviceId, c: Cooling, now: u64, budget: &Budget) {
        if self.devices.len() >= MAX_COOLING && !self.devices.contains_key(device) {
            let keep = budget.max_cooldown_secs;
            self.devices
                .retain(|_, o| now < o.until.saturating_add(keep));
            if self.devices.len() >= MAX_COOLING {
                // Full of devices cooling right now: drop the one that ends first.
                if let Some(first) = self
                    .devices
                    .iter()
                    .min_by_key(|(_, o)| o.until)
                    .map(|(d, _)| d.clone())
                {
                    self.devices.remove(&first);
                }
            }
        }
        self.devices.insert(device.clone(), c);
    }

    /// The end of `device`'s cool-down when it is cooling at `now`.
    pub fn cooling(&self, device: &DeviceId, now: u64) -> Option<Cooling> {
        self.devices.get(device).copied().filter(|c| now < c.until)
    }
}

/// Why the callout refuses a device's new connection before its cool-down is even considered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdmitRefusal {
    /// It was admitted too often lately (a reconnect flood); the next admission is possible in this many seconds.
    TooOften(u64),
}

impl std::fmt::Display for AdmitRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AdmitRefusal::TooOften(secs) => write!(
                f,
                "it connected too often lately (a reconnect flood): admitted again in {secs} s"
            ),
        }
    }
}

/// The callout's view of each device's connections: those open, oldest first (from the server's CONNECT and
/// DISCONNECT events, which the flood guard reads), and the admissions budget.
///
/// The connection cap is kept by displacing, not refusing: a device over its cap loses its oldest connections.
/// A device on a link that drops without closing (LTE) leaves dead connections that the server keeps for minutes
/// (its keep-alive); refusing its new connection would lock it out until then, while the newest connection is
/// the one a real device is using. Only the device's own connections are displaced, at its reconnect budget's pace.
#[derive(Debug, Default)]
pub struct Admissions {
    open: HashMap<DeviceId, Vec<(String, u64)>>,
    admitted: HashMap<DeviceId, Bucket>,
}

impl Admissions {
    /// Decides a new connection of `device` at `now_ms` (a monotonic clock) and, when admitted, counts it.
    pub fn admit(
        &mut self,
        device: &DeviceId,
        now_ms: u64,
        budget: &Budget,
    ) -> Result<(), AdmitRefusal> {
        if !self.admitted.contains_key(device) && self.admitted.len() >= MAX_DEVICES {
            // Forget the devices whose budget is full again (they have not connected for a long time).
            let full = budget.connect_every_secs * budget.connects_burst * 1000;
            self.admitted
                .retain(|_, b| now_ms.saturating_sub(b.at_ms) < full);
            if self.admitted.len() >= MAX_DEVICES {
                // More devices connecting at once than remembered (a storm of a larger fleet): admitted without a
                // budget rather than refused, as before this rule existed; the guard still judges what they send.
                return Ok(());
            }
        }
        // The bucket holds `connects_burst` admissions and refills one every `connect_every_secs`: milli-admissions
        // refilled at 1000 / connect_every_secs a second.
        let every = budget.connect_every_secs.max(1);
        let b = self.admitted.entry(device.clone()).or_insert(Bucket {
            level_milli: i128::from(budget.connects_burst) * 1000 * 1000,
            at_ms: now_ms,
        });
        let cap = i128::from(budget.connects_burst) * 1000 * 1000;
        let since = i128::from(now_ms.saturating_sub(b.at_ms));
        let level = (b.level_milli + since * 1000 / i128::from(every)).min(cap);
        b.at_ms = b.at_ms.max(now_ms);
        if level < 1000 * 1000 {
            b.level_milli = level;
            let wait_ms = (1000 * 1000 - level) * i128::from(every) / 1000;
            return Err(AdmitRefusal::TooOften(
                u64::try_from(wait_ms / 1000 + 1).unwrap_or(every),
            ));
        }
        b.level_milli = level - 1000 * 1000;
        Ok(())
    }

    /// A connection of `device` opened (CONNECT event); returns the device's oldest connections that put it over
    /// its cap, to be disconnected (they are forgotten here; their DISCONNECT events find nothing).
    pub fn opened(
        &mut self,
        device: &DeviceId,
        server: &str,
        cid: u64,
        budget: &Budget,
    ) -> Vec<(String, u64)> {
        if !self.open.contains_key(device) && self.open.len() >= MAX_DEVICES {
            return Vec::new();
        }
        let s = self.open.entry(device.clone()).or_default();
        let c = (server.to_owned(), cid);
        if !s.contains(&c) {
            s.push(c);
        }
        let cap = usize::try_from(budget.max_connections.max(1)).unwrap_or(usize::MAX);
        let over = s.len().saturating_sub(cap);
        s.drain(..over).collect()
    }

    /// A connection ended (DISCONNECT event).
    pub fn ended(&mut self, device: &DeviceId, server: &str, cid: u64) {
        if let Some(s) = self.open.get_mut(device) {
            s.retain(|c| *c != (server.to_owned(), cid));
            if s.is_empty() {
                self.open.remove(device);
            }
        }
    }

    /// Forgets the connections of servers not in `live` (a server restarted or gone: its connections ended without
    /// DISCONNECT events).
    pub fn keep_servers(&mut self, live: &HashSet<String>) {
        self.open.retain(|_, s| {
            s.retain(|(server, _)| live.contains(server));
            !s.is_empty()
        });
    }

    /// The devices with their cap of connections open (whose list is worth checking against the servers').
    pub fn full(&self, budget: &Budget) -> Vec<DeviceId> {
        let mut v: Vec<DeviceId> = self
            .open
            .iter()
            .filter(|(_, s)| s.len() as u64 >= budget.max_connections)
            .map(|(d, _)| d.clone())
            .collect();
        v.sort();
        v
    }

    /// Replaces what is known of `device`'s open connections with the servers' own list (a DISCONNECT event may
    /// have been missed while fleet-auth's connection was down), keeping the known ones in their order.
    pub fn replace(&mut self, device: &DeviceId, open: Vec<(String, u64)>) {
        let mut kept: Vec<(String, u64)> = self
            .open
            .remove(device)
            .unwrap_or_default()
            .into_iter()
            .filter(|c| open.contains(c))
            .collect();
        for c in open {
            if !kept.contains(&c) {
                kept.push(c);
            }
        }
        if !kept.is_empty() {
            self.open.insert(device.clone(), kept);
        }
    }

    /// The connections of `device` known to be open (server, cid).
    pub fn open_of(&self, device: &DeviceId) -> Vec<(String, u64)> {
        let mut v: Vec<_> = self
            .open
            .get(device)
            .map(|s| s.to_vec())
            .unwrap_or_default();
        v.sort();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(s: &str) -> DeviceId {
        DeviceId::try_from(s).unwrap()
    }

    fn conn(cid: u64, device: Option<&str>, in_msgs: u64) -> Conn {
        Conn {
            server: "S1".into(),
            cid,
            device: device.map(dev),
            in_msgs,
            out_bytes: 0,
            pending_bytes: 0,
            subscriptions: 3,
            age_secs: Some(0),
        }
    }

    const BUDGET: Budget = Budget {
        max_msgs_per_sec: 100,
        burst_secs: 2,
        max_bytes_out_per_sec: 1_000_000,
        max_pending_bytes: 8_000_000,
        max_subscriptions: 64,
        max_connections: 4,
        connects_burst: 5,
        connect_every_secs: 10,
        cooldown_secs: 60,
        max_cooldown_secs: 3600,
    };

    fn msgs(f: &[Flood]) -> Vec<(String, u64)> {
        f.iter()
            .filter_map(|f| match f.over {
                Over::Messages { msgs, .. } => Some((f.device.to_string(), msgs)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_connection_is_judged_from_its_first_sighting() {
        // (age at first sighting, messages by then, flood?) with a 100/s budget and a 2 s burst (200).
        let table: &[(Option<u64>, u64, bool)] = &[
            (Some(0), 200, false),            // its burst, at once
            (Some(0), 201, true),             // just over
            (Some(1), 30_000, true),          // a short-lived flood, seen once
            (Some(86_400), 8_640_000, false), // an old connection at its rate: 200 of it in the window
            (Some(86_400), 9_000_000, true),  // an old one averaging over its rate
            (None, 201, true),                // age unknown: all of it is recent
        ];
        for &(age, n, want) in table {
            let mut t = Tracker::default();
            let c = Conn {
                age_secs: age,
                ..conn(7, Some("dev-a"), n)
            };
            let got = t.observe(&[c], 1_000, &BUDGET, true);
            assert_eq!(!got.is_empty(), want, "{age:?} {n}: {got:?}");
        }
    }

    #[test]
    fn a_device_steadily_under_its_rate_is_never_cut_off_whatever_the_polls_jitter() {
        let mut t = Tracker::default();
        let (mut now, mut sent) = (0u64, 0u64);
        // 96 % of the budget, polls 0.5 to 2.5 s apart whose clock disagrees with the counts by up to 300 ms.
        for i in 0..2_000u64 {
            let step = 500 + (i * 7919 % 2_000);
            now += step;
            sent += 96 * step / 1000;
            let skew = (i * 104_729 % 600) as i64 - 300;
            let seen_at = (now as i64 + skew).max(0) as u64;
            let c = Conn {
                age_secs: Some(now / 1000),
                ..conn(1, Some("dev-a"), sent)
            };
            let f = t.observe(&[c], seen_at, &BUDGET, true);
            assert!(f.is_empty(), "poll {i}: {f:?}");
        }
        // At 110 % it is caught.
        let mut caught = false;
        for _ in 0..20 {
            now += 1_000;
            sent += 110;
            caught |= !t
                .observe(&[conn(1, Some("dev-a"), sent)], now, &BUDGET, true)
                .is_empty();
        }
        assert!(caught);
    }

    #[test]
    fn a_devices_connections_are_summed() {
        let mut t = Tracker::default();
        let at = |t: &mut Tracker, n: u64, now: u64| {
            let conns: Vec<Conn> = (0..20)
                .map(|cid| Conn {
                    age_secs: Some(100),
                    ..conn(cid, Some("dev-a"), n)
                })
                .collect();
            t.observe(&conns, now, &BUDGET, true)
        };
        assert!(at(&mut t, 0, 0).is_empty());
        // 20 connections at 10 a second each: 200 a second for the device.
        let mut f = Vec::new();
        for s in 1..=4 {
            f = at(&mut t, 10 * s, s * 1000);
            if !f.is_empty() {
                break;
            }
        }
        assert_eq!(msgs(&f).len(), 1, "one flood for the device: {f:?}");
        // Subscriptions and pending bytes summed too.
        let mut t = Tracker::default();
        let held = |subs, pending| -> Vec<Conn> {
            (0..4)
                .map(|cid| Conn {
                    subscriptions: subs,
                    pending_bytes: pending,
                    ..conn(cid, Some("dev-b"), 0)
                })
                .collect()
        };
        assert!(t.observe(&held(16, 0), 0, &BUDGET, true).is_empty());
        assert_eq!(
            t.observe(&held(17, 0), 1, &BUDGET, true)[0].over,
            Over::Subscriptions(68)
        );
        assert!(
            t.observe(&held(17, 0), 2, &BUDGET, false).is_empty(),
            "a poll without the counts does not judge them"
        );
        assert_eq!(
            t.observe(&held(1, 2_000_001), 3, &BUDGET, true)[0].over,
            Over::Pending(8_000_004)
        );
        // A connection that is not a device's is never judged.
        assert!(t
            .observe(&[conn(99, None, 1 << 40)], 4, &BUDGET, true)
            .is_empty());
    }

    #[test]
    fn a_new_connection_looked_at_between_polls_is_judged_at_once() {
        let mut t = Tracker::default();
        t.connected("S1", 4, &dev("dev-a"));
        assert!(t
            .sighting(&[conn(4, Some("dev-a"), 150)], 100, &BUDGET)
            .is_empty());
        let f = t.sighting(&[conn(4, Some("dev-a"), 20_000)], 200, &BUDGET);
        assert_eq!(msgs(&f), [("dev-a".to_owned(), 19_850)]);
    }

    #[test]
    fn a_closed_connection_is_charged_and_a_slow_consumer_is_a_flood() {
        let mut t = Tracker::default();
        let closed = |cid, in_msgs, reason: &str| Closed {
            server: "S1".into(),
            cid,
            device: Some(dev("dev-a")),
            in_msgs,
            out_bytes: 0,
            age_ms: Some(300),
            reason: reason.into(),
        };
        // Connected, never polled, gone 0.3 s later with 30,000 messages.
        t.connected("S1", 1, &dev("dev-a"));
        let f = t.closed(&closed(1, 30_000, "Client Closed"), 300, &BUDGET);
        assert!(matches!(
            f.map(|f| f.over),
            Some(Over::Messages { msgs: 30_000, .. })
        ));
        // Seen at 150, then closed: only the rest is charged.
        t.connected("S1", 2, &dev("dev-b"));
        t.observe(&[conn(2, Some("dev-b"), 150)], 1_000, &BUDGET, true);
        let f = t.closed(
            &Closed {
                device: Some(dev("dev-b")),
                ..closed(2, 200, "Client Closed")
            },
            1_500,
            &BUDGET,
        );
        assert_eq!(f, None);
        assert_eq!(t.tracked(), 0);
        let f = t.closed(
            &closed(3, 0, "Slow Consumer (Pending Bytes)"),
            2_000,
            &BUDGET,
        );
        assert_eq!(
            f.map(|f| f.over),
            Some(Over::SlowConsumer("Slow Consumer (Pending Bytes)".into()))
        );
    }

    #[test]
    fn the_reasons_say_what_and_the_budget() {
        let say = |o: Over| o.describe(&BUDGET);
        assert_eq!(
            say(Over::Messages { msgs: 3_000, over_ms: 1_500 }),
            "2000 messages a second over 1500 ms (3000 messages), over its budget of 100 messages a second with a 2 s burst"
        );
        assert_eq!(
            say(Over::Messages {
                msgs: 30_000,
                over_ms: 0
            }),
            "30000 messages at once, over its budget of 100 messages a second with a 2 s burst"
        );
        assert_eq!(
            say(Over::Subscriptions(96)),
            "96 subscriptions, over its limit of 64 summed over its connections"
        );
        assert!(
            say(Over::SlowConsumer("Slow Consumer (Pending Bytes)".into()))
                .contains("slow consumer")
        );
    }

    #[test]
    fn memory_is_bounded() {
        let mut t = Tracker::default();
        let many: Vec<Conn> = (0..(MAX_TRACKED as u64 + 10))
            .map(|i| conn(i, None, 0))
            .collect();
        t.observe(&many, 0, &BUDGET, true);
        assert_eq!(t.tracked(), 0, "only device connections are remembered");
        let many: Vec<Conn> = (0..(MAX_TRACKED as u64 + 10))
            .map(|i| conn(i, Some("dev-a"), 0))
            .collect();
        t.observe(&many, 0, &BUDGET, true);
        assert_eq!(t.tracked(), MAX_TRACKED);
        for p in 1..=FORGET_AFTER_POLLS {
            t.observe(&[], p, &BUDGET, true);
        }
        assert_eq!(
            t.tracked(),
            0,
            "connections not seen for long are forgotten"
        );
    }

    #[test]
    fn uptimes_are_read() {
        for (s, want) in [
            ("0s", Some(0)),
            ("59s", Some(59)),
            ("4m5s", Some(245)),
            ("1h0m1s", Some(3_601)),
            ("2d3h4m5s", Some(2 * 86_400 + 3 * 3_600 + 245)),
            ("1y0d0h0m0s", Some(365 * 86_400)),
            ("", None),
            ("5", None),
            ("s", None),
            ("1x", None),
        ] {
            assert_eq!(uptime_secs(s), want, "{s}");
        }
    }

    #[test]
    fn admissions_cap_connections_and_reconnects() {
        let mut a = Admissions::default();
        let d = dev("dev-a");
        // Five in a row, then one every 10 s.
        for i in 0..5 {
            assert_eq!(a.admit(&d, i * 300, &BUDGET), Ok(()), "{i}");
        }
        assert_eq!(a.admit(&d, 1_500, &BUDGET), Err(AdmitRefusal::TooOften(9)));
        assert!(a.admit(&d, 9_000, &BUDGET).is_err());
        assert_eq!(a.admit(&d, 10_000, &BUDGET), Ok(()));
        assert!(a.admit(&d, 10_300, &BUDGET).is_err());
        // Another device is not affected.
        assert_eq!(a.admit(&dev("dev-b"), 10_300, &BUDGET), Ok(()));
        // At most four open: a fifth is admitted and displaces the oldest (a device whose link dropped without
        // closing is never locked out by its own dead connections), two more the next two.
        for cid in 0..4 {
            assert!(a.opened(&d, "S1", cid, &BUDGET).is_empty());
        }
        assert_eq!(a.admit(&d, 100_000, &BUDGET), Ok(()));
        assert_eq!(a.opened(&d, "S1", 4, &BUDGET), [("S1".to_owned(), 0)]);
        assert_eq!(a.opened(&d, "S1", 5, &BUDGET), [("S1".to_owned(), 1)]);
        // An event seen twice changes nothing.
        assert!(a.opened(&d, "S1", 5, &BUDGET).is_empty());
        a.ended(&d, "S1", 2);
        assert_eq!(a.open_of(&d).len(), 3);
        // A restarted server's connections are forgotten; a missed DISCONNECT is corrected by the servers' list.
        a.opened(&d, "S2", 9, &BUDGET);
        assert_eq!(a.full(&BUDGET), std::slice::from_ref(&d));
        a.keep_servers(&HashSet::from(["S2".to_owned()]));
        assert_eq!(a.open_of(&d), [("S2".to_owned(), 9)]);
        a.replace(&d, Vec::new());
        assert!(a.open_of(&d).is_empty() && a.full(&BUDGET).is_empty());
    }

    #[test]
    fn cooldowns_double_on_repeat_and_start_again_after_a_quiet_hour() {
        let mut c = Cooldowns::default();
        let d = dev("dev-a");
        let s1 = c.strike(&d, 1_000, &BUDGET);
        assert_eq!((s1.until, s1.strikes), (1_060, 1));
        assert_eq!(c.cooling(&d, 1_059), Some(s1));
        assert_eq!(c.cooling(&d, 1_060), None);
        // Kicked again while cooling: same cool-down.
        assert_eq!(c.strike(&d, 1_030, &BUDGET), s1);
        // Floods again after it ended: twice as long, then four times...
        let s2 = c.strike(&d, 1_070, &BUDGET);
        assert_eq!((s2.until, s2.strikes), (1_070 + 120, 2));
        let s3 = c.strike(&d, s2.until + 1, &BUDGET);
        assert_eq!(s3.until, s2.until + 1 + 240);
        // ...at most the longest.
        let mut at = s3.until;
        for _ in 0..10 {
            at = c.strike(&d, at, &BUDGET).until;
        }
        let last = c.cooling(&d, at - 1).unwrap();
        assert!(last.until - (at - 3600) <= 3600, "{last:?}");
        // Quiet for the longest cool-down after the end: the first again.
        let fresh = c.strike(&d, at + 3600, &BUDGET);
        assert_eq!((fresh.strikes, fresh.until), (1, at + 3600 + 60));
        // Other devices are untouched.
        assert_eq!(c.cooling(&dev("dev-b"), at), None);
    }

    #[test]
    fn a_replicas_cooldown_is_learned_and_the_later_end_wins() {
        let mut c = Cooldowns::default();
        let d = dev("dev-a");
        c.learn(
            &d,
            Cooling {
                until: 500,
                strikes: 2,
            },
            100,
            &BUDGET,
        );
        assert_eq!(c.cooling(&d, 499).map(|x| x.until), Some(500));
        c.learn(
            &d,
            Cooling {
                until: 300,
                strikes: 1,
            },
            100,
            &BUDGET,
        );
        assert_eq!(c.cooling(&d, 499).map(|x| x.until), Some(500));
    }
}
