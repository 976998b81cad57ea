//! Reconciliation: a pure plan from desired workloads and observed containers to actions, and its execution
//! one mutation at a time (each checked against the drain flag first). A pass compares either everything or, for
//! a desired-state change, only the workloads the change touched ([`Scope`]), so a one-workload change costs the
//! same with 50 unchanged workloads present as with none.
//!
//! A workload is replaced, never dropped ([`Swap`]): the new image is present before the running container is
//! touched, the old container steps aside under another name while the new one is created, and a new container
//! that does not start gives way to the old one again. A spec that failed is not tried again before its
//! [`Backoff`] is over, unless the desired spec changes (a fix is tried at once).

use crate::device_secrets::PassSecrets;
use crate::podman::{Observed, Podman, PodmanError};
use fleet_wire::workload::{LABEL_DEVICE, LABEL_SPEC_DIGEST, LABEL_WORKLOAD};
use fleet_wire::{
    BoundedText, DeviceId, FailureReason, RestartPolicy, Restarts, Sha256Hex, Timestamp,
    WorkloadFailure, WorkloadName, WorkloadSpec, WorkloadState, WorkloadStatus,
};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// One mutation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Stop and remove a managed container (gone from the desired state, other device, duplicate, or an extra
    /// container of an older spec).
    Remove {
        /// Container id.
        id: String,
        /// Why, for the log.
        why: &'static str,
    },
    /// Make sure the image is present, then create and start the container of a workload that has none.
    Create(WorkloadName),
    /// Replace the container of an older spec with the desired one ([`Swap`]): nothing is touched before the new
    /// image is present, and the old container comes back if the new one does not start.
    Replace {
        /// The old container's id.
        old: String,
        /// The workload.
        name: WorkloadName,
    },
    /// Start an existing container of a workload that is not running but should be.
    Start {
        /// Container id.
        id: String,
        /// The workload.
        name: WorkloadName,
    },
}

/// Why a workload's desired spec is not running after a pass: what its status reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failed {
    /// The reason, for an event.
    pub reason: FailureReason,
    /// What happened, in words a person acts on.
    pub error: String,
    /// The new container did not start and the previous one was started again.
    pub rolled_back: bool,
    /// The digest of the spec that failed; `None` when the failure is not one spec's (a container that could
    /// not be removed). A status shows it only while that spec is still the desired one: a failure of the spec
    /// the device had before must not be read as the new spec's between a desired-state change and the pass.
    pub spec: Option<Sha256Hex>,
}

impl Failed {
    /// True when delivered secrets can mend this failure: a Secret value not delivered yet, or a pull the
    /// registry refused (`image-pull-failed: unauthorized`).
    pub fn waits_for_secrets(&self) -> bool {
        self.reason == FailureReason::SecretMissing
            || (self.reason == FailureReason::ImagePullFailed
                && self.error.starts_with("image-pull-failed: unauthorized"))
    }

    fn of(self, spec: &WorkloadSpec) -> Failed {
        Failed {
            spec: Some(spec.digest()),
            ..self
        }
    }
}

