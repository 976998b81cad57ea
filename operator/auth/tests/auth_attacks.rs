//! Attacks by a device that holds one valid token (issue "One device can never harm another", docs/auth.md threat
//! model), against a real nats-server with the fleet-auth callout and device API, the real fleet-auth, and a real
//! agent as the victim where the victim's side matters:
//!
//! - every header JetStream or KV honours, on a write of every bucket a device writes, changes no other device's
//!   keys (revision and value);
//! - answers aimed at another device's subjects (direct gets of a large value of one's own, writes, watch
//!   registrations, with the reply subject set to the victim's old watch subjects and its inboxes), sustained for
//!   60 s: the victim agent never disconnects and notices every change of its desired state within seconds;
//! - floods of run keys, of oversize values and of writes: refused once over the attacker's share, with a report on
//!   `fleet.device-refusals.<device>`, and nothing of another device's changes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use fleet_rig::nats_client as nats;
mod auth_common;

use auth_common::*;
use fleet_rig::tls::TestCa;
use fleet_rig::wait_for;
use fleet_wire::kv;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const RUN_C: &str = "3c1e0a5b-8f2d-4b7a-9c6e-1d2f3a4b5c6d";
const RUN_A: &str = "0a5b3c1e-8f2d-4b7a-9c6e-1d2f3a4b5c6d";

/// The stack, its buckets, and a bystander device `dev-c` (never connected) with a key in every bucket keyed by
/// device.
struct Fleet {
    stack: Stack,
    ec: SignKey,
    _jwks: Jwks,
    admin: nats::Connection,
}

impl Fleet {
    fn start() -> Self {
        let ca = TestCa::new();
        let ec = SignKey::ec("ec-1");
        let jwks = Jwks::start(&ca, &[&ec]);
        let stack = Stack::start(&ca, &jwks.url(), false);
        make_buckets(&stack.admin_url(), None);
        let admin = stack.admin();
        let f = Self {
            stack,
            ec,
            _jwks: jwks,
            admin,
        };
        for spec in kv::BUCKETS {
            if let Some(key) = f.bystander_key(spec) {
                f.kv(spec.name)
                    .put(&key, format!("dev-c's {} value", spec.name).into_bytes())
                    .expect("bystander key");
            }
        }
        f
    }

    fn kv(&self, bucket: &str) -> nats::kv::Store {
        nats::jetstream::new(self.admin.clone())
            .key_value(bucket)
            .expect("bucket")
    }

    fn bystander_key(&self, spec: &kv::BucketSpec) -> Option<String> {
        match spec.key {
            kv::KeyShape::Device => Some("dev-c".into()),
            kv::KeyShape::DeviceRun => Some(format!("dev-c.{RUN_C}")),
            _ => None,
        }
    }

    /// Every key of `dev-c`: bucket → (revision, value).
    fn bystander(&self) -> BTreeMap<&'static str, (u64, Vec<u8>)> {
        kv::BUCKETS
            .iter()
            .filter_map(|spec| {
                let key = self.bystander_key(spec)?;
                let e = self
                    .kv(spec.name)
                    .entry(&key)
                    .expect("read")
                    .unwrap_or_else(|| panic!("dev-c's key in {} is gone", spec.name));
                assert_eq!(
                    e.operation,
                    nats::kv::Operation::Put,
                    "dev-c's key in {} was deleted or purged",
                    spec.name
                );
                Some((spec.name, (e.revision, e.value)))
            })
            .collect()
    }

    fn token(&self, device: &str) -> String {
        self.ec.sign(&claims(device, 3600))
    }

    fn attacker(&self) -> Device {
        connect_device(&self.stack.nats.url(), &self.token("dev-a")).expect("dev-a connects")
    }
}

/// A request from the attacker's own connection on its own inbox; the answer's body (empty on time-out).
fn ask(
    a: &Device,
    subject: &str,
    headers: Option<&nats::header::HeaderMap>,
    body: &[u8],
) -> String {
    ask_as(a, "dev-a", subject, headers, body)
}

