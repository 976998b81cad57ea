//! fleet-auth against a real nats-server 2.10+ with `auth_callout` and a local HTTPS JWKS issuer (RSA and EC keys):
//! every denial has its reason in fleet-auth's log and nats-server's log (the client is told "Authorization
//! Violation": nats-server does not pass the callout's reason to clients); JWKS rotation works without a restart;
//! an unreachable or oversize JWKS fails closed; a real agent with a token file runs normally, rotates its token
//! on reconnect, and can neither read nor write another device's keys nor hear its replies.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use fleet_rig::nats_client as nats;
mod auth_common;

use auth_common::*;
use fleet_rig::tls::TestCa;
use fleet_rig::wait_for;
use fleet_wire::kv;
use serde_json::json;
use std::time::Duration;

const IMAGE: &str = "localhost/busybox:auth-test";

/// Connects with `token`, expects a refusal, and waits for `reason` in fleet-auth's log (and nats-server's).
fn expect_denied(stack: &Stack, token: &str, reason: &str) {
    match connect_device(&stack.nats.url(), token) {
        Ok(_) => panic!("connected although the token should be refused ({reason})"),
        Err(e) => assert!(
            e.to_lowercase().contains("authorization violation"),
            "client error for {reason}: {e}"
        ),
    }
    let seen = wait_for(Duration::from_secs(5), || {
        let log = stack.auth_log_text();
        log.lines()
            .any(|l| l.contains("denied client") && l.contains(reason))
            .then_some(())
    });
    assert!(
        seen.is_some(),
        "no denial with {reason:?} in fleet-auth's log:\n{}",
        stack.auth_log_text()
    );
    let in_server_log = wait_for(Duration::from_secs(5), || {
        stack.nats_log_text().contains(reason).then_some(())
    });
    assert!(
        in_server_log.is_some(),
        "nats-server's log lacks {reason:?}:\n{}",
        stack.nats_log_text()
    );
}

fn expect_allowed(stack: &Stack, token: &str, device: &str) -> Device {
    let d = connect_device(&stack.nats.url(), token)
        .unwrap_or_else(|e| panic!("{device} refused: {e}\n{}", stack.auth_log_text()));
    assert!(stack
        .auth_log_text()
        .contains(&format!("as device {device}")));
    d
}

#[test]
fn tokens_are_verified_and_every_denial_says_why() {
    let ca = TestCa::new();
    let keydir = tempfile::tempdir().expect("tmp");
    let rsa = SignKey::rsa("rsa-1", keydir.path());
    let ec = SignKey::ec("ec-1");
    let mut jwks = Jwks::start(&ca, &[&rsa, &ec]);
    let mut stack = Stack::start(&ca, &jwks.url(), false);

    // Valid tokens signed with either key are admitted, as the device named by the claim.
    expect_allowed(&stack, &rsa.sign(&claims("dev-rsa", 600)), "dev-rsa");
    expect_allowed(&stack, &ec.sign(&claims("dev-ec", 600)), "dev-ec");

    // Each refusal, with its reason.
    let stranger = SignKey::ec("ec-1");
    expect_denied(
        &stack,
        &stranger.sign(&claims("dev-a", 600)),
        "bad token signature",
    );
    expect_denied(
        &stack,
        &ec.sign_as("nope", &claims("dev-a", 600)),
        "unknown signing key id \"nope\"",
    );
    let mut c = claims("dev-a", 600);
    c["exp"] = json!(now() - 30);
    expect_denied(&stack, &ec.sign(&c), "token expired");
    let mut c = claims("dev-a", 600);
    c["nbf"] = json!(now() + 120);
    expect_denied(&stack, &rsa.sign(&c), "token not valid yet");
    let mut c = claims("dev-a", 600);
    c["iss"] = json!("https://evil.test");
    expect_denied(&stack, &ec.sign(&c), "wrong token issuer");
    let mut c = claims("dev-a", 600);
    c["aud"] = json!("another-project");
    expect_denied(&stack, &ec.sign(&c), "wrong token audience");
    let mut c = claims("dev-a", 600);
    c.as_object_mut().unwrap().remove("device_id");
    expect_denied(&stack, &ec.sign(&c), "token has no device id claim");
    for bad in ["dev.a", "dev*", ">", "dev a"] {
        expect_denied(
            &stack,
            &ec.sign(&claims(bad, 600)),
            &format!("token device id rejected: invalid device id: {bad:?}"),
        );
    }
    expect_denied(&stack, "not-a-jwt", "token is malformed");
    // No token at all.
    match nats::Options::new().connect(stack.nats.url().as_str()) {
        Ok(_) => panic!("connected without credentials"),
        Err(e) => assert!(e
            .to_string()
            .to_lowercase()
            .contains("authorization violation")),
    }
    assert!(stack
        .auth_log_text()
        .contains("no token in the connect options"));

    // Key rotation: a new kid is fetched on first use, without restarting fleet-auth.
    let ec2 = SignKey::ec("ec-2");
    jwks.set(&[&rsa, &ec2]);
    expect_allowed(
        &stack,
        &ec2.sign(&claims("dev-rotated", 600)),
        "dev-rotated",
    );

    // An oversize JWKS is refused (fail closed) when a refetch is needed.
    let mut big = json!({"keys": [ec2.jwk.clone()]}).to_string();
    big.push_str(&" ".repeat(10_000));
    jwks.set_raw(big.into_bytes());
    expect_denied(
        &stack,
        &ec.sign_as("ec-9", &claims("dev-a", 600)),
        "larger than 8192 bytes",
    );

    // JWKS unreachable: a fresh fleet-auth with no cached keys refuses even a well-signed token.
    jwks.server = None;
    stack.start_auth();
    expect_denied(&stack, &ec2.sign(&claims("dev-a", 600)), "JWKS unavailable");

    // No token or key material in fleet-auth's log.
    let log = stack.auth_log_text();
    let token = ec2.sign(&claims("dev-a", 600));
    let sig_part = token.rsplit('.').next().unwrap();
    assert!(
        !log.contains(&sig_part[..16]) && !log.contains("eyJ"),
        "{log}"
    );
    assert!(!log.contains(&stack.issuer.seed().unwrap()[..12]));
}

