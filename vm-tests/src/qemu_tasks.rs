//! Fleet tasks on a QEMU guest ([`crate::qemu::Vm`], amd64 or arm64): what a person sees of a system upgrade on
//! the device (apt's history, dpkg's state, the updater's journal), the run's status in NATS, and the whole TaskRun
//! flow through the real operator with a reboot coordinated through FleetLock. Used by `vm-tests/qemu/tasks.rs`
//! and `vm-tests/arm64-vm/scenarios.rs`, so that both architectures are held to the same assertions.

use crate::cluster::Cluster;
use crate::fleet::DEVICE;
use crate::fleetlock::FleetLockServer;
use crate::local_fleet::{group_yaml, taskrun_view, taskrun_yaml};
use crate::qemu::Vm;
use crate::runner::step;
use crate::tasks::{HolderWatch, Tasks};
use fleet_wire::{SystemUpgradePhase as P, SystemUpgradeStatus, TaskRunPhase};
use std::time::{Duration, Instant};

/// `<version>|<status>` of `package` in the guest.
pub fn installed(vm: &mut Vm, package: &str) -> String {
    vm.sh(&format!(
        "dpkg-query -W -f '${{Version}}|${{Status}}' {package}"
    ))
    .trim()
    .to_string()
}

/// apt runs recorded in the guest's `/var/log/apt/history.log` (on disk: it counts across reboots).
pub fn apt_runs(vm: &mut Vm) -> usize {
    vm.sh("cat /var/log/apt/history.log 2>/dev/null || true")
        .lines()
        .filter(|l| l.starts_with("Start-Date:"))
        .count()
}

/// Lines of the updater's journal (this boot only with `this_boot`, else every boot the journal kept) that start
/// `apt-get full-upgrade` for `run`.
pub fn full_upgrades(vm: &mut Vm, run: &str, this_boot: bool) -> usize {
    let boot = if this_boot { "-b" } else { "" };
    vm.sh(&format!(
        "journalctl {boot} --no-pager -o cat -u fleet-updater.service"
    ))
    .lines()
    .filter(|l| l.contains(&format!("run {run}: running apt-get")) && l.ends_with("full-upgrade"))
    .count()
}

/// The guest's units' logs and the FleetLock server's, for failure messages.
pub fn logs(vm: &mut Vm, lock: &FleetLockServer) -> String {
    format!(
        "{}\n--- fleetlock-server ---\n{}",
        vm.unit_logs(),
        lock.log()
    )
}

