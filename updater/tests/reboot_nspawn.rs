//! The marker / boot-id cycle through a real reboot of an nspawn device: `fleet-reboot.service` (the shipped
//! unit) takes the lock from a FleetLock responder on the host, writes its marker and diagnostics and reboots the
//! guest; after the boot the next run finds the marker with another boot id and gives the lock back.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use fleet_rig::nspawn::Guest;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A one-slot FleetLock responder on a real socket: it answers like the protocol says and records requests.
struct Responder {
    addr: SocketAddr,
    holder: Arc<Mutex<Option<String>>>,
    requests: Arc<Mutex<Vec<String>>>,
}

fn responder() -> Responder {
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

#[test]
fn reboot_cycle_in_an_nspawn_device() {
    let srv = responder();
    let mut guest = Guest::boot();
    let _relay = guest.forward(srv.addr.port());
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    guest.install_file(
        Path::new(env!("CARGO_BIN_EXE_fleet-reboot")),
        "/usr/local/bin/fleet-reboot",
        0o755,
    );
    guest.install_file(
        &repo.join("systemd/fleet-reboot.service"),
        "/etc/systemd/system/fleet-reboot.service",
        0o644,
    );
    guest.install_file(
        &repo.join("systemd/fleet-reboot.timer"),
        "/etc/systemd/system/fleet-reboot.timer",
        0o644,
    );
    let cfg = format!(
        "server: http://127.0.0.1:{}\ngroup: default\ntimeout: 2\nallow_degraded: true\nhealth_wait: 60\n",
        srv.addr.port()
    );
    guest.write_file(
        "/etc/harmony-fleet/fleet-reboot.yaml",
        cfg.as_bytes(),
        0o644,
    );
    guest.sh("systemctl daemon-reload && touch /run/reboot-required");
    let first = guest.boot_id();
    let old_pid1 = guest.pid1();

    guest.sh("systemctl start --no-block fleet-reboot.service");
    let rebooted = fleet_rig::wait_for(Duration::from_secs(90), || {
        (guest.pid1().is_some() && guest.pid1() != old_pid1).then_some(())
    });
    assert!(
        rebooted.is_some(),
        "the guest did not reboot. Console:\n{}",
        guest.console()
    );
    guest.wait_up(Duration::from_secs(60));
    let second = guest.boot_id();
    assert_ne!(first, second);
    let held = srv.holder.lock().unwrap().clone();
    assert!(held.is_some(), "the lock was not taken before the reboot");
    let marker = std::fs::read_to_string(guest.path("/var/lib/fleet-reboot/marker.json")).unwrap();
    assert!(
        marker.contains(&first),
        "marker {marker} lacks the first boot id"
    );
    let diag = guest.sh("ls /var/log/fleet-reboot/");
    assert!(diag.contains("reboot-"), "no diagnostics snapshot: {diag}");

    // After the boot (the timer would do this): the marker has another boot id, so release and clean up.
    guest.sh("systemctl start fleet-reboot.service");
    assert!(
        srv.holder.lock().unwrap().is_none(),
        "lock not released: {}",
        guest.journal("fleet-reboot.service", 40)
    );
    assert!(!guest.path("/var/lib/fleet-reboot/marker.json").exists());
    let reqs = srv.requests.lock().unwrap().clone();
    assert!(
        reqs.iter().any(|r| r.starts_with("/v1/pre-reboot")),
        "{reqs:?}"
    );
    assert!(
        reqs.iter().any(|r| r.starts_with("/v1/steady-state")),
        "{reqs:?}"
    );
    // The timer unit is well-formed for the guest's systemd.
    let verify = guest.try_sh("systemd-analyze verify /etc/systemd/system/fleet-reboot.timer 2>&1");
    assert!(verify.0, "{}", verify.1);
}
