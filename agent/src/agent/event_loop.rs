//! The agent's event loop: watches, timers (resync, updater poll, workload status, heartbeat and usage) and the events
//! of the other threads, each handed to the part that owns it; a signal ends it in the drain.

use super::{fail, put_json, Agent, AgentError, Event};
use crate::nats_kv::{Done, Op};
use crate::workload_worker::Worker;
use fleet_wire::kv;
use fleet_wire::{AgentUpgradeStatus, SystemUpgradeStatus};
use fleet_wire::{Heartbeat, Timestamp};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

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
                        next_status = self.next_status(Instant::now(), unsettled, next_beat);
                    }
                }
                Ok(Event::Reconciled(r)) => {
                    // A pass that changed nothing (the resync's, mostly) leaves the published status true.
                    if self.on_reconciled(*r) || self.status_stale {
                        let unsettled = self.publish_status();
                        next_status = self.next_status(Instant::now(), unsettled, next_beat);
                    }
                }
                Ok(Event::Health(f)) => {
                    // Sent only when a container's health changed: published at once, not a status interval later.
                    self.health.found = f;
                    if !self.stopping() {
                        let unsettled = self.publish_status();
                        next_status = self.next_status(Instant::now(), unsettled, next_beat);
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
                self.resync(&stop);
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
            let status_due = now >= next_status && !self.stopping();
            let beat_due = now >= next_beat && !self.stopping();
            if status_due || beat_due {
                // The status and the heartbeat due together (the status falls on the heartbeat's ticks), and
                // the heartbeat's check for lost keys, go to NATS as one batch of requests.
                let unsettled = self.tick(status_due, beat_due);
                if status_due {
                    next_status = self.next_status(now, unsettled, next_beat);
                }
                if beat_due {
                    next_beat = now + self.cfg.heartbeat_interval;
                    // Measured in the heartbeat's wake-up: no timer of its own.
                    if !self.stopping() {
                        self.report_usage();
                    }
                }
            }
        }
    }

    /// Publishes the workload status (`status`) and the heartbeat (`beat`) and, with the heartbeat, reads the
    /// keys that [`Self::republish_lost`] writes again when NATS lost them: one batch of NATS requests, all sent
    /// and then all answered within one request's bound, instead of one round trip after another (each a
    /// wake-up of this thread and two of the connection's). Returns whether a workload is unsettled.
    fn tick(&mut self, status: bool, beat: bool) -> bool {
        let draft = if status { self.status_now() } else { None };
        let unsettled = draft.as_ref().is_some_and(|(_, u)| *u);
        let mut ops: Vec<Op> = Vec::new();
        let at = |ops: &mut Vec<Op>, op: Op| {
            ops.push(op);
            ops.len() - 1
        };
        let status_op = draft.as_ref().map(|(s, _)| {
            serde_json::to_vec(s)
                .map(|value| at(&mut ops, self.put_op(kv::WORKLOAD_STATUS, &self.key, value)))
        });
        let h = beat.then(|| self.next_heartbeat());
        let beat_op = h.as_ref().map(|h| {
            serde_json::to_vec(h).map(|value| {
                at(
                    &mut ops,
                    self.put_op(kv::DEVICE_HEARTBEAT, &self.key, value),
                )
            })
        });
        let mut lost = Lost::<usize>::default();
        if beat {
            lost.info = Some(at(&mut ops, self.get_op(kv::DEVICE_INFO, &self.key)));
            if self.relay.idle() {
                if let Some(s) = self.relay.last_mirrored().cloned() {
                    lost.upgrade = Some((
                        at(&mut ops, self.get_op(kv::AGENT_UPGRADE_STATUS, &self.key)),
                        s,
                    ));
                }
            }
            if let Some(s) = self.system.republishable().cloned() {
                let key = kv::run_key(&s.device_id, &s.run_uid);
                lost.system = Some((
                    at(&mut ops, self.get_op(kv::SYSTEM_UPGRADE_STATUS, &key)),
                    s,
                ));
            }
        }
        let mut results: Vec<Option<std::io::Result<Done>>> =
            self.kv.batch(&ops).into_iter().map(Some).collect();
        let mut take = |i: usize| -> std::io::Result<Done> {
            results
                .get_mut(i)
                .and_then(Option::take)
                .unwrap_or_else(|| Err(std::io::Error::other("no result")))
        };
        let put = |d: std::io::Result<Done>| {
            d.and_then(|d| match d {
                Done::Put(rev) => Ok(rev),
                _ => Err(std::io::Error::other("not a put")),
            })
        };
        if let (Some((s, _)), Some(op)) = (&draft, status_op) {
            let written = op.map_err(std::io::Error::other).and_then(|i| put(take(i)));
            self.status_written(s, written);
        }
        if let (Some(h), Some(op)) = (h, beat_op) {
            match op.map_err(std::io::Error::other).and_then(|i| put(take(i))) {
                Ok(_) => {
                    // Only a heartbeat NATS acknowledged counts as the first one after a system upgrade.
                    let effects = self.system.on_heartbeat(h.at);
                    self.apply_system(effects);
                }
                Err(e) => log::warn!("publishing heartbeat: {e}"),
            }
            self.nats.refresh_watches();
        }
        if beat && !self.stopping() {
            let absent = |d: std::io::Result<Done>| matches!(d, Ok(Done::Got(_, c)) if c.value == crate::nats_kv::Value::Absent);
            let found = Lost {
                info: lost.info.filter(|i| absent(take(*i))).map(|_| ()),
                upgrade: lost
                    .upgrade
                    .and_then(|(i, s)| absent(take(i)).then_some(((), s))),
                system: lost
                    .system
                    .and_then(|(i, s)| absent(take(i)).then_some(((), s))),
            };
            self.republish_lost(found);
        }
        unsettled
    }

    /// The resync's reads, as one batch of NATS requests (see [`Self::tick`]): the desired state (a pass toward
    /// it follows), the upgrade intent while the relay is idle (one deferred while a request was in flight, or
    /// missed by a lost watch), this device's newest diagnostics request (one missed by a lost watch) or, until
    /// they exist, whether the diagnostics buckets exist, and whether the optional `device-usage` bucket exists
    /// until it does.
    fn resync(&mut self, stop: &Arc<AtomicBool>) {
        let mut ops = vec![self.get_op(kv::DESIRED_STATE, &self.key)];
        let intent = (self.relay.idle() && !self.stopping()).then(|| {
            ops.push(self.get_op(kv::AGENT_UPGRADE_INTENT, &self.key));
            ops.len() - 1
        });
        let diagnostics = ops.len();
        let running = self.diagnostics_running();
        if running {
            let filter = kv::device_runs_filter(&self.cfg.device_id);
            ops.push(self.get_op(kv::DIAGNOSTICS_REQUEST, &filter));
        } else {
            for bucket in super::diagnostics::DIAGNOSTICS_BUCKETS {
                ops.push(Op::Open {
                    bucket: bucket.to_owned(),
                });
            }
        }
        let usage = self.usage_unopened().then(|| {
            ops.push(Op::Open {
                bucket: kv::DEVICE_USAGE.to_owned(),
            });
            ops.len() - 1
        });
        let mut results: Vec<Option<std::io::Result<Done>>> =
            self.nats.batch(&ops).into_iter().map(Some).collect();
        let mut take = |i: usize| -> std::io::Result<Done> {
            results
                .get_mut(i)
                .and_then(Option::take)
                .unwrap_or_else(|| Err(std::io::Error::other("no result")))
        };
        match take(0) {
            Ok(Done::Got(_, c)) => {
                self.apply_desired_from(c, true);
            }
            Ok(_) => {}
            Err(e) => log::warn!("re-reading the desired state: {e}; keeping the last one"),
        }
        self.reconcile_now(true);
        if let Some(i) = intent {
            if let (Ok(Done::Got(_, c)), false) = (take(i), self.stopping()) {
                let effects = self.relay.on_intent_reread(&c, Timestamp::now());
                self.apply_relay(effects);
            }
        }
        if self.stopping() {
            return;
        }
        if running {
            match take(diagnostics) {
                Ok(Done::Got(k, c)) => self.on_diagnostics_request(&k, c),
                Ok(_) => {}
                Err(e) => log::debug!("re-reading diagnostics requests: {e}"),
            }
        } else {
            let opened = self.nats.opened(
                &super::diagnostics::DIAGNOSTICS_BUCKETS,
                [take(diagnostics), take(diagnostics + 1)],
            );
            self.diagnostics_opened(opened, stop);
            // Just started: the newest request, as at every resync.
            self.reread_diagnostics();
        }
        if let Some(i) = usage {
            let opened = self.nats.opened(&[kv::DEVICE_USAGE], [take(i)]);
            self.usage_opened(opened);
        }
    }

    fn put_op(&self, bucket: &str, key: &str, value: Vec<u8>) -> Op {
        Op::Put {
            bucket: bucket.to_owned(),
            key: key.to_owned(),
            value,
        }
    }

    fn get_op(&self, bucket: &str, key: &str) -> Op {
        Op::Get {
            bucket: bucket.to_owned(),
            key: key.to_owned(),
        }
    }

    /// When the next workload status is due after one published at `now`: at most [`Self::status_interval`] later,
    /// on the latest heartbeat tick within that (the heartbeat's next tick is `next_beat`, or one interval from
    /// `now` when it is due now), so that the two timers share one wake-up of the event loop, and their NATS
    /// requests one of the connection's thread, instead of drifting apart after a status published on an
    /// event. Never later than without the alignment.
    fn next_status(&self, now: Instant, unsettled: bool, next_beat: Instant) -> Instant {
        status_due(
            now,
            self.status_interval(unsettled),
            next_beat,
            self.cfg.heartbeat_interval,
        )
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
        let h = self.next_heartbeat();
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

    /// The next heartbeat (its sequence counted).
    fn next_heartbeat(&mut self) -> Heartbeat {
        self.beat += 1;
        Heartbeat {
            device_id: self.cfg.device_id.clone(),
            at: Timestamp::now(),
            agent_version: self.version.clone(),
            boot_id: crate::device::boot_id(),
            sequence: self.beat,
        }
    }

    /// SIGTERM came (the signal thread set the flag): no further NATS step of the loop starts.
    fn stopping(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Writes device info, the mirrored agent-upgrade status and the status of a system-upgrade run under way again
    /// when NATS no longer has them (an operator's mistake, a bucket restored from a backup): they are otherwise
    /// written only at start-up and on change. `lost` names those the heartbeat's tick found absent ([`Self::tick`]:
    /// read with each heartbeat, in its wake-up), so that a lost key is back within one heartbeat interval.
    fn republish_lost(&mut self, lost: Lost<()>) {
        if lost.info.is_some() {
            log::warn!("device info is missing from NATS: writing it again");
            let mut info = self.info.clone();
            info.published_at = Timestamp::now();
            match put_json(&self.kv, kv::DEVICE_INFO, &self.key, &info) {
                Ok(_) => self.info = info,
                Err(e) => log::warn!("writing device info again: {e}"),
            }
        }
        if let Some((_, s)) = lost.upgrade {
            // As read: the relay still idle with the same status mirrored.
            if self.relay.idle() && self.relay.last_mirrored() == Some(&s) && !self.stopping() {
                log::warn!("the agent-upgrade status is missing from NATS: writing it again");
                if let Err(e) = self.put_upgrade_status(&s) {
                    log::warn!("writing the agent-upgrade status again: {e}");
                }
            }
        }
        if let Some((_, s)) = lost.system {
            // Only the status that was found missing, and only while it is still the one to keep (the heartbeat
            // just acknowledged may have moved the run on and written a newer one).
            if self.system.republishable() == Some(&s) && !self.stopping() {
                let key = kv::run_key(&s.device_id, &s.run_uid);
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

/// The keys a heartbeat's tick reads for [`Agent::republish_lost`], with the value to write again: `At` is each
/// read's place in the batch (`usize`), and after the batch `()` for those found absent.
struct Lost<At> {
    info: Option<At>,
    upgrade: Option<(At, AgentUpgradeStatus)>,
    system: Option<(At, SystemUpgradeStatus)>,
}

impl<At> Default for Lost<At> {
    fn default() -> Self {
        Lost {
            info: None,
            upgrade: None,
            system: None,
        }
    }
}

/// See [`Agent::next_status`]: `now + interval`, moved earlier to the latest heartbeat tick (`next_beat`, then
/// every `beat` after it; one `beat` from `now` when `next_beat` is not after `now`) that is not after it.
fn status_due(now: Instant, interval: Duration, next_beat: Instant, beat: Duration) -> Instant {
    let due = now + interval;
    let tick = if next_beat > now {
        next_beat
    } else {
        now + beat
    };
    if tick > due || beat.is_zero() {
        return due;
    }
    let steps = (due - tick).as_nanos() / beat.as_nanos();
    tick + beat * u32::try_from(steps).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_falls_on_the_latest_heartbeat_tick_within_its_interval() {
        let now = Instant::now();
        let s = Duration::from_secs;
        // Heartbeat and status both every 30 s: a status published on an event 12 s before the next beat is
        // published again with that beat, then with every beat.
        assert_eq!(status_due(now, s(30), now + s(12), s(30)), now + s(12));
        // Due with the beat now (the beat's next tick is one interval away).
        assert_eq!(status_due(now, s(30), now, s(30)), now + s(30));
        assert_eq!(status_due(now, s(30), now - s(1), s(30)), now + s(30));
        // A status every 60 s, heartbeats every 20 s: the latest of the beats at 5, 25, 45 s.
        assert_eq!(status_due(now, s(60), now + s(5), s(20)), now + s(45));
        // No beat within the interval (an unsettled workload's short one): not moved.
        assert_eq!(status_due(now, s(5), now + s(12), s(30)), now + s(5));
        // Never later than the interval.
        for beat in 1..70 {
            for next in 0..70 {
                let d = status_due(now, s(30), now + s(next), s(beat));
                assert!(d <= now + s(30) && d > now, "{beat} {next}");
            }
        }
    }
}
