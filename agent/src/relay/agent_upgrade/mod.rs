//! The agent-upgrade relay as a state machine without I/O: an intent from `agent-upgrade-intent/<device>` is
//! validated and bound to its digest, published as `preparing` and sent to the updater one request at a time;
//! the updater's status is mirrored into `agent-upgrade-status/<device>`; an updater that cannot be reached
//! leaves the attempt pending, not failed. Every transition returns the [`Effect`]s the agent loop carries out,
//! in order, and reports back through the methods each effect names.

mod bindings;
mod intent;
mod status;

pub use bindings::{Binding, Bindings, BINDINGS_MAX_BYTES, MAX_BINDINGS};
pub use intent::{evaluate, Decision};
pub use status::{new_status, rejected_status, stopping_status};

use crate::nats_kv::{Change, Value};
use fleet_wire::{
    AgentUpgradeAttempt, AgentUpgradeStatus, Architecture, AttemptId, BoundedText, DeviceId,
    ErrorCode, Response, Sha256Hex, Timestamp, UpgradePhase, UpgradeReason,
};

/// Something the agent loop must do, in the order given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Write the bindings file durably. When `sending` names an attempt, the effects after this one depend on
    /// the write: if it fails, carry out none of them and call [`Relay::not_sent`] (an attempt the agent cannot
    /// record is never sent). Otherwise a failed write is only logged.
    SaveBindings {
        /// The bindings to write.
        bindings: Box<Bindings>,
        /// The attempt whose sending needs this write.
        sending: Option<AttemptId>,
    },
    /// Write a status the agent made itself (rejected, preparing, failed); a failed write is only logged.
    Publish(Box<AgentUpgradeStatus>),
    /// Write the updater's status; call [`Relay::mirrored`] once JetStream acknowledged it (otherwise it is
    /// written again on the next updater poll).
    Mirror(Box<AgentUpgradeStatus>),
    /// Write the attempt as pending (updater unreachable); call [`Relay::pending_published`] once acknowledged,
    /// so that the same wait is not written again.
    PublishPending(Box<AgentUpgradeStatus>),
    /// Send the attempt to the updater off the event thread; call [`Relay::on_answer`] with the answer, or
    /// [`Relay::not_sent`] when it could not be sent at all.
    Send(Box<AgentUpgradeAttempt>),
    /// The updater's answer to `attempt` was lost (`error`): poll the updater now (it may have the attempt all
    /// the same), then call [`Relay::after_lost_answer`].
    Recheck {
        /// The attempt sent.
        attempt: AttemptId,
        /// Why its answer was lost.
        error: String,
    },
}

/// The relay's state for one device.
#[derive(Debug)]
pub struct Relay {
    device: DeviceId,
    arch: Architecture,
    bindings: Bindings,
    /// The intent revision last taken; `None`: take the next one read, whatever its revision.
    intent_rev: Option<u64>,
    /// The attempt whose request is with the updater now (one at a time).
    in_flight: Option<AttemptId>,
    /// The updater's status last acknowledged by NATS.
    mirrored: Option<AgentUpgradeStatus>,
    /// The attempt last published as pending because the updater was unreachable, with its error text.
    last_pending: Option<(AttemptId, Option<BoundedText>)>,
}

impl Relay {
    /// A relay for `device` on `arch` with the bindings read at start-up.
    pub fn new(device: DeviceId, arch: Architecture, bindings: Bindings) -> Self {
        Self {
            device,
            arch,
            bindings,
            intent_rev: None,
            in_flight: None,
            mirrored: None,
            last_pending: None,
        }
    }

    /// Start-up: takes the updater's transaction (`recovered`, already for this device) and what NATS holds
    /// (`published`); returns the status to write before readiness, if any: an active transaction, a
    /// replacement for the agent's own stale drain record (`stopping`), an update of an older record of the
    /// same attempt (e.g. `complete` that the previous process did not mirror), or the transaction's status where
    /// NATS holds none, or only an earlier attempt's (its `preparing` write failed and the agent restarted before
    /// another write went through). A record of a later attempt (one the agent rejected since) is kept.
    pub fn recover(
        &mut self,
        published: Option<&AgentUpgradeStatus>,
        recovered: Option<AgentUpgradeStatus>,
    ) -> Option<AgentUpgradeStatus> {
        let s = recovered?;
        let stale_drain = published.is_some_and(|p| p.phase == UpgradePhase::Stopping);
        let outdated = match published {
            None => true,
            Some(p) if p.attempt_id == s.attempt_id => p != &s,
            Some(p) => p.attempt_started_at < s.attempt_started_at,
        };
        let write = !s.phase.is_terminal() || stale_drain || outdated;
        self.mirrored = Some(s.clone());
        write.then_some(s)
    }

