//! The workload worker: one thread that runs reconcile passes, so the event loop (upgrade and system-upgrade
//! relay, status, heartbeats) never waits behind a Podman mutation such as a container stop's grace period.
//!
//! One thread and one pass at a time keep the one-mutation-at-a-time rule; the drain flag is checked before each
//! mutation as before, and [`Worker::finish`] waits for the mutation in progress. Requests made while a pass runs
//! are coalesced: the next pass uses the newest desired state (and compares everything if any of them asked so).
//! A request with another desired state also abandons an image pull in progress, so a fix never waits behind a
//! pull of the image it replaces. The worker remembers the desired state its last pass reached, so a change is
//! compared for the workloads it touched only ([`reconcile::scope`]), and the specs that failed
//! ([`reconcile::Backoff`]).

use crate::podman::Podman;
use crate::reconcile::{self, Backoff, Outcome, Scope};
use fleet_wire::{DeviceId, WorkloadSpec};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;

/// The result of one pass, handed to the event loop.
pub type PassResult = Result<Outcome, String>;

/// What a pass is asked for: the desired workloads, and whether to compare everything.
struct Job {
    desired: Vec<WorkloadSpec>,
    full: bool,
}

/// The request waiting for the worker (at most one: newer requests merge into it).
#[derive(Default)]
struct Queue {
    next: Option<Job>,
    closed: bool,
}

#[derive(Default)]
struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        // A poisoned lock only means a panic elsewhere; the queue itself is always consistent.
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The next job, or `None` once closed.
    fn take(&self) -> Option<Job> {
        let mut q = self.lock();
        loop {
            if q.closed {
                return None;
            }
            if let Some(job) = q.next.take() {
                return Some(job);
            }
            q = self.wake.wait(q).unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// True when a waiting request wants another desired state than `desired`.
    fn superseded(&self, desired: &[WorkloadSpec]) -> bool {
        let q = self.lock();
        q.closed || q.next.as_ref().is_some_and(|j| j.desired != desired)
    }
}

/// A running workload worker.
pub struct Worker {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Worker {
    /// Starts the worker; `done` receives each pass's result (on the worker thread).
    /// `secrets` reads the device's delivered secrets (`device-secrets/<device>`) for a pass that needs them.
    pub fn spawn(
        podman: Podman,
        device: DeviceId,
        draining: Arc<AtomicBool>,
        secrets: Box<crate::device_secrets::Read>,
        done: impl Fn(PassResult) + Send + 'static,
    ) -> std::io::Result<Self> {
        let shared = Arc::new(Shared::default());
        let mine = shared.clone();
        let thread = std::thread::Builder::new()
            .name("workloads".into())
            .spawn(move || {
                // The desired state the last pass reached (no error, not interrupted).
                let mut reached: Option<Vec<WorkloadSpec>> = None;
                let mut backoff = Backoff::default();
                // Unused Podman secrets are looked for after the first pass and after each that mutated.
                let mut collect = true;
                while let Some(job) = mine.take() {
                    let base = if job.full { None } else { reached.take() };
                    let scope = reconcile::scope(base.as_deref(), &job.desired);
                    if let Scope::Only(names) = &scope {
                        log::debug!("reconcile pass over {} changed workloads", names.len());
                    }
                    let cancel =
                        || draining.load(Ordering::SeqCst) || mine.superseded(&job.desired);
                    let r = reconcile::reconcile(
                        &podman,
                        &device,
                        &job.desired,
                        &scope,
                        &draining,
                        &mut backoff,
                        &*secrets,
                        &cancel,
                    )
                    .map_err(|e| e.to_string());
                    collect |= matches!(&r, Ok(out) if out.mutations > 0);
                    // A secret removal is a mutation: none once draining.
                    let ended = matches!(&r, Ok(out) if !out.interrupted)
                        && !draining.load(Ordering::SeqCst);
                    let goal = matches!(&r, Ok(out) if out.errors.is_empty() && !out.interrupted);
                    done(r);
                    if collect && ended {
                        collect = !reconcile::collect_secrets(&podman, &job.desired);
                    }
                    reached = goal.then_some(job.desired);
                }
            })?;
        Ok(Self {
            shared,
            thread: Some(thread),
        })
    }

    /// Asks for a pass toward `desired` (after the one in progress, if any). `full`: compare every container
    /// (start-up, resync); otherwise only the workloads that differ from what the last pass reached.
    pub fn request(&self, desired: Vec<WorkloadSpec>, full: bool) {
        let mut q = self.shared.lock();
        if q.closed {
            return;
        }
        let full = full || q.next.as_ref().is_some_and(|j| j.full);
        q.next = Some(Job { desired, full });
        self.shared.wake.notify_one();
    }

    /// Admits no new pass and waits for the one in progress (which, with the drain flag set, stops before its
    /// next mutation).
    pub fn finish(&mut self) {
        self.shared.lock().closed = true;
        self.shared.wake.notify_one();
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
