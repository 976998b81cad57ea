//! Two of the agent's readiness gates, with the real agent binary, a real nats-server and an in-test updater
//! peer: the compiled version must match the target the updater is activating (else no `READY=1`, a non-zero
//! exit, so systemd's start fails and the updater rolls back), and an active transaction's status is in NATS
//! before `READY=1` is sent.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::*;
use fleet_wire::{kv, AgentUpgradeStatus, DeviceId, UpgradePhase, Version};
use std::time::Duration;

/// The updater's status for an attempt whose candidate is being started (`starting`), targeting `target`.
fn starting(target: &str) -> AgentUpgradeStatus {
    let mut s = fleet_wire::fixtures::upgrade_status();
    s.device_id = DeviceId::try_from(DEVICE).unwrap();
    s.target_version = Some(Version::try_from(target).unwrap());
    s.phase = UpgradePhase::Starting;
    s
}

#[test]
fn readiness_is_refused_when_the_compiled_version_is_not_the_activation_target() {
    let rig = Rig::new(false, "");
    // A target that is not this binary's compiled version (a wrong artifact behind the right digest).
    let other = if fleet_agent::VERSION == "9.9.9" {
        "9.9.8"
    } else {
        "9.9.9"
    };
    rig.peer.status.lock().unwrap().agent_upgrade = Some(starting(other));
    let mut agent = rig.spawn_agent();
    let exit = agent.wait_exit(Duration::from_secs(60));
    let log = agent.log_text();
    assert!(!exit.success(), "the agent exited successfully:\n{log}");
    assert!(
        log.contains("refusing readiness") && log.contains(fleet_agent::VERSION),
        "the log does not say why:\n{log}"
    );
    assert!(
        !log.contains("ready (READY=1"),
        "READY=1 was sent for the wrong version:\n{log}"
    );
}

#[test]
fn an_active_transaction_status_is_in_nats_before_ready() {
    let rig = Rig::new(false, "");
    let status = starting(fleet_agent::VERSION);
    rig.peer.status.lock().unwrap().agent_upgrade = Some(status.clone());
    let nc = rig.nc();
    let statuses = store(&nc, kv::AGENT_UPGRADE_STATUS);
    assert!(statuses.get(DEVICE).unwrap().is_none(), "fresh bucket");
    let mut agent = rig.spawn_agent();
    agent.wait_ready();
    // Read at once after READY=1: the gate publishes before it notifies, so no waiting is allowed here.
    let published: AgentUpgradeStatus =
        get_json(&statuses, DEVICE).expect("no agent-upgrade-status when READY=1 arrived");
    assert_eq!(published, status, "{}", agent.log_text());
}
