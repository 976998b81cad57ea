//! Carrying out what the upgrade relays decide: the agent-upgrade relay's effects
//! ([`crate::relay::agent_upgrade::Effect`]) and the system-upgrade relay's ([`crate::relay::system_upgrade::Effect`]),
//! as KV writes, bindings writes and requests to the updater on their own threads; and the transaction status
//! published before readiness.

use super::{fail, put_json, retry_until, Agent, AgentError, Event, STARTUP_DEPENDENCY_WAIT};
use crate::nats_kv::{Change, Value};
use crate::relay::agent_upgrade;
use crate::relay::system_upgrade;
use fleet_wire::kv;
use fleet_wire::{AgentUpgradeAttempt, AgentUpgradeStatus, SystemUpgradeStatus, Timestamp};

impl Agent {
    pub(super) fn on_system_intent(&mut self, key: &str, c: Change) {
        // A run seen for the first time: what was published for it decides whether it is new (agent restart).
        let published = if self.system.knows(key) {
            None
        } else {
            match self.kv.get(kv::SYSTEM_UPGRADE_STATUS, key) {
                Ok(Change {
                    value: Value::Put(b),
                    ..
                }) => serde_json::from_slice::<SystemUpgradeStatus>(&b).ok(),
                Ok(_) => None,
                Err(e) => {
                    // Without knowing, never send: the next updater poll tries again.
                    log::warn!("reading system-upgrade-status/{key}: {e}; will retry");
                    self.system_unread.push((key.to_owned(), c));
                    return;
                }
            }
        };
        let value = match &c.value {
            Value::Put(b) => Some(b.as_slice()),
            Value::Absent => None,
        };
        let effects = self
            .system
            .on_intent(key, value, published, Timestamp::now());
        self.apply_system(effects);
    }

