//! Retiring a device with every part real but the devices: kube-apiserver + etcd, the `fleet-operator` binary,
//! nats-server with the auth callout and the real fleet-auth (device API and flood guard on), and four simulated
//! devices (`fleet-sim --token-dir`: each on a connection of its own made with its own token through the callout,
//! writing through the device API as fleet-agent does), one `fleet-sim` process per device group so that one device
//! can be powered off alone. A staged AgentRelease (soak 60 s, `maxUnavailable: 1`, `heartbeatTimeoutSeconds: 10`)
//! over the four, in the order canary `sim-000000`, then `sim-000001`, `sim-000002`, `sim-000003`:
//!
//! 1. The case: `sim-000001` takes the release and, while it soaks, is powered off. The release halts
//!    (`FailureThreshold … sim-000001 (no heartbeat during its soak)`). A person retires it: `kubectl delete fdev
//!    sim-000001` (the one documented step, docs/device-lifecycle.md). The Device is gone; the halt lifts by itself
//!    with a `HaltLifted` event (its only cause left), and the rollout goes on with the remaining devices.
//! 2. The device is powered on again and keeps trying: its Device stays gone for 2 minutes, its keys are gone from
//!    every per-device bucket, its still valid token is refused at the callout (`device sim-000001 is retired` in
//!    fleet-auth's log, and a new connection with it fails).
//! 3. `sim-000003` is retired while it soaks, heard from: it leaves the rollout without a halt, and the release
//!    completes on the other devices with nothing failed.
//! 4. `sim-000001` is enrolled again (its Device created with `fleet.nationtech.io/enrol: "true"`): the tombstone
//!    is lifted, the device comes back by itself, and the release gives it the change.
//!
//! Waits are bounds on failure only.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use fleet_rig::callout::{FleetNats, NatsAuth, NatsTransport};
use fleet_rig::nats_client as nats;
use fleet_vm_tests::builds;
use fleet_vm_tests::cluster::Cluster;
use fleet_vm_tests::retire;
use std::time::{Duration, Instant};

const CANARY: &str = "sim-000000";
/// Powered off while it soaks, then retired.
const SILENT: &str = "sim-000001";
const THIRD: &str = "sim-000002";
/// Retired while it soaks, heard from.
const FOURTH: &str = "sim-000003";
const STEP: Duration = Duration::from_secs(180);
const SOAK_SECS: u64 = 60;

