//! The operator's control loop: watches the four CRDs (reflector caches) and the NATS buckets (in-memory
//! mirrors), and on every change runs one level-triggered pass that places workloads, writes agent-upgrade
//! intents, mirrors device status and reports conditions.
//!
//! Placement is a function of every device, group and deployment together, so one global pass (debounced)
//! replaces per-object reconcilers. Replicas need no leader: every NATS write is a compare-and-set by revision
//! that re-reads and re-decides on conflict (see `kv::cas_write`), so two replicas that decide the same thing
//! write it once, and Kubernetes status writes are idempotent merge patches.

use crate::cache::cache;
use crate::conditions::{self, Want};
use crate::crd::{
    AgentRelease, Device, DeviceGroup, DeviceGroupStatus, FleetDeployment, PlacementStatus,
    HOLD_ANNOTATION,
};
use crate::kv::{self, CasOutcome, Mirror, NatsError};
use crate::mirror::{self, Reported};
use crate::placement::{self, DeploymentInput, GroupError, Labels, PlacementError};
use crate::release::{self, IntentDecision, ReleaseCounts};
use crate::{health, report, validate};
use async_nats::jetstream::kv::Store;
use fleet_wire::kv as layout;
use fleet_wire::{
    AgentUpgradeAttempt, AgentUpgradeStatus, AttemptId, DesiredState, DeviceId, DeviceInfo,
    DeviceWorkloadStatus, Heartbeat, WorkloadSpec,
};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::events::Recorder;
use kube::runtime::reflector::Store as Cache;
use kube::{Client, ResourceExt};
use serde::de::DeserializeOwned;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// Concurrent NATS writes per pass.
pub const WRITE_CONCURRENCY: usize = 1024;
/// Concurrent Kubernetes writes per pass.
pub const KUBE_CONCURRENCY: usize = 16;
/// Changes arriving within this window are handled by one pass.
pub const DEBOUNCE: Duration = Duration::from_millis(100);
/// A pass runs at least this often, to repair anything a missed event left behind.
pub const RESYNC: Duration = Duration::from_secs(60);

/// How the operator runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// `nats://host:port`.
    pub nats_url: String,
    /// This replica's name for events (the pod name).
    pub instance: Option<String>,
    /// Only fleet objects with these labels (a Kubernetes label selector, e.g. `fleet=eu`) are handled: lets
    /// several fleets (or parallel tests) share one cluster without seeing each other.
    pub label_selector: Option<String>,
}

/// A live NATS connection: the buckets and the watches that keep the mirrors current.
struct Link {
    client: async_nats::Client,
    stores: BTreeMap<&'static str, Store>,
    watches: Vec<tokio::task::JoinHandle<NatsError>>,
}

impl Drop for Link {
    fn drop(&mut self) {
        for w in &self.watches {
            w.abort();
        }
    }
}

impl Link {
    /// Feeds `mirror` from a watch of its own bucket, waking `notify` on every change.
    fn watch<T: DeserializeOwned + Clone + Send + Sync + 'static>(
        &mut self,
        mirror: &Arc<Mirror<T>>,
        notify: &Arc<Notify>,
    ) -> Result<(), NatsError> {
        let store = self.store(mirror.bucket())?.clone();
        self.watches
            .push(tokio::spawn(mirror.clone().run(store, notify.clone())));
        Ok(())
    }

    fn store(&self, bucket: &str) -> Result<&Store, NatsError> {
        self.stores.get(bucket).ok_or_else(|| NatsError {
            op: format!("open bucket {bucket}"),
            message: "not in the layout".into(),
        })
    }
    fn broken(&self) -> Option<String> {
        if self.watches.iter().any(|w| w.is_finished()) {
            return Some("a KV watch ended".into());
        }
        match self.client.connection_state() {
            async_nats::connection::State::Connected => None,
            s => Some(format!("connection {s}")),
        }
    }
}

/// The NATS mirrors the operator keeps.
pub struct Mirrors {
    /// `device-info`.
    pub info: Arc<Mirror<DeviceInfo>>,
    /// `device-heartbeat`.
    pub heartbeat: Arc<Mirror<Heartbeat>>,
    /// `agent-upgrade-status`.
    pub upgrade: Arc<Mirror<AgentUpgradeStatus>>,
    /// `device-desired-state` (what this or another replica wrote).
    pub desired: Arc<Mirror<DesiredState>>,
    /// `agent-upgrade-intent`.
    pub intent: Arc<Mirror<AgentUpgradeAttempt>>,
    /// `device-workload-status`.
    pub workloads: Arc<Mirror<DeviceWorkloadStatus>>,
}

