//! Device health a person sees, through the real `fleet-operator` binary against the real kube-apiserver and a real
//! nats-server.
//!
//! Liveness across restarts: a live fleet whose agents beat into `device-heartbeat` as the agent does while their
//! Devices carry an older `lastHeartbeat` (the operator refreshes it only hourly). Restarted three times, the
//! operator raises no `DeviceSilent` event for a device that beats; a device silenced before the restarts is still
//! alerted within the silence threshold plus 30 s. The Devices' `Online` condition (kubectl's Online column) is
//! written once for the live devices and never again across the restarts; the silenced device turns
//! `Online=False` 90 s after its last heartbeat without any new report, the latest heartbeat written with it.
//!
//! Crash loops: an agent and a workload that keep restarting show on their Devices and raise one event each.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use async_nats::jetstream::kv;
use fleet_operator::crd::{CrashLooping, Device};
use fleet_wire::kv as layout;
use fleet_wire::{fixtures, DeviceId, Timestamp};
use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod kube_common;
use kube_common::{kubectl, Fleet, API};

/// The alert threshold the operators run with (`--alert-silent-after`).
const SILENT_AFTER: Duration = Duration::from_secs(20);
/// How often the live devices beat (the agent's default is 30 s; beats must come well within [`SILENT_AFTER`]).
const BEAT: Duration = Duration::from_secs(2);
/// How long each of the first two operators runs before it is killed.
const RUN: Duration = Duration::from_secs(12);

/// The operator binary for this test's objects, logging to `log`.
fn operator(f: &Fleet, dir: &Path, log: &str) -> Kill {
    let api = API.get().expect("apiserver");
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(&kubeconfig, api.kubeconfig(api.token())).unwrap();
    let log = std::fs::File::create(dir.join(log)).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_fleet-operator"))
        .args([
            "--alert-silent-after",
            &format!("{}s", SILENT_AFTER.as_secs()),
        ])
        .env("KUBECONFIG", &kubeconfig)
        .env("FLEET_NATS_URL", f.nats.url())
        .env("FLEET_LABEL_SELECTOR", format!("fleet-test={}", f.run))
        .env("POD_NAME", "fleet-operator-liveness")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start fleet-operator");
    Kill(child)
}

