//! Interrupted cutovers on a whole device: the updater SIGKILLed during `activating` and during `rolling-back`
//! (systemd restarts it and it recovers per the recovery table), and a power cut during `activating`.
//!
//! The candidate is the real v2 agent behind a wrapper that waits a few seconds before it starts (so the
//! cutover stays in `activating` long enough to be interrupted) and that takes a few seconds to stop (so a
//! rollback stays in `rolling-back`).

use fleet_rig::wait_for;
use fleet_vm_tests::builds::V1;
use fleet_vm_tests::fleet::{one_device_at_a_time, Device};
use fleet_vm_tests::scene::{Scene, LIB, REAL_V2};
use fleet_wire::{UpgradePhase, UpgradeReason};
use std::time::Duration;

/// The slow candidate: probes like the real v2; as a service it starts 8 s late and needs 3 s to stop.
fn slow_candidate() -> String {
    format!(
        "case \"$1\" in --self-test|--version|--help) exec {REAL_V2} \"$@\" ;; esac\n\
         trap 'sleep 3; exit 143' TERM\n\
         sleep 8 & wait $!\n\
         exec {REAL_V2} \"$@\""
    )
}

struct Setup {
    scene: Scene,
    attempt: fleet_wire::AgentUpgradeAttempt,
}

/// A v1 device whose intent now asks for the slow v2; returns once the journal says `activating`.
fn upgrade_until_activating() -> Setup {
    let scene = Scene::v1_with_real_v2();
    let attempt = scene.v2_attempt("slow", &slow_candidate());
    scene.operator.put_intent(&attempt);
    scene
        .device
        .wait_journal_phase("activating", Duration::from_secs(180));
    Setup { scene, attempt }
}

/// After recovery: v1 selected, active and reporting; journal and NATS status `failed` because of the interruption.
fn assert_recovered_to_v1(s: &Setup) -> fleet_wire::AgentUpgradeStatus {
    let status =
        s.scene
            .operator
            .wait_phase(&s.attempt, UpgradePhase::Failed, Duration::from_secs(240));
    let d = &s.scene.device;
    assert_eq!(d.active_link(), format!("{LIB}/fleet-agent-v{V1}"));
    assert_eq!(d.journal_phase(), "failed", "{}", d.logs());
    d.guest
        .wait_unit("fleet-agent.service", "active", Duration::from_secs(60));
    d.guest
        .wait_unit("fleet-updater.service", "active", Duration::from_secs(60));
    assert_eq!(d.active_version(), V1);
    assert_eq!(
        status.reason,
        Some(UpgradeReason::Interrupted),
        "{status:#?}"
    );
    let phases = status.transitions.phases();
    assert!(phases.contains(&UpgradePhase::RollingBack), "{phases:?}");
    status
}

fn kill_updater(device: &Device) -> String {
    let before = device.guest.systemctl(&[
        "show",
        "-p",
        "InvocationID",
        "--value",
        "fleet-updater.service",
    ]);
    device
        .guest
        .systemctl(&["kill", "--signal=SIGKILL", "fleet-updater.service"]);
    // systemd restarts it (Restart=always): a new invocation.
    let restarted = wait_for(Duration::from_secs(30), || {
        let now = device.guest.systemctl(&[
            "show",
            "-p",
            "InvocationID",
            "--value",
            "fleet-updater.service",
        ]);
        (!now.is_empty() && now != before).then_some(now)
    });
    restarted.unwrap_or_else(|| {
        panic!(
            "systemd did not restart the killed updater.\n{}",
            device.logs()
        )
    })
}

/// d. The updater SIGKILLed during `activating`, then again during the `rolling-back` its recovery started:
/// systemd restarts it each time and it ends with v1 selected and running, journal `failed`.
#[test]
fn d_updater_killed_during_activating_and_rolling_back_recovers() {
    let _one = one_device_at_a_time();
    let s = upgrade_until_activating();
    kill_updater(&s.scene.device);
    // Recovery of `activating`: record rolling-back, restore v1, stop the candidate (3 s), start v1.
    s.scene
        .device
        .wait_journal_phase("rolling-back", Duration::from_secs(60));
    kill_updater(&s.scene.device);
    // Recovery of `rolling-back`: restore the link again and repeat stop/start.
    assert_recovered_to_v1(&s);
    let kills = s.scene.device.guest.systemctl(&[
        "show",
        "-p",
        "NRestarts",
        "--value",
        "fleet-updater.service",
    ]);
    assert!(kills.parse::<u32>().unwrap_or(0) >= 2, "NRestarts={kills}");
}

/// e. The power is cut during `activating`: after the next boot v1 is selected and running, and the status says
/// the attempt failed because it was interrupted.
#[test]
fn e_power_cut_during_activating_boots_into_v1() {
    let _one = one_device_at_a_time();
    let mut s = upgrade_until_activating();
    let boot_before = s.scene.device.guest.boot_id();
    s.scene.device.guest.power_cut();
    s.scene.device.guest.power_on();
    assert_ne!(s.scene.device.guest.boot_id(), boot_before);
    let status = assert_recovered_to_v1(&s);
    assert_eq!(
        status.boot_id.map(|b| b.to_string().replace('-', "")),
        Some(s.scene.device.guest.boot_id().replace('-', "")),
        "the status is not from the new boot"
    );
}
