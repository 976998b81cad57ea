//! Reconciliation against real Podman and a real nats-server: create, update, remove, a foreign container left
//! alone, an agent restart that restarts nothing, 30 s of NATS outage that touches no container, and a new spec
//! that cannot be pulled or does not start, which never takes the running workload down.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use fleet_rig::nats_client as nats;
mod common;
use common::*;
use fleet_wire::kv;
use fleet_wire::{
    DesiredState, DeviceId, DeviceInfo, DeviceWorkloadStatus, Heartbeat, WorkloadName,
    WorkloadSpec, WorkloadState,
};
use fleet_wire::{FailureReason, WorkloadStatus};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, PartialEq)]
struct Seen {
    id: String,
    started_at: i64,
    state: String,
}

fn containers(rig: &Rig) -> BTreeMap<String, Seen> {
    let out = rig
        .podman
        .as_ref()
        .expect("podman")
        .podman(&["ps", "-a", "--format", "json"]);
    let list: Vec<serde_json::Value> =
        serde_json::from_str(if out.is_empty() { "[]" } else { &out }).expect("ps json");
    list.iter()
        .map(|c| {
            (
                c["Names"][0].as_str().unwrap_or("").to_string(),
                Seen {
                    id: c["Id"].as_str().unwrap_or("").to_string(),
                    started_at: c["StartedAt"].as_i64().unwrap_or(0),
                    state: c["State"].as_str().unwrap_or("").to_string(),
                },
            )
        })
        .collect()
}

fn workload(name: &str, marker: &str) -> WorkloadSpec {
    let mut w = WorkloadSpec::new(WorkloadName::try_from(name).unwrap(), IMAGE).unwrap();
    w.command = vec!["sleep".into(), "1000".into()];
    w.env.insert("MARKER".into(), marker.into());
    w.labels.insert("app".into(), name.into());
    if name == "web" {
        // A named volume, a read-only bind mount and a non-default restart policy.
        w.volumes = vec![
            fleet_wire::VolumeMount {
                source: "web-data".into(),
                target: "/data".into(),
                read_only: false,
            },
            fleet_wire::VolumeMount {
                source: "/tmp".into(),
                target: "/host".into(),
                read_only: true,
            },
        ];
        w.restart_policy = fleet_wire::RestartPolicy::OnFailure;
    }
    w
}

fn put_desired(rig: &Rig, generation: u64, workloads: Vec<WorkloadSpec>) {
    let d = DesiredState::new(DeviceId::try_from(DEVICE).unwrap(), generation, workloads).unwrap();
    store(&rig.nc(), kv::DESIRED_STATE)
        .put(DEVICE, serde_json::to_vec(&d).unwrap())
        .expect("put desired");
}

fn running(seen: &BTreeMap<String, Seen>, names: &[&str]) -> bool {
    names
        .iter()
        .all(|n| seen.get(*n).is_some_and(|s| s.state == "running"))
}

