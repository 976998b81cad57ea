//! Protocol conformance of a real `fleetlock-server` process (file store): every point of the protocol, groups,
//! auth, TTL, admin release with audit, config reload, status, metrics and client time-outs — each case once over
//! plain HTTP (`--plain-http`) and once over HTTPS with a private CA (`_https`). HTTPS only: a client with another
//! CA or without TLS is refused, certificate rotation on disk takes effect without a restart, a bad certificate
//! file stops the start with its name.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use fleet_rig::fleetlock::{trust_only, Answer, Conn, ServerProcess, TlsFiles};
use fleet_rig::tls::TestCa;
use std::io::Read;
use std::path::Path;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_fleetlock-server");

/// Plain HTTP or HTTPS.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Wire {
    Http,
    Https,
}

/// Issues a certificate for 127.0.0.1 from `ca` and writes it, its key and the CA into `dir`.
fn tls_files(dir: &Path, ca: &TestCa) -> TlsFiles {
    let cert = ca.server_cert("fleetlock");
    let files = TlsFiles {
        cert: dir.join("server.crt"),
        key: dir.join("server.key"),
        ca: dir.join("ca.pem"),
    };
    std::fs::copy(&cert.cert_file, &files.cert).unwrap();
    std::fs::copy(&cert.key_file, &files.key).unwrap();
    std::fs::copy(ca.ca_file(), &files.ca).unwrap();
    files
}

fn write_config(dir: &Path, yaml: &str) -> std::path::PathBuf {
    let cfg = dir.join("config.yaml");
    let yaml = format!(
        "store: {{kind: file, dir: {}}}\n{yaml}",
        dir.join("store").display()
    );
    std::fs::write(&cfg, yaml).unwrap();
    cfg
}

fn server(dir: &Path, yaml: &str, wire: Wire) -> ServerProcess {
    let cfg = write_config(dir, yaml);
    match wire {
        Wire::Http => ServerProcess::start(Path::new(BIN), &cfg).unwrap(),
        Wire::Https => {
            let files = tls_files(dir, &TestCa::new());
            ServerProcess::start_tls(Path::new(BIN), &cfg, files).unwrap()
        }
    }
}

/// One `#[test]` per wire for a case written as `fn case(wire: Wire)`.
macro_rules! both_wires {
    ($case:ident, $https:ident) => {
        #[test]
        fn $case() {
            cases::$case(Wire::Http);
        }
        #[test]
        fn $https() {
            cases::$case(Wire::Https);
        }
    };
}

both_wires!(protocol_points, protocol_points_https);
both_wires!(slow_clients_time_out, slow_clients_time_out_https);
both_wires!(
    groups_members_and_all_or_nothing,
    groups_members_and_all_or_nothing_https
);
both_wires!(
    auth_ttl_admin_release_and_audit,
    auth_ttl_admin_release_and_audit_https
);
both_wires!(
    config_reload_and_invalid_config,
    config_reload_and_invalid_config_https
);

fn status(c: &mut Conn) -> serde_json::Value {
    let a = c.request("GET", "/v1/status", &[], b"").unwrap();
    assert_eq!(a.status, 200, "{}", a.text());
    serde_json::from_slice(&a.body).unwrap()
}

fn holders(c: &mut Conn, group: &str) -> Vec<String> {
    status(c)["groups"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|g| g["name"] == group)
        .flat_map(|g| g["holders"].as_array().unwrap().clone())
        .map(|h| h["id"].as_str().unwrap().to_string())
        .collect()
}

fn err(a: &Answer, status: u16, kind: &str) {
    assert_eq!(a.status, status, "{}", a.text());
    assert_eq!(a.header("content-type"), Some("application/json"));
    let v: serde_json::Value = serde_json::from_slice(&a.body).unwrap();
    assert_eq!(v["kind"], kind, "{}", a.text());
    assert!(v["value"].as_str().is_some_and(|s| !s.is_empty()));
    assert_eq!(v.as_object().unwrap().len(), 2, "only kind and value");
}

mod cases {
    use super::*;

