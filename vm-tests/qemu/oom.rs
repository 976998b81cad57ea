//! `oom`: a workload over its memory limit on a real kernel (cgroup v2, rootless Podman of the fleet-agent user,
//! as on a device; nspawn guests cannot enforce memory limits). The device installed as in scenario a is given a
//! workload limited to 32 MiB that allocates 64 MiB and one that idles: the first is reported `oom-killed` with
//! its limit in the error, the second runs on with `oom_score_adj` 500, and the agent keeps its process, its
//! `OOMScoreAdjust=-900` and its `MemoryMin`; the same allocation under restart policy `always` is reported
//! `crash-looping` with `restarts.oomKilled`.

use fleet_rig::nats_client as nats;
use fleet_rig::wait_for;
use fleet_vm_tests::fleet::{device_id, DEVICE, TEST_IMAGE};
use fleet_vm_tests::runner::step;
use fleet_wire::{
    kv, DesiredState, DeviceWorkloadStatus, Resources, RestartPolicy, WorkloadName, WorkloadSpec,
    WorkloadState,
};
use std::time::Duration;

use crate::install_v1;

/// The guest command prefix that runs a command as the fleet-agent user, with its Podman.
const AS_AGENT: &str =
    "cd /tmp && runuser -u fleet-agent -- env XDG_RUNTIME_DIR=/run/user/$(id -u fleet-agent)";

fn workload(name: &str, command: &str) -> WorkloadSpec {
    let mut w = WorkloadSpec::new(
        WorkloadName::try_from(name).unwrap_or_else(|e| panic!("name: {e}")),
        TEST_IMAGE,
    )
    .unwrap_or_else(|e| panic!("workload: {e}"));
    w.command = vec!["sh".into(), "-c".into(), command.into()];
    w.resources = Some(Resources {
        memory_mib: Some(32),
        ..Default::default()
    });
    w
}

