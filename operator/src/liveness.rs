//! Liveness: whether a device is heard from, by one rule that the alerts (`DeviceSilent`), the dashboard and the
//! Device's `Online` condition share. Pure.
//!
//! An operator judges only what it has watched: not before its heartbeat mirror has read `device-heartbeat`
//! (every operator start, every watch opened anew), and a device with no heartbeat in NATS only by the Device's
//! `lastHeartbeat` once the operator has itself watched for the whole threshold without hearing from it.
//!
//! Clocks: a heartbeat carries the device's clock (`at`), which may be off by hours (a Raspberry Pi without a
//! real-time clock boots at its last shutdown's time until NTP answers). The operator compares its own clock only
//! with the time NATS stored a heartbeat (JetStream's timestamp, the server's clock, next to the operator's): a
//! heartbeat it saw arrive counts from when NATS stored it, whatever the device's clock said. A heartbeat found
//! in the bucket when the watch started counts from the earlier of its stored time and its own time: a device
//! clock running ahead never hides a silence, and a heartbeat written long ago and never since is old whatever
//! was stored; a device whose clock runs behind by more than the threshold is judged by its clock until its next
//! heartbeat arrives (one heartbeat interval after the watch started).

use fleet_wire::{Heartbeat, Timestamp};
use std::time::Duration;

/// A device is `Online=False` after this long without a heartbeat: three of the agent's default 30 s heartbeats,
/// the rollouts' default `heartbeatTimeoutSeconds` (the `DeviceSilent` alert has its own, longer threshold:
/// `--alert-silent-after`).
pub const OFFLINE_AFTER: Duration = Duration::from_secs(90);

/// One device's latest heartbeat as the heartbeat mirror holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Beat {
    /// Its own time (the device's clock).
    pub at: Timestamp,
    /// When NATS stored it (the NATS server's clock), when known.
    pub stored: Option<Timestamp>,
    /// True when the watch delivered it as a new write (this operator saw it arrive); false when it was in the
    /// bucket when the watch started.
    pub arrived: bool,
}

impl Beat {
    /// The heartbeat `hb` with what the mirror knows of it ([`crate::kv::Seen`]).
    pub fn of(hb: &Heartbeat, seen: &crate::kv::Seen<Heartbeat>) -> Self {
        Self {
            at: hb.at,
            stored: seen.stored_at(),
            arrived: seen.arrived(),
        }
    }

    /// When the device was last heard from, on the operator's side of the wire (see the module's doc).
    pub fn heard(&self) -> Timestamp {
        match (self.stored, self.arrived) {
            (Some(stored), true) => stored,
            (Some(stored), false) => stored.min(self.at),
            (None, _) => self.at,
        }
    }
}

/// A device's liveness at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Not judged: the heartbeats are not watched (yet), or the device has no heartbeat in NATS and the operator
    /// has not watched for the threshold yet, or it never sent one.
    Unknown,
    /// Heard from within the threshold, last at this time.
    Heard(Timestamp),
    /// Nothing heard for longer than the threshold, last at this time.
    Silent(Timestamp),
}

/// What the operator knows of one device's heartbeats: the rule's inputs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Facts {
    /// When the heartbeat mirror's running watch had read the bucket (the operator's clock); `None`: not
    /// watching.
    pub watched_since: Option<Timestamp>,
    /// The device's heartbeat in NATS.
    pub beat: Option<Beat>,
    /// The Device's `lastHeartbeat` (the device's clock, refreshed hourly), read only when NATS holds no
    /// heartbeat.
    pub recorded: Option<Timestamp>,
}

/// The rule: the device of `f` at `now` (the operator's clock), silent after `threshold`.
pub fn judge(f: &Facts, threshold: Duration, now: Timestamp) -> Verdict {
    let Some(since) = f.watched_since else {
        return Verdict::Unknown;
    };
    let last = match (&f.beat, f.recorded) {
        (Some(b), _) => b.heard(),
        // No heartbeat in NATS (a new NATS store, a removed key): the Device's record, once this operator has
        // itself gone the whole threshold without a heartbeat of it.
        (None, Some(r)) if now.since(since) >= threshold => r,
        (None, _) => return Verdict::Unknown,
    };
    if now.since(last) > threshold {
        Verdict::Silent(last)
    } else {
        Verdict::Heard(last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: u64) -> Timestamp {
        Timestamp::from_unix_ms(1_800_000_000_000 + s * 1000)
    }

    #[test]
    fn silence_rule_table() {
        use Verdict::{Heard, Silent, Unknown};
        let t = Duration::from_secs(60);
        let found = |own: u64, stored: u64| Beat {
            at: at(own),
            stored: Some(at(stored)),
            arrived: false,
        };
        let arrived = |own: u64, stored: u64| Beat {
            arrived: true,
            ..found(own, stored)
        };
        // (case, watched since, heartbeat, Device's lastHeartbeat, now, verdict)
        type Row = (
            &'static str,
            Option<u64>,
            Option<Beat>,
            Option<u64>,
            u64,
            Verdict,
        );
        #[rustfmt::skip]
        let rows: [Row; 14] = [
            // Before the mirror has read the bucket nothing is judged, however old the Device's record (the
            // false alarm of every operator start) or the heartbeat.
            ("not watching, old record", None, None, Some(0), 5000, Unknown),
            ("not watching, old beat", None, Some(found(0, 0)), Some(0), 5000, Unknown),
            // Watching: the heartbeat in NATS, not the Device's hourly record.
            ("fresh beat, old record", Some(1000), Some(found(1000, 1000)), Some(0), 1001, Heard(at(1000))),
            ("beat at the threshold", Some(1000), Some(found(1000, 1000)), None, 1060, Heard(at(1000))),
            ("beat past the threshold", Some(1000), Some(found(1000, 1000)), None, 1061, Silent(at(1000))),
            // A device silenced before the operator started is silent from its last beat, not from the start.
            ("silenced before the start", Some(1000), Some(found(950, 950)), None, 1011, Silent(at(950))),
            // Clocks: a device clock two hours behind, its beat seen arriving: NATS's time counts.
            ("behind, arrived", Some(9000), Some(arrived(9500 - 7200, 9500)), None, 9510, Heard(at(9500))),
            // A clock ahead never hides a silence: a beat counts from when NATS stored it at the latest.
            ("ahead, found", Some(1000), Some(found(9000, 900)), None, 1000, Silent(at(900))),
            ("ahead, arrived", Some(1000), Some(arrived(9000, 1500)), None, 1561, Silent(at(1500))),
            // A beat found in the bucket, written long ago by its own clock: old, whenever it was stored.
            ("found, own time old", Some(1000), Some(found(0, 1000)), None, 1001, Silent(at(0))),
            // No heartbeat in NATS: the Device's record only after watching for the whole threshold.
            ("no key, watched 59 s", Some(1000), None, Some(0), 1059, Unknown),
            ("no key, watched 60 s", Some(1000), None, Some(0), 1060, Silent(at(0))),
            ("no key, recent record", Some(1000), None, Some(1050), 1060, Heard(at(1050))),
            ("never beat", Some(1000), None, None, 9000, Unknown),
        ];
        for (case, watched, beat, recorded, now, want) in rows {
            let facts = Facts {
                watched_since: watched.map(at),
                beat,
                recorded: recorded.map(at),
            };
            assert_eq!(judge(&facts, t, at(now)), want, "{case}");
        }
    }
}
