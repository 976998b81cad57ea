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
//! in the bucket when the watch started counts from the earlier of its stored time and its own time corrected by
//! the device's clock offset (the Device's `clockOffsetSeconds`, measured from the heartbeats an operator saw
//! arrive: [`clock_offset`]): a device clock running ahead never hides a silence, a heartbeat written long ago and
//! never since is old whatever was stored, and a device whose clock is known to run behind is not taken for
//! silent at a restart. Only a device whose offset was never measured (or changed since by more than the
//! threshold) is judged by its own clock until its next heartbeat arrives.

use fleet_wire::{Heartbeat, Timestamp};
use std::time::Duration;

/// A device is `Online=False` after this long without a heartbeat: three of the agent's default 30 s heartbeats,
/// the rollouts' default `heartbeatTimeoutSeconds` (the `DeviceSilent` alert has its own, longer threshold:
/// `--alert-silent-after`).
pub const OFFLINE_AFTER: Duration = Duration::from_secs(90);

/// A device clock within this many seconds of NATS's counts as right (no `clockOffsetSeconds`), and a measured
/// offset within this many seconds of the recorded one changes nothing (no write per heartbeat): network delay and
/// whole-second rounding stay below it.
pub const CLOCK_TOLERANCE_SECS: i64 = 5;

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

    /// When the device was last heard from, on the operator's side of the wire, its clock running `offset_secs`
    /// ahead of NATS's (negative: behind) when known (see the module's doc).
    pub fn heard(&self, offset_secs: Option<i64>) -> Timestamp {
        let own = match offset_secs {
            Some(o) => shifted(self.at, -o),
            None => self.at,
        };
        match (self.stored, self.arrived) {
            (Some(stored), true) => stored,
            (Some(stored), false) => stored.min(own),
            (None, _) => own,
        }
    }

    /// The device's clock minus NATS's, in whole seconds, measured from this heartbeat when the operator saw it
    /// arrive (a heartbeat found in the bucket may have waited there: it measures nothing).
    pub fn offset_secs(&self) -> Option<i64> {
        let stored = self.stored.filter(|_| self.arrived)?;
        let ms = i128::from(self.at.unix_ms()) - i128::from(stored.unix_ms());
        i64::try_from(ms / 1000).ok()
    }
}

/// `t` moved by `secs` seconds (either way, saturating at the epoch).
fn shifted(t: Timestamp, secs: i64) -> Timestamp {
    let ms = i128::from(t.unix_ms()) + i128::from(secs) * 1000;
    Timestamp::from_unix_ms(u64::try_from(ms.max(0)).unwrap_or(u64::MAX))
}

/// The device's clock offset to record (a Device's `clockOffsetSeconds`) given the one recorded and its latest
/// heartbeat: the offset `beat` measures when it differs from the recorded one by more than
/// [`CLOCK_TOLERANCE_SECS`] (`None` when the clock is within the tolerance of NATS's), else the recorded one.
pub fn clock_offset(recorded: Option<i64>, beat: Option<&Beat>) -> Option<i64> {
    let Some(measured) = beat.and_then(Beat::offset_secs) else {
        return recorded;
    };
    let near = |a: i64, b: i64| (a - b).abs() <= CLOCK_TOLERANCE_SECS;
    match recorded {
        Some(r) if near(measured, r) => Some(r),
        _ if near(measured, 0) => None,
        _ => Some(measured),
    }
}

/// Whether the next heartbeat of a device should wake the operator's pass at once (instead of being recorded
/// quietly until the periodic pass): when it would change what the Device shows — the device is judged silent
/// (its return turns `Online` back), or its latest heartbeat was found in the bucket with a clock off from NATS's
/// by more than [`CLOCK_TOLERANCE_SECS`] beyond the recorded offset (the next arrival measures the offset, and the
/// device is judged by NATS's time from then on).
pub fn wake_on_next_beat(f: &Facts, verdict: Verdict) -> bool {
    if matches!(verdict, Verdict::Silent(_)) {
        return true;
    }
    let Some(b) = f.beat.filter(|b| !b.arrived) else {
        return false;
    };
    let Some(stored) = b.stored else {
        return false;
    };
    let off = (i128::from(b.at.unix_ms()) - i128::from(stored.unix_ms())) / 1000;
    let recorded = i128::from(f.offset_secs.unwrap_or(0));
    (off - recorded).abs() > i128::from(CLOCK_TOLERANCE_SECS)
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
    /// The Device's `clockOffsetSeconds`: how far the device's clock runs ahead of NATS's (negative: behind).
    pub offset_secs: Option<i64>,
}

