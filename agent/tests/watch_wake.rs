//! The desired-state watch sleeps on its subscription with no time-out: a change still arrives after a NATS
//! outage that closed the connection (the new connection wakes the watch to subscribe again), with the periodic
//! re-read set to an hour so that only the watch can deliver it; and SIGTERM still ends the agent promptly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::*;
use fleet_wire::{kv, DesiredState, DeviceId, Heartbeat, WorkloadName, WorkloadSpec};
use std::time::Duration;

fn workload(name: &str) -> WorkloadSpec {
    let mut w = WorkloadSpec::new(WorkloadName::try_from(name).unwrap(), IMAGE).unwrap();
    w.command = vec!["sleep".into(), "1000".into()];
    w
}

fn put_desired(rig: &Rig, generation: u64, workloads: Vec<WorkloadSpec>) {
    let d = DesiredState::new(DeviceId::try_from(DEVICE).unwrap(), generation, workloads).unwrap();
    store(&rig.nc(), kv::DESIRED_STATE)
        .put(DEVICE, serde_json::to_vec(&d).unwrap())
        .expect("put desired");
}

fn running(rig: &Rig, name: &str) -> bool {
    let state = rig.podman.as_ref().expect("podman").try_podman(&[
        "inspect",
        "--format",
        "{{.State.Status}}",
        name,
    ]);
    String::from_utf8_lossy(&state.stdout).trim() == "running"
}

#[test]
fn a_change_after_a_nats_restart_is_delivered_by_the_watch_alone() {
    let mut rig = Rig::new(true, "");
    rig.write_config_intervals(
        "",
        "heartbeat_secs = 1\nstatus_secs = 1\nresync_secs = 3600\nupdater_poll_ms = 200\n",
    );
    put_desired(&rig, 1, vec![workload("a")]);
    let mut agent = rig.spawn_agent();
    agent.wait_ready();
    eventually(&agent, Duration::from_secs(60), "fleet-a running", || {
        running(&rig, "fleet-a").then_some(())
    });

    // A change while idle arrives through the watch.
    put_desired(&rig, 2, vec![workload("a"), workload("b")]);
    eventually(&agent, Duration::from_secs(30), "fleet-b running", || {
        running(&rig, "fleet-b").then_some(())
    });

    // NATS is away long enough for the client library's one reconnect to fail, so the agent makes a new
    // connection; once heartbeats flow again, a change must arrive without any re-read.
    rig.nats.stop();
    eventually(
        &agent,
        Duration::from_secs(60),
        "the agent giving up the library's reconnect for a new connection",
        || agent.log_text().contains("connecting anew").then_some(()),
    );
    rig.nats.start_again();
    eventually(&agent, Duration::from_secs(60), "a new connection", || {
        agent
            .log_text()
            .contains("reconnected to NATS (new connection)")
            .then_some(())
    });
    let hb = store(&rig.nc(), kv::DEVICE_HEARTBEAT);
    let before: Heartbeat = eventually(&agent, Duration::from_secs(60), "a heartbeat", || {
        get_json(&hb, DEVICE)
    });
    eventually(
        &agent,
        Duration::from_secs(60),
        "heartbeats after the restart",
        || {
            let h: Heartbeat = get_json(&hb, DEVICE)?;
            (h.sequence > before.sequence + 1).then_some(())
        },
    );
    put_desired(&rig, 3, vec![workload("a"), workload("b"), workload("c")]);
    eventually(
        &agent,
        Duration::from_secs(30),
        "fleet-c running after the NATS restart",
        || running(&rig, "fleet-c").then_some(()),
    );

    agent.sigterm();
    assert!(agent.wait_exit(Duration::from_secs(20)).success());
}
