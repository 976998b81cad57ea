//! Acceptance tests of `fetch` for `https://` artifacts against a real rustls HTTPS server whose certificate
//! comes from a CA generated per test (fleet-rig): success, wrong SHA-256, oversize declared and streamed, a
//! refused redirect, a stalling server hitting the time-out, an untrusted server, and no temp file left behind.

use fleet_rig::https::{HttpsServer, Reply};
use fleet_rig::tls::TestCa;
use fleet_updater::fetch_helper::{fetch, FetchConfig, FetchError};
use fleet_wire::{fixtures, AgentUpgradeAttempt, ByteLimit, Sha256Hex, UpgradeReason};
use sha2::{Digest, Sha256};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

fn sha(b: &[u8]) -> Sha256Hex {
    Sha256Hex::from_bytes(Sha256::digest(b).into())
}

fn attempt(artifact: &str, sha256: Sha256Hex, limit: u64) -> AgentUpgradeAttempt {
    let mut a = fixtures::attempt();
    a.artifact = artifact.parse().expect("artifact");
    a.sha256 = sha256;
    a.byte_limit = ByteLimit::try_from(limit).expect("limit");
    a
}

fn cfg(ca: &TestCa) -> FetchConfig {
    FetchConfig::default()
        .with_ca_file(ca.ca_file())
        .expect("CA bundle")
}

fn binary(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 % 251) as u8).collect()
}

#[track_caller]
fn assert_empty(dir: &Path) {
    let left: Vec<_> = std::fs::read_dir(dir)
        .expect("ls")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert!(left.is_empty(), "temporary files left behind: {left:?}");
}

#[test]
fn downloads_and_verifies() {
    let ca = TestCa::new();
    let body = binary(3 * 1024 * 1024 + 17);
    let server = HttpsServer::serve(&ca, Reply::ok(body.clone()));
    let tmp = tempfile::tempdir().expect("tmp");
    let a = attempt(&server.url("/fleet-agent-arm64"), sha(&body), 4 << 20);
    let f = fetch(&a, tmp.path(), &cfg(&ca)).expect("fetch");
    assert_eq!(f.bytes, body.len() as u64);
    assert_eq!(f.sha256, sha(&body));
    assert_eq!(
        f.path.parent(),
        Some(tmp.path()),
        "temp file inside tmp_dir"
    );
    assert_eq!(std::fs::read(&f.path).expect("read"), body);
    let mode = std::fs::metadata(&f.path)
        .expect("meta")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    // The limit is inclusive: exactly `limit` bytes pass.
    std::fs::remove_file(&f.path).expect("rm");
    let exact = attempt(&server.url("/x"), sha(&body), body.len() as u64);
    let f = fetch(&exact, tmp.path(), &cfg(&ca)).expect("exact limit");
    assert_eq!(f.bytes, body.len() as u64);
}

