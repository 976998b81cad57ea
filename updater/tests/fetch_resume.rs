//! Resumable downloads through the production path (the real `fleet-fetch` helper as the agent user, the
//! updater side appending to its partial download) against the rig's HTTPS server playing a file server with
//! range support whose link drops at random offsets: the download completes with the right digest across a
//! SIGKILLed updater process; a server that ignores `Range`, one whose content changed (with or without new
//! validators, honouring `If-Range` or not, answering 416) restarts from zero and still verifies; an OCI blob
//! resumes behind a registry's storage redirect.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use fleet_rig::https::{HttpsServer, Reply, Request};
use fleet_rig::registry::{artifact_manifest, digest};
use fleet_rig::tls::TestCa;
use fleet_updater::fetch_runner::{production, Fetcher, HelperFetcher, Retry};
use fleet_wire::artifact::{OCI_AGENT_ARTIFACT_TYPE, OCI_AGENT_LAYER_MEDIA_TYPE};
use fleet_wire::AgentUpgradeAttempt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Environment of the child process that plays the updater killed mid-download.
const CHILD_ENV: &str = "FLEET_RESUME_TEST_CHILD";

/// Deterministic bytes (xorshift), so a failure can be replayed from the printed seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }

    fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo)
    }
}

fn seed() -> u64 {
    let s = std::env::var("FLEET_RESUME_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
                | 1
        });
    eprintln!("FLEET_RESUME_SEED={s}");
    s
}

/// Quick retries: the backoff's length is not what these tests are about.
fn quick() -> Retry {
    Retry {
        first_backoff: Duration::from_millis(50),
        max_backoff: Duration::from_millis(200),
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

    /// Fetches and checks the result: the attempt's digest, the bytes, nothing else left behind.
    fn fetch_ok(&self, f: &HelperFetcher, a: &AgentUpgradeAttempt, want: &[u8]) {
        let d = f.fetch(a, &self.downloads).expect("the download completes");
        assert_eq!(d.sha256, a.sha256);
        assert_eq!(std::fs::read(&d.path).expect("read"), want);
        std::fs::remove_file(&d.path).expect("rm");
        let left: Vec<_> = std::fs::read_dir(&self.downloads).expect("ls").collect();
        assert!(left.is_empty(), "left behind: {left:?}");
    }

    /// Bytes held in the partial download (0 when none).
    fn held(&self) -> u64 {
        std::fs::read_dir(&self.downloads)
            .expect("ls")
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".part"))
            .filter_map(|e| e.metadata().ok())
            .map(|m| m.len())
            .sum()
    }
}

fn attempt(url: &str, bytes: &[u8]) -> AgentUpgradeAttempt {
    let mut a = attempt_for(bytes, TARGET);
    a.artifact = url.parse().expect("url");
    a
}

/// The `N` of a request's `Range: bytes=N-`.
fn range_start(r: &Request) -> Option<u64> {
    r.header("range")?
        .strip_prefix("bytes=")?
        .strip_suffix('-')?
        .parse()
        .ok()
}

/// What the flaky server does: how its body is picked and when a response is cut.
type Pick = dyn Fn(&Request, usize) -> Reply + Send + Sync;

/// An HTTPS server that answers through `pick` (given the request and its number, from 0), counting the body
/// bytes it sends.
fn counting_server(
    ca: &TestCa,
    pick: impl Fn(&Request, usize) -> Reply + Send + Sync + 'static,
) -> (HttpsServer, Arc<AtomicU64>) {
    let sent = Arc::new(AtomicU64::new(0));
    let n = Arc::new(Mutex::new(0usize));
    let (s, pick): (Arc<AtomicU64>, Box<Pick>) = (sent.clone(), Box::new(pick));
    let server = HttpsServer::start(ca, move |req| {
        let i = {
            let mut n = n.lock().unwrap();
            *n += 1;
            *n - 1
        };
        let reply = pick(req, i);
        s.fetch_add(reply.body_bytes(), Ordering::Relaxed);
        reply
    });
    (server, sent)
}