struct Kill(std::process::Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One heartbeat of `id` as the agent writes it: now by its clock, the next sequence. Returns its time.
async fn beat(store: &kv::Store, id: &DeviceId, sequence: u64) -> Timestamp {
    beat_behind(store, id, sequence, Duration::ZERO).await
}

/// [`beat`] from a device whose clock runs `behind`.
async fn beat_behind(
    store: &kv::Store,
    id: &DeviceId,
    sequence: u64,
    behind: Duration,
) -> Timestamp {
    let mut hb = fixtures::heartbeat();
    hb.device_id = id.clone();
    hb.at = Timestamp::from_unix_ms(Timestamp::now().unix_ms() - behind.as_millis() as u64);
    hb.sequence = sequence;
    store
        .put(id.as_str(), serde_json::to_vec(&hb).unwrap().into())
        .await
        .expect("put heartbeat");
    hb.at
}

/// The `DeviceSilent` events about `name`.
async fn silent_events(client: &kube::Client, name: &str) -> Vec<Event> {
    events(client, name, "DeviceSilent").await
}

/// The events with `reason` about `name`.
async fn events(client: &kube::Client, name: &str, reason: &str) -> Vec<Event> {
    Api::<Event>::namespaced(client.clone(), "default")
        .list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarts_raise_no_false_silence_and_a_silenced_device_is_still_alerted() {
    let f = Fleet::start("liveness").await;
    fleet_operator::kv::ensure_buckets(&f.js, &Default::default())
        .await
        .expect("buckets");
    let heartbeats = f.js.get_key_value(layout::DEVICE_HEARTBEAT).await.unwrap();
    let infos = f.js.get_key_value(layout::DEVICE_INFO).await.unwrap();
    let devices: Api<Device> = Api::all(f.client.clone());
    let live: Vec<DeviceId> = ["pi-a", "pi-b", "pi-c"]
        .iter()
        .map(|b| DeviceId::try_from(f.name(b).as_str()).unwrap())
        .collect();
    let quiet = DeviceId::try_from(f.name("pi-quiet").as_str()).unwrap();
    // A live device whose clock runs two hours behind (a Raspberry Pi without a real-time clock and without NTP).
    let skewed = DeviceId::try_from(f.name("pi-skewed").as_str()).unwrap();
    const SKEW: Duration = Duration::from_secs(2 * 3600);
    // Every Device as an operator left it: a `lastHeartbeat` half an hour old (within the hourly refresh, so the
    // operator keeps it), its agent's info in NATS.
    let older = Timestamp::from_unix_ms(Timestamp::now().unix_ms() - 30 * 60 * 1000);
    for id in live.iter().chain([&quiet, &skewed]) {
        let d: Device = serde_json::from_value(json!({
            "apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "Device",
            "metadata": {"name": id.as_str(), "labels": f.labels(json!({}))}, "spec": {}
        }))
        .unwrap();
        devices.create(&PostParams::default(), &d).await.unwrap();
        devices
            .patch_status(
                id.as_str(),
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"lastHeartbeat": older.to_string()}})),
            )
            .await
            .unwrap();
        let mut info = fixtures::device_info();
        info.device_id = id.clone();
        infos
            .put(id.as_str(), serde_json::to_vec(&info).unwrap().into())
            .await
            .unwrap();
    }
    // The live fleet beats for the whole test; the quiet device beats once and falls silent before any operator.
    let beating = {
        let (store, live, skewed) = (heartbeats.clone(), live.clone(), skewed.clone());
        tokio::spawn(async move {
            for sequence in 1.. {
                for id in &live {
                    beat(&store, id, sequence).await;
                }
                beat_behind(&store, &skewed, sequence, SKEW).await;
                // why: the simulated devices' beat period, not a wait
                tokio::time::sleep(BEAT).await;
            }
        })
    };
    let quiet_beat = beat(&heartbeats, &quiet, 1).await;
    let silenced = Instant::now();
    let dir = tempfile::tempdir().unwrap();

    // Three restarts: two operators killed after a while each, then the third keeps running.
    let mut second_started = None;
    for n in 1..=2 {
        let op = operator(&f, dir.path(), &format!("operator-{n}.log"));
        // why: the scenario: each operator runs RUN before it is killed
        tokio::time::sleep(RUN).await;
        drop(op);
        second_started.get_or_insert_with(Timestamp::now);
    }
    let second_started = second_started.unwrap();
    let _op = operator(&f, dir.path(), "operator-3.log");

    // The silenced device is alerted within the threshold plus 30 s of its last heartbeat.
    let deadline = silenced + SILENT_AFTER + Duration::from_secs(30);
    loop {
        if !silent_events(&f.client, quiet.as_str()).await.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no DeviceSilent event for {quiet} within {} s of its last heartbeat",
            (SILENT_AFTER + Duration::from_secs(30)).as_secs()
        );
        // why: pacing of the bounded poll for the event
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let alerted_after = silenced.elapsed();
    // The third operator keeps judging a while longer: still no alarm for a device that beats.
    // why: 'no false alarm' has no event: 5 s more of the third operator's judging is the window
    tokio::time::sleep(Duration::from_secs(5)).await;
    let mut false_alarms = Vec::new();
    for id in &live {
        for e in silent_events(&f.client, id.as_str()).await {
            false_alarms.push(format!("{id}: {}", e.message.unwrap_or_default()));
        }
    }
    // The skewed device: an operator that never measured its clock judges the heartbeat it finds at its start by
    // the device's clock (the first operator may alert it once); every later start knows the offset from the
    // Device and raises nothing.
    let skew_alarms: Vec<Event> = silent_events(&f.client, skewed.as_str()).await;
    let after_first: Vec<String> = skew_alarms
        .iter()
        .filter(|e| {
            e.first_timestamp
                .as_ref()
                .and_then(|t| t.0.to_string().parse::<Timestamp>().ok())
                .is_some_and(|t| t >= second_started)
        })
        .map(|e| e.message.clone().unwrap_or_default())
        .collect();
    beating.abort();
    let logs: String = (1..=3)
        .map(|n| {
            std::fs::read_to_string(dir.path().join(format!("operator-{n}.log")))
                .unwrap_or_default()
        })
        .collect::<Vec<_>>()
        .join("\n---\n");
    assert!(
        false_alarms.is_empty(),
        "{} DeviceSilent events for devices that beat every {} s, over 3 operator starts:\n{}\n\nlogs:\n{logs}",
        false_alarms.len(),
        BEAT.as_secs(),
        false_alarms.join("\n")
    );
    assert!(
        after_first.is_empty(),
        "DeviceSilent for {skewed}, whose clock offset the Device records, after a restart: {after_first:?}\n\nlogs:\n{logs}"
    );
    let offset = devices
        .get(skewed.as_str())
        .await
        .unwrap()
        .status
        .and_then(|s| s.clock_offset_seconds);
    assert!(
        offset.is_some_and(|o| (o + 7200).abs() <= 5),
        "{skewed}: clockOffsetSeconds {offset:?}, its clock runs 7200 s behind"
    );
    eprintln!(
        "skewed device (2 h behind): {} DeviceSilent event(s) from the first operator, none after; clockOffsetSeconds {offset:?}",
        skew_alarms.len()
    );
    eprintln!(
        "quiet device alerted {:.1} s after its last heartbeat (threshold {} s)",
        alerted_after.as_secs_f64(),
        SILENT_AFTER.as_secs()
    );

    // Online: True on every live device since the first operator judged it, written once (its transition time
    // before the second operator started: no restart wrote it again); kubectl shows it.
    for id in live.iter().chain([&skewed]) {
        let d = devices.get(id.as_str()).await.unwrap();
        let (status, reason, since) =
            online(&d).unwrap_or_else(|| panic!("{id}: no Online: {d:?}"));
        assert_eq!(
            (status.as_str(), reason.as_str()),
            ("True", "Heartbeating"),
            "{id}"
        );
        assert!(
            since < second_started,
            "{id}: Online written again at {since} (second operator started at {second_started})"
        );
        assert_eq!(kubectl_cell(id.as_str(), "ONLINE"), "True", "{id}");
    }
    // The silenced device turns Online=False 90 s after its last heartbeat, noticed without any new report.
    let deadline = silenced + fleet_operator::liveness::OFFLINE_AFTER + Duration::from_secs(15);
    let off = loop {
        let d = devices.get(quiet.as_str()).await.unwrap();
        if let Some(("False", since)) = online(&d).as_ref().map(|(s, _, t)| (s.as_str(), *t)) {
            break (d, since);
        }
        assert!(
            Instant::now() < deadline,
            "{quiet} not Online=False within 105 s of its last heartbeat: {:?}",
            d.status
        );
        // why: pacing of the poll for Online=False (bounded by the deadline above)
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let offline_after = silenced.elapsed();
    let (d, _) = off;
    assert_eq!(online(&d).map(|(_, r, _)| r).as_deref(), Some("Silent"));
    let status = d.status.unwrap_or_default();
    assert_eq!(
        status.last_heartbeat.as_deref(),
        Some(quiet_beat.to_string().as_str()),
        "the write that turns Online False carries the latest heartbeat"
    );
    assert_eq!(kubectl_cell(quiet.as_str(), "ONLINE"), "False");
    eprintln!(
        "quiet device Online=False {:.1} s after its last heartbeat (after {} s)",
        offline_after.as_secs_f64(),
        fleet_operator::liveness::OFFLINE_AFTER.as_secs()
    );
}

