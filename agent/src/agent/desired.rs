//! The desired state as the agent takes it (newer revisions only; a bad write never removes workloads), the
//! workload worker's passes toward it, and the workload status published from what Podman reports.

use super::{put_json, Agent};
use crate::nats_kv::{Change, Value};
use crate::reconcile;
use crate::workload_worker::PassResult;
use fleet_wire::kv;
use fleet_wire::{DesiredState, DeviceWorkloadStatus, Timestamp};

impl Agent {
    /// Takes a desired-state value; returns true when it changed what the agent wants.
    pub(super) fn apply_desired(&mut self, c: Change) -> bool {
        self.apply_desired_from(c, false)
    }

    /// `reread`: the value comes from a full read, so any other revision counts (a re-created bucket restarts
    /// its revisions); watch events only count when newer.
    pub(super) fn apply_desired_from(&mut self, c: Change, reread: bool) -> bool {
        let changed = self.take_desired(c, reread);
        self.status_stale |= changed;
        changed
    }

    pub(super) fn take_desired(&mut self, c: Change, reread: bool) -> bool {
        let stale = match self.desired_rev {
            Some(r) if reread => c.revision == r,
            Some(r) => c.revision <= r,
            None => false,
        };
        if stale {
            return false;
        }
        self.desired_rev = Some(c.revision);
        match c.value {
            Value::Absent => {
                log::info!("no desired state for this device (revision {})", c.revision);
                self.desired.clear();
                true
            }
            Value::Put(bytes) => match serde_json::from_slice::<DesiredState>(&bytes) {
                Ok(d) if d.device_id == self.cfg.device_id => {
                    crate::timing::mark("decoded", format_args!("rev={}", c.revision));
                    log::info!(
                        "desired state generation {} with {} workloads (revision {})",
                        d.generation,
                        d.workloads.len(),
                        c.revision
                    );
                    self.generation = d.generation;
                    self.desired = d.workloads;
                    true
                }
                Ok(d) => {
                    log::error!(
                        "desired state is for device {}, not this one; ignored",
                        d.device_id
                    );
                    false
                }
                Err(e) => {
                    // Keep running what we have: a bad write must not remove workloads.
                    log::error!(
                        "desired state revision {} is invalid; keeping the last valid one: {e}",
                        c.revision
                    );
                    false
                }
            },
        }
    }

    /// Asks the workload worker for a pass toward the current desired state (`full`: compare every container,
    /// else only what changed since the last pass); its result arrives as `Event::Reconciled`.
    pub(super) fn reconcile_now(&mut self, full: bool) {
        if let Some(w) = &self.worker {
            w.request(self.desired.clone(), full);
        }
    }

    /// Takes a pass's result; true when it may have changed what the workload status shows.
    pub(super) fn on_reconciled(&mut self, r: PassResult) -> bool {
        match r {
            Ok(out) => {
                if out.mutations > 0 {
                    log::info!(
                        "reconcile: {} mutations, {} errors",
                        out.mutations,
                        out.errors.len()
                    );
                }
                let changed = out.mutations > 0 || out.errors != self.errors;
                self.errors = out.errors;
                changed
            }
            Err(e) => {
                log::warn!("reconcile: {e}");
                true
            }
        }
    }

    /// Publishes the workload status; true when a workload is unsettled (restarted since the last one and not
    /// reported crash-looping yet), so the caller publishes again after [`reconcile::UNSETTLED_STATUS_INTERVAL`].
    pub(super) fn publish_status(&mut self) -> bool {
        let Some(p) = self.podman.clone() else {
            return false;
        };
        let mut observed = match p.list_managed() {
            Ok(o) => o,
            Err(e) => {
                log::warn!("workload status: {e}");
                return false;
            }
        };
        p.count_restarts(&mut observed);
        let health = self.observe_health(&p, &observed);
        let now = Timestamp::now();
        let s = DeviceWorkloadStatus {
            device_id: self.cfg.device_id.clone(),
            generation: self.generation,
            at: now,
            workloads: reconcile::statuses(&self.desired, &observed, &self.errors, &health, now),
            desired_error: None,
        };
        let unsettled = reconcile::unsettled(&self.published_restarts, &s.workloads);
        match put_json(&self.kv, kv::WORKLOAD_STATUS, &self.key, &s) {
            Ok(_) => {
                self.status_stale = false;
                self.published_restarts = reconcile::restart_counts(&s.workloads);
            }
            Err(e) => log::warn!("publishing workload status: {e}"),
        }
        unsettled
    }
}
