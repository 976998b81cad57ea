//! The values a simulated device writes, built with the fleet-wire types as the agent builds them.

use fleet_wire::{
    AgentUpgradeAttempt, AgentUpgradeStatus, Architecture, BoundedText, Capability, DesiredState,
    DeviceId, DeviceInfo, DeviceWorkloadStatus, FailureReason, Heartbeat, Id128, OsInfo,
    SystemUpgradeAttempt, SystemUpgradePhase, SystemUpgradeReason, SystemUpgradeStatus, Timestamp,
    Transition, Transitions, UpgradePhase, UpgradeReason, Version, WorkloadFailure, WorkloadState,
    WorkloadStatus,
};
use std::time::Duration;

/// The agent version every simulated device starts with.
pub const START_VERSION: &str = "1.0.0";

/// A boot id per device (stable within a run).
pub fn boot_id(i: usize) -> Id128 {
    Id128::parse_lenient(&format!("{:032x}", 0x5150_0000_0000_0000_u128 + i as u128))
        .unwrap_or_else(|_| unreachable!())
}

/// `device-info/<id>`: what the agent publishes at start-up (an amd64 Debian 12 device that can upgrade its
/// agent from https and OCI artifacts and run apt full-upgrade).
pub fn device_info(id: &DeviceId, version: &Version, boot: &Id128, at: Timestamp) -> DeviceInfo {
    DeviceInfo {
        device_id: id.clone(),
        agent_version: version.clone(),
        architecture: Architecture::Amd64,
        os: OsInfo {
            id: BoundedText::lossy("debian"),
            version_id: Some(BoundedText::lossy("12")),
            pretty_name: Some(BoundedText::lossy(
                "Debian GNU/Linux 12 (bookworm) [fleet-sim]",
            )),
        },
        capabilities: vec![
            Capability::AgentUpgradeV1,
            Capability::OciArtifactsV1,
            Capability::AptFullUpgradeV1,
        ],
        boot_id: Some(boot.clone()),
        published_at: at,
        restarts: Some(0),
        reboot_client_id: None,
    }
}

/// `device-heartbeat/<id>`: `at` is the send time, which the bench compares with the Device status.
pub fn heartbeat(
    id: &DeviceId,
    version: &Version,
    boot: &Id128,
    sequence: u64,
    at: Timestamp,
) -> Heartbeat {
    Heartbeat {
        device_id: id.clone(),
        at,
        agent_version: version.clone(),
        boot_id: Some(boot.clone()),
        sequence,
    }
}

/// A workload status before any desired state (generation 0, nothing running), as the agent publishes at start.
pub fn first_workload_status(device: &DeviceId, at: Timestamp) -> DeviceWorkloadStatus {
    DeviceWorkloadStatus {
        device_id: device.clone(),
        generation: 0,
        at,
        workloads: vec![],
        desired_error: None,
    }
}

/// `device-workload-status/<id>` for `desired`: every workload running with its spec, or (a failing device)
/// failed with an image pull error.
pub fn workload_status(desired: &DesiredState, fails: bool, at: Timestamp) -> DeviceWorkloadStatus {
    let started = Timestamp::from_unix_ms(at.unix_ms() / 1000 * 1000);
    let workloads = desired
        .workloads
        .iter()
        .map(|w| {
            let digest = w.digest();
            if fails {
                WorkloadStatus {
                    name: w.name.clone(),
                    state: WorkloadState::Failed,
                    container_id: None,
                    spec_digest: None,
                    started_at: None,
                    error: Some(BoundedText::lossy(format!(
                        "pulling {}: simulated failure (fleet-sim)",
                        w.image
                    ))),
                    failure: Some(WorkloadFailure {
                        reason: FailureReason::ImagePullFailed,
                        running_container_id: None,
                        running_spec_digest: None,
                        rolled_back: false,
                    }),
                    restarts: None,
                    health: None,
                }
            } else {
                WorkloadStatus {
                    name: w.name.clone(),
                    state: WorkloadState::Running,
                    // A container id is 64 hex digits; the spec digest's serve.
                    container_id: Some(digest.as_str().to_owned()),
                    spec_digest: Some(digest),
                    started_at: Some(started),
                    error: None,
                    failure: None,
                    restarts: None,
                    health: None,
                }
            }
        })
        .collect();
    DeviceWorkloadStatus {
        device_id: desired.device_id.clone(),
        generation: desired.generation,
        at,
        workloads,
        desired_error: None,
    }
}

