//! Alerts: a pure evaluation of what the dashboard knows (Devices, TaskRuns, the FleetLock server's status) into a
//! list of alerts, each with a title, its subject, since when and what to do. The same list is shown on the
//! dashboard, exported as `fleet_alerts` metrics and published as Kubernetes Warning events when an alert appears.

use fleet_wire::fleetlock::ServerStatus;
use fleet_wire::text::for_log;
use fleet_wire::{
    AgentUpgradeStatus, TaskRunPhase, TaskRunReason, TaskRunStatus, Timestamp, UpgradePhase,
};
use std::time::Duration;

/// The kinds of alert.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AlertKind {
    /// A device's agent upgrade ended in `rollback-failed`: the device is quarantined.
    RollbackFailed,
    /// A device has sent no heartbeat for longer than the configured time.
    DeviceSilent,
    /// A device's agent upgrade has stayed in one phase longer than that phase's bound allows, or it has not
    /// accepted a running TaskRun's intent within the accept timeout.
    DeviceStalled,
    /// A device's agent keeps restarting (fleet-wire's crash-loop rule on `status.agentRestarts`).
    AgentCrashLooping,
    /// A workload's container keeps restarting on a device (reported `crash-looping` by the agent).
    WorkloadCrashLooping,
    /// A workload's health check keeps failing on a device (reported `unhealthy` by the agent).
    WorkloadUnhealthy,
    /// fleet-auth refused writes of a device recently (over its share, too large, not its key): a broken or
    /// compromised device.
    WritesRefused,
    /// A filesystem of a device is at or above 90 % used (its Device's `status.usage.diskFull`).
    DiskFull,
    /// A device's memory is under pressure (its Device's `status.usage.memoryPressure`).
    MemoryPressure,
    /// A TaskRun failed because a canary failed (the rest were never released).
    CanaryFailed,
    /// A TaskRun failed for another reason.
    RunFailed,
    /// A FleetLock slot has been held for longer than the configured time.
    SlotHeldTooLong,
    /// The FleetLock server's config file on disk is invalid (it runs on its last good config).
    FleetLockConfigInvalid,
}

impl AlertKind {
    /// Every kind, in display order.
    pub const ALL: [AlertKind; 13] = [
        Self::RollbackFailed,
        Self::DeviceSilent,
        Self::DeviceStalled,
        Self::AgentCrashLooping,
        Self::WorkloadCrashLooping,
        Self::WorkloadUnhealthy,
        Self::WritesRefused,
        Self::DiskFull,
        Self::MemoryPressure,
        Self::CanaryFailed,
        Self::RunFailed,
        Self::SlotHeldTooLong,
        Self::FleetLockConfigInvalid,
    ];

    /// Whether the alert is published as an Event when it appears: not for refused writes, whose Device already
    /// gets a rate-limited `WritesRefused` event from the operator (`crate::refusals`).
    pub fn publishes_event(self) -> bool {
        self != Self::WritesRefused
    }