#[test]
fn wrong_sha256_is_a_digest_mismatch() {
    let ca = TestCa::new();
    let server = HttpsServer::serve(&ca, Reply::ok(binary(100_000)));
    let tmp = tempfile::tempdir().expect("tmp");
    let a = attempt(&server.url("/a"), sha(b"another build"), 1 << 20);
    let e = fetch(&a, tmp.path(), &cfg(&ca)).expect_err("mismatch");
    assert!(
        matches!(
            e,
            FetchError::DigestMismatch {
                what: "artifact",
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(e.reason(), UpgradeReason::DigestMismatch);
    assert_empty(tmp.path());
}

#[test]
fn declared_oversize_is_refused_up_front() {
    let ca = TestCa::new();
    let server = HttpsServer::serve(
        &ca,
        Reply::DeclaredLength {
            declared: 50 * 1024 * 1024,
            sent: 1024 * 1024,
        },
    );
    let tmp = tempfile::tempdir().expect("tmp");
    let a = attempt(&server.url("/a"), sha(b"x"), 10 * 1024 * 1024);
    let e = fetch(&a, tmp.path(), &cfg(&ca)).expect_err("too large");
    assert!(
        matches!(e, FetchError::DeclaredTooLarge { declared, limit } if declared == 50 << 20 && limit == 10 << 20),
        "{e}"
    );
    assert_eq!(e.reason(), UpgradeReason::ArtifactTooLarge);
    assert_empty(tmp.path());
}

#[test]
fn streamed_oversize_without_length_is_cut_off() {
    let ca = TestCa::new();
    // 64 MiB offered without Content-Length; the limit is 1 MiB.
    let server = HttpsServer::serve(&ca, Reply::Unsized { bytes: 64 << 20 });
    let tmp = tempfile::tempdir().expect("tmp");
    let a = attempt(&server.url("/a"), sha(b"x"), 1 << 20);
    let e = fetch(&a, tmp.path(), &cfg(&ca)).expect_err("too large");
    assert!(
        matches!(e, FetchError::StreamedTooLarge { limit } if limit == 1 << 20),
        "{e}"
    );
    assert_eq!(e.reason(), UpgradeReason::ArtifactTooLarge);
    assert_empty(tmp.path());
}

#[test]
fn a_redirect_is_refused_never_followed() {
    let ca = TestCa::new();
    let body = binary(1000);
    let served = body.clone();
    let server = HttpsServer::start(&ca, move |req| match req.path() {
        "/moved" => Reply::Redirect {
            status: 302,
            location: "/final".into(),
        },
        _ => Reply::ok(served.clone()),
    });
    let tmp = tempfile::tempdir().expect("tmp");
    for _ in 0..2 {
        let a = attempt(&server.url("/moved"), sha(&body), 1 << 20);
        let e = fetch(&a, tmp.path(), &cfg(&ca)).expect_err("redirect");
        assert!(
            matches!(e, FetchError::Redirected { status: 302, .. }),
            "{e}"
        );
        assert_eq!(e.reason(), UpgradeReason::DownloadFailed);
    }
    let paths: Vec<String> = server.requests().iter().map(|r| r.target.clone()).collect();
    assert_eq!(
        paths,
        ["/moved", "/moved"],
        "the redirect target was requested"
    );
    assert_empty(tmp.path());
}

#[test]
fn a_stalling_server_hits_the_request_timeout() {
    let ca = TestCa::new();
    let server = HttpsServer::serve(
        &ca,
        Reply::StallAfterHeaders {
            content_length: 1 << 20,
        },
    );
    let tmp = tempfile::tempdir().expect("tmp");
    let a = attempt(&server.url("/a"), sha(b"x"), 2 << 20);
    let cfg = FetchConfig {
        request_timeout: Duration::from_secs(2),
        ..cfg(&ca)
    };
    let started = Instant::now();
    let e = fetch(&a, tmp.path(), &cfg).expect_err("timeout");
    let took = started.elapsed();
    assert!(matches!(e, FetchError::TimedOut { .. }), "{e}");
    assert_eq!(e.reason(), UpgradeReason::DownloadFailed);
    assert!(took >= Duration::from_secs(2), "gave up early: {took:?}");
    assert!(
        took < Duration::from_secs(30),
        "time-out not enforced: {took:?}"
    );
    assert_empty(tmp.path());
}

#[test]
fn untrusted_server_and_http_errors_fail_the_download() {
    let ca = TestCa::new();
    let other = TestCa::new();
    let server = HttpsServer::start(&other, |req| match req.path() {
        "/missing" => Reply::status(404, &[]),
        _ => Reply::ok(b"agent".to_vec()),
    });
    let tmp = tempfile::tempdir().expect("tmp");
    // Signed by a CA the updater does not trust.
    let a = attempt(&server.url("/a"), sha(b"agent"), 1 << 20);
    let e = fetch(&a, tmp.path(), &cfg(&ca)).expect_err("untrusted");
    assert!(matches!(e, FetchError::Transport { .. }), "{e}");
    assert_eq!(e.reason(), UpgradeReason::DownloadFailed);
    // Trusted: an HTTP error status.
    let a = attempt(&server.url("/missing"), sha(b"agent"), 1 << 20);
    let e = fetch(&a, tmp.path(), &cfg(&other)).expect_err("404");
    assert!(matches!(e, FetchError::Status { status: 404, .. }), "{e}");
    // Nothing listening.
    let port = fleet_rig::free_port();
    let a = attempt(
        &format!("https://127.0.0.1:{port}/a"),
        sha(b"agent"),
        1 << 20,
    );
    let e = fetch(&a, tmp.path(), &cfg(&other)).expect_err("refused");
    assert_eq!(e.reason(), UpgradeReason::DownloadFailed, "{e}");
    assert_empty(tmp.path());
}

#[test]
fn ca_file_errors_are_clear() {
    let tmp = tempfile::tempdir().expect("tmp");
    let e = FetchConfig::default()
        .with_ca_file(&tmp.path().join("missing.pem"))
        .expect_err("missing");
    assert!(e.to_string().contains("missing.pem"), "{e}");
    let empty = tmp.path().join("empty.pem");
    std::fs::write(&empty, "not a certificate\n").expect("write");
    let e = FetchConfig::default()
        .with_ca_file(&empty)
        .expect_err("no certs");
    assert!(e.to_string().contains("no PEM certificate"), "{e}");
    let d = FetchConfig::default();
    assert_eq!(d.connect_timeout, fleet_wire::limits::HTTPS_CONNECT_TIMEOUT);
    assert_eq!(d.request_timeout, fleet_wire::limits::HTTPS_REQUEST_TIMEOUT);
}
