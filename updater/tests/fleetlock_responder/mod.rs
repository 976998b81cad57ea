//! A one-slot FleetLock responder on a real loopback socket for the reboot client's tests (the real
//! fleetlock-server is a binary of the operator crate, which the updater's tests cannot build).
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

/// A one-slot FleetLock responder on a real socket: it answers like the protocol says and records requests.
pub struct Responder {
    /// Where it listens.
    pub addr: SocketAddr,
    /// The current holder's id.
    pub holder: Arc<Mutex<Option<String>>>,
    /// `<path> <id> <hostname>` per request, in order.
    pub requests: Arc<Mutex<Vec<String>>>,
}

/// Starts a responder on a free loopback port; it serves until the test process exits.
pub fn responder() -> Responder {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let holder = Arc::new(Mutex::new(None::<String>));
    let requests = Arc::new(Mutex::new(Vec::new()));
    let (h, r) = (holder.clone(), requests.clone());
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(s) = s else { continue };
            let (h, r) = (h.clone(), r.clone());
            std::thread::spawn(move || serve(s, &h, &r));
        }
    });
    Responder {
        addr,
        holder,
        requests,
    }
}

fn serve(s: TcpStream, holder: &Mutex<Option<String>>, requests: &Mutex<Vec<String>>) {
    let mut rd = BufReader::new(s.try_clone().unwrap());
    let mut w = s;
    loop {
        let mut line = String::new();
        if rd.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
        let (mut len, mut proto) = (0usize, false);
        loop {
            let mut h = String::new();
            rd.read_line(&mut h).unwrap();
            let h = h.trim().to_ascii_lowercase();
            if h.is_empty() {
                break;
            }
            if let Some(v) = h.strip_prefix("content-length:") {
                len = v.trim().parse().unwrap();
            }
            if h == "fleet-lock-protocol: true" {
                proto = true;
            }
        }
        let mut body = vec![0; len];
        rd.read_exact(&mut body).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let id = v["client_params"]["id"].as_str().unwrap().to_string();
        requests
            .lock()
            .unwrap()
            .push(format!("{path} {id} {}", v["client_params"]["hostname"]));
        let mut held = holder.lock().unwrap();
        let (code, text) = if !proto {
            (400, r#"{"kind":"missing-protocol-header","value":"x"}"#)
        } else if path == "/v1/pre-reboot" {
            match held.as_ref() {
                Some(h) if *h != id => (409, r#"{"kind":"all-slots-taken","value":"1 of 1"}"#),
                _ => {
                    *held = Some(id);
                    (200, "{}")
                }
            }
        } else {
            if held.as_deref() == Some(id.as_str()) {
                *held = None;
            }
            (200, "{}")
        };
        let _ = write!(
            w,
            "HTTP/1.1 {code} X\r\ncontent-length: {}\r\n\r\n{text}",
            text.len()
        );
    }
}
