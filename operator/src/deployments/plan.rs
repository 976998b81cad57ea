//! One pass of the control loop as a pure function: [`plan`] turns a [`Snapshot`] (the cached fleet objects and the
//! values of the NATS mirrors) into a [`Plan`] — each device's desired workloads, the agent-upgrade attempts to
//! write, the statuses to write and the Devices to create — which `engine` then carries out (the only I/O).
//! Table-tested without NATS or Kubernetes.

use super::blocking::{self, Blocking};
use super::health;
use super::mirror::{self, Reported};
use super::release::{self, IntentDecision, ReleaseCounts};
use super::{capability, secrets};
use crate::conditions::{self, Want};
use crate::crd::{
    AgentRelease, Device, DeviceGroup, DeviceGroupStatus, DeviceStatus, FleetDeployment,
    PlacementStatus, RolloutPhase, WorkloadHealth, HOLD_ANNOTATION,
};
use crate::fleet::placement::{self, DeploymentInput, GroupError, Labels, PlacementError};
use crate::fleet::rollout;
use crate::fleet::validate::{self, Build};
use fleet_wire::secrets::RegistryAuth;
use fleet_wire::{
    AgentUpgradeAttempt, AgentUpgradeStatus, AttemptId, DesiredState, DeviceId, DeviceInfo,
    DeviceSecrets, DeviceWorkloadStatus, Heartbeat, Timestamp, WorkloadSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// Most failed devices a Degraded message names (the counts carry the rest).
pub const FAILED_EXAMPLES: usize = 5;
/// Most unknown listed devices a group's message names.
pub const UNKNOWN_EXAMPLES: usize = 5;
/// Most distinct previous specs of one staged deployment shared between the devices it holds back (the rest are
/// kept per device; a deployment changed a few times mid-rollout has a few).
pub const HELD_LISTS: usize = 8;
/// Most superseded devices a release's Superseded message names.
pub const CONFLICT_EXAMPLES: usize = 10;

/// Everything one pass decides from: the cached objects and the mirrors' values (keyed by device id).
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Device objects.
    pub devices: Vec<Arc<Device>>,
    /// DeviceGroup objects.
    pub groups: Vec<Arc<DeviceGroup>>,
    /// FleetDeployment objects.
    pub deployments: Vec<Arc<FleetDeployment>>,
    /// AgentRelease objects.
    pub releases: Vec<Arc<AgentRelease>>,
    /// `device-info`.
    pub info: BTreeMap<String, Arc<DeviceInfo>>,
    /// `device-heartbeat`.
    pub heartbeats: BTreeMap<String, Arc<Heartbeat>>,
    /// `agent-upgrade-status`.
    pub upgrades: BTreeMap<String, Arc<AgentUpgradeStatus>>,
    /// `device-workload-status`.
    pub workloads: BTreeMap<String, Arc<DeviceWorkloadStatus>>,
    /// `device-usage`: a staged rollout gives no change to a device below the free-space floor (usage.rs).
    pub usage: BTreeMap<String, Arc<fleet_wire::DeviceUsage>>,
    /// `device-desired-state` (what this or another replica wrote).
    pub desired: BTreeMap<String, Arc<DesiredState>>,
    /// `agent-upgrade-intent`.
    pub intents: BTreeMap<String, Arc<AgentUpgradeAttempt>>,
    /// Refused writes reported by fleet-auth ([`crate::refusals`]).
    pub refused: BTreeMap<String, crate::refusals::Record>,
    /// WorkloadPolicy objects ([`super::policy`]).
    pub policies: Vec<Arc<crate::crd::policy::WorkloadPolicy>>,
    /// Liveness ([`crate::liveness`]): since when the heartbeat mirror is watched (`None`: not judged) and each
    /// heartbeat with when NATS stored it.
    pub liveness: Liveness,
    /// The Secrets the deployments name, by name, read from [`Self::secrets_namespace`] ([`super::secrets`]).
    pub secrets: BTreeMap<String, super::secrets::SecretState>,
    /// The namespace the deployments' Secrets are read from (named in messages).
    pub secrets_namespace: String,
    /// `device-secrets` (what this or another replica wrote).
    pub device_secrets: BTreeMap<String, Arc<DeviceSecrets>>,
    /// The TaskRun controller's reasons by Device name, listed after the rollouts' ([`crate::task_reasons`]).
    pub task_reasons: Arc<crate::task_reasons::Published>,
    /// `device-retired`: the tombstones of retired devices, by device id ([`crate::retire`]). A retired device is
    /// in no group, deployment or release, and no Device is created for it.
    pub retired: BTreeMap<String, Arc<fleet_wire::DeviceRetirement>>,
}

/// What a pass judges liveness from (a Device's `Online` condition).
#[derive(Debug, Clone, Default)]
pub struct Liveness {
    /// [`crate::kv::Mirror::watched_since`] of the heartbeat mirror.
    pub watched_since: Option<Timestamp>,
    /// Each device's heartbeat as [`crate::liveness::Beat`].
    pub beats: BTreeMap<String, crate::liveness::Beat>,
}

/// One agent-upgrade attempt to write, with what was decided from (so that a lost compare-and-set decides again
/// on the value it lost to).
#[derive(Debug, Clone, PartialEq)]
pub struct IntentWrite {
    /// The device.
    pub device: DeviceId,
    /// The attempt decided.
    pub attempt: AgentUpgradeAttempt,
    /// The intent it was decided against (the key's value in the snapshot).
    pub seen: Option<AgentUpgradeAttempt>,
    /// The device's info.
    pub info: Option<DeviceInfo>,
    /// The release's builds.
    pub builds: Arc<[Build]>,
}

impl IntentWrite {
    /// What to write when the key holds `current`: the planned attempt when it is still what the plan saw, else a
    /// new decision on `current` (`None`: nothing to write).
    pub fn decide(&self, current: Option<&AgentUpgradeAttempt>) -> Option<AgentUpgradeAttempt> {
        if current == self.seen.as_ref() {
            return Some(self.attempt.clone());
        }
        match release::decide_intent(
            &self.device,
            self.info.as_ref(),
            &self.builds,
            current,
            AttemptId::new_random,
        ) {
            IntentDecision::Write(a) => Some(a),
            _ => None,
        }
    }
}

/// The status one object should have: everything but its conditions, and the conditions wanted (apply adds
/// `NatsReachable` after the NATS writes, when `nats` is set).
#[derive(Debug, Clone, PartialEq)]
pub struct StatusPlan<K, S> {
    /// The object.
    pub obj: Arc<K>,
    /// Its current status.
    pub old: S,
    /// The next status, conditions not yet merged.
    pub next: S,
    /// Wanted conditions, in order; `NatsReachable` goes second when `nats` is set.
    pub wants: Vec<Want>,
    /// Whether the status carries `NatsReachable`.
    pub nats: bool,
}

/// A status whose conditions a plan replaces.
pub trait SetConditions: conditions::WithConditions {
    /// Replaces the conditions; `old` is the status being replaced (a status with a condition history carries
    /// it on with the changes from `old`'s conditions to these).
    fn set_conditions(&mut self, conditions: Vec<Condition>, old: &Self, now: &Time);
}

impl SetConditions for DeviceGroupStatus {
    fn set_conditions(&mut self, conditions: Vec<Condition>, _old: &Self, _now: &Time) {
        self.conditions = conditions;
    }
}

impl SetConditions for PlacementStatus {
    fn set_conditions(&mut self, conditions: Vec<Condition>, old: &Self, now: &Time) {
        self.condition_history =
            conditions::record(&old.condition_history, &old.conditions, &conditions, now);
        self.conditions = conditions;
    }
}

impl<K: kube::Resource, S: SetConditions + PartialEq> StatusPlan<K, S> {
    /// The finished next status given the NATS condition; `None` when it equals the current one.
    pub fn finish(mut self, nats: &Want, now: &Time) -> Option<(Arc<K>, S, S)> {
        if self.nats {
            self.wants.insert(1.min(self.wants.len()), nats.clone());
        }
        let merged = conditions::merge(
            self.old.conditions(),
            &self.wants,
            self.obj.meta().generation,
            now,
        );
        self.next.set_conditions(merged, &self.old, now);
        (self.next != self.old).then_some((self.obj, self.old, self.next))
    }
}

/// A Device to create for a device that reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewDevice {
    /// Its name (the device id).
    pub id: String,
    /// With [`HOLD_ANNOTATION`]: the device already runs workloads (its Device was deleted).
    pub hold: bool,
}

/// What one pass does.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    /// Each device's workloads (written compare-and-set; unchanged ones are skipped).
    pub desired: BTreeMap<DeviceId, Arc<[WorkloadSpec]>>,
    /// Devices whose desired state is written again with a new generation even when unchanged: a FleetDeployment
    /// retry gives its failed devices the spec again ([`crate::fleet::rollout::retry_requested`]).
    pub bump: BTreeSet<DeviceId>,
    /// Agent-upgrade attempts to write.
    pub intents: Vec<IntentWrite>,
    /// DeviceGroup statuses.
    pub groups: Vec<StatusPlan<DeviceGroup, DeviceGroupStatus>>,
    /// FleetDeployment statuses.
    pub deployments: Vec<StatusPlan<FleetDeployment, PlacementStatus>>,
    /// AgentRelease statuses.
    pub releases: Vec<StatusPlan<AgentRelease, PlacementStatus>>,
    /// Devices to create.
    pub new_devices: Vec<NewDevice>,
    /// Device statuses to replace (name, status).
    pub device_statuses: Vec<(String, DeviceStatus)>,
    /// Device objects ignored because their name is not a device id (name, why).
    pub ignored: Vec<(String, String)>,
    /// Devices whose next heartbeat or workload report can change a decision (an agent release or a deployment
    /// soaking on them): of the reports that change nothing else, only theirs wake the control loop.
    pub heartbeat_watch: BTreeSet<DeviceId>,
    /// The earliest instant at which time alone changes a rollout's decision (a device outliving its heartbeat
    /// timeout or becoming stalled: [`rollout::next_change`]): the control loop passes again then.
    pub next_change: Option<Timestamp>,
    /// Each device's `device-secrets` key where it changes (`None`: delete it), written before the desired states
    /// that need it ([`super::secrets::deliveries`]).
    pub device_secrets: BTreeMap<DeviceId, Option<DeviceSecrets>>,
    /// Each device's reasons for the changes it does not have yet, as the rollouts decided them (blocking.rs),
    /// deployments first, then releases; written into its `status.blocking`.
    pub blocking: BTreeMap<DeviceId, Vec<Blocking>>,
    /// Normal events to publish about fleet objects (a halt that lifted because its only causes left the rollout).
    pub events: Vec<PlanEvent>,
}

impl Plan {
    /// Keeps the earlier of the plan's next time-driven change and `at`.
    fn wake_at(&mut self, at: Option<Timestamp>) {
        self.next_change = self.next_change.into_iter().chain(at).min();
    }
}

/// A Normal event a pass decided on.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanEvent {
    /// The object it is about.
    pub reference: k8s_openapi::api::core::v1::ObjectReference,
    /// Its reason.
    pub reason: &'static str,
    /// Its message.
    pub message: String,
    /// The event's name: the same decision by two replicas (or two passes) is published once.
    pub name: String,
}

