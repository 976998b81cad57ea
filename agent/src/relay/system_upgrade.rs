//! The system-upgrade relay, without I/O: intents from `system-upgrade-intent/<device>.<run-uid>` are validated
//! and forwarded to the updater one request at a time; the updater's status is reflected into
//! `system-upgrade-status/<device>.<run-uid>` whenever it changes; after a success the first heartbeat the agent
//! publishes is recorded in that status. Every method returns the effects the agent loop carries out.

use fleet_wire::{
    kv, AttemptId, DeviceId, ErrorCode, Response, SystemUpgradeAttempt, SystemUpgradePhase,
    SystemUpgradeReason, SystemUpgradeStatus, Timestamp,
};
use std::collections::BTreeMap;

/// Runs remembered at most (the oldest finished ones are forgotten first).
pub const MAX_RUNS: usize = 64;

/// Something the agent loop must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Write the status to `system-upgrade-status/<device>.<run-uid>`; call [`SystemRelay::published`] once
    /// JetStream acknowledged it (otherwise it is written again on the next updater poll).
    Publish(Box<SystemUpgradeStatus>),
    /// Send one `system-upgrade` request; call [`SystemRelay::on_answer`] with the answer.
    Send(Box<SystemUpgradeAttempt>),
}

/// Where a run is, as the relay sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Valid, not yet accepted by the updater: to be sent.
    Pending,
    /// A request is in flight.
    InFlight,
    /// The updater has it: its status is mirrored.
    WithUpdater,
}

#[derive(Debug, Clone)]
struct Run {
    attempt: Option<SystemUpgradeAttempt>,
    stage: Stage,
    /// The status last acknowledged by NATS (or read from it).
    published: Option<SystemUpgradeStatus>,
    /// Writing its status again after its key was lost was refused ([`SystemRelay::republishable`]).
    republished: bool,
}

impl Run {
    /// Nothing more to do: terminal, and for a success the first heartbeat after completion is recorded.
    fn finished(&self) -> bool {
        self.published.as_ref().is_some_and(|s| {
            s.phase.is_terminal()
                && (s.phase != SystemUpgradePhase::Succeeded
                    || s.first_heartbeat_after_completion.is_some())
        })
    }
}

/// The relay's state for one device.
#[derive(Debug)]
pub struct SystemRelay {
    device: DeviceId,
    runs: BTreeMap<AttemptId, Run>,
    in_flight: Option<AttemptId>,
}

impl SystemRelay {
    /// A relay for `device` that knows no run yet.
    pub fn new(device: DeviceId) -> Self {
        Self {
            device,
            runs: BTreeMap::new(),
            in_flight: None,
        }
    }

    /// True while a run needs the updater polled often (sent, upgrading, rebooting, or awaiting its heartbeat).
    pub fn active(&self) -> bool {
        self.runs.values().any(|r| !r.finished())
    }

    /// Whether `key`'s run is already known (the agent reads its published status only for new ones).
    pub fn knows(&self, key: &str) -> bool {
        kv::parse_run_key(key).is_ok_and(|(_, run)| self.runs.contains_key(&run))
    }

    fn fail(
        &mut self,
        run: AttemptId,
        reason: SystemUpgradeReason,
        error: String,
        now: Timestamp,
    ) -> Vec<Effect> {
        log::warn!("system upgrade run {run}: {reason:?}: {error}");
        let s = SystemUpgradeStatus::refused(run, self.device.clone(), reason, error, now);
        let entry = self.runs.entry(run).or_insert(Run {
            attempt: None,
            stage: Stage::WithUpdater,
            published: None,
            republished: false,
        });
        entry.stage = Stage::WithUpdater;
        entry.attempt = None;
        vec![Effect::Publish(Box::new(s))]
    }

