//! Benchmark (run by `scripts/bench.d/50-operator.sh`): placing one FleetDeployment on 10,000 devices through
//! the operator's own placement and compare-and-set write path, against raw KV puts of the same values to the
//! same nats-server in the same run; and the process's RSS holding 10,000 devices. Prints a Markdown table.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use fleet_operator::crd::{Device, DeviceSpec, DeviceStatus};
use fleet_operator::engine::{current_workloads, write_desired, WRITE_CONCURRENCY};
use fleet_operator::kv::{self, Mirror};
use fleet_operator::placement::{self, DeploymentInput};
use fleet_wire::{fixtures, DesiredState, DeviceId};
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

fn rss_kib(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

fn main() {
    let n: usize = std::env::var("FLEET_BENCH_DEVICES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let nats = fleet_rig::NatsServer::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let rss_before = rss_kib("VmRSS:");
    rt.block_on(async move {
        let (_client, js) = kv::connect(&nats.url()).await.expect("nats");
        let stores = kv::ensure_buckets(&js).await.expect("buckets");
        let spec = fleet_wire::kv::bucket(fleet_wire::kv::DESIRED_STATE).expect("spec");
        let mut raw_cfg = kv::bucket_config(spec);
        raw_cfg.bucket = "bench-raw".into();
        let raw = js.create_key_value(raw_cfg).await.expect("raw bucket");

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
            });
            devices_objs.push(d);
            labels.insert(info.device_id, l);
        }

        // Reference: raw puts of the same desired-state values, same concurrency.
        let values: Vec<(String, Vec<u8>)> = labels
            .keys()
            .map(|id| {
                let s = DesiredState::new(id.clone(), 1, vec![workload.clone()]).unwrap();
                (id.as_str().to_owned(), serde_json::to_vec(&s).unwrap())
            })
            .collect();
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
        let raw_secs = t.elapsed().as_secs_f64();

        // The operator: resolve the group, place the deployment, CAS-write every device's desired state.
        let desired_store = stores.get(fleet_wire::kv::DESIRED_STATE).expect("store");
        let mirror: std::sync::Arc<Mirror<DesiredState>> = Mirror::new(fleet_wire::kv::DESIRED_STATE);
        let t = Instant::now();
        let sel = LabelSelector { match_labels: Some([("fleet".to_string(), "bench".to_string())].into()), match_expressions: None };
        let mut groups = BTreeMap::new();
        groups.insert("all".to_string(), placement::resolve_group("all", &sel, &labels));
        let targets = placement::place(&["all".to_string()], &LabelSelector::default(), &groups, &labels);
        let devset: BTreeSet<DeviceId> = labels.keys().cloned().collect();
        let inputs = vec![DeploymentInput { name: "web".into(), workloads: vec![workload.clone()], targets }];
        let desired = placement::desired_workloads(&devset, &inputs, &BTreeMap::new());
        let compute_secs = t.elapsed().as_secs_f64();
        let written = write_desired(desired_store, &mirror, desired.per_device).await.expect("write");
        let place_secs = t.elapsed().as_secs_f64();
        assert_eq!(written, n);
        let mut stream = js.get_stream(format!("KV_{}", fleet_wire::kv::DESIRED_STATE)).await.expect("stream");
        let keys = stream.info().await.expect("stream info").state.messages;
        assert_eq!(keys as usize, n, "desired-state keys written");

        // A second pass with nothing changed: decided from the mirror, no writes.
        let t = Instant::now();
        let current = current_workloads(&mirror, &inputs);
        let again = placement::desired_workloads(&devset, &inputs, &current);
        let rewritten = write_desired(desired_store, &mirror, again.per_device).await.expect("write");
        let idle_secs = t.elapsed().as_secs_f64();
        assert_eq!(rewritten, 0);

        let rss = rss_kib("VmRSS:");
        let raw_rate = n as f64 / raw_secs;
        let place_rate = n as f64 / place_secs;
        println!("| measurement ({n} devices, one nats-server, {WRITE_CONCURRENCY} writes in flight) | value |");
        println!("|---|---|");
        println!("| reference: raw KV put of the same values | {raw_rate:.0} keys/s ({raw_secs:.2} s) |");
        println!("| operator: place one deployment, CAS-write desired states | {place_rate:.0} keys/s ({place_secs:.2} s) |");
        println!("| ratio operator / raw (goal ≥ 0.5) | {:.2} |", place_rate / raw_rate);
        println!("| of which placement computation (groups, selector, desired workloads) | {:.0} ms |", compute_secs * 1000.0);
        println!("| operator: pass with nothing changed (no writes) | {:.0} ms |", idle_secs * 1000.0);
        println!(
            "| operator RSS holding {n} Device objects + placement + KV mirror | {:.1} MiB (before: {:.1} MiB, peak {:.1} MiB) |",
            rss as f64 / 1024.0,
            rss_before as f64 / 1024.0,
            rss_kib("VmHWM:") as f64 / 1024.0
        );
        drop(devices_objs);
    });
}