#[test]
fn reconciles_desired_state_and_survives_restart_and_nats_outage() {
    let mut rig = Rig::new(true, "");
    let p = rig.podman.as_ref().unwrap();
    // A container the agent does not own, with a name in the agent's namespace.
    p.podman(&[
        "run",
        "-d",
        "--name",
        "fleet-foreign",
        IMAGE,
        "sleep",
        "1000",
    ]);
    put_desired(&rig, 1, vec![workload("web", "1"), workload("db", "1")]);

    let mut agent = rig.spawn_agent();
    agent.wait_ready();
    let nc = rig.nc();
    let info: DeviceInfo =
        get_json(&store(&nc, kv::DEVICE_INFO), DEVICE).expect("device info published");
    assert_eq!(info.os.id.as_str(), "debian");
    assert!(!info.capabilities.is_empty());

    let first = eventually(
        &agent,
        Duration::from_secs(60),
        "containers created",
        || {
            let s = containers(&rig);
            running(&s, &["fleet-web", "fleet-db"]).then_some(s)
        },
    );
    let foreign = first["fleet-foreign"].clone();
    let wl_status = store(&nc, kv::WORKLOAD_STATUS);
    eventually(
        &agent,
        Duration::from_secs(30),
        "workload status running",
        || {
            let s: DeviceWorkloadStatus = get_json(&wl_status, DEVICE)?;
            (s.generation == 1
                && s.workloads.len() == 2
                && s.workloads
                    .iter()
                    .all(|w| w.state == WorkloadState::Running))
            .then_some(())
        },
    );

    // A change replaces only the changed workload.
    put_desired(&rig, 2, vec![workload("web", "2"), workload("db", "1")]);
    let second = eventually(&agent, Duration::from_secs(60), "web replaced", || {
        let s = containers(&rig);
        (running(&s, &["fleet-web", "fleet-db"]) && s["fleet-web"].id != first["fleet-web"].id)
            .then_some(s)
    });
    assert_eq!(
        second["fleet-db"], first["fleet-db"],
        "db untouched by web's change"
    );
    let env = p.podman(&[
        "inspect",
        "--format",
        "{{range .Config.Env}}{{println .}}{{end}}",
        "fleet-web",
    ]);
    assert!(env.lines().any(|l| l == "MARKER=2"), "{env}");
    let spec = p.podman(&[
        "inspect",
        "--format",
        "{{range .Mounts}}{{.Type}}:{{.Name}}:{{.Destination}}:{{.RW}};{{end}} {{.HostConfig.RestartPolicy.Name}} {{index .Config.Labels \"app\"}} {{index .Config.Labels \"io.nationtech.fleet.managed\"}}",
        "fleet-web",
    ]);
    for want in [
        "volume:web-data:/data:true;",
        "bind::/host:false;",
        " on-failure web true",
    ] {
        assert!(spec.contains(want), "{want:?} missing in {spec:?}");
    }

    // A removal removes.
    put_desired(&rig, 3, vec![workload("web", "2")]);
    let third = eventually(&agent, Duration::from_secs(60), "db removed", || {
        let s = containers(&rig);
        (!s.contains_key("fleet-db")).then_some(s)
    });
    assert_eq!(third["fleet-web"], second["fleet-web"]);
    assert_eq!(
        third["fleet-foreign"], foreign,
        "the foreign container is never touched"
    );

    // An agent restart restarts nothing.
    agent.sigterm();
    assert!(agent.wait_exit(Duration::from_secs(30)).success());
    let restarted_at = fleet_wire::Timestamp::now();
    let mut agent = rig.spawn_agent();
    agent.wait_ready();
    // Let the first reconcile and at least two resync passes (2 s apart) of the new process run: its own
    // heartbeats (sequence restarts at 1) reach 5 only after about 5 s.
    let hb = store(&nc, kv::DEVICE_HEARTBEAT);
    eventually(
        &agent,
        Duration::from_secs(30),
        "heartbeats of the new process",
        || {
            let h: Heartbeat = get_json(&hb, DEVICE)?;
            (h.at > restarted_at && h.sequence >= 5).then_some(())
        },
    );
    assert_eq!(
        containers(&rig),
        third,
        "no container restarted or replaced by an agent restart"
    );

    // NATS down for 30 s: the agent keeps running, touches nothing, and reconnects.
    rig.nats.stop();
    // why: the outage's length is the scenario (30 s without NATS: nothing exits, nothing is touched)
    std::thread::sleep(Duration::from_secs(30));
    assert!(
        agent.child.try_wait().expect("try_wait").is_none(),
        "agent exited during the outage:\n{}",
        agent.log_text()
    );
    assert_eq!(
        containers(&rig),
        third,
        "no container touched while NATS was down"
    );
    rig.nats.start_again();
    let nc = rig.nc();
    put_desired(&rig, 4, vec![workload("web", "2"), workload("cache", "1")]);
    let fourth = eventually(
        &agent,
        Duration::from_secs(60),
        "change applied after reconnect",
        || {
            let s = containers(&rig);
            running(&s, &["fleet-cache"]).then_some(s)
        },
    );
    assert_eq!(fourth["fleet-web"], third["fleet-web"]);
    assert_eq!(fourth["fleet-foreign"], foreign);
    let hb = store(&nc, kv::DEVICE_HEARTBEAT);
    let before: Heartbeat = eventually(
        &agent,
        Duration::from_secs(30),
        "heartbeat after reconnect",
        || get_json(&hb, DEVICE),
    );
    eventually(
        &agent,
        Duration::from_secs(30),
        "heartbeats continue",
        || {
            let h: Heartbeat = get_json(&hb, DEVICE)?;
            (h.sequence > before.sequence).then_some(())
        },
    );
    drop(rig);
}

