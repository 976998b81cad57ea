//! Whole-device system upgrades (`AptFullUpgradeV1`) on one nspawn Debian device set up by device setup, with a
//! local apt repository built with `dpkg-deb` + `dpkg-scanpackages`: an intent upgrades the test package and the
//! status succeeds with the first heartbeat after completion; the same intent again (and agent and updater
//! restarts) never runs apt again; an expired intent never starts; an updater SIGKILLed during
//! `apt-get full-upgrade` recovers with `dpkg --configure -a` and a truthful terminal status; a package that sets
//! `/run/reboot-required` makes the device take the slot of a real `fleetlock-server`, reboot, come back, complete
//! and release the slot. The cases share one booted guest, in order.

use fleet_rig::callout::FleetNats;
use fleet_vm_tests::builds::V1;
use fleet_vm_tests::fleet::{one_device_at_a_time, start_nats, Device, Operator};
use fleet_vm_tests::fleetlock::FleetLockServer;
use fleet_vm_tests::tasks::{
    apt_history_runs, installed, ready_for_reboot_upgrade, AptRepo, HolderWatch,
    RebootUpgradeReady, Tasks,
};
use fleet_wire::{Capability, SystemUpgradePhase as P, SystemUpgradeReason as R};
use std::time::Duration;

const HOUR: Duration = Duration::from_secs(3600);

/// Lines of the updater's journal that start `apt-get full-upgrade` for `run`.
fn full_upgrades_started(device: &Device, run: &str) -> usize {
    device
        .guest
        .journal("fleet-updater.service", 2000)
        .lines()
        .filter(|l| {
            l.contains(&format!("run {run}: running apt-get")) && l.ends_with("full-upgrade")
        })
        .count()
}