/// [`ask`] from device `id`'s connection `a`.
fn ask_as(
    a: &Device,
    id: &str,
    subject: &str,
    headers: Option<&nats::header::HeaderMap>,
    body: &[u8],
) -> String {
    let inbox = format!(
        "_INBOX.device.{id}.{}",
        nats::Connection::new_inbox(&a.conn)
            .rsplit('.')
            .next()
            .unwrap()
    );
    let sub = a.conn.subscribe(&inbox).expect("own inbox");
    a.conn
        .publish_with_reply_or_headers(subject, Some(&inbox), headers, body)
        .expect("publish");
    let got = sub
        .next_timeout(Duration::from_secs(5))
        .map(|m| String::from_utf8_lossy(&m.data).into_owned())
        .unwrap_or_default();
    let _ = sub.unsubscribe();
    got
}

#[test]
fn no_header_on_a_devices_write_changes_another_devices_keys() {
    let f = Fleet::start();
    // dev-a was given one run (a system upgrade's intent, a diagnostics request), so its run keys can be written
    // at all.
    for given in [kv::SYSTEM_UPGRADE_INTENT, kv::DIAGNOSTICS_REQUEST] {
        f.kv(given)
            .put(&format!("dev-a.{RUN_A}"), b"{}")
            .expect("run given");
    }
    let before = f.bystander();
    let a = f.attacker();
    let bystander_subject = |bucket: &str| format!("$KV.{bucket}.dev-c");
    let header_sets: Vec<Vec<(&str, String)>> = vec![
        vec![("Nats-Rollup", "all".into())],
        vec![("Nats-Rollup", "sub".into())],
        vec![
            ("KV-Operation", "PURGE".into()),
            ("Nats-Rollup", "sub".into()),
        ],
        vec![
            ("KV-Operation", "PURGE".into()),
            ("Nats-Rollup", "all".into()),
        ],
        vec![("KV-Operation", "DEL".into())],
        vec![("Nats-Expected-Stream", "KV_device-info".into())],
        vec![("Nats-Expected-Last-Sequence", "0".into())],
        vec![("Nats-Expected-Last-Subject-Sequence", "0".into())],
        vec![("Nats-Expected-Last-Msg-Id", "x".into())],
        vec![("Nats-Msg-Id", "dev-c-next".into())],
        vec![("Nats-TTL", "1s".into())],
        vec![("Nats-Incr", "1".into())],
        vec![
            ("Nats-Batch-Id", "b1".into()),
            ("Nats-Batch-Sequence", "1".into()),
            ("Nats-Batch-Commit", "1".into()),
        ],
        vec![
            ("Nats-Schedule", "@every 1s".into()),
            ("Nats-Schedule-Target", "BYSTANDER".into()),
        ],
        vec![("Nats-Required-Api-Level", "0".into())],
    ];
    let mut answers = Vec::new();
    // Every write must be taken: each bucket's batch waits, when the burst would not hold it, for the budget to
    // refill by a batch (15 header sets × 7 buckets are more than a burst of 100).
    let (burst, rate) = (
        fleet_wire::device_api::WRITE_BURST as usize,
        fleet_wire::device_api::WRITE_RATE_PER_SEC as usize,
    );
    let mut spent = 0;
    for spec in fleet_wire::device_api::written_buckets() {
        if spent + header_sets.len() > burst {
            // why: pacing to the device API's write budget (the refill time of one set), not a wait for an event
            std::thread::sleep(Duration::from_millis(
                (1000 * header_sets.len() / rate) as u64 + 200,
            ));
            spent -= header_sets.len();
        }
        spent += header_sets.len();
        let own = match spec.key {
            kv::KeyShape::Device => format!("$KV.{}.dev-a", spec.name),
            _ => format!("$KV.{}.dev-a.{RUN_A}", spec.name),
        };
        for set in &header_sets {
            let mut h = nats::header::HeaderMap::new();
            for (k, v) in set {
                let v = if v == "BYSTANDER" {
                    bystander_subject(spec.name)
                } else {
                    v.clone()
                };
                h.insert(*k, v);
            }
            let answer = ask(&a, &own, Some(&h), b"{}");
            // Taken as a plain write of dev-a's own key (within its budget: see above)...
            assert!(
                answer.contains("\"seq\""),
                "dev-a's write of {own} with {set:?} was not acknowledged: {answer}"
            );
            // ...and dev-c's keys are as they were right after it.
            assert_eq!(
                before,
                f.bystander(),
                "dev-a's write of {own} with {set:?} changed dev-c's keys: {answer}"
            );
            answers.push((own.clone(), format!("{set:?}"), answer));
        }
    }
    // Schedules and TTLs would act later: wait past them.
    // why: a write that did nothing shows no event; the window outlasts any schedule or TTL the writes could set
    std::thread::sleep(Duration::from_secs(3));
    let after = f.bystander();
    assert_eq!(
        before, after,
        "a header on dev-a's own writes changed dev-c's keys; the answers were:\n{answers:#?}"
    );
    // The writes themselves went through as plain values (no header of the device's reached JetStream).
    let e = f
        .kv(kv::DEVICE_INFO)
        .entry("dev-a")
        .expect("read")
        .expect("dev-a's info");
    assert_eq!(e.operation, nats::kv::Operation::Put, "{answers:#?}");
}