/// The rule: the device of `f` at `now` (the operator's clock), silent after `threshold`.
pub fn judge(f: &Facts, threshold: Duration, now: Timestamp) -> Verdict {
    let Some(since) = f.watched_since else {
        return Verdict::Unknown;
    };
    let last = match (&f.beat, f.recorded) {
        (Some(b), _) => b.heard(f.offset_secs),
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
        // A device clock 2 h behind, measured before (the Device's clockOffsetSeconds).
        let behind = Some(-7200);
        // (case, watched since, heartbeat, Device's lastHeartbeat, its clock offset, now, verdict)
        type Row = (
            &'static str,
            Option<u64>,
            Option<Beat>,
            Option<u64>,
            Option<i64>,
            u64,
            Verdict,
        );
        #[rustfmt::skip]
        let rows: [Row; 17] = [
            // Before the mirror has read the bucket nothing is judged, however old the Device's record (the
            // false alarm of every operator start) or the heartbeat.
            ("not watching, old record", None, None, Some(0), None, 5000, Unknown),
            ("not watching, old beat", None, Some(found(0, 0)), Some(0), None, 5000, Unknown),
            // Watching: the heartbeat in NATS, not the Device's hourly record.
            ("fresh beat, old record", Some(1000), Some(found(1000, 1000)), Some(0), None, 1001, Heard(at(1000))),
            ("beat at the threshold", Some(1000), Some(found(1000, 1000)), None, None, 1060, Heard(at(1000))),
            ("beat past the threshold", Some(1000), Some(found(1000, 1000)), None, None, 1061, Silent(at(1000))),
            // A device silenced before the operator started is silent from its last beat, not from the start.
            ("silenced before the start", Some(1000), Some(found(950, 950)), None, None, 1011, Silent(at(950))),
            // Clocks: a device clock two hours behind, its beat seen arriving: NATS's time counts.
            ("behind, arrived", Some(9000), Some(arrived(9500 - 7200, 9500)), None, None, 9510, Heard(at(9500))),
            // A clock ahead never hides a silence: a beat counts from when NATS stored it at the latest.
            ("ahead, found", Some(1000), Some(found(9000, 900)), None, None, 1000, Silent(at(900))),
            ("ahead, arrived", Some(1000), Some(arrived(9000, 1500)), None, None, 1561, Silent(at(1500))),
            // A beat found in the bucket, written long ago by its own clock: old, whenever it was stored.
            ("found, own time old", Some(1000), Some(found(0, 1000)), None, None, 1001, Silent(at(0))),
            // No heartbeat in NATS: the Device's record only after watching for the whole threshold.
            ("no key, watched 59 s", Some(1000), None, Some(0), None, 1059, Unknown),
            ("no key, watched 60 s", Some(1000), None, Some(0), None, 1060, Silent(at(0))),
            ("no key, recent record", Some(1000), None, Some(1050), None, 1060, Heard(at(1050))),
            ("never beat", Some(1000), None, None, None, 9000, Unknown),
            // A clock known to run 2 h behind: a beat found at a restart is judged by its corrected time, not taken
            // for silent; one written long ago and never since is still old.
            ("behind, found, offset known", Some(9000), Some(found(9500 - 7200, 9500)), None, behind, 9501, Heard(at(9500))),
            ("behind, found, offset unknown", Some(9000), Some(found(9500 - 7200, 9500)), None, None, 9501, Silent(at(2300))),
            ("behind, silent long since", Some(9000), Some(found(8000 - 7200, 8000)), None, behind, 9001, Silent(at(8000))),
        ];
        for (case, watched, beat, recorded, offset_secs, now, want) in rows {
            let facts = Facts {
                watched_since: watched.map(at),
                beat,
                recorded: recorded.map(at),
                offset_secs,
            };
            assert_eq!(judge(&facts, t, at(now)), want, "{case}");
        }
    }

    #[test]
    fn clock_offset_table() {
        let beat = |own: u64, stored: u64, arrived: bool| Beat {
            at: at(own),
            stored: Some(at(stored)),
            arrived,
        };
        // (case, recorded, heartbeat, recorded next)
        type Row = (&'static str, Option<i64>, Option<Beat>, Option<i64>);
        #[rustfmt::skip]
        let rows: [Row; 8] = [
            ("right clock", None, Some(beat(100, 100, true)), None),
            ("within 5 s", None, Some(beat(105, 100, true)), None),
            ("2 h behind", None, Some(beat(100, 7300, true)), Some(-7200)),
            ("ahead by a minute", None, Some(beat(160, 100, true)), Some(60)),
            ("the same give or take 5 s: no write", Some(-7200), Some(beat(104, 7300, true)), Some(-7200)),
            ("corrected by NTP", Some(-7200), Some(beat(100, 100, true)), None),
            ("found in the bucket: measures nothing", Some(-7200), Some(beat(100, 100, false)), Some(-7200)),
            ("no heartbeat", Some(30), None, Some(30)),
        ];
        for (case, recorded, b, want) in rows {
            assert_eq!(clock_offset(recorded, b.as_ref()), want, "{case}");
        }
    }

    #[test]
    fn which_next_heartbeats_wake_the_pass() {
        let t = Duration::from_secs(60);
        let beat = |own: u64, stored: u64, arrived: bool| Beat {
            at: at(own),
            stored: Some(at(stored)),
            arrived,
        };
        // (case, heartbeat, recorded offset, now, wakes)
        #[rustfmt::skip]
        let rows: [(&str, Beat, Option<i64>, u64, bool); 7] = [
            ("beating, right clock", beat(1000, 1000, true), None, 1010, false),
            ("silent: its return turns Online back", beat(1000, 1000, true), None, 1100, true),
            ("found, right clock", beat(1000, 1000, false), None, 1010, false),
            ("found, 2 h behind, offset unknown", beat(1000, 8200, false), None, 8210, true),
            ("found, 2 h behind, offset recorded", beat(1000, 8200, false), Some(-7200), 8210, false),
            ("found, clock corrected since", beat(8200, 8200, false), Some(-7200), 8210, true),
            ("arrived, 2 h behind: measured already", beat(1000, 8200, true), None, 8210, false),
        ];
        for (case, b, offset_secs, now, want) in rows {
            let f = Facts {
                watched_since: Some(at(0)),
                beat: Some(b),
                recorded: None,
                offset_secs,
            };
            assert_eq!(wake_on_next_beat(&f, judge(&f, t, at(now))), want, "{case}");
        }
    }
}