impl Default for Mirrors {
    fn default() -> Self {
        Self {
            info: Mirror::new(layout::DEVICE_INFO),
            heartbeat: Mirror::new(layout::DEVICE_HEARTBEAT),
            upgrade: Mirror::new(layout::AGENT_UPGRADE_STATUS),
            desired: Mirror::new(layout::DESIRED_STATE),
            intent: Mirror::new(layout::AGENT_UPGRADE_INTENT),
            workloads: Mirror::new(layout::WORKLOAD_STATUS),
        }
    }
}

impl Mirrors {
    fn synced(&self) -> bool {
        self.desired.is_synced() && self.intent.is_synced()
    }
}

async fn open_link(url: &str, m: &Mirrors, notify: &Arc<Notify>) -> Result<Link, NatsError> {
    let (client, js) = kv::connect(url).await?;
    let stores = kv::ensure_buckets(&js).await?;
    let mut link = Link {
        client,
        stores,
        watches: vec![],
    };
    link.watch(&m.info, notify)?;
    link.watch(&m.heartbeat, notify)?;
    link.watch(&m.upgrade, notify)?;
    link.watch(&m.desired, notify)?;
    link.watch(&m.intent, notify)?;
    link.watch(&m.workloads, notify)?;
    Ok(link)
}

/// Runs the operator until the task is dropped or aborted.
pub async fn run(
    client: Client,
    opts: Options,
) -> Result<(), kube::runtime::reflector::store::WriterDropped> {
    let notify = Arc::new(Notify::new());
    let devices = cache::<Device>(&client, &opts.label_selector, &notify);
    let groups = cache::<DeviceGroup>(&client, &opts.label_selector, &notify);
    let deployments = cache::<FleetDeployment>(&client, &opts.label_selector, &notify);
    let releases = cache::<AgentRelease>(&client, &opts.label_selector, &notify);
    // Never place from a partial view: a missing deployment would look like "remove its workloads".
    devices.wait_until_ready().await?;
    groups.wait_until_ready().await?;
    deployments.wait_until_ready().await?;
    releases.wait_until_ready().await?;
    log::info!("caches synced; NATS at {}", opts.nats_url);
    let engine = Engine {
        client: client.clone(),
        recorder: report::recorder(client, opts.instance.clone()),
        devices,
        groups,
        deployments,
        releases,
        mirrors: Mirrors::default(),
        new_device_labels: selector_labels(opts.label_selector.as_deref()),
    };
    let mut link: Option<Link> = None;
    loop {
        if let Some(why) = link.as_ref().and_then(Link::broken) {
            log::warn!("NATS link lost ({why}); reconnecting");
            link = None;
        }
        let mut nats_error = None;
        if link.is_none() {
            match open_link(&opts.nats_url, &engine.mirrors, &notify).await {
                Ok(l) => link = Some(l),
                Err(e) => {
                    log::warn!("{e}");
                    nats_error = Some(e.to_string());
                }
            }
        }
        // Wait for the desired-state and intent mirrors before the first writes (CAS would be safe anyway,
        // but every write would first lose a race).
        let ready = link.is_some() && engine.mirrors.synced();
        if link.is_none() || ready {
            engine.pass(link.as_ref(), nats_error).await;
        }
        let wait = if link.is_none() {
            Duration::from_secs(2)
        } else {
            RESYNC
        };
        tokio::select! {
            _ = notify.notified() => {}
            _ = tokio::time::sleep(wait) => {}
        }
        tokio::time::sleep(DEBOUNCE).await;
    }
}

/// Tasks one pass's desired-state writes are spread over, so that deciding, encoding and bookkeeping run on more
/// than one core. Together they keep at most [`WRITE_CONCURRENCY`] writes in flight.
pub const WRITE_SHARDS: usize = 2;

