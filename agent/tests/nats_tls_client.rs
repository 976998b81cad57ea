//! The agent's NATS client (`fleet-nats`) over TLS against a real nats-server that requires TLS with a private
//! CA: thousands of request/replies from several threads of one connection all get their reply, and publishes
//! larger than rustls' 64 KiB send buffer all arrive, with a flush whose bound covers the server's PONG. The
//! vendored `nats` 0.26 client this replaced lost about 1 % of the requests before it was patched (a reply
//! decrypted by a writing thread while the reading thread slept in poll); fleet-nats has one thread for the
//! socket and the TLS session, so that interleaving does not exist.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use fleet_rig::NatsServer;
use std::time::{Duration, Instant};

/// Requester threads sharing one connection: several requests share each write, and replies arrive while
/// another thread publishes.
const THREADS: usize = 8;
/// Requests per thread (4,000 in all; about 3 s).
const PER_THREAD: usize = 500;
/// Far above a round trip on loopback (well under 10 ms), far below the run.
const REPLY_TIMEOUT: Duration = Duration::from_secs(2);

fn client(server: &NatsServer) -> fleet_nats::Client {
    client_with(server, |_| {})
}

fn client_with(
    server: &NatsServer,
    set: impl FnOnce(&mut fleet_nats::Options),
) -> fleet_nats::Client {
    let mut opts = fleet_nats::Options::new(&server.url());
    opts.name = "nats_tls_client".into();
    opts.tls = Some(fleet_nats::TlsOptions {
        ca_pem: Some(std::fs::read(server.ca_file().expect("a TLS server")).unwrap()),
        client: None,
    });
    set(&mut opts);
    fleet_nats::connect(&opts).expect("connect over TLS")
}

#[test]
fn thousands_of_requests_over_tls_all_get_their_reply() {
    let server = NatsServer::start_tls(false);
    assert!(server.url().starts_with("tls://"));
    let responder = server.connect();
    let sub = responder.subscribe("svc.echo").unwrap();
    let _handler = sub.with_handler(|m| m.respond(&m.data));
    responder.flush().unwrap();

    let requester = client(&server);
    let started = Instant::now();
    let lost: Vec<String> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..THREADS)
            .map(|t| {
                let nc = requester.clone();
                s.spawn(move || {
                    let replies = nc.subscribe(&format!("reply.{t}.*")).unwrap();
                    let mut lost = Vec::new();
                    for i in 0..PER_THREAD {
                        let body = format!("{t}-{i}");
                        let reply = format!("reply.{t}.{i}");
                        nc.publish_request("svc.echo", &reply, body.as_bytes())
                            .unwrap();
                        match replies.next_timeout(REPLY_TIMEOUT) {
                            Ok(m) => {
                                assert_eq!(m.subject, reply, "a reply to another request");
                                assert_eq!(m.data, body.as_bytes(), "a reply to another request")
                            }
                            Err(e) => lost.push(format!("thread {t} request {i}: {e}")),
                        }
                    }
                    assert_eq!(replies.dropped(), 0);
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
    // Room for every message: this test is about the sender (a full queue drops, counted below).
    let receiver = client_with(&server, |o| o.sub_max_bytes = 64 * 1024 * 1024);
    let sub = receiver.subscribe("big").unwrap();
    receiver.flush(Duration::from_secs(5)).unwrap();
    let sender = client(&server);
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
    // The flush's own bound covers the PONG: no outside watchdog needed.
    let flushed = Instant::now();
    sender.flush(Duration::from_secs(10)).expect("flush");
    assert!(flushed.elapsed() < Duration::from_secs(11));
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
    assert_eq!(sub.dropped(), 0);
    // Larger than the server's max_payload: refused here, the connection stays.
    let e = sender
        .publish("big", &vec![0u8; 2 * 1024 * 1024])
        .expect_err("too big");
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
    sender
        .flush(Duration::from_secs(5))
        .expect("still connected");
}