/// An image that cannot be pulled: the workload's status is `failed` with an error a person can act on (which
/// image, Podman's reason), not the HTTP exchange; the other workload runs.
#[test]
fn an_unpullable_image_is_reported_in_words() {
    let rig = Rig::new(true, "");
    let mut bad = WorkloadSpec::new(
        WorkloadName::try_from("ghost").unwrap(),
        "localhost/no-such-image:1",
    )
    .unwrap();
    bad.command = vec!["sleep".into(), "1000".into()];
    put_desired(&rig, 1, vec![workload("db", "1"), bad]);
    let mut agent = rig.spawn_agent();
    agent.wait_ready();
    let wl_status = store(&rig.nc(), kv::WORKLOAD_STATUS);
    let s = eventually(&agent, Duration::from_secs(60), "ghost failed", || {
        let s: DeviceWorkloadStatus = get_json(&wl_status, DEVICE)?;
        let by = |n: &str| s.workloads.iter().find(|w| w.name.as_str() == n).cloned();
        (by("db")?.state == WorkloadState::Running && by("ghost")?.state == WorkloadState::Failed)
            .then(|| by("ghost"))
            .flatten()
    });
    let e = s.error.expect("an error").as_str().to_owned();
    assert!(
        e.starts_with("image localhost/no-such-image:1 could not be pulled: "),
        "{e}"
    );
    assert!(!e.contains("answered 200") && !e.contains("POST"), "{e}");
    agent.sigterm();
    assert!(agent.wait_exit(Duration::from_secs(30)).success());
}

/// A host-path volume whose source leads through a symlink (one planted under a path a WorkloadPolicy allows) is
/// not mounted: the workload fails `create-failed` naming where it leads, and the other workloads run.
#[test]
fn a_host_path_through_a_symlink_is_not_mounted() {
    let rig = Rig::new(true, "");
    let dir = tempfile::tempdir().unwrap();
    let allowed = std::fs::canonicalize(dir.path()).unwrap();
    std::os::unix::fs::symlink("/etc", allowed.join("data")).unwrap();
    let mut planted = workload("reader", "1");
    planted.volumes = vec![fleet_wire::VolumeMount {
        source: format!("{}/data", allowed.display()),
        target: "/data".into(),
        read_only: true,
    }];
    put_desired(&rig, 1, vec![workload("db", "1"), planted]);
    let mut agent = rig.spawn_agent();
    agent.wait_ready();
    let wl_status = store(&rig.nc(), kv::WORKLOAD_STATUS);
    let s = eventually(&agent, Duration::from_secs(60), "reader failed", || {
        let s: DeviceWorkloadStatus = get_json(&wl_status, DEVICE)?;
        let by = |n: &str| s.workloads.iter().find(|w| w.name.as_str() == n).cloned();
        (by("db")?.state == WorkloadState::Running && by("reader")?.state == WorkloadState::Failed)
            .then(|| by("reader"))
            .flatten()
    });
    assert_eq!(
        s.failure.map(|f| f.reason),
        Some(FailureReason::CreateFailed)
    );
    let e = s.error.expect("an error").as_str().to_owned();
    assert!(e.contains("leads through a symlink to /etc"), "{e}");
    assert!(
        !containers(&rig).contains_key("fleet-reader"),
        "no container was created"
    );
    agent.sigterm();
    assert!(agent.wait_exit(Duration::from_secs(30)).success());
}

/// `<PID> <container id> <state>` of `fleet-<name>`.
fn pid_id_state(rig: &Rig, name: &str) -> String {
    rig.podman
        .as_ref()
        .unwrap()
        .podman(&[
            "inspect",
            "--format",
            "{{.State.Pid}} {{.Id}} {{.State.Status}}",
            &format!("fleet-{name}"),
        ])
        .trim()
        .to_owned()
}

/// The status of workload `name` in the device's published workload status of `generation`.
/// `RUST_LOG` that logs each pass's judgement of a failed spec (`<name>: the failed spec waits for its retry`).
const PASS_LOG: &str = "info,fleet_agent::reconcile=debug";

/// Waits until `passes` more reconcile passes (resyncs) than now have judged `name`'s failed spec and left it
/// alone: the event that shows a pass ran and did not act, instead of a fixed wait. Needs [`PASS_LOG`].
fn held_through_passes(agent: &Agent, name: &str, passes: usize) {
    let line = format!("{name}: the failed spec waits for its retry");
    let now = agent.log_text().matches(&line).count();
    eventually(
        agent,
        Duration::from_secs(30),
        &format!("{passes} more passes leaving the failed {name} alone"),
        || (agent.log_text().matches(&line).count() >= now + passes).then_some(()),
    );
}

fn status_of(store: &nats::kv::Store, generation: u64, name: &str) -> Option<WorkloadStatus> {
    let s: DeviceWorkloadStatus = get_json(store, DEVICE)?;
    if s.generation != generation {
        return None;
    }
    s.workloads.into_iter().find(|w| w.name.as_str() == name)
}