/// Waits for `bucket/key` to exist (via the admin connection) and returns its JSON; `agent` (its log) explains a
/// time-out.
fn wait_key(
    admin: &nats::Connection,
    bucket: &str,
    key: &str,
    agent: &AgentProc,
) -> serde_json::Value {
    let store = nats::jetstream::new(admin.clone())
        .key_value(bucket)
        .expect("bucket");
    wait_for(Duration::from_secs(30), || {
        store
            .get(key)
            .ok()
            .flatten()
            .and_then(|b| serde_json::from_slice(&b).ok())
    })
    .unwrap_or_else(|| {
        panic!(
            "{bucket}/{key} never written; agent log:\n{}",
            agent.log_text()
        )
    })
}

#[test]
fn a_device_runs_with_its_token_and_cannot_reach_another_device() {
    let ca = TestCa::new();
    let ec = SignKey::ec("ec-1");
    let _jwks = Jwks::start(&ca, &[&ec]);
    // This stack encrypts callout requests and answers with xkeys.
    let stack = Stack::start(&ca, &_jwks.url(), true);

    // The operator's own credentials (an auth_users user) create the buckets: the real `fleet-operator buckets`.
    make_buckets(&stack.admin_url(), None);
    // Without valid credentials the callout refuses the operator, and its error does not show the password.
    let (ok, text) = operator_buckets(&stack.admin_url().replace("admin:", "nobody:"), None);
    assert!(!ok, "an unknown user made buckets: {text}");
    assert!(!text.contains(&stack.admin_password), "{text}");
    // fleetlock-server's NATS store connects with its own user too (here the same auth_users entry).
    let rt = tokio::runtime::Runtime::new().expect("rt");
    rt.block_on(async {
        fleetlock_server::store::nats::NatsStore::open(&stack.admin_url(), None)
            .await
            .expect("fleetlock store connects with its own credentials");
    });
    let admin = stack.admin();

    // Device A reconciles real containers (rootful Podman, a test image); B runs with Podman off.
    let podman = fleet_rig::podman::PodmanService::start();
    podman.import_busybox(IMAGE);
    // The agent binary first: building it may take longer than A's short-lived token lives.
    fleet_vm_tests::builds::agent(fleet_vm_tests::builds::V1);
    // Device A: a short-lived token that is rotated on disk while the agent runs.
    let tokens = tempfile::tempdir().expect("tmp");
    let token_a = tokens.path().join("a.token");
    write_token(&token_a, &ec.sign(&claims("dev-a", 10)));
    let token_b = tokens.path().join("b.token");
    write_token(&token_b, &ec.sign(&claims("dev-b", 600)));
    let agent_a = AgentProc::start("dev-a", &stack.nats.url(), &token_a, Some(&podman.socket()));
    let agent_b = AgentProc::start("dev-b", &stack.nats.url(), &token_b, None);

    // Both agents run: device info, heartbeats, and a reconcile of their desired state.
    wait_key(&admin, kv::DEVICE_INFO, "dev-a", &agent_a);
    wait_key(&admin, kv::DEVICE_HEARTBEAT, "dev-a", &agent_a);
    wait_key(&admin, kv::DEVICE_HEARTBEAT, "dev-b", &agent_b);

    // A's token is rotated on disk; when the old one expires (10 s) the server disconnects the agent, which
    // reconnects with the new one: one reconnect, no restart.
    write_token(&token_a, &ec.sign(&claims("dev-a", 600)));
    let reconnected = wait_for(Duration::from_secs(30), || {
        (stack.auth_log_text().matches("as device dev-a").count() >= 2
            && agent_a.log_text().contains("reconnected to NATS"))
        .then_some(())
    });
    assert!(
        reconnected.is_some(),
        "agent A did not reconnect with its rotated token:\n{}\n{}",
        agent_a.log_text(),
        stack.auth_log_text()
    );
    let hb = |admin: &nats::Connection| {
        nats::jetstream::new(admin.clone())
            .key_value(kv::DEVICE_HEARTBEAT)
            .unwrap()
            .entry("dev-a")
            .unwrap()
            .map(|e| e.revision)
    };
    let before = hb(&admin);
    let after = wait_for(Duration::from_secs(10), || {
        hb(&admin).filter(|r| Some(*r) > before)
    });
    assert!(
        after.is_some(),
        "dev-a stopped heartbeating after the token rotation"
    );
    let put = |device: &str, generation: u64, workloads: Vec<fleet_wire::WorkloadSpec>| {
        let d = fleet_wire::DesiredState::new(
            fleet_wire::DeviceId::try_from(device).unwrap(),
            generation,
            workloads,
        )
        .unwrap();
        nats::jetstream::new(admin.clone())
            .key_value(kv::DESIRED_STATE)
            .unwrap()
            .put(device, serde_json::to_vec(&d).unwrap())
            .unwrap();
    };
    let mut web =
        fleet_wire::WorkloadSpec::new(fleet_wire::WorkloadName::try_from("web").unwrap(), IMAGE)
            .unwrap();
    web.command = vec!["sleep".into(), "1000".into()];
    put("dev-a", 3, vec![web]);
    let mut secret =
        fleet_wire::WorkloadSpec::new(fleet_wire::WorkloadName::try_from("db").unwrap(), IMAGE)
            .unwrap();
    secret
        .env
        .insert("DB_PASSWORD".into(), "dev-b-secret".into());
    put("dev-b", 5, vec![secret]);
    let running = || {
        let v: serde_json::Value = nats::jetstream::new(admin.clone())
            .key_value(kv::WORKLOAD_STATUS)
            .unwrap()
            .get("dev-a")
            .ok()
            .flatten()
            .and_then(|b| serde_json::from_slice(&b).ok())?;
        (v["generation"] == 3 && v["workloads"][0]["state"] == "running").then_some(())
    };
    wait_for(Duration::from_secs(60), running)
        .unwrap_or_else(|| panic!("dev-a did not reconcile:\n{}", agent_a.log_text()));
    let b_saw = wait_for(Duration::from_secs(30), || {
        agent_b
            .log_text()
            .contains("desired state generation 5")
            .then_some(())
    });
    assert!(
        b_saw.is_some(),
        "dev-b did not read its desired state:\n{}",
        agent_b.log_text()
    );

    // A's own connection, subscribed to everything it may: its inbox (which A's agent's replies also use) and the
    // subjects of its own keys (which carry every write to them).
    let a = connect_device(&stack.nats.url(), &ec.sign(&claims("dev-a", 600))).expect("dev-a");
    let allowed =
        fleet_wire::auth::device_permissions(&fleet_wire::DeviceId::try_from("dev-a").unwrap());
    let subs: Vec<_> = allowed
        .subscribe
        .iter()
        .map(|s| a.conn.subscribe(s).expect("allowed subscription"))
        .collect();
    for forbidden in [
        ">",
        "_INBOX.>",
        "_INBOX.device.dev-b.>",
        "$KV.>",
        "$KV.device-desired-state.dev-b",
    ] {
        let _ = a.conn.subscribe(forbidden);
        assert!(
            a.wait_error(
                &format!("Permissions Violation for Subscription to \"{forbidden}\""),
                Duration::from_secs(5)
            ),
            "subscribing to {forbidden} was not refused: {:?}",
            a.errors.lock().unwrap()
        );
    }
    // A cannot read B's desired state (direct get or stream message get) nor create any consumer.
    for subject in [
        "$JS.API.DIRECT.GET.KV_device-desired-state.$KV.device-desired-state.dev-b",
        "$JS.API.DIRECT.GET.KV_device-desired-state",
        "$JS.API.STREAM.MSG.GET.KV_device-desired-state",
        "$JS.API.CONSUMER.CREATE.KV_device-desired-state",
        "$JS.API.CONSUMER.CREATE.KV_device-desired-state.x.$KV.device-desired-state.dev-a",
        "$JS.API.CONSUMER.CREATE.KV_device-desired-state.x.$KV.device-desired-state.>",
        "$JS.API.CONSUMER.DURABLE.CREATE.KV_device-desired-state.x",
    ] {
        a.conn
            .publish_request(
                subject,
                "_INBOX.device.dev-a.probe",
                br#"{"last_by_subj":"$KV.device-desired-state.dev-b"}"#,
            )
            .expect("publish");
        assert!(
            a.wait_error(
                &format!("Permissions Violation for Publish to \"{subject}\""),
                Duration::from_secs(5)
            ),
            "{subject} was not refused: {:?}",
            a.errors.lock().unwrap()
        );
    }
    // A cannot write B's keys (nor the keys the operator writes for A).
    for subject in [
        "$KV.agent-upgrade-intent.dev-b",
        "$KV.agent-upgrade-status.dev-b",
        "$KV.device-heartbeat.dev-b",
        "$KV.system-upgrade-status.dev-b.6f1c2b9e-8d0a-4c55-9a77-3f2e1d0c9b8a",
        "$KV.device-desired-state.dev-a",
        "$KV.agent-upgrade-intent.dev-a",
    ] {
        a.conn
            .publish(subject, b"{\"forged\":true}")
            .expect("publish");
        assert!(
            a.wait_error(
                &format!("Permissions Violation for Publish to \"{subject}\""),
                Duration::from_secs(5)
            ),
            "{subject} was not refused"
        );
    }
    // Nor through the reply subject of a request it may make: JetStream's answers (a put's acknowledgement, a
    // direct get's message) stay in the devices' account and never land on a key.
    let desired = nats::jetstream::new(admin.clone())
        .key_value(kv::DESIRED_STATE)
        .unwrap();
    let b_desired = desired.entry("dev-b").unwrap().map(|e| e.revision);
    let run = "6f1c2b9e-8d0a-4c55-9a77-3f2e1d0c9b8a";
    let targets = [
        "$KV.agent-upgrade-intent.dev-b".to_owned(),
        "$KV.device-desired-state.dev-b".to_owned(),
        format!("$KV.system-upgrade-status.dev-b.{run}"),
        format!("$KV.system-upgrade-intent.dev-b.{run}"),
    ];
    for target in &targets {
        a.conn
            .publish_request("$KV.device-info.dev-a", target, b"{\"forged\":true}")
            .expect("put");
        a.conn
            .publish_request(
                "$JS.API.DIRECT.GET.KV_device-info.$KV.device-info.dev-a",
                target,
                b"",
            )
            .expect("get");
    }
    a.conn.flush().expect("flush");
    // why: that JetStream's answers never land on B's keys is a non-event: a second for them to arrive if they could.
    std::thread::sleep(Duration::from_secs(1));
    let js = nats::jetstream::new(admin.clone());
    assert_eq!(
        js.key_value(kv::AGENT_UPGRADE_INTENT)
            .unwrap()
            .entry("dev-b")
            .unwrap()
            .map(|e| e.revision),
        None,
        "B's intent was written"
    );
    assert_eq!(
        desired.entry("dev-b").unwrap().map(|e| e.revision),
        b_desired,
        "B's desired state changed"
    );
    for bucket in [kv::SYSTEM_UPGRADE_STATUS, kv::SYSTEM_UPGRADE_INTENT] {
        let key = format!("dev-b.{run}");
        assert_eq!(
            js.key_value(bucket)
                .unwrap()
                .entry(&key)
                .unwrap()
                .map(|e| e.revision),
            None,
            "{bucket}/{key} was written"
        );
    }

    // While B works (heartbeats every second), A hears only its own agent's traffic.
    // why: a listening window (four of B's heartbeats) that must bring nothing of B's.
    std::thread::sleep(Duration::from_secs(4));
    let mut seen = 0;
    for sub in &subs {
        while let Ok(m) = sub.next_timeout(Duration::from_millis(100)) {
            seen += 1;
            let text = String::from_utf8_lossy(&m.data);
            assert!(
                !text.contains("dev-b") && !m.subject.contains("dev-b"),
                "A heard B on {}: {text}",
                m.subject
            );
        }
    }
    assert!(
        seen > 0,
        "A's subscriptions saw none of its own agent's traffic"
    );

    // Leave no container behind.
    put("dev-a", 4, vec![]);
    let gone = wait_for(Duration::from_secs(30), || {
        let out = podman.podman(&["ps", "-a", "--format", "{{.Names}}"]);
        (!out.contains("web")).then_some(())
    });
    assert!(
        gone.is_some(),
        "the workload was not removed:\n{}",
        agent_a.log_text()
    );
    drop(agent_b);
}

