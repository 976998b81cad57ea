//! Whole-device agent upgrades on real systemd (nspawn guests, device setup, the real agent and updater, rootless
//! Podman in the guest, NATS on the host): each scenario asserts the final symlink, unit state, journal phase and
//! the status the agent mirrored into NATS.

use fleet_rig::NatsServer;
use fleet_vm_tests::builds::{self, V1, V2};
use fleet_vm_tests::fleet::{
    desired_one_workload, one_device_at_a_time, Artifacts, Device, Operator,
};
use fleet_vm_tests::scene::{Scene, LIB, REAL_V2};
use fleet_wire::{UpgradePhase, UpgradeReason};
use std::time::Duration;

/// a. v1 → v2 commits; the new agent is READY; the device's container keeps running throughout.
#[test]
fn a_upgrade_commits_and_containers_keep_running() {
    let _one = one_device_at_a_time();
    let nats = NatsServer::start();
    let operator = Operator::new(&nats);
    let artifacts = Artifacts::start();
    let device = Device::install(&nats, &operator, V1, Some(&artifacts));
    assert_eq!(device.active_link(), format!("{LIB}/fleet-agent-v{V1}"));

    // A workload, reconciled by v1 through the fleet-agent user's Podman.
    device.import_test_image();
    operator.put_desired(&desired_one_workload(1, "web"));
    let running = fleet_rig::wait_for(Duration::from_secs(60), || {
        let c = device.container("fleet-web")?;
        (c["State"]["Running"] == true).then_some(c)
    })
    .unwrap_or_else(|| panic!("v1 did not start the workload.\n{}", device.logs()));
    let (pid, started) = (
        running["State"]["Pid"].clone(),
        running["State"]["StartedAt"].clone(),
    );
    let old_agent = device.agent_pid();

    let attempt = artifacts.attempt(&builds::agent(V2), "fleet-agent-v2", V2);
    operator.put_intent(&attempt);
    let status = operator.wait_phase(&attempt, UpgradePhase::Complete, Duration::from_secs(240));

    // The new agent is the active, ready unit; the old process is gone.
    assert_eq!(device.active_link(), format!("{LIB}/fleet-agent-v{V2}"));
    assert_eq!(
        device.guest.unit_state("fleet-agent.service"),
        "active",
        "{}",
        device.logs()
    );
    assert_ne!(device.agent_pid(), old_agent);
    assert_eq!(device.active_version(), V2);
    assert_eq!(device.journal_phase(), "committed");
    // The public timeline went through the cutover in order (the updater records `activating` once, so
    // `starting` shows as the current phase while it lasts but not as a transition of its own).
    let mut phases = status.transitions.phases();
    phases.retain(|p| *p != UpgradePhase::Starting);
    assert_eq!(
        phases,
        [
            UpgradePhase::Preparing,
            UpgradePhase::Stopping,
            UpgradePhase::Complete
        ],
        "{status:#?}"
    );
    assert!(
        status.drain_duration_ms.is_some(),
        "no drain duration: {status:#?}"
    );
    assert_eq!(status.target_version.as_ref().map(|v| v.as_str()), Some(V2));
    assert_eq!(status.attempt_digest.as_ref(), Some(&attempt.digest()));

    // The container was never restarted: same process, same start time, still running.
    let after = device
        .container("fleet-web")
        .unwrap_or_else(|| panic!("the workload is gone after the upgrade.\n{}", device.logs()));
    assert_eq!(after["State"]["Running"], true);
    assert_eq!(after["State"]["Pid"], pid, "the container was restarted");
    assert_eq!(
        after["State"]["StartedAt"], started,
        "the container was restarted"
    );
}

/// b. The v2 candidate fails `--self-test` → `failed`; v1 is never stopped.
#[test]
fn b_candidate_failing_its_probe_fails_and_v1_keeps_running() {
    let _one = one_device_at_a_time();
    let scene = Scene::v1_with_real_v2();
    let (device, operator) = (&scene.device, &scene.operator);
    let v1_pid = device.agent_pid();
    let v1_since = device.guest.systemctl(&[
        "show",
        "-p",
        "ActiveEnterTimestampMonotonic",
        "--value",
        "fleet-agent.service",
    ]);

    // The real v2 agent, probing a configuration it cannot read.
    let attempt = scene.v2_attempt(
        "probe-fails",
        &format!(
            "[ \"$1\" = --self-test ] && exec {REAL_V2} --self-test --config /nonexistent/agent.toml\n\
             exec {REAL_V2} \"$@\""
        ),
    );
    operator.put_intent(&attempt);
    let status = operator.wait_phase(&attempt, UpgradePhase::Failed, Duration::from_secs(240));

    assert_eq!(
        status.reason,
        Some(UpgradeReason::ProbeFailed),
        "{status:#?}"
    );
    assert!(status.error.is_some(), "no error in {status:#?}");
    assert_eq!(device.active_link(), format!("{LIB}/fleet-agent-v{V1}"));
    assert_eq!(device.journal_phase(), "failed");
    // v1 was never stopped: the same process, active since the same moment.
    assert_eq!(device.guest.unit_state("fleet-agent.service"), "active");
    assert_eq!(
        device.agent_pid(),
        v1_pid,
        "v1 was restarted.\n{}",
        device.logs()
    );
    assert_eq!(
        device.guest.systemctl(&[
            "show",
            "-p",
            "ActiveEnterTimestampMonotonic",
            "--value",
            "fleet-agent.service"
        ]),
        v1_since
    );
    let phases = status.transitions.phases();
    assert!(
        !phases.contains(&UpgradePhase::Stopping),
        "v1 was stopped: {phases:?}"
    );
}

/// c. v2 passes the probe but exits instead of becoming ready → rolled back to v1, status `failed` with reason.
#[test]
fn c_candidate_that_never_becomes_ready_is_rolled_back() {
    let _one = one_device_at_a_time();
    let scene = Scene::v1_with_real_v2();
    let (device, operator) = (&scene.device, &scene.operator);
    let v1_pid = device.agent_pid();

    // The real v2 probe passes (and reports 2.0.0); the service itself exits before READY=1.
    let attempt = scene.v2_attempt(
        "never-ready",
        &format!(
            "[ \"$1\" = --self-test ] && exec {REAL_V2} \"$@\"\n\
             [ \"$1\" = --version ] && exec {REAL_V2} \"$@\"\n\
             echo 'candidate exits before readiness' >&2\nexit 1"
        ),
    );
    operator.put_intent(&attempt);
    let status = operator.wait_phase(&attempt, UpgradePhase::Failed, Duration::from_secs(300));

    assert_eq!(
        status.reason,
        Some(UpgradeReason::StartFailed),
        "{status:#?}"
    );
    assert!(status.error.is_some(), "no error in {status:#?}");
    let phases = status.transitions.phases();
    for want in [
        UpgradePhase::Stopping,
        UpgradePhase::RollingBack,
        UpgradePhase::Failed,
    ] {
        assert!(phases.contains(&want), "{want:?} missing from {phases:?}");
    }
    assert_eq!(device.active_link(), format!("{LIB}/fleet-agent-v{V1}"));
    assert_eq!(device.journal_phase(), "failed");
    device
        .guest
        .wait_unit("fleet-agent.service", "active", Duration::from_secs(60));
    assert_eq!(device.active_version(), V1);
    assert_ne!(
        device.agent_pid(),
        v1_pid,
        "v1 was restarted after the rollback"
    );
}