    /// An intent value (`None`: deleted) at `key`, with the status already published for that run when the
    /// relay did not know it yet (see [`Self::knows`]).
    pub fn on_intent(
        &mut self,
        key: &str,
        value: Option<&[u8]>,
        published: Option<SystemUpgradeStatus>,
        now: Timestamp,
    ) -> Vec<Effect> {
        let (device, run) = match kv::parse_run_key(key) {
            Ok(k) => k,
            Err(e) => {
                log::warn!("system-upgrade intent key {key:?} ignored: {e}");
                return Vec::new();
            }
        };
        if device != self.device {
            return Vec::new();
        }
        let Some(bytes) = value else {
            // The operator removes an intent once its run is terminal; an active run continues in the updater.
            if self.runs.get(&run).is_some_and(Run::finished) {
                self.runs.remove(&run);
            }
            return Vec::new();
        };
        if self.runs.contains_key(&run) {
            return self.drive(now);
        }
        if let Some(p) = published {
            if p.run_uid == run && p.device_id == self.device {
                // Published before (this agent or an earlier process): the updater has (or had) it.
                self.runs.insert(
                    run,
                    Run {
                        attempt: None,
                        stage: Stage::WithUpdater,
                        published: Some(p),
                        republished: false,
                    },
                );
                self.forget_old();
                return Vec::new();
            }
        }
        let attempt: SystemUpgradeAttempt = match serde_json::from_slice(bytes) {
            Ok(a) => a,
            Err(e) => {
                return self.fail(
                    run,
                    SystemUpgradeReason::Rejected,
                    format!("intent is not a valid SystemUpgradeAttempt: {e}"),
                    now,
                )
            }
        };
        if attempt.run_uid != run {
            return self.fail(
                run,
                SystemUpgradeReason::Rejected,
                format!("intent at key {key} carries run {}", attempt.run_uid),
                now,
            );
        }
        if attempt.device_id != self.device {
            return self.fail(
                run,
                SystemUpgradeReason::Rejected,
                format!("intent is for device {}", attempt.device_id),
                now,
            );
        }
        self.runs.insert(
            run,
            Run {
                attempt: Some(attempt),
                stage: Stage::Pending,
                published: None,
                republished: false,
            },
        );
        self.forget_old();
        self.drive(now)
    }

    /// Sends the next pending run when no request is in flight; an attempt that expired while it waited is
    /// failed instead (it was never accepted, so it never starts). Call on every updater poll.
    pub fn drive(&mut self, now: Timestamp) -> Vec<Effect> {
        if self.in_flight.is_some() {
            return Vec::new();
        }
        let Some((run, attempt)) = self
            .runs
            .iter()
            .find(|(_, r)| r.stage == Stage::Pending)
            .and_then(|(id, r)| r.attempt.clone().map(|a| (*id, a)))
        else {
            return Vec::new();
        };
        if attempt.has_expired(now) {
            return self.fail(
                run,
                SystemUpgradeReason::Expired,
                format!(
                    "the attempt expired at {} before the updater accepted it; it never starts",
                    attempt.expires_at
                ),
                now,
            );
        }
        if let Some(r) = self.runs.get_mut(&run) {
            r.stage = Stage::InFlight;
        }
        self.in_flight = Some(run);
        vec![Effect::Send(Box::new(attempt))]
    }

