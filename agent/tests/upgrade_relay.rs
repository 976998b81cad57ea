//! The upgrade relay against a real nats-server and an in-test updater peer: invalid intents are rejected with
//! a status error and never reach the updater; a valid one is bound, published as `preparing`, sent once, and
//! every updater phase up to `complete` is mirrored; SIGTERM while the updater is stopping the agent gives an
//! acknowledged `stopping` status with reason `updater`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use fleet_rig::nats_client as nats;
mod common;
use common::*;
use fleet_wire::kv;
use fleet_wire::{
    AgentUpgradeAttempt, AgentUpgradeStatus, Architecture, AttemptId, DeviceId, UpgradePhase,
    UpgradeReason,
};
use std::time::Duration;

fn attempt() -> AgentUpgradeAttempt {
    let mut a = fleet_wire::fixtures::attempt();
    a.attempt_id = AttemptId::new_random();
    a.device_id = DeviceId::try_from(DEVICE).unwrap();
    a.architecture = Architecture::current().unwrap();
    a
}

#[test]
fn rejects_invalid_intents_and_relays_a_valid_one() {
    let rig = Rig::new(false, "");
    let mut agent = rig.spawn_agent();
    agent.wait_ready();
    let nc = rig.nc();
    let intents = store(&nc, kv::AGENT_UPGRADE_INTENT);
    let statuses = store(&nc, kv::AGENT_UPGRADE_STATUS);
    let put = |bytes: Vec<u8>| intents.put(DEVICE, bytes).expect("put intent");
    let wait_rejected = |after: u64, needle: &str| {
        eventually(
            &agent,
            Duration::from_secs(20),
            &format!("rejection mentioning {needle:?}"),
            || {
                let e = statuses.entry(DEVICE).ok().flatten()?;
                if e.revision <= after {
                    return None;
                }
                let s: AgentUpgradeStatus = serde_json::from_slice(&e.value).ok()?;
                let err = s.error.as_ref()?.to_string();
                (s.phase == UpgradePhase::Failed
                    && s.reason == Some(UpgradeReason::Rejected)
                    && err.contains(needle))
                .then_some(e.revision)
            },
        )
    };
    let mut rev = 0;
    let mut other_device = attempt();
    other_device.device_id = DeviceId::try_from("device-2").unwrap();
    put(serde_json::to_vec(&other_device).unwrap());
    rev = wait_rejected(rev, "device");
    let mut wrong_arch = attempt();
    wrong_arch.architecture = match wrong_arch.architecture {
        Architecture::Amd64 => Architecture::Arm64,
        Architecture::Arm64 => Architecture::Amd64,
    };
    put(serde_json::to_vec(&wrong_arch).unwrap());
    rev = wait_rejected(rev, "architecture");
    let mut bad_uuid = serde_json::to_value(attempt()).unwrap();
    bad_uuid["attemptId"] = "6f1c2b9e-not-a-uuid".into();
    put(serde_json::to_vec(&bad_uuid).unwrap());
    rev = wait_rejected(rev, "UUID");
    put(b"{\"attemptId\": ".to_vec());
    rev = wait_rejected(rev, "malformed");
    assert!(
        rig.peer.mutating_requests().is_empty(),
        "invalid intents reached the updater"
    );

    // A valid attempt: preparing, one request, then every phase the updater reports is mirrored. The updater
    // takes 10 s to answer (a slow preparation): the agent keeps running its loops meanwhile.
    rig.peer
        .upgrade_delay_ms
        .store(4000, std::sync::atomic::Ordering::SeqCst);
    let good = attempt();
    put(serde_json::to_vec(&good).unwrap());
    eventually(
        &agent,
        Duration::from_secs(20),
        "one upgrade request",
        || (rig.peer.mutating_requests().len() == 1).then_some(()),
    );
    let preparing: AgentUpgradeStatus = get_json(&statuses, DEVICE).expect("status");
    assert_eq!(
        (preparing.phase, preparing.attempt_id),
        (UpgradePhase::Preparing, Some(good.attempt_id))
    );
    let hb = store(&nc, kv::DEVICE_HEARTBEAT);
    let beat = |h: &nats::kv::Store| {
        get_json::<fleet_wire::Heartbeat>(h, DEVICE)
            .map(|b| b.sequence)
            .unwrap_or(0)
    };
    let before = beat(&hb);
    eventually(
        &agent,
        Duration::from_secs(8),
        "heartbeats while the upgrade request is pending",
        || (beat(&hb) >= before + 2).then_some(()),
    );
    let sent = rig.peer.mutating_requests();
    assert_eq!(
        sent[0],
        fleet_wire::Request::Upgrade {
            attempt: good.clone()
        }
    );
    let bindings = std::fs::read_to_string(
        rig.root
            .path()
            .join("var/lib/fleet-agent/upgrade-bindings.json"),
    )
    .expect("bindings");
    assert!(
        bindings.contains(&good.attempt_id.to_string())
            && bindings.contains(good.digest().as_str())
    );
    let mut s = fleet_wire::fixtures::upgrade_status();
    s.device_id = good.device_id.clone();
    s.attempt_id = Some(good.attempt_id);
    s.attempt_digest = Some(good.digest());
    for (phase, at) in [
        (UpgradePhase::Preparing, 1),
        (UpgradePhase::Stopping, 2),
        (UpgradePhase::Starting, 3),
        (UpgradePhase::Complete, 4),
    ] {
        if phase != UpgradePhase::Preparing {
            s.enter(phase, fleet_wire::fixtures::t(at), None);
        }
        rig.peer.status.lock().unwrap().agent_upgrade = Some(s.clone());
        eventually(
            &agent,
            Duration::from_secs(20),
            &format!("phase {phase:?} mirrored"),
            || {
                let got: AgentUpgradeStatus = get_json(&statuses, DEVICE)?;
                (got == s).then_some(())
            },
        );
    }

    // The mirrored status lost (an operator's mistake, a bucket restored from a backup) is written again within
    // a heartbeat (1 s here), each time it is lost.
    for loss in 1..=2 {
        statuses.delete(DEVICE).unwrap();
        eventually(
            &agent,
            Duration::from_secs(5),
            &format!("the status written again after loss {loss}"),
            || {
                let got: AgentUpgradeStatus = get_json(&statuses, DEVICE)?;
                (got == s).then_some(())
            },
        );
    }

    // The same UUID with other content is rejected and not sent.
    let mut reused = good.clone();
    reused.target_version = fleet_wire::Version::try_from("9.9.9").unwrap();
    let cur = statuses.entry(DEVICE).unwrap().unwrap().revision;
    put(serde_json::to_vec(&reused).unwrap());
    wait_rejected(cur.max(rev), "already used");
    assert_eq!(
        rig.peer.mutating_requests().len(),
        1,
        "only the valid attempt reached the updater"
    );
}

