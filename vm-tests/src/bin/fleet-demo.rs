//! The first demo (`scripts/demo`): one Debian device in a systemd-nspawn guest, set up with device setup, NATS on
//! the host; an agent upgrade that commits and one that rolls back, shown as a timeline of the public phases.
//! Ctrl-C stops it cleanly: the guest, NATS and the artifact server are torn down by their owners.

use fleet_rig::NatsServer;
use fleet_vm_tests::builds::{self, V1, V2, V3};
use fleet_vm_tests::fleet::{desired_one_workload, Artifacts, Device, Operator};
use fleet_wire::{AgentUpgradeAttempt, UpgradePhase};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn main() {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        if let Err(e) = signal_hook::flag::register(sig, stop.clone()) {
            eprintln!("cannot handle signal {sig}: {e}");
        }
    }
    let code = match std::panic::catch_unwind(|| run(&stop)) {
        Ok(true) => 0,
        Ok(false) => {
            println!("\ninterrupted: cleaned up");
            130
        }
        Err(_) => 1,
    };
    std::process::exit(code);
}

fn step(text: &str) {
    println!("\n== {text}");
}

/// Returns false when interrupted.
fn run(stop: &AtomicBool) -> bool {
    step(&format!("building the agent at {V1}, {V2} and a broken {V3}, and the updater (cached after the first run)"));
    builds::agent(V1);
    builds::updater();
    builds::fetch_helper();
    let (a2, a3) = (builds::agent(V2), builds::agent(V3));
    if stop.load(Ordering::SeqCst) {
        return false;
    }
    step("starting NATS (JetStream) and an HTTPS artifact server on the host");
    let nats = NatsServer::start();
    let operator = Operator::new(&nats);
    let artifacts = Artifacts::start();
    println!(
        "   nats {}   artifacts https://127.0.0.1:{}",
        nats.url(),
        artifacts.port()
    );
    step(&format!("booting a Debian bookworm device (systemd-nspawn) and running device setup with agent {V1}"));
    let t = Instant::now();
    let device = Device::install(&nats, &operator, V1, Some(&artifacts));
    println!(
        "   device-1 up in {:.1}s: fleet-updater {}, fleet-agent {} ({})",
        t.elapsed().as_secs_f64(),
        device.guest.unit_state("fleet-updater.service"),
        device.guest.unit_state("fleet-agent.service"),
        device.active_link()
    );
    if stop.load(Ordering::SeqCst) {
        return false;
    }
    step("a workload: one busybox container, run by the fleet-agent user's rootless Podman");
    device.import_test_image();
    operator.put_desired(&desired_one_workload(1, "web"));
    let up = fleet_rig::wait_for(Duration::from_secs(60), || {
        let c = device.container("fleet-web")?;
        (c["State"]["Running"] == true).then_some(c)
    });
    let Some(c) = up else {
        println!("   the workload did not start:\n{}", device.logs());
        return true;
    };
    let pid = c["State"]["Pid"].clone();
    println!("   fleet-web running (pid {pid})");

    step(&format!(
        "upgrade {V1} -> {V2}: the operator writes an AgentUpgradeAttempt"
    ));
    let attempt = artifacts.attempt(&a2, "fleet-agent-v2", V2);
    operator.put_intent(&attempt);
    if !timeline(&operator, &attempt, stop) {
        return false;
    }
    let still = device
        .container("fleet-web")
        .map(|c| c["State"]["Pid"].clone());
    println!(
        "   active agent: {} (reports {}); fleet-web still the same process: {}",
        device.active_link(),
        device.active_version(),
        still.as_ref() == Some(&pid)
    );

    step(&format!(
        "upgrade {V2} -> {V3}: a candidate that passes its probe but exits before READY=1"
    ));
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("temp dir: {e}"));
    let real = "/opt/fleet-demo/fleet-agent-real-v3";
    device.guest.install_file(&a3, real, 0o755);
    let broken = dir.path().join("broken");
    std::fs::write(
        &broken,
        format!(
            "#!/bin/sh\n# demo: the real {V3} probe passes; the service dies before readiness\n\
             case \"$1\" in --self-test|--version) exec {real} \"$@\" ;; esac\nexit 1\n"
        ),
    )
    .unwrap_or_else(|e| panic!("write: {e}"));
    let attempt = artifacts.attempt(&broken, "fleet-agent-v3", V3);
    operator.put_intent(&attempt);
    if !timeline(&operator, &attempt, stop) {
        return false;
    }
    println!(
        "   active agent after the rollback: {} ({}), fleet-agent {}",
        device.active_link(),
        device.active_version(),
        device.guest.unit_state("fleet-agent.service")
    );
    step("done: tearing down the device, NATS and the artifact server");
    true
}

/// Prints each public phase of `attempt` as it appears in NATS until a terminal phase. False when interrupted.
fn timeline(operator: &Operator, attempt: &AgentUpgradeAttempt, stop: &AtomicBool) -> bool {
    let start = Instant::now();
    let mut last: Option<UpgradePhase> = None;
    let deadline = start + Duration::from_secs(300);
    while Instant::now() < deadline {
        if stop.load(Ordering::SeqCst) {
            return false;
        }
        if let Some(s) = operator.status() {
            if s.attempt_id.as_ref() == Some(&attempt.attempt_id) && last != Some(s.phase) {
                let mut line = format!(
                    "   {:>6.2}s  {:<16}",
                    start.elapsed().as_secs_f64(),
                    serde_json::to_value(s.phase)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_string))
                        .unwrap_or_default()
                );
                if let Some(r) = s.reason {
                    line.push_str(&format!(
                        " reason={}",
                        serde_json::to_value(r)
                            .ok()
                            .and_then(|v| v.as_str().map(str::to_string))
                            .unwrap_or_default()
                    ));
                }
                if let Some(d) = s.drain_duration_ms {
                    line.push_str(&format!(" drain={d}ms"));
                }
                if let Some(e) = &s.error {
                    line.push_str(&format!(" error={:?}", e.as_str()));
                }
                println!("{line}");
                last = Some(s.phase);
                if s.phase.is_terminal() {
                    return true;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    println!("   (no terminal phase within 5 minutes)");
    true
}
