//! Benchmark of `fleetlock-server`: lock + unlock pairs per second and p99 latency with N concurrent clients
//! (enough slots for all), for the file store (with fsync) or the NATS store with several replicas. Prints one
//! Markdown table row. A reference row measures one fsync per request, as a server without group commit would do.
//!
//! With `--https` the servers serve HTTPS with a certificate of a throw-away CA and the clients verify it (each
//! client keeps one connection, so the row shows TLS's cost per request, not per handshake).
//!
//! `cargo run --release --example fleetlock_bench -- --bin target/release/fleetlock-server --store file
//!  --dir <dir on a real disk> [--clients 50] [--seconds 5] [--replicas 3] [--https]`
//!
//! `--store refusals --count N`: the NATS store on a 3-node cluster (bucket with 3 copies), one slot held, N
//! `pre-reboot`s from N distinct ids all refused, from the clients at once; the row gives refusals per second, the
//! bucket's keys afterwards and the time a restarted server takes to answer `/healthz`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use fleet_rig::fleetlock::{trust_only, Conn, ServerProcess, TlsFiles};
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

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

fn main() {
    let store = arg("--store").unwrap_or_else(|| "file".into());
    let clients: usize = arg("--clients").map_or(50, |v| v.parse().unwrap());
    let seconds: u64 = arg("--seconds").map_or(5, |v| v.parse().unwrap());
    let dir = PathBuf::from(arg("--dir").expect("--dir <directory on a real disk>"));
    std::fs::create_dir_all(&dir).unwrap();
    if store == "fsync-reference" {
        return fsync_reference(&dir, seconds);
    }
    let bin = PathBuf::from(arg("--bin").expect("--bin <fleetlock-server>"));
    if store == "refusals" {
        let count = arg("--count").map_or(100_000, |v| v.parse().unwrap());
        return refusals(&bin, &dir, clients, count);
    }
    let _nats;
    let (store_yaml, replicas) = if store == "nats" {
        let n = fleet_rig::NatsServer::start();
        let y = format!("store: {{kind: nats, url: \"{}\"}}", n.url());
        _nats = Some(n);
        (y, arg("--replicas").map_or(3, |v| v.parse().unwrap()))
    } else {
        _nats = None;
        let d = dir.join("store");
        let _ = std::fs::remove_dir_all(&d);
        (format!("store: {{kind: file, dir: {}}}", d.display()), 1)
    };
    let cfg = dir.join(format!("bench-{store}.yaml"));
    std::fs::write(
        &cfg,
        format!("{store_yaml}\ndefault_slots: {}\n", clients * 2),
    )
    .unwrap();
    let https = std::env::args().any(|a| a == "--https");
    let ca = fleet_rig::tls::TestCa::new();
    let tls = https.then(|| {
        let cert = ca.server_cert("fleetlock-bench");
        TlsFiles {
            cert: cert.cert_file,
            key: cert.key_file,
            ca: ca.ca_file().to_path_buf(),
        }
    });
    let client_tls = https.then(|| trust_only(ca.ca_file()).unwrap());
    let servers: Vec<ServerProcess> = (0..replicas)
        .map(|_| match &tls {
            Some(t) => ServerProcess::start_tls(&bin, &cfg, t.clone()).unwrap(),
            None => ServerProcess::start(&bin, &cfg).unwrap(),
        })
        .collect();
    let barrier = Arc::new(Barrier::new(clients + 1));
    let handles: Vec<_> = (0..clients)
        .map(|i| {
            let addr = servers[i % servers.len()].addr;
            let barrier = barrier.clone();
            let client_tls = client_tls.clone();
            std::thread::spawn(move || {
                let mut c = match client_tls {
                    Some(t) => Conn::connect_tls(addr, t).unwrap(),
                    None => Conn::connect(addr).unwrap(),
                };
                let id = format!("bench-{i}");
                let mut pairs = Vec::new();
                let mut requests = Vec::new();
                let mut errors = 0u64;
                barrier.wait();
                let end = Instant::now() + Duration::from_secs(seconds);
                while Instant::now() < end {
                    let t0 = Instant::now();
                    let a = c.fleetlock(true, &id, "default").unwrap();
                    let t1 = Instant::now();
                    let b = c.fleetlock(false, &id, "default").unwrap();
                    let t2 = Instant::now();
                    errors += u64::from(a.status != 200) + u64::from(b.status != 200);
                    requests.push(t1 - t0);
                    requests.push(t2 - t1);
                    pairs.push(t2 - t0);
                }
                (pairs, requests, errors)
            })
        })
        .collect();
    barrier.wait();
    let started = Instant::now();
    let mut pairs = Vec::new();
    let mut requests = Vec::new();
    let mut errors = 0;
    for h in handles {
        let (p, r, e) = h.join().unwrap();
        pairs.extend(p);
        requests.extend(r);
        errors += e;
    }
    let elapsed = started.elapsed().as_secs_f64();
    pairs.sort();
    requests.sort();
    let mut commits = 0u64;
    for s in &servers {
        let m = s.metrics().unwrap();
        commits += fleet_rig::fleetlock::metric(&m, "fleetlock_store_commits_total").unwrap_or(0);
    }
    let wire = if https { "HTTPS" } else { "HTTP" };
    let label = if store == "nats" {
        format!("fleetlock-server over {wire}, NATS KV store, {replicas} replicas")
    } else {
        format!("fleetlock-server over {wire}, file store (fsync, group commit)")
    };
    let row = format!(
        "| {label} | {clients} | {:.0} | {:.2} | {:.2} | {:.1} | {errors} |",
        pairs.len() as f64 / elapsed,
        pct(&pairs, 0.99),
        pct(&requests, 0.99),
        (requests.len() as f64) / (commits.max(1) as f64),
    );
    println!("{row}");
    let _ = std::io::stdout().flush();
}

