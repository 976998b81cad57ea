//! `hardware`: a device node, a supplementary group and an added capability for a workload of the fleet-agent
//! user's rootless Podman on a real kernel, as on a device: the container runs with `NET_ADMIN` in its effective
//! set, the device's `dialout` gid among its groups and `/dev/ttyS0` present as a character device. Whether the
//! process can open the node is printed, not required: in a rootless user namespace the host's root:dialout node
//! shows as nobody:nogroup and the container's gid 20 is one of fleet-agent's subordinate gids, not the host's
//! dialout (that would need crun's `keep-groups` and fleet-agent in dialout).

use fleet_rig::nats_client as nats;
use fleet_rig::wait_for;
use fleet_vm_tests::fleet::{device_id, DEVICE, TEST_IMAGE};
use fleet_vm_tests::runner::step;
use fleet_wire::{
    kv, DesiredState, DeviceWorkloadStatus, WorkloadName, WorkloadSpec, WorkloadState,
};
use std::time::Duration;

use crate::install_v1;

/// The guest command prefix that runs a command as the fleet-agent user, with its Podman.
const AS_AGENT: &str =
    "cd /tmp && runuser -u fleet-agent -- env XDG_RUNTIME_DIR=/run/user/$(id -u fleet-agent)";

pub fn scenario_hardware() {
    let mut rig = install_v1();
    let vm = &mut rig.vm;
    vm.sh(&format!(
        "{AS_AGENT} podman import --quiet /usr/share/fleet-test/busybox-rootfs.tar {TEST_IMAGE} >/dev/null"
    ));
    let host = vm.sh("ls -ln /dev/ttyS0; getent group dialout");
    step(&format!("the device: {}", host.replace('\n', " | ")));

    let mut w = WorkloadSpec::new(
        WorkloadName::try_from("serial").unwrap_or_else(|e| panic!("name: {e}")),
        TEST_IMAGE,
    )
    .unwrap_or_else(|e| panic!("workload: {e}"));
    w.command = vec!["sleep".into(), "100000".into()];
    w.devices = vec!["/dev/ttyS0".into()];
    w.groups = vec!["dialout".into()];
    w.capabilities = vec!["NET_ADMIN".into()];
    let desired =
        DesiredState::new(device_id(), 1, vec![w]).unwrap_or_else(|e| panic!("desired: {e}"));
    rig.operator.put_desired(&desired);
    step("desired state with /dev/ttyS0, dialout and NET_ADMIN written; waiting for running");

    let statuses = nats::jetstream::new(rig._nats.connect())
        .key_value(kv::WORKLOAD_STATUS)
        .unwrap_or_else(|e| panic!("bucket: {e}"));
    let mut last = None;
    let running = wait_for(Duration::from_secs(300), || {
        let raw = statuses.get(DEVICE).ok()??;
        let s: DeviceWorkloadStatus = serde_json::from_slice(&raw).ok()?;
        last = Some(s.clone());
        let w = s.workloads.first()?;
        (w.state == WorkloadState::Running).then_some(())
    });
    let vm = &mut rig.vm;
    if running.is_none() {
        panic!(
            "the workload did not run within 300 s; last: {last:#?}\n{}",
            vm.unit_logs()
        );
    }
    let inside = vm.sh(&format!(
        "{AS_AGENT} podman exec fleet-serial sh -c 'test -c /dev/ttyS0 && echo device; ls -ln /dev/ttyS0; \
         while read k v; do case $k in Groups:|CapEff:) echo $k $v;; esac; done < /proc/1/status; \
         (exec 3</dev/ttyS0) 2>/dev/null && echo opened || echo not-opened; true'"
    ));
    step(&format!(
        "inside the container: {}",
        inside.replace('\n', " | ")
    ));
    assert!(inside.starts_with("device\n"), "{inside}");
    assert!(
        inside
            .lines()
            .any(|l| l.starts_with("Groups:") && l.split_whitespace().any(|g| g == "20")),
        "{inside}"
    );
    let cap_eff = inside
        .lines()
        .find_map(|l| l.strip_prefix("CapEff: "))
        .and_then(|h| u64::from_str_radix(h.trim(), 16).ok())
        .unwrap_or_else(|| panic!("no CapEff: {inside}"));
    // CAP_NET_ADMIN is capability 12.
    assert!(cap_eff & (1 << 12) != 0, "NET_ADMIN missing: {cap_eff:x}");
}