/// A running workload changed to an image tag that does not exist: the container keeps running (same id and
/// PID), the status says `failed` with the pull error within 10 s and names the container that still runs, resyncs
/// leave it alone; the fix runs the new spec and the error is gone at once.
#[test]
fn a_bad_image_never_takes_the_running_workload_down() {
    let rig = Rig::new(true, "");
    put_desired(&rig, 1, vec![workload("app", "1")]);
    let mut agent = Agent::spawn_logging(&rig.config, rig.root.path(), PASS_LOG);
    agent.wait_ready();
    let wl = store(&rig.nc(), kv::WORKLOAD_STATUS);
    eventually(&agent, Duration::from_secs(60), "app running", || {
        (status_of(&wl, 1, "app")?.state == WorkloadState::Running).then_some(())
    });
    let before = pid_id_state(&rig, "app");
    let old_id = before.split(' ').nth(1).unwrap().to_owned();
    assert!(before.ends_with(" running"), "{before}");

    let mut bad = workload("app", "1");
    bad.image = "localhost/busybox:no-such-tag".into();
    let t = Instant::now();
    put_desired(&rig, 2, vec![bad]);
    let s = eventually(
        &agent,
        Duration::from_secs(10),
        "app failed with the pull error",
        || status_of(&wl, 2, "app").filter(|w| w.state == WorkloadState::Failed),
    );
    println!("failed with the pull error after {:?}", t.elapsed());
    assert_eq!(
        pid_id_state(&rig, "app"),
        before,
        "the running container keeps running, same id and PID"
    );
    let e = s.error.as_ref().expect("an error").as_str().to_owned();
    assert!(
        e.starts_with("image localhost/busybox:no-such-tag could not be pulled: "),
        "{e}"
    );
    let f = s.failure.clone().expect("failure details for an event");
    assert_eq!(f.reason, FailureReason::ImagePullFailed);
    assert_eq!(f.running_container_id.as_deref(), Some(old_id.as_str()));
    assert_eq!(f.running_spec_digest, Some(workload("app", "1").digest()));
    assert!(!f.rolled_back);

    // Resync passes (every 2 s) leave the running container alone and keep reporting the failure.
    held_through_passes(&agent, "app", 2);
    assert_eq!(pid_id_state(&rig, "app"), before);
    let again = status_of(&wl, 2, "app").expect("status");
    assert_eq!((again.state, again.error), (WorkloadState::Failed, s.error));

    // Fixed: the new spec runs, the error is gone on the next pass.
    let fixed = workload("app", "2");
    let t = Instant::now();
    put_desired(&rig, 3, vec![fixed.clone()]);
    let s = eventually(
        &agent,
        Duration::from_secs(10),
        "fixed spec running, error gone",
        || status_of(&wl, 3, "app").filter(|w| w.state == WorkloadState::Running),
    );
    println!("fixed spec running, error gone after {:?}", t.elapsed());
    assert_eq!(s.spec_digest, Some(fixed.digest()));
    assert_eq!((s.error, s.failure), (None, None));
    let env = rig.podman.as_ref().unwrap().podman(&[
        "inspect",
        "--format",
        "{{range .Config.Env}}{{println .}}{{end}}",
        "fleet-app",
    ]);
    assert!(env.lines().any(|l| l == "MARKER=2"), "{env}");
    let names: Vec<String> = containers(&rig).into_keys().collect();
    assert_eq!(
        names,
        vec!["fleet-app".to_string()],
        "the old container is gone"
    );
    agent.sigterm();
    assert!(agent.wait_exit(Duration::from_secs(30)).success());
}