/// The `Online` condition of `d`: status, reason, last transition.
fn online(d: &Device) -> Option<(String, String, Timestamp)> {
    let c = d
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Online")?;
    let since: Timestamp = c.last_transition_time.0.to_string().parse().ok()?;
    Some((c.status.clone(), c.reason.clone(), since))
}

/// The cell under `column` in `kubectl get fdev <name> -o wide`.
fn kubectl_cell(name: &str, column: &str) -> String {
    let (ok, table, stderr) = kubectl(&["get", "fdev", name, "-o", "wide"], "");
    assert!(ok, "kubectl get fdev {name}: {stderr}");
    let mut lines = table.lines();
    let header = lines.next().expect("header");
    let row = lines.next().expect("a row");
    let start = header
        .find(column)
        .unwrap_or_else(|| panic!("{column} in {table}"));
    row.get(start..)
        .filter(|rest| !rest.starts_with(' '))
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_default()
        .to_owned()
}

/// Crash loops are visible with no rollout running: a device whose agent restarted 4 times just now and one whose
/// workload Podman keeps restarting. Each Device shows it (`status.agentRestarts`, `status.crashLooping`,
/// kubectl's CrashLoop column) and each raises exactly one Warning event (`AgentCrashLooping`,
/// `WorkloadCrashLooping`), however often the devices report the same again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_loops_show_on_the_device_and_raise_one_event_each() {
    let f = Fleet::start("crashloop").await;
    fleet_operator::kv::ensure_buckets(&f.js, &Default::default())
        .await
        .expect("buckets");
    let store = |b: &'static str| {
        let js = f.js.clone();
        async move { js.get_key_value(b).await.unwrap() }
    };
    let (infos, heartbeats, statuses) = (
        store(layout::DEVICE_INFO).await,
        store(layout::DEVICE_HEARTBEAT).await,
        store(layout::WORKLOAD_STATUS).await,
    );
    let devices: Api<Device> = Api::all(f.client.clone());
    let agent = DeviceId::try_from(f.name("pi-agent").as_str()).unwrap();
    let host = DeviceId::try_from(f.name("pi-host").as_str()).unwrap();
    let started = Timestamp::now();
    for (id, restarts) in [(&agent, 4), (&host, 0)] {
        let d: Device = serde_json::from_value(json!({
            "apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "Device",
            "metadata": {"name": id.as_str(), "labels": f.labels(json!({}))}, "spec": {}
        }))
        .unwrap();
        devices.create(&PostParams::default(), &d).await.unwrap();
        let mut info = fixtures::device_info();
        info.device_id = id.clone();
        info.published_at = started;
        info.restarts = Some(restarts);
        infos
            .put(id.as_str(), serde_json::to_vec(&info).unwrap().into())
            .await
            .unwrap();
        beat(&heartbeats, id, 1).await;
    }
    let report = || {
        let mut ws = fixtures::workload_status_crash_looping();
        ws.device_id = host.clone();
        ws.at = Timestamp::now();
        serde_json::to_vec(&ws).unwrap()
    };
    statuses.put(host.as_str(), report().into()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let _op = operator(&f, dir.path(), "operator.log");

    // The Devices show it.
    let shown = kube_common::eventually("both Devices crash-looping", || async {
        let a = devices.get(agent.as_str()).await.ok()?.status?;
        let h = devices.get(host.as_str()).await.ok()?.status?;
        (a.crash_looping.is_some() && h.crash_looping.is_some()).then_some((a, h))
    })
    .await;
    let (a, h) = shown;
    assert_eq!(
        a.crash_looping,
        Some(CrashLooping::Agent),
        "the agent's device: {a:?}"
    );
    let restarts = a.agent_restarts.expect("agentRestarts");
    assert_eq!(
        (
            restarts.count,
            restarts.since.as_str(),
            restarts.crash_looping
        ),
        (4, started.to_string().as_str(), true)
    );
    assert_eq!(h.crash_looping, Some(CrashLooping::Workloads), "{h:?}");
    assert_eq!(h.workloads.as_ref().map(|w| w.crash_looping), Some(1));
    assert_eq!(kubectl_cell(agent.as_str(), "CRASHLOOP"), "agent");
    assert_eq!(kubectl_cell(host.as_str(), "CRASHLOOP"), "workloads");
    assert_eq!(kubectl_cell(agent.as_str(), "AGENTRESTARTS"), "4");

    // One event each, about the Device.
    let agent_event = kube_common::eventually("AgentCrashLooping event", || async {
        events(&f.client, agent.as_str(), "AgentCrashLooping")
            .await
            .into_iter()
            .next()
    })
    .await;
    let note = agent_event.message.unwrap_or_default();
    assert!(
        note.starts_with(&format!(
            "Agent crash-looping: device {agent}. the agent restarted 4 times"
        )),
        "{note}"
    );
    let workload_event = kube_common::eventually("WorkloadCrashLooping event", || async {
        events(&f.client, host.as_str(), "WorkloadCrashLooping")
            .await
            .into_iter()
            .next()
    })
    .await;
    assert_eq!(
        workload_event.involved_object.kind.as_deref(),
        Some("Device")
    );
    assert_eq!(
        workload_event.message.as_deref(),
        Some(
            format!(
                "Workload crash-looping: workload web on device {host}. restarted 7 times, last exit code 3"
            )
            .as_str()
        )
    );
    // The devices go on reporting the same (the agent republishes its workload status on a timer): no second
    // event.
    for _ in 0..4 {
        // why: the simulated agent's republish period (4 s, four times): the repeats are the scenario
        tokio::time::sleep(Duration::from_secs(4)).await;
        statuses.put(host.as_str(), report().into()).await.unwrap();
        beat(&heartbeats, &agent, 2).await;
    }
    assert_eq!(
        events(&f.client, agent.as_str(), "AgentCrashLooping")
            .await
            .len(),
        1
    );
    assert_eq!(
        events(&f.client, host.as_str(), "WorkloadCrashLooping")
            .await
            .len(),
        1
    );
}