/// Per-workload failures of a pass.
pub type Errors = BTreeMap<WorkloadName, Failed>;

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
/// therefore restarts nothing). A workload with no such container but one of an older spec is replaced (the
/// running one of them, else the first; any others are removed); any other managed container is removed.
/// Removals come first.
pub fn plan(device: &DeviceId, desired: &[WorkloadSpec], observed: &[Observed]) -> Vec<Action> {
    let mut removes = Vec::new();
    let mut rest = Vec::new();
    let mut kept: BTreeMap<&str, &Observed> = BTreeMap::new();
    let mut older: BTreeMap<&str, Vec<&Observed>> = BTreeMap::new();
    let want: BTreeMap<&str, &WorkloadSpec> =
        desired.iter().map(|w| (w.name.as_str(), w)).collect();
    for o in observed {
        let label = |k: &str| o.labels.get(k).map(String::as_str);
        let workload = label(LABEL_WORKLOAD).unwrap_or("");
        let why = if label(LABEL_DEVICE) != Some(device.as_str()) {
            Some("labelled for another device")
        } else if let Some(spec) = want.get(workload) {
            if label(LABEL_SPEC_DIGEST) != Some(spec.digest().as_str()) {
                older.entry(workload).or_default().push(o);
                None
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
        let mut old = older.remove(w.name.as_str()).unwrap_or_default();
        match kept.get(w.name.as_str()) {
            Some(o) => {
                if should_start(o, w.restart_policy) {
                    rest.push(Action::Start {
                        id: o.id.clone(),
                        name: w.name.clone(),
                    });
                }
            }
            None if old.is_empty() => rest.push(Action::Create(w.name.clone())),
            None => {
                let i = old.iter().position(|o| o.state == "running").unwrap_or(0);
                rest.push(Action::Replace {
                    old: old.remove(i).id.clone(),
                    name: w.name.clone(),
                });
            }
        }
        removes.extend(old.into_iter().map(|o| Action::Remove {
            id: o.id.clone(),
            why: "spec changed",
        }));
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

/// One step of replacing a workload's container (see [`Swap::after`] for the order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Make sure the new image is present (pull it). Nothing is touched before this succeeds.
    Pull,
    /// Rename the old container out of the way ([`parked_name`]); it keeps running.
    Park,
    /// Create the new container under the workload's name.
    Create,
    /// Stop the old container (frees its ports).
    StopOld,
    /// Start the new container.
    Start,
    /// Remove the old container: done.
    RemoveOld,
    /// Roll back: remove the new container.
    RemoveNew,
    /// Roll back: give the old container its name back.
    Unpark,
    /// Roll back: start the old container again.
    RestartOld,
}

/// How a replacement ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replaced {
    /// The new container runs; the old one is gone (or left stopped for the next pass to remove).
    Done,
    /// The old container was never stopped and runs as before.
    Kept(FailureReason),
    /// The new container did not start; the old one was started again.
    RolledBack(FailureReason),
    /// The new container did not start and the old one could not be started again either.
    Broken(FailureReason),
}

/// Where a replacement stands: the step to do next and the first failure, once one happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Swap {
    /// The next step.
    pub step: Step,
    /// The failure that turned the replacement into a roll-back.
    pub cause: Option<FailureReason>,
}

impl Swap {
    /// The first step.
    pub const BEGIN: Swap = Swap {
        step: Step::Pull,
        cause: None,
    };

    /// The next step after `self.step` succeeded (`ok`) or failed, or how the replacement ended. Pure.
    ///
    /// Forward: pull, park, create, stop old, start new, remove old. A failed pull touched nothing; a failed park
    /// or create unparks the old container (still running: a park that failed for want of space may have renamed
    /// it all the same); a failed stop or start removes the new container, unparks the old one and starts it
    /// again.
    pub fn after(self, ok: bool) -> Result<Swap, Replaced> {
        use FailureReason as R;
        use Step::*;
        let go = |step| Ok(Swap { step, ..self });
        let fail = |step, why| {
            Ok(Swap {
                step,
                cause: Some(why),
            })
        };
        let cause = self.cause.unwrap_or(R::Other);
        match (self.step, ok) {
            (Pull, true) => go(Park),
            (Pull, false) => Err(Replaced::Kept(R::ImagePullFailed)),
            (Park, true) => go(Create),
            (Park, false) => fail(Unpark, R::CreateFailed),
            (Create, true) => go(StopOld),
            (Create, false) => fail(Unpark, R::CreateFailed),
            (StopOld, true) => go(Start),
            (StopOld, false) => fail(RemoveNew, R::StopFailed),
            (Start, true) => go(RemoveOld),
            (Start, false) => fail(RemoveNew, R::StartFailed),
            // A stopped old container left behind is removed by the next pass ("spec changed").
            (RemoveOld, _) => Err(Replaced::Done),
            (RemoveNew, true) => go(Unpark),
            // The new container keeps the name; the old one starts under its parked name.
            (RemoveNew, false) => go(RestartOld),
            // Renamed back or not, a container that was never stopped keeps running.
            (Unpark, _) if cause == R::CreateFailed => Err(Replaced::Kept(cause)),
            (Unpark, _) => go(RestartOld),
            (RestartOld, true) => Err(Replaced::RolledBack(cause)),
            (RestartOld, false) => Err(Replaced::Broken(cause)),
        }
    }
}

/// The name the old container of `name` has while its replacement is created. A workload name cannot contain
/// '.', so this never collides with another workload's container.
pub fn parked_name(name: &WorkloadName) -> String {
    format!("{}.previous", name.container_name())
}

/// First wait before a failed spec is tried again.
pub const RETRY_FIRST: Duration = Duration::from_secs(30);
/// Longest wait before a failed spec is tried again (the wait doubles per failure up to this).
pub const RETRY_MAX: Duration = Duration::from_secs(10 * 60);

/// Failed specs, held back from a new attempt until their wait is over: a replacement that stopped and
/// restarted the old container must not repeat that on every resync, and a pull that fails (slowly) must not
/// occupy the worker on every resync. Keyed by workload and spec digest: a changed spec is tried at once. Kept in
/// memory only (an agent restart tries once more). Pure: the caller passes the time.
#[derive(Debug, Default)]
pub struct Backoff {
    held: BTreeMap<WorkloadName, Held>,
}

#[derive(Debug)]
struct Held {
    digest: Sha256Hex,
    failed: Failed,
    failures: u32,
    until: Instant,
    /// For a failure that new secrets can mend ([`Failed::waits_for_secrets`]): the `device-secrets` revision
    /// it failed with; another revision ends the wait at once.
    secrets_revision: Option<u64>,
}

impl Backoff {
    /// The failure to report instead of trying `spec` now, while its wait is not over.
    pub fn holds(&self, spec: &WorkloadSpec, now: Instant) -> Option<&Failed> {
        self.held
            .get(&spec.name)
            .filter(|h| h.digest == spec.digest() && now < h.until)
            .map(|h| &h.failed)
    }

    /// Records a failed attempt of `spec`: the wait doubles with each failure of the same spec.
    pub fn failed(&mut self, spec: &WorkloadSpec, failed: Failed, now: Instant) {
        let digest = spec.digest();
        let failures = match self.held.get(&spec.name) {
            Some(h) if h.digest == digest => h.failures.saturating_add(1),
            _ => 1,
        };
        let wait = RETRY_FIRST
            .saturating_mul(1 << (failures - 1).min(16))
            .min(RETRY_MAX);
        self.held.insert(
            spec.name.clone(),
            Held {
                digest,
                failed,
                failures,
                until: now + wait,
                secrets_revision: None,
            },
        );
    }

    /// Notes that the held failure of `name` waits for the device's secrets, read at `revision`: a pass that
    /// reads another revision tries the spec again without waiting (a rotated credential, a delivered value).
    pub fn waits_for_secrets(&mut self, name: &WorkloadName, revision: u64) {
        if let Some(h) = self.held.get_mut(name) {
            h.secrets_revision = Some(revision);
        }
    }

    /// The `device-secrets` revision the held failure of `name` waits on, if it waits on one.
    pub fn secrets_revision(&self, name: &WorkloadName) -> Option<u64> {
        self.held.get(name)?.secrets_revision
    }

    /// Forgets a workload whose desired spec now runs.
    pub fn succeeded(&mut self, name: &WorkloadName) {
        self.held.remove(name);
    }

    /// Forgets workloads that are no longer desired or whose desired spec changed.
    pub fn retain(&mut self, desired: &[WorkloadSpec]) {
        let want: BTreeMap<&WorkloadName, Sha256Hex> =
            desired.iter().map(|w| (&w.name, w.digest())).collect();
        self.held
            .retain(|n, h| want.get(n).is_some_and(|d| *d == h.digest));
    }
}

/// The outcome of one reconcile pass.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Mutations performed.
    pub mutations: usize,
    /// Per-workload failures of this pass (including those still held back by the [`Backoff`]).
    pub errors: Errors,
    /// True when the pass stopped early: the agent is draining, or a newer desired state made a pull in
    /// progress pointless.
    pub interrupted: bool,
}

/// What running one create or replacement came to.
enum Applied {
    Done,
    Failed(Failed),
    /// Stopped before anything was touched (drain, or `cancel` during the pull).
    Abandoned,
}

