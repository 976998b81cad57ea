//! Benchmark (`scripts/bench rolling-reboot`): a rolling reboot of 3 nspawn devices in a one-slot FleetLock group
//! (a real `fleetlock-server`), from the first lock taken to the last slot given back, with
//! `fleet-reboot-release.service` (the slot given back as soon as the host is healthy after its boot), next to the
//! same run with today's timer-only release (the timer's first run after the boot: `OnActiveSec=5min` plus up to
//! `RandomizedDelaySec=2min`). Both variants poke every device that still needs its reboot every 2 s (the timer's
//! 15-minute period would dominate otherwise); only the release differs. Prints a Markdown table.
//! `FLEET_BENCH_TIMER_SECS=N` shortens the baseline timer's `OnActiveSec` (and drops its random delay) to try the
//! bench quickly; the table then says so.

use fleet_rig::nspawn::Guest;
use fleet_rig::wait_for;
use fleet_rig::workspace_root;
use fleet_vm_tests::builds;
use fleet_vm_tests::fleetlock::FleetLockServer;
use std::time::{Duration, Instant};

const DEVICES: usize = 3;

fn holders(server: &FleetLockServer) -> Option<usize> {
    let status = server.get("/v1/status")?;
    let v: serde_json::Value = serde_json::from_str(&status).ok()?;
    Some(
        v["groups"]
            .as_array()?
            .iter()
            .map(|g| g["holders"].as_array().map_or(0, Vec::len))
            .sum(),
    )
}

/// One rolling reboot; returns the seconds from the first lock to the last release.
fn run(with_release_unit: bool, timer_secs: Option<u64>) -> f64 {
    let server = FleetLockServer::start();
    let repo = workspace_root();
    let mut guests = Vec::new();
    for _ in 0..DEVICES {
        let mut g = Guest::boot();
        g.wait_up(Duration::from_secs(120));
        g.forward(server.port());
        g.install_file(&builds::tools(), "/usr/local/sbin/fleet-reboot", 0o755);
        let mut units = vec!["fleet-reboot.service", "fleet-reboot.timer"];
        if with_release_unit {
            units.push("fleet-reboot-release.service");
        }
        for u in &units {
            g.install_file(
                &repo.join("updater/systemd").join(u),
                &format!("/etc/systemd/system/{u}"),
                0o644,
            );
        }
        if let Some(s) = timer_secs {
            g.write_file(
                "/etc/systemd/system/fleet-reboot.timer.d/bench.conf",
                format!("[Timer]\nOnActiveSec={s}s\nRandomizedDelaySec=0\n").as_bytes(),
                0o644,
            );
        }
        g.write_file(
            "/etc/harmony-fleet/fleet-reboot.yaml",
            format!(
                "server: http://127.0.0.1:{}\ngroup: default\nallow_degraded: true\nhealth_wait: 300\n",
                server.port()
            )
            .as_bytes(),
            0o644,
        );
        let enable = units
            .iter()
            .filter(|u| **u != "fleet-reboot.service")
            .copied()
            .collect::<Vec<_>>()
            .join(" ");
        g.sh(&format!(
            "systemctl daemon-reload && systemctl enable --now {enable} && touch /run/reboot-required"
        ));
        let boot = g.boot_id();
        guests.push((g, boot));
    }
    let mut first_lock = None;
    let started = Instant::now();
    let done = wait_for(Duration::from_secs(60 * 40), || {
        let mut all_rebooted = true;
        for (g, boot) in &guests {
            // A guest that is rebooting has no PID 1 or answers nothing: count it as not yet rebooted.
            let (ok, id) = g.try_sh("cat /proc/sys/kernel/random/boot_id");
            if ok && id.trim() != boot {
                continue;
            }
            all_rebooted = false;
            if ok {
                let _ = g.exec(&["systemctl", "start", "--no-block", "fleet-reboot.service"]);
            }
        }
        let held = holders(&server).unwrap_or(0);
        if held > 0 && first_lock.is_none() {
            first_lock = Some(Instant::now());
        }
        std::thread::sleep(Duration::from_secs(2));
        (all_rebooted && held == 0 && first_lock.is_some()).then_some(())
    });
    assert!(
        done.is_some(),
        "the rolling reboot did not finish within 40 min ({:?})",
        started.elapsed()
    );
    first_lock
        .map(|t| t.elapsed().as_secs_f64())
        .unwrap_or_default()
}

fn main() {
    let timer_secs = std::env::var("FLEET_BENCH_TIMER_SECS")
        .ok()
        .and_then(|s| s.parse().ok());
    let fast = run(true, None);
    let slow = run(false, timer_secs);
    let baseline = match timer_secs {
        Some(s) => {
            format!("timer-only release (OnActiveSec shortened to {s} s by FLEET_BENCH_TIMER_SECS)")
        }
        None => {
            "timer-only release (today's timer: OnActiveSec=5min, RandomizedDelaySec=2min)".into()
        }
    };
    println!(
        "| rolling reboot, {DEVICES} nspawn devices, one-slot group | first lock → last release |"
    );
    println!("|---|---|");
    println!("| fleet-reboot-release.service (release once healthy after boot) | {fast:.0} s |");
    println!("| {baseline} (reference) | {slow:.0} s |");
}
