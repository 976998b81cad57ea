//! A desired state the agent cannot honour (a workload field it does not know, as a newer operator would write)
//! against a real nats-server and real Podman: the workload status says so at once (`desiredError` names the
//! field, the revision, this agent's version and the generation it keeps), the running workload is untouched,
//! and the next valid desired state clears it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::*;
use fleet_wire::kv;
use fleet_wire::{
    DesiredState, DeviceId, DeviceWorkloadStatus, WorkloadName, WorkloadSpec, WorkloadState,
};
use std::time::{Duration, Instant};

fn desired(generation: u64, marker: &str) -> serde_json::Value {
    let mut w = WorkloadSpec::new(WorkloadName::try_from("web").unwrap(), IMAGE).unwrap();
    w.command = vec!["sleep".into(), "1000".into()];
    w.env.insert("MARKER".into(), marker.into());
    let d = DesiredState::new(DeviceId::try_from(DEVICE).unwrap(), generation, vec![w]).unwrap();
    serde_json::to_value(&d).unwrap()
}

#[test]
fn a_desired_state_with_an_unknown_field_is_reported_and_the_workload_kept() {
    // A long status interval: the prompt publish is the agent reacting to the value, not its timer.
    let mut rig = Rig::new(true, "");
    rig.write_config_intervals(
        "",
        "heartbeat_secs = 1\nstatus_secs = 60\nresync_secs = 60\nupdater_poll_ms = 200\n",
    );
    let nc = rig.nc();
    let ds = store(&nc, kv::DESIRED_STATE);
    ds.put(DEVICE, serde_json::to_vec(&desired(1, "1")).unwrap())
        .unwrap();
    let mut agent = rig.spawn_agent();
    agent.wait_ready();
    let wl = store(&nc, kv::WORKLOAD_STATUS);
    let running = eventually(&agent, Duration::from_secs(60), "web running", || {
        let s: DeviceWorkloadStatus = get_json(&wl, DEVICE)?;
        let w = s.workloads.first()?;
        (s.generation == 1 && w.state == WorkloadState::Running).then(|| w.clone())
    });

    let mut newer = desired(2, "2");
    newer["workloads"][0]["futureField"] = serde_json::json!({ "x": 1 });
    let put_at = Instant::now();
    let rev = ds.put(DEVICE, serde_json::to_vec(&newer).unwrap()).unwrap();
    let s = eventually(&agent, Duration::from_secs(20), "desiredError", || {
        let s: DeviceWorkloadStatus = get_json(&wl, DEVICE)?;
        s.desired_error.is_some().then_some(s)
    });
    let took = put_at.elapsed();
    let e = s.desired_error.as_ref().unwrap().as_str().to_owned();
    let version = fleet_agent::VERSION;
    assert!(
        e.starts_with(&format!(
            "desired state revision {rev} cannot be honoured by agent {version}"
        )),
        "{e}"
    );
    assert!(e.contains("unknown field `futureField`"), "{e}");
    assert!(e.ends_with("; keeping generation 1"), "{e}");
    assert!(
        took < Duration::from_secs(10),
        "published {took:?} after the put, not a status interval later"
    );
    assert_eq!(s.generation, 1);
    let w = &s.workloads[0];
    assert_eq!(
        (w.state, &w.container_id),
        (WorkloadState::Running, &running.container_id),
        "the workload of generation 1 runs on, untouched"
    );

    // The operator writes what this agent can take: the error is gone and generation 3 applies.
    ds.put(DEVICE, serde_json::to_vec(&desired(3, "3")).unwrap())
        .unwrap();
    eventually(
        &agent,
        Duration::from_secs(60),
        "generation 3 taken",
        || {
            let s: DeviceWorkloadStatus = get_json(&wl, DEVICE)?;
            let w = s.workloads.first()?;
            (s.generation == 3
                && s.desired_error.is_none()
                && w.state == WorkloadState::Running
                && w.container_id != running.container_id)
                .then_some(())
        },
    );
}

/// An agent that starts on a desired state it cannot honour (a newer operator wrote it while the agent was down, or
/// across a reboot) reports it and leaves the running containers alone: no pass runs toward an empty desired
/// state, which would remove them.
#[test]
fn an_agent_started_on_a_desired_state_it_cannot_honour_removes_nothing() {
    let rig = Rig::new(true, "");
    let nc = rig.nc();
    let ds = store(&nc, kv::DESIRED_STATE);
    ds.put(DEVICE, serde_json::to_vec(&desired(1, "1")).unwrap())
        .unwrap();
    let mut agent = rig.spawn_agent();
    agent.wait_ready();
    let wl = store(&nc, kv::WORKLOAD_STATUS);
    let running = eventually(&agent, Duration::from_secs(60), "web running", || {
        let s: DeviceWorkloadStatus = get_json(&wl, DEVICE)?;
        let w = s.workloads.first()?;
        (s.generation == 1 && w.state == WorkloadState::Running).then(|| w.clone())
    });
    agent.sigterm();
    assert!(agent.wait_exit(Duration::from_secs(30)).success());

    let mut newer = desired(2, "2");
    newer["futureField"] = serde_json::json!(true);
    ds.put(DEVICE, serde_json::to_vec(&newer).unwrap()).unwrap();
    // Each refusal to run a pass without a taken desired state is logged (below: at the start and three resyncs).
    let mut agent = Agent::spawn_logging(
        &rig.config,
        rig.root.path(),
        "info,fleet_agent::agent::desired=debug",
    );
    agent.wait_ready();
    let s = eventually(&agent, Duration::from_secs(20), "desiredError", || {
        let s: DeviceWorkloadStatus = get_json(&wl, DEVICE)?;
        s.desired_error.is_some().then_some(s)
    });
    let e = s.desired_error.unwrap();
    assert!(
        e.as_str().contains("unknown field `futureField`"),
        "{}",
        e.as_str()
    );
    assert!(
        e.as_str().ends_with("; keeping generation 0"),
        "{}",
        e.as_str()
    );
    // Three resyncs (2 s apart) came and ran no pass (a pass toward nothing would remove the container).
    eventually(
        &agent,
        Duration::from_secs(30),
        "four refusals (the start and three resyncs) without a pass",
        || {
            let log = agent.log_text();
            let refused = log.matches("no desired state taken since start: no pass");
            (refused.count() >= 4).then_some(())
        },
    );
    let ps = rig
        .podman
        .as_ref()
        .unwrap()
        .podman(&["ps", "--format", "{{.ID}} {{.Names}}"]);
    let id = running.container_id.expect("container id");
    assert!(
        ps.lines().any(|l| id.starts_with(l.split(' ').next().unwrap_or("-"))
            && l.ends_with("fleet-web")),
        "the container of generation 1 still runs: {ps}\n{}",
        agent.log_text()
    );
}
