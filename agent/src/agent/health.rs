//! The event loop's side of workload health checks: with each workload status it hands the health worker the
//! containers the agent checks, finds command checks Podman's timer does not run (two looks at the health log one
//! [`health::timer_window`] apart; the worker runs them from then on), and reads Podman's last check of an
//! unhealthy command-checked container for the status's error.

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
    /// Containers whose command check Podman's timer does not run: the worker runs it through Podman's API.
    driven: BTreeSet<String>,
    /// Command-checked containers whose health log the agent looked at once: when (Unix seconds) and the latest
    /// run it held then. Looked at again one window later.
    looked: BTreeMap<String, (i64, Option<String>)>,
    /// Containers whose health log showed a run Podman's timer made: not asked again.
    timer_seen: BTreeSet<String>,
    /// Unhealthy command-checked containers: Podman's latest failed check, in words.
    podman_errors: BTreeMap<String, String>,
}

impl Agent {
    /// Updates what the agent knows of its workloads' health from the containers just listed and returns the
    /// findings the status reports (the worker's, and Podman's failed checks).
    pub(super) fn observe_health(&mut self, p: &Podman, observed: &[Observed]) -> Findings {
        let h = &mut self.health;
        let now = i64::try_from(fleet_wire::Timestamp::now().unix_ms() / 1000).unwrap_or(i64::MAX);
        let ids: BTreeSet<&str> = observed.iter().map(|o| o.id.as_str()).collect();
        h.driven.retain(|id| ids.contains(id.as_str()));
        h.timer_seen.retain(|id| ids.contains(id.as_str()));
        h.looked.retain(|id, _| ids.contains(id.as_str()));
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
            let decided = h.driven.contains(&o.id) || h.timer_seen.contains(&o.id);
            let first = h.looked.get(&o.id).cloned();
            let due = first
                .as_ref()
                .is_none_or(|(at, _)| now - at > health::timer_window(check));
            if !decided && due {
                match p.health_log(&o.id) {
                    Err(e) => log::debug!("health log of {}: {e}", w.name.as_str()),
                    Ok(log) => match first {
                        None => {
                            h.looked.insert(o.id.clone(), (now, log.last_start));
                        }
                        Some((_, before)) => {
                            h.looked.remove(&o.id);
                            if health::podman_runs_it(before.as_deref(), log.last_start.as_deref())
                            {
                                h.timer_seen.insert(o.id.clone());
                            } else {
                                log::warn!(
                                    "Podman did not run the health check of {} by itself (no systemd timer: no \
                                     systemd for Podman?); the agent runs it through Podman's API every {} s",
                                    w.name.as_str(),
                                    check.interval_seconds
                                );
                                h.driven.insert(o.id.clone());
                            }
                        }
                    },
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