    /// The metric label and the Event reason.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RollbackFailed => "DeviceRollbackFailed",
            Self::DeviceSilent => "DeviceSilent",
            Self::DeviceStalled => "DeviceStalled",
            Self::AgentCrashLooping => "AgentCrashLooping",
            Self::WorkloadCrashLooping => "WorkloadCrashLooping",
            Self::WorkloadUnhealthy => "WorkloadUnhealthy",
            Self::WritesRefused => "DeviceWritesRefused",
            Self::DiskFull => "DeviceDiskFull",
            Self::MemoryPressure => "DeviceMemoryPressure",
            Self::CanaryFailed => "TaskRunCanaryFailed",
            Self::RunFailed => "TaskRunFailed",
            Self::SlotHeldTooLong => "FleetLockSlotHeldTooLong",
            Self::FleetLockConfigInvalid => "FleetLockConfigInvalid",
        }
    }

    /// The title a person reads.
    pub fn title(self) -> &'static str {
        match self {
            Self::RollbackFailed => "Agent rollback failed: device quarantined",
            Self::DeviceSilent => "Device silent",
            Self::DeviceStalled => "Device stalled",
            Self::AgentCrashLooping => "Agent crash-looping",
            Self::WorkloadCrashLooping => "Workload crash-looping",
            Self::WorkloadUnhealthy => "Workload unhealthy",
            Self::WritesRefused => "Device writes refused",
            Self::DiskFull => "Device disk full",
            Self::MemoryPressure => "Device memory pressure",
            Self::CanaryFailed => "Task run stopped: a canary failed",
            Self::RunFailed => "Task run failed",
            Self::SlotHeldTooLong => "FleetLock slot held too long",
            Self::FleetLockConfigInvalid => "FleetLock config invalid",
        }
    }

    /// What to do about it.
    pub fn action(self) -> &'static str {
        match self {
            Self::RollbackFailed => {
                "The updater refuses new upgrades until root repairs the device: read `journalctl -u \
                 fleet-updater` on it, then follow the root repair of docs/device-setup.md; its last step \
                 is `fleet-device-setup --repair-rollback-failed`."
            }
            Self::DeviceSilent => {
                "Check power and network, then `systemctl status fleet-agent` on the device; its NATS \
                 credentials may have expired (docs/auth.md)."
            }
            Self::DeviceStalled => {
                "The updater bounds every phase and answers a new intent at once, so a stall means the \
                 updater or the agent is stopped or cannot report: run `systemctl status fleet-updater \
                 fleet-agent` and `journalctl -u fleet-updater` on the device (docs/updater.md)."
            }
            Self::AgentCrashLooping => {
                "systemd keeps restarting the agent: read `journalctl -u fleet-agent` on the device for why \
                 it exits; after an upgrade, the release's rollout halts on it (docs/crds.md)."
            }
            Self::WorkloadCrashLooping => {
                "Podman keeps restarting the container: read `podman logs` of it on the device (the device page \
                 shows its restarts and last exit code), then fix the image or the FleetDeployment's spec."
            }
            Self::WorkloadUnhealthy => {
                "Its health check keeps failing while the container runs: the detail says how (the answer of an \
                 HTTP check, Podman's output of a command check); `podman healthcheck run` or `podman logs` of it on \
                 the device, then fix the image or the FleetDeployment's spec (docs/crds.md, Workload health checks)."
            }
            Self::WritesRefused => {
                "The agent never writes this much or outside its own keys: read `journalctl -u fleet-agent` \
                 on the device and `kubectl describe device <name>` (its WritesRefused events); a device that \
                 keeps flooding may be compromised: revoke its token (docs/auth.md)."
            }
            Self::DiskFull => {
                "Free space on the device: `podman image prune -a` as the agent's user removes images no \
                 workload uses, `journalctl --vacuum-size=100M` trims the journal; `df -h` shows what is full. \
                 Below 256 MiB free on its containers or agent-state filesystem a staged rollout gives it no \
                 change (docs/crds.md, Device: resources)."
            }
            Self::MemoryPressure => {
                "Tasks on the device wait for memory: `systemctl status` and `podman stats` on it show what \
                 uses it; lower a workload's memory limit or move workloads off the device (docs/crds.md, \
                 Device: resources)."
            }
            Self::CanaryFailed => {
                "Open the run's page for the canary's error and apt output; fix the cause and create a new \
                 TaskRun (runs are immutable)."
            }
            Self::RunFailed => {
                "Open the run's page for the failing devices and their errors; create a new TaskRun for \
                 them once fixed."
            }
            Self::SlotHeldTooLong => {
                "The holder did not come back healthy after its reboot: check it; if it is gone, free the \
                 slot with POST /v1/admin/release (docs/fleetlock.md)."
            }
            Self::FleetLockConfigInvalid => {
                "Fix the config file (the server names the error) — it keeps running on its last good \
                 config until then."
            }
        }
    }
}

/// What an alert is about.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Subject {
    /// A Device (its name).
    Device(String),
    /// One workload on a Device.
    Workload {
        /// The device (its name).
        device: String,
        /// The workload's name.
        workload: String,
    },
    /// A TaskRun.
    Run {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// One holder of a FleetLock group.
    Holder {
        /// The group.
        group: String,
        /// The holder's id.
        id: String,
    },
    /// The FleetLock server itself.
    FleetLock,
}

