//! Benchmark (run by `scripts/bench.d/52-rollout.sh`): one pass of the rollout planner ([`rollout::plan`]) over
//! 100,000 devices in a few positions of a staged rollout, next to the same devices without a `rollout` section
//! (the cost of staging itself). Each case is measured `FLEET_BENCH_RUNS` times (default 5); the table gives
//! medians in milliseconds per pass. Pure computation: no NATS, no Kubernetes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use fleet_operator::crd::RolloutSpec;
use fleet_operator::rollout::{self, Observed, Policy, Target};
use fleet_wire::{DeviceId, Timestamp};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
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
}
