//! The marker / boot-id cycle through a real reboot of an nspawn device: `fleet-reboot.service` (the shipped
//! unit) takes the lock from a FleetLock responder on the host, writes its marker and diagnostics and reboots the
//! guest; after the boot the next run finds the marker with another boot id and gives the lock back. And the
//! race: the timer's run and the updater's `--upgrade-step` in one boot of one device,
//! against the real one-slot `fleetlock-server`: the slot is never given back under the rebooting device.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fleetlock_responder;

use fleet_rig::fleetlock::{Conn, ServerProcess};
use fleet_rig::nspawn::Guest;
use fleetlock_responder::responder;
use sha2::{Digest, Sha256};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// Installs `fleet-reboot` (the multicall binary under the tool's name runs that tool) and its service, with a
/// config naming the FleetLock server at the guest's `127.0.0.1:lock_port`, group `default`, plus `extra` lines.
fn install_fleet_reboot(guest: &Guest, lock_port: u16, extra: &str) {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    guest.install_file(
        Path::new(env!("CARGO_BIN_EXE_fleet-tools")),
        "/usr/local/sbin/fleet-reboot",
        0o755,
    );
    guest.install_file(
        &repo.join("systemd/fleet-reboot.service"),
        "/etc/systemd/system/fleet-reboot.service",
        0o644,
    );
    let cfg = format!(
        "server: http://127.0.0.1:{lock_port}\ngroup: default\nallow_degraded: true\nhealth_wait: 60\n{extra}"
    );
    guest.write_file(
        "/etc/harmony-fleet/fleet-reboot.yaml",
        cfg.as_bytes(),
        0o644,
    );
}

#[test]
fn reboot_cycle_in_an_nspawn_device() {
    let srv = responder();
    let mut guest = Guest::boot();
    let _relay = guest.forward(srv.addr.port());
    install_fleet_reboot(&guest, srv.addr.port(), "timeout: 2\n");
    guest.install_file(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("systemd/fleet-reboot.timer"),
        "/etc/systemd/system/fleet-reboot.timer",
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

/// The real `fleetlock-server` (`cargo test --workspace` builds it beside this test; `$FLEETLOCK_SERVER` overrides).
fn fleetlock_server_bin() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| fleet_rig::workspace_root().join("target"));
    fleet_rig::require_binary(
        "fleetlock-server",
        "FLEETLOCK_SERVER",
        &[target.join("debug/fleetlock-server")],
        "build it first: cargo build -p fleetlock-server",
    )
}

/// The real fleetlock-server with one slot per group and a file store in a temporary directory (kept while the
/// server runs).
fn one_slot_server() -> (tempfile::TempDir, ServerProcess) {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("fleetlock.yaml");
    std::fs::write(
        &config,
        format!(
            "default_slots: 1\nstore: {{kind: file, dir: \"{}\"}}\n",
            dir.path().join("store").display()
        ),
    )
    .unwrap();
    let srv = ServerProcess::start(&fleetlock_server_bin(), &config).expect("fleetlock-server");
    (dir, srv)
}

/// The ids holding a slot of group `default`.
fn holders(srv: &ServerProcess) -> Vec<String> {
    let a = srv
        .conn()
        .and_then(|mut c| c.request("GET", "/v1/status", &[], b""))
        .expect("GET /v1/status");
    let v: serde_json::Value = serde_json::from_slice(&a.body).expect("status JSON");
    fleet_rig::fleetlock::default_holders(&v)
}

