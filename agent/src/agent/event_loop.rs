//! The agent's event loop: watches, timers (resync, updater poll, workload status, heartbeat and usage) and the events
//! of the other threads, each handed to the part that owns it; a signal ends it in the drain.

use super::{fail, put_json, Agent, AgentError, Event};
use crate::workload_worker::Worker;
use fleet_wire::kv;
use fleet_wire::{Heartbeat, Timestamp};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::time::Instant;

impl Agent {
    pub(super) fn main_loop(&mut self, rx: mpsc::Receiver<Event>) -> Result<(), AgentError> {
        if let Some(p) = &self.podman {
            let tx = self.tx.clone();
            let worker = Worker::spawn(
                p.clone(),
                self.cfg.device_id.clone(),
                self.draining.clone(),
                crate::device_secrets::from_kv(self.kv.clone(), self.cfg.device_id.clone()),
                move |r| {
                    let _ = tx.send(Event::Reconciled(Box::new(r)));
                },
            )
            .map_err(|e| fail("workload worker", e))?;
            self.worker = Some(worker);
        }
        self.reconcile_now(true);
        // Each NATS step below may wait its whole request bound on a server that does not answer: a SIGTERM
        // that came meanwhile skips the rest, so the drain waits for one request at most, never for a sum.
        if !self.stopping() {
            self.publish_status();
        }
        if !self.stopping() {
            self.heartbeat();
        }
        if !self.stopping() {
            self.open_usage();
            self.report_usage();
        }
        // The intent is read once now (like the desired state) and then followed by its watch.
        if !self.stopping() {
            match self.kv.get(kv::AGENT_UPGRADE_INTENT, &self.key) {
                Ok(c) => self.on_intent(&c),
                Err(e) => log::warn!("reading the upgrade intent: {e}"),
            }
        }
        let stop = Arc::new(AtomicBool::new(false));
        for (bucket, intent) in [(kv::DESIRED_STATE, false), (kv::AGENT_UPGRADE_INTENT, true)] {
            let tx = self.tx.clone();
            self.kv
                .watch(bucket, &self.key, stop.clone(), move |c| {
                    tx.send(if intent {
                        Event::Intent(c)
                    } else {
                        Event::Desired(c)
                    })
                    .is_ok()
                })
                .map_err(|e| fail("watch", e))?;
        }
        // Every run key of this device, current and new, so a reboot never loses the active run.
        let tx = self.tx.clone();
        self.kv
            .watch_keys(
                kv::SYSTEM_UPGRADE_INTENT,
                &kv::device_runs_filter(&self.cfg.device_id),
                stop.clone(),
                move |k, c| tx.send(Event::SystemIntent(k, c)).is_ok(),
            )
            .map_err(|e| fail("watch", e))?;
        if !self.stopping() {
            self.start_diagnostics(&stop);
        }
        let now = Instant::now();
        let mut next_beat = now + self.cfg.heartbeat_interval;
        let mut next_status = now + self.cfg.status_interval;
        let mut next_resync = now + self.cfg.resync_interval;
        // Idle, the updater is polled with the resync, in the same wake-up; an active upgrade polls at its own rate.
        let mut next_poll = if self.upgrade_active() {
            now + self.cfg.updater_poll_interval
        } else {
            next_resync
        };
        loop {
            let soonest = next_beat.min(next_status).min(next_resync).min(next_poll);
            let wait = soonest.saturating_duration_since(Instant::now());
            match rx.recv_timeout(wait) {
                Ok(Event::Signal(at)) => {
                    stop.store(true, Ordering::SeqCst);
                    self.nats.wake_watches();
                    // The drain flag is set: the worker starts no new mutation; wait for the one in progress.
                    if let Some(w) = &mut self.worker {
                        w.finish();
                    }
                    if let Some(h) = &mut self.health.worker {
                        h.finish();
                    }
                    return self.drain(at);
                }
                Ok(Event::Desired(c)) => {
                    if self.apply_desired(c) {
                        self.reconcile_now(false);
                    } else if self.status_stale && !self.stopping() {
                        // Not taken (e.g. a field this agent does not know): no pass to wait for, and the
                        // operator should hear of it now.
                        let unsettled = self.publish_status();
                        next_status = Instant::now() + self.status_interval(unsettled);
                    }
                }
                Ok(Event::Reconciled(r)) => {
                    // A pass that changed nothing (the resync's, mostly) leaves the published status true.
                    if self.on_reconciled(*r) || self.status_stale {
                        let unsettled = self.publish_status();
                        next_status = Instant::now() + self.status_interval(unsettled);
                    }
                }
                Ok(Event::Health(f)) => {
                    // Sent only when a container's health changed: published at once, not a status interval later.
                    self.health.found = f;
                    if !self.stopping() {
                        let unsettled = self.publish_status();
                        next_status = Instant::now() + self.status_interval(unsettled);
                    }
                }
                Ok(Event::Intent(c)) => self.on_intent(&c),
                Ok(Event::UpgradeAnswer(id, r)) => {
                    let effects = self.relay.on_answer(id, *r, Timestamp::now());
                    self.apply_relay(effects);
                }
                Ok(Event::SystemIntent(k, c)) => self.on_system_intent(&k, c),
                Ok(Event::Diagnostics(k, c)) => self.on_diagnostics_request(&k, c),
                Ok(Event::SystemAnswer(id, r)) => {
                    let effects = self.system.on_answer(id, *r, Timestamp::now());
                    self.apply_system(effects);
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(fail("event loop", "event channel closed"));
                }
            }
            if self.draining.load(Ordering::SeqCst) {
                continue; // the signal event is next in the channel
            }
            let now = Instant::now();
            // An attempt that just became active (sent, accepted) is polled at the active rate from now on, not
            // after the idle interval that was scheduled before it.
            if self.upgrade_active() {
                next_poll = next_poll.min(now + self.cfg.updater_poll_interval);
            }
            if now >= next_resync {
                next_resync = now + self.cfg.resync_interval;
                match self.kv.get(kv::DESIRED_STATE, &self.key) {
                    Ok(c) => {
                        self.apply_desired_from(c, true);
                    }
                    Err(e) => log::warn!("re-reading the desired state: {e}; keeping the last one"),
                }
                self.reconcile_now(true);
                // An intent deferred while a request was in flight, or missed by a lost watch, is read again.
                if self.relay.idle() && !self.stopping() {
                    if let Ok(c) = self.kv.get(kv::AGENT_UPGRADE_INTENT, &self.key) {
                        let effects = self.relay.on_intent_reread(&c, Timestamp::now());
                        self.apply_relay(effects);
                    }
                }
                if !self.stopping() {
                    self.start_diagnostics(&stop);
                    self.reread_diagnostics();
                    self.open_usage();
                }
            }
            if now >= next_poll && !self.stopping() {
                next_poll = now
                    + if self.upgrade_active() {
                        self.cfg.updater_poll_interval
                    } else {
                        self.cfg.resync_interval
                    };
                self.poll_updater();
            }
            if now >= next_status && !self.stopping() {
                let unsettled = self.publish_status();
                next_status = now + self.status_interval(unsettled);
            }
            if now >= next_beat && !self.stopping() {
                next_beat = now + self.cfg.heartbeat_interval;
                self.heartbeat();
                if !self.stopping() {
                    self.republish_if_lost();
                }
                // Measured in the heartbeat's wake-up: no timer of its own.
                if !self.stopping() {
                    self.report_usage();
                }
            }
        }
    }

