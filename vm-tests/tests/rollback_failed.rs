//! f. `rollback-failed` on a whole device: the previous binary is made unstartable while a failing candidate is
//! being activated, so the rollback cannot start it → quarantine; new attempts are refused; the documented root
//! repair (docs/device-setup.md: select a good agent, see it start, `device-setup --repair-rollback-failed`)
//! brings the device back, and a new attempt then commits.

use fleet_rig::wait_for;
use fleet_vm_tests::builds::{self, V1, V2};
use fleet_vm_tests::device::{device_setup, text};
use fleet_vm_tests::fleet::one_device_at_a_time;
use fleet_vm_tests::scene::{Scene, LIB, REAL_V2};
use fleet_wire::{UpgradePhase, UpgradeReason};
use std::time::Duration;

#[test]
fn f_rollback_failed_quarantines_until_root_repair() {
    let _one = one_device_at_a_time();
    let scene = Scene::v1_with_real_v2();
    let (device, operator, artifacts) = (&scene.device, &scene.operator, &scene.artifacts);
    // Probes like the real v2; as a service it exits after 5 s without readiness.
    let attempt = scene.v2_attempt(
        "fails-late",
        &format!(
            "case \"$1\" in --self-test|--version) exec {REAL_V2} \"$@\" ;; esac\nsleep 5\nexit 1"
        ),
    );
    operator.put_intent(&attempt);
    let activating = wait_for(Duration::from_secs(180), || {
        (device.journal_phase() == "activating").then_some(())
    });
    assert!(activating.is_some(), "no activating.\n{}", device.logs());
    // The previous binary becomes unstartable while the candidate is starting.
    let v1 = format!("{LIB}/fleet-agent-v{V1}");
    device.guest.sh(&format!(
        "rm -f {v1} && printf 'damaged' > {v1} && chmod 755 {v1}"
    ));

    let quarantined = wait_for(Duration::from_secs(240), || {
        (device.journal_phase() == "rollback-failed").then_some(())
    });
    assert!(
        quarantined.is_some(),
        "journal {} instead of rollback-failed.\n{}",
        device.journal_phase(),
        device.logs()
    );
    assert_eq!(
        device.active_link(),
        v1,
        "the rollback restores the previous link"
    );
    assert_ne!(device.guest.unit_state("fleet-agent.service"), "active");

    // Root repair, steps 2–3: a good v1 binary back in place and started by hand; the updater is still
    // quarantined, and the running agent reports that.
    device.guest.install_file(&builds::agent(V1), &v1, 0o755);
    device
        .guest
        .sh("systemctl reset-failed fleet-agent.service; systemctl restart fleet-agent.service");
    device
        .guest
        .wait_unit("fleet-agent.service", "active", Duration::from_secs(120));
    let status = operator.wait_phase(
        &attempt,
        UpgradePhase::RollbackFailed,
        Duration::from_secs(60),
    );
    assert!(status.error.is_some(), "{status:#?}");

    // New attempts are refused while quarantined.
    let refused = artifacts.attempt(&builds::agent(V2), "fleet-agent-v2", V2);
    operator.put_intent(&refused);
    let status = operator.wait_phase(&refused, UpgradePhase::Failed, Duration::from_secs(60));
    assert_eq!(
        status.reason,
        Some(UpgradeReason::Quarantined),
        "{status:#?}"
    );
    assert_eq!(device.journal_phase(), "rollback-failed");
    assert_eq!(device.active_link(), v1);

    // The failed candidate still occupies fleet-agent-v2.0.0 (versioned binaries are immutable): retrying that
    // version with other bytes needs it removed as root, as the updater's error says. The operator's retry is
    // written while still quarantined, so it is the current intent when the quarantine ends.
    device.guest.sh(&format!("rm {LIB}/fleet-agent-v{V2}"));
    let retry = artifacts.attempt(&builds::agent(V2), "fleet-agent-v2", V2);
    operator.put_intent(&retry);
    let status = operator.wait_phase(&retry, UpgradePhase::Failed, Duration::from_secs(60));
    assert_eq!(
        status.reason,
        Some(UpgradeReason::Quarantined),
        "{status:#?}"
    );

    // Root repair, step 4: device setup leaves quarantine (the selected agent starts); the journal is kept aside.
    let out = device_setup(&device.guest, &["--repair-rollback-failed"]);
    assert!(
        out.status.success(),
        "repair: {}\n{}",
        text(&out),
        device.logs()
    );
    device
        .guest
        .sh("ls /var/lib/fleet-updater/journal.json.rollback-failed.*");
    device
        .guest
        .wait_unit("fleet-updater.service", "active", Duration::from_secs(60));
    device
        .guest
        .wait_unit("fleet-agent.service", "active", Duration::from_secs(120));
    // The agent forwards the current intent again once the updater accepts attempts; if it does not within
    // 20 s, the operator writes a fresh attempt. Either way the device now upgrades.
    let moved = wait_for(Duration::from_secs(20), || {
        (device.journal_phase() != "none").then_some(())
    });
    let last = if moved.is_some() {
        retry
    } else {
        let again = artifacts.attempt(&builds::agent(V2), "fleet-agent-v2", V2);
        operator.put_intent(&again);
        again
    };
    operator.wait_phase(&last, UpgradePhase::Complete, Duration::from_secs(240));
    assert_eq!(device.active_link(), format!("{LIB}/fleet-agent-v{V2}"));
    assert_eq!(device.journal_phase(), "committed");
    assert_eq!(device.guest.unit_state("fleet-agent.service"), "active");
}
