//! The event loop's side of workload health checks: with each workload status it hands the health worker the
//! containers the agent checks, finds command checks Podman's timer never ran (and has the worker run them from
//! then on), and reads Podman's last check of an unhealthy command-checked container for the status's error.

use super::{Agent, Event};
use crate::health::{self, Findings, Probed, Target};
use crate::health_worker::HealthWorker;
use crate::podman::{Observed, Podman};
use fleet_wire::HealthState;
use std::collections::{BTreeMap, BTreeSet};

/// What the agent keeps of workload health between two statuses.
#[derive(Default)]
pub(super) struct Health {
    /// Runs the agent's checks; started with the first one.
    pub(super) worker: Option<HealthWorker>,
    /// What the worker last found, per container.
    pub(super) found: Findings,
    /// The targets the worker was last given.
    sent: Vec<Target>,
    /// Containers whose command check Podman's timer never ran: the worker runs it through Podman's API.
    driven: BTreeSet<String>,
    /// Containers whose health log showed that Podman runs their check: not asked again.
    timer_seen: BTreeSet<String>,
    /// Unhealthy command-checked containers: Podman's latest failed check, in words.
    podman_errors: BTreeMap<String, String>,
}

impl Agent {
    /// Updates what the agent knows of its workloads' health from the containers just listed and returns the
    /// findings the status reports (the worker's, and Podman's failed checks).
    pub(super) fn observe_health(&mut self, p: &Podman, observed: &[Observed]) -> Findings {
        let h = &mut self.health;
        let now = fleet_wire::Timestamp::now().unix_ms() / 1000;
        let now = i64::try_from(now).unwrap_or(i64::MAX);
        let ids: BTreeSet<&str> = observed.iter().map(|o| o.id.as_str()).collect();
        h.driven.retain(|id| ids.contains(id.as_str()));
        h.timer_seen.retain(|id| ids.contains(id.as_str()));
        let mut errors = BTreeMap::new();
        for w in &self.desired {
            let Some(check) = &w.health_check else {
                continue;
            };
            let Some(o) = health::running_of(w, observed) else {
                continue;
            };
            if !check.runs_in_podman() {
                continue;
            }
            let asked = h.driven.contains(&o.id) || h.timer_seen.contains(&o.id);
            if !asked && health::timer_suspect(check, o, now) {
                match p.health_log(&o.id) {
                    Ok(log) if log.runs == 0 => {
                        log::warn!(
                            "Podman never ran the health check of {} (its systemd timer did not start: no systemd \
                             for Podman?); the agent runs it through Podman's API every {} s",
                            w.name.as_str(),
                            check.interval_seconds
                        );
                        h.driven.insert(o.id.clone());
                    }
                    Ok(_) => {
                        h.timer_seen.insert(o.id.clone());
                    }
                    Err(e) => log::debug!("health log of {}: {e}", w.name.as_str()),
                }
            }
            if o.health == Some(HealthState::Unhealthy) {
                // Read once per unhealthy spell: the error stays until the container is healthy again.
                let why = match h.podman_errors.get(&o.id) {
                    Some(why) => Some(why.clone()),
                    None => match p.health_log(&o.id) {
                        // Podman records every failure as exit code 1 (whatever the command's own): its output
                        // is what says why.
                        Ok(log) => log.last.map(|(_, out)| {
                            if out.is_empty() {
                                "the check command failed".to_owned()
                            } else {
                                format!("the check command failed: {out}")
                            }
                        }),
                        Err(e) => {
                            log::debug!("health log of {}: {e}", w.name.as_str());
                            None
                        }
                    },
                };
                if let Some(why) = why {
                    errors.insert(o.id.clone(), why);
                }
            }
        }
        h.podman_errors = errors;
        let targets = health::targets(&self.desired, observed, &h.driven);
        if targets != h.sent {
            // Started with the first check it has to run: a device without any costs no thread.
            if h.worker.is_none() {
                let tx = self.tx.clone();
                match HealthWorker::spawn(p.clone(), move |f| {
                    let _ = tx.send(Event::Health(f));
                }) {
                    Ok(w) => h.worker = Some(w),
                    Err(e) => log::error!("starting the health worker: {e}"),
                }
            }
            if let Some(worker) = &h.worker {
                worker.set(targets.clone());
                h.sent = targets;
            }
        }
        let mut out = h.found.clone();
        for (id, why) in &h.podman_errors {
            out.insert(
                id.clone(),
                Probed {
                    state: None,
                    error: Some(why.clone()),
                },
            );
        }
        out
    }
}
