//! Staged rollouts, as a pure function: from what NATS says about each device in a rollout and the object's
//! `rollout` section, [`plan`] decides which devices get the change now, the rollout's phase, its counts and why
//! it halted. Nothing is remembered between passes: the position is read again from NATS (the intents written, the
//! statuses and heartbeats reported) every time, so an operator restarted at any point never releases a device
//! twice and never skips a gate. Table-tested.
//!
//! The rule (docs/crds.md, "Rollouts"): devices labelled `canary=true` first (all of them at once); the rest only
//! after every canary is healthy, i.e. committed and past its soak; then at most `maxUnavailable` of the rest
//! updating or soaking at once. A failed canary, a canary that restarted or fell silent during its soak or is
//! crash-looping, or more than `maxFailures` failed devices among the rest halt the rollout: no further device
//! gets the change. Devices already updated keep what they have. A halt holds ([`hold`]) until a person changes
//! the spec or sets the retry annotation to a new value, whatever the failed devices do meanwhile.
//!
//! Each pass also says, per device it leaves short of the change, why ([`Wait`], in [`Outcome::waits`]): the gate
//! that held it back, where the rule decided it. A Device's `status.blocking` copies it (blocking.rs).

use crate::crd::{PlacementStatus, RolloutPhase, RolloutSpec, RolloutStatus};
use fleet_wire::{DeviceId, Timestamp, UpgradePhase};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use std::time::Duration;

/// The label that makes a device a canary (value `true`).
pub const CANARY_LABEL: &str = "canary";

/// Default `heartbeatTimeoutSeconds`: three of the agent's default 30 s heartbeats.
pub const DEFAULT_HEARTBEAT_TIMEOUT_SECS: u32 = 90;
/// Longest `soakSeconds` and `heartbeatTimeoutSeconds`: one day.
pub const MAX_SECONDS: u32 = 86_400;
/// Shortest `heartbeatTimeoutSeconds` (a heartbeat is sent at most once a second).
pub const MIN_HEARTBEAT_TIMEOUT_SECS: u32 = 10;
/// Most devices a halt message names (the counts carry the rest).
pub const HALT_EXAMPLES: usize = 10;
/// Most failed devices a halted status lists as its causes (`rollout.haltedBy`); a halt with more lists none, and
/// never lifts by itself ([`left_silent`]).
pub const HALT_CAUSES: usize = 20;
/// Slack on top of a phase's own bound before a device counts as stalled: one operator resync, so that a device
/// is never called stalled only because the operator looked late.
pub const STALL_SLACK: Duration = Duration::from_secs(60);

/// The longest an agent upgrade stays in `phase` when nothing is wrong, from the agent-upgrade bounds (seed
/// agent-upgrades: download 5 min + probe 4 min while preparing, stop 65 s, start 4 min 15 s; a rollback is a stop
/// and a start); `None` for terminal phases.
pub fn phase_bound(phase: UpgradePhase) -> Option<Duration> {
    match phase {
        UpgradePhase::Preparing => Some(Duration::from_secs(9 * 60)),
        UpgradePhase::Stopping => Some(Duration::from_secs(65)),
        UpgradePhase::Starting => Some(Duration::from_secs(255)),
        UpgradePhase::RollingBack => Some(Duration::from_secs(65 + 255)),
        UpgradePhase::Complete | UpgradePhase::Failed | UpgradePhase::RollbackFailed => None,
    }
}

/// A count, or a percentage of the devices in the rollout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Amount {
    /// That many devices.
    Count(u32),
    /// That percentage (0 to 100) of the devices in the rollout, rounded down.
    Percent(u32),
}

impl Amount {
    /// A count (0 or more) or a percentage from `"0%"` to `"100%"`; `None`: neither (the problem
    /// [`super::validate::rollout_problems`] names).
    pub fn parse(v: &IntOrString) -> Option<Self> {
        match v {
            IntOrString::Int(n) => u32::try_from(*n).ok().map(Amount::Count),
            IntOrString::String(s) => s
                .strip_suffix('%')
                .and_then(|p| p.parse::<u32>().ok())
                .filter(|p| *p <= 100)
                .map(Amount::Percent),
        }
    }
    /// The number of devices out of `total`.
    pub fn of(self, total: usize) -> usize {
        match self {
            Amount::Count(n) => n as usize,
            Amount::Percent(p) => total * p as usize / 100,
        }
    }
}