/// Writes each device's desired state (compare-and-set; unchanged ones are skipped). Returns how many keys were
/// written, or the first error (the other writes then stop). Used by the control loop and by the benchmark.
pub async fn write_desired(
    store: &Store,
    mirror: &Arc<Mirror<DesiredState>>,
    per_device: BTreeMap<DeviceId, Arc<[WorkloadSpec]>>,
) -> Result<usize, NatsError> {
    let mut shards: Vec<Vec<(DeviceId, Arc<[WorkloadSpec]>)>> = (0..WRITE_SHARDS)
        .map(|_| Vec::with_capacity(per_device.len() / WRITE_SHARDS + 1))
        .collect();
    for (i, item) in per_device.into_iter().enumerate() {
        shards[i % WRITE_SHARDS].push(item);
    }
    let mut tasks = AbortOnDrop(
        shards
            .into_iter()
            .map(|shard| {
                let (store, mirror) = (store.clone(), mirror.clone());
                tokio::spawn(async move {
                    write_desired_shard(&store, &mirror, shard, WRITE_CONCURRENCY / WRITE_SHARDS)
                        .await
                })
            })
            .collect(),
    );
    let mut done: futures::stream::FuturesUnordered<_> = tasks.0.iter_mut().collect();
    let mut written = 0;
    while let Some(joined) = done.next().await {
        written += match joined {
            Ok(result) => result?,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => {
                return Err(NatsError {
                    op: "write desired states".into(),
                    message: e.to_string(),
                })
            }
        };
    }
    Ok(written)
}

/// Spawned tasks that end when this is dropped (an error, or the caller dropped).
struct AbortOnDrop<T>(Vec<tokio::task::JoinHandle<T>>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}

async fn write_desired_shard(
    store: &Store,
    mirror: &Mirror<DesiredState>,
    items: Vec<(DeviceId, Arc<[WorkloadSpec]>)>,
    concurrency: usize,
) -> Result<usize, NatsError> {
    // Owned items (taken, not copied): borrowed ones make the future's lifetimes too general for `tokio::spawn`.
    futures::stream::iter(items)
        .map(|(dev, want)| async move {
            kv::cas_write(
                store,
                mirror,
                &layout::device_key(&dev),
                |cur: Option<&DesiredState>| {
                    if cur.is_some_and(|c| c.workloads[..] == want[..]) {
                        return None;
                    }
                    let generation = cur.map(|c| c.generation + 1).unwrap_or(1);
                    match DesiredState::new(dev.clone(), generation, want.to_vec()) {
                        Ok(s) => Some(s),
                        Err(e) => {
                            log::warn!("desired state of {dev}: {e}");
                            None
                        }
                    }
                },
            )
            .await
        })
        .buffer_unordered(concurrency)
        .try_fold(0, |written, outcome| async move {
            Ok(written + usize::from(matches!(outcome, CasOutcome::Written(_))))
        })
        .await
}

/// Each device's current workloads from the desired-state mirror, as [`placement::desired_workloads`] reads
/// them. Only a deployment whose placement failed reads them (to hold what runs), so without one the copy is
/// skipped.
pub fn current_workloads(
    mirror: &Mirror<DesiredState>,
    inputs: &[DeploymentInput],
) -> BTreeMap<DeviceId, Vec<WorkloadSpec>> {
    if inputs.iter().all(|i| i.targets.is_ok()) {
        return BTreeMap::new();
    }
    mirror
        .values()
        .into_values()
        .map(|s| (s.device_id, s.workloads))
        .collect()
}

struct Engine {
    client: Client,
    recorder: Recorder,
    devices: Cache<Device>,
    groups: Cache<DeviceGroup>,
    deployments: Cache<FleetDeployment>,
    releases: Cache<AgentRelease>,
    mirrors: Mirrors,
    new_device_labels: BTreeMap<String, String>,
}

/// Labels for Device objects the operator creates: the `key=value` terms of the label selector, so that the
/// operator sees what it creates.
pub fn selector_labels(selector: Option<&str>) -> BTreeMap<String, String> {
    selector
        .unwrap_or_default()
        .split(',')
        .filter_map(|term| {
            let (k, v) = term.split_once('=')?;
            let (k, v) = (
                k.trim().trim_end_matches('='),
                v.trim().trim_start_matches('='),
            );
            (!k.is_empty() && !k.ends_with('!')).then(|| (k.to_owned(), v.to_owned()))
        })
        .collect()
}