/// A device session that records whether the server ended it: no reconnects, so an ended session stays ended.
struct Session {
    conn: nats::Connection,
    ended: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Session {
    fn open(url: &str, token: &str) -> Result<Self, String> {
        use std::sync::atomic::{AtomicBool, Ordering};
        let ended = std::sync::Arc::new(AtomicBool::new(false));
        let (on_disconnect, on_close) = (ended.clone(), ended.clone());
        nats::Options::with_token(token)
            .with_name("session-test")
            // Counts attempts, the first connection included: one, so an ended session is not made anew.
            .max_reconnects(1)
            .disconnect_callback(move || on_disconnect.store(true, Ordering::SeqCst))
            .close_callback(move || on_close.store(true, Ordering::SeqCst))
            .connect(url)
            .map(|conn| Self { conn, ended })
            .map_err(|e| e.to_string())
    }

    /// Whether the server still serves it: not ended, and a round trip answers.
    fn alive(&self) -> bool {
        !self.ended.load(std::sync::atomic::Ordering::SeqCst)
            && self.conn.flush_timeout(Duration::from_secs(2)).is_ok()
    }
}

/// Sets fleet-auth's `leeway_secs` (the stack starts with 2) and restarts it.
fn set_leeway(stack: &mut Stack, secs: u64) {
    let text = std::fs::read_to_string(&stack.auth_config).expect("config");
    assert!(text.contains("leeway_secs: 2\n"), "{text}");
    std::fs::write(
        &stack.auth_config,
        text.replace("leeway_secs: 2\n", &format!("leeway_secs: {secs}\n")),
    )
    .expect("config");
    stack.start_auth();
}

/// fleet-auth's decision about `device` as logged: `Some(Ok(session end))` for "allowed … until <time>",
/// `Some(Err(line))` for any other line about it.
fn logged(stack: &Stack, device: &str) -> Option<Result<u64, String>> {
    let log = stack.auth_log_text();
    let line = log
        .lines()
        .rev()
        .find(|l| l.contains(&format!("as device {device} ")) || l.contains(device))?;
    let until = line
        .split_once(&format!("as device {device} until "))
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .and_then(|t| humantime::parse_rfc3339(t).ok())
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_secs());
    Some(until.ok_or_else(|| line.to_owned()))
}

