//! The operator's control loop: watches the four CRDs (reflector caches) and the NATS buckets (in-memory
//! mirrors), and on every change runs one level-triggered pass: a [`Snapshot`] of both, the pure
//! [`plan::plan`] (placement, agent-upgrade intents, statuses), then `apply`, the only I/O (NATS writes,
//! statuses, events, Devices).
//!
//! Placement is a function of every device, group and deployment together, so one global pass (debounced)
//! replaces per-object reconcilers. Replicas need no leader: every NATS write is a compare-and-set by revision
//! that re-reads and re-decides on conflict (see `kv::cas_write`), so two replicas that decide the same thing
//! write it once, and Kubernetes status writes are idempotent merge patches.

use super::device_writes::DeviceWrites;
use super::plan::{self, NewDevice, Plan, Snapshot};
use crate::conditions;
use crate::crd::{AgentRelease, Device, DeviceGroup, FleetDeployment};
use crate::fleet::placement::DeploymentInput;
use crate::fleet::report;
use crate::kv::{self, CasOutcome, Mirror, NatsError};
use crate::nats_link::{Kept, Link, NatsLink};
use crate::runtime::Runtime;
use async_nats::jetstream::kv::Store;
use fleet_wire::kv as layout;
use fleet_wire::{
    AgentUpgradeAttempt, AgentUpgradeStatus, AttemptId, DesiredState, DeviceId, DeviceInfo,
    DeviceSecrets, DeviceWorkloadStatus, Heartbeat, WorkloadSpec,
};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::events::Recorder;
use kube::runtime::reflector::Store as Cache;
use kube::{Client, ResourceExt};
use serde::de::DeserializeOwned;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// Concurrent NATS writes per pass.
pub const WRITE_CONCURRENCY: usize = 1024;
/// Concurrent Kubernetes writes per pass (group, deployment and release statuses; Device writes have their own
/// writer: [`crate::deployments::device_writes`]).
pub const KUBE_CONCURRENCY: usize = 16;
/// Changes arriving within this window are handled by one pass.
pub const DEBOUNCE: Duration = Duration::from_millis(100);
/// A pass runs at least this often, to repair anything a missed event left behind.
pub const RESYNC: Duration = Duration::from_secs(60);
/// After a pass of duration `d`, a change a device made (its reports, its Device object) waits until `PACE × d`
/// has passed before the next pass: every pass looks at the whole fleet, so a fleet whose devices change all the
/// time (100,000 onboarding) would otherwise spend the operator's every cycle on passes, and the API server's on
/// nothing. A person's change of a group, deployment or release is never paced.
pub const PACE: u32 = 2;

/// How long after a pass of duration `last` a device-level change waits before the next pass starts (the
/// debounce aside): `PACE × last`, so that passes woken by devices take at most 1 / (1 + PACE) of the time
/// (3.5-s passes at 100,000 devices: one every ~10 s; 20-ms passes at 1,000: no wait).
pub fn paced(last: Duration) -> Duration {
    last * PACE
}

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
    /// TLS and bucket settings ([`kv::NatsSettings`]).
    pub nats: kv::NatsSettings,
    /// The namespace whose Secrets FleetDeployments name (`--secrets-namespace`; `None`:
    /// [`crate::secrets_source::DEFAULT_NAMESPACE`]).
    pub secrets_namespace: Option<String>,
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
    /// `device-usage` ([`usage_mirror`]).
    pub usage: Arc<Mirror<fleet_wire::DeviceUsage>>,
    /// `device-secrets` (what this or another replica wrote): a device held back by a staged rollout keeps the
    /// value it has ([`super::secrets::deliveries`]).
    pub secrets: Arc<Mirror<DeviceSecrets>>,
    /// `device-retired`: the tombstones (shared with the retirement controller, [`crate::retire`]).
    pub retired: Arc<Mirror<fleet_wire::DeviceRetirement>>,
}

/// The devices whose heartbeats and workload reports always wake the control loop (the plan's
/// [`Plan::heartbeat_watch`]).
pub type HeartbeatWatch = Arc<std::sync::RwLock<std::collections::HashSet<String>>>;