    pub fn protocol_points(wire: Wire) {
        let dir = tempfile::tempdir().unwrap();
        let s = server(
            dir.path(),
            "default_slots: 1\ngroups: [{name: workers, slots: 2}]\n",
            wire,
        );
        let mut c = s.conn().unwrap();
        let body = br#"{"client_params":{"id":"a","group":"default"}}"#;

        // The header is required, with the value true.
        err(
            &c.request("POST", "/v1/pre-reboot", &[], body).unwrap(),
            400,
            "missing-protocol-header",
        );
        err(
            &c.request(
                "POST",
                "/v1/pre-reboot",
                &[("fleet-lock-protocol", "false")],
                body,
            )
            .unwrap(),
            400,
            "missing-protocol-header",
        );
        // No Content-Type needed (the helper sends none).
        let a = c
            .request(
                "POST",
                "/v1/pre-reboot",
                &[("fleet-lock-protocol", "true")],
                body,
            )
            .unwrap();
        assert_eq!(a.status, 200, "{}", a.text());
        // The holder asking again is fine; another client finds every slot taken.
        assert_eq!(c.fleetlock(true, "a", "default").unwrap().status, 200);
        err(
            &c.fleetlock(true, "b", "default").unwrap(),
            409,
            "all-slots-taken",
        );
        // steady-state from a non-holder is fine and changes nothing.
        assert_eq!(c.fleetlock(false, "b", "default").unwrap().status, 200);
        assert_eq!(holders(&mut c, "default"), vec!["a"]);
        assert_eq!(c.fleetlock(false, "a", "default").unwrap().status, 200);
        assert!(holders(&mut c, "default").is_empty());
        assert_eq!(c.fleetlock(true, "b", "default").unwrap().status, 200);

        // Validation of id and group, body shape, unknown group.
        err(
            &c.fleetlock(true, "", "default").unwrap(),
            400,
            "invalid-id",
        );
        err(
            &c.fleetlock(true, "x", "a b").unwrap(),
            400,
            "invalid-group",
        );
        err(&c.fleetlock(true, "x", "").unwrap(), 400, "invalid-group");
        err(
            &c.fleetlock(true, "x", "nope").unwrap(),
            400,
            "unknown-group",
        );
        let h = [("fleet-lock-protocol", "true")];
        err(
            &c.request("POST", "/v1/pre-reboot", &h, b"{").unwrap(),
            400,
            "invalid-body",
        );
        err(
            &c.request("POST", "/v1/steady-state", &h, b"{}").unwrap(),
            400,
            "invalid-body",
        );
        // A named group with free slots.
        assert_eq!(c.fleetlock(true, "w1", "workers").unwrap().status, 200);
        assert_eq!(c.fleetlock(true, "w2", "workers").unwrap().status, 200);
        err(
            &c.fleetlock(true, "w3", "workers").unwrap(),
            409,
            "all-slots-taken",
        );

        // Other methods: 405 with an Allow header; unknown paths 404.
        for (m, p) in [
            ("GET", "/v1/pre-reboot"),
            ("PUT", "/v1/steady-state"),
            ("DELETE", "/v1/pre-reboot"),
            ("POST", "/v1/status"),
            ("POST", "/metrics"),
        ] {
            let a = c.request(m, p, &[], b"").unwrap();
            err(&a, 405, "method-not-allowed");
            assert!(a.header("allow").is_some());
        }
        err(
            &c.request("GET", "/v2/nothing", &[], b"").unwrap(),
            404,
            "not-found",
        );

        // Bounded body: 413.
        let big = vec![b' '; 20_000];
        err(
            &c.request("POST", "/v1/pre-reboot", &h, &big).unwrap(),
            413,
            "body-too-large",
        );
        // Bounded head: hyper answers 431 (or closes).
        let mut c2 = s.conn().unwrap();
        let long = "x".repeat(40_000);
        if let Ok(a) = c2.request("GET", "/healthz", &[("x-long", &long)], b"") {
            assert!(a.status == 431 || a.status == 400, "{}", a.status);
        }

        // Status, metrics, health.
        let st = status(&mut c);
        assert_eq!(st["store"], "file");
        assert_eq!(st["config_valid"], true);
        let hb = st["groups"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["name"] == "default")
            .unwrap()["holders"][0]
            .clone();
        assert_eq!(hb["id"], "b");
        assert_eq!(hb["ip"], "127.0.0.1");
        assert!(hb["taken_at"].as_str().unwrap().ends_with('Z'));
        let m = c.request("GET", "/metrics", &[], b"").unwrap().text();
        for needle in [
            "fleetlock_slots{group=\"workers\"} 2",
            "fleetlock_holders{group=\"workers\"} 2",
            "fleetlock_holders{group=\"default\"} 1",
            "fleetlock_errors_total{kind=\"all-slots-taken\"} 2",
            "fleetlock_errors_total{kind=\"missing-protocol-header\"} 2",
            "fleetlock_requests_total{endpoint=\"pre-reboot\",code=\"200\"}",
            "fleetlock_config_valid 1",
        ] {
            assert!(m.contains(needle), "{needle} missing from\n{m}");
        }
        assert_eq!(c.request("GET", "/healthz", &[], b"").unwrap().status, 200);
    }

