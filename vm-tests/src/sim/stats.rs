//! Counters and latency histograms, shared by every connection's threads (atomics only: no lock on the hot
//! path, fixed memory).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// What a write was, for counting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `device-info`.
    Info,
    /// `device-heartbeat`.
    Heartbeat,
    /// `device-workload-status`.
    Workload,
    /// `agent-upgrade-status`.
    Agent,
    /// `system-upgrade-status`.
    System,
}

/// Every kind, in the order counters print.
pub const KINDS: [Kind; 5] = [
    Kind::Info,
    Kind::Heartbeat,
    Kind::Workload,
    Kind::Agent,
    Kind::System,
];

impl Kind {
    fn idx(self) -> usize {
        self as usize
    }
    /// Short name for the counter line.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Info => "info",
            Kind::Heartbeat => "hb",
            Kind::Workload => "wl",
            Kind::Agent => "agent",
            Kind::System => "sys",
        }
    }
}

/// Latencies in 1-ms buckets up to 10 s, then one overflow bucket.
pub struct Histogram {
    buckets: Vec<AtomicU64>,
}

const HIST_MS: usize = 10_000;

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            buckets: (0..=HIST_MS).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl Histogram {
    /// Counts one latency.
    pub fn record(&self, d: Duration) {
        let ms = (d.as_millis() as usize).min(HIST_MS);
        self.buckets[ms].fetch_add(1, Ordering::Relaxed);
    }

    /// The `q` quantile (0–1) in ms, an upper bound to the bucket; `None` with nothing recorded. `10000` means
    /// "10 s or more".
    pub fn quantile_ms(&self, q: f64) -> Option<u64> {
        let counts: Vec<u64> = self
            .buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return None;
        }
        let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (ms, c) in counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Some(ms as u64);
            }
        }
        Some(HIST_MS as u64)
    }
}

/// Every counter of a run.
#[derive(Default)]
pub struct Stats {
    sent: [AtomicU64; 5],
    acked: [AtomicU64; 5],
    errors: [AtomicU64; 5],
    /// Intents and desired states received for this simulator's devices.
    pub received: AtomicU64,
    /// Values received that did not parse as their fleet-wire type.
    pub bad_values: AtomicU64,
    /// Messages the client dropped because a subscription's queue was full.
    pub dropped: AtomicU64,
    /// Heartbeat put → acknowledgement.
    pub heartbeat_ack: Histogram,
    /// How late a heartbeat was sent after it was due (the simulator's own lag).
    pub heartbeat_late: Histogram,
    /// With a connection per device: connections the server accepted (fleet-auth admitted them).
    pub connects: AtomicU64,
    /// Of [`Self::connects`], those after a device's first (it had lost its connection).
    pub reconnects: AtomicU64,
    /// Connection attempts the server refused (an authorization error: fleet-auth said no, or did not answer in
    /// time).
    pub refused: AtomicU64,
    /// Connection attempts that failed otherwise (no server listening, a time-out, a token file unreadable).
    pub connect_failed: AtomicU64,
    /// Writes not sent because their device had no connection at that moment (as the agent, it does not queue
    /// them: the next heartbeat or status is the next write).
    pub offline: AtomicU64,
    /// Devices back after losing their connection: connected again and a heartbeat acknowledged (counted once per
    /// loss).
    pub back: AtomicU64,
}

impl Stats {
    /// A write was sent.
    pub fn sent(&self, k: Kind) {
        self.sent[k.idx()].fetch_add(1, Ordering::Relaxed);
    }
    /// A write was acknowledged by JetStream.
    pub fn acked(&self, k: Kind) {
        self.acked[k.idx()].fetch_add(1, Ordering::Relaxed);
    }
    /// A write failed (error answer, time-out, not sent).
    pub fn error(&self, k: Kind) {
        self.errors[k.idx()].fetch_add(1, Ordering::Relaxed);
    }
    /// Totals over every kind: (sent, acked, errors).
    pub fn totals(&self) -> (u64, u64, u64) {
        let sum = |a: &[AtomicU64; 5]| a.iter().map(|x| x.load(Ordering::Relaxed)).sum();
        (sum(&self.sent), sum(&self.acked), sum(&self.errors))
    }

    /// One line of every counter (what the simulator prints every 10 s; `scripts/bench` reads the last one).
    pub fn line(&self, elapsed: Duration, devices: usize, in_flight: u64) -> String {
        let (s, a, e) = self.totals();
        let mut out = format!(
            "fleet-sim t={}s devices={devices} sent={s} acked={a} errors={e} in_flight={in_flight}",
            elapsed.as_secs()
        );
        for k in KINDS {
            let i = k.idx();
            out.push_str(&format!(
                " {n}={}/{}/{}",
                self.sent[i].load(Ordering::Relaxed),
                self.acked[i].load(Ordering::Relaxed),
                self.errors[i].load(Ordering::Relaxed),
                n = k.name()
            ));
        }
        let q = |h: &Histogram, q| h.quantile_ms(q).map_or("-".into(), |v| v.to_string());
        out.push_str(&format!(
            " received={} bad={} dropped={} hb_ack_ms_p50={} hb_ack_ms_p99={} hb_late_ms_p99={}",
            self.received.load(Ordering::Relaxed),
            self.bad_values.load(Ordering::Relaxed),
            self.dropped.load(Ordering::Relaxed),
            q(&self.heartbeat_ack, 0.5),
            q(&self.heartbeat_ack, 0.99),
            q(&self.heartbeat_late, 0.99),
        ));
        out
    }

    /// The connection counters of a run with a connection per device (appended to [`Self::line`]);
    /// `connected` devices have a connection now.
    pub fn device_line(&self, connected: usize, devices: usize) -> String {
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        format!(
            " connected={connected}/{devices} connects={} reconnects={} refused={} connect_failed={} offline={} back={}",
            n(&self.connects),
            n(&self.reconnects),
            n(&self.refused),
            n(&self.connect_failed),
            n(&self.offline),
            n(&self.back),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles() {
        let h = Histogram::default();
        assert_eq!(h.quantile_ms(0.5), None);
        for ms in 1..=100 {
            h.record(Duration::from_millis(ms));
        }
        assert_eq!(h.quantile_ms(0.5), Some(50));
        assert_eq!(h.quantile_ms(0.99), Some(99));
        h.record(Duration::from_secs(60));
        assert_eq!(h.quantile_ms(1.0), Some(10_000), "overflow bucket");
    }

    #[test]
    fn counter_line() {
        let s = Stats::default();
        s.sent(Kind::Heartbeat);
        s.acked(Kind::Heartbeat);
        s.error(Kind::Info);
        let l = s.line(Duration::from_secs(10), 5, 0);
        assert!(l.contains("sent=1 acked=1 errors=1"), "{l}");
        assert!(l.contains(" hb=1/1/0") && l.contains(" info=0/0/1"), "{l}");
    }
}