#[test]
fn sigterm_while_the_updater_stops_the_agent_reports_reason_updater() {
    let rig = Rig::new(false, "");
    let mut agent = rig.spawn_agent();
    agent.wait_ready();
    let mut s = fleet_wire::fixtures::upgrade_status();
    s.device_id = DeviceId::try_from(DEVICE).unwrap();
    s.enter(UpgradePhase::Stopping, fleet_wire::fixtures::t(2), None);
    rig.peer.status.lock().unwrap().agent_upgrade = Some(s);
    agent.sigterm();
    agent.wait_notify("STOPPING=1", Duration::from_secs(30));
    assert!(agent.wait_exit(Duration::from_secs(30)).success());
    let got: AgentUpgradeStatus =
        get_json(&store(&rig.nc(), kv::AGENT_UPGRADE_STATUS), DEVICE).expect("status");
    assert_eq!(got.phase, UpgradePhase::Stopping);
    assert_eq!(got.reason, Some(UpgradeReason::Updater));
    assert!(got.drain_duration_ms.is_some());
}

/// Once the updater accepted an attempt, its status is polled every `updater_poll_ms`, not at the idle resync
/// interval that was scheduled before the attempt arrived: a result reaches NATS within a few polls.
#[test]
fn an_accepted_attempt_is_polled_at_the_active_rate() {
    let rig = Rig::new(false, "");
    // A long idle interval, so that a result mirrored in time can only come from the active poll rate.
    let text = std::fs::read_to_string(&rig.config).expect("config");
    std::fs::write(
        &rig.config,
        text.replace("resync_secs = 2", "resync_secs = 60"),
    )
    .expect("config");
    let mut agent = rig.spawn_agent();
    agent.wait_ready();
    let nc = rig.nc();
    let statuses = store(&nc, kv::AGENT_UPGRADE_STATUS);
    let good = attempt();
    let mut s = fleet_wire::fixtures::upgrade_status();
    s.device_id = good.device_id.clone();
    s.attempt_id = Some(good.attempt_id);
    s.attempt_digest = Some(good.digest());
    s.target_version = Some(good.target_version.clone());
    // the updater accepts and reports `preparing`
    rig.peer.status.lock().unwrap().agent_upgrade = Some(s.clone());
    store(&nc, kv::AGENT_UPGRADE_INTENT)
        .put(DEVICE, serde_json::to_vec(&good).unwrap())
        .expect("put intent");
    eventually(
        &agent,
        Duration::from_secs(20),
        "one upgrade request",
        || (rig.peer.mutating_requests().len() == 1).then_some(()),
    );
    // then fails; NATS must show it long before the 60 s idle interval
    s.enter(
        UpgradePhase::Failed,
        fleet_wire::fixtures::t(5),
        Some(UpgradeReason::DigestMismatch),
    );
    rig.peer.status.lock().unwrap().agent_upgrade = Some(s.clone());
    let changed = std::time::Instant::now();
    eventually(
        &agent,
        Duration::from_secs(10),
        "failed mirrored at the active poll rate",
        || {
            let got: AgentUpgradeStatus = get_json(&statuses, DEVICE)?;
            (got.phase == UpgradePhase::Failed).then_some(())
        },
    );
    eprintln!(
        "result mirrored {:?} after the updater reported it",
        changed.elapsed()
    );
}