    pub fn slow_clients_time_out(wire: Wire) {
        let dir = tempfile::tempdir().unwrap();
        let s = server(dir.path(), "client_timeout: 1s\n", wire);
        // Headers never finished: the server closes the connection (or answers 408) in time.
        let mut c = s.conn().unwrap();
        let started = Instant::now();
        if let Ok(a) = c.raw(b"POST /v1/pre-reboot HTTP/1.1\r\nhost: x\r\n") {
            assert_eq!(a.status, 408, "{}", a.text());
        }
        assert!(
            started.elapsed() < Duration::from_secs(8),
            "closed after {:?}",
            started.elapsed()
        );
        // Body announced but never sent: 408 timeout.
        let mut c = s.conn().unwrap();
        let a = c.raw(b"POST /v1/pre-reboot HTTP/1.1\r\nhost: x\r\nfleet-lock-protocol: true\r\ncontent-length: 50\r\n\r\n{").unwrap();
        err(&a, 408, "timeout");
        // A TCP connection that never starts its handshake is closed in time too.
        if wire == Wire::Https {
            let mut t = std::net::TcpStream::connect(s.addr).unwrap();
            t.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let started = Instant::now();
            let mut buf = Vec::new();
            let _ = t.read_to_end(&mut buf);
            assert!(
                started.elapsed() < Duration::from_secs(8),
                "closed after {:?}",
                started.elapsed()
            );
        }
    }

    pub fn groups_members_and_all_or_nothing(wire: Wire) {
        let dir = tempfile::tempdir().unwrap();
        let s = server(
            dir.path(),
            "default_slots: 5\ngroups:\n  - {name: db, slots: 1, members: [h1, h2]}\n  - {name: swarm, slots: 1, members: [h2, h3]}\n",
            wire,
        );
        let mut c = s.conn().unwrap();
        assert_eq!(c.fleetlock(true, "h1", "default").unwrap().status, 200); // db
                                                                             // h2 is in db and swarm: db is full, so it gets neither.
        err(
            &c.fleetlock(true, "h2", "default").unwrap(),
            409,
            "all-slots-taken",
        );
        assert!(holders(&mut c, "swarm").is_empty());
        assert_eq!(c.fleetlock(true, "h3", "default").unwrap().status, 200); // swarm
        assert_eq!(c.fleetlock(false, "h1", "default").unwrap().status, 200);
        err(
            &c.fleetlock(true, "h2", "default").unwrap(),
            409,
            "all-slots-taken",
        ); // swarm now full
        assert!(holders(&mut c, "db").is_empty());
        assert_eq!(c.fleetlock(false, "h3", "default").unwrap().status, 200);
        assert_eq!(c.fleetlock(true, "h2", "default").unwrap().status, 200);
        assert_eq!(holders(&mut c, "db"), vec!["h2"]);
        assert_eq!(holders(&mut c, "swarm"), vec!["h2"]);
        // A host in no group shares `default`; the IP also matches members.
        assert_eq!(c.fleetlock(true, "other", "default").unwrap().status, 200);
        assert_eq!(holders(&mut c, "default"), vec!["other"]);
        // A hostname sent by fleet-reboot matches members too.
        let body = br#"{"client_params":{"id":"m-77","group":"default","hostname":"h1"}}"#;
        let a = c
            .request(
                "POST",
                "/v1/pre-reboot",
                &[("fleet-lock-protocol", "true")],
                body,
            )
            .unwrap();
        err(&a, 409, "all-slots-taken"); // db is held by h2
    }

