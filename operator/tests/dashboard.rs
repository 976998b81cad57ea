//! The dashboard as a person uses it: the real `fleet-operator` binary (with `--dashboard-listen`) against the real
//! kube-apiserver, a real nats-server and a real `fleetlock-server`, with a fleet of devices (one whose agent
//! upgrade rolled back, one quarantined in `rollback-failed`, one silent), a TaskRun whose canary failed and a
//! FleetLock slot held too long. Headless Chromium (Debian's `chromium`) loads every page; the test asserts on the
//! rendered DOM (`--dump-dom`) and takes screenshots (`--screenshot`; copied into docs/dashboard/ when
//! `FLEET_UPDATE_SCREENSHOTS=1`). Alerts are also checked as Kubernetes events and as `/metrics`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use async_nats::jetstream::kv;
use fleet_operator::crd::tasks::TaskRun;
use fleet_operator::crd::{
    AgentRelease, Device, DeviceGroup, FleetDeployment, PlacementStatus, RolloutPhase,
};
use fleet_rig::fleetlock::ServerProcess;
use fleet_wire::fleetlock::LockEventKind;
use fleet_wire::kv as layout;
use fleet_wire::{
    fixtures, AgentUpgradeAttempt, AttemptId, BoundedText, DeviceId, SystemUpgradePhase,
    SystemUpgradeStatus, TaskRunPhase, TaskRunReason, Timestamp, UpgradePhase, UpgradeReason,
    Version, WorkloadState,
};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod kube_common;
use kube_common::{eventually, Fleet, API};

const TOKEN: &str = "dashboard-test-token-0123456789";
/// An env value of a placed workload: it must never appear on a page.
const SECRET: &str = "s3cr3t-never-rendered";
/// A line of a device's diagnostics bundle: the device page shows it.
const BUNDLE_LINE: &str = "cache: connection to upstream refused, retrying in 5 s";

/// Debian's Chromium, or a loud failure that says how to install it.
fn chromium() -> PathBuf {
    for dir in std::env::var("PATH").unwrap_or_default().split(':') {
        let p = Path::new(dir).join("chromium");
        if p.is_file() {
            return p;
        }
    }
    panic!(
        "headless Chromium is missing: run `scripts/setup chromium` (Debian package `chromium`)"
    );
}

/// Runs headless Chromium on `url` with `extra` arguments (a fresh profile each time) and returns its stdout.
fn browse(url: &str, extra: &[&str]) -> String {
    let profile = tempfile::tempdir().unwrap();
    let mut child = Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(extra)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start chromium");
    let mut out = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut out, &mut s).unwrap();
        s
    });
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("chromium did not finish {url} within 90 s");
        }
        // why: pacing of the bounded wait for chromium
        std::thread::sleep(Duration::from_millis(50));
    }
    reader.join().unwrap()
}

/// `GET path` with the token (`None`: without), returning status and body.
fn get(base: &str, path: &str, token: Option<&str>) -> (u16, String) {
    let agent = ureq::Agent::new_with_config(
        ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(10)))
            .build(),
    );
    let mut req = agent.get(format!("{base}{path}"));
    if let Some(t) = token {
        req = req.header("Authorization", &format!("Bearer {t}"));
    }
    let mut r = req.call().unwrap();
    (r.status().as_u16(), r.body_mut().read_to_string().unwrap())
}

impl Fleet {
    async fn put<T: serde::Serialize>(&self, bucket: &str, key: &str, v: &T) {
        let store: kv::Store = self.js.get_key_value(bucket).await.expect("bucket");
        store
            .put(key, serde_json::to_vec(v).unwrap().into())
            .await
            .expect("put");
    }

    /// A Device with `labels` and what its agent would publish: info, a heartbeat at `heartbeat`, workloads.
    async fn device(
        &self,
        base: &str,
        labels: serde_json::Value,
        heartbeat: Timestamp,
    ) -> DeviceId {
        let name = self.name(base);
        let d: Device = serde_json::from_value(json!({
            "apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "Device",
            "metadata": {"name": name, "labels": self.labels(labels)},
            "spec": {"description": "rack 3 <b>not bold</b>"}
        }))
        .unwrap();
        Api::<Device>::all(self.client.clone())
            .create(&PostParams::default(), &d)
            .await
            .expect("device");
        let id = DeviceId::try_from(name.as_str()).unwrap();
        let mut info = fixtures::device_info();
        info.device_id = id.clone();
        self.put(layout::DEVICE_INFO, &name, &info).await;
        let mut hb = fixtures::heartbeat();
        hb.device_id = id.clone();
        hb.at = heartbeat;
        self.put(layout::DEVICE_HEARTBEAT, &name, &hb).await;
        id
    }
}

fn spawn_operator(f: &Fleet, dir: &Path, fleetlock: &str) -> std::process::Child {
    let token_file = dir.join("dashboard-token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let mut cmd = operator_command(f, dir);
    cmd.args(["--dashboard-listen", &DASH_ADDR.with(|a| a.to_string())])
        .arg("--dashboard-token-file")
        .arg(&token_file)
        .args(["--dashboard-fleetlock-url", fleetlock]);
    cmd.spawn().expect("start fleet-operator")
}

/// The operator as every test here starts it (the alert thresholds short), without dashboard flags.
fn operator_command(f: &Fleet, dir: &Path) -> Command {
    let api = API.get().expect("apiserver");
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(&kubeconfig, api.kubeconfig(api.token())).unwrap();
    let log = std::fs::File::create(dir.join("operator.log")).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fleet-operator"));
    cmd.args([
        "--alert-silent-after",
        "10m",
        "--alert-slot-held-after",
        "2s",
    ])
    .env("KUBECONFIG", &kubeconfig)
    .env("FLEET_NATS_URL", f.nats.url())
    .env("FLEET_LABEL_SELECTOR", format!("fleet-test={}", f.run))
    .env("POD_NAME", "fleet-operator-test")
    .env("POD_NAMESPACE", &f.run)
    .env("RUST_LOG", "info")
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(log);
    cmd
}

/// Alerts do not need the dashboard: an operator started without any dashboard flag publishes a silent device's
/// alert as a Warning event about that Device (its kind, name and uid: what `kubectl describe` finds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alerts_are_events_without_the_dashboard() {
    let f = Fleet::start("alerts").await;
    fleet_operator::kv::ensure_buckets(&f.js, &Default::default())
        .await
        .expect("buckets");
    let dir = tempfile::tempdir().unwrap();
    let now = Timestamp::now();
    let silent = f
        .device(
            "pi-quiet",
            json!({"site": "c"}),
            Timestamp::from_unix_ms(now.unix_ms() - 3_600_000),
        )
        .await;
    let _op = Kill(
        operator_command(&f, dir.path())
            .spawn()
            .expect("start fleet-operator"),
    );
    let uid = Api::<Device>::all(f.client.clone())
        .get(silent.as_str())
        .await
        .expect("the Device")
        .metadata
        .uid
        .expect("uid");
    let events: Api<k8s_openapi::api::core::v1::Event> =
        Api::namespaced(f.client.clone(), "default");
    let ev = eventually("DeviceSilent event without the dashboard", || async {
        let list = events.list(&Default::default()).await.ok()?;
        list.items.into_iter().find(|e| {
            e.reason.as_deref() == Some("DeviceSilent")
                && e.involved_object.uid.as_deref() == Some(uid.as_str())
        })
    })
    .await;
    assert_eq!(
        (
            ev.type_.as_deref(),
            ev.involved_object.kind.as_deref(),
            ev.involved_object.name.as_deref()
        ),
        (Some("Warning"), Some("Device"), Some(silent.as_str()))
    );
    let note = ev.message.unwrap_or_default();
    assert!(
        note.starts_with(&format!(
            "Device silent: device {silent}. no heartbeat for longer than 10"
        )),
        "{note}"
    );
    let log = std::fs::read_to_string(dir.path().join("operator.log")).unwrap_or_default();
    assert!(
        log.contains("the dashboard is not served"),
        "the operator says the dashboard is off:\n{log}"
    );
}

thread_local! {
    static DASH_ADDR: std::net::SocketAddr = fleet_rig::fleetlock::free_addr().unwrap();
}