    /// True while the updater should be polled at the active rate: a request in flight or an attempt the
    /// updater reports as not finished.
    pub fn active(&self) -> bool {
        self.in_flight.is_some()
            || self
                .mirrored
                .as_ref()
                .is_some_and(|s| !s.phase.is_terminal())
    }

    /// The updater's status as last mirrored into NATS (what NATS should hold), if any.
    pub fn last_mirrored(&self) -> Option<&AgentUpgradeStatus> {
        self.mirrored.as_ref()
    }

    /// True when no request is in flight (the periodic re-read of the intent is only useful then).
    pub fn idle(&self) -> bool {
        self.in_flight.is_none()
    }

    /// An intent value from the watch (or the first read): taken when newer than the last one.
    pub fn on_intent(&mut self, c: &Change, now: Timestamp) -> Vec<Effect> {
        if self.intent_rev.is_some_and(|r| c.revision <= r) {
            return Vec::new();
        }
        self.intent_rev = Some(c.revision);
        let Value::Put(bytes) = &c.value else {
            return Vec::new();
        };
        let decision = evaluate(bytes, &self.device, self.arch, &self.bindings);
        match decision {
            Decision::Reject { ref error, .. } => {
                log::warn!("upgrade intent revision {} rejected: {error}", c.revision);
                rejected_status(&self.device, &decision, now)
                    .map(|s| Effect::Publish(Box::new(s)))
                    .into_iter()
                    .collect()
            }
            Decision::Known(a) => {
                let accepted = self.bindings.get(&a.attempt_id).is_some_and(|b| b.accepted);
                let updater_knows = self
                    .mirrored
                    .as_ref()
                    .is_some_and(|s| s.attempt_id == Some(a.attempt_id));
                // Bound but never accepted (the agent stopped in between): ask again; the updater is idempotent
                // for the same id and digest.
                if !accepted && !updater_knows && self.in_flight.is_none() {
                    vec![self.send(*a)]
                } else {
                    Vec::new()
                }
            }
            Decision::New(a) => {
                if self.in_flight.is_some() {
                    log::warn!(
                        "attempt {} arrived while another request is in flight; it will be read again",
                        a.attempt_id
                    );
                    self.intent_rev = None;
                    return Vec::new();
                }
                self.bindings.bind(&a.attempt_id, &a.digest(), now);
                let preparing = new_status(
                    &self.device,
                    Some(a.attempt_id),
                    Some(a.target_version.clone()),
                    Some(a.digest()),
                    UpgradePhase::Preparing,
                    None,
                    now,
                );
                vec![
                    Effect::SaveBindings {
                        bindings: Box::new(self.bindings.clone()),
                        sending: Some(a.attempt_id),
                    },
                    Effect::Publish(Box::new(preparing)),
                    self.send(*a),
                ]
            }
        }
    }

    /// The periodic re-read of the intent: an intent deferred while a request was in flight, or missed by a
    /// lost watch, is taken again when its revision differs from the last one taken.
    pub fn on_intent_reread(&mut self, c: &Change, now: Timestamp) -> Vec<Effect> {
        if self.in_flight.is_some() || self.intent_rev == Some(c.revision) {
            return Vec::new();
        }
        self.intent_rev = None;
        self.on_intent(c, now)
    }

    fn send(&mut self, a: AgentUpgradeAttempt) -> Effect {
        self.in_flight = Some(a.attempt_id);
        Effect::Send(Box::new(a))
    }

    /// The `Send` for `id` did not happen (its binding could not be written, or no thread could be started).
    pub fn not_sent(&mut self, id: AttemptId) {
        if self.in_flight == Some(id) {
            self.in_flight = None;
        }
    }

