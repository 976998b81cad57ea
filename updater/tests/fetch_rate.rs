//! The download's bandwidth cap (`download_max_bytes_per_sec`) through the production path: the real `fleet-fetch`
//! helper as the agent user, the updater side appending to its partial download, against the rig's HTTPS server
//! with range support. A 2 MiB artifact under a 512 KiB/s cap cannot arrive in less than 4 s — the token bucket
//! starts empty in every helper run, so the bytes of a run never outnumber the rate times its duration — whether
//! the link holds or drops half way (the resumed try is capped too). Only this lower bound is asserted: it cannot
//! fail from load; how close to the cap a download gets is the benchmark's (`scripts/bench resume`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use fleet_rig::https::{HttpsServer, Reply};
use fleet_updater::fetch_runner::{production, Fetcher, HelperFetcher, Retry};
use std::num::NonZeroU64;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SIZE: usize = 2 << 20;
const CAP: u64 = 512 * 1024;

// The scene (dirs and CA): common::Scene.
impl Scene {
    fn fetcher(&self, cap: Option<u64>) -> HelperFetcher {
        production(
            fetch_helper_in(self.dir.path()),
            "fleet-agent",
            Some(self.ca.ca_file()),
        )
        .expect("fetcher")
        .with_retry(Retry {
            first_backoff: Duration::from_millis(50),
            ..Retry::default()
        })
        .with_max_bytes_per_sec(cap.and_then(NonZeroU64::new))
    }

    /// Serves `body` with range support, cutting the first response after `cut` bytes when set; counts the
    /// requests and the body bytes sent.
    fn server(
        &self,
        body: &[u8],
        cut: Option<u64>,
    ) -> (HttpsServer, Arc<AtomicUsize>, Arc<AtomicU64>) {
        let body = Arc::new(body.to_vec());
        let requests = Arc::new(AtomicUsize::new(0));
        let sent = Arc::new(AtomicU64::new(0));
        let (r, s) = (requests.clone(), sent.clone());
        let server = HttpsServer::start(&self.ca, move |req| {
            let i = r.fetch_add(1, Ordering::SeqCst);
            let reply = Reply::ranged(req, body.clone(), "\"rate\"", cut.filter(|_| i == 0));
            s.fetch_add(reply.body_bytes(), Ordering::SeqCst);
            reply
        });
        (server, requests, sent)
    }
}

fn body() -> Vec<u8> {
    (0..SIZE).map(|i| (i * 131 % 251) as u8).collect()
}

/// Fetches `want` with `f` from `server`, checks the bytes and that nothing is left behind; returns the time taken.
fn fetch_timed(scene: &Scene, f: &HelperFetcher, server: &HttpsServer, want: &[u8]) -> Duration {
    let mut a = attempt_for(want, TARGET);
    a.artifact = server.url("/fleet-agent").parse().expect("url");
    let started = Instant::now();
    let d = f
        .fetch(&a, &scene.downloads)
        .expect("the download completes");
    let took = started.elapsed();
    assert_eq!(d.sha256, a.sha256);
    assert_eq!(std::fs::read(&d.path).expect("read"), want);
    std::fs::remove_file(&d.path).expect("rm");
    let left: Vec<_> = std::fs::read_dir(&scene.downloads).expect("ls").collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    took
}

/// The least time `SIZE` bytes can take under `CAP`.
fn floor() -> Duration {
    Duration::from_secs_f64(SIZE as f64 / CAP as f64)
}

#[test]
fn a_capped_download_takes_at_least_its_size_over_the_cap() {
    let scene = Scene::new();
    let want = body();
    let (server, requests, sent) = scene.server(&want, None);
    let took = fetch_timed(&scene, &scene.fetcher(Some(CAP)), &server, &want);
    eprintln!(
        "2 MiB at {CAP} B/s: {:.2} s ({:.0} B/s)",
        took.as_secs_f64(),
        SIZE as f64 / took.as_secs_f64()
    );
    assert!(
        took >= floor(),
        "2 MiB under a {CAP} B/s cap arrived in {took:?}, faster than the cap allows ({:?})",
        floor()
    );
    assert_eq!(requests.load(Ordering::SeqCst), 1);
    assert_eq!(sent.load(Ordering::SeqCst), SIZE as u64);
}

#[test]
fn a_dropped_link_resumes_under_the_cap() {
    let scene = Scene::new();
    let want = body();
    let (server, requests, sent) = scene.server(&want, Some(SIZE as u64 / 2));
    let took = fetch_timed(&scene, &scene.fetcher(Some(CAP)), &server, &want);
    eprintln!(
        "2 MiB at {CAP} B/s, dropped at 1 MiB: {:.2} s",
        took.as_secs_f64()
    );
    // Resumed, not started again: the second request sent the second half only.
    assert_eq!(requests.load(Ordering::SeqCst), 2);
    assert_eq!(sent.load(Ordering::SeqCst), SIZE as u64);
    assert!(
        took >= floor(),
        "2 MiB under a {CAP} B/s cap over a dropped link arrived in {took:?}, faster than the cap allows ({:?})",
        floor()
    );
}
