//! The operator's own counters, kept process-wide so that every controller can count without a handle: reconcile
//! passes and their errors per controller, and the latency of NATS KV writes. The dashboard's `/metrics` exposes
//! them (with gauges it computes at scrape time) in the Prometheus/OpenMetrics text format.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use std::sync::OnceLock;
use std::time::Duration;

/// Labels of one controller's counters: `controller="…"`.
pub type ControllerLabels = Vec<(&'static str, &'static str)>;

/// The process-wide counters.
pub struct OperatorMetrics {
    /// Reconcile passes, per controller.
    pub reconciles: Family<ControllerLabels, Counter>,
    /// Reconcile passes that ended with an error, per controller.
    pub reconcile_errors: Family<ControllerLabels, Counter>,
    /// Seconds one NATS KV write took (compare-and-set, including re-reads after a lost race).
    pub nats_write_seconds: Histogram,
    /// Rollouts that halted (condition `Halted` turned True), per kind and reason.
    pub rollout_halts: Family<HaltLabels, Counter>,
    /// Device writes fleet-auth refused, per bucket and kind (no device label: bounded for any fleet size).
    pub writes_refused: Family<RefusalLabels, Counter>,
    /// Device creations and status writes waiting for the API server ([`crate::deployments::device_writes`]).
    pub device_writes_waiting: prometheus_client::metrics::gauge::Gauge,
    /// Seconds one Device creation or status write took at the API server, per kind (`create`, `status`).
    pub device_write_seconds: Family<DeviceWriteLabels, Histogram>,
    /// Seconds one pass of the deployments controller took (decide, then its NATS and status writes; Device
    /// writes are off the pass).
    pub pass_seconds: Histogram,
}

/// Labels of a Device write: `kind="create"` or `kind="status"`.
pub type DeviceWriteLabels = Vec<(&'static str, &'static str)>;

fn latency_buckets() -> Histogram {
    // 0.5 ms … about 8 s
    Histogram::new(exponential_buckets(0.0005, 2.0, 15))
}

/// Labels of refused writes: `bucket="device-info", kind="too-large"` (both from fixed sets).
pub type RefusalLabels = Vec<(&'static str, &'static str)>;

/// Labels of a halt: `kind="AgentRelease", reason="CanaryFailed"`.
pub type HaltLabels = Vec<(&'static str, String)>;

/// The controllers that count their passes ([`reconciled`]).
pub const CONTROLLERS: [&str; 2] = ["deployments", "taskruns"];

/// The counters of this process. Each controller's series exist from the start at 0, so that a rate or an alert
/// on errors has a series before the first error.
pub fn global() -> &'static OperatorMetrics {
    static M: OnceLock<OperatorMetrics> = OnceLock::new();
    M.get_or_init(|| {
        let m = OperatorMetrics {
            reconciles: Family::default(),
            reconcile_errors: Family::default(),
            nats_write_seconds: latency_buckets(),
            rollout_halts: Family::default(),
            writes_refused: Family::default(),
            device_writes_waiting: Default::default(),
            device_write_seconds: Family::new_with_constructor(
                latency_buckets as fn() -> Histogram,
            ),
            pass_seconds: latency_buckets(),
        };
        for c in CONTROLLERS {
            let labels = vec![("controller", c)];
            let _ = m.reconciles.get_or_create(&labels);
            let _ = m.reconcile_errors.get_or_create(&labels);
        }
        m
    })
}

/// Counts one reconcile pass of `controller` (one of [`CONTROLLERS`]); `ok`: it ended without an error.
pub fn reconciled(controller: &'static str, ok: bool) {
    let labels = vec![("controller", controller)];
    let m = global();
    m.reconciles.get_or_create(&labels).inc();
    if !ok {
        m.reconcile_errors.get_or_create(&labels).inc();
    }
}

/// Records how long one NATS write took.
pub fn nats_write(took: Duration) {
    global().nats_write_seconds.observe(took.as_secs_f64());
}

/// Counts one rollout halt of an object of `kind` for `reason` (once per halt: when `Halted` turns True).
pub fn rollout_halted(kind: &str, reason: &str) {
    let labels = vec![("kind", kind.to_owned()), ("reason", reason.to_owned())];
    global().rollout_halts.get_or_create(&labels).inc();
}

/// Counts `n` refused device writes of `bucket` and `kind` (from [`crate::refusals`]' fixed label sets).
pub fn writes_refused(bucket: &'static str, kind: &'static str, n: u64) {
    let labels = vec![("bucket", bucket), ("kind", kind)];
    global().writes_refused.get_or_create(&labels).inc_by(n);
}

/// Sets how many Device writes wait for the API server.
pub fn device_writes_waiting(n: usize) {
    global()
        .device_writes_waiting
        .set(i64::try_from(n).unwrap_or(i64::MAX));
}

/// Records one Device write of `kind` (`create` or `status`) and how long the API server took.
pub fn device_write(kind: &'static str, took: Duration) {
    global()
        .device_write_seconds
        .get_or_create(&vec![("kind", kind)])
        .observe(took.as_secs_f64());
}

/// Records how long one deployments-controller pass took.
pub fn pass(took: Duration) {
    global().pass_seconds.observe(took.as_secs_f64());
}
