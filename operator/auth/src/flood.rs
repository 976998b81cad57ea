//! Flood detection, pure: per-connection message rates from nats-server's own counters (CONNZ `in_msgs`, sampled
//! by the flood guard every poll), and the cool-downs of devices disconnected for going over their budget.
//!
//! NATS has no per-connection message-rate limit, so one device's valid connection can send tens of thousands of
//! messages a second (docs/auth.md, threat model). The guard measures, disconnects and refuses: a device over
//! its budget is kicked and its sessions are refused for a cool-down that doubles with each repeat.

use fleet_wire::DeviceId;
use std::collections::HashMap;

/// Connections remembered at most (a poll sees the busiest connections of each server only).
pub const MAX_TRACKED: usize = 100_000;
/// Devices in cool-down remembered at most.
pub const MAX_COOLING: usize = 100_000;
/// A connection not seen for this many polls is forgotten (its next sighting is a new baseline).
const FORGET_AFTER_POLLS: u64 = 10;

/// The budget and what happens past it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Messages a second a device's connection may send, averaged over one poll.
    pub max_msgs_per_sec: u64,
    /// The first cool-down, seconds; each repeat within [`Budget::max_cooldown_secs`] doubles it.
    pub cooldown_secs: u64,
    /// The longest cool-down, seconds; a device with no flood for this long starts again at the first.
    pub max_cooldown_secs: u64,
    /// Subscriptions a device's connection may hold (an agent holds a few; each costs the server memory).
    pub max_subscriptions: u64,
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
    /// Subscriptions it holds now.
    pub subscriptions: u64,
}

/// A connection over budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flood {
    /// The connection.
    pub server: String,
    /// Its id.
    pub cid: u64,
    /// Its device.
    pub device: DeviceId,
    /// Its measured rate, messages a second.
    pub msgs_per_sec: u64,
    /// Over how many milliseconds it was measured.
    pub over_ms: u64,
}

#[derive(Debug, Clone, Copy)]
struct Sample {
    in_msgs: u64,
    at_ms: u64,
    poll: u64,
}

/// The rates of the connections seen, poll to poll.
#[derive(Debug, Default)]
pub struct Tracker {
    last: HashMap<(String, u64), Sample>,
    polls: u64,
}

impl Tracker {
    /// Takes one poll's connections at `now_ms` (a monotonic clock) and returns those over `budget`. A connection
    /// seen for the first time is a baseline: its rate is known from its second sighting on (a flood is seen
    /// within two polls; a count from before the first sighting may be old and is never judged).
    pub fn observe(&mut self, conns: &[Conn], now_ms: u64, budget: &Budget) -> Vec<Flood> {
        self.polls += 1;
        let poll = self.polls;
        let mut floods = Vec::new();
        for c in conns {
            let key = (c.server.clone(), c.cid);
            let now = Sample {
                in_msgs: c.in_msgs,
                at_ms: now_ms,
                poll,
            };
            match self.last.get(&key).copied() {
                Some(before) if now_ms > before.at_ms && c.in_msgs >= before.in_msgs => {
                    let over_ms = now_ms - before.at_ms;
                    let msgs_per_sec = (c.in_msgs - before.in_msgs).saturating_mul(1000) / over_ms;
                    if msgs_per_sec > budget.max_msgs_per_sec {
                        if let Some(device) = &c.device {
                            floods.push(Flood {
                                server: c.server.clone(),
                                cid: c.cid,
                                device: device.clone(),
                                msgs_per_sec,
                                over_ms,
                            });
                        }
                    }
                }
                _ => {}
            }
            if self.last.len() < MAX_TRACKED || self.last.contains_key(&key) {
                self.last.insert(key, now);
            }
        }
        self.last
            .retain(|_, s| poll.saturating_sub(s.poll) < FORGET_AFTER_POLLS);
        floods
    }