/// Runs one reconcile pass over `scope`. Before each mutation it checks `draining`: once set, no new mutation
/// starts, and the one in progress finishes (the caller waits for this function to return). `cancel` is asked
/// while an image is being pulled; when it says so, the pull is abandoned and the pass ends (the agent is
/// draining, or a newer desired state is waiting). `secrets` reads the device's delivered secrets; the pass calls
/// it at most once, and only when it needs them ([`PassSecrets`]).
#[allow(clippy::too_many_arguments)]
pub fn reconcile(
    podman: &Podman,
    device: &DeviceId,
    desired: &[WorkloadSpec],
    scope: &Scope,
    draining: &AtomicBool,
    backoff: &mut Backoff,
    secrets: &crate::device_secrets::Read,
    cancel: &dyn Fn() -> bool,
) -> Result<Outcome, PodmanError> {
    backoff.retain(desired);
    let mut pass = PassSecrets::new(secrets);
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
        if let Action::Create(name) | Action::Replace { name, .. } = a {
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
        match a {
            Action::Remove { id, why } => {
                out.mutations += 1;
                log::info!("removing container {id}: {why}");
                if let Err(e) = podman.remove(&id) {
                    log::warn!("remove {id}: {e}");
                    if let Some(w) = observed
                        .iter()
                        .find(|o| o.id == id)
                        .and_then(|o| o.labels.get(LABEL_WORKLOAD))
                        .and_then(|w| WorkloadName::try_from(w.as_str()).ok())
                    {
                        out.errors
                            .insert(w, failed(FailureReason::RemoveFailed, &e));
                    }
                }
            }
            Action::Create(ref name) | Action::Replace { ref name, .. } => {
                let Some(spec) = by_name.get(name.as_str()) else {
                    continue;
                };
                let now = Instant::now();
                if let Some(f) = backoff.holds(spec, now) {
                    // A failure that waits for secrets is tried again as soon as other secrets are delivered.
                    let delivered = backoff
                        .secrets_revision(&spec.name)
                        .is_some_and(|seen| pass.get().is_ok_and(|d| d.revision != seen));
                    if !delivered {
                        log::debug!("{}: the failed spec waits for its retry", name.as_str());
                        out.errors.insert(name.clone(), f.clone().of(spec));
                        continue;
                    }
                    log::info!(
                        "{}: new secrets were delivered; trying the failed spec again",
                        name.as_str()
                    );
                }
                out.mutations += 1;
                let applied = match &a {
                    Action::Replace { old, .. } => {
                        let o = observed.iter().find(|o| o.id == *old);
                        let old_name = o.map(|o| o.name.as_str()).unwrap_or("");
                        let was_running = o.is_some_and(|o| o.state == "running");
                        let old = Old {
                            id: old,
                            name: old_name,
                            was_running,
                        };
                        replace(podman, device, spec, &old, &mut pass, draining, cancel)
                    }
                    _ => create(podman, device, spec, &mut pass, draining, cancel),
                };
                match applied {
                    Applied::Done => backoff.succeeded(&spec.name),
                    Applied::Failed(f) => {
                        log::warn!("{}: {}", name.as_str(), f.error);
                        let f = f.of(spec);
                        backoff.failed(spec, f.clone(), now);
                        if let Some(rev) = pass.revision_read().filter(|_| f.waits_for_secrets()) {
                            backoff.waits_for_secrets(&spec.name, rev);
                        }
                        out.errors.insert(name.clone(), f);
                    }
                    Applied::Abandoned => {
                        out.interrupted = true;
                        break;
                    }
                }
            }
            Action::Start { id, name } => {
                out.mutations += 1;
                log::info!("starting container {id} ({})", name.as_str());
                if let Err(e) = podman.start(&id) {
                    log::warn!("start {}: {e}", name.as_str());
                    let mut f = failed(FailureReason::StartFailed, &e);
                    f.spec = by_name.get(name.as_str()).map(|s| s.digest());
                    out.errors.insert(name, f);
                }
            }
        }
    }
    Ok(out)
}

/// Removes the agent's Podman secrets that no container uses any more; the worker calls it after a pass that
/// mutated (a replacement or a removal is what leaves one unused) and after its first pass (what an earlier agent
/// left), not on an idle resync. False when it failed (logged): the next pass tries again.
pub fn collect_secrets(podman: &Podman, desired: &[WorkloadSpec]) -> bool {
    match podman.collect_secrets(desired) {
        Ok(_) => true,
        Err(e) => {
            log::warn!("cleaning up Podman secrets: {e}");
            false
        }
    }
}

/// The secret values `spec` uses, from the pass's delivered secrets; `Err` is the failure to report
/// (`secret-missing`), before anything was touched.
fn prepare_secrets(
    spec: &WorkloadSpec,
    pass: &mut PassSecrets<'_>,
) -> Result<Vec<crate::podman::secrets::Prepared>, Failed> {
    if spec.secrets.is_empty() {
        return Ok(Vec::new());
    }
    let missing = |error: String| Failed {
        reason: FailureReason::SecretMissing,
        error,
        rolled_back: false,
        spec: None,
    };
    let delivered = pass.get().map_err(|e| {
        missing(format!(
            "secret-missing: the device's secrets could not be read: {e}"
        ))
    })?;
    crate::podman::secrets::prepare(spec, delivered.secrets.as_ref()).map_err(missing)
}

fn failed(reason: FailureReason, e: &PodmanError) -> Failed {
    Failed {
        reason,
        error: e.to_string(),
        rolled_back: false,
        spec: None,
    }
}

/// Pull, create, start a workload that has no container.
fn create(
    podman: &Podman,
    device: &DeviceId,
    spec: &WorkloadSpec,
    pass: &mut PassSecrets<'_>,
    draining: &AtomicBool,
    cancel: &dyn Fn() -> bool,
) -> Applied {
    let name = spec.name.as_str();
    let values = match prepare_secrets(spec, pass) {
        Ok(v) => v,
        Err(f) => return Applied::Failed(f),
    };
    match podman.ensure_image(&spec.image, &mut |host| pass.registry(host), cancel) {
        Err(e) if e.is_cancelled() => return Applied::Abandoned,
        Err(e) => return Applied::Failed(failed(FailureReason::ImagePullFailed, &e)),
        Ok(pulled) => {
            if pulled {
                crate::timing::mark("pulled", format_args!("workload={name}"));
            }
        }
    }
    if draining.load(Ordering::SeqCst) {
        return Applied::Abandoned;
    }
    log::info!(
        "creating container {} ({})",
        spec.name.container_name(),
        spec.image
    );
    let id = match podman
        .ensure_secrets(&values)
        .and_then(|()| podman.create(device, spec))
    {
        Ok(id) => id,
        Err(e) => return Applied::Failed(failed(FailureReason::CreateFailed, &e)),
    };
    if draining.load(Ordering::SeqCst) {
        // Created but not started: the next agent starts it.
        return Applied::Done;
    }
    match podman.start(&id) {
        Ok(()) => {
            crate::timing::mark("started", format_args!("workload={name}"));
            Applied::Done
        }
        Err(e) => Applied::Failed(failed(FailureReason::StartFailed, &e)),
    }
}

/// The container a replacement replaces.
struct Old<'a> {
    id: &'a str,
    name: &'a str,
    /// Only a container that was running is started again by a roll-back.
    was_running: bool,
}

