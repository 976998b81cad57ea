//! The recent lock history `/v1/status` reports: the last [`MAX_RECENT_EVENTS`] grants, releases, expiries and
//! admin releases this process made durable. In memory only (a restart empties it; each replica of an HA server
//! keeps its own); the stores push to it once a change is durable, in commit order.

use crate::state::Change;
use fleet_wire::fleetlock::{LockEvent, MAX_RECENT_EVENTS};
use fleet_wire::Timestamp;
use std::collections::VecDeque;
use std::sync::Mutex;

/// A bounded ring of recent events, oldest evicted first.
#[derive(Debug, Default)]
pub struct Recent {
    /// Oldest at the front, newest at the back.
    events: Mutex<VecDeque<LockEvent>>,
}

impl Recent {
    /// Records `changes` (in the order they were applied) as made durable at `at`.
    pub fn push(&self, changes: impl IntoIterator<Item = Change>, at: Timestamp) {
        // A panic elsewhere while holding the lock leaves a list that is still whole: keep using it.
        let mut events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        for c in changes {
            if events.len() == MAX_RECENT_EVENTS {
                events.pop_front();
            }
            events.push_back(c.at(at));
        }
    }

    /// The events, newest first.
    pub fn newest_first(&self) -> Vec<LockEvent> {
        let events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        events.iter().rev().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_wire::fleetlock::{Holder, LockEventKind};

    fn change(n: usize) -> Change {
        Change {
            kind: LockEventKind::Granted,
            group: "g".into(),
            holder: Holder {
                id: format!("h{n}"),
                hostname: None,
                ip: "127.0.0.1".into(),
                taken_at: Timestamp::from_unix_ms(n as u64),
            },
        }
    }

    #[test]
    fn keeps_the_newest_events_newest_first() {
        let r = Recent::default();
        assert!(r.newest_first().is_empty());
        // One push of several (a batch) and single pushes alike.
        r.push((0..50).map(change), Timestamp::from_unix_ms(1));
        for n in 50..250 {
            r.push([change(n)], Timestamp::from_unix_ms(n as u64));
        }
        let got = r.newest_first();
        assert_eq!(got.len(), MAX_RECENT_EVENTS);
        let ids: Vec<String> = got.iter().map(|e| e.holder.id.clone()).collect();
        let want: Vec<String> = (50..250).rev().map(|n| format!("h{n}")).collect();
        assert_eq!(ids, want);
        assert_eq!(got[0].at, Timestamp::from_unix_ms(249));
    }
}