/// Child mode: run one fetch as the updater would and never return (the parent kills this process).
#[test]
fn child_fetch_for_the_restart_test() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let [url, sha, ca, helper, downloads]: [&str; 5] = spec
        .split('\n')
        .collect::<Vec<_>>()
        .try_into()
        .expect("spec");
    let mut a = attempt_for(b"", TARGET);
    a.artifact = url.parse().expect("url");
    a.sha256 = sha.try_into().expect("sha");
    let f = production(helper.into(), "fleet-agent", Some(Path::new(ca)))
        .expect("fetcher")
        .with_retry(Retry {
            // Long pauses: the parent kills this process while it holds bytes, between tries.
            first_backoff: Duration::from_secs(60),
            ..Retry::default()
        });
    let r = f.fetch(&a, Path::new(downloads));
    panic!("the child fetch was meant to be killed, it ended: {r:?}");
}

#[test]
fn a_link_that_drops_at_random_offsets_completes_across_an_updater_restart() {
    let scene = Scene::new();
    let mut rng = Rng(seed());
    // Every response but the last is cut somewhere in its first 1.5 MiB: a link that drops every so often. The
    // artifact is larger than six cuts can be together, so every cut happens (with 6 MiB, one seed in several
    // reached the end early: FLEET_RESUME_SEED=1796197310618259017 made 6 requests, not 7).
    let cuts: Vec<u64> = (0..6).map(|_| rng.between(64 << 10, 1536 << 10)).collect();
    let size = 10 << 20;
    assert!(cuts.iter().sum::<u64>() < size as u64);
    let artifact = Arc::new(rng.bytes(size));
    let (body, c) = (artifact.clone(), cuts.clone());
    let (server, sent) = counting_server(&scene.ca, move |req, i| {
        Reply::ranged(req, body.clone(), "\"v1\"", c.get(i).copied())
    });
    let a = attempt(&server.url("/fleet-agent"), &artifact);

    // The updater (a child process running the same fetch) is SIGKILLed while it holds the first drop's bytes.
    let spec = [
        server.url("/fleet-agent"),
        a.sha256.to_string(),
        scene.ca.ca_file().display().to_string(),
        fetch_helper_in(scene.dir.path()).display().to_string(),
        scene.downloads.display().to_string(),
    ]
    .join("\n");
    let mut child = std::process::Command::new(std::env::current_exe().expect("exe"))
        .args(["--exact", "child_fetch_for_the_restart_test", "--nocapture"])
        .env(CHILD_ENV, spec)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("spawn the child updater");
    let until = Instant::now() + Duration::from_secs(60);
    while scene.held() < cuts[0] && Instant::now() < until {
        // why: pacing of the bounded poll for the held bytes
        std::thread::sleep(Duration::from_millis(20));
    }
    // why: no event shows the child parked on the dropped connection (not mid-write); a margin before the kill
    std::thread::sleep(Duration::from_millis(200));
    child.kill().expect("SIGKILL the child updater");
    child.wait().expect("reap");
    let held = scene.held();
    assert_eq!(
        held, cuts[0],
        "the first response's bytes are held after the kill"
    );
    assert_eq!(server.requests().len(), 1);

    // The restarted updater resumes after the held bytes, through every further drop, and verifies the whole.
    scene.fetch_ok(&scene.fetcher(), &a, &artifact);
    let reqs = server.requests();
    assert_eq!(
        range_start(&reqs[1]),
        Some(held),
        "resumed after the held bytes"
    );
    assert_eq!(reqs[1].header("if-range"), Some("\"v1\""));
    assert_eq!(
        reqs.len(),
        cuts.len() + 1,
        "one request per drop, and the last"
    );
    let total = sent.load(Ordering::Relaxed);
    eprintln!(
        "{size} bytes delivered with {total} bytes sent over {} drops",
        cuts.len()
    );
    assert_eq!(total, size as u64, "not a byte sent twice");
}