/// Replaces container `old` with `spec`'s, step by step as [`Swap::after`] says.
fn replace(
    podman: &Podman,
    device: &DeviceId,
    spec: &WorkloadSpec,
    old: &Old<'_>,
    pass: &mut PassSecrets<'_>,
    draining: &AtomicBool,
    cancel: &dyn Fn() -> bool,
) -> Applied {
    // A value not delivered yet fails the replacement before anything is touched.
    let values = match prepare_secrets(spec, pass) {
        Ok(v) => v,
        Err(f) => return Applied::Failed(f),
    };
    let (old_name, was_running) = (old.name, old.was_running);
    let old = old.id;
    let name = spec.name.container_name();
    let parked = parked_name(&spec.name);
    let mut swap = Swap::BEGIN;
    let mut new_id: Option<String> = None;
    let mut errors: Vec<String> = Vec::new();
    // Bounded: every path through `Swap::after` ends within nine steps.
    for _ in 0..16 {
        let r: Result<(), PodmanError> = match swap.step {
            Step::Pull => match podman.ensure_image(&spec.image, &mut |h| pass.registry(h), cancel)
            {
                Err(e) if e.is_cancelled() => return Applied::Abandoned,
                r => r.map(|_| ()),
            },
            Step::Park => {
                // The last point where nothing has been touched.
                if draining.load(Ordering::SeqCst) {
                    return Applied::Abandoned;
                }
                log::info!(
                    "replacing container {old} of {} with {} (the old one steps aside as {parked})",
                    spec.name.as_str(),
                    spec.image
                );
                if old_name == parked {
                    Ok(()) // parked by an earlier agent that stopped half-way
                } else {
                    podman.rename(old, &parked)
                }
            }
            Step::Create => podman
                .ensure_secrets(&values)
                .and_then(|()| podman.create(device, spec))
                .map(|id| new_id = Some(id)),
            Step::StopOld => podman.stop(old),
            Step::Start => match &new_id {
                Some(id) => podman.start(id).map(|()| {
                    crate::timing::mark("started", format_args!("workload={}", spec.name.as_str()));
                }),
                None => Ok(()),
            },
            Step::RemoveOld => podman.remove(old),
            Step::RemoveNew => match &new_id {
                Some(id) => podman.remove(id),
                None => Ok(()),
            },
            Step::Unpark => unpark(podman, old, &name),
            Step::RestartOld if was_running => podman.start(old),
            Step::RestartOld => Ok(()),
        };
        if let Err(e) = &r {
            log::warn!("{} ({:?}): {e}", spec.name.as_str(), swap.step);
            errors.push(e.to_string());
        }
        swap = match swap.after(r.is_ok()) {
            Ok(next) => next,
            Err(end) => return ended(end, &errors, was_running),
        };
    }
    Applied::Failed(Failed {
        reason: FailureReason::Other,
        error: "the replacement did not finish".into(),
        rolled_back: false,
        spec: None,
    })
}

/// Gives the old container its own name back, checking Podman's answer against what it did: with no space left
/// on its storage Podman renames the container in its database and then fails to write the storage's record,
/// answering an error for a rename that happened (measured with Podman 4.3 on a full file system). A container
/// that has its name (already, or after such an answer) is unparked.
fn unpark(podman: &Podman, old: &str, name: &str) -> Result<(), PodmanError> {
    if podman.name_of(old).is_ok_and(|n| n == name) {
        return Ok(());
    }
    match podman.rename(old, name) {
        Err(e) if podman.name_of(old).is_ok_and(|n| n == name) => {
            log::warn!("{name}: renamed back although Podman answered: {e}");
            Ok(())
        }
        r => r,
    }
}

/// What an error that comes from a full file system starts with in a status.
pub const NO_SPACE: &str = "no space left on device";

/// The status a finished replacement leaves, in words: the first error, and what runs now. A replacement that
/// failed for want of space says so first, whatever step met it.
fn ended(end: Replaced, errors: &[String], was_running: bool) -> Applied {
    let first = errors.first().map(String::as_str).unwrap_or("failed");
    let full;
    let first = if errors.iter().any(|e| e.contains(NO_SPACE)) && !first.starts_with(NO_SPACE) {
        full = format!("{NO_SPACE} (Podman's storage): {first}");
        full.as_str()
    } else {
        first
    };
    let (reason, rolled_back, what) = match end {
        Replaced::Done => return Applied::Done,
        Replaced::Kept(r) => (
            r,
            false,
            if was_running {
                "the container of the previous spec keeps running".to_owned()
            } else {
                "the container of the previous spec is left as it was (not running)".to_owned()
            },
        ),
        Replaced::RolledBack(r) => (
            r,
            true,
            if was_running {
                "the previous spec was restored (its container started again)".to_owned()
            } else {
                "the previous spec was restored (its container was not running and is left so)"
                    .to_owned()
            },
        ),
        Replaced::Broken(r) => (
            r,
            true,
            format!(
                "restoring the previous spec failed too: {}",
                errors.last().map(String::as_str).unwrap_or("failed")
            ),
        ),
    };
    Applied::Failed(Failed {
        reason,
        error: format!("{first}; {what}"),
        rolled_back,
        spec: None,
    })
}

/// How soon the workload status is published again while a workload is unsettled ([`unsettled`]).
pub const UNSETTLED_STATUS_INTERVAL: Duration = Duration::from_secs(5);

/// Each workload's published restart count.
pub type RestartCounts = BTreeMap<WorkloadName, u32>;

/// The restart counts of a status, to compare the next one with.
pub fn restart_counts(statuses: &[WorkloadStatus]) -> RestartCounts {
    statuses
        .iter()
        .filter_map(|s| Some((s.name.clone(), s.restarts?.count)))
        .collect()
}

/// True when some workload restarted since `published` and is not reported crash-looping yet: its next
/// restarts decide whether it is, so the status is published again soon rather than a whole interval later.
/// Bounded: once crash-looping (or quiet), the normal interval returns.
pub fn unsettled(published: &RestartCounts, statuses: &[WorkloadStatus]) -> bool {
    statuses.iter().any(|s| {
        s.state != WorkloadState::CrashLooping
            && s.restarts
                .is_some_and(|r| r.count > published.get(&s.name).copied().unwrap_or(0))
    })
}

/// The error of a workload whose container the kernel's OOM killer ended: at its own limit, or (without one) when
/// the device ran out of memory.
pub fn oom_error(w: &WorkloadSpec) -> String {
    match w.resources.and_then(|r| r.memory_mib) {
        Some(mib) => format!("oom-killed: the container exceeded its memory limit of {mib} MiB"),
        None => "oom-killed: the device ran out of memory and the kernel ended the container (it has no memory limit)".into(),
    }
}