    pub fn auth_ttl_admin_release_and_audit(wire: Wire) {
        let dir = tempfile::tempdir().unwrap();
        let s = server(
            dir.path(),
            "ttl: 2s\nauth:\n  tokens: [client-secret]\n  basic: [{username: zincati, password: pw}]\n  admin_tokens: [admin-secret]\n",
            wire,
        );
        let mut c = s.conn().unwrap();
        err(
            &c.fleetlock(true, "a", "default").unwrap(),
            401,
            "unauthorized",
        );
        err(
            &c.fleetlock_with(true, "a", "default", &[("authorization", "Bearer wrong")])
                .unwrap(),
            401,
            "unauthorized",
        );
        err(
            &c.request("GET", "/v1/status", &[], b"").unwrap(),
            401,
            "unauthorized",
        );
        assert_eq!(
            c.fleetlock_with(
                true,
                "a",
                "default",
                &[("authorization", "Bearer client-secret")]
            )
            .unwrap()
            .status,
            200
        );
        // Basic auth as Zincati sends it from http://zincati:pw@host/ (base64 of "zincati:pw").
        let basic = [("authorization", "Basic emluY2F0aTpwdw==")];
        err(
            &c.fleetlock_with(true, "b", "default", &basic).unwrap(),
            409,
            "all-slots-taken",
        );
        // Admin release needs the admin token and a reason, and leaves an audit record.
        let rel = br#"{"group":"default","id":"a","reason":"host a was reinstalled"}"#;
        err(
            &c.request(
                "POST",
                "/v1/admin/release",
                &[("authorization", "Bearer client-secret")],
                rel,
            )
            .unwrap(),
            401,
            "unauthorized",
        );
        let a = c
            .request(
                "POST",
                "/v1/admin/release",
                &[("authorization", "Bearer admin-secret")],
                rel,
            )
            .unwrap();
        assert_eq!(a.status, 200, "{}", a.text());
        let audit = std::fs::read_to_string(dir.path().join("store/audit.jsonl")).unwrap();
        assert!(
            audit.contains("\"action\":\"admin-release\"") && audit.contains("\"removed\":true"),
            "{audit}"
        );
        assert!(audit.contains("host a was reinstalled"));
        // TTL: b takes the slot and loses it 2 s later to c.
        assert_eq!(
            c.fleetlock_with(true, "b", "default", &basic)
                .unwrap()
                .status,
            200
        );
        err(
            &c.fleetlock_with(true, "c", "default", &basic).unwrap(),
            409,
            "all-slots-taken",
        );
        // why: the TTL running out is the property: b's slot ends 2 s after its grant, not before
        std::thread::sleep(Duration::from_millis(2100));
        assert_eq!(
            c.fleetlock_with(true, "c", "default", &basic)
                .unwrap()
                .status,
            200
        );
        let audit = std::fs::read_to_string(dir.path().join("store/audit.jsonl")).unwrap();
        assert!(
            audit.contains("\"action\":\"ttl-expired\"") && audit.contains("\"id\":\"b\""),
            "{audit}"
        );
        // No secret ever reaches the log; plain HTTP with credentials is warned about at start, HTTPS is not.
        let log = s.log();
        assert_eq!(
            log.contains("credentials are configured but the listener is plain HTTP"),
            wire == Wire::Http,
            "{log}"
        );
        for secret in [
            "client-secret",
            "admin-secret",
            "emluY2F0aTpwdw",
            "zincati:pw",
        ] {
            assert!(!log.contains(secret), "{secret} in log:\n{log}");
        }
    }

    pub fn config_reload_and_invalid_config(wire: Wire) {
        let dir = tempfile::tempdir().unwrap();
        let s = server(dir.path(), "default_slots: 1\n", wire);
        let cfg = dir.path().join("config.yaml");
        let store = dir.path().join("store");
        let mut c = s.conn().unwrap();
        assert_eq!(c.fleetlock(true, "a", "default").unwrap().status, 200);
        err(
            &c.fleetlock(true, "b", "default").unwrap(),
            409,
            "all-slots-taken",
        );
        std::fs::write(
            &cfg,
            format!(
                "store: {{kind: file, dir: {}}}\ndefault_slots: 2\n",
                store.display()
            ),
        )
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(15);
        while c.fleetlock(true, "b", "default").unwrap().status != 200 {
            assert!(Instant::now() < deadline, "config not reloaded");
            // why: pacing of the bounded poll for the reload
            std::thread::sleep(Duration::from_millis(100));
        }
        // An invalid file keeps the last good config and says so in status and metrics.
        std::fs::write(&cfg, "default_slots: [not a number]\n").unwrap();
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let st = status(&mut c);
            if st["config_valid"] == false {
                assert!(
                    st["config_error"]
                        .as_str()
                        .unwrap()
                        .contains("default_slots"),
                    "{st}"
                );
                break;
            }
            assert!(Instant::now() < deadline, "invalid config not reported");
            // why: pacing of the bounded poll for the report
            std::thread::sleep(Duration::from_millis(100));
        }
        let m = c.request("GET", "/metrics", &[], b"").unwrap().text();
        assert!(m.contains("fleetlock_config_valid 0"), "{m}");
        assert!(
            m.contains("fleetlock_config_reload_failures_total{store=\"file\"} 1"),
            "{m}"
        );
        assert!(m.contains("fleetlock_slots{group=\"default\"} 2"), "{m}");
        err(
            &c.fleetlock(true, "c", "default").unwrap(),
            409,
            "all-slots-taken",
        );
        assert!(s.log().contains("keeping the last good config"));
    }
}