impl std::fmt::Display for Subject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Device(d) => write!(f, "device {d}"),
            Self::Workload { device, workload } => {
                write!(f, "workload {workload} on device {device}")
            }
            Self::Run { namespace, name } => write!(f, "task run {namespace}/{name}"),
            Self::Holder { group, id } => write!(f, "{id} in FleetLock group {group}"),
            Self::FleetLock => f.write_str("the FleetLock server"),
        }
    }
}

/// One alert.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alert {
    /// What kind.
    pub kind: AlertKind,
    /// About what.
    pub subject: Subject,
    /// Since when the condition holds, when known.
    pub since: Option<Timestamp>,
    /// The specifics (an error, a duration).
    pub detail: String,
}

impl Alert {
    /// Identity across evaluations: an alert with the same key is the same alert (one event, not one per pass).
    pub fn key(&self) -> (AlertKind, Subject) {
        (self.kind, self.subject.clone())
    }
}

/// When conditions become alerts.
#[derive(Debug, Clone, Copy)]
pub struct Thresholds {
    /// A device without a heartbeat for longer is silent.
    pub silent_after: Duration,
    /// A FleetLock slot held for longer alerts.
    pub slot_held_after: Duration,
    /// A failed run alerts for this long after it ended (then it is history).
    pub failed_run_for: Duration,
    /// Refused writes alert for this long after the latest was reported.
    pub refused_for: Duration,
}

impl Default for Thresholds {
    fn default() -> Self {
        Self {
            silent_after: Duration::from_secs(15 * 60),
            slot_held_after: Duration::from_secs(60 * 60),
            failed_run_for: Duration::from_secs(24 * 3600),
            refused_for: Duration::from_secs(3600),
        }
    }
}

/// One device as the alerts see it.
pub struct DeviceFacts<'a> {
    /// Its name (the device id).
    pub name: &'a str,
    /// The mirrored agent-upgrade status.
    pub upgrade: Option<&'a AgentUpgradeStatus>,
    /// What the operator knows of its heartbeats, judged by [`crate::liveness::judge`] (never heard from, or
    /// not judged yet: no silence alert).
    pub heartbeat: crate::liveness::Facts,
    /// Since when the device was silent by the last evaluation's `DeviceSilent` alert, if it had one: kept as it
    /// is while liveness is not judged (a watch of the heartbeats being opened anew), so that the alert neither
    /// goes nor comes back as a second event.
    pub silent_before: Option<Timestamp>,
    /// Its refused writes as the Device shows them, with the latest report's time.
    pub writes_refused: Option<(&'a crate::crd::WritesRefused, Timestamp)>,
    /// Its `status.stalled` (only a TaskRun's stall is read from it: an agent upgrade's is judged from
    /// `upgrade` at the evaluation's own time).
    pub stalled: Option<&'a crate::crd::Stalled>,
    /// Its `status.agentRestarts` (crash-looping judged at the evaluation's own time).
    pub agent_restarts: Option<&'a crate::crd::AgentRestarts>,
    /// Its workloads reported `crash-looping` (from the workload-status mirror), with their restarts.
    pub looping_workloads: Vec<(String, Option<fleet_wire::Restarts>)>,
    /// Its workloads reported running but `unhealthy` (from the workload-status mirror), with their error.
    pub unhealthy_workloads: Vec<(String, String)>,
    /// Its `status.usage` (disk and memory verdicts, decided by the operator from its `device-usage`).
    pub usage: Option<&'a crate::crd::UsageStatus>,
}

/// `restarted N times, last exit code C`.
pub fn restarts_text(r: Option<&fleet_wire::Restarts>) -> String {
    match r {
        None => "restarted, count not reported".into(),
        Some(r) => format!(
            "restarted {} times{}",
            r.count,
            r.last_exit_code
                .map(|c| format!(", last exit code {c}"))
                .unwrap_or_default()
        ),
    }
}

/// One TaskRun as the alerts see it.
pub struct RunFacts<'a> {
    /// Namespace.
    pub namespace: &'a str,
    /// Name.
    pub name: &'a str,
    /// Its status.
    pub status: &'a TaskRunStatus,
}

