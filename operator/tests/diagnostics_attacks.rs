//! Diagnostics between devices (docs/diagnostics.md): a device with its own valid token, against a real
//! nats-server with the fleet-auth callout and device API and the buckets the operator creates, can neither read
//! another device's diagnostics (its requests or its bundles) nor answer a request addressed to another, and cannot
//! read its own bundle either (the `diagnostics-bundle` bucket is write-only to devices: a readable bundle would be
//! the largest answer a device could make the server send). A device answers only a request it was given, and only
//! while that request exists.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use fleet_rig::nats_client as nats;
#[path = "../auth/tests/auth_common/mod.rs"]
mod auth_common;

use auth_common::*;
use fleet_rig::tls::TestCa;
use fleet_wire::diagnostics::{DiagnosticsBundle, DiagnosticsRequest, Item, Section};
use fleet_wire::{kv, AttemptId, DeviceId, Timestamp};
use std::time::Duration;

/// The request given to `dev-a`, and the one given to `dev-b`.
const RUN_A: &str = "0a5b3c1e-8f2d-4b7a-9c6e-1d2f3a4b5c6d";
const RUN_B: &str = "7b2e4f10-3c5d-4e6f-8a9b-0c1d2e3f4a5b";
/// A line in `dev-a`'s bundle that must reach no one but the services.
const A_SECRET_LINE: &str = "dev-a's private log line 5f0c9e";

fn dev(id: &str) -> DeviceId {
    DeviceId::try_from(id).unwrap()
}

fn run(uid: &str) -> AttemptId {
    AttemptId::try_from(uid).unwrap()
}

/// A request as the operator writes it.
fn request() -> Vec<u8> {
    serde_json::to_vec(&DiagnosticsRequest {
        items: vec![Item::WorkloadLogs, Item::Disk],
        workloads: vec![],
        lines: 50,
        since_seconds: None,
        requested_at: Timestamp::now(),
    })
    .unwrap()
}

/// A bundle of `device` for request `uid`, as the agent writes it (bounded JSON).
fn bundle(device: &str, uid: &str, line: &str) -> Vec<u8> {
    DiagnosticsBundle {
        device: dev(device),
        request: run(uid),
        collected_at: Timestamp::now(),
        sections: vec![Section::new(Item::WorkloadLogs, None, line, 50)],
        redacted: 0,
        cut: false,
    }
    .to_bounded_json()
}

/// A request from device `id`'s connection `d` on its own inbox: the answer's body, empty when none came within
/// 5 s.
fn ask(d: &Device, id: &str, subject: &str, body: &[u8]) -> String {
    ask_within(d, id, subject, body, Duration::from_secs(5))
}

/// [`ask`] of a request its permissions refuse (which gets no answer): waits `within` for an answer that would
/// show the refusal missing (one comes back in milliseconds from a local server).
fn ask_refused(d: &Device, id: &str, subject: &str, body: &[u8]) -> String {
    ask_within(d, id, subject, body, Duration::from_secs(1))
}

fn ask_within(d: &Device, id: &str, subject: &str, body: &[u8], within: Duration) -> String {
    let inbox = format!(
        "_INBOX.device.{id}.{}",
        nats::Connection::new_inbox(&d.conn)
            .rsplit('.')
            .next()
            .unwrap()
    );
    let sub = d.conn.subscribe(&inbox).expect("own inbox");
    d.conn
        .publish_request(subject, &inbox, body)
        .expect("publish");
    let got = sub
        .next_timeout(within)
        .map(|m| String::from_utf8_lossy(&m.data).into_owned())
        .unwrap_or_default();
    let _ = sub.unsubscribe();
    got
}

/// Asserts that the server refused `d`'s publish to `subject` as a permission violation.
fn refused(d: &Device, subject: &str, what: &str) {
    assert!(
        d.wait_error(
            &format!("Permissions Violation for Publish to \"{subject}\""),
            Duration::from_secs(5)
        ),
        "{what}: the publish to {subject} was not refused by the permissions: {:?}",
        d.errors.lock().unwrap()
    );
}

