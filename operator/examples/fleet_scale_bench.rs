//! Fleet-scale benchmark (run by `scripts/bench.d/90-fleet-scale.sh`, one N per run): a real kube-apiserver +
//! etcd, a real nats-server, the release `fleet-operator` and `fleet-sim` playing N devices. Measures onboarding
//! (every Device object exists), a steady-state window (CPU and RSS of operator, apiserver, etcd and nats-server;
//! apiserver writes/s by verb and resource from its `/metrics`; etcd growth; heartbeat → Device status lag, the
//! age of each Device's `lastHeartbeat` (refreshed hourly) and the heartbeat age the operator's dashboard and
//! alerts read, from its `/metrics`), a FleetDeployment to every desired-state key and an AgentRelease to
//! every intent and to every device up to date (or failed). Prints a Markdown table and writes `key value` lines
//! to `$FLEET_SCALE_RESULTS` for the script's goal rows.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use fleet_operator::crd::{AgentRelease, Device, DeviceGroup, FleetDeployment};
use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn env_num<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn now_ms() -> u64 {
    fleet_wire::Timestamp::now().unix_ms()
}

/// (utime + stime) of `pid` in clock ticks, from `/proc/<pid>/stat`.
fn cpu_ticks(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The command name may hold spaces: fields count from after its closing parenthesis.
    let rest = s.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let n = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    n(11) + n(12)
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

fn rss_mib(pid: u32) -> f64 {
    status_mib(pid, "VmRSS:")
}

/// The highest RSS the process has had since it started (the kernel's high-water mark).
fn peak_rss_mib(pid: u32) -> f64 {
    status_mib(pid, "VmHWM:")
}

fn status_mib(pid: u32, field: &str) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1024.0
}

fn dir_bytes(p: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(p) else {
        return std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    };
    rd.flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_bytes(&e.path()),
            _ => e.metadata().map(|m| m.len()).unwrap_or(0),
        })
        .sum()
}

/// Write requests counted by the apiserver: (verb, resource[/subresource]) → count, summed over codes.
fn apiserver_writes(url: &str, ca: &Path, header_file: &Path) -> BTreeMap<(String, String), f64> {
    let out = std::process::Command::new("curl")
        .args(["-s", "--max-time", "10", "--cacert"])
        .arg(ca)
        .arg("-H")
        .arg(format!("@{}", header_file.display()))
        .arg(format!("{url}/metrics"))
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut m = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let label = |name: &str| {
            labels
                .split("\",")
                .find_map(|kv| kv.strip_prefix(&format!("{name}=\"")))
                .map(|v| v.trim_end_matches('"').to_owned())
                .unwrap_or_default()
        };
        let verb = label("verb");
        if !matches!(verb.as_str(), "POST" | "PUT" | "PATCH" | "DELETE" | "APPLY") {
            continue;
        }
        let (res, sub) = (label("resource"), label("subresource"));
        let res = if sub.is_empty() {
            res
        } else {
            format!("{res}/{sub}")
        };
        // A write the API server refused is counted apart, with its code.
        let code = label("code");
        let res = if code.starts_with('2') {
            res
        } else {
            format!("{res}, answered {code}")
        };
        *m.entry((verb, res)).or_insert(0.0) += value.trim().parse::<f64>().unwrap_or(0.0);
    }
    m
}

/// The operator's `fleet_device_heartbeat_age_seconds{quantile="0.99"}` (liveness as its dashboard and alerts see
/// it), from its `/metrics`.
fn dashboard_heartbeat_age_p99(addr: &str, token: &str) -> Option<u64> {
    let out = std::process::Command::new("curl")
        .args(["-s", "--max-time", "10", "-H"])
        .arg(format!("Authorization: Bearer {token}"))
        .arg(format!("http://{addr}/metrics"))
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout).lines().find_map(|l| {
        let v = l.strip_prefix("fleet_device_heartbeat_age_seconds{quantile=\"0.99\"} ")?;
        v.trim().parse::<u64>().ok()
    })
}

/// The API server's registered watchers of the fleet kinds (`apiserver_registered_watchers`), by kind.
fn apiserver_fleet_watchers(url: &str, ca: &Path, header_file: &Path) -> BTreeMap<String, f64> {
    let Ok(out) = std::process::Command::new("curl")
        .args(["-s", "--max-time", "10", "--cacert"])
        .arg(ca)
        .arg("-H")
        .arg(format!("@{}", header_file.display()))
        .arg(format!("{url}/metrics"))
        .output()
    else {
        return BTreeMap::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("apiserver_registered_watchers{")?;
            let (labels, v) = rest.rsplit_once("} ")?;
            if !labels.contains("group=\"fleet.nationtech.io\"") {
                return None;
            }
            let kind = labels
                .split("kind=\"")
                .nth(1)?
                .split('"')
                .next()?
                .to_owned();
            Some((kind, v.trim().parse::<f64>().ok()?))
        })
        .collect()
}