/// A relay in front of the FleetLock server that holds every `pre-reboot` answer until a `steady-state` has gone
/// through (or 5 s passed): the order "the step's lock request reaches the server, the timer's release reaches
/// it, the step reads its answer" is made certain. Sends each request's path on the receiver as it arrives.
fn lock_relay(server: std::net::SocketAddr) -> (u16, mpsc::Receiver<String>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let (tx, rx) = mpsc::channel::<String>();
    let released = Arc::new((Mutex::new(false), std::sync::Condvar::new()));
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            let (tx, released) = (tx.clone(), released.clone());
            std::thread::spawn(move || {
                let mut rd = BufReader::new(s.try_clone().unwrap());
                let mut head = String::new();
                let mut len = 0usize;
                loop {
                    let mut line = String::new();
                    if rd.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                        len = v.trim().parse().unwrap_or(0);
                    }
                    let end = line.trim().is_empty();
                    head.push_str(&line);
                    if end {
                        break;
                    }
                }
                let mut bytes = head.clone().into_bytes();
                let mut body = vec![0; len];
                std::io::Read::read_exact(&mut rd, &mut body).unwrap();
                bytes.extend_from_slice(&body);
                let path = head.split_whitespace().nth(1).unwrap_or("").to_string();
                let _ = tx.send(path.clone());
                let a = Conn::connect(server).unwrap().raw(&bytes).unwrap();
                let (lock, cv) = &*released;
                if path == "/v1/steady-state" {
                    *lock.lock().unwrap() = true;
                    cv.notify_all();
                } else if path == "/v1/pre-reboot" {
                    let g = lock.lock().unwrap();
                    let _ = cv.wait_timeout_while(g, Duration::from_secs(5), |r| !*r);
                }
                let _ = write!(
                    s,
                    "HTTP/1.1 {} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    a.status,
                    a.body.len()
                );
                let _ = s.write_all(&a.body);
            });
        }
    });
    (port, rx)
}