/// The phases an agent upgrade goes through after `preparing`, each this long after the previous: the updater's
/// transaction, shortened. A failing device's download fails.
pub fn agent_steps(fails: bool) -> Vec<(Duration, UpgradePhase, Option<UpgradeReason>)> {
    let s = Duration::from_secs(1);
    if fails {
        vec![(s, UpgradePhase::Failed, Some(UpgradeReason::DownloadFailed))]
    } else {
        vec![
            (s, UpgradePhase::Stopping, Some(UpgradeReason::Updater)),
            (s, UpgradePhase::Starting, None),
            (s, UpgradePhase::Complete, None),
        ]
    }
}

/// The first status of an accepted attempt: `preparing`.
pub fn agent_accepted(a: &AgentUpgradeAttempt, boot: &Id128, at: Timestamp) -> AgentUpgradeStatus {
    let mut transitions = Transitions::default();
    transitions.push(Transition {
        phase: UpgradePhase::Preparing,
        at,
        reason: None,
    });
    AgentUpgradeStatus {
        device_id: a.device_id.clone(),
        attempt_id: Some(a.attempt_id),
        target_version: Some(a.target_version.clone()),
        attempt_digest: Some(a.digest()),
        phase: UpgradePhase::Preparing,
        reason: None,
        detail: Some(BoundedText::lossy("simulated (fleet-sim)")),
        error: None,
        attempt_started_at: at,
        phase_changed_at: at,
        drain_duration_ms: None,
        boot_id: Some(boot.clone()),
        invocation_id: None,
        journal_unit: None,
        transitions,
    }
}

/// `s` after entering `phase` at `at`; a failure carries an error.
pub fn agent_step(
    mut s: AgentUpgradeStatus,
    phase: UpgradePhase,
    reason: Option<UpgradeReason>,
    at: Timestamp,
) -> AgentUpgradeStatus {
    s.enter(phase, at, reason);
    if phase == UpgradePhase::Failed {
        s.error = Some(BoundedText::lossy(
            "download failed: simulated failure (fleet-sim)",
        ));
    }
    if phase == UpgradePhase::Complete {
        s.drain_duration_ms = Some(100);
    }
    s
}

/// The `accepted` status of a system upgrade, or a `failed` (`expired`) one for an intent past its expiry, as the
/// agent writes without reaching the updater.
pub fn system_accepted(a: &SystemUpgradeAttempt, at: Timestamp) -> SystemUpgradeStatus {
    if a.expires_at < at {
        return SystemUpgradeStatus::refused(
            a.run_uid,
            a.device_id.clone(),
            SystemUpgradeReason::Expired,
            "the intent expired before the updater accepted it",
            at,
        );
    }
    let mut transitions = Transitions::default();
    transitions.push(Transition {
        phase: SystemUpgradePhase::Accepted,
        at,
        reason: None,
    });
    SystemUpgradeStatus {
        run_uid: a.run_uid,
        device_id: a.device_id.clone(),
        phase: SystemUpgradePhase::Accepted,
        reason: None,
        error: None,
        accepted_at: at,
        completed_at: None,
        first_heartbeat_after_completion: None,
        reboot_required: false,
        detail: None,
        output_tail: None,
        transitions,
    }
}

/// How long after `accepted` a system upgrade ends.
pub const SYSTEM_RUN: Duration = Duration::from_secs(2);

