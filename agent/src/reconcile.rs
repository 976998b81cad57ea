//! Reconciliation: a pure plan from desired workloads and observed containers to actions, and its execution
//! one mutation at a time (each checked against the drain flag first). A pass compares either everything or, for
//! a desired-state change, only the workloads the change touched ([`Scope`]), so a one-workload change costs the
//! same with 50 unchanged workloads present as with none.

use crate::podman::{Observed, Podman};
use fleet_wire::workload::{LABEL_DEVICE, LABEL_SPEC_DIGEST, LABEL_WORKLOAD};
use fleet_wire::{
    BoundedText, DeviceId, RestartPolicy, WorkloadName, WorkloadSpec, WorkloadState, WorkloadStatus,
};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};

/// One mutation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Stop and remove a managed container (gone from the desired state, changed spec, other device, duplicate).
    Remove {
        /// Container id.
        id: String,
        /// Why, for the log.
        why: &'static str,
    },
    /// Create and start the container of a workload.
    Create(WorkloadName),
    /// Start an existing container of a workload that is not running but should be.
    Start {
        /// Container id.
        id: String,
        /// The workload.
        name: WorkloadName,
    },
}

/// Which workloads a pass compares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Every managed container against the whole desired state (start-up, resync, after a pass that did not
    /// reach its goal): also restarts exited containers and removes strays, duplicates and other devices' ones.
    All,
    /// Only these workloads' containers against their desired specs: a desired-state change that touched them
    /// and nothing else, after a pass that reached the previous desired state.
    Only(BTreeSet<WorkloadName>),
}

/// Most workloads a scoped pass observes one by one (one Podman list call each); with more, one full list is
/// cheaper.
pub const SCOPED_MAX: usize = 4;

/// The workloads that differ between `old` and `new`: added, removed, or with another spec digest. Pure.
pub fn changed(old: &[WorkloadSpec], new: &[WorkloadSpec]) -> BTreeSet<WorkloadName> {
    let digests = |ws: &[WorkloadSpec]| -> BTreeMap<WorkloadName, String> {
        ws.iter()
            .map(|w| (w.name.clone(), w.digest().to_string()))
            .collect()
    };
    let (old, new) = (digests(old), digests(new));
    let mut out: BTreeSet<WorkloadName> = old
        .iter()
        .filter(|(n, d)| new.get(*n) != Some(*d))
        .map(|(n, _)| n.clone())
        .collect();
    out.extend(new.keys().filter(|n| !old.contains_key(*n)).cloned());
    out
}

/// The scope of a pass toward `desired`. `reached` is the desired state that the last pass reached (every action
/// done, no error, not interrupted), or `None` when no pass did or a full pass is asked for. Pure.
pub fn scope(reached: Option<&[WorkloadSpec]>, desired: &[WorkloadSpec]) -> Scope {
    match reached {
        None => Scope::All,
        Some(r) => {
            let names = changed(r, desired);
            if names.len() > SCOPED_MAX {
                Scope::All
            } else {
                Scope::Only(names)
            }
        }
    }
}

/// Plans the actions that make `observed` (managed containers only) match `desired`. Pure.
///
/// A container whose spec-digest label equals the desired spec's digest is kept as it is (an agent restart
/// therefore restarts nothing); any other managed container is removed, removals first so a replacement can
/// reuse the container name.
pub fn plan(device: &DeviceId, desired: &[WorkloadSpec], observed: &[Observed]) -> Vec<Action> {
    let mut removes = Vec::new();
    let mut rest = Vec::new();
    let mut kept: BTreeMap<&str, &Observed> = BTreeMap::new();
    let want: BTreeMap<&str, &WorkloadSpec> =
        desired.iter().map(|w| (w.name.as_str(), w)).collect();
    for o in observed {
        let label = |k: &str| o.labels.get(k).map(String::as_str);
        let workload = label(LABEL_WORKLOAD).unwrap_or("");
        let why = if label(LABEL_DEVICE) != Some(device.as_str()) {
            Some("labelled for another device")
        } else if let Some(spec) = want.get(workload) {
            if label(LABEL_SPEC_DIGEST) != Some(spec.digest().as_str()) {
                Some("spec changed")
            } else if kept.contains_key(workload) {
                Some("duplicate")
            } else {
                kept.insert(workload, o);
                None
            }
        } else {
            Some("not in the desired state")
        };
        if let Some(why) = why {
            removes.push(Action::Remove {
                id: o.id.clone(),
                why,
            });
        }
    }
    for w in desired {
        match kept.get(w.name.as_str()) {
            None => rest.push(Action::Create(w.name.clone())),
            Some(o) if should_start(o, w.restart_policy) => rest.push(Action::Start {
                id: o.id.clone(),
                name: w.name.clone(),
            }),
            Some(_) => {}
        }
    }
    removes.extend(rest);
    removes
}