/// What fleet-auth logs is what nats-server does, for every token expiry: a token inside the leeway gets a session
/// that lasts until `exp` + leeway; one whose session would be too short, or that expired beyond the leeway, is
/// refused with its reason; far and huge expiries (beyond nats-server's 64-bit timer and `exp`) get a session capped
/// at 24 h instead of one the server refuses or ends at once.
#[test]
fn fleet_auth_admits_exactly_the_sessions_nats_server_keeps() {
    const YEAR: u64 = 365 * 86400;
    const CAP: u64 = 24 * 3600;
    let ca = TestCa::new();
    let ec = SignKey::ec("ec-1");
    let jwks = Jwks::start(&ca, &[&ec]);
    let mut stack = Stack::start(&ca, &jwks.url(), false);
    set_leeway(&mut stack, 60);
    let t = now();
    // (device, exp, the session end fleet-auth must log: within lo..=hi)
    let admitted: Vec<(&str, serde_json::Value, u64, u64)> = vec![
        ("dev-leeway", json!(t - 30), t + 30, t + 30),
        ("dev-now", json!(t), t + 60, t + 60),
        ("dev-fraction", json!(t as f64 + 600.5), t + 660, t + 660),
        ("dev-far", json!(t + 300 * YEAR), t + CAP, t + CAP + 10),
        ("dev-i64", json!(i64::MAX), t + CAP, t + CAP + 10),
        ("dev-u64", json!(u64::MAX), t + CAP, t + CAP + 10),
    ];
    let mut problems = Vec::new();
    let mut sessions = Vec::new();
    for (device, exp, lo, hi) in &admitted {
        let mut c = claims(device, 600);
        c["exp"] = exp.clone();
        match Session::open(&stack.nats.url(), &ec.sign(&c)) {
            Ok(s) => sessions.push((*device, *lo, *hi, s)),
            Err(e) => problems.push(format!(
                "{device} (exp {exp}): refused by nats-server ({e}); fleet-auth logged {:?}",
                logged(&stack, device)
            )),
        }
    }
    // Sessions the server ends at once (an overflowing timer) are gone after a few seconds.
    // why: the sessions that must stay are checked after the window in which a wrong expiry would end them
    std::thread::sleep(Duration::from_secs(3));
    for (device, lo, hi, s) in &sessions {
        if !s.alive() {
            problems.push(format!(
                "{device}: admitted, then ended by nats-server within 3 s"
            ));
        }
        match logged(&stack, device) {
            Some(Ok(until)) if (*lo..=*hi).contains(&until) => {}
            other => problems.push(format!(
                "{device}: fleet-auth should log a session until {lo}..={hi}, logged {other:?}"
            )),
        }
    }
    // Refused, with the reason in fleet-auth's log and nats-server's.
    let refused = [
        (
            "dev-short",
            58,
            "token expires within 5s even with the 60s leeway",
        ),
        ("dev-gone", 61, "token expired"),
    ];
    for (device, ago, reason) in refused {
        let mut c = claims(device, 600);
        c["exp"] = json!(now() - ago);
        let connected = Session::open(&stack.nats.url(), &ec.sign(&c)).is_ok();
        let said = wait_for(Duration::from_secs(5), || {
            let log = stack.auth_log_text();
            log.lines()
                .any(|l| l.contains("denied client") && l.contains(reason))
                .then_some(())
        });
        if connected || said.is_none() {
            problems.push(format!(
                "{device} (exp now-{ago}): connected {connected}, fleet-auth's last line {:?} (want a denial: \
                 {reason})",
                stack.auth_log_text().lines().last()
            ));
        }
    }
    let server_said: Vec<String> = stack
        .nats_log_text()
        .lines()
        .filter(|l| !l.contains("[INF]") && !l.contains("authentication error"))
        .map(str::to_owned)
        .collect();
    assert!(
        problems.is_empty(),
        "{}\nnats-server's log:\n{}",
        problems.join("\n"),
        server_said.join("\n")
    );
}

