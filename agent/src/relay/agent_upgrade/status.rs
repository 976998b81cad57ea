//! The agent-upgrade statuses the agent writes itself (rejected, preparing, pending, failed, stopping).

use super::Decision;
use fleet_wire::{
    AgentUpgradeStatus, AttemptId, BoundedText, DeviceId, Sha256Hex, Timestamp, Transitions,
    UpgradePhase, UpgradeReason, Version,
};

/// A fresh status for an attempt (or for no parsed attempt) in `phase`.
pub fn new_status(
    device: &DeviceId,
    attempt_id: Option<AttemptId>,
    target_version: Option<Version>,
    digest: Option<Sha256Hex>,
    phase: UpgradePhase,
    reason: Option<UpgradeReason>,
    now: Timestamp,
) -> AgentUpgradeStatus {
    let mut s = AgentUpgradeStatus {
        device_id: device.clone(),
        attempt_id,
        target_version,
        attempt_digest: digest,
        phase,
        reason,
        detail: None,
        error: None,
        attempt_started_at: now,
        phase_changed_at: now,
        drain_duration_ms: None,
        boot_id: crate::device::boot_id(),
        invocation_id: None,
        journal_unit: None,
        transitions: Transitions::default(),
    };
    s.enter(phase, now, reason);
    s
}

/// The status for a rejected intent: phase `failed`, reason `rejected`, with the error.
pub fn rejected_status(
    device: &DeviceId,
    d: &Decision,
    now: Timestamp,
) -> Option<AgentUpgradeStatus> {
    let Decision::Reject {
        attempt_id,
        target_version,
        digest,
        error,
    } = d
    else {
        return None;
    };
    let mut s = new_status(
        device,
        *attempt_id,
        target_version.clone(),
        digest.clone(),
        UpgradePhase::Failed,
        Some(UpgradeReason::Rejected),
        now,
    );
    s.error = Some(BoundedText::lossy(error));
    Some(s)
}

/// The status the drain writes, from the updater's view of the attempt (`current`): the reason is `updater`
/// when the updater is stopping the agent for a cutover, else `shutdown`. `None` when no attempt is in progress
/// (a reboot, an admin's restart): `agent-upgrade-status` describes the last attempt, and writing `stopping` there
/// would make a terminal record (a failed upgrade) look in progress.
pub fn stopping_status(
    current: Option<AgentUpgradeStatus>,
    agent_version: &Version,
    drain_ms: u64,
    now: Timestamp,
) -> (UpgradeReason, Option<AgentUpgradeStatus>) {
    // The updater writes `activating` (public phase `stopping`) before it runs `systemctl stop`.
    let by_updater = current
        .as_ref()
        .is_some_and(|s| s.phase == UpgradePhase::Stopping);
    let reason = if by_updater {
        UpgradeReason::Updater
    } else {
        UpgradeReason::Shutdown
    };
    let mut s = match current {
        Some(s) if by_updater || !s.phase.is_terminal() => s,
        _ => return (reason, None),
    };
    if s.phase == UpgradePhase::Stopping {
        // The updater already recorded the transition; add the reason without a duplicate entry.
        s.reason = Some(reason);
    } else {
        s.enter(UpgradePhase::Stopping, now, Some(reason));
    }
    s.drain_duration_ms = Some(drain_ms);
    s.detail = Some(BoundedText::lossy(format!(
        "agent {agent_version} drained in {drain_ms} ms"
    )));
    (reason, Some(s))
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_wire::fixtures;

    #[test]
    fn stopping_status_table() {
        let v = Version::try_from("1.1.0").expect("v");
        let a = fixtures::attempt();
        let at = |phase| {
            new_status(
                &a.device_id,
                Some(a.attempt_id),
                Some(a.target_version.clone()),
                Some(a.digest()),
                phase,
                None,
                fixtures::t(0),
            )
        };
        use UpgradePhase as P;
        use UpgradeReason as R;
        // (updater's view, reason, whether a status is written)
        let table = [
            (None, R::Shutdown, false),
            (Some(at(P::Complete)), R::Shutdown, false),
            (Some(at(P::Failed)), R::Shutdown, false),
            (Some(at(P::Preparing)), R::Shutdown, true),
            (Some(at(P::Starting)), R::Shutdown, true),
            (Some(at(P::Stopping)), R::Updater, true),
        ];
        for (current, reason, written) in table {
            let before = current.as_ref().map(|s| s.transitions.len());
            let (r, s) = stopping_status(current, &v, 42, fixtures::t(5));
            assert_eq!((r, s.is_some()), (reason, written), "{before:?}");
            if let Some(s) = s {
                assert_eq!((s.phase, s.reason), (P::Stopping, Some(reason)));
                assert_eq!(s.drain_duration_ms, Some(42));
                // The updater's own `stopping` entry is not repeated.
                let added = usize::from(reason == R::Shutdown);
                assert_eq!(Some(s.transitions.len()), before.map(|n| n + added));
            }
        }
    }
}