/// One write + fsync + rename + directory fsync per request, sequentially: what a server without group commit
/// can do at most (pairs/s = requests/s / 2).
fn fsync_reference(dir: &std::path::Path, seconds: u64) {
    let tmp = dir.join("ref.tmp");
    let path = dir.join("ref.json");
    let end = Instant::now() + Duration::from_secs(seconds);
    let mut lat = Vec::new();
    let started = Instant::now();
    while Instant::now() < end {
        let t0 = Instant::now();
        let mut f = std::fs::File::create(&tmp).unwrap();
        f.write_all(br#"{"version":1,"groups":{"default":[]}}"#)
            .unwrap();
        f.sync_all().unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        std::fs::File::open(dir).unwrap().sync_all().unwrap();
        lat.push(t0.elapsed());
    }
    let per_s = lat.len() as f64 / started.elapsed().as_secs_f64();
    lat.sort();
    println!(
        "| reference: one fsync per request, sequential | 1 | {:.0} | {:.2} | {:.2} | 1.0 | 0 |",
        per_s / 2.0,
        pct(&lat, 0.99) * 2.0,
        pct(&lat, 0.99)
    );
}

/// N refused `pre-reboot`s from distinct ids against one server on a 3-node cluster, then a restart.
fn refusals(bin: &std::path::Path, dir: &std::path::Path, clients: usize, count: usize) {
    let yaml = format!(
        "default_slots: 1\nmax_connections_per_client: {}\n",
        clients.max(1)
    );
    let (cluster, cfg) = fleet_rig::fleetlock::nats_cluster_config(dir, &yaml).unwrap();
    let mut server = ServerProcess::start(bin, &cfg).unwrap();
    cluster.wait_stream_current("KV_fleetlock", Duration::from_secs(30));
    let held = server
        .conn()
        .unwrap()
        .fleetlock(true, "holder", "default")
        .unwrap();
    assert_eq!(held.status, 200, "{}", held.text());
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let handles: Vec<_> = (0..clients)
        .map(|_| {
            let (addr, next) = (server.addr, next.clone());
            std::thread::spawn(move || {
                let mut c = Conn::connect(addr).unwrap();
                let mut errors = 0u64;
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if i >= count {
                        return errors;
                    }
                    let a = c
                        .fleetlock(true, &format!("refused-{i}"), "default")
                        .unwrap();
                    errors += u64::from(a.status != 409);
                }
            })
        })
        .collect();
    let errors: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    let per_s = count as f64 / started.elapsed().as_secs_f64();
    let keys = cluster.stream_info("KV_fleetlock").unwrap()["state"]["num_subjects"]
        .as_u64()
        .unwrap_or(0);
    server.kill();
    let t = Instant::now();
    server.restart().unwrap();
    let restart_ms = t.elapsed().as_secs_f64() * 1000.0;
    println!(
        "| NATS store, 3 copies, 1 slot held: {count} refused ids | {clients} | {per_s:.0} | {keys} | {restart_ms:.0} | {errors} |"
    );
    let _ = std::io::stdout().flush();
}