/// Every alert that holds at `now`, ordered by kind and subject.
pub fn evaluate<'a>(
    devices: impl IntoIterator<Item = DeviceFacts<'a>>,
    runs: impl IntoIterator<Item = RunFacts<'a>>,
    fleetlock: Option<&ServerStatus>,
    t: &Thresholds,
    now: Timestamp,
) -> Vec<Alert> {
    let mut out = Vec::new();
    for d in devices {
        if let Some(u) = d
            .upgrade
            .filter(|u| u.phase == UpgradePhase::RollbackFailed)
        {
            out.push(Alert {
                kind: AlertKind::RollbackFailed,
                subject: Subject::Device(d.name.to_owned()),
                since: Some(u.phase_changed_at),
                // The device's own words: logged and put in an Event, so shown escaped (a newline as `\n`).
                detail: match (&u.target_version, &u.error) {
                    (Some(v), Some(e)) => format!("upgrade to {v}: {}", for_log(e.as_str())),
                    (None, Some(e)) => for_log(e.as_str()),
                    (Some(v), None) => format!("upgrade to {v}"),
                    (None, None) => String::new(),
                },
            });
        }
        if let Some(u) = d
            .upgrade
            .filter(|u| crate::fleet::rollout::is_stalled(u.phase, u.phase_changed_at, now))
        {
            let phase = crate::fleet::rollout::phase_word(u.phase);
            let bound = crate::fleet::rollout::phase_bound(u.phase).unwrap_or_default();
            out.push(Alert {
                kind: AlertKind::DeviceStalled,
                subject: Subject::Device(d.name.to_owned()),
                since: Some(u.phase_changed_at),
                detail: match &u.target_version {
                    Some(v) => format!(
                        "upgrade to {v} in phase {phase} for longer than its bound of {}",
                        super::html::age(bound)
                    ),
                    None => format!(
                        "in phase {phase} for longer than its bound of {}",
                        super::html::age(bound)
                    ),
                },
            });
        } else if let Some((s, run)) = d.stalled.and_then(|s| Some((s, s.task_run.as_deref()?))) {
            out.push(Alert {
                kind: AlertKind::DeviceStalled,
                subject: Subject::Device(d.name.to_owned()),
                since: super::html::parse_time(&s.since),
                detail: format!(
                    "has not accepted the system-upgrade intent of TaskRun {run} (written {})",
                    s.since
                ),
            });
        }
        if let Some(a) = d.agent_restarts {
            let since = super::html::parse_time(&a.since);
            if fleet_wire::workload::is_crash_looping(a.count, since, now) {
                out.push(Alert {
                    kind: AlertKind::AgentCrashLooping,
                    subject: Subject::Device(d.name.to_owned()),
                    since,
                    detail: format!(
                        "the agent restarted {} times, the latest at {} (3 or more, the latest within 10 min)",
                        a.count, a.since
                    ),
                });
            }
        }
        for (w, r) in &d.looping_workloads {
            out.push(Alert {
                kind: AlertKind::WorkloadCrashLooping,
                subject: Subject::Workload {
                    device: d.name.to_owned(),
                    workload: w.clone(),
                },
                since: None,
                detail: restarts_text(r.as_ref()),
            });
        }
        for (w, error) in &d.unhealthy_workloads {
            out.push(Alert {
                kind: AlertKind::WorkloadUnhealthy,
                subject: Subject::Workload {
                    device: d.name.to_owned(),
                    workload: w.clone(),
                },
                since: None,
                detail: error.clone(),
            });
        }
        if let Some((w, last)) = d
            .writes_refused
            .filter(|(_, last)| now.since(*last) <= t.refused_for)
        {
            out.push(Alert {
                kind: AlertKind::WritesRefused,
                subject: Subject::Device(d.name.to_owned()),
                since: Some(last),
                detail: format!(
                    "{} refused since {} (latest: {}{}: {})",
                    w.count,
                    w.since,
                    w.kind,
                    w.bucket
                        .as_deref()
                        .map(|b| format!(" in {b}"))
                        .unwrap_or_default(),
                    for_log(&w.reason)
                ),
            });
        }
        if let Some(u) = d.usage.filter(|u| u.disk_full) {
            let full: Vec<String> = u
                .filesystems
                .iter()
                .filter(|f| f.used_percent >= u32::from(fleet_wire::usage::DISK_ALERT_PERCENT))
                .map(|f| {
                    format!(
                        "{} {}% used, {} free",
                        f.role,
                        f.used_percent,
                        crate::fleet::usage::size(f.available_bytes)
                    )
                })
                .collect();
            out.push(Alert {
                kind: AlertKind::DiskFull,
                subject: Subject::Device(d.name.to_owned()),
                since: None,
                detail: format!(
                    "{} (alert at {}%)",
                    full.join("; "),
                    fleet_wire::usage::DISK_ALERT_PERCENT
                ),
            });
        }
        if let Some(u) = d.usage.filter(|u| u.memory_pressure) {
            out.push(Alert {
                kind: AlertKind::MemoryPressure,
                subject: Subject::Device(d.name.to_owned()),
                since: None,
                detail: format!(
                    "{} (alert at pressure {}% or under {}% available)",
                    u.memory,
                    fleet_wire::usage::MEMORY_PRESSURE_SOME_AVG10_ALERT_CENTI / 100,
                    fleet_wire::usage::MEMORY_AVAILABLE_ALERT_PERCENT
                ),
            });
        }
        let silent = match crate::liveness::judge(&d.heartbeat, t.silent_after, now) {
            crate::liveness::Verdict::Silent(last) => Some(last),
            crate::liveness::Verdict::Heard(_) => None,
            crate::liveness::Verdict::Unknown => d.silent_before,
        };
        if let Some(last) = silent {
            out.push(Alert {
                kind: AlertKind::DeviceSilent,
                subject: Subject::Device(d.name.to_owned()),
                since: Some(last),
                // No running duration here: the alert is kept while it holds, "since" tells how long.
                detail: format!(
                    "no heartbeat for longer than {}",
                    super::html::age(t.silent_after)
                ),
            });
        }
    }
    for r in runs {
        let s = r.status;
        if s.phase != Some(TaskRunPhase::Failed) {
            continue;
        }
        if s.completion_time
            .is_some_and(|c| now.since(c) > t.failed_run_for)
        {
            continue;
        }
        let kind = match s.reason {
            Some(TaskRunReason::CanaryFailed) => AlertKind::CanaryFailed,
            _ => AlertKind::RunFailed,
        };
        let reason = s
            .reason
            .and_then(|r| serde_json::to_value(r).ok())
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        out.push(Alert {
            kind,
            subject: Subject::Run {
                namespace: r.namespace.to_owned(),
                name: r.name.to_owned(),
            },
            since: s.completion_time,
            detail: format!(
                "{reason}: {} of {} succeeded, {} failed{}",
                s.succeeded,
                s.targets,
                s.failed,
                s.latest_error
                    .as_ref()
                    .map(|e| format!("; latest error: {}", for_log(e.as_str())))
                    .unwrap_or_default()
            ),
        });
    }
    if let Some(fl) = fleetlock {
        if !fl.config_valid {
            out.push(Alert {
                kind: AlertKind::FleetLockConfigInvalid,
                subject: Subject::FleetLock,
                since: None,
                detail: fl.config_error.clone().unwrap_or_default(),
            });
        }
        for g in &fl.groups {
            for h in &g.holders {
                let held = now.since(h.taken_at);
                if held > t.slot_held_after {
                    out.push(Alert {
                        kind: AlertKind::SlotHeldTooLong,
                        subject: Subject::Holder {
                            group: g.name.clone(),
                            id: h.id.clone(),
                        },
                        since: Some(h.taken_at),
                        detail: format!(
                            "held for longer than {}{}",
                            super::html::age(t.slot_held_after),
                            h.hostname
                                .as_ref()
                                .map(|n| format!("; host {n}"))
                                .unwrap_or_default()
                        ),
                    });
                }
            }
        }
    }
    out.sort_by_key(Alert::key);
    out
}