fn should_start(o: &Observed, policy: RestartPolicy) -> bool {
    match o.state.as_str() {
        "created" | "configured" => true,
        // Podman restarts these itself; after a reboot of Podman they may be left exited.
        "exited" | "stopped" => matches!(policy, RestartPolicy::Always),
        _ => false,
    }
}

/// The outcome of one reconcile pass.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Mutations performed.
    pub mutations: usize,
    /// Per-workload errors of this pass.
    pub errors: BTreeMap<WorkloadName, String>,
    /// True when the pass stopped early because the agent is draining.
    pub interrupted: bool,
}

/// Runs one reconcile pass over `scope`. Before each mutation it checks `draining`: once set, no new mutation
/// starts, and the one in progress finishes (the caller waits for this function to return).
pub fn reconcile(
    podman: &Podman,
    device: &DeviceId,
    desired: &[WorkloadSpec],
    scope: &Scope,
    draining: &AtomicBool,
) -> Result<Outcome, crate::podman::PodmanError> {
    let (observed, actions) = match scope {
        Scope::All => {
            let observed = podman.list_managed()?;
            let actions = plan(device, desired, &observed);
            (observed, actions)
        }
        Scope::Only(names) => {
            let mut observed = Vec::new();
            for n in names {
                observed.extend(podman.list_workload(n)?);
            }
            // The plan is per workload name, so planning the touched names alone gives exactly the full plan's
            // actions for them.
            let touched: Vec<WorkloadSpec> = desired
                .iter()
                .filter(|w| names.contains(&w.name))
                .cloned()
                .collect();
            let actions = plan(device, &touched, &observed);
            (observed, actions)
        }
    };
    for a in &actions {
        if let Action::Create(name) = a {
            crate::timing::mark("decided", format_args!("workload={}", name.as_str()));
        }
    }
    let mut out = Outcome::default();
    let by_name: BTreeMap<&str, &WorkloadSpec> =
        desired.iter().map(|w| (w.name.as_str(), w)).collect();
    for a in actions {
        if draining.load(Ordering::SeqCst) {
            out.interrupted = true;
            break;
        }
        out.mutations += 1;
        match a {
            Action::Remove { id, why } => {
                log::info!("removing container {id}: {why}");
                if let Err(e) = podman.remove(&id) {
                    log::warn!("remove {id}: {e}");
                    if let Some(w) = observed
                        .iter()
                        .find(|o| o.id == id)
                        .and_then(|o| o.labels.get(LABEL_WORKLOAD))
                        .and_then(|w| WorkloadName::try_from(w.as_str()).ok())
                    {
                        out.errors.insert(w, e.to_string());
                    }
                }
            }
            Action::Create(name) => {
                let Some(spec) = by_name.get(name.as_str()) else {
                    continue;
                };
                log::info!(
                    "creating container {} ({})",
                    name.container_name(),
                    spec.image
                );
                let r = podman.create(device, spec).and_then(|id| {
                    if draining.load(Ordering::SeqCst) {
                        // Created but not started: the next agent starts it.
                        return Ok(());
                    }
                    podman.start(&id)?;
                    crate::timing::mark("started", format_args!("workload={}", name.as_str()));
                    Ok(())
                });
                if let Err(e) = r {
                    log::warn!("create {}: {e}", name.as_str());
                    out.errors.insert(name, e.to_string());
                }
            }
            Action::Start { id, name } => {
                log::info!("starting container {id} ({})", name.as_str());
                if let Err(e) = podman.start(&id) {
                    log::warn!("start {}: {e}", name.as_str());
                    out.errors.insert(name, e.to_string());
                }
            }
        }
    }
    Ok(out)
}

