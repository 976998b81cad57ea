//! The system-upgrade relay against a real nats-server and an in-test updater peer: capabilities follow what
//! the updater reports; an expired intent never reaches the updater; a valid one (also one written while the
//! agent was down) is sent once, every updater change is mirrored into `system-upgrade-status/<device>.<run>`,
//! the first heartbeat after completion is recorded, and a restarted agent does not send it again.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::*;
use fleet_wire::{
    kv, AttemptId, Capability, DeviceId, DeviceInfo, Heartbeat, Request, SystemUpgradeAttempt,
    SystemUpgradePhase as P, SystemUpgradeReason, SystemUpgradeStatus, TaskOperation, Timestamp,
};
use std::time::Duration;

fn attempt(expires_in: Duration) -> SystemUpgradeAttempt {
    SystemUpgradeAttempt {
        run_uid: AttemptId::new_random(),
        device_id: DeviceId::try_from(DEVICE).unwrap(),
        operation: TaskOperation::AptFullUpgradeV1,
        expires_at: Timestamp::now().plus(expires_in),
    }
}

fn updater_view(a: &SystemUpgradeAttempt, phase: P) -> SystemUpgradeStatus {
    let now = Timestamp::now();
    SystemUpgradeStatus {
        run_uid: a.run_uid,
        device_id: a.device_id.clone(),
        phase,
        reason: None,
        error: None,
        accepted_at: now,
        completed_at: phase.is_terminal().then_some(now),
        first_heartbeat_after_completion: None,
        reboot_required: false,
        detail: None,
        output_tail: None,
        transitions: Default::default(),
    }
}

fn system_requests(peer: &UpdaterPeer, run: AttemptId) -> usize {
    peer.mutating_requests()
        .iter()
        .filter(|r| matches!(r, Request::SystemUpgrade { attempt } if attempt.run_uid == run))
        .count()
}

#[test]
fn capabilities_follow_the_updater_and_a_run_is_relayed_once() {
    let rig = Rig::new(false, "");
    let nc = rig.nc();
    let info = store(&nc, kv::DEVICE_INFO);
    let intents = store(&nc, kv::SYSTEM_UPGRADE_INTENT);
    let statuses = store(&nc, kv::SYSTEM_UPGRADE_STATUS);

    // An updater that reports no capabilities (an older one): only the agent's own are advertised.
    let mut agent = rig.spawn_agent();
    agent.wait_ready();
    let i: DeviceInfo = get_json(&info, DEVICE).expect("device info");
    assert_eq!(
        i.capabilities,
        [Capability::AgentUpgradeV1, Capability::WorkloadSpecV2]
    );

    // An expired intent is failed/expired and never sent.
    let old = attempt(Duration::ZERO);
    let old_key = kv::run_key(&old.device_id, &old.run_uid);
    intents
        .put(&old_key, serde_json::to_vec(&old).unwrap())
        .unwrap();
    let s: SystemUpgradeStatus =
        eventually(&agent, Duration::from_secs(20), "expired status", || {
            get_json(&statuses, &old_key)
        });
    assert_eq!(
        (s.phase, s.reason),
        (P::Failed, Some(SystemUpgradeReason::Expired))
    );
    assert_eq!(system_requests(&rig.peer, old.run_uid), 0);
    agent.sigterm();
    agent.wait_exit(Duration::from_secs(20));

    // A current updater; an intent written while the agent is down is picked up at start.
    rig.peer.status.lock().unwrap().capabilities = vec![
        Capability::AgentUpgradeV1,
        Capability::OciArtifactsV1,
        Capability::AptFullUpgradeV1,
    ];
    let a = attempt(Duration::from_secs(3600));
    let key = kv::run_key(&a.device_id, &a.run_uid);
    intents.put(&key, serde_json::to_vec(&a).unwrap()).unwrap();
    let mut agent = rig.spawn_agent();
    agent.wait_ready();
    let i: DeviceInfo = get_json(&info, DEVICE).expect("device info");
    assert_eq!(
        i.capabilities,
        [
            Capability::AgentUpgradeV1,
            Capability::WorkloadSpecV2,
            Capability::OciArtifactsV1,
            Capability::AptFullUpgradeV1
        ]
    );
    eventually(
        &agent,
        Duration::from_secs(20),
        "one system-upgrade request",
        || (system_requests(&rig.peer, a.run_uid) == 1).then_some(()),
    );
    rig.peer.status.lock().unwrap().system_upgrade = Some(updater_view(&a, P::Accepted));
    let (st, k) = (&statuses, &key);
    let phase_is = |want: P| {
        move || {
            let s: SystemUpgradeStatus = get_json(st, k)?;
            (s.phase == want).then_some(s)
        }
    };
    eventually(
        &agent,
        Duration::from_secs(20),
        "accepted",
        phase_is(P::Accepted),
    );
    assert_eq!(system_requests(&rig.peer, a.run_uid), 1);
    rig.peer.status.lock().unwrap().system_upgrade = Some(updater_view(&a, P::Upgrading));
    eventually(
        &agent,
        Duration::from_secs(20),
        "upgrading",
        phase_is(P::Upgrading),
    );
    // Its status lost while the run is under way (an operator's mistake, a bucket restored from a backup) is
    // written again within a heartbeat (1 s here), each time it is lost.
    for loss in 1..=2 {
        statuses.delete(&key).unwrap();
        eventually(
            &agent,
            Duration::from_secs(5),
            &format!("the run's status written again after loss {loss}"),
            phase_is(P::Upgrading),
        );
    }
    let done = updater_view(&a, P::Succeeded);
    rig.peer.status.lock().unwrap().system_upgrade = Some(done.clone());
    let s = eventually(
        &agent,
        Duration::from_secs(20),
        "first heartbeat after completion",
        || {
            let s: SystemUpgradeStatus = get_json(&statuses, &key)?;
            s.first_heartbeat_after_completion.map(|_| s)
        },
    );
    let beat = s.first_heartbeat_after_completion.unwrap();
    assert!(beat >= done.completed_at.unwrap(), "{s:#?}");
    assert_eq!(s.phase, P::Succeeded);
    let h: Heartbeat = get_json(&store(&nc, kv::DEVICE_HEARTBEAT), DEVICE).expect("heartbeat");
    assert!(h.at >= beat);

    // A restarted agent sees the published terminal status: nothing is sent again, the heartbeat stays.
    agent.sigterm();
    agent.wait_exit(Duration::from_secs(20));
    let mut agent = rig.spawn_agent();
    agent.wait_ready();
    // why: no event shows a request not sent (the relay's start-up read logs nothing); 3 s after ready is the window
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        system_requests(&rig.peer, a.run_uid),
        1,
        "{}",
        agent.log_text()
    );
    let after: SystemUpgradeStatus = get_json(&statuses, &key).unwrap();
    assert_eq!(after.first_heartbeat_after_completion, Some(beat));
}
