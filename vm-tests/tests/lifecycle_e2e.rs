//! A device's whole life from the docs, every part real: `kubectl` → kube-apiserver + etcd → the `fleet-operator`
//! binary → nats-server over TLS with the fleet-auth callout and the Zitadel stand-in. One device (`life-2`) is set
//! up with device setup beforehand; the device under test (`life-1`) comes from the Debian package in an nspawn
//! guest, enrolled the way docs/auth.md ("Enrolling a device") tells a person (`fleet_vm_tests::enrol`):
//!
//! 1. Enrolled with its own identity: a machine user of its own in the identity provider, its key at
//!    `/etc/harmony-fleet/zitadel-key.json` (root 0600), `fleet-token.yaml`, the CAs, `agent.toml` with
//!    `token_file`, `apt install` of the package: fleet-token got its token, fleet-auth admitted it as `life-1`,
//!    its Device appeared. The services' NATS password is nowhere in its file system (the whole guest, /run and
//!    /tmp included, read through its PID 1's root).
//! 2. Placed: labelled into a DeviceGroup, a FleetDeployment's workload runs on it (Podman in the guest).
//! 3. Upgraded: an AgentRelease to v2 for the group commits on it (the Device and `fleet-agent --version` on the
//!    device say v2), its workload still running.
//! 4. Retired while it soaks as the canary of a staged change of the deployment (`rollout: soakSeconds: 60`):
//!    `kubectl delete fdev life-1` (`fleet_vm_tests::retire`). The device keeps running and reporting, yet its
//!    Device is gone and stays gone for 2 minutes, none of its keys is left in any bucket, its token is refused
//!    at the callout, and the rollout goes on without it: `life-2` gets the change, nothing halts.

use fleet_rig::nats_client::Options;
use fleet_rig::wait_for;
use fleet_vm_tests::builds::{V1, V2};
use fleet_vm_tests::enrol::{self, KEY_FILE};
use fleet_vm_tests::fleet::GUEST_TOKEN_FILE;
use fleet_vm_tests::local_fleet::{deployment_yaml, group_yaml, release_yaml, LocalFleet};
use fleet_vm_tests::packages;
use fleet_vm_tests::retire;
use std::time::{Duration, Instant};

/// The device enrolled from the package.
const NEW: &str = "life-1";
/// The device set up beforehand (the rest of the fleet).
const OLD: &str = "life-2";
/// The group both are placed in.
const GROUP: &str = "life";
/// One step (a start, a pull, an agent upgrade on two loaded cores) well within this.
const STEP: Duration = Duration::from_secs(240);

fn logs(fleet: &LocalFleet) -> String {
    format!(
        "{}\n--- fleet-operator ---\n{}\n{}",
        fleet.device_logs(),
        fleet.cluster.operator_log(60),
        fleet.nats.auth_logs()
    )
}