    /// The wait before the next workload status: shorter while a workload is unsettled.
    fn status_interval(&self, unsettled: bool) -> std::time::Duration {
        if unsettled {
            self.cfg
                .status_interval
                .min(crate::reconcile::UNSETTLED_STATUS_INTERVAL)
        } else {
            self.cfg.status_interval
        }
    }

    pub(super) fn heartbeat(&mut self) {
        self.beat += 1;
        let h = Heartbeat {
            device_id: self.cfg.device_id.clone(),
            at: Timestamp::now(),
            agent_version: self.version.clone(),
            boot_id: crate::device::boot_id(),
            sequence: self.beat,
        };
        match put_json(&self.kv, kv::DEVICE_HEARTBEAT, &self.key, &h) {
            Ok(_) => {
                // Only a heartbeat NATS acknowledged counts as the first one after a system upgrade.
                let effects = self.system.on_heartbeat(h.at);
                self.apply_system(effects);
            }
            Err(e) => log::warn!("publishing heartbeat: {e}"),
        }
        self.nats.refresh_watches();
    }

    /// SIGTERM came (the signal thread set the flag): no further NATS step of the loop starts.
    fn stopping(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Writes device info, the mirrored agent-upgrade status and the status of a system-upgrade run under way again
    /// when NATS no longer has them (an operator's mistake, a bucket restored from a backup): they are otherwise
    /// written only at start-up and on change.
    /// Checked with each heartbeat (in its wake-up), so that a lost key is back within one heartbeat interval.
    fn republish_if_lost(&mut self) {
        let absent = |bucket: &str| matches!(self.kv.get(bucket, &self.key), Ok(c) if c.value == crate::nats_kv::Value::Absent);
        if absent(kv::DEVICE_INFO) {
            log::warn!("device info is missing from NATS: writing it again");
            let mut info = self.info.clone();
            info.published_at = Timestamp::now();
            match put_json(&self.kv, kv::DEVICE_INFO, &self.key, &info) {
                Ok(_) => self.info = info,
                Err(e) => log::warn!("writing device info again: {e}"),
            }
        }
        if self.relay.idle() && !self.stopping() {
            if let Some(s) = self.relay.last_mirrored().cloned() {
                if absent(kv::AGENT_UPGRADE_STATUS) {
                    log::warn!("the agent-upgrade status is missing from NATS: writing it again");
                    if let Err(e) = self.put_upgrade_status(&s) {
                        log::warn!("writing the agent-upgrade status again: {e}");
                    }
                }
            }
        }
        if let Some(s) = self.system.republishable().cloned() {
            let key = kv::run_key(&s.device_id, &s.run_uid);
            let gone = matches!(self.kv.get(kv::SYSTEM_UPGRADE_STATUS, &key), Ok(c) if c.value == crate::nats_kv::Value::Absent);
            if gone && !self.stopping() {
                log::warn!("system-upgrade-status/{key} is missing from NATS: writing it again");
                // A refused write is not tried again for this run; a written one is, should it be lost again.
                if let Err(e) = put_json(&self.kv, kv::SYSTEM_UPGRADE_STATUS, &key, &s) {
                    log::warn!("writing system-upgrade-status/{key} again: {e}");
                    self.system.republished(&s.run_uid);
                }
            }
        }
    }

    pub(super) fn upgrade_active(&self) -> bool {
        self.relay.active() || self.system.active()
    }

    pub(super) fn poll_updater(&mut self) {
        match self.updater.status() {
            Ok(st) => {
                self.reflect_system(st.system_upgrade);
                let effects = self.system.drive(Timestamp::now());
                self.apply_system(effects);
                for (k, c) in std::mem::take(&mut self.system_unread) {
                    self.on_system_intent(&k, c);
                }
                let effects = self.relay.on_updater_status(st.agent_upgrade);
                self.apply_relay(effects);
            }
            Err(e) => log::warn!("polling the updater: {e}"),
        }
    }
}
