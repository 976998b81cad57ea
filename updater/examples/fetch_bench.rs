//! Benchmark helper for `scripts/bench.d/20-download.sh`: `serve` runs the fleet-rig HTTPS server (a fresh test CA)
//! for one file; `fetch` downloads and verifies it through the updater's production path (the `fleet-fetch`
//! helper run as the agent user, re-checked and written by this process) and reports time and peak RSS of both.
//!
//! `fetch_bench serve <file> <ca.pem out>` prints the URL and serves until stdin closes.
//! `fetch_bench fetch <url> <sha256> <ca.pem> <tmp dir> <fleet-fetch>` prints
//! `bytes=<n> seconds=<s> vmhwm_kib=<updater side> helper_kib=<helper>`.
//! `fetch_bench resume <MiB> <drops> <seed> <tmp dir> <fleet-fetch>` serves a random artifact of that size from a
//! range-capable server whose first `<drops>` responses are cut at random points, fetches it with resuming and
//! then without (every try from zero, the reference), and prints one line per run:
//! `mode=<resume|from-zero> bytes_sent=<n> requests=<n> seconds=<s>`.
//! `fetch_bench cap <MiB> <bytes/s> <drop at MiB, 0: none> <tmp dir> <fleet-fetch>` serves a random artifact of
//! that size from a range-capable server whose first response is cut at the drop point (if any), fetches it through
//! the production path under the bandwidth cap (`download_max_bytes_per_sec`), then with `curl --limit-rate` (the
//! reference; `-C - --retry` with a drop), sampling the bytes received (the partial download's, curl's output
//! file's) every 50 ms, and prints one line per tool:
//! `tool=<fleet-fetch|curl> seconds=<s> bytes_sent=<n> requests=<n> max5s=<B/s> min5s=<B/s>` (the highest and
//! lowest rate over every 5-s window of the samples).

use fleet_rig::https::{HttpsServer, Reply};
use fleet_rig::tls::TestCa;
use fleet_updater::fetch_runner::{production, Fetcher, Retry};
use fleet_wire::limits::ARTIFACT_MAX_BYTES;
use fleet_wire::{fixtures, ByteLimit, Sha256Hex};
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let code = match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["serve", file, ca_out] => serve(file, ca_out),
        ["fetch", url, sha, ca, tmp, helper] => run_fetch(url, sha, ca, tmp, helper),
        ["resume", mib, drops, seed, tmp, helper] => run_resume(mib, drops, seed, tmp, helper),
        ["cap", mib, rate, drop, tmp, helper] => run_cap(mib, rate, drop, tmp, helper),
        _ => Err("usage: fetch_bench serve <file> <ca.pem out> | fetch <url> <sha256> <ca.pem> <tmp dir> <fleet-fetch> | resume <MiB> <drops> <seed> <tmp dir> <fleet-fetch> | cap <MiB> <bytes/s> <drop at MiB> <tmp dir> <fleet-fetch>".into()),
    };
    if let Err(e) = code {
        eprintln!("fetch_bench: {e}");
        std::process::exit(1);
    }
}

fn serve(file: &str, ca_out: &str) -> Result<(), String> {
    let ca = TestCa::new();
    std::fs::copy(ca.ca_file(), ca_out).map_err(|e| format!("copy CA to {ca_out}: {e}"))?;
    let server = HttpsServer::serve(&ca, Reply::File(file.into()));
    println!("{}", server.url("/fleet-agent"));
    // Serve until the benchmark script closes our stdin.
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    Ok(())
}

fn run_fetch(url: &str, sha: &str, ca: &str, tmp: &str, helper: &str) -> Result<(), String> {
    let mut attempt = fixtures::attempt();
    attempt.artifact = url.parse().map_err(|e| format!("{e}"))?;
    attempt.sha256 = Sha256Hex::try_from(sha).map_err(|e| format!("{e}"))?;
    attempt.byte_limit = ByteLimit::try_from(ARTIFACT_MAX_BYTES).map_err(|e| format!("{e}"))?;
    let fetcher = production(helper.into(), "fleet-agent", Some(Path::new(ca)))?;
    let started = Instant::now();
    let fetched = fetcher
        .fetch(&attempt, Path::new(tmp))
        .map_err(|e| e.to_string())?;
    let seconds = started.elapsed().as_secs_f64();
    let _ = std::fs::remove_file(&fetched.path);
    println!(
        "bytes={} seconds={seconds:.3} vmhwm_kib={} helper_kib={}",
        fetched.bytes,
        vm_hwm_kib().unwrap_or(0),
        children_max_rss_kib()
    );
    Ok(())
}

