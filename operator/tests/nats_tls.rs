//! The operator's NATS clients over TLS against a real nats-server that requires TLS with a private CA and client
//! certificates (mTLS): `fleet-operator buckets`, fleetlock-server's NATS store and fleet-auth connect with the
//! CA and their certificates, and are refused — with the reason and the file — with another CA, without a CA, or
//! against a plain server while TLS is configured.
#![allow(clippy::unwrap_used, clippy::expect_used, deprecated)]

use fleet_rig::fleetlock::{ServerProcess, TlsFiles};
use fleet_rig::nats_client as nats;
use fleet_rig::tls::{ServerCert, TestCa};
use fleet_rig::{wait_for, NatsServer};
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn buckets(url: &str, tls: &[(&str, &Path)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_fleet-operator"));
    c.args(["buckets", "--nats-url", url]);
    for (flag, p) in tls {
        c.arg(flag).arg(p);
    }
    c.env_remove("FLEET_NATS_CA_FILE")
        .env_remove("FLEET_NATS_CERT_FILE")
        .env_remove("FLEET_NATS_KEY_FILE");
    c.output().unwrap()
}

#[test]
fn operator_buckets_over_mtls_and_refusals() {
    let nats = NatsServer::start_tls(true);
    let tls = nats.tls().unwrap();
    let ca = tls.ca.ca_file();
    let op = tls.ca.client_cert("fleet-operator");
    let with_cert = |ca: &Path, c: &ServerCert| {
        buckets(
            &nats.url(),
            &[
                ("--nats-ca-file", ca),
                ("--nats-cert-file", &c.cert_file),
                ("--nats-key-file", &c.key_file),
            ],
        )
    };
    let out = with_cert(ca, &op);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("created"), "{}", text(&out));
    // The buckets really are on the TLS server.
    let nc = nats.connect();
    let js = nats::jetstream::new(nc);
    assert!(js.key_value(fleet_wire::kv::DEVICE_INFO).is_ok());

    // Another CA: refused, with the reason and the file.
    let other = TestCa::new();
    let out = with_cert(other.ca_file(), &op);
    assert!(!out.status.success());
    let t = text(&out);
    assert!(
        t.contains(&format!(
            "not signed by the CA in {} (unknown issuer)",
            other.ca_file().display()
        )),
        "{t}"
    );
    // No client certificate: the server refuses.
    let out = buckets(&nats.url(), &[("--nats-ca-file", ca)]);
    assert!(!out.status.success(), "{}", text(&out));
    // A certificate without its key is a usage error.
    let out = buckets(
        &nats.url(),
        &[("--nats-ca-file", ca), ("--nats-cert-file", &op.cert_file)],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("go together"), "{}", text(&out));

    // TLS configured against a plain server: no fallback.
    let plain = NatsServer::start();
    let out = buckets(&plain.url(), &[("--nats-ca-file", ca)]);
    assert!(!out.status.success());
    assert!(text(&out).contains("no plain fallback"), "{}", text(&out));
}

fn fleetlock_with_nats_store(
    dir: &Path,
    nats: &NatsServer,
    store_tls: &str,
) -> Result<ServerProcess, String> {
    let web = TestCa::new();
    let cert = web.server_cert("fleetlock");
    let cfg = dir.join("fleetlock.yaml");
    std::fs::write(
        &cfg,
        format!(
            "store: {{kind: nats, url: \"{}\"{store_tls}}}\naudit_log: {}\n",
            nats.url(),
            dir.join("audit.jsonl").display()
        ),
    )
    .unwrap();
    let files = TlsFiles {
        cert: cert.cert_file.clone(),
        key: cert.key_file.clone(),
        ca: web.ca_file().to_path_buf(),
    };
    let s = ServerProcess::start_tls(&fleet_vm_tests::builds::fleetlock_server(), &cfg, files);
    // The web CA's files are read at start; keep the CA alive for restarts by leaking nothing: start is done.
    drop(web);
    s
}