/// A rollout section, checked and with its defaults filled in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// Canaries first and halts: false without a `rollout` section (every device at once, as before).
    pub staged: bool,
    /// How long an updated device must stay healthy.
    pub soak: Duration,
    /// Most non-canary devices updating or soaking at once (at least 1 after resolving).
    pub max_unavailable: Amount,
    /// Most failed non-canary devices before a halt.
    pub max_failures: Amount,
    /// A soaking device silent for longer counts as failed.
    pub heartbeat_timeout: Duration,
}

impl Policy {
    /// No `rollout` section: every device at once, never halted.
    pub const ALL_AT_ONCE: Policy = Policy {
        staged: false,
        soak: Duration::ZERO,
        max_unavailable: Amount::Percent(100),
        max_failures: Amount::Percent(100),
        heartbeat_timeout: Duration::from_secs(DEFAULT_HEARTBEAT_TIMEOUT_SECS as u64),
    };

    /// The policy of an object's `rollout` section (`None`: [`Policy::ALL_AT_ONCE`]), or why it is invalid.
    pub fn from_spec(spec: Option<&RolloutSpec>) -> Result<Policy, String> {
        let Some(r) = spec else {
            return Ok(Policy::ALL_AT_ONCE);
        };
        // Every problem at once, as the admission webhook names them.
        let problems = super::validate::rollout_problems(r);
        if !problems.is_empty() {
            return Err(problems.join("; "));
        }
        let timeout = r
            .heartbeat_timeout_seconds
            .unwrap_or(DEFAULT_HEARTBEAT_TIMEOUT_SECS);
        let amount = |v: &Option<IntOrString>, default| {
            v.as_ref().and_then(Amount::parse).unwrap_or(default)
        };
        Ok(Policy {
            staged: true,
            soak: Duration::from_secs(r.soak_seconds.unwrap_or(0).into()),
            max_unavailable: amount(&r.max_unavailable, Amount::Percent(100)),
            max_failures: amount(&r.max_failures, Amount::Count(0)),
            heartbeat_timeout: Duration::from_secs(timeout.into()),
        })
    }
}

/// What NATS says about one device in the rollout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Observed {
    /// Needs the change and has not been given it (or a retry asks for a new attempt).
    Pending,
    /// Given the change (its intent is written); the attempt is not terminal yet: the phase the device reported
    /// for it and when it entered it (the device's clock), once it reported.
    Updating(Option<(UpgradePhase, Timestamp)>),
    /// The attempt committed at `at`.
    Committed {
        /// When it committed (the device's clock).
        at: Timestamp,
        /// When the running agent process started (its `device-info`), when known (the device's clock).
        agent_started: Option<Timestamp>,
        /// The latest heartbeat of the new version (the device's clock).
        heartbeat: Option<Timestamp>,
        /// How often systemd restarted the agent before the process that started at `agent_started`
        /// (`device-info`'s `restarts`), when known; `None` for workloads.
        restarts: Option<u32>,
    },
    /// Runs the change without an attempt of this object (it had it before): healthy.
    Current,
    /// The attempt failed (or its rollback failed).
    Failed,
    /// Runs the change and keeps restarting (a deployment's container, [`fleet_wire::WorkloadState::CrashLooping`]):
    /// a soak failure, not a failed attempt.
    CrashLooping,
    /// Runs the change and its health check fails (a deployment's workload reported `unhealthy`): a soak failure,
    /// not a failed attempt.
    Unhealthy,
}

/// Why a device counts as failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// Its attempt failed.
    Attempt,
    /// Its agent restarted during the soak.
    Restarted,
    /// No heartbeat for longer than the timeout during the soak.
    Silent,
    /// The updated agent keeps restarting ([`fleet_wire::workload::is_crash_looping`]), during its soak or after.
    CrashLooping,
    /// A deployment's workload fails its health check on the device, during its soak or after.
    Unhealthy,
}