/// Every sample of the operator's `/metrics` (series with its labels → value).
fn operator_metrics(addr: &str, token: &str) -> BTreeMap<String, f64> {
    let Ok(out) = std::process::Command::new("curl")
        .args(["-s", "--max-time", "10", "-H"])
        .arg(format!("Authorization: Bearer {token}"))
        .arg(format!("http://{addr}/metrics"))
        .output()
    else {
        return BTreeMap::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, v) = l.rsplit_once(' ')?;
            Some((series.to_owned(), v.trim().parse::<f64>().ok()?))
        })
        .collect()
}

/// Rows for what the operator did between two `/metrics` samples: Device writes by kind with their mean API
/// server latency, and passes with their mean duration.
fn operator_work(
    out: &mut Out,
    when: &str,
    m0: &BTreeMap<String, f64>,
    m1: &BTreeMap<String, f64>,
    secs: f64,
) {
    let delta = |k: &str| m1.get(k).copied().unwrap_or(0.0) - m0.get(k).copied().unwrap_or(0.0);
    let mut parts = vec![];
    for kind in ["create", "status"] {
        let base = "fleet_operator_device_write_duration_seconds";
        let (n, sum) = (
            delta(&format!("{base}_count{{kind=\"{kind}\"}}")),
            delta(&format!("{base}_sum{{kind=\"{kind}\"}}")),
        );
        let mean = if n > 0.0 { sum / n * 1000.0 } else { 0.0 };
        parts.push(format!(
            "{n:.0} {kind} ({:.1}/s, mean {mean:.0} ms)",
            n / secs
        ));
    }
    let (n, sum) = (
        delta("fleet_operator_pass_duration_seconds_count"),
        delta("fleet_operator_pass_duration_seconds_sum"),
    );
    let mean = if n > 0.0 { sum / n * 1000.0 } else { 0.0 };
    out.row(
        format!("operator, {when}: Device writes; passes"),
        format!(
            "{}; {:.0} waiting at the end; {n:.0} passes (mean {mean:.0} ms)",
            parts.join(", "),
            m1.get("fleet_operator_device_writes_waiting")
                .copied()
                .unwrap_or(0.0)
        ),
    );
}

fn quantile(v: &mut [u64], q: f64) -> Option<u64> {
    if v.is_empty() {
        return None;
    }
    v.sort_unstable();
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    Some(v[rank - 1])
}

