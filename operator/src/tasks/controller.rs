//! The TaskRun controller: watches TaskRuns, Devices and DeviceGroups (reflector caches) and `device-info`
//! (mirror); for each run it gathers what [`super::pass`] decides from and carries the decision out: plans
//! ([`super::planning`]), stores the plan ([`super::store`]) before the run enters Running, releases
//! system-upgrade intents and accepts results ([`super::progress`]) from the run's KV view ([`super::view`]), writes
//! the bounded status ([`super::status`]), and adds and removes the run's finalizer ([`pass::FINALIZER`]).
//!
//! Replicas need no leader: the plan's manifest is created once (KV create), intents are KV creates (a second
//! writer's create fails and changes nothing), decisions are functions of the plan and the KV keys, and status
//! writes are guarded by resourceVersion. A restarted operator resumes from the plan and the keys: a device whose
//! intent was ever written (the key exists or was removed) or that reported is never released again.

use super::blocking;
use super::intents;
use super::pass::{self, Finalizer, PlanStep, Report, Step};
use super::planning::{self, Groups};
use super::progress::{self, DeviceState, Outcome};
use super::stall;
use super::status::{self as run_status, StallReport};
use super::store;
use super::view::RunView;
use crate::conditions;
use crate::crd::tasks::{created_at, TaskRun};
use crate::crd::{Device, DeviceGroup, Stalled};
use crate::fleet::placement::{self, Labels};
use crate::fleet::report;
use crate::kv::{self, Mirror, NatsError};
use crate::nats_link::{Kept, Link};
use crate::runtime::Runtime;
use crate::task_reasons::TaskReasons;
use fleet_wire::kv as layout;
use fleet_wire::{
    AttemptId, BoundedText, Capability, DeviceId, DeviceInfo, TaskPlan, TaskRunPhase,
    TaskRunStatus, Timestamp,
};
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::events::Recorder;
use kube::runtime::reflector::Store as Cache;
use kube::{Client, ResourceExt};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// A pass runs at least this often.
pub const RESYNC: Duration = Duration::from_secs(30);
/// Changes arriving within this window are handled by one pass.
pub const DEBOUNCE: Duration = Duration::from_millis(100);
/// Terminal runs whose leftover intents are looked for at once (each needs a KV view): after a restart with a long
/// run history, the rest wait for later passes instead of opening hundreds of consumers together.
pub const CLEANUPS_AT_ONCE: usize = 16;

/// How the controller runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// `nats://host:port`.
    pub nats_url: String,
    /// This replica's name for events.
    pub instance: Option<String>,
    /// Only TaskRuns, Devices and DeviceGroups with these labels are handled.
    pub label_selector: Option<String>,
    /// A released device without a status for the run for longer is *stalled* ([`stall`];
    /// `--task-accept-timeout`, default [`stall::DEFAULT_ACCEPT_TIMEOUT`]).
    pub accept_timeout: Duration,
    /// TLS and bucket settings ([`kv::NatsSettings`]).
    pub nats: kv::NatsSettings,
}

/// Devices patched at once when their `status.stalled` changes.
pub const DEVICE_WRITES_AT_ONCE: usize = 16;

/// One running run's stalled devices, as last judged from its view.
struct RunStalls {
    /// `namespace/name`, as the Devices name it.
    run: String,
    /// Every stalled device and when NATS stored its intent.
    devices: Vec<(DeviceId, Timestamp)>,
    /// When the next waiting device becomes stalled.
    wake: Option<Timestamp>,
}

/// Where the TaskRun controller reads device info (capabilities, at planning) from.
pub enum DeviceInfoSource {
    /// The runtime's mirror, which another controller keeps current (the operator's: the deployments controller
    /// watches it); this one is woken by its changes.
    Shared,
    /// A mirror of its own, which it watches (the controller run alone).
    Own,
}

