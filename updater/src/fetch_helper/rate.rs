//! The bandwidth cap of the artifact download (the updater's `download_max_bytes_per_sec`, docs/updater.md): a
//! token bucket in front of the helper's reads of the artifact's body.
//!
//! The cap must hold over every 5-s interval, not only on average, so the bucket is small: it holds at most a
//! quarter of a second of the rate and never more than one read buffer ([`BURST_MAX_BYTES`]), each read asks for
//! at most half of that, and a read starts only once the bucket holds what it asks for (the other half takes up
//! what a sleep overshoots, so a fast cap is not lost to the scheduler). Over any interval of `T`
//! seconds the body bytes read are then at most `rate × T + burst` — within 5 % of the cap over 5 s at any rate
//! (the unit tests replay reads against a simulated clock and check every window). The bucket starts empty: a new
//! try after a dropped link (a new helper process, a new bucket) adds no burst of its own.
//!
//! What is capped: the bytes of the artifact's body (an `https://` artifact, an OCI layer blob) as the helper
//! reads them. Not capped: request and response heads, the OCI manifest and token (at most 64 KiB each), TLS and
//! TCP framing (a few per cent on the link), and what the kernel buffers for the socket before the helper reads
//! it (once per connection, the receive window).

use std::io::Read;
use std::num::NonZeroU64;
use std::time::{Duration, Instant};

/// Largest burst, in bytes: one read buffer of the download, whatever the rate.
pub const BURST_MAX_BYTES: u64 = 64 * 1024;

const NANOS_PER_SEC: i128 = 1_000_000_000;

/// A token bucket of bytes, refilled at `rate` bytes per second up to its capacity. Pure: every method takes
/// the time it acts at.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    rate: u64,
    capacity: u64,
    /// Credit in byte-nanoseconds (bytes × 10⁹), so that refills are exact; below zero after a read larger than
    /// the credit (which [`Capped`] never does).
    credit: i128,
    at: Instant,
}

impl TokenBucket {
    /// An empty bucket refilled at `rate` bytes per second from `now`, holding at most a quarter of a second of
    /// it (at least 1 byte, at most [`BURST_MAX_BYTES`]).
    pub fn new(rate: NonZeroU64, now: Instant) -> Self {
        let rate = rate.get();
        Self {
            rate,
            capacity: (rate / 4).clamp(1, BURST_MAX_BYTES),
            credit: 0,
            at: now,
        }
    }

    /// Bytes per second.
    pub fn rate(&self) -> u64 {
        self.rate
    }

    /// Most bytes the bucket holds.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Most bytes one read asks for: half the capacity (at least 1).
    pub fn read_max(&self) -> u64 {
        (self.capacity / 2).max(1)
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_nanos();
        self.at = self.at.max(now);
        let full = i128::from(self.capacity) * NANOS_PER_SEC;
        // Anything above twice the capacity is capped anyway; bounding it first keeps the sum in range.
        let added = elapsed
            .saturating_mul(u128::from(self.rate))
            .min(2 * full.unsigned_abs());
        self.credit = self
            .credit
            .saturating_add(i128::try_from(added).unwrap_or(i128::MAX))
            .min(full);
    }

    /// How long from `now` until the bucket holds `want` bytes (at most its capacity): zero when it does now.
    pub fn wait(&mut self, want: u64, now: Instant) -> Duration {
        self.refill(now);
        let need = i128::from(want.min(self.capacity)) * NANOS_PER_SEC;
        if self.credit >= need {
            return Duration::ZERO;
        }
        let short = (need - self.credit).unsigned_abs();
        let nanos = short.div_ceil(u128::from(self.rate));
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    /// Takes `bytes` read at `now` out of the bucket.
    pub fn take(&mut self, bytes: u64, now: Instant) {
        self.refill(now);
        self.credit = self
            .credit
            .saturating_sub(i128::from(bytes) * NANOS_PER_SEC);
    }
}

/// Where [`Capped`] reads the time and waits (a simulated clock in the tests).
pub trait Clock {
    /// Now.
    fn now(&self) -> Instant;
    /// Waits `d`.
    fn sleep(&self, d: Duration);
}

/// The real clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn sleep(&self, d: Duration) {
        std::thread::sleep(d);
    }
}

