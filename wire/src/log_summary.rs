//! How often a service logs what one device (or client) keeps doing wrong: the first time at once, then at most
//! one line per key per interval with the count since and the latest reason, so a device sending a million bad
//! messages costs the log a line every [`SUMMARY_INTERVAL`], not a million. Used by fleet-auth
//! and the operator. Pure: the caller passes the time and logs the lines returned; every text it is given is shown
//! through [`for_log`].

use crate::text::{for_log, LOG_TEXT_MAX_CHARS};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// One summary line per key at most this often.
pub const SUMMARY_INTERVAL: Duration = Duration::from_secs(10);
/// Keys followed at most; past this, the events of new keys are counted together under [`OTHERS`] (a summary
/// never grows memory without bound).
pub const MAX_KEYS: usize = 100_000;
/// The key events of keys past [`MAX_KEYS`] are counted under.
pub const OTHERS: &str = "(other devices)";

/// Where one key stands.
struct Entry {
    /// Start of the current interval (its first line was logged then, or its summary).
    since: Instant,
    /// Events since that line, not logged yet.
    unlogged: u64,
    /// The latest of them (cut to what [`for_log`] shows; escaped when it is written).
    latest: String,
}

/// Summaries of one kind of event (`what`, e.g. `watch registration refused for`), per key (a device id).
pub struct Summaries {
    what: String,
    interval: Duration,
    keys: HashMap<String, Entry>,
}

impl Summaries {
    /// Summaries of `what` with one line per key per `interval` at most.
    pub fn new(what: impl Into<String>, interval: Duration) -> Self {
        Self {
            what: what.into(),
            interval,
            keys: HashMap::new(),
        }
    }

    /// Records one event of `key` (why: `reason`) at `now`; the line to log now, if one is due (the first event of a
    /// quiet key, or the first after its interval passed).
    pub fn record(&mut self, key: &str, reason: &str, now: Instant) -> Option<String> {
        let key = if self.keys.contains_key(key) || self.keys.len() < MAX_KEYS {
            key
        } else {
            OTHERS
        };
        match self.keys.get_mut(key) {
            None => {
                self.keys.insert(
                    key.to_owned(),
                    Entry {
                        since: now,
                        unlogged: 0,
                        latest: String::new(),
                    },
                );
                Some(format!(
                    "{} {}: {}",
                    self.what,
                    for_log(key),
                    for_log(reason)
                ))
            }
            Some(e) => {
                e.unlogged += 1;
                e.latest.clear();
                e.latest.extend(reason.chars().take(LOG_TEXT_MAX_CHARS + 1));
                if now.duration_since(e.since) < self.interval {
                    return None;
                }
                let line = summary(&self.what, key, e, now);
                e.since = now;
                e.unlogged = 0;
                Some(line)
            }
        }
    }

    /// The summaries due at `now` (keys whose interval passed with events not logged yet); keys quiet for a whole
    /// interval are forgotten, so their next event is logged at once.
    pub fn due(&mut self, now: Instant) -> Vec<String> {
        let mut lines = Vec::new();
        let (what, interval) = (&self.what, self.interval);
        self.keys.retain(|key, e| {
            if now.duration_since(e.since) < interval {
                return true;
            }
            if e.unlogged == 0 {
                return false;
            }
            lines.push(summary(what, key, e, now));
            e.since = now;
            e.unlogged = 0;
            true
        });
        lines
    }
}

/// The line for `e`'s events not logged yet, at `now`.
fn summary(what: &str, key: &str, e: &Entry, now: Instant) -> String {
    format!(
        "{what} {}: {} more in the last {} s, the latest: {}",
        for_log(key),
        e.unlogged,
        now.duration_since(e.since).as_secs().max(1),
        for_log(&e.latest)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_key_per_interval_with_the_count() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut s = Summaries::new("watch registration refused", Duration::from_secs(10));
        let first = s.record("dev-a", "bad\nflood guard: forged", at(0));
        assert_eq!(
            first.as_deref(),
            Some("watch registration refused dev-a: bad\\nflood guard: forged")
        );
        for i in 1..100_000u64 {
            assert_eq!(s.record("dev-a", "again\nforged", at(i / 20)), None);
        }
        assert!(
            s.record("dev-b", "other", at(1)).is_some(),
            "each device its own"
        );
        assert!(s.due(at(9_999)).is_empty(), "within the interval");
        let due = s.due(at(10_001));
        assert_eq!(due.len(), 1, "dev-b sent nothing more: {due:?}");
        let a = &due[0];
        assert!(a.contains(": 99999 more in the last"), "{a}");
        assert!(a.ends_with("the latest: again\\nforged"), "{a}");
        assert!(!a.contains('\n'));
        assert_eq!(
            s.keys.len(),
            1,
            "dev-b, quiet for its interval, is forgotten"
        );
        // The next interval: its events are summarised at its end, or by the first event after it.
        assert_eq!(s.record("dev-a", "x", at(12_000)), None);
        let line = s.record("dev-a", "y", at(20_001)).expect("a new interval");
        assert!(line.contains(": 2 more in"), "{line}");
        // Quiet for an interval: forgotten, and its next event is shown at once.
        assert!(s.due(at(30_000)).is_empty());
        assert_eq!(s.keys.len(), 1);
        assert!(s.due(at(30_001)).is_empty());
        assert_eq!(s.keys.len(), 0);
        assert!(s.record("dev-a", "z", at(40_001)).is_some());
    }

    #[test]
    fn past_max_keys_new_keys_share_one_line() {
        let t0 = Instant::now();
        let mut s = Summaries::new("x", Duration::from_secs(10));
        for i in 0..MAX_KEYS {
            s.record(&format!("dev-{i}"), "r", t0);
        }
        assert!(s.record("dev-new", "r", t0).is_some());
        assert_eq!(s.record("dev-newer", "r", t0), None);
        assert_eq!(s.keys.len(), MAX_KEYS + 1);
        assert!(s.keys.contains_key(OTHERS));
    }
}
