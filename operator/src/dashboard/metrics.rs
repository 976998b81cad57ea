//! `/metrics`: the operator's counters ([`crate::metrics`]) and gauges computed at scrape time from the
//! dashboard's caches (devices by agent-upgrade phase, task runs by phase, alerts by kind, FleetLock reachability),
//! in the OpenMetrics text format that Prometheus scrapes.

use super::alerts::AlertKind;
use super::overview::{phase_name, run_phase_name};
use super::state::State;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::collections::BTreeMap;

/// The content type of [`render`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

type Labels = Vec<(&'static str, String)>;

fn gauge_family(registry: &mut Registry, name: &str, help: &str, values: BTreeMap<Labels, i64>) {
    let f = Family::<Labels, Gauge>::default();
    for (labels, v) in values {
        f.get_or_create(&labels).set(v);
    }
    registry.register(name, help, f);
}

/// The operator's own counters ([`crate::metrics`]). The library adds the period that ends each HELP text, so
/// the texts here end without one.
fn register_counters(registry: &mut Registry) {
    let m = crate::metrics::global();
    registry.register(
        "fleet_operator_reconciles",
        "Reconcile passes per controller",
        m.reconciles.clone(),
    );
    registry.register(
        "fleet_operator_reconcile_errors",
        "Reconcile passes that ended with an error, per controller",
        m.reconcile_errors.clone(),
    );
    registry.register(
        "fleet_operator_nats_write_duration_seconds",
        "Latency of one NATS KV compare-and-set write, re-reads included",
        m.nats_write_seconds.clone(),
    );
    registry.register(
        "fleet_operator_rollout_halts",
        "Rollouts that halted (condition Halted turned True), per kind and reason",
        m.rollout_halts.clone(),
    );
    registry.register(
        "fleet_device_writes_refused",
        "Device writes fleet-auth refused (over the device's share), per bucket and kind; the Device is in \
         kubectl get fdev (column Refused) and its WritesRefused events",
        m.writes_refused.clone(),
    );
    registry.register(
        "fleet_operator_device_writes_waiting",
        "Device creations and status writes waiting for the API server (a backlog that grows means the API \
         server cannot keep up; desired-state and intent writes do not wait for it)",
        m.device_writes_waiting.clone(),
    );
    registry.register(
        "fleet_operator_device_write_duration_seconds",
        "Latency of one Device creation or status write at the API server, per kind (create, status)",
        m.device_write_seconds.clone(),
    );
    registry.register(
        "fleet_operator_pass_duration_seconds",
        "Duration of one deployments-controller pass: deciding from the caches and mirrors, then its NATS writes \
         and the status writes of groups, deployments and releases (Device writes are off the pass)",
        m.pass_seconds.clone(),
    );
}

/// The whole exposition.
pub fn render(state: &State) -> String {
    let mut registry = Registry::default();
    register_counters(&mut registry);
    let refusing = state
        .devices
        .state()
        .iter()
        .filter(|d| {
            d.status
                .as_ref()
                .is_some_and(|s| s.writes_refused.is_some())
        })
        .count();
    gauge_family(
        &mut registry,
        "fleet_devices_writes_refused",
        "Devices with writes refused within the last hour (status.writesRefused)",
        BTreeMap::from([(vec![], i64::try_from(refusing).unwrap_or(i64::MAX))]),
    );

    let mut phases = BTreeMap::new();
    for d in state.devices.state() {
        *phases.entry(vec![("phase", phase_name(&d))]).or_insert(0) += 1;
    }
    gauge_family(
        &mut registry,
        "fleet_devices",
        "Devices by agent-upgrade phase (`none`: never upgraded)",
        phases,
    );

    // Liveness as the dashboard and the silence alert see it (the heartbeat mirror): the age of each device's
    // latest heartbeat, by quantile; devices that never beat are left out.
    let now = fleet_wire::Timestamp::now();
    let mut ages: Vec<i64> = state
        .devices
        .state()
        .iter()
        .filter_map(|d| state.last_heartbeat(d))
        .map(|t| i64::try_from(now.since(t).as_secs()).unwrap_or(i64::MAX))
        .collect();
    ages.sort_unstable();
    let quantiles: BTreeMap<Labels, i64> = [("0.5", 0.5), ("0.99", 0.99), ("1", 1.0)]
        .into_iter()
        .filter_map(|(label, q)| {
            let i = ((ages.len() as f64 * q).ceil() as usize).checked_sub(1)?;
            Some((vec![("quantile", label.to_string())], *ages.get(i)?))
        })
        .collect();
    gauge_family(
        &mut registry,
        "fleet_device_heartbeat_age_seconds",
        "Age of each device's latest heartbeat as the dashboard and the silence alert see it, by quantile over \
         the devices that have sent one (device clocks)",
        quantiles,
    );

    let mut runs = BTreeMap::new();
    for r in state.runs.state() {
        *runs.entry(vec![("phase", run_phase_name(&r))]).or_insert(0) += 1;
    }
    gauge_family(&mut registry, "fleet_task_runs", "TaskRuns by phase", runs);

    let alerts = state.alerts();
    let mut by_kind: BTreeMap<Labels, i64> = AlertKind::ALL
        .iter()
        .map(|k| (vec![("alert", k.as_str().to_owned())], 0))
        .collect();
    for a in &alerts {
        *by_kind
            .entry(vec![("alert", a.kind.as_str().to_owned())])
            .or_insert(0) += 1;
    }
    gauge_family(
        &mut registry,
        "fleet_alerts",
        "Alerts that hold now, by kind (the dashboard's /alerts page lists them)",
        by_kind,
    );
    let mut fl = BTreeMap::new();
    if let Some(v) = state.fleetlock() {
        fl.insert(vec![], i64::from(v.status.is_ok()));
    }
    gauge_family(
        &mut registry,
        "fleet_fleetlock_status_up",
        "1 when the FleetLock server's /v1/status was read at the last try, 0 when not (absent: none configured)",
        fl,
    );

    let mut out = String::with_capacity(8 * 1024);
    if let Err(e) = encode(&mut out, &registry) {
        log::warn!("metrics: {e}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::AlertKind;

    /// Every counter is exported from the start (errors at 0 per controller, so a rate or an alert on it has a
    /// series before the first error), and no HELP text ends with two periods.
    #[test]
    fn counters_start_at_zero_and_help_texts_end_once() {
        let mut registry = prometheus_client::registry::Registry::default();
        super::register_counters(&mut registry);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).expect("encodes");
        for c in crate::metrics::CONTROLLERS {
            let line = format!("fleet_operator_reconcile_errors_total{{controller=\"{c}\"}} ");
            assert!(out.contains(&line), "{line:?} missing:\n{out}");
        }
        let help: Vec<&str> = out.lines().filter(|l| l.starts_with("# HELP")).collect();
        assert!(help.len() >= 3, "{out}");
        for l in help {
            assert!(l.ends_with('.') && !l.ends_with(".."), "{l}");
        }
    }

    /// The example rules (docs/dashboard/prometheus-rules.yaml) name only metrics and alert kinds that exist.
    #[test]
    fn example_rules_name_real_metrics() {
        let text = include_str!("../../../docs/dashboard/prometheus-rules.yaml");
        let doc: serde_json::Value = serde_yaml_ng::from_str(text).expect("rules are YAML");
        let known = [
            "fleet_alerts",
            "fleet_fleetlock_status_up",
            "fleet_operator_reconcile_errors_total",
            "fleet_device_writes_refused_total",
            "fleet_operator_nats_write_duration_seconds_bucket",
            "up",
        ];
        let rules = doc["groups"][0]["rules"].as_array().expect("rules");
        assert!(rules.len() >= AlertKind::ALL.len());
        for r in rules {
            let expr = r["expr"].as_str().expect("expr");
            assert!(
                known
                    .iter()
                    .any(|m| expr.contains(&format!("{m}{{")) || expr.contains(&format!("({m}"))),
                "{expr} names no exported metric"
            );
            if let Some(kind) = expr
                .split("alert=\"")
                .nth(1)
                .and_then(|s| s.split('"').next())
            {
                assert!(AlertKind::ALL.iter().any(|k| k.as_str() == kind), "{kind}");
            }
        }
        for k in AlertKind::ALL {
            assert!(
                text.contains(&format!("alert=\"{}\"", k.as_str())),
                "{k:?} has no rule"
            );
        }
    }
}