#[test]
fn a_device_reads_no_diagnostics_and_answers_only_its_own_live_requests() {
    let started = std::time::Instant::now();
    let ca = TestCa::new();
    let ec = SignKey::ec("ec-1");
    let jwks = Jwks::start(&ca, &[&ec]);
    let stack = Stack::start(&ca, &jwks.url(), false);
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let (_c, js) = fleet_operator::kv::connect(&stack.admin_url(), &Default::default())
            .await
            .expect("admin connects");
        fleet_operator::kv::ensure_buckets(&js, &Default::default())
            .await
            .expect("buckets");
    });
    let admin = stack.admin();
    let store = |bucket: &str| {
        nats::jetstream::new(admin.clone())
            .key_value(bucket)
            .expect("bucket")
    };
    let requests = store(kv::DIAGNOSTICS_REQUEST);
    let bundles = store(kv::DIAGNOSTICS_BUNDLE);
    let reports = admin
        .subscribe("fleet.device-refusals.dev-b")
        .expect("refusal reports");
    // The operator's requests: one to each device.
    requests
        .put(&format!("dev-a.{RUN_A}"), request())
        .expect("request to dev-a");
    requests
        .put(&format!("dev-b.{RUN_B}"), request())
        .expect("request to dev-b");
    let a = connect_device(&stack.nats.url(), &ec.sign(&claims("dev-a", 600))).expect("dev-a");
    let b = connect_device(&stack.nats.url(), &ec.sign(&claims("dev-b", 600))).expect("dev-b");

    eprintln!(
        "{:?}: A answers its request while it exists",
        started.elapsed()
    );
    // A answers its request while it exists: taken, and stored as written.
    let a_key = format!("dev-a.{RUN_A}");
    let a_subject = format!("$KV.{}.{a_key}", kv::DIAGNOSTICS_BUNDLE);
    let answer = ask(
        &a,
        "dev-a",
        &a_subject,
        &bundle("dev-a", RUN_A, A_SECRET_LINE),
    );
    assert!(
        answer.contains("\"seq\""),
        "dev-a's bundle for its own request was refused: {answer}\n{}",
        stack.auth_log_text()
    );
    let a_stored = bundles.entry(&a_key).unwrap().expect("dev-a's bundle");
    assert!(String::from_utf8_lossy(&a_stored.value).contains(A_SECRET_LINE));
    // The positive control of the reads below: B reads its own request (the same get that is refused for A's).
    let own_request = ask(
        &b,
        "dev-b",
        &fleet_wire::auth::direct_get_subject(
            kv::DIAGNOSTICS_REQUEST,
            &format!("$KV.{}.dev-b.{RUN_B}", kv::DIAGNOSTICS_REQUEST),
        ),
        b"",
    );
    assert!(
        own_request.contains("\"lines\":50"),
        "dev-b could not read its own request: {own_request:?}"
    );

    eprintln!("{:?}: (i) B cannot read", started.elapsed());
    // (i) B cannot read A's bundle: the direct get of A's key, and of every key of A's.
    for filter in [
        a_subject.clone(),
        format!("$KV.{}.dev-a.>", kv::DIAGNOSTICS_BUNDLE),
    ] {
        let get = fleet_wire::auth::direct_get_subject(kv::DIAGNOSTICS_BUNDLE, &filter);
        let got = ask_refused(&b, "dev-b", &get, b"");
        assert!(
            !got.contains(A_SECRET_LINE),
            "dev-b read dev-a's bundle with {get}"
        );
        refused(&b, &get, "dev-b reading dev-a's bundle");
    }
    // Nor the bucket's stream by any other API (no JetStream API but direct gets of its own keys).
    for subject in [
        format!("$JS.API.DIRECT.GET.KV_{}", kv::DIAGNOSTICS_BUNDLE),
        format!("$JS.API.STREAM.MSG.GET.KV_{}", kv::DIAGNOSTICS_BUNDLE),
        format!("$JS.API.CONSUMER.CREATE.KV_{}", kv::DIAGNOSTICS_BUNDLE),
    ] {
        let body = format!(r#"{{"last_by_subj":"{a_subject}"}}"#);
        let got = ask_refused(&b, "dev-b", &subject, body.as_bytes());
        assert!(
            !got.contains(A_SECRET_LINE),
            "dev-b read dev-a's bundle with {subject}"
        );
        refused(&b, &subject, "dev-b reading the bundles' stream");
    }

    eprintln!("{:?}: (ii) B cannot read its own", started.elapsed());
    // (ii) B cannot read its own bundle either: it writes it, and no get of it is allowed.
    let b_key = format!("dev-b.{RUN_B}");
    let b_subject = format!("$KV.{}.{b_key}", kv::DIAGNOSTICS_BUNDLE);
    let b_line = "dev-b's own bundle line 77e1aa";
    let answer = ask(&b, "dev-b", &b_subject, &bundle("dev-b", RUN_B, b_line));
    assert!(
        answer.contains("\"seq\""),
        "dev-b's bundle for its own request was refused: {answer}"
    );
    assert!(bundles.entry(&b_key).unwrap().is_some(), "dev-b's bundle");
    for filter in [
        b_subject.clone(),
        format!("$KV.{}.dev-b.>", kv::DIAGNOSTICS_BUNDLE),
    ] {
        let get = fleet_wire::auth::direct_get_subject(kv::DIAGNOSTICS_BUNDLE, &filter);
        let got = ask_refused(&b, "dev-b", &get, b"");
        assert!(
            !got.contains(b_line),
            "dev-b read its own bundle back with {get}"
        );
        refused(&b, &get, "dev-b reading its own bundle");
    }
    eprintln!("{:?}: (iv) B cannot write", started.elapsed());
    // (iv) B cannot write its own key for a request it was not given: A's request uid, or one never made.
    for uid in [RUN_A.to_owned(), AttemptId::new_random().to_string()] {
        let subject = format!("$KV.{}.dev-b.{uid}", kv::DIAGNOSTICS_BUNDLE);
        let got = ask(&b, "dev-b", &subject, &bundle("dev-b", &uid, b_line));
        assert!(
            got.contains("no intent for run"),
            "dev-b's bundle for request {uid} it was not given: {got}"
        );
        assert!(
            bundles.entry(&format!("dev-b.{uid}")).unwrap().is_none(),
            "dev-b's bundle for {uid} was stored"
        );
    }
    let report = reports
        .next_timeout(Duration::from_secs(5))
        .expect("a refusal report for dev-b");
    let r: fleet_wire::device_api::WriteRefused = serde_json::from_slice(&report.data).unwrap();
    assert_eq!(
        (r.device_id.as_str(), r.kind.as_str()),
        ("dev-b", "unknown-run"),
        "{r:?}"
    );

    eprintln!("{:?}: The probe key is", started.elapsed());
    // The probe key is the only one it may get, and nobody can write it: a device cannot store a value there to
    // read it back.
    let probe = format!("$KV.{}.dev-b.probe", kv::DIAGNOSTICS_BUNDLE);
    let answer = ask(&b, "dev-b", &probe, &bundle("dev-b", RUN_B, b_line));
    assert!(
        !answer.contains("\"seq\"") && answer.contains("invalid key"),
        "dev-b's write of its probe key: {answer}"
    );
    let got = ask(
        &b,
        "dev-b",
        &fleet_wire::auth::direct_get_subject(kv::DIAGNOSTICS_BUNDLE, &probe),
        b"",
    );
    assert!(!got.contains(b_line), "dev-b read a value at its probe key");

    eprintln!("{:?}: (iii) B cannot answer", started.elapsed());
    // (iii) B cannot answer for A: a write of A's bundle key is refused by the permissions, and A's bundle is as A
    // wrote it.
    b.conn
        .publish(&a_subject, bundle("dev-a", RUN_A, "forged by dev-b"))
        .expect("publish");
    refused(&b, &a_subject, "dev-b writing dev-a's bundle");
    let got = ask_refused(
        &b,
        "dev-b",
        &a_subject,
        &bundle("dev-a", RUN_A, "forged by dev-b"),
    );
    assert!(
        !got.contains("\"seq\""),
        "dev-b's forged bundle was taken: {got}"
    );
    let a_now = bundles.entry(&a_key).unwrap().expect("dev-a's bundle");
    assert_eq!(
        (a_now.revision, a_now.value),
        (a_stored.revision, a_stored.value.clone()),
        "dev-a's bundle was changed by dev-b"
    );

    eprintln!("{:?}: (v) B cannot read", started.elapsed());
    // (v) B cannot read A's requests (what was asked of A, and when).
    for filter in [
        format!("$KV.{}.{a_key}", kv::DIAGNOSTICS_REQUEST),
        format!("$KV.{}.dev-a.>", kv::DIAGNOSTICS_REQUEST),
    ] {
        let get = fleet_wire::auth::direct_get_subject(kv::DIAGNOSTICS_REQUEST, &filter);
        let got = ask_refused(&b, "dev-b", &get, b"");
        assert!(
            !got.contains("\"lines\""),
            "dev-b read dev-a's request with {get}"
        );
        refused(&b, &get, "dev-b reading dev-a's request");
    }

    eprintln!("{:?}: Once the request is gone", started.elapsed());
    // Once the request is gone (answered or withdrawn: the operator deletes its key), A's answer is refused.
    let again = ask(
        &a,
        "dev-a",
        &a_subject,
        &bundle("dev-a", RUN_A, "second answer"),
    );
    assert!(
        again.contains("\"seq\""),
        "dev-a's second answer while its request exists: {again}"
    );
    requests.delete(&a_key).expect("delete dev-a's request");
    let late = ask(
        &a,
        "dev-a",
        &a_subject,
        &bundle("dev-a", RUN_A, "late answer"),
    );
    assert!(
        late.contains("no intent for run"),
        "dev-a's answer to a deleted request was not refused: {late}"
    );
    let kept = bundles.entry(&a_key).unwrap().expect("dev-a's bundle");
    assert!(
        String::from_utf8_lossy(&kept.value).contains("second answer"),
        "dev-a's bundle changed after its request was deleted"
    );
    eprintln!("{:?}: Both devices stayed", started.elapsed());
    // Both devices stayed connected through all of it (a violation is refused, not a reason to disconnect).
    assert!(
        a.errors.lock().unwrap().is_empty(),
        "{:?}",
        a.errors.lock().unwrap()
    );
    assert_eq!(a.conn.flush_timeout(Duration::from_secs(5)).ok(), Some(()));
    assert_eq!(b.conn.flush_timeout(Duration::from_secs(5)).ok(), Some(()));
    drop(jwks);
}