/// Runs the TaskRun controller on the operator's [`Runtime`] until the task is dropped or aborted: its caches and
/// NATS connection, and its device-info mirror when `info` says [`DeviceInfoSource::Shared`] (another controller
/// keeps it current); run alone (tests), [`DeviceInfoSource::Own`] with a runtime of its own.
pub async fn run_with(
    rt: &Runtime,
    opts: Options,
    info: DeviceInfoSource,
) -> Result<(), kube::runtime::reflector::store::WriterDropped> {
    let (client, caches, nats) = (rt.client.clone(), &rt.caches, &*rt.nats);
    let notify = Arc::new(Notify::new());
    let (info, own_info) = match info {
        DeviceInfoSource::Shared => {
            rt.info.subscribe(&notify);
            (rt.info.clone(), false)
        }
        DeviceInfoSource::Own => (Mirror::new(layout::DEVICE_INFO), true),
    };
    let runs = caches.runs.subscribe(&notify);
    let devices = caches.devices.subscribe(&notify);
    let groups = caches.groups.subscribe(&notify);
    // Never plan from a partial view: a missing group or device would shrink the frozen plan.
    caches.runs.ready().await?;
    caches.devices.ready().await?;
    caches.groups.ready().await?;
    // The URL may carry the operator's own NATS password: log it without.
    log::info!("task runs: caches synced; NATS at {}", nats.display_url());
    let mut c = Controller {
        recorder: report::recorder(client.clone(), opts.instance.clone()),
        client,
        runs,
        devices,
        groups,
        info,
        notify: notify.clone(),
        plans: HashMap::new(),
        views: HashMap::new(),
        finished: HashMap::new(),
        cleaned: HashSet::new(),
        retries: HashMap::new(),
        stalls: HashMap::new(),
        reasons: HashMap::new(),
        published: rt.task_reasons.clone(),
        accept_timeout: opts.accept_timeout,
    };
    let mut link: Option<Link> = None;
    loop {
        let info = &c.info;
        let kept = Link::keep(&mut link, nats, "task runs", || async {
            let mut l = Link::open(nats).await?;
            // The device-info mirror, when this controller keeps it itself ([`DeviceInfoSource::Own`]).
            if own_info {
                l.watch(info, &notify)?;
            }
            Ok(l)
        })
        .await;
        let nats_error = match kept {
            // The run views' watches were on the old link: a new one reads them anew.
            Kept::Opened => {
                c.views.clear();
                None
            }
            Kept::Same => None,
            Kept::Failed(e) => Some(e),
        };
        crate::metrics::reconciled("taskruns", nats_error.is_none());
        let wake = c.pass(link.as_ref(), nats_error).await;
        crate::memory::give_back();
        let mut wait = if link.is_none() {
            Duration::from_secs(2)
        } else {
            RESYNC
        };
        if let Some(w) = wake {
            let until =
                Duration::from_millis(w.unix_ms().saturating_sub(Timestamp::now().unix_ms()));
            wait = wait.min(until + Duration::from_millis(20));
        }
        tokio::select! {
            _ = notify.notified() => {}
            _ = tokio::time::sleep(wait) => {}
        }
        tokio::time::sleep(DEBOUNCE).await;
    }
}

struct Controller {
    client: Client,
    recorder: Recorder,
    runs: Cache<TaskRun>,
    devices: Cache<Device>,
    groups: Cache<DeviceGroup>,
    info: Arc<Mirror<DeviceInfo>>,
    notify: Arc<Notify>,
    /// Loaded plans (immutable once created).
    plans: HashMap<AttemptId, Arc<TaskPlan>>,
    /// KV views of runs that are running or being cleaned up.
    views: HashMap<AttemptId, RunView>,
    /// Terminal phases this process wrote (the cache may lag behind its own write).
    finished: HashMap<AttemptId, TaskRunPhase>,
    /// Terminal runs whose intents are all removed.
    cleaned: HashSet<AttemptId>,
    /// Planning retries after group source errors: failures so far and when to try again.
    retries: HashMap<AttemptId, (u32, Timestamp)>,
    /// Running runs' stalled devices, judged from their views (a run absent here was not judged yet).
    stalls: HashMap<AttemptId, RunStalls>,
    /// Running runs' reasons by device, from their latest step ([`blocking`]), keyed by the run's change name.
    reasons: HashMap<AttemptId, (String, Vec<(DeviceId, crate::blocking::Blocking)>)>,
    /// Where they are published for the Device writer ([`crate::task_reasons`]).
    published: Arc<TaskReasons>,
    /// See [`Options::accept_timeout`].
    accept_timeout: Duration,
}

/// `namespace/name` of a run, as a Device's `status.stalled.taskRun` names it.
fn run_ref(run: &TaskRun) -> String {
    format!("{}/{}", run.namespace().unwrap_or_default(), run.name_any())
}

