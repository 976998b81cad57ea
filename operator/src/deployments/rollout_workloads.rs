//! A FleetDeployment's side of a staged rollout, as pure functions: what *updated*, *healthy* and *failed* mean
//! for workloads, mapped into the planner's [`Observed`] (the planner itself, [`crate::fleet::rollout::plan`], is the one
//! AgentRelease uses) and what a device not given the change yet keeps. Everything is read from NATS (the device's desired-state key and its workload status) and the CR
//! (its status and annotations), so a restarted operator finds the same position. Table-tested.
//!
//! - *updated*: the device's desired-state key holds every workload of the deployment's spec as it is now;
//! - *healthy*: the device reports every one of them running that spec (its digest), at a generation at least
//!   the key's, each container started (its `startedAt`) at least `soakSeconds` before the report; a restart moves
//!   `startedAt`, so the soak starts again. A workload with a `healthCheck` counts as running only once it reports
//!   `healthy` (`starting` keeps the device updating). A report older than `heartbeatTimeoutSeconds` during the
//!   soak fails;
//! - *failed*: one of them reports `failed` (the agent could not pull, create or start it), `crash-looping`
//!   (Podman keeps restarting it), `exited` for that spec, or runs it `unhealthy` (its health check failed
//!   `retries` times in a row; during the soak or after, like a crash loop);
//! - otherwise *updating*.

use crate::fleet::rollout::Observed;
use fleet_wire::{
    DesiredState, DeviceWorkloadStatus, HealthState, Timestamp, WorkloadSpec, WorkloadState,
};
use std::collections::BTreeSet;

/// True when `current` (the device's desired-state key) holds every workload of `new`, exactly.
pub fn is_updated(new: &[WorkloadSpec], current: Option<&DesiredState>) -> bool {
    let have = current.map(|c| c.workloads.as_slice()).unwrap_or_default();
    new.iter().all(|w| have.contains(w))
}

/// What a device not given the change keeps: the workloads its key holds under the names of the deployment's
/// spec (nothing for a device that never had them). A workload removed from the spec is removed everywhere at
/// once: only changes and additions are staged.
pub fn previous(new: &[WorkloadSpec], current: Option<&DesiredState>) -> Vec<WorkloadSpec> {
    let names: BTreeSet<&str> = new.iter().map(|w| w.name.as_str()).collect();
    current
        .map(|c| c.workloads.as_slice())
        .unwrap_or_default()
        .iter()
        .filter(|w| names.contains(w.name.as_str()))
        .cloned()
        .collect()
}