#[test]
fn servers_that_cannot_continue_restart_from_zero_and_still_verify() {
    let scene = Scene::new();
    let mut rng = Rng(seed());
    let good = Arc::new(rng.bytes(3 << 20));
    let old = Arc::new(rng.bytes(3 << 20));
    let cut_at = rng.between(256 << 10, 2 << 20);
    let cut = Some(cut_at);
    // Each server cuts its first response; what it answers to the resumed request differs.
    type Behaviour =
        Box<dyn Fn(&Request, usize, &Arc<Vec<u8>>, &Arc<Vec<u8>>) -> Reply + Send + Sync>;
    let cases: Vec<(&str, Behaviour, usize)> = vec![
        (
            "ignores Range: 200 with everything",
            Box::new(move |_, i, good, _| Reply::Slice {
                status: 200,
                headers: vec![("ETag".into(), "\"v1\"".into())],
                body: good.clone(),
                start: 0,
                cut_after: if i == 0 { cut } else { None },
            }),
            2,
        ),
        (
            "content changed, If-Range honoured: 200 with the new build",
            Box::new(move |req, i, good, old| match i {
                0 => Reply::ranged(req, old.clone(), "\"old\"", cut),
                _ => Reply::ranged(req, good.clone(), "\"new\"", None),
            }),
            2,
        ),
        (
            "content changed, If-Range ignored: 206 of the new build under a new ETag",
            Box::new(move |req, i, good, old| match i {
                0 => Reply::ranged(req, old.clone(), "\"old\"", cut),
                _ => {
                    let mut r = req.clone();
                    r.headers.retain(|(k, _)| k != "if-range");
                    Reply::ranged(&r, good.clone(), "\"new\"", None)
                }
            }),
            3,
        ),
        (
            "content changed under the same validators: the spliced digest fails, from zero once",
            Box::new(move |req, i, good, old| match i {
                0 => Reply::ranged(req, old.clone(), "\"same\"", cut),
                _ => Reply::ranged(req, good.clone(), "\"same\"", None),
            }),
            3,
        ),
        (
            "416 for the held range",
            Box::new(move |req, i, good, _| match i {
                0 => Reply::ranged(req, good.clone(), "\"v1\"", cut),
                1 => Reply::Body {
                    status: 416,
                    headers: vec![("Content-Range".into(), "bytes */3".into())],
                    body: Arc::new(Vec::new()),
                },
                _ => Reply::ranged(req, good.clone(), "\"v1\"", None),
            }),
            3,
        ),
    ];
    for (name, behave, requests) in cases {
        let (g, o) = (good.clone(), old.clone());
        let (server, sent) = counting_server(&scene.ca, move |req, i| behave(req, i, &g, &o));
        let a = attempt(&server.url("/fleet-agent"), &good);
        scene.fetch_ok(&scene.fetcher(), &a, &good);
        let reqs = server.requests();
        assert_eq!(reqs.len(), requests, "{name}: requests {reqs:#?}");
        assert!(
            range_start(&reqs[1]).is_some(),
            "{name}: the second request resumes"
        );
        // The first response's cut bytes are lost, and the whole artifact comes from zero.
        if requests == 3 {
            assert_eq!(
                range_start(&reqs[2]),
                None,
                "{name}: the third request asks from zero"
            );
        }
        let total = sent.load(Ordering::Relaxed);
        assert!(
            total >= cut_at + good.len() as u64,
            "{name}: {total} bytes sent"
        );
    }
}

