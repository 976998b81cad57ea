//! The path a user takes, end to end, every part real: kubectl → kube-apiserver + etcd → the `fleet-operator`
//! binary (CRDs and RBAC from `operator/deploy/`, running as its service account) → nats-server → an nspawn
//! Debian device installed with device setup (fleet-updater + fleet-agent, rootless Podman). One booted device
//! is shared by the steps, in order: a FleetDeployment runs its container (and counts it running), one whose image
//! cannot be pulled shows the device's error in `kubectl get fdep`; an AgentRelease to v2 commits, the
//! container keeps running and the Device shows it; a broken v3 (never ready) is rolled back and the Device shows
//! phase and typed reason; a v4 whose self-test fails is refused without stopping the running agent. Each step
//! also checks the device itself (active symlink, the updater's journal, the agent's unit, Podman). NATS runs with
//! the fleet-auth auth callout (`FLEET_NATS_AUTH=off` runs without); no token or password reaches a log.

use fleet_vm_tests::builds::{V1, V2, V3};
use fleet_vm_tests::fleet::Device;
use fleet_vm_tests::local_fleet::{deployment_yaml, group_yaml, release_yaml, LocalFleet};
use fleet_vm_tests::scene::LIB;
use fleet_wire::{UpgradePhase, UpgradeReason};
use std::time::Duration;

const DEVICE: &str = "e2e-1";
/// A version no build exists for: the candidate of step 4 is a script that fails its self-test.
const V4: &str = "4.0.0";
/// An upgrade on a loaded 2-core machine: download, probe, cutover and commit (or roll back) well within this.
const UPGRADE_TIMEOUT: Duration = Duration::from_secs(300);
const SHORT: Duration = Duration::from_secs(60);