/// A reader whose reads take at most `rate` bytes per second (with the burst of [`TokenBucket`]); without a
/// rate, the reader as it is.
#[derive(Debug)]
pub struct Capped<R, C = SystemClock> {
    inner: R,
    bucket: Option<TokenBucket>,
    clock: C,
}

impl<R: Read> Capped<R> {
    /// Caps `inner` at `rate` bytes per second (none: no cap), from now.
    pub fn new(inner: R, rate: Option<NonZeroU64>) -> Self {
        Self::with_clock(inner, rate, SystemClock)
    }
}

impl<R: Read, C: Clock> Capped<R, C> {
    /// Caps `inner` at `rate` bytes per second on `clock`, from its now.
    pub fn with_clock(inner: R, rate: Option<NonZeroU64>, clock: C) -> Self {
        let bucket = rate.map(|r| TokenBucket::new(r, clock.now()));
        Self {
            inner,
            bucket,
            clock,
        }
    }
}

impl<R: Read, C: Clock> Read for Capped<R, C> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let Some(bucket) = self.bucket.as_mut() else {
            return self.inner.read(buf);
        };
        if buf.is_empty() {
            return Ok(0);
        }
        let want = buf
            .len()
            .min(usize::try_from(bucket.read_max()).unwrap_or(usize::MAX));
        loop {
            let d = bucket.wait(want as u64, self.clock.now());
            if d.is_zero() {
                break;
            }
            self.clock.sleep(d);
        }
        let n = self.inner.read(&mut buf[..want])?;
        bucket.take(n as u64, self.clock.now());
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::rc::Rc;

    /// A clock that only moves when slept on (or when the simulated network takes time).
    #[derive(Clone)]
    struct SimClock {
        start: Instant,
        offset: Rc<Cell<Duration>>,
    }

    impl SimClock {
        fn new() -> Self {
            Self {
                start: Instant::now(),
                offset: Rc::new(Cell::new(Duration::ZERO)),
            }
        }
        fn advance(&self, d: Duration) {
            self.offset.set(self.offset.get() + d);
        }
        fn elapsed(&self) -> Duration {
            self.offset.get()
        }
    }

    impl Clock for SimClock {
        fn now(&self) -> Instant {
            self.start + self.offset.get()
        }
        fn sleep(&self, d: Duration) {
            // A real sleep overshoots a little; so does this one.
            self.advance(d + Duration::from_micros(70));
        }
    }

    /// An endless body: each read returns a pseudo-random size up to `max_read` (a TLS record is 16 KiB) and
    /// takes time on the simulated clock when the network is slow (`stalls`: every 50th read waits that long).
    struct Network {
        clock: SimClock,
        x: u64,
        max_read: usize,
        stall: Duration,
        reads: u64,
    }

    impl Read for Network {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            self.x ^= self.x << 13;
            self.x ^= self.x >> 7;
            self.x ^= self.x << 17;
            self.reads += 1;
            if self.reads.is_multiple_of(50) {
                self.clock.advance(self.stall);
            }
            let n = 1 + (self.x as usize) % self.max_read;
            Ok(n.min(buf.len()))
        }
    }

    /// Reads for `run` of simulated time through a 64-KiB buffer (the download's); returns (time, bytes) of
    /// every read.
    fn replay(rate: u64, max_read: usize, stall: Duration, run: Duration) -> Vec<(Duration, u64)> {
        let clock = SimClock::new();
        let net = Network {
            clock: clock.clone(),
            x: rate | 1,
            max_read,
            stall,
            reads: 0,
        };
        let mut r = Capped::with_clock(net, NonZeroU64::new(rate), clock.clone());
        let mut buf = vec![0u8; 64 * 1024];
        let mut reads = Vec::new();
        while clock.elapsed() < run {
            let n = r.read(&mut buf).expect("read");
            reads.push((clock.elapsed(), n as u64));
        }
        reads
    }

    /// The most bytes read in any window of `window` (every window that starts at a read: the worst ones do).
    fn worst_window(reads: &[(Duration, u64)], window: Duration) -> u64 {
        let mut worst = 0;
        let (mut end, mut sum) = (0, 0u64);
        for (start, &(t0, _)) in reads.iter().enumerate() {
            while end < reads.len() && reads[end].0 <= t0 + window {
                sum += reads[end].1;
                end += 1;
            }
            worst = worst.max(sum);
            sum -= reads[start].1;
        }
        worst
    }

    #[test]
    fn every_five_second_window_stays_within_ten_per_cent_of_the_cap() {
        let five = Duration::from_secs(5);
        // The floor, a metered link, 256 KiB/s (the benchmark's), a fast link; reads of up to one TLS record or
        // a whole buffer; a network that keeps up, and one that stalls now and then (credit must not pile up).
        for rate in [1024, 32 * 1024, 256 * 1024, 10 << 20] {
            for max_read in [16 * 1024, 64 * 1024] {
                for stall in [Duration::ZERO, Duration::from_millis(700)] {
                    let run = Duration::from_secs(60);
                    let reads = replay(rate, max_read, stall, run);
                    let worst = worst_window(&reads, five);
                    let allowed = rate * 5 + (rate / 4).clamp(1, BURST_MAX_BYTES);
                    assert!(
                        worst <= allowed,
                        "{rate} B/s, reads ≤ {max_read}, stalls {stall:?}: {worst} bytes in a 5-s window, more than {allowed}"
                    );
                    assert!(
                        worst as f64 <= 1.10 * (rate * 5) as f64,
                        "{rate} B/s: {worst} bytes in 5 s"
                    );
                    // Not slower than the cap when the network keeps up (the sleeps' overshoot aside).
                    if stall.is_zero() {
                        let total: u64 = reads.iter().map(|r| r.1).sum();
                        let secs = reads.last().map_or(0.0, |r| r.0.as_secs_f64());
                        let avg = total as f64 / secs;
                        assert!(
                            avg >= 0.97 * rate as f64 && avg <= 1.01 * rate as f64,
                            "{rate} B/s, reads ≤ {max_read}: {avg:.0} B/s on average"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn the_burst_is_small_and_the_bucket_starts_empty() {
        let now = Instant::now();
        let rate = |r: u64| NonZeroU64::new(r).expect("non-zero");
        for (r, capacity) in [
            (1, 1),
            (1024, 256),
            (256 * 1024, 64 * 1024),
            (u64::MAX, BURST_MAX_BYTES),
        ] {
            assert_eq!(TokenBucket::new(rate(r), now).capacity(), capacity, "{r}");
        }
        let mut b = TokenBucket::new(rate(256 * 1024), now);
        // Empty at the start: a quarter of a second until a full read.
        assert_eq!(b.wait(1 << 20, now), Duration::from_millis(250));
        assert_eq!(b.wait(1024, now), Duration::from_nanos(3_906_250));
        // A long idle time fills it only to its capacity.
        let later = now + Duration::from_secs(3600);
        assert_eq!(b.wait(64 * 1024, later), Duration::ZERO);
        b.take(64 * 1024, later);
        assert_eq!(b.wait(64 * 1024, later), Duration::from_millis(250));
        // A read larger than the credit is a debt paid before the next one.
        b.take(128 * 1024, later);
        assert_eq!(b.wait(1, later), Duration::from_nanos(500_003_815));
        // Time going backwards (it does not, with Instant) adds nothing.
        assert_eq!(b.wait(1, now), Duration::from_nanos(500_003_815));
    }

    #[test]
    fn no_cap_reads_as_the_inner_reader_does() {
        let data = vec![7u8; 200_000];
        let mut r = Capped::new(&data[..], None);
        let mut out = Vec::new();
        r.read_to_end(&mut out).expect("read");
        assert_eq!(out, data);
        // With a cap, reads never ask for more than half the bucket's capacity.
        let clock = SimClock::new();
        let mut r = Capped::with_clock(&data[..], NonZeroU64::new(4096), clock.clone());
        let mut buf = vec![0u8; 64 * 1024];
        assert_eq!(r.read(&mut buf).expect("read"), 512);
        let mut out = buf[..512].to_vec();
        r.read_to_end(&mut out).expect("read");
        assert_eq!(out, data);
        // 200,000 bytes at 4,096 B/s: about 48.8 s on the simulated clock.
        let secs = clock.elapsed().as_secs_f64();
        assert!((48.5..49.5).contains(&secs), "{secs}");
    }
}