/// Per-workload status from the desired state, the observed containers and the last pass's failures, at `now`.
/// A failed workload names the container of an older spec that still runs, if one does; a container of the
/// desired spec that Podman keeps restarting is `crash-looping` ([`fleet_wire::workload::is_crash_looping`]).
/// An exited container whose latest exit was the OOM killer's is `oom-killed` (its error names the memory
/// limit); one that restarts reports `restarts.oomKilled`, and its error too while it is crash-looping.
/// A running container of a workload with a health check reports its health ([`crate::health::reported`]:
/// Podman's for a command check, the agent's `health` findings for an HTTP or TCP probe), and while unhealthy
/// its error says why (`unhealthy: …`).
pub fn statuses(
    desired: &[WorkloadSpec],
    observed: &[Observed],
    errors: &Errors,
    health: &crate::health::Findings,
    now: Timestamp,
) -> Vec<WorkloadStatus> {
    desired
        .iter()
        .map(|w| {
            let digest = w.digest();
            let of_workload = |o: &&Observed| {
                o.labels.get(LABEL_WORKLOAD).map(String::as_str) == Some(w.name.as_str())
            };
            let o = observed.iter().filter(of_workload).find(|o| {
                o.labels.get(LABEL_SPEC_DIGEST).map(String::as_str) == Some(digest.as_str())
            });
            let f = errors
                .get(&w.name)
                .filter(|f| f.spec.as_ref().is_none_or(|d| *d == digest));
            let error = f.map(|f| BoundedText::lossy(&f.error));
            // Podman's StartedAt in Unix seconds (0: never started).
            let started = o
                .and_then(|o| u64::try_from(o.started_at).ok())
                .filter(|s| *s > 0)
                .map(|s| Timestamp::from_unix_ms(s * 1000));
            let state = match (o, f) {
                (_, Some(_)) => WorkloadState::Failed,
                (None, None) => WorkloadState::Missing,
                (Some(o), None)
                    if fleet_wire::workload::is_crash_looping(o.restarts, started, now) =>
                {
                    WorkloadState::CrashLooping
                }
                (Some(o), None) => match o.state.as_str() {
                    "running" => WorkloadState::Running,
                    "exited" | "stopped" if o.oom_killed => WorkloadState::OomKilled,
                    "exited" | "stopped" => WorkloadState::Exited,
                    _ => WorkloadState::Starting,
                },
            };
            let failure = f.map(|f| {
                let running = observed.iter().filter(of_workload).find(|o| {
                    o.state == "running"
                        && o.labels.get(LABEL_SPEC_DIGEST).map(String::as_str)
                            != Some(digest.as_str())
                });
                WorkloadFailure {
                    reason: f.reason,
                    running_container_id: running.map(|o| o.id.clone()),
                    running_spec_digest: running
                        .and_then(|o| o.labels.get(LABEL_SPEC_DIGEST))
                        .and_then(|d| Sha256Hex::try_from(d.as_str()).ok()),
                    rolled_back: f.rolled_back,
                }
            });
            // Only while the container of the desired spec runs: a failed, exited or crash-looping one says so itself.
            let checked = o
                .filter(|_| state == WorkloadState::Running)
                .and_then(|o| crate::health::reported(w, o, health));
            let error = error.or_else(|| {
                o.filter(|o| {
                    o.oom_killed
                        && matches!(
                            state,
                            WorkloadState::OomKilled | WorkloadState::CrashLooping
                        )
                })
                .map(|_| BoundedText::lossy(oom_error(w)))
            });
            let error = error.or_else(|| match &checked {
                Some((fleet_wire::HealthState::Unhealthy, why)) => Some(BoundedText::lossy(
                    why.as_deref()
                        .map_or_else(|| "unhealthy".to_owned(), |why| format!("unhealthy: {why}")),
                )),
                _ => None,
            });
            WorkloadStatus {
                name: w.name.clone(),
                state,
                container_id: o.map(|o| o.id.clone()),
                spec_digest: o.map(|_| digest.clone()),
                // Only while running, as the soak reads it.
                started_at: started.filter(|_| state == WorkloadState::Running),
                error,
                failure,
                // A failed workload's failure says what failed; restart counts are for a container that runs
                // (or keeps trying to), and leaving them out keeps the largest status within its bucket's limit.
                restarts: o
                    .filter(|_| state != WorkloadState::Failed)
                    .map(|o| Restarts {
                        count: o.restarts,
                        last_exit_code: (o.exited
                            || matches!(state, WorkloadState::Exited | WorkloadState::OomKilled))
                        .then_some(o.exit_code),
                        oom_killed: o.oom_killed,
                    }),
                health: checked.map(|(h, _)| h),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::Findings;
    use fleet_wire::fixtures;
    use fleet_wire::workload::LABEL_MANAGED;

    /// A moment well after every test container's start (Unix second 1).
    const NOW: Timestamp = Timestamp::from_unix_ms(2_000_000_000_000);

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
            restarts: 0,
            exit_code: 0,
            exited: false,
            created: 1,
            restarts_unknown: false,
            health: None,
            oom_killed: false,
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
            // Spec changed: replace (never a removal first: the old one runs until the new one is there).
            (
                vec![web2.clone()],
                vec![observed("1", &web, "device-1", "running")],
                vec![Action::Replace {
                    old: "1".into(),
                    name: name("web"),
                }],
            ),
            // Two containers of older specs: the running one is replaced, the other removed.
            (
                vec![web2.clone()],
                vec![
                    observed("1", &web, "device-1", "exited"),
                    observed("2", &web, "device-1", "running"),
                ],
                vec![
                    rm("1", "spec changed"),
                    Action::Replace {
                        old: "2".into(),
                        name: name("web"),
                    },
                ],
            ),
            // The new spec's container already runs (a replacement stopped half-way): the old one goes.
            (
                vec![web2.clone()],
                vec![
                    observed("1", &web, "device-1", "exited"),
                    observed("2", &web2, "device-1", "running"),
                ],
                vec![rm("1", "spec changed")],
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
        let errors = Errors::from([(
            db.name.clone(),
            Failed {
                reason: FailureReason::CreateFailed,
                error: "boom".into(),
                rolled_back: false,
                spec: Some(db.digest()),
            },
        )]);
        let s = statuses(
            &[web.clone(), db],
            &[observed("1", &web, "device-1", "running")],
            &errors,
            &Findings::new(),
            NOW,
        );
        assert_eq!(s[0].state, WorkloadState::Running);
        assert_eq!(s[0].container_id.as_deref(), Some("1"));
        // Podman's StartedAt (Unix seconds) is what a rollout's soak counts from; only a running workload has one.
        assert_eq!(
            s[0].started_at,
            Some(fleet_wire::Timestamp::from_unix_ms(1000))
        );
        assert_eq!(s[1].state, WorkloadState::Failed);
        assert_eq!(s[1].started_at, None);
    }

    /// Every step's successor, on success and on failure, forward and in a roll-back.
    #[test]
    fn swap_transition_table() {
        use FailureReason as R;
        use Step::*;
        let fwd = |step| Swap { step, cause: None };
        let back = |step, c| Swap {
            step,
            cause: Some(c),
        };
        let cases: Vec<(Swap, bool, Result<Swap, Replaced>)> = vec![
            (fwd(Pull), true, Ok(fwd(Park))),
            (fwd(Pull), false, Err(Replaced::Kept(R::ImagePullFailed))),
            (fwd(Park), true, Ok(fwd(Create))),
            (fwd(Park), false, Ok(back(Unpark, R::CreateFailed))),
            (fwd(Create), true, Ok(fwd(StopOld))),
            (fwd(Create), false, Ok(back(Unpark, R::CreateFailed))),
            (fwd(StopOld), true, Ok(fwd(Start))),
            (fwd(StopOld), false, Ok(back(RemoveNew, R::StopFailed))),
            (fwd(Start), true, Ok(fwd(RemoveOld))),
            (fwd(Start), false, Ok(back(RemoveNew, R::StartFailed))),
            (fwd(RemoveOld), true, Err(Replaced::Done)),
            (fwd(RemoveOld), false, Err(Replaced::Done)),
            (
                back(RemoveNew, R::StartFailed),
                true,
                Ok(back(Unpark, R::StartFailed)),
            ),
            (
                back(RemoveNew, R::StartFailed),
                false,
                Ok(back(RestartOld, R::StartFailed)),
            ),
            (
                back(Unpark, R::CreateFailed),
                true,
                Err(Replaced::Kept(R::CreateFailed)),
            ),
            (
                back(Unpark, R::CreateFailed),
                false,
                Err(Replaced::Kept(R::CreateFailed)),
            ),
            (
                back(Unpark, R::StartFailed),
                true,
                Ok(back(RestartOld, R::StartFailed)),
            ),
            (
                back(Unpark, R::StopFailed),
                false,
                Ok(back(RestartOld, R::StopFailed)),
            ),
            (
                back(RestartOld, R::StartFailed),
                true,
                Err(Replaced::RolledBack(R::StartFailed)),
            ),
            (
                back(RestartOld, R::StopFailed),
                false,
                Err(Replaced::Broken(R::StopFailed)),
            ),
        ];
        for (i, (from, ok, want)) in cases.into_iter().enumerate() {
            assert_eq!(from.after(ok), want, "case {i}: {from:?} ok={ok}");
        }
    }

    /// The decision end to end: which Podman steps run, given which of them fail (the image not pullable, the
    /// new container not creatable or not starting, the old one not restartable), and what the status says.
    #[test]
    fn replacement_paths() {
        use FailureReason as R;
        use Step::*;
        fn drive(failing: &[Step]) -> (Vec<Step>, Replaced) {
            let mut swap = Swap::BEGIN;
            let mut ran = vec![];
            for _ in 0..16 {
                ran.push(swap.step);
                match swap.after(!failing.contains(&swap.step)) {
                    Ok(next) => swap = next,
                    Err(end) => return (ran, end),
                }
            }
            panic!("no end: {ran:?}");
        }
        let cases: Vec<(&[Step], &[Step], Replaced)> = vec![
            // Image present (or pulled): the old container runs until the new one is created, then swaps.
            (
                &[],
                &[Pull, Park, Create, StopOld, Start, RemoveOld],
                Replaced::Done,
            ),
            // The image cannot be pulled: nothing else happens; the old container runs on, untouched.
            (&[Pull], &[Pull], Replaced::Kept(R::ImagePullFailed)),
            // The park fails (perhaps renamed all the same, no space left): the old container gets its name back.
            (
                &[Park],
                &[Pull, Park, Unpark],
                Replaced::Kept(R::CreateFailed),
            ),
            // Podman refuses the create: the old container (never stopped) gets its name back.
            (
                &[Create],
                &[Pull, Park, Create, Unpark],
                Replaced::Kept(R::CreateFailed),
            ),
            // The new container does not start: it goes, the old one comes back.
            (
                &[Start],
                &[
                    Pull, Park, Create, StopOld, Start, RemoveNew, Unpark, RestartOld,
                ],
                Replaced::RolledBack(R::StartFailed),
            ),
            // … and if the old one cannot start either, the status says so.
            (
                &[Start, RestartOld],
                &[
                    Pull, Park, Create, StopOld, Start, RemoveNew, Unpark, RestartOld,
                ],
                Replaced::Broken(R::StartFailed),
            ),
            // The new container cannot be removed: the old one starts under its parked name.
            (
                &[Start, RemoveNew],
                &[Pull, Park, Create, StopOld, Start, RemoveNew, RestartOld],
                Replaced::RolledBack(R::StartFailed),
            ),
        ];
        for (failing, steps, end) in cases {
            assert_eq!(drive(failing), (steps.to_vec(), end), "failing {failing:?}");
        }
        let Applied::Failed(f) = ended(
            Replaced::Kept(R::ImagePullFailed),
            &["image x could not be pulled: y".into()],
            true,
        ) else {
            panic!("kept is a failure");
        };
        assert_eq!(
            f.error,
            "image x could not be pulled: y; the container of the previous spec keeps running"
        );
        assert!(!f.rolled_back);
        // A full file system is named first, whichever step met it.
        let Applied::Failed(f) = ended(
            Replaced::Kept(R::CreateFailed),
            &[
                "renaming the container: write x: no space left on device (Podman answered HTTP 500)"
                    .into(),
            ],
            true,
        ) else {
            panic!("kept is a failure");
        };
        assert_eq!(
            f.error,
            "no space left on device (Podman's storage): renaming the container: write x: no space left on device \
             (Podman answered HTTP 500); the container of the previous spec keeps running"
        );
        // An old container that was not running is not started by a roll-back, and the status says so.
        let Applied::Failed(f) = ended(
            Replaced::RolledBack(R::StartFailed),
            &["starting the container: x".into()],
            false,
        ) else {
            panic!("rolled back is a failure");
        };
        assert!(f.rolled_back);
        assert!(
            f.error
                .ends_with("(its container was not running and is left so)"),
            "{}",
            f.error
        );
    }

    #[test]
    fn backoff_holds_a_failed_spec_until_its_wait_is_over_or_the_spec_changes() {
        let web = fixtures::workload("web");
        let mut fixed = web.clone();
        fixed.image = "localhost/web:2".into();
        let f = Failed {
            reason: FailureReason::ImagePullFailed,
            error: "no".into(),
            rolled_back: false,
            spec: Some(web.digest()),
        };
        let t0 = Instant::now();
        let mut b = Backoff::default();
        assert_eq!(b.holds(&web, t0), None);
        b.failed(&web, f.clone(), t0);
        assert_eq!(b.holds(&web, t0 + RETRY_FIRST / 2), Some(&f));
        assert_eq!(b.holds(&fixed, t0), None, "a changed spec is tried at once");
        assert_eq!(b.holds(&web, t0 + RETRY_FIRST), None);
        // Failing again doubles the wait, up to the cap.
        let t1 = t0 + RETRY_FIRST;
        b.failed(&web, f.clone(), t1);
        assert!(b.holds(&web, t1 + RETRY_FIRST * 3 / 2).is_some());
        assert!(b.holds(&web, t1 + RETRY_FIRST * 2).is_none());
        for _ in 0..40 {
            b.failed(&web, f.clone(), t1);
        }
        assert!(b.holds(&web, t1 + RETRY_MAX).is_none());
        // A spec that changed is forgotten; so is one that ran.
        b.retain(&[fixed.clone()]);
        assert_eq!(b.holds(&web, t1), None);
        b.failed(&fixed, f.clone(), t1);
        b.succeeded(&fixed.name);
        assert_eq!(b.holds(&fixed, t1), None);
    }

    /// Only a failure that delivered secrets can mend waits on them; the revision it failed with is kept until
    /// the spec fails again, runs or changes.
    #[test]
    fn failures_that_secrets_mend_remember_their_revision() {
        let web = fixtures::workload("web");
        let f = |reason, error: &str| Failed {
            reason,
            error: error.into(),
            rolled_back: false,
            spec: Some(web.digest()),
        };
        let unauthorized = f(
            FailureReason::ImagePullFailed,
            "image-pull-failed: unauthorized: registry r:5000 refused image r:5000/a:1 with the credentials delivered to this device: unauthorized: authentication required; the container of the previous spec keeps running",
        );
        let missing = f(
            FailureReason::SecretMissing,
            "secret-missing: Secret s key k version 3 not delivered yet",
        );
        let unknown = f(
            FailureReason::ImagePullFailed,
            "image r:5000/a:1 could not be pulled: manifest unknown",
        );
        assert!(unauthorized.waits_for_secrets() && missing.waits_for_secrets());
        assert!(!unknown.waits_for_secrets());
        assert!(!f(
            FailureReason::StartFailed,
            "image-pull-failed: unauthorized"
        )
        .waits_for_secrets());
        let t0 = Instant::now();
        let mut b = Backoff::default();
        b.waits_for_secrets(&web.name, 4);
        assert_eq!(
            b.secrets_revision(&web.name),
            None,
            "nothing held, nothing noted"
        );
        b.failed(&web, missing.clone(), t0);
        assert_eq!(b.secrets_revision(&web.name), None);
        b.waits_for_secrets(&web.name, 4);
        assert_eq!(b.secrets_revision(&web.name), Some(4));
        b.failed(&web, unknown, t0);
        assert_eq!(
            b.secrets_revision(&web.name),
            None,
            "a new failure starts afresh"
        );
        b.failed(&web, missing, t0);
        b.waits_for_secrets(&web.name, 5);
        b.succeeded(&web.name);
        assert_eq!(b.secrets_revision(&web.name), None);
    }

    #[test]
    fn a_failed_workload_names_the_old_container_that_still_runs() {
        let web = fixtures::workload("web");
        let mut next = web.clone();
        next.image = "localhost/web:nope".into();
        let errors = Errors::from([(
            web.name.clone(),
            Failed {
                reason: FailureReason::ImagePullFailed,
                error: "image localhost/web:nope could not be pulled: x".into(),
                rolled_back: false,
                spec: Some(next.digest()),
            },
        )]);
        let s = statuses(
            &[next],
            &[observed("1", &web, "device-1", "running")],
            &errors,
            &Findings::new(),
            NOW,
        );
        assert_eq!(s[0].state, WorkloadState::Failed);
        // The desired spec has no container: the operator counts it failed, not running the old spec.
        assert_eq!(
            (s[0].container_id.as_deref(), s[0].spec_digest.as_ref()),
            (None, None)
        );
        assert_eq!(
            s[0].failure,
            Some(WorkloadFailure {
                reason: FailureReason::ImagePullFailed,
                running_container_id: Some("1".into()),
                running_spec_digest: Some(web.digest()),
                rolled_back: false,
            })
        );
        // Fixed: no failure, no error.
        let s = statuses(
            std::slice::from_ref(&web),
            &[observed("1", &web, "device-1", "running")],
            &Errors::new(),
            &Findings::new(),
            NOW,
        );
        assert_eq!(
            (s[0].state, s[0].error.as_ref(), s[0].failure.as_ref()),
            (WorkloadState::Running, None, None)
        );
    }

    /// Between a desired-state change and the pass that applies it, the last pass's failure is of the spec the
    /// device had before: the new spec is not failed, and its status carries no old error (the operator halted a
    /// fixed rollout on it).
    #[test]
    fn a_failure_of_the_previous_spec_is_not_the_new_specs() {
        let web = fixtures::workload("web");
        let mut bad = web.clone();
        bad.image = "localhost/web:nope".into();
        let mut fix = web.clone();
        fix.command = vec!["sleep".into(), "2".into()];
        let errors = Errors::from([(
            web.name.clone(),
            Failed {
                reason: FailureReason::ImagePullFailed,
                error: "image localhost/web:nope could not be pulled: x".into(),
                rolled_back: false,
                spec: Some(bad.digest()),
            },
        )]);
        let running = [observed("1", &web, "device-1", "running")];
        let s = statuses(
            std::slice::from_ref(&fix),
            &running,
            &errors,
            &Findings::new(),
            NOW,
        );
        assert_eq!(
            (s[0].state, s[0].error.as_ref(), s[0].failure.as_ref()),
            (WorkloadState::Missing, None, None)
        );
        // Still the failed spec: still failed. A failure of no one spec (a container not removed) always shows.
        let s = statuses(
            std::slice::from_ref(&bad),
            &running,
            &errors,
            &Findings::new(),
            NOW,
        );
        assert_eq!(s[0].state, WorkloadState::Failed);
        let mut anyspec = errors.clone();
        anyspec.get_mut(&web.name).expect("web").spec = None;
        let s = statuses(
            std::slice::from_ref(&fix),
            &running,
            &anyspec,
            &Findings::new(),
            NOW,
        );
        assert_eq!(s[0].state, WorkloadState::Failed);
    }

    /// Podman's restart count and last exit code reach the status; a container it keeps restarting, the latest
    /// start recent, is crash-looping whatever its state at the moment of the list; one that then stayed up for
    /// the window is running again.
    #[test]
    fn restarts_and_crash_loops_are_reported() {
        let web = fixtures::workload("web");
        let at = |secs: u64| Timestamp::from_unix_ms(secs * 1000);
        let mut o = observed("1", &web, "device-1", "running");
        o.started_at = 1_000;
        let status = |o: &Observed, now| {
            statuses(
                std::slice::from_ref(&web),
                std::slice::from_ref(o),
                &Errors::new(),
                &Findings::new(),
                now,
            )
            .remove(0)
        };
        let s = status(&o, at(1_005));
        assert_eq!(
            (s.state, s.restarts),
            (
                WorkloadState::Running,
                Some(Restarts {
                    count: 0,
                    last_exit_code: None,
                    oom_killed: false,
                })
            )
        );
        o.restarts = 2;
        o.exit_code = 3;
        o.exited = true;
        let s = status(&o, at(1_005));
        assert_eq!(
            (s.state, s.restarts),
            (
                WorkloadState::Running,
                Some(Restarts {
                    count: 2,
                    last_exit_code: Some(3),
                    oom_killed: false,
                })
            )
        );
        o.restarts = 3;
        for state in ["running", "exited", "stopping"] {
            o.state = state.into();
            let s = status(&o, at(1_005));
            assert_eq!(s.state, WorkloadState::CrashLooping, "{state}");
            assert_eq!(s.started_at, None, "a crash loop has no start to soak from");
        }
        o.state = "running".into();
        let calm = 1_000 + fleet_wire::workload::CRASH_LOOP_WINDOW.as_secs() + 1;
        assert_eq!(status(&o, at(calm)).state, WorkloadState::Running);
        // No container of the desired spec: nothing to count.
        let s = statuses(
            std::slice::from_ref(&web),
            &[],
            &Errors::new(),
            &Findings::new(),
            at(1_005),
        );
        assert_eq!((s[0].state, s[0].restarts), (WorkloadState::Missing, None));
    }

    /// The OOM rule: the latest exit OOM-killed and not running → `oom-killed` with the limit in the error; running
    /// again after one → `restarts.oomKilled`; repeated → `crash-looping`, still `oomKilled`.
    #[test]
    fn oom_kills_are_reported() {
        let mut limited = fixtures::workload("web");
        limited.resources = Some(fleet_wire::Resources {
            memory_mib: Some(32),
            ..Default::default()
        });
        let unlimited = fixtures::workload("web");
        let at = |secs: u64| Timestamp::from_unix_ms(secs * 1000);
        const LIMIT: &str = "oom-killed: the container exceeded its memory limit of 32 MiB";
        const NO_LIMIT: &str = "oom-killed: the device ran out of memory";
        use WorkloadState::{CrashLooping, Exited, OomKilled, Running};
        // (spec, Podman state, OOMKilled, restarts, exit code) → (state, restarts.oomKilled, error starts with)
        type Given<'a> = (&'a WorkloadSpec, &'a str, bool, u32, i32);
        type Want<'a> = (WorkloadState, bool, Option<&'a str>);
        let rows: Vec<(Given, Want)> = vec![
            (
                (&limited, "exited", true, 0, 137),
                (OomKilled, true, Some(LIMIT)),
            ),
            (
                (&limited, "stopped", true, 1, 137),
                (OomKilled, true, Some(LIMIT)),
            ),
            (
                (&unlimited, "exited", true, 0, 137),
                (OomKilled, true, Some(NO_LIMIT)),
            ),
            // Killed by someone else: an exit like any other.
            ((&limited, "exited", false, 0, 137), (Exited, false, None)),
            // Running again after an OOM kill.
            ((&limited, "running", true, 1, 0), (Running, true, None)),
            // Repeated: a crash loop, running or between its restarts.
            (
                (&limited, "running", true, 3, 0),
                (CrashLooping, true, Some(LIMIT)),
            ),
            (
                (&limited, "exited", true, 3, 137),
                (CrashLooping, true, Some(LIMIT)),
            ),
            (
                (&limited, "exited", false, 3, 1),
                (CrashLooping, false, None),
            ),
        ];
        for (i, ((w, state, oom, restarts, code), (want, want_oom, error))) in
            rows.into_iter().enumerate()
        {
            let mut o = observed("1", w, "device-1", state);
            o.started_at = 1_000;
            (o.oom_killed, o.restarts, o.exit_code) = (oom, restarts, code);
            o.exited = state != "running";
            let s = statuses(
                std::slice::from_ref(w),
                std::slice::from_ref(&o),
                &Errors::new(),
                &Findings::new(),
                at(1_005),
            )
            .remove(0);
            assert_eq!(s.state, want, "row {i}");
            let r = s.restarts.expect("restarts");
            assert_eq!(r.oom_killed, want_oom, "row {i}");
            match error {
                Some(e) => assert!(
                    s.error.as_ref().is_some_and(|t| t.as_str().starts_with(e)),
                    "row {i}: {:?}",
                    s.error
                ),
                None => assert_eq!(s.error, None, "row {i}"),
            }
            if want == OomKilled {
                assert_eq!(r.last_exit_code, Some(137), "row {i}");
            }
        }
    }

    /// A workload that restarted since the last status is published again soon, until it is reported
    /// crash-looping or stops restarting.
    #[test]
    fn restarts_since_the_last_status_hurry_the_next() {
        let web = fixtures::workload("web");
        let status = |state, count| WorkloadStatus {
            name: web.name.clone(),
            state,
            container_id: None,
            spec_digest: None,
            started_at: None,
            error: None,
            failure: None,
            restarts: Some(Restarts {
                count,
                last_exit_code: None,
                oom_killed: false,
            }),
            health: None,
        };
        let none = RestartCounts::new();
        assert!(!unsettled(&none, &[status(WorkloadState::Running, 0)]));
        assert!(unsettled(&none, &[status(WorkloadState::Running, 1)]));
        let one = restart_counts(&[status(WorkloadState::Running, 1)]);
        assert!(
            !unsettled(&one, &[status(WorkloadState::Running, 1)]),
            "quiet since"
        );
        assert!(unsettled(&one, &[status(WorkloadState::Running, 2)]));
        assert!(
            !unsettled(&one, &[status(WorkloadState::CrashLooping, 5)]),
            "reported"
        );
    }

    /// Health reaches the status only for a running container of the desired spec: the agent's finding for an
    /// HTTP probe, Podman's state for a command check (with the failed check the agent read from Podman's log),
    /// `starting` until a check decided; an unhealthy workload's error says so.
    #[test]
    fn health_is_reported_for_a_running_container_of_the_desired_spec() {
        use crate::health::Probed;
        use fleet_wire::HealthState::{Starting, Unhealthy};
        let http = fixtures::workload_with_health("web", "http");
        let cmd = fixtures::workload_with_health("job", "command");
        let plain = fixtures::workload("plain");
        let desired = [http.clone(), cmd.clone(), plain.clone()];
        let mut web = observed("w", &http, "device-1", "running");
        let mut job = observed("j", &cmd, "device-1", "running");
        job.health = Some(Unhealthy);
        let other = observed("p", &plain, "device-1", "running");
        let found = Findings::from([
            (
                "w".to_string(),
                Probed {
                    state: Some(Unhealthy),
                    error: Some("GET /healthz on port 8080 answered HTTP 503".into()),
                },
            ),
            (
                "j".to_string(),
                Probed {
                    state: None,
                    error: Some("the check command failed: down".into()),
                },
            ),
        ]);
        let all = |web: &Observed, found: &Findings| {
            statuses(
                &desired,
                &[web.clone(), job.clone(), other.clone()],
                &Errors::new(),
                found,
                NOW,
            )
        };
        let s = all(&web, &found);
        let seen: Vec<_> = s
            .iter()
            .map(|s| {
                (
                    s.state,
                    s.health,
                    s.error.as_ref().map(|e| e.as_str().to_owned()),
                )
            })
            .collect();
        assert_eq!(
            seen,
            [
                (
                    WorkloadState::Running,
                    Some(Unhealthy),
                    Some("unhealthy: GET /healthz on port 8080 answered HTTP 503".into())
                ),
                (
                    WorkloadState::Running,
                    Some(Unhealthy),
                    Some("unhealthy: the check command failed: down".into())
                ),
                (WorkloadState::Running, None, None),
            ]
        );
        // Nothing decided yet: starting; Podman's unhealthy without its log read is still unhealthy.
        let s = all(&web, &Findings::new());
        assert_eq!((s[0].health, s[0].error.as_ref()), (Some(Starting), None));
        assert_eq!(s[1].error.as_ref().map(|e| e.as_str()), Some("unhealthy"));
        // Not running: no health.
        web.state = "exited".into();
        let s = all(&web, &found);
        assert_eq!((s[0].state, s[0].health), (WorkloadState::Exited, None));
    }
}
