//! Benchmark of fleet-auth: device connects per second (each one an auth decision: request JWT, JWKS-cached token
//! verification, signed user JWT) and p99 connect latency with N concurrent clients, next to the same connects by a
//! static user/password that nats-server checks itself (an `auth_users` entry, on the same server). Prints
//! Markdown table rows. With `--storm N`, instead: a reconnect storm — N device connections through the callout,
//! nats-server killed and started again on the same port and store, and how long until every device is connected
//! again through the callout, with fleet-auth's memory (one row). With `--storm-sim N`: the same storm with
//! fleet-sim's devices (`fleet-sim --token-dir`: one connection per device with its own token, writing through the
//! device API, reconnecting by itself), timed until every device has a heartbeat acknowledged after the restart.
//! With `--guard-cost N`: fleet-auth's and nats-server's CPU with N such devices connected, with the flood guard
//! and without it.
//!
//! `FLEET_AUTH_BIN=target/release/fleet-auth cargo run --release --example auth_bench -- [--clients 100]
//!  [--seconds 5] [--storm 2000] [--storm-sim 2000]` (`--storm-sim` runs `FLEET_SIM_BIN`, by default the
//! `fleet-sim` built beside this example: `cargo build --release -p fleet-vm-tests --bin fleet-sim`)
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../auth/tests/auth_common/mod.rs"]
mod auth_common;

#[path = "auth_bench/storm_sim.rs"]
mod storm_sim;

#[path = "auth_bench/guard_cost.rs"]
mod guard_cost;

