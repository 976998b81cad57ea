//! g. A device that is offline while its AgentRelease changes twice upgrades straight to the current target when
//! it returns: the intermediate target is never fetched. Driven through the real operator (kubectl →
//! kube-apiserver → fleet-operator → NATS), which writes both intents while the device cannot hear them.

use fleet_rig::nats_client as nats;
use fleet_vm_tests::builds::{V2, V3};
use fleet_vm_tests::local_fleet::{group_yaml, release_yaml, LocalFleet};
use fleet_vm_tests::scene::LIB;
use fleet_wire::{kv, AgentUpgradeAttempt};
use std::time::Duration;

const DEVICE: &str = "offline-1";

#[test]
fn g_offline_device_upgrades_straight_to_the_current_target() {
    let fleet = LocalFleet::start(&[DEVICE]);
    let (cluster, device) = (&fleet.cluster, fleet.device(DEVICE));
    let intents = nats::jetstream::new(fleet.nats.connect())
        .key_value(kv::AGENT_UPGRADE_INTENT)
        .expect("intent bucket");
    // The version of the attempt the operator has written for the device, as the device would read it.
    let intent_version = || -> Option<String> {
        let raw = intents.get(DEVICE).ok()??;
        let a: AgentUpgradeAttempt = serde_json::from_slice(&raw).ok()?;
        Some(a.target_version.as_str().to_string())
    };
    cluster.kubectl(&["label", "fdev", DEVICE, "site=lab"]);
    cluster.apply(&group_yaml("lab", &[("site", "lab")]));

    // Offline: the device's NATS connection is cut; the release changes twice meanwhile.
    device.nats_link.set_connected(false);
    let (url, sha) = fleet.publish_agent(V2);
    cluster.apply(&release_yaml("fleet-agent", "lab", V2, &url, &sha));
    cluster.wait(
        "the operator wrote the v2 intent",
        Duration::from_secs(60),
        || (intent_version()? == V2).then_some(()),
    );
    let (url, sha) = fleet.publish_agent(V3);
    cluster.apply(&release_yaml("fleet-agent", "lab", V3, &url, &sha));
    cluster.wait(
        "the operator wrote the v3 intent",
        Duration::from_secs(60),
        || (intent_version()? == V3).then_some(()),
    );
    // why: the offline stretch's length is the scenario (the relay refuses meanwhile)
    std::thread::sleep(Duration::from_secs(2));
    device.nats_link.set_connected(true);

    let view = cluster.wait("Device committed v3", Duration::from_secs(300), || {
        fleet.view(DEVICE).filter(|v| v.finished(V3))
    });
    assert!(view.committed(V3), "{view:#?}\n{}", device.logs());
    assert_eq!(device.active_link(), format!("{LIB}/fleet-agent-v{V3}"));
    assert_eq!(device.journal_phase(), "committed");
    assert_eq!(device.guest.unit_state("fleet-agent.service"), "active");
    assert_eq!(device.active_version(), V3);
    assert_eq!(
        fleet.artifacts.requests_for(&format!("fleet-agent-v{V2}")),
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