/// Event reason: a halt lifted because every device that caused it fell silent during its soak and then left the
/// rollout ([`rollout::left_silent`]).
pub const REASON_HALT_LIFTED: &str = "HaltLifted";

/// The event of a halt of `obj` lifted because `devices` left.
fn halt_lifted<K>(obj: &K, devices: &[String]) -> PlanEvent
where
    K: kube::Resource<DynamicType = ()>,
{
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    devices.hash(&mut h);
    obj.meta().generation.hash(&mut h);
    let name = obj.meta().name.clone().unwrap_or_default();
    PlanEvent {
        reference: obj.object_ref(&()),
        reason: REASON_HALT_LIFTED,
        message: format!(
            "the halt is lifted: every device that caused it ({}) fell silent during its soak and has since left the \
             rollout (retired, deleted, or no longer in its groups), which counts it as gone, not failed; the \
             rollout goes on with the remaining devices",
            devices
                .iter()
                .map(|d| format!("{d} (no heartbeat during its soak)"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        name: format!("{name}.halt-lifted.{:x}", h.finish()),
    }
}

/// "1 device", "3 devices".
pub fn devices(n: u32) -> String {
    if n == 1 {
        "1 device".into()
    } else {
        format!("{n} devices")
    }
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

/// A resolved group's Ready message: its member count, and the listed ids that have no Device (yet).
fn group_message(members: usize, unknown: &[&str]) -> String {
    let mut m = devices(members as u32);
    if !unknown.is_empty() {
        let shown: Vec<&str> = unknown.iter().take(UNKNOWN_EXAMPLES).copied().collect();
        let more = unknown.len() - shown.len();
        m.push_str(&format!("; listed but no Device yet: {}", shown.join(", ")));
        if more > 0 {
            m.push_str(&format!(" and {more} more"));
        }
    }
    m
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

/// FleetDeployment: Degraded=True while some of its workloads failed on their devices (the agent's last reconcile
/// failed or the container exited), with the count and the first failure (devices by name, stable while the same
/// devices fail); the Warning event a person sees in `kubectl describe` comes from it turning True.
fn workloads_degraded_want(h: &WorkloadHealth) -> Want {
    if h.failed == 0 {
        return Want {
            type_: conditions::DEGRADED,
            ok: false,
            reason: conditions::REASON_NO_FAILURES,
            message: "no workload has failed on a targeted device".into(),
        };
    }
    let total = h.running + h.failed + h.pending;
    let first = h
        .latest_error
        .as_deref()
        .unwrap_or("no error text reported");
    Want {
        type_: conditions::DEGRADED,
        ok: true,
        reason: conditions::REASON_WORKLOADS_FAILED,
        message: format!(
            "{} of {total} workloads failed on their devices; first: {first}",
            h.failed
        ),
    }
}

/// The placement view every part of a pass shares.
struct Fleet {
    labels: BTreeMap<DeviceId, Labels>,
    held: BTreeSet<DeviceId>,
    groups: BTreeMap<String, Result<BTreeSet<DeviceId>, GroupError>>,
}

fn fleet(s: &Snapshot, plan: &mut Plan) -> Fleet {
    // Devices and their labels; names that are not device ids are ignored.
    let mut labels = BTreeMap::new();
    let mut held = BTreeSet::new();
    for d in &s.devices {
        // A Device being deleted is being retired, and a retired device is gone: neither is in any group, so a
        // rollout that had it counts it as having left, not as failed (docs/crds.md, "Rollouts").
        if leaving(s, d) {
            continue;
        }
        match DeviceId::try_from(d.name_any().as_str()) {
            Ok(id) => {
                if d.annotations().contains_key(HOLD_ANNOTATION) {
                    held.insert(id.clone());
                }
                labels.insert(id, d.labels().clone());
            }
            Err(e) => plan.ignored.push((d.name_any(), e.to_string())),
        }
    }
    let groups = placement::resolve_groups(&s.groups, &labels);
    Fleet {
        labels,
        held,
        groups,
    }
}

/// True when Device `d` is leaving the fleet: deleted (its retirement is under way: [`crate::retire`]) or its device
/// is retired (a tombstone; its Device is deleted again unless it enrols it).
pub fn leaving(s: &Snapshot, d: &Device) -> bool {
    d.metadata.deletion_timestamp.is_some()
        || d.metadata
            .name
            .as_deref()
            .is_some_and(|n| s.retired.contains_key(n))
}

/// Decides one pass at `now` (the operator's clock; rollouts compare heartbeats with it). `new_id` names new
/// attempts (random in production).
pub fn plan(s: &Snapshot, now: Timestamp, new_id: &mut dyn FnMut() -> AttemptId) -> Plan {
    let mut plan = Plan::default();
    let fleet = fleet(s, &mut plan);
    let deployed = deployments(s, &fleet, &mut plan, now);
    releases(s, &fleet, &mut plan, now, new_id);
    groups(s, &fleet, &mut plan);
    deployment_statuses(s, deployed, &mut plan);
    devices_to_write(s, &fleet, now, &mut plan);
    plan
}

/// What the deployments part hands to their statuses.
struct Deployed {
    results: BTreeMap<String, Result<usize, PlacementError>>,
    targets: BTreeMap<String, BTreeSet<DeviceId>>,
    workloads: BTreeMap<String, Vec<WorkloadSpec>>,
    holding: BTreeSet<String>,
    conflicts: BTreeMap<String, Vec<(DeviceId, String, String)>>,
    /// Deployments with a `rollout` section: the pass's outcome.
    rollouts: BTreeMap<String, StagedDeployment>,
    /// Per deployment, the devices its rollout holds back and what they keep.
    held: BTreeMap<String, BTreeMap<DeviceId, Arc<[WorkloadSpec]>>>,
    /// Per deployment, what its `Ready` message says of the targeted devices whose agent cannot honour its spec
    /// ([`capability`]).
    incapable: BTreeMap<String, String>,
}

/// One staged deployment's rollout in this pass.
struct StagedDeployment {
    outcome: rollout::Outcome,
    /// The previous `Halted` condition, kept while the halt holds and nothing fails now.
    kept_halt: Option<Want>,
}

/// A deployment's rollout: which targeted devices get its spec now, which keep their previous workloads
/// (returned), which failed ones a retry gives the spec again (into `plan.bump`).
#[allow(clippy::too_many_arguments)]
fn stage(
    s: &Snapshot,
    fleet: &Fleet,
    d: &FleetDeployment,
    workloads: &[WorkloadSpec],
    targets: &BTreeSet<DeviceId>,
    incapable: &BTreeMap<DeviceId, Option<String>>,
    policy: &rollout::Policy,
    now: Timestamp,
    plan: &mut Plan,
) -> (StagedDeployment, BTreeMap<DeviceId, Arc<[WorkloadSpec]>>) {
    use crate::deployments::rollout_workloads as rw;
    let old = d.status.as_ref();
    let token = rollout::token(d.annotations().get(release::RETRY_ANNOTATION));
    let retry = rollout::retry_requested(old, token);
    let holds = !retry && rollout::halt_holds(old, d.metadata.generation, token);
    let mut in_rollout = Vec::with_capacity(targets.len());
    for dev in targets {
        let current = s.desired.get(dev.as_str()).map(Arc::as_ref);
        let mut observed = rw::observe(
            workloads,
            current,
            s.workloads.get(dev.as_str()).map(Arc::as_ref),
        );
        // An agent that cannot honour the spec is never given it: a failed device, so that a canary halts the
        // rollout and the rest count against maxFailures (capability.rs); a retry does not change its agent.
        if incapable.contains_key(dev) {
            observed = rollout::Observed::Failed;
        } else if retry
            && matches!(
                observed,
                rollout::Observed::Failed
                    | rollout::Observed::CrashLooping
                    | rollout::Observed::Unhealthy
            )
        {
            plan.bump.insert(dev.clone());
            observed = rollout::Observed::Updating(None);
        }
        let canary = fleet
            .labels
            .get(dev)
            .and_then(|l| l.get(rollout::CANARY_LABEL))
            .is_some_and(|v| v == "true");
        in_rollout.push(rollout::Target {
            last_heartbeat: s.heartbeats.get(dev.as_str()).map(|h| h.at),
            low_space: crate::fleet::usage::low_space(s.usage.get(dev.as_str()).map(Arc::as_ref)),
            id: dev.clone(),
            canary,
            observed,
        });
    }
    // A halt whose only causes were devices silent in their soak that have since left lifts (rollout::left_silent).
    let lifted = holds
        .then(|| {
            rollout::left_silent(old, &|d| {
                DeviceId::try_from(d).is_ok_and(|id| targets.contains(&id))
            })
        })
        .flatten();
    let holds = holds && lifted.is_none();
    if let Some(devices) = &lifted {
        plan.events.push(halt_lifted(d, devices));
    }
    let mut outcome = rollout::plan(&in_rollout, policy, now);
    plan.wake_at(outcome.next_change);
    // A soaking device's next workload report can end its soak (a report that changes nothing else is otherwise
    // recorded quietly): its reports wake the control loop.
    for t in &in_rollout {
        if rollout::standing(t.observed, policy, now) == rollout::Standing::Soaking {
            plan.heartbeat_watch.insert(t.id.clone());
        }
    }
    let kept_halt = held_halt(&mut outcome, holds, old);
    outcome.status.retry = token.map(str::to_owned);
    let change = blocking::change("FleetDeployment", &d.name_any());
    let names: Vec<&str> = workloads.iter().map(|w| w.name.as_str()).collect();
    for (dev, wait) in &outcome.waits {
        let reason = blocking::reason(
            &change,
            *wait,
            || blocking::halt_why(outcome.halt.as_ref(), kept_halt.as_ref()),
            || {
                let report = s.workloads.get(dev.as_str()).map(Arc::as_ref);
                blocking::workload_failure(report, &names, incapable.get(dev))
            },
        );
        plan.blocking.entry(dev.clone()).or_default().push(reason);
    }
    let released: BTreeSet<&DeviceId> = outcome.release.iter().collect();
    // Devices held back mostly keep one and the same previous spec: one shared list each, so that placement
    // shares it too (it shares lists by their objects' addresses).
    let mut lists: Vec<Arc<[WorkloadSpec]>> = Vec::new();
    let held = in_rollout
        .iter()
        .filter(|t| t.observed == rollout::Observed::Pending && !released.contains(&t.id))
        .map(|t| {
            let keep = rw::previous(workloads, s.desired.get(t.id.as_str()).map(Arc::as_ref));
            let list = match lists.iter().find(|l| l[..] == keep[..]) {
                Some(l) => l.clone(),
                None if lists.len() < HELD_LISTS => {
                    lists.push(keep.into());
                    lists[lists.len() - 1].clone()
                }
                None => keep.into(),
            };
            (t.id.clone(), list)
        })
        .collect();
    (StagedDeployment { outcome, kept_halt }, held)
}

/// Applies the halt rule ([`rollout::hold`]) to a pass's outcome: while the previous halt `holds` and nothing fails
/// now, the rollout stays halted and its previous `Halted` condition is kept as it was (returned).
fn held_halt(
    outcome: &mut rollout::Outcome,
    holds: bool,
    old: Option<&PlacementStatus>,
) -> Option<Want> {
    if !rollout::hold(outcome, holds) {
        return None;
    }
    rollout::keep_causes(outcome, old);
    old.and_then(|o| o.conditions.iter().find(|c| c.type_ == conditions::HALTED))
        .map(|c| Want {
            type_: conditions::HALTED,
            ok: true,
            reason: if c.reason == rollout::HaltReason::FailureThreshold.as_str() {
                rollout::HaltReason::FailureThreshold.as_str()
            } else {
                rollout::HaltReason::CanaryFailed.as_str()
            },
            message: c.message.clone(),
        })
}

fn deployments(s: &Snapshot, fleet: &Fleet, plan: &mut Plan, now: Timestamp) -> Deployed {
    let mut incapable_of = BTreeMap::new();
    // Per placed deployment: the devices given its spec, its workload names, its pull credentials.
    type Credentials = (
        BTreeSet<DeviceId>,
        BTreeSet<String>,
        BTreeMap<String, RegistryAuth>,
    );
    let mut credentials: BTreeMap<String, Credentials> = BTreeMap::new();
    let mut inputs = Vec::new();
    let mut results = BTreeMap::new();
    let mut targets_of = BTreeMap::new();
    let mut rollouts = BTreeMap::new();
    let policies: Vec<super::policy::Policy> = s
        .policies
        .iter()
        .map(|p| super::policy::Policy::of(p))
        .collect();
    for d in &s.deployments {
        // Unknown fields (kept by the CRD, dropped by the typed spec) and every other problem make the spec
        // invalid, all named as the webhook names them.
        let workloads = validate::deployment(d);
        // The rollout section is checked like an AgentRelease's: out of range is an invalid spec.
        let policy = rollout::Policy::from_spec(d.spec.rollout.as_ref());
        let workloads = match (workloads, &policy) {
            (Ok(_), Err(e)) => Err(e.clone()),
            (w, _) => w,
        };
        let targets = match &workloads {
            Err(e) => Err(PlacementError::InvalidSpec(e.clone())),
            // Fail closed whatever the webhook did: placed nowhere new, what runs is held (`NotAllowed`).
            Ok(w) => match super::policy::check(
                &super::policy::Deployment {
                    namespace: d.metadata.namespace.as_deref(),
                    allowed_groups: &d.spec.placement.allowed_groups,
                    workloads: w,
                },
                &policies,
            ) {
                Err(e) => Err(PlacementError::NotAllowed(e)),
                Ok(()) => placement::place(
                    &d.spec.placement.allowed_groups,
                    &d.spec.placement.target_selector,
                    &fleet.groups,
                    &fleet.labels,
                ),
            },
        };
        // Each secret use pinned to its Secret's version, the pull Secrets' credentials read (secrets.rs); a
        // Secret that cannot be used fails the deployment closed, like an invalid spec.
        let resolved = workloads.as_ref().ok().map(|w| {
            let pull: Vec<String> = d
                .spec
                .image_pull_secrets
                .iter()
                .map(|r| r.name.clone())
                .collect();
            secrets::resolve(&s.secrets_namespace, w, &pull, &s.secrets)
        });
        let targets = match (targets, &resolved) {
            (Ok(_), Some(Err(e))) => Err(PlacementError::Secret(e.reason, e.message.clone())),
            (t, _) => t,
        };
        results.insert(
            d.name_any(),
            targets.as_ref().map(|t| t.len()).map_err(Clone::clone),
        );
        if let Ok(t) = &targets {
            targets_of.insert(d.name_any(), t.clone());
        }
        let mut registries = None;
        let workloads = match workloads {
            Ok(w) => match resolved {
                Some(Ok(r)) => {
                    registries = Some(r.registries);
                    r.workloads
                }
                _ => w,
            },
            // Invalid workloads: what is placed under the names the spec gives is held (the placed specs
            // themselves, read back), so a typo never takes running workloads off devices.
            Err(_) => {
                let names = validate::raw_workload_names(&d.spec);
                let mut held: BTreeMap<&str, WorkloadSpec> = BTreeMap::new();
                for w in s.desired.values().flat_map(|s| &s.workloads) {
                    if names.contains(w.name.as_str()) {
                        held.entry(w.name.as_str()).or_insert_with(|| w.clone());
                    }
                }
                held.into_values().collect()
            }
        };
        let incapable = match &targets {
            Ok(t) => capability::incapable(&workloads, t, &s.info),
            Err(_) => BTreeMap::new(),
        };
        let mut held = BTreeMap::new();
        if let (Ok(t), Ok(policy), Some(_)) = (&targets, &policy, &d.spec.rollout) {
            let (staged, h) = stage(s, fleet, d, &workloads, t, &incapable, policy, now, plan);
            rollouts.insert(d.name_any(), staged);
            held = h;
        }
        // A device whose agent cannot honour the spec keeps what it has (capability.rs).
        for dev in incapable.keys() {
            held.entry(dev.clone()).or_insert_with(|| {
                let current = s.desired.get(dev.as_str()).map(Arc::as_ref);
                super::rollout_workloads::previous(&workloads, current).into()
            });
        }
        if let Some(m) = capability::message(&workloads, &incapable, FAILED_EXAMPLES) {
            incapable_of.insert(d.name_any(), m);
        }
        if let Ok(t) = &targets {
            let given = t.iter().filter(|d| !incapable.contains_key(*d)).cloned();
            let names = workloads.iter().map(|w| w.name.as_str().to_owned());
            credentials.insert(
                d.name_any(),
                (
                    given.collect(),
                    names.collect(),
                    registries.unwrap_or_default(),
                ),
            );
        }
        inputs.push(DeploymentInput {
            name: d.name_any(),
            workloads,
            targets,
            held,
        });
    }
    // Each device's current workloads: only a deployment whose placement failed reads them (to hold what runs).
    let current: BTreeMap<DeviceId, Vec<WorkloadSpec>> = if inputs.iter().all(|i| i.targets.is_ok())
    {
        BTreeMap::new()
    } else {
        s.desired
            .values()
            .map(|d| (d.device_id.clone(), d.workloads.clone()))
            .collect()
    };
    // Failed deployments that hold something on some device (a new object holds nothing).
    let holding = inputs
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
    let device_set: BTreeSet<DeviceId> = fleet.labels.keys().cloned().collect();
    let mut desired = placement::desired_workloads(&device_set, &inputs, &current);
    // A held device (its Device was deleted and recreated) keeps exactly what it has until a person releases it.
    for id in &fleet.held {
        match s.desired.get(id.as_str()) {
            Some(st) => {
                desired
                    .per_device
                    .insert(id.clone(), st.workloads.clone().into());
            }
            None => {
                desired.per_device.remove(id);
            }
        }
    }
    plan.desired = desired.per_device;
    // What each device's device-secrets key holds for the desired states just decided (secrets.rs).
    let placed: Vec<secrets::Placed> = credentials
        .values()
        .map(|(targets, names, registries)| secrets::Placed {
            targets,
            names: names.iter().map(String::as_str).collect(),
            registries,
        })
        .collect();
    plan.device_secrets =
        secrets::deliveries(&plan.desired, &placed, &s.secrets, &s.device_secrets);
    let mut workloads = BTreeMap::new();
    let mut held = BTreeMap::new();
    for i in inputs {
        if !i.held.is_empty() {
            held.insert(i.name.clone(), i.held);
        }
        workloads.insert(i.name, i.workloads);
    }
    Deployed {
        results,
        targets: targets_of,
        workloads,
        holding,
        conflicts: desired.conflicts,
        rollouts,
        held,
        incapable: incapable_of,
    }
}

/// Agent releases: the newest release (by creation time, then UID) targeting a device owns it, and older ones
/// report the devices it took as `superseded` (no name order enters); each owned device's intent is decided once,
/// counted from that decision, and written only when the release's rollout ([`rollout::plan`]) releases it.
fn releases(
    s: &Snapshot,
    fleet: &Fleet,
    plan: &mut Plan,
    now: Timestamp,
    new_id: &mut dyn FnMut() -> AttemptId,
) {
    let mut sorted: Vec<&Arc<AgentRelease>> = s.releases.iter().collect();
    sorted.sort_by(|a, b| {
        let key = |r: &AgentRelease| {
            (
                r.metadata.creation_timestamp.clone(),
                r.metadata.uid.clone(),
            )
        };
        key(b).cmp(&key(a))
    });
    let mut owner: BTreeMap<DeviceId, String> = BTreeMap::new();
    for r in sorted {
        let name = r.name_any();
        let result = release(s, fleet, r, &name, &mut owner, plan, now, new_id);
        let old = r.status.clone().unwrap_or_default();
        let mut next = PlacementStatus {
            observed_generation: r.metadata.generation,
            ..Default::default()
        };
        let mut wants = Vec::new();
        match &result {
            Ok(d) => {
                let c = d.counts;
                wants.push(ready_want(&Ok(format!(
                    "{}, {} up to date, {} failed",
                    devices(c.targeted),
                    c.up_to_date,
                    c.failed
                ))));
                wants.push(degraded_want(&c, &d.failed));
                let [progressing, halted] = rollout_wants(&d.rollout);
                wants.push(progressing);
                wants.push(d.kept_halt.clone().unwrap_or(halted));
                if !d.superseded.is_empty() {
                    wants.push(superseded_want(&d.superseded, d.superseded_total));
                }
                next.targeted_devices = Some(c.targeted);
                next.up_to_date = Some(c.up_to_date);
                next.failed = Some(c.failed);
                next.in_progress = Some(c.in_progress);
                next.superseded = (d.superseded_total > 0).then_some(d.superseded_total);
                next.rollout = Some(d.rollout.status.clone());
            }
            Err(e) => wants.push(ready_want(&Err(e.clone()))),
        }
        plan.releases.push(StatusPlan {
            obj: r.clone(),
            next,
            old,
            wants,
            nats: true,
        });
    }
}

/// `Progressing` and `Halted` from a rollout's outcome.
fn rollout_wants(o: &rollout::Outcome) -> [Want; 2] {
    let st = &o.status;
    let counts = format!(
        "{} updated ({} healthy, {} soaking), {} updating, {} pending, {} failed",
        st.updated, st.healthy, st.soaking, st.updating, st.pending, st.failed
    );
    let names = |ids: &[DeviceId]| {
        ids.iter()
            .map(DeviceId::as_str)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let progressing = match st.phase {
        RolloutPhase::Progressing | RolloutPhase::Soaking if !o.stalled.0.is_empty() => {
            let more = (o.stalled.1 as usize).saturating_sub(o.stalled.0.len());
            let tail = if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            };
            Want {
                type_: conditions::PROGRESSING,
                ok: false,
                reason: conditions::REASON_STALLED,
                message: format!(
                    "{counts}; stalled beyond their phase's bounds: {}{tail}; see each Device's status.agentUpgrade",
                    o.stalled.0.join(", ")
                ),
            }
        }
        RolloutPhase::Complete => Want {
            type_: conditions::PROGRESSING,
            ok: false,
            reason: conditions::REASON_COMPLETE,
            message: counts.clone(),
        },
        RolloutPhase::Failed => Want {
            type_: conditions::PROGRESSING,
            ok: false,
            reason: conditions::REASON_ROLLOUT_FAILED,
            message: format!("{counts}: no device runs the change"),
        },
        RolloutPhase::Halted => Want {
            type_: conditions::PROGRESSING,
            ok: false,
            reason: conditions::REASON_HALTED,
            message: format!("halted: {counts}"),
        },
        RolloutPhase::Soaking => Want {
            type_: conditions::PROGRESSING,
            ok: true,
            reason: conditions::REASON_SOAKING,
            message: format!("{counts}; soaking: {}", names(&o.in_flight)),
        },
        RolloutPhase::Progressing => Want {
            type_: conditions::PROGRESSING,
            ok: true,
            reason: conditions::REASON_PROGRESSING,
            message: if o.in_flight.is_empty() {
                counts.clone()
            } else {
                format!("{counts}; now: {}", names(&o.in_flight))
            },
        },
    };
    let halted = match &o.halt {
        None => Want {
            type_: conditions::HALTED,
            ok: false,
            reason: conditions::REASON_NOT_HALTED,
            message: "nothing halts the rollout".into(),
        },
        Some(h) => {
            let more = h.failed.saturating_sub(h.devices.len());
            let tail = if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            };
            let what = match h.reason {
                rollout::HaltReason::CanaryFailed => "a canary failed".to_owned(),
                rollout::HaltReason::FailureThreshold => format!(
                    "{} failed devices, more than maxFailures ({})",
                    h.failed, h.tolerated
                ),
            };
            // Propose only what can work: a retry re-runs failed attempts, but a device that runs the change and
            // failed its soak is not made healthy by one.
            let action = if h.retryable {
                format!(
                    "To retry the failed attempts set the annotation {}=<new value>",
                    release::RETRY_ANNOTATION
                )
            } else {
                format!(
                    "A retry does not undo a failed soak: publish a fixed spec (a new generation lifts the \
                     halt), or set {}=<new value> to resume once they are healthy",
                    release::RETRY_ANNOTATION
                )
            };
            Want {
                type_: conditions::HALTED,
                ok: true,
                reason: h.reason.as_str(),
                message: format!(
                    "{what}: {}{tail}; no further device gets the change until a person acts, updated devices keep it. {action}",
                    h.devices.join(", "),
                ),
            }
        }
    };
    [progressing, halted]
}

/// `Superseded=True`: some targeted devices belong to newer releases (a few named, with the release).
fn superseded_want(examples: &[String], total: u32) -> Want {
    let more = (total as usize).saturating_sub(examples.len());
    let tail = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    Want {
        type_: conditions::SUPERSEDED,
        ok: true,
        reason: conditions::REASON_NEWER_RELEASE,
        message: format!(
            "{} taken by a newer AgentRelease: {}{tail}",
            devices(total),
            examples.join(", ")
        ),
    }
}

/// What one release's part of a pass found.
struct Released {
    counts: ReleaseCounts,
    failed: Vec<String>,
    rollout: rollout::Outcome,
    /// The previous `Halted` condition, kept while the halt holds and nothing fails now.
    kept_halt: Option<Want>,
    superseded: Vec<String>,
    superseded_total: u32,
}

/// A release's findings, or why it could not be placed (reason, message).
type ReleaseResult = Result<Released, (&'static str, String)>;

#[allow(clippy::too_many_arguments)]
fn release(
    s: &Snapshot,
    fleet: &Fleet,
    r: &AgentRelease,
    name: &str,
    owner: &mut BTreeMap<DeviceId, String>,
    plan: &mut Plan,
    now: Timestamp,
    new_id: &mut dyn FnMut() -> AttemptId,
) -> ReleaseResult {
    let builds: Arc<[Build]> = validate::release(r)
        .map_err(|e| (conditions::REASON_INVALID_SPEC, e))?
        .into();
    let policy = rollout::Policy::from_spec(r.spec.rollout.as_ref())
        .map_err(|e| (conditions::REASON_INVALID_SPEC, e))?;
    let targets = placement::place(
        &r.spec.placement.allowed_groups,
        &r.spec.placement.target_selector,
        &fleet.groups,
        &fleet.labels,
    )
    .map_err(|e| (e.reason(), e.to_string()))?;
    let uid = r.metadata.uid.clone().unwrap_or_else(|| name.to_owned());
    let token = rollout::token(r.annotations().get(release::RETRY_ANNOTATION));
    let old = r.status.as_ref();
    let holds = !rollout::retry_requested(old, token)
        && rollout::halt_holds(old, r.metadata.generation, token);
    let mut superseded = Vec::new();
    let mut superseded_total = 0u32;
    let mut counts = ReleaseCounts::default();
    let mut failed = Vec::new();
    let mut in_rollout = Vec::new();
    let mut writes: BTreeMap<DeviceId, IntentWrite> = BTreeMap::new();
    for dev in targets {
        if let Some(o) = owner.get(&dev) {
            superseded_total += 1;
            if superseded.len() < CONFLICT_EXAMPLES {
                superseded.push(format!("{dev} (by {o})"));
            }
            continue;
        }
        owner.insert(dev.clone(), name.to_owned());
        let info = s.info.get(dev.as_str()).map(Arc::as_ref);
        let cur = s.intents.get(dev.as_str()).map(Arc::as_ref);
        let decision = release::decide_intent(&dev, info, &builds, cur, &mut *new_id);
        let status = s.upgrades.get(dev.as_str()).map(Arc::as_ref);
        let retry = token.map(|t| release::retry_id(&uid, t, &dev));
        let retried = release::retry_attempt(&decision, cur, status, retry);
        if retried.is_none()
            && release::count_device(&mut counts, &decision, cur, status)
            && failed.len() < FAILED_EXAMPLES
        {
            failed.push(release::describe_failure(&dev, status));
        }
        if retried.is_some() {
            counts.targeted += 1;
            counts.in_progress += 1;
        }
        let mine = cur.filter(|a| builds.iter().any(|b| release::attempt_matches(a, &dev, b)));
        let observed = match &retried {
            Some(_) => Some(rollout::Observed::Pending),
            None => release::observe(
                &decision,
                mine,
                status,
                info,
                s.heartbeats.get(dev.as_str()).map(Arc::as_ref),
            ),
        };
        let Some(observed) = observed else {
            continue;
        };
        let attempt = match (retried, decision) {
            (Some(a), _) | (None, IntentDecision::Write(a)) => Some(a),
            _ => None,
        };
        if let Some(attempt) = attempt {
            writes.insert(
                dev.clone(),
                IntentWrite {
                    device: dev.clone(),
                    attempt,
                    seen: cur.cloned(),
                    info: info.cloned(),
                    builds: builds.clone(),
                },
            );
        }
        let canary = fleet
            .labels
            .get(&dev)
            .and_then(|l| l.get(rollout::CANARY_LABEL))
            .is_some_and(|v| v == "true");
        in_rollout.push(rollout::Target {
            last_heartbeat: s.heartbeats.get(dev.as_str()).map(|h| h.at),
            low_space: crate::fleet::usage::low_space(s.usage.get(dev.as_str()).map(Arc::as_ref)),
            id: dev,
            canary,
            observed,
        });
    }
    let lifted = holds
        .then(|| rollout::left_silent(old, &|d| in_rollout.iter().any(|t| t.id.as_str() == d)))
        .flatten();
    let holds = holds && lifted.is_none();
    if let Some(devices) = &lifted {
        plan.events.push(halt_lifted(r, devices));
    }
    let mut outcome = rollout::plan(&in_rollout, &policy, now);
    plan.wake_at(outcome.next_change);
    let kept_halt = held_halt(&mut outcome, holds, old);
    outcome.status.retry = token.map(str::to_owned);
    let change = blocking::change("AgentRelease", name);
    for (dev, wait) in &outcome.waits {
        let reason = blocking::reason(
            &change,
            *wait,
            || blocking::halt_why(outcome.halt.as_ref(), kept_halt.as_ref()),
            || {
                // The status of the device's current attempt, as the planner judged it failed.
                let attempt = s.intents.get(dev.as_str()).map(|a| a.attempt_id);
                let status = s.upgrades.get(dev.as_str()).map(Arc::as_ref);
                blocking::upgrade_failure(status.filter(|st| st.attempt_id == attempt))
            },
        );
        plan.blocking.entry(dev.clone()).or_default().push(reason);
    }
    for t in &in_rollout {
        if rollout::standing(t.observed, &policy, now) == rollout::Standing::Soaking {
            plan.heartbeat_watch.insert(t.id.clone());
        }
    }
    // Devices the rollout holds back were counted as in progress by their decision: they are not.
    let held = (outcome.status.pending as usize).saturating_sub(outcome.release.len());
    counts.in_progress = counts.in_progress.saturating_sub(held as u32);
    for dev in &outcome.release {
        if let Some(w) = writes.remove(dev) {
            plan.intents.push(w);
        }
    }
    Ok(Released {
        counts,
        failed,
        rollout: outcome,
        kept_halt,
        superseded,
        superseded_total,
    })
}

fn groups(s: &Snapshot, fleet: &Fleet, plan: &mut Plan) {
    for g in &s.groups {
        let (count, want) = match fleet.groups.get(&g.name_any()) {
            Some(Ok(m)) => (
                Some(m.len() as u32),
                ready_want(&Ok(group_message(
                    m.len(),
                    &placement::unknown_listed(&g.spec, &fleet.labels),
                ))),
            ),
            Some(Err(e)) => (None, ready_want(&Err((e.reason(), e.to_string())))),
            None => continue,
        };
        plan.groups.push(StatusPlan {
            obj: g.clone(),
            old: g.status.clone().unwrap_or_default(),
            next: DeviceGroupStatus {
                member_count: count,
                conditions: vec![],
            },
            wants: vec![want],
            nats: false,
        });
    }
}

fn deployment_statuses(s: &Snapshot, d: Deployed, plan: &mut Plan) {
    for obj in &s.deployments {
        let name = obj.name_any();
        let result = match d.results.get(&name) {
            Some(Ok(n)) => match d.conflicts.get(&name) {
                Some(c) => Err((
                    conditions::REASON_CONFLICT,
                    format!(
                        "{} workload placements lost to deployments whose name sorts first, e.g. {} on {} (kept by {})",
                        c.len(), c[0].1, c[0].0, c[0].2
                    ),
                )),
                None => Ok(match d.incapable.get(&name) {
                    Some(m) => format!("placed on {}; {m}", devices(*n as u32)),
                    None => format!("placed on {}", devices(*n as u32)),
                }),
            },
            Some(Err(e)) if d.holding.contains(&name) => Err((
                e.reason(),
                format!("{e}; workloads already placed are kept unchanged"),
            )),
            Some(Err(e)) => Err((
                e.reason(),
                format!("{e}; nothing is placed until this is fixed"),
            )),
            None => continue,
        };
        let targeted = d
            .results
            .get(&name)
            .and_then(|r| r.as_ref().ok())
            .map(|n| *n as u32);
        // Health over the workloads each targeted device was actually given (a lost name conflict is not).
        let health = d.targets.get(&name).map(|targets| {
            let mine = d
                .workloads
                .get(&name)
                .map(Vec::as_slice)
                .unwrap_or_default();
            let lost = d.conflicts.contains_key(&name);
            let held = d.held.get(&name);
            health::deployment(targets.iter().flat_map(|dev| {
                let on_device = plan.desired.get(dev);
                let report = s.workloads.get(dev.as_str()).map(Arc::as_ref);
                // A device the rollout holds back is judged on what it keeps.
                let given = held.and_then(|h| h.get(dev)).map_or(mine, |l| &l[..]);
                given
                    .iter()
                    .filter(move |w| !lost || on_device.is_some_and(|l| l.contains(w)))
                    .map(move |w| (dev.as_str(), w, report))
            }))
        });
        let staged = d.rollouts.get(&name);
        let mut wants: Vec<Want> = std::iter::once(ready_want(&result))
            .chain(health.as_ref().map(workloads_degraded_want))
            .collect();
        if let Some(r) = staged {
            let [progressing, halted] = rollout_wants(&r.outcome);
            wants.push(progressing);
            wants.push(r.kept_halt.clone().unwrap_or(halted));
        }
        plan.deployments.push(StatusPlan {
            obj: obj.clone(),
            old: obj.status.clone().unwrap_or_default(),
            next: PlacementStatus {
                observed_generation: obj.metadata.generation,
                targeted_devices: targeted,
                workloads: health.clone(),
                rollout: staged.map(|r| r.outcome.status.clone()),
                ..Default::default()
            },
            wants,
            nats: true,
        });
    }
}

/// Devices: create the ones that reported, mirror what they report.
fn devices_to_write(s: &Snapshot, fleet: &Fleet, now: Timestamp, plan: &mut Plan) {
    let leaving_names: BTreeSet<&str> = s
        .devices
        .iter()
        .filter(|d| d.metadata.deletion_timestamp.is_some())
        .filter_map(|d| d.metadata.name.as_deref())
        .collect();
    for id in s.info.keys() {
        let Ok(dev) = DeviceId::try_from(id.as_str()) else {
            continue;
        };
        if fleet.labels.contains_key(&dev) {
            continue;
        }
        // Never for a retired device (it may still report until fleet-auth cuts it off), nor while its Device is
        // being deleted.
        if s.retired.contains_key(id) || leaving_names.contains(id.as_str()) {
            continue;
        }
        // Workloads already placed: the Device was deleted. Recreated without its labels it would be targeted by
        // nothing and lose every workload; it is held instead.
        let hold = s.desired.get(id).is_some_and(|st| !st.workloads.is_empty());
        plan.new_devices.push(NewDevice {
            id: id.clone(),
            hold,
        });
    }
    for d in &s.devices {
        let id = d.name_any();
        if leaving(s, d) {
            continue;
        }
        let reported = Reported {
            info: s.info.get(&id).cloned(),
            heartbeat: s.heartbeats.get(&id).cloned(),
            upgrade: s.upgrades.get(&id).cloned(),
            workloads: s.workloads.get(&id).cloned(),
            usage: s.usage.get(&id).cloned(),
            refused: s.refused.get(&id).cloned(),
            beat: s.liveness.beats.get(&id).copied(),
        };
        // Nothing reported (yet, or by another fleet's NATS): leave the status alone.
        if reported == Reported::default() {
            continue;
        }
        // The rollouts' reasons, then the TaskRun controller's (published to this one writer of Device status:
        // crate::task_reasons), replace the listed ones; the rest is mirrored from what the device reported. The
        // status is copied only when its reasons change (a pass looks at every Device).
        let mine = DeviceId::try_from(id.as_str())
            .ok()
            .and_then(|dev| plan.blocking.get(&dev))
            .map(Vec::as_slice)
            .unwrap_or_default();
        let current = d.status.as_ref().map_or(&[][..], |st| &st.blocking[..]);
        let (shown, more) = match s.task_reasons.of(&id, current) {
            None => {
                let (shown, more) = blocking::listed(mine);
                (std::borrow::Cow::Borrowed(shown), more)
            }
            Some(tasks) => {
                let (all, more) = crate::task_reasons::merged(mine, Some(&tasks));
                (std::borrow::Cow::Owned(all), more)
            }
        };
        let same = match &d.status {
            Some(st) => st.blocking[..] == *shown && st.blocking_more == more,
            None => shown.is_empty(),
        };
        if same {
            if let Some(next) =
                mirror::device_status(d.status.as_ref(), &reported, s.liveness.watched_since, now)
            {
                plan.device_statuses.push((id, next));
            }
            continue;
        }
        let base = DeviceStatus {
            blocking: shown.to_vec(),
            blocking_more: more,
            ..d.status.clone().unwrap_or_default()
        };
        let next = mirror::device_status(Some(&base), &reported, s.liveness.watched_since, now);
        plan.device_statuses.push((id, next.unwrap_or(base)));
    }
}

#[cfg(test)]
mod tests {
    /// A mirror's values, shared as the mirror shares them.
    fn shared<T, const N: usize>(items: [(String, T); N]) -> BTreeMap<String, Arc<T>> {
        items.into_iter().map(|(k, v)| (k, Arc::new(v))).collect()
    }

    use super::*;
    use fleet_wire::fixtures;
    use serde_json::{json, Value};

    fn obj<K: serde::de::DeserializeOwned>(
        kind: &str,
        name: &str,
        meta: Value,
        spec: Value,
    ) -> Arc<K> {
        let mut metadata = json!({"name": name, "generation": 1});
        for (k, v) in meta.as_object().into_iter().flatten() {
            metadata[k] = v.clone();
        }
        Arc::new(
            serde_json::from_value(
                json!({"apiVersion": "fleet.nationtech.io/v1alpha1", "kind": kind,
                "metadata": metadata, "spec": spec}),
            )
            .expect(kind),
        )
    }
    fn device(name: &str, labels: Value) -> Arc<Device> {
        obj("Device", name, json!({"labels": labels}), json!({}))
    }
    fn held(name: &str) -> Arc<Device> {
        obj(
            "Device",
            name,
            json!({"annotations": {HOLD_ANNOTATION: "true"}}),
            json!({}),
        )
    }
    fn group(name: &str, spec: Value) -> Arc<DeviceGroup> {
        obj("DeviceGroup", name, json!({}), spec)
    }
    fn deployment(name: &str, group: &str, image: &str) -> Arc<FleetDeployment> {
        obj(
            "FleetDeployment",
            name,
            json!({}),
            json!({"allowedGroups": [group], "workloads": [{"name": name, "image": image}]}),
        )
    }
    fn release(name: &str, group: &str) -> Arc<AgentRelease> {
        release_with(name, group, json!({}), Value::Null)
    }
    /// A release with metadata and a `rollout` section (`null`: none).
    fn release_with(name: &str, group: &str, meta: Value, rollout: Value) -> Arc<AgentRelease> {
        let mut spec = json!({"allowedGroups": [group], "builds": [{"architecture": "arm64",
            "version": "2.0.0", "artifact": "https://example.com/a", "sha256": "a".repeat(64),
            "byteLimit": 1000}]});
        if !rollout.is_null() {
            spec["rollout"] = rollout;
        }
        obj("AgentRelease", name, meta, spec)
    }
    fn info(id: &str) -> (String, DeviceInfo) {
        let mut i = fixtures::device_info();
        i.device_id = DeviceId::try_from(id).expect("id");
        (id.to_owned(), i)
    }
    fn desired(id: &str, names: &[&str]) -> (String, DesiredState) {
        let ws = names.iter().map(|n| fixtures::workload(n)).collect();
        let s = DesiredState::new(DeviceId::try_from(id).expect("id"), 1, ws).expect("state");
        (id.to_owned(), s)
    }
    fn base() -> Snapshot {
        Snapshot {
            devices: vec![
                device("d1", json!({"site": "a"})),
                device("d2", json!({"site": "b"})),
            ],
            groups: vec![
                group(
                    "site-a",
                    json!({"selector": {"matchLabels": {"site": "a"}}}),
                ),
                group("all", json!({"selectAll": true})),
            ],
            ..Default::default()
        }
    }

    /// What a plan does, in words a table can hold.
    #[derive(Debug, Default, PartialEq)]
    struct Summary {
        desired: Vec<String>,
        intents: Vec<String>,
        ready: Vec<String>,
        counts: Vec<String>,
        new_devices: Vec<String>,
        ignored: Vec<String>,
        device_statuses: usize,
    }

    fn summary(p: &Plan) -> Summary {
        let ready = |kind: &str, name: String, wants: &[Want]| {
            let w = &wants[0];
            format!("{kind} {name}: {}", if w.ok { "Placed" } else { w.reason })
        };
        let mut s = Summary {
            desired: p
                .desired
                .iter()
                .map(|(d, ws)| {
                    let names: Vec<&str> = ws.iter().map(|w| w.name.as_str()).collect();
                    format!("{d}={}", names.join(","))
                })
                .collect(),
            intents: p
                .intents
                .iter()
                .map(|w| format!("{}->{}", w.device, w.attempt.target_version))
                .collect(),
            new_devices: p
                .new_devices
                .iter()
                .map(|n| format!("{}{}", n.id, if n.hold { " held" } else { "" }))
                .collect(),
            ignored: p.ignored.iter().map(|(n, _)| n.clone()).collect(),
            device_statuses: p.device_statuses.len(),
            ..Default::default()
        };
        for g in &p.groups {
            s.ready.push(ready("group", g.obj.name_any(), &g.wants));
            s.counts.push(format!(
                "group {}: {:?}",
                g.obj.name_any(),
                g.next.member_count
            ));
        }
        for d in &p.deployments {
            s.ready
                .push(ready("deployment", d.obj.name_any(), &d.wants));
        }
        for r in &p.releases {
            s.ready.push(ready("release", r.obj.name_any(), &r.wants));
            let n = &r.next;
            s.counts.push(format!(
                "release {}: {:?}/{:?}/{:?}/{:?}",
                r.obj.name_any(),
                n.targeted_devices,
                n.up_to_date,
                n.in_progress,
                n.failed
            ));
            if let Some(n) = n.superseded {
                s.counts
                    .push(format!("release {}: superseded {n}", r.obj.name_any()));
            }
            if let Some(ro) = &n.rollout {
                s.counts.push(format!(
                    "release {}: {:?} {}/{}/{}/{}",
                    r.obj.name_any(),
                    ro.phase,
                    ro.updated,
                    ro.healthy,
                    ro.pending,
                    ro.failed
                ));
            }
        }
        s
    }

    fn strs(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn plan_table() {
        type Case = (&'static str, Snapshot, Summary);
        let mut cases: Vec<Case> = Vec::new();

        let mut s = base();
        s.deployments = vec![deployment("web", "site-a", "nginx:1")];
        cases.push((
            "placement",
            s,
            Summary {
                desired: strs(&["d1=web", "d2="]),
                ready: strs(&[
                    "group site-a: Placed",
                    "group all: Placed",
                    "deployment web: Placed",
                ]),
                counts: strs(&["group site-a: Some(1)", "group all: Some(2)"]),
                ..Default::default()
            },
        ));

        let mut s = base();
        s.deployments = vec![deployment("web", "site-a", "Nginx:Bad:x")];
        s.desired = shared([desired("d1", &["web"]), desired("d2", &[])]);
        cases.push((
            "an invalid spec holds what runs",
            s,
            Summary {
                desired: strs(&["d1=web", "d2="]),
                ready: strs(&[
                    "group site-a: Placed",
                    "group all: Placed",
                    "deployment web: InvalidSpec",
                ]),
                counts: strs(&["group site-a: Some(1)", "group all: Some(2)"]),
                ..Default::default()
            },
        ));

        let mut s = base();
        s.groups = vec![group("empty", json!({"selector": {}}))];
        s.deployments = vec![deployment("web", "empty", "nginx:1")];
        s.desired = shared([desired("d1", &["web"])]);
        cases.push((
            "an empty selector holds, never selects all",
            s,
            Summary {
                desired: strs(&["d1=web", "d2="]),
                ready: strs(&[
                    "group empty: EmptySelector",
                    "deployment web: GroupSourceError",
                ]),
                counts: strs(&["group empty: None"]),
                ..Default::default()
            },
        ));

        let mut s = base();
        s.devices.push(held("d3"));
        s.desired = shared([desired("d3", &["old"])]);
        cases.push((
            "a held device keeps its state",
            s,
            Summary {
                desired: strs(&["d1=", "d2=", "d3=old"]),
                ready: strs(&["group site-a: Placed", "group all: Placed"]),
                counts: strs(&["group site-a: Some(1)", "group all: Some(3)"]),
                ..Default::default()
            },
        ));

        let mut s = base();
        // r-b is newer and sorts last by name: the newer one wins, whatever the names
        s.releases = vec![
            release_with(
                "r-a",
                "site-a",
                json!({"creationTimestamp": "2026-12-01T09:00:00Z", "uid": "u-a"}),
                Value::Null,
            ),
            release_with(
                "r-b",
                "all",
                json!({"creationTimestamp": "2026-12-01T10:00:00Z", "uid": "u-b"}),
                Value::Null,
            ),
        ];
        s.info = shared([info("d1"), info("d2")]);
        cases.push((
            "releases: the newest owns a device, the older reports it superseded and keeps its counts",
            s,
            Summary {
                desired: strs(&["d1=", "d2="]),
                intents: strs(&["d1->2.0.0", "d2->2.0.0"]),
                ready: strs(&[
                    "group site-a: Placed",
                    "group all: Placed",
                    "release r-b: Placed",
                    "release r-a: Placed",
                ]),
                counts: strs(&[
                    "group site-a: Some(1)",
                    "group all: Some(2)",
                    "release r-b: Some(2)/Some(0)/Some(2)/Some(0)",
                    "release r-b: Progressing 0/0/2/0",
                    "release r-a: Some(0)/Some(0)/Some(0)/Some(0)",
                    "release r-a: superseded 1",
                    "release r-a: Complete 0/0/0/0",
                ]),
                device_statuses: 2,
                ..Default::default()
            },
        ));

        let mut s = base();
        s.devices = vec![
            device("d1", json!({"site": "a", "canary": "true"})),
            device("d2", json!({"site": "a"})),
            device("d3", json!({"site": "a", "canary": "false"})),
        ];
        s.releases = vec![release_with(
            "r",
            "all",
            json!({}),
            json!({"soakSeconds": 60}),
        )];
        s.info = shared([info("d1"), info("d2"), info("d3")]);
        cases.push((
            "a staged release gives the change to its canary only",
            s,
            Summary {
                desired: strs(&["d1=", "d2=", "d3="]),
                intents: strs(&["d1->2.0.0"]),
                ready: strs(&[
                    "group site-a: Placed",
                    "group all: Placed",
                    "release r: Placed",
                ]),
                counts: strs(&[
                    "group site-a: Some(3)",
                    "group all: Some(3)",
                    "release r: Some(3)/Some(0)/Some(1)/Some(0)",
                    "release r: Progressing 0/0/3/0",
                ]),
                device_statuses: 3,
                ..Default::default()
            },
        ));

        let mut s = base();
        s.releases = vec![release_with(
            "r",
            "all",
            json!({}),
            json!({"maxUnavailable": "150%"}),
        )];
        cases.push((
            "an invalid rollout section is InvalidSpec",
            s,
            Summary {
                desired: strs(&["d1=", "d2="]),
                ready: strs(&[
                    "group site-a: Placed",
                    "group all: Placed",
                    "release r: InvalidSpec",
                ]),
                counts: strs(&[
                    "group site-a: Some(1)",
                    "group all: Some(2)",
                    "release r: None/None/None/None",
                ]),
                ..Default::default()
            },
        ));

        let mut s = base();
        s.releases = vec![release("r", "site-a")];
        s.info = shared([info("d1")]);
        let mut kept = fixtures::attempt();
        kept.device_id = DeviceId::try_from("d1").expect("id");
        kept.target_version = fleet_wire::Version::try_from("2.0.0").expect("v");
        kept.artifact = "https://example.com/a".parse().expect("artifact");
        kept.byte_limit = fleet_wire::ByteLimit::try_from(1000).expect("limit");
        kept.sha256 = fleet_wire::Sha256Hex::try_from("a".repeat(64).as_str()).expect("sha");
        let mut failed = fixtures::failed_status();
        failed.attempt_id = Some(kept.attempt_id);
        s.intents = shared([("d1".to_owned(), kept)]);
        s.upgrades = shared([("d1".to_owned(), failed)]);
        cases.push((
            "a failed attempt is kept and counted, not retried",
            s,
            Summary {
                desired: strs(&["d1=", "d2="]),
                ready: strs(&[
                    "group site-a: Placed",
                    "group all: Placed",
                    "release r: Placed",
                ]),
                counts: strs(&[
                    "group site-a: Some(1)",
                    "group all: Some(2)",
                    "release r: Some(1)/Some(0)/Some(0)/Some(1)",
                    "release r: Failed 0/0/0/1",
                ]),
                device_statuses: 1,
                ..Default::default()
            },
        ));

        let mut s = base();
        s.devices.push(device("Bad_Name", json!({})));
        s.info = shared([info("d1"), info("d8"), info("d9")]);
        s.desired = shared([desired("d9", &["web"])]);
        cases.push((
            "devices that reported are created; held when they run workloads",
            s,
            Summary {
                desired: strs(&["d1=", "d2="]),
                ready: strs(&["group site-a: Placed", "group all: Placed"]),
                counts: strs(&["group site-a: Some(1)", "group all: Some(2)"]),
                new_devices: strs(&["d8", "d9 held"]),
                ignored: strs(&["Bad_Name"]),
                device_statuses: 1,
                ..Default::default()
            },
        ));

        for (what, snapshot, want) in cases {
            let mut ids = 0u32;
            let p = plan(&snapshot, Timestamp::now(), &mut || {
                ids += 1;
                AttemptId::new_random()
            });
            assert_eq!(summary(&p), want, "{what}");
            // decide_intent names a new attempt at most once per device that needs one (a staged rollout holds
            // some back)
            assert!(ids as usize >= p.intents.len(), "{what}");
        }
    }

    #[test]
    fn messages_say_why() {
        let mut s = base();
        s.groups
            .push(group("listed", json!({"devices": ["d2", "d7"]})));
        s.groups.push(group("empty", json!({})));
        s.deployments = vec![deployment("web", "empty", "nginx:1")];
        s.desired = shared([desired("d1", &["web"])]);
        let p = plan(&s, Timestamp::now(), &mut AttemptId::new_random);
        let msg = |name: &str| {
            let g = p
                .groups
                .iter()
                .find(|g| g.obj.name_any() == name)
                .expect(name);
            g.wants[0].message.clone()
        };
        assert_eq!(msg("listed"), "1 device; listed but no Device yet: d7");
        assert!(
            msg("empty").contains("selects no device"),
            "{}",
            msg("empty")
        );
        let d = &p.deployments[0].wants[0].message;
        assert!(
            d.contains("selects no device") && d.contains("kept unchanged"),
            "{d}"
        );
    }

    #[test]
    fn finish_adds_nats_second_and_skips_unchanged() {
        let mut s = base();
        s.deployments = vec![deployment("web", "site-a", "nginx:1")];
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let ok = conditions::nats_reachable(None);
        let p = plan(&s, Timestamp::now(), &mut AttemptId::new_random);
        let (_, _, next) = p.deployments[0].clone().finish(&ok, &now).expect("changed");
        let types: Vec<&str> = next.conditions.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(types, ["Ready", "NatsReachable", "Degraded"]);
        // the same plan against the status it produced writes nothing
        let mut written = (*s.deployments[0]).clone();
        written.status = Some(next);
        s.deployments = vec![Arc::new(written)];
        let p = plan(&s, Timestamp::now(), &mut AttemptId::new_random);
        assert!(p.deployments[0].clone().finish(&ok, &now).is_none());
        // an unreachable NATS is a change
        let down = conditions::nats_reachable(Some("connection refused"));
        assert!(p.deployments[0].clone().finish(&down, &now).is_some());
    }

    /// A staged deployment through its passes: the canary gets the new spec and the rest keep the old one in
    /// their desired state; after the canary's soak one more; a failed canary halts, and the halt holds after it
    /// recovers until the retry annotation changes, which gives the failed device the spec again.
    #[test]
    fn staged_deployment_holds_the_rest_until_the_canary_soaked() {
        use fleet_wire::{WorkloadState, WorkloadStatus};
        let staged = |image: &str, meta: Value, status: Option<PlacementStatus>| {
            let mut d: FleetDeployment = (*obj::<FleetDeployment>(
                "FleetDeployment",
                "web",
                meta,
                json!({"allowedGroups": ["all"], "workloads": [{"name": "web", "image": image}],
                    "rollout": {"soakSeconds": 60, "maxUnavailable": 1}}),
            ))
            .clone();
            d.status = status;
            Arc::new(d)
        };
        let spec_of = |d: &FleetDeployment| validate::deployment_workloads(&d.spec).expect("valid");
        let old = spec_of(&staged("nginx:1", json!({}), None));
        let new = spec_of(&staged("nginx:2", json!({}), None));
        let key = |id: &str, generation, ws: &[WorkloadSpec]| {
            let s = DesiredState::new(DeviceId::try_from(id).expect("id"), generation, ws.to_vec());
            (id.to_owned(), s.expect("state"))
        };
        let now = Timestamp::now();
        let report = |id: &str, generation, state, started: u64| {
            let mut r = fixtures::workload_status();
            r.device_id = DeviceId::try_from(id).expect("id");
            r.generation = generation;
            r.at = now;
            r.workloads = vec![WorkloadStatus {
                name: new[0].name.clone(),
                state,
                container_id: None,
                spec_digest: (state == WorkloadState::Running).then(|| new[0].digest()),
                started_at: Some(Timestamp::from_unix_ms(now.unix_ms() - started * 1000)),
                error: None,
                failure: None,
                restarts: None,
                health: None,
            }];
            (id.to_owned(), r)
        };
        let images = |p: &Plan| -> Vec<String> {
            p.desired
                .iter()
                .map(|(d, ws)| {
                    format!(
                        "{d}={}",
                        ws.iter().map(|w| w.image.as_str()).collect::<String>()
                    )
                })
                .collect()
        };
        let rollout_of = |p: &Plan| {
            let d = &p.deployments[0];
            let r = d.next.rollout.clone().expect("status.rollout");
            let halted = d
                .wants
                .iter()
                .find(|w| w.type_ == conditions::HALTED)
                .cloned();
            (r, halted.expect("Halted wanted"))
        };
        // What each device's status.blocking gets: `device=kind`.
        let waiting = |p: &Plan| -> Vec<String> {
            p.blocking
                .iter()
                .flat_map(|(d, bs)| bs.iter().map(move |b| (d, b)))
                .map(|(d, b)| {
                    assert_eq!(b.change, "FleetDeployment/web");
                    let kind = serde_json::to_value(b.kind).expect("kind");
                    format!("{d}={}", kind.as_str().unwrap_or_default())
                })
                .collect()
        };
        let mut s = base();
        s.devices = vec![
            device("d1", json!({"canary": "true"})),
            device("d2", json!({})),
            device("d3", json!({})),
        ];
        s.deployments = vec![staged("nginx:2", json!({}), None)];
        s.desired = shared([key("d1", 1, &old), key("d2", 1, &old), key("d3", 1, &old)]);
        let p = plan(&s, now, &mut AttemptId::new_random);
        assert_eq!(images(&p), ["d1=nginx:2", "d2=nginx:1", "d3=nginx:1"]);
        assert_eq!(
            waiting(&p),
            ["d2=waitingForCanaries", "d3=waitingForCanaries"]
        );
        let (r, halted) = rollout_of(&p);
        assert_eq!((r.phase, r.pending), (RolloutPhase::Progressing, 3));
        assert!(!halted.ok);

        // the canary took it and runs it for 30 s: soaking, nobody else
        s.desired
            .insert("d1".into(), Arc::new(key("d1", 2, &new).1));
        s.workloads = shared([report("d1", 2, WorkloadState::Running, 30)]);
        let p = plan(&s, now, &mut AttemptId::new_random);
        assert_eq!(images(&p), ["d1=nginx:2", "d2=nginx:1", "d3=nginx:1"]);
        assert_eq!(rollout_of(&p).0.phase, RolloutPhase::Soaking);
        assert_eq!(waiting(&p), ["d2=soaking", "d3=soaking"]);
        let soak_end = Timestamp::from_unix_ms(now.unix_ms() + 30_000).to_string();
        assert_eq!(
            p.blocking[&DeviceId::try_from("d2").expect("id")][0].until,
            Some(soak_end)
        );
        // The device that reported gets the reason in its status (the others reported nothing: left alone).
        let d2_status = p.device_statuses.iter().find(|(n, _)| n == "d2");
        assert_eq!(d2_status, None, "d2 reported nothing yet");
        // its next report (the same workloads, a later time) ends the soak: it must wake the loop
        assert_eq!(
            p.heartbeat_watch
                .iter()
                .map(|d| d.as_str())
                .collect::<Vec<_>>(),
            ["d1"]
        );

        // 60 s: healthy; d2 is next, d3 waits
        s.workloads = shared([report("d1", 2, WorkloadState::Running, 60)]);
        let p = plan(&s, now, &mut AttemptId::new_random);
        assert_eq!(images(&p), ["d1=nginx:2", "d2=nginx:2", "d3=nginx:1"]);
        assert_eq!(rollout_of(&p).0.healthy, 1);
        assert_eq!(waiting(&p), ["d3=maxUnavailable"]);
        // d3 reports: its status carries the reason, and a pass that decides the same writes nothing new.
        s.workloads = shared([
            report("d1", 2, WorkloadState::Running, 60),
            report("d3", 1, WorkloadState::Running, 600),
        ]);
        let p = plan(&s, now, &mut AttemptId::new_random);
        let (_, d3) = p
            .device_statuses
            .iter()
            .find(|(n, _)| n == "d3")
            .expect("d3's status");
        assert_eq!(
            d3.blocking.iter().map(|b| b.message.as_str()).collect::<Vec<_>>(),
            ["FleetDeployment/web waits: maxUnavailable reached, 1 of 1 devices updating or soaking"]
        );
        let mut again = s.clone();
        let mut d3_obj = (*again.devices[2]).clone();
        d3_obj.status = Some(d3.clone());
        again.devices[2] = Arc::new(d3_obj);
        let p = plan(&again, now, &mut AttemptId::new_random);
        assert!(p.device_statuses.iter().all(|(n, _)| n != "d3"));

        // the canary's workload failed: halted, the rest keep the old spec
        s.workloads = shared([report("d1", 2, WorkloadState::Failed, 0)]);
        let p = plan(&s, now, &mut AttemptId::new_random);
        assert_eq!(images(&p), ["d1=nginx:2", "d2=nginx:1", "d3=nginx:1"]);
        assert_eq!(waiting(&p), ["d1=failed", "d2=halted", "d3=halted"]);
        let (r, halted) = rollout_of(&p);
        assert_eq!((r.phase, r.failed), (RolloutPhase::Halted, 1));
        assert!(halted.ok && halted.reason == "CanaryFailed", "{halted:?}");
        assert!(halted.message.contains("d1"), "{}", halted.message);
        let ok = conditions::nats_reachable(None);
        let at = Time(k8s_openapi::jiff::Timestamp::now());
        let (_, _, halted_status) = p.deployments[0].clone().finish(&ok, &at).expect("status");

        // it recovers: the halt holds (the status says Halted for this spec)
        s.deployments = vec![staged("nginx:2", json!({}), Some(halted_status.clone()))];
        s.workloads = shared([report("d1", 2, WorkloadState::Running, 600)]);
        let p = plan(&s, now, &mut AttemptId::new_random);
        assert_eq!(images(&p), ["d1=nginx:2", "d2=nginx:1", "d3=nginx:1"]);
        assert_eq!(waiting(&p), ["d2=halted", "d3=halted"]);
        let (r, halted) = rollout_of(&p);
        assert_eq!(r.phase, RolloutPhase::Halted);
        assert!(halted.ok && halted.message.contains("d1"), "{halted:?}");
        assert!(p.bump.is_empty());

        // a retry with the canary still failing gives it the spec again (a new generation) and lifts the halt
        let retry = json!({"annotations": {release::RETRY_ANNOTATION: "1"}});
        s.deployments = vec![staged(
            "nginx:2",
            retry.clone(),
            Some(halted_status.clone()),
        )];
        s.workloads = shared([report("d1", 2, WorkloadState::Failed, 0)]);
        let p = plan(&s, now, &mut AttemptId::new_random);
        assert_eq!(
            p.bump.iter().map(DeviceId::as_str).collect::<Vec<_>>(),
            ["d1"]
        );
        let (r, halted) = rollout_of(&p);
        assert_eq!(
            (r.phase, r.updating, r.retry.as_deref()),
            (RolloutPhase::Progressing, 1, Some("1"))
        );
        assert_eq!(
            waiting(&p),
            [
                "d1=updating",
                "d2=waitingForCanaries",
                "d3=waitingForCanaries"
            ]
        );
        assert!(!halted.ok);

        // a retry after the canary recovered: the rollout goes on
        s.workloads = shared([report("d1", 2, WorkloadState::Running, 600)]);
        let p = plan(&s, now, &mut AttemptId::new_random);
        assert_eq!(images(&p), ["d1=nginx:2", "d2=nginx:2", "d3=nginx:1"]);
        assert!(p.bump.is_empty());

        // an invalid rollout section is InvalidSpec and places nothing new
        let mut bad = (*staged("nginx:3", json!({}), None)).clone();
        bad.spec.rollout = Some(crate::crd::RolloutSpec {
            soak_seconds: Some(rollout::MAX_SECONDS + 1),
            ..Default::default()
        });
        s.deployments = vec![Arc::new(bad)];
        let p = plan(&s, now, &mut AttemptId::new_random);
        assert_eq!(
            p.deployments[0].wants[0].reason,
            conditions::REASON_INVALID_SPEC
        );
        assert!(p.deployments[0].wants[0].message.contains("soakSeconds"));
        assert_eq!(images(&p), ["d1=nginx:2", "d2=nginx:1", "d3=nginx:1"]);
    }

    /// A device that leaves a staged deployment while it soaks (its Device deleted, its device retired, or its
    /// label gone from the group) is dropped from the counts and the failure threshold: the rollout goes on with
    /// the others. A halt recorded while it soaked silent lifts once it left, with an event saying why; a halt from
    /// a real failure (a crash loop) holds when its device leaves.
    #[test]
    fn a_device_that_left_the_rollout_is_gone_not_failed() {
        use fleet_wire::{WorkloadState, WorkloadStatus};
        let staged = |status: Option<PlacementStatus>| {
            let mut d: FleetDeployment = (*obj::<FleetDeployment>(
                "FleetDeployment",
                "web",
                json!({}),
                json!({"allowedGroups": ["site-a"], "workloads": [{"name": "web", "image": "nginx:2"}],
                    "rollout": {"soakSeconds": 300, "maxUnavailable": 1}}),
            ))
            .clone();
            d.status = status;
            Arc::new(d)
        };
        let new = validate::deployment_workloads(&staged(None).spec).expect("valid");
        let mut old = new.clone();
        old[0].image = "nginx:1".into();
        let key = |id: &str, generation, ws: &[WorkloadSpec]| {
            let s = DesiredState::new(DeviceId::try_from(id).expect("id"), generation, ws.to_vec());
            (id.to_owned(), s.expect("state"))
        };
        let now = Timestamp::now();
        let ago = |secs: u64| Timestamp::from_unix_ms(now.unix_ms() - secs * 1000);
        // Reported `at` seconds ago, running the new spec since `started` seconds ago (or crash-looping).
        let report = |id: &str, state, started: u64, at: u64| {
            let mut r = fixtures::workload_status();
            r.device_id = DeviceId::try_from(id).expect("id");
            r.generation = 2;
            r.at = ago(at);
            r.workloads = vec![WorkloadStatus {
                name: new[0].name.clone(),
                state,
                container_id: None,
                spec_digest: Some(new[0].digest()),
                started_at: Some(ago(started)),
                error: None,
                failure: None,
                restarts: None,
                health: None,
            }];
            (id.to_owned(), r)
        };
        let image_of = |p: &Plan, id: &str| {
            p.desired[&DeviceId::try_from(id).expect("id")][0]
                .image
                .clone()
        };
        let rollout_of = |p: &Plan| p.deployments[0].next.rollout.clone().expect("rollout");
        let mut s = base();
        let site_a = json!({"site": "a"});
        s.devices = vec![
            device("d1", json!({"site": "a", "canary": "true"})),
            device("d2", site_a.clone()),
            device("d3", site_a.clone()),
        ];
        s.desired = shared([key("d1", 2, &new), key("d2", 2, &new), key("d3", 1, &old)]);
        // d1 soaked long ago; d2 took the change 120 s ago and has been silent for 100 s of its 300-s soak.
        s.workloads = shared([
            report("d1", WorkloadState::Running, 900, 0),
            report("d2", WorkloadState::Running, 120, 100),
        ]);
        s.deployments = vec![staged(None)];
        let p = plan(&s, now, &mut AttemptId::new_random);
        let r = rollout_of(&p);
        assert_eq!((r.phase, r.failed), (RolloutPhase::Halted, 1));
        assert_eq!(
            r.halted_by,
            [crate::crd::HaltCause {
                device: "d2".into(),
                failure: "silent".into()
            }]
        );
        assert_eq!(image_of(&p, "d3"), "nginx:1");
        let ok = conditions::nats_reachable(None);
        let at = Time(k8s_openapi::jiff::Timestamp::now());
        let (_, _, halted) = p.deployments[0].clone().finish(&ok, &at).expect("status");
        s.deployments = vec![staged(Some(halted.clone()))];
        // Still there and silent: the halt holds, no event.
        let p = plan(&s, now, &mut AttemptId::new_random);
        assert_eq!(rollout_of(&p).phase, RolloutPhase::Halted);
        assert!(p.events.is_empty());

        // It leaves, three ways: each lifts the halt (an event says why) and d3 gets the change.
        let mut deleted = (*device("d2", site_a.clone())).clone();
        deleted.metadata.deletion_timestamp = Some(at.clone());
        let ways: Vec<(&str, Snapshot)> = vec![
            ("deleted (retiring)", {
                let mut s = s.clone();
                s.devices[1] = Arc::new(deleted.clone());
                s
            }),
            ("retired", {
                let mut s = s.clone();
                let tomb = fleet_wire::DeviceRetirement {
                    device_id: DeviceId::try_from("d2").expect("id"),
                    retired_at: now,
                    device_uid: None,
                };
                s.retired = shared([("d2".to_owned(), tomb)]);
                s
            }),
            ("its label removed", {
                let mut s = s.clone();
                s.devices[1] = device("d2", json!({}));
                s
            }),
        ];
        for (how, s) in ways {
            let p = plan(&s, now, &mut AttemptId::new_random);
            let r = rollout_of(&p);
            assert_eq!(
                (r.phase, r.failed, r.healthy, r.soaking),
                (RolloutPhase::Progressing, 0, 1, 0),
                "{how}"
            );
            assert!(r.halted_by.is_empty(), "{how}");
            assert_eq!(
                image_of(&p, "d3"),
                "nginx:2",
                "{how}: d3 is given the change"
            );
            assert_eq!(p.events.len(), 1, "{how}");
            assert_eq!(p.events[0].reason, REASON_HALT_LIFTED);
            assert!(
                p.events[0]
                    .message
                    .contains("d2 (no heartbeat during its soak)"),
                "{}",
                p.events[0].message
            );
            let halted_want = p.deployments[0]
                .wants
                .iter()
                .find(|w| w.type_ == conditions::HALTED)
                .expect("Halted");
            assert!(!halted_want.ok, "{how}: {halted_want:?}");
            if how == "retired" || how == "deleted (retiring)" {
                assert!(
                    p.new_devices.is_empty() && p.device_statuses.iter().all(|(n, _)| n != "d2"),
                    "{how}: no Device made or written for it"
                );
            }
        }

        // A real failure: d2 crash-loops, the rollout halts; d2 then leaves and the halt holds.
        s.deployments = vec![staged(None)];
        s.workloads = shared([
            report("d1", WorkloadState::Running, 900, 0),
            report("d2", WorkloadState::CrashLooping, 10, 0),
        ]);
        let p = plan(&s, now, &mut AttemptId::new_random);
        assert_eq!(rollout_of(&p).phase, RolloutPhase::Halted);
        let (_, _, crashed) = p.deployments[0].clone().finish(&ok, &at).expect("status");
        let mut gone = s.clone();
        gone.devices[1] = Arc::new(deleted.clone());
        gone.deployments = vec![staged(Some(crashed))];
        let p = plan(&gone, now, &mut AttemptId::new_random);
        let r = rollout_of(&p);
        assert_eq!((r.phase, r.failed), (RolloutPhase::Halted, 0), "held");
        assert_eq!(
            r.halted_by,
            [crate::crd::HaltCause {
                device: "d2".into(),
                failure: "crashLooping".into()
            }],
            "the kept halt keeps its causes"
        );
        assert!(p.events.is_empty());
        assert_eq!(image_of(&p, "d3"), "nginx:1");

        // Leaving while soaking, before any halt: not counted, no halt, d3 next.
        s.deployments = vec![staged(None)];
        s.workloads = shared([
            report("d1", WorkloadState::Running, 900, 0),
            report("d2", WorkloadState::Running, 30, 0),
        ]);
        s.devices[1] = Arc::new(deleted);
        let p = plan(&s, now, &mut AttemptId::new_random);
        let r = rollout_of(&p);
        assert_eq!(
            (r.phase, r.failed, r.soaking),
            (RolloutPhase::Progressing, 0, 0)
        );
        assert_eq!(image_of(&p, "d3"), "nginx:2");
    }

    #[test]
    fn intent_write_decides_again_only_when_the_key_changed() {
        let mut s = base();
        s.releases = vec![release("r", "site-a")];
        s.info = shared([info("d1")]);
        let p = plan(&s, Timestamp::now(), &mut AttemptId::new_random);
        let w = &p.intents[0];
        assert_eq!(
            w.decide(None),
            Some(w.attempt.clone()),
            "unchanged: as planned"
        );
        // another replica wrote an attempt for the same build: keep it
        let mut theirs = w.attempt.clone();
        theirs.attempt_id = AttemptId::new_random();
        assert_eq!(w.decide(Some(&theirs)), None);
        // another replica wrote something else: decide again, a new attempt
        let mut other = theirs.clone();
        other.target_version = fleet_wire::Version::try_from("9.0.0").expect("v");
        let again = w.decide(Some(&other)).expect("a new attempt");
        assert_ne!(again.attempt_id, w.attempt.attempt_id);
        assert_eq!(again.target_version.as_str(), "2.0.0");
    }

    /// A deployment asking for a device and a capability that no WorkloadPolicy allows is `NotAllowed`: nothing
    /// new is placed, what runs under its workload names is held; a policy for its group lets it proceed.
    #[test]
    fn what_no_policy_allows_is_held_until_one_does() {
        let mut s = base();
        let mut i = fixtures::device_info();
        i.device_id = DeviceId::try_from("d1").expect("id");
        i.capabilities.push(fleet_wire::Capability::WorkloadSpecV2);
        s.info = shared([("d1".to_owned(), i)]);
        s.desired = shared([desired("d1", &["serial"])]);
        let before = s.desired["d1"].workloads.clone();
        s.deployments = vec![obj(
            "FleetDeployment",
            "serial",
            json!({}),
            json!({"allowedGroups": ["site-a"], "workloads": [{"name": "serial", "image": "localhost/serial:2",
                "devices": ["/dev/ttyS0"], "capabilities": ["NET_ADMIN"]}]}),
        )];
        let p = plan(&s, Timestamp::now(), &mut AttemptId::new_random);
        let ready = &p.deployments[0].wants[0];
        assert_eq!(ready.reason, conditions::REASON_NOT_ALLOWED);
        assert!(
            ready.message.starts_with("spec.workloads[0] (serial): device /dev/ttyS0 and capability NET_ADMIN are not allowed for groups [site-a]: no WorkloadPolicy applies")
                && ready.message.ends_with("workloads already placed are kept unchanged"),
            "{}",
            ready.message
        );
        assert_eq!(
            p.desired[&DeviceId::try_from("d1").expect("id")][..],
            before[..]
        );

        s.policies = vec![obj(
            "WorkloadPolicy",
            "serial",
            json!({}),
            json!({"groups": ["site-a", "all"], "devices": ["/dev/ttyS*"], "capabilities": ["NET_ADMIN"]}),
        )];
        let p = plan(&s, Timestamp::now(), &mut AttemptId::new_random);
        assert!(
            p.deployments[0].wants[0].ok,
            "{:?}",
            p.deployments[0].wants[0]
        );
        let placed = &p.desired[&DeviceId::try_from("d1").expect("id")];
        assert_eq!(placed[0].devices, ["/dev/ttyS0"]);
        assert_eq!(placed[0].capabilities, ["NET_ADMIN"]);
    }

    /// The TaskRun controller's reasons (crate::task_reasons) reach a Device's status.blocking through this one
    /// writer, after the rollouts' own; a pass that decides the same list writes nothing, and the list goes once the
    /// run gives the device nothing more.
    #[test]
    fn task_reasons_are_listed_by_the_one_device_writer() {
        use crate::blocking::{Blocking, BlockingKind};
        let now = Timestamp::now();
        let mut s = base();
        let mut report = fixtures::workload_status();
        report.device_id = DeviceId::try_from("d1").expect("id");
        s.workloads = shared([("d1".to_owned(), report)]);
        let waiting = Blocking {
            kind: BlockingKind::WaitingForCanaries,
            change: "TaskRun/fleet/upgrade-1".into(),
            message:
                "TaskRun/fleet/upgrade-1 waits for its canaries: 1 of 1 have not succeeded yet"
                    .into(),
            since: None,
            until: None,
        };
        // Published, with no run left unjudged.
        let published = |devices| {
            Arc::new(crate::task_reasons::Published {
                devices,
                kept: crate::task_reasons::Kept::Changes(Default::default()),
            })
        };
        let mut tasks = crate::task_reasons::ByDevice::new();
        tasks.insert(
            "d1".into(),
            crate::task_reasons::Listed {
                shown: vec![waiting.clone()],
                more: 0,
            },
        );
        s.task_reasons = published(tasks);
        let written = |p: &Plan, name: &str| {
            p.device_statuses
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, st)| st.clone())
        };
        let p = plan(&s, now, &mut AttemptId::new_random);
        let d1 = written(&p, "d1").expect("d1's status");
        assert_eq!(d1.blocking, std::slice::from_ref(&waiting));
        assert_eq!(d1.blocking_more, None);
        // d2 reported nothing: left alone
        assert_eq!(written(&p, "d2"), None);
        // the cache shows it: the same list again writes nothing
        let mut shown = (*s.devices[0]).clone();
        shown.status = Some(d1.clone());
        s.devices[0] = Arc::new(shown);
        let p = plan(&s, now, &mut AttemptId::new_random);
        assert_eq!(written(&p, "d1"), None);
        // the run ended: the entry goes
        s.task_reasons = published(Default::default());
        let p = plan(&s, now, &mut AttemptId::new_random);
        let d1 = written(&p, "d1").expect("d1's status without the reason");
        assert!(d1.blocking.is_empty(), "{:?}", d1.blocking);
    }
}