#[test]
fn limits_and_refusals_still_hold_when_resuming() {
    let scene = Scene::new();
    let mut rng = Rng(seed());
    let good = Arc::new(rng.bytes(1 << 20));
    let bigger = Arc::new(rng.bytes(3 << 20));
    // After a drop, the server sends another, larger artifact from zero: refused on its declared size.
    let (g, big) = (good.clone(), bigger.clone());
    let (server, _) = counting_server(&scene.ca, move |req, i| match i {
        0 => Reply::ranged(req, g.clone(), "\"v1\"", Some(1000)),
        _ => Reply::ranged(
            &Request {
                headers: Vec::new(),
                ..req.clone()
            },
            big.clone(),
            "\"v2\"",
            None,
        ),
    });
    let mut a = attempt(&server.url("/fleet-agent"), &good);
    a.byte_limit = (2u64 << 20).try_into().expect("limit");
    let e = scene
        .fetcher()
        .fetch(&a, &scene.downloads)
        .expect_err("too large");
    assert_eq!(
        e.reason,
        fleet_wire::UpgradeReason::ArtifactTooLarge,
        "{}",
        e.message
    );
    assert_eq!(scene.held(), 0, "refused bytes are not kept");

    // A server that keeps dropping before a byte arrives: bounded tries, then a failure that keeps what is held.
    let g = good.clone();
    let (server, _) = counting_server(&scene.ca, move |req, i| {
        Reply::ranged(
            req,
            g.clone(),
            "\"v1\"",
            Some(if i == 0 { 4096 } else { 0 }),
        )
    });
    let a = attempt(&server.url("/fleet-agent"), &good);
    let f = scene.fetcher().with_retry(Retry {
        max_fruitless: 3,
        ..quick()
    });
    let e = f.fetch(&a, &scene.downloads).expect_err("gives up");
    assert_eq!(
        e.reason,
        fleet_wire::UpgradeReason::DownloadFailed,
        "{}",
        e.message
    );
    assert_eq!(
        server.requests().len(),
        4,
        "one try with bytes, then three in a row without"
    );
    assert_eq!(scene.held(), 4096, "held for the next attempt");

    // The whole fetch's deadline bounds every try and pause.
    let f = scene
        .fetcher()
        .with_retry(Retry {
            // One pause longer than the whole deadline (quick()'s 200 ms cap would let the run of fruitless tries
            // end first on a fast machine, and the test would time the race instead of the deadline).
            first_backoff: Duration::from_secs(5),
            max_backoff: Duration::from_secs(5),
            ..quick()
        })
        .with_deadline(Duration::from_secs(2), Duration::from_secs(5));
    let started = Instant::now();
    let e = f.fetch(&a, &scene.downloads).expect_err("deadline");
    assert!(e.message.contains("did not finish within"), "{}", e.message);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );

    let reqs = server.requests();
    assert!(
        reqs[1..].iter().all(|r| range_start(r) == Some(4096)),
        "{reqs:#?}"
    );
}

#[test]
fn an_oci_blob_resumes_behind_a_storage_redirect() {
    let scene = Scene::new();
    let mut rng = Rng(seed());
    let agent = Arc::new(rng.bytes(2 << 20));
    let cut = rng.between(64 << 10, 1 << 20);
    let manifest = artifact_manifest(
        Some(OCI_AGENT_ARTIFACT_TYPE),
        &[(OCI_AGENT_LAYER_MEDIA_TYPE, &agent)],
    );
    let blob_path = format!("/v2/harmony/fleet-agent/blobs/{}", digest(&agent));
    let storage_hits = Arc::new(AtomicU64::new(0));
    let (ag, hits) = (agent.clone(), storage_hits.clone());
    let (server, sent) = counting_server(&scene.ca, move |req, _| match req.path() {
        "/v2/harmony/fleet-agent/manifests/1.2.0" => Reply::Body {
            status: 200,
            headers: vec![(
                "Content-Type".into(),
                "application/vnd.oci.image.manifest.v1+json".into(),
            )],
            body: Arc::new(manifest.clone()),
        },
        p if p == blob_path => Reply::Redirect {
            status: 307,
            location: "/storage/blob?X-Signature=secret".into(),
        },
        "/storage/blob" => {
            let first = hits.fetch_add(1, Ordering::Relaxed) == 0;
            Reply::ranged(req, ag.clone(), "\"blob-etag\"", first.then_some(cut))
        }
        _ => Reply::status(404, &[]),
    });
    let a = attempt(
        &format!(
            "oci://127.0.0.1:{}/harmony/fleet-agent:1.2.0",
            server.port()
        ),
        &agent,
    );
    scene.fetch_ok(&scene.fetcher(), &a, &agent);
    let storage: Vec<_> = server
        .requests()
        .into_iter()
        .filter(|r| r.path() == "/storage/blob")
        .collect();
    assert_eq!(storage.len(), 2, "{storage:#?}");
    assert_eq!(
        range_start(&storage[1]),
        Some(cut),
        "the range follows the redirect"
    );
    assert!(sent.load(Ordering::Relaxed) < agent.len() as u64 + 64 * 1024);
}
