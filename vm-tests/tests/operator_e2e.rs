//! The path a user takes, end to end, every part real: kubectl → kube-apiserver + etcd → the `fleet-operator`
//! binary (CRDs and RBAC from `operator/deploy/`, running as its service account) → nats-server → an nspawn
//! Debian device installed with device setup (fleet-updater + fleet-agent, rootless Podman). One booted device
//! is shared by the three steps, in order: a FleetDeployment runs its container; an AgentRelease to v2 commits
//! and the Device shows it; a broken v3 is rolled back and the Device shows phase and typed reason.

use fleet_vm_tests::builds::{V1, V2, V3};
use fleet_vm_tests::local_fleet::{deployment_yaml, group_yaml, release_yaml, LocalFleet};
use fleet_wire::{UpgradePhase, UpgradeReason};
use std::time::Duration;

const DEVICE: &str = "e2e-1";
/// An upgrade on a loaded 2-core machine: download, probe, cutover and commit (or roll back) well within this.
const UPGRADE_TIMEOUT: Duration = Duration::from_secs(300);

#[test]
fn kubectl_drives_a_real_device_through_the_real_operator() {
    let fleet = LocalFleet::start(&[DEVICE]);
    let (cluster, device) = (&fleet.cluster, fleet.device(DEVICE));

    // The operator created the Device from what the device reported.
    let view = fleet.view(DEVICE).expect("Device object");
    assert_eq!(view.agent_version.as_deref(), Some(V1), "{view:?}");

    // 1. DeviceGroup + FleetDeployment → the container runs on the device.
    cluster.kubectl(&["label", "fdev", DEVICE, "site=lab"]);
    cluster.apply(&group_yaml("lab", &[("site", "lab")]));
    cluster.apply(&deployment_yaml("web", "lab", "web"));
    let running = cluster.wait(
        "fleet-web running on the device",
        Duration::from_secs(120),
        || {
            let c = device.container("fleet-web")?;
            (c["State"]["Running"] == true).then_some(c)
        },
    );
    let web_pid = running["State"]["Pid"].clone();
    let dep = cluster.wait("FleetDeployment web Ready", Duration::from_secs(60), || {
        let d = cluster.get_json(&["fdep", "web"])?;
        let ready = d["status"]["conditions"]
            .as_array()?
            .iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True");
        ready.then_some(d)
    });
    assert_eq!(dep["status"]["targetedDevices"], 1, "{dep:#}");
    let group = cluster.get_json(&["fdg", "lab"]).expect("DeviceGroup");
    assert_eq!(group["status"]["memberCount"], 1, "{group:#}");

    // 2. AgentRelease v2 → the device commits, the Device shows it, the container keeps running.
    let (url, sha) = fleet.publish_agent(V2);
    cluster.apply(&release_yaml("fleet-agent", "lab", V2, &url, &sha));
    let view = cluster.wait("Device committed v2", UPGRADE_TIMEOUT, || {
        fleet.view(DEVICE).filter(|v| v.finished(V2))
    });
    assert!(view.committed(V2), "{view:#?}\n{}", device.logs());
    let status = view.upgrade.as_ref().expect("agentUpgrade");
    let phases = status.transitions.phases();
    for want in [
        UpgradePhase::Preparing,
        UpgradePhase::Stopping,
        UpgradePhase::Complete,
    ] {
        assert!(phases.contains(&want), "{want:?} missing from {phases:?}");
    }
    assert_eq!(
        device.active_link(),
        format!("/usr/lib/harmony-fleet/fleet-agent-v{V2}")
    );
    assert_eq!(device.active_version(), V2);
    let still = device
        .container("fleet-web")
        .expect("fleet-web after the cutover");
    assert_eq!(
        still["State"]["Pid"], web_pid,
        "the container was restarted"
    );
    let rel = cluster.wait(
        "AgentRelease counts v2 up to date",
        Duration::from_secs(60),
        || {
            let r = cluster.get_json(&["frel", "fleet-agent"])?;
            (r["status"]["upToDate"] == 1).then_some(r)
        },
    );
    assert_eq!(rel["status"]["failed"], 0, "{rel:#}");

    // 3. A broken v3 (probe passes, the service dies before readiness) → rolled back, typed reason on the Device.
    let (url, sha) = fleet.publish_broken_v3();
    cluster.apply(&release_yaml("fleet-agent", "lab", V3, &url, &sha));
    let view = cluster.wait("Device finished v3", UPGRADE_TIMEOUT, || {
        fleet.view(DEVICE).filter(|v| v.finished(V3))
    });
    let status = view.upgrade.as_ref().expect("agentUpgrade");
    assert_eq!(status.phase, UpgradePhase::Failed, "{view:#?}");
    assert_eq!(status.reason, Some(UpgradeReason::StartFailed), "{view:#?}");
    assert!(
        status
            .transitions
            .phases()
            .contains(&UpgradePhase::RollingBack),
        "{view:#?}"
    );
    assert_eq!(
        (view.phase(), view.reason()),
        ("failed".into(), "start-failed".into())
    );
    // The Device's table as a person reads it: phase and reason columns.
    let table = cluster.kubectl(&["get", "fdev", DEVICE]);
    assert!(
        table.contains("failed") && table.contains(V2),
        "kubectl get fdev:\n{table}"
    );
    device
        .guest
        .wait_unit("fleet-agent.service", "active", Duration::from_secs(60));
    assert_eq!(device.active_version(), V2);
    let after = fleet
        .cluster
        .wait("Device reports v2 again", Duration::from_secs(60), || {
            fleet
                .view(DEVICE)
                .filter(|v| v.agent_version.as_deref() == Some(V2))
        });
    assert_eq!(after.reason(), "start-failed");
    let rel = cluster.wait(
        "AgentRelease counts the failure",
        Duration::from_secs(60),
        || {
            let r = cluster.get_json(&["frel", "fleet-agent"])?;
            (r["status"]["failed"] == 1).then_some(r)
        },
    );
    assert_eq!(rel["status"]["upToDate"], 0, "{rel:#}");
    let web = device
        .container("fleet-web")
        .expect("fleet-web after the rollback");
    assert_eq!(web["State"]["Running"], true);
}
