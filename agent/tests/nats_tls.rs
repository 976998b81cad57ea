//! The agent over TLS against a real nats-server that requires TLS with a private CA and client certificates
//! (mTLS): with the fleet's CA and its own certificate it becomes ready and publishes; with another CA, without a
//! client certificate, or against a plain server while TLS is configured, it fails readiness with the reason and
//! the file to look at, and never talks plain.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::*;
use fleet_rig::tls::TestCa;
use fleet_rig::NatsServer;
use std::path::Path;
use std::time::Duration;

/// A rig whose NATS server requires TLS (with client certificates when `verify_clients`), the agent's [nats]
/// section given `tls_lines` and a short retry window.
fn tls_rig(server: NatsServer, tls_lines: &str) -> Rig {
    let mut rig = Rig::new(false, "");
    rig.nats = server;
    create_buckets(&rig.nats.connect());
    rig.write_config("");
    let text = std::fs::read_to_string(&rig.config).unwrap().replace(
        "retry_window_secs = 120\n",
        &format!("retry_window_secs = 3\n{tls_lines}"),
    );
    std::fs::write(&rig.config, text).unwrap();
    rig
}

fn lines(ca: &Path, client: Option<&fleet_rig::tls::ServerCert>) -> String {
    let mut s = format!("ca_file = \"{}\"\n", ca.display());
    if let Some(c) = client {
        s.push_str(&format!(
            "cert_file = \"{}\"\nkey_file = \"{}\"\n",
            c.cert_file.display(),
            c.key_file.display()
        ));
    }
    s
}

/// Runs the agent until it exits (it must, within the retry window) and returns its log.
fn fails_readiness(rig: &Rig) -> String {
    let mut agent = rig.spawn_agent();
    let status = agent.wait_exit(Duration::from_secs(60));
    assert!(!status.success(), "agent exited 0:\n{}", agent.log_text());
    let log = agent.log_text();
    assert!(!log.contains("connected to NATS"), "{log}");
    log
}

#[test]
fn the_agent_works_over_mtls_with_the_fleet_ca() {
    let server = NatsServer::start_tls(true);
    let device_cert = server.tls().unwrap().ca.client_cert(DEVICE);
    let l = lines(server.ca_file().unwrap(), Some(&device_cert));
    let rig = tls_rig(server, &l);
    assert!(rig.nats.url().starts_with("tls://"));
    let mut agent = rig.spawn_agent();
    agent.wait_ready();
    let nc = rig.nc();
    let hb = store(&nc, fleet_wire::kv::DEVICE_HEARTBEAT);
    eventually(
        &agent,
        Duration::from_secs(20),
        "no heartbeat over TLS",
        || hb.get(DEVICE).unwrap(),
    );
    // The same config passes the probe the updater runs.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_fleet-agent"))
        .args(["--self-test", "--config"])
        .arg(&rig.config)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn a_wrong_ca_fails_readiness_with_the_reason_and_the_file() {
    let server = NatsServer::start_tls(false);
    let other = TestCa::new();
    let l = lines(other.ca_file(), None);
    let rig = tls_rig(server, &l);
    let log = fails_readiness(&rig);
    let needle = format!(
        "TLS: the server's certificate is not signed by the CA in nats.ca_file {} (unknown issuer)",
        other.ca_file().display()
    );
    assert!(log.contains(&needle), "{log}");
    assert!(log.contains("could not connect to NATS"), "{log}");

    // No ca_file at all and a nats:// URL against the TLS server: the client follows the server to TLS and
    // checks it with the system roots, which do not know the fleet CA.
    let text = std::fs::read_to_string(&rig.config).unwrap();
    let text = text
        .lines()
        .filter(|l| !l.starts_with("ca_file"))
        .map(|l| l.replace("tls://", "nats://") + "\n")
        .collect::<String>();
    std::fs::write(&rig.config, text).unwrap();
    let log = fails_readiness(&rig);
    assert!(log.contains("set nats.ca_file to the fleet's CA"), "{log}");
}

#[test]
fn a_verifying_server_refuses_an_agent_without_a_client_certificate() {
    let server = NatsServer::start_tls(true);
    let l = lines(server.ca_file().unwrap(), None);
    let rig = tls_rig(server, &l);
    let log = fails_readiness(&rig);
    assert!(log.contains("could not connect to NATS"), "{log}");
    assert!(
        log.contains(
            "the server requires a client certificate: set nats.cert_file and nats.key_file"
        ),
        "{log}"
    );
}

#[test]
fn configured_tls_never_falls_back_to_plain() {
    let ca = TestCa::new();
    let rig = tls_rig(NatsServer::start(), &lines(ca.ca_file(), None));
    assert!(rig.nats.url().starts_with("nats://"));
    let log = fails_readiness(&rig);
    assert!(log.contains("could not connect to NATS"), "{log}");
    assert!(log.contains("did not answer with TLS"), "{log}");
    assert!(log.contains("no plain fallback"), "{log}");
}

#[test]
fn unusable_tls_files_are_named() {
    let server = NatsServer::start_tls(false);
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("not-a-ca.pem");
    std::fs::write(&junk, "hello").unwrap();
    let rig = tls_rig(server, &lines(&junk, None));
    let log = fails_readiness(&rig);
    assert!(
        log.contains(&format!(
            "nats.ca_file {}: no CERTIFICATE block in the file",
            junk.display()
        )),
        "{log}"
    );
}
