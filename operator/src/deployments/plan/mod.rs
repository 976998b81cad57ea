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

mod deployments;
mod device_statuses;
mod groups;
mod releases;
#[cfg(test)]
mod tests;

use deployments::{deployment_statuses, deployments};
use device_statuses::devices_to_write;
use groups::groups;
use releases::releases;

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
