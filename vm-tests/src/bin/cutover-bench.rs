//! Benchmark (`scripts/bench devices`): the cutover gap of an agent upgrade on a whole device — from the old
//! agent stopped to the new agent READY — with an idle drain, next to a plain `systemctl restart` of the same
//! agent measured on the same device in the same run. Prints a Markdown table.

use fleet_vm_tests::builds::{self, V1, V2, V3};
use fleet_vm_tests::fleet::{Artifacts, Device, Operator};
use fleet_wire::UpgradePhase;
use std::time::Duration;

/// The journal cursor of fleet-agent.service now.
fn cursor(device: &Device) -> String {
    let out = device
        .guest
        .sh("journalctl -u fleet-agent.service -n 0 --show-cursor --no-pager");
    out.lines()
        .find_map(|l| l.strip_prefix("-- cursor: "))
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// Microseconds from the first "Stopped" of fleet-agent.service after `cursor` to the next "Started" (READY=1
/// for a Type=notify unit).
fn gap_us(device: &Device, cursor: &str) -> Option<u64> {
    let out = device.guest.sh(&format!(
        "journalctl -u fleet-agent.service -o json --no-pager --after-cursor='{cursor}'"
    ));
    let mut stopped = None;
    for line in out.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let msg = v["MESSAGE"].as_str().unwrap_or("");
        let t: u64 = v["__MONOTONIC_TIMESTAMP"].as_str()?.parse().ok()?;
        if stopped.is_none() && msg.starts_with("Stopped ") {
            stopped = Some(t);
        } else if let Some(s) = stopped {
            if msg.starts_with("Started ") {
                return Some(t.saturating_sub(s));
            }
        }
    }
    None
}

fn main() {
    let nats = fleet_vm_tests::fleet::start_nats();
    let operator = Operator::new(&nats);
    let artifacts = Artifacts::start();
    let device = Device::install(&nats, &operator, V1, Some(&artifacts));

    // Reference: the same agent restarted by systemd (stop, start, READY) with nothing else in between.
    let mut restarts = vec![];
    for _ in 0..3 {
        let c = cursor(&device);
        device.guest.sh("systemctl restart fleet-agent.service");
        if let Some(g) = gap_us(&device, &c) {
            restarts.push(g);
        }
    }
    // Upgrades with an idle drain: v1 -> v2 -> v3.
    let mut upgrades = vec![];
    let mut drains = vec![];
    for (v, name) in [(V2, "fleet-agent-v2"), (V3, "fleet-agent-v3")] {
        let c = cursor(&device);
        let attempt = artifacts.attempt(&builds::agent(v), name, v);
        operator.put_intent(&attempt);
        let s = operator.wait_phase(&attempt, UpgradePhase::Complete, Duration::from_secs(300));
        if let Some(g) = gap_us(&device, &c) {
            upgrades.push(g);
        }
        if let Some(d) = s.drain_duration_ms {
            drains.push(d * 1000);
        }
    }
    let ms = |v: &[u64]| -> String {
        if v.is_empty() {
            return "n/a".into();
        }
        let med = {
            let mut s = v.to_vec();
            s.sort_unstable();
            s[s.len() / 2]
        };
        format!("{:.0} ms (median of {})", med as f64 / 1000.0, v.len())
    };
    let worst_upgrade = upgrades.iter().copied().max().unwrap_or(u64::MAX);
    println!(
        "| cutover on an nspawn device (idle drain) | old agent stopped → new agent READY | goal |"
    );
    println!("|---|---|---|");
    println!(
        "| reference: `systemctl restart fleet-agent` (same binary) | {} | — |",
        ms(&restarts)
    );
    println!(
        "| upgrade by fleet-updater (switch link, start, READY) | {} | ≤ 1500 ms: {} |",
        ms(&upgrades),
        if worst_upgrade <= 1_500_000 {
            "met"
        } else {
            "NOT met"
        }
    );
    println!(
        "| drain reported in the status (SIGTERM → exit) | {} | — |",
        ms(&drains)
    );
}
