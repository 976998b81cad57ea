//! The NATS store on a real 3-node NATS cluster (bucket with 3 copies, three fleetlock-server replicas): Zincati's
//! protocol points answered through different replicas, and a soak of lock/release pairs from 50 clients with
//! zero non-200 answers while the JetStream consumer count (the nodes' `/jsz`) stays flat. A release used to list
//! the bucket's keys with a consumer each time, and a burst of releases ran into
//! `503 … maximum consumers limit reached`.
//!
//! The soak runs `FLEET_SOAK_PAIRS` pairs (default 4,000). The full soak (docs/fleetlock.md):
//! `FLEET_SOAK_PAIRS=200000 cargo test --release -p fleet-operator --test fleetlock_soak soak`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use fleet_rig::fleetlock::{Conn, ServerProcess};
use fleet_rig::nats_client as nats;
use fleet_rig::NatsCluster;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_fleetlock-server");
const CLIENTS: usize = 50;

/// A 3-node cluster, a config file with `yaml` after the NATS store line, and `replicas` servers on it.
fn setup(dir: &Path, yaml: &str, replicas: usize) -> (NatsCluster, Vec<ServerProcess>) {
    let (cluster, cfg) = fleet_rig::fleetlock::nats_cluster_config(dir, yaml).unwrap();
    let servers = (0..replicas)
        .map(|_| ServerProcess::start(Path::new(BIN), &cfg).unwrap())
        .collect();
    cluster.wait_stream_current("KV_fleetlock", Duration::from_secs(30));
    (cluster, servers)
}

/// Consumers on every node together.
fn consumers(cluster: &NatsCluster) -> u64 {
    (0..cluster.size()).map(|i| cluster.consumers(i)).sum()
}

/// The consumer count once it has stopped changing (the servers' start-up scan of the bucket uses one consumer
/// each, which the server removes when it goes idle); bounded.
fn settled_consumers(cluster: &NatsCluster) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = consumers(cluster);
    loop {
        // why: "stopped changing" is judged over a 0.5 s step (no event says the servers' scans are over)
        std::thread::sleep(Duration::from_millis(500));
        let now = consumers(cluster);
        if now == last || Instant::now() > deadline {
            return now;
        }
        last = now;
    }
}

fn holders(c: &mut Conn, group: &str) -> Vec<String> {
    let a = c.request("GET", "/v1/status", &[], b"").unwrap();
    assert_eq!(a.status, 200, "{}", a.text());
    let v: serde_json::Value = serde_json::from_slice(&a.body).unwrap();
    assert_eq!(v["store"], "nats");
    v["groups"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|g| g["name"] == group)
        .flat_map(|g| g["holders"].as_array().unwrap().clone())
        .map(|h| h["id"].as_str().unwrap().to_string())
        .collect()
}

fn status_of(a: &fleet_rig::fleetlock::Answer) -> (u16, String) {
    (a.status, a.text())
}

