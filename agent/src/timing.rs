//! Step marks on the deploy path (watch delivery, decode, reconcile decision, libpod calls), logged at DEBUG on
//! their own target so that `scripts/bench agent` can print where the time between a KV put and a running
//! container goes. Off by default; `RUST_LOG=info,fleet_agent::timing=debug` turns them on. Nothing acts on them.

use std::time::{SystemTime, UNIX_EPOCH};

/// The log target of the marks.
pub const TARGET: &str = "fleet_agent::timing";

/// Logs `step` for `key` (a revision `rev=<n>` or a workload `workload=<name>`) with the wall-clock time in
/// microseconds since the Unix epoch: the benchmark compares it with its own clock on the same machine.
pub fn mark(step: &str, key: std::fmt::Arguments<'_>) {
    if log::log_enabled!(target: TARGET, log::Level::Debug) {
        let us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros())
            .unwrap_or(0);
        log::debug!(target: TARGET, "mark {step} {key} unix_us={us}");
    }
}