/// Logs a failed finalizer patch: at debug level when the run changed meanwhile (a `test` operation failed, as
/// when the cache has not caught up with this process's own write), else as a warning.
fn changed_meanwhile(run: &TaskRun, what: &str, e: &kube::Error) {
    match e {
        kube::Error::Api(s) if s.code == 409 || s.code == 422 => {
            log::debug!(
                "TaskRun {}: {what}: changed meanwhile ({e}); next pass",
                run.name_any()
            )
        }
        _ => log::warn!("TaskRun {}: {what}: {e}", run.name_any()),
    }
}

/// The run carries [`pass::FINALIZER`].
fn has_finalizer(run: &TaskRun) -> bool {
    run.finalizers().iter().any(|f| f == pass::FINALIZER)
}

/// Devices and their labels, and every group resolved, from the caches.
fn snapshot(
    devices: &[Arc<Device>],
    groups: &[Arc<DeviceGroup>],
) -> (BTreeMap<DeviceId, Labels>, Groups) {
    let labels: BTreeMap<DeviceId, Labels> = devices
        .iter()
        // A Device being deleted is being retired: in no group (docs/device-lifecycle.md).
        .filter(|d| d.metadata.deletion_timestamp.is_none())
        .filter_map(|d| {
            DeviceId::try_from(d.name_any().as_str())
                .ok()
                .map(|id| (id, d.labels().clone()))
        })
        .collect();
    let resolved = placement::resolve_groups(groups, &labels);
    (labels, resolved)
}

impl Controller {
    async fn pass(&mut self, link: Option<&Link>, nats_error: Option<String>) -> Option<Timestamp> {
        let runs = self.runs.state();
        let mut wake: Option<Timestamp> = None;
        let mut seen = HashSet::new();
        for run in &runs {
            let Ok(uid) = AttemptId::try_from(run.uid().unwrap_or_default().as_str()) else {
                continue;
            };
            seen.insert(uid);
            if let Some(w) = self.reconcile(link, nats_error.as_deref(), run, uid).await {
                wake = Some(wake.map_or(w, |x: Timestamp| x.min(w)));
            }
        }
        // A run deleted while it ran is cancelled: the intents no device has taken yet are removed (an updater that
        // already accepted its attempt finishes it), as for a run that ended. Until that succeeds its view is kept
        // and the next pass tries again.
        let deleted: Vec<AttemptId> = self
            .views
            .keys()
            .filter(|k| !seen.contains(*k) && !self.cleaned.contains(*k))
            .copied()
            .collect();
        for uid in deleted {
            if let Some(link) = link {
                log::info!("run {uid} deleted: removing the intents no device has taken");
                self.clean_up(link, uid).await;
            }
            if self.views.contains_key(&uid) {
                seen.insert(uid);
                wake = Some(Timestamp::now().plus(Duration::from_secs(1)));
            }
        }
        // Forget runs that no longer exist.
        self.plans.retain(|k, _| seen.contains(k));
        self.views.retain(|k, _| seen.contains(k));
        self.finished.retain(|k, _| seen.contains(k));
        self.cleaned.retain(|k| seen.contains(k));
        self.retries.retain(|k, _| seen.contains(k));
        self.stalls.retain(|k, _| seen.contains(k));
        self.reasons.retain(|k, _| seen.contains(k));
        self.publish(&runs);
        self.mark_devices(&runs).await;
        wake
    }

    /// Hands every running run's reasons to the Device writer, runs in the order of their change names (so that
    /// an unchanged fleet publishes the same list, which writes nothing), and names the running runs not judged yet
    /// (their entries stay as the Devices show them).
    fn publish(&self, runs: &[Arc<TaskRun>]) {
        let unjudged = runs
            .iter()
            .filter(|r| {
                let uid = AttemptId::try_from(r.uid().unwrap_or_default().as_str()).ok();
                let done = uid.and_then(|u| self.finished.get(&u)).is_some();
                let judged = uid.is_some_and(|u| self.reasons.contains_key(&u));
                !done
                    && !judged
                    && r.metadata.deletion_timestamp.is_none()
                    && r.status
                        .as_ref()
                        .is_some_and(|s| s.run.phase == Some(TaskRunPhase::Running))
            })
            .map(|r| blocking::change(&r.namespace().unwrap_or_default(), &r.name_any()))
            .collect();
        let mut runs: Vec<&(String, Vec<(DeviceId, crate::blocking::Blocking)>)> =
            self.reasons.values().collect();
        runs.sort_by(|a, b| a.0.cmp(&b.0));
        let all = runs
            .into_iter()
            .flat_map(|(_, r)| r.iter().map(|(d, b)| (d.to_string(), b.clone())));
        if self.published.publish(all, unjudged) {
            log::debug!("task runs: devices' reasons changed");
        }
    }

