//! The fleet counted from the dashboard's caches: devices by agent version and by heartbeat age, workloads by
//! state, rollouts by kind and phase, the rollouts not complete and the running task runs. The overview's bars
//! and `/metrics`' gauges both count here, so the picture and the scrape cannot disagree.

use super::html::name;
use crate::crd::tasks::TaskRun;
use crate::crd::{AgentRelease, Device, FleetDeployment, RolloutPhase, RolloutStatus};
use fleet_wire::{TaskRunPhase, Timestamp};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The label under which the versions past a cap are summed.
pub const OTHER: &str = "other";
/// The version of a device that has not reported one.
pub const UNKNOWN_VERSION: &str = "unknown";

/// Heartbeat-age buckets: label and exclusive upper bound in seconds; then [`OVER_A_DAY`] and [`NEVER`].
pub const AGE_BUCKETS: [(&str, u64); 4] = [
    ("under 1 minute", 60),
    ("1–5 minutes", 5 * 60),
    ("5–60 minutes", 3600),
    ("1–24 hours", 86400),
];
/// The bucket of a heartbeat a day old or older.
pub const OVER_A_DAY: &str = "over 24 hours";
/// The bucket of a device that never sent a heartbeat.
pub const NEVER: &str = "never";

/// Every rollout phase, in the order of its lifecycle (each exported, at 0 when none).
pub const ROLLOUT_PHASES: [RolloutPhase; 5] = [
    RolloutPhase::Progressing,
    RolloutPhase::Soaking,
    RolloutPhase::Halted,
    RolloutPhase::Complete,
    RolloutPhase::Failed,
];
/// The phase label of an object without a rollout status (none written yet, or no `rollout` section).
pub const NO_ROLLOUT: &str = "none";

/// A device's agent version as shown ([`UNKNOWN_VERSION`] before it reported one).
pub fn version_of(d: &Device) -> String {
    d.status
        .as_ref()
        .and_then(|s| s.agent_version.as_ref())
        .map(|v| v.to_string())
        .unwrap_or_else(|| UNKNOWN_VERSION.into())
}

/// Devices per agent version.
pub fn versions(devices: &[Arc<Device>]) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    for d in devices {
        *m.entry(version_of(d)).or_insert(0) += 1;
    }
    m
}

/// `counts` most first (ties by name), the first `keep` as they are and the rest summed as [`OTHER`] (absent when
/// nothing is left over): a bar's parts and a metric's series stay bounded for any fleet.
pub fn top(counts: &BTreeMap<String, u64>, keep: usize) -> Vec<(String, u64)> {
    let mut v: Vec<(String, u64)> = counts.iter().map(|(k, n)| (k.clone(), *n)).collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let rest: u64 = v.iter().skip(keep).map(|(_, n)| n).sum();
    v.truncate(keep);
    if counts.len() > keep {
        v.push((OTHER.into(), rest));
    }
    v
}

/// The heartbeat-age bucket of a device last heard from at `last`.
pub fn age_bucket(last: Option<Timestamp>, now: Timestamp) -> &'static str {
    let Some(t) = last else { return NEVER };
    let secs = now.since(t).as_secs();
    AGE_BUCKETS
        .iter()
        .find(|(_, max)| secs < *max)
        .map(|(l, _)| *l)
        .unwrap_or(OVER_A_DAY)
}

/// Devices per heartbeat-age bucket, every bucket in order (youngest first, [`NEVER`] last), zeros included.
pub fn heartbeat_ages(
    devices: &[Arc<Device>],
    last_heartbeat: &dyn Fn(&Device) -> Option<Timestamp>,
    now: Timestamp,
) -> Vec<(&'static str, u64)> {
    let mut v: Vec<(&'static str, u64)> = AGE_BUCKETS
        .iter()
        .map(|(l, _)| (*l, 0))
        .chain([(OVER_A_DAY, 0), (NEVER, 0)])
        .collect();
    for d in devices {
        let b = age_bucket(last_heartbeat(d), now);
        if let Some(e) = v.iter_mut().find(|(l, _)| *l == b) {
            e.1 += 1;
        }
    }
    v
}

/// Workloads over the fleet, summed from each Device's `status.workloads`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Workloads {
    /// Running with the desired spec.
    pub running: u64,
    /// Failed on their device (crash-looping ones included).
    pub failed: u64,
    /// Of the failed, those whose container keeps restarting (`crash-looping`).
    pub crash_looping: u64,
    /// Not reported yet, starting, or being replaced.
    pub pending: u64,
    /// Devices whose status counts workloads (the rest have not reported any).
    pub devices: u64,
}

/// [`Workloads`] of `devices`.
pub fn workloads(devices: &[Arc<Device>]) -> Workloads {
    let mut w = Workloads::default();
    for h in devices
        .iter()
        .filter_map(|d| d.status.as_ref()?.workloads.as_ref())
    {
        w.running += u64::from(h.running);
        w.failed += u64::from(h.failed);
        w.crash_looping += u64::from(h.crash_looping);
        w.pending += u64::from(h.pending);
        w.devices += 1;
    }
    w
}

