//! Fault injection: named crash points at every durable step. Without the `fault-injection` feature every check
//! is a no-op; with it, a test (constructor argument) or the daemon (`FLEET_UPDATER_CRASH_AT`) picks one point.

/// Every crash point, in transaction order.
pub const POINTS: &[&str] = &[
    "journal-preparing",
    "fetched",
    "installed",
    "probed",
    "journal-activating",
    "stopped",
    "link-switched",
    "started",
    "journal-committed",
    "journal-rolling-back",
    "link-restored",
    "rollback-stopped",
    "rollback-started",
    "journal-failed",
    "journal-rollback-failed",
];

/// The system-upgrade transaction's crash points, in order (their own list: `POINTS` is the agent-upgrade
/// transaction's crash table).
pub const SYSTEM_POINTS: &[&str] = &["system-journal-upgrading", "system-upgraded"];

fn known(point: &str) -> bool {
    POINTS.contains(&point) || SYSTEM_POINTS.contains(&point)
}

/// The transaction stopped dead at a crash point: nothing after it ran, nothing was cleaned up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("crashed at injected fault point {0}")]
pub struct Crashed(pub &'static str);

/// Where (if anywhere) to crash.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    #[cfg(feature = "fault-injection")]
    point: Option<String>,
    #[cfg(feature = "fault-injection")]
    abort_process: bool,
}

impl Faults {
    /// No crash points.
    pub fn none() -> Self {
        Self::default()
    }

    /// Stop the transaction dead at `point` (tests).
    #[cfg(feature = "fault-injection")]
    pub fn crash_at(point: &str) -> Self {
        assert!(known(point), "unknown crash point {point}");
        Self {
            point: Some(point.into()),
            abort_process: false,
        }
    }

    /// The daemon's faults: `FLEET_UPDATER_CRASH_AT=<point>` aborts the whole process there (whole-device tests).
    pub fn from_env() -> Self {
        #[cfg(feature = "fault-injection")]
        if let Ok(p) = std::env::var("FLEET_UPDATER_CRASH_AT") {
            return Self {
                point: Some(p),
                abort_process: true,
            };
        }
        Self::default()
    }

    /// Passes unless `point` is the chosen crash point.
    #[inline]
    pub fn check(&self, point: &'static str) -> Result<(), Crashed> {
        debug_assert!(known(point), "unlisted crash point {point}");
        #[cfg(feature = "fault-injection")]
        if self.point.as_deref() == Some(point) {
            log::error!("fault injection: crashing at {point}");
            if self.abort_process {
                std::process::abort();
            }
            return Err(Crashed(point));
        }
        Ok(())
    }
}