/// Per-workload status from the desired state, the observed containers and the last pass's errors.
pub fn statuses(
    desired: &[WorkloadSpec],
    observed: &[Observed],
    errors: &BTreeMap<WorkloadName, String>,
) -> Vec<WorkloadStatus> {
    desired
        .iter()
        .map(|w| {
            let digest = w.digest();
            let o = observed.iter().find(|o| {
                o.labels.get(LABEL_WORKLOAD).map(String::as_str) == Some(w.name.as_str())
                    && o.labels.get(LABEL_SPEC_DIGEST).map(String::as_str) == Some(digest.as_str())
            });
            let error = errors.get(&w.name).map(BoundedText::lossy);
            let state = match (o, &error) {
                (_, Some(_)) => WorkloadState::Failed,
                (None, None) => WorkloadState::Missing,
                (Some(o), None) => match o.state.as_str() {
                    "running" => WorkloadState::Running,
                    "exited" | "stopped" => WorkloadState::Exited,
                    _ => WorkloadState::Starting,
                },
            };
            WorkloadStatus {
                name: w.name.clone(),
                state,
                container_id: o.map(|o| o.id.clone()),
                spec_digest: o.map(|_| digest.clone()),
                error,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_wire::fixtures;
    use fleet_wire::workload::LABEL_MANAGED;

    fn observed(id: &str, w: &WorkloadSpec, device: &str, state: &str) -> Observed {
        let labels = BTreeMap::from([
            (LABEL_MANAGED.to_string(), "true".to_string()),
            (LABEL_WORKLOAD.to_string(), w.name.as_str().to_string()),
            (LABEL_DEVICE.to_string(), device.to_string()),
            (LABEL_SPEC_DIGEST.to_string(), w.digest().to_string()),
        ]);
        Observed {
            id: id.into(),
            name: w.name.container_name(),
            labels,
            state: state.into(),
            started_at: 1,
        }
    }

    #[test]
    fn plan_table() {
        let d = fixtures::device();
        let web = fixtures::workload("web");
        let db = fixtures::workload("db");
        let mut web2 = web.clone();
        web2.env.insert("X".into(), "1".into());
        let name = |s: &str| WorkloadName::try_from(s).expect("name");
        let rm = |id: &str, why| Action::Remove { id: id.into(), why };
        let cases: Vec<(Vec<WorkloadSpec>, Vec<Observed>, Vec<Action>)> = vec![
            // Nothing observed: create everything.
            (
                vec![web.clone(), db.clone()],
                vec![],
                vec![Action::Create(name("web")), Action::Create(name("db"))],
            ),
            // Up to date and running: nothing (an agent restart touches nothing).
            (
                vec![web.clone()],
                vec![observed("1", &web, "device-1", "running")],
                vec![],
            ),
            // Spec changed: replace (remove first).
            (
                vec![web2.clone()],
                vec![observed("1", &web, "device-1", "running")],
                vec![rm("1", "spec changed"), Action::Create(name("web"))],
            ),
            // Removed from the desired state.
            (
                vec![],
                vec![observed("1", &web, "device-1", "running")],
                vec![rm("1", "not in the desired state")],
            ),
            // Another device's label, a duplicate, a created-but-not-started container.
            (
                vec![web.clone()],
                vec![
                    observed("1", &web, "device-9", "running"),
                    observed("2", &web, "device-1", "created"),
                    observed("3", &web, "device-1", "running"),
                ],
                vec![
                    rm("1", "labelled for another device"),
                    rm("3", "duplicate"),
                    Action::Start {
                        id: "2".into(),
                        name: name("web"),
                    },
                ],
            ),
        ];
        for (i, (desired, obs, want)) in cases.into_iter().enumerate() {
            assert_eq!(plan(&d, &desired, &obs), want, "case {i}");
        }
    }

    #[test]
    fn scope_table() {
        let name = |s: &str| WorkloadName::try_from(s).expect("name");
        let only = |ns: &[&str]| Scope::Only(ns.iter().map(|n| name(n)).collect());
        let w = |n: &str| fixtures::workload(n);
        let mut web2 = w("web");
        web2.env.insert("X".into(), "1".into());
        let many: Vec<WorkloadSpec> = (0..=SCOPED_MAX).map(|i| w(&format!("n{i}"))).collect();
        let cases: Vec<(Option<Vec<WorkloadSpec>>, Vec<WorkloadSpec>, Scope)> = vec![
            // Nothing reached yet (start-up, a failed pass) or a full pass asked for: everything.
            (None, vec![w("web")], Scope::All),
            // The same desired state: nothing to compare.
            (
                Some(vec![w("web"), w("db")]),
                vec![w("db"), w("web")],
                only(&[]),
            ),
            // One added, one removed, one changed: those three only.
            (
                Some(vec![w("web"), w("db"), w("old")]),
                vec![web2.clone(), w("db"), w("new")],
                only(&["new", "old", "web"]),
            ),
            // More changes than SCOPED_MAX: one full list is cheaper.
            (Some(vec![]), many.clone(), Scope::All),
            (Some(many.clone()), many[1..].to_vec(), only(&["n0"])),
        ];
        for (i, (reached, desired, want)) in cases.into_iter().enumerate() {
            assert_eq!(scope(reached.as_deref(), &desired), want, "case {i}");
        }
    }

    #[test]
    fn statuses_report_each_desired_workload() {
        let web = fixtures::workload("web");
        let db = fixtures::workload("db");
        let errors = BTreeMap::from([(db.name.clone(), "boom".to_string())]);
        let s = statuses(
            &[web.clone(), db],
            &[observed("1", &web, "device-1", "running")],
            &errors,
        );
        assert_eq!(s[0].state, WorkloadState::Running);
        assert_eq!(s[0].container_id.as_deref(), Some("1"));
        assert_eq!(s[1].state, WorkloadState::Failed);
    }
}