    /// Reflects the updater's system-upgrade status. For a run the relay does not know yet (agent restart), what
    /// NATS holds is read first, so that the agent's own fields (the heartbeat) are kept.
    pub(super) fn reflect_system(&mut self, status: Option<SystemUpgradeStatus>) {
        if let Some(s) = &status {
            if s.device_id == self.cfg.device_id && !self.system.knows_run(&s.run_uid) {
                let key = kv::run_key(&s.device_id, &s.run_uid);
                match self.kv.get(kv::SYSTEM_UPGRADE_STATUS, &key) {
                    Ok(Change {
                        value: Value::Put(b),
                        ..
                    }) => {
                        if let Ok(p) = serde_json::from_slice::<SystemUpgradeStatus>(&b) {
                            self.system.remember(p);
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        log::warn!("reading system-upgrade-status/{key}: {e}; will retry");
                        return;
                    }
                }
            }
        }
        let effects = self.system.on_updater_status(status);
        self.apply_system(effects);
    }

    /// Carries out the system relay's effects: acknowledged status writes, one request to the updater.
    pub(super) fn apply_system(&mut self, effects: Vec<system_upgrade::Effect>) {
        for e in effects {
            match e {
                system_upgrade::Effect::Publish(s) => {
                    let key = kv::run_key(&s.device_id, &s.run_uid);
                    match put_json(&self.kv, kv::SYSTEM_UPGRADE_STATUS, &key, &s) {
                        Ok(_) => self.system.published(*s),
                        Err(e) => {
                            log::warn!("publishing system-upgrade-status/{key}: {e}; will retry")
                        }
                    }
                }
                system_upgrade::Effect::Send(a) => {
                    let id = a.run_uid;
                    log::info!("sending system upgrade run {id} to the updater");
                    let client = self.updater.clone();
                    let tx = self.tx.clone();
                    let spawned = std::thread::Builder::new()
                        .name("system-upgrade-request".into())
                        .spawn(move || {
                            let r = client.system_upgrade(*a).map_err(|e| e.to_string());
                            let _ = tx.send(Event::SystemAnswer(id, Box::new(r)));
                        });
                    if let Err(e) = spawned {
                        log::error!("cannot start the system-upgrade request: {e}");
                        let effects =
                            self.system
                                .on_answer(id, Err(e.to_string()), Timestamp::now());
                        self.apply_system(effects);
                    }
                }
            }
        }
    }

    pub(super) fn put_upgrade_status(&self, s: &AgentUpgradeStatus) -> std::io::Result<u64> {
        put_json(&self.kv, kv::AGENT_UPGRADE_STATUS, &self.key, s)
    }

    pub(super) fn publish_recovered(
        &mut self,
        recovered: Option<AgentUpgradeStatus>,
    ) -> Result<(), AgentError> {
        let current = retry_until(STARTUP_DEPENDENCY_WAIT, &self.draining, || {
            self.kv.get(kv::AGENT_UPGRADE_STATUS, &self.key)
        })
        .map_err(|e| fail("upgrade-status", e))?;
        let published = match &current.value {
            Value::Put(b) => serde_json::from_slice::<AgentUpgradeStatus>(b).ok(),
            Value::Absent => None,
        };
        if let Some(s) = self.relay.recover(published.as_ref(), recovered) {
            retry_until(STARTUP_DEPENDENCY_WAIT, &self.draining, || {
                self.put_upgrade_status(&s)
            })
            .map_err(|e| fail("upgrade-status", e))?;
        }
        Ok(())
    }

    pub(super) fn on_intent(&mut self, c: &Change) {
        let effects = self.relay.on_intent(c, Timestamp::now());
        self.apply_relay(effects);
    }

    /// Carries out the upgrade relay's effects in order and reports each outcome back to it.
    pub(super) fn apply_relay(&mut self, effects: Vec<agent_upgrade::Effect>) {
        use agent_upgrade::Effect;
        for effect in effects {
            match effect {
                Effect::SaveBindings { bindings, sending } => {
                    if let Err(e) = bindings.save(&self.paths.bindings_file()) {
                        let Some(id) = sending else {
                            log::warn!("recording the upgrade bindings: {e}");
                            continue;
                        };
                        log::error!("cannot record attempt {id}: {e}; not sending it");
                        self.relay.not_sent(id);
                        return;
                    }
                }
                Effect::Publish(s) => {
                    if let Err(e) = self.put_upgrade_status(&s) {
                        log::warn!(
                            "publishing upgrade status {:?} of attempt {:?}: {e}",
                            s.phase,
                            s.attempt_id.map(|a| a.to_string())
                        );
                    }
                }
                Effect::Mirror(s) => match self.put_upgrade_status(&s) {
                    Ok(_) => self.relay.mirrored(*s),
                    Err(e) => log::warn!("mirroring upgrade status: {e}; will retry"),
                },
                Effect::PublishPending(s) => match self.put_upgrade_status(&s) {
                    Ok(_) => self.relay.pending_published(&s),
                    Err(e) => log::warn!(
                        "publishing the pending attempt {:?}: {e}",
                        s.attempt_id.map(|a| a.to_string())
                    ),
                },
                Effect::Send(a) => self.send(*a),
                Effect::Recheck { attempt, error } => {
                    self.poll_updater();
                    let effects = self
                        .relay
                        .after_lost_answer(attempt, &error, Timestamp::now());
                    self.apply_relay(effects);
                }
            }
        }
    }

    /// Sends an attempt to the updater on its own thread; the answer arrives as `Event::UpgradeAnswer`.
    pub(super) fn send(&mut self, a: AgentUpgradeAttempt) {
        let id = a.attempt_id;
        log::info!(
            "sending upgrade attempt {id} (target {}) to the updater",
            a.target_version
        );
        let client = self.updater.clone();
        let tx = self.tx.clone();
        let spawned = std::thread::Builder::new()
            .name("upgrade-request".into())
            .spawn(move || {
                let r = client.upgrade(a).map_err(|e| e.to_string());
                let _ = tx.send(Event::UpgradeAnswer(id, Box::new(r)));
            });
        if let Err(e) = spawned {
            log::error!("cannot start the upgrade request: {e}");
            self.relay.not_sent(id);
        }
    }
}