/// Where one targeted device stands for the deployment's spec `new`, from its desired-state key and its report.
pub fn observe(
    new: &[WorkloadSpec],
    current: Option<&DesiredState>,
    report: Option<&DeviceWorkloadStatus>,
) -> Observed {
    let Some(cur) = current.filter(|_| is_updated(new, current)) else {
        return Observed::Pending;
    };
    // A report of an older generation describes what the device had before this key.
    let Some(report) = report.filter(|r| r.generation >= cur.generation) else {
        return Observed::Updating(None);
    };
    let mut started: Option<Timestamp> = None;
    let mut all_running = true;
    for w in new {
        let digest = w.digest();
        let entry = report.workloads.iter().find(|r| r.name == w.name);
        let of_spec = entry.is_some_and(|r| r.spec_digest.as_ref().is_none_or(|d| *d == digest));
        match entry.map(|r| r.state) {
            // A crash loop fails the device whenever it is seen: a restart alone only restarts the soak.
            Some(WorkloadState::Failed) => return Observed::Failed,
            Some(WorkloadState::CrashLooping) => return Observed::CrashLooping,
            Some(WorkloadState::Exited) if of_spec => return Observed::Failed,
            Some(WorkloadState::Running)
                if entry.is_some_and(|r| r.spec_digest.as_ref() == Some(&digest)) =>
            {
                // With a health check, running the change means passing it: still `starting` is updating, and a
                // failing check fails the device whenever it is seen, like a crash loop.
                let health = entry.and_then(|r| r.health);
                if w.health_check.is_some() && health != Some(HealthState::Healthy) {
                    if health == Some(HealthState::Unhealthy) {
                        return Observed::Unhealthy;
                    }
                    all_running = false;
                    continue;
                }
                // The soak counts from the latest start; without one (an older agent) from the report itself,
                // which only a zero soak passes.
                let at = entry.and_then(|r| r.started_at).unwrap_or(report.at);
                started = Some(started.map_or(at, |s| s.max(at)));
            }
            _ => all_running = false,
        }
    }
    match (all_running, started) {
        (true, Some(at)) => Observed::Committed {
            at,
            agent_started: None,
            heartbeat: Some(report.at),
            restarts: None,
        },
        // A deployment with no workloads has nothing to wait for.
        (true, None) => Observed::Current,
        (false, _) => Observed::Updating(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{PlacementStatus, RolloutPhase, RolloutStatus};
    use crate::fleet::rollout::{
        halt_holds, plan, retry_requested, token, Policy, Standing, Target,
    };
    use fleet_wire::{fixtures, DeviceId, WorkloadStatus};

    const T0: u64 = 1_800_000_000_000;
    fn t(secs: u64) -> Timestamp {
        Timestamp::from_unix_ms(T0 + secs * 1000)
    }
    fn web(image: &str) -> WorkloadSpec {
        let mut w = fixtures::workload("web");
        w.image = image.into();
        w
    }
    fn key(generation: u64, ws: &[WorkloadSpec]) -> DesiredState {
        DesiredState::new(fixtures::device(), generation, ws.to_vec()).expect("state")
    }
    /// A report at `at` (seconds) of generation `generation`: each workload's state, spec and start.
    fn report(
        generation: u64,
        at: u64,
        ws: &[(&WorkloadSpec, WorkloadState, Option<u64>)],
    ) -> DeviceWorkloadStatus {
        let mut s = fixtures::workload_status();
        s.generation = generation;
        s.at = t(at);
        s.workloads = ws
            .iter()
            .map(|(w, state, started)| WorkloadStatus {
                name: w.name.clone(),
                state: *state,
                container_id: None,
                spec_digest: (*state != WorkloadState::Failed).then(|| w.digest()),
                started_at: started.map(t),
                error: None,
                failure: None,
                restarts: None,
                health: None,
            })
            .collect();
        s
    }

    #[test]
    fn observe_table() {
        use WorkloadState::*;
        let (old, new) = (web("nginx:1"), web("nginx:2"));
        let news = [new.clone()];
        let db = fixtures::workload("db");
        let committed = |at, beat| Observed::Committed {
            at: t(at),
            agent_started: None,
            heartbeat: Some(t(beat)),
            restarts: None,
        };
        let cases: Vec<(
            &str,
            Option<DesiredState>,
            Option<DeviceWorkloadStatus>,
            Observed,
        )> = vec![
            ("no key", None, None, Observed::Pending),
            (
                "the key holds the old spec",
                Some(key(3, &[old.clone(), db.clone()])),
                Some(report(3, 50, &[(&old, Running, Some(10))])),
                Observed::Pending,
            ),
            (
                "given, not reported yet",
                Some(key(4, &[new.clone(), db.clone()])),
                None,
                Observed::Updating(None),
            ),
            (
                "given; the report is of the previous generation (its failure is the old spec's)",
                Some(key(4, &news)),
                Some(report(3, 50, &[(&new, Failed, None)])),
                Observed::Updating(None),
            ),
            (
                "the old container still runs",
                Some(key(4, &news)),
                Some(report(4, 50, &[(&old, Running, Some(10))])),
                Observed::Updating(None),
            ),
            (
                "the new image could not be pulled",
                Some(key(4, &news)),
                Some(report(4, 50, &[(&new, Failed, None)])),
                Observed::Failed,
            ),
            (
                "the new container is crash-looping",
                Some(key(4, &news)),
                Some(report(4, 50, &[(&new, CrashLooping, None)])),
                Observed::CrashLooping,
            ),
            (
                "the new container exited",
                Some(key(4, &news)),
                Some(report(4, 50, &[(&new, Exited, None)])),
                Observed::Failed,
            ),
            (
                "running the new spec since 40: the soak counts from the start",
                Some(key(4, &news)),
                Some(report(4, 50, &[(&new, Running, Some(40))])),
                committed(40, 50),
            ),
            (
                "an older agent reports no start: the report's own time",
                Some(key(4, &news)),
                Some(report(4, 50, &[(&new, Running, None)])),
                committed(50, 50),
            ),
        ];
        for (name, cur, rep, want) in cases {
            assert_eq!(observe(&news, cur.as_ref(), rep.as_ref()), want, "{name}");
        }
        // Two workloads: the later start counts; one still starting keeps the device updating.
        let two = [new.clone(), db.clone()];
        let cur = key(5, &two);
        let both = report(
            5,
            90,
            &[(&new, Running, Some(40)), (&db, Running, Some(70))],
        );
        assert_eq!(observe(&two, Some(&cur), Some(&both)), committed(70, 90));
        let half = report(5, 90, &[(&new, Running, Some(40)), (&db, Starting, None)]);
        assert_eq!(
            observe(&two, Some(&cur), Some(&half)),
            Observed::Updating(None)
        );
        assert_eq!(previous(&news, Some(&cur)), news);
        assert_eq!(
            previous(&news, Some(&key(3, &[old.clone(), db.clone()]))),
            [old]
        );
        assert!(previous(&[new], None).is_empty());
    }

    /// A workload with a health check: updating while its check is `starting` (or not reported), committed from
    /// its start once `healthy`, failed whenever it reports `unhealthy`, during the soak or after; a workload
    /// without a check is as before whatever `health` says.
    #[test]
    fn observe_health_table() {
        use fleet_wire::HealthState::*;
        let checked = fixtures::workload_with_health("web", "http");
        let plain = fixtures::workload("db");
        let two = [checked.clone(), plain.clone()];
        let cur = key(4, &two);
        let with = |h: Option<fleet_wire::HealthState>| {
            let mut r = report(
                4,
                90,
                &[
                    (&checked, WorkloadState::Running, Some(40)),
                    (&plain, WorkloadState::Running, Some(30)),
                ],
            );
            r.workloads[0].health = h;
            r
        };
        let committed = Observed::Committed {
            at: t(40),
            agent_started: None,
            heartbeat: Some(t(90)),
            restarts: None,
        };
        let rows = [
            ("no health reported yet", None, Observed::Updating(None)),
            ("starting", Some(Starting), Observed::Updating(None)),
            (
                "a value from a newer agent",
                Some(Unknown),
                Observed::Updating(None),
            ),
            (
                "healthy: the soak counts from the start",
                Some(Healthy),
                committed,
            ),
            ("unhealthy", Some(Unhealthy), Observed::Unhealthy),
        ];
        for (name, h, want) in rows {
            assert_eq!(observe(&two, Some(&cur), Some(&with(h))), want, "{name}");
        }
        // Health on a workload without a check changes nothing.
        let mut r = with(Some(Healthy));
        r.workloads[1].health = Some(Unhealthy);
        r.workloads[0].health = Some(Healthy);
        let only_plain = [plain.clone()];
        assert!(matches!(
            observe(&only_plain, Some(&key(4, &only_plain)), Some(&r)),
            Observed::Committed { .. }
        ));
    }

    /// An HTTP health check that starts failing after the update: the canary, soaking, reports `unhealthy`; the
    /// rollout halts with it named `(unhealthy)`, proposes no retry (a soak failure, not a failed attempt), and
    /// the others are not given the change. The canary keeps the new spec (its desired-state key is not
    /// rewritten: the halt stops the rest; see docs/crds.md).
    #[test]
    fn an_unhealthy_canary_halts_the_rollout() {
        let new = fixtures::workload_with_health("web", "http");
        let news = [new.clone()];
        let cur = key(4, &news);
        let p = Policy::from_spec(Some(&crate::crd::RolloutSpec {
            soak_seconds: Some(300),
            max_unavailable: Some(
                k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(1),
            ),
            ..Default::default()
        }))
        .expect("policy");
        let mut healthy = report(4, 100, &[(&new, WorkloadState::Running, Some(40))]);
        healthy.workloads[0].health = Some(fleet_wire::HealthState::Healthy);
        let mut sick = healthy.clone();
        sick.at = t(130);
        sick.workloads[0].health = Some(fleet_wire::HealthState::Unhealthy);
        let targets = |canary: Observed| -> Vec<Target> {
            vec![
                Target {
                    id: DeviceId::try_from("a").expect("id"),
                    canary: true,
                    observed: canary,
                    last_heartbeat: Some(t(100)),
                    low_space: None,
                },
                Target {
                    id: DeviceId::try_from("b").expect("id"),
                    canary: false,
                    observed: observe(&news, None, None),
                    last_heartbeat: Some(t(100)),
                    low_space: None,
                },
            ]
        };
        let soaking = plan(
            &targets(observe(&news, Some(&cur), Some(&healthy))),
            &p,
            t(100),
        );
        assert_eq!(soaking.status.phase, RolloutPhase::Soaking);
        assert!(soaking.release.is_empty() && soaking.halt.is_none());
        let halted = plan(
            &targets(observe(&news, Some(&cur), Some(&sick))),
            &p,
            t(130),
        );
        assert_eq!(halted.status.phase, RolloutPhase::Halted);
        assert_eq!(halted.status.failed, 1);
        assert!(halted.release.is_empty(), "the others keep the old spec");
        let halt = halted.halt.expect("halt");
        assert_eq!(halt.devices, ["a (unhealthy)"]);
        assert!(!halt.retryable);
    }

    /// What the shared planner makes of a deployment's observations: a restart restarts the soak, a stale report
    /// during the soak fails the device.
    #[test]
    fn soak_of_workloads() {
        let new = web("nginx:2");
        let news = [new.clone()];
        let cur = key(4, &news);
        let p = Policy::from_spec(Some(&crate::crd::RolloutSpec {
            soak_seconds: Some(60),
            ..Default::default()
        }))
        .expect("policy");
        let seen = |started, at, now| {
            let o = observe(
                &news,
                Some(&cur),
                Some(&report(
                    4,
                    at,
                    &[(&new, WorkloadState::Running, Some(started))],
                )),
            );
            crate::fleet::rollout::standing(o, &p, t(now))
        };
        assert_eq!(seen(10, 50, 50), Standing::Soaking);
        assert_eq!(seen(10, 70, 70), Standing::Healthy, "60 s after its start");
        assert_eq!(
            seen(40, 70, 70),
            Standing::Soaking,
            "restarted at 40: 30 s only"
        );
        assert_eq!(
            seen(10, 50, 50 + 91),
            Standing::Failed(crate::fleet::rollout::Failure::Silent),
            "no report for longer than the heartbeat timeout"
        );
        // three devices, one canary, maxUnavailable 1: the planner releases the canary, then one at a time
        let ids = ["a", "b", "c"];
        let targets = |obs: [Observed; 3]| -> Vec<Target> {
            ids.iter()
                .zip(obs)
                .map(|(id, observed)| Target {
                    id: DeviceId::try_from(*id).expect("id"),
                    canary: *id == "a",
                    observed,
                    last_heartbeat: None,
                    low_space: None,
                })
                .collect()
        };
        let pending = || observe(&news, None, None);
        let running = |started| {
            observe(
                &news,
                Some(&cur),
                Some(&report(
                    4,
                    100,
                    &[(&new, WorkloadState::Running, Some(started))],
                )),
            )
        };
        let p1 = Policy {
            max_unavailable: crate::fleet::rollout::Amount::Count(1),
            ..p
        };
        let first = plan(&targets([pending(), pending(), pending()]), &p1, t(0));
        assert_eq!(first.release, [DeviceId::try_from("a").expect("id")]);
        let soaking = plan(&targets([running(60), pending(), pending()]), &p1, t(100));
        assert!(soaking.release.is_empty());
        assert_eq!(soaking.status.phase, RolloutPhase::Soaking);
        let next = plan(&targets([running(10), pending(), pending()]), &p1, t(100));
        assert_eq!(next.release, [DeviceId::try_from("b").expect("id")]);
        assert_eq!((next.status.healthy, next.status.pending), (1, 2));
    }

    #[test]
    fn halts_hold_until_a_retry() {
        let status = |generation, phase, retry: Option<&str>| PlacementStatus {
            observed_generation: Some(generation),
            rollout: Some(RolloutStatus {
                phase,
                retry: retry.map(str::to_owned),
                ..Default::default()
            }),
            ..Default::default()
        };
        let halted = status(2, RolloutPhase::Halted, None);
        assert!(halt_holds(Some(&halted), Some(2), None));
        assert!(!halt_holds(Some(&halted), Some(3), None), "a new spec");
        assert!(!halt_holds(Some(&halted), Some(2), Some("1")), "a retry");
        assert!(!halt_holds(
            Some(&status(2, RolloutPhase::Soaking, None)),
            Some(2),
            None
        ));
        assert!(!halt_holds(None, Some(2), None));
        let retried = status(2, RolloutPhase::Halted, Some("1"));
        assert!(halt_holds(Some(&retried), Some(2), Some("1")));
        assert!(retry_requested(Some(&halted), Some("1")));
        assert!(
            !retry_requested(Some(&retried), Some("1")),
            "already handled"
        );
        assert!(retry_requested(Some(&retried), Some("2")));
        assert!(!retry_requested(Some(&halted), None));
        assert_eq!(token(Some(&String::new())), None);
    }
}
