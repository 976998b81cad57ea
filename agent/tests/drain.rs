//! SIGTERM during a slow Podman mutation: the agent admits no new mutation, waits for the current one, logs the
//! drain duration, notifies STOPPING=1 and exits 0 — and, with no upgrade attempt in progress, leaves the last
//! attempt's terminal `agent-upgrade-status` record exactly as it was (a stop must not make a failed upgrade look
//! in progress). Also: a second agent exits at once with a clear error while the first holds the lock.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::*;
use fleet_wire::kv;
use fleet_wire::{
    AgentUpgradeStatus, DesiredState, DeviceId, UpgradePhase, UpgradeReason, WorkloadName,
    WorkloadSpec,
};
use std::time::{Duration, Instant};

#[test]
fn sigterm_waits_for_the_current_mutation() {
    let rig = Rig::new(true, "");
    // `sleep` as PID 1 ignores SIGTERM, so stopping it takes the whole 4 s grace period: a slow mutation.
    let mut w = WorkloadSpec::new(WorkloadName::try_from("slow").unwrap(), IMAGE).unwrap();
    w.command = vec!["sleep".into(), "1000".into()];
    let put = |workloads: Vec<WorkloadSpec>, g| {
        let d = DesiredState::new(DeviceId::try_from(DEVICE).unwrap(), g, workloads).unwrap();
        store(&rig.nc(), kv::DESIRED_STATE)
            .put(DEVICE, serde_json::to_vec(&d).unwrap())
            .expect("put");
    };
    put(vec![w], 1);
    // The last attempt failed: the updater reports it, and it is what NATS shows.
    let mut failed = fleet_wire::fixtures::failed_status();
    failed.device_id = DeviceId::try_from(DEVICE).unwrap();
    rig.peer.status.lock().unwrap().agent_upgrade = Some(failed.clone());
    store(&rig.nc(), kv::AGENT_UPGRADE_STATUS)
        .put(DEVICE, serde_json::to_vec(&failed).unwrap())
        .expect("put failed status");
    let mut agent = rig.spawn_agent();
    agent.wait_ready();

    // The lock: a second agent refuses to start and touches nothing.
    let second = std::process::Command::new(env!("CARGO_BIN_EXE_fleet-agent"))
        .arg("--config")
        .arg(&rig.config)
        .output()
        .expect("second agent");
    assert!(!second.status.success());
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(err.contains("another fleet-agent holds"), "{err}");

    let p = rig.podman.as_ref().unwrap();
    eventually(
        &agent,
        Duration::from_secs(60),
        "slow workload running",
        || {
            let out = p.try_podman(&["inspect", "--format", "{{.State.Status}}", "fleet-slow"]);
            (String::from_utf8_lossy(&out.stdout).trim() == "running").then_some(())
        },
    );
    // Removing it is the slow mutation.
    put(vec![], 2);
    eventually(&agent, Duration::from_secs(20), "removal started", || {
        agent
            .log_text()
            .contains("removing container")
            .then_some(())
    });
    let signalled = Instant::now();
    agent.sigterm();
    agent.wait_notify("STOPPING=1", Duration::from_secs(40));
    let status = agent.wait_exit(Duration::from_secs(40));
    assert!(status.success(), "exit {status}: {}", agent.log_text());
    assert!(
        signalled.elapsed() < Duration::from_secs(60),
        "drain must finish well inside TimeoutStopSec=60"
    );
    assert_eq!(
        p.podman(&[
            "ps",
            "-a",
            "--filter",
            "name=fleet-slow",
            "--format",
            "{{.ID}}"
        ]),
        "",
        "the mutation in progress completed"
    );
    let got: AgentUpgradeStatus =
        get_json(&store(&rig.nc(), kv::AGENT_UPGRADE_STATUS), DEVICE).expect("status");
    assert_eq!(
        got, failed,
        "a stop outside an attempt leaves the terminal record"
    );
    assert_eq!(got.phase, UpgradePhase::Failed);
    assert_eq!(got.reason, Some(UpgradeReason::StartFailed));
    let log = agent.log_text();
    let drained: u64 = log
        .split("drained in ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no drain duration logged: {log}"));
    assert!(
        drained >= 500,
        "the drain waited for the stop in progress ({drained} ms)"
    );
    assert!(log.contains("Shutdown"), "{log}");
}

/// An upgrade intent that arrives while a container stop is in progress (the 4 s grace period of a `sleep` that
/// ignores SIGTERM) reaches the updater before that stop ends: relaying does not wait behind workload mutations,
/// and the stop itself still completes.
#[test]
fn an_intent_is_relayed_while_a_container_stops() {
    let rig = Rig::new(true, "");
    let mut w = WorkloadSpec::new(WorkloadName::try_from("slow").unwrap(), IMAGE).unwrap();
    w.command = vec!["sleep".into(), "1000".into()];
    let put = |workloads: Vec<WorkloadSpec>, g| {
        let d = DesiredState::new(DeviceId::try_from(DEVICE).unwrap(), g, workloads).unwrap();
        store(&rig.nc(), kv::DESIRED_STATE)
            .put(DEVICE, serde_json::to_vec(&d).unwrap())
            .expect("put");
    };
    put(vec![w], 1);
    let mut agent = rig.spawn_agent();
    agent.wait_ready();
    let p = rig.podman.as_ref().unwrap();
    let exists = || {
        !p.podman(&[
            "ps",
            "-a",
            "--filter",
            "name=fleet-slow",
            "--format",
            "{{.ID}}",
        ])
        .trim()
        .is_empty()
    };
    eventually(
        &agent,
        Duration::from_secs(60),
        "slow workload running",
        || {
            let out = p.try_podman(&["inspect", "--format", "{{.State.Status}}", "fleet-slow"]);
            (String::from_utf8_lossy(&out.stdout).trim() == "running").then_some(())
        },
    );
    put(vec![], 2);
    eventually(&agent, Duration::from_secs(20), "removal started", || {
        agent
            .log_text()
            .contains("removing container")
            .then_some(())
    });
    let mut a = fleet_wire::fixtures::attempt();
    a.attempt_id = fleet_wire::AttemptId::new_random();
    a.device_id = DeviceId::try_from(DEVICE).unwrap();
    a.architecture = fleet_wire::Architecture::current().unwrap();
    store(&rig.nc(), kv::AGENT_UPGRADE_INTENT)
        .put(DEVICE, serde_json::to_vec(&a).unwrap())
        .expect("put intent");
    eventually(
        &agent,
        Duration::from_secs(20),
        "the upgrade request",
        || (rig.peer.mutating_requests().len() == 1).then_some(()),
    );
    assert!(
        exists(),
        "the intent was relayed only after the container stop ended: {}",
        agent.log_text()
    );
    eventually(
        &agent,
        Duration::from_secs(30),
        "the stop completes",
        || (!exists()).then_some(()),
    );
    agent.sigterm();
    assert!(agent.wait_exit(Duration::from_secs(30)).success());
}
