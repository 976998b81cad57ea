//! The path a user takes for a fleet task, every part real: `kubectl create` a TaskRun (`systemUpgradeV1`) →
//! kube-apiserver + etcd → the `fleet-operator` binary → nats-server → two nspawn Debian devices installed with
//! device setup (one labelled `canary=true`), each with a local apt repository whose upgrade wants a reboot, and
//! a real `fleetlock-server`. The canary upgrades and reboots first, then the other; `kubectl get ftr` shows the
//! run Complete; each device has the new package, rebooted once through FleetLock (never both at once), and its
//! status in NATS is terminal with the first heartbeat after completion recorded. The operator's dashboard reads
//! the FleetLock server, as the demo's does: its Reboots page shows each hold as the device it is, with bars that
//! can be seen. Every Device's `status.blocking` is read at each poll: the other device shows that the run waits for
//! its canary (also in `kubectl get fdev -o wide`'s Waiting column) until the canary succeeded, then that it is on
//! its way, and neither shows anything once the run is Complete.

use fleet_vm_tests::fleetlock::FleetLockServer;
use fleet_vm_tests::local_fleet::{group_yaml, taskrun_yaml, LocalFleet};
use fleet_vm_tests::reboots_page;
use fleet_vm_tests::tasks::{installed, ready_for_reboot_upgrade, HolderWatch, Tasks, REBOOT_PKG};
use fleet_wire::{SystemUpgradePhase as P, TaskRunPhase};
use std::collections::BTreeMap;
use std::time::Duration;

const CANARY: &str = "task-1";
const OTHER: &str = "task-2";
/// Both devices upgrade and reboot one after the other on a loaded 2-core machine well within this.
const RUN_TIMEOUT: Duration = Duration::from_secs(600);
/// The run as a Device's `status.blocking[].change` and messages name it.
const CHANGE: &str = "TaskRun/default/upgrade";

/// What each device's `status.blocking` showed, each change kept once, in order.
#[derive(Default)]
struct Shown(BTreeMap<String, Vec<Vec<(String, String)>>>);

impl Shown {
    fn look(&mut self, cluster: &fleet_vm_tests::cluster::Cluster) {
        for (d, now) in cluster.blocking() {
            let shown = self.0.entry(d.clone()).or_default();
            if shown.last() != Some(&now) {
                eprintln!("{d} blocking: {now:?}");
                shown.push(now);
            }
        }
    }

    fn of(&self, device: &str) -> Vec<Vec<(String, String)>> {
        self.0.get(device).cloned().unwrap_or_default()
    }
}

/// Exactly one entry, of `kind`, whose message starts with `message`.
fn one(rs: &[(String, String)], kind: &str, message: &str) -> bool {
    matches!(rs, [(k, m)] if k == kind && m.starts_with(message))
}