/// The `device-heartbeat` mirror, whose watch wakes the loop for a device's first heartbeat, a new agent version
/// in it, or a device in `watch`; any other beat is recorded quietly (liveness is read from the mirror, and a
/// Device's `lastHeartbeat` is refreshed by the periodic pass: [`crate::deployments::mirror::HEARTBEAT_REFRESH`]).
pub fn heartbeat_mirror(watch: HeartbeatWatch) -> Arc<Mirror<Heartbeat>> {
    Mirror::waking_when(
        layout::DEVICE_HEARTBEAT,
        Box::new(move |key, old: Option<&Heartbeat>, new| match (old, new) {
            (Some(o), Some(n)) if o.agent_version == n.agent_version => watch
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .contains(key),
            _ => true,
        }),
    )
}

/// The `device-workload-status` mirror, whose watch wakes the loop for a changed report or any report of a device
/// in `watch` (it can end a deployment's soak): the agent republishes its workload status on a timer, and a report
/// that differs only in when it was measured is recorded quietly.
pub fn workload_mirror(watch: HeartbeatWatch) -> Arc<Mirror<DeviceWorkloadStatus>> {
    Mirror::waking_when(
        layout::WORKLOAD_STATUS,
        Box::new(
            move |key, old: Option<&DeviceWorkloadStatus>, new| match (old, new) {
                (Some(o), Some(n)) => {
                    o.generation != n.generation
                        || o.workloads != n.workloads
                        || watch
                            .read()
                            .unwrap_or_else(|p| p.into_inner())
                            .contains(key)
                }
                _ => true,
            },
        ),
    )
}

/// The `device-usage` mirror, whose watch wakes the loop only for a report that changes what a Device shows or
/// whether a rollout may give the device a change ([`crate::fleet::usage::wakes`]); the rest are recorded quietly.
pub fn usage_mirror() -> Arc<Mirror<fleet_wire::DeviceUsage>> {
    Mirror::waking_when(
        layout::DEVICE_USAGE,
        Box::new(|_key, old, new| crate::fleet::usage::wakes(old, new)),
    )
}

impl Mirrors {
    /// The mirrors, `heartbeat` (made by [`heartbeat_mirror`]) and `workloads` (made by [`workload_mirror`]) shared
    /// with the dashboard and `info` with the TaskRun controller (all kept current by this controller's watches).
    pub fn new(
        heartbeat: Arc<Mirror<Heartbeat>>,
        info: Arc<Mirror<DeviceInfo>>,
        workloads: Arc<Mirror<DeviceWorkloadStatus>>,
        retired: Arc<Mirror<fleet_wire::DeviceRetirement>>,
    ) -> Self {
        Self {
            info,
            heartbeat,
            upgrade: Mirror::new(layout::AGENT_UPGRADE_STATUS),
            desired: Mirror::new(layout::DESIRED_STATE),
            intent: Mirror::new(layout::AGENT_UPGRADE_INTENT),
            workloads,
            usage: usage_mirror(),
            secrets: Mirror::new(layout::DEVICE_SECRETS),
            retired,
        }
    }
}

impl Mirrors {
    fn synced(&self) -> bool {
        self.desired.is_synced()
            && self.intent.is_synced()
            && self.secrets.is_synced()
            && self.retired.is_synced()
    }
}

async fn open_link(nats: &NatsLink, m: &Mirrors, notify: &Arc<Notify>) -> Result<Link, NatsError> {
    let mut link = Link::open(nats).await?;
    link.watch(&m.info, notify)?;
    link.watch(&m.heartbeat, notify)?;
    link.watch(&m.upgrade, notify)?;
    link.watch(&m.desired, notify)?;
    link.watch(&m.intent, notify)?;
    link.watch(&m.workloads, notify)?;
    link.watch(&m.usage, notify)?;
    link.watch(&m.secrets, notify)?;
    link.watch(&m.retired, notify)?;
    Ok(link)
}

