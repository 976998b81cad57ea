//! The workload worker: one thread that runs reconcile passes, so the event loop (upgrade and system-upgrade
//! relay, status, heartbeats) never waits behind a Podman mutation such as a container stop's grace period.
//!
//! One thread and one pass at a time keep the one-mutation-at-a-time rule; the drain flag is checked before each
//! mutation as before, and [`Worker::finish`] waits for the mutation in progress. Requests made while a pass runs
//! are coalesced: the next pass uses the newest desired state (and compares everything if any of them asked so).
//! The worker remembers the desired state its last pass reached, so a change is compared for the workloads it
//! touched only ([`reconcile::scope`]).

use crate::podman::Podman;
use crate::reconcile::{self, Outcome, Scope};
use fleet_wire::{DeviceId, WorkloadSpec};
use std::sync::atomic::AtomicBool;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

/// The result of one pass, handed to the event loop.
pub type PassResult = Result<Outcome, String>;

/// What a pass is asked for: the desired workloads, and whether to compare everything.
struct Job {
    desired: Vec<WorkloadSpec>,
    full: bool,
}

/// A running workload worker.
pub struct Worker {
    jobs: Option<mpsc::Sender<Job>>,
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
        let (jobs, rx) = mpsc::channel::<Job>();
        let thread = std::thread::Builder::new()
            .name("workloads".into())
            .spawn(move || {
                // The desired state the last pass reached (no error, not interrupted).
                let mut reached: Option<Vec<WorkloadSpec>> = None;
                while let Ok(mut job) = rx.recv() {
                    // Coalesce: only the newest desired state matters.
                    while let Ok(newer) = rx.try_recv() {
                        job = Job {
                            full: job.full || newer.full,
                            desired: newer.desired,
                        };
                    }
                    let base = if job.full { None } else { reached.take() };
                    let scope = reconcile::scope(base.as_deref(), &job.desired);
                    if let Scope::Only(names) = &scope {
                        log::debug!("reconcile pass over {} changed workloads", names.len());
                    }
                    let r = reconcile::reconcile(&podman, &device, &job.desired, &scope, &draining)
                        .map_err(|e| e.to_string());
                    reached = match &r {
                        Ok(out) if out.errors.is_empty() && !out.interrupted => Some(job.desired),
                        _ => None,
                    };
                    done(r);
                }
            })?;
        Ok(Self {
            jobs: Some(jobs),
            thread: Some(thread),
        })
    }

    /// Asks for a pass toward `desired` (after the one in progress, if any). `full`: compare every container
    /// (start-up, resync); otherwise only the workloads that differ from what the last pass reached.
    pub fn request(&self, desired: Vec<WorkloadSpec>, full: bool) {
        if let Some(j) = &self.jobs {
            // The worker only stops after `finish`; a send error then means nothing is left to do.
            let _ = j.send(Job { desired, full });
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