/// The files below the guest's root (its PID 1's view: every mount of the guest) that hold `secret`.
fn files_holding(pid1: u32, secret: &str) -> String {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let pattern = dir.path().join("pattern");
    std::fs::write(&pattern, secret).unwrap_or_else(|e| panic!("write pattern: {e}"));
    let root = format!("/proc/{pid1}/root/");
    let out = std::process::Command::new("grep")
        .args([
            "-rlsaF",
            "--exclude-dir=proc",
            "--exclude-dir=sys",
            "--exclude-dir=dev",
            "-f",
        ])
        .arg(&pattern)
        .arg(&root)
        .output()
        .unwrap_or_else(|e| panic!("grep: {e}"));
    // 0: found, 1: not found; 2 also comes with unreadable files (sockets), which -s silences.
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_device_enrolled_from_the_package_is_placed_upgraded_and_retired() {
    let mut fleet = LocalFleet::start(&[OLD]);
    let password = fleet
        .nats
        .service_password()
        .unwrap_or_else(|| {
            panic!("this test needs the auth callout (the default; FLEET_NATS_AUTH=off is set)")
        })
        .to_string();

    // 1. Enrolled from the package with its own identity.
    let t = Instant::now();
    let debs = packages::amd64(V1);
    let mut say = |l: &str| eprintln!("enrol: {l}");
    let d = enrol::from_package(NEW, &fleet.nats, debs, Some(&fleet.artifacts), &mut say)
        .unwrap_or_else(|e| panic!("{e}"));
    enrol::import_demo_image(&d);
    fleet.devices.push(d);
    let dev = fleet.device(NEW);
    fleet.cluster.wait(&format!("Device {NEW}"), STEP, || {
        fleet
            .view(NEW)
            .filter(|v| v.agent_version.as_deref() == Some(V1))
    });
    eprintln!(
        "step 1: {NEW} enrolled from the package in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    assert!(fleet.nats.grants_issued(NEW) >= 1, "{}", logs(&fleet));
    assert!(fleet.nats.admitted(NEW), "{}", logs(&fleet));
    let facts = dev.guest.sh(&format!(
        "stat -c '%n %U:%G %a' {KEY_FILE} {GUEST_TOKEN_FILE}; grep -c '^token_file' /etc/harmony-fleet/agent.toml; \
         grep -cE '^(user|password)' /etc/harmony-fleet/agent.toml || true"
    ));
    assert_eq!(
        facts.trim(),
        format!("{KEY_FILE} root:root 600\n{GUEST_TOKEN_FILE} fleet-agent:fleet-agent 600\n1\n0"),
        "{facts}"
    );
    let pid1 = dev
        .guest
        .pid1()
        .unwrap_or_else(|| panic!("{NEW} has no PID 1"));
    // The search finds what is there (a control), and the services' password is not.
    let token = std::fs::read_to_string(dev.guest.path(GUEST_TOKEN_FILE))
        .unwrap_or_else(|e| panic!("read the token: {e}"));
    let sig = token.trim().rsplit('.').next().unwrap_or_default();
    assert!(
        files_holding(pid1, sig).contains("nats-token"),
        "the search does not find the device's own token"
    );
    let holding = files_holding(pid1, &password);
    assert!(
        holding.is_empty(),
        "the services' NATS password is on {NEW} in: {holding}"
    );

    // 2. Placed: labelled into a group, a FleetDeployment's workload runs on it.
    for id in [NEW, OLD] {
        fleet
            .cluster
            .kubectl(&["label", "fdev", id, &format!("lifecycle={GROUP}")]);
    }
    fleet
        .cluster
        .apply(&group_yaml(GROUP, &[("lifecycle", GROUP)]));
    fleet.cluster.apply(&deployment_yaml("web", GROUP, "web"));
    let t = Instant::now();
    let running = wait_for(STEP, || {
        let c = fleet.device(NEW).container("fleet-web")?;
        (c["State"]["Running"] == true).then_some(c)
    });
    let web =
        running.unwrap_or_else(|| panic!("fleet-web not running on {NEW}:\n{}", logs(&fleet)));
    eprintln!(
        "step 2: fleet-web running on {NEW} after {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let web_id = web["Id"].as_str().unwrap_or_default().to_string();

    // 3. Upgraded: an AgentRelease to v2 commits on it; the workload keeps running.
    let (url, sha) = fleet.publish_agent(V2);
    fleet
        .cluster
        .apply(&release_yaml("fleet-agent", GROUP, V2, &url, &sha));
    let t = Instant::now();
    fleet
        .cluster
        .wait(&format!("{NEW} committed {V2}"), STEP, || {
            fleet.view(NEW).filter(|v| v.committed(V2))
        });
    assert_eq!(fleet.device(NEW).active_version(), V2);
    let c = fleet
        .device(NEW)
        .container("fleet-web")
        .unwrap_or_else(|| panic!("fleet-web gone after the upgrade:\n{}", logs(&fleet)));
    assert_eq!(c["Id"].as_str().unwrap_or_default(), web_id);
    assert_eq!(c["State"]["Running"], true);
    eprintln!(
        "step 3: {NEW} committed {V2} in {:.1} s",
        t.elapsed().as_secs_f64()
    );

    // 4. Retired while it soaks as the canary of a staged change.
    fleet
        .cluster
        .kubectl(&["label", "fdev", NEW, "canary=true"]);
    let staged = deployment_yaml("web", GROUP, "web").replace("\"100000\"", "\"200000\"")
        + "  rollout:\n    soakSeconds: 60\n    maxUnavailable: 1\n";
    fleet.cluster.apply(&staged);
    let changed = |id: &str| {
        fleet.device(id).container("fleet-web").is_some_and(|c| {
            c["State"]["Running"] == true && c["Config"]["Cmd"].to_string().contains("200000")
        })
    };
    fleet.cluster.wait(
        &format!("the canary {NEW} runs the change and soaks"),
        STEP,
        || changed(NEW).then_some(()),
    );
    assert!(
        !changed(OLD),
        "{OLD} got the change before the canary's soak ended"
    );
    let conn = fleet.nats.connect();
    assert!(
        retire::keys_left(&conn, NEW).len() > 1,
        "{NEW} has no keys to delete before its retirement"
    );
    let refused = |token: &str| {
        let ca = fleet.nats.ca_file().unwrap_or_else(|| panic!("NATS CA"));
        Options::with_token(token)
            .tls_required(true)
            .add_root_certificate(ca)
            .max_reconnects(1)
            .connect(&fleet.nats.url())
            .is_err()
    };
    let token = token.trim().to_string();
    assert!(
        !refused(&token),
        "{NEW}'s token is refused before its retirement"
    );
    let took = retire::retire(&fleet.cluster, NEW);
    eprintln!("step 4: {NEW} retired in {:.1} s", took.as_secs_f64());
    retire::wait_keys_gone(&fleet.cluster, &conn, NEW);
    assert!(
        refused(&token),
        "{NEW}'s token is still admitted after its retirement"
    );
    // The rollout goes on without it: the other device gets the change, nothing halts.
    let t = Instant::now();
    fleet.cluster.wait(
        &format!("{OLD} given the change after its canary was retired"),
        STEP,
        || changed(OLD).then_some(()),
    );
    eprintln!(
        "step 4: {OLD} has the change {:.1} s after the retirement",
        t.elapsed().as_secs_f64()
    );
    let halted = fleet.cluster.condition(&["fdep", "web"], "Halted");
    assert!(
        halted.as_ref().is_none_or(|c| c.status != "True"),
        "the deployment halted: {halted:?}\n{}",
        logs(&fleet)
    );
    // Gone for good: 2 more minutes, with the device still running and reporting.
    retire::stays_gone(&fleet.cluster, NEW, Duration::from_secs(120));
    assert_eq!(retire::keys_left(&conn, NEW), Vec::<String>::new());
    assert!(
        fleet.device(NEW).guest.unit_state("fleet-agent.service") == "active",
        "the retired device's agent stopped: the check above did not run against a reporting device"
    );
    let halted = fleet.cluster.condition(&["fdep", "web"], "Halted");
    assert!(
        halted.as_ref().is_none_or(|c| c.status != "True"),
        "the deployment halted: {halted:?}"
    );
    fleet.assert_no_secrets_in_logs();
}
