//! Benchmark (run by `scripts/bench.d/50-operator.sh`): placing one FleetDeployment on 10,000 devices through
//! the operator's own placement and compare-and-set write path, against raw KV puts of the same values to the
//! same nats-server in the same run; and the process's RSS holding 10,000 devices. Prints a Markdown table.
//!
//! The two are measured `FLEET_BENCH_RUNS` times (default 5), alternately first, each time into fresh buckets,
//! and the table gives medians and ranges: one ~0.2 s sample of either side is at the mercy of whatever else
//! runs on the machine.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use async_nats::jetstream;
use fleet_operator::crd::{Device, DeviceSpec, DeviceStatus};
use fleet_operator::deployments::engine::{current_workloads, write_desired, WRITE_CONCURRENCY};
use fleet_operator::fleet::placement::{self, DeploymentInput, Labels};
use fleet_operator::kv::{self, Mirror};
use fleet_wire::{fixtures, DesiredState, DeviceId, WorkloadSpec};
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

fn rss_kib(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Median and range of `v`.
fn stats(v: &[f64]) -> (f64, f64, f64) {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let m = s.len() / 2;
    let median = if s.len() % 2 == 1 {
        s[m]
    } else {
        (s[m - 1] + s[m]) / 2.0
    };
    (median, s[0], s[s.len() - 1])
}

/// Reference: raw puts of the same pre-serialized values into a fresh bucket, same concurrency. Seconds.
async fn raw_puts(js: &jetstream::Context, run: usize, values: &[(String, Vec<u8>)]) -> f64 {
    let spec = fleet_wire::kv::bucket(fleet_wire::kv::DESIRED_STATE).expect("spec");
    let mut raw_cfg = kv::bucket_config(spec, &Default::default());
    raw_cfg.bucket = format!("bench-raw-{run}");
    let raw = js.create_key_value(raw_cfg).await.expect("raw bucket");
    let t = Instant::now();
    let puts: Vec<_> = futures::stream::iter(values.iter().cloned())
        .map(|(k, v)| {
            let raw = raw.clone();
            async move { raw.put(k, v.into()).await }
        })
        .buffer_unordered(WRITE_CONCURRENCY)
        .collect()
        .await;
    assert!(puts.iter().all(|r| r.is_ok()));
    t.elapsed().as_secs_f64()
}

/// One side of a measurement run.
#[derive(Clone, Copy)]
enum Side {
    Raw,
    Operator,
    Watched,
}

/// What the operator needs to place: the fleet's labels and one deployment.
struct Fleet {
    labels: BTreeMap<DeviceId, Labels>,
    workload: WorkloadSpec,
}

/// One placement as the operator's pass makes it: the device set and deployment inputs (held, like the pass
/// holds them) and every device's desired workloads (handed to the writes).
type Placed = (
    BTreeSet<DeviceId>,
    Vec<DeploymentInput>,
    BTreeMap<DeviceId, Arc<[WorkloadSpec]>>,
);

/// Resolves the group, places the deployment and computes every device's desired workloads.
fn place(
    fleet: &Fleet,
    current: impl FnOnce(&[DeploymentInput]) -> BTreeMap<DeviceId, Vec<WorkloadSpec>>,
) -> Placed {
    let group = fleet_operator::crd::DeviceGroupSpec {
        selector: Some(LabelSelector {
            match_labels: Some([("fleet".to_string(), "bench".to_string())].into()),
            match_expressions: None,
        }),
        ..Default::default()
    };
    let mut groups = BTreeMap::new();
    groups.insert(
        "all".to_string(),
        placement::resolve_group("all", &group, &fleet.labels),
    );
    let targets = placement::place(
        &["all".to_string()],
        &LabelSelector::default(),
        &groups,
        &fleet.labels,
    );
    let devset: BTreeSet<DeviceId> = fleet.labels.keys().cloned().collect();
    let inputs = vec![DeploymentInput {
        name: "web".into(),
        workloads: vec![fleet.workload.clone()],
        targets,
        held: Default::default(),
    }];
    let current = current(&inputs);
    let per_device = placement::desired_workloads(&devset, &inputs, &current).per_device;
    (devset, inputs, per_device)
}

/// The operator: place the deployment and CAS-write every device's desired state into a fresh desired-state
/// bucket, with or without the desired-state watch that the operator process runs next to its writes (its own
/// writes come back through it). Checks the values are the reference's, byte for byte. Returns (total seconds,
/// placement computation seconds, the mirror, what the placement holds).
async fn operator(
    js: &jetstream::Context,
    fleet: &Fleet,
    values: &[(String, Vec<u8>)],
    watch: bool,
) -> (
    f64,
    f64,
    Arc<Mirror<DesiredState>>,
    (BTreeSet<DeviceId>, Vec<DeploymentInput>),
) {
    // A fresh, empty desired-state bucket (created by the operator's own ensure_buckets).
    let _ = js.delete_key_value(fleet_wire::kv::DESIRED_STATE).await;
    let stores = kv::ensure_buckets(js, &Default::default())
        .await
        .expect("buckets");
    let desired_store = stores.get(fleet_wire::kv::DESIRED_STATE).expect("store");
    let mirror: Arc<Mirror<DesiredState>> = Mirror::new(fleet_wire::kv::DESIRED_STATE);
    let watcher = watch.then(|| {
        tokio::spawn(
            mirror
                .clone()
                .run(desired_store.clone(), Arc::new(tokio::sync::Notify::new())),
        )
    });
    let deadline = Instant::now() + std::time::Duration::from_secs(10);
    while watch && !mirror.is_synced() {
        assert!(
            Instant::now() < deadline,
            "the desired-state watch did not start"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let t = Instant::now();
    let (devset, inputs, per_device) = place(fleet, |inputs| current_workloads(&mirror, inputs));
    let compute_secs = t.elapsed().as_secs_f64();
    let written = write_desired(desired_store, &mirror, per_device)
        .await
        .expect("write");
    let secs = t.elapsed().as_secs_f64();
    if let Some(w) = watcher {
        w.abort();
    }
    assert_eq!(written, values.len());
    let mut stream = js
        .get_stream(format!("KV_{}", fleet_wire::kv::DESIRED_STATE))
        .await
        .expect("stream");
    let keys = stream.info().await.expect("stream info").state.messages;
    assert_eq!(keys as usize, values.len(), "desired-state keys written");
    for (k, v) in values.iter().step_by(997) {
        let got = desired_store.get(k).await.expect("get").expect("key");
        assert_eq!(
            &got[..],
            &v[..],
            "{k}: the operator wrote what the reference put"
        );
    }
    (secs, compute_secs, mirror, (devset, inputs))
}

fn main() {
    let n = env_usize("FLEET_BENCH_DEVICES", 10_000);
    let runs = env_usize("FLEET_BENCH_RUNS", 5).max(1);
    let nats = fleet_rig::NatsServer::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let rss_before = rss_kib("VmRSS:");
    rt.block_on(async move {
        let (_client, js) = kv::connect(&nats.url(), &Default::default()).await.expect("nats");

        // The fleet as the operator holds it: Device objects (like its reflector cache) and their labels.
        let workload = fixtures::workload("web");
        let mut devices_objs = Vec::with_capacity(n);
        let mut labels = BTreeMap::new();
        for i in 0..n {
            let name = format!("device-{i:05}");
            let l: BTreeMap<String, String> =
                [("site".to_string(), format!("site-{}", i % 50)), ("fleet".to_string(), "bench".to_string())].into();
            let mut d = Device::new(&name, DeviceSpec::default());
            d.metadata.labels = Some(l.clone());
            let mut info = fixtures::device_info();
            info.device_id = DeviceId::try_from(name.as_str()).unwrap();
            d.status = Some(DeviceStatus {
                agent_version: Some(info.agent_version.clone()),
                architecture: Some(info.architecture),
                capabilities: info.capabilities.clone(),
                os: Some("Debian GNU/Linux 12 (bookworm)".into()),
                last_heartbeat: Some(fixtures::t(90).to_string()),
                agent_upgrade: Some(fixtures::upgrade_status()),
                workloads: None,
                // the fixture has been preparing since t(0): stalled, as the operator mirrors it
                stalled: Some(fleet_operator::crd::Stalled {
                    phase: "preparing".into(),
                    since: fixtures::upgrade_status().phase_changed_at.to_string(),
                    task_run: None,
                }),
                writes_refused: None,
                ..Default::default()
            });
            devices_objs.push(d);
            labels.insert(info.device_id, l);
        }
        // The reference's values: the same desired states, serialized beforehand.
        let values: Vec<(String, Vec<u8>)> = labels
            .keys()
            .map(|id| {
                let s = DesiredState::new(id.clone(), 1, vec![workload.clone()]).unwrap();
                (id.as_str().to_owned(), serde_json::to_vec(&s).unwrap())
            })
            .collect();
        let fleet = Fleet { labels, workload };

        let (mut raw_rates, mut op_rates, mut ratios, mut computes) = (vec![], vec![], vec![], vec![]);
        let (mut watched_rates, mut watched_ratios) = (vec![], vec![]);
        let mut first = None;
        for run in 0..runs {
            // Alternately first and last, so that no side always runs on a server another has just loaded.
            let mut order = [Side::Raw, Side::Operator, Side::Watched];
            if run % 2 == 1 {
                order.reverse();
            }
            let (mut raw_secs, mut op_secs, mut watched_secs) = (0.0, 0.0, 0.0);
            for side in order {
                match side {
                    Side::Raw => raw_secs = raw_puts(&js, run, &values).await,
                    Side::Watched => watched_secs = operator(&js, &fleet, &values, true).await.0,
                    Side::Operator => {
                        let (secs, compute_secs, mirror, placed) = operator(&js, &fleet, &values, false).await;
                        op_secs = secs;
                        computes.push(compute_secs * 1000.0);
                        if run == 0 {
                            // A second pass with nothing changed: decided from the mirror, no writes.
                            let stores = kv::ensure_buckets(&js, &Default::default()).await.expect("buckets");
                            let t = Instant::now();
                            let (_, _, again) = place(&fleet, |inputs| current_workloads(&mirror, inputs));
                            let rewritten = write_desired(&stores[fleet_wire::kv::DESIRED_STATE], &mirror, again)
                                .await
                                .expect("write");
                            let idle_secs = t.elapsed().as_secs_f64();
                            assert_eq!(rewritten, 0);
                            // RSS holding the fleet, one placement and the KV mirror.
                            first = Some((idle_secs, (rss_kib("VmRSS:"), rss_kib("VmHWM:"))));
                        }
                        drop((mirror, placed));
                    }
                }
            }
            let _ = js.delete_key_value(format!("bench-raw-{run}")).await;
            raw_rates.push(n as f64 / raw_secs);
            op_rates.push(n as f64 / op_secs);
            ratios.push(raw_secs / op_secs);
            watched_rates.push(n as f64 / watched_secs);
            watched_ratios.push(raw_secs / watched_secs);
        }
        let (idle_secs, (rss, hwm)) = first.expect("first run");
        let (raw_m, raw_lo, raw_hi) = stats(&raw_rates);
        let (op_m, op_lo, op_hi) = stats(&op_rates);
        let (ratio_m, ratio_lo, ratio_hi) = stats(&ratios);
        let (comp_m, comp_lo, comp_hi) = stats(&computes);
        println!("| measurement ({n} devices, one nats-server, {WRITE_CONCURRENCY} writes in flight; median of {runs} runs, sides alternately first and last, range in brackets) | value |");
        println!("|---|---|");
        println!("| reference: raw KV put of the same values | {raw_m:.0} keys/s ({raw_lo:.0}–{raw_hi:.0}) |");
        println!("| operator: place one deployment, CAS-write desired states | {op_m:.0} keys/s ({op_lo:.0}–{op_hi:.0}) |");
        println!("| ratio operator / raw, per run (goal ≥ 0.5) | {ratio_m:.2} ({ratio_lo:.2}–{ratio_hi:.2}) |");
        let (w_m, w_lo, w_hi) = stats(&watched_rates);
        let (wr_m, wr_lo, wr_hi) = stats(&watched_ratios);
        println!("| the same with the operator's desired-state KV watch running (as in the fleet-operator process) | {w_m:.0} keys/s ({w_lo:.0}–{w_hi:.0}); / raw {wr_m:.2} ({wr_lo:.2}–{wr_hi:.2}) |");
        println!("| of which placement computation (groups, selector, desired workloads) | {comp_m:.0} ms ({comp_lo:.0}–{comp_hi:.0}) |");
        println!("| operator: pass with nothing changed (no writes), first run | {:.0} ms |", idle_secs * 1000.0);
        println!(
            "| operator RSS holding {n} Device objects + placement + KV mirror, first run | {:.1} MiB (before: {:.1} MiB, peak {:.1} MiB) |",
            rss as f64 / 1024.0,
            rss_before as f64 / 1024.0,
            hwm as f64 / 1024.0
        );
        drop(devices_objs);
    });
}
