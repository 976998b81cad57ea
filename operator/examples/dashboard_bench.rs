//! Dashboard benchmark (run by `scripts/bench.d/58-dashboard.sh`): the real `fleet-operator` binary with the
//! dashboard on, against a real kube-apiserver holding 10,000 Devices (with statuses) and a TaskRun whose frozen plan
//! in a real nats-server holds 100,000 devices (10,000 with a status). Measures each page's time and size as a
//! client on the same host sees them, and the operator's RSS; references measured in the same run: listing the same
//! CRs with kube's client, and loading the whole plan from NATS. An AgentRelease and a FleetDeployment, each with a
//! staged rollout, target every Device (a `selectAll` group; 1 in 1,000 devices is a canary): the operator
//! writes their rollout statuses, so the rollout pages and the overview's rollout bars show them mid-rollout (no
//! agent answers, so the canaries stay updating).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use fleet_operator::crd::tasks::TaskRun;
use fleet_operator::crd::{AgentRelease, Device, DeviceGroup, FleetDeployment};
use fleet_wire::kv as layout;
use fleet_wire::{
    fixtures, AttemptId, DeviceId, SystemUpgradePhase, TaskOperation, TaskPlan, TaskRunPhase,
    TaskRunReason, Timestamp, UpgradePhase,
};
use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use std::time::{Duration, Instant};

const TOKEN: &str = "dashboard-bench-token-0123456789";
/// The AgentRelease and the FleetDeployment the bench creates.
const RELEASE: &str = "bench-agent";
const DEPLOYMENT: &str = "bench-web";

/// `bytes` in KB (1,024 bytes).
fn kb(bytes: usize) -> f64 {
    bytes as f64 / 1024.0
}

fn proc_mib(pid: u32, field: &str) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with(field))
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

/// Median and range of `times` in ms.
fn stats(mut times: Vec<f64>) -> String {
    times.sort_by(|a, b| a.total_cmp(b));
    format!(
        "{:.1} ms ({:.1}–{:.1})",
        times[times.len() / 2],
        times[0],
        times[times.len() - 1]
    )
}