#[test]
fn no_config_serves_default_group() {
    // Without --config the server needs /var/lib/fleetlock; here check the config-less defaults instead.
    let c = fleetlock_server::Config::parse("").unwrap();
    assert_eq!(c.slots("default"), Some(1));
    assert_eq!(
        c.store,
        fleetlock_server::config::StoreConfig::File {
            dir: "/var/lib/fleetlock".into()
        }
    );
}

/// HTTPS: a client trusting another CA is refused at the handshake, and so is a client speaking plain HTTP.
#[test]
fn https_refuses_other_ca_and_plain_clients() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(dir.path(), "default_slots: 1\n", Wire::Https);
    let other = TestCa::new();
    let e = Conn::connect_tls(s.addr, trust_only(other.ca_file()).unwrap())
        .err()
        .expect("a certificate of another CA must be refused");
    assert!(
        e.to_string()
            .contains("invalid peer certificate: UnknownIssuer"),
        "{e}"
    );
    let mut plain = Conn::connect(s.addr).unwrap();
    let answer = plain.fleetlock(true, "a", "default");
    assert!(
        answer.as_ref().map_or(true, |a| a.status != 200),
        "plain HTTP on the HTTPS port: {answer:?}"
    );
    // Nothing was locked by either.
    let mut c = s.conn().unwrap();
    assert_eq!(c.fleetlock(true, "b", "default").unwrap().status, 200);
}

