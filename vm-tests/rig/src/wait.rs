//! The tests' one way of waiting for something: poll a check until it holds or a deadline passes. Blocking
//! ([`wait_for`], [`eventually`], [`eventually_seen`]) and async ([`eventually_async`]) waits share [`Poll`]: the
//! same pause between checks and the same deadline, and a failure says what was awaited, for how long, how many
//! checks were made and (with [`eventually_seen`]) the last value seen.

use std::fmt::Debug;
use std::time::{Duration, Instant};

/// The pause between two checks: short enough that a wait ends within a few ms of what it waits for, long enough
/// that a check (a KV read, an API request) costs the 2 shared cores little. A check that starts a process
/// (kubectl) waits longer between tries: [`poll_every`].
pub const PAUSE: Duration = Duration::from_millis(20);

/// One wait's clock: its deadline and the checks made so far.
#[derive(Debug)]
pub struct Poll {
    start: Instant,
    timeout: Duration,
    every: Duration,
    checks: u32,
}

impl Poll {
    /// A wait of at most `timeout` from now, a check every [`PAUSE`].
    pub fn new(timeout: Duration) -> Self {
        Self::every(timeout, PAUSE)
    }

    /// A wait of at most `timeout` from now, a check every `every`.
    pub fn every(timeout: Duration, every: Duration) -> Self {
        Self {
            start: Instant::now(),
            timeout,
            every,
            checks: 0,
        }
    }

    /// Counts a check that did not hold; the pause before the next one, or `None` when the deadline has passed
    /// (the last check was made at or after it).
    pub fn next_pause(&mut self) -> Option<Duration> {
        self.checks += 1;
        let left = self.timeout.checked_sub(self.start.elapsed())?;
        if left.is_zero() {
            return None;
        }
        // The last check falls on the deadline, not a pause after it.
        Some(self.every.min(left))
    }

    /// The wait's failure: how long it took and how many checks it made, with the last value seen.
    pub fn timed_out<S>(&self, last: S) -> TimedOut<S> {
        TimedOut {
            waited: self.start.elapsed(),
            checks: self.checks,
            every: self.every,
            last,
        }
    }
}

/// A wait that ended without its check holding.
#[derive(Debug)]
pub struct TimedOut<S> {
    /// How long it waited.
    pub waited: Duration,
    /// How many checks it made.
    pub checks: u32,
    /// The pause between two of them.
    pub every: Duration,
    /// What the last check saw.
    pub last: S,
}

impl<S: Debug> TimedOut<S> {
    /// `<what>: not within <waited> (<n> checks); last seen: <last>`.
    pub fn message(&self, what: &str) -> String {
        format!(
            "{what}: not within {:.1?} ({} checks, one every {:?}); last seen: {:?}",
            self.waited, self.checks, self.every, self.last
        )
    }
}

/// Nothing to show: what an `Option` check saw when it returned `None`.
#[derive(Debug)]
pub struct Nothing;

/// Runs `check` every [`PAUSE`] until it returns `Ok`, at most `timeout` (and once more at the deadline):
/// its value, or how the wait went and the last `Err` seen.
pub fn poll<T, S>(
    timeout: Duration,
    check: impl FnMut() -> Result<T, S>,
) -> Result<T, TimedOut<S>> {
    poll_every(timeout, PAUSE, check)
}

/// [`poll`] with a check every `every` (a check that starts a process: kubectl).
pub fn poll_every<T, S>(
    timeout: Duration,
    every: Duration,
    mut check: impl FnMut() -> Result<T, S>,
) -> Result<T, TimedOut<S>> {
    let mut p = Poll::every(timeout, every);
    loop {
        match check() {
            Ok(v) => return Ok(v),
            Err(last) => match p.next_pause() {
                Some(pause) => std::thread::sleep(pause),
                None => return Err(p.timed_out(last)),
            },
        }
    }
}

/// Polls `check` until it returns `Some` or `timeout` passes (`None`: the caller says what failed).
pub fn wait_for<T>(timeout: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
    poll(timeout, || check().ok_or(Nothing)).ok()
}

/// Polls `check` until it returns `Some`; fails the test after `timeout`, naming `what`.
pub fn eventually<T>(what: &str, timeout: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    poll(timeout, || check().ok_or(Nothing)).unwrap_or_else(|t| panic!("{}", t.message(what)))
}

/// Polls `check` until it returns `Ok`; fails the test after `timeout`, naming `what` and the last `Err` seen.
pub fn eventually_seen<T, S: Debug>(
    what: &str,
    timeout: Duration,
    check: impl FnMut() -> Result<T, S>,
) -> T {
    poll(timeout, check).unwrap_or_else(|t| panic!("{}", t.message(what)))
}

/// [`eventually`] for an async check (a Kubernetes API request), pausing with the caller's Tokio runtime.
pub async fn eventually_async<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let mut p = Poll::new(timeout);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        match p.next_pause() {
            Some(pause) => tokio::time::sleep(pause).await,
            None => panic!("{}", p.timed_out(Nothing).message(what)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_check_that_holds_on_the_third_try_is_waited_for() {
        let mut n = 0;
        let v = eventually("three", Duration::from_secs(5), || {
            n += 1;
            (n == 3).then_some(n)
        });
        assert_eq!(v, 3);
    }

    #[test]
    fn a_timeout_says_what_how_long_and_the_last_value() {
        let mut n = 0;
        let t = poll(Duration::from_millis(100), || -> Result<(), u32> {
            n += 1;
            Err(n)
        })
        .expect_err("never holds");
        assert!(t.waited >= Duration::from_millis(100), "{t:?}");
        assert_eq!(t.last, t.checks, "{t:?}");
        let m = t.message("the count");
        assert!(m.starts_with("the count: not within "), "{m}");
        assert!(m.ends_with(&format!("last seen: {}", t.last)), "{m}");
        assert!(wait_for(Duration::ZERO, || None::<()>).is_none());
    }

    #[test]
    fn the_async_wait_pauses_on_the_callers_runtime() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("rt");
        let mut n = 0;
        let v = rt.block_on(eventually_async("two", Duration::from_secs(5), || {
            n += 1;
            let v = n;
            async move { (v == 2).then_some(v) }
        }));
        assert_eq!(v, 2);
    }
}
