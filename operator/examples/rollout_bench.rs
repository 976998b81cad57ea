//! Benchmark (run by `scripts/bench.d/52-rollout.sh`): one pass of the rollout planner ([`rollout::plan`]) over
//! 100,000 devices in a few positions of a staged rollout, next to the same devices without a `rollout` section
//! (the cost of staging itself). Each case is measured `FLEET_BENCH_RUNS` times (default 5); the table gives
//! medians in milliseconds per pass. A second table does the same for a FleetDeployment through the whole pass
//! ([`plan::plan`]): its own path reads each device's desired-state key and workload report
//! ([`fleet_operator::deployments::rollout_workloads::observe`]) and keeps the previous spec for the devices it holds back.
//! Pure computation: no NATS, no Kubernetes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use fleet_operator::crd::{Device, DeviceGroup, FleetDeployment, RolloutSpec};
use fleet_operator::deployments::plan::{self, Snapshot};
use fleet_operator::fleet::rollout::{self, Observed, Policy, Target};
use fleet_wire::{
    AttemptId, DesiredState, DeviceId, DeviceWorkloadStatus, Timestamp, WorkloadSpec,
    WorkloadState, WorkloadStatus,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use std::sync::Arc;
use std::time::Instant;

const DEVICES: usize = 100_000;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// `DEVICES` targets, one in 1,000 a canary; `state(i)` says what NATS reports for device `i`.
fn targets(state: impl Fn(usize) -> Observed) -> Vec<Target> {
    (0..DEVICES)
        .map(|i| Target {
            id: DeviceId::try_from(format!("dev-{i:06}")).unwrap(),
            canary: i % 1000 == 0,
            observed: state(i),
            last_heartbeat: Some(Timestamp::now()),
            low_space: None,
        })
        .collect()
}

fn main() {
    let runs: usize = std::env::var("FLEET_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let now = Timestamp::now();
    let committed = Observed::Committed {
        at: Timestamp::from_unix_ms(now.unix_ms() - 600_000),
        agent_started: Some(Timestamp::from_unix_ms(now.unix_ms() - 601_000)),
        heartbeat: Some(now),
        restarts: Some(0),
    };
    let staged = Policy::from_spec(Some(&RolloutSpec {
        soak_seconds: Some(300),
        max_unavailable: Some(IntOrString::String("10%".into())),
        max_failures: Some(IntOrString::String("1%".into())),
        heartbeat_timeout_seconds: None,
    }))
    .unwrap();
    let cases: Vec<(&str, Vec<Target>)> = vec![
        (
            "start: every device pending",
            targets(|_| Observed::Pending),
        ),
        (
            "middle: half healthy, 10% updating, the rest pending",
            targets(|i| match i % 10 {
                0..=4 => committed,
                5 => Observed::Updating(None),
                _ => Observed::Pending,
            }),
        ),
        ("end: every device healthy", targets(|_| committed)),
    ];
    println!("| {DEVICES} devices, one pass | staged (ms) | no rollout section (ms) | staged / unstaged |");
    println!("|---|---|---|---|");
    for (name, t) in &cases {
        let measure = |policy: &Policy| {
            let mut v: Vec<f64> = (0..runs)
                .map(|_| {
                    let start = Instant::now();
                    let out = rollout::plan(t, policy, now);
                    std::hint::black_box(&out);
                    start.elapsed().as_secs_f64() * 1000.0
                })
                .collect();
            median(&mut v)
        };
        let (s, u) = (measure(&staged), measure(&Policy::ALL_AT_ONCE));
        println!(
            "| {name} | {s:.1} | {u:.1} | {:.2} |",
            s / u.max(f64::MIN_POSITIVE)
        );
    }
    deployments(runs, now);
}

/// A FleetDeployment of one workload on every device (one in 1,000 a canary), changed from `web:1` to `web:2`.
fn deployment(staged: bool) -> Arc<FleetDeployment> {
    let mut spec = serde_json::json!({"allowedGroups": ["all"],
        "workloads": [{"name": "web", "image": "registry.example.com/web:2"}]});
    if staged {
        spec["rollout"] =
            serde_json::json!({"soakSeconds": 300, "maxUnavailable": "10%", "maxFailures": "1%"});
    }
    Arc::new(
        serde_json::from_value(
            serde_json::json!({"apiVersion": "fleet.nationtech.io/v1alpha1",
            "kind": "FleetDeployment", "metadata": {"name": "web", "generation": 2}, "spec": spec}),
        )
        .unwrap(),
    )
}

fn workload(image: &str) -> WorkloadSpec {
    serde_json::from_value(serde_json::json!({"name": "web", "image": image})).unwrap()
}

/// Device `i` has the new spec in its key (`updated`) and reports it running since 10 minutes, or the old one.
fn snapshot(updated: impl Fn(usize) -> bool, staged: bool, now: Timestamp) -> Snapshot {
    let (old, new) = (
        workload("registry.example.com/web:1"),
        workload("registry.example.com/web:2"),
    );
    let mut s = Snapshot {
        groups: vec![Arc::new(
            serde_json::from_value::<DeviceGroup>(
                serde_json::json!({"apiVersion": "fleet.nationtech.io/v1alpha1",
                "kind": "DeviceGroup", "metadata": {"name": "all"}, "spec": {"selectAll": true}}),
            )
            .unwrap(),
        )],
        deployments: vec![deployment(staged)],
        ..Default::default()
    };
    for i in 0..DEVICES {
        let id = DeviceId::try_from(format!("dev-{i:06}")).unwrap();
        let labels = if i % 1000 == 0 {
            serde_json::json!({"canary": "true"})
        } else {
            serde_json::json!({})
        };
        s.devices.push(Arc::new(
            serde_json::from_value::<Device>(
                serde_json::json!({"apiVersion": "fleet.nationtech.io/v1alpha1",
                "kind": "Device", "metadata": {"name": id.as_str(), "labels": labels}, "spec": {}}),
            )
            .unwrap(),
        ));
        let w = if updated(i) { new.clone() } else { old.clone() };
        let report = DeviceWorkloadStatus {
            device_id: id.clone(),
            generation: 2,
            at: now,
            workloads: vec![WorkloadStatus {
                name: w.name.clone(),
                state: WorkloadState::Running,
                container_id: None,
                spec_digest: Some(w.digest()),
                started_at: Some(Timestamp::from_unix_ms(now.unix_ms() - 600_000)),
                error: None,
                failure: None,
                restarts: None,
                health: None,
            }],
            desired_error: None,
        };
        s.workloads.insert(id.to_string(), Arc::new(report));
        s.desired.insert(
            id.to_string(),
            Arc::new(DesiredState::new(id, 2, vec![w]).unwrap()),
        );
    }
    s
}

/// A case: its name, and which devices have the change.
type Case = (&'static str, fn(usize) -> bool);

/// One whole pass ([`plan::plan`]) for a FleetDeployment change on `DEVICES` devices, staged and not.
fn deployments(runs: usize, now: Timestamp) {
    // Which devices have the change: none, every other one, all.
    let cases: [Case; 3] = [
        ("start: no device has the change", |_| false),
        ("middle: half the devices have it", |i| i % 2 == 0),
        ("end: every device has it", |_| true),
    ];
    println!();
    println!("| FleetDeployment on {DEVICES} devices, one whole pass | staged (ms) | no rollout section (ms) | staged / unstaged |");
    println!("|---|---|---|---|");
    for (name, updated) in &cases {
        let measure = |staged: bool| {
            let s = snapshot(updated, staged, now);
            let mut v: Vec<f64> = (0..runs)
                .map(|_| {
                    let start = Instant::now();
                    let out = plan::plan(&s, now, &mut AttemptId::new_random);
                    std::hint::black_box(&out);
                    start.elapsed().as_secs_f64() * 1000.0
                })
                .collect();
            median(&mut v)
        };
        let (s, u) = (measure(true), measure(false));
        println!(
            "| {name} | {s:.1} | {u:.1} | {:.2} |",
            s / u.max(f64::MIN_POSITIVE)
        );
    }
}