/// An ES256 token for `device` of as close to `len` bytes as base64 allows (at most `len`).
fn sized_token(key: &SignKey, device: &str, len: usize) -> String {
    let mut pad = len * 3 / 4;
    loop {
        let mut c = claims(device, 600);
        c["pad"] = json!("x".repeat(pad));
        let t = key.sign(&c);
        if t.len() <= len {
            return t;
        }
        pad -= 1;
    }
}

/// nats-server reads a CONNECT only up to its `max_control_line`; the rig's configuration (as docs/auth.md's) sets
/// it so that the largest token the agent and fleet-auth take gets through to the callout, and one byte more is
/// refused by fleet-auth with its reason.
#[test]
fn a_16_kib_token_connects_through_the_callout() {
    let ca = TestCa::new();
    let ec = SignKey::ec("ec-1");
    let jwks = Jwks::start(&ca, &[&ec]);
    let stack = Stack::start(&ca, &jwks.url(), false);
    let max = fleet_wire::auth::NATS_TOKEN_MAX_BYTES;
    for (device, len) in [("dev-15k", 15 * 1024), ("dev-16k", max)] {
        let token = sized_token(&ec, device, len);
        assert!(token.len() + 4 > len, "{}", token.len());
        let d = expect_allowed(&stack, &token, device);
        d.conn.flush().expect("the device's session answers");
    }
    let mut c = claims("dev-over", 600);
    c["pad"] = json!("x".repeat(max * 3 / 4));
    let over = ec.sign(&c);
    assert!(over.len() > max);
    expect_denied(&stack, &over, &format!("larger than {max} bytes"));
}