    /// Sets each Device's `status.stalled` for the TaskRun intents it has not accepted (the earliest, when several
    /// runs wait on it) and clears it once the device accepted, or its run ended or is gone. An agent upgrade's
    /// stall (set by the engine) is left alone. A stall naming a running run not judged yet (its view is still
    /// reading NATS after a restart) stays as it is.
    async fn mark_devices(&self, runs: &[Arc<TaskRun>]) {
        let mut want: BTreeMap<&str, Stalled> = BTreeMap::new();
        for st in self.stalls.values() {
            for (d, since) in &st.devices {
                let next = Stalled {
                    phase: stall::NOT_ACCEPTED.into(),
                    since: since.to_string(),
                    task_run: Some(st.run.clone()),
                };
                want.entry(d.as_str())
                    .and_modify(|w| {
                        if next.since < w.since {
                            *w = next.clone();
                        }
                    })
                    .or_insert(next);
            }
        }
        let running: HashSet<String> = runs
            .iter()
            .filter(|r| {
                let uid = AttemptId::try_from(r.uid().unwrap_or_default().as_str()).ok();
                let done = uid.and_then(|u| self.finished.get(&u)).is_some();
                !done
                    && r.status
                        .as_ref()
                        .is_some_and(|s| s.run.phase == Some(TaskRunPhase::Running))
            })
            .map(|r| run_ref(r))
            .collect();
        let judged: HashSet<&str> = self.stalls.values().map(|s| s.run.as_str()).collect();
        let mut writes = Vec::new();
        for dev in self.devices.state() {
            let name = dev.name_any();
            let current = dev.status.as_ref().and_then(|s| s.stalled.as_ref());
            let next = match (current, want.get(name.as_str())) {
                (Some(c), _) if c.task_run.is_none() => continue,
                (c, Some(w)) if c == Some(w) => continue,
                (_, Some(w)) => Some(w.clone()),
                (Some(c), None) => {
                    let r = c.task_run.as_deref().unwrap_or_default();
                    if running.contains(r) && !judged.contains(r) {
                        continue;
                    }
                    None
                }
                (None, None) => continue,
            };
            writes.push((name, next));
        }
        if writes.is_empty() {
            return;
        }
        let api: kube::Api<Device> = kube::Api::all(self.client.clone());
        futures::stream::iter(writes)
            .for_each_concurrent(DEVICE_WRITES_AT_ONCE, |(name, next)| {
                let api = api.clone();
                async move {
                    match &next {
                        Some(s) => log::info!(
                            "device {name}: stalled: has not accepted the intent of TaskRun {} written {}",
                            s.task_run.as_deref().unwrap_or_default(),
                            s.since
                        ),
                        None => log::info!("device {name}: no longer stalled on a TaskRun"),
                    }
                    let patch = serde_json::json!({"status": {"stalled": next}});
                    if let Err(e) = api
                        .patch_status(&name, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(patch))
                        .await
                    {
                        log::warn!("device {name}: status.stalled: {e}");
                    }
                }
            })
            .await;
    }