/// Zincati's protocol points (as in fleetlock_protocol's `protocol_points`, the file store's test) on the NATS
/// store, each step through another replica than the one before: the replicas share one truth, and no request
/// leaves a consumer behind.
#[test]
fn zincati_protocol_points_on_a_nats_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let (cluster, servers) = setup(
        dir.path(),
        "default_slots: 1\ngroups: [{name: workers, slots: 2}, {name: db, slots: 1, members: [m1]}]\n",
        2,
    );
    let before = settled_consumers(&cluster);
    let mut a = servers[0].conn().unwrap();
    let mut b = servers[1].conn().unwrap();
    let hdr = [("fleet-lock-protocol", "true")];

    // As Zincati sends it: pretty-printed JSON, no Content-Type.
    let zincati = b"{\n  \"client_params\": {\n    \"group\": \"default\",\n    \"id\": \"e0f3745b108f471cbd4883c6fbed8cdd\"\n  }\n}";
    let zid = "e0f3745b108f471cbd4883c6fbed8cdd";
    let r = a.request("POST", "/v1/pre-reboot", &hdr, zincati).unwrap();
    assert_eq!(status_of(&r).0, 200, "{}", r.text());
    // The holder asking again (through the other replica) is fine; another client finds the slot taken.
    assert_eq!(
        b.request("POST", "/v1/pre-reboot", &hdr, zincati)
            .unwrap()
            .status,
        200
    );
    let full = b.fleetlock(true, "other", "default").unwrap();
    assert_eq!(
        (full.status, full.kind().as_deref()),
        (409, Some("all-slots-taken")),
        "{}",
        full.text()
    );
    assert_eq!(holders(&mut b, "default"), vec![zid]);
    // steady-state from a non-holder is fine and changes nothing.
    assert_eq!(a.fleetlock(false, "other", "default").unwrap().status, 200);
    assert_eq!(holders(&mut b, "default"), vec![zid]);
    // Zincati's steady-state (through the replica that did not grant) frees the slot.
    let r = b
        .request("POST", "/v1/steady-state", &hdr, zincati)
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(holders(&mut a, "default").is_empty());
    assert_eq!(b.fleetlock(true, "other", "default").unwrap().status, 200);

    // A member of `db` that names `workers` takes both slots; its release frees both, whoever answers it.
    assert_eq!(a.fleetlock(true, "m1", "workers").unwrap().status, 200);
    assert_eq!(holders(&mut b, "db"), vec!["m1"]);
    assert_eq!(holders(&mut b, "workers"), vec!["m1"]);
    let r = b.fleetlock(true, "m2", "workers").unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let r = a.fleetlock(true, "m3", "workers").unwrap();
    assert_eq!(r.kind().as_deref(), Some("all-slots-taken"), "{}", r.text());
    assert_eq!(b.fleetlock(false, "m1", "default").unwrap().status, 200);
    assert!(holders(&mut a, "db").is_empty());
    assert_eq!(holders(&mut a, "workers"), vec!["m2"]);
    assert_eq!(a.fleetlock(true, "m3", "workers").unwrap().status, 200);

    // Validation is the same as on the file store.
    assert_eq!(
        a.fleetlock(true, "x", "nope").unwrap().kind().as_deref(),
        Some("unknown-group")
    );
    assert_eq!(
        a.fleetlock(true, "", "default").unwrap().kind().as_deref(),
        Some("invalid-id")
    );

    let m = a.request("GET", "/metrics", &[], b"").unwrap().text();
    assert!(m.contains("fleetlock_holders{group=\"workers\"} 2"), "{m}");
    let after = consumers(&cluster);
    assert!(
        after <= before,
        "requests left consumers: {before} before, {after} after"
    );
}