/// HTTPS: a new certificate and key written over the files are served without a restart (here from another CA,
/// so the switch is visible to clients); a broken file keeps the last good pair in force and is logged.
#[test]
fn https_certificate_rotation_without_restart() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(dir.path(), "default_slots: 1\n");
    let first = TestCa::new();
    let files = tls_files(dir.path(), &first);
    let mut s = ServerProcess::start_tls(Path::new(BIN), &cfg, files.clone()).unwrap();
    let mut c = s.conn().unwrap();
    assert_eq!(c.fleetlock(true, "a", "default").unwrap().status, 200);

    let second = TestCa::new();
    let next = second.server_cert("rotated");
    // Key first, then certificate: in between the pair does not match and the old one is kept.
    std::fs::copy(&next.key_file, &files.key).unwrap();
    let kept = |s: &ServerProcess| {
        s.log()
            .matches("the last good certificate stays in use")
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    while kept(&s) == 0 {
        assert!(
            Instant::now() < deadline,
            "the mismatched pair not judged:\n{}",
            s.log()
        );
        // why: pacing of the poll for the reloader's verdict in the log
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(Conn::connect_tls(s.addr, trust_only(first.ca_file()).unwrap()).is_ok());
    std::fs::copy(&next.cert_file, &files.cert).unwrap();
    let trusts_second = trust_only(second.ca_file()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut c2 = loop {
        if let Ok(c) = Conn::connect_tls(s.addr, trusts_second.clone()) {
            break c;
        }
        assert!(
            Instant::now() < deadline,
            "rotated certificate not served:\n{}",
            s.log()
        );
        // why: pacing of the bounded poll for the rotated certificate
        std::thread::sleep(Duration::from_millis(100));
    };
    // Same process, same state: the holder taken before the rotation is still there.
    err_slots(&c2.fleetlock(true, "b", "default").unwrap());
    assert!(Conn::connect_tls(s.addr, trust_only(first.ca_file()).unwrap()).is_err());
    // The connection opened before the rotation keeps working.
    assert_eq!(c.fleetlock(false, "a", "default").unwrap().status, 200);

    // A broken certificate file: logged, and the last good pair stays.
    std::fs::write(&files.cert, "not a certificate").unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    while kept(&s) < 2 {
        assert!(
            Instant::now() < deadline,
            "broken certificate not reported:\n{}",
            s.log()
        );
        // why: pacing of the bounded poll for the report
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(s.log().contains("server.crt"), "{}", s.log());
    assert!(Conn::connect_tls(s.addr, trusts_second.clone()).is_ok());

    // A restart with the broken file does not start, and says which file is wrong.
    s.kill();
    let e = s
        .restart()
        .expect_err("a broken certificate stops the start");
    assert!(
        e.contains("server.crt") && e.contains("no CERTIFICATE"),
        "{e}"
    );
}

fn err_slots(a: &Answer) {
    assert_eq!(a.status, 409, "{}", a.text());
    assert_eq!(a.kind().as_deref(), Some("all-slots-taken"));
}

/// Neither HTTPS files nor `--plain-http`: the server does not start and says what to give.
#[test]
fn listener_must_be_chosen() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(dir.path(), "");
    let out = std::process::Command::new(BIN)
        .args(["--listen", "127.0.0.1:0", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains("--tls-cert") && text.contains("--plain-http"),
        "{text}"
    );
    let out = std::process::Command::new(BIN)
        .args(["--plain-http", "--tls-cert", "x.pem", "--tls-key", "y.pem"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// fleet-reboot's FleetLock client against the real server over HTTPS: with the fleet's CA in `ca_file` it takes
/// and gives back the slot; with only the system roots, or another CA, it is refused with the reason; a CA file
/// that cannot be used is named.
#[test]
fn fleet_reboot_client_trusts_its_ca_file() {
    use fleet_updater::reboot::lock::{Identity, LockClient};
    let dir = tempfile::tempdir().unwrap();
    let s = server(dir.path(), "default_slots: 1\n", Wire::Https);
    let base = s.url();
    let ca = dir.path().join("ca.pem");
    let t = Duration::from_secs(5);
    let who = Identity {
        id: "host-1".into(),
        hostname: Some("host-1".into()),
    };
    let client = LockClient::new(&base, "default", None, t, Some(&ca)).unwrap();
    client.pre_reboot(&who).unwrap();
    let st = client.status().unwrap();
    assert_eq!(st.groups[0].holders[0].id, "host-1");
    client.steady_state(&who).unwrap();

    let system_only = LockClient::new(&base, "default", None, t, None).unwrap();
    let e = system_only.pre_reboot(&who).unwrap_err().to_string();
    assert!(
        e.contains("UnknownIssuer") && e.contains("set ca_file"),
        "{e}"
    );
    let other = TestCa::new();
    let wrong = LockClient::new(&base, "default", None, t, Some(other.ca_file())).unwrap();
    let e = wrong.pre_reboot(&who).unwrap_err().to_string();
    assert!(e.contains("UnknownIssuer"), "{e}");
    let mut c = s.conn().unwrap();
    assert!(
        holders(&mut c, "default").is_empty(),
        "refused clients took no slot"
    );
    // The history shows host-1's own grant and release only: the refused requests changed nothing.
    let st = status(&mut c);
    let kinds: Vec<&str> = st["recent"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["released", "granted"], "{st}");

    let missing = dir.path().join("missing-ca.pem");
    let e = LockClient::new(&base, "default", None, t, Some(&missing))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("missing-ca.pem"), "{e}");
    let e = LockClient::new(
        &base,
        "default",
        None,
        t,
        Some(&dir.path().join("config.yaml")),
    )
    .err()
    .unwrap()
    .to_string();
    assert!(
        e.contains("config.yaml") && e.contains("no CERTIFICATE"),
        "{e}"
    );
}

/// The `store:` lines of a file store under `dir` and of a NATS store on `nats`.
fn both_stores(dir: &Path, nats: &fleet_rig::NatsServer) -> [String; 2] {
    [
        format!(
            "store: {{kind: file, dir: {}}}",
            dir.join("store").display()
        ),
        format!("store: {{kind: nats, url: \"{}\"}}", nats.url()),
    ]
}

/// Rewrites the config file and waits until the server answers with it (`probe` returns true).
fn reconfigure(path: &Path, yaml: &str, mut probe: impl FnMut() -> bool) {
    std::fs::write(path, yaml).unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    while !probe() {
        assert!(Instant::now() < deadline, "config not reloaded: {yaml}");
        // why: pacing of the bounded poll for the reload
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A release never depends on the current config: a host that took a slot in a group that was then removed
/// from the config still gives it back with steady-state (it used to get `unknown-group` and keep the slot until an
/// admin release), with the file store and with the NATS store.
#[test]
fn release_frees_slots_of_a_removed_group() {
    let nats = fleet_rig::NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let stores = both_stores(dir.path(), &nats);
    for (i, store) in stores.iter().enumerate() {
        let cfg = dir.path().join(format!("config-{i}.yaml"));
        let with = format!("{store}\ngroups: [{{name: workers, slots: 1}}]\n");
        std::fs::write(&cfg, &with).unwrap();
        let s = ServerProcess::start(Path::new(BIN), &cfg).unwrap();
        let mut c = s.conn().unwrap();
        assert_eq!(c.fleetlock(true, "a", "workers").unwrap().status, 200);
        // the group leaves the config while a holds its only slot
        reconfigure(&cfg, &format!("{store}\n"), || {
            c.fleetlock(true, "probe", "workers")
                .unwrap()
                .kind()
                .as_deref()
                == Some("unknown-group")
        });
        let a = c.fleetlock(false, "a", "workers").unwrap();
        assert_eq!(a.status, 200, "store {i}: {}", a.text());
        // a release of a group never configured is no error either
        assert_eq!(c.fleetlock(false, "a", "nowhere").unwrap().status, 200);
        // the slot is free: with the group back, another host takes it
        reconfigure(&cfg, &with, || {
            c.fleetlock(true, "b", "workers").unwrap().status == 200
        });
        assert_eq!(holders(&mut c, "workers"), vec!["b"], "store {i}");
    }
}

/// `path_prefix`: a client base URL with a path (`https://host/fleetlock/`, to which Zincati joins
/// `v1/pre-reboot`) reaches every endpoint; the root keeps working; another prefix is not found.
#[test]
fn path_prefix_serves_a_base_url_with_a_path() {
    let dir = tempfile::tempdir().unwrap();
    let s = server(dir.path(), "path_prefix: /fleetlock/\n", Wire::Http);
    let mut c = s.conn().unwrap();
    let hdr = [("fleet-lock-protocol", "true")];
    // as Zincati sends it: pretty-printed JSON, no Content-Type
    let body = b"{\n  \"client_params\": {\n    \"id\": \"a\",\n    \"group\": \"default\"\n  }\n}";
    let a = c
        .request("POST", "/fleetlock/v1/pre-reboot", &hdr, body)
        .unwrap();
    assert_eq!(a.status, 200, "{}", a.text());
    let st = c.request("GET", "/fleetlock/v1/status", &[], b"").unwrap();
    assert_eq!(st.status, 200, "{}", st.text());
    assert!(st.text().contains("\"id\":\"a\""), "{}", st.text());
    assert_eq!(
        holders(&mut c, "default"),
        vec!["a"],
        "the root still works"
    );
    for path in [
        "/fleetlockx/v1/pre-reboot",
        "/other/v1/pre-reboot",
        "/fleetlock",
    ] {
        err(
            &c.request("POST", path, &hdr, body).unwrap(),
            404,
            "not-found",
        );
    }
    let a = c
        .request("POST", "/fleetlock/v1/steady-state", &hdr, body)
        .unwrap();
    assert_eq!(a.status, 200, "{}", a.text());
    assert!(holders(&mut c, "default").is_empty());
    assert_eq!(
        c.request("GET", "/fleetlock/healthz", &[], b"")
            .unwrap()
            .status,
        200
    );
}

/// The info log shows grants and releases in the order they were committed: with one slot and clients racing
/// for it, every grant follows the release of the previous holder (file store, then the NATS store).
#[test]
fn grants_and_releases_are_logged_in_commit_order() {
    const CLIENTS: usize = 8;
    const ROUNDS: usize = 6;
    let nats = fleet_rig::NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let stores = both_stores(dir.path(), &nats);
    for (i, store) in stores.iter().enumerate() {
        let cfg = dir.path().join(format!("order-{i}.yaml"));
        std::fs::write(
            &cfg,
            format!("{store}\ngroups: [{{name: one, slots: 1}}]\n"),
        )
        .unwrap();
        let s = ServerProcess::start_logging(Path::new(BIN), &cfg, "info").unwrap();
        let threads: Vec<_> = (0..CLIENTS)
            .map(|n| {
                let addr = s.addr;
                std::thread::spawn(move || {
                    let mut c = fleet_rig::fleetlock::Conn::connect(addr).unwrap();
                    let id = format!("host-{n}");
                    for _ in 0..ROUNDS {
                        while c.fleetlock(true, &id, "one").unwrap().status != 200 {
                            // why: a brief back-off before asking for the slot again (the race is the test)
                            std::thread::sleep(Duration::from_millis(2));
                        }
                        assert_eq!(c.fleetlock(false, &id, "one").unwrap().status, 200);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let log = s.log();
        let mut holder: Option<String> = None;
        let (mut grants, mut releases) = (0, 0);
        for line in log.lines() {
            if let Some(rest) = line.split("grant: ").nth(1) {
                let id = rest.split_whitespace().next().unwrap().to_string();
                assert!(
                    holder.is_none(),
                    "store {i}: grant to {id} while {holder:?} holds the slot:\n{log}"
                );
                assert!(rest.ends_with("holds a slot in one"), "{line}");
                holder = Some(id);
                grants += 1;
            } else if let Some(rest) = line.split("release: ").nth(1) {
                let id = rest.split_whitespace().next().unwrap().to_string();
                assert_eq!(
                    holder.as_deref(),
                    Some(id.as_str()),
                    "store {i}: release by a non-holder:\n{log}"
                );
                assert!(rest.ends_with("gave back its slot in one"), "{line}");
                holder = None;
                releases += 1;
            }
        }
        assert_eq!(
            (grants, releases),
            (CLIENTS * ROUNDS, CLIENTS * ROUNDS),
            "store {i}:\n{log}"
        );
    }
}

/// `GET /v1/status` reports the server's start and its recent grants, releases, admin releases and expiries,
/// newest first, each with its group and holder; a release carries the holder as granted (`taken_at` is the
/// grant's), so the Reboots page can show how long the slot was held. File store, then the NATS store.
#[test]
fn status_reports_recent_lock_history() {
    const TTL: Duration = Duration::from_secs(3);
    let nats = fleet_rig::NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let stores = both_stores(dir.path(), &nats);
    let admin = [("authorization", "Bearer admin-secret")];
    for (i, store) in stores.iter().enumerate() {
        let cfg = dir.path().join(format!("recent-{i}.yaml"));
        // The TTL covers every group: the steps before the expiry take far less than it.
        std::fs::write(
            &cfg,
            format!(
                "{store}\nttl: {}s\nauth: {{admin_tokens: [admin-secret]}}\n\
                 groups: [{{name: one, slots: 1}}, {{name: two, slots: 1}}, {{name: three, slots: 1}}]\n",
                TTL.as_secs()
            ),
        )
        .unwrap();
        let s = ServerProcess::start(Path::new(BIN), &cfg).unwrap();
        let mut c = s.conn().unwrap();
        assert_eq!(c.fleetlock(true, "a", "one").unwrap().status, 200);
        assert_eq!(c.fleetlock(true, "b", "two").unwrap().status, 200);
        assert_eq!(c.fleetlock(false, "a", "one").unwrap().status, 200);
        let rel = br#"{"group":"two","id":"b","reason":"host b was reinstalled"}"#;
        let a = c.request("POST", "/v1/admin/release", &admin, rel).unwrap();
        assert_eq!(a.status, 200, "store {i}: {}", a.text());
        // c's slot runs out; d's grant in the same group expires it first.
        assert_eq!(c.fleetlock(true, "c", "three").unwrap().status, 200);
        // why: the TTL running out is the property (c's slot expires when d asks, not earlier)
        std::thread::sleep(TTL + Duration::from_millis(200));
        assert_eq!(c.fleetlock(true, "d", "three").unwrap().status, 200);

        let st = status(&mut c);
        let recent = st["recent"].as_array().unwrap();
        let seen: Vec<(&str, &str, &str)> = recent
            .iter()
            .map(|e| {
                (
                    e["kind"].as_str().unwrap(),
                    e["group"].as_str().unwrap(),
                    e["holder"]["id"].as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            seen,
            [
                ("granted", "three", "d"),
                ("expired", "three", "c"),
                ("granted", "three", "c"),
                ("admin-released", "two", "b"),
                ("released", "one", "a"),
                ("granted", "two", "b"),
                ("granted", "one", "a"),
            ],
            "store {i}: {st}"
        );
        let ts = |v: &serde_json::Value| {
            v.as_str()
                .unwrap()
                .parse::<fleet_wire::Timestamp>()
                .unwrap()
        };
        // Each release or expiry carries the holder as it was granted: its taken_at is the grant's.
        for (gone, granted) in [(4, 6), (3, 5), (1, 2)] {
            assert_eq!(
                recent[gone]["holder"], recent[granted]["holder"],
                "store {i}: {st}"
            );
            assert!(ts(&recent[gone]["at"]) >= ts(&recent[granted]["holder"]["taken_at"]));
        }
        assert_eq!(recent[0]["holder"]["ip"], "127.0.0.1");
        let held = ts(&recent[1]["at"]).since(ts(&recent[1]["holder"]["taken_at"]));
        assert!(held >= TTL, "store {i}: c held its slot {held:?}");
        // Newest first; the server started before all of it.
        let ats: Vec<_> = recent.iter().map(|e| ts(&e["at"])).collect();
        assert!(ats.windows(2).all(|w| w[0] >= w[1]), "store {i}: {st}");
        let started = ts(&st["started_at"]);
        assert!(started <= ats[ats.len() - 1], "store {i}: {st}");
    }
}
