//! A stalled agent upgrade on a whole device, every part real: `kubectl apply` an AgentRelease → kube-apiserver +
//! etcd → the `fleet-operator` binary → nats-server (with the auth callout) → an nspawn Debian device installed with
//! device setup. The artifact server answers the download's headers and then sends nothing; once the device reports
//! `preparing` and its download has started, its updater is stopped (SIGSTOP to every process of
//! `fleet-updater.service`: the updater and its download helper), as a hung updater would be. What a person sees:
//!
//! - nothing called stalled before the `preparing` bound (9 min) plus one resync (60 s) has passed;
//! - then, within one more pass: the Device's `status.stalled` (phase `preparing`, since the phase began) and its
//!   Stalled column in `kubectl get fdev`, the release's `Progressing=False` with reason `Stalled` naming the
//!   device and its phase, `status.rollout.stalled` 1, and the `DeviceStalled` Warning event about the Device;
//! - the updater resumed (SIGCONT): the attempt ends on the download's own deadline (failed, not hanging) and the
//!   stall clears.
//!
//! About 11 minutes, nearly all of it waiting (the bound is the seed's, not a test setting).

use fleet_vm_tests::builds::{self, V2};
use fleet_vm_tests::local_fleet::{group_yaml, release_yaml, LocalFleet};
use fleet_wire::{Timestamp, UpgradePhase};
use std::time::{Duration, Instant};

const DEVICE: &str = "stall-1";
/// The `preparing` bound (download 5 min + probe 4 min) plus the operator's one-resync slack: the earliest a
/// device may be called stalled (operator/src/fleet/rollout.rs, docs/crds.md).
const STALL_AFTER: Duration = Duration::from_secs(9 * 60 + 60);
/// After that moment, the most the operator may take to say so: it checks stalls on every pass, at least once a
/// minute, plus a status write.
const ONE_PASS: Duration = Duration::from_secs(75);

fn logs(fleet: &LocalFleet) -> String {
    fleet.device_logs()
        + &format!(
            "\n--- fleet-operator ---\n{}",
            fleet.cluster.operator_log(80)
        )
}

#[test]
fn an_updater_stopped_mid_download_is_stalled_after_the_phase_bound() {
    let fleet = LocalFleet::start(&[DEVICE]);
    let (cluster, device) = (&fleet.cluster, fleet.device(DEVICE));
    cluster.kubectl(&["label", "fdev", DEVICE, "site=lab"]);
    cluster.apply(&group_yaml("lab", &[("site", "lab")]));

    let v2 = builds::agent(V2);
    let (url, sha) = fleet.artifacts.publish_stalling(&v2, "fleet-agent-hang");
    cluster.apply(&release_yaml("hang", "lab", V2, &url, sha.as_ref()));
    let preparing = cluster.wait(
        "the device preparing, its download started",
        Duration::from_secs(120),
        || {
            let u = fleet.view(DEVICE)?.upgrade?;
            (u.phase == UpgradePhase::Preparing
                && fleet.artifacts.requests_for("fleet-agent-hang") > 0)
                .then_some(u)
        },
    );
    device
        .guest
        .systemctl(&["kill", "--signal=SIGSTOP", "fleet-updater.service"]);
    let since = preparing.phase_changed_at;
    eprintln!("updater stopped mid-download; preparing since {since:?}");

    // Watched every 5 s as a person would: nothing stalled before the bound, then all of it within a pass.
    let deadline = Instant::now() + STALL_AFTER + ONE_PASS + Duration::from_secs(60);
    let stalled = loop {
        assert!(
            Instant::now() < deadline,
            "not stalled {:?} after preparing began\n{}",
            Timestamp::now().since(since),
            logs(&fleet)
        );
        let view = fleet.view(DEVICE).expect("Device");
        if let Some(s) = view.stalled {
            break (s, Timestamp::now());
        }
        // why: pacing: watched every 5 s as a person would (the bound's check allows one step)
        std::thread::sleep(Duration::from_secs(5));
    };
    let (s, seen) = stalled;
    let after = seen.since(since);
    eprintln!("stalled after {after:?}: {s}");
    assert!(
        after >= STALL_AFTER,
        "called stalled {after:?} after preparing began, before the bound {STALL_AFTER:?}: {s}"
    );
    assert!(
        after <= STALL_AFTER + ONE_PASS,
        "stalled only {after:?} after preparing began (bound {STALL_AFTER:?} plus a pass {ONE_PASS:?})"
    );
    assert_eq!(s["phase"], "preparing", "{s}");
    assert_eq!(
        s["since"],
        serde_json::to_value(since).expect("json"),
        "since the phase began: {s}"
    );
    // Read by the column's position, as a person reads it (empty columns, such as Reason here, print blanks).
    let table = cluster.kubectl(&["get", "fdev", DEVICE]);
    let mut lines = table.lines();
    let (header, row) = (
        lines.next().unwrap_or_default(),
        lines.next().unwrap_or_default(),
    );
    let col = header.find("STALLED").expect("a Stalled column");
    assert_eq!(
        row.get(col..).and_then(|r| r.split_whitespace().next()),
        Some("preparing"),
        "kubectl get fdev:\n{table}"
    );

    let progressing = cluster.wait("the release Progressing=False, Stalled", ONE_PASS, || {
        cluster
            .condition(&["frel", "hang"], "Progressing")
            .filter(|c| c.reason == "Stalled")
    });
    assert_eq!(progressing.status, "False", "{progressing:?}");
    assert!(
        progressing
            .message
            .contains(&format!("{DEVICE} (preparing")),
        "{progressing:?}"
    );
    let rel = cluster.get_json(&["frel", "hang"]).expect("release");
    assert_eq!(rel["status"]["rollout"]["stalled"], 1, "{rel:#}");
    let events = cluster.wait("the DeviceStalled Warning event", ONE_PASS, || {
        Some(cluster.warnings("Device", DEVICE))
            .filter(|e| e.iter().any(|m| m.starts_with("DeviceStalled: ")))
    });
    assert!(events.iter().any(|m| m.contains("preparing")), "{events:?}");

    // The updater resumed: its download is long past its deadline, the attempt fails, the stall clears.
    device
        .guest
        .systemctl(&["kill", "--signal=SIGCONT", "fleet-updater.service"]);
    let failed = cluster.wait(
        "the attempt failed on its deadline and the stall cleared",
        Duration::from_secs(180),
        || {
            let v = fleet.view(DEVICE)?;
            let u = v.upgrade.clone()?;
            (u.phase == UpgradePhase::Failed && v.stalled.is_none()).then_some(u)
        },
    );
    eprintln!("after SIGCONT: {:?} {:?}", failed.reason, failed.error);
    assert_eq!(
        fleet.view(DEVICE).and_then(|v| v.agent_version).as_deref(),
        Some(builds::V1),
        "the device keeps its agent"
    );
    cluster.wait("Progressing no longer Stalled", ONE_PASS, || {
        cluster
            .condition(&["frel", "hang"], "Progressing")
            .filter(|c| c.reason != "Stalled")
    });
    fleet.assert_no_secrets_in_logs();
}
