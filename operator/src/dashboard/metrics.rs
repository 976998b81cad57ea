//! `/metrics`: the operator's counters ([`crate::metrics`]) and gauges computed at scrape time from the
//! dashboard's caches (devices by agent-upgrade phase and by agent version, workloads by state, rollouts by kind
//! and phase, task runs by phase, alerts by kind, FleetLock reachability), in the OpenMetrics text format that
//! Prometheus scrapes. The fleet's counts are [`fleet_counts`]', the same the overview's bars show.

use super::alerts::AlertKind;
use super::fleet_counts as counts;
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

/// Agent versions exported one by one; the devices of any further version are summed as `other`, so the series
/// stay bounded whatever versions devices report.
pub const VERSION_SERIES: usize = 32;

fn gauge(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

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

    let devices = state.devices.state();
    let mut phases = BTreeMap::new();
    for d in &devices {
        *phases.entry(vec![("phase", phase_name(d))]).or_insert(0) += 1;
    }
    gauge_family(
        &mut registry,
        "fleet_devices",
        "Devices by agent-upgrade phase (`none`: never upgraded)",
        phases,
    );
    gauge_family(
        &mut registry,
        "fleet_devices_by_agent_version",
        "Devices by the agent version they report (`unknown`: none reported yet); the 32 versions with the most \
         devices each, the rest summed as `other`",
        counts::top(&counts::versions(&devices), VERSION_SERIES)
            .into_iter()
            .map(|(v, n)| (vec![("agent_version", v)], gauge(n)))
            .collect(),
    );
    let w = counts::workloads(&devices);
    gauge_family(
        &mut registry,
        "fleet_workloads",
        "Workloads on the fleet by state (running, failed, crash_looping, pending; each counted once: failed \
         leaves the crash-looping out), summed over the Devices' status.workloads",
        w.by_state()
            .into_iter()
            .map(|(s, n)| (vec![("state", s.replace('-', "_"))], gauge(n)))
            .collect(),
    );
    gauge_family(
        &mut registry,
        "fleet_agents_crash_looping",
        "Devices whose agent is crash-looping now (3 or more automatic restarts, the latest within 10 minutes)",
        BTreeMap::from([(
            vec![],
            gauge(counts::agents_crash_looping(
                &devices,
                fleet_wire::Timestamp::now(),
            )),
        )]),
    );
    gauge_family(
        &mut registry,
        "fleet_rollouts",
        "AgentReleases and FleetDeployments by kind and rollout phase (`none`: no rollout status)",
        counts::rollout_phases(&state.releases.state(), &state.deployments.state())
            .into_iter()
            .map(|((k, p), n)| (vec![("kind", k.to_owned()), ("phase", p)], gauge(n)))
            .collect(),
    );

    // Liveness as the dashboard and the silence alert see it (the heartbeat mirror): the age of each device's
    // latest heartbeat, by quantile; devices that never beat are left out.
    let now = fleet_wire::Timestamp::now();
    let mut ages: Vec<i64> = devices
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
        "Whether the FleetLock server's /v1/status was read at the last try: 1 yes, 0 no (absent: none configured)",
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
    use super::{render, AlertKind, State, VERSION_SERIES};
    use serde_json::{json, Value};
    use std::sync::RwLock;

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

    /// A State holding `objs` in its caches, as the watches would fill them.
    fn store<K>(objs: Vec<serde_json::Value>) -> kube::runtime::reflector::Store<K>
    where
        K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned,
    {
        let (reader, mut writer) = kube::runtime::reflector::store::<K>();
        for o in objs {
            let k: K = serde_json::from_value(o).expect("object");
            writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(k));
        }
        reader
    }

    fn obj(kind: &str, name: &str, spec: Value, status: Value) -> Value {
        json!({"apiVersion": "fleet.nationtech.io/v1alpha1", "kind": kind, "metadata": {"name": name},
               "spec": spec, "status": status})
    }

    fn rollout(phase: &str) -> Value {
        json!({"rollout": {"phase": phase, "updated": 0, "healthy": 0, "soaking": 0, "updating": 1,
                           "stalled": 0, "failed": 0, "pending": 0}})
    }

    /// The fleet's gauges from hand-built caches: devices by agent version (capped, the rest as `other`),
    /// workloads by state, rollouts by kind and phase (every phase present); and every HELP line of the whole
    /// exposition is one sentence ending in one period.
    #[test]
    fn fleet_gauges_count_the_caches_and_help_lines_are_sentences() {
        let mut devices = vec![
            obj(
                "Device",
                "a",
                json!({}),
                json!({"agentVersion": "2.0.0",
                "workloads": {"running": 3, "failed": 2, "pending": 0, "crashLooping": 1},
                "agentRestarts": {"count": 4, "since": fleet_wire::Timestamp::now().to_string()}}),
            ),
            obj(
                "Device",
                "b",
                json!({}),
                json!({"agentVersion": "2.0.0",
                "workloads": {"running": 4, "failed": 0, "pending": 2},
                "agentRestarts": {"count": 4, "since": "2026-12-01T10:00:00Z"}}),
            ),
            obj(
                "Device",
                "c",
                json!({}),
                json!({"agentVersion": "1.0.0", "lastHeartbeat": "2026-12-01T10:00:00Z"}),
            ),
            obj("Device", "c2", json!({}), json!({"agentVersion": "1.0.0"})),
            obj("Device", "d", json!({}), Value::Null),
            obj("Device", "d2", json!({}), Value::Null),
        ];
        // 40 more versions on one device each: past the cap, they are `other`.
        for v in 0..40 {
            devices.push(obj(
                "Device",
                &format!("x{v}"),
                json!({}),
                json!({"agentVersion": format!("0.{v}.0")}),
            ));
        }
        let release_spec = json!({"allowedGroups": ["g"], "builds": []});
        let deployment_spec = json!({"allowedGroups": ["g"], "workloads": []});
        let state = State {
            devices: store(devices),
            groups: store(vec![]),
            diagnostics: store(vec![]),
            runs: store(vec![json!({
                "apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "TaskRun",
                "metadata": {"name": "nightly", "namespace": "ops"},
                "spec": {"allowedGroups": ["g"], "deadlineSeconds": 600, "systemUpgradeV1": {}},
                "status": {"phase": "Running", "targets": 2, "succeeded": 0, "failed": 0}
            })]),
            releases: store(vec![
                obj(
                    "AgentRelease",
                    "r1",
                    release_spec.clone(),
                    rollout("Halted"),
                ),
                obj(
                    "AgentRelease",
                    "r2",
                    release_spec.clone(),
                    rollout("Complete"),
                ),
                obj("AgentRelease", "r3", release_spec, rollout("Complete")),
            ]),
            deployments: store(vec![
                obj(
                    "FleetDeployment",
                    "d1",
                    deployment_spec.clone(),
                    rollout("Soaking"),
                ),
                obj("FleetDeployment", "d2", deployment_spec, json!({})),
            ]),
            heartbeats: crate::kv::Mirror::new(fleet_wire::kv::DEVICE_HEARTBEAT),
            workloads: crate::kv::Mirror::new(fleet_wire::kv::WORKLOAD_STATUS),
            info: crate::kv::Mirror::new(fleet_wire::kv::DEVICE_INFO),
            nats: RwLock::new(None),
            fleetlock: RwLock::new(Some(crate::dashboard::state::FleetLockView {
                fetched_at: fleet_wire::Timestamp::now(),
                status: Err("unreachable".into()),
            })),
            alerts: RwLock::new(vec![]),
            thresholds: Default::default(),
            version_history: Default::default(),
        };
        // Counter families without a series print no HELP: give each one (process-wide counters; no other test
        // reads these).
        crate::metrics::rollout_halted("AgentRelease", "CanaryFailed");
        crate::metrics::writes_refused("device-info", "too-large", 1);
        crate::metrics::device_write("status", std::time::Duration::from_millis(3));
        let out = render(&state);
        let value = |series: &str| -> i64 {
            out.lines()
                .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
                .unwrap_or_else(|| panic!("no {series} in:\n{out}"))
        };
        assert_eq!(
            value("fleet_devices_by_agent_version{agent_version=\"2.0.0\"}"),
            2
        );
        assert_eq!(
            value("fleet_devices_by_agent_version{agent_version=\"1.0.0\"}"),
            2
        );
        assert_eq!(
            value("fleet_devices_by_agent_version{agent_version=\"unknown\"}"),
            2
        );
        // 43 versions: the 32 largest (the three with two devices, then 29 one-device versions by name), the other
        // 11 summed.
        assert_eq!(
            value("fleet_devices_by_agent_version{agent_version=\"other\"}"),
            11
        );
        let series = out
            .lines()
            .filter(|l| l.starts_with("fleet_devices_by_agent_version{"))
            .count();
        assert_eq!(series, VERSION_SERIES + 1, "{out}");
        let sum: i64 = out
            .lines()
            .filter(|l| l.starts_with("fleet_devices_by_agent_version{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<i64>().ok())
            .sum();
        assert_eq!(sum, 46, "every device counted once");
        for (s, n) in [
            ("running", 7),
            ("failed", 1),
            ("crash_looping", 1),
            ("pending", 2),
        ] {
            assert_eq!(
                value(&format!("fleet_workloads{{state=\"{s}\"}}")),
                n,
                "{s}"
            );
        }
        for (kind, phase, n) in [
            ("AgentRelease", "Halted", 1),
            ("AgentRelease", "Complete", 2),
            ("AgentRelease", "Progressing", 0),
            ("AgentRelease", "none", 0),
            ("FleetDeployment", "Soaking", 1),
            ("FleetDeployment", "none", 1),
            ("FleetDeployment", "Failed", 0),
        ] {
            let s = format!("fleet_rollouts{{kind=\"{kind}\",phase=\"{phase}\"}}");
            assert_eq!(value(&s), n, "{s}");
        }
        assert_eq!(
            out.lines()
                .filter(|l| l.starts_with("fleet_rollouts{"))
                .count(),
            12
        );
        assert_eq!(value("fleet_fleetlock_status_up"), 0);
        // one agent restarted 4 times just now; the other's restarts are long past
        assert_eq!(value("fleet_agents_crash_looping"), 1);
        let help: Vec<&str> = out.lines().filter(|l| l.starts_with("# HELP")).collect();
        let families = out.lines().filter(|l| l.starts_with("# TYPE")).count();
        assert_eq!(help.len(), families, "every family has a HELP line: {out}");
        assert_eq!(families, 18, "every family shows: {out}");
        for l in help {
            assert!(l.ends_with('.') && !l.ends_with(".."), "{l}");
            let text = l.splitn(4, ' ').nth(3).unwrap_or_default();
            assert!(text.starts_with(char::is_uppercase), "a sentence: {l}");
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
        // A command an annotation tells a person to run is one the product has, with an option it has: the
        // rollback-failed repair is the one the dashboard's own text names, and a program followed by an option
        // (`fleet-x --y`) is one of these.
        let repair = AlertKind::RollbackFailed
            .action()
            .split('`')
            .find(|s| s.contains("--repair-rollback-failed"))
            .expect("the dashboard names the repair command");
        let commands = [repair];
        assert!(
            text.contains(repair),
            "the rules name the dashboard's repair `{repair}`"
        );
        // (Spelled in two parts so a grep for the old, wrong command finds nothing in the tree.)
        assert!(!text.contains(concat!("fleet-updater ", "--repair-rollback-failed")));
        for r in rules {
            for (_, v) in r["annotations"].as_object().into_iter().flatten() {
                let v = v.as_str().expect("an annotation is text");
                for (i, _) in v.match_indices(" --") {
                    let Some(start) = v[..i].rfind("fleet-") else {
                        continue;
                    };
                    if v[start..i].contains(' ') {
                        continue;
                    }
                    let end = v[i + 1..]
                        .find([' ', '.', ',', ';', ')', '`'])
                        .map_or(v.len(), |e| i + 1 + e);
                    let command = &v[start..end];
                    assert!(
                        commands.contains(&command),
                        "{command} in {v} is no command the product has"
                    );
                }
            }
        }
    }
}
