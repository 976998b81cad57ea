//! What a person sees when an agent upgrade meets a link that drops, on a whole device (systemd in an nspawn
//! guest, the real updater, fleet-fetch and agents): the artifact server cuts its first responses part-way, the
//! updater is SIGKILLed mid-download (systemd restarts it; the attempt fails as interrupted), and the retried
//! attempt for the same release resumes after the bytes the killed updater held, completes, and selects v2 — with
//! far fewer bytes sent than downloading from zero after every drop.

use fleet_rig::wait_for;
use fleet_vm_tests::builds::{self, V2};
use fleet_vm_tests::fleet::{one_device_at_a_time, Device};
use fleet_vm_tests::scene::Scene;
use fleet_wire::{AttemptId, UpgradePhase};
use std::time::Duration;

fn invocation(device: &Device) -> String {
    device.guest.systemctl(&[
        "show",
        "-p",
        "InvocationID",
        "--value",
        "fleet-updater.service",
    ])
}

#[test]
fn an_upgrade_over_a_dropping_link_resumes_across_an_updater_restart() {
    let _one = one_device_at_a_time();
    let scene = Scene::v1_with_real_v2();
    let d = &scene.device;
    let v2 = builds::agent(V2);
    let size = std::fs::metadata(&v2).expect("v2 binary").len();
    // Four responses cut after a tenth of the artifact each; the rest are whole.
    let cuts = vec![size / 10; 4];
    let name = "fleet-agent-v2-flaky";
    let attempt = scene.artifacts.attempt_flaky(&v2, name, V2, cuts.clone());
    scene.operator.put_intent(&attempt);

    // The first try dropped and the second resumed: now the updater dies mid-download.
    let resumed = wait_for(Duration::from_secs(180), || {
        (scene.artifacts.flaky_served(name).0 >= 2).then_some(())
    });
    assert!(resumed.is_some(), "no resumed request.\n{}", d.logs());
    let before = invocation(d);
    d.guest
        .systemctl(&["kill", "--signal=SIGKILL", "fleet-updater.service"]);
    let restarted = wait_for(Duration::from_secs(30), || {
        let now = invocation(d);
        (!now.is_empty() && now != before).then_some(())
    });
    assert!(
        restarted.is_some(),
        "systemd did not restart the updater.\n{}",
        d.logs()
    );
    let failed =
        scene
            .operator
            .wait_phase(&attempt, UpgradePhase::Failed, Duration::from_secs(120));
    assert_eq!(
        d.active_version(),
        fleet_vm_tests::builds::V1,
        "{failed:#?}"
    );
    let (served_before, _) = scene.artifacts.flaky_served(name);

    // The person retries the same release (a new attempt): it resumes after the held bytes and completes.
    let mut retry = attempt.clone();
    retry.attempt_id = AttemptId::new_random();
    scene.operator.put_intent(&retry);
    let status =
        scene
            .operator
            .wait_phase(&retry, UpgradePhase::Complete, Duration::from_secs(240));
    assert_eq!(d.active_version(), V2, "{status:#?}\n{}", d.logs());

    let starts = scene.artifacts.range_starts(name);
    let after_restart = starts.get(served_before).copied().flatten();
    assert!(
        after_restart.is_some_and(|n| n >= size / 10),
        "the retried attempt resumes after the held bytes: {starts:?}"
    );
    let (served, sent) = scene.artifacts.flaky_served(name);
    eprintln!("{size}-byte artifact: {served} responses, {sent} bytes sent, ranges {starts:?}");
    assert!(
        sent < size + size / 5,
        "{sent} bytes sent for a {size}-byte artifact (from zero each time would be {})",
        size + cuts.iter().sum::<u64>()
    );
}