/// A new spec whose container is created but does not start (its program does not exist): the previous spec's
/// container runs again, the status says why, and resyncs do not stop it again for the same spec.
#[test]
fn a_new_container_that_does_not_start_gives_way_to_the_previous_spec() {
    let rig = Rig::new(true, "");
    put_desired(&rig, 1, vec![workload("app", "1")]);
    let mut agent = Agent::spawn_logging(&rig.config, rig.root.path(), PASS_LOG);
    agent.wait_ready();
    let wl = store(&rig.nc(), kv::WORKLOAD_STATUS);
    eventually(&agent, Duration::from_secs(60), "app running", || {
        (status_of(&wl, 1, "app")?.state == WorkloadState::Running).then_some(())
    });
    let before = pid_id_state(&rig, "app");
    let old_id = before.split(' ').nth(1).unwrap().to_owned();

    let mut broken = workload("app", "2");
    broken.command = vec!["/no/such/program".into()];
    put_desired(&rig, 2, vec![broken]);
    let s = eventually(
        &agent,
        Duration::from_secs(30),
        "app failed and rolled back",
        || status_of(&wl, 2, "app").filter(|w| w.state == WorkloadState::Failed),
    );
    let seen = containers(&rig);
    assert!(
        seen.get("fleet-app")
            .is_some_and(|c| c.id == old_id && c.state == "running"),
        "the old container runs again under its name, and the new one is gone: {seen:?}"
    );
    assert_eq!(seen.len(), 1, "the new container is gone: {seen:?}");
    let now = pid_id_state(&rig, "app");
    let f = s.failure.clone().expect("failure details");
    assert_eq!(f.reason, FailureReason::StartFailed, "{s:?}");
    assert!(f.rolled_back, "{s:?}");
    assert_eq!(f.running_container_id.as_deref(), Some(old_id.as_str()));
    let e = s.error.expect("error").as_str().to_owned();
    assert!(
        e.starts_with("starting the container: ")
            && e.ends_with("; the previous spec was restored (its container started again)"),
        "{e}"
    );
    // Resyncs (every 2 s) do not stop and restart it again for the same failed spec.
    held_through_passes(&agent, "app", 2);
    assert_eq!(pid_id_state(&rig, "app"), now);
    agent.sigterm();
    assert!(agent.wait_exit(Duration::from_secs(30)).success());
}

/// A registry on 127.0.0.1 that accepts connections and never answers, so a pull from it takes as long as
/// Podman's own time-outs and retries (as an unreachable registry or a DNS server that does not answer does).
/// Stops when dropped.
struct SilentRegistry {
    addr: std::net::SocketAddr,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Connections accepted so far (a pull from it is under way once one is).
    accepted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl SilentRegistry {
    fn start() -> Self {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let addr = l.local_addr().unwrap();
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let accepted = std::sync::Arc::new(AtomicUsize::new(0));
        let a = accepted.clone();
        let thread = std::thread::spawn(move || {
            let mut held = Vec::new();
            let end = Instant::now() + Duration::from_secs(300);
            while !s.load(Ordering::SeqCst) && Instant::now() < end {
                let got = l.accept();
                if got.is_ok() {
                    a.fetch_add(1, Ordering::SeqCst);
                }
                match got {
                    Ok((c, _)) if held.len() < 64 => held.push(c),
                    Ok(_) => {}
                    // why: the listener is non-blocking; a pause between accepts
                    Err(_) => std::thread::sleep(Duration::from_millis(50)),
                }
            }
        });
        Self {
            addr,
            stop,
            accepted,
            thread: Some(thread),
        }
    }
}

impl Drop for SilentRegistry {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A fix made while the agent is still pulling a bad image from a registry that does not answer is applied at
/// once (the pull is abandoned), not after the pull gives up; the running container is untouched meanwhile.
#[test]
fn a_fix_does_not_wait_behind_a_slow_pull_of_the_bad_image() {
    let registry = SilentRegistry::start();
    let rig = Rig::new(true, "");
    put_desired(&rig, 1, vec![workload("app", "1")]);
    let mut agent = rig.spawn_agent();
    agent.wait_ready();
    let wl = store(&rig.nc(), kv::WORKLOAD_STATUS);
    eventually(&agent, Duration::from_secs(60), "app running", || {
        (status_of(&wl, 1, "app")?.state == WorkloadState::Running).then_some(())
    });
    let before = pid_id_state(&rig, "app");

    let mut slow = workload("app", "1");
    slow.image = format!("{}/app:v2", registry.addr);
    put_desired(&rig, 2, vec![slow]);
    // The pull is under way (Podman connected to the registry and waits).
    eventually(
        &agent,
        Duration::from_secs(30),
        "a pull from the silent registry",
        || (registry.accepted.load(std::sync::atomic::Ordering::SeqCst) > 0).then_some(()),
    );
    assert_eq!(
        pid_id_state(&rig, "app"),
        before,
        "the running container is untouched while the new image is pulled"
    );
    let fixed = workload("app", "2");
    let t = Instant::now();
    put_desired(&rig, 3, vec![fixed.clone()]);
    let s = eventually(
        &agent,
        Duration::from_secs(15),
        "the fix running while the bad pull would still hang",
        || status_of(&wl, 3, "app").filter(|w| w.state == WorkloadState::Running),
    );
    println!("fix running after {:?}", t.elapsed());
    assert_eq!(s.spec_digest, Some(fixed.digest()));
    assert_eq!((s.error, s.failure), (None, None));
    agent.sigterm();
    assert!(agent.wait_exit(Duration::from_secs(30)).success());
    drop(registry);
}