/// The attack a device can keep up: paced just under the flood guard's budget (500 messages a second), so it is
/// never cut off and lasts the whole 60 s (a faster flood is cut off within two polls: `auth_attacks_tls`).
#[test]
fn answers_aimed_at_another_device_reach_nothing_for_60_seconds() {
    const RATE: f64 = 400.0;
    let f = Fleet::start();
    fleet_vm_tests::builds::agent(fleet_vm_tests::builds::V1);
    let tokens = tempfile::tempdir().expect("tmp");
    let token_b = tokens.path().join("b.token");
    write_token(&token_b, &f.token("dev-b"));
    // The victim re-reads its keys only every 10 minutes: a change reaches it in time only through its watch.
    let victim = AgentProc::start_with_resync("dev-b", &f.stack.nats.url(), &token_b, None, 600);
    let desired = f.kv(kv::DESIRED_STATE);
    let put_desired = |generation: u64| {
        let d = fleet_wire::DesiredState::new(
            fleet_wire::DeviceId::try_from("dev-b").unwrap(),
            generation,
            Vec::new(),
        )
        .unwrap();
        desired
            .put("dev-b", serde_json::to_vec(&d).unwrap())
            .unwrap();
    };
    let saw = |generation: u64, within: Duration| {
        wait_for(within, || {
            victim
                .log_text()
                .contains(&format!("desired state generation {generation}"))
                .then_some(())
        })
        .is_some()
    };
    put_desired(1);
    assert!(
        saw(1, Duration::from_secs(30)),
        "victim never started:\n{}",
        victim.log_text()
    );

    // The attacker's largest value of its own, and the subjects the victim listens on or used to.
    let a = f.attacker();
    let spec = largest_readable_own_bucket();
    let own = format!("$KV.{}.dev-a", spec.name);
    let big = vec![b'x'; spec.max_value_bytes as usize];
    let stored = ask(&a, &own, None, &big);
    let own_big = own.clone();
    let get = fleet_wire::auth::direct_get_subject(spec.name, &own);
    // What it only writes it cannot read back: its 96 KiB of workload status is no ammunition.
    let status = "$KV.device-workload-status.dev-a";
    assert!(ask(&a, status, None, &vec![b'x'; 96 * 1024]).contains("\"seq\""));
    let read_back = ask(
        &a,
        &fleet_wire::auth::direct_get_subject(kv::WORKLOAD_STATUS, status),
        None,
        b"",
    );
    assert!(
        read_back.is_empty(),
        "a device read its write-only workload status back: {read_back:.80}"
    );
    // Every request a device may make: a direct get of its own key in every bucket it may read, a write of its own
    // key (or a run key) in every bucket it writes, a watch registration (below).
    let own = |b: &kv::BucketSpec| match b.key {
        kv::KeyShape::Device => format!("$KV.{}.dev-a", b.name),
        _ => format!("$KV.{}.dev-a.{RUN_A}", b.name),
    };
    let gets: Vec<String> = kv::BUCKETS
        .iter()
        .filter(|b| {
            use fleet_wire::auth::{device_access, DeviceAccess};
            matches!(
                device_access(b),
                DeviceAccess::Read | DeviceAccess::ReadWrite
            )
        })
        .map(|b| fleet_wire::auth::direct_get_subject(b.name, &own(b)))
        .collect();
    let writes: Vec<String> = fleet_wire::device_api::written_buckets().map(own).collect();
    assert!(gets.len() >= 6 && writes.len() == 7, "{gets:?} {writes:?}");
    let targets = [
        "$KV.device-desired-state.dev-b".to_owned(),
        "$KV.agent-upgrade-intent.dev-b".to_owned(),
        "$KV.system-upgrade-intent.dev-b.x".to_owned(),
        "_INBOX.device.dev-b".to_owned(),
        "_INBOX.device.dev-b.>".to_owned(),
        "_INBOX.device.dev-b.*.1".to_owned(),
        "_INBOX.device.dev-b.x.device-desired-state.dev-b".to_owned(),
    ];
    let started = Instant::now();
    let mut sent = 0u64;
    let mut generation = 1;
    let mut last_change = Instant::now();
    let mut missed = Vec::new();
    while started.elapsed() < Duration::from_secs(60) {
        let (burst_start, sent_before) = (Instant::now(), sent);
        for t in &targets {
            for _ in 0..10 {
                let _ = a.conn.publish_request(&get, t, b"");
                sent += 1;
            }
            for subject in &gets {
                let _ = a.conn.publish_request(subject, t, b"");
                sent += 1;
            }
            for subject in &writes {
                // Its largest readable value stays what it stored (the last direct get below reads it).
                let body: &[u8] = if *subject == own_big { &big } else { b"{}" };
                let _ = a.conn.publish_request(subject, t, body);
                sent += 1;
            }
            let _ = a.conn.publish_request(
                "fleet.device-watch.dev-a",
                t,
                br#"{"inbox":"_INBOX.device.dev-b.AbCdEfGhIjKlMnOpQrStUv"}"#,
            );
            sent += 1;
        }
        let _ = ask(&a, &get, None, b"");
        sent += 1;
        // Each burst paced to RATE, never catching up after a stall (a catch-up burst could pass the budget).
        let due = Duration::from_secs_f64((sent - sent_before) as f64 / RATE);
        if let Some(ahead) = due.checked_sub(burst_start.elapsed()) {
            // why: pacing the attack to RATE is the scenario
            std::thread::sleep(ahead);
        }
        // Every 5 s the victim's desired state changes; it must notice each within 5 s.
        if last_change.elapsed() >= Duration::from_secs(5) {
            generation += 1;
            put_desired(generation);
            if !saw(generation, Duration::from_secs(5)) {
                missed.push(generation);
            }
            last_change = Instant::now();
        }
    }
    let attack = started.elapsed();
    // The attack lasted: the attacker is still connected and served at its end (not cut off by the flood guard).
    let last = ask(&a, &get, None, b"");
    assert_eq!(
        last.len(),
        big.len(),
        "the attacker was cut off before the end of its {attack:?} at {:.0} messages a second; fleet-auth:\n{}",
        sent as f64 / attack.as_secs_f64(),
        f.stack
            .auth_log_text()
            .lines()
            .filter(|l| !l.contains("watch registration on"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let log = victim.log_text();
    assert!(
        stored.contains("\"seq\""),
        "the attacker's own large value was not stored: {stored}"
    );
    assert!(
        missed.is_empty(),
        "the victim missed desired-state changes {missed:?} during the attack ({sent} messages sent):\n{log}"
    );
    for bad in ["disconnected", "reconnect", "slow consumer"] {
        assert!(
            !log.to_lowercase().contains(bad),
            "the victim's log shows {bad:?} during the attack:\n{log}"
        );
    }
    let mut v = victim;
    assert!(
        v.child.try_wait().expect("wait").is_none(),
        "the victim agent exited"
    );
    println!(
        "{sent} attack messages in {attack:.1?} ({:.0} a second); the victim noticed {generation} generations, none missed",
        sent as f64 / attack.as_secs_f64()
    );
}

#[test]
fn floods_are_refused_past_the_devices_share_and_reported() {
    let f = Fleet::start();
    f.kv(kv::SYSTEM_UPGRADE_INTENT)
        .put(&format!("dev-a.{RUN_A}"), b"{}")
        .expect("intent");
    let reports = f
        .admin
        .subscribe("fleet.device-refusals.*")
        .expect("reports");
    let before = f.bystander();
    let a = f.attacker();

    // Run keys: only the run dev-a was given is written; every other suffix is refused.
    let given = ask(
        &a,
        &format!("$KV.system-upgrade-status.dev-a.{RUN_A}"),
        None,
        b"{}",
    );
    assert!(
        given.contains("\"seq\""),
        "the given run's status was refused: {given}"
    );
    let mut refused = 0;
    for i in 0..50 {
        let run = fleet_wire::AttemptId::new_random();
        let answer = ask(
            &a,
            &format!("$KV.system-upgrade-status.dev-a.{run}"),
            None,
            &vec![b'x'; 60 * 1024],
        );
        if answer.contains("no intent for run") || answer.contains("limit") {
            refused += 1;
        } else {
            panic!("run key {i} ({run}) was not refused: {answer}");
        }
        let answer = ask(
            &a,
            &format!("$KV.system-upgrade-status.dev-a.x{i}"),
            None,
            b"{}",
        );
        assert!(answer.contains("invalid key"), "suffix x{i}: {answer}");
    }
    assert_eq!(refused, 50);
    let stream = nats::jetstream::new(f.admin.clone())
        .stream_info("KV_system-upgrade-status")
        .expect("stream");
    assert_eq!(
        stream.state.messages, 2,
        "dev-c's and dev-a's given run only"
    );

    // Oversize values: refused with the limit named.
    let limit = kv::bucket(kv::DEVICE_INFO).unwrap().max_value_bytes as usize;
    let answer = ask(&a, "$KV.device-info.dev-a", None, &vec![b'x'; limit + 1]);
    assert!(answer.contains("over device-info's limit"), "{answer}");

    // A write flood: the budget's burst, then refusals.
    let mut ok = 0;
    let mut over = 0;
    let flood = Instant::now();
    for _ in 0..300 {
        let answer = ask(&a, "$KV.device-heartbeat.dev-a", None, b"{}");
        if answer.contains("\"seq\"") {
            ok += 1;
        } else if answer.contains("write budget") {
            over += 1;
        }
    }
    assert!(over > 0, "300 writes in a row were all taken ({ok})");
    // What the budget allows: its burst (less the writes above), then its rate over the flood's time.
    let refill =
        flood.elapsed().as_secs_f64() * f64::from(fleet_wire::device_api::WRITE_RATE_PER_SEC);
    let allowed = fleet_wire::device_api::WRITE_BURST as usize + refill.ceil() as usize + 1;
    assert!(
        ok <= allowed,
        "{ok} writes taken, the budget allows {allowed}"
    );

    // The refusals are reported for dev-a (at most one report per interval, with a count).
    let report = reports
        .next_timeout(Duration::from_secs(5))
        .expect("a refusal report");
    assert_eq!(report.subject, "fleet.device-refusals.dev-a");
    let r: fleet_wire::device_api::WriteRefused = serde_json::from_slice(&report.data).unwrap();
    assert_eq!(r.device_id.as_str(), "dev-a");
    assert!(f
        .stack
        .auth_log_text()
        .contains("write of device dev-a refused"));

    assert_eq!(before, f.bystander(), "the floods changed dev-c's keys");
}

#[test]
fn a_lost_device_info_is_written_again_within_a_heartbeat() {
    let f = Fleet::start();
    fleet_vm_tests::builds::agent(fleet_vm_tests::builds::V1);
    let tokens = tempfile::tempdir().expect("tmp");
    let token = tokens.path().join("b.token");
    write_token(&token, &f.token("dev-b"));
    // A resync far longer than the test: only the heartbeat's check (every second here) can write it again.
    let agent = AgentProc::start_with_resync("dev-b", &f.stack.nats.url(), &token, None, 3600);
    let info = f.kv(kv::DEVICE_INFO);
    let present = || {
        info.entry("dev-b")
            .ok()
            .flatten()
            .filter(|e| e.operation == nats::kv::Operation::Put)
    };
    let first = wait_for(Duration::from_secs(60), present)
        .unwrap_or_else(|| panic!("dev-b never wrote its info:\n{}", agent.log_text()));
    // An operator's mistake: the key is deleted; then again.
    let mut last = first.revision;
    for loss in 1..=2 {
        info.delete("dev-b").expect("delete");
        let again = wait_for(Duration::from_secs(5), || {
            present().filter(|e| e.revision > last + 1)
        });
        last = again
            .unwrap_or_else(|| {
                panic!(
                    "device info not written again within 5 s of loss {loss} (heartbeat 1 s):\n{}",
                    agent.log_text()
                )
            })
            .revision;
    }
    assert!(agent
        .log_text()
        .contains("device info is missing from NATS: writing it again"));
}

/// A raw NATS protocol client: connects, sends CONNECT with `fields` (beside the protocol's own) and a PING, and
/// checks the PONG; the socket.
fn raw_connect(f: &Fleet, fields: serde_json::Value) -> std::net::TcpStream {
    use std::io::{BufRead, BufReader, Write};
    let addr = f.stack.nats.url().trim_start_matches("nats://").to_owned();
    let mut s = std::net::TcpStream::connect(&addr).expect("tcp");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut reader = BufReader::new(s.try_clone().unwrap());
    let mut info = String::new();
    reader.read_line(&mut info).expect("INFO");
    assert!(info.starts_with("INFO "), "{info}");
    let mut connect = serde_json::json!({
        "verbose": false, "pedantic": false, "protocol": 1, "headers": true,
    });
    for (k, v) in fields.as_object().expect("CONNECT fields") {
        connect[k] = v.clone();
    }
    write!(s, "CONNECT {connect}\r\nPING\r\n").unwrap();
    let mut pong = String::new();
    reader.read_line(&mut pong).expect("PONG");
    assert_eq!(pong.trim(), "PONG", "CONNECT {fields}: {pong}");
    s
}

/// A flood from a raw client that names another device in every field of CONNECT a client controls (`user`,
/// `name`) while it authenticates with its own token: fleet-auth's flood guard cuts off the token's device and
/// only it (the server reports the user fleet-auth named, never the client's words), the other device stays
/// welcome, and its Device's refusals are not touched.
#[test]
fn a_flooding_client_that_names_another_device_in_connect_cuts_off_only_itself() {
    use std::io::Write;
    let f = Fleet::start();
    let reports = f
        .admin
        .subscribe("fleet.device-refusals.*")
        .expect("reports");
    let mut s = raw_connect(
        &f,
        serde_json::json!({"user": "dev-b", "name": "fleet-agent dev-b", "auth_token": f.token("dev-a")}),
    );
    // 10 s of heartbeats as fast as the socket takes them (the answers go nowhere: no reply subject).
    let started = Instant::now();
    let mut sent = 0u64;
    let line = b"PUB $KV.device-heartbeat.dev-a 2\r\n{}\r\n".repeat(200);
    while started.elapsed() < Duration::from_secs(10) {
        if s.write_all(&line).is_err() {
            break;
        }
        sent += 200;
    }
    let logs = || f.stack.auth_log_text();
    let cut = wait_for(Duration::from_secs(10), || {
        logs()
            .contains("flood guard: device dev-a (cid ")
            .then_some(())
    });
    assert!(
        cut.is_some(),
        "dev-a was not cut off after {sent} messages:\n{}",
        logs()
    );
    assert!(
        !logs().contains("flood guard: device dev-b"),
        "the guard believed the client's CONNECT:\n{}",
        logs()
    );
    // The token's device is refused while it cools down; the named one is welcome.
    let again = connect_device(&f.stack.nats.url(), &f.token("dev-a"));
    assert!(again.is_err(), "dev-a reconnected while cooling down");
    assert!(
        logs().contains("device dev-a is cooling down after a message flood"),
        "{}",
        logs()
    );
    connect_device(&f.stack.nats.url(), &f.token("dev-b")).expect("dev-b is not cut off");
    // The report names dev-a, kind flood.
    let flood = wait_for(Duration::from_secs(15), || {
        let m = reports.next_timeout(Duration::from_secs(1)).ok()?;
        let r: fleet_wire::device_api::WriteRefused = serde_json::from_slice(&m.data).ok()?;
        (r.kind == fleet_wire::device_api::FLOOD_KIND).then_some((m.subject, r))
    })
    .expect("a flood report");
    assert_eq!(flood.0, "fleet.device-refusals.dev-a");
    assert_eq!(flood.1.device_id.as_str(), "dev-a");
    println!("{sent} messages sent; {}", flood.1.reason);
}

/// A device that holds many subscriptions (each costs every server memory): nats-server itself refuses a
/// connection's subscriptions past the devices' account limit (`fleet_wire::auth::DEVICE_MAX_SUBSCRIPTIONS`; it
/// does not apply the user JWT's `subs` to users the auth callout admits), and the flood guard sums them over the
/// device's connections: three connections at the limit are over the device's 64 and are cut off together, well
/// within its message budget, and only that device: its sessions are refused for the cool-down, the other
/// device's are not, and the operator gets a report of kind flood that says why.
#[test]
fn a_device_holding_too_many_subscriptions_is_cut_off_alone() {
    use std::io::{BufRead, BufReader, Write};
    let f = Fleet::start();
    let reports = f
        .admin
        .subscribe("fleet.device-refusals.*")
        .expect("reports");
    let limit = fleet_wire::auth::DEVICE_MAX_SUBSCRIPTIONS as usize;
    let mut conns = Vec::new();
    for c in 0..3 {
        let mut s = raw_connect(&f, serde_json::json!({"auth_token": f.token("dev-a")}));
        // 100 subscriptions below its own inbox (allowed subjects), 200 messages a second, far under the
        // 500-a-second message budget: the server takes `limit` and refuses the rest.
        let subs: String = (0..100)
            .map(|i| format!("SUB _INBOX.device.dev-a.x.{c}.{i} {}\r\n", i + 1))
            .collect();
        s.write_all(subs.as_bytes()).expect("SUB");
        s.write_all(b"PING\r\n").expect("PING");
        let mut reader = BufReader::new(s.try_clone().expect("clone"));
        let mut refused = 0;
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).expect("the server answers");
            if line
                .to_ascii_lowercase()
                .contains("maximum subscriptions exceeded")
            {
                refused += 1;
            }
            if line.starts_with("PONG") {
                break;
            }
        }
        assert_eq!(
            refused,
            100 - limit,
            "connection {c}: the server refuses past {limit}"
        );
        conns.push(s);
        // why: pacing, not a proof: the connections come one after another, as a device opens them.
        std::thread::sleep(Duration::from_millis(500));
    }
    let logs = || f.stack.auth_log_text();
    let want = "subscriptions, over its limit of 64 summed over its connections";
    let cut = wait_for(Duration::from_secs(15), || {
        logs()
            .lines()
            .find(|l| l.contains("flood guard: device dev-a (cid ") && l.contains(want))
            .map(str::to_owned)
    });
    assert!(
        cut.is_some(),
        "dev-a was not cut off holding 3 x {limit} subscriptions:\n{}",
        logs()
    );
    assert!(
        !logs().contains("messages a second over"),
        "cut off for its subscriptions, not a message rate:\n{}",
        logs()
    );
    let again = connect_device(&f.stack.nats.url(), &f.token("dev-a"));
    assert!(again.is_err(), "dev-a reconnected while cooling down");
    connect_device(&f.stack.nats.url(), &f.token("dev-b")).expect("dev-b is not cut off");
    let flood = wait_for(Duration::from_secs(15), || {
        let m = reports.next_timeout(Duration::from_secs(1)).ok()?;
        let r: fleet_wire::device_api::WriteRefused = serde_json::from_slice(&m.data).ok()?;
        (r.kind == fleet_wire::device_api::FLOOD_KIND).then_some((m.subject, r))
    })
    .expect("a report");
    assert_eq!(flood.0, "fleet.device-refusals.dev-a");
    // The guard counts what the server held at its poll: over the device's limit, at most what three connections
    // may hold.
    let held: usize = flood
        .1
        .reason
        .strip_prefix("disconnected: ")
        .and_then(|r| r.split_once(" subscriptions, over its limit of 64"))
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or_else(|| panic!("the report says how many it held: {}", flood.1.reason));
    assert!((65..=3 * limit).contains(&held), "{}", flood.1.reason);
    println!("{}", flood.1.reason);
}

/// A token whose claims name `device_id` twice (signed by the issuer, so a claim mapping that
/// appends one would do it) is refused with a clear reason, not admitted as the last one; a token naming each claim
/// once still is.
#[test]
fn a_token_naming_device_id_twice_is_refused() {
    use base64::Engine;
    let f = Fleet::start();
    let b = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let raw = |payload: String| {
        let header = serde_json::json!({"alg": "ES256", "typ": "JWT", "kid": f.ec.kid});
        let message = format!("{}.{}", b.encode(header.to_string()), b.encode(payload));
        let sig =
            jsonwebtoken::crypto::sign(message.as_bytes(), &f.ec.enc, f.ec.alg).expect("sign");
        format!("{message}.{sig}")
    };
    let claims = |device_ids: &str| {
        let c = claims("dev-x", 3600);
        format!(
            r#"{{"iss":{},"aud":{},"exp":{},"nbf":{},{device_ids}}}"#,
            c["iss"], c["aud"], c["exp"], c["nbf"]
        )
    };
    let url = f.stack.nats.url();
    connect_device(&url, &raw(claims(r#""device_id":"dev-a""#))).expect("one device_id: admitted");
    let twice = connect_device(
        &url,
        &raw(claims(r#""device_id":"dev-b","device_id":"dev-a""#)),
    );
    let logs = f.stack.auth_log_text();
    let admitted_twice = logs.matches("as device dev-a").count();
    println!(
        "two device_ids: {}; fleet-auth: {:?}",
        match &twice {
            Ok(_) => "admitted".to_owned(),
            Err(e) => format!("refused ({e})"),
        },
        logs.lines()
            .filter(|l| l.contains("device_id"))
            .collect::<Vec<_>>()
    );
    assert!(
        twice.is_err(),
        "a token naming dev-b and dev-a was admitted ({admitted_twice} admissions as dev-a):\n{logs}"
    );
    assert!(
        wait_for(Duration::from_secs(5), || f
            .stack
            .auth_log_text()
            .contains(r#"token names claim "device_id" more than once"#)
            .then_some(()))
        .is_some(),
        "{}",
        f.stack.auth_log_text()
    );
}