/// A restarted nats-server has fleet-auth subscribed again before devices come back: a device connecting half a
/// second after the server listens again (the agent waits at least a second) is admitted at its first attempt.
/// (Alone, quiet, fleet-auth came back in time also before its reconnection pause was capped at 100 ms; under a
/// storm it did not: `scripts/bench auth`'s fleet-sim storm counts the refusals.)
#[test]
fn a_device_coming_back_after_a_server_restart_is_admitted_at_its_first_attempt() {
    let ca = TestCa::new();
    let ec = SignKey::ec("ec-1");
    let jwks = Jwks::start(&ca, &[&ec]);
    let mut stack = Stack::start(&ca, &jwks.url(), false);
    let token = ec.sign(&claims("dev-back", 600));
    drop(expect_allowed(&stack, &token, "dev-back"));
    for round in 1..=2 {
        stack.nats.start_again_after(Duration::from_secs(2));
        // why: the claim is a bound: a device's session is admitted at most 0.5 s after the server is back.
        std::thread::sleep(Duration::from_millis(500));
        let d = connect_device(&stack.nats.url(), &token).unwrap_or_else(|e| {
            panic!(
                "round {round}: refused 0.5 s after the server came back: {e}\n{}",
                stack.auth_log_text()
            )
        });
        d.conn.flush().expect("the device's session answers");
    }
}