fn run_resume(mib: &str, drops: &str, seed: &str, tmp: &str, helper: &str) -> Result<(), String> {
    let num = |what: &str, v: &str| v.parse::<u64>().map_err(|e| format!("{what} {v:?}: {e}"));
    let (size, drops, mut x) = (
        num("MiB", mib)? << 20,
        num("drops", drops)?,
        num("seed", seed)? | 1,
    );
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let body: Arc<Vec<u8>> = Arc::new((0..size).map(|_| next() as u8).collect());
    // Each dropped response is cut somewhere between 2 % and 18 % of the artifact into its body.
    let cuts: Vec<u64> = (0..drops)
        .map(|_| size / 50 + next() % (size * 16 / 100))
        .collect();
    let mut attempt = fixtures::attempt();
    attempt.sha256 = Sha256Hex::from_bytes(Sha256::digest(&body[..]).into());
    attempt.byte_limit = ByteLimit::try_from(ARTIFACT_MAX_BYTES).map_err(|e| format!("{e}"))?;
    let ca = TestCa::new();
    for resume in [true, false] {
        let sent = Arc::new(AtomicU64::new(0));
        let served = Arc::new(AtomicUsize::new(0));
        let (b, c, s, n) = (body.clone(), cuts.clone(), sent.clone(), served.clone());
        let server = HttpsServer::start(&ca, move |req| {
            let i = n.fetch_add(1, Ordering::SeqCst);
            let reply = Reply::ranged(req, b.clone(), "\"bench\"", c.get(i).copied());
            s.fetch_add(reply.body_bytes(), Ordering::SeqCst);
            reply
        });
        attempt.artifact = server
            .url("/fleet-agent")
            .parse()
            .map_err(|e| format!("{e}"))?;
        let fetcher = production(helper.into(), "fleet-agent", Some(ca.ca_file()))?
            .with_resume(resume)
            .with_retry(Retry {
                // The pauses are not what is measured here.
                first_backoff: Duration::from_millis(100),
                ..Retry::default()
            });
        let started = Instant::now();
        let fetched = fetcher
            .fetch(&attempt, Path::new(tmp))
            .map_err(|e| e.to_string())?;
        let seconds = started.elapsed().as_secs_f64();
        let _ = std::fs::remove_file(&fetched.path);
        println!(
            "mode={} bytes_sent={} requests={} seconds={seconds:.3}",
            if resume { "resume" } else { "from-zero" },
            sent.load(Ordering::SeqCst),
            served.load(Ordering::SeqCst),
        );
    }
    Ok(())
}