impl Workloads {
    /// The workloads by state, each counted once: running, failed (not crash-looping), crash-looping, pending
    /// (the overview's bar and `fleet_workloads`).
    pub fn by_state(&self) -> [(&'static str, u64); 4] {
        [
            ("running", self.running),
            ("failed", self.failed.saturating_sub(self.crash_looping)),
            ("crash-looping", self.crash_looping),
            ("pending", self.pending),
        ]
    }
}

/// Devices whose agent is crash-looping at `now` (fleet-wire's rule on `status.agentRestarts`, as the
/// `AgentCrashLooping` alert judges it).
pub fn agents_crash_looping(devices: &[Arc<Device>], now: Timestamp) -> u64 {
    let looping = devices
        .iter()
        .filter_map(|d| d.status.as_ref()?.agent_restarts.as_ref())
        .filter(|a| {
            fleet_wire::workload::is_crash_looping(a.count, super::html::parse_time(&a.since), now)
        })
        .count();
    u64::try_from(looping).unwrap_or(u64::MAX)
}

/// The kind label of a rollout.
pub const RELEASE: &str = "AgentRelease";
/// The kind label of a rollout.
pub const DEPLOYMENT: &str = "FleetDeployment";

/// A rollout as the overview lists it.
pub struct Rollout<'a> {
    /// [`RELEASE`] or [`DEPLOYMENT`].
    pub kind: &'static str,
    /// The object's name (both kinds are cluster-scoped).
    pub name: &'a str,
    /// Its rollout status.
    pub status: &'a RolloutStatus,
}

/// Every rollout status of `releases` and `deployments`, with its kind and name (`None`: no rollout status).
fn all<'a>(
    releases: &'a [Arc<AgentRelease>],
    deployments: &'a [Arc<FleetDeployment>],
) -> impl Iterator<Item = (&'static str, &'a str, Option<&'a RolloutStatus>)> {
    let r = releases.iter().map(|r| {
        let s = r.status.as_ref().and_then(|s| s.rollout.as_ref());
        (RELEASE, r.metadata.name.as_deref().unwrap_or(""), s)
    });
    let d = deployments.iter().map(|d| {
        let s = d.status.as_ref().and_then(|s| s.rollout.as_ref());
        (DEPLOYMENT, d.metadata.name.as_deref().unwrap_or(""), s)
    });
    r.chain(d)
}

/// Rollouts by kind and phase ([`NO_ROLLOUT`] for an object without a rollout status), every kind and phase
/// present, at 0 when none.
pub fn rollout_phases(
    releases: &[Arc<AgentRelease>],
    deployments: &[Arc<FleetDeployment>],
) -> BTreeMap<(&'static str, String), u64> {
    let mut m = BTreeMap::new();
    for kind in [RELEASE, DEPLOYMENT] {
        for p in ROLLOUT_PHASES.iter().map(name).chain([NO_ROLLOUT.into()]) {
            m.insert((kind, p), 0);
        }
    }
    for (kind, _, s) in all(releases, deployments) {
        let p = s
            .map(|s| name(&s.phase))
            .unwrap_or_else(|| NO_ROLLOUT.into());
        *m.entry((kind, p)).or_insert(0) += 1;
    }
    m
}

/// The rollouts whose phase is not `Complete` (progressing, soaking, halted, or failed), releases first, each
/// kind by name.
pub fn not_complete<'a>(
    releases: &'a [Arc<AgentRelease>],
    deployments: &'a [Arc<FleetDeployment>],
) -> Vec<Rollout<'a>> {
    let mut v: Vec<Rollout> = all(releases, deployments)
        .filter_map(|(kind, name, s)| {
            let status = s.filter(|s| s.phase != RolloutPhase::Complete)?;
            Some(Rollout { kind, name, status })
        })
        .collect();
    v.sort_by(|a, b| a.kind.cmp(b.kind).then_with(|| a.name.cmp(b.name)));
    v
}

/// The task runs in phase `Running`, by namespace and name.
pub fn running(runs: &[Arc<TaskRun>]) -> Vec<&TaskRun> {
    let mut v: Vec<&TaskRun> = runs
        .iter()
        .map(|r| r.as_ref())
        .filter(|r| r.status.as_ref().and_then(|s| s.run.phase) == Some(TaskRunPhase::Running))
        .collect();
    v.sort_by(|a, b| {
        (&a.metadata.namespace, &a.metadata.name).cmp(&(&b.metadata.namespace, &b.metadata.name))
    });
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn counts(v: &[(&str, u64)]) -> BTreeMap<String, u64> {
        v.iter().map(|(k, n)| (k.to_string(), *n)).collect()
    }

    #[test]
    fn top_keeps_the_largest_and_sums_the_rest() {
        let c = counts(&[("1.0.0", 2), ("2.0.0", 5), ("1.5.0", 2), ("0.9.0", 1)]);
        assert_eq!(
            top(&c, 2),
            vec![("2.0.0".into(), 5), ("1.0.0".into(), 2), (OTHER.into(), 3)],
            "ties by name: 1.0.0 before 1.5.0"
        );
        assert_eq!(top(&c, 4).len(), 4, "no other when nothing is left over");
        assert_eq!(top(&c, 9).iter().map(|(_, n)| n).sum::<u64>(), 10);
        assert!(top(&BTreeMap::new(), 8).is_empty());
    }

    #[test]
    fn ages_fall_in_their_buckets() {
        let now = Timestamp::from_unix_ms(1_000_000_000);
        let ago = |s: u64| Some(Timestamp::from_unix_ms(now.unix_ms() - s * 1000));
        assert_eq!(age_bucket(ago(0), now), "under 1 minute");
        assert_eq!(age_bucket(ago(59), now), "under 1 minute");
        assert_eq!(age_bucket(ago(60), now), "1–5 minutes");
        assert_eq!(age_bucket(ago(3599), now), "5–60 minutes");
        assert_eq!(age_bucket(ago(3600), now), "1–24 hours");
        assert_eq!(age_bucket(ago(86400), now), OVER_A_DAY);
        assert_eq!(age_bucket(None, now), NEVER);
        // A device clock ahead of ours is "just now", not an error.
        assert_eq!(
            age_bucket(Some(now.plus(Duration::from_secs(30))), now),
            "under 1 minute"
        );
    }
}