    /// One run's pass; returns when it wants to run again at the latest. Decides with [`pass::decide`], then
    /// carries the step out.
    async fn reconcile(
        &mut self,
        link: Option<&Link>,
        nats_error: Option<&str>,
        run: &TaskRun,
        uid: AttemptId,
    ) -> Option<Timestamp> {
        let old = run.status.clone().unwrap_or_default();
        let now = Timestamp::now();
        let expires = created_at(run).plus(Duration::from_secs(run.spec.deadline_seconds));
        let phase = self
            .finished
            .get(&uid)
            .copied()
            .or(old.run.phase)
            .unwrap_or(TaskRunPhase::Planning);
        let busy = self
            .views
            .keys()
            .filter(|k| !self.plans.contains_key(*k))
            .count();
        let deleting = run.metadata.deletion_timestamp.is_some();
        let facts = pass::Facts {
            phase,
            old: &old.run,
            deleting,
            finalizer: has_finalizer(run),
            spec_problem: match deleting || phase.is_terminal() {
                true => None,
                false => run_status::spec_check(run).err(),
            },
            nats: link.is_some(),
            cleaned: self.cleaned.contains(&uid),
            cleanup_slot: busy < CLEANUPS_AT_ONCE || self.views.contains_key(&uid),
            expires,
            intent_age: layout::bucket(layout::SYSTEM_UPGRADE_INTENT)
                .and_then(|b| b.max_age)
                .unwrap_or_default(),
            now,
        };
        let step = pass::decide(&facts);
        if !matches!(step, Step::Status(_) | Step::Advance) {
            self.stalls.remove(&uid);
            // Ended, or deleted: it gives no device anything more.
            self.reasons.remove(&uid);
        }
        match step {
            Step::Idle => None,
            Step::Wait(at) => Some(at),
            Step::RemoveFinalizer => {
                if deleting && link.is_none() {
                    log::info!(
                        "TaskRun {}: deleted past its deadline ({expires}) with NATS unreachable: no device starts \
                         its intents any more; removing the finalizer",
                        run.name_any()
                    );
                }
                match self.remove_finalizer(run).await {
                    true => None,
                    false => Some(Timestamp::now().plus(pass::CLEANUP_RETRY)),
                }
            }
            Step::CleanUp(finalizer) => {
                if deleting {
                    log::info!("run {uid} deleted: removing the intents no device has taken");
                }
                if let Some(link) = link {
                    self.clean_up(link, uid).await;
                }
                let clean = self.cleaned.contains(&uid);
                let remove = match finalizer {
                    Finalizer::Absent => false,
                    Finalizer::RemoveWhenClean => clean,
                    Finalizer::Remove => true,
                };
                let removed = !remove || self.remove_finalizer(run).await;
                (!clean || !removed).then(|| Timestamp::now().plus(pass::CLEANUP_RETRY))
            }
            Step::Status(report) => {
                // Refused spec: nothing more is released, so the devices not given the run yet say so; those given
                // it keep their last entry (no NATS: every entry stays as last judged).
                if let (Some(problem), Some((change, entries))) =
                    (&facts.spec_problem, self.reasons.get_mut(&uid))
                {
                    blocking::spec_held(change, problem, entries);
                }
                self.write(
                    run,
                    report.status,
                    report.problem,
                    report.note,
                    nats_error,
                    None,
                )
                .await;
                None
            }
            Step::Advance => {
                let link = link?;
                self.advance(link, run, uid, now, expires).await
            }
        }
    }

    /// A run that is neither terminal nor deleted: planned ([`Self::plan`]), then advanced ([`Self::progress`]).
    async fn advance(
        &mut self,
        link: &Link,
        run: &TaskRun,
        uid: AttemptId,
        now: Timestamp,
        expires: Timestamp,
    ) -> Option<Timestamp> {
        let plan = match self.plan(link, run, uid, now, expires).await {
            Ok(p) => p,
            Err(None) => return Some(Timestamp::now().plus(pass::CLEANUP_RETRY)),
            Err(Some(report)) => {
                let wake = self.retries.get(&uid).map(|r| r.1);
                self.write(run, report.status, report.problem, report.note, None, None)
                    .await;
                return wake;
            }
        };
        let report = self.progress(link, run, uid, &plan, now).await;
        let terminal = report.status.phase.is_some_and(TaskRunPhase::is_terminal);
        if terminal {
            self.stalls.remove(&uid);
        }
        let stalled = self.stalls.get(&uid).map(|st| {
            let examples = stall::Stalls {
                devices: st.devices.clone(),
                wake: None,
            }
            .examples();
            StallReport {
                count: st.devices.len() as u32,
                examples,
                timeout: self.accept_timeout,
            }
        });
        let stall_wake = self.stalls.get(&uid).and_then(|st| st.wake);
        let written = self
            .write(
                run,
                report.status.clone(),
                report.problem,
                report.note,
                None,
                stalled,
            )
            .await;
        if terminal && written {
            if let Some(p) = report.status.phase {
                self.finished.insert(uid, p);
            }
            self.clean_up(link, uid).await;
            return None;
        }
        Some(stall_wake.map_or(plan.expires_at, |w| w.min(plan.expires_at)))
    }