/// Waits for run `run`'s status in NATS to satisfy `done`, printing each new phase; fails after `timeout` with the
/// last status and the logs.
pub fn wait_run(
    vm: &mut Vm,
    tasks: &Tasks,
    lock: &FleetLockServer,
    run: &str,
    timeout: Duration,
    what: &str,
    done: impl Fn(&SystemUpgradeStatus) -> bool,
) -> SystemUpgradeStatus {
    let deadline = Instant::now() + timeout;
    let mut last: Option<SystemUpgradeStatus> = None;
    loop {
        if let Some(s) = tasks.status_of(DEVICE, run) {
            if last.as_ref().map(|l| (l.phase, &l.detail)) != Some((s.phase, &s.detail)) {
                step(&format!(
                    "  status {:?}{}",
                    s.phase,
                    s.detail
                        .as_ref()
                        .map(|d| format!(": {d}"))
                        .unwrap_or_default()
                ));
            }
            let hit = done(&s);
            last = Some(s.clone());
            if hit {
                return s;
            }
        }
        if Instant::now() >= deadline {
            let logs = logs(vm, lock);
            panic!("run {run}: no {what} within {timeout:?}; last status: {last:#?}\n{logs}");
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// What [`taskrun_with_reboot`] saw.
pub struct RebootedRun {
    /// The TaskRun's UID (the run id on the device).
    pub uid: String,
    /// The run's terminal status in NATS.
    pub status: SystemUpgradeStatus,
    /// The boot ids before and after the upgrade's reboot.
    pub boots: (String, String),
    /// Seconds from `kubectl create` to the TaskRun's terminal phase.
    pub secs: f64,
}

/// The TaskRun flow on the guest, every part real: the Device labelled `site=<site>` and a DeviceGroup `<site>`
/// selecting it applied with kubectl; `kubectl create` of TaskRun `name` (systemUpgradeV1, deadline one hour); the
/// operator writes the intent, the updater runs apt-get full-upgrade from the guest's apt sources (set up by the
/// caller: an upgrade that makes something write /run/reboot-required), takes the slot of the real
/// fleetlock-server, reboots the guest for real (a new boot id), and gives the slot back after a healthy boot.
/// Asserted: the status in NATS succeeded, with the reboot, after the first heartbeat following completion; the
/// TaskRun Complete with 1 target, 1 succeeded, 0 failed, and `kubectl get ftr` printing that row; one holder of
/// the slot at a time, one reboot through FleetLock, the slot released; apt ran once across the reboot; the status
/// unchanged once terminal.
pub fn taskrun_with_reboot(
    vm: &mut Vm,
    cluster: &Cluster,
    lock: &FleetLockServer,
    tasks: &Tasks,
    name: &str,
    site: &str,
) -> RebootedRun {
    let boot0 = vm.boot_id();
    let runs0 = apt_runs(vm);
    assert!(
        vm.sh_code("test -e /run/reboot-required").0 != 0,
        "/run/reboot-required exists before the upgrade"
    );
    cluster.kubectl(&[
        "label",
        "fdev",
        DEVICE,
        &format!("site={site}"),
        "--overwrite",
    ]);
    cluster.apply(&group_yaml(site, &[("site", site)]));
    let holders = HolderWatch::start(lock);
    step(&format!("kubectl create TaskRun {name} (systemUpgradeV1)"));
    let t0 = Instant::now();
    cluster.create(&taskrun_yaml(name, site, 3600));
    let uid = cluster.wait(
        &format!("TaskRun {name} has a uid"),
        Duration::from_secs(60),
        || taskrun_view(cluster, name).map(|r| r.uid),
    );
    let status = wait_run(
        vm,
        tasks,
        lock,
        &uid,
        Duration::from_secs(1800),
        "success with the first heartbeat after the reboot",
        |s| {
            s.phase.is_terminal()
                && (s.phase != P::Succeeded || s.first_heartbeat_after_completion.is_some())
        },
    );
    let run = cluster.wait(
        &format!("TaskRun {name} terminal"),
        Duration::from_secs(300),
        || taskrun_view(cluster, name).filter(|r| r.terminal()),
    );
    let secs = t0.elapsed().as_secs_f64();
    step(&format!(
        "TaskRun terminal {secs:.0} s after kubectl create"
    ));
    let (max, order) = holders.stop();
    assert_eq!(
        (status.phase, status.reason),
        (P::Succeeded, None),
        "{status:#?}\n{}",
        logs(vm, lock)
    );
    let st = &run.status;
    assert_eq!(
        (st.phase, st.targets, st.succeeded, st.failed),
        (Some(TaskRunPhase::Complete), 1, 1, 0),
        "{run:?}"
    );
    let table = cluster.kubectl(&["get", "ftr", name]);
    step(&format!("$ kubectl get ftr {name}\n{table}"));
    let row: Vec<&str> = table
        .lines()
        .nth(1)
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        row.get(..5),
        Some(&[name, "Complete", "1", "1", "0"][..]),
        "kubectl get ftr:\n{table}"
    );
    assert!(status.reboot_required, "{status:#?}");
    assert_eq!(
        status.transitions.phases(),
        [P::Accepted, P::Upgrading, P::Rebooting, P::Succeeded],
        "{status:#?}"
    );
    assert!(
        status.first_heartbeat_after_completion >= status.completed_at,
        "{status:#?}"
    );

    // The device: a real reboot, the slot taken once and given back after the healthy boot.
    let boot1 = vm.wait_boot(Some(&boot0), vm.boot_wait());
    step(&format!("boot id {boot0} -> {boot1}"));
    vm.wait_unit("fleet-agent.service", "active", vm.boot_wait());
    assert_eq!(max, 1, "holders at once: {order:?}");
    assert_eq!(order.len(), 1, "one reboot through FleetLock: {order:?}");
    // fleet-reboot-release.service gives the slot back once the host is healthy; the status can be terminal first.
    let released = fleet_rig::wait_for(vm.boot_wait(), || (lock.holders() == 0).then_some(()));
    assert!(
        released.is_some(),
        "the slot was not released:\n{}",
        lock.log()
    );
    vm.sh("test ! -e /var/lib/fleet-reboot/marker.json");
    assert_eq!(apt_runs(vm), runs0 + 1, "apt ran once across the reboot");
    assert_eq!(full_upgrades(vm, &uid, false), 1, "{}", logs(vm, lock));
    assert_eq!(
        tasks.status_of(DEVICE, &uid).as_ref(),
        Some(&status),
        "the status changed after it was terminal"
    );
    RebootedRun {
        uid,
        status,
        boots: (boot0, boot1),
        secs,
    }
}
