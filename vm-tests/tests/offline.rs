//! g. A device that is offline while its intent changes several times upgrades straight to the current target
//! when it returns: the intermediate target is never fetched.

use fleet_rig::NatsServer;
use fleet_vm_tests::builds::{self, V1, V2, V3};
use fleet_vm_tests::fleet::{one_device_at_a_time, Artifacts, Device, Operator};
use fleet_wire::UpgradePhase;
use std::time::Duration;

const LIB: &str = "/usr/lib/harmony-fleet";

#[test]
fn g_offline_device_upgrades_straight_to_the_current_target() {
    let _one = one_device_at_a_time();
    let nats = NatsServer::start();
    let operator = Operator::new(&nats);
    let artifacts = Artifacts::start();
    let device = Device::install(&nats, &operator, V1, Some(&artifacts));

    // Offline: the device's NATS connection is cut; the operator changes the intent twice meanwhile.
    device.nats_link.set_connected(false);
    let first = artifacts.attempt(&builds::agent(V2), "fleet-agent-v2", V2);
    operator.put_intent(&first);
    let current = artifacts.attempt(&builds::agent(V3), "fleet-agent-v3", V3);
    operator.put_intent(&current);
    std::thread::sleep(Duration::from_secs(3)); // offline for a while (the relay refuses meanwhile)
    device.nats_link.set_connected(true);

    let status = operator.wait_phase(&current, UpgradePhase::Complete, Duration::from_secs(300));
    assert_eq!(status.target_version.as_ref().map(|v| v.as_str()), Some(V3));
    assert_eq!(device.active_link(), format!("{LIB}/fleet-agent-v{V3}"));
    assert_eq!(device.journal_phase(), "committed");
    assert_eq!(device.guest.unit_state("fleet-agent.service"), "active");
    assert_eq!(device.active_version(), V3);
    assert_eq!(
        artifacts.requests_for("fleet-agent-v2"),
        0,
        "the stale target was fetched"
    );
    assert!(
        !device
            .guest
            .path(&format!("{LIB}/fleet-agent-v{V2}"))
            .exists(),
        "the stale target was installed"
    );
}
