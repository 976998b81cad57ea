//! A link to NATS that dies silently (an outage was noticed only after about 85 s): the agent talks to
//! nats-server through a TCP relay that, at a moment the test chooses, stops forwarding in both directions
//! without closing anything, as a cut cable or a NAT that forgot the flow does. The agent notices within
//! `nats_kv::DEAD_LINK_BOUND` (30 s: a PING after 15 s of silence, closed when it is not answered 15 s later), connects anew
//! (the relay forwards new connections) and heartbeats again.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::*;
use fleet_agent::nats_kv::DEAD_LINK_BOUND;
use fleet_wire::kv;
use fleet_wire::Heartbeat;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A TCP relay to `upstream`; [`Relay::freeze`] stops the connections it has so far, silently.
struct Relay {
    addr: String,
    frozen: Arc<Mutex<Vec<Arc<AtomicBool>>>>,
}

impl Relay {
    fn start(upstream: String) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let frozen: Arc<Mutex<Vec<Arc<AtomicBool>>>> = Arc::default();
        let all = frozen.clone();
        std::thread::spawn(move || {
            for down in listener.incoming() {
                let Ok(down) = down else { continue };
                let Ok(up) = TcpStream::connect(&upstream) else {
                    continue;
                };
                let stop = Arc::new(AtomicBool::new(false));
                all.lock().unwrap().push(stop.clone());
                pump(
                    down.try_clone().unwrap(),
                    up.try_clone().unwrap(),
                    stop.clone(),
                );
                pump(up, down, stop);
            }
        });
        Relay { addr, frozen }
    }

    /// Every connection so far stops forwarding and stays open; new ones forward.
    fn freeze(&self) {
        for s in self.frozen.lock().unwrap().iter() {
            s.store(true, Ordering::SeqCst);
        }
    }
}

/// Copies `from` to `to` until either closes; once `stop` is set it reads nothing more and holds both open.
fn pump(mut from: TcpStream, mut to: TcpStream, stop: Arc<AtomicBool>) {
    std::thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        from.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        loop {
            if stop.load(Ordering::SeqCst) {
                // Silent: keep the sockets, forward nothing, until the test ends.
                // why: holds the link dead (sockets open, nothing through) until the test ends; waits for nothing
                std::thread::sleep(Duration::from_secs(3600));
                return;
            }
            match from.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => {
                    if to.write_all(&buf[..n]).is_err() {
                        return;
                    }
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => return,
            }
        }
    });
}

#[test]
fn a_silently_dead_link_is_noticed_within_the_bound() {
    let rig = Rig::new(false, "");
    let relay = Relay::start(rig.nats.url().trim_start_matches("nats://").to_owned());
    let config = std::fs::read_to_string(&rig.config).unwrap();
    let config = config.replace(&rig.nats.url(), &format!("nats://{}", relay.addr));
    assert!(config.contains(&relay.addr), "{config}");
    std::fs::write(&rig.config, config).unwrap();

    let mut agent = rig.spawn_agent();
    agent.wait_ready();
    let beats = store(&rig.nc(), kv::DEVICE_HEARTBEAT);
    let seq = || get_json::<Heartbeat>(&beats, DEVICE).map(|h| h.sequence);
    eventually(&agent, Duration::from_secs(10), "heartbeats", || {
        seq().filter(|s| *s >= 2)
    });

    relay.freeze();
    let cut = Instant::now();
    let before = seq().unwrap();
    eventually(
        &agent,
        DEAD_LINK_BOUND + Duration::from_secs(15),
        "the dead link noticed",
        || {
            agent
                .log_text()
                .contains("NATS connection closed (no answer to 1 PINGs")
                .then_some(())
        },
    );
    let noticed = cut.elapsed();
    println!("noticed {noticed:?} after the link went silent");
    // Counted from the server's last frame, which came before the cut; a second for the log to be read.
    assert!(
        noticed <= DEAD_LINK_BOUND + Duration::from_secs(1),
        "noticed after {noticed:?}, bound {DEAD_LINK_BOUND:?}"
    );
    // Connected anew through the relay: heartbeats reach NATS again.
    eventually(
        &agent,
        Duration::from_secs(30),
        "heartbeats again after reconnecting",
        || seq().filter(|s| *s > before + 1),
    );
    println!("heartbeating again {:?} after the cut", cut.elapsed());
    agent.sigterm();
    assert!(agent.wait_exit(Duration::from_secs(30)).success());
}