/// `s` ended at `at`: `succeeded` (no reboot needed), or for a failing device `failed` (`apt-failed`).
pub fn system_done(mut s: SystemUpgradeStatus, fails: bool, at: Timestamp) -> SystemUpgradeStatus {
    let phase = if fails {
        s.reason = Some(SystemUpgradeReason::AptFailed);
        s.error = Some(BoundedText::lossy(
            "apt-get exited 100: simulated failure (fleet-sim)",
        ));
        SystemUpgradePhase::Failed
    } else {
        SystemUpgradePhase::Succeeded
    };
    s.phase = phase;
    s.completed_at = Some(at);
    s.transitions.push(Transition {
        phase,
        at,
        reason: None,
    });
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_wire::fixtures;

    fn v(s: &str) -> Version {
        Version::try_from(s).expect("version")
    }

    #[test]
    fn info_and_heartbeat_are_wire_values() {
        let id = crate::sim::fleet::device_id(7);
        let t = Timestamp::from_unix_ms(1_000);
        let info = device_info(&id, &v(START_VERSION), &boot_id(7), t);
        let back: DeviceInfo =
            serde_json::from_slice(&serde_json::to_vec(&info).expect("json")).expect("parse");
        assert_eq!(back, info);
        assert!(back.capabilities.contains(&Capability::AgentUpgradeV1));
        let h = heartbeat(&id, &v("2.0.0"), &boot_id(7), 3, t);
        assert_eq!(h.sequence, 3);
        assert_ne!(boot_id(1), boot_id(2));
    }

    #[test]
    fn workload_status_follows_the_desired_state() {
        let d = fixtures::desired_state();
        let ok = workload_status(&d, false, Timestamp::from_unix_ms(1_500));
        assert_eq!(ok.generation, d.generation);
        assert_eq!(ok.workloads.len(), d.workloads.len());
        assert!(ok
            .workloads
            .iter()
            .all(|w| w.state == WorkloadState::Running));
        assert_eq!(ok.workloads[0].spec_digest, Some(d.workloads[0].digest()));
        assert_eq!(
            ok.workloads[0].started_at,
            Some(Timestamp::from_unix_ms(1_000))
        );
        let bad = workload_status(&d, true, Timestamp::from_unix_ms(1_500));
        assert!(bad
            .workloads
            .iter()
            .all(|w| w.state == WorkloadState::Failed));
    }

    #[test]
    fn agent_upgrade_ends_complete_or_failed() {
        let a = fixtures::attempt();
        let t = Timestamp::from_unix_ms(1_000);
        let mut s = agent_accepted(&a, &boot_id(0), t);
        assert_eq!(s.attempt_digest, Some(a.digest()));
        for (_, p, r) in agent_steps(false) {
            s = agent_step(s, p, r, t);
        }
        assert_eq!(
            s.transitions.phases(),
            [
                UpgradePhase::Preparing,
                UpgradePhase::Stopping,
                UpgradePhase::Starting,
                UpgradePhase::Complete
            ]
        );
        let steps = agent_steps(true);
        assert_eq!(steps.len(), 1);
        let f = agent_step(
            agent_accepted(&a, &boot_id(0), t),
            steps[0].1,
            steps[0].2,
            t,
        );
        assert!(f.phase.is_terminal() && f.error.is_some());
    }

    #[test]
    fn system_upgrade_accepts_then_ends() {
        let mut a = fixtures::system_attempt();
        let now = Timestamp::from_unix_ms(a.expires_at.unix_ms() - 10_000);
        let s = system_accepted(&a, now);
        assert_eq!(s.phase, SystemUpgradePhase::Accepted);
        let done = system_done(s.clone(), false, now);
        assert_eq!(done.phase, SystemUpgradePhase::Succeeded);
        assert_eq!(done.completed_at, Some(now));
        assert_eq!(system_done(s, true, now).phase, SystemUpgradePhase::Failed);
        a.expires_at = Timestamp::from_unix_ms(1);
        assert_eq!(system_accepted(&a, now).phase, SystemUpgradePhase::Failed);
    }
}
