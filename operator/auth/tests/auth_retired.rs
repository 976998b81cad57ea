//! fleet-auth and retired devices (docs/auth.md, "Retired devices"), against a real nats-server with
//! `auth_callout`, the real fleet-auth (device API and flood guard on) and the operator's tombstone bucket
//! `device-retired` written as the operator writes it: a tombstone read at fleet-auth's start refuses the device at
//! the callout with `device X is retired`; a tombstone written while a device is connected disconnects it and
//! refuses its writes through the device API (nothing it sends lands), and a new connection with its still valid
//! token is refused; lifting the tombstone (an enrolment) admits it again.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use fleet_rig::nats_client as nats;
mod auth_common;

use auth_common::*;
use fleet_rig::tls::TestCa;
use fleet_rig::wait_for;
use fleet_wire::kv;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Writes `device`'s tombstone as the operator does.
fn retire(js: &nats::jetstream::JetStream, device: &str) {
    let tomb = fleet_wire::DeviceRetirement {
        device_id: fleet_wire::DeviceId::try_from(device).unwrap(),
        retired_at: fleet_wire::Timestamp::now(),
        device_uid: Some("uid-1".into()),
    };
    js.key_value(kv::DEVICE_RETIRED)
        .unwrap()
        .put(device, serde_json::to_vec(&tomb).unwrap())
        .unwrap();
}

/// Connects with `token`, expecting a refusal whose reason fleet-auth logs.
fn refused_as_retired(stack: &Stack, token: &str, device: &str) {
    match connect_device(&stack.nats.url(), token) {
        Ok(_) => panic!(
            "{device} connected although it is retired:\n{}",
            stack.auth_log_text()
        ),
        Err(e) => assert!(e.to_lowercase().contains("authorization violation"), "{e}"),
    }
    let reason = format!("device {device} is retired");
    let logged = wait_for(Duration::from_secs(5), || {
        stack
            .auth_log_text()
            .lines()
            .any(|l| l.contains("denied client") && l.contains(&reason))
            .then_some(())
    });
    assert!(
        logged.is_some(),
        "no denial {reason:?} in fleet-auth's log:\n{}",
        stack.auth_log_text()
    );
}

/// A write of `device`'s heartbeat through the device API on `conn`, its answer read on the device's own inbox:
/// `Some(answer)`, or `None` when none came (the connection is gone).
fn write_heartbeat(conn: &nats::Connection, device: &str, sequence: u64) -> Option<String> {
    let mut beat = fleet_wire::fixtures::heartbeat();
    beat.device_id = fleet_wire::DeviceId::try_from(device).unwrap();
    beat.sequence = sequence;
    let inbox = format!("_INBOX.device.{device}.w{sequence}");
    let sub = conn.subscribe(&inbox).ok()?;
    conn.publish_request(
        &format!("$KV.{}.{device}", kv::DEVICE_HEARTBEAT),
        &inbox,
        serde_json::to_vec(&beat).unwrap(),
    )
    .ok()?;
    let m = sub.next_timeout(Duration::from_secs(3)).ok()?;
    Some(String::from_utf8_lossy(&m.data).into_owned())
}

fn stored_sequence(js: &nats::jetstream::JetStream, device: &str) -> Option<u64> {
    let raw = js
        .key_value(kv::DEVICE_HEARTBEAT)
        .ok()?
        .get(device)
        .ok()??;
    serde_json::from_slice::<fleet_wire::Heartbeat>(&raw)
        .ok()
        .map(|h| h.sequence)
}