#[test]
fn kubectl_create_taskrun_upgrades_the_canary_then_the_rest() {
    let mut fleet = LocalFleet::start(&[CANARY, OTHER]);
    let lock = FleetLockServer::start();
    let _ready: Vec<_> = fleet
        .devices
        .iter_mut()
        .map(|d| ready_for_reboot_upgrade(d, &lock))
        .collect();
    let boots: Vec<String> = fleet.devices.iter().map(|d| d.guest.boot_id()).collect();
    let cluster = &fleet.cluster;
    lock.show_on_dashboard(cluster);
    cluster.kubectl(&["label", "fdev", CANARY, "canary=true"]);
    cluster.kubectl(&["label", "fdev", "--all", "site=lab"]);
    cluster.apply(&group_yaml("lab", &[("site", "lab")]));

    let holders = HolderWatch::start(&lock);
    cluster.create(&taskrun_yaml("upgrade", "lab", 3600));
    let waits_for_canary =
        format!("{CHANGE} waits for its canaries: 1 of 1 have not succeeded yet");
    let mut shown = Shown::default();
    // The Waiting column, read while the other device waits for the canary.
    let mut column: Option<String> = None;
    let run = cluster.wait("TaskRun upgrade terminal", RUN_TIMEOUT, || {
        shown.look(cluster);
        let now = shown.of(OTHER).last().cloned().unwrap_or_default();
        if column.is_none() && one(&now, "waitingForCanaries", &waits_for_canary) {
            let wide = cluster.kubectl(&["get", "fdev", OTHER, "-o", "wide"]);
            column = wide.contains(&waits_for_canary).then_some(wide);
        }
        fleet.taskrun("upgrade").filter(|r| r.terminal())
    });
    // Once Complete, the run gives no device anything more: both lists empty (the Device writer's next pass).
    cluster.wait(
        "no device lists the run once it is Complete",
        Duration::from_secs(60),
        || {
            shown.look(cluster);
            [CANARY, OTHER]
                .iter()
                .all(|d| shown.of(d).last().is_some_and(Vec::is_empty))
                .then_some(())
        },
    );
    let (max, order) = holders.stop();
    let logs = || fleet.device_logs() + &format!("\n--- fleetlock-server ---\n{}", lock.log());
    let st = &run.status;
    assert_eq!(
        (st.phase, st.targets, st.succeeded, st.failed, st.reason),
        (Some(TaskRunPhase::Complete), 2, 2, 0, None),
        "{run:?}\n{}",
        logs()
    );
    // What a person sees: NAME PHASE TARGETS SUCCEEDED FAILED …
    let table = cluster.kubectl(&["get", "ftr", "upgrade"]);
    let row: Vec<&str> = table
        .lines()
        .nth(1)
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        row.get(..5),
        Some(&["upgrade", "Complete", "2", "2", "0"][..]),
        "kubectl get ftr:\n{table}"
    );

    // Each device, read from the device and from NATS.
    let tasks = Tasks::new(&fleet.nats);
    let statuses: Vec<_> = fleet
        .devices
        .iter()
        .zip(&boots)
        .map(|(d, boot)| {
            let s = tasks
                .status_of(&d.id, &run.uid)
                .unwrap_or_else(|| panic!("no status for {} in NATS.\n{}", d.id, logs()));
            assert_eq!((s.phase, s.reason), (P::Succeeded, None), "{s:#?}");
            assert!(s.reboot_required, "{s:#?}");
            assert_eq!(
                s.transitions.phases(),
                [P::Accepted, P::Upgrading, P::Rebooting, P::Succeeded],
                "{s:#?}"
            );
            let heartbeat = s.first_heartbeat_after_completion.expect("first heartbeat");
            assert!(Some(heartbeat) >= s.completed_at, "{s:#?}");
            assert_eq!(installed(&d.guest, REBOOT_PKG).0, "2.0", "{}", d.id);
            assert_ne!(&d.guest.boot_id(), boot, "{} did not reboot", d.id);
            s
        })
        .collect();
    // Canary first: the other device accepted its attempt only after the canary had succeeded.
    let canary_done = statuses[0]
        .first_heartbeat_after_completion
        .expect("canary heartbeat");
    assert!(
        statuses[1].accepted_at >= canary_done,
        "{OTHER} started before the canary succeeded: {statuses:#?}"
    );
    // status.blocking at each step, as the task planner decided: the other device waited for the canary (shown
    // before it was given the run), then was on its way; the canary never waited for anyone; nothing at the end.
    let other = shown.of(OTHER);
    let waited = other
        .iter()
        .position(|rs| one(rs, "waitingForCanaries", &waits_for_canary))
        .unwrap_or_else(|| panic!("{OTHER} never showed that it waits for the canary: {other:#?}"));
    // On its way: given, accepted, upgrading, rebooting, or succeeded and its first heartbeat not recorded yet.
    let on_its_way = format!("{CHANGE} ");
    for (i, rs) in other.iter().enumerate() {
        let ok = rs.is_empty()
            || (i <= waited && one(rs, "waitingForCanaries", &waits_for_canary))
            || (i > waited && one(rs, "updating", &on_its_way));
        assert!(ok, "{OTHER} showed {rs:?} at step {i}: {other:#?}");
    }
    let canary = shown.of(CANARY);
    for rs in &canary {
        assert!(
            rs.is_empty() || one(rs, "updating", &on_its_way),
            "{CANARY} showed {rs:?}: {canary:#?}"
        );
    }
    let column = column.unwrap_or_else(|| {
        panic!("kubectl get fdev -o wide never showed {waits_for_canary:?} while {OTHER} waited")
    });
    eprintln!("kubectl get fdev {OTHER} -o wide while it waited:\n{column}");
    assert_eq!(max, 1, "two holders at once: {order:?}");
    assert_eq!(order.len(), 2, "one reboot each, in turn: {order:?}");
    assert_ne!(order[0], order[1]);
    assert_eq!(lock.holders(), 0, "{}", lock.log());
    // The Reboots page (the operator reads the server every 15 s): both releases shown as their devices.
    let mut last = String::from("no answer from the dashboard");
    let shown = fleet_rig::wait_for(Duration::from_secs(60), || {
        let page = cluster.dashboard_page("/reboots")?;
        let checked = reboots_page::check_released(&page, &[CANARY, OTHER]);
        last = format!("{checked:?}\n{page}");
        checked.ok()
    });
    let shown = shown.unwrap_or_else(|| panic!("the Reboots page within 60 s: {last}"));
    eprintln!("Reboots page: {shown}");
    fleet.assert_no_secrets_in_logs();
}