pub fn scenario_oom() {
    let mut rig = install_v1();
    let vm = &mut rig.vm;

    // What the device gives rootless Podman: cgroup v2 with the memory controller delegated to the agent user's
    // manager (Debian's user@.service: Delegate=pids memory cpu), and that manager's own OOM score.
    let facts = vm.sh("u=$(id -u fleet-agent); stat -fc %T /sys/fs/cgroup; \
         cat /sys/fs/cgroup/user.slice/user-$u.slice/user@$u.service/cgroup.controllers; \
         systemctl show -p Delegate -p OOMScoreAdjust user@$u.service");
    step(&format!(
        "the device's cgroups: {}",
        facts.replace('\n', " | ")
    ));
    assert!(facts.starts_with("cgroup2fs"), "{facts}");
    let delegated = facts.lines().nth(1).unwrap_or_default();
    assert!(
        delegated.split_whitespace().any(|c| c == "memory"),
        "memory is not delegated to the fleet-agent user's manager: {facts}"
    );
    vm.sh(&format!(
        "{AS_AGENT} podman import --quiet /usr/share/fleet-test/busybox-rootfs.tar {TEST_IMAGE} >/dev/null"
    ));

    let agent_pid = vm.agent_pid();
    assert!(agent_pid > 0);
    let protection = vm.sh(&format!(
        "cat /proc/{agent_pid}/oom_score_adj; systemctl show -p MemoryMin --value fleet-agent.service; \
         cat /sys/fs/cgroup/system.slice/fleet-agent.service/memory.min /sys/fs/cgroup/system.slice/memory.min; \
         ps -o rss= -p {agent_pid}; ps -o rss= -p $(systemctl show -p MainPID --value fleet-updater.service)"
    ));
    step(&format!(
        "agent oom_score_adj, MemoryMin, its cgroup's and system.slice's memory.min, agent and updater RSS (KiB): {}",
        protection.replace('\n', " | ")
    ));
    let p: Vec<&str> = protection.lines().map(str::trim).collect();
    assert_eq!(p.first(), Some(&"-900"), "{protection}");
    assert_eq!(p.get(1), Some(&"33554432"), "{protection}");

    // 64 MiB in a shell variable, twice the limit; no restart, so the kill stays visible.
    let mut hog = workload(
        "hog",
        r#"x=$(busybox head -c 67108864 /dev/zero | busybox tr "\0" a); echo survived"#,
    );
    hog.restart_policy = RestartPolicy::No;
    let idle = workload("idle", "sleep 100000");
    let (hog_spec, idle_spec) = (hog.clone(), idle.clone());
    let desired = DesiredState::new(device_id(), 1, vec![hog, idle])
        .unwrap_or_else(|e| panic!("desired: {e}"));
    rig.operator.put_desired(&desired);
    step("desired state with the 64 MiB workload written; waiting for oom-killed");

    let conn = rig._nats.connect();
    let statuses = nats::jetstream::new(conn)
        .key_value(kv::WORKLOAD_STATUS)
        .unwrap_or_else(|e| panic!("bucket: {e}"));
    let mut last = None;
    let seen = wait_for(Duration::from_secs(300), || {
        let raw = statuses.get(DEVICE).ok()??;
        let s: DeviceWorkloadStatus = serde_json::from_slice(&raw).ok()?;
        last = Some(s.clone());
        let hog = s.workloads.iter().find(|w| w.name.as_str() == "hog")?;
        let idle = s.workloads.iter().find(|w| w.name.as_str() == "idle")?;
        (hog.state == WorkloadState::OomKilled && idle.state == WorkloadState::Running)
            .then(|| (hog.clone(), idle.clone()))
    });
    let vm = &mut rig.vm;
    let Some((hog, idle)) = seen else {
        panic!(
            "no oom-killed status within 300 s; last: {last:#?}\n{}",
            vm.unit_logs()
        )
    };
    assert_eq!(
        hog.error.as_ref().map(|e| e.as_str()),
        Some("oom-killed: the container exceeded its memory limit of 32 MiB")
    );
    let r = hog
        .restarts
        .unwrap_or_else(|| panic!("no restarts: {hog:?}"));
    assert!(r.oom_killed && r.last_exit_code == Some(137), "{r:?}");

    let inspect = vm.sh(&format!(
        "{AS_AGENT} podman inspect fleet-hog fleet-idle --format \
         '{{{{.State.ExitCode}}}} {{{{.HostConfig.Memory}}}} {{{{.State.Pid}}}} {{{{.State.OOMKilled}}}}'"
    ));
    // Podman's own OOMKilled is shown, not required: Debian 12's Podman 4.3 never sets it (agent/src/oom.rs).
    step(&format!(
        "podman inspect (exit code, memory limit, pid, OOMKilled): {}",
        inspect.replace('\n', " | ")
    ));
    let lines: Vec<&str> = inspect.lines().collect();
    assert!(lines[0].starts_with("137 33554432 "), "{inspect}");
    let idle_pid = lines
        .get(1)
        .and_then(|l| l.split_whitespace().nth(2))
        .unwrap_or_else(|| panic!("{inspect}"));
    assert_eq!(
        vm.sh(&format!("cat /proc/{idle_pid}/oom_score_adj")).trim(),
        "500",
        "rootless Podman gave the container the agent's oom_score_adj"
    );
    assert!(idle.container_id.is_some());
    assert_eq!(vm.agent_pid(), agent_pid, "the agent process is unharmed");
    assert_eq!(
        vm.sh_code("systemctl is-active fleet-agent.service fleet-updater.service")
            .1
            .split_whitespace()
            .collect::<Vec<_>>(),
        ["active", "active"]
    );

    // The same allocation restarted by Podman (always): its exits are not visible, its restarts and the kernel's
    // count are; repeated, it is crash-looping, still reported as OOM-killed.
    let mut repeat = workload(
        "repeat",
        r#"x=$(busybox head -c 67108864 /dev/zero | busybox tr "\0" a); echo survived"#,
    );
    repeat.restart_policy = RestartPolicy::Always;
    let desired = DesiredState::new(device_id(), 2, vec![hog_spec, idle_spec, repeat])
        .unwrap_or_else(|e| panic!("desired: {e}"));
    rig.operator.put_desired(&desired);
    step("generation 2 adds the allocation under restart policy always; waiting for crash-looping");
    let mut last = None;
    let looping = wait_for(Duration::from_secs(300), || {
        let raw = statuses.get(DEVICE).ok()??;
        let s: DeviceWorkloadStatus = serde_json::from_slice(&raw).ok()?;
        last = Some(s.clone());
        let w = s.workloads.iter().find(|w| w.name.as_str() == "repeat")?;
        (w.state == WorkloadState::CrashLooping && w.restarts.is_some_and(|r| r.oom_killed))
            .then(|| w.clone())
    });
    let vm = &mut rig.vm;
    let Some(looping) = looping else {
        panic!(
            "no crash-looping oom-killed status within 300 s; last: {last:#?}\n{}",
            vm.unit_logs()
        )
    };
    step(&format!("repeat: {:?}", looping.restarts));
    assert_eq!(
        looping.error.as_ref().map(|e| e.as_str()),
        Some("oom-killed: the container exceeded its memory limit of 32 MiB")
    );
    assert_eq!(vm.agent_pid(), agent_pid, "the agent process is unharmed");
    let kernel = vm.sh("journalctl -k -b --no-pager | grep -ci 'killed process' || true");
    step(&format!(
        "the kernel's log names {} killed process(es)",
        kernel.trim()
    ));
}
