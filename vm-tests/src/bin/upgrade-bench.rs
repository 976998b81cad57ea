//! Benchmark (`scripts/bench.d/80-demo.sh`): on a local fleet of three nspawn devices run by the real operator,
//! the wall time of a whole-fleet agent upgrade two ways in the same run: written straight into NATS KV (one
//! `AgentUpgradeAttempt` per device, as a script could) and through an AgentRelease applied with kubectl (the
//! path a user takes). Both end when the third device's `agent-upgrade-status` says `complete`; the operator path
//! also shows when the Device objects say so. Each round runs the KV path first (to v2; the AgentRelease is
//! deleted meanwhile, so the operator leaves the intents alone), then the operator path (v2 → v3, the real v3
//! agent): the same kind of one-step upgrade with a real binary. `FLEET_BENCH_RUNS` rounds (default 3).
//!
//! With `--staging` (`scripts/bench.d/52-rollout.sh`): the cost of a staged rollout itself, in the same run — each
//! round an AgentRelease without a `rollout` section and then one with `rollout: {soakSeconds: 0}` (one device
//! `canary=true`: the canary first, the other two once it committed), each from `kubectl apply` to all three
//! Device objects showing the new version committed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use fleet_rig::nats_client as nats;
use fleet_vm_tests::builds::{self, V2, V3};
use fleet_vm_tests::local_fleet::{group_yaml, release_yaml, LocalFleet};
use fleet_wire::{kv, AgentUpgradeStatus, UpgradePhase};
use std::time::{Duration, Instant};

const DEVICES: [&str; 3] = ["bench-1", "bench-2", "bench-3"];
const TIMEOUT: Duration = Duration::from_secs(600);

