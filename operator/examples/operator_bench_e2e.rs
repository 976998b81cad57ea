//! End-to-end benchmark (run by `scripts/bench.d/50-operator.sh`): the real `fleet-operator` binary against a
//! real kube-apiserver holding 10,000 Device objects and a real nats-server. Measures how long placing one
//! FleetDeployment on every device takes (all desired-state keys rewritten) and the operator's RSS.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use fleet_operator::crd::{Device, DeviceGroup, FleetDeployment};
use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use std::time::{Duration, Instant};

fn rss_mib(pid: u32) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1024.0
}

struct Kill(std::process::Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn main() {
    let n: usize = std::env::var("FLEET_BENCH_DEVICES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let bin = std::env::var("FLEET_OPERATOR_BIN")
        .expect("FLEET_OPERATOR_BIN: path of the fleet-operator binary");
    let api = fleet_rig::kube::KubeApiServer::start();
    let nats = fleet_rig::NatsServer::start();
    let dir = tempfile::tempdir().expect("tmp");
    let kubeconfig = dir.path().join("kubeconfig");
    // Verified against the rig's CA, by the operator and by this client alike.
    std::fs::write(&kubeconfig, api.kubeconfig(api.token())).expect("kubeconfig");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let kc = kube::config::Kubeconfig::from_yaml(&api.kubeconfig(api.token())).unwrap();
        let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .unwrap();
        let client = kube::Client::try_from(cfg).unwrap();
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        for crd in fleet_operator::crd::all_crds() {
            let name = crd.metadata.name.clone().unwrap();
            crds.patch(&name, &PatchParams::apply("bench").force(), &Patch::Apply(&crd)).await.unwrap();
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        let devices: Api<Device> = Api::all(client.clone());
        let t = Instant::now();
        let created: Vec<_> = futures::stream::iter(0..n)
            .map(|i| {
                let devices = devices.clone();
                async move {
                    let d: Device = serde_json::from_value(json!({"apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "Device",
                        "metadata": {"name": format!("device-{i:05}"), "labels": {"site": format!("site-{}", i % 50)}}, "spec": {}})).unwrap();
                    devices.create(&PostParams::default(), &d).await
                }
            })
            .buffer_unordered(32)
            .collect()
            .await;
        assert!(created.iter().all(|r| r.is_ok()), "creating Devices failed");
        let create_secs = t.elapsed().as_secs_f64();
        let group: DeviceGroup = serde_json::from_value(json!({"apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "DeviceGroup",
            "metadata": {"name": "all"}, "spec": {"selectAll": true}})).unwrap();
        Api::<DeviceGroup>::all(client.clone()).create(&PostParams::default(), &group).await.unwrap();

        let child = std::process::Command::new(&bin)
            .args(["--nats-url", &nats.url()])
            .env("KUBECONFIG", &kubeconfig)
            .env("RUST_LOG", "warn")
            .spawn()
            .expect("start fleet-operator");
        let pid = child.id();
        let _op = Kill(child);
        let nc = async_nats::connect(nats.url()).await.unwrap();
        let js = async_nats::jetstream::new(nc);
        let stream_name = format!("KV_{}", fleet_wire::kv::DESIRED_STATE);
        let last_seq = |js: async_nats::jetstream::Context| {
            let stream_name = stream_name.clone();
            async move {
                match js.get_stream(&stream_name).await {
                    Ok(mut s) => s.info().await.map(|i| i.state.last_sequence).unwrap_or(0),
                    Err(_) => 0,
                }
            }
        };
        // Start-up: every Device gets an (empty) desired state.
        let t = Instant::now();
        while last_seq(js.clone()).await < n as u64 {
            assert!(t.elapsed() < Duration::from_secs(600), "operator start-up did not write {n} keys");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let startup_secs = t.elapsed().as_secs_f64();
        let rss_idle = rss_mib(pid);
        let dep: FleetDeployment = serde_json::from_value(json!({"apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "FleetDeployment",
            "metadata": {"name": "web"}, "spec": {"allowedGroups": ["all"], "workloads": [{"name": "web", "image": "localhost/web:1"}]}})).unwrap();
        let t = Instant::now();
        Api::<FleetDeployment>::all(client.clone()).create(&PostParams::default(), &dep).await.unwrap();
        while last_seq(js.clone()).await < 2 * n as u64 {
            assert!(t.elapsed() < Duration::from_secs(600), "placement did not write {n} keys");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let place_secs = t.elapsed().as_secs_f64();
        let rss = rss_mib(pid);
        println!("| end to end: real fleet-operator, kube-apiserver with {n} Devices | value |");
        println!("|---|---|");
        println!("| creating {n} Device objects (API server, 32 in flight; setup only) | {create_secs:.1} s |");
        println!("| operator start-up: list + first pass, {n} empty desired states written | {startup_secs:.2} s |");
        println!("| placing one FleetDeployment on {n} devices (create → all keys written) | {place_secs:.2} s ({:.0} keys/s) |", n as f64 / place_secs);
        println!("| operator RSS after start-up / after placement | {rss_idle:.1} MiB / {rss:.1} MiB |");
    });
}
