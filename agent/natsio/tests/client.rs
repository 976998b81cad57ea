//! fleet-nats against a real nats-server: a slow subscriber's full queue drops and counts instead of stalling
//! the connection; a server that goes silent (SIGSTOP) is detected by PING/PONG and reported through
//! `on_closed`, and a flush against it returns within its own bound; a server that closes is reported at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use fleet_rig::NatsServer;
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn options(server: &NatsServer) -> fleet_nats::Options {
    let mut o = fleet_nats::Options::new(&server.url());
    o.name = "fleet-nats test".into();
    o
}

#[test]
fn a_full_subscription_drops_and_counts_and_the_connection_stays() {
    let server = NatsServer::start();
    let mut o = options(&server);
    o.sub_max_msgs = 10;
    let nc = fleet_nats::connect(&o).unwrap();
    let slow = nc.subscribe("slow").unwrap();
    nc.flush(Duration::from_secs(5)).unwrap();
    for i in 0..100 {
        nc.publish("slow", format!("{i}").as_bytes()).unwrap();
    }
    nc.flush(Duration::from_secs(5)).unwrap();
    // Every message reached the client once the next flush is answered (the server sends in order).
    let other = nc.subscribe("other").unwrap();
    nc.publish("other", b"x").unwrap();
    assert_eq!(
        other.next_timeout(Duration::from_secs(5)).unwrap().data,
        b"x"
    );
    assert_eq!(slow.dropped(), 90);
    for i in 0..10 {
        let m = slow.next_timeout(Duration::from_secs(1)).unwrap();
        assert_eq!(m.data, format!("{i}").as_bytes());
    }
    assert!(nc.closed().is_none());
}

#[test]
fn a_silent_server_is_detected_and_a_flush_keeps_its_bound() {
    let server = NatsServer::start();
    let pid = server.pid().expect("running") as libc::pid_t;
    let mut o = options(&server);
    o.ping_interval = Duration::from_millis(300);
    o.max_pings_out = 2;
    let (tx, closed) = mpsc::channel();
    o.on_closed = Some(std::sync::Arc::new(move |why: &str| {
        let _ = tx.send(why.to_owned());
    }));
    let nc = fleet_nats::connect(&o).unwrap();
    let sub = nc.subscribe("x").unwrap();
    nc.flush(Duration::from_secs(5)).unwrap();
    // SAFETY: signals to the nats-server child this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    // Stopped (state T) before the flush, so no thread of it answers any more.
    let stopped = Instant::now() + Duration::from_secs(5);
    while !std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .unwrap()
        .contains(") T ")
    {
        assert!(Instant::now() < stopped, "nats-server did not stop");
        // why: pacing of the bounded wait for the server to stop
        std::thread::sleep(Duration::from_millis(10));
    }
    let t = Instant::now();
    let e = nc.flush(Duration::from_millis(400)).expect_err("no PONG");
    let took = t.elapsed();
    let why = closed.recv_timeout(Duration::from_secs(10));
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    assert!(
        took < Duration::from_millis(1500),
        "flush took {took:?}: {e}"
    );
    let why = why.expect("on_closed within 10 s");
    assert!(why.contains("PING"), "{why}");
    assert!(nc.closed().is_some());
    assert!(
        sub.next().is_none(),
        "subscriptions end with the connection"
    );
    assert!(nc.publish("x", b"y").is_err());
}

#[test]
fn a_server_that_goes_away_is_reported_at_once() {
    let mut server = NatsServer::start();
    let (tx, closed) = mpsc::channel();
    let mut o = options(&server);
    o.on_closed = Some(std::sync::Arc::new(move |why: &str| {
        let _ = tx.send(why.to_owned());
    }));
    let nc = fleet_nats::connect(&o).unwrap();
    nc.flush(Duration::from_secs(5)).unwrap();
    server.stop();
    let why = closed
        .recv_timeout(Duration::from_secs(10))
        .expect("closed");
    assert!(why.contains("closed"), "{why}");
    // The next connection is the caller's to make: none here, so connecting fails within its bound.
    let mut o2 = options(&server);
    o2.connect_timeout = Duration::from_secs(2);
    let t = Instant::now();
    assert!(fleet_nats::connect(&o2).is_err());
    assert!(t.elapsed() < Duration::from_secs(3));
    drop(nc);
}
