//! When a TaskRun's device counts as *stalled*: its system-upgrade intent was written and no status for the run
//! came back (the device never accepted it) for longer than the accept timeout. The intent's write time is the
//! time NATS stored the entry, so a restarted operator judges the same devices stalled. Pure; table-tested.

use fleet_wire::{DeviceId, Timestamp};
use std::time::Duration;

/// Default accept timeout: three default agent heartbeats (90 s, the time after which a rollout counts a silent
/// device as gone) plus one controller resync (30 s). An agent that is up sees a new intent within a second (it
/// watches the bucket) and its updater answers at once, so two minutes without a status means the agent or the
/// updater is not taking it.
pub const DEFAULT_ACCEPT_TIMEOUT: Duration = Duration::from_secs(120);
/// Shortest accept timeout `--task-accept-timeout` takes.
pub const MIN_ACCEPT_TIMEOUT: Duration = Duration::from_secs(1);
/// Longest: a day (a run lasts at most 30 days; a person who wants no stall reports sets a long deadline anyway).
pub const MAX_ACCEPT_TIMEOUT: Duration = Duration::from_secs(86_400);
/// The `phase` a Device's `status.stalled` shows for a task intent it has not accepted.
pub const NOT_ACCEPTED: &str = "not-accepted";
/// Most devices a condition message names (the count carries the rest).
pub const STALL_EXAMPLES: usize = 10;

/// One planned device's intent as the run's view holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    /// The intent is present (written, not removed).
    pub live: bool,
    /// When NATS stored it (`None`: not read back yet, e.g. this operator's own create just now).
    pub written: Option<Timestamp>,
    /// A status for this run came back (the device accepted or refused it).
    pub reported: bool,
}

/// Where one device stands in accepting its intent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accept {
    /// Nothing to judge: no live intent, already reported, or the write time is not known yet.
    Unjudged,
    /// Waiting within the timeout: stalled at `at` unless a status comes first.
    Waiting {
        /// When it becomes stalled.
        at: Timestamp,
    },
    /// Stalled: written at `since`, no status for longer than the timeout.
    Stalled {
        /// When the intent was written.
        since: Timestamp,
    },
}

/// Judges one device at `now`.
pub fn judge(seen: Seen, now: Timestamp, timeout: Duration) -> Accept {
    match seen {
        Seen {
            live: true,
            written: Some(w),
            reported: false,
        } => {
            if now.since(w) > timeout {
                Accept::Stalled { since: w }
            } else {
                Accept::Waiting {
                    at: w.plus(timeout).plus(Duration::from_millis(1)),
                }
            }
        }
        _ => Accept::Unjudged,
    }
}

/// The stalled devices of a run (every one, with when its intent was written, in plan order) and when the next
/// waiting device becomes stalled (the controller wakes then, so a stall is reported on time, not a resync late).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stalls {
    /// Stalled devices and their intents' write times.
    pub devices: Vec<(DeviceId, Timestamp)>,
    /// The earliest time a waiting device becomes stalled.
    pub wake: Option<Timestamp>,
}

impl Stalls {
    /// `dev-1 (since 2026-12-02T06:00:00Z)` for the first [`STALL_EXAMPLES`] devices.
    pub fn examples(&self) -> Vec<String> {
        self.devices
            .iter()
            .take(STALL_EXAMPLES)
            .map(|(d, since)| format!("{d} (intent written {since})"))
            .collect()
    }
}

/// Judges every device of `devices` with `seen`.
pub fn stalls<'a>(
    devices: impl IntoIterator<Item = &'a DeviceId>,
    seen: impl Fn(&DeviceId) -> Seen,
    now: Timestamp,
    timeout: Duration,
) -> Stalls {
    let mut out = Stalls::default();
    for d in devices {
        match judge(seen(d), now, timeout) {
            Accept::Unjudged => {}
            Accept::Waiting { at } => out.wake = Some(out.wake.map_or(at, |w| w.min(at))),
            Accept::Stalled { since } => out.devices.push((d.clone(), since)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: u64) -> Timestamp {
        Timestamp::from_unix_ms(1_796_000_000_000 + s * 1000)
    }
    fn id(s: &str) -> DeviceId {
        DeviceId::try_from(s).expect("id")
    }

    #[test]
    fn accept_table() {
        let timeout = Duration::from_secs(120);
        let seen = |live, written: Option<u64>, reported| Seen {
            live,
            written: written.map(t),
            reported,
        };
        let cases = [
            // written at 0, nothing back: waiting up to and including 120 s, stalled after
            (seen(true, Some(0), false), 60, "waiting 120.001"),
            (seen(true, Some(0), false), 120, "waiting 120.001"),
            (seen(true, Some(0), false), 121, "stalled 0"),
            // a status came back (accepted, refused, or finished): never stalled
            (seen(true, Some(0), true), 600, "unjudged"),
            // removed intent (the run ended, or the device is done): not judged
            (seen(false, Some(0), false), 600, "unjudged"),
            // the write time is not read back yet (the operator's own create): judged once it is
            (seen(true, None, false), 600, "unjudged"),
        ];
        for (i, (s, now, want)) in cases.into_iter().enumerate() {
            let got = match judge(s, t(now), timeout) {
                Accept::Unjudged => "unjudged".to_owned(),
                Accept::Waiting { at } => format!(
                    "waiting {}",
                    (at.unix_ms() - t(0).unix_ms()) as f64 / 1000.0
                ),
                Accept::Stalled { since } => {
                    format!("stalled {}", (since.unix_ms() - t(0).unix_ms()) / 1000)
                }
            };
            assert_eq!(got, want, "case {i}");
        }
    }

    #[test]
    fn stalls_lists_every_stalled_device_and_the_next_wake() {
        let devices = [id("a"), id("b"), id("c"), id("d")];
        let seen = |d: &DeviceId| match d.as_str() {
            "a" => Seen {
                live: true,
                written: Some(t(0)),
                reported: false,
            },
            "b" => Seen {
                live: true,
                written: Some(t(100)),
                reported: false,
            },
            "c" => Seen {
                live: true,
                written: Some(t(50)),
                reported: false,
            },
            _ => Seen {
                live: true,
                written: Some(t(0)),
                reported: true,
            },
        };
        let s = stalls(&devices, seen, t(130), Duration::from_secs(120));
        assert_eq!(s.devices, vec![(id("a"), t(0))]);
        // c becomes stalled first (50 + 120), then b
        assert_eq!(s.wake, Some(t(170).plus(Duration::from_millis(1))), "{s:?}");
        assert_eq!(
            s.examples(),
            [format!("a (intent written {})", t(0))],
            "named with when the intent was written"
        );
        let later = stalls(&devices, seen, t(300), Duration::from_secs(120));
        assert_eq!(later.devices.len(), 3);
        assert_eq!(later.wake, None);
    }
}