    /// The run's plan: held, loaded, or planned and stored now ([`pass::plan_step`]). `Err(Some)` carries the status
    /// to write instead; `Err(None)`: nothing to write (the finalizer was added, or could not be).
    async fn plan(
        &mut self,
        link: &Link,
        run: &TaskRun,
        uid: AttemptId,
        now: Timestamp,
        expires: Timestamp,
    ) -> Result<Arc<TaskPlan>, Option<Report>> {
        let plans = link
            .store(layout::TASK_PLANS)
            .map_err(|e| Some(pass::planning(None, Some(e.to_string()))))?;
        let loaded = match self.plans.get(&uid) {
            Some(p) => Ok(Some(p.clone())),
            None => store::load(plans, &uid)
                .await
                .map(|p| p.map(Arc::new))
                .map_err(|e| e.to_string()),
        };
        let old = run
            .status
            .as_ref()
            .map(|s| s.run.clone())
            .unwrap_or_default();
        let facts = pass::PlanFacts {
            uid,
            old: &old,
            loaded,
            info_synced: self.info.is_synced(),
            retry: self.retries.get(&uid).copied(),
            finalizer: has_finalizer(run),
            expires,
            now,
        };
        let targets = || {
            let (labels, groups) = snapshot(&self.devices.state(), &self.groups.state());
            let capable = |d: &DeviceId| {
                self.info.with(d.as_str(), |s| {
                    s.and_then(|s| s.value.as_ref())
                        .is_some_and(|i| i.capabilities.contains(&Capability::AptFullUpgradeV1))
                })
            };
            planning::plan_targets(&run.spec, &groups, &labels, capable)
        };
        let plan = match pass::plan_step(facts, targets) {
            PlanStep::Use(p) => {
                self.plans.insert(uid, p.clone());
                return Ok(p);
            }
            PlanStep::Report(r) => return Err(Some(r)),
            PlanStep::Retry {
                failures,
                at,
                report,
            } => {
                self.retries.insert(uid, (failures, at));
                log::warn!(
                    "TaskRun {}: {}; planning again in {:?}",
                    run.name_any(),
                    report.problem.as_deref().unwrap_or_default(),
                    Duration::from_millis(at.unix_ms().saturating_sub(now.unix_ms()))
                );
                return Err(Some(report));
            }
            PlanStep::AddFinalizer => {
                self.retries.remove(&uid);
                self.add_finalizer(run).await;
                return Err(None);
            }
            PlanStep::Create(plan) => plan,
        };
        self.retries.remove(&uid);
        let plan = match store::create(plans, &plan).await {
            Ok(store::Created::Written(p)) => {
                super::fault::crash_point("plan-created");
                log::info!(
                    "TaskRun {}: plan of {} devices ({} canaries) created",
                    run.name_any(),
                    p.canaries.len() + p.others.len(),
                    p.canaries.len()
                );
                p
            }
            Ok(store::Created::Loaded(p)) => p,
            Err(e) => return Err(Some(pass::planning(None, Some(e.to_string())))),
        };
        let p = Arc::new(plan);
        self.plans.insert(uid, p.clone());
        Ok(p)
    }

    /// Adds [`pass::FINALIZER`] (a JSON patch that fails, changing nothing, if the finalizers changed meanwhile:
    /// the next pass looks again).
    async fn add_finalizer(&self, run: &TaskRun) {
        let mut patch = vec![
            serde_json::json!({"op": "test", "path": "/metadata/finalizers",
            "value": run.metadata.finalizers}),
        ];
        patch.push(match run.finalizers().is_empty() {
            true => serde_json::json!({"op": "add", "path": "/metadata/finalizers", "value": [pass::FINALIZER]}),
            false => serde_json::json!({"op": "add", "path": "/metadata/finalizers/-", "value": pass::FINALIZER}),
        });
        match self.patch(run, patch).await {
            Ok(()) => log::info!(
                "TaskRun {}: finalizer {} added",
                run.name_any(),
                pass::FINALIZER
            ),
            Err(e) => changed_meanwhile(run, "adding the finalizer", &e),
        }
    }

