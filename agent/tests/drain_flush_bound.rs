//! The drain's final NATS flush is bounded by the agent's own constant (`DRAIN_FLUSH_TIMEOUT`), the server's
//! `PONG` included: with nats-server stopped (SIGSTOP: the socket stays open, nothing answers), SIGTERM still
//! ends in a clean exit within that bound plus one NATS request already in flight (`REQUEST_TIMEOUT`), not in a
//! sum of every request the event loop had still to make.
#![allow(deprecated, clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::*;
use fleet_agent::agent::DRAIN_FLUSH_TIMEOUT;
use fleet_agent::nats_kv::REQUEST_TIMEOUT;
use std::time::{Duration, Instant};

struct Continued(libc::pid_t);

impl Drop for Continued {
    fn drop(&mut self) {
        // SAFETY: a signal to the nats-server child this test started.
        unsafe { libc::kill(self.0, libc::SIGCONT) };
    }
}

#[test]
fn the_drain_flush_keeps_its_bound_against_a_silent_server() {
    let rig = Rig::new(false, "");
    let mut agent = rig.spawn_agent();
    agent.wait_ready();
    let pid = rig.nats.pid().expect("running") as libc::pid_t;
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    let _continued = Continued(pid);
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
    agent.sigterm();
    let exit = agent.wait_exit(Duration::from_secs(60));
    let took = t.elapsed();
    let log = agent.log_text();
    assert!(exit.success(), "{log}");
    assert!(log.contains("drained; exiting"), "{log}");
    assert!(
        log.contains(&format!(
            "NATS flush: NATS flush not answered within {DRAIN_FLUSH_TIMEOUT:?}"
        )),
        "{log}"
    );
    // The request in flight when SIGTERM came, the flush, and what the drain does besides (the updater's status
    // over its socket).
    let bound = REQUEST_TIMEOUT + DRAIN_FLUSH_TIMEOUT + Duration::from_secs(2);
    assert!(
        took < bound,
        "the drain took {took:?} (bound {bound:?}):\n{log}"
    );
}