    /// The updater's answer to the request for `id` (`Err`: the answer was lost).
    pub fn on_answer(
        &mut self,
        id: AttemptId,
        r: Result<Response, String>,
        now: Timestamp,
    ) -> Vec<Effect> {
        self.in_flight = None;
        match r {
            Ok(Response::Accepted { status }) | Ok(Response::Status { status }) => {
                log::info!("updater accepted attempt {id}");
                self.last_pending = None;
                self.bindings.mark_accepted(&id);
                let mut effects = vec![Effect::SaveBindings {
                    bindings: Box::new(self.bindings.clone()),
                    sending: None,
                }];
                effects.extend(self.on_updater_status(status.agent_upgrade));
                effects
            }
            Ok(Response::Error { code, message }) => {
                log::warn!("updater refused attempt {id}: {code:?}: {message}");
                let reason = match code {
                    ErrorCode::Quarantined => UpgradeReason::Quarantined,
                    ErrorCode::Busy => UpgradeReason::Busy,
                    _ => UpgradeReason::Rejected,
                };
                let s = self.attempt_status(
                    id,
                    UpgradePhase::Failed,
                    reason,
                    format!("updater refused: {code:?}: {message}"),
                    now,
                );
                vec![Effect::Publish(Box::new(s))]
            }
            Err(error) => vec![Effect::Recheck { attempt: id, error }],
            Ok(Response::Diagnostics { .. }) => vec![Effect::Recheck {
                attempt: id,
                error: "the updater answered another request".into(),
            }],
        }
    }

    /// After the poll a [`Effect::Recheck`] asked for: when the updater does not report attempt `id`, it never
    /// got it (socket absent, updater restarting): the attempt has not failed. It is published as pending with
    /// reason `updater-unreachable`, and the intent is read again at the next resync, which sends it once the
    /// updater answers (it is bound, not accepted).
    pub fn after_lost_answer(&mut self, id: AttemptId, error: &str, now: Timestamp) -> Vec<Effect> {
        if self.mirrored.as_ref().and_then(|s| s.attempt_id) == Some(id) {
            return Vec::new();
        }
        log::info!("upgrade attempt {id} not delivered, the updater is unreachable ({error}); it stays pending and is sent again when the updater answers");
        self.intent_rev = None;
        let s = self.attempt_status(
            id,
            UpgradePhase::Preparing,
            UpgradeReason::UpdaterUnreachable,
            format!(
                "the updater is unreachable ({error}); the attempt is delivered when it answers again"
            ),
            now,
        );
        if self.last_pending.as_ref() == Some(&(id, s.error.clone())) {
            return Vec::new(); // the same wait, already published
        }
        vec![Effect::PublishPending(Box::new(s))]
    }

    /// The pending status `s` was acknowledged.
    pub fn pending_published(&mut self, s: &AgentUpgradeStatus) {
        if let Some(id) = s.attempt_id {
            self.last_pending = Some((id, s.error.clone()));
        }
    }

    /// The updater's agent-upgrade status (from a poll or an answer): mirrored when it is for this device and
    /// differs from what was mirrored last.
    pub fn on_updater_status(&mut self, status: Option<AgentUpgradeStatus>) -> Vec<Effect> {
        let Some(s) = status.filter(|s| s.device_id == self.device) else {
            return Vec::new();
        };
        if self.mirrored.as_ref() == Some(&s) {
            return Vec::new();
        }
        log::info!(
            "upgrade {:?}: phase {:?} reason {:?}",
            s.attempt_id.map(|a| a.to_string()),
            s.phase,
            s.reason
        );
        vec![Effect::Mirror(Box::new(s))]
    }

    /// The mirrored status `s` was acknowledged.
    pub fn mirrored(&mut self, s: AgentUpgradeStatus) {
        self.mirrored = Some(s);
    }

    /// A status of attempt `id` made by the agent, with the digest it is bound to.
    fn attempt_status(
        &self,
        id: AttemptId,
        phase: UpgradePhase,
        reason: UpgradeReason,
        error: String,
        now: Timestamp,
    ) -> AgentUpgradeStatus {
        let digest = self
            .bindings
            .get(&id)
            .and_then(|b| Sha256Hex::try_from(b.digest.as_str()).ok());
        let mut s = new_status(
            &self.device,
            Some(id),
            None,
            digest,
            phase,
            Some(reason),
            now,
        );
        s.error = Some(BoundedText::lossy(error));
        s
    }
}

#[cfg(test)]
mod tests;
