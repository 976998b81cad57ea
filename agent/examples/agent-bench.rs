//! Benchmark driver for `scripts/bench.d/40-agent.sh`: idle RSS with 10 workloads, desired-state put → container
//! running against a plain `podman run` in the same run, and the stripped release binary size. Prints a Markdown
//! table. Needs `FLEET_AGENT_BIN` (the release binary) and the same parts as the integration tests.
#![allow(deprecated, clippy::unwrap_used, clippy::expect_used, missing_docs)]

#[path = "../tests/common/mod.rs"]
mod common;
use common::*;
use fleet_agent::podman::Podman;
use fleet_wire::{kv, DesiredState, DeviceId, WorkloadName, WorkloadSpec};
use std::time::{Duration, Instant};

fn workload(name: &str) -> WorkloadSpec {
    let mut w = WorkloadSpec::new(WorkloadName::try_from(name).unwrap(), IMAGE).unwrap();
    w.command = vec!["sleep".into(), "100000".into()];
    w
}

fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let rig = Rig::new(true, "");
    let p = rig.podman.as_ref().unwrap();
    let api = Podman::new(&p.socket(), Duration::from_secs(1));
    let desired = |ws: Vec<WorkloadSpec>, g: u64| {
        let d = DesiredState::new(DeviceId::try_from(DEVICE).unwrap(), g, ws).unwrap();
        store(&rig.nc(), kv::DESIRED_STATE)
            .put(DEVICE, serde_json::to_vec(&d).unwrap())
            .unwrap();
    };
    let running = |name: &str| {
        api.list_managed()
            .unwrap_or_default()
            .iter()
            .any(|o| o.name == format!("fleet-{name}") && o.state == "running")
    };
    let mut ws: Vec<WorkloadSpec> = (0..10).map(|i| workload(&format!("w{i}"))).collect();
    desired(ws.clone(), 1);
    let mut agent = rig.spawn_agent();
    agent.wait_ready();
    eventually(
        &agent,
        Duration::from_secs(120),
        "10 workloads running",
        || {
            (api.list_managed()
                .unwrap_or_default()
                .iter()
                .filter(|o| o.state == "running")
                .count()
                == 10)
                .then_some(())
        },
    );
    std::thread::sleep(Duration::from_secs(5));
    let agent_rss = rss_kib(agent.child.id());

    // Put → running, 5 times, against `podman run -d` of the same image and command.
    let mut agent_times = Vec::new();
    let mut podman_times = Vec::new();
    for i in 0..5 {
        let name = format!("lat{i}");
        ws.push(workload(&name));
        let t = Instant::now();
        desired(ws.clone(), 2 + i);
        eventually(
            &agent,
            Duration::from_secs(60),
            "latency workload running",
            || running(&name).then_some(()),
        );
        agent_times.push(t.elapsed());
        let t = Instant::now();
        p.podman(&[
            "run",
            "-d",
            "--name",
            &format!("plain{i}"),
            IMAGE,
            "sleep",
            "100000",
        ]);
        podman_times.push(t.elapsed());
    }
    let bin = agent_bin();
    let size = std::fs::metadata(&bin).map(|m| m.len()).unwrap_or(0);
    let ms = |d: Duration| format!("{:.0} ms", d.as_secs_f64() * 1000.0);
    let mib = |b: u64| format!("{:.2} MiB", b as f64 / 1048576.0);
    println!("| measure | fleet-agent | reference (same run) | goal |");
    println!("|---|---|---|---|");
    println!(
        "| idle RSS with 10 workloads | {} | — | ≤ 6 MiB |",
        mib(agent_rss * 1024)
    );
    println!(
        "| desired-state put → container running (median of 5) | {} | `podman run -d`: {} | — |",
        ms(median(agent_times)),
        ms(median(podman_times))
    );
    println!(
        "| stripped release binary ({}) | {} | — | ≤ 6 MiB (amd64) |",
        std::env::consts::ARCH,
        mib(size)
    );
    agent.sigterm();
    let _ = agent.wait_exit(Duration::from_secs(60));
}
