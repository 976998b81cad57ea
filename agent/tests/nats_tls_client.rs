//! The blocking `nats` client the agent links (0.26, patched in agent/vendor/nats) over TLS against a real
//! nats-server that requires TLS with a private CA: thousands of request/replies from several threads of one
//! connection all get their reply, and publishes larger than rustls' 64 KiB send buffer all arrive. Before the
//! patch the first lost about 1 % of its requests (a reply decrypted by a writing thread while the reading thread
//! slept in poll) and the second broke the connection ("failed to write whole buffer") and then hung in a flush.
#![allow(deprecated, clippy::unwrap_used, clippy::expect_used)]

use fleet_rig::NatsServer;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Requester threads sharing one connection: several requests share each flush, and replies arrive while
/// another thread writes — the interleaving that lost replies.
const THREADS: usize = 8;
/// Requests per thread (4,000 in all; about 3 s).
const PER_THREAD: usize = 500;
/// Far above a round trip on loopback (well under 10 ms), far below the run.
const REPLY_TIMEOUT: Duration = Duration::from_secs(2);

#[test]
fn thousands_of_requests_over_tls_all_get_their_reply() {
    let server = NatsServer::start_tls(false);
    assert!(server.url().starts_with("tls://"));
    let responder = server.connect();
    let sub = responder.subscribe("svc.echo").unwrap();
    let _handler = sub.with_handler(|m| m.respond(&m.data));
    responder.flush().unwrap();

    let requester = server.connect();
    let started = Instant::now();
    let lost: Vec<String> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..THREADS)
            .map(|t| {
                let nc = requester.clone();
                s.spawn(move || {
                    let mut lost = Vec::new();
                    for i in 0..PER_THREAD {
                        let body = format!("{t}-{i}");
                        match nc.request_timeout("svc.echo", &body, REPLY_TIMEOUT) {
                            Ok(m) => {
                                assert_eq!(m.data, body.as_bytes(), "a reply to another request")
                            }
                            Err(e) => lost.push(format!("thread {t} request {i}: {e}")),
                        }
                    }
                    lost
                })
            })
            .collect();
        threads
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    assert!(
        lost.is_empty(),
        "{} of {} requests got no reply within {REPLY_TIMEOUT:?} over TLS (run took {:?}):\n{}",
        lost.len(),
        THREADS * PER_THREAD,
        started.elapsed(),
        lost.join("\n")
    );
}

#[test]
fn publishes_larger_than_the_tls_send_buffer_all_arrive() {
    const PUBLISHERS: usize = 4;
    const EACH: usize = 15;
    let server = NatsServer::start_tls(false);
    let receiver = server.connect();
    let sub = receiver.subscribe("big").unwrap();
    receiver.flush().unwrap();
    let sender = server.connect();
    // Within the server's 1 MiB max_payload, 14 times rustls' 64 KiB limit of TLS bytes waiting for the socket.
    let body = vec![7u8; 900 * 1024];
    std::thread::scope(|s| {
        for t in 0..PUBLISHERS {
            let (nc, body) = (sender.clone(), &body);
            s.spawn(move || {
                for i in 0..EACH {
                    nc.publish("big", body)
                        .unwrap_or_else(|e| panic!("publish {t}/{i}: {e}"));
                }
            });
        }
    });
    // The client's flush waits for the server's PONG without a bound of its own: bound it here.
    let (done, flushed) = mpsc::channel();
    let nc = sender.clone();
    std::thread::spawn(move || done.send(nc.flush_timeout(Duration::from_secs(10))));
    flushed
        .recv_timeout(Duration::from_secs(20))
        .expect("the flush after the publishes did not return within 20 s")
        .expect("flush");
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut got = 0;
    while got < PUBLISHERS * EACH {
        let left = deadline.saturating_duration_since(Instant::now());
        let m = sub
            .next_timeout(left)
            .unwrap_or_else(|e| panic!("{got} of {} messages arrived: {e}", PUBLISHERS * EACH));
        assert_eq!(m.data.len(), body.len());
        got += 1;
    }
}
