//! When each device's next periodic write is due. Devices start spread evenly over the interval (not all at
//! once); after a write the next is due one interval after it was actually sent, as the agent schedules its
//! heartbeat (`next = now + interval`), so a late write never makes the next one early.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::{Duration, Instant};

/// Due times of one periodic write for many devices (indices local to a connection).
pub struct Schedule {
    interval: Duration,
    heap: BinaryHeap<Reverse<(Instant, usize)>>,
}

impl Schedule {
    /// Devices `0..n`, device `k` first due at `start + interval × k / n`, plus `skew` (a fraction of the interval
    /// that offsets this write from another schedule of the same devices).
    pub fn spread(n: usize, interval: Duration, start: Instant, skew: f64) -> Schedule {
        let heap = (0..n)
            .map(|k| {
                let frac = (k as f64 / n.max(1) as f64 + skew).fract();
                Reverse((start + interval.mul_f64(frac), k))
            })
            .collect();
        Schedule { interval, heap }
    }

    /// When the earliest write is due.
    pub fn next_due(&self) -> Option<Instant> {
        self.heap.peek().map(|Reverse((t, _))| *t)
    }

    /// The device whose write is due at or before `now`, with its due time; it is due again one interval after
    /// `sent` (call [`Self::sent`]).
    pub fn pop_due(&mut self, now: Instant) -> Option<(usize, Instant)> {
        match self.heap.peek() {
            Some(Reverse((t, _))) if *t <= now => self.heap.pop().map(|Reverse((t, k))| (k, t)),
            _ => None,
        }
    }

    /// Device `k` wrote at `sent`: its next write is due one interval later.
    pub fn sent(&mut self, k: usize, sent: Instant) {
        self.heap.push(Reverse((sent + self.interval, k)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_evenly_then_one_interval_after_each_send() {
        let t0 = Instant::now();
        let iv = Duration::from_secs(30);
        let mut s = Schedule::spread(3, iv, t0, 0.0);
        assert_eq!(s.next_due(), Some(t0));
        assert_eq!(s.pop_due(t0), Some((0, t0)));
        assert_eq!(s.pop_due(t0), None, "the next is 10 s later");
        assert_eq!(s.next_due(), Some(t0 + Duration::from_secs(10)));
        s.sent(0, t0 + Duration::from_secs(1));
        let late = t0 + Duration::from_secs(25);
        assert_eq!(s.pop_due(late).map(|(k, _)| k), Some(1));
        assert_eq!(s.pop_due(late).map(|(k, _)| k), Some(2));
        assert_eq!(s.pop_due(late), None);
        assert_eq!(s.next_due(), Some(t0 + Duration::from_secs(31)));
    }

    #[test]
    fn skew_offsets_and_wraps() {
        let t0 = Instant::now();
        let iv = Duration::from_secs(30);
        let s = Schedule::spread(2, iv, t0, 0.75);
        // Device 0 at 0.75, device 1 at (0.5 + 0.75) mod 1 = 0.25 of the interval.
        assert_eq!(s.next_due(), Some(t0 + iv.mul_f64(0.25)));
    }
}