#[test]
fn fleetlock_nats_store_over_mtls() {
    let dir = tempfile::tempdir().unwrap();
    let nats = NatsServer::start_tls(true);
    let tls = nats.tls().unwrap();
    let c = tls.ca.client_cert("fleetlock");
    let good = format!(
        ", ca_file: {}, cert_file: {}, key_file: {}",
        tls.ca.ca_file().display(),
        c.cert_file.display(),
        c.key_file.display()
    );
    let s = fleetlock_with_nats_store(dir.path(), &nats, &good).unwrap();
    let mut conn = s.conn().unwrap();
    assert_eq!(conn.fleetlock(true, "a", "default").unwrap().status, 200);
    let a = conn.request("GET", "/v1/status", &[], b"").unwrap();
    assert!(a.text().contains("\"store\":\"nats\""), "{}", a.text());
    drop(s);

    let other = TestCa::new();
    let wrong = format!(
        ", ca_file: {}, cert_file: {}, key_file: {}",
        other.ca_file().display(),
        c.cert_file.display(),
        c.key_file.display()
    );
    let e = fleetlock_with_nats_store(dir.path(), &nats, &wrong)
        .err()
        .expect("another CA must be refused");
    assert!(
        e.contains("not signed by the CA in") && e.contains("(unknown issuer)"),
        "{e}"
    );
}

/// fleet-auth over TLS to a nats-server with the auth callout: it serves with the fleet CA, and with another CA it
/// stops at start with the reason instead of retrying forever.
#[test]
fn fleet_auth_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let issuer = nkeys::KeyPair::new_account();
    let conf = dir.path().join("nats.conf");
    std::fs::write(
        &conf,
        fleet_rig::nats::callout_config(
            &dir.path().join("nats.log"),
            &issuer.public_key(),
            &fleet_rig::nats::CalloutPasswords {
                auth: "auth-pw".into(),
                admin: "admin-pw".into(),
                device_api: "api-pw".into(),
                system: "system-pw".into(),
            },
            None,
        ),
    )
    .unwrap();
    let nats = NatsServer::start_tls_with_args(false, &["-c", conf.to_str().unwrap()]);
    let write = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let pw = write("auth-password", "auth-pw");
    let api_pw = write("api-password", "api-pw");
    let admin_pw = write("admin-password", "admin-pw");
    let seed = write("issuer.nk", &issuer.seed().unwrap());
    let config = |ca: &Path| {
        write(
            "fleet-auth.yaml",
            &format!(
                "nats:\n  url: \"{}\"\n  user: fleet-auth\n  password_file: \"{}\"\n  ca_file: \"{}\"\n\
                 issuer_seed_file: \"{}\"\naccount: DEVICES\ndevice_api:\n  user: {}\n  password_file: \"{}\"\n  \
                 fleet_user: admin\n  fleet_password_file: \"{}\"\nzitadel:\n  issuer: https://id.example\n  \
                 audience: fleet\n  jwks_url: https://127.0.0.1:9/keys\n  jwks_timeout_ms: 200\n",
                nats.url(),
                pw.display(),
                ca.display(),
                seed.display(),
                fleet_rig::nats::DEVICE_API_USER,
                api_pw.display(),
                admin_pw.display()
            ),
        )
    };
    let run = |cfg: &Path| {
        let log = dir.path().join("fleet-auth.log");
        let child = Command::new(fleet_vm_tests::builds::fleet_auth())
            .arg("--config")
            .arg(cfg)
            .env("RUST_LOG", "info")
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        (child, log)
    };
    let (mut child, log) = run(&config(nats.ca_file().unwrap()));
    let served = wait_for(Duration::from_secs(20), || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("fleet-auth serving")
            .then_some(())
    });
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        served.is_some(),
        "{}",
        std::fs::read_to_string(&log).unwrap()
    );

    let other = TestCa::new();
    let (mut child, log) = run(&config(other.ca_file()));
    let exited = wait_for(Duration::from_secs(30), || child.try_wait().unwrap());
    let text = std::fs::read_to_string(&log).unwrap();
    if exited.is_none() {
        let _ = child.kill();
    }
    assert!(exited.is_some_and(|s| !s.success()), "{text}");
    assert!(
        text.contains(&format!(
            "not signed by the CA in {} (unknown issuer)",
            other.ca_file().display()
        )),
        "{text}"
    );
}
