//! Benchmark (run by `scripts/bench.d/55-tasks.sh`): one TaskRun's plan + release over 10,000 and 100,000 devices
//! through the operator's own path (planning with the placement rule, the chunked plan store, intent creates),
//! against raw KV puts of the same intents to the same nats-server in the same run; and the process's RSS.
//! Prints a Markdown table. Each size is measured `FLEET_BENCH_RUNS` times (default 3), the two sides alternately
//! first, each into fresh keys; the table gives medians.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use fleet_operator::crd::tasks::TaskRunSpec;
use fleet_operator::crd::Placement;
use fleet_operator::fleet::placement::{self, Labels};
use fleet_operator::kv::{self, Mirror};
use fleet_operator::tasks::intents::{self, INTENT_CONCURRENCY};
use fleet_operator::tasks::{planning, store};
use fleet_wire::kv as layout;
use fleet_wire::{AttemptId, DeviceId, SystemUpgradeAttempt, TaskOperation, TaskPlan, Timestamp};
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

fn rss_kib(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Operator side: (total, plan, store, release) seconds.
async fn operator(
    stores: &BTreeMap<&'static str, async_nats::jetstream::kv::Store>,
    spec: &TaskRunSpec,
    groups: &planning::Groups,
    labels: &BTreeMap<DeviceId, Labels>,
) -> (f64, f64, f64, f64) {
    let t = Instant::now();
    let targets = planning::plan_targets(spec, groups, labels, |_| true).expect("targets");
    let now = Timestamp::now();
    let plan = TaskPlan::new(
        AttemptId::new_random(),
        TaskOperation::AptFullUpgradeV1,
        now.plus(Duration::from_secs(3600)),
        targets.canaries,
        targets.others,
        now,
    )
    .expect("plan");
    let planned = t.elapsed().as_secs_f64();
    let plan = store::create(&stores[layout::TASK_PLANS], &plan)
        .await
        .expect("store")
        .plan();
    let stored = t.elapsed().as_secs_f64();
    let mirror = Mirror::new(layout::SYSTEM_UPGRADE_INTENT);
    let n = intents::release(
        &stores[layout::SYSTEM_UPGRADE_INTENT],
        Some(mirror),
        &plan,
        &plan.others,
    )
    .await
    .expect("release");
    assert_eq!(n, plan.others.len());
    let total = t.elapsed().as_secs_f64();
    (total, planned, stored - planned, total - stored)
}

/// Reference: raw puts of the same intents (pre-serialized) into a fresh bucket of the same configuration.
async fn raw(js: &async_nats::jetstream::Context, round: String, ids: &[DeviceId]) -> f64 {
    let spec = layout::bucket(layout::SYSTEM_UPGRADE_INTENT).expect("spec");
    let mut cfg = kv::bucket_config(spec, &Default::default());
    cfg.bucket = format!("bench-raw-{round}");
    let bucket = js.create_key_value(cfg).await.expect("raw bucket");
    let run = AttemptId::new_random();
    let expires_at = Timestamp::now().plus(Duration::from_secs(3600));
    let values: Vec<(String, Vec<u8>)> = ids
        .iter()
        .map(|d| {
            let a = SystemUpgradeAttempt {
                run_uid: run,
                device_id: d.clone(),
                operation: TaskOperation::AptFullUpgradeV1,
                expires_at,
            };
            (layout::run_key(d, &run), serde_json::to_vec(&a).unwrap())
        })
        .collect();
    let t = Instant::now();
    let puts: Vec<_> = futures::stream::iter(values)
        .map(|(k, v)| {
            let bucket = bucket.clone();
            async move { bucket.put(k, v.into()).await }
        })
        .buffer_unordered(INTENT_CONCURRENCY)
        .collect()
        .await;
    assert!(puts.iter().all(|r| r.is_ok()));
    let secs = t.elapsed().as_secs_f64();
    js.delete_key_value(format!("bench-raw-{round}"))
        .await
        .expect("drop raw bucket");
    secs
}

fn main() {
    let runs: usize = std::env::var("FLEET_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let sizes: Vec<usize> = std::env::var("FLEET_BENCH_TASK_SIZES")
        .unwrap_or_else(|_| "10000,100000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let rss_start = rss_kib("VmRSS:");
    let nats = fleet_rig::NatsServer::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    println!("| devices | raw KV puts | operator plan + release | vs raw | plan / store / release (s) | operator RSS |");
    println!("|---|---|---|---|---|---|");
    rt.block_on(async {
        let (_client, js) = kv::connect(&nats.url(), &Default::default()).await.expect("connect");
        let stores = kv::ensure_buckets(&js, &Default::default()).await.expect("buckets");
        for n in sizes {
            let ids: Vec<DeviceId> = (0..n)
                .map(|i| DeviceId::try_from(format!("device-{i:06}").as_str()).unwrap())
                .collect();
            let member: Labels = [("member".to_string(), "prod".to_string())].into();
            let labels: BTreeMap<DeviceId, Labels> =
                ids.iter().map(|d| (d.clone(), member.clone())).collect();
            let group = fleet_operator::crd::DeviceGroupSpec {
                selector: Some(LabelSelector {
                    match_labels: Some(member.clone()),
                    match_expressions: None,
                }),
                ..Default::default()
            };
            let mut groups = planning::Groups::new();
            groups.insert("prod".into(), placement::resolve_group("prod", &group, &labels));
            let spec = TaskRunSpec {
                placement: Placement {
                    allowed_groups: vec!["prod".into()],
                    target_selector: LabelSelector::default(),
                },
                deadline_seconds: 3600,
                system_upgrade_v1: Default::default(),
            };
            let (mut raw_s, mut op_s, mut parts) = (vec![], vec![], vec![]);
            for round in 0..runs {
                let tag = format!("{n}-{round}");
                if round % 2 == 0 {
                    raw_s.push(raw(&js, tag, &ids).await);
                    let o = operator(&stores, &spec, &groups, &labels).await;
                    op_s.push(o.0);
                    parts.push(o);
                } else {
                    let o = operator(&stores, &spec, &groups, &labels).await;
                    op_s.push(o.0);
                    parts.push(o);
                    raw_s.push(raw(&js, tag, &ids).await);
                }
            }
            let (r, o) = (median(&mut raw_s), median(&mut op_s));
            let p = parts
                .iter()
                .find(|p| p.0 == o)
                .copied()
                .unwrap_or(parts[0]);
            println!(
                "| {n} | {r:.2} s ({:.0}/s) | {o:.2} s ({:.0}/s) | {:.2}× | {:.2} / {:.2} / {:.2} | {} MiB (peak {} MiB, {} MiB at start) |",
                n as f64 / r,
                n as f64 / o,
                r / o,
                p.1,
                p.2,
                p.3,
                rss_kib("VmRSS:") / 1024,
                rss_kib("VmHWM:") / 1024,
                rss_start / 1024,
            );
        }
    });
}
