//! Races: 200 concurrent clients on one group with N slots end with exactly N holders, repeatedly, for the file
//! store (one server) and the NATS store (three server processes sharing one real nats-server).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use fleet_rig::fleetlock::ServerProcess;
use std::path::Path;
use std::sync::{Arc, Barrier};

const BIN: &str = env!("CARGO_BIN_EXE_fleetlock-server");
const CLIENTS: usize = 200;

/// One round: every client asks once at the same moment; returns who got a slot.
fn round(servers: &[&ServerProcess], round: usize) -> Vec<usize> {
    let barrier = Arc::new(Barrier::new(CLIENTS));
    let addrs: Vec<_> = servers.iter().map(|s| s.addr).collect();
    let handles: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let barrier = barrier.clone();
            let addr = addrs[i % addrs.len()];
            std::thread::spawn(move || {
                let mut c = fleet_rig::fleetlock::Conn::connect(addr).unwrap();
                barrier.wait();
                let a = c
                    .fleetlock(true, &format!("r{round}-c{i}"), "race")
                    .unwrap();
                match a.status {
                    200 => Some(i),
                    409 => {
                        assert_eq!(a.kind().as_deref(), Some("all-slots-taken"));
                        None
                    }
                    s => panic!("client {i}: unexpected {s}: {}", a.text()),
                }
            })
        })
        .collect();
    handles
        .into_iter()
        .filter_map(|h| h.join().unwrap())
        .collect()
}

fn holder_count(s: &ServerProcess) -> usize {
    let a = s
        .conn()
        .unwrap()
        .request("GET", "/v1/status", &[], b"")
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&a.body).unwrap();
    v["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["name"] == "race")
        .map_or(0, |g| g["holders"].as_array().unwrap().len())
}

fn release_all(s: &ServerProcess, round: usize, winners: &[usize]) {
    let mut c = s.conn().unwrap();
    for i in winners {
        assert_eq!(
            c.fleetlock(false, &format!("r{round}-c{i}"), "race")
                .unwrap()
                .status,
            200
        );
    }
}

fn run_rounds(servers: &[&ServerProcess], slot_counts: &[usize]) {
    for (r, &n) in slot_counts.iter().enumerate() {
        let winners = round(servers, r);
        assert_eq!(
            winners.len(),
            n,
            "round {r}: {n} slots but {} winners",
            winners.len()
        );
        for s in servers {
            assert_eq!(holder_count(s), n, "round {r}: status disagrees");
        }
        release_all(servers[r % servers.len()], r, &winners);
        for s in servers {
            assert_eq!(holder_count(s), 0, "round {r}: holders left after release");
        }
    }
}

fn write_config(path: &Path, store: &str, slots: usize) {
    std::fs::write(
        path,
        // All 200 clients come from 127.0.0.1: one client as far as the per-client connection cap goes.
        format!(
            "{store}\ngroups: [{{name: race, slots: {slots}}}]\nmax_connections_per_client: {CLIENTS}\n"
        ),
    )
    .unwrap();
}

#[test]
fn file_store_race() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.yaml");
    let store = format!(
        "store: {{kind: file, dir: {}}}",
        dir.path().join("store").display()
    );
    for slots in [1, 3, 7] {
        write_config(&cfg, &store, slots);
        let s = ServerProcess::start(Path::new(BIN), &cfg).unwrap();
        run_rounds(&[&s], &[slots; 4]);
    }
}

#[test]
fn nats_store_race_three_replicas() {
    let nats = fleet_rig::NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let store = format!("store: {{kind: nats, url: \"{}\"}}", nats.url());
    for slots in [1, 5] {
        let cfg = dir.path().join(format!("config-{slots}.yaml"));
        write_config(&cfg, &store, slots);
        let servers: Vec<ServerProcess> = (0..3)
            .map(|_| ServerProcess::start(Path::new(BIN), &cfg).unwrap())
            .collect();
        let refs: Vec<&ServerProcess> = servers.iter().collect();
        run_rounds(&refs, &[slots; 3]);
        for s in &servers {
            let m = s.metrics().unwrap();
            assert!(
                m.contains("fleetlock_errors_total{kind=\"store-unavailable\"} 0"),
                "{m}"
            );
        }
    }
}