fn main() {
    let n: usize = std::env::var("FLEET_BENCH_DEVICES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let plan_n: usize = std::env::var("FLEET_BENCH_PLAN")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let rounds: usize = 5;
    let bin = std::env::var("FLEET_OPERATOR_BIN")
        .expect("FLEET_OPERATOR_BIN: path of the fleet-operator binary");
    let api = fleet_rig::kube::KubeApiServer::start();
    let nats = fleet_rig::NatsServer::start();
    let dir = tempfile::tempdir().expect("tmp");
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, api.kubeconfig(api.token())).expect("kubeconfig");
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, TOKEN).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let kc = kube::config::Kubeconfig::from_yaml(&api.kubeconfig(api.token())).unwrap();
        let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.unwrap();
        let client = kube::Client::try_from(cfg).unwrap();
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        for crd in fleet_operator::crd::all_crds() {
            let name = crd.metadata.name.clone().unwrap();
            crds.patch(&name, &PatchParams::apply("bench").force(), &Patch::Apply(&crd)).await.unwrap();
        }
        tokio::time::sleep(Duration::from_secs(3)).await;

        // 10,000 Devices with what the operator would mirror: info, a heartbeat, an upgrade status (1 % failed).
        let devices: Api<Device> = Api::all(client.clone());
        let now = Timestamp::now();
        let t = Instant::now();
        let made: Vec<_> = futures::stream::iter(0..n)
            .map(|i| {
                let devices = devices.clone();
                async move {
                    let name = format!("device-{i:06}");
                    let mut labels = json!({"site": format!("site-{}", i % 50)});
                    if i % 1000 == 0 {
                        labels["canary"] = json!("true");
                    }
                    let d: Device = serde_json::from_value(json!({"apiVersion": "fleet.nationtech.io/v1alpha1",
                        "kind": "Device", "metadata": {"name": name, "labels": labels},
                        "spec": {}})).unwrap();
                    devices.create(&PostParams::default(), &d).await?;
                    let mut up = fixtures::failed_status();
                    up.device_id = DeviceId::try_from(name.as_str()).unwrap();
                    if i % 100 != 0 {
                        up.phase = UpgradePhase::Complete;
                        up.error = None;
                    }
                    let status = json!({"agentVersion": "1.2.0", "architecture": "arm64", "os": "Debian GNU/Linux 12",
                        "lastHeartbeat": now.to_string(), "agentUpgrade": up,
                        "workloads": {"running": 2, "failed": 0, "pending": 0}});
                    devices
                        .patch_status(&name, &PatchParams::default(), &Patch::Merge(json!({"status": status})))
                        .await
                }
            })
            .buffer_unordered(32)
            .collect()
            .await;
        assert!(made.iter().all(|r| r.is_ok()), "creating Devices failed");
        let create_secs = t.elapsed().as_secs_f64();

        // A terminal TaskRun (the task controller leaves it alone) with a 100,000-device plan.
        let ns = "default";
        let runs: Api<TaskRun> = Api::namespaced(client.clone(), ns);
        let run: TaskRun = serde_json::from_value(json!({"apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "TaskRun",
            "metadata": {"name": "big-run"}, "spec": {"allowedGroups": ["all"], "deadlineSeconds": 3600,
            "systemUpgradeV1": {}}})).unwrap();
        let run = runs.create(&PostParams::default(), &run).await.unwrap();
        let uid = AttemptId::try_from(run.metadata.uid.as_deref().unwrap()).unwrap();
        let status = fleet_wire::TaskRunStatus {
            phase: Some(TaskRunPhase::Failed),
            targets: plan_n as u32,
            failed: 1,
            start_time: Some(now),
            completion_time: Some(now),
            reason: Some(TaskRunReason::CanaryFailed),
            ..Default::default()
        };
        runs.patch_status("big-run", &PatchParams::default(), &Patch::Merge(json!({"status": status})))
            .await
            .unwrap();
        let nc = async_nats::connect(nats.url()).await.unwrap();
        let js = async_nats::jetstream::new(nc);
        let stores = fleet_operator::kv::ensure_buckets(&js, &Default::default()).await.unwrap();
        let ids: Vec<DeviceId> = (0..plan_n)
            .map(|i| DeviceId::try_from(format!("device-{i:06}").as_str()).unwrap())
            .collect();
        let plan = TaskPlan::new(uid, TaskOperation::AptFullUpgradeV1, now.plus(Duration::from_secs(3600)),
            ids[..10].to_vec(), ids[10..].to_vec(), now).unwrap();
        fleet_operator::tasks::store::create(&stores[layout::TASK_PLANS], &plan).await.unwrap();
        let statuses = stores[layout::SYSTEM_UPGRADE_STATUS].clone();
        let written: Vec<_> = futures::stream::iter(ids.iter().take(n).cloned())
            .map(|d| {
                let statuses = statuses.clone();
                async move {
                    let mut s = fixtures::system_status();
                    s.run_uid = uid;
                    s.device_id = d.clone();
                    if d.as_str() == "device-000000" {
                        s.phase = SystemUpgradePhase::Failed;
                    }
                    statuses.put(layout::run_key(&d, &uid), serde_json::to_vec(&s).unwrap().into()).await
                }
            })
            .buffer_unordered(64)
            .collect()
            .await;
        assert!(written.iter().all(|r| r.is_ok()), "writing statuses failed");
        // What each device's agent publishes (info, a heartbeat): the operator targets only devices it knows.
        let (infos, beats) = (stores[layout::DEVICE_INFO].clone(), stores[layout::DEVICE_HEARTBEAT].clone());
        let written: Vec<_> = futures::stream::iter(ids.iter().take(n).cloned())
            .map(|d| {
                let (infos, beats) = (infos.clone(), beats.clone());
                async move {
                    let mut info = fixtures::device_info();
                    info.device_id = d.clone();
                    info.agent_version = fleet_wire::Version::try_from("1.2.0").unwrap();
                    info.published_at = now;
                    infos.put(d.as_str(), serde_json::to_vec(&info).unwrap().into()).await?;
                    let mut hb = fixtures::heartbeat();
                    hb.device_id = d.clone();
                    hb.agent_version = info.agent_version;
                    hb.at = now;
                    beats.put(d.as_str(), serde_json::to_vec(&hb).unwrap().into()).await
                }
            })
            .buffer_unordered(64)
            .collect()
            .await;
        assert!(written.iter().all(|r| r.is_ok()), "writing device info failed");
        // The timed device page's agent upgrade, as its agent would publish it: a failed attempt with its
        // transitions, so the page draws its timeline (the operator mirrors this key into the Device's status).
        let mut failed = fixtures::failed_status();
        failed.device_id = DeviceId::try_from("device-000100").unwrap();
        stores[layout::AGENT_UPGRADE_STATUS]
            .put("device-000100", serde_json::to_vec(&failed).unwrap().into())
            .await
            .unwrap();

        // An AgentRelease and a FleetDeployment over every Device, each with a staged rollout (canaries first).
        let group: DeviceGroup = serde_json::from_value(json!({"apiVersion": "fleet.nationtech.io/v1alpha1",
            "kind": "DeviceGroup", "metadata": {"name": "all"}, "spec": {"selectAll": true}})).unwrap();
        Api::<DeviceGroup>::all(client.clone()).create(&PostParams::default(), &group).await.unwrap();
        let art = fixtures::attempt();
        let release: AgentRelease = serde_json::from_value(json!({"apiVersion": "fleet.nationtech.io/v1alpha1",
            "kind": "AgentRelease", "metadata": {"name": RELEASE},
            "spec": {"allowedGroups": ["all"], "rollout": {"soakSeconds": 600, "maxUnavailable": "1%"},
                "builds": [{"architecture": "arm64", "version": "2.0.0", "artifact": art.artifact.to_string(),
                    "sha256": art.sha256.as_str(), "byteLimit": 20_000_000}]}})).unwrap();
        let releases: Api<AgentRelease> = Api::all(client.clone());
        releases.create(&PostParams::default(), &release).await.unwrap();
        let deployment: FleetDeployment = serde_json::from_value(json!({"apiVersion": "fleet.nationtech.io/v1alpha1",
            "kind": "FleetDeployment", "metadata": {"name": DEPLOYMENT},
            "spec": {"allowedGroups": ["all"], "targetSelector": {}, "workloads": [fixtures::workload("web")],
                "rollout": {"maxUnavailable": "1%"}}})).unwrap();
        let deployments: Api<FleetDeployment> = Api::all(client.clone());
        deployments.create(&PostParams::default(), &deployment).await.unwrap();

        // References: kube's client listing the same CRs; loading the whole plan from NATS.
        let mut list_devices = vec![];
        let mut list_bytes = 0;
        for _ in 0..rounds {
            let t = Instant::now();
            let l = devices.list(&ListParams::default()).await.unwrap();
            list_devices.push(t.elapsed().as_secs_f64() * 1000.0);
            assert_eq!(l.items.len(), n);
            list_bytes = serde_json::to_vec(&l).unwrap().len();
        }
        let mut list_releases = vec![];
        let mut list_deployments = vec![];
        for _ in 0..rounds {
            let t = Instant::now();
            assert_eq!(releases.list(&ListParams::default()).await.unwrap().items.len(), 1);
            list_releases.push(t.elapsed().as_secs_f64() * 1000.0);
            let t = Instant::now();
            assert_eq!(deployments.list(&ListParams::default()).await.unwrap().items.len(), 1);
            list_deployments.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        let mut get_run = vec![];
        for _ in 0..rounds {
            let t = Instant::now();
            runs.get("big-run").await.unwrap();
            get_run.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        let mut load_plan = vec![];
        for _ in 0..rounds {
            let t = Instant::now();
            let p = fleet_operator::tasks::store::load(&stores[layout::TASK_PLANS], &uid).await.unwrap().unwrap();
            load_plan.push(t.elapsed().as_secs_f64() * 1000.0);
            assert_eq!(p.targets().count(), plan_n);
        }

        // A FleetLock server with a full history: 150 grants and 100 releases (the newest 200 events kept), 50
        // devices holding a slot.
        let fl_bin = std::env::var("FLEETLOCK_SERVER_BIN")
            .expect("FLEETLOCK_SERVER_BIN: path of the fleetlock-server binary");
        let fl_cfg = dir.path().join("fleetlock.yaml");
        let fl_dir = dir.path().join("fleetlock");
        std::fs::write(&fl_cfg, format!("store: {{kind: file, dir: {}}}\ndefault_slots: 200\n", fl_dir.display()))
            .unwrap();
        let fl = fleet_rig::fleetlock::ServerProcess::start(std::path::Path::new(&fl_bin), &fl_cfg).unwrap();
        for (lock, ids) in [(true, 0..150), (false, 0..100)] {
            for i in ids {
                let a = fl.conn().unwrap().fleetlock(lock, &format!("device-{i:06}"), "default").unwrap();
                assert_eq!(a.status, 200, "fleetlock {lock} {i}");
            }
        }
        let fl_url = format!("http://{}", fl.addr);
        let mut fl_status = vec![];
        let mut fl_bytes = 0;
        for _ in 0..rounds {
            let t = Instant::now();
            let body = ureq::get(format!("{fl_url}/v1/status")).call().unwrap().body_mut().read_to_vec().unwrap();
            fl_status.push(t.elapsed().as_secs_f64() * 1000.0);
            fl_bytes = body.len();
        }

        // The operator with the dashboard on.
        let addr = fleet_rig::fleetlock::free_addr().unwrap();
        let child = std::process::Command::new(&bin)
            .args(["--nats-url", &nats.url(), "--dashboard-listen", &addr.to_string()])
            .args(["--dashboard-fleetlock-url", &fl_url])
            .arg("--dashboard-token-file")
            .arg(&token_file)
            .env("KUBECONFIG", &kubeconfig)
            .env("RUST_LOG", "warn")
            .spawn()
            .expect("start fleet-operator");
        let pid = child.id();
        let _op = Kill(child);
        let base = format!("http://{addr}");
        let get = move |path: &str| -> (u16, usize, f64, String) {
            let agent = ureq::Agent::new_with_config(
                ureq::Agent::config_builder()
                    .http_status_as_error(false)
                    .timeout_global(Some(Duration::from_secs(60)))
                    .build(),
            );
            let t = Instant::now();
            match agent.get(format!("{base}{path}")).header("Authorization", &format!("Bearer {TOKEN}")).call() {
                Ok(mut r) => {
                    let body = r.body_mut().with_config().limit(64 << 20).read_to_string().unwrap_or_default();
                    (r.status().as_u16(), body.len(), t.elapsed().as_secs_f64() * 1000.0, body)
                }
                Err(_) => (0, 0, 0.0, String::new()),
            }
        };
        let t = Instant::now();
        let want = format!("{n} devices");
        // The overview with its bars, and a rollout bar for each rollout (the operator wrote both statuses).
        let marks = [
            "data-bar=\"agent-versions\"".to_string(),
            "data-bar=\"heartbeat-ages\"".into(),
            "data-bar=\"workloads\"".into(),
            format!("data-bar=\"AgentRelease/{RELEASE}\""),
            format!("data-bar=\"FleetDeployment/{DEPLOYMENT}\""),
        ];
        loop {
            let g = get.clone();
            let (code, _, _, body) = tokio::task::spawn_blocking(move || g("/")).await.unwrap();
            let missing: Vec<&String> = marks.iter().filter(|m| !body.contains(m.as_str())).collect();
            if code == 200 && body.contains(&want) && body.contains("1 task runs") && missing.is_empty() {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(300),
                "the overview did not show {n} devices and every bar (missing: {missing:?}; {} devices: {}):\n{body}",
                want,
                body.contains(&want)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let ready_secs = t.elapsed().as_secs_f64();
        // The Reboots page once the dashboard has read the FleetLock status (every 15 s), and the device page once
        // the operator has mirrored the device's upgrade status.
        loop {
            let g = get.clone();
            let (code, _, _, body) = tokio::task::spawn_blocking(move || g("/reboots")).await.unwrap();
            let g = get.clone();
            let (_, _, _, device) = tokio::task::spawn_blocking(move || g("/devices/device-000100")).await.unwrap();
            if code == 200 && body.contains("data-holds=") && body.contains("data-event=") && device.contains("data-timeline=") {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(360),
                "the Reboots page shows no history or the device page no timeline:\n{body}\n{device}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let rss_idle = proc_mib(pid, "VmRSS:");
        let last_page = plan_n.div_ceil(fleet_operator::dashboard::runs::DEVICES_PER_RUN_PAGE) - 1;
        let pages: Vec<(String, String)> = vec![
            ("overview `/`".into(), "/".into()),
            ("device list, first page `/devices`".into(), "/devices".into()),
            ("device page `/devices/device-000100`".into(), "/devices/device-000100".into()),
            ("run history `/runs`".into(), "/runs".into()),
            ("run page 1 (canaries, 200 devices with status)".into(), format!("/runs/{ns}/big-run")),
            (format!("run page {} (last chunk, no status)", last_page + 1), format!("/runs/{ns}/big-run?page={last_page}")),
            ("release list `/releases`".into(), "/releases".into()),
            (format!("release page `/releases/{RELEASE}`"), format!("/releases/{RELEASE}")),
            ("deployment list `/deployments`".into(), "/deployments".into()),
            (format!("deployment page `/deployments/{DEPLOYMENT}`"), format!("/deployments/{DEPLOYMENT}")),
            ("reboots `/reboots` (50 holders, 200 recent events)".into(), "/reboots".into()),
            ("`/metrics`".into(), "/metrics".into()),
        ];
        let mut rows = vec![];
        for (label, path) in pages {
            let mut times = vec![];
            let mut bytes = 0;
            for _ in 0..rounds {
                let g = get.clone();
                let p = path.clone();
                let (code, len, ms, body) = tokio::task::spawn_blocking(move || g(&p)).await.unwrap();
                assert_eq!(code, 200, "{path}");
                // A rollout page that lost its bar would be timed doing less than it should.
                if path.starts_with("/releases") || path.starts_with("/deployments") {
                    assert!(body.contains("<svg"), "{path} has no bar");
                }
                if path.starts_with("/devices/") {
                    assert!(body.contains("data-timeline="), "{path} has no timeline");
                }
                if path == "/" {
                    assert!(body.contains("data-samples="), "the overview has no version history");
                }
                times.push(ms);
                bytes = len;
            }
            rows.push((label, stats(times), bytes));
        }
        let rss = proc_mib(pid, "VmRSS:");
        let hwm = proc_mib(pid, "VmHWM:");
        println!("| dashboard: real fleet-operator, {n} Devices, a {plan_n}-device plan | time (median of {rounds}, range) | size |");
        println!("|---|---|---|");
        println!("| reference: kube client lists the {n} Devices | {} | {:.1} KB (JSON) |", stats(list_devices), kb(list_bytes));
        println!("| reference: kube client gets the TaskRun | {} | |", stats(get_run));
        println!("| reference: kube client lists the AgentReleases (1) | {} | |", stats(list_releases));
        println!("| reference: kube client lists the FleetDeployments (1) | {} | |", stats(list_deployments));
        println!("| reference: load the whole {plan_n}-device plan from NATS (tasks::store::load) | {} | |", stats(load_plan));
        println!("| reference: fleetlock-server `GET /v1/status` (50 holders, 200 recent events) | {} | {:.1} KB (JSON) |", stats(fl_status), kb(fl_bytes));
        for (label, t, bytes) in rows {
            println!("| {label} | {t} | {:.1} KB |", kb(bytes));
        }
        println!();
        println!("| setup and memory | value |");
        println!("|---|---|");
        println!("| creating {n} Devices with statuses (setup only) | {create_secs:.1} s |");
        println!("| operator start → overview shows {n} devices | {ready_secs:.1} s |");
        println!("| operator RSS after start-up / after the pages / peak | {rss_idle:.1} MiB / {rss:.1} MiB / {hwm:.1} MiB |");
    });
}