use auth_common::*;
use fleet_rig::tls::TestCa;
use fleet_rig::wait_for;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Devices each client of the connect rows connects as, in turn (at 3,000 connects a second, 100 clients connect
/// about 150 times each in 5 s: about one admission per device).
const DEVICES_PER_CLIENT: usize = 128;

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

/// Runs `clients` concurrent tasks, each connecting (and dropping the connection) with `opts` for `seconds`;
/// prints one row. The async client keeps the client side cheap, so the rows compare the servers.
fn run(
    rt: &tokio::runtime::Runtime,
    label: &str,
    clients: usize,
    seconds: u64,
    url: &str,
    opts: Arc<dyn Fn(usize, usize) -> async_nats::ConnectOptions + Send + Sync>,
) {
    let started = Instant::now();
    let (mut all, errors) = rt.block_on(async {
        let barrier = Arc::new(tokio::sync::Barrier::new(clients));
        let tasks: Vec<_> = (0..clients)
            .map(|i| {
                let (barrier, opts, url) = (barrier.clone(), opts.clone(), url.to_owned());
                tokio::spawn(async move {
                    let mut lat = Vec::new();
                    let mut errors = 0u64;
                    barrier.wait().await;
                    let end = Instant::now() + Duration::from_secs(seconds);
                    let mut attempt = 0;
                    while Instant::now() < end {
                        let t0 = Instant::now();
                        attempt += 1;
                        match opts(i, attempt)
                            .connection_timeout(Duration::from_secs(10))
                            .connect(url.as_str())
                            .await
                        {
                            Ok(c) => {
                                lat.push(t0.elapsed());
                                drop(c);
                            }
                            Err(_) => errors += 1,
                        }
                    }
                    (lat, errors)
                })
            })
            .collect();
        let mut all = Vec::new();
        let mut errors = 0;
        for t in tasks {
            let (l, e) = t.await.unwrap();
            all.extend(l);
            errors += e;
        }
        (all, errors)
    });
    let secs = started.elapsed().as_secs_f64();
    all.sort();
    println!(
        "| {label} | {clients} | {:.0} | {:.1} | {:.1} | {errors} |",
        all.len() as f64 / secs,
        pct(&all, 0.5),
        pct(&all, 0.99)
    );
}

/// fleet-auth's resident memory and its peak so far, MiB (from /proc).
fn rss_mib(stack: &Stack) -> (f64, f64) {
    let pid = stack.auth.as_ref().map(|c| c.id()).unwrap_or(0);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (kib("VmRSS:") / 1024.0, kib("VmHWM:") / 1024.0)
}

/// The devices fleet-auth admitted in `log` (its lines "as device <prefix><i> until …").
fn admitted(log: &str, prefix: &str) -> std::collections::HashSet<usize> {
    let marker = format!("as device {prefix}");
    log.lines()
        .filter_map(|l| l.split_once(marker.as_str()))
        .filter_map(|(_, rest)| rest.split(' ').next()?.parse().ok())
        .collect()
}

/// The reconnect storm: `devices` connections with their own tokens (opened 50 at a time; a client whose session
/// was refused retries by itself), then nats-server killed and started on the same port and store; every client
/// reconnects by itself (async-nats' default backoff, like a device's client). A device counts as back when
/// fleet-auth's log says it admitted it after the kill: async-nats reports `connected` on any first answer of the
/// server, also one that precedes a refusal, so its events do not prove an admission. Prints one row: time until
/// all are back, p50/p99, fleet-auth's admissions during the storm, its memory.
fn storm(rt: &tokio::runtime::Runtime, stack: &mut Stack, key: &SignKey, devices: usize) {
    const LIMIT: Duration = Duration::from_secs(180);
    let url = stack.nats.url();
    let opening = Instant::now();
    let clients: Vec<async_nats::Client> = rt.block_on(async {
        let permits = Arc::new(tokio::sync::Semaphore::new(50));
        let tasks: Vec<_> = (0..devices)
            .map(|i| {
                let token = key.sign(&claims(&format!("storm-{i}"), 3600));
                let (permits, url) = (permits.clone(), url.clone());
                tokio::spawn(async move {
                    let _permit = permits.acquire().await.unwrap();
                    async_nats::ConnectOptions::with_token(token)
                        .connection_timeout(Duration::from_secs(10))
                        .retry_on_initial_connect()
                        .connect(url.as_str())
                        .await
                        .unwrap_or_else(|e| panic!("storm-{i}: {e}"))
                })
            })
            .collect();
        let mut clients = Vec::with_capacity(devices);
        for t in tasks {
            clients.push(t.await.unwrap());
        }
        clients
    });
    let all_open = wait_for(LIMIT, || {
        (admitted(&stack.auth_log_text(), "storm-").len() == devices).then(|| opening.elapsed())
    });
    let (rss_before, _) = rss_mib(stack);
    let offset = stack.auth_log_text().len();
    let t0 = Instant::now();
    stack.nats.start_again();
    let restarted = t0.elapsed().as_secs_f64();
    let mut back: Vec<Option<Duration>> = vec![None; devices];
    let all_back = wait_for(LIMIT, || {
        let log = stack.auth_log_text();
        for i in admitted(log.get(offset..).unwrap_or(""), "storm-") {
            if let Some(b) = back.get_mut(i) {
                b.get_or_insert_with(|| t0.elapsed());
            }
        }
        back.iter().all(Option::is_some).then(|| t0.elapsed())
    });
    let (rss_after, peak) = rss_mib(stack);
    let mut times: Vec<Duration> = back.iter().flatten().copied().collect();
    times.sort();
    let missing = devices - times.len();
    let readmitted = stack
        .auth_log_text()
        .get(offset..)
        .unwrap_or("")
        .matches("] allowed client")
        .count();
    drop(clients);
    let within = |d: Option<Duration>| {
        d.map_or(format!("not within {} s", LIMIT.as_secs()), |d| {
            format!("{:.1}", d.as_secs_f64())
        })
    };
    println!(
        "| {devices} devices, nats-server killed and restarted ({restarted:.1} s to listen) | {} | {} | {:.1} | \
         {:.1} | {readmitted} | {missing} | {rss_before:.0} / {peak:.0} / {rss_after:.0} |",
        within(all_open),
        within(all_back),
        pct(&times, 0.5) / 1000.0,
        pct(&times, 0.99) / 1000.0,
    );
}

fn main() {
    let clients: usize = arg("--clients").map_or(100, |v| v.parse().unwrap());
    let seconds: u64 = arg("--seconds").map_or(5, |v| v.parse().unwrap());
    let ca = TestCa::new();
    let keydir = tempfile::tempdir().unwrap();
    let ec = SignKey::ec("ec-1");
    let rsa = SignKey::rsa("rsa-1", keydir.path());
    let jwks = Jwks::start(&ca, &[&ec, &rsa]);
    let mut stack = Stack::start(&ca, &jwks.url(), false);
    if let Some(devices) = arg("--guard-cost") {
        guard_cost::run(&mut stack, &ec, devices.parse().unwrap());
        return;
    }
    if let Some(devices) = arg("--storm-sim") {
        storm_sim::run(&mut stack, &ec, devices.parse().unwrap());
        return;
    }
    if let Some(devices) = arg("--storm") {
        let rt = tokio::runtime::Runtime::new().unwrap();
        storm(&rt, &mut stack, &ec, devices.parse().unwrap());
        return;
    }
    let url = stack.nats.url();
    let password = stack.admin_password.clone();
    let rt = tokio::runtime::Runtime::new().unwrap();
    run(
        &rt,
        "static user/password (nats-server alone, reference)",
        clients,
        seconds,
        &url,
        Arc::new(move |_, _| {
            async_nats::ConnectOptions::with_user_and_password("admin".into(), password.clone())
        }),
    );
    for key in [&ec, &rsa] {
        // Each client connects as DEVICES_PER_CLIENT devices in turn, of this row only: the callout admits one
        // device 5 times in a row, then once every 10 s (a reconnect flood), and these rows measure decisions, not
        // that budget.
        let tag = format!("{:?}", key.alg).to_ascii_lowercase();
        let tokens: Arc<Vec<Vec<String>>> = Arc::new(
            (0..clients)
                .map(|i| {
                    (0..DEVICES_PER_CLIENT)
                        .map(|k| key.sign(&claims(&format!("bench-{tag}-{i}-{k}"), 3600)))
                        .collect()
                })
                .collect(),
        );
        let label = format!("Zitadel token via fleet-auth ({:?})", key.alg);
        run(
            &rt,
            &label,
            clients,
            seconds,
            &url,
            Arc::new(move |i, n| {
                async_nats::ConnectOptions::with_token(tokens[i][n % DEVICES_PER_CLIENT].clone())
            }),
        );
    }
}