fn ready_want(result: &Result<String, (&'static str, String)>) -> Want {
    match result {
        Ok(m) => Want {
            type_: conditions::READY,
            ok: true,
            reason: conditions::REASON_PLACED,
            message: m.clone(),
        },
        Err((reason, m)) => Want {
            type_: conditions::READY,
            ok: false,
            reason,
            message: m.clone(),
        },
    }
}

/// A release's counts and a few failed devices' descriptions, or why it could not be placed (reason, message).
type ReleaseResult = Result<(ReleaseCounts, Vec<String>), (&'static str, String)>;

/// Most failed devices a Degraded message names (the counts carry the rest).
const FAILED_EXAMPLES: usize = 5;

/// "1 device", "3 devices".
fn devices(n: u32) -> String {
    if n == 1 {
        "1 device".into()
    } else {
        format!("{n} devices")
    }
}

/// Degraded=True while some targeted devices failed their current attempt, naming a few with their reasons.
fn degraded_want(c: &ReleaseCounts, failed: &[String]) -> Want {
    if c.failed == 0 {
        return Want {
            type_: conditions::DEGRADED,
            ok: false,
            reason: conditions::REASON_NO_FAILURES,
            message: "no targeted device has failed its current attempt".into(),
        };
    }
    let more = (c.failed as usize).saturating_sub(failed.len());
    let tail = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    Want {
        type_: conditions::DEGRADED,
        ok: true,
        reason: conditions::REASON_DEVICES_FAILED,
        message: format!(
            "{} of {} failed the agent upgrade: {}{tail}; see each Device's status.agentUpgrade",
            c.failed,
            devices(c.targeted),
            failed.join(", ")
        ),
    }
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

/// One Kubernetes write of a pass.
type Write<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), kube::Error>> + Send + 'a>>;

impl Engine {
    /// The status patch of `obj` from `old` to `next`, with a Warning event for each condition that just turned
    /// False; `None` when nothing changed.
    fn status_write<'a, K, S>(&'a self, obj: &Arc<K>, old: &S, next: S) -> Option<Write<'a>>
    where
        K: kube::Resource<DynamicType = (), Scope = k8s_openapi::ClusterResourceScope>
            + Clone
            + DeserializeOwned
            + serde::Serialize
            + std::fmt::Debug
            + Send
            + Sync
            + 'a,
        S: conditions::WithConditions + PartialEq + serde::Serialize + Send + Sync + 'a,
    {
        if &next == old {
            return None;
        }
        let failing: Vec<_> = conditions::newly_failing(old.conditions(), next.conditions())
            .into_iter()
            .cloned()
            .collect();
        for c in &failing {
            // Once per change, like the Warning event: a condition that stays the same is not logged again.
            log::warn!(
                "{} {}: {} {}: {}",
                K::kind(&()),
                obj.name_any(),
                c.type_,
                c.reason,
                c.message
            );
        }
        let obj = obj.clone();
        Some(Box::pin(async move {
            let f: Vec<_> = failing.iter().collect();
            report::write_status(&self.client, &self.recorder, obj.as_ref(), &next, &f).await
        }))
    }

    async fn pass(&self, link: Option<&Link>, mut nats_error: Option<String>) {
        let now = now();
        // Devices and their labels; names that are not device ids are ignored.
        let mut labels: BTreeMap<DeviceId, Labels> = BTreeMap::new();
        let mut held: BTreeSet<DeviceId> = BTreeSet::new();
        for d in self.devices.state() {
            match DeviceId::try_from(d.name_any().as_str()) {
                Ok(id) => {
                    if d.annotations().contains_key(HOLD_ANNOTATION) {
                        held.insert(id.clone());
                    }
                    labels.insert(id, d.labels().clone());
                }
                Err(e) => log::warn!("Device {:?} ignored: {e}", d.name_any()),
            }
        }
        let device_set: BTreeSet<DeviceId> = labels.keys().cloned().collect();

        // Groups.
        let group_objs = self.groups.state();
        let mut groups: BTreeMap<String, Result<BTreeSet<DeviceId>, GroupError>> = BTreeMap::new();
        for g in &group_objs {
            groups.insert(
                g.name_any(),
                placement::resolve_group(&g.name_any(), &g.spec.selector, &labels),
            );
        }

        // Deployments and the desired state of every device.
        let dep_objs = self.deployments.state();
        let mut inputs = Vec::new();
        let mut dep_results: BTreeMap<String, Result<usize, PlacementError>> = BTreeMap::new();
        let mut dep_targets: BTreeMap<String, BTreeSet<DeviceId>> = BTreeMap::new();
        let mut placed_values: Option<BTreeMap<String, DesiredState>> = None;
        for d in &dep_objs {
            let workloads = validate::deployment_workloads(&d.spec);
            let targets = match &workloads {
                Err(e) => Err(PlacementError::InvalidSpec(e.clone())),
                Ok(_) => placement::place(
                    &d.spec.placement.allowed_groups,
                    &d.spec.placement.target_selector,
                    &groups,
                    &labels,
                ),
            };
            dep_results.insert(
                d.name_any(),
                targets.as_ref().map(|t| t.len()).map_err(Clone::clone),
            );
            if let Ok(t) = &targets {
                dep_targets.insert(d.name_any(), t.clone());
            }
            let workloads = match workloads {
                Ok(w) => w,
                // Invalid workloads: what is placed under the names the spec gives is held (the placed specs
                // themselves, read back), so a typo never takes running workloads off devices.
                Err(_) => {
                    let names = validate::raw_workload_names(&d.spec);
                    let placed = placed_values.get_or_insert_with(|| self.mirrors.desired.values());
                    let mut held: BTreeMap<&str, WorkloadSpec> = BTreeMap::new();
                    for w in placed.values().flat_map(|s| &s.workloads) {
                        if names.contains(w.name.as_str()) {
                            held.entry(w.name.as_str()).or_insert_with(|| w.clone());
                        }
                    }
                    held.into_values().collect()
                }
            };
            inputs.push(DeploymentInput {
                name: d.name_any(),
                workloads,
                targets,
            });
        }
        let current = current_workloads(&self.mirrors.desired, &inputs);
        // Failed deployments that hold something on some device (a new object holds nothing).
        let holding: BTreeSet<String> = inputs
            .iter()
            .filter(|i| i.targets.is_err())
            .filter(|i| {
                let names: BTreeSet<&str> = i.workloads.iter().map(|w| w.name.as_str()).collect();
                current
                    .values()
                    .any(|ws| ws.iter().any(|w| names.contains(w.name.as_str())))
            })
            .map(|i| i.name.clone())
            .collect();
        let mut desired = placement::desired_workloads(&device_set, &inputs, &current);
        // A held device (its Device was deleted and recreated) keeps exactly what it has until a person releases it.
        for id in &held {
            match self.mirrors.desired.get(id.as_str()).and_then(|s| s.value) {
                Some(s) => {
                    desired.per_device.insert(id.clone(), s.workloads.into());
                }
                None => {
                    desired.per_device.remove(id);
                }
            }
        }
        // What each device was given (shared lists, cheap to keep) for the workload health below.
        let given = desired.per_device.clone();
        if let (Some(link), None) = (link, &nats_error) {
            match link.store(layout::DESIRED_STATE) {
                Ok(store) => {
                    match write_desired(store, &self.mirrors.desired, desired.per_device).await {
                        Ok(n) if n > 0 => log::info!("wrote {n} desired states"),
                        Ok(_) => {}
                        Err(e) => nats_error = Some(e.to_string()),
                    }
                }
                Err(e) => nats_error = Some(e.to_string()),
            }
        }

        // Agent releases: the first release (by name) targeting a device owns it.
        let rel_objs = self.releases.state();
        let mut sorted_rel: Vec<_> = rel_objs.iter().collect();
        sorted_rel.sort_by_key(|r| r.name_any());
        let mut owner: BTreeMap<DeviceId, String> = BTreeMap::new();
        let mut rel_results: BTreeMap<String, ReleaseResult> = BTreeMap::new();
        let infos = self.mirrors.info.values();
        let statuses = self.mirrors.upgrade.values();
        for r in sorted_rel {
            let name = r.name_any();
            let builds = match validate::release_builds(&r.spec) {
                Ok(b) => b,
                Err(e) => {
                    rel_results.insert(name, Err((conditions::REASON_INVALID_SPEC, e)));
                    continue;
                }
            };
            let targets = match placement::place(
                &r.spec.placement.allowed_groups,
                &r.spec.placement.target_selector,
                &groups,
                &labels,
            ) {
                Ok(t) => t,
                Err(e) => {
                    rel_results.insert(name, Err((e.reason(), e.to_string())));
                    continue;
                }
            };
            let mut conflicts = Vec::new();
            let mut mine = Vec::new();
            for t in targets {
                match owner.get(&t) {
                    Some(o) => conflicts.push(format!("{t} (owned by AgentRelease {o})")),
                    None => {
                        owner.insert(t.clone(), name.clone());
                        mine.push(t);
                    }
                }
            }
            let mut counts = ReleaseCounts::default();
            let writes = if let (Some(link), None) = (link, &nats_error) {
                match link.store(layout::AGENT_UPGRADE_INTENT) {
                    Ok(store) => {
                        let results: Vec<Result<CasOutcome, NatsError>> =
                            futures::stream::iter(mine.iter().cloned())
                                .map(|dev: DeviceId| {
                                    let info = infos.get(dev.as_str());
                                    let builds = &builds;
                                    async move {
                                        kv::cas_write(
                                            store,
                                            &self.mirrors.intent,
                                            &layout::device_key(&dev),
                                            |cur| match release::decide_intent(
                                                &dev,
                                                info,
                                                builds,
                                                cur,
                                                AttemptId::new_random,
                                            ) {
                                                IntentDecision::Write(a) => {
                                                    log::info!(
                                                "device {dev}: agent-upgrade attempt {} to {}",
                                                a.attempt_id,
                                                a.target_version
                                            );
                                                    Some(a)
                                                }
                                                _ => None,
                                            },
                                        )
                                        .await
                                    }
                                })
                                .buffer_unordered(WRITE_CONCURRENCY)
                                .collect()
                                .await;
                        results.into_iter().find_map(Result::err)
                    }
                    Err(e) => Some(e),
                }
            } else {
                None
            };
            if let Some(e) = writes {
                nats_error = Some(e.to_string());
            }
            let mut failed = Vec::new();
            for dev in &mine {
                let cur = self.mirrors.intent.get(dev.as_str()).and_then(|s| s.value);
                let decision = release::decide_intent(
                    dev,
                    infos.get(dev.as_str()),
                    &builds,
                    cur.as_ref(),
                    AttemptId::new_random,
                );
                let status = statuses.get(dev.as_str());
                if release::count_device(&mut counts, &decision, cur.as_ref(), status)
                    && failed.len() < FAILED_EXAMPLES
                {
                    failed.push(release::describe_failure(dev, status));
                }
            }
            if conflicts.is_empty() {
                rel_results.insert(name, Ok((counts, failed)));
            } else {
                conflicts.truncate(10);
                rel_results.insert(
                    name,
                    Err((
                        conditions::REASON_CONFLICT,
                        format!(
                            "devices targeted by an earlier AgentRelease are skipped: {}",
                            conflicts.join(", ")
                        ),
                    )),
                );
            }
        }

        // Statuses and events.
        crate::metrics::reconciled("deployments", nats_error.is_none());
        let nats = conditions::nats_reachable(nats_error.as_deref());
        let mut kube_writes: Vec<Write<'_>> = Vec::new();
        for g in &group_objs {
            let (count, want) = match groups.get(&g.name_any()) {
                Some(Ok(m)) => (
                    Some(m.len() as u32),
                    ready_want(&Ok(devices(m.len() as u32))),
                ),
                Some(Err(e)) => (
                    None,
                    ready_want(&Err((conditions::REASON_GROUP_SOURCE, e.to_string()))),
                ),
                None => continue,
            };
            let old = g.status.clone().unwrap_or_default();
            let next = DeviceGroupStatus {
                member_count: count,
                conditions: conditions::merge(
                    &old.conditions,
                    &[want],
                    g.metadata.generation,
                    &now,
                ),
            };
            kube_writes.extend(self.status_write(g, &old, next));
        }
        let workload_reports = self.mirrors.workloads.values();
        let dep_workloads: BTreeMap<String, &[WorkloadSpec]> = inputs
            .iter()
            .map(|i| (i.name.clone(), &i.workloads[..]))
            .collect();
        for d in &dep_objs {
            let name = d.name_any();
            let result = match dep_results.get(&name) {
                Some(Ok(n)) => match desired.conflicts.get(&name) {
                    Some(c) => Err((
                        conditions::REASON_CONFLICT,
                        format!(
                            "{} workload placements lost to deployments whose name sorts first, e.g. {} on {} (kept by {})",
                            c.len(), c[0].1, c[0].0, c[0].2
                        ),
                    )),
                    None => Ok(format!("placed on {}", devices(*n as u32))),
                },
                Some(Err(e)) if holding.contains(&name) => Err((e.reason(), format!("{e}; workloads already placed are kept unchanged"))),
                Some(Err(e)) => Err((e.reason(), format!("{e}; nothing is placed until this is fixed"))),
                None => continue,
            };
            let targeted = dep_results
                .get(&name)
                .and_then(|r| r.as_ref().ok())
                .map(|n| *n as u32);
            // Health over the workloads each targeted device was actually given (a lost name conflict is not).
            let health = dep_targets.get(&name).map(|targets| {
                let mine = dep_workloads.get(&name).copied().unwrap_or_default();
                let lost = desired.conflicts.contains_key(&name);
                health::deployment(targets.iter().flat_map(|dev| {
                    let on_device = given.get(dev);
                    let report = workload_reports.get(dev.as_str());
                    mine.iter()
                        .filter(move |w| !lost || on_device.is_some_and(|l| l.contains(w)))
                        .map(move |w| (dev.as_str(), w, report))
                }))
            });
            let old = d.status.clone().unwrap_or_default();
            let next = PlacementStatus {
                observed_generation: d.metadata.generation,
                targeted_devices: targeted,
                workloads: health,
                conditions: conditions::merge(
                    &old.conditions,
                    &[ready_want(&result), nats.clone()],
                    d.metadata.generation,
                    &now,
                ),
                ..Default::default()
            };
            kube_writes.extend(self.status_write(d, &old, next));
        }
        for r in &rel_objs {
            let name = r.name_any();
            let Some(result) = rel_results.get(&name) else {
                continue;
            };
            let counts = result.as_ref().ok().map(|(c, _)| *c);
            let ready = result
                .as_ref()
                .map(|(c, _)| {
                    format!(
                        "{}, {} up to date, {} failed",
                        devices(c.targeted),
                        c.up_to_date,
                        c.failed
                    )
                })
                .map_err(Clone::clone);
            let mut wants = vec![ready_want(&ready), nats.clone()];
            if let Ok((c, failed)) = result {
                wants.push(degraded_want(c, failed));
            }
            let old = r.status.clone().unwrap_or_default();
            let next = PlacementStatus {
                observed_generation: r.metadata.generation,
                targeted_devices: counts.map(|c| c.targeted),
                up_to_date: counts.map(|c| c.up_to_date),
                failed: counts.map(|c| c.failed),
                in_progress: counts.map(|c| c.in_progress),
                workloads: None,
                conditions: conditions::merge(&old.conditions, &wants, r.metadata.generation, &now),
            };
            kube_writes.extend(self.status_write(r, &old, next));
        }

        // Devices: create the ones that reported, mirror what they report.
        for id in infos.keys() {
            if DeviceId::try_from(id.as_str()).is_ok() && !labels.keys().any(|d| d.as_str() == id) {
                let id = id.clone();
                let new_labels = &self.new_device_labels;
                // Workloads already placed: the Device was deleted. Recreated without its labels it would be
                // targeted by nothing and lose every workload; it is held instead.
                let hold = self
                    .mirrors
                    .desired
                    .get(&id)
                    .and_then(|s| s.value)
                    .is_some_and(|s| !s.workloads.is_empty());
                if hold {
                    log::warn!("Device {id} is missing but the device runs workloads: recreating it with {HOLD_ANNOTATION}=true (its workloads are kept until a person labels it and removes the annotation)");
                }
                kube_writes.push(Box::pin(async move {
                    report::create_device(&self.client, &id, new_labels, hold).await
                }));
            }
        }
        let heartbeats = self.mirrors.heartbeat.values();
        for d in self.devices.state() {
            let id = d.name_any();
            let reported = Reported {
                info: infos.get(&id).cloned(),
                heartbeat: heartbeats.get(&id).cloned(),
                upgrade: statuses.get(&id).cloned(),
                workloads: workload_reports.get(&id).cloned(),
            };
            // Nothing reported (yet, or by another fleet's NATS): leave the status alone.
            if reported == Reported::default() {
                continue;
            }
            if let Some(next) = mirror::device_status(d.status.as_ref(), &reported) {
                kube_writes.push(Box::pin(async move {
                    report::write_device_status(&self.client, &id, &next).await
                }));
            }
        }
        let errors: Vec<kube::Error> = futures::stream::iter(kube_writes)
            .buffer_unordered(KUBE_CONCURRENCY)
            .filter_map(|r| async move { r.err() })
            .collect()
            .await;
        if let Some(e) = errors.first() {
            log::warn!(
                "{} Kubernetes writes failed, e.g.: {e}; retried on the next pass",
                errors.len()
            );
        }
    }
}