/// Waits until every device's `agent-upgrade-status` is `complete` for `version`; the elapsed time since `t0`.
fn all_complete(js: &nats::jetstream::JetStream, version: &str, t0: Instant) -> Duration {
    let store = js
        .key_value(kv::AGENT_UPGRADE_STATUS)
        .expect("status bucket");
    loop {
        let done = DEVICES.iter().all(|d| {
            let Ok(Some(raw)) = store.get(d) else {
                return false;
            };
            let Ok(s) = serde_json::from_slice::<AgentUpgradeStatus>(&raw) else {
                return false;
            };
            s.phase == UpgradePhase::Complete
                && s.target_version.as_ref().map(|v| v.as_str()) == Some(version)
        });
        if done {
            return t0.elapsed();
        }
        assert!(
            t0.elapsed() < TIMEOUT,
            "not every device committed {version}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn median(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

/// The version to upgrade to from `current`: the two built versions in turn.
fn other(current: &str) -> &'static str {
    if current == V2 {
        V3
    } else {
        V2
    }
}

/// Applies `release` and waits until every Device shows `version` committed; seconds from the apply.
fn through_operator(fleet: &LocalFleet, release: &str, version: &str) -> f64 {
    let t0 = Instant::now();
    fleet.cluster.apply(release);
    fleet.cluster.wait(
        &format!("every Device shows {version} committed"),
        TIMEOUT,
        || {
            let views = fleet.views();
            (views.len() == DEVICES.len() && views.iter().all(|v| v.committed(version)))
                .then(|| t0.elapsed().as_secs_f64())
        },
    )
}

/// `--staging`: the same upgrade without and with a staged rollout (soak 0), round after round.
fn staging(fleet: &LocalFleet, runs: usize) {
    let cluster = &fleet.cluster;
    cluster.kubectl(&["label", "fdev", DEVICES[0], "canary=true"]);
    let (mut plain, mut staged) = (vec![], vec![]);
    let mut current = builds::V1;
    for round in 0..runs {
        for (i, times) in [&mut plain, &mut staged].into_iter().enumerate() {
            let _ = cluster.try_kubectl(&["delete", "frel", "fleet-agent", "--ignore-not-found"]);
            let version = other(current);
            let (url, sha) = fleet.artifacts.publish(
                &builds::agent(version),
                &format!("fleet-agent-{version}-round{round}-{i}"),
            );
            let mut release = release_yaml("fleet-agent", "bench", version, &url, sha.as_ref());
            if i == 1 {
                release.push_str("  rollout:\n    soakSeconds: 0\n");
            }
            times.push(through_operator(fleet, &release, version));
            current = version;
        }
    }
    let (p, p_lo, p_hi) = median(plain);
    let (st, st_lo, st_hi) = median(staged);
    println!("| agent upgrade of 3 nspawn devices from `kubectl apply` to all 3 Devices committed, same run, median of {runs} (range) | wall time |");
    println!("|---|---|");
    println!("| AgentRelease without a `rollout` section (all at once) | {p:.1} s ({p_lo:.1}–{p_hi:.1}) |");
    println!(
        "| AgentRelease with `rollout: {{soakSeconds: 0}}` (the canary, then the other two) | {st:.1} s ({st_lo:.1}–{st_hi:.1}); {:+.1} s: the cost of staging |",
        st - p
    );
}

fn main() {
    let staged_only = std::env::args().any(|a| a == "--staging");
    let runs: usize = std::env::var("FLEET_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
        .max(1);
    println!("(setting up: API server, fleet-operator, NATS, three devices; {runs} rounds)");
    let fleet = LocalFleet::start(&DEVICES);
    let conn = fleet.nats.connect();
    let js = nats::jetstream::new(conn);
    let intents = js
        .key_value(kv::AGENT_UPGRADE_INTENT)
        .expect("intent bucket");
    let cluster = &fleet.cluster;
    cluster.kubectl(&["label", "fdev", "--all", "site=bench"]);
    cluster.apply(&group_yaml("bench", &[("site", "bench")]));
    if staged_only {
        return staging(&fleet, runs);
    }
    let v2 = builds::agent(V2);
    let (mut kv_times, mut op_times, mut cr_times) = (vec![], vec![], vec![]);
    for round in 0..runs {
        // 1. Straight into KV: one attempt per device, to v2 (from v1 in the first round, from v3 after). No
        //    AgentRelease exists meanwhile, so the operator leaves the intents alone.
        let _ = cluster.try_kubectl(&["delete", "frel", "fleet-agent", "--ignore-not-found"]);
        let attempts: Vec<_> = DEVICES
            .iter()
            .map(|d| fleet.artifacts.attempt_for(d, &v2, "fleet-agent-v2", V2))
            .collect();
        let t0 = Instant::now();
        for a in &attempts {
            let value = serde_json::to_vec(a).expect("json");
            let key = a.device_id.as_str();
            match intents.entry(key).expect("read intent") {
                Some(e) => intents.update(key, value, e.revision).map(|_| ()),
                None => intents.create(key, value).map(|_| ()),
            }
            .expect("write intent");
        }
        kv_times.push(all_complete(&js, V2, t0).as_secs_f64());

        // 2. Through the operator: an AgentRelease applied with kubectl, v2 → v3 (a new artifact URL per round,
        //    so that each round is a new build the operator writes attempts for).
        let (url, sha) = fleet
            .artifacts
            .publish(&builds::agent(V3), &format!("fleet-agent-v3-round{round}"));
        let release = release_yaml("fleet-agent", "bench", V3, &url, sha.as_ref());
        let t0 = Instant::now();
        cluster.apply(&release);
        op_times.push(all_complete(&js, V3, t0).as_secs_f64());
        cr_times.push(
            cluster.wait("every Device shows v3 committed", TIMEOUT, || {
                let views = fleet.views();
                (views.len() == DEVICES.len() && views.iter().all(|v| v.committed(V3)))
                    .then(|| t0.elapsed().as_secs_f64())
            }),
        );
    }
    let (kv, kv_lo, kv_hi) = median(kv_times);
    let (op, op_lo, op_hi) = median(op_times);
    let (cr, cr_lo, cr_hi) = median(cr_times);
    println!("| whole-fleet agent upgrade, 3 nspawn devices, same run, median of {runs} (range) | wall time |");
    println!("|---|---|");
    println!(
        "| reference: 3 AgentUpgradeAttempts written straight into KV (to {V2}) → all 3 `complete` in KV | {kv:.1} s ({kv_lo:.1}–{kv_hi:.1}) |"
    );
    println!(
        "| AgentRelease applied with kubectl → fleet-operator → all 3 `complete` in KV ({V2} → {V3}) | {op:.1} s ({op_lo:.1}–{op_hi:.1}); {:+.1} s vs KV |",
        op - kv
    );
    println!(
        "| AgentRelease applied → all 3 Device objects show `complete` and agentVersion {V3} | {cr:.1} s ({cr_lo:.1}–{cr_hi:.1}) |"
    );
}