/// A dependency (`require_hosts` URL) the test answers by hand: the first request waits for the code sent on
/// the returned sender, every later one gets 200 at once. Each request's number is sent on the receiver.
fn held_dependency() -> (u16, mpsc::Sender<u16>, mpsc::Receiver<usize>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let (code_tx, code_rx) = mpsc::channel::<u16>();
    let (seen_tx, seen_rx) = mpsc::channel::<usize>();
    let first = Arc::new(Mutex::new(Some(code_rx)));
    std::thread::spawn(move || {
        for (n, s) in l.incoming().enumerate() {
            let Ok(mut s) = s else { continue };
            let (first, seen) = (first.clone(), seen_tx.clone());
            std::thread::spawn(move || {
                let mut rd = BufReader::new(s.try_clone().unwrap());
                loop {
                    let mut line = String::new();
                    if rd.read_line(&mut line).unwrap_or(0) == 0 || line.trim().is_empty() {
                        break;
                    }
                }
                let _ = seen.send(n);
                let held = first.lock().unwrap().take();
                let code = match (n, held) {
                    (0, Some(rx)) => rx.recv().unwrap_or(503),
                    _ => 200,
                };
                let _ = write!(
                    s,
                    "HTTP/1.1 {code} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                );
            });
        }
    });
    (port, code_tx, seen_rx)
}

/// The timer's run racing the upgrade step, on one nspawn device against the real one-slot fleetlock-server. Earlier in this boot an
/// upgrade step took the slot and its reboot did not happen (its marker names this boot). The timer's run starts
/// and waits on a slow dependency; the updater's `--upgrade-step` starts beside it and reboots the device; then
/// the dependency answers "down" to the timer's run. While the device reboots, another host asks for the slot
/// all the time: it must never get it, and the device must still hold it when it is back up.
#[test]
fn timer_and_upgrade_step_racing_never_release_a_slot_under_a_rebooting_device() {
    let (_dir, srv) = one_slot_server();
    let (dep_port, answer_timer, seen) = held_dependency();
    let (lock_port, lock_requests) = lock_relay(srv.addr);
    let mut guest = Guest::boot();
    let _relay = guest.forward(lock_port);
    let _dep = guest.forward(dep_port);
    install_fleet_reboot(
        &guest,
        lock_port,
        &format!("timeout: 20\nrequire_hosts: ['http://127.0.0.1:{dep_port}/ready']\n"),
    );
    guest.sh("systemctl daemon-reload && touch /run/reboot-required");
    let first = guest.boot_id();
    // The device's FleetLock id, as the client derives it (docs/fleetlock.md).
    let machine_id = guest.sh("cat /etc/machine-id");
    let digest = Sha256::digest(format!("fleet-reboot:{}", machine_id.trim()).as_bytes());
    let id: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();

    // Earlier in this boot: an upgrade step took the slot and wrote its marker; the reboot did not happen.
    let taken = Conn::connect(srv.addr)
        .unwrap()
        .fleetlock(true, &id, "default")
        .unwrap();
    assert_eq!(taken.status, 200, "{}", taken.text());
    fleet_updater::reboot::marker::write(
        &guest.path("/var/lib/fleet-reboot/marker.json"),
        &fleet_updater::reboot::marker::Marker {
            version: 1,
            boot_id: first.clone(),
            taken_at: fleet_wire::Timestamp::now(),
            server: format!("http://127.0.0.1:{lock_port}"),
            group: "default".into(),
        },
    )
    .unwrap();

    // The timer's run: it reads the marker, then waits on the dependency.
    guest.sh("systemctl start --no-block fleet-reboot.service");
    assert_eq!(
        seen.recv_timeout(Duration::from_secs(30)).ok(),
        Some(0),
        "the timer's run did not reach its dependency check: {}",
        guest.journal("fleet-reboot.service", 40)
    );
    // The updater's upgrade step, as fleet-updater runs it, beside the timer's run.
    let old_pid1 = guest.pid1();
    guest.sh(
        "systemd-run --unit=fleet-upgrade-step --no-block /usr/local/sbin/fleet-reboot \
         --config /etc/harmony-fleet/fleet-reboot.yaml --upgrade-step",
    );
    // Once the step asks the server for the slot it is about to reboot: the timer's dependency now answers
    // "down" (with a lock between the runs the step waits for the timer's run instead, and asks after it).
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut step_passed = false;
    while let Ok(path) =
        lock_requests.recv_timeout(deadline.saturating_duration_since(Instant::now()))
    {
        if path == "/v1/pre-reboot" {
            step_passed = true;
            break;
        }
    }
    answer_timer.send(503).unwrap();
    let rebooting = fleet_rig::wait_for(Duration::from_secs(90), || {
        (guest.pid1() != old_pid1).then_some(())
    });
    assert!(
        rebooting.is_some(),
        "the device did not reboot for its upgrade step (it asked for the slot beside the timer's run: \
         {step_passed}). Console:\n{}",
        guest.console()
    );
    // The device is rebooting: another host of the group asks for the slot until the device is back.
    let stop = Arc::new(AtomicBool::new(false));
    let other = {
        let (stop, addr) = (stop.clone(), srv.addr);
        std::thread::spawn(move || {
            let start = Instant::now();
            while !stop.load(Ordering::SeqCst) {
                let got =
                    Conn::connect(addr).and_then(|mut c| c.fleetlock(true, "host-b", "default"));
                if got.is_ok_and(|a| a.status == 200) {
                    return Some(start.elapsed());
                }
                // why: pacing of the bounded poll
                std::thread::sleep(Duration::from_millis(20));
            }
            None
        })
    };
    let held_at_reboot = holders(&srv);
    guest.wait_up(Duration::from_secs(60));
    stop.store(true, Ordering::SeqCst);
    let other_won = other.join().unwrap();
    let second = guest.boot_id();
    assert_ne!(first, second);
    assert!(
        other_won.is_none() && held_at_reboot == [id.clone()],
        "two hosts rebooting at once in a one-slot group: the device's slot was given back while it rebooted \
         (holders as the reboot began: {held_at_reboot:?}; another host got the slot {other_won:?} into the \
         device's reboot; the step asked for the slot beside the timer's run: {step_passed}).\ntimer's \
         run:\n{}\nupgrade step:\n{}",
        guest.journal("fleet-reboot.service", 60),
        guest.journal("fleet-upgrade-step.service", 60)
    );
    eprintln!(
        "the step asked for the slot beside the timer's run: {step_passed}\ntimer's run:\n{}\nupgrade step:\n{}",
        guest.journal("fleet-reboot.service", 60),
        guest.journal("fleet-upgrade-step.service", 60)
    );
    assert_eq!(holders(&srv), [id], "still held after the boot");
    // After the boot the timer's run gives it back.
    guest.sh("systemctl start fleet-reboot.service");
    assert!(
        holders(&srv).is_empty(),
        "not released after the boot: {}",
        guest.journal("fleet-reboot.service", 40)
    );
}

/// The same race, the second half, with the real programs and a real reboot: the system upgrade's step
/// reboots the device; in the new boot `--after-boot` gives the slot back and removes the marker before the
/// updater's next step runs. That step must answer `released` from the journal's boot id, without taking the slot
/// or rebooting a second time.
#[test]
fn a_consumed_marker_never_reboots_the_device_a_second_time() {
    use fleet_updater::system::journal::SystemJournal;
    use fleet_updater::system::machine::Event;
    let (_dir, srv) = one_slot_server();
    let mut guest = Guest::boot();
    let _relay = guest.forward(srv.addr.port());
    install_fleet_reboot(&guest, srv.addr.port(), "timeout: 2\n");
    guest.sh("systemctl daemon-reload");
    let first = guest.boot_id();
    // The journal fleet-updater wrote when its upgrade entered `rebooting` in this boot.
    let mut j = SystemJournal::begin(
        fleet_wire::fixtures::system_attempt(),
        vec![],
        fleet_wire::Timestamp::now(),
    );
    j.apply(Event::Start, fleet_wire::Timestamp::now()).unwrap();
    j.apply(
        Event::Upgraded { reboot: true },
        fleet_wire::Timestamp::now(),
    )
    .unwrap();
    let mut journal = serde_json::to_value(&j).unwrap();
    journal["rebootBootId"] = serde_json::json!(first);
    guest.write_file(
        "/var/lib/fleet-updater/system-upgrade.json",
        &serde_json::to_vec_pretty(&journal).unwrap(),
        0o600,
    );
    let step = "systemd-run --wait --pipe --quiet /usr/local/sbin/fleet-reboot \
                --config /etc/harmony-fleet/fleet-reboot.yaml --upgrade-step";

    let old_pid1 = guest.pid1();
    guest.sh(&format!("{step} >/run/step.out 2>&1 &"));
    let rebooted = fleet_rig::wait_for(Duration::from_secs(60), || {
        (guest.pid1() != old_pid1).then_some(())
    });
    assert!(
        rebooted.is_some(),
        "no reboot. Console:\n{}",
        guest.console()
    );
    guest.wait_up(Duration::from_secs(60));
    let second = guest.boot_id();
    assert_ne!(first, second);
    let held = holders(&srv);
    assert_eq!(
        held.len(),
        1,
        "the slot is held across the reboot: {held:?}"
    );

    // The post-boot release runs first and consumes the marker.
    guest.sh(
        "systemd-run --wait --quiet /usr/local/sbin/fleet-reboot --after-boot \
         --config /etc/harmony-fleet/fleet-reboot.yaml",
    );
    assert!(
        holders(&srv).is_empty(),
        "after-boot did not give the slot back"
    );
    assert!(!guest.path("/var/lib/fleet-reboot/marker.json").exists());

    // The updater's next step in the new boot.
    let pid1 = guest.pid1();
    let (_, out) = guest.try_sh(&format!("{step} 2>&1"));
    let again = fleet_rig::wait_for(Duration::from_secs(3), || {
        (guest.pid1() != pid1).then_some(())
    });
    assert!(
        again.is_none() && holders(&srv).is_empty(),
        "a second reboot: the step took the slot ({:?}) and rebooted the device again ({}). Step:\n{out}",
        holders(&srv),
        again.is_some()
    );
    assert!(out.contains(r#"{"outcome":"released"}"#), "{out}");
    guest.wait_up(Duration::from_secs(60));
    assert_eq!(guest.boot_id(), second, "no second reboot");
}