/// Runs `cmd` for at most 15 s; its exit code (None: still running, then killed) and stderr.
fn run_bounded(mut cmd: std::process::Command) -> (Option<i32>, String) {
    let mut child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let status = wait_for(Duration::from_secs(15), || child.try_wait().ok().flatten());
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut err);
    }
    (status.and_then(|s| s.code()), err)
}

/// A copied example whose password variable was never substituted stops fleet-auth, fleet-operator and
/// fleetlock-server at start with the reason, instead of connecting with a password printed in the docs.
#[test]
fn services_refuse_a_placeholder_password_at_start() {
    let ca = TestCa::new();
    let ec = SignKey::ec("ec-1");
    let jwks = Jwks::start(&ca, &[&ec]);
    let mut stack = Stack::start(&ca, &jwks.url(), false);
    stack.stop_auth();
    let port = stack.nats.port();
    let mut problems = Vec::new();
    let mut check = |what: &str, cmd: std::process::Command, placeholder: &str| {
        let (code, err) = run_bounded(cmd);
        let said = format!("{placeholder:?}, a placeholder, not a password");
        if code != Some(2) || !err.contains(&said) {
            problems.push(format!("{what}: exit {code:?}, stderr {err:?}"));
        }
    };

    std::fs::write(
        stack.dir.path().join("auth-password"),
        "$FLEET_AUTH_PASSWORD\n",
    )
    .expect("password file");
    let mut auth = std::process::Command::new(fleet_auth_bin());
    auth.arg("--config").arg(&stack.auth_config);
    check("fleet-auth", auth, "$FLEET_AUTH_PASSWORD");

    let operator = fleet_vm_tests::builds::operator();
    for args in [&[][..], &["buckets"][..]] {
        let mut op = std::process::Command::new(&operator);
        op.args(args)
            .env(
                "FLEET_NATS_URL",
                format!("nats://fleet-operator:$OPERATOR_PASSWORD@127.0.0.1:{port}"),
            )
            .env("KUBECONFIG", stack.dir.path().join("no-kubeconfig"));
        check(
            &format!("fleet-operator {args:?}"),
            op,
            "$OPERATOR_PASSWORD",
        );
    }
    let mut op = std::process::Command::new(&operator);
    op.args([
        "buckets",
        "--nats-url",
        &format!("nats://fleet-operator:${{OPERATOR_PASSWORD}}@127.0.0.1:{port}"),
    ]);
    check("fleet-operator --nats-url", op, "${OPERATOR_PASSWORD}");

    let config = stack.dir.path().join("fleetlock.yaml");
    std::fs::write(
        &config,
        format!(
            "store: {{kind: nats, url: 'nats://fleetlock:$(FLEETLOCK_PASSWORD)@127.0.0.1:{port}'}}\n"
        ),
    )
    .expect("fleetlock config");
    let mut fl = std::process::Command::new(fleet_vm_tests::builds::fleetlock_server());
    fl.args(["--plain-http", "--listen"])
        .arg(format!("127.0.0.1:{}", fleet_rig::free_port()))
        .arg("--config")
        .arg(&config);
    check("fleetlock-server", fl, "$(FLEETLOCK_PASSWORD)");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// A nats-server started by a test from its own configuration and environment; killed on drop.
struct DocServer(std::process::Child);

impl Drop for DocServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// docs/auth.md's nats-server example is safe to copy as it is: without the password variables nats-server refuses
/// to start; with them (and its files and port) it starts, listens with TLS, and each service user's password is
/// the variable's value, not the text of the example.
#[test]
fn the_documented_server_config_takes_its_passwords_from_the_environment() {
    let doc =
        std::fs::read_to_string(fleet_rig::workspace_root().join("docs/auth.md")).expect("docs");
    let section = doc
        .split_once("## nats-server configuration")
        .expect("section")
        .1;
    let example = section
        .split_once("```\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .expect("the example")
        .0;
    let ca = TestCa::new();
    let dir = tempfile::tempdir().expect("tmp");
    let write = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).expect("write");
        p
    };
    let vars = [
        "FLEET_AUTH_PASSWORD",
        "OPERATOR_PASSWORD",
        "FLEETLOCK_PASSWORD",
        "DEVICE_API_PASSWORD",
        "DEVICE_KV_PASSWORD",
        "FLOOD_GUARD_PASSWORD",
    ];
    let nats_server = || {
        let mut c = std::process::Command::new(fleet_rig::NatsServer::binary());
        for v in vars {
            c.env_remove(v);
        }
        c
    };

    // Verbatim, without the variables.
    let verbatim = write("verbatim.conf", example);
    let mut c = nats_server();
    c.arg("-c").arg(&verbatim).arg("-t");
    let (code, err) = run_bounded(c);
    assert!(
        code.is_some_and(|c| c != 0)
            && err.contains("variable reference for 'FLEET_AUTH_PASSWORD'"),
        "the verbatim example did not refuse to start: {code:?} {err}"
    );

    // With the variables, its certificate, store, issuer and a port of this machine.
    let cert = ca.server_cert("nats-server");
    let port = fleet_rig::free_port();
    let issuer = nkeys::KeyPair::new_account().public_key();
    let mut conf = example.to_owned();
    for (from, to) in [
        ("listen: 0.0.0.0:4222", format!("listen: 127.0.0.1:{port}")),
        ("/etc/nats/server.crt", cert.cert_file.display().to_string()),
        ("/etc/nats/server.key", cert.key_file.display().to_string()),
        (
            "/var/lib/nats",
            dir.path().join("store").display().to_string(),
        ),
        ("\"A…\"", format!("\"{issuer}\"")),
    ] {
        assert!(conf.contains(from), "the example has no {from:?}");
        conf = conf.replace(from, &to);
    }
    let conf = write("nats.conf", &conf);
    let passwords = [
        "authPw1x",
        "operatorPw2y",
        "fleetlockPw3z",
        "deviceApiPw4w",
        "deviceKvPw5v",
        "floodGuardPw6u",
    ];
    let mut c = nats_server();
    c.arg("-c").arg(&conf);
    for (v, p) in vars.iter().zip(passwords) {
        c.env(v, p);
    }
    let _server = DocServer(
        c.stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("nats-server"),
    );
    let up = wait_for(Duration::from_secs(10), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).ok()
    });
    assert!(up.is_some(), "the documented configuration did not start");
    let url = format!("tls://127.0.0.1:{port}");
    let connect = |user: &str, password: &str| {
        nats::Options::with_user_pass(user, password)
            .tls_required(true)
            .add_root_certificate(ca.ca_file())
            .connect(url.as_str())
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    for ((user, var), password) in [
        "fleet-auth",
        "fleet-operator",
        "fleetlock",
        "fleet-device-api",
        "fleet-device-kv",
        "fleet-auth-system",
    ]
    .into_iter()
    .zip(vars)
    .zip(passwords)
    {
        assert_eq!(
            connect(user, password),
            Ok(()),
            "{user} with ${var}'s value"
        );
        let literal = connect(user, &format!("${var}"));
        assert!(
            literal
                .as_ref()
                .is_err_and(|e| e.to_lowercase().contains("authorization violation")),
            "{user} with the literal ${var}: {literal:?}"
        );
    }
}