#[test]
fn a_retired_device_is_refused_at_the_callout_and_at_the_device_api_until_enrolled() {
    let ca = TestCa::new();
    let ec = SignKey::ec("ec-1");
    let _jwks = Jwks::start(&ca, &[&ec]);
    let mut stack = Stack::start(&ca, &_jwks.url(), false);
    let admin = stack.admin();
    for spec in kv::BUCKETS {
        nats::buckets::create_bucket(&admin, spec);
    }
    let js = nats::jetstream::new(admin.clone());
    // Retired before fleet-auth started: read at its start (a restart re-reads the bucket).
    retire(&js, "dev-old");
    stack.start_auth();
    let old_token = ec.sign(&claims("dev-old", 600));
    refused_as_retired(&stack, &old_token, "dev-old");
    assert!(
        stack.auth_log_text().contains("retired devices: 1 known"),
        "{}",
        stack.auth_log_text()
    );

    // dev-a, connected and writing, then retired.
    let token = ec.sign(&claims("dev-a", 600));
    let closed = Arc::new(AtomicBool::new(false));
    let c = closed.clone();
    let conn = nats::Options::with_token(&token)
        .with_name("dev-a")
        .max_reconnects(1)
        .disconnect_callback(move || c.store(true, Ordering::SeqCst))
        .connect(&stack.nats.url())
        .unwrap_or_else(|e| panic!("dev-a refused: {e}\n{}", stack.auth_log_text()));
    let answer = write_heartbeat(&conn, "dev-a", 1).expect("an answer");
    assert!(!answer.contains("error"), "{answer}");
    assert_eq!(stored_sequence(&js, "dev-a"), Some(1));
    retire(&js, "dev-a");
    // Its open connection cannot write any more: refused by the device API, or already disconnected.
    let mut seq = 2;
    let cut = wait_for(Duration::from_secs(10), || {
        let a = write_heartbeat(&conn, "dev-a", seq);
        seq += 1;
        match a {
            Some(a) if a.contains("device dev-a is retired") => Some("refused"),
            None if closed.load(Ordering::SeqCst) => Some("disconnected"),
            _ => None,
        }
    });
    assert!(
        cut.is_some(),
        "dev-a could still write after its retirement:\n{}",
        stack.auth_log_text()
    );
    assert_eq!(
        stored_sequence(&js, "dev-a"),
        Some(1),
        "a write after the retirement landed"
    );
    // The flood guard disconnects it (the connection was opened before the retirement).
    let kicked = wait_for(Duration::from_secs(10), || {
        closed.load(Ordering::SeqCst).then_some(())
    });
    assert!(
        kicked.is_some(),
        "dev-a's open connection was not disconnected:\n{}",
        stack.auth_log_text()
    );
    assert!(stack
        .auth_log_text()
        .contains("retired device dev-a: 1 open connections disconnected"));
    // Its token is valid for 10 more minutes, and refused.
    refused_as_retired(&stack, &token, "dev-a");

    // The enrolment lifts the tombstone: admitted again, its writes land.
    js.key_value(kv::DEVICE_RETIRED)
        .unwrap()
        .delete("dev-a")
        .unwrap();
    let back = wait_for(Duration::from_secs(10), || {
        connect_device(&stack.nats.url(), &token).ok()
    })
    .unwrap_or_else(|| {
        panic!(
            "dev-a not admitted after the enrolment:\n{}",
            stack.auth_log_text()
        )
    });
    let answer = write_heartbeat(&back.conn, "dev-a", 100).expect("an answer");
    assert!(!answer.contains("error"), "{answer}");
    assert_eq!(stored_sequence(&js, "dev-a"), Some(100));
    // dev-old is still refused: the enrolment of one device lifts nothing else.
    refused_as_retired(&stack, &old_token, "dev-old");
}

/// 100,000 tombstones: fleet-auth reads them all before it serves (its start, timed) and keeps them in bounded
/// memory (its RSS, printed); a device among them is refused, one not among them admitted. A measurement, run on
/// demand: `cargo test -p fleet-operator --test auth_retired -- --ignored --nocapture`.
#[test]
#[ignore]
fn a_hundred_thousand_retired_devices_are_read_at_start() {
    use futures::StreamExt;
    const N: usize = 100_000;
    let ca = TestCa::new();
    let ec = SignKey::ec("ec-1");
    let jwks = Jwks::start(&ca, &[&ec]);
    let mut stack = Stack::start(&ca, &jwks.url(), false);
    let admin = stack.admin();
    for spec in kv::BUCKETS {
        nats::buckets::create_bucket(&admin, spec);
    }
    let (url, password) = (stack.nats.url(), stack.admin_password.clone());
    let put = std::time::Instant::now();
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(async move {
            let js = async_nats::jetstream::new(
                async_nats::ConnectOptions::with_user_and_password("admin".into(), password)
                    .connect(url)
                    .await
                    .unwrap(),
            );
            futures::stream::iter(0..N)
                .map(|i| {
                    let js = js.clone();
                    async move {
                        let id = format!("gone-{i:06}");
                        let tomb = fleet_wire::DeviceRetirement {
                            device_id: fleet_wire::DeviceId::try_from(id.as_str()).unwrap(),
                            retired_at: fleet_wire::Timestamp::now(),
                            device_uid: Some(format!("5f0c2a3e-8d1b-4c62-9a57-{i:012}")),
                        };
                        let body = serde_json::to_vec(&tomb).unwrap();
                        js.publish(format!("$KV.{}.{id}", kv::DEVICE_RETIRED), body.into())
                            .await
                            .unwrap()
                            .await
                            .unwrap();
                    }
                })
                .buffer_unordered(512)
                .collect::<Vec<()>>()
                .await;
        });
    eprintln!(
        "{N} tombstones written in {:.1} s",
        put.elapsed().as_secs_f64()
    );
    let rss = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap_or_default()
            .lines()
            .find(|l| l.starts_with("VmRSS:"))
            .unwrap_or_default()
            .to_owned()
    };
    let t = std::time::Instant::now();
    stack.start_auth();
    let started = t.elapsed();
    let pid = stack.auth.as_ref().unwrap().id();
    assert!(
        stack
            .auth_log_text()
            .contains(&format!("retired devices: {N} known")),
        "{}",
        stack.auth_log_text()
    );
    eprintln!(
        "fleet-auth serving {:.2} s after its start with {N} retired devices; {}",
        started.as_secs_f64(),
        rss(pid)
    );
    refused_as_retired(&stack, &ec.sign(&claims("gone-054321", 600)), "gone-054321");
    connect_device(&stack.nats.url(), &ec.sign(&claims("dev-a", 600)))
        .unwrap_or_else(|e| panic!("dev-a refused: {e}"));
}