/// When the agent's unit last became active (monotonic µs): equal means not restarted in between.
fn active_since(device: &Device) -> String {
    device.guest.systemctl(&[
        "show",
        "-p",
        "ActiveEnterTimestampMonotonic",
        "--value",
        "fleet-agent.service",
    ])
}

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
    let running = cluster.wait("fleet-web running on the device", SHORT * 2, || {
        let c = device.container("fleet-web")?;
        (c["State"]["Running"] == true).then_some(c)
    });
    let (web_pid, web_started) = (
        running["State"]["Pid"].clone(),
        running["State"]["StartedAt"].clone(),
    );
    let dep = cluster.wait("FleetDeployment web Ready", SHORT, || {
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
    // What the device runs shows on the deployment, and an image that cannot be pulled shows as a failure with
    // the device's words, in `kubectl get fdep` (Running / Failed / Pending, Error with -o wide).
    cluster.wait("FleetDeployment web counts 1 running", SHORT, || {
        let d = cluster.get_json(&["fdep", "web"])?;
        (d["status"]["workloads"]["running"] == 1).then_some(())
    });
    cluster.apply(&deployment_yaml("ghost", "lab", "ghost").replace(
        fleet_vm_tests::fleet::TEST_IMAGE,
        "localhost/no-such-image:1",
    ));
    let ghost = cluster.wait("FleetDeployment ghost counts 1 failed", SHORT * 2, || {
        let d = cluster.get_json(&["fdep", "ghost"])?;
        (d["status"]["workloads"]["failed"] == 1).then_some(d)
    });
    let error = ghost["status"]["workloads"]["latestError"]
        .as_str()
        .unwrap_or_default();
    assert!(
        error.starts_with(&format!(
            "{DEVICE}: ghost: image localhost/no-such-image:1 could not be pulled: "
        )),
        "{ghost:#}"
    );
    let table = cluster.kubectl(&["get", "fdep", "ghost", "-o", "wide"]);
    assert!(
        table.contains("FAILED") && table.contains("could not be pulled"),
        "{table}"
    );
    cluster.kubectl(&["delete", "fdep", "ghost"]);

    // 2. AgentRelease v2 → the device commits, the Device shows it, the container keeps running.
    let v1_pid = device.agent_pid();
    let (url, sha) = fleet.publish_agent(V2);
    cluster.apply(&release_yaml("fleet-agent", "lab", V2, &url, &sha));
    let view = cluster.wait("Device committed v2", UPGRADE_TIMEOUT, || {
        fleet.view(DEVICE).filter(|v| v.finished(V2))
    });
    assert!(view.committed(V2), "{view:#?}\n{}", device.logs());
    let status = view.upgrade.as_ref().expect("agentUpgrade");
    // The public timeline went through the cutover in order; the history is append-only, so `starting` stays.
    let phases = status.transitions.phases();
    assert_eq!(
        phases,
        [
            UpgradePhase::Preparing,
            UpgradePhase::Stopping,
            UpgradePhase::Starting,
            UpgradePhase::Complete
        ],
        "{view:#?}"
    );
    assert!(status.drain_duration_ms.is_some(), "no drain: {view:#?}");
    assert_eq!(device.active_link(), format!("{LIB}/fleet-agent-v{V2}"));
    assert_eq!(device.journal_phase(), "committed");
    assert_eq!(
        device.guest.unit_state("fleet-agent.service"),
        "active",
        "{}",
        device.logs()
    );
    assert_ne!(device.agent_pid(), v1_pid, "v1 still runs");
    assert_eq!(device.active_version(), V2);
    // The container was never restarted: same process, same start time, still running.
    let still = device
        .container("fleet-web")
        .expect("fleet-web after the cutover");
    assert_eq!(still["State"]["Running"], true);
    assert_eq!(
        still["State"]["Pid"], web_pid,
        "the container was restarted"
    );
    assert_eq!(
        still["State"]["StartedAt"], web_started,
        "the container was restarted"
    );
    let rel = cluster.wait("AgentRelease counts v2 up to date", SHORT, || {
        let r = cluster.get_json(&["frel", "fleet-agent"])?;
        (r["status"]["upToDate"] == 1).then_some(r)
    });
    assert_eq!(rel["status"]["failed"], 0, "{rel:#}");

    // 3. A broken v3 (probe passes, the service dies before readiness) → rolled back, typed reason on the Device.
    let v2_pid = device.agent_pid();
    let (url, sha) = fleet.publish_broken_v3();
    cluster.apply(&release_yaml("fleet-agent", "lab", V3, &url, &sha));
    let view = cluster.wait("Device finished v3", UPGRADE_TIMEOUT, || {
        fleet.view(DEVICE).filter(|v| v.finished(V3))
    });
    let status = view.upgrade.as_ref().expect("agentUpgrade");
    assert_eq!(
        (status.phase, status.reason),
        (UpgradePhase::Failed, Some(UpgradeReason::StartFailed)),
        "{view:#?}"
    );
    assert!(status.error.is_some(), "no error in {view:#?}");
    let phases = status.transitions.phases();
    for want in [UpgradePhase::Stopping, UpgradePhase::RollingBack] {
        assert!(phases.contains(&want), "{want:?} missing from {view:#?}");
    }
    // The Device's table as a person reads it: version, phase and reason columns.
    let table = cluster.kubectl(&["get", "fdev", DEVICE]);
    assert!(
        table.contains("REASON") && table.contains("start-failed") && table.contains(V2),
        "kubectl get fdev:\n{table}"
    );
    device
        .guest
        .wait_unit("fleet-agent.service", "active", SHORT);
    assert_eq!(device.active_link(), format!("{LIB}/fleet-agent-v{V2}"));
    assert_eq!(device.active_version(), V2);
    assert_eq!(device.journal_phase(), "failed");
    assert_ne!(device.agent_pid(), v2_pid, "v2 was not restarted");
    cluster.wait("Device reports v2 again", SHORT, || {
        fleet
            .view(DEVICE)
            .filter(|v| v.agent_version.as_deref() == Some(V2))
    });
    let rel = cluster.wait("AgentRelease counts the failure", SHORT, || {
        let r = cluster.get_json(&["frel", "fleet-agent"])?;
        (r["status"]["failed"] == 1).then_some(r)
    });
    assert_eq!(rel["status"]["upToDate"], 0, "{rel:#}");
    let web = device
        .container("fleet-web")
        .expect("fleet-web after the rollback");
    assert_eq!(web["State"]["Running"], true);

    // 4. A v4 whose self-test fails → refused before anything stops: the running v2 is never touched.
    //    (Today this step takes about a minute: an agent that was idle polls the updater at its resync interval,
    //    60 s, and does not shorten that poll when it hands over an attempt that fails before any cutover.)
    let (v2_pid, v2_since) = (device.agent_pid(), active_since(device));
    let (url, sha) = fleet.publish_script(
        "fleet-agent-v4-probe-fails",
        "echo 'self-test: cannot read the configuration' >&2\nexit 1",
    );
    cluster.apply(&release_yaml("fleet-agent", "lab", V4, &url, &sha));
    let view = cluster.wait("Device finished v4", UPGRADE_TIMEOUT, || {
        fleet.view(DEVICE).filter(|v| v.finished(V4))
    });
    let status = view.upgrade.as_ref().expect("agentUpgrade");
    assert_eq!(
        (status.phase, status.reason),
        (UpgradePhase::Failed, Some(UpgradeReason::ProbeFailed)),
        "{view:#?}"
    );
    assert!(status.error.is_some(), "no error in {view:#?}");
    assert!(
        !status
            .transitions
            .phases()
            .contains(&UpgradePhase::Stopping),
        "v2 was stopped: {view:#?}"
    );
    assert_eq!(device.agent_pid(), v2_pid, "v2 was restarted");
    assert_eq!(active_since(device), v2_since, "v2 was restarted");
    assert_eq!(device.active_link(), format!("{LIB}/fleet-agent-v{V2}"));
    assert_eq!(device.journal_phase(), "failed");
    let table = cluster.kubectl(&["get", "fdev", DEVICE]);
    assert!(table.contains("probe-failed"), "kubectl get fdev:\n{table}");

    // Through all of it (the auth callout on: the device with its own token, the operator as its own user), no
    // token or password reached a log.
    fleet.assert_no_secrets_in_logs();
}
