//! Workload health checks, the pure part: which running containers the agent checks itself and how, when each
//! check is due, and what a check's result does to a container's health. The thread that runs the checks is
//! [`crate::health_worker`], the HTTP and TCP probes themselves [`crate::health_probe`].
//!
//! Who runs which check: a `command` check is Podman's native healthcheck (created with the container,
//! `podman ps` shows it, Podman's systemd timer runs it); an `http` or `tcp` probe is run by the agent against the
//! host port that publishes the container port. Where Podman's timer does not run a command check (Podman
//! without a systemd connection), the agent runs Podman's check through the API on the same schedule, and Podman
//! still keeps the state: it looks at the container's health log twice, one [`timer_window`] apart, and a log
//! with no new run in between ([`podman_runs_it`]) means no timer runs it. Two looks, not one, because runs the
//! agent itself made before it restarted are in that log too.
//!
//! The rules are Podman's: the first check one interval after the container's start; a pass is `healthy` and
//! clears the failures; a failure within the start period does not count; after it, the `retries`-th
//! consecutive failure is `unhealthy`, and fewer keep the state as it was (`starting` until a first pass).

use crate::podman::Observed;
use fleet_wire::workload::{LABEL_SPEC_DIGEST, LABEL_WORKLOAD};
use fleet_wire::{
    HealthCheck, HealthProbe, HealthState, Protocol, Timestamp, WorkloadName, WorkloadSpec,
};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// Checks due within this much after the earliest one run in the same wake-up: at most one wake-up a second
/// for health checks, whatever their number.
pub const BATCH_SLACK: Duration = Duration::from_secs(1);

/// Seconds on top of a command check's interval and timeout that the agent waits between its two looks at the
/// container's health log ([`timer_window`]).
pub const TIMER_SLACK_SECS: i64 = 10;

/// How the agent checks one container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum How {
    /// `GET path` on `127.0.0.1:host_port`.
    Http {
        /// The published host port.
        host_port: u16,
        /// The request path.
        path: String,
    },
    /// A TCP connection to `127.0.0.1:host_port`.
    Tcp {
        /// The published host port.
        host_port: u16,
    },
    /// Podman's own healthcheck of the container, run through the API (Podman's timer does not run it).
    Podman,
}

/// One running container whose health the agent checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The workload.
    pub name: WorkloadName,
    /// The container id.
    pub container: String,
    /// When the container started (Podman's `StartedAt`, Unix seconds): a restart is a new target.
    pub started_at: i64,
    /// How.
    pub how: How,
    /// The check's timing.
    pub check: HealthCheck,
}

/// What the agent knows of one container's health beyond Podman's list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probed {
    /// The health of a check the agent runs (HTTP, TCP); `None` where Podman keeps the state (a command check).
    pub state: Option<HealthState>,
    /// Why it is unhealthy: the latest failed check, in words (only while unhealthy).
    pub error: Option<String>,
}

/// Per container id.
pub type Findings = BTreeMap<String, Probed>;

/// The containers of `desired` the agent checks itself, from `observed` (containers of the desired spec that
/// run): every HTTP and TCP probe (against the host port that publishes the probed container port), and the
/// command checks of the containers in `driven` (Podman's timer does not run them). Pure.
pub fn targets(
    desired: &[WorkloadSpec],
    observed: &[Observed],
    driven: &BTreeSet<String>,
) -> Vec<Target> {
    let mut out = Vec::new();
    for w in desired {
        let Some(check) = &w.health_check else {
            continue;
        };
        let Some(o) = running_of(w, observed) else {
            continue;
        };
        let host_port = |port: u16| {
            w.ports
                .iter()
                .find(|p| p.container_port == port && p.protocol == Protocol::Tcp)
                .map(|p| p.host_port)
        };
        let how = match &check.probe {
            HealthProbe::Command(_) if driven.contains(&o.id) => Some(How::Podman),
            HealthProbe::Command(_) => None,
            // The spec's validation makes sure the port is published; a spec without it is skipped, not guessed.
            HealthProbe::Http(h) => host_port(h.port).map(|host_port| How::Http {
                host_port,
                path: h.path.clone(),
            }),
            HealthProbe::Tcp(t) => host_port(t.port).map(|host_port| How::Tcp { host_port }),
        };
        if let Some(how) = how {
            out.push(Target {
                name: w.name.clone(),
                container: o.id.clone(),
                started_at: o.started_at,
                how,
                check: check.clone(),
            });
        }
    }
    out
}