    /// The updater's answer to the request for `run` (`Err`: the exchange failed).
    pub fn on_answer(
        &mut self,
        run: AttemptId,
        answer: Result<Response, String>,
        now: Timestamp,
    ) -> Vec<Effect> {
        if self.in_flight == Some(run) {
            self.in_flight = None;
        }
        let back_to_pending = |this: &mut Self| {
            if let Some(r) = this.runs.get_mut(&run) {
                if r.stage == Stage::InFlight {
                    r.stage = Stage::Pending;
                }
            }
        };
        match answer {
            Ok(Response::Accepted { status }) | Ok(Response::Status { status }) => {
                if let Some(r) = self.runs.get_mut(&run) {
                    r.stage = Stage::WithUpdater;
                }
                self.on_updater_status(status.system_upgrade)
            }
            Ok(Response::Error {
                code: ErrorCode::Busy,
                message,
            }) => {
                // Another transaction runs; asked again on the next poll.
                log::info!(
                    "system upgrade run {run}: updater busy ({message}); asking again later"
                );
                back_to_pending(self);
                Vec::new()
            }
            Ok(Response::Error {
                code: ErrorCode::Expired,
                message,
            }) => self.fail(run, SystemUpgradeReason::Expired, message.to_string(), now),
            Ok(Response::Error { code, message }) => self.fail(
                run,
                SystemUpgradeReason::Rejected,
                format!("updater refused: {code:?}: {message}"),
                now,
            ),
            Ok(Response::Diagnostics { .. }) => {
                log::warn!("system upgrade run {run}: the updater answered another request; asking again later");
                back_to_pending(self);
                Vec::new()
            }
            Err(e) => {
                // The updater may have accepted it before the exchange broke: polls show the truth.
                log::warn!("system upgrade run {run}: request failed: {e}; asking again later");
                back_to_pending(self);
                Vec::new()
            }
        }
    }

    /// Whether the relay knows run `run` (the agent reads its published status before reflecting an updater
    /// status of a run it does not know, e.g. after a restart).
    pub fn knows_run(&self, run: &AttemptId) -> bool {
        self.runs.contains_key(run)
    }

    /// What NATS already holds for a run the relay did not know (read by the agent after a restart).
    pub fn remember(&mut self, published: SystemUpgradeStatus) {
        if published.device_id != self.device || self.runs.contains_key(&published.run_uid) {
            return;
        }
        self.runs.insert(
            published.run_uid,
            Run {
                attempt: None,
                stage: Stage::WithUpdater,
                published: Some(published),
                republished: false,
            },
        );
        self.forget_old();
    }

    /// The updater's current or last system upgrade (from a status poll or an answer): published when it
    /// differs from what NATS holds. The heartbeat field is the agent's own and is kept.
    pub fn on_updater_status(&mut self, status: Option<SystemUpgradeStatus>) -> Vec<Effect> {
        let Some(mut s) = status.filter(|s| s.device_id == self.device) else {
            return Vec::new();
        };
        let run = self.runs.entry(s.run_uid).or_insert(Run {
            attempt: None,
            stage: Stage::WithUpdater,
            published: None,
            republished: false,
        });
        if run.stage != Stage::InFlight {
            run.stage = Stage::WithUpdater;
        }
        if let Some(p) = &run.published {
            s.first_heartbeat_after_completion = p.first_heartbeat_after_completion;
            // A status written by the relay itself (refused before acceptance) is not replaced by an older view.
            if p.phase.is_terminal() && !s.phase.is_terminal() {
                return Vec::new();
            }
        }
        if run.published.as_ref() == Some(&s) {
            return Vec::new();
        }
        log::info!(
            "system upgrade run {}: phase {:?} reason {:?}",
            s.run_uid,
            s.phase,
            s.reason
        );
        self.forget_old();
        vec![Effect::Publish(Box::new(s))]
    }

    /// The agent published a heartbeat at `at`: the first one after a success is recorded in its status.
    pub fn on_heartbeat(&mut self, at: Timestamp) -> Vec<Effect> {
        let mut out = Vec::new();
        for r in self.runs.values() {
            if let Some(p) = &r.published {
                if p.phase == SystemUpgradePhase::Succeeded
                    && p.first_heartbeat_after_completion.is_none()
                    && p.completed_at.is_some_and(|c| c <= at)
                {
                    let mut s = p.clone();
                    s.first_heartbeat_after_completion = Some(at);
                    out.push(Effect::Publish(Box::new(s)));
                }
            }
        }
        out
    }

