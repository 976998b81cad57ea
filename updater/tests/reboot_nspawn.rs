//! The marker / boot-id cycle through a real reboot of an nspawn device: `fleet-reboot.service` (the shipped
//! unit) takes the lock from a FleetLock responder on the host, writes its marker and diagnostics and reboots the
//! guest; after the boot the next run finds the marker with another boot id and gives the lock back.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fleetlock_responder;

use fleet_rig::nspawn::Guest;
use fleetlock_responder::responder;
use std::path::Path;
use std::time::Duration;

#[test]
fn reboot_cycle_in_an_nspawn_device() {
    let srv = responder();
    let mut guest = Guest::boot();
    let _relay = guest.forward(srv.addr.port());
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    guest.install_file(
        // The multicall binary installed under the tool's name runs that tool.
        Path::new(env!("CARGO_BIN_EXE_fleet-tools")),
        "/usr/local/sbin/fleet-reboot",
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