/// The running container of `w`'s desired spec, if one is listed.
pub fn running_of<'a>(w: &WorkloadSpec, observed: &'a [Observed]) -> Option<&'a Observed> {
    let digest = w.digest();
    observed.iter().find(|o| {
        o.state == "running"
            && o.labels.get(LABEL_WORKLOAD).map(String::as_str) == Some(w.name.as_str())
            && o.labels.get(LABEL_SPEC_DIGEST).map(String::as_str) == Some(digest.as_str())
    })
}

/// Seconds between the agent's two looks at a command-checked container's health log: Podman's timer runs the
/// check every interval (the first one interval after the start), so a timer that runs leaves a new run within one
/// interval, one timeout and [`TIMER_SLACK_SECS`].
pub fn timer_window(check: &HealthCheck) -> i64 {
    i64::from(check.interval_seconds) + i64::from(check.timeout_seconds) + TIMER_SLACK_SECS
}

/// True when Podman's timer runs the check: the health log's latest run (its start time as Podman wrote it) at the
/// second look, `latest`, is not the one of the first look, `first`. Pure.
pub fn podman_runs_it(first: Option<&str>, latest: Option<&str>) -> bool {
    latest.is_some() && latest != first
}

/// Where one checked container stands (Podman's rules, see the module's text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tracker {
    /// Its health.
    pub state: HealthState,
    /// Consecutive failures counted (outside the start period).
    pub failures: u32,
    /// The latest counted failure, in words.
    pub error: Option<String>,
}

impl Tracker {
    /// A container no check decided yet.
    pub const NEW: Tracker = Tracker {
        state: HealthState::Starting,
        failures: 0,
        error: None,
    };

    /// After one check's `result`: a pass is healthy and clears the failures; a failure `in_start_period` changes
    /// nothing; another counts, and the `retries`-th in a row is unhealthy. Pure.
    pub fn after(
        &self,
        result: Result<(), String>,
        in_start_period: bool,
        retries: u32,
    ) -> Tracker {
        match result {
            Ok(()) => Tracker {
                state: HealthState::Healthy,
                failures: 0,
                error: None,
            },
            Err(_) if in_start_period => self.clone(),
            Err(why) => {
                let failures = self.failures.saturating_add(1);
                Tracker {
                    state: if failures >= retries {
                        HealthState::Unhealthy
                    } else {
                        self.state
                    },
                    failures,
                    error: Some(why),
                }
            }
        }
    }
}

#[derive(Debug)]
struct Entry {
    target: Target,
    next: Instant,
    tracker: Tracker,
}

/// The checks the agent runs and when each is due. Pure: the caller passes the clocks (`Instant` for the
/// schedule, the wall clock for the start period, which Podman's `StartedAt` gives in Unix seconds).
#[derive(Debug, Default)]
pub struct Schedule {
    entries: BTreeMap<String, Entry>,
}

impl Schedule {
    /// Replaces the targets. A container already scheduled with the same start keeps its state and its next
    /// check; a new one (or a restarted one) is `starting` with its first check on its interval's grid, one to two
    /// intervals after its start ([`first_check`]; now, if that is past: an agent that restarted checks at once).
    pub fn set(&mut self, targets: Vec<Target>, now: Instant, wall: Timestamp) {
        let mut old = std::mem::take(&mut self.entries);
        for t in targets {
            let entry = match old.remove(&t.container) {
                Some(e) if e.target.started_at == t.started_at && e.target.check == t.check => {
                    Entry { target: t, ..e }
                }
                _ => Entry {
                    next: now + first_check(&t, wall),
                    tracker: Tracker::NEW,
                    target: t,
                },
            };
            self.entries.insert(entry.target.container.clone(), entry);
        }
    }