    /// The latest run's status as NATS acknowledged it, while the run is under way (not finished; its intent is
    /// still there, so fleet-auth takes the write): written again by the agent whenever its key is gone, until a
    /// write of it is refused ([`Self::republished`]), so that a refused write is not repeated every heartbeat.
    pub fn republishable(&self) -> Option<&SystemUpgradeStatus> {
        self.runs
            .values()
            .filter(|r| !r.finished() && !r.republished)
            .filter_map(|r| r.published.as_ref())
            .max_by_key(|p| p.accepted_at)
    }

    /// Writing run `run`'s status again was refused: it is not tried again.
    pub fn republished(&mut self, run: &AttemptId) {
        if let Some(r) = self.runs.get_mut(run) {
            r.republished = true;
        }
    }

    /// NATS acknowledged `status`.
    pub fn published(&mut self, status: SystemUpgradeStatus) {
        if let Some(r) = self.runs.get_mut(&status.run_uid) {
            r.published = Some(status);
        }
    }

    fn forget_old(&mut self) {
        while self.runs.len() > MAX_RUNS {
            let Some(oldest) = self
                .runs
                .iter()
                .filter(|(_, r)| r.finished())
                .min_by_key(|(_, r)| r.published.as_ref().map(|p| p.accepted_at))
                .map(|(id, _)| *id)
            else {
                return;
            };
            self.runs.remove(&oldest);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_wire::{fixtures, UpdaterStatus};
    use std::time::Duration;

    fn device() -> DeviceId {
        fixtures::device()
    }

    fn attempt() -> SystemUpgradeAttempt {
        SystemUpgradeAttempt {
            expires_at: fixtures::t(1000),
            ..fixtures::system_attempt()
        }
    }

    fn key(a: &SystemUpgradeAttempt) -> String {
        kv::run_key(&a.device_id, &a.run_uid)
    }

    fn json(a: &SystemUpgradeAttempt) -> Vec<u8> {
        serde_json::to_vec(a).expect("json")
    }

    fn updater(s: SystemUpgradeStatus) -> Response {
        Response::Accepted {
            status: UpdaterStatus {
                updater_version: "t".into(),
                boot_id: None,
                recovering: false,
                agent_upgrade: None,
                system_upgrade: Some(s),
                capabilities: vec![],
            },
        }
    }

    fn status(a: &SystemUpgradeAttempt, phase: SystemUpgradePhase, at: u64) -> SystemUpgradeStatus {
        SystemUpgradeStatus {
            run_uid: a.run_uid,
            device_id: a.device_id.clone(),
            phase,
            reason: None,
            error: None,
            accepted_at: fixtures::t(10),
            completed_at: phase.is_terminal().then(|| fixtures::t(at)),
            first_heartbeat_after_completion: None,
            reboot_required: false,
            detail: None,
            output_tail: None,
            transitions: Default::default(),
        }
    }

    /// Applies publish effects as the agent would after an acknowledged put; returns the published statuses.
    fn ack(r: &mut SystemRelay, effects: Vec<Effect>) -> Vec<SystemUpgradeStatus> {
        effects
            .into_iter()
            .filter_map(|e| match e {
                Effect::Publish(s) => {
                    r.published((*s).clone());
                    Some(*s)
                }
                Effect::Send(_) => None,
            })
            .collect()
    }

    #[test]
    fn a_run_is_sent_once_mirrored_and_gets_its_first_heartbeat() {
        let a = attempt();
        let mut r = SystemRelay::new(device());
        let e = r.on_intent(&key(&a), Some(&json(&a)), None, fixtures::t(5));
        assert_eq!(e, [Effect::Send(Box::new(a.clone()))]);
        assert!(r.active() && r.knows(&key(&a)));
        // The same intent again (watch redelivery) while in flight: nothing.
        assert!(r
            .on_intent(&key(&a), Some(&json(&a)), None, fixtures::t(6))
            .is_empty());
        let accepted = status(&a, SystemUpgradePhase::Accepted, 0);
        let e = r.on_answer(a.run_uid, Ok(updater(accepted.clone())), fixtures::t(7));
        assert_eq!(ack(&mut r, e), std::slice::from_ref(&accepted));
        // Polls reflect every change, and nothing when nothing changed.
        assert!(r.on_updater_status(Some(accepted)).is_empty());
        let upgrading = status(&a, SystemUpgradePhase::Upgrading, 0);
        assert_eq!(
            {
                let e = r.on_updater_status(Some(upgrading.clone()));
                ack(&mut r, e)
            },
            [upgrading]
        );
        // Never sent again, whatever is redelivered.
        assert!(r.drive(fixtures::t(8)).is_empty());
        assert!(r
            .on_intent(&key(&a), Some(&json(&a)), None, fixtures::t(8))
            .is_empty());
        let done = status(&a, SystemUpgradePhase::Succeeded, 50);
        assert_eq!(
            {
                let e = r.on_updater_status(Some(done.clone()));
                ack(&mut r, e)
            },
            std::slice::from_ref(&done)
        );
        assert!(r.active(), "waits for the first heartbeat");
        // A heartbeat before completion does not count; the first one after does, once.
        assert!(r.on_heartbeat(fixtures::t(49)).is_empty());
        let beat = {
            let e = r.on_heartbeat(fixtures::t(55));
            ack(&mut r, e)
        };
        assert_eq!(beat.len(), 1);
        assert_eq!(
            beat[0].first_heartbeat_after_completion,
            Some(fixtures::t(55))
        );
        assert!(r.on_heartbeat(fixtures::t(60)).is_empty());
        assert!(!r.active());
        // Later polls of the same updater status keep the heartbeat and publish nothing.
        assert!(r.on_updater_status(Some(done)).is_empty());
        // The operator deletes the terminal intent: forgotten.
        assert!(r
            .on_intent(&key(&a), None, None, fixtures::t(70))
            .is_empty());
        assert!(!r.knows(&key(&a)));
    }

    #[test]
    fn validation_and_expiry() {
        let a = attempt();
        let mut r = SystemRelay::new(device());
        // Expired before it was ever sent: failed/expired, never sent.
        let e = r.on_intent(&key(&a), Some(&json(&a)), None, a.expires_at);
        let s = ack(&mut r, e);
        assert_eq!(
            (s[0].phase, s[0].reason),
            (
                SystemUpgradePhase::Failed,
                Some(SystemUpgradeReason::Expired)
            )
        );
        assert!(!r.active());
        // Malformed, another run id under this key, another device.
        let b = SystemUpgradeAttempt {
            run_uid: AttemptId::new_random(),
            ..attempt()
        };
        let bad = [
            (b"{".to_vec(), "valid"),
            (
                json(&SystemUpgradeAttempt {
                    run_uid: AttemptId::new_random(),
                    ..b.clone()
                }),
                "carries run",
            ),
        ];
        for (bytes, needle) in bad {
            let mut r = SystemRelay::new(device());
            let s = {
                let e = r.on_intent(&key(&b), Some(&bytes), None, fixtures::t(5));
                ack(&mut r, e)
            };
            assert_eq!(s[0].reason, Some(SystemUpgradeReason::Rejected));
            assert!(
                s[0].error
                    .as_ref()
                    .is_some_and(|e| e.as_str().contains(needle)),
                "{s:?}"
            );
        }
        let other = DeviceId::try_from("device-2").expect("id");
        let mut r = SystemRelay::new(other);
        assert!(
            r.on_intent(&key(&a), Some(&json(&a)), None, fixtures::t(5))
                .is_empty(),
            "another device's key"
        );
    }

    #[test]
    fn restarts_busy_and_refusals() {
        let a = attempt();
        // After an agent restart: the run is already published (upgrading) — not sent again, just mirrored.
        let mut r = SystemRelay::new(device());
        let published = status(&a, SystemUpgradePhase::Upgrading, 0);
        // Even past its expiry: it was accepted in time.
        assert!(r
            .on_intent(
                &key(&a),
                Some(&json(&a)),
                Some(published),
                a.expires_at.plus(Duration::from_secs(1))
            )
            .is_empty());
        assert!(r.active());
        // A terminal success without its heartbeat still gets one.
        let mut r = SystemRelay::new(device());
        let done = status(&a, SystemUpgradePhase::Succeeded, 50);
        assert!(r
            .on_intent(&key(&a), Some(&json(&a)), Some(done), fixtures::t(60))
            .is_empty());
        assert_eq!(
            {
                let e = r.on_heartbeat(fixtures::t(61));
                ack(&mut r, e)
            }
            .len(),
            1
        );

        // After a restart the updater still reports the finished run: with what NATS holds remembered, its
        // view (which has no heartbeat) does not overwrite the recorded heartbeat.
        let mut r = SystemRelay::new(device());
        let mut recorded = status(&a, SystemUpgradePhase::Succeeded, 50);
        recorded.first_heartbeat_after_completion = Some(fixtures::t(55));
        r.remember(recorded);
        assert!(r.knows_run(&a.run_uid));
        assert!(r
            .on_updater_status(Some(status(&a, SystemUpgradePhase::Succeeded, 50)))
            .is_empty());
        assert!(!r.active());

        // Busy: asked again on the next drive, not before.
        let mut r = SystemRelay::new(device());
        r.on_intent(&key(&a), Some(&json(&a)), None, fixtures::t(5));
        let busy = Response::error(ErrorCode::Busy, "an agent upgrade is running");
        assert!(r.on_answer(a.run_uid, Ok(busy), fixtures::t(6)).is_empty());
        assert_eq!(r.drive(fixtures::t(7)), [Effect::Send(Box::new(a.clone()))]);
        // An I/O failure: the same.
        assert!(r
            .on_answer(a.run_uid, Err("connection refused".into()), fixtures::t(8))
            .is_empty());
        assert_eq!(r.drive(fixtures::t(9)).len(), 1);
        // The updater says expired (its clock decides): failed/expired.
        let e = r.on_answer(
            a.run_uid,
            Ok(Response::error(ErrorCode::Expired, "expired")),
            fixtures::t(10),
        );
        assert_eq!(ack(&mut r, e)[0].reason, Some(SystemUpgradeReason::Expired));
        // A conflict: failed/rejected with the updater's words.
        let mut r = SystemRelay::new(device());
        r.on_intent(&key(&a), Some(&json(&a)), None, fixtures::t(5));
        let e = r.on_answer(
            a.run_uid,
            Ok(Response::error(ErrorCode::Conflict, "already ended")),
            fixtures::t(6),
        );
        let s = ack(&mut r, e);
        assert_eq!(s[0].reason, Some(SystemUpgradeReason::Rejected));
        assert!(s[0]
            .error
            .as_ref()
            .is_some_and(|e| e.as_str().contains("already ended")));
        assert!(!r.active());
    }

    #[test]
    fn the_latest_unfinished_run_is_republishable_until_refused() {
        let mut r = SystemRelay::new(device());
        assert!(r.republishable().is_none());
        let done = fixtures::system_status();
        r.remember(done.clone());
        // Ended (and its first heartbeat after completion recorded, or a failure): never written again.
        let mut failed = done.clone();
        failed.phase = SystemUpgradePhase::Failed;
        let mut r2 = SystemRelay::new(device());
        r2.remember(failed);
        assert!(r2.republishable().is_none());
        // A newer run under way: it is the one, until writing it again is refused.
        let mut running = done.clone();
        running.run_uid = fleet_wire::AttemptId::new_random();
        running.accepted_at = done.accepted_at.plus(Duration::from_secs(60));
        running.phase = SystemUpgradePhase::Upgrading;
        running.completed_at = None;
        r.remember(running.clone());
        assert_eq!(r.republishable(), Some(&running));
        r.republished(&running.run_uid);
        assert!(r.republishable().is_none());
    }
}