/// The alerts of `now` that were not in `before`: each gets one event.
pub fn appeared<'a>(before: &[Alert], now: &'a [Alert]) -> Vec<&'a Alert> {
    let old: std::collections::HashSet<_> = before.iter().map(Alert::key).collect();
    now.iter().filter(|a| !old.contains(&a.key())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_wire::fixtures;
    use fleet_wire::fleetlock::{GroupStatus, Holder};

    fn at(s: u64) -> Timestamp {
        Timestamp::from_unix_ms(s * 1000)
    }

    #[test]
    fn conditions_become_alerts() {
        let now = at(100_000);
        let t = Thresholds {
            silent_after: Duration::from_secs(600),
            slot_held_after: Duration::from_secs(3600),
            failed_run_for: Duration::from_secs(86400),
            refused_for: Duration::from_secs(3600),
        };
        let refused = crate::crd::WritesRefused {
            count: 300,
            since: "2026-12-01T10:00:00Z".into(),
            last_at: "2026-12-01T10:01:00Z".into(),
            bucket: Some("device-heartbeat".into()),
            kind: "over-budget".into(),
            reason: "over the device's write budget".into(),
        };
        let mut quarantined = fixtures::upgrade_status();
        quarantined.phase = UpgradePhase::RollbackFailed;
        quarantined.error = Some(fleet_wire::BoundedText::lossy(
            "rollback failed\n[2026-12-07T04:00:00Z WARN  fleet_operator] forged",
        ));
        let mut failed = fixtures::upgrade_status();
        failed.phase = UpgradePhase::Failed;
        // preparing for 9 min + 1 min slack + 1 s: stalled; for exactly 10 min: not yet
        let mut stuck = fixtures::upgrade_status();
        stuck.phase_changed_at = at(100_000 - 601);
        let mut preparing = fixtures::upgrade_status();
        preparing.phase_changed_at = at(100_000 - 600);
        // a TaskRun intent the device has not accepted (set on the Device by the TaskRun controller)
        let task_stall = crate::crd::Stalled {
            phase: "not-accepted".into(),
            since: "2026-12-01T10:00:00Z".into(),
            task_run: Some("ops/upgrade".into()),
        };
        let devices = [
            ("q", Some(&quarantined), Some(at(99_990))),
            ("stuck", Some(&stuck), Some(at(99_990))),
            ("preparing", Some(&preparing), Some(at(99_990))),
            ("rolled-back", Some(&failed), Some(at(99_990))),
            ("silent", None, Some(at(100_000 - 601))),
            ("just-quiet", None, Some(at(100_000 - 600))),
            ("never", None, None),
        ];
        // Heartbeats watched since long before, each seen arriving when its device sent it.
        let beat = |hb: Option<Timestamp>| crate::liveness::Facts {
            watched_since: Some(at(0)),
            beat: hb.map(|at| crate::liveness::Beat {
                at,
                stored: Some(at),
                arrived: true,
            }),
            recorded: None,
            offset_secs: None,
        };
        // Heartbeats not watched (an operator starting, a watch opened anew): no new silence, however old the
        // heartbeat; one the last evaluation alerted stays (no second event when judged again).
        let unjudged = [
            ("starting", None),
            ("still-silent", Some(at(100_000 - 700))),
        ];
        // Agent restarts: 3, the latest start 10 min ago: crash-looping; 10 min and 1 s ago: no longer; 2 just
        // now: an incident. A workload reported crash-looping alerts on its own, whatever the agent does.
        let agent = |count: u32, ago: u64| crate::crd::AgentRestarts {
            count,
            since: at(100_000 - ago).to_string(),
            crash_looping: true, // as an earlier pass wrote it: judged again at the evaluation's time
        };
        let looping = vec![(
            "web".to_owned(),
            Some(fleet_wire::Restarts {
                count: 7,
                last_exit_code: Some(3),
                oom_killed: false,
            }),
        )];
        let restarted = [
            ("looper", agent(3, 600), Vec::new()),
            ("calmed", agent(3, 601), Vec::new()),
            ("incident", agent(2, 0), Vec::new()),
            ("web-host", agent(0, 5000), looping),
        ];
        // Refused an hour ago exactly: still shown; an hour and a second ago: history.
        let refusals = [
            ("flooder", at(100_000 - 3600)),
            ("flooded-long-ago", at(100_000 - 3601)),
        ];
        let run = |phase, reason, done: u64| TaskRunStatus {
            phase: Some(phase),
            reason,
            completion_time: Some(at(done)),
            targets: 3,
            failed: 1,
            ..Default::default()
        };
        let runs = [
            (
                "canary",
                run(
                    TaskRunPhase::Failed,
                    Some(TaskRunReason::CanaryFailed),
                    99_000,
                ),
            ),
            (
                "target",
                run(
                    TaskRunPhase::Failed,
                    Some(TaskRunReason::TargetFailed),
                    99_000,
                ),
            ),
            (
                "old",
                run(
                    TaskRunPhase::Failed,
                    Some(TaskRunReason::TargetFailed),
                    10_000,
                ),
            ),
            ("ok", run(TaskRunPhase::Complete, None, 99_000)),
        ];
        let holder = |id: &str, taken: u64| Holder {
            id: id.into(),
            hostname: None,
            ip: "10.0.0.1".into(),
            taken_at: at(taken),
        };
        let fl = ServerStatus {
            store: "file".into(),
            config_valid: false,
            config_error: Some("groups: slots must be at least 1".into()),
            ttl_secs: None,
            client_auth: None,
            warnings: Vec::new(),
            groups: vec![GroupStatus {
                name: "default".into(),
                slots: 2,
                holders: vec![holder("stuck", 100_000 - 3601), holder("fresh", 99_999)],
            }],
            started_at: None,
            recent: Vec::new(),
        };
        let alerts = evaluate(
            devices
                .iter()
                .map(|(n, u, hb)| DeviceFacts {
                    name: n,
                    upgrade: *u,
                    heartbeat: beat(*hb),
                    silent_before: None,
                    writes_refused: None,
                    stalled: None,
                    agent_restarts: None,
                    looping_workloads: Vec::new(),
                    unhealthy_workloads: Vec::new(),
                    usage: None,
                })
                .chain(refusals.iter().map(|(n, last)| DeviceFacts {
                    name: n,
                    upgrade: None,
                    heartbeat: beat(None),
                    silent_before: None,
                    writes_refused: Some((&refused, *last)),
                    stalled: None,
                    agent_restarts: None,
                    looping_workloads: Vec::new(),
                    unhealthy_workloads: Vec::new(),
                    usage: None,
                }))
                .chain([DeviceFacts {
                    name: "untaken",
                    upgrade: None,
                    heartbeat: beat(Some(at(99_990))),
                    silent_before: None,
                    writes_refused: None,
                    stalled: Some(&task_stall),
                    agent_restarts: None,
                    looping_workloads: Vec::new(),
                    unhealthy_workloads: Vec::new(),
                    usage: None,
                }])
                .chain(restarted.iter().map(|(n, a, w)| DeviceFacts {
                    name: n,
                    upgrade: None,
                    heartbeat: beat(Some(at(99_990))),
                    silent_before: None,
                    writes_refused: None,
                    stalled: None,
                    agent_restarts: Some(a),
                    looping_workloads: w.clone(),
                    unhealthy_workloads: if *n == "web-host" {
                        vec![(
                            "api".to_owned(),
                            "unhealthy: GET /healthz on port 8080 answered HTTP 503".to_owned(),
                        )]
                    } else {
                        Vec::new()
                    },
                    usage: None,
                }))
                .chain(unjudged.iter().map(|(n, before)| DeviceFacts {
                    name: n,
                    upgrade: None,
                    heartbeat: crate::liveness::Facts {
                        watched_since: None,
                        ..beat(Some(at(0)))
                    },
                    silent_before: *before,
                    writes_refused: None,
                    stalled: None,
                    agent_restarts: None,
                    looping_workloads: Vec::new(),
                    unhealthy_workloads: Vec::new(),
                    usage: None,
                })),
            runs.iter().map(|(n, s)| RunFacts {
                namespace: "ops",
                name: n,
                status: s,
            }),
            Some(&fl),
            &t,
            now,
        );
        let got: Vec<(AlertKind, String)> = alerts
            .iter()
            .map(|a| (a.kind, a.subject.to_string()))
            .collect();
        assert_eq!(
            got,
            [
                (AlertKind::RollbackFailed, "device q".into()),
                (AlertKind::DeviceSilent, "device silent".into()),
                (AlertKind::DeviceSilent, "device still-silent".into()),
                (AlertKind::DeviceStalled, "device stuck".into()),
                (AlertKind::DeviceStalled, "device untaken".into()),
                (AlertKind::AgentCrashLooping, "device looper".into()),
                (
                    AlertKind::WorkloadCrashLooping,
                    "workload web on device web-host".into()
                ),
                (
                    AlertKind::WorkloadUnhealthy,
                    "workload api on device web-host".into()
                ),
                (AlertKind::WritesRefused, "device flooder".into()),
                (AlertKind::CanaryFailed, "task run ops/canary".into()),
                (AlertKind::RunFailed, "task run ops/target".into()),
                (
                    AlertKind::SlotHeldTooLong,
                    "stuck in FleetLock group default".into()
                ),
                (
                    AlertKind::FleetLockConfigInvalid,
                    "the FleetLock server".into()
                ),
            ]
        );
        assert!(
            alerts[0]
                .detail
                .ends_with("rollback failed\\n[2026-12-07T04:00:00Z WARN  fleet_operator] forged"),
            "the device's error, escaped: {}",
            alerts[0].detail
        );
        assert_eq!(
            alerts[3].detail,
            "upgrade to 1.2.0 in phase preparing for longer than its bound of 9m"
        );
        assert_eq!(
            alerts[4].detail,
            "has not accepted the system-upgrade intent of TaskRun ops/upgrade (written 2026-12-01T10:00:00Z)"
        );
        assert_eq!(
            alerts[4].since,
            super::super::html::parse_time("2026-12-01T10:00:00Z")
        );
        assert_eq!(
            alerts[7].detail,
            "unhealthy: GET /healthz on port 8080 answered HTTP 503"
        );
        assert_eq!(
            alerts[8].detail,
            "300 refused since 2026-12-01T10:00:00Z (latest: over-budget in device-heartbeat: over the \
             device's write budget)"
        );
        assert!(alerts[9]
            .detail
            .starts_with("CanaryFailed: 0 of 3 succeeded, 1 failed"));
        assert_eq!(alerts[5].since, Some(at(100_000 - 600)));
        assert_eq!(
            alerts[5].detail,
            format!(
                "the agent restarted 3 times, the latest at {} (3 or more, the latest within 10 min)",
                at(100_000 - 600)
            )
        );
        assert_eq!(alerts[6].detail, "restarted 7 times, last exit code 3");
        // the same alerts again: nothing new; one gone and one back: only that one is new
        assert!(appeared(&alerts, &alerts).is_empty());
        assert_eq!(alerts[2].since, Some(at(100_000 - 700)), "kept as it was");
        let fewer: Vec<Alert> = alerts[1..].to_vec();
        assert_eq!(appeared(&fewer, &alerts), vec![&alerts[0]]);
    }

    /// A full disk and memory pressure, as the Device's status.usage says, are alerts with what is full; a
    /// device below the thresholds has none.
    #[test]
    fn usage_verdicts_become_alerts() {
        let now = at(100_000);
        let fs = |role: &str, used, free| crate::crd::FilesystemStatus {
            role: role.into(),
            used_percent: used,
            available_bytes: free,
            size_bytes: 1 << 30,
        };
        let full = crate::crd::UsageStatus {
            disk_full: true,
            filesystems: vec![fs("containers", 96, 41 << 20), fs("root", 25, 6 << 30)],
            memory: "3% available, pressure 12%".into(),
            memory_pressure: true,
            ..Default::default()
        };
        let calm = crate::crd::UsageStatus {
            filesystems: vec![fs("containers", 89, 110 << 20)],
            memory: "40% available".into(),
            ..Default::default()
        };
        let facts = |name, usage| DeviceFacts {
            name,
            upgrade: None,
            heartbeat: crate::liveness::Facts {
                watched_since: None,
                beat: None,
                recorded: None,
                offset_secs: None,
            },
            silent_before: None,
            writes_refused: None,
            stalled: None,
            agent_restarts: None,
            looping_workloads: Vec::new(),
            unhealthy_workloads: Vec::new(),
            usage,
        };
        let alerts = evaluate(
            [
                facts("full", Some(&full)),
                facts("calm", Some(&calm)),
                facts("unknown", None),
            ],
            [],
            None,
            &Thresholds::default(),
            now,
        );
        let got: Vec<(AlertKind, String, &str)> = alerts
            .iter()
            .map(|a| (a.kind, a.subject.to_string(), a.detail.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                (
                    AlertKind::DiskFull,
                    "device full".into(),
                    "containers 96% used, 41 MiB free (alert at 90%)"
                ),
                (
                    AlertKind::MemoryPressure,
                    "device full".into(),
                    "3% available, pressure 12% (alert at pressure 10% or under 5% available)"
                ),
            ]
        );
    }
}
