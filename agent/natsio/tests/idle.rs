//! An idle connection costs no wake-ups: its I/O thread (`nats-io`) sleeps in poll(2) until the keep-alive PING
//! (every 30 s by default), so over a few idle seconds it does not wake at all (its own process: no other
//! connection's thread is counted).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use fleet_rig::NatsServer;
use std::time::Duration;

/// Voluntary context switches of every thread of this process named `nats-io`.
fn io_thread_switches() -> u64 {
    let mut total = 0;
    let mut found = 0;
    for t in std::fs::read_dir("/proc/self/task").unwrap() {
        let dir = t.unwrap().path();
        if std::fs::read_to_string(dir.join("comm"))
            .unwrap_or_default()
            .trim()
            != "nats-io"
        {
            continue;
        }
        found += 1;
        let status = std::fs::read_to_string(dir.join("status")).unwrap();
        total += status
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .map(|v| v.trim().parse::<u64>().unwrap())
            .unwrap();
    }
    assert_eq!(found, 1, "one connection, one I/O thread");
    total
}

#[test]
fn an_idle_connection_does_not_wake() {
    let server = NatsServer::start();
    let nc = fleet_nats::connect(&fleet_nats::Options::new(&server.url())).unwrap();
    let sub = nc.subscribe("idle").unwrap();
    nc.flush(Duration::from_secs(5)).unwrap();
    // why: lets the subscription's and flush's own wake-ups settle before counting
    std::thread::sleep(Duration::from_millis(200));
    let before = io_thread_switches();
    // why: "does not wake while idle" is the property: the count of wake-ups over a fixed 5 s is the assertion
    std::thread::sleep(Duration::from_secs(5));
    let woke = io_thread_switches() - before;
    assert!(woke <= 1, "the idle I/O thread woke {woke} times in 5 s");
    // And it is alive: a message still arrives.
    nc.publish("idle", b"x").unwrap();
    assert_eq!(sub.next_timeout(Duration::from_secs(5)).unwrap().data, b"x");
}