struct Kill(std::process::Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Saves a screenshot of `path` as `<name>.png` (in the test's temporary directory; also in docs/dashboard/ with
/// `FLEET_UPDATE_SCREENSHOTS=1`) and checks it is a PNG.
/// Takes a screenshot of `path` in a window of `size` (width, height) as `<dir>/<name>.png`; copied to
/// docs/dashboard/ when `FLEET_UPDATE_SCREENSHOTS=1`.
fn screenshot(base_with_auth: &str, path: &str, name: &str, size: (u32, u32), dir: &Path) {
    let file = dir.join(format!("{name}.png"));
    browse(
        &format!("{base_with_auth}{path}"),
        &[
            &format!("--screenshot={}", file.display()),
            &format!("--window-size={},{}", size.0, size.1),
        ],
    );
    let png = std::fs::read(&file).expect("screenshot written");
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "{name}.png"
    );
    if std::env::var("FLEET_UPDATE_SCREENSHOTS").is_ok_and(|v| v == "1") {
        let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/dashboard");
        std::fs::create_dir_all(&docs).unwrap();
        std::fs::copy(&file, docs.join(format!("{name}.png"))).unwrap();
    }
}

/// The `data-part`/`data-count` pairs a rollout page's bars must show: each part exactly its count in `s`
/// (`workloads`: also the deployment's workloads bar; a list page shows only one bar per object, the rollout's
/// when there is one).
fn bar_counts(s: &PlacementStatus, workloads: bool) -> Vec<String> {
    let part = |p: &str, n: u32| format!("data-part=\"{p}\" data-count=\"{n}\"");
    let mut v = Vec::new();
    if let Some(r) = &s.rollout {
        v.extend([
            part("healthy", r.healthy),
            part("soaking", r.soaking),
            part("updating", r.updating),
            part("failed", r.failed),
            part("pending", r.pending),
        ]);
    }
    if let (Some(w), true) = (&s.workloads, workloads || s.rollout.is_none()) {
        v.extend([
            part("workloads running", w.running),
            part("workloads failed", w.failed),
            part("workloads pending", w.pending),
        ]);
    }
    v
}

/// Loads `path` in Chromium until `status` (read through the API server) is the same before and after the load,
/// so the DOM and the returned status describe one moment even while the operator writes it.
async fn page_with_status<T, F, Fut>(authed: &str, path: &str, status: F) -> (String, T)
where
    T: PartialEq + std::fmt::Debug,
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = T>,
{
    let mut last = None;
    for _ in 0..10 {
        let before = status().await;
        let url = format!("{authed}{path}");
        let dom = tokio::task::spawn_blocking(move || browse(&url, &["--dump-dom"]))
            .await
            .unwrap();
        let after = status().await;
        if before == after {
            return (dom, after);
        }
        last = Some((before, after));
        // why: pacing between two page loads (each a chromium run) until the status holds still
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!("{path}: the status changed during every load: {last:#?}")
}

/// The fleet as the test reads it back itself (the API server for the objects, NATS for the heartbeats), in the
/// terms the overview's bars and the fleet's metrics count.
#[derive(Debug, PartialEq)]
struct FleetView {
    /// Devices per agent version (`unknown` without one).
    versions: BTreeMap<String, u64>,
    /// Devices per heartbeat-age bucket, youngest first.
    ages: Vec<(&'static str, u64)>,
    /// Workloads running, failed (not crash-looping), crash-looping, pending over the Devices'
    /// `status.workloads`.
    workloads: [u64; 4],
    /// Every AgentRelease / FleetDeployment of the test: kind, name, rollout status.
    rollouts: Vec<(
        &'static str,
        String,
        Option<fleet_operator::crd::RolloutStatus>,
    )>,
    /// Every TaskRun of the test: namespace, name, status.
    runs: Vec<(String, String, fleet_wire::taskrun::TaskRunStatus)>,
}

/// The overview's heartbeat-age bucket of a heartbeat `secs` old, written out here (not the operator's function)
/// so that a wrong bucket in the operator shows.
fn age_bucket(secs: Option<u64>) -> &'static str {
    match secs {
        None => "never",
        Some(0..60) => "under 1 minute",
        Some(60..300) => "1–5 minutes",
        Some(300..3600) => "5–60 minutes",
        Some(3600..86400) => "1–24 hours",
        Some(_) => "over 24 hours",
    }
}

impl Fleet {
    /// [`FleetView`] now.
    async fn view(&self) -> FleetView {
        let lp = ListParams::default().labels(&format!("fleet-test={}", self.run));
        let devices = Api::<Device>::all(self.client.clone())
            .list(&lp)
            .await
            .expect("devices")
            .items;
        let heartbeats: kv::Store = self
            .js
            .get_key_value(layout::DEVICE_HEARTBEAT)
            .await
            .unwrap();
        let now = Timestamp::now();
        let mut v = FleetView {
            versions: BTreeMap::new(),
            ages: [
                "under 1 minute",
                "1–5 minutes",
                "5–60 minutes",
                "1–24 hours",
                "over 24 hours",
                "never",
            ]
            .map(|b| (b, 0))
            .to_vec(),
            workloads: [0; 4],
            rollouts: Vec::new(),
            runs: Vec::new(),
        };
        for d in &devices {
            let s = d.status.clone().unwrap_or_default();
            let version = s.agent_version.map(|v| v.to_string());
            *v.versions
                .entry(version.unwrap_or_else(|| "unknown".into()))
                .or_default() += 1;
            if let Some(w) = s.workloads {
                v.workloads[0] += u64::from(w.running);
                v.workloads[1] += u64::from(w.failed - w.crash_looping);
                v.workloads[2] += u64::from(w.crash_looping);
                v.workloads[3] += u64::from(w.pending);
            }
            let name = d.metadata.name.as_deref().unwrap();
            let hb: Option<fleet_wire::Heartbeat> = heartbeats
                .get(name)
                .await
                .unwrap()
                .map(|b| serde_json::from_slice(&b).unwrap());
            let bucket = age_bucket(hb.map(|h| now.since(h.at).as_secs()));
            v.ages.iter_mut().find(|(b, _)| *b == bucket).unwrap().1 += 1;
        }
        for r in Api::<AgentRelease>::all(self.client.clone())
            .list(&lp)
            .await
            .unwrap()
            .items
        {
            let st = r.status.and_then(|s| s.rollout);
            v.rollouts
                .push(("AgentRelease", r.metadata.name.unwrap(), st));
        }
        for d in Api::<FleetDeployment>::all(self.client.clone())
            .list(&lp)
            .await
            .unwrap()
            .items
        {
            let st = d.status.and_then(|s| s.rollout);
            v.rollouts
                .push(("FleetDeployment", d.metadata.name.unwrap(), st));
        }
        for r in Api::<TaskRun>::namespaced(self.client.clone(), &self.run)
            .list(&lp)
            .await
            .unwrap()
            .items
        {
            let st = r.status.map(|s| s.run).unwrap_or_default();
            v.runs
                .push((self.run.clone(), r.metadata.name.unwrap(), st));
        }
        v
    }
}

/// Loads `path` (Chromium's DOM, or `/metrics` as a scraper gets it: `browser` false) until the fleet the test
/// reads back is the same before and after, so that both describe one moment.
async fn load_with_view(
    f: &Fleet,
    authed: &str,
    base: &str,
    path: &str,
    browser: bool,
) -> (String, FleetView) {
    let mut last = None;
    for _ in 0..10 {
        let before = f.view().await;
        let (url, b, p) = (format!("{authed}{path}"), base.to_owned(), path.to_owned());
        let body = tokio::task::spawn_blocking(move || {
            if browser {
                browse(&url, &["--dump-dom"])
            } else {
                get(&b, &p, Some(TOKEN)).1
            }
        })
        .await
        .unwrap();
        let after = f.view().await;
        if before == after {
            return (body, after);
        }
        last = Some((before, after));
        // why: pacing between two page loads (each a chromium run) until the status holds still
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!("{path}: the fleet changed during every load: {last:#?}")
}

/// The overview's bars are the fleet `v` the test read back: every version's devices, every heartbeat-age bucket,
/// the workloads, and each rollout that is not complete and each running run with its status's counts (and no bar
/// for the others).
fn assert_overview_bars(dom: &str, v: &FleetView) {
    use fleet_operator::dashboard::bars::legend;
    let bar =
        |id: &str| legend(dom, id).unwrap_or_else(|| panic!("no bar {id} in the overview:\n{dom}"));
    let versions: BTreeMap<String, u64> = bar("agent-versions").into_iter().collect();
    assert_eq!(versions, v.versions, "agent versions");
    assert_eq!(
        versions.values().sum::<u64>(),
        4,
        "the agent-versions bar counts each of the four Devices once"
    );
    let ages: Vec<(String, u64)> = v.ages.iter().map(|(b, n)| (b.to_string(), *n)).collect();
    assert_eq!(bar("heartbeat-ages"), ages, "heartbeat ages");
    let w = v.workloads;
    assert_eq!(
        bar("workloads"),
        vec![
            ("workloads running".to_owned(), w[0]),
            ("workloads failed".to_owned(), w[1]),
            ("workloads crash-looping".to_owned(), w[2]),
            ("workloads pending".to_owned(), w[3]),
        ],
        "workloads"
    );
    let mut open = 0;
    for (kind, name, st) in &v.rollouts {
        let id = format!("{kind}/{name}");
        match st.as_ref().filter(|s| s.phase != RolloutPhase::Complete) {
            Some(s) => {
                open += 1;
                let want: Vec<(String, u64)> = [
                    ("healthy", s.healthy),
                    ("soaking", s.soaking),
                    ("updating", s.updating),
                    ("failed", s.failed),
                    ("pending", s.pending),
                ]
                .map(|(p, n)| (p.to_owned(), u64::from(n)))
                .to_vec();
                assert_eq!(bar(&id), want, "{id}");
                let path = if *kind == "AgentRelease" {
                    "releases"
                } else {
                    "deployments"
                };
                assert!(
                    dom.contains(&format!("href=\"/{path}/{name}\"")),
                    "{id} linked:\n{dom}"
                );
            }
            None => assert_eq!(legend(dom, &id), None, "{id} is complete or has no rollout"),
        }
    }
    assert!(
        open >= 1,
        "the halted release is not complete: {:#?}",
        v.rollouts
    );
    let mut running = 0;
    for (ns, name, st) in &v.runs {
        let id = format!("TaskRun/{ns}/{name}");
        if st.phase == Some(TaskRunPhase::Running) {
            running += 1;
            let open = st
                .targets
                .saturating_sub(st.succeeded)
                .saturating_sub(st.failed);
            assert_eq!(
                bar(&id),
                vec![
                    ("succeeded".to_owned(), u64::from(st.succeeded)),
                    ("failed".to_owned(), u64::from(st.failed)),
                    ("not finished".to_owned(), u64::from(open)),
                ],
                "{id}"
            );
            assert!(
                dom.contains(&format!("href=\"/runs/{ns}/{name}\"")),
                "{id} linked"
            );
        } else {
            assert_eq!(legend(dom, &id), None, "{id} is not running");
        }
    }
    assert_eq!(running, 1, "one run is running: {:#?}", v.runs);
}

/// `/metrics`' fleet families are the fleet `v` the test read back.
fn assert_fleet_metrics(m: &str, v: &FleetView) {
    let value = |series: &str| -> u64 {
        m.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {series} in /metrics:\n{m}"))
    };
    for (version, n) in &v.versions {
        assert_eq!(
            value(&format!(
                "fleet_devices_by_agent_version{{agent_version=\"{version}\"}}"
            )),
            *n
        );
    }
    assert_eq!(
        m.lines()
            .filter(|l| l.starts_with("fleet_devices_by_agent_version{"))
            .count(),
        v.versions.len(),
        "one series per version:\n{m}"
    );
    for (state, n) in ["running", "failed", "crash_looping", "pending"]
        .into_iter()
        .zip(v.workloads)
    {
        assert_eq!(
            value(&format!("fleet_workloads{{state=\"{state}\"}}")),
            n,
            "{state}"
        );
    }
    let mut by_phase: BTreeMap<(&str, String), u64> = BTreeMap::new();
    for (kind, _, st) in &v.rollouts {
        let phase = st
            .as_ref()
            .map(|s| {
                serde_json::to_value(s.phase)
                    .unwrap()
                    .as_str()
                    .unwrap()
                    .to_owned()
            })
            .unwrap_or_else(|| "none".into());
        *by_phase.entry((*kind, phase)).or_default() += 1;
    }
    for kind in ["AgentRelease", "FleetDeployment"] {
        for phase in [
            "Progressing",
            "Soaking",
            "Halted",
            "Complete",
            "Failed",
            "none",
        ] {
            let n = by_phase
                .get(&(kind, phase.to_owned()))
                .copied()
                .unwrap_or(0);
            assert_eq!(
                value(&format!(
                    "fleet_rollouts{{kind=\"{kind}\",phase=\"{phase}\"}}"
                )),
                n,
                "{kind} {phase}"
            );
        }
    }
}

/// What a person does: start the operator with the dashboard on, open it in a browser, and find out why a device
/// is not upgraded and why a task run stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_pages_alerts_and_metrics_in_a_real_browser() {
    let chromium = chromium(); // fail first, and loudly, when the browser is missing
    assert!(chromium.exists());
    let f = Fleet::start("dash").await;
    fleet_operator::kv::ensure_buckets(&f.js, &Default::default())
        .await
        .expect("buckets");
    Api::<Namespace>::all(f.client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": f.run}})).unwrap(),
        )
        .await
        .expect("namespace");
    let dir = tempfile::tempdir().unwrap();

    // The fleet: a healthy canary, a device whose upgrade rolled back, one quarantined, one silent for an hour.
    let now = Timestamp::now();
    let canary = f
        .device("pi-canary", json!({"site": "a", "canary": "true"}), now)
        .await;
    let rolled = f.device("pi-rolled", json!({"site": "a"}), now).await;
    let stuck = f.device("pi-stuck", json!({"site": "a"}), now).await;
    let silent = f
        .device(
            "pi-silent",
            json!({"site": "b"}),
            Timestamp::from_unix_ms(now.unix_ms() - 3_600_000),
        )
        .await;
    let mut back = fixtures::failed_status();
    back.device_id = rolled.clone();
    f.put(layout::AGENT_UPGRADE_STATUS, rolled.as_str(), &back)
        .await;
    let mut q = fixtures::failed_status();
    q.device_id = stuck.clone();
    q.enter(
        UpgradePhase::RollbackFailed,
        fixtures::t(290),
        Some(UpgradeReason::RestoreFailed),
    );
    q.error = Some(BoundedText::lossy(
        "restoring /usr/local/bin/fleet-agent failed: <Input/output error>",
    ));
    f.put(layout::AGENT_UPGRADE_STATUS, stuck.as_str(), &q)
        .await;
    let mut ws = fixtures::workload_status();
    ws.device_id = rolled.clone();
    ws.at = now;
    ws.workloads[0].state = WorkloadState::Failed;
    ws.workloads[0].error = Some(BoundedText::lossy("pull localhost/web:2: image not known"));
    f.put(layout::WORKLOAD_STATUS, rolled.as_str(), &ws).await;
    // The quarantined device also runs a workload that Podman keeps restarting: crash-looping.
    let mut looping = fixtures::workload_status_crash_looping();
    looping.device_id = stuck.clone();
    looping.at = now;
    looping.workloads[0].name = fleet_wire::WorkloadName::try_from("cache").unwrap();
    f.put(layout::WORKLOAD_STATUS, stuck.as_str(), &looping)
        .await;

    // Groups, a deployment whose workload carries a secret env value, and a TaskRun.
    let group = f.name("site-a");
    let g: DeviceGroup = serde_json::from_value(json!({
        "apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "DeviceGroup",
        "metadata": {"name": group, "labels": f.labels(json!({}))},
        "spec": {"selector": {"matchLabels": {"fleet-test": f.run, "site": "a"}}}
    }))
    .unwrap();
    Api::<DeviceGroup>::all(f.client.clone())
        .create(&PostParams::default(), &g)
        .await
        .unwrap();
    let mut w = serde_json::to_value(fixtures::workload("web")).unwrap();
    w["env"] = json!({"API_KEY": SECRET});
    let dep: FleetDeployment = serde_json::from_value(json!({
        "apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "FleetDeployment",
        "metadata": {"name": f.name("web"), "labels": f.labels(json!({}))},
        "spec": {"allowedGroups": [group], "targetSelector": {}, "workloads": [w]}
    }))
    .unwrap();
    Api::<FleetDeployment>::all(f.client.clone())
        .create(&PostParams::default(), &dep)
        .await
        .unwrap();
    let run_name = "nightly-upgrade";
    let run: TaskRun = serde_json::from_value(json!({
        "apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "TaskRun",
        "metadata": {"name": run_name, "labels": f.labels(json!({}))},
        "spec": {"allowedGroups": [group], "targetSelector": {}, "deadlineSeconds": 3600, "systemUpgradeV1": {}}
    }))
    .unwrap();
    let runs: Api<TaskRun> = Api::namespaced(f.client.clone(), &f.run);
    let run = runs.create(&PostParams::default(), &run).await.unwrap();
    let uid = AttemptId::try_from(run.metadata.uid.as_deref().unwrap()).unwrap();

    // FleetLock: one slot taken (alerts after 2 s).
    let fl_cfg = dir.path().join("fleetlock.yaml");
    std::fs::write(
        &fl_cfg,
        format!(
            "store: {{kind: file, dir: {}}}\ndefault_slots: 1\n",
            dir.path().join("fl").display()
        ),
    )
    .unwrap();
    let fl = ServerProcess::start(&fleet_vm_tests::builds::fleetlock_server(), &fl_cfg).unwrap();
    // A reboot history: pi-done (an id no device reports) took the slot and gave it back a second later; then
    // pi-rolled took it with the id its agent reports in its device info (as fleet-reboot derives it).
    let rolled_rid = fleet_wire::fleetlock::client_id("0123456789abcdef0123456789abcdef");
    let mut info = fixtures::device_info();
    info.device_id = rolled.clone();
    info.reboot_client_id = Some(fleet_wire::Id128::try_from(rolled_rid.clone()).unwrap());
    f.put(layout::DEVICE_INFO, rolled.as_str(), &info).await;
    let mut c = fl.conn().unwrap();
    assert_eq!(c.fleetlock(true, "pi-done", "default").unwrap().status, 200);
    // why: the reboot history's scenario: pi-done held the slot for a second before it gave it back
    std::thread::sleep(Duration::from_millis(1100));
    let mut c = fl.conn().unwrap();
    assert_eq!(
        c.fleetlock(false, "pi-done", "default").unwrap().status,
        200
    );
    assert_eq!(
        fl.conn()
            .unwrap()
            .fleetlock(true, &rolled_rid, "default")
            .unwrap()
            .status,
        200
    );

    let _op = Kill(spawn_operator(
        &f,
        dir.path(),
        &format!("http://{}", fl.addr),
    ));
    let base = format!("http://{}", DASH_ADDR.with(|a| *a));

    // The canary's intent is released; its agent reports failure: the run stops with CanaryFailed.
    let intents: kv::Store =
        f.js.get_key_value(layout::SYSTEM_UPGRADE_INTENT)
            .await
            .unwrap();
    let key = layout::run_key(&canary, &uid);
    eventually("canary intent", || async {
        intents.get(&key).await.ok().flatten()
    })
    .await;
    let mut st: SystemUpgradeStatus = fixtures::system_status();
    st.run_uid = uid;
    st.device_id = canary.clone();
    st.accepted_at = Timestamp::now();
    st.completed_at = Some(Timestamp::now());
    st.first_heartbeat_after_completion = None;
    st.phase = SystemUpgradePhase::Failed;
    st.reason = Some(fleet_wire::SystemUpgradeReason::AptFailed);
    st.error = Some(BoundedText::lossy(
        "apt-get full-upgrade exited with 100: dpkg: error processing package <linux-image>",
    ));
    f.put(layout::SYSTEM_UPGRADE_STATUS, &key, &st).await;
    eventually("run failed with CanaryFailed", || async {
        let s = runs.get(run_name).await.ok()?.status?.run;
        (s.phase == Some(TaskRunPhase::Failed) && s.reason == Some(TaskRunReason::CanaryFailed))
            .then_some(())
    })
    .await;

    // An AgentRelease with a staged rollout: its canary commits, then its agent restarts during the 600 s soak,
    // which halts the rollout (CanaryFailed) and names the canary. And a FleetDeployment with a rollout section.
    let release_name = f.name("agent-2");
    let art = fixtures::attempt();
    let release: AgentRelease = serde_json::from_value(json!({
        "apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "AgentRelease",
        "metadata": {"name": release_name, "labels": f.labels(json!({}))},
        "spec": {"allowedGroups": [group], "rollout": {"soakSeconds": 600, "maxUnavailable": 1},
            "builds": [{"architecture": "arm64", "version": "2.0.0", "artifact": art.artifact.to_string(),
                "sha256": art.sha256.as_str(), "byteLimit": 20_000_000}]}
    }))
    .unwrap();
    let releases = Api::<AgentRelease>::all(f.client.clone());
    releases
        .create(&PostParams::default(), &release)
        .await
        .unwrap();
    let staged_name = f.name("api");
    let staged: FleetDeployment = serde_json::from_value(json!({
        "apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "FleetDeployment",
        "metadata": {"name": staged_name, "labels": f.labels(json!({}))},
        "spec": {"allowedGroups": [group], "targetSelector": {}, "workloads": [fixtures::workload("api")],
            "rollout": {"soakSeconds": 600, "maxUnavailable": 1}}
    }))
    .unwrap();
    let deployments = Api::<FleetDeployment>::all(f.client.clone());
    deployments
        .create(&PostParams::default(), &staged)
        .await
        .unwrap();
    let upgrade_intents: kv::Store =
        f.js.get_key_value(layout::AGENT_UPGRADE_INTENT)
            .await
            .unwrap();
    let a: AgentUpgradeAttempt = eventually("the release's canary intent", || async {
        let v = upgrade_intents.get(canary.as_str()).await.ok()??;
        serde_json::from_slice(&v).ok()
    })
    .await;
    let agent_started = |at: Timestamp| {
        let mut info = fixtures::device_info();
        info.device_id = canary.clone();
        info.agent_version = Version::try_from("2.0.0").unwrap();
        info.published_at = at;
        info
    };
    let t1 = Timestamp::now();
    f.put(layout::DEVICE_INFO, canary.as_str(), &agent_started(t1))
        .await;
    let mut committed = fixtures::upgrade_status();
    committed.device_id = canary.clone();
    committed.attempt_id = Some(a.attempt_id);
    committed.target_version = Some(a.target_version.clone());
    committed.attempt_digest = Some(a.digest());
    committed.phase = UpgradePhase::Complete;
    committed.phase_changed_at = t1.plus(Duration::from_millis(500));
    f.put(layout::AGENT_UPGRADE_STATUS, canary.as_str(), &committed)
        .await;
    let mut hb = fixtures::heartbeat();
    hb.device_id = canary.clone();
    hb.agent_version = Version::try_from("2.0.0").unwrap();
    hb.at = t1.plus(Duration::from_secs(1));
    f.put(layout::DEVICE_HEARTBEAT, canary.as_str(), &hb).await;
    let phase = || async {
        releases
            .get(&release_name)
            .await
            .ok()?
            .status?
            .rollout
            .map(|r| r.phase)
    };
    eventually("the canary soaking", || async {
        matches!(
            phase().await,
            Some(RolloutPhase::Soaking | RolloutPhase::Halted)
        )
        .then_some(())
    })
    .await;
    f.put(
        layout::DEVICE_INFO,
        canary.as_str(),
        &agent_started(t1.plus(Duration::from_secs(30))),
    )
    .await;
    eventually("the release halted", || async {
        (phase().await == Some(RolloutPhase::Halted)).then_some(())
    })
    .await;

    // The staged deployment half done: its canary was given `api` first and runs it (every workload of its
    // desired state running, as its agent would report), so it soaks for 600 s while the others wait.
    let desired: kv::Store = f.js.get_key_value(layout::DESIRED_STATE).await.unwrap();
    let given: fleet_wire::DesiredState = eventually("the canary given api", || async {
        let v = desired.get(canary.as_str()).await.ok()??;
        let d: fleet_wire::DesiredState = serde_json::from_slice(&v).ok()?;
        d.workloads
            .iter()
            .any(|w| w.name.as_str() == "api")
            .then_some(d)
    })
    .await;
    let mut ws = fixtures::workload_status();
    ws.device_id = canary.clone();
    ws.generation = given.generation;
    ws.at = Timestamp::now();
    ws.workloads = given
        .workloads
        .iter()
        .map(|w| fleet_wire::WorkloadStatus {
            name: w.name.clone(),
            state: WorkloadState::Running,
            container_id: Some("c".repeat(64)),
            spec_digest: Some(w.digest()),
            started_at: Some(Timestamp::now()),
            error: None,
            failure: None,
            restarts: None,
            health: None,
        })
        .collect();
    f.put(layout::WORKLOAD_STATUS, canary.as_str(), &ws).await;
    let half = eventually("the staged deployment soaking on its canary", || async {
        let r = deployments.get(&staged_name).await.ok()?.status?.rollout?;
        (r.phase == RolloutPhase::Soaking).then_some(r)
    })
    .await;
    assert_eq!(
        (half.soaking, half.healthy, half.updating, half.failed),
        (1, 0, 0, 0),
        "the canary soaks: {half:?}"
    );
    assert!(half.pending >= 1, "the others wait: {half:?}");

    // fleet-auth reports refused writes of the canary (as its device API does on a flood): the operator puts
    // them on the Device, the dashboard raises an alert.
    let report = fleet_wire::device_api::WriteRefused {
        device_id: canary.clone(),
        bucket: Some(layout::DEVICE_HEARTBEAT.into()),
        kind: "over-budget".into(),
        reason: "over the device's write budget".into(),
        count: 212,
    };
    let nats = async_nats::connect(f.nats.url()).await.expect("nats");
    nats.publish(
        fleet_wire::device_api::refusals_subject(&canary),
        serde_json::to_vec(&report).unwrap().into(),
    )
    .await
    .unwrap();
    nats.flush().await.unwrap();

    // The dashboard: no token, no page; read-only.
    let b = base.clone();
    let (code, _) = tokio::task::spawn_blocking(move || get(&b, "/", None))
        .await
        .unwrap();
    assert_eq!(code, 401);
    let b = base.clone();
    let (code, _) =
        tokio::task::spawn_blocking(move || get(&b, "/", Some("wrong-token-0123456789")))
            .await
            .unwrap();
    assert_eq!(code, 401);

    // Every alert shows (the alert loop runs on every change, at most once a second).
    let b = base.clone();
    let alerts_page = eventually("all six alerts", || {
        let b = b.clone();
        async move {
            let (code, body) = tokio::task::spawn_blocking(move || get(&b, "/alerts", Some(TOKEN)))
                .await
                .ok()?;
            (code == 200
                && [
                    "DeviceRollbackFailed",
                    "DeviceSilent",
                    "TaskRunCanaryFailed",
                    "FleetLockSlotHeldTooLong",
                    "DeviceWritesRefused",
                    "WorkloadCrashLooping",
                ]
                .iter()
                .all(|k| body.contains(&format!("data-alert=\"{k}\""))))
            .then_some(body)
        }
    })
    .await;
    assert!(
        !alerts_page.contains(&format!("device <a href=\"/devices/{rolled}\"")),
        "a rolled-back upgrade is no alert"
    );
    assert!(
        alerts_page.contains("212 refused since")
            && alerts_page.contains("over-budget in device-heartbeat"),
        "the refused writes' alert says how many and why:\n{alerts_page}"
    );

    // In the browser, with the token as the Basic password (a browser cannot send a bearer header).
    let authed = format!("http://admin:{TOKEN}@{}", DASH_ADDR.with(|a| *a));
    let pages: Vec<(String, Vec<String>)> = vec![
        (
            "/".into(),
            vec![
                "Fleet overview".into(),
                "data-alert=\"DeviceRollbackFailed\"".into(),
                "data-alert=\"TaskRunCanaryFailed\"".into(),
                "rollback-failed".into(),
                group.clone(),
            ],
        ),
        (
            format!("/devices/{stuck}"),
            vec![
                "id=\"upgrade-timeline\"".into(),
                "rollback-failed".into(),
                "restore-failed".into(),
                "&lt;Input/output error&gt;".into(),
                "data-alert=\"DeviceRollbackFailed\"".into(),
                // its crash-looping workload: in red, with its restarts and last exit code, and its alert
                "<b class=\"bad\" data-crash-looping=\"cache\">crash-looping</b>".into(),
                "<span class=\"bad\">7 (last exit code 3)</span>".into(),
                "data-alert=\"WorkloadCrashLooping\"".into(),
            ],
        ),
        (
            format!("/devices/{rolled}"),
            vec![
                "id=\"upgrade-timeline\"".into(),
                "rolling-back".into(),
                "start-failed".into(),
                "fleet-agent.service did not become ready".into(),
                "image not known".into(),
                "rack 3 &lt;b&gt;not bold&lt;/b&gt;".into(),
            ],
        ),
        (
            format!("/devices/{canary}"),
            vec![format!("{}/{run_name}", f.run), "apt-failed".into()],
        ),
        (
            "/runs".into(),
            vec![run_name.into(), "CanaryFailed".into(), "failed".into()],
        ),
        (
            format!("/runs/{}/{run_name}", f.run),
            vec![
                "CanaryFailed".into(),
                "canary".into(),
                canary.to_string(),
                "&lt;linux-image&gt;".into(),
                "not released".into(),
                "data-alert=\"TaskRunCanaryFailed\"".into(),
                // The progress bar: the one canary failed, nothing succeeded (the status's counts).
                "data-part=\"failed\" data-count=\"1\"".into(),
                "data-part=\"succeeded\" data-count=\"0\"".into(),
            ],
        ),
        (
            "/reboots".into(),
            vec![
                "1 of 1 used".into(),
                "data-alert=\"FleetLockSlotHeldTooLong\"".into(),
                // The alert names the device that holds the slot.
                format!("held for longer than 2s; device {rolled}"),
                // This server runs without client authentication, and says so.
                "client authentication <span class=\"bad\">off</span>".into(),
                "fleetlock-server warns: client authentication is off".into(),
                // The holder as the device it is (a link to its page) with its DeviceGroup; pi-done as unknown.
                format!("data-holder=\"{rolled_rid}\" data-device=\"{rolled}\""),
                format!("<a href=\"/devices/{rolled}\">{rolled}</a>"),
                format!("data-groups=\"{group}\""),
                "data-holder=\"pi-done\" data-device=\"\"".into(),
                "unknown holder <code>pi-done</code>".into(),
                // The history: pi-done's grant and release, pi-rolled's grant, its hold still running.
                format!("data-hold=\"default/{rolled_rid}\" data-end=\"held\""),
                format!("{rolled} · default · held for "),
                "unknown holder pi-done · default · released after 1s".into(),
                "data-hold=\"default/pi-done\" data-end=\"released\"".into(),
                "data-event=\"released\"".into(),
            ],
        ),
    ];
    for (path, wants) in &pages {
        let url = format!("{authed}{path}");
        let dom = tokio::task::spawn_blocking(move || browse(&url, &["--dump-dom"]))
            .await
            .unwrap();
        for want in wants {
            assert!(
                dom.contains(want.as_str()),
                "{path}: {want:?} missing from the DOM:\n{dom}"
            );
        }
        assert!(!dom.contains(SECRET), "{path} shows a workload's env");
        assert!(!dom.contains("<script"), "{path} has a script");
    }
    assert!(
        pages.iter().any(|(p, _)| p.starts_with("/devices/")),
        "device pages checked"
    );

    // "Why isn't it updating?" at the top of a device page: every reason of the Device's `status.blocking` as the API
    // server holds it while the page loads (the rollouts above hold changes back from pi-stuck: a release halted by
    // its canary, a deployment soaking on its canary), with its kind, change and sentence.
    let devices = Api::<Device>::all(f.client.clone());
    let blocking_of = || async {
        devices
            .get(stuck.as_str())
            .await
            .ok()
            .and_then(|d| d.status)
            .map(|s| s.blocking)
            .unwrap_or_default()
    };
    eventually("pi-stuck's blocking reasons", || async {
        let b = blocking_of().await;
        (!b.is_empty()).then_some(())
    })
    .await;
    let (dom, reasons) = loop {
        let before = blocking_of().await;
        let url = format!("{authed}/devices/{stuck}");
        let dom = tokio::task::spawn_blocking(move || browse(&url, &["--dump-dom"]))
            .await
            .unwrap();
        if blocking_of().await == before {
            break (dom, before);
        }
    };
    let escaped = |t: &str| {
        t.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
    };
    let top = dom.find("id=\"blocking\"");
    assert!(
        top.is_some() && top < dom.find("id=\"upgrade-timeline\""),
        "{stuck}: no blocking section above the upgrade timeline:\n{dom}"
    );
    for b in &reasons {
        let kind = serde_json::to_value(b.kind).unwrap();
        for want in [
            format!("data-blocking=\"{}\"", kind.as_str().unwrap()),
            format!("<code>{}</code>", escaped(&b.change)),
            escaped(&b.message),
        ] {
            assert!(
                dom.contains(&want),
                "{stuck}'s page does not show its blocking reason {b:?}: {want:?} missing from the DOM:\n{dom}"
            );
        }
    }
    eprintln!(
        "{stuck}'s page shows its {} blocking reasons: {:?}",
        reasons.len(),
        reasons.iter().map(|b| &b.message).collect::<Vec<_>>()
    );

    // The device page's diagnostics: a person's DeviceDiagnostics for pi-stuck, answered by its device (the test
    // writes the bundle where the agent writes it, diagnostics-bundle/<device>.<request uid>, once the operator has
    // written the request), shows the request and the bundle's sections, the device's line among them.
    use fleet_operator::crd::diagnostics::{DeviceDiagnostics, DiagnosticsPhase};
    use fleet_wire::diagnostics::{DiagnosticsBundle, Item, Section};
    let diagnostics = Api::<DeviceDiagnostics>::all(f.client.clone());
    let diag_name = f.name("why-stuck");
    let asked: DeviceDiagnostics = serde_json::from_value(json!({
        "apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "DeviceDiagnostics",
        "metadata": {"name": diag_name, "labels": f.labels(json!({}))},
        "spec": {"device": stuck.as_str(), "items": ["workloadLogs", "disk"], "lines": 50}
    }))
    .unwrap();
    let asked = diagnostics
        .create(&PostParams::default(), &asked)
        .await
        .unwrap();
    let request = AttemptId::try_from(asked.metadata.uid.as_deref().unwrap()).unwrap();
    let diag_key = layout::run_key(&stuck, &request);
    let requests: kv::Store =
        f.js.get_key_value(layout::DIAGNOSTICS_REQUEST)
            .await
            .unwrap();
    eventually("the diagnostics request written for pi-stuck", || async {
        requests.get(&diag_key).await.ok().flatten()
    })
    .await;
    let mut bundle = DiagnosticsBundle {
        device: stuck.clone(),
        request,
        collected_at: Timestamp::now(),
        sections: vec![
            Section::new(
                Item::WorkloadLogs,
                Some(fleet_wire::WorkloadName::try_from("cache").unwrap()),
                &format!(
                    "2026-12-07T10:00:01Z cache starting\n2026-12-07T10:00:02Z {BUNDLE_LINE}\n\
                     2026-12-07T10:00:03Z the api token is [redacted]\n"
                ),
                50,
            ),
            Section::new(
                Item::Disk,
                None,
                "/ size=29.4 GiB used=7.9 GiB free=20.0 GiB use=29%\n/var size=29.4 GiB used=7.9 GiB free=20.0 GiB use=29%",
                50,
            ),
        ],
        redacted: 1,
        cut: false,
    };
    let bundles: kv::Store =
        f.js.get_key_value(layout::DIAGNOSTICS_BUNDLE)
            .await
            .unwrap();
    bundles
        .put(&diag_key, bundle.to_bounded_json().into())
        .await
        .unwrap();
    eventually("the DeviceDiagnostics Complete", || async {
        let s = diagnostics.get(&diag_name).await.ok()?.status?;
        (s.phase == Some(DiagnosticsPhase::Complete)).then_some(())
    })
    .await;
    let url = format!("{authed}/devices/{stuck}");
    let dom = tokio::task::spawn_blocking(move || browse(&url, &["--dump-dom"]))
        .await
        .unwrap();
    for want in [
        "id=\"diagnostics\"".to_string(),
        diag_name.clone(),
        "Complete".into(),
        "data-section=\"workloadLogs\"".into(),
        "data-section=\"disk\"".into(),
        BUNDLE_LINE.into(),
        ", 1 string redacted".into(),
    ] {
        assert!(
            dom.contains(&want),
            "{stuck}'s page does not show its diagnostics: {want:?} missing from the DOM:\n{dom}"
        );
    }

    // The Reboots page's history is the FleetLock server's, as the test reads it itself: one row per recent event,
    // newest first, and one bar per hold with how it ended and how long it lasted.
    use fleet_operator::dashboard::{holds, reboots};
    let src = reboots::FleetLockSource {
        url: format!("http://{}", fl.addr),
        token: None,
        ca: Vec::new(),
    };
    let server = tokio::task::spawn_blocking(move || reboots::fetch(&src))
        .await
        .unwrap()
        .expect("the FleetLock status");
    let kinds: Vec<&str> = server
        .recent
        .iter()
        .map(|e| match e.kind {
            LockEventKind::Granted => "granted",
            LockEventKind::Released => "released",
            _ => "other",
        })
        .collect();
    assert_eq!(kinds, ["granted", "released", "granted"], "newest first");
    let url = format!("{authed}/reboots");
    let dom = tokio::task::spawn_blocking(move || browse(&url, &["--dump-dom"]))
        .await
        .unwrap();
    let rows: Vec<&str> = dom
        .split("data-event=\"")
        .skip(1)
        .filter_map(|r| r.split('"').next())
        .collect();
    assert_eq!(
        rows, kinds,
        "the table's rows are the server's events:\n{dom}"
    );
    let drawn = holds::holds(&server);
    assert_eq!(drawn.len(), 2, "{drawn:?}");
    assert!(dom.contains("data-holds=\"2\""), "{dom}");
    for h in &drawn {
        let want = match h.to {
            Some(to) => format!(
                "data-hold=\"{}/{}\" data-end=\"released\" data-held-secs=\"{}\"",
                h.group,
                h.id,
                to.since(h.from).as_secs()
            ),
            None => format!("data-hold=\"{}/{}\" data-end=\"held\"", h.group, h.id),
        };
        assert!(dom.contains(&want), "{want:?} missing:\n{dom}");
    }
    // Since when the device holds its slot: the server's taken_at, in the holders table.
    let held = server.groups.iter().flat_map(|g| &g.holders).next();
    let held = held.expect("a holder");
    assert_eq!(held.id, rolled_rid);
    assert!(
        dom.contains(&format!("<time datetime=\"{}\">", held.taken_at)),
        "held since {} missing:\n{dom}",
        held.taken_at
    );
    // Every bar is readable: at least the least width, the 1-s hold beside the minutes-long one included.
    let widths: Vec<u64> = dom
        .split("data-bar=\"hold\"")
        .skip(1)
        .filter_map(|r| r.split("width=\"").nth(1)?.split('"').next()?.parse().ok())
        .collect();
    assert_eq!(widths.len(), 2, "{dom}");
    assert!(
        widths.iter().all(|w| *w >= holds::MIN_BAR),
        "bars {widths:?} narrower than {}:\n{dom}",
        holds::MIN_BAR
    );

    // The device pages' timelines: one mark per transition of the Device's status as the API server holds it
    // (the same before and after the page is loaded), with its phase, in order.
    let devices = Api::<Device>::all(f.client.clone());
    for dev in [&stuck, &rolled] {
        let transitions = || async {
            let d = devices.get(dev.as_str()).await.unwrap();
            let u = d.status.and_then(|s| s.agent_upgrade);
            u.map(|u| {
                u.transitions
                    .as_slice()
                    .iter()
                    .map(|t| {
                        serde_json::to_value(t.phase)
                            .unwrap()
                            .as_str()
                            .unwrap()
                            .to_owned()
                    })
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default()
        };
        let (dom, want) = loop {
            let before = transitions().await;
            let url = format!("{authed}/devices/{dev}");
            let dom = tokio::task::spawn_blocking(move || browse(&url, &["--dump-dom"]))
                .await
                .unwrap();
            if transitions().await == before {
                break (dom, before);
            }
        };
        assert!(
            want.len() >= 2,
            "{dev}: the test's upgrade has transitions: {want:?}"
        );
        assert_eq!(
            fleet_operator::dashboard::timeline::phases(&dom),
            Some(want),
            "{dev}: the timeline's marks are the status's transitions:\n{dom}"
        );
    }

    // The rollout pages: every bar part is the count the API server holds in the object's status at that moment
    // (whatever the operator wrote), and each device the status names as failing links to its page.
    let release_status = || async {
        releases
            .get(&release_name)
            .await
            .ok()
            .and_then(|r| r.status)
    };
    let deployment_status = |n: String| {
        let deployments = deployments.clone();
        async move { deployments.get(&n).await.ok().and_then(|d| d.status) }
    };
    let dep_name = f.name("web");
    let (dom, st) = page_with_status(&authed, "/releases", release_status).await;
    let st = st.expect("the release has a status");
    let mut wants = bar_counts(&st, false);
    wants.extend([release_name.clone(), "Halted: CanaryFailed".into()]);
    let (page, st) = page_with_status(
        &authed,
        &format!("/releases/{release_name}"),
        release_status,
    )
    .await;
    let st = st.expect("the release has a status");
    let named = fleet_operator::dashboard::named_devices::named(&st.conditions);
    assert!(
        named.iter().any(|n| n.device == canary),
        "the halt names the canary: {:#?}",
        st.conditions
    );
    // The condition history: one row per entry of the status's, newest first, the halt among them.
    let history: Vec<&str> = page
        .split("data-history=\"")
        .skip(1)
        .filter_map(|r| r.split('"').next())
        .collect();
    let want: Vec<&str> = st
        .condition_history
        .iter()
        .rev()
        .map(|c| c.type_.as_str())
        .collect();
    assert_eq!(history, want, "the history rows are the status's:\n{page}");
    assert!(
        st.condition_history
            .iter()
            .any(|c| c.type_ == "Halted" && c.status == "True" && c.reason == "CanaryFailed"),
        "the halt is in the history: {:#?}",
        st.condition_history
    );
    let mut page_wants = bar_counts(&st, true);
    page_wants.push("<b id=\"rollout-phase\">Halted</b>".into());
    page_wants.push("a canary failed: the rollout is halted".into());
    page_wants.push("agent restarted during its soak".into());
    for n in &named {
        page_wants.push(format!(
            "<span data-failing-device=\"{0}\"><a href=\"/devices/{0}\">{0}</a></span>",
            n.device
        ));
    }
    let both = || async {
        (
            deployment_status(dep_name.clone()).await,
            deployment_status(staged_name.clone()).await,
        )
    };
    let (deps_dom, (web_st, staged_st)) = page_with_status(&authed, "/deployments", both).await;
    let (web_st, staged_st) = (web_st.expect("web status"), staged_st.expect("api status"));
    let mut deps_wants = bar_counts(&web_st, false);
    deps_wants.extend(bar_counts(&staged_st, false));
    deps_wants.extend([dep_name.clone(), staged_name.clone()]);
    let (web_dom, web_st) = page_with_status(&authed, &format!("/deployments/{dep_name}"), || {
        deployment_status(dep_name.clone())
    })
    .await;
    let web_st = web_st.expect("web status");
    assert!(
        web_st.workloads.is_some(),
        "the deployment counts its workloads"
    );
    let (staged_dom, staged_st) =
        page_with_status(&authed, &format!("/deployments/{staged_name}"), || {
            deployment_status(staged_name.clone())
        })
        .await;
    let staged_st = staged_st.expect("api status");
    assert!(
        staged_st.rollout.is_some(),
        "a staged deployment's rollout status"
    );
    for (path, dom, wants) in [
        ("/releases".to_owned(), &dom, wants),
        (format!("/releases/{release_name}"), &page, page_wants),
        ("/deployments".to_owned(), &deps_dom, deps_wants),
        (
            format!("/deployments/{dep_name}"),
            &web_dom,
            bar_counts(&web_st, true),
        ),
        (format!("/deployments/{staged_name}"), &staged_dom, {
            let mut w = bar_counts(&staged_st, true);
            w.push("<b id=\"rollout-phase\">Soaking</b>".into());
            // When the canary's soak ends and who waits next, as the status says.
            let r = staged_st.rollout.as_ref().expect("its rollout");
            let end = r
                .soak_ends_at
                .as_deref()
                .expect("a soak end while the canary soaks");
            w.push(format!("<span id=\"soak-ends\" data-at=\"{end}\">"));
            assert!(!r.next.is_empty(), "the others are next: {r:?}");
            w.extend(r.next.iter().map(|d| format!("data-next=\"{d}\"")));
            w
        }),
    ] {
        assert!(!wants.is_empty());
        for want in wants {
            assert!(
                dom.contains(want.as_str()),
                "{path}: {want:?} missing from the DOM:\n{dom}"
            );
        }
        assert!(!dom.contains(SECRET), "{path} shows a workload's env");
        assert!(!dom.contains("<script"), "{path} has a script");
    }
    // A second TaskRun whose canary never answers: it stays Running (its deadline is an hour away).
    let second: TaskRun = serde_json::from_value(json!({
        "apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "TaskRun",
        "metadata": {"name": "weekly-upgrade", "labels": f.labels(json!({}))},
        "spec": {"allowedGroups": [group], "targetSelector": {}, "deadlineSeconds": 3600, "systemUpgradeV1": {}}
    }))
    .unwrap();
    runs.create(&PostParams::default(), &second).await.unwrap();
    eventually("the second run running", || async {
        let s = runs.get("weekly-upgrade").await.ok()?.status?.run;
        (s.phase == Some(TaskRunPhase::Running)).then_some(())
    })
    .await;

    // The overview's pictures and the fleet's metrics: each count is what the test reads back itself.
    let (dom, view) = load_with_view(&f, &authed, &base, "/", true).await;
    assert_overview_bars(&dom, &view);
    // The versions over time: sampled since the operator started (one a minute), the newest sample's series
    // summing to the fleet (no device came or went since).
    let chart = dom
        .split("data-chart=\"version-history\"")
        .nth(1)
        .expect("the version history chart");
    let chart = &chart[..chart.find("</figure>").expect("its end")];
    assert!(chart.contains("data-samples=\""), "{chart}");
    let newest: u64 = chart
        .split("data-last-count=\"")
        .skip(1)
        .map(|r| r.split('"').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(newest, view.versions.values().sum::<u64>(), "{chart}");
    let (m, view) = load_with_view(&f, &authed, &base, "/metrics", false).await;
    assert_fleet_metrics(&m, &view);

    // The overview and every page's navigation link to the list pages.
    let url = format!("{authed}/");
    let overview = tokio::task::spawn_blocking(move || browse(&url, &["--dump-dom"]))
        .await
        .unwrap();
    for link in ["href=\"/releases\"", "href=\"/deployments\""] {
        assert_eq!(
            overview.matches(link).count(),
            2,
            "{link}: nav and overview"
        );
    }

    // Screenshots for docs/dashboard.md.
    let shots = dir.path().to_path_buf();
    let a = authed.clone();
    let (stuck_path, run_path, release_path) = (
        format!("/devices/{stuck}"),
        format!("/runs/{}/{run_name}", f.run),
        format!("/releases/{release_name}"),
    );
    tokio::task::spawn_blocking(move || {
        screenshot(&a, "/", "overview", (1280, 1900), &shots);
        screenshot(&a, &stuck_path, "device", (1280, 1900), &shots);
        screenshot(&a, &run_path, "run", (1280, 1000), &shots);
        screenshot(&a, "/reboots", "reboots", (1280, 1000), &shots);
        screenshot(&a, &release_path, "release", (1280, 1500), &shots);
        screenshot(&a, "/deployments", "deployments", (1280, 600), &shots);
        // A phone's width: a person checks a rollout from their phone.
        screenshot(&a, &release_path, "phone-release", (390, 2400), &shots);
        screenshot(&a, "/", "phone-overview", (390, 2400), &shots);
    })
    .await
    .unwrap();

    // Alerts as events: on the Device and the TaskRun they are about, and on the operator's Pod for FleetLock.
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(f.client.clone());
    eventually("alert events", || async {
        let list = events.list(&Default::default()).await.ok()?;
        let has = |name: &str, reason: &str| {
            list.items.iter().any(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                    && e.reason.as_deref() == Some(reason)
                    && e.type_.as_deref() == Some("Warning")
            })
        };
        (has(stuck.as_str(), "DeviceRollbackFailed")
            && has(stuck.as_str(), "WorkloadCrashLooping")
            && has(silent.as_str(), "DeviceSilent")
            && has(run_name, "TaskRunCanaryFailed")
            && has("fleet-operator-test", "FleetLockSlotHeldTooLong"))
        .then_some(())
    })
    .await;

    // Metrics.
    let b = base.clone();
    let (code, m) = tokio::task::spawn_blocking(move || get(&b, "/metrics", Some(TOKEN)))
        .await
        .unwrap();
    assert_eq!(code, 200);
    for want in [
        "fleet_alerts{alert=\"DeviceRollbackFailed\"} 1",
        "fleet_alerts{alert=\"TaskRunCanaryFailed\"} 1",
        "fleet_alerts{alert=\"WorkloadCrashLooping\"} 1",
        "fleet_alerts{alert=\"AgentCrashLooping\"} 0",
        "fleet_agents_crash_looping 0",
        "fleet_alerts{alert=\"FleetLockConfigInvalid\"} 0",
        "fleet_devices{phase=\"rollback-failed\"} 1",
        "fleet_devices{phase=\"failed\"} 1",
        "fleet_task_runs{phase=\"Failed\"} 1",
        "fleet_fleetlock_status_up 1",
        "fleet_operator_reconciles_total{controller=\"deployments\"}",
        "fleet_operator_reconciles_total{controller=\"taskruns\"}",
        "fleet_operator_nats_write_duration_seconds_count",
    ] {
        assert!(m.contains(want), "{want:?} missing from /metrics:\n{m}");
    }
    // Liveness as the dashboard reads it (the heartbeat mirror): most beat just now, pi-silent an hour ago.
    let age = |q: &str| -> u64 {
        let prefix = format!("fleet_device_heartbeat_age_seconds{{quantile=\"{q}\"}} ");
        m.lines()
            .find_map(|l| l.strip_prefix(&prefix)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {prefix:?} in /metrics:\n{m}"))
    };
    assert!(age("0.5") < 600, "median heartbeat age {} s", age("0.5"));
    assert!(
        (3600..4200).contains(&age("1")),
        "oldest heartbeat age {} s (pi-silent's is an hour)",
        age("1")
    );
    let b = base.clone();
    let (code, _) = tokio::task::spawn_blocking(move || get(&b, "/metrics", None))
        .await
        .unwrap();
    assert_eq!(code, 401, "metrics need the token too");

    // One NATS connection for the whole operator: the deployments controller, the TaskRun controller, the refusal
    // reports and the dashboard (all of which have used NATS by now) share it.
    assert_eq!(
        fleet_rig::util::tcp_connections_to(_op.0.id(), f.nats.port()),
        1,
        "the operator's connections to nats-server"
    );
}

/// A run page reads only the plan chunk(s) holding its devices, in plan order, with each device's status and
/// release; a chunk that does not match its digest is an error, never a wrong page. Real nats-server, a
/// 25,000-device plan (three chunks).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_pages_read_one_chunk_of_a_large_plan() {
    use fleet_operator::dashboard::runs::{read_plan_page, DEVICES_PER_RUN_PAGE};
    use fleet_operator::dashboard::state::Buckets;
    let nats = fleet_rig::NatsServer::start();
    let nc = async_nats::connect(nats.url()).await.unwrap();
    let js = async_nats::jetstream::new(nc);
    let buckets = std::sync::Arc::new(Buckets::open(&js, &Default::default()).await.unwrap());
    let uid = AttemptId::try_from("6f1c2b9e-8d0a-4c55-9a77-3f2e1d0c9b8a").unwrap();
    let ids: Vec<DeviceId> = (0..25_000)
        .map(|i| DeviceId::try_from(format!("d-{i:05}").as_str()).unwrap())
        .collect();
    let plan = fleet_wire::TaskPlan::new(
        uid,
        fleet_wire::TaskOperation::AptFullUpgradeV1,
        Timestamp::now(),
        ids[..5].to_vec(),
        ids[5..].to_vec(),
        Timestamp::now(),
    )
    .unwrap();
    let plans = buckets.store(layout::TASK_PLANS).unwrap().clone();
    assert!(
        read_plan_page(&buckets, &uid, 0).await.unwrap().is_none(),
        "no plan yet"
    );
    fleet_operator::tasks::store::create(&plans, &plan)
        .await
        .unwrap();
    // d-12001 reported; d-12002 was released and has not reported.
    let mut st = fixtures::system_status();
    st.run_uid = uid;
    st.device_id = ids[12_001].clone();
    let key = layout::run_key(&ids[12_001], &uid);
    buckets
        .store(layout::SYSTEM_UPGRADE_STATUS)
        .unwrap()
        .put(key, serde_json::to_vec(&st).unwrap().into())
        .await
        .unwrap();
    let attempt = fixtures::system_attempt();
    buckets
        .store(layout::SYSTEM_UPGRADE_INTENT)
        .unwrap()
        .put(
            layout::run_key(&ids[12_002], &uid),
            serde_json::to_vec(&attempt).unwrap().into(),
        )
        .await
        .unwrap();

    let first = read_plan_page(&buckets, &uid, 0).await.unwrap().unwrap();
    assert_eq!(
        (first.total, first.canaries, first.rows.len()),
        (25_000, 5, DEVICES_PER_RUN_PAGE)
    );
    assert!(first.rows[..5].iter().all(|r| r.canary) && !first.rows[5].canary);
    let page = 12_000 / DEVICES_PER_RUN_PAGE;
    let mid = read_plan_page(&buckets, &uid, page).await.unwrap().unwrap();
    assert_eq!(mid.rows[0].device, ids[12_000]);
    assert_eq!(mid.rows[1].device, ids[12_001]);
    assert!(mid.rows[1].status.is_some() && mid.rows[1].released);
    assert!(mid.rows[2].status.is_none() && mid.rows[2].released);
    assert!(!mid.rows[3].released);
    let last = read_plan_page(&buckets, &uid, 124).await.unwrap().unwrap();
    assert_eq!(last.rows.len(), 200);
    assert_eq!(last.rows[199].device, ids[24_999]);
    assert!(read_plan_page(&buckets, &uid, 125)
        .await
        .unwrap()
        .unwrap()
        .rows
        .is_empty());

    // Someone alters the middle chunk: that page is an error; the others still read.
    let (manifest, _) = plan.to_stored();
    plans
        .put(
            fleet_wire::taskrun::plan_chunk_key(&uid, &manifest.chunks[1]),
            b"{\"runUid\":\"x\"}".to_vec().into(),
        )
        .await
        .unwrap();
    let err = read_plan_page(&buckets, &uid, page)
        .await
        .err()
        .expect("altered chunk");
    assert!(
        err.to_string().contains("does not match its digest"),
        "{err}"
    );
    assert!(read_plan_page(&buckets, &uid, 0).await.is_ok());
}

/// The FleetLock status is read over HTTPS with a private CA (`--dashboard-fleetlock-ca-file`) and the bearer
/// token; an unknown issuer, a refusal and an oversized answer are errors that say why (rig's rustls server).
#[test]
fn fleetlock_status_over_https_with_a_private_ca() {
    use fleet_operator::dashboard::reboots::{fetch, FleetLockSource, MAX_STATUS_BYTES};
    use fleet_rig::https::{HttpsServer, Reply};
    let ca = fleet_rig::tls::TestCa::new();
    let status = json!({"store": "nats", "config_valid": true, "groups": [
        {"name": "default", "slots": 1, "holders": [{"id": "pi-1", "ip": "10.0.0.7", "taken_at": "2026-12-01T10:00:00Z"}]}]});
    let server = HttpsServer::start(&ca, move |req| match req.path() {
        "/v1/status" if req.header("authorization") == Some("Bearer fl-token") => {
            Reply::ok(status.to_string())
        }
        "/v1/status" => Reply::status(401, &[]),
        _ => Reply::ok(vec![b' '; MAX_STATUS_BYTES as usize + 1]),
    });
    let base = server.url("");
    let pem = std::fs::read(ca.ca_file()).unwrap();
    let src = FleetLockSource {
        url: base.clone(),
        token: Some("fl-token".into()),
        ca: vec![],
    }
    .with_ca_pem(&pem)
    .unwrap();
    let st = fetch(&src).expect("status over https");
    assert_eq!(st.groups[0].holders[0].id, "pi-1");
    let no_ca = FleetLockSource {
        ca: vec![],
        ..src.clone()
    };
    let e = fetch(&no_ca).expect_err("unknown issuer");
    assert!(e.contains(&base), "{e}");
    let no_token = FleetLockSource {
        token: None,
        ..src.clone()
    };
    assert!(fetch(&no_token).expect_err("refused").contains("HTTP 401"));
    let big = FleetLockSource {
        url: format!("{base}/big"),
        ..src.clone()
    };
    assert!(fetch(&big).is_err(), "an answer over 1 MiB is refused");
    assert!(FleetLockSource { ca: vec![], ..src }
        .with_ca_pem(b"no pem")
        .is_err());
}

/// A value written by a device, a person or the FleetLock server that looks like markup comes out as text on every
/// page that shows it: the templates escape it. Each page is rendered from objects carrying the hostile
/// value in every field it shows: workload and upgrade errors, a device's description and labels, a run's error,
/// condition and per-device error, a FleetLock holder's id and host and the config error, an alert's detail.
#[test]
fn hostile_values_are_escaped_on_every_page() {
    use fleet_operator::dashboard::alerts::{Alert, AlertKind, Subject};
    use fleet_operator::dashboard::runs::{DeviceResult, PlanPage};
    use fleet_operator::dashboard::state::FleetLockView;
    use fleet_operator::dashboard::{device, overview, reboots, rollouts, runs};
    use std::sync::Arc;
    const HOSTILE: &str = "<script>alert(\"x&y\")</script>'";
    const ESCAPED: &str = "&lt;script&gt;alert(&quot;x&amp;y&quot;)&lt;/script&gt;'";
    let check = |page: &str, html: &str, at_least: usize| {
        assert!(!html.contains("<script"), "{page}: raw markup:\n{html}");
        assert!(
            html.matches(ESCAPED).count() >= at_least,
            "{page}: the hostile value escaped at least {at_least} times:\n{html}"
        );
    };
    let now = Timestamp::now();
    let dev: Device = serde_json::from_value(json!({
        "apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "Device",
        "metadata": {"name": "pi-1", "labels": {"site": "a"}},
        "spec": {"description": HOSTILE},
        "status": {"workloads": {"running": 0, "failed": 1, "pending": 0, "latestError": HOSTILE}}
    }))
    .unwrap();
    let mut upgrade = fixtures::failed_status();
    upgrade.error = Some(BoundedText::lossy(HOSTILE));
    let mut dev_with_upgrade = dev.clone();
    dev_with_upgrade.status.as_mut().unwrap().agent_upgrade = Some(upgrade);
    let mut ws = fixtures::workload_status();
    ws.workloads[0].error = Some(BoundedText::lossy(HOSTILE));
    let mut sys = fixtures::system_status();
    sys.error = Some(BoundedText::lossy(HOSTILE));
    let kv = device::DeviceKv {
        heartbeat: None,
        workloads: Some(ws),
        runs: vec![("ns".into(), "run-1".into(), Some(sys.clone()))],
        errors: vec![HOSTILE.into()],
        // A device's diagnostics: the request's message, a section's text and its error, all from the device.
        diagnostics: vec![Arc::new(
            serde_json::from_value(serde_json::json!({
                "apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "DeviceDiagnostics",
                "metadata": {"name": "ask"}, "spec": {"device": "pi-1"},
                "status": {"phase": "Complete", "message": HOSTILE, "bundle": {"collectedAt": "2026-12-07T10:00:00Z",
                    "sections": [{"item": "disk", "text": HOSTILE, "error": HOSTILE}]}}
            }))
            .unwrap(),
        )],
    };
    let alerts = vec![
        Alert {
            kind: AlertKind::DeviceSilent,
            subject: Subject::Device("pi-1".into()),
            since: Some(now),
            detail: HOSTILE.into(),
        },
        Alert {
            kind: AlertKind::SlotHeldTooLong,
            subject: Subject::Holder {
                group: "default".into(),
                id: HOSTILE.into(),
            },
            since: Some(now),
            detail: HOSTILE.into(),
        },
    ];
    // Device page: the description, the workload error, the upgrade error, the run result's error, the read
    // error and the device's alert.
    check(
        "device",
        &device::render(&dev_with_upgrade, &kv, &alerts, now),
        9,
    );
    // Overview and alerts list: each alert's detail, the holder's id in its subject.
    let devices = vec![Arc::new(dev.clone())];
    check(
        "overview",
        &overview::render(
            &overview::Objects {
                devices: &devices,
                groups: &[],
                runs: &[],
                releases: &[],
                deployments: &[],
                version_history: &[fleet_operator::dashboard::version_history::Sample {
                    at: now,
                    counts: vec![(HOSTILE.into(), 1)],
                }],
            },
            &alerts,
            &|_| None,
            now,
        ),
        // Each alert's detail and the holder's id; the version history's version, in its series and legend.
        5,
    );
    // Task run: its latest error, a condition's message, a device's error.
    let run: TaskRun = serde_json::from_value(json!({
        "apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "TaskRun",
        "metadata": {"name": "run-1", "namespace": "ns"},
        "spec": {"allowedGroups": ["g"], "targetSelector": {}, "deadlineSeconds": 3600, "systemUpgradeV1": {}},
        "status": {"phase": "Failed", "targets": 1, "succeeded": 0, "failed": 1, "latestError": HOSTILE,
                   "conditions": [{"type": "Complete", "status": "False", "reason": "Failed", "message": HOSTILE,
                                   "lastTransitionTime": "2026-12-01T10:00:00Z"}]}
    }))
    .unwrap();
    let plan = PlanPage {
        total: 1,
        canaries: 1,
        rows: vec![DeviceResult {
            device: DeviceId::try_from("pi-1").unwrap(),
            canary: true,
            released: true,
            status: Some(sys),
        }],
    };
    check("run", &runs::render(&run, Ok(Some(plan)), 0, &[], now), 3);
    check(
        "run without a plan",
        &runs::render(&run, Err(HOSTILE.into()), 0, &[], now),
        3,
    );
    // Reboots: holder id and host, the config error, the holder's alert.
    let status: fleet_wire::fleetlock::ServerStatus = serde_json::from_value(json!({
        "store": "file", "config_valid": false, "config_error": HOSTILE,
        "groups": [{"name": "default", "slots": 1, "holders": [
            {"id": HOSTILE, "hostname": HOSTILE, "ip": "10.0.0.1", "taken_at": "2026-12-01T10:00:00Z"}]}]
    }))
    .unwrap();
    let view = FleetLockView {
        fetched_at: now,
        status: Ok(status),
    };
    check(
        "reboots",
        &reboots::render(Some(&view), &Default::default(), &alerts, now),
        5,
    );
    let failed = FleetLockView {
        fetched_at: now,
        status: Err(HOSTILE.into()),
    };
    check(
        "reboots, unreadable",
        &reboots::render(Some(&failed), &Default::default(), &[], now),
        1,
    );
    // Rollout pages: the object's name, its groups, a build's architecture and version, a failing device's
    // reason as the halt names it, a condition's reason and message, the latest workload error.
    let halted = json!([
        {"type": "Halted", "status": "True", "reason": HOSTILE, "lastTransitionTime": "2026-12-01T10:00:00Z",
         "message": format!("a canary failed: pi-1 ({HOSTILE}); no further device gets the change")}
    ]);
    let rel: AgentRelease = serde_json::from_value(json!({
        "apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "AgentRelease",
        "metadata": {"name": HOSTILE},
        "spec": {"allowedGroups": [HOSTILE], "rollout": {},
            "builds": [{"architecture": HOSTILE, "version": HOSTILE, "artifact": HOSTILE, "sha256": "00",
                "byteLimit": 1}]},
        "status": {"rollout": {"phase": "Halted", "updated": 0, "healthy": 0, "soaking": 0, "updating": 0,
            "pending": 2, "failed": 1}, "conditions": halted}
    }))
    .unwrap();
    // Title and heading, groups, architecture, version, the device's reason, the condition's reason and message.
    check(
        "release",
        &rollouts::release(&rel, &|_| Some(HOSTILE.into()), now),
        9,
    );
    // The link's text, the problem's reason and its message (as the tooltip).
    check("releases", &rollouts::releases(&[Arc::new(rel)]), 3);
    let dep: FleetDeployment = serde_json::from_value(json!({
        "apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "FleetDeployment",
        "metadata": {"name": HOSTILE},
        "spec": {"allowedGroups": [HOSTILE], "workloads": []},
        "status": {"workloads": {"running": 0, "failed": 1, "pending": 0, "latestError": format!("pi-1: {HOSTILE}")},
            "conditions": [{"type": "Degraded", "status": "True", "reason": HOSTILE,
                "lastTransitionTime": "2026-12-01T10:00:00Z", "message": HOSTILE}]}
    }))
    .unwrap();
    // Title and heading, groups, the latest workload error, the condition's reason and message.
    check("deployment", &rollouts::deployment(&dep, now), 6);
    check("deployments", &rollouts::deployments(&[Arc::new(dep)]), 3);
    // A status that does not exist yet: the name still shows, escaped.
    let mut bare = rel_without_status();
    bare.metadata.name = Some(HOSTILE.into());
    check(
        "release without a status",
        &rollouts::release(&bare, &|_| None, now),
        2,
    );
}

/// An AgentRelease as created, before the operator wrote its status.
fn rel_without_status() -> AgentRelease {
    serde_json::from_value(json!({
        "apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "AgentRelease",
        "metadata": {"name": "agent-2"},
        "spec": {"allowedGroups": ["pilot"], "builds": []}
    }))
    .unwrap()
}