    /// Removes [`pass::FINALIZER`] (tested by index, so that another finalizer is never removed instead); false
    /// when that failed (the next pass tries again).
    async fn remove_finalizer(&self, run: &TaskRun) -> bool {
        let Some(i) = run.finalizers().iter().position(|f| f == pass::FINALIZER) else {
            return true;
        };
        let path = format!("/metadata/finalizers/{i}");
        let patch = vec![
            serde_json::json!({"op": "test", "path": path, "value": pass::FINALIZER}),
            serde_json::json!({"op": "remove", "path": path}),
        ];
        match self.patch(run, patch).await {
            Ok(()) => {
                log::info!(
                    "TaskRun {}: finalizer {} removed",
                    run.name_any(),
                    pass::FINALIZER
                );
                true
            }
            Err(kube::Error::Api(s)) if s.code == 404 => true,
            Err(e) => {
                changed_meanwhile(run, "removing the finalizer", &e);
                false
            }
        }
    }

    async fn patch(&self, run: &TaskRun, ops: Vec<serde_json::Value>) -> Result<(), kube::Error> {
        let patch: json_patch::Patch = serde_json::from_value(serde_json::Value::Array(ops))
            .map_err(kube::Error::SerdeError)?;
        let api: kube::Api<TaskRun> =
            kube::Api::namespaced(self.client.clone(), &run.namespace().unwrap_or_default());
        api.patch(
            &run.name_any(),
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Json::<()>(patch),
        )
        .await
        .map(|_| ())
    }

    /// Starts the run's view unless it runs, and returns it.
    fn view(&mut self, link: &Link, uid: AttemptId) -> Result<&RunView, NatsError> {
        if self.views.get(&uid).is_some_and(RunView::is_broken) {
            self.views.remove(&uid);
        }
        if !self.views.contains_key(&uid) {
            let v = RunView::start(
                &link.client,
                link.store(layout::SYSTEM_UPGRADE_INTENT)?,
                link.store(layout::SYSTEM_UPGRADE_STATUS)?,
                &uid,
                &self.notify,
            );
            self.views.insert(uid, v);
        }
        self.views.get(&uid).ok_or_else(|| NatsError {
            op: "run view".into(),
            message: "missing".into(),
        })
    }

    /// A running run's step: release, results, deadline, removal of terminal intents ([`pass::advance`]).
    async fn progress(
        &mut self,
        link: &Link,
        run: &TaskRun,
        uid: AttemptId,
        plan: &TaskPlan,
        now: Timestamp,
    ) -> Report {
        // Until the view has read the keys, the counts already reported stand.
        let reported = run.status.as_ref().map(|s| &s.run);
        if let Err(e) = self.view(link, uid) {
            let mut r = pass::unsynced(plan, reported);
            r.status.latest_error = Some(BoundedText::lossy(e.to_string()));
            return r;
        }
        let Some(view) = self.views.get(&uid) else {
            return pass::unsynced(plan, None);
        };
        if !view.is_synced() {
            return pass::unsynced(plan, reported);
        }
        // Authorization is current: resolved from the caches now, right before any intent is written.
        let (_, groups) = snapshot(&self.devices.state(), &self.groups.state());
        let authorized = planning::authorized(&run.spec.placement.allowed_groups, &groups);
        let state = |d: &DeviceId| {
            let (released, st) = view.device(d, &uid);
            DeviceState {
                released,
                outcome: st
                    .map(|s| progress::accept(&s, d, &uid, plan.expires_at))
                    .unwrap_or(Outcome::Pending),
            }
        };
        let step = pass::advance(plan, state, &authorized, view.live_intents(), now);
        // Why each device without a success waits, as this step decided, for its Device's status.blocking.
        let change = blocking::change(&run.namespace().unwrap_or_default(), &run.name_any());
        let timeout = self.accept_timeout;
        let reasons = step
            .waits
            .iter()
            .map(|(d, w)| {
                let b = blocking::reason(&change, w, || {
                    let status = view.device(d, &uid).1;
                    blocking::Given {
                        status,
                        seen: view.intent_seen(d, &uid),
                        now,
                        timeout,
                    }
                });
                (d.clone(), b)
            })
            .collect();
        let stalls = stall::stalls(
            plan.targets(),
            |d| view.intent_seen(d, &uid),
            now,
            self.accept_timeout,
        );
        let mut report = step.report;
        let mut errors = vec![];
        if !step.release.is_empty() {
            if let Err(e) = self.release(link, uid, plan, &step.release).await {
                errors.push(e.to_string());
            }
        }
        if let Err(e) = self.remove_intents(link, &step.remove).await {
            errors.push(e.to_string());
        }
        if let Some(e) = errors.into_iter().next() {
            report.status.latest_error = Some(BoundedText::lossy(e));
        }
        self.reasons.insert(uid, (change, reasons));
        self.stalls.insert(
            uid,
            RunStalls {
                run: run_ref(run),
                devices: stalls.devices,
                wake: stalls.wake,
            },
        );
        report
    }

