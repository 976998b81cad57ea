//! Fault injection for restart tests: named crash points in the TaskRun controller. Without the `fault-injection`
//! feature every check is a no-op; with it, `FLEET_OPERATOR_CRASH_AT=<point>` aborts the whole process there (no
//! clean-up runs, as with SIGKILL).

/// Every crash point.
pub const POINTS: &[&str] = &[
    // the plan's manifest is created; the run's status still says Planning
    "plan-created",
    // half of one release's intents are sent, the other half not
    "mid-release",
];

/// Aborts the process if `point` is the configured crash point.
pub fn crash_point(point: &'static str) {
    #[cfg(feature = "fault-injection")]
    if std::env::var("FLEET_OPERATOR_CRASH_AT").is_ok_and(|p| p == point) {
        log::error!("crashing at injected fault point {point}");
        std::process::abort();
    }
    let _ = point;
}

/// Aborts the process at `mid-release` before intent number `started` (from 0) of `total` is sent, once half are.
pub fn mid_release(started: usize, total: usize) {
    if started * 2 >= total {
        crash_point("mid-release");
    }
}