    /// Connections remembered (for the bound's test).
    pub fn tracked(&self) -> usize {
        self.last.len()
    }
}

/// A device's connection holding more subscriptions than its budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverSubscribed {
    /// The connection's server.
    pub server: String,
    /// Its id.
    pub cid: u64,
    /// Its device.
    pub device: DeviceId,
    /// Subscriptions it holds.
    pub subscriptions: u64,
}

/// The device connections of one poll that hold more subscriptions than `budget` allows (NATS keeps each in the
/// server's memory; the user JWT's `subs` limit is not applied to users the auth callout admits).
pub fn over_subscribed(conns: &[Conn], budget: &Budget) -> Vec<OverSubscribed> {
    conns
        .iter()
        .filter(|c| c.subscriptions > budget.max_subscriptions)
        .filter_map(|c| {
            Some(OverSubscribed {
                server: c.server.clone(),
                cid: c.cid,
                device: c.device.clone()?,
                subscriptions: c.subscriptions,
            })
        })
        .collect()
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
            subscriptions: 3,
        }
    }

    #[test]
    fn a_connection_over_its_subscriptions_is_named() {
        let at = |subscriptions, device| Conn {
            subscriptions,
            ..conn(1, device, 0)
        };
        assert!(
            over_subscribed(&[at(256, Some("dev-a")), at(3, Some("dev-b"))], &BUDGET).is_empty()
        );
        assert_eq!(
            over_subscribed(&[at(257, Some("dev-a")), at(9_000, None)], &BUDGET),
            [OverSubscribed {
                server: "S1".into(),
                cid: 1,
                device: dev("dev-a"),
                subscriptions: 257
            }],
            "at the budget is allowed, one over is not; a connection that is not a device's is never named"
        );
    }

    const BUDGET: Budget = Budget {
        max_msgs_per_sec: 100,
        cooldown_secs: 60,
        max_cooldown_secs: 3600,
        max_subscriptions: 256,
    };

    #[test]
    fn rates_table() {
        // (in_msgs at first poll, in_msgs 2 s later, flood?)
        let table: &[(u64, u64, Option<u64>)] = &[
            (0, 0, None),
            (0, 200, None),               // 100/s: at the budget, not over
            (0, 202, Some(101)),          // just over
            (5_000_000, 5_000_100, None), // a big count from before the first sighting is never judged
            (10, 60_010, Some(30_000)),
            (500, 400, None), // a counter that went back (a new connection reusing the id): baseline again
        ];
        for &(first, second, want) in table {
            let mut t = Tracker::default();
            assert!(t
                .observe(&[conn(7, Some("dev-a"), first)], 1_000, &BUDGET)
                .is_empty());
            let got = t.observe(&[conn(7, Some("dev-a"), second)], 3_000, &BUDGET);
            assert_eq!(
                got.first().map(|f| f.msgs_per_sec),
                want,
                "{first} then {second}: {got:?}"
            );
            if let Some(f) = got.first() {
                assert_eq!((f.cid, f.over_ms, f.device.as_str()), (7, 2_000, "dev-a"));
            }
        }
    }

    #[test]
    fn only_device_connections_are_judged_and_memory_is_bounded() {
        let mut t = Tracker::default();
        t.observe(&[conn(1, None, 0)], 0, &BUDGET);
        assert!(t
            .observe(&[conn(1, None, 1_000_000)], 1_000, &BUDGET)
            .is_empty());
        // Connections that vanish are forgotten after a few polls.
        for p in 2..=(FORGET_AFTER_POLLS + 2) {
            t.observe(&[], p * 1_000, &BUDGET);
        }
        assert_eq!(t.tracked(), 0);
        let many: Vec<Conn> = (0..(MAX_TRACKED as u64 + 10))
            .map(|i| conn(i, None, 0))
            .collect();
        t.observe(&many, 100_000, &BUDGET);
        assert_eq!(t.tracked(), MAX_TRACKED);
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