struct Kill(std::process::Child);
impl Drop for Kill {
    fn drop(&mut self) {
        // SIGTERM first so the simulator prints its last counters.
        // SAFETY: kill(2) on a child we started and still own.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(5) {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What the Device watch keeps: each Device's `lastHeartbeat`, and heartbeat lags while recording.
#[derive(Default)]
struct Seen {
    heartbeat: HashMap<String, Option<String>>,
    recording: bool,
    lags_ms: Vec<u64>,
}

/// Distinct keys written to a bucket since the last reset (what the operator wrote, seen on its subjects).
#[derive(Default)]
struct Keys {
    written: HashSet<String>,
}

/// The one device the bench itself plays beside fleet-sim's: it publishes its info and one heartbeat, then falls
/// silent, so that the time to its `DeviceSilent` alert is measured under the fleet's load. Not counted among the
/// N in any other row.
const SILENT: &str = "fleet-scale-silent";

/// Publishes the silent device's info and its only heartbeat (the fixtures' shapes, its own id, `at` now); returns
/// that `at` in Unix ms.
async fn publish_silent_device(js: &async_nats::jetstream::Context) -> u64 {
    let id = fleet_wire::DeviceId::try_from(SILENT).unwrap();
    let at = fleet_wire::Timestamp::now();
    let mut info = fleet_wire::fixtures::device_info();
    info.device_id = id.clone();
    info.architecture = fleet_wire::Architecture::Amd64;
    info.published_at = at;
    let mut hb = fleet_wire::fixtures::heartbeat();
    hb.device_id = id;
    hb.at = at;
    for (bucket, value) in [
        (
            fleet_wire::kv::DEVICE_INFO,
            serde_json::to_vec(&info).unwrap(),
        ),
        (
            fleet_wire::kv::DEVICE_HEARTBEAT,
            serde_json::to_vec(&hb).unwrap(),
        ),
    ] {
        js.get_key_value(bucket)
            .await
            .unwrap()
            .put(SILENT, value.into())
            .await
            .unwrap();
    }
    at.unix_ms()
}

/// Polls the `DeviceSilent` Warning event about the silent device every second until `limit`; returns when it
/// was first seen, in Unix ms.
async fn silent_alert_seen(client: kube::Client, limit: Duration) -> Option<u64> {
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client, "default");
    let lp = kube::api::ListParams::default()
        .fields(&format!("involvedObject.name={SILENT},reason=DeviceSilent"));
    let t = Instant::now();
    while t.elapsed() < limit {
        if events.list(&lp).await.is_ok_and(|l| !l.items.is_empty()) {
            return Some(now_ms());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    None
}

async fn count_keys(nc: async_nats::Client, bucket: &str, keys: Arc<Mutex<Keys>>) {
    let prefix = format!("$KV.{bucket}.");
    let mut sub = nc.subscribe(format!("{prefix}>")).await.expect("subscribe");
    while let Some(m) = sub.next().await {
        let op = m
            .headers
            .as_ref()
            .and_then(|h| h.get("KV-Operation"))
            .map(|v| v.as_str().to_owned());
        if matches!(op.as_deref(), Some("DEL") | Some("PURGE")) {
            continue;
        }
        if let Some(k) = m.subject.as_str().strip_prefix(&prefix) {
            if k != SILENT {
                keys.lock().unwrap().written.insert(k.to_owned());
            }
        }
    }
}

struct Out {
    rows: Vec<(String, String)>,
    results: Vec<(String, String)>,
}
impl Out {
    /// A row of the table (printed at the end), shown on stderr as it is measured: a long run shows its progress.
    fn row(&mut self, what: impl Into<String>, value: impl Into<String>) {
        let (what, value) = (what.into(), value.into());
        eprintln!("  measured: {what}: {value}");
        self.rows.push((what, value));
    }
    fn result(&mut self, key: &str, value: impl ToString) {
        self.results.push((key.to_owned(), value.to_string()));
    }
}

async fn wait_until(limit: Duration, mut done: impl FnMut() -> bool) -> Option<f64> {
    let t = Instant::now();
    loop {
        if done() {
            return Some(t.elapsed().as_secs_f64());
        }
        if t.elapsed() >= limit {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn main() {
    let n: usize = env_num("FLEET_SCALE_DEVICES", 1000);
    let steady = Duration::from_secs(env_num("FLEET_SCALE_STEADY_SECS", 180));
    let settle = Duration::from_secs(env_num("FLEET_SCALE_SETTLE_SECS", 30));
    let limit = Duration::from_secs(env_num("FLEET_SCALE_TIMEOUT_SECS", 900));
    let connections: usize = env_num("FLEET_SCALE_CONNECTIONS", 8).clamp(1, n);
    let fail: f64 = env_num("FLEET_SCALE_FAIL_FRACTION", 0.01);
    let heartbeat_secs: u64 = env_num("FLEET_SCALE_HEARTBEAT_SECS", 30);
    let silent_after: u64 = env_num("FLEET_SCALE_SILENT_AFTER_SECS", 90);
    let op_bin =
        std::env::var("FLEET_OPERATOR_BIN").expect("FLEET_OPERATOR_BIN: the fleet-operator binary");
    let sim_bin = std::env::var("FLEET_SIM_BIN").expect("FLEET_SIM_BIN: the fleet-sim binary");
    let results_file = std::env::var_os("FLEET_SCALE_RESULTS").map(PathBuf::from);

    let api = fleet_rig::kube::KubeApiServer::start();
    let nats = fleet_rig::NatsServer::start();
    let dir = tempfile::tempdir().expect("tmp");
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, api.kubeconfig(api.token())).expect("kubeconfig");
    // The bearer token goes to curl in a file, never on a command line.
    let header_file = dir.path().join("auth-header");
    std::fs::write(
        &header_file,
        format!("Authorization: Bearer {}\n", api.token()),
    )
    .expect("header");
    let pids = api.pids();
    let (etcd_pid, apiserver_pid) = (pids[0], pids[1]);
    let nats_pid = nats.pid().expect("nats pid");
    let etcd_dir = api.log_dir().join("etcd");
    let mut out = Out {
        rows: vec![],
        results: vec![],
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let ok = rt.block_on(async {
        let kc = kube::config::Kubeconfig::from_yaml(&api.kubeconfig(api.token())).unwrap();
        let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.unwrap();
        let client = kube::Client::try_from(cfg).unwrap();
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        for crd in fleet_operator::crd::all_crds() {
            let name = crd.metadata.name.clone().unwrap();
            crds.patch(&name, &PatchParams::apply("bench").force(), &Patch::Apply(&crd)).await.unwrap();
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        let group: DeviceGroup = serde_json::from_value(json!({"apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "DeviceGroup",
            "metadata": {"name": "all"}, "spec": {"selectAll": true}})).unwrap();
        Api::<DeviceGroup>::all(client.clone()).create(&PostParams::default(), &group).await.unwrap();

        let op_log = std::fs::File::create(dir.path().join("operator.log")).expect("log");
        // The dashboard on, as a person runs it: liveness is read from its /metrics.
        let dash_addr = format!("127.0.0.1:{}", fleet_rig::util::free_port());
        let dash_token = "fleet-scale-bench-dashboard-token";
        let token_file = dir.path().join("dashboard-token");
        std::fs::write(&token_file, dash_token).expect("token");
        let op = std::process::Command::new(&op_bin)
            .args(["--nats-url", &nats.url()])
            // Buckets with room for N devices, as docs/kv-layout.md tells a person with a fleet this size.
            .args(["--fleet-size", &n.max(fleet_wire::kv::DEFAULT_FLEET_SIZE as usize).to_string()])
            .args(["--dashboard-listen", &dash_addr])
            .arg("--dashboard-token-file")
            .arg(&token_file)
            .args(["--alert-silent-after", &format!("{silent_after}s")])
            .env("KUBECONFIG", &kubeconfig)
            .env("RUST_LOG", "warn")
            .stdout(op_log.try_clone().expect("log"))
            .stderr(op_log)
            .spawn()
            .expect("start fleet-operator");
        let op_pid = op.id();
        let _op = Kill(op);
        let nc = async_nats::connect(nats.url()).await.unwrap();
        let js = async_nats::jetstream::new(nc.clone());
        // The operator creates the buckets; the devices only open them.
        let t = Instant::now();
        while js.get_key_value(fleet_wire::kv::SYSTEM_UPGRADE_STATUS).await.is_err() {
            assert!(t.elapsed() < Duration::from_secs(120), "the operator did not create the buckets");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let desired = Arc::new(Mutex::new(Keys::default()));
        let intents = Arc::new(Mutex::new(Keys::default()));
        tokio::spawn(count_keys(nc.clone(), fleet_wire::kv::DESIRED_STATE, desired.clone()));
        tokio::spawn(count_keys(nc.clone(), fleet_wire::kv::AGENT_UPGRADE_INTENT, intents.clone()));

        // Every Device's lastHeartbeat, and the lag of each new one while recording.
        let seen = Arc::new(Mutex::new(Seen::default()));
        let devices: Api<Device> = Api::all(client.clone());
        {
            let seen = seen.clone();
            let devices = devices.clone();
            tokio::spawn(async move {
                let mut w = watcher(devices, watcher::Config::default()).boxed();
                while let Some(ev) = w.next().await {
                    let d = match ev {
                        Ok(watcher::Event::Apply(d)) | Ok(watcher::Event::InitApply(d)) => d,
                        _ => continue,
                    };
                    let Some(name) = d.metadata.name.clone().filter(|n| n != SILENT) else { continue };
                    let hb = d.status.as_ref().and_then(|s| s.last_heartbeat.clone());
                    let at = now_ms();
                    let mut s = seen.lock().unwrap();
                    let old = s.heartbeat.insert(name, hb.clone());
                    if s.recording && hb.is_some() && old.flatten() != hb {
                        if let Some(t) = hb.and_then(|h| h.parse::<fleet_wire::Timestamp>().ok()) {
                            s.lags_ms.push(at.saturating_sub(t.unix_ms()));
                        }
                    }
                }
            });
        }

        // The simulator: its counter lines go to stderr (the table is stdout), the last one is kept.
        let mut sim_cmd = std::process::Command::new(&sim_bin);
        sim_cmd
            .args(["--devices", &n.to_string(), "--connections", &connections.to_string()])
            .args(["--nats-url", &nats.url(), "--fail-fraction", &fail.to_string()])
            .args(["--heartbeat-secs", &heartbeat_secs.to_string()])
            .stdout(std::process::Stdio::piped());
        let mut sim = sim_cmd.spawn().expect("start fleet-sim");
        let sim_out = sim.stdout.take().expect("sim stdout");
        let sim_pid = sim.id();
        let sim = Kill(sim);
        let last_line = Arc::new(Mutex::new(String::new()));
        {
            let last_line = last_line.clone();
            std::thread::spawn(move || {
                use std::io::BufRead;
                for line in std::io::BufReader::new(sim_out).lines().map_while(Result::ok) {
                    eprintln!("  {line}");
                    *last_line.lock().unwrap() = line;
                }
            });
        }
        let t0 = Instant::now();
        let metrics_start = operator_metrics(&dash_addr, dash_token);
        let onboard = wait_until(limit, || seen.lock().unwrap().heartbeat.len() >= n).await;
        let onboard_devices = seen.lock().unwrap().heartbeat.len();
        match onboard {
            Some(s) => out.row(format!("onboarding: fleet-sim start → all {n} Device objects exist"), format!("{s:.1} s")),
            None => out.row("onboarding", format!("not done in {} s ({onboard_devices} of {n})", limit.as_secs())),
        }
        out.result("onboarding_secs", onboard.map_or("timeout".into(), |s| format!("{s:.1}")));
        if onboard.is_none() {
            return false;
        }
        // Every device has its (empty) desired state before the steady window.
        let initial = wait_until(limit, || desired.lock().unwrap().written.len() >= n).await;
        out.row(
            format!("fleet-sim start → all {n} empty desired states written"),
            initial.map_or("timeout".into(), |_| format!("{:.1} s", t0.elapsed().as_secs_f64())),
        );
        // Onboarding is over when every Device has its first status and the operator's writer has nothing left
        // waiting: the steady window measures steady state, not the tail of onboarding.
        let statused = wait_until(limit, || {
            let s = seen.lock().unwrap();
            s.heartbeat.len() >= n && s.heartbeat.values().all(Option::is_some)
        })
        .await;
        let mut drained = statused.is_some();
        while drained && operator_metrics(&dash_addr, dash_token).get("fleet_operator_device_writes_waiting").copied().unwrap_or(1.0) > 0.0 {
            if t0.elapsed() >= limit {
                drained = false;
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let done = t0.elapsed().as_secs_f64();
        out.row(
            "fleet-sim start → every Device with its first status and no Device write waiting",
            if drained { format!("{done:.1} s") } else { format!("not done in {} s", limit.as_secs()) },
        );
        out.result("onboarding_status_secs", if drained { format!("{done:.1}") } else { "timeout".into() });
        out.row(
            "fleet-operator RSS after onboarding: now / peak so far",
            format!("{:.0} MiB / {:.0} MiB", rss_mib(op_pid), peak_rss_mib(op_pid)),
        );
        if !drained {
            // What was left, and what the operator and the servers were doing: the numbers that say what saturates.
            let (with, total) = {
                let s = seen.lock().unwrap();
                (s.heartbeat.values().filter(|h| h.is_some()).count(), s.heartbeat.len())
            };
            let m = operator_metrics(&dash_addr, dash_token);
            let waiting = m.get("fleet_operator_device_writes_waiting").copied().unwrap_or(-1.0);
            out.row("at the time-out: Devices with a first status; Device writes waiting", format!("{with} of {total}; {waiting:.0}"));
            operator_work(&mut out, "fleet-sim start → time-out", &metrics_start, &m, t0.elapsed().as_secs_f64());
            let life = |p: u32| {
                let since = std::fs::metadata(format!("/proc/{p}")).and_then(|m| m.modified()).ok();
                let secs = since.and_then(|t| t.elapsed().ok()).map_or(1.0, |d| d.as_secs_f64().max(1.0));
                cpu_ticks(p) as f64 / clock_ticks() / secs * 100.0
            };
            for (name, p) in [("fleet-operator", op_pid), ("kube-apiserver", apiserver_pid), ("etcd", etcd_pid), ("nats-server", nats_pid)] {
                out.row(format!("{name} at the time-out: CPU since start (% of one core) / RSS"), format!("{:.0} % / {:.0} MiB", life(p), rss_mib(p)));
            }
            return false;
        }
        tokio::time::sleep(settle).await;
        let metrics_steady = operator_metrics(&dash_addr, dash_token);
        operator_work(&mut out, "fleet-sim start → end of settling", &metrics_start, &metrics_steady, t0.elapsed().as_secs_f64());

        // Steady state: heartbeats and workload statuses only.
        let tick = clock_ticks();
        let procs = [("fleet-operator", op_pid), ("kube-apiserver", apiserver_pid), ("etcd", etcd_pid), ("nats-server", nats_pid), ("fleet-sim", sim_pid)];
        let cpu0: Vec<u64> = procs.iter().map(|(_, p)| cpu_ticks(*p)).collect();
        let writes0 = apiserver_writes(&api.url(), api.ca_file(), &header_file);
        let (db0, dir0) = (dir_bytes(&etcd_dir.join("member/snap/db")), dir_bytes(&etcd_dir));
        let mut rss_max = vec![0.0f64; procs.len()];
        let mut ages: Vec<u64> = vec![];
        let mut live_p99: Vec<u64> = vec![];
        let mut never = 0u64;
        seen.lock().unwrap().recording = true;
        let silent_at = publish_silent_device(&js).await;
        let silent_seen = tokio::spawn(silent_alert_seen(client.clone(), steady + Duration::from_secs(silent_after + 120)));
        let w0 = Instant::now();
        while w0.elapsed() < steady {
            tokio::time::sleep(Duration::from_secs(10).min(steady.saturating_sub(w0.elapsed())).max(Duration::from_millis(10))).await;
            for (i, (_, p)) in procs.iter().enumerate() {
                rss_max[i] = rss_max[i].max(rss_mib(*p));
            }
            if let Some(a) = dashboard_heartbeat_age_p99(&dash_addr, dash_token) {
                live_p99.push(a * 1000);
            }
            let now = now_ms();
            let s = seen.lock().unwrap();
            // A Device without a heartbeat yet has no age: counted apart.
            for h in s.heartbeat.values() {
                match h.as_ref().and_then(|h| h.parse::<fleet_wire::Timestamp>().ok()) {
                    Some(t) => ages.push(now.saturating_sub(t.unix_ms())),
                    None => never += 1,
                }
            }
        }
        let window = w0.elapsed().as_secs_f64();
        let mut lags = {
            let mut s = seen.lock().unwrap();
            s.recording = false;
            std::mem::take(&mut s.lags_ms)
        };
        let writes1 = apiserver_writes(&api.url(), api.ca_file(), &header_file);
        let watchers = apiserver_fleet_watchers(&api.url(), api.ca_file(), &header_file);
        out.row(
            "API server watchers of the fleet kinds (the bench's own Device watch included)",
            watchers.iter().map(|(k, v)| format!("{k} {v:.0}")).collect::<Vec<_>>().join(", "),
        );
        out.result("device_watchers", watchers.get("Device").map_or("none".into(), |v| format!("{v:.0}")));
        // One NATS link for the whole operator : the controllers and the dashboard share it.
        let links = fleet_rig::util::tcp_connections_to(op_pid, nats.port());
        out.row("the operator's NATS connections", links.to_string());
        out.result("operator_nats_connections", links.to_string());
        let (db1, dir1) = (dir_bytes(&etcd_dir.join("member/snap/db")), dir_bytes(&etcd_dir));
        out.row("steady window", format!("{window:.0} s, after {} s settling", settle.as_secs()));
        operator_work(&mut out, "steady window", &metrics_steady, &operator_metrics(&dash_addr, dash_token), window);
        for (i, (name, p)) in procs.iter().enumerate() {
            let cpu = (cpu_ticks(*p).saturating_sub(cpu0[i])) as f64 / tick / window * 100.0;
            out.row(format!("{name}: CPU (% of one core) / max RSS"), format!("{cpu:.1} % / {:.0} MiB", rss_max[i]));
            let key = name.replace('-', "_");
            out.result(&format!("{key}_cpu_pct"), format!("{cpu:.1}"));
            out.result(&format!("{key}_rss_mib"), format!("{:.0}", rss_max[i]));
        }
        let mut total = 0.0;
        let mut by: Vec<(String, f64)> = writes1
            .iter()
            .map(|(k, v)| (format!("{} {}", k.0, k.1), (v - writes0.get(k).copied().unwrap_or(0.0)) / window))
            .filter(|(_, r)| *r > 0.0)
            .collect();
        by.sort_by(|a, b| b.1.total_cmp(&a.1));
        for (_, r) in &by {
            total += r;
        }
        out.row("apiserver writes/s (POST, PUT, PATCH, DELETE, APPLY), total", format!("{total:.1}"));
        out.result("apiserver_writes_per_sec", format!("{total:.1}"));
        for (what, r) in by.iter().take(8) {
            out.row(format!("  {what}"), format!("{r:.2}/s"));
        }
        out.row(
            "etcd growth: bbolt db file / whole data dir (WAL included)",
            format!("{:.1} KiB/s / {:.1} KiB/s", (db1 as f64 - db0 as f64) / window / 1024.0, (dir1 as f64 - dir0 as f64) / window / 1024.0),
        );
        let (p50, p99) = (quantile(&mut lags, 0.5), quantile(&mut lags, 0.99));
        let secs = |v: Option<u64>| v.map_or("-".into(), |ms| format!("{:.1}", ms as f64 / 1000.0));
        out.row(
            "heartbeat → Device status lag (sent `at` → watch event), p50 / p99",
            format!("{} s / {} s ({} updates)", secs(p50), secs(p99), lags.len()),
        );
        out.result("heartbeat_lag_p99_secs", secs(p99));
        let (a99, amax) = (quantile(&mut ages, 0.99), ages.iter().max().copied());
        out.row(
            "Device lastHeartbeat age, sampled every 10 s: p99 / max",
            format!("{} s / {} s ({} samples; {never} of a Device without a heartbeat yet)", secs(a99), secs(amax), ages.len()),
        );
        out.result("device_heartbeat_age_p99_secs", secs(a99));
        let (l99, lmax) = (quantile(&mut live_p99, 0.5), live_p99.iter().max().copied());
        out.row(
            "liveness the dashboard and alerts read (heartbeat mirror): age p99, sampled every 10 s: median / max",
            format!("{} s / {} s ({} samples)", secs(l99), secs(lmax), live_p99.len()),
        );
        out.result("heartbeat_age_p99_secs", secs(lmax));
        // Detection: from the silent device's last heartbeat past the threshold to its alert (evaluated every
        // 15 s, so up to 15 s plus the pass's own time).
        let seen_at = silent_seen.await.ok().flatten();
        let beyond = seen_at.map(|t| t.saturating_sub(silent_at) as f64 / 1000.0 - silent_after as f64);
        out.row(
            format!("silent device: last heartbeat → DeviceSilent event (--alert-silent-after {silent_after}s), time beyond the threshold"),
            beyond.map_or("no alert".into(), |b| format!("{b:.1} s")),
        );
        out.result("silent_detection_secs", beyond.map_or("none".into(), |b| format!("{b:.1}")));

        // A FleetDeployment to every desired-state key.
        desired.lock().unwrap().written.clear();
        let dep: FleetDeployment = serde_json::from_value(json!({"apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "FleetDeployment",
            "metadata": {"name": "web"}, "spec": {"allowedGroups": ["all"], "workloads": [{"name": "web", "image": "localhost/web:1"}]}})).unwrap();
        Api::<FleetDeployment>::all(client.clone()).create(&PostParams::default(), &dep).await.unwrap();
        let fd = wait_until(limit, || desired.lock().unwrap().written.len() >= n).await;
        let fd_keys = desired.lock().unwrap().written.len();
        out.row(
            format!("FleetDeployment create → all {n} desired-state keys written"),
            fd.map_or(format!("not done in {} s ({fd_keys} of {n})", limit.as_secs()), |s| format!("{s:.2} s ({:.0} keys/s)", n as f64 / s)),
        );
        out.result("fleetdeployment_secs", fd.map_or("timeout".into(), |s| format!("{s:.2}")));
        out.row(
            "fleet-operator RSS after FleetDeployment: now / peak so far",
            format!("{:.0} MiB / {:.0} MiB", rss_mib(op_pid), peak_rss_mib(op_pid)),
        );

        // An AgentRelease to every intent, then to every device up to date (or failed: the simulator's fraction).
        let rel: AgentRelease = serde_json::from_value(json!({"apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "AgentRelease",
            "metadata": {"name": "v2"}, "spec": {"allowedGroups": ["all"], "builds": [{"architecture": "amd64", "version": "2.0.0",
            "artifact": "https://artifacts.example.com/fleet-agent-2.0.0-amd64", "sha256": "ab".repeat(32), "byteLimit": 20_000_000}]}})).unwrap();
        let releases: Api<AgentRelease> = Api::all(client.clone());
        releases.create(&PostParams::default(), &rel).await.unwrap();
        let t = Instant::now();
        let ar = wait_until(limit, || intents.lock().unwrap().written.len() >= n).await;
        let ar_keys = intents.lock().unwrap().written.len();
        out.row(
            format!("AgentRelease create → all {n} agent-upgrade intents written"),
            ar.map_or(format!("not done in {} s ({ar_keys} of {n})", limit.as_secs()), |s| format!("{s:.2} s")),
        );
        out.result("agentrelease_intents_secs", ar.map_or("timeout".into(), |s| format!("{s:.2}")));
        let mut done = None;
        let mut last = (0, 0);
        while t.elapsed() < limit {
            if let Ok(r) = releases.get("v2").await {
                let st = r.status.unwrap_or_default();
                last = (st.up_to_date.unwrap_or(0), st.failed.unwrap_or(0));
                if (last.0 + last.1) as usize >= n {
                    done = Some(t.elapsed().as_secs_f64());
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        out.row(
            format!("AgentRelease create → status: every device up to date or failed ({:.1}% fail)", fail * 100.0),
            match done {
                Some(s) => format!("{s:.1} s ({} up to date, {} failed)", last.0, last.1),
                None => format!("not done in {} s ({} up to date, {} failed)", limit.as_secs(), last.0, last.1),
            },
        );
        out.result("agentrelease_done_secs", done.map_or("timeout".into(), |s| format!("{s:.1}")));
        out.row(
            "fleet-operator RSS after AgentRelease: now / peak so far",
            format!("{:.0} MiB / {:.0} MiB", rss_mib(op_pid), peak_rss_mib(op_pid)),
        );

        // A TaskRun (apt full-upgrade) of every device: planned, every device released (no canary, so all at once),
        // until every simulated device's result is counted (fleet-sim fails its fraction). The silent device is a
        // target too and never answers: the run stays Running with it stalled, as it would in a real fleet.
        let run: fleet_operator::crd::tasks::TaskRun = serde_json::from_value(json!({"apiVersion": "fleet.nationtech.io/v1alpha1",
            "kind": "TaskRun", "metadata": {"name": "upgrade-all", "namespace": "default"},
            "spec": {"allowedGroups": ["all"], "targetSelector": {}, "deadlineSeconds": 86400, "systemUpgradeV1": {}}})).unwrap();
        let runs: Api<fleet_operator::crd::tasks::TaskRun> = Api::namespaced(client.clone(), "default");
        runs.create(&PostParams::default(), &run).await.unwrap();
        let t = Instant::now();
        let mut ended = None;
        let mut seen = String::from("no status");
        while t.elapsed() < limit {
            if let Some(st) = runs.get("upgrade-all").await.ok().and_then(|r| r.status) {
                let r = st.run;
                let phase = r.phase.map_or("no phase".to_owned(), |p| format!("{p:?}"));
                seen = format!("{phase}: {} targets, {} succeeded, {} failed", r.targets, r.succeeded, r.failed);
                if (r.succeeded + r.failed) as usize >= n {
                    ended = Some(t.elapsed().as_secs_f64());
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        out.row(
            format!("TaskRun of all {n} devices (and the silent one): create → every simulated device's result counted"),
            match ended {
                Some(s) => format!("{s:.1} s ({seen})"),
                None => format!("not done in {} s ({seen})", limit.as_secs()),
            },
        );
        out.result("taskrun_secs", ended.map_or("timeout".into(), |s| format!("{s:.1}")));
        // Not a goal (the goal is the steady window's): the whole run's peak, onboarding and rollouts included.
        out.row(
            "fleet-operator peak RSS over the whole run (onboarding, FleetDeployment, AgentRelease, TaskRun)",
            format!("{:.0} MiB", peak_rss_mib(op_pid)),
        );
        drop(sim);
        std::thread::sleep(Duration::from_millis(300));
        let line = last_line.lock().unwrap().clone();
        let field = |name: &str| {
            line.split_whitespace()
                .find_map(|f| f.strip_prefix(&format!("{name}=")))
                .unwrap_or("?")
                .to_owned()
        };
        out.row(
            "fleet-sim writes sent / acked / errors (every bucket)",
            format!("{} / {} / {}", field("sent"), field("acked"), field("errors")),
        );
        out.row(
            "fleet-sim heartbeat put → ack p50 / p99; sent late (its own lag) p99",
            format!("{} ms / {} ms; {} ms", field("hb_ack_ms_p50"), field("hb_ack_ms_p99"), field("hb_late_ms_p99")),
        );
        out.result("sim_errors", field("errors"));
        true
    });
    let stdout = std::io::stdout();
    let mut o = stdout.lock();
    let _ = writeln!(
        o,
        "| fleet-scale, {n} simulated devices ({connections} NATS connections, heartbeat every {heartbeat_secs} s) | measured |"
    );
    let _ = writeln!(o, "|---|---|");
    for (w, v) in &out.rows {
        let _ = writeln!(o, "| {w} | {v} |");
    }
    if let Some(f) = results_file {
        let text: String = out
            .results
            .iter()
            .map(|(k, v)| format!("{k} {v}\n"))
            .collect();
        std::fs::write(f, text).expect("results file");
    }
    // The operator's warnings (it runs with RUST_LOG=warn): how many, and the last lines, on stderr.
    let log = std::fs::read_to_string(dir.path().join("operator.log")).unwrap_or_default();
    let tail: Vec<&str> = log.lines().rev().take(20).collect();
    eprintln!(
        "fleet-operator log: {} lines; the last ones:",
        log.lines().count()
    );
    for l in tail.iter().rev() {
        eprintln!("  {}", l.chars().take(400).collect::<String>());
    }
    if !ok {
        // exit skips destructors: stop the servers first (a failed run left its nats-server running).
        drop(nats);
        drop(api);
        std::process::exit(1);
    }
}