#[test]
fn system_upgrade_on_a_debian_device() {
    let _one = one_device_at_a_time();
    let nats = start_nats();
    let operator = Operator::new(&nats);
    let lock = FleetLockServer::start();
    let mut device = Device::install(&nats, &operator, V1, None);
    let _lock_link = device.guest.forward(lock.port());
    let guest = &device.guest;
    let tasks = Tasks::new(&nats);
    let logs = || device.logs();
    assert!(
        tasks.capabilities().contains(&Capability::AptFullUpgradeV1),
        "the device does not advertise AptFullUpgradeV1: {:?}",
        tasks.capabilities()
    );

    // 1. fleet-test-pkg 1.0 installed, 2.0 in the repository: one intent upgrades it.
    let repo = AptRepo::in_guest(guest);
    repo.install_now(guest, &repo.build("fleet-test-pkg", "1.0", ""));
    repo.publish(&repo.build("fleet-test-pkg", "2.0", ""));
    let history = apt_history_runs(guest);
    let a = Tasks::attempt(HOUR);
    tasks.put_intent(&a);
    let done = tasks.wait(
        &a,
        Duration::from_secs(240),
        "success with the first heartbeat after completion",
        |s| s.phase == P::Succeeded && s.first_heartbeat_after_completion.is_some(),
        logs,
    );
    assert_eq!(
        installed(guest, "fleet-test-pkg"),
        ("2.0".into(), "install ok installed".into())
    );
    assert!(
        done.first_heartbeat_after_completion >= done.completed_at,
        "{done:#?}"
    );
    assert_eq!(
        done.transitions.phases(),
        [P::Accepted, P::Upgrading, P::Succeeded]
    );
    assert!(!done.reboot_required);
    assert!(
        done.output_tail
            .as_ref()
            .is_some_and(|t| t.as_str().contains("fleet-test-pkg")),
        "{done:#?}"
    );
    assert_eq!(apt_history_runs(guest), history + 1, "one apt run");
    let run = a.run_uid.to_string();
    assert_eq!(full_upgrades_started(&device, &run), 1, "{}", logs());

    // 2. The same intent again, an agent restart and an updater restart: apt never runs again.
    tasks.put_intent(&a);
    guest.systemctl(&["restart", "fleet-agent.service"]);
    guest.systemctl(&["restart", "fleet-updater.service"]);
    guest.wait_unit("fleet-updater.service", "active", Duration::from_secs(60));
    guest.wait_unit("fleet-agent.service", "active", Duration::from_secs(120));
    tasks.put_intent(&a);
    // why: "apt never runs again" has no event in the guest; 8 s after the restarted units took the intent
    std::thread::sleep(Duration::from_secs(8));
    assert_eq!(
        apt_history_runs(guest),
        history + 1,
        "apt ran again.\n{}",
        logs()
    );
    assert_eq!(full_upgrades_started(&device, &run), 1, "{}", logs());
    assert_eq!(tasks.status(&a).as_ref(), Some(&done), "the status changed");

    // 3. An expired intent never starts.
    let expired = Tasks::attempt(Duration::ZERO);
    tasks.put_intent(&expired);
    let s = tasks.wait(
        &expired,
        Duration::from_secs(60),
        "failed/expired",
        |s| s.phase.is_terminal(),
        logs,
    );
    assert_eq!((s.phase, s.reason), (P::Failed, Some(R::Expired)), "{s:#?}");
    assert_eq!(
        full_upgrades_started(&device, &expired.run_uid.to_string()),
        0
    );
    assert_eq!(apt_history_runs(guest), history + 1);

    // 4. The updater SIGKILLed while dpkg runs a postinst: after the restart, dpkg --configure -a finishes the
    //    configuration and the run ends failed/interrupted (apt is not run again for it).
    let started = "/var/lib/fleet-test-slow-started";
    repo.install_now(guest, &repo.build("fleet-test-slow", "1.0", ""));
    repo.publish(&repo.build(
        "fleet-test-slow",
        "2.0",
        &format!(
            "if [ \"$1\" = configure ] && [ ! -e {started} ]; then touch {started}; sleep 120; fi"
        ),
    ));
    let k = Tasks::attempt(HOUR);
    tasks.put_intent(&k);
    let marker = fleet_rig::wait_for(Duration::from_secs(180), || {
        guest.path(started).exists().then_some(())
    });
    assert!(marker.is_some(), "the slow postinst never ran.\n{}", logs());
    tasks.wait(
        &k,
        Duration::from_secs(10),
        "upgrading",
        |s| s.phase == P::Upgrading,
        logs,
    );
    guest.sh("systemctl kill --kill-whom=main --signal=SIGKILL fleet-updater.service");
    let s = tasks.wait(
        &k,
        Duration::from_secs(180),
        "a terminal status after the kill",
        |s| s.phase.is_terminal(),
        logs,
    );
    assert_eq!(
        (s.phase, s.reason),
        (P::Failed, Some(R::Interrupted)),
        "{s:#?}"
    );
    let error = s.error.as_ref().map(|e| e.to_string()).unwrap_or_default();
    assert!(error.contains("dpkg --configure -a completed"), "{error}");
    assert_eq!(
        installed(guest, "fleet-test-slow"),
        ("2.0".into(), "install ok installed".into())
    );
    assert_eq!(guest.sh("dpkg --audit").trim(), "", "dpkg is consistent");
    let journal = guest.journal("fleet-updater.service", 2000);
    assert!(
        journal.contains(&format!(
            "run {}: running dpkg --force-confdef --force-confold --configure -a",
            k.run_uid
        )),
        "{journal}"
    );
    let history = apt_history_runs(guest);
    tasks.put_intent(&k);
    // why: "apt ran not again" has no event in the guest; 5 s after the intent is the window
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(
        apt_history_runs(guest),
        history,
        "apt ran again for the interrupted run"
    );
    assert_eq!(full_upgrades_started(&device, &k.run_uid.to_string()), 1);

    // 5. A package that wants a reboot: the slot is taken from the real fleetlock-server, diagnostics are
    //    written, the guest reboots, and after the boot the run completes and the slot is released.
    guest.write_file(
        "/etc/harmony-fleet/fleet-reboot.yaml",
        lock.client_config().as_bytes(),
        0o644,
    );
    repo.install_now(guest, &repo.build("fleet-test-reboot", "1.0", ""));
    repo.publish(&repo.build(
        "fleet-test-reboot",
        "2.0",
        "[ \"$1\" = configure ] && touch /run/reboot-required || true",
    ));
    let first_boot = guest.boot_id();
    let history = apt_history_runs(guest);
    let r = Tasks::attempt(HOUR);
    tasks.put_intent(&r);
    let rebooting = tasks.wait(
        &r,
        Duration::from_secs(180),
        "rebooting",
        |s| s.phase == P::Rebooting || s.phase.is_terminal(),
        logs,
    );
    assert_eq!(rebooting.phase, P::Rebooting, "{rebooting:#?}");
    let done = tasks.wait(
        &r,
        Duration::from_secs(300),
        "success with the first heartbeat after the reboot",
        |s| {
            s.phase.is_terminal()
                && (s.phase != P::Succeeded || s.first_heartbeat_after_completion.is_some())
        },
        || format!("{}\n--- fleetlock-server ---\n{}", logs(), lock.log()),
    );
    assert_eq!((done.phase, done.reason), (P::Succeeded, None), "{done:#?}");
    assert!(done.reboot_required);
    assert_eq!(
        done.transitions.phases(),
        [P::Accepted, P::Upgrading, P::Rebooting, P::Succeeded]
    );
    assert_ne!(guest.boot_id(), first_boot, "the device did not reboot");
    assert_eq!(installed(guest, "fleet-test-reboot").0, "2.0");
    assert_eq!(
        lock.holders(),
        0,
        "the slot was not released:\n{}",
        lock.log()
    );
    assert!(!guest.path("/var/lib/fleet-reboot/marker.json").exists());
    let diag = guest.sh("ls /var/log/fleet-reboot/");
    assert!(
        diag.contains("reboot-"),
        "no diagnostics before the reboot: {diag}"
    );
    // The journal of the boot before is gone (volatile journald); apt's history log is on disk.
    assert_eq!(
        apt_history_runs(guest),
        history + 1,
        "apt ran once across the reboot"
    );
}