    /// Writes the intents of `devices` (see [`intents::release`]).
    async fn release(
        &self,
        link: &Link,
        uid: AttemptId,
        plan: &TaskPlan,
        devices: &[DeviceId],
    ) -> Result<(), NatsError> {
        let store = link.store(layout::SYSTEM_UPGRADE_INTENT)?;
        let mirror = self.views.get(&uid).map(|v| v.intents.clone());
        log::info!("run {uid}: releasing {} devices", devices.len());
        intents::release(store, mirror, plan, devices)
            .await
            .map(|_| ())
    }

    async fn remove_intents(&self, link: &Link, keys: &[String]) -> Result<(), NatsError> {
        if keys.is_empty() {
            return Ok(());
        }
        intents::remove(link.store(layout::SYSTEM_UPGRADE_INTENT)?, keys).await
    }

    /// Removes every intent a terminal run still has (an updater that already accepted its attempt finishes it;
    /// one that has not never starts it), then forgets the run's view.
    async fn clean_up(&mut self, link: &Link, uid: AttemptId) {
        if self.cleaned.contains(&uid) {
            return;
        }
        let live = match self.view(link, uid) {
            Ok(v) if v.is_synced() => v.live_intents(),
            Ok(_) => return,
            Err(e) => {
                log::warn!("run {uid}: {e}");
                return;
            }
        };
        match self.remove_intents(link, &live).await {
            Ok(()) => {
                self.cleaned.insert(uid);
                self.views.remove(&uid);
                self.plans.remove(&uid);
            }
            Err(e) => log::warn!("run {uid}: {e}"),
        }
    }

    /// Writes the run's status; true when it was written (or already current).
    async fn write(
        &self,
        run: &TaskRun,
        status: TaskRunStatus,
        problem: Option<String>,
        note: Option<String>,
        nats_error: Option<&str>,
        stalled: Option<StallReport>,
    ) -> bool {
        let old = run.status.clone().unwrap_or_default();
        let phase = status.phase.unwrap_or(TaskRunPhase::Planning);
        // Not judged in this pass (no NATS, the view still reading): the last judgement stands.
        let kept = old
            .conditions
            .iter()
            .find(|c| c.type_ == conditions::PROGRESSING && c.reason == conditions::REASON_STALLED)
            .filter(|_| phase == TaskRunPhase::Running && stalled.is_none());
        let (progressing, stalled_count) = match kept {
            Some(c) => (
                conditions::Want {
                    type_: conditions::PROGRESSING,
                    ok: false,
                    reason: conditions::REASON_STALLED,
                    message: c.message.clone(),
                },
                old.stalled,
            ),
            None => {
                let s = stalled.unwrap_or_default();
                (run_status::progressing(phase, &s), s.count)
            }
        };
        let message = match phase {
            TaskRunPhase::Planning => "freezing the target plan".to_owned(),
            TaskRunPhase::Running => format!(
                "{} of {} devices succeeded, {} failed{}",
                status.succeeded,
                status.targets,
                status.failed,
                match stalled_count {
                    0 => String::new(),
                    n => format!(", {n} stalled"),
                }
            ),
            TaskRunPhase::Complete => format!("all {} devices succeeded", status.targets),
            TaskRunPhase::Failed => status
                .latest_error
                .as_ref()
                .map(|e| e.to_string())
                .unwrap_or_else(|| "failed".into()),
        };
        let wants = [
            run_status::ready(phase, status.reason, problem.as_deref(), message),
            progressing,
            conditions::nats_reachable(nats_error),
        ];
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let frozen = run_status::spec_check(run).ok();
        let next = run_status::next(
            &old,
            status,
            stalled_count,
            &wants,
            run.metadata.generation,
            &now,
            frozen,
        );
        match run_status::write(&self.client, &self.recorder, run, &next, note).await {
            Ok(_) => true,
            Err(kube::Error::Api(s)) if s.code == 409 => {
                log::debug!("TaskRun {}: changed meanwhile; next pass", run.name_any());
                false
            }
            Err(e) => {
                log::warn!("TaskRun {}: status write: {e}", run.name_any());
                false
            }
        }
    }
}