/// Runs the deployments controller on the operator's [`Runtime`] until the task is dropped or aborted: its caches
/// and NATS connection, and the heartbeat and device-info mirrors it shares (the dashboard reads liveness from the
/// heartbeats, the TaskRun controller capabilities from the device info); this controller's watches keep them
/// current. Run alone (tests), it takes a runtime of its own.
pub async fn run_with(
    rt: &Runtime,
    opts: Options,
) -> Result<(), kube::runtime::reflector::store::WriterDropped> {
    // Retirement (the Device finalizer) runs wherever the deployments controller does: it decides from the
    // tombstones this controller's link keeps current.
    tokio::select! {
        r = crate::retire::run_with(rt, opts.instance.clone()) => r,
        r = run_engine(rt, opts) => r,
    }
}

async fn run_engine(
    rt: &Runtime,
    opts: Options,
) -> Result<(), kube::runtime::reflector::store::WriterDropped> {
    let (client, caches, nats) = (rt.client.clone(), &rt.caches, &*rt.nats);
    let (heartbeats, info, workloads, watch) = (
        rt.heartbeats.clone(),
        rt.info.clone(),
        rt.workloads.clone(),
        rt.heartbeat_watch.clone(),
    );
    // Woken by what devices change (Device objects, every NATS mirror, refusals): paced ([`paced`]).
    let notify = Arc::new(Notify::new());
    // Woken by what a person changes: the next pass starts at once.
    let urgent = Arc::new(Notify::new());
    let devices = caches.devices.subscribe(&notify);
    let groups = caches.groups.subscribe(&urgent);
    let deployments = caches.deployments.subscribe(&urgent);
    let releases = caches.releases.subscribe(&urgent);
    // A policy added, changed or removed re-checks every deployment at once.
    let policies = caches.policies.subscribe(&urgent);
    // Never place from a partial view: a missing deployment would look like "remove its workloads".
    caches.devices.ready().await?;
    caches.groups.ready().await?;
    caches.deployments.ready().await?;
    caches.releases.ready().await?;
    caches.policies.ready().await?;
    // The URL may carry the operator's own NATS password: log it without.
    log::info!("caches synced; NATS at {}", nats.display_url());
    let device_writes = Arc::new(DeviceWrites::default());
    tokio::spawn(device_writes.clone().run(
        client.clone(),
        selector_labels(opts.label_selector.as_deref()),
        rt.retired.clone(),
    ));
    let engine = Engine {
        client: client.clone(),
        recorder: report::recorder(client.clone(), opts.instance.clone()),
        devices,
        groups,
        deployments,
        releases,
        policies,
        mirrors: Mirrors::new(heartbeats, info, workloads, rt.retired.clone()),
        heartbeat_watch: watch,
        device_writes,
        refusals: Arc::default(),
        task_reasons: rt.task_reasons.clone(),
        secrets: crate::secrets_source::SecretSource::new(
            client.clone(),
            opts.secrets_namespace
                .clone()
                .unwrap_or_else(|| crate::secrets_source::DEFAULT_NAMESPACE.into()),
        ),
        urgent: urgent.clone(),
    };
    let mut link: Option<Link> = None;
    loop {
        let kept = Link::keep(&mut link, nats, "deployments", || async {
            let mut l = open_link(nats, &engine.mirrors, &notify).await?;
            // fleet-auth's reports of refused device writes, on the same connection.
            l.spawn(crate::refusals::listen(
                l.client.clone(),
                crate::refusals::Reporting {
                    refusals: engine.refusals.clone(),
                    devices: engine.devices.clone(),
                    client: engine.client.clone(),
                    recorder: engine.recorder.clone(),
                    notify: notify.clone(),
                },
            ));
            Ok(l)
        })
        .await;
        let nats_error = match kept {
            Kept::Failed(e) => Some(e),
            Kept::Same | Kept::Opened => None,
        };
        // Wait for the desired-state and intent mirrors before the first writes (CAS would be safe anyway,
        // but every write would first lose a race).
        let ready = link.is_some() && engine.mirrors.synced();
        let started = tokio::time::Instant::now();
        let mut offline_in = None;
        if link.is_none() || ready {
            offline_in = engine.pass(link.as_ref(), nats_error).await;
        }
        let pace_until = tokio::time::Instant::now() + paced(started.elapsed());
        // The next pass comes when the next device goes silent for OFFLINE_AFTER or time alone changes a
        // rollout's decision (a heartbeat that changes nothing wakes no pass), within RESYNC at the latest.
        let wait = if link.is_none() {
            Duration::from_secs(2)
        } else {
            offline_in.map_or(RESYNC, |d: Duration| d.min(RESYNC))
        };
        tokio::select! {
            _ = urgent.notified() => {}
            _ = async {
                // A change of the TaskRun controller's reasons is paced like any change a device makes.
                tokio::select! {
                    _ = notify.notified() => {}
                    _ = engine.task_reasons.changed.notified() => {}
                }
                tokio::time::sleep_until(pace_until).await;
            } => {}
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
    write_desired_bumped(store, mirror, per_device, Arc::default()).await
}

/// [`write_desired`], also writing the devices in `bump` with a new generation when their workloads are
/// unchanged (a FleetDeployment retry: the agent takes the spec again).
pub async fn write_desired_bumped(
    store: &Store,
    mirror: &Arc<Mirror<DesiredState>>,
    per_device: BTreeMap<DeviceId, Arc<[WorkloadSpec]>>,
    bump: Arc<std::collections::BTreeSet<DeviceId>>,
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
                let (store, mirror, bump) = (store.clone(), mirror.clone(), bump.clone());
                tokio::spawn(async move {
                    let concurrency = WRITE_CONCURRENCY / WRITE_SHARDS;
                    write_desired_shard(&store, &mirror, shard, &bump, concurrency).await
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
    bump: &std::collections::BTreeSet<DeviceId>,
    concurrency: usize,
) -> Result<usize, NatsError> {
    // Owned items (taken, not copied): borrowed ones make the future's lifetimes too general for `tokio::spawn`.
    futures::stream::iter(items)
        .map(|(dev, want)| async move {
            // Bumped once: a lost race re-decides on the value it lost to, which may be the bump itself.
            let mut bumping = bump.contains(&dev);
            kv::cas_write(
                store,
                mirror,
                &layout::device_key(&dev),
                |cur: Option<&DesiredState>| {
                    if cur.is_some_and(|c| c.workloads[..] == want[..]) && !bumping {
                        return None;
                    }
                    bumping = false;
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

/// Writes each device's `device-secrets` key (compare-and-set; one equal to what the key holds is skipped).
/// A document over the bucket's limits is not written and is logged by device, Secret and key (never a value):
/// its device keeps the key it has. Returns how many were written.
pub async fn write_device_secrets(
    store: &Store,
    mirror: &Arc<Mirror<DeviceSecrets>>,
    items: Vec<(DeviceId, DeviceSecrets)>,
) -> Result<usize, NatsError> {
    let results: Vec<Result<CasOutcome, NatsError>> = futures::stream::iter(items)
        .filter(|(dev, want)| {
            let size = serde_json::to_vec(want)
                .map(|v| v.len())
                .unwrap_or(usize::MAX);
            let ok = match want.check() {
                Err(e) => Err(e.to_string()),
                Ok(()) if size > fleet_wire::secrets::MAX_DEVICE_SECRETS_BYTES => Err(format!(
                    "{size} bytes, over the bucket's limit of {}",
                    fleet_wire::secrets::MAX_DEVICE_SECRETS_BYTES
                )),
                Ok(()) => Ok(()),
            };
            if let Err(e) = &ok {
                log::warn!("device-secrets of {dev} not written: {e}");
            }
            futures::future::ready(ok.is_ok())
        })
        .map(|(dev, want)| async move {
            kv::cas_write(store, mirror, &layout::device_key(&dev), |cur| {
                (cur != Some(&want)).then(|| want.clone())
            })
            .await
        })
        .buffer_unordered(WRITE_CONCURRENCY)
        .collect()
        .await;
    let mut written = 0;
    for r in results {
        written += usize::from(matches!(r?, CasOutcome::Written(_)));
    }
    Ok(written)
}

/// Removes the `device-secrets` key of each device in `devices` (a delete marker replaces the value: the bucket
/// keeps one entry per key, and refuses the rollup header a purge would need), if it still is the value the mirror
/// saw (another replica's newer write is left for the next pass). Returns how
/// many were removed.
pub async fn delete_device_secrets(
    store: &Store,
    mirror: &Arc<Mirror<DeviceSecrets>>,
    devices: Vec<DeviceId>,
) -> Result<usize, NatsError> {
    let mut removed = 0;
    for dev in devices {
        let key = layout::device_key(&dev);
        let Some(seen) = mirror.get(&key).filter(|s| s.value.is_some()) else {
            continue;
        };
        match store
            .delete_expect_revision(&key, Some(seen.revision))
            .await
        {
            Ok(()) => {
                // The delete's own revision comes back through the watch; until then the key reads as gone.
                mirror.record(&key, seen.revision + 1, None);
                removed += 1;
            }
            Err(e) => {
                log::warn!("device-secrets of {dev} not removed: {e}; retried on the next pass")
            }
        }
    }
    Ok(removed)
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
        .map(|s| (s.device_id.clone(), s.workloads.clone()))
        .collect()
}

struct Engine {
    client: Client,
    recorder: Recorder,
    devices: Cache<Device>,
    groups: Cache<DeviceGroup>,
    deployments: Cache<FleetDeployment>,
    releases: Cache<AgentRelease>,
    policies: Cache<crate::crd::policy::WorkloadPolicy>,
    mirrors: Mirrors,
    heartbeat_watch: HeartbeatWatch,
    device_writes: Arc<DeviceWrites>,
    refusals: Arc<crate::refusals::Refusals>,
    /// The TaskRun controller's reasons, listed in each Device's `status.blocking` by this controller's writer.
    task_reasons: Arc<crate::task_reasons::TaskReasons>,
    /// The Secrets the deployments name, and what wakes the loop when one changes (a person's change).
    secrets: Arc<crate::secrets_source::SecretSource>,
    urgent: Arc<Notify>,
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

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

/// One Kubernetes write of a pass.
type Write<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), kube::Error>> + Send + 'a>>;

impl Engine {
    /// The status patch of `obj` from `old` to `next` (they differ), with a Warning event for each condition that
    /// just turned bad.
    fn status_write<'a, K, S>(&'a self, obj: Arc<K>, old: S, next: S) -> Write<'a>
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
        let failing: Vec<_> = conditions::newly_failing(old.conditions(), next.conditions())
            .into_iter()
            .cloned()
            .collect();
        for c in &failing {
            if c.type_ == conditions::HALTED {
                crate::metrics::rollout_halted(K::kind(&()).as_ref(), &c.reason);
            }
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
        Box::pin(async move {
            let f: Vec<_> = failing.iter().collect();
            report::write_status(&self.client, &self.recorder, obj.as_ref(), &next, &f).await
        })
    }

    /// Everything a pass decides from, read from the caches and mirrors (in memory, no I/O).
    fn snapshot(&self) -> Snapshot {
        Snapshot {
            // What the writer wrote and the watch does not show yet: never decided (and written) twice.
            devices: self.device_writes.overlay(self.devices.state()),
            groups: self.groups.state(),
            deployments: self.deployments.state(),
            releases: self.releases.state(),
            policies: self.policies.state(),
            info: self.mirrors.info.values(),
            heartbeats: self.mirrors.heartbeat.values(),
            upgrades: self.mirrors.upgrade.values(),
            workloads: self.mirrors.workloads.values(),
            usage: self.mirrors.usage.values(),
            desired: self.mirrors.desired.values(),
            intents: self.mirrors.intent.values(),
            device_secrets: self.mirrors.secrets.values(),
            task_reasons: self.task_reasons.snapshot(),
            retired: self.mirrors.retired.values(),
            // Read by the pass itself (an API read: not in this in-memory snapshot).
            secrets: BTreeMap::new(),
            secrets_namespace: String::new(),
            refused: self.refusals.snapshot(),
            liveness: plan::Liveness {
                watched_since: self.mirrors.heartbeat.watched_since(),
                beats: self.mirrors.heartbeat.collect(crate::liveness::Beat::of),
            },
        }
    }

    /// One level-triggered pass: decide ([`plan::plan`], pure), then carry the plan out.
    /// Returns how long until the next device heard from now goes silent for [`crate::liveness::OFFLINE_AFTER`]
    /// (its `Online` condition turns False), if any is heard from.
    async fn pass(&self, link: Option<&Link>, nats_error: Option<String>) -> Option<Duration> {
        let started = std::time::Instant::now();
        let mut snapshot = self.snapshot();
        // The Secrets the deployments name, read now (the data of only those: secrets_source.rs).
        let names = snapshot
            .deployments
            .iter()
            .flat_map(|d| super::secrets::referenced(&d.spec))
            .collect();
        snapshot.secrets = self.secrets.read(&names, &self.urgent).await;
        snapshot.secrets_namespace = self.secrets.namespace().to_owned();
        let now = fleet_wire::Timestamp::now();
        let offline_in = snapshot
            .liveness
            .watched_since
            .and(
                snapshot
                    .liveness
                    .beats
                    .values()
                    // without the Devices' clock offsets: at worst a pass too early
                    .map(|b| b.heard(None).plus(crate::liveness::OFFLINE_AFTER))
                    .filter(|t| *t >= now)
                    .min(),
            )
            // just past it: the device is silent for longer than OFFLINE_AFTER by then
            .map(|t| t.since(now) + Duration::from_millis(10));
        let mut plan = plan::plan(&snapshot, now, &mut AttemptId::new_random);
        // Or sooner, when time alone changes a rollout's decision (a device becoming silent or stalled).
        let offline_in = offline_in
            .into_iter()
            .chain(plan.next_change.map(|t| t.since(now)))
            .min();
        let watch = std::mem::take(&mut plan.heartbeat_watch);
        // Also the devices whose next heartbeat changes what their Device shows (a silent one coming back, a
        // clock offset to measure): [`crate::liveness::wake_on_next_beat`].
        let waking = snapshot.devices.iter().filter_map(|d| {
            let name = d.metadata.name.as_deref()?;
            let facts = crate::liveness::Facts {
                watched_since: snapshot.liveness.watched_since,
                beat: snapshot.liveness.beats.get(name).copied(),
                recorded: None,
                offset_secs: d.status.as_ref().and_then(|s| s.clock_offset_seconds),
            };
            let verdict = crate::liveness::judge(&facts, crate::liveness::OFFLINE_AFTER, now);
            crate::liveness::wake_on_next_beat(&facts, verdict).then(|| name.to_owned())
        });
        *self
            .heartbeat_watch
            .write()
            .unwrap_or_else(|p| p.into_inner()) =
            watch.iter().map(|d| d.to_string()).chain(waking).collect();
        self.apply(plan, link, nats_error).await;
        drop(snapshot);
        crate::memory::give_back();
        crate::metrics::pass(started.elapsed());
        offline_in
    }

    /// Carries out a plan: the NATS writes (compare-and-set), then statuses, events and Devices, whose
    /// `NatsReachable` condition says how the NATS writes went.
    async fn apply(&self, plan: Plan, link: Option<&Link>, mut nats_error: Option<String>) {
        let now = now();
        for (name, why) in &plan.ignored {
            log::warn!("Device {name:?} ignored: {why}");
        }
        if let (Some(link), None) = (link, &nats_error) {
            if let Err(e) = self
                .write_nats(
                    link,
                    plan.desired,
                    plan.bump,
                    plan.intents,
                    plan.device_secrets,
                )
                .await
            {
                nats_error = Some(e.to_string());
            }
        }
        crate::metrics::reconciled("deployments", nats_error.is_none());
        let nats = conditions::nats_reachable(nats_error.as_deref());
        let mut kube_writes: Vec<Write<'_>> = Vec::new();
        for g in plan.groups {
            if let Some((obj, old, next)) = g.finish(&nats, &now) {
                kube_writes.push(self.status_write(obj, old, next));
            }
        }
        for d in plan.deployments {
            if let Some((obj, old, next)) = d.finish(&nats, &now) {
                kube_writes.push(self.status_write(obj, old, next));
            }
        }
        for r in plan.releases {
            if let Some((obj, old, next)) = r.finish(&nats, &now) {
                kube_writes.push(self.status_write(obj, old, next));
            }
        }
        // Device writes (one per device: the many) go to their own writer, so that the next pass's NATS writes
        // never wait behind them.
        for NewDevice { id, hold } in plan.new_devices {
            self.device_writes.create(id, hold);
        }
        for (name, next) in plan.device_statuses {
            self.device_writes.status(name, next);
        }
        crate::metrics::device_writes_waiting(self.device_writes.waiting());
        for e in &plan.events {
            log::info!(
                "{} {}: {}: {}",
                e.reference.kind.as_deref().unwrap_or_default(),
                e.reference.name.as_deref().unwrap_or_default(),
                e.reason,
                e.message
            );
            let ev = kube::runtime::events::Event {
                type_: kube::runtime::events::EventType::Normal,
                reason: e.reason.into(),
                note: Some(e.message.clone()),
                action: "Rollout".into(),
                secondary: None,
            };
            match report::publish_named(&self.client, &ev, &e.reference, &e.name).await {
                // Published by another replica, or by an earlier pass.
                Ok(()) => {}
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(err) => log::warn!("event {} for {}: {err}", e.reason, e.name),
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

    /// The plan's NATS writes: every device's desired state, then the agent-upgrade attempts (each decided again
    /// only if its key changed since the snapshot). The first error stops them.
    async fn write_nats(
        &self,
        link: &Link,
        desired: BTreeMap<DeviceId, Arc<[WorkloadSpec]>>,
        bump: std::collections::BTreeSet<DeviceId>,
        intents: Vec<plan::IntentWrite>,
        device_secrets: BTreeMap<DeviceId, Option<DeviceSecrets>>,
    ) -> Result<(), NatsError> {
        // A device's secrets before the desired state that names them (awaited); removed ones after it.
        let secrets_store = link.store(layout::DEVICE_SECRETS)?;
        let (puts, deletes): (Vec<_>, Vec<_>) =
            device_secrets.into_iter().partition(|(_, s)| s.is_some());
        let puts = puts
            .into_iter()
            .filter_map(|(d, s)| Some((d, s?)))
            .collect();
        match write_device_secrets(secrets_store, &self.mirrors.secrets, puts).await? {
            0 => {}
            n => log::info!("wrote the registry credentials and secret values of {n} devices"),
        }
        let store = link.store(layout::DESIRED_STATE)?;
        if !bump.is_empty() {
            log::info!("retry: desired state given again to {} devices", bump.len());
        }
        match write_desired_bumped(store, &self.mirrors.desired, desired, Arc::new(bump)).await? {
            0 => {}
            n => log::info!("wrote {n} desired states"),
        }
        let deletes: Vec<DeviceId> = deletes.into_iter().map(|(d, _)| d).collect();
        match delete_device_secrets(secrets_store, &self.mirrors.secrets, deletes).await? {
            0 => {}
            n => {
                log::info!("removed the device-secrets keys of {n} devices that need none any more")
            }
        }
        if intents.is_empty() {
            return Ok(());
        }
        let store = link.store(layout::AGENT_UPGRADE_INTENT)?;
        let results: Vec<Result<CasOutcome, NatsError>> = futures::stream::iter(intents)
            // Owned items: borrowed ones make the future's lifetimes too general for `tokio::spawn`.
            .map(|w: plan::IntentWrite| async move {
                kv::cas_write(
                    store,
                    &self.mirrors.intent,
                    &layout::device_key(&w.device),
                    |cur| {
                        let a = w.decide(cur)?;
                        log::info!(
                            "device {}: agent-upgrade attempt {} to {}",
                            w.device,
                            a.attempt_id,
                            a.target_version
                        );
                        Some(a)
                    },
                )
                .await
            })
            .buffer_unordered(WRITE_CONCURRENCY)
            .collect()
            .await;
        results
            .into_iter()
            .find_map(Result::err)
            .map_or(Ok(()), Err)
    }
}