impl Failure {
    /// The name a halted status records it under (`rollout.haltedBy[].failure`).
    pub fn as_str(self) -> &'static str {
        match self {
            Failure::Attempt => "attemptFailed",
            Failure::Restarted => "restarted",
            Failure::Silent => "silent",
            Failure::CrashLooping => "crashLooping",
            Failure::Unhealthy => "unhealthy",
        }
    }

    /// True for a failure of the attempt itself, which the retry annotation retries; the others are soak
    /// failures of a device that runs the change.
    pub fn is_attempt(self) -> bool {
        self == Failure::Attempt
    }
}

/// Where one device stands, from [`Observed`], the policy and now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// Not given the change yet.
    Pending,
    /// Given the change, not committed.
    Updating,
    /// Committed, within its soak.
    Soaking,
    /// Committed and past its soak, or already current.
    Healthy,
    /// Failed.
    Failed(Failure),
}

/// One device of a rollout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The device.
    pub id: DeviceId,
    /// Labelled `canary=true`.
    pub canary: bool,
    /// What NATS says.
    pub observed: Observed,
    /// Its latest heartbeat (the device's clock), when one is known: a staged rollout gives the change to no
    /// device silent for longer than `heartbeatTimeoutSeconds`, and names an updating one silent that long plus
    /// [`STALL_SLACK`] as stalled.
    pub last_heartbeat: Option<Timestamp>,
    /// Set when the device's latest usage report has a filesystem with less than the free-space floor available
    /// ([`crate::fleet::usage::low_space`]): a staged rollout gives it the change only once it has room.
    pub low_space: Option<LowSpace>,
}

/// A device short of free space: the filesystem with the least available, what it has and what the floor asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LowSpace {
    /// The filesystem's role as the agent names it (`root`, `agentState`, `containers`).
    pub role: &'static str,
    /// Bytes available on it (the device's latest report).
    pub available_bytes: u64,
    /// The floor: [`fleet_wire::usage::FREE_SPACE_FLOOR_BYTES`].
    pub floor_bytes: u64,
}

/// Why a rollout halted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HaltReason {
    /// A canary failed its attempt or its soak.
    CanaryFailed,
    /// More failed devices among the rest than `maxFailures`.
    FailureThreshold,
}

impl HaltReason {
    /// The condition reason.
    pub fn as_str(self) -> &'static str {
        match self {
            HaltReason::CanaryFailed => "CanaryFailed",
            HaltReason::FailureThreshold => "FailureThreshold",
        }
    }
}

/// A halt: the reason, the failed devices that caused it (at most [`HALT_EXAMPLES`], each with why) and their
/// number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Halt {
    /// Why.
    pub reason: HaltReason,
    /// Up to [`HALT_EXAMPLES`] devices, `dev-1 (restarted during its soak)`.
    pub devices: Vec<String>,
    /// How many devices failed in the group that halted (canaries, or the rest).
    pub failed: usize,
    /// The tolerated number (0 for canaries).
    pub tolerated: usize,
    /// True when some of the failures are of an attempt (a retry re-runs those); false when every one is a soak
    /// failure (the devices run the change and a retry does not make them healthy).
    pub retryable: bool,
    /// Every failed device of the group that halted, with why, when they are at most [`HALT_CAUSES`] (else none):
    /// what the status records as `haltedBy`.
    pub causes: Vec<(DeviceId, Failure)>,
}

/// What one pass of a rollout decides.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// Devices to give the change now.
    pub release: Vec<DeviceId>,
    /// Phase and counts.
    pub status: RolloutStatus,
    /// Set when halted.
    pub halt: Option<Halt>,
    /// Devices being given the change, updating or soaking, for the `Progressing` message (a few).
    pub in_flight: Vec<DeviceId>,
    /// Updating devices in one phase for longer than its bound plus [`STALL_SLACK`] (a few, `dev-1 (preparing
    /// for 12m)`), and their number.
    pub stalled: (Vec<String>, u32),
    /// Every device this pass leaves short of the change, by device id, with why ([`Wait`]): the decision
    /// itself, which a Device's `status.blocking` copies (blocking.rs). Released, soaking and healthy devices are
    /// not in it.
    pub waits: Vec<(DeviceId, Wait)>,
    /// The next instant at which time alone changes what this rollout decides ([`next_change`]): the control
    /// loop's next pass comes then, not a resync later.
    pub next_change: Option<Timestamp>,
}

