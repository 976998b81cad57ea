//! The real agent binary against configurations it was not written for: a file with keys of a newer release
//! still starts it (one warning per key: a rolled-back agent must read the configuration its successor left), and
//! the wait for buckets that do not exist is bounded by `nats.bucket_wait_secs` (then exit 1, systemd restarts);
//! a services user name (a password that bypasses the auth callout) stops it at start.
#![allow(deprecated, clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::*;
use fleet_rig::NatsServer;
use std::time::{Duration, Instant};

#[test]
fn keys_of_a_newer_release_are_ignored_with_a_warning_each() {
    let mut rig = Rig::new(false, "");
    // Keys this build does not know, at the top level, in a known table and as a table of their own.
    let text = std::fs::read_to_string(&rig.config).unwrap();
    let text = text
        .replacen("[nats]\n", "[nats]\ncompression = \"zstd\"\n", 1)
        .replacen("root = ", "telemetry_level = 2\nroot = ", 1)
        + "\n[metrics]\nport = 9100\n";
    rig.write_config("");
    std::fs::write(&rig.config, text).unwrap();
    let mut agent = rig.spawn_agent();
    agent.wait_ready();
    let log = agent.log_text();
    for key in ["telemetry_level", "nats.compression", "metrics"] {
        let line = format!("unknown key `{key}` ignored");
        assert_eq!(
            log.matches(&line).count(),
            1,
            "one warning for {key} expected:\n{log}"
        );
    }
    assert!(log.contains("WARN"), "{log}");
}

#[test]
fn the_wait_for_missing_buckets_is_bounded() {
    // A server without the agent's buckets (nobody ran `fleet-operator buckets`).
    let nats = NatsServer::start();
    let root = tempfile::tempdir().unwrap();
    let config = root.path().join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "device_id = \"{DEVICE}\"\nroot = \"{}\"\n[nats]\nurls = [\"{}\"]\nconnect_timeout_secs = 2\n\
             bucket_wait_secs = 2\n[podman]\nenabled = false\n",
            root.path().display(),
            nats.url()
        ),
    )
    .unwrap();
    let started = Instant::now();
    let mut agent = Agent::spawn(&config, root.path());
    let exit = agent.wait_exit(Duration::from_secs(60));
    let took = started.elapsed();
    let log = agent.log_text();
    assert!(!exit.success(), "{log}");
    assert!(
        log.contains("still missing after 2s (nats.bucket_wait_secs)"),
        "the log does not say why:\n{log}"
    );
    assert!(!log.contains("ready (READY=1"), "{log}");
    // The bound (2 s) plus start-up and one bucket look; the poll (5 s) must not stretch it.
    assert!(
        took < Duration::from_secs(10),
        "exited after {took:?}:\n{log}"
    );
}

#[test]
fn a_services_user_name_is_refused_at_start() {
    // The demo's services user with its password, as a newcomer copies it into agent.toml: the agent stops at
    // start, naming the setting and the documented way (token_file), before any connection.
    let root = tempfile::tempdir().unwrap();
    let config = root.path().join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "device_id = \"{DEVICE}\"\nroot = \"{}\"\n[nats]\nurls = [\"nats://127.0.0.1:9\"]\nuser = \"admin\"\n\
             password = \"services-password-1\"\n[podman]\nenabled = false\n",
            root.path().display(),
        ),
    )
    .unwrap();
    let mut agent = Agent::spawn(&config, root.path());
    let exit = agent.wait_exit(Duration::from_secs(30));
    let log = agent.log_text();
    assert!(!exit.success(), "{log}");
    assert!(
        log.contains("`nats.user`")
            && log.contains("\"admin\" is a services user")
            && log.contains("token_file"),
        "the refusal does not say why:\n{log}"
    );
    assert!(!log.contains("services-password-1"), "{log}");
    assert!(!log.contains("ready (READY=1"), "{log}");
}