/// An intent that arrives while the updater is unreachable has not failed: it is published as pending (phase
/// `preparing`, reason `updater-unreachable`) and delivered once the updater answers again.
#[test]
fn an_unreachable_updater_keeps_the_attempt_pending_and_gets_it_later() {
    let rig = Rig::new(false, "");
    let mut agent = rig.spawn_agent();
    agent.wait_ready();
    let nc = rig.nc();
    let statuses = store(&nc, kv::AGENT_UPGRADE_STATUS);
    // the updater goes away (its socket is gone, as while it restarts)
    std::fs::remove_file(&rig.peer.path).expect("remove updater socket");
    let good = attempt();
    store(&nc, kv::AGENT_UPGRADE_INTENT)
        .put(DEVICE, serde_json::to_vec(&good).unwrap())
        .expect("put intent");
    let pending: AgentUpgradeStatus = eventually(
        &agent,
        Duration::from_secs(20),
        "pending with reason updater-unreachable",
        || {
            let s: AgentUpgradeStatus = get_json(&statuses, DEVICE)?;
            (s.reason == Some(UpgradeReason::UpdaterUnreachable)).then_some(s)
        },
    );
    assert_eq!(pending.phase, UpgradePhase::Preparing);
    assert_eq!(pending.attempt_id, Some(good.attempt_id));
    assert!(
        pending
            .error
            .as_ref()
            .is_some_and(|e| e.to_string().contains("unreachable")),
        "{pending:?}"
    );
    // the updater is back: the attempt is delivered, once, without a new intent
    let back = UpdaterPeer::start(&rig.peer.path);
    eventually(&agent, Duration::from_secs(20), "attempt delivered", || {
        (back.mutating_requests().len() == 1).then_some(())
    });
    assert_eq!(
        back.mutating_requests()[0],
        fleet_wire::Request::Upgrade {
            attempt: good.clone()
        }
    );
    let s: AgentUpgradeStatus = get_json(&statuses, DEVICE).expect("status");
    assert_ne!(s.phase, UpgradePhase::Failed, "{s:?}");
    // why: "sent once" has no later event to wait for (an accepted attempt ends the relay's sending); a window
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        back.mutating_requests().len(),
        1,
        "sent once after acceptance"
    );
}

/// A healthy agent on a new device (no upgrade intent, no desired state yet) under `RUST_LOG=info`, as the unit
/// runs it, logs no ERROR: an absent key is a normal answer.
#[test]
fn a_healthy_start_logs_no_error() {
    let rig = Rig::new(false, "");
    let mut agent = rig.spawn_agent();
    agent.wait_ready();
    // a few loop turns, and a resync that reads the absent keys again
    let hb = store(&rig.nc(), kv::DEVICE_HEARTBEAT);
    eventually(&agent, Duration::from_secs(20), "three heartbeats", || {
        (get_json::<fleet_wire::Heartbeat>(&hb, DEVICE)?.sequence >= 3).then_some(())
    });
    agent.sigterm();
    assert!(agent.wait_exit(Duration::from_secs(30)).success());
    let log = agent.log_text();
    assert!(!log.contains("ERROR"), "{log}");
    assert!(
        log.matches("found no value").count() <= 1,
        "an absent key is said at most once: {log}"
    );
}