/// How an updating device is stuck (the planner's stall rule, [`stall`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stall {
    /// In `phase` since `since` (the device's clock), longer than the phase's bound plus [`STALL_SLACK`].
    Phase {
        /// The phase.
        phase: UpgradePhase,
        /// When it entered it.
        since: Timestamp,
    },
    /// No heartbeat since `since` for longer than the heartbeat timeout plus [`STALL_SLACK`].
    Silent {
        /// Its latest heartbeat (the device's clock).
        since: Timestamp,
    },
}

/// Why one pass leaves a device short of the change: decided where [`plan`] decides not to release it (or finds
/// it given and not there yet), so what a Device shows is the rule's own decision, not a second reading of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Pending while the rollout is halted (a halt found now, or one that holds: [`hold`]).
    Halted,
    /// Pending (not a canary) while `waiting` of the `canaries` canaries are not yet updated.
    Canaries {
        /// Canaries not yet updated (pending, updating; failed ones halt instead).
        waiting: u32,
        /// Canaries in the rollout.
        canaries: u32,
    },
    /// Pending (not a canary) while every canary is updated and some still soak: not before `until` (the latest
    /// canary soak's end; a canary counts as soaked once it reports a heartbeat at or after it).
    CanariesSoaking {
        /// The end of the latest canary soak.
        until: Timestamp,
    },
    /// Pending: `busy` of the `max` devices maxUnavailable allows are updating or soaking (after this pass's
    /// releases).
    MaxUnavailable {
        /// Non-canary devices updating or soaking, this pass's releases included.
        busy: u32,
        /// maxUnavailable, resolved (at least 1).
        max: u32,
    },
    /// Pending in a staged rollout and silent for longer than the heartbeat timeout: the change waits until it is
    /// heard from.
    Offline {
        /// Its latest heartbeat (the device's clock).
        since: Timestamp,
    },
    /// Pending in a staged rollout with less free space than the floor on one of its filesystems: the change
    /// waits until the device reports room. Not failed, and it holds no maxUnavailable slot.
    LowSpace(LowSpace),
    /// Given the change and not there yet: the phase it reported and since when, once it reported one.
    Updating(Option<(UpgradePhase, Timestamp)>),
    /// Given the change and stuck ([`Stall`]).
    Stalled(Stall),
    /// Failed ([`Failure`]): not given the change again until a retry or a new spec.
    Failed(Failure),
}