/// One device of the two-device case: its own NATS (both use the scenario device id), device, buckets and
/// repository, the shared FleetLock server relayed into its guest.
struct Member {
    device: Device,
    tasks: Tasks,
    _ready: RebootUpgradeReady,
    _operator: Operator,
    _nats: FleetNats,
}

#[test]
fn two_devices_in_a_one_slot_group_never_reboot_together() {
    let _one = one_device_at_a_time();
    let lock = FleetLockServer::start();
    let members: Vec<Member> = (0..2)
        .map(|_| {
            let nats = start_nats();
            let operator = Operator::new(&nats);
            let mut device = Device::install(&nats, &operator, V1, None);
            let ready = ready_for_reboot_upgrade(&mut device, &lock);
            Member {
                tasks: Tasks::new(&nats),
                device,
                _ready: ready,
                _operator: operator,
                _nats: nats,
            }
        })
        .collect();
    let boots: Vec<String> = members.iter().map(|m| m.device.guest.boot_id()).collect();
    let ids: Vec<String> = members
        .iter()
        .map(|m| {
            m.device
                .guest
                .sh("cat /etc/machine-id; cat /proc/sys/kernel/hostname")
        })
        .collect();
    assert_ne!(ids[0], ids[1], "both guests have the same identity");

    // Watch the group's holders while both run: never more than one, and the order they held it in.
    let watcher = HolderWatch::start(&lock);
    let attempts: Vec<_> = members
        .iter()
        .map(|m| {
            let a = Tasks::attempt(HOUR);
            m.tasks.put_intent(&a);
            a
        })
        .collect();
    for (m, a) in members.iter().zip(&attempts) {
        let done = m.tasks.wait(
            a,
            Duration::from_secs(400),
            "success with the first heartbeat after the reboot",
            |s| {
                s.phase.is_terminal()
                    && (s.phase != P::Succeeded || s.first_heartbeat_after_completion.is_some())
            },
            || {
                format!(
                    "{}\n--- fleetlock-server ---\n{}",
                    m.device.logs(),
                    lock.log()
                )
            },
        );
        assert_eq!((done.phase, done.reason), (P::Succeeded, None), "{done:#?}");
    }
    let (max, order) = watcher.stop();
    for (m, before) in members.iter().zip(&boots) {
        assert_ne!(&m.device.guest.boot_id(), before, "a device did not reboot");
    }
    assert_eq!(max, 1, "two holders of a one-slot group at once");
    assert_eq!(
        order.len(),
        2,
        "the slot went to one device, then the other: {order:?}"
    );
    assert_ne!(order[0], order[1]);
    assert_eq!(lock.holders(), 0, "{}", lock.log());
}