    /// When the earliest check is due; `None` with nothing to check.
    pub fn next_due(&self) -> Option<Instant> {
        self.entries.values().map(|e| e.next).min()
    }

    /// The checks due by `now` plus [`BATCH_SLACK`], each moved on by its interval (from `now` if it fell
    /// behind), in container order.
    pub fn due(&mut self, now: Instant) -> Vec<Target> {
        let mut out = Vec::new();
        for e in self.entries.values_mut() {
            if e.next <= now + BATCH_SLACK {
                let next = e.next + e.target.check.interval();
                e.next = if next <= now {
                    now + e.target.check.interval()
                } else {
                    next
                };
                out.push(e.target.clone());
            }
        }
        out
    }

    /// Records a check's result for `container` at `wall`; true when what [`Self::findings`] says for it changed
    /// (for a check Podman keeps the state of, when the state by Podman's rules changed: the status is then read
    /// and published again).
    pub fn record(&mut self, container: &str, result: Result<(), String>, wall: Timestamp) -> bool {
        let Some(e) = self.entries.get_mut(container) else {
            return false;
        };
        let up = unix_secs(wall).saturating_sub(e.target.started_at);
        let in_start = up < i64::from(e.target.check.start_period_seconds);
        let next = e.tracker.after(result, in_start, e.target.check.retries);
        let changed = next.state != e.tracker.state
            || (next.state == HealthState::Unhealthy && next.error != e.tracker.error);
        e.tracker = next;
        changed
    }

    /// What the agent reports for each checked container.
    pub fn findings(&self) -> Findings {
        self.entries
            .iter()
            .map(|(id, e)| {
                let podman = e.target.how == How::Podman;
                let unhealthy = e.tracker.state == HealthState::Unhealthy;
                (
                    id.clone(),
                    Probed {
                        state: (!podman).then_some(e.tracker.state),
                        error: e.tracker.error.clone().filter(|_| unhealthy && !podman),
                    },
                )
            })
            .collect()
    }

