//! Resource limits, hardware and privileges through the whole device path against the host's real (rootful)
//! Podman and a real nats-server: the agent creates a workload's container with its memory, CPU and PID limits,
//! device node, supplementary group, added capability and OOM score as Podman's own inspect shows them, and a
//! workload that allocates twice its memory limit is killed by the kernel and reported `oom-killed`, the agent
//! unharmed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::*;
use fleet_wire::kv;
use fleet_wire::{
    DesiredState, DeviceId, DeviceWorkloadStatus, Resources, RestartPolicy, WorkloadName,
    WorkloadSpec, WorkloadState,
};
use std::time::Duration;

fn put_desired(rig: &Rig, generation: u64, workloads: Vec<WorkloadSpec>) {
    let d = DesiredState::new(DeviceId::try_from(DEVICE).unwrap(), generation, workloads).unwrap();
    store(&rig.nc(), kv::DESIRED_STATE)
        .put(DEVICE, serde_json::to_vec(&d).unwrap())
        .expect("put desired");
}

fn inspect(rig: &Rig, name: &str) -> serde_json::Value {
    let out = rig
        .podman
        .as_ref()
        .unwrap()
        .podman(&["inspect", name, "--format", "json"]);
    let v: serde_json::Value = serde_json::from_str(&out).expect("inspect json");
    v[0].clone()
}

/// The gid of `name` in the host's /etc/group (the device's, for the agent).
fn host_gid(name: &str) -> u64 {
    let groups = std::fs::read_to_string("/etc/group").expect("/etc/group");
    groups
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.first() == Some(&name)).then(|| f[2].parse().expect("gid"))
        })
        .unwrap_or_else(|| panic!("this machine has no group {name} (Debian has)"))
}

/// Kilobytes of resident memory of a process (`VmRSS`).
fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

#[test]
fn limits_hardware_and_privileges_reach_podman() {
    let serial = "/dev/ttyS0";
    assert!(
        std::fs::metadata(serial).is_ok(),
        "{serial} is missing on this machine: the test gives it to a container"
    );
    let rig = Rig::new(true, "");
    let mut w = WorkloadSpec::new(WorkloadName::try_from("serial").unwrap(), IMAGE).unwrap();
    w.command = vec!["sleep".into(), "1000".into()];
    w.resources = Some(Resources {
        memory_mib: Some(32),
        cpu_millis: Some(250),
        pids: Some(64),
    });
    w.devices = vec![serial.into()];
    w.groups = vec!["dialout".into()];
    w.capabilities = vec!["NET_ADMIN".into()];
    let mut p = WorkloadSpec::new(WorkloadName::try_from("priv").unwrap(), IMAGE).unwrap();
    p.command = vec!["sleep".into(), "1000".into()];
    p.privileged = true;
    put_desired(&rig, 1, vec![w, p]);

    let mut agent = rig.spawn_agent();
    agent.wait_ready();
    let wl = store(&rig.nc(), kv::WORKLOAD_STATUS);
    eventually(&agent, Duration::from_secs(60), "both running", || {
        let s: DeviceWorkloadStatus = get_json(&wl, DEVICE)?;
        (s.workloads.len() == 2
            && s.workloads
                .iter()
                .all(|w| w.state == WorkloadState::Running))
        .then_some(())
    });

    let i = inspect(&rig, "fleet-serial");
    let h = &i["HostConfig"];
    let mib32 = 32 * 1024 * 1024;
    assert_eq!(h["Memory"], mib32, "{h}");
    assert_eq!(h["MemorySwap"], mib32, "no swap beyond the limit: {h}");
    assert_eq!(
        (&h["CpuQuota"], &h["CpuPeriod"]),
        (&25_000.into(), &100_000.into())
    );
    assert_eq!(h["PidsLimit"], 64);
    assert_eq!(h["OomScoreAdj"], 500);
    assert_eq!(h["CapAdd"], serde_json::json!(["CAP_NET_ADMIN"]));
    assert_eq!(
        h["GroupAdd"],
        serde_json::json!([host_gid("dialout").to_string()]),
        "the device's dialout, by gid"
    );
    assert_eq!(h["Devices"][0]["PathOnHost"], serial, "{h}");
    assert_eq!(h["Privileged"], false);
    let podman = rig.podman.as_ref().unwrap();
    let inside = podman.podman(&[
        "exec",
        "fleet-serial",
        "sh",
        "-c",
        "test -c /dev/ttyS0 && echo device; cat /proc/1/oom_score_adj; \
         while read k v; do [ \"$k\" = Groups: ] && echo \"groups $v\"; done < /proc/1/status; true",
    ]);
    assert!(inside.starts_with("device\n500\n"), "{inside}");
    assert!(
        inside.lines().any(|l| l
            .split_whitespace()
            .skip(1)
            .any(|g| g == host_gid("dialout").to_string())
            && l.starts_with("groups ")),
        "the process has the group: {inside}"
    );
    assert_eq!(
        inspect(&rig, "fleet-priv")["HostConfig"]["Privileged"],
        true
    );

    let pid = agent.child.id();
    eprintln!(
        "agent resident memory with two workloads: {} KiB",
        rss_kib(pid)
    );
}

#[test]
fn a_container_over_its_memory_limit_is_killed_and_reported() {
    let rig = Rig::new(true, "");
    let mut w = WorkloadSpec::new(WorkloadName::try_from("hog").unwrap(), IMAGE).unwrap();
    // 64 MiB in a shell variable, twice the limit.
    w.command = vec![
        "sh".into(),
        "-c".into(),
        r#"x=$(busybox head -c 67108864 /dev/zero | busybox tr "\0" a); echo survived"#.into(),
    ];
    w.resources = Some(Resources {
        memory_mib: Some(32),
        ..Default::default()
    });
    w.restart_policy = RestartPolicy::No;
    put_desired(&rig, 1, vec![w]);

    let mut agent = rig.spawn_agent();
    agent.wait_ready();
    let pid = agent.child.id();
    let wl = store(&rig.nc(), kv::WORKLOAD_STATUS);
    let s = eventually(&agent, Duration::from_secs(60), "the hog reported", || {
        let s: DeviceWorkloadStatus = get_json(&wl, DEVICE)?;
        let h = s.workloads.first()?.clone();
        matches!(h.state, WorkloadState::Exited | WorkloadState::OomKilled).then_some(h)
    });
    let i = inspect(&rig, "fleet-hog");
    assert_eq!(i["State"]["ExitCode"], 137, "killed: {}", i["State"]);
    let logs = rig.podman.as_ref().unwrap().podman(&["logs", "fleet-hog"]);
    assert!(!logs.contains("survived"), "{logs}");
    // Podman 4.3 says OOMKilled false here (its conmon's marker goes astray); the agent judges from the kernel's
    // OOM kill count (agent/src/oom.rs).
    assert_eq!(s.state, WorkloadState::OomKilled, "{s:?}");
    assert_eq!(
        s.error.as_ref().map(|e| e.as_str()),
        Some("oom-killed: the container exceeded its memory limit of 32 MiB")
    );
    let r = s.restarts.expect("restarts");
    assert!(r.oom_killed && r.last_exit_code == Some(137), "{r:?}");
    assert!(
        agent.child.try_wait().unwrap().is_none(),
        "the agent still runs"
    );
    assert_eq!(agent.child.id(), pid);
}
