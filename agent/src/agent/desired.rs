//! The desired state as the agent takes it (newer revisions only; a bad write never removes workloads, and one
//! this agent cannot honour is reported in the status's `desiredError`), the workload worker's passes toward it,
//! and the workload status published from what Podman reports.

use super::{put_json, Agent};
use crate::nats_kv::{Change, Value};
use crate::reconcile;
use crate::workload_worker::PassResult;
use fleet_wire::kv;
use fleet_wire::{BoundedText, DesiredState, DeviceWorkloadStatus, Timestamp, Version};

/// Most characters of the decoder's own words in a `desiredError` (the whole text stays within its bound, so the
/// generation kept is never cut off).
const DECODE_ERROR_CHARS: usize = 640;

/// The status's `desiredError` for a desired state (revision `revision`) that `version` could not take, while it
/// keeps running `generation`: names the field (serde's error says `unknown field `x``) or the invalid value.
pub(crate) fn cannot_honour(
    revision: u64,
    version: &Version,
    error: &str,
    generation: u64,
) -> BoundedText {
    let mut why: String = error.chars().take(DECODE_ERROR_CHARS).collect();
    if error.chars().count() > DECODE_ERROR_CHARS {
        why.push('…');
    }
    BoundedText::lossy(format!(
        "desired state revision {revision} cannot be honoured by agent {version}: {why}; keeping generation {generation}"
    ))
}

impl Agent {
    /// Takes a desired-state value; returns true when it changed what the agent wants.
    pub(super) fn apply_desired(&mut self, c: Change) -> bool {
        self.apply_desired_from(c, false)
    }

    /// `reread`: the value comes from a full read, so any other revision counts (a re-created bucket restarts
    /// its revisions); watch events only count when newer.
    /// A desired state it could not take marks the status stale too (its `desiredError` changed), without a pass.
    pub(super) fn apply_desired_from(&mut self, c: Change, reread: bool) -> bool {
        let error_before = self.desired_error.clone();
        let changed = self.take_desired(c, reread);
        self.status_stale |= changed || self.desired_error != error_before;
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
                self.desired_error = None;
                self.desired_taken = true;
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
                    self.desired_error = None;
                    self.desired_taken = true;
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
                    // Keep running what we have: a bad write (or one from a newer operator, with a field this
                    // agent does not know) must not remove workloads, and is reported so a person sees it.
                    let why =
                        cannot_honour(c.revision, &self.version, &e.to_string(), self.generation);
                    log::error!("{}", why.as_str());
                    self.desired_error = Some(why);
                    false
                }
            },
        }
    }

    /// Asks the workload worker for a pass toward the current desired state (`full`: compare every container,
    /// else only what changed since the last pass); its result arrives as `Event::Reconciled`.
    /// None runs before a desired state was taken (`desired_taken`): an empty one would remove every
    /// container.
    pub(super) fn reconcile_now(&mut self, full: bool) {
        if !self.desired_taken {
            log::debug!("no desired state taken since start: no pass");
            return;
        }
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
        let Some((s, unsettled)) = self.status_now() else {
            return false;
        };
        let written = put_json(&self.kv, kv::WORKLOAD_STATUS, &self.key, &s);
        self.status_written(&s, written);
        unsettled
    }

    /// The workload status as Podman shows it now, and whether a workload is unsettled (see
    /// [`Self::publish_status`]); `None` without Podman or when it could not be listed (logged).
    pub(super) fn status_now(&mut self) -> Option<(DeviceWorkloadStatus, bool)> {
        let p = self.podman.clone()?;
        let mut observed = match p.list_managed() {
            Ok(o) => o,
            Err(e) => {
                log::warn!("workload status: {e}");
                return None;
            }
        };
        p.count_restarts(&mut observed);
        self.oom.observe(crate::oom::read_kills(), &mut observed);
        let health = self.observe_health(&p, &observed);
        let now = Timestamp::now();
        let s = DeviceWorkloadStatus {
            device_id: self.cfg.device_id.clone(),
            generation: self.generation,
            at: now,
            workloads: reconcile::statuses(&self.desired, &observed, &self.errors, &health, now),
            desired_error: self.desired_error.clone(),
        };
        let unsettled = reconcile::unsettled(&self.published_restarts, &s.workloads);
        Some((s, unsettled))
    }

    /// Takes the outcome of writing status `s`.
    pub(super) fn status_written(
        &mut self,
        s: &DeviceWorkloadStatus,
        written: std::io::Result<u64>,
    ) {
        match written {
            Ok(_) => {
                self.status_stale = false;
                self.published_restarts = reconcile::restart_counts(&s.workloads);
            }
            Err(e) => log::warn!("publishing workload status: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_desired_state_it_cannot_honour_is_worded_within_bounds() {
        let v = Version::try_from("1.4.0").expect("version");
        let e = serde_json::from_str::<DesiredState>(
            r#"{"deviceId":"device-1","generation":3,"workloads":[{"name":"web","image":"x:1","futureField":1}]}"#,
        )
        .expect_err("unknown field");
        let t = cannot_honour(8, &v, &e.to_string(), 2);
        assert!(
            t.as_str().starts_with(
                "desired state revision 8 cannot be honoured by agent 1.4.0: unknown field `futureField`"
            ),
            "{}",
            t.as_str()
        );
        assert!(t.as_str().ends_with("; keeping generation 2"));
        let long = cannot_honour(8, &v, &"x".repeat(5000), 2);
        assert!(long.as_str().ends_with("…; keeping generation 2"));
    }
}
