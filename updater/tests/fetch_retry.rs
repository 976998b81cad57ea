//! How often a download is tried again, through the production path (the real `fleet-fetch` helper as the
//! agent user) against hostile HTTPS servers: one that always fails with 503 gets the documented 6 tries; one
//! that answers with too many headers is not tried again; one that ignores `Range` and cuts every transfer at
//! the same byte gets 1 try that adds bytes and 6 that add none, not all 32 (re-sent bytes are not progress);
//! a 5xx or 429 says the server is failing, not that the artifact may be missing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use fleet_rig::https::{HttpsServer, Reply, Request};
use fleet_updater::fetch_runner::{production, Fetcher, HelperFetcher, Retry};
use fleet_wire::{AgentUpgradeAttempt, UpgradeReason};
use std::sync::Arc;
use std::time::Duration;

/// The default policy with short pauses: the counts are what these tests are about (the pauses' lengths are
/// the unit test `the_default_schedule_is_the_documented_one`).
fn quick() -> Retry {
    Retry {
        first_backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(80),
        ..Retry::default()
    }
}

// The scene (dirs and CA): common::Scene.
impl Scene {
    fn fetcher(&self) -> HelperFetcher {
        production(
            fetch_helper_in(self.dir.path()),
            "fleet-agent",
            Some(self.ca.ca_file()),
        )
        .expect("fetcher")
        .with_retry(quick())
    }
}

fn attempt(url: &str, bytes: &[u8]) -> AgentUpgradeAttempt {
    let mut a = attempt_for(bytes, TARGET);
    a.artifact = url.parse().expect("url");
    a
}

#[test]
fn a_server_error_gets_the_documented_six_tries_and_says_the_server_failed() {
    let scene = Scene::new();
    for status in [503u16, 429] {
        let server = HttpsServer::start(&scene.ca, move |_| Reply::status(status, &[]));
        let a = attempt(&server.url("/fleet-agent"), b"agent");
        let e = scene
            .fetcher()
            .fetch(&a, &scene.downloads)
            .expect_err("fails");
        assert_eq!(e.reason, UpgradeReason::DownloadFailed, "{}", e.message);
        assert_eq!(
            server.requests().len(),
            6,
            "HTTP {status}: tries (docs/artifacts.md: 6 in a row without a new byte)"
        );
        assert!(
            e.message.contains("tried again") && !e.message.contains("readable anonymously"),
            "HTTP {status}: {}",
            e.message
        );
    }
}

#[test]
fn too_many_headers_is_not_tried_again() {
    let scene = Scene::new();
    let headers: Vec<(String, String)> = (0..300)
        .map(|i| (format!("X-Filler-{i}"), "x".to_string()))
        .collect();
    let server = HttpsServer::start(&scene.ca, move |_| Reply::Body {
        status: 200,
        headers: headers.clone(),
        body: Arc::new(b"agent".to_vec()),
    });
    let a = attempt(&server.url("/fleet-agent"), b"agent");
    let e = scene
        .fetcher()
        .fetch(&a, &scene.downloads)
        .expect_err("fails");
    assert!(e.message.contains("too many headers"), "{}", e.message);
    assert_eq!(server.requests().len(), 1, "a protocol violation is final");
}

#[test]
fn a_server_that_ignores_range_and_cuts_every_transfer_is_not_tried_32_times() {
    let scene = Scene::new();
    let body: Arc<Vec<u8>> = Arc::new((0..256 * 1024).map(|i| (i * 7 % 251) as u8).collect());
    let b = body.clone();
    let server = HttpsServer::start(&scene.ca, move |req| {
        // Range is ignored: every answer is the whole artifact from zero, cut after the same 4 KiB.
        let whole = Request {
            headers: Vec::new(),
            ..req.clone()
        };
        Reply::ranged(&whole, b.clone(), "\"v1\"", Some(4096))
    });
    let a = attempt(&server.url("/fleet-agent"), &body);
    let e = scene
        .fetcher()
        .fetch(&a, &scene.downloads)
        .expect_err("fails");
    assert_eq!(e.reason, UpgradeReason::DownloadFailed, "{}", e.message);
    let reqs = server.requests();
    assert_eq!(
        reqs.len(),
        7,
        "one try that adds 4 KiB, then 6 that only send the same bytes again"
    );
    assert!(
        reqs[1..]
            .iter()
            .all(|r| r.header("range") == Some("bytes=4096-")),
        "every later try asked to resume: {reqs:#?}"
    );
}
