//! The workload worker: one thread that runs reconcile passes, so the event loop (upgrade and system-upgrade
//! relay, status, heartbeats) never waits behind a Podman mutation such as a container stop's grace period.
//!
//! One thread and one pass at a time keep the one-mutation-at-a-time rule; the drain flag is checked before each
//! mutation as before, and [`Worker::finish`] waits for the mutation in progress. Requests made while a pass runs
//! are coalesced: the next pass uses the newest desired state.

use crate::podman::Podman;
use crate::reconcile::{self, Outcome};
use fleet_wire::{DeviceId, WorkloadSpec};
use std::sync::atomic::AtomicBool;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

/// The result of one pass, handed to the event loop.
pub type PassResult = Result<Outcome, String>;

/// A running workload worker.
pub struct Worker {
    jobs: Option<mpsc::Sender<Vec<WorkloadSpec>>>,
    thread: Option<JoinHandle<()>>,
}

impl Worker {
    /// Starts the worker; `done` receives each pass's result (on the worker thread).
    pub fn spawn(
        podman: Podman,
        device: DeviceId,
        draining: Arc<AtomicBool>,
        done: impl Fn(PassResult) + Send + 'static,
    ) -> std::io::Result<Self> {
        let (jobs, rx) = mpsc::channel::<Vec<WorkloadSpec>>();
        let thread = std::thread::Builder::new()
            .name("workloads".into())
            .spawn(move || {
                while let Ok(mut desired) = rx.recv() {
                    // Coalesce: only the newest desired state matters.
                    while let Ok(newer) = rx.try_recv() {
                        desired = newer;
                    }
                    let r = reconcile::reconcile(&podman, &device, &desired, &draining)
                        .map_err(|e| e.to_string());
                    done(r);
                }
            })?;
        Ok(Self {
            jobs: Some(jobs),
            thread: Some(thread),
        })
    }

    /// Asks for a pass toward `desired` (after the one in progress, if any).
    pub fn request(&self, desired: Vec<WorkloadSpec>) {
        if let Some(j) = &self.jobs {
            // The worker only stops after `finish`; a send error then means nothing is left to do.
            let _ = j.send(desired);
        }
    }

    /// Admits no new pass and waits for the one in progress (which, with the drain flag set, stops before its
    /// next mutation).
    pub fn finish(&mut self) {
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                log::error!("the workload worker panicked");
            }
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.finish();
    }
}
