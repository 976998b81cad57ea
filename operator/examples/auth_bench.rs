//! Benchmark of fleet-auth: device connects per second (each one an auth decision: request JWT, JWKS-cached token
//! verification, signed user JWT) and p99 connect latency with N concurrent clients, next to the same connects by a
//! static user/password that nats-server checks itself (an `auth_users` entry, on the same server). Prints
//! Markdown table rows.
//!
//! `FLEET_AUTH_BIN=target/release/fleet-auth cargo run --release --example auth_bench -- [--clients 100]
//!  [--seconds 5]`
#![allow(deprecated, clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/auth_common/mod.rs"]
mod auth_common;

use auth_common::*;
use fleet_rig::tls::TestCa;
use std::sync::Arc;
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

/// Runs `clients` concurrent tasks, each connecting (and dropping the connection) with `opts` for `seconds`;
/// prints one row. The async client keeps the client side cheap, so the rows compare the servers.
fn run(
    rt: &tokio::runtime::Runtime,
    label: &str,
    clients: usize,
    seconds: u64,
    url: &str,
    opts: Arc<dyn Fn(usize) -> async_nats::ConnectOptions + Send + Sync>,
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
                    while Instant::now() < end {
                        let t0 = Instant::now();
                        match opts(i)
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

fn main() {
    let clients: usize = arg("--clients").map_or(100, |v| v.parse().unwrap());
    let seconds: u64 = arg("--seconds").map_or(5, |v| v.parse().unwrap());
    let ca = TestCa::new();
    let keydir = tempfile::tempdir().unwrap();
    let ec = SignKey::ec("ec-1");
    let rsa = SignKey::rsa("rsa-1", keydir.path());
    let jwks = Jwks::start(&ca, &[&ec, &rsa]);
    let stack = Stack::start(&ca, &jwks.url(), false);
    let url = stack.nats.url();
    let password = stack.admin_password.clone();
    let rt = tokio::runtime::Runtime::new().unwrap();
    run(
        &rt,
        "static user/password (nats-server alone, reference)",
        clients,
        seconds,
        &url,
        Arc::new(move |_| {
            async_nats::ConnectOptions::with_user_and_password("admin".into(), password.clone())
        }),
    );
    for key in [&ec, &rsa] {
        let tokens: Arc<Vec<String>> = Arc::new(
            (0..clients)
                .map(|i| key.sign(&claims(&format!("bench-{i}"), 3600)))
                .collect(),
        );
        let label = format!("Zitadel token via fleet-auth ({:?})", key.alg);
        run(
            &rt,
            &label,
            clients,
            seconds,
            &url,
            Arc::new(move |i| async_nats::ConnectOptions::with_token(tokens[i].clone())),
        );
    }
}