/// A bucket of the layout before the group directory: a slot in its group key, a per-id `_holder.` index key for
/// every id that ever asked (refused or not), no `_groups`. The first start removes the index keys and lists the
/// group, and the holder's steady-state gives the slot back.
#[test]
fn slots_granted_before_the_group_directory_are_released() {
    let dir = tempfile::tempdir().unwrap();
    let (cluster, mut servers) = setup(dir.path(), "default_slots: 1\n", 1);
    servers[0].kill();
    let held = fleet_wire::fleetlock::GroupHolders {
        version: 1,
        holders: vec![fleet_wire::fleetlock::Holder {
            id: "old-host".into(),
            hostname: None,
            ip: "10.0.0.7".into(),
            taken_at: fleet_wire::Timestamp::now(),
        }],
    };
    let js = nats::jetstream::new(cluster.connect());
    let kv = js.key_value(fleet_wire::kv::FLEETLOCK).unwrap();
    kv.delete(fleet_wire::fleetlock::GROUP_DIRECTORY_KEY)
        .unwrap();
    kv.put("default", serde_json::to_vec(&held).unwrap())
        .unwrap();
    for i in 0..500 {
        let key = format!("{}{i:032x}", fleet_wire::fleetlock::HOLDER_INDEX_PREFIX);
        kv.put(&key, br#"{"version":1,"id":"x","groups":["default"]}"#)
            .unwrap();
    }
    servers[0].restart().unwrap();
    let mut left: Vec<String> = kv.keys().unwrap().collect();
    left.sort();
    assert_eq!(left, vec!["_groups", "default"], "old index keys left");
    let mut c = servers[0].conn().unwrap();
    assert_eq!(holders(&mut c, "default"), vec!["old-host"]);
    let full = c.fleetlock(true, "new-host", "default").unwrap();
    assert_eq!(full.status, 409, "{}", full.text());
    let r = c.fleetlock(false, "old-host", "default").unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(holders(&mut c, "default").is_empty());
    assert_eq!(
        c.fleetlock(true, "new-host", "default").unwrap().status,
        200
    );
}

/// `FLEET_SOAK_PAIRS` lock/release pairs (default 4,000; the full soak 200,000) from 50 clients spread over three
/// replicas, each client its own id, enough slots for all: every answer is 200, and the cluster's consumer count
/// never rises above what it was before the first request (sampled every 200 ms).
#[test]
fn soak_lock_release_pairs_all_answered_with_flat_consumers() {
    let pairs: usize = std::env::var("FLEET_SOAK_PAIRS")
        .ok()
        .map_or(4_000, |v| v.parse().expect("FLEET_SOAK_PAIRS: a number"));
    let dir = tempfile::tempdir().unwrap();
    let (cluster, servers) = setup(dir.path(), &format!("default_slots: {CLIENTS}\n"), 3);
    let before = settled_consumers(&cluster);
    let cluster = Arc::new(cluster);

    let done = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicU64::new(before));
    let sampler = {
        let (cluster, done, peak) = (cluster.clone(), done.clone(), peak.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                peak.fetch_max(consumers(&cluster), Ordering::Relaxed);
                // why: sampling period of the consumer-count watch
                std::thread::sleep(Duration::from_millis(200));
            }
        })
    };

    let per_client = pairs.div_ceil(CLIENTS);
    let barrier = Arc::new(Barrier::new(CLIENTS));
    let started = Instant::now();
    let handles: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let addr = servers[i % servers.len()].addr;
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let mut c = Conn::connect(addr).unwrap();
                let id = format!("soak-{i}");
                let mut bad: Vec<(u16, String)> = Vec::new();
                let mut failed = 0u64;
                barrier.wait();
                for _ in 0..per_client {
                    for lock in [true, false] {
                        let a = c.fleetlock(lock, &id, "default").unwrap();
                        if a.status != 200 {
                            failed += 1;
                            if bad.len() < 3 {
                                bad.push(status_of(&a));
                            }
                        }
                    }
                }
                (failed, bad)
            })
        })
        .collect();
    let mut failed = 0;
    let mut examples = Vec::new();
    for h in handles {
        let (f, b) = h.join().unwrap();
        failed += f;
        examples.extend(b);
    }
    let elapsed = started.elapsed();
    done.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    let peak = peak.load(Ordering::Relaxed);
    let total = per_client * CLIENTS;
    println!(
        "soak: {total} pairs from {CLIENTS} clients in {:.1} s ({:.0} pairs/s), {failed} non-200 answers, \
         consumers {before} before, at most {peak} during",
        elapsed.as_secs_f64(),
        total as f64 / elapsed.as_secs_f64()
    );
    assert_eq!(
        failed,
        0,
        "{failed} of {} answers were not 200, e.g. {examples:?}",
        total * 2
    );
    assert!(
        peak <= before,
        "the consumer count rose from {before} to {peak} during the soak"
    );
    let mut c = servers[0].conn().unwrap();
    assert!(
        holders(&mut c, "default").is_empty(),
        "every slot given back"
    );
}
