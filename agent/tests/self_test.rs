//! `fleet-agent --self-test` and `--version` as the updater runs them: one JSON report line, exit 0 only when every
//! check passed, and the failed check named when NATS is unreachable, a bucket is missing, the Podman socket is
//! missing, the updater socket is missing, or the configuration is invalid.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use fleet_rig::nats_client as nats;
mod common;
use common::*;
use fleet_wire::SelfTestReport;
use std::path::Path;

fn probe(config: &Path) -> (bool, SelfTestReport) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fleet-agent"))
        .args(["--self-test", "--config"])
        .arg(config)
        .output()
        .expect("run --self-test");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "exactly one line on stdout: {stdout:?}; stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = SelfTestReport::parse(lines[0].as_bytes()).expect("a valid report");
    assert_eq!(report.version.as_str(), fleet_agent::VERSION);
    assert_eq!(out.status.success(), report.passed);
    (out.status.success(), report)
}

fn failed_check(config: &Path) -> (String, String) {
    let (ok, r) = probe(config);
    assert!(!ok, "probe passed unexpectedly: {r:?}");
    let c = r.first_failure().expect("a failed check");
    (
        c.name.clone(),
        c.error.as_ref().map(|e| e.to_string()).unwrap_or_default(),
    )
}

#[test]
fn version_prints_the_compiled_version() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fleet-agent"))
        .arg("--version")
        .output()
        .expect("run");
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        fleet_agent::VERSION
    );
    fleet_wire::Version::try_from(fleet_agent::VERSION).expect("a valid version");
}

#[test]
fn self_test_passes_when_healthy_and_names_each_failure() {
    let mut rig = Rig::new(true, "");
    let (ok, report) = probe(&rig.config);
    assert!(ok, "{report:?}");
    let names: Vec<&str> = report.checks.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, fleet_agent::probe::CHECKS.to_vec());
    // The probe mutates nothing: no heartbeat, no status, no device info.
    let nc = rig.nc();
    for b in [
        fleet_wire::kv::DEVICE_HEARTBEAT,
        fleet_wire::kv::WORKLOAD_STATUS,
        fleet_wire::kv::DEVICE_INFO,
    ] {
        assert!(
            store(&nc, b).get(DEVICE).unwrap().is_none(),
            "probe wrote {b}"
        );
    }

    // Invalid configuration: a known key with a value of the wrong type (an unknown key is only a warning, so
    // that a rolled-back release reads a newer one's configuration).
    let good = std::fs::read_to_string(&rig.config).unwrap();
    std::fs::write(
        &rig.config,
        good.replace("retry_window_secs = 120", "retry_window_secs = \"soon\""),
    )
    .unwrap();
    assert_eq!(failed_check(&rig.config).0, "config");
    std::fs::write(&rig.config, &good).unwrap();

    // Podman socket missing.
    let moved = rig.root.path().join("podman-elsewhere.sock");
    let sock = rig.podman.as_ref().unwrap().socket();
    std::fs::rename(&sock, &moved).unwrap();
    assert_eq!(failed_check(&rig.config).0, "podman");
    std::fs::rename(&moved, &sock).unwrap();

    // Updater socket missing.
    let usock = rig.peer.path.clone();
    let umoved = rig.root.path().join("updater-elsewhere.sock");
    std::fs::rename(&usock, &umoved).unwrap();
    let (name, err) = failed_check(&rig.config);
    assert_eq!(name, "updater-socket", "{err}");
    std::fs::rename(&umoved, &usock).unwrap();
    assert!(probe(&rig.config).0, "healthy again");

    // A required bucket missing.
    nats::jetstream::new(nc.clone())
        .delete_key_value(fleet_wire::kv::AGENT_UPGRADE_STATUS)
        .unwrap();
    let (name, err) = failed_check(&rig.config);
    assert_eq!(name, "buckets");
    assert!(err.contains(fleet_wire::kv::AGENT_UPGRADE_STATUS), "{err}");

    // NATS unreachable (a short retry window keeps the test quick; the default is 3 minutes).
    rig.nats.stop();
    let text = std::fs::read_to_string(&rig.config)
        .unwrap()
        .replace("retry_window_secs = 120", "retry_window_secs = 2");
    std::fs::write(&rig.config, text).unwrap();
    let (name, err) = failed_check(&rig.config);
    assert_eq!(name, "nats", "{err}");
    rig.write_config("");
}

#[test]
fn the_agent_exits_non_zero_when_nats_stays_unreachable_or_the_config_is_invalid() {
    let dir = tempfile::tempdir().unwrap();
    let port = fleet_rig::free_port();
    let config = dir.path().join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "device_id = \"{DEVICE}\"\nroot = \"{}\"\n[nats]\nurls = [\"nats://127.0.0.1:{port}\"]\nconnect_timeout_secs = 1\nretry_window_secs = 2\n[podman]\nenabled = false\n",
            dir.path().display()
        ),
    )
    .unwrap();
    let started = std::time::Instant::now();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fleet-agent"))
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("could not connect to NATS"), "{err}");

    std::fs::write(&config, "device_id = 1\n").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fleet-agent"))
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("config"));
}
