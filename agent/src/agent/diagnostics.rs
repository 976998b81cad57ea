//! The event loop's part in diagnostics ([`crate::diagnostics`]): open the optional buckets (an older operator
//! has none: logged once, looked for again at each resync), watch this device's requests, and hand each new one
//! to the diagnostics worker. Nothing here waits for a collection.

use super::{Agent, Event};
use crate::diagnostics::worker::{Context, Worker};
use crate::diagnostics::Answering;
use crate::nats_kv::{Buckets, Change, NatsError};

/// The buckets diagnostics need, both (the request and the bundle).
pub(super) const DIAGNOSTICS_BUCKETS: [&str; 2] = [kv::DIAGNOSTICS_REQUEST, kv::DIAGNOSTICS_BUNDLE];
use fleet_wire::kv;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// The diagnostics state of the agent.
pub(super) struct Diagnostics {
    answering: Answering,
    /// The buckets and the worker, once the buckets exist.
    running: Option<(Buckets, Worker)>,
    missing_logged: bool,
}

impl Diagnostics {
    pub(super) fn new(device: fleet_wire::DeviceId) -> Self {
        Self {
            answering: Answering::new(device),
            running: None,
            missing_logged: false,
        }
    }
}

impl Agent {
    /// Starts answering diagnostics requests once their buckets exist; called at start and at each resync.
    pub(super) fn start_diagnostics(&mut self, stop: &Arc<AtomicBool>) {
        if self.diagnostics.running.is_some() {
            return;
        }
        let opened = self.nats.open_buckets(&DIAGNOSTICS_BUCKETS);
        self.diagnostics_opened(opened, stop);
    }

    /// Whether diagnostics requests are answered (their buckets exist and the worker runs).
    pub(super) fn diagnostics_running(&self) -> bool {
        self.diagnostics.running.is_some()
    }

    /// Starts answering diagnostics requests with the buckets opened (or says once why not).
    pub(super) fn diagnostics_opened(
        &mut self,
        opened: Result<Buckets, NatsError>,
        stop: &Arc<AtomicBool>,
    ) {
        if self.diagnostics.running.is_some() {
            return;
        }
        let kv = match opened {
            Ok(kv) => kv,
            Err(e) => {
                if !self.diagnostics.missing_logged {
                    log::info!(
                        "diagnostics requests are not answered: {e}; looking again at each resync"
                    );
                    self.diagnostics.missing_logged = true;
                }
                return;
            }
        };
        let secrets = crate::device_secrets::from_kv(self.kv.clone(), self.cfg.device_id.clone());
        let auth = self.cfg.nats.auth.clone();
        let ctx = Context {
            device: self.cfg.device_id.clone(),
            podman: self.podman.clone(),
            updater: self.updater.clone(),
            kv: kv.clone(),
            values: Box::new(move || crate::diagnostics::known_values(&*secrets, &auth)),
            draining: self.draining.clone(),
        };
        let worker = match Worker::spawn(ctx) {
            Ok(w) => w,
            Err(e) => {
                log::warn!("starting the diagnostics worker: {e}; trying again at the next resync");
                return;
            }
        };
        let tx = self.tx.clone();
        if let Err(e) = kv.watch_keys(
            kv::DIAGNOSTICS_REQUEST,
            &kv::device_runs_filter(&self.cfg.device_id),
            stop.clone(),
            move |k, c| tx.send(Event::Diagnostics(k, c)).is_ok(),
        ) {
            log::warn!("watching diagnostics requests: {e}; trying again at the next resync");
            return;
        }
        if self.diagnostics.missing_logged {
            log::info!("the diagnostics buckets exist now: answering diagnostics requests");
        }
        self.diagnostics.running = Some((kv, worker));
    }

    /// A change of `diagnostics-request/<key>`: a new request of this device goes to the worker.
    pub(super) fn on_diagnostics_request(&mut self, key: &str, c: Change) {
        let Some((_, worker)) = &self.diagnostics.running else {
            return;
        };
        let desired = self.desired.iter().map(|w| w.name.clone()).collect();
        let Some(job) = self.diagnostics.answering.admit(key, &c, desired) else {
            return;
        };
        if let Err(job) = worker.submit(job) {
            log::warn!(
                "diagnostics request {}: the worker is busy with earlier requests; it is answered when it changes or at a resync",
                job.request_id
            );
            self.diagnostics.answering.forget(&job.request_id);
        }
    }

    /// At a resync: the newest request of this device again (one missed by a lost watch).
    pub(super) fn reread_diagnostics(&mut self) {
        let Some((kv, _)) = &self.diagnostics.running else {
            return;
        };
        match kv.get_keyed(
            kv::DIAGNOSTICS_REQUEST,
            &kv::device_runs_filter(&self.cfg.device_id),
        ) {
            Ok((k, c)) => self.on_diagnostics_request(&k, c),
            Err(e) => log::debug!("re-reading diagnostics requests: {e}"),
        }
    }
}
