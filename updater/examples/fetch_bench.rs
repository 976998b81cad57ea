//! Benchmark helper for `scripts/bench.d/20-download.sh`: `serve` runs the fleet-rig HTTPS server (a fresh test CA)
//! for one file; `fetch` downloads and verifies it through the updater's production path (the `fleet-fetch`
//! helper run as the agent user, re-checked and written by this process) and reports time and peak RSS of both.
//!
//! `fetch_bench serve <file> <ca.pem out>` prints the URL and serves until stdin closes.
//! `fetch_bench fetch <url> <sha256> <ca.pem> <tmp dir> <fleet-fetch>` prints
//! `bytes=<n> seconds=<s> vmhwm_kib=<updater side> helper_kib=<helper>`.

use fleet_rig::https::{HttpsServer, Reply};
use fleet_rig::tls::TestCa;
use fleet_updater::fetcher::{production, Fetcher};
use fleet_wire::limits::ARTIFACT_MAX_BYTES;
use fleet_wire::{fixtures, ByteLimit, Sha256Hex};
use std::io::Read;
use std::path::Path;
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let code = match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["serve", file, ca_out] => serve(file, ca_out),
        ["fetch", url, sha, ca, tmp, helper] => run_fetch(url, sha, ca, tmp, helper),
        _ => Err("usage: fetch_bench serve <file> <ca.pem out> | fetch <url> <sha256> <ca.pem> <tmp dir> <fleet-fetch>".into()),
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