    /// Number of containers checked.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True with nothing to check.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// How long from `wall` until the first check of `t`: at the first whole multiple of its interval (in Unix
/// seconds) at least one interval after the container's start, so that checks of one interval fall on one grid
/// and run in one wake-up, whatever their containers' start times (Podman's own timer starts one interval after
/// the start: this is that, or up to one interval later). Zero when that is past (an agent that restarted checks at
/// once).
fn first_check(t: &Target, wall: Timestamp) -> Duration {
    let interval = u64::from(t.check.interval_seconds.max(1));
    let earliest = u64::try_from(t.started_at).unwrap_or(0) + interval;
    let aligned_ms = earliest.div_ceil(interval) * interval * 1000;
    Duration::from_millis(aligned_ms.saturating_sub(wall.unix_ms()))
}

fn unix_secs(t: Timestamp) -> i64 {
    i64::try_from(t.unix_ms() / 1000).unwrap_or(i64::MAX)
}

/// The health a status reports for `w`, whose running container of the desired spec is `o`: Podman's for a
/// command check, the agent's (in `findings`) for an HTTP or TCP probe; `starting` until a check decided; and
/// the error that goes with `unhealthy` (the agent's failed probe, or Podman's failed check as the caller found
/// it in `findings`). `None` without a health check. Pure.
pub fn reported(
    w: &WorkloadSpec,
    o: &Observed,
    findings: &Findings,
) -> Option<(HealthState, Option<String>)> {
    let check = w.health_check.as_ref()?;
    let found = findings.get(&o.id);
    let state = if check.runs_in_podman() {
        o.health
    } else {
        found.and_then(|f| f.state)
    }
    .unwrap_or(HealthState::Starting);
    let error = found
        .and_then(|f| f.error.clone())
        .filter(|_| state == HealthState::Unhealthy);
    Some((state, error))
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_wire::fixtures;
    use fleet_wire::workload::{LABEL_DEVICE, LABEL_MANAGED};

    const START: i64 = 1_800_000_000;

    fn wall(secs_after_start: i64) -> Timestamp {
        Timestamp::from_unix_ms(u64::try_from(START + secs_after_start).expect("t") * 1000)
    }

    fn running(w: &WorkloadSpec, id: &str) -> Observed {
        Observed {
            id: id.into(),
            name: w.name.container_name(),
            labels: BTreeMap::from([
                (LABEL_MANAGED.to_string(), "true".to_string()),
                (LABEL_WORKLOAD.to_string(), w.name.as_str().to_string()),
                (LABEL_DEVICE.to_string(), fixtures::DEVICE.to_string()),
                (LABEL_SPEC_DIGEST.to_string(), w.digest().to_string()),
            ]),
            state: "running".into(),
            started_at: START,
            restarts: 0,
            exit_code: 0,
            exited: false,
            created: START,
            restarts_unknown: false,
            health: None,
            oom_killed: false,
        }
    }

    /// Podman's rules, row by row: (state before, failures before, result, in the start period, retries) → (state,
    /// failures).
    #[test]
    fn tracker_table() {
        use HealthState::*;
        let rows: [(HealthState, u32, bool, bool, u32, HealthState, u32); 9] = [
            (Starting, 0, true, false, 3, Healthy, 0),
            (Starting, 0, true, true, 3, Healthy, 0),
            (Starting, 0, false, true, 3, Starting, 0),
            (Starting, 0, false, false, 3, Starting, 1),
            (Starting, 2, false, false, 3, Unhealthy, 3),
            (Healthy, 0, false, false, 3, Healthy, 1),
            (Healthy, 2, false, false, 3, Unhealthy, 3),
            (Healthy, 0, false, false, 1, Unhealthy, 1),
            (Unhealthy, 5, true, false, 3, Healthy, 0),
        ];
        for (i, (state, failures, pass, start, retries, want, want_failures)) in
            rows.into_iter().enumerate()
        {
            let t = Tracker {
                state,
                failures,
                error: None,
            };
            let r = if pass { Ok(()) } else { Err("no".to_string()) };
            let n = t.after(r, start, retries);
            assert_eq!((n.state, n.failures), (want, want_failures), "row {i}");
            assert_eq!(n.error.is_some(), !pass && !start, "row {i}");
        }
    }

    #[test]
    fn targets_take_the_published_host_port_and_only_driven_command_checks() {
        let mut http = fixtures::workload_with_health("web", "http");
        http.ports[0].host_port = 18080;
        let tcp = fixtures::workload_with_health("db", "tcp");
        let cmd = fixtures::workload_with_health("job", "command");
        let plain = fixtures::workload("plain");
        let desired = [http.clone(), tcp.clone(), cmd.clone(), plain.clone()];
        let mut observed = vec![
            running(&http, "c-web"),
            running(&tcp, "c-db"),
            running(&cmd, "c-job"),
            running(&plain, "c-plain"),
        ];
        let t = targets(&desired, &observed, &BTreeSet::new());
        let hows: Vec<(&str, &How)> = t.iter().map(|t| (t.container.as_str(), &t.how)).collect();
        assert_eq!(
            hows,
            [
                (
                    "c-web",
                    &How::Http {
                        host_port: 18080,
                        path: "/healthz".into()
                    }
                ),
                ("c-db", &How::Tcp { host_port: 8080 }),
            ]
        );
        let driven = BTreeSet::from(["c-job".to_string()]);
        let t = targets(&desired, &observed, &driven);
        assert_eq!(t.last().map(|t| &t.how), Some(&How::Podman));
        // Not running, or of another spec: nothing to check.
        observed[0].state = "exited".into();
        observed[1]
            .labels
            .insert(LABEL_SPEC_DIGEST.into(), "0".repeat(64));
        assert!(targets(&desired, &observed, &BTreeSet::new()).is_empty());
    }

    #[test]
    fn podmans_timer_is_judged_by_a_new_run_between_two_looks() {
        let cmd = fixtures::workload_with_health("job", "command");
        // interval 10, timeout 2, slack 10
        assert_eq!(timer_window(cmd.health_check.as_ref().expect("check")), 22);
        let (a, b) = ("2026-12-07T00:57:25.9Z", "2026-12-07T00:57:35.9Z");
        assert!(podman_runs_it(None, Some(a)), "a first run");
        assert!(podman_runs_it(Some(a), Some(b)), "a new run");
        assert!(!podman_runs_it(None, None), "never ran");
        assert!(
            !podman_runs_it(Some(a), Some(a)),
            "only runs made before (by an agent before its restart)"
        );
    }

    /// Due times: the first check one interval after the start (at once for a container that has been up
    /// longer), then every interval; checks due within the batch slack run together; the start period, retries
    /// and a restart (a new start) as Podman has them.
    #[test]
    fn schedule_runs_checks_on_time_and_follows_podmans_rules() {
        let mut http = fixtures::workload_with_health("web", "http");
        http.health_check
            .as_mut()
            .expect("check")
            .start_period_seconds = 15;
        let tcp = fixtures::workload_with_health("db", "tcp");
        let desired = [http.clone(), tcp.clone()];
        let web = running(&http, "c-web");
        let mut db = running(&tcp, "c-db");
        db.started_at = START - 100; // up long before the agent looked
        let t0 = Instant::now();
        let mut s = Schedule::default();
        s.set(
            targets(&desired, &[web.clone(), db.clone()], &BTreeSet::new()),
            t0,
            wall(0),
        );
        assert_eq!(s.len(), 2);
        // db at once, web 10 s after its start.
        assert_eq!(s.next_due(), Some(t0));
        let names =
            |v: Vec<Target>| -> Vec<String> { v.into_iter().map(|t| t.container).collect() };
        assert_eq!(names(s.due(t0)), ["c-db"]);
        assert_eq!(s.next_due(), Some(t0 + Duration::from_secs(10)));
        // 10.5 s: both are due within the slack (db at 10, web at 10).
        assert_eq!(
            names(s.due(t0 + Duration::from_millis(9_500))),
            ["c-db", "c-web"]
        );
        // web fails at 10 s: within its 15-s start period, nothing counts.
        assert!(!s.record("c-web", Err("refused".into()), wall(10)));
        assert_eq!(s.findings()["c-web"].state, Some(HealthState::Starting));
        // Three counted failures after it: unhealthy, with the error.
        assert!(!s.record("c-web", Err("refused".into()), wall(20)));
        assert!(!s.record("c-web", Err("refused".into()), wall(30)));
        assert!(s.record("c-web", Err("HTTP 503".into()), wall(40)));
        let f = &s.findings()["c-web"];
        assert_eq!(
            (f.state, f.error.as_deref()),
            (Some(HealthState::Unhealthy), Some("HTTP 503"))
        );
        // A new failure text is a change (the error is published); the same is not.
        assert!(s.record("c-web", Err("HTTP 500".into()), wall(50)));
        assert!(!s.record("c-web", Err("HTTP 500".into()), wall(60)));
        assert!(s.record("c-web", Ok(()), wall(70)));
        assert_eq!(s.findings()["c-web"].error, None);
        // Setting the same targets keeps the state; a restart (a new start) begins again.
        let now = t0 + Duration::from_secs(70);
        s.set(
            targets(&desired, &[web.clone(), db.clone()], &BTreeSet::new()),
            now,
            wall(70),
        );
        assert_eq!(s.findings()["c-web"].state, Some(HealthState::Healthy));
        let mut restarted = web.clone();
        restarted.started_at = START + 65;
        s.set(
            targets(&desired, &[restarted, db], &BTreeSet::new()),
            now,
            wall(70),
        );
        assert_eq!(s.findings()["c-web"].state, Some(HealthState::Starting));
        // A container that is gone is forgotten.
        s.set(vec![], now, wall(70));
        assert!(s.is_empty() && s.next_due().is_none());
    }

    /// Containers started at different moments with one interval are checked in one wake-up: the first check of
    /// each falls on the interval's grid of Unix seconds, one to two intervals after its start.
    #[test]
    fn checks_of_one_interval_share_a_grid() {
        let a = fixtures::workload_with_health("web", "http"); // interval 10
        let mut b = fixtures::workload_with_health("db", "tcp");
        b.ports[0].host_port = 9090;
        let mut oa = running(&a, "c-a");
        let mut ob = running(&b, "c-b");
        oa.started_at = START + 3;
        ob.started_at = START + 8;
        let t0 = Instant::now();
        let mut s = Schedule::default();
        s.set(targets(&[a, b], &[oa, ob], &BTreeSet::new()), t0, wall(9));
        // Both at Unix second START + 20: 11 s from now; one wake-up runs both.
        assert_eq!(s.next_due(), Some(t0 + Duration::from_secs(11)));
        assert_eq!(s.due(t0 + Duration::from_secs(11)).len(), 2);
        assert_eq!(s.next_due(), Some(t0 + Duration::from_secs(21)));
    }

    /// A check Podman keeps the state of: the schedule mirrors Podman's rules only to know when to publish;
    /// what it reports leaves the state to Podman's list.
    #[test]
    fn a_driven_podman_check_leaves_the_state_to_podman() {
        let cmd = fixtures::workload_with_health("job", "command");
        let o = running(&cmd, "c-job");
        let mut s = Schedule::default();
        let driven = BTreeSet::from(["c-job".to_string()]);
        s.set(
            targets(
                std::slice::from_ref(&cmd),
                std::slice::from_ref(&o),
                &driven,
            ),
            Instant::now(),
            wall(0),
        );
        for at in [20, 30] {
            assert!(!s.record("c-job", Err("exit 1".into()), wall(at)));
        }
        assert!(
            s.record("c-job", Err("exit 1".into()), wall(40)),
            "unhealthy now"
        );
        assert_eq!(
            s.findings()["c-job"],
            Probed {
                state: None,
                error: None
            }
        );
    }

    #[test]
    fn reported_health() {
        let http = fixtures::workload_with_health("web", "http");
        let cmd = fixtures::workload_with_health("job", "command");
        let plain = fixtures::workload("plain");
        let mut o = running(&http, "c");
        assert_eq!(reported(&plain, &o, &Findings::new()), None);
        assert_eq!(
            reported(&http, &o, &Findings::new()),
            Some((HealthState::Starting, None)),
            "no check decided yet"
        );
        let mut f = Findings::from([(
            "c".to_string(),
            Probed {
                state: Some(HealthState::Unhealthy),
                error: Some("HTTP 503".into()),
            },
        )]);
        assert_eq!(
            reported(&http, &o, &f),
            Some((HealthState::Unhealthy, Some("HTTP 503".into())))
        );
        // A command check: Podman's state, with the error the agent read from Podman's log.
        o.health = Some(HealthState::Unhealthy);
        f.insert(
            "c".into(),
            Probed {
                state: None,
                error: Some("the check command failed".into()),
            },
        );
        assert_eq!(
            reported(&cmd, &o, &f),
            Some((
                HealthState::Unhealthy,
                Some("the check command failed".into())
            ))
        );
        o.health = Some(HealthState::Healthy);
        assert_eq!(reported(&cmd, &o, &f), Some((HealthState::Healthy, None)));
    }
}