fn run_cap(mib: &str, rate: &str, drop: &str, tmp: &str, helper: &str) -> Result<(), String> {
    let num = |what: &str, v: &str| v.parse::<u64>().map_err(|e| format!("{what} {v:?}: {e}"));
    let (size, rate, drop) = (
        num("MiB", mib)? << 20,
        num("bytes/s", rate)?,
        num("drop", drop)? << 20,
    );
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let body: Arc<Vec<u8>> = Arc::new(
        (0..size)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect(),
    );
    let sha = Sha256Hex::from_bytes(Sha256::digest(&body[..]).into());
    let ca = TestCa::new();
    let cut = (drop > 0).then_some(drop);
    for tool in ["fleet-fetch", "curl"] {
        let sent = Arc::new(AtomicU64::new(0));
        let served = Arc::new(AtomicUsize::new(0));
        let (b, s, n) = (body.clone(), sent.clone(), served.clone());
        let server = HttpsServer::start(&ca, move |req| {
            let i = n.fetch_add(1, Ordering::SeqCst);
            let reply = Reply::ranged(req, b.clone(), "\"bench\"", cut.filter(|_| i == 0));
            s.fetch_add(reply.body_bytes(), Ordering::SeqCst);
            reply
        });
        let url = server.url("/fleet-agent");
        let started = Instant::now();
        let (samples, seconds) = if tool == "fleet-fetch" {
            let mut attempt = fixtures::attempt();
            attempt.sha256 = sha.clone();
            attempt.byte_limit =
                ByteLimit::try_from(ARTIFACT_MAX_BYTES).map_err(|e| format!("{e}"))?;
            attempt.artifact = url.parse().map_err(|e| format!("{e}"))?;
            let fetcher = production(helper.into(), "fleet-agent", Some(ca.ca_file()))?
                .with_max_bytes_per_sec(std::num::NonZeroU64::new(rate));
            let dir = Path::new(tmp).to_owned();
            let sampler = Sampler::start(move || dir_bytes(&dir));
            let fetched = fetcher
                .fetch(&attempt, Path::new(tmp))
                .map_err(|e| e.to_string())?;
            let seconds = started.elapsed().as_secs_f64();
            let samples = sampler.stop();
            if fetched.sha256 != sha {
                return Err("fleet-fetch: wrong digest".into());
            }
            let _ = std::fs::remove_file(&fetched.path);
            (samples, seconds)
        } else {
            let out = Path::new(tmp).join("curl.out");
            let mut cmd = std::process::Command::new("curl");
            cmd.args(["-sS", "--fail", "--cacert"])
                .arg(ca.ca_file())
                .args(["--limit-rate", &rate.to_string(), "-o"])
                .arg(&out);
            if cut.is_some() {
                cmd.args([
                    "-C",
                    "-",
                    "--retry",
                    "5",
                    "--retry-all-errors",
                    "--retry-delay",
                    "1",
                ]);
            }
            cmd.arg(&url);
            let o = out.clone();
            let sampler = Sampler::start(move || std::fs::metadata(&o).map_or(0, |m| m.len()));
            let status = cmd.status().map_err(|e| format!("curl: {e}"))?;
            let seconds = started.elapsed().as_secs_f64();
            let samples = sampler.stop();
            let got = std::fs::read(&out).map_err(|e| format!("curl's output: {e}"))?;
            let _ = std::fs::remove_file(&out);
            if !status.success() || Sha256Hex::from_bytes(Sha256::digest(&got).into()) != sha {
                return Err(format!(
                    "curl: {status}, {} bytes, digest wrong or not",
                    got.len()
                ));
            }
            (samples, seconds)
        };
        let (max, min) = window_rates(&samples, Duration::from_secs(5));
        println!(
            "tool={tool} seconds={seconds:.3} bytes_sent={} requests={} max5s={max:.0} min5s={min:.0}",
            sent.load(Ordering::SeqCst),
            served.load(Ordering::SeqCst),
        );
    }
    Ok(())
}

/// Bytes of every file in `dir` but the partial download's state file (the partial download, then the finished
/// file it becomes).
fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .filter(|e| !e.file_name().to_string_lossy().ends_with(".json"))
                .filter_map(|e| e.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// Samples a byte count every 50 ms on a thread until stopped.
struct Sampler {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<Vec<(Duration, u64)>>,
}

impl Sampler {
    fn start(count: impl Fn() -> u64 + Send + 'static) -> Self {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let started = Instant::now();
            let mut samples = Vec::new();
            while !s.load(Ordering::SeqCst) {
                samples.push((started.elapsed(), count()));
                std::thread::sleep(Duration::from_millis(50));
            }
            samples.push((started.elapsed(), count()));
            samples
        });
        Self { stop, thread }
    }

    fn stop(self) -> Vec<(Duration, u64)> {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().unwrap_or_default()
    }
}

/// The highest and lowest rate (bytes/s) over every window of `window` between two samples, from the first byte
/// received to the last (a window is the longest span of samples no longer than `window`, at least 98 % of it).
fn window_rates(samples: &[(Duration, u64)], window: Duration) -> (f64, f64) {
    let first = samples
        .iter()
        .position(|s| s.1 > 0)
        .unwrap_or(0)
        .saturating_sub(1);
    let last = samples
        .iter()
        .position(|s| s.1 == samples.last().map_or(0, |l| l.1));
    let samples = &samples[first..=last.unwrap_or(samples.len().saturating_sub(1))];
    let (mut max, mut min) = (0f64, f64::MAX);
    let mut j = 0;
    for (i, &(t0, b0)) in samples.iter().enumerate() {
        j = j.max(i);
        while j + 1 < samples.len() && samples[j + 1].0 <= t0 + window {
            j += 1;
        }
        let (t1, b1) = samples[j];
        let span = (t1 - t0).as_secs_f64();
        if span < window.as_secs_f64() * 0.98 {
            continue;
        }
        let r = b1.saturating_sub(b0) as f64 / span;
        max = max.max(r);
        min = min.min(r);
    }
    (max, if min == f64::MAX { 0.0 } else { min })
}

/// Peak resident set size of the largest waited-for child (the helper), in KiB.
fn children_max_rss_kib() -> i64 {
    // SAFETY: getrusage fills the zeroed struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a rusage.
    if unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) } != 0 {
        return 0;
    }
    usage.ru_maxrss
}

/// Peak resident set size of this process (`VmHWM` in /proc/self/status), in KiB.
fn vm_hwm_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}