/// The phase's wire name (`preparing`, `rolling-back`, …), as status, events and alerts show it.
pub fn phase_word(phase: UpgradePhase) -> String {
    serde_json::to_value(phase)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// True when an agent upgrade has been in `phase` since `since` for longer than the phase's bound plus
/// [`STALL_SLACK`] (never for a terminal phase): the device is *stalled*.
pub fn is_stalled(phase: UpgradePhase, since: Timestamp, now: Timestamp) -> bool {
    phase_bound(phase).is_some_and(|bound| now.since(since) > bound + STALL_SLACK)
}

/// True when the device's latest heartbeat is older than the policy's heartbeat timeout (never without one).
fn is_silent(t: &Target, policy: &Policy, now: Timestamp) -> bool {
    t.last_heartbeat
        .is_some_and(|h| now.since(h) > policy.heartbeat_timeout)
}

/// How an updating device is stuck: its phase outlasted its bound, or it has sent no heartbeat for longer than the
/// heartbeat timeout plus [`STALL_SLACK`].
fn stall(t: &Target, policy: &Policy, now: Timestamp) -> Option<Stall> {
    let Observed::Updating(phase) = t.observed else {
        return None;
    };
    if let Some((phase, since)) = phase.filter(|(p, since)| is_stalled(*p, *since, now)) {
        return Some(Stall::Phase { phase, since });
    }
    let heard = t.last_heartbeat?;
    (now.since(heard) > policy.heartbeat_timeout + STALL_SLACK)
        .then_some(Stall::Silent { since: heard })
}

/// `dev (preparing for 12m)` or `dev (silent for 4m)`, as the `Progressing` message names a stalled device.
fn describe_stall(id: &DeviceId, s: Stall, now: Timestamp) -> String {
    match s {
        Stall::Phase { phase, since } => format!(
            "{id} ({} for {}m)",
            phase_word(phase),
            now.since(since).as_secs() / 60
        ),
        Stall::Silent { since } => {
            format!("{id} (silent for {}m)", now.since(since).as_secs() / 60)
        }
    }
}

/// Where a device stands now.
pub fn standing(observed: Observed, policy: &Policy, now: Timestamp) -> Standing {
    match observed {
        Observed::Pending => Standing::Pending,
        Observed::Updating(_) => Standing::Updating,
        Observed::Current => Standing::Healthy,
        Observed::Failed => Standing::Failed(Failure::Attempt),
        Observed::CrashLooping => Standing::Failed(Failure::CrashLooping),
        Observed::Unhealthy => Standing::Failed(Failure::Unhealthy),
        Observed::Committed {
            at,
            agent_started,
            heartbeat,
            restarts,
        } => {
            let soak_end = at.plus(policy.soak);
            // A crash loop of the updated agent fails it whenever it is seen, during its soak or after.
            let new_agent = agent_started.filter(|s| *s > at);
            if new_agent.is_some()
                && restarts
                    .is_some_and(|n| fleet_wire::workload::is_crash_looping(n, new_agent, now))
            {
                return Standing::Failed(Failure::CrashLooping);
            }
            // device-info is published once per agent process, before it commits: a later one is a restart.
            // Both times are the device's own clock, so no skew enters here.
            if agent_started.is_some_and(|s| s > at && s < soak_end) {
                return Standing::Failed(Failure::Restarted);
            }
            let silent = heartbeat.is_none_or(|h| now.since(h) > policy.heartbeat_timeout);
            if policy.soak.is_zero() {
                return Standing::Healthy;
            }
            // Past the soak once the device itself reported a heartbeat at or after its end.
            if heartbeat.is_some_and(|h| h >= soak_end) {
                return Standing::Healthy;
            }
            // A just-committed agent has not beaten yet: silence counts from the commit, not from the old agent.
            let silent_since_commit = silent && now.since(at) > policy.heartbeat_timeout;
            if silent_since_commit {
                Standing::Failed(Failure::Silent)
            } else {
                Standing::Soaking
            }
        }
    }
}

fn describe(id: &DeviceId, s: Standing) -> String {
    match s {
        Standing::Failed(Failure::Attempt) => format!("{id} (attempt failed)"),
        Standing::Failed(Failure::Restarted) => format!("{id} (agent restarted during its soak)"),
        Standing::Failed(Failure::Silent) => format!("{id} (no heartbeat during its soak)"),
        Standing::Failed(Failure::CrashLooping) => format!("{id} (crash-looping)"),
        Standing::Failed(Failure::Unhealthy) => format!("{id} (unhealthy)"),
        _ => id.to_string(),
    }
}

/// Most devices a status names as next.
pub const NEXT_SHOWN: usize = 5;

/// Decides one pass of a rollout over `targets` (sorted by device id: the rest are released in that order).
pub fn plan(targets: &[Target], policy: &Policy, now: Timestamp) -> Outcome {
    let standings: Vec<(&Target, Standing)> = targets
        .iter()
        .map(|t| (t, standing(t.observed, policy, now)))
        .collect();
    let mut status = RolloutStatus::default();
    for (_, s) in &standings {
        match s {
            Standing::Pending => status.pending += 1,
            Standing::Updating => status.updating += 1,
            Standing::Soaking => status.soaking += 1,
            Standing::Healthy => status.healthy += 1,
            Standing::Failed(f) => {
                status.failed += 1;
                if *f == Failure::CrashLooping {
                    status.crash_looping += 1;
                }
            }
        }
    }
    status.updated = status.soaking + status.healthy;
    let total = targets.len();
    let is_canary = |t: &Target| policy.staged && t.canary;
    type Failed = (Vec<String>, bool, Vec<(DeviceId, Failure)>);
    let failed_of = |canary: bool| -> Failed {
        let failed: Vec<(&Target, Standing)> = standings
            .iter()
            .filter(|(t, s)| is_canary(t) == canary && matches!(s, Standing::Failed(_)))
            .map(|(t, s)| (*t, *s))
            .collect();
        let retryable = failed
            .iter()
            .any(|(_, s)| matches!(s, Standing::Failed(f) if f.is_attempt()));
        let named = failed.iter().map(|(t, s)| describe(&t.id, *s)).collect();
        let causes = if failed.len() <= HALT_CAUSES {
            failed
                .iter()
                .filter_map(|(t, s)| match s {
                    Standing::Failed(f) => Some((t.id.clone(), *f)),
                    _ => None,
                })
                .collect()
        } else {
            Vec::new()
        };
        (named, retryable, causes)
    };
    let halt = if policy.staged {
        let (canaries, canaries_retryable, canary_causes) = failed_of(true);
        let (rest, rest_retryable, rest_causes) = failed_of(false);
        let tolerated = policy.max_failures.of(total);
        if !canaries.is_empty() {
            Some(Halt {
                reason: HaltReason::CanaryFailed,
                failed: canaries.len(),
                devices: canaries.into_iter().take(HALT_EXAMPLES).collect(),
                tolerated: 0,
                retryable: canaries_retryable,
                causes: canary_causes,
            })
        } else if rest.len() > tolerated {
            Some(Halt {
                reason: HaltReason::FailureThreshold,
                failed: rest.len(),
                devices: rest.into_iter().take(HALT_EXAMPLES).collect(),
                tolerated,
                retryable: rest_retryable,
                causes: rest_causes,
            })
        } else {
            None
        }
    } else {
        None
    };
    let in_flight_of = |canary: bool| {
        standings.iter().filter(move |(t, s)| {
            is_canary(t) == canary && matches!(s, Standing::Updating | Standing::Soaking)
        })
    };
    // A staged rollout gives the change only to devices that are heard from: a silent one may be mid-way
    // through anything, and would hold a maxUnavailable slot it cannot use. It waits, pending, and is given the
    // change on a pass after it is heard from again. So does a device without the free-space floor: a new image
    // or agent would fill it, and the change could fail half-way (it gets the change once it reports room).
    let pending_of = |canary: bool| {
        standings
            .iter()
            .filter(move |(t, s)| {
                is_canary(t) == canary
                    && *s == Standing::Pending
                    && !(policy.staged && (is_silent(t, policy, now) || t.low_space.is_some()))
            })
            .map(|(t, _)| t.id.clone())
    };
    let canaries_healthy = standings
        .iter()
        .filter(|(t, _)| is_canary(t))
        .all(|(_, s)| *s == Standing::Healthy);
    let release: Vec<DeviceId> = if halt.is_some() {
        vec![]
    } else if !canaries_healthy {
        pending_of(true).collect()
    } else {
        let budget = if policy.staged {
            policy.max_unavailable.of(total).max(1)
        } else {
            usize::MAX
        };
        let busy = in_flight_of(false).count();
        pending_of(false)
            .take(budget.saturating_sub(busy))
            .collect()
    };
    // Who waits next: not released by this pass, in release order; nobody while halted.
    status.next = if halt.is_some() {
        Vec::new()
    } else {
        pending_of(true)
            .chain(pending_of(false))
            .filter(|id| !release.contains(id))
            .take(NEXT_SHOWN)
            .map(|id| id.to_string())
            .collect()
    };
    status.soak_ends_at = standings
        .iter()
        .filter(|(_, s)| *s == Standing::Soaking)
        .filter_map(|(t, _)| match t.observed {
            Observed::Committed { at, .. } => Some(at.plus(policy.soak)),
            _ => None,
        })
        .min()
        .map(|t| t.to_string());
    let mut in_flight: Vec<DeviceId> = release.clone();
    in_flight.extend(
        in_flight_of(true)
            .chain(in_flight_of(false))
            .map(|(t, _)| t.id.clone()),
    );
    in_flight.truncate(HALT_EXAMPLES);
    let mut stalled = (Vec::new(), 0u32);
    for t in targets {
        if let Some(s) = stall(t, policy, now) {
            stalled.1 += 1;
            if stalled.0.len() < HALT_EXAMPLES {
                stalled.0.push(describe_stall(&t.id, s, now));
            }
        }
    }
    // Why each device not released stays short of the change, from the same gates that held it back above.
    let canaries_waiting = standings
        .iter()
        .filter(|(t, s)| is_canary(t) && matches!(s, Standing::Pending | Standing::Updating))
        .count() as u32;
    let canary_soak_until = standings
        .iter()
        .filter(|(t, s)| is_canary(t) && *s == Standing::Soaking)
        .filter_map(|(t, _)| match t.observed {
            Observed::Committed { at, .. } => Some(at.plus(policy.soak)),
            _ => None,
        })
        .max();
    let gate = if halt.is_some() {
        Wait::Halted
    } else if !canaries_healthy {
        match (canaries_waiting, canary_soak_until) {
            (0, Some(until)) => Wait::CanariesSoaking { until },
            _ => Wait::Canaries {
                waiting: canaries_waiting,
                canaries: standings.iter().filter(|(t, _)| is_canary(t)).count() as u32,
            },
        }
    } else {
        let max = policy.max_unavailable.of(total).max(1) as u32;
        let busy = in_flight_of(false).count() + release.len();
        Wait::MaxUnavailable {
            busy: busy as u32,
            max,
        }
    };
    // A set: a rollout without a section releases every device at once.
    let released: std::collections::BTreeSet<&DeviceId> = release.iter().collect();
    let waits = standings
        .iter()
        .filter(|(t, _)| !released.contains(&t.id))
        .filter_map(|(t, s)| {
            let wait = match s {
                Standing::Soaking | Standing::Healthy => return None,
                Standing::Failed(f) => Wait::Failed(*f),
                Standing::Updating => match stall(t, policy, now) {
                    Some(st) => Wait::Stalled(st),
                    None => match t.observed {
                        Observed::Updating(p) => Wait::Updating(p),
                        _ => Wait::Updating(None),
                    },
                },
                Standing::Pending if halt.is_some() => Wait::Halted,
                Standing::Pending => match (t.last_heartbeat, t.low_space) {
                    (Some(since), _) if policy.staged && is_silent(t, policy, now) => {
                        Wait::Offline { since }
                    }
                    (_, Some(low)) if policy.staged => Wait::LowSpace(low),
                    _ => gate,
                },
            };
            Some((t.id.clone(), wait))
        })
        .collect();
    status.stalled = stalled.1;
    status.halted_by = halt
        .iter()
        .flat_map(|h| &h.causes)
        .map(|(d, f)| crate::crd::HaltCause {
            device: d.to_string(),
            failure: f.as_str().to_owned(),
        })
        .collect();
    status.phase = if halt.is_some() {
        RolloutPhase::Halted
    } else if status.pending + status.updating + status.soaking == 0 {
        // Done; "Complete" only if the change reached some device (or there was nothing to fail).
        if status.failed > 0 && status.updated == 0 {
            RolloutPhase::Failed
        } else {
            RolloutPhase::Complete
        }
    } else if status.updating == 0 && status.soaking > 0 && release.is_empty() {
        RolloutPhase::Soaking
    } else {
        RolloutPhase::Progressing
    };
    Outcome {
        release,
        status,
        halt,
        in_flight,
        stalled,
        waits,
        next_change: next_change(targets, policy, now),
    }
}

/// The earliest instant after `now` at which time alone, with no report, changes a device's standing or wait:
/// a heartbeat or a commit outliving the heartbeat timeout (a soaking device fails, a pending one waits as
/// offline), an updating device becoming stalled (its phase's bound or its silence, plus [`STALL_SLACK`]).
/// Just past each bound, as the rules compare with `>`. Everything else changes with a report, which wakes the
/// loop by itself.
pub fn next_change(targets: &[Target], policy: &Policy, now: Timestamp) -> Option<Timestamp> {
    const PAST: Duration = Duration::from_millis(10);
    let mut at = Vec::new();
    for t in targets {
        if let Some(h) = t.last_heartbeat.filter(|_| policy.staged) {
            at.push(h.plus(policy.heartbeat_timeout + PAST));
        }
        match t.observed {
            Observed::Updating(phase) => {
                if let Some((bound, since)) =
                    phase.and_then(|(p, since)| Some((phase_bound(p)?, since)))
                {
                    at.push(since.plus(bound + STALL_SLACK + PAST));
                }
                if let Some(h) = t.last_heartbeat {
                    at.push(h.plus(policy.heartbeat_timeout + STALL_SLACK + PAST));
                }
            }
            Observed::Committed {
                at: c, heartbeat, ..
            } if !policy.soak.is_zero() => {
                at.push(c.plus(policy.heartbeat_timeout + PAST));
                if let Some(h) = heartbeat {
                    at.push(h.plus(policy.heartbeat_timeout + PAST));
                }
            }
            _ => {}
        }
    }
    at.into_iter().filter(|t| *t > now).min()
}

/// The retry annotation's value, when set and not empty.
pub fn token(value: Option<&String>) -> Option<&str> {
    value.map(String::as_str).filter(|t| !t.is_empty())
}

/// True when the retry annotation holds a value the object's status was not decided under: a person asked for a
/// retry, which lifts a held halt (and retries what the object's kind retries).
pub fn retry_requested(old: Option<&PlacementStatus>, token: Option<&str>) -> bool {
    token.is_some()
        && old
            .and_then(|s| s.rollout.as_ref())
            .and_then(|r| r.retry.as_deref())
            != token
}

/// True when the previous status halted this same spec (`generation`) under the same retry value: the halt
/// holds, even if the devices that caused it recovered, passed their soak window or left, and across operator
/// restarts (it is read from the status), until a person changes the spec or the annotation.
pub fn halt_holds(
    old: Option<&PlacementStatus>,
    generation: Option<i64>,
    token: Option<&str>,
) -> bool {
    old.is_some_and(|s| {
        s.observed_generation == generation
            && s.rollout
                .as_ref()
                .is_some_and(|r| r.phase == RolloutPhase::Halted && r.retry.as_deref() == token)
    })
}

/// The devices whose leaving lifts the halt `old` recorded, when it does: every cause of it ([`HALT_CAUSES`] at
/// most, all listed) is a device that fell silent during its soak and is no longer in the rollout (`present` says
/// which device ids still are: retired, deleted and ungrouped devices are not). A device gone silent and then gone
/// from the fleet is gone, not failed. A halt with any other cause (a failed attempt, a restart, a crash loop, an
/// unhealthy workload) holds even when its device leaves: that would let a bad change through by removing the
/// device that showed it.
pub fn left_silent(
    old: Option<&PlacementStatus>,
    present: &dyn Fn(&str) -> bool,
) -> Option<Vec<String>> {
    let r = old?.rollout.as_ref()?;
    if r.phase != RolloutPhase::Halted || r.halted_by.is_empty() {
        return None;
    }
    r.halted_by
        .iter()
        .all(|c| c.failure == Failure::Silent.as_str() && !present(&c.device))
        .then(|| r.halted_by.iter().map(|c| c.device.clone()).collect())
}

/// The halt rule applied to a pass: while the halt `holds` ([`halt_holds`], and no retry was asked for), a pass
/// that found nothing failing now still releases no device and stays `Halted`, with nobody next. Returns true
/// when the previous halt was kept this way (its condition is then kept as it was); a pass that finds failures
/// now halts afresh and returns false.
pub fn hold(outcome: &mut Outcome, holds: bool) -> bool {
    if !holds || outcome.halt.is_some() {
        return false;
    }
    // Whoever this pass would have given the change, or held back for a gate, now waits for the halt.
    let released = std::mem::take(&mut outcome.release);
    for (_, w) in &mut outcome.waits {
        if matches!(
            w,
            Wait::Canaries { .. }
                | Wait::CanariesSoaking { .. }
                | Wait::MaxUnavailable { .. }
                | Wait::Offline { .. }
                | Wait::LowSpace(_)
        ) {
            *w = Wait::Halted;
        }
    }
    outcome
        .waits
        .extend(released.into_iter().map(|id| (id, Wait::Halted)));
    outcome.waits.sort_by(|a, b| a.0.cmp(&b.0));
    outcome.status.next.clear();
    outcome.status.phase = RolloutPhase::Halted;
    true
}

/// A kept halt's causes: the ones the status recorded when it halted (a pass that finds nothing failing now has
/// none of its own).
pub fn keep_causes(outcome: &mut Outcome, old: Option<&PlacementStatus>) {
    if let Some(r) = old.and_then(|o| o.rollout.as_ref()) {
        outcome.status.halted_by = r.halted_by.clone();
    }
}

#[cfg(test)]
mod tests;