/// One `fleet-sim` process (killed on drop).
struct Sim(std::process::Child);
impl Drop for Sim {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `fleet-sim` for `devices` devices from index `first`, each with its own token from `tokens`.
fn sim(nats: &FleetNats, tokens: &std::path::Path, first: usize, devices: usize) -> Sim {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_fleet-sim"));
    cmd.args(["--devices", &devices.to_string(), "--connections", "1"])
        .args(["--first", &first.to_string()])
        .args(["--nats-url", &nats.url()])
        .arg("--token-dir")
        .arg(tokens)
        .args(["--heartbeat-secs", "1", "--status-secs", "5"])
        .stdout(std::process::Stdio::null());
    if let Some(ca) = nats.ca_file() {
        cmd.arg("--ca-file").arg(ca);
    }
    Sim(cmd.spawn().expect("start fleet-sim"))
}

fn release_yaml() -> String {
    format!(
        "apiVersion: fleet.nationtech.io/v1alpha1\nkind: AgentRelease\nmetadata:\n  name: two\nspec:\n  \
         allowedGroups: [ret]\n  targetSelector: {{}}\n  builds:\n    - architecture: amd64\n      version: 2.0.0\n      \
         artifact: \"https://artifacts.invalid/fleet-agent-2.0.0\"\n      sha256: \"{}\"\n      byteLimit: 1000000\n  \
         rollout:\n    soakSeconds: {SOAK_SECS}\n    maxUnavailable: 1\n    heartbeatTimeoutSeconds: 10\n",
        "a".repeat(64)
    )
}

/// The device's agent-upgrade status phase in NATS (`complete`, …), read as the services' user.
fn upgrade_phase(conn: &nats::Connection, device: &str) -> Option<fleet_wire::UpgradePhase> {
    let js = nats::jetstream::new(conn.clone());
    let raw = js
        .key_value(fleet_wire::kv::AGENT_UPGRADE_STATUS)
        .ok()?
        .get(device)
        .ok()??;
    serde_json::from_slice::<fleet_wire::AgentUpgradeStatus>(&raw)
        .ok()
        .map(|s| s.phase)
}

/// The release's `status.rollout` as kubectl prints it.
fn rollout(c: &Cluster) -> serde_json::Value {
    c.get_json(&["frel", "two"])
        .map(|r| r["status"]["rollout"].clone())
        .unwrap_or_default()
}

fn halted(c: &Cluster) -> Option<fleet_vm_tests::cluster::Condition> {
    c.condition(&["frel", "two"], "Halted")
        .filter(|h| h.status == "True")
}

#[test]
fn a_retired_device_is_gone_for_good_and_its_rollout_goes_on() {
    let nats = FleetNats::start_with(
        NatsAuth::Callout,
        NatsTransport::from_env(),
        builds::fleet_auth,
    );
    let c = Cluster::start_with_nats_ca(&nats.service_url(), nats.ca_file());
    let tokens = tempfile::tempdir().unwrap();
    let all = [CANARY, SILENT, THIRD, FOURTH];
    for id in all {
        let t = nats.device_token(id).expect("a token with the callout on");
        std::fs::write(tokens.path().join(id), t.as_bytes()).unwrap();
    }
    let _canary = sim(&nats, tokens.path(), 0, 1);
    let mut silent = Some(sim(&nats, tokens.path(), 1, 1));
    let _rest = sim(&nats, tokens.path(), 2, 2);
    for id in all {
        c.wait(&format!("the operator making Device {id}"), STEP, || {
            c.try_kubectl(&["get", "fdev", id]).ok()
        });
    }
    c.kubectl(&["label", "fdev", CANARY, "canary=true"]);
    c.kubectl(&["label", "fdev", "--all", "site=ret"]);
    c.apply(&fleet_vm_tests::local_fleet::group_yaml(
        "ret",
        &[("site", "ret")],
    ));
    c.apply(&release_yaml());
    let conn = nats.connect();

    // 1. SILENT takes the release, then goes silent in its soak: the release halts on it.
    c.wait(
        &format!("{SILENT} committed the release"),
        STEP + Duration::from_secs(SOAK_SECS),
        || (upgrade_phase(&conn, SILENT) == Some(fleet_wire::UpgradePhase::Complete)).then_some(()),
    );
    drop(silent.take());
    let h = c.wait("the release halted on the silent device", STEP, || {
        halted(&c)
    });
    assert_eq!(h.reason, "FailureThreshold", "{h:?}");
    assert!(
        h.message
            .contains(&format!("{SILENT} (no heartbeat during its soak)")),
        "{}",
        h.message
    );
    eprintln!("step 1: halted: {}", h.message);
    let took = retire::retire(&c, SILENT);
    eprintln!("step 1: {SILENT} retired in {:.1} s", took.as_secs_f64());
    let t = Instant::now();
    c.wait("the halt lifted", STEP, || {
        halted(&c).is_none().then_some(())
    });
    let lifted = c.get_json(&[
        "events",
        "-A",
        "--field-selector",
        "involvedObject.kind=AgentRelease,involvedObject.name=two,reason=HaltLifted",
    ]);
    let note = lifted
        .as_ref()
        .and_then(|e| e["items"][0]["message"].as_str().map(str::to_owned));
    assert!(
        note.as_deref()
            .is_some_and(|n| n.contains(&format!("{SILENT} (no heartbeat during its soak)"))),
        "no HaltLifted event naming {SILENT}: {lifted:?}"
    );
    eprintln!(
        "step 1: the halt lifted {:.1} s after the retirement: {}",
        t.elapsed().as_secs_f64(),
        note.unwrap_or_default()
    );
    c.wait(&format!("{THIRD} given the release"), STEP, || {
        upgrade_phase(&conn, THIRD).map(|_| ())
    });

    // 2. Powered on again and trying with its token, for 2 minutes: no Device, no keys, refused at the callout.
    let _back = sim(&nats, tokens.path(), 1, 1);
    retire::wait_keys_gone(&c, &conn, SILENT);
    let tomb = retire::tombstone(&conn, SILENT).expect("its tombstone");
    assert_eq!(tomb.device_id.as_str(), SILENT);
    std::thread::scope(|s| {
        s.spawn(|| retire::stays_gone(&c, SILENT, Duration::from_secs(120)));
        // 3. Meanwhile FOURTH is retired while it soaks, heard from: no halt, the release completes without it.
        c.wait(
            &format!("{FOURTH} committed the release"),
            STEP + Duration::from_secs(SOAK_SECS),
            || {
                (upgrade_phase(&conn, FOURTH) == Some(fleet_wire::UpgradePhase::Complete))
                    .then_some(())
            },
        );
        let r = rollout(&c);
        assert_eq!(r["failed"], 0, "{r}");
        retire::retire(&c, FOURTH);
        let done = c.wait(
            "the release complete without the retired devices",
            STEP,
            || {
                let r = rollout(&c);
                (r["phase"] == "Complete").then_some(r)
            },
        );
        assert_eq!(
            (done["healthy"].as_u64(), done["failed"].as_u64()),
            (Some(2), Some(0)),
            "{done}"
        );
        assert!(halted(&c).is_none(), "halted again: {:?}", halted(&c));
    });
    assert_eq!(retire::keys_left(&conn, SILENT), Vec::<String>::new());
    let log = nats.auth_logs();
    assert!(
        log.contains(&format!("device {SILENT} is retired")),
        "fleet-auth logged no refusal of the retired device:\n{log}"
    );
    let token = std::fs::read_to_string(tokens.path().join(SILENT)).unwrap();
    let mut opts = nats::Options::with_token(token.trim()).max_reconnects(1);
    if let Some(ca) = nats.ca_file() {
        opts = opts.tls_required(true).add_root_certificate(ca);
    }
    assert!(
        opts.connect(&nats.url()).is_err(),
        "a new connection with the retired device's token was admitted"
    );

    // 4. Enrolled again: the tombstone lifted, the device back by itself (it retries with growing pauses, up to a
    // minute), the release gives it the change.
    retire::enrol_again(&c, &conn, SILENT, &[("site", "ret")]);
    let back = fleet_rig::wait_for(STEP, || {
        let d = c.get_json(&["fdev", SILENT])?;
        (d["status"]["agentVersion"] == "2.0.0").then_some(())
    });
    assert!(
        back.is_some(),
        "{SILENT} not back, reporting and given the release within {STEP:?}: {:?}\n{}\n--- fleet-operator log ---\n{}",
        c.get_json(&["fdev", SILENT]).map(|d| d["status"].clone()),
        nats.auth_logs().lines().rev().take(40).collect::<Vec<_>>().join("\n"),
        c.operator_log(40)
    );
    assert!(retire::gone(&c, FOURTH), "{FOURTH} is back");
}
