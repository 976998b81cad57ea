//! Device status mirrored from NATS KV (`device-info`, `device-heartbeat`, `agent-upgrade-status`,
//! `device-workload-status`, `device-usage`), as a pure function. A heartbeat alone is written at most once per
//! [`HEARTBEAT_REFRESH`]: liveness is read from the heartbeat mirror (the dashboard, alerts, rollouts), so the API
//! server carries writes that follow change, not N devices / 30 s for ever (Kubernetes moved node heartbeats out
//! of NodeStatus for the same reason, KEP-589).

use crate::conditions::{self, Want};
use crate::crd::{AgentRestarts, CrashLooping, DeviceStatus, Stalled};
use fleet_wire::{AgentUpgradeStatus, DeviceInfo, DeviceWorkloadStatus, Heartbeat, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::sync::Arc;
use std::time::Duration;

/// A heartbeat newer than the Device's `lastHeartbeat` by less than this is not written to it: 100,000 devices
/// cost 28 writes/s.
pub const HEARTBEAT_REFRESH: Duration = Duration::from_secs(3600);

/// What NATS says about one device.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reported {
    /// From `device-info`.
    pub info: Option<Arc<DeviceInfo>>,
    /// From `device-heartbeat`.
    pub heartbeat: Option<Arc<Heartbeat>>,
    /// From `agent-upgrade-status`.
    pub upgrade: Option<Arc<AgentUpgradeStatus>>,
    /// From `device-workload-status`.
    pub workloads: Option<Arc<DeviceWorkloadStatus>>,
    /// From `device-usage`.
    pub usage: Option<Arc<fleet_wire::DeviceUsage>>,
    /// fleet-auth's reports of refused writes ([`crate::refusals`]).
    pub refused: Option<crate::refusals::Record>,
    /// The heartbeat with when NATS stored it (set with `heartbeat`), for [`crate::liveness`].
    pub beat: Option<crate::liveness::Beat>,
}

/// The `Online` condition wanted at `now`, or `None` when liveness is not judged (the current one stays).
fn online(
    current: Option<&DeviceStatus>,
    r: &Reported,
    watched_since: Option<Timestamp>,
    now: Timestamp,
) -> Option<Want> {
    let facts = crate::liveness::Facts {
        watched_since,
        beat: r.beat,
        recorded: current
            .and_then(|c| c.last_heartbeat.as_deref())
            .and_then(|t| t.parse().ok()),
        offset_secs: crate::liveness::clock_offset(
            current.and_then(|c| c.clock_offset_seconds),
            r.beat.as_ref(),
        ),
    };
    let after = humantime::format_duration(crate::liveness::OFFLINE_AFTER);
    // Messages without times or counts: the condition is written when it changes, never per heartbeat.
    match crate::liveness::judge(&facts, crate::liveness::OFFLINE_AFTER, now) {
        crate::liveness::Verdict::Unknown => None,
        crate::liveness::Verdict::Heard(_) => Some(Want {
            type_: conditions::ONLINE,
            ok: true,
            reason: conditions::REASON_HEARTBEATING,
            message: format!("its heartbeats arrive (offline after {after} without one)"),
        }),
        crate::liveness::Verdict::Silent(_) => Some(Want {
            type_: conditions::ONLINE,
            ok: false,
            reason: conditions::REASON_SILENT,
            message: format!(
                "no heartbeat for longer than {after}: check its power and network, then `systemctl status \
                 fleet-agent` on it"
            ),
        }),
    }
}

/// `t` as a Kubernetes time.
fn kube_time(t: Timestamp) -> Time {
    Time(
        k8s_openapi::jiff::Timestamp::from_millisecond(
            i64::try_from(t.unix_ms()).unwrap_or(i64::MAX),
        )
        .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
    )
}

/// The Device status to write at `now` (the operator's clock), given what is currently mirrored and since when
/// the heartbeats are watched (`watched_since`: [`crate::kv::Mirror::watched_since`]); `None` when nothing needs
/// writing. `stalled` is set once the upgrade's phase outlasted its bound and the `Online` condition turns False
/// once the device is silent for [`crate::liveness::OFFLINE_AFTER`] (the operator's periodic pass notices both
/// without a new report).
pub fn device_status(
    current: Option<&DeviceStatus>,
    r: &Reported,
    watched_since: Option<Timestamp>,
    now: Timestamp,
) -> Option<DeviceStatus> {
    let mut next = DeviceStatus {
        agent_version: r.info.as_ref().map(|i| i.agent_version.clone()),
        architecture: r.info.as_ref().map(|i| i.architecture),
        capabilities: r
            .info
            .as_ref()
            .map(|i| i.capabilities.clone())
            .unwrap_or_default(),
        os: r.info.as_ref().map(|i| {
            i.os.pretty_name
                .as_ref()
                .unwrap_or(&i.os.id)
                .as_str()
                .to_owned()
        }),
        last_heartbeat: r.heartbeat.as_ref().map(|h| h.at.to_string()),
        agent_upgrade: r.upgrade.as_deref().cloned(),
        workloads: r
            .workloads
            .as_deref()
            .map(crate::deployments::health::device),
        stalled: r
            .upgrade
            .as_ref()
            .and_then(|u| {
                crate::fleet::rollout::is_stalled(u.phase, u.phase_changed_at, now).then(|| {
                    Stalled {
                        phase: crate::fleet::rollout::phase_word(u.phase),
                        since: u.phase_changed_at.to_string(),
                        task_run: None,
                    }
                })
            })
            // A TaskRun's stall is the TaskRun controller's to set and clear: kept as it is (an agent upgrade's
            // stall, the more urgent, replaces it).
            .or_else(|| {
                current
                    .and_then(|c| c.stalled.clone())
                    .filter(|s| s.task_run.is_some())
            }),
        writes_refused: crate::refusals::status(
            current.and_then(|c| c.writes_refused.as_ref()),
            r.refused.as_ref(),
            now,
        ),
        conditions: Vec::new(),
        clock_offset_seconds: crate::liveness::clock_offset(
            current.and_then(|c| c.clock_offset_seconds),
            r.beat.as_ref(),
        ),
        agent_restarts: r.info.as_ref().and_then(|i| {
            let count = i.restarts?;
            Some(AgentRestarts {
                count,
                since: i.published_at.to_string(),
                crash_looping: fleet_wire::workload::is_crash_looping(
                    count,
                    Some(i.published_at),
                    now,
                ),
            })
        }),
        crash_looping: None,
        // The pass sets these from the rollouts' decisions (plan.rs), not from a report: kept as they are here.
        blocking: current.map(|c| c.blocking.clone()).unwrap_or_default(),
        blocking_more: current.and_then(|c| c.blocking_more),
        // Rounded in steps from what is shown now, so that small changes write nothing (usage.rs).
        usage: r
            .usage
            .as_deref()
            .map(|u| crate::fleet::usage::shown(current.and_then(|c| c.usage.as_ref()), u)),
    };
    next.crash_looping = CrashLooping::of(
        next.agent_restarts
            .as_ref()
            .is_some_and(|a| a.crash_looping),
        next.workloads.as_ref().is_some_and(|w| w.crash_looping > 0),
    );
    // Online: replaced when judged, kept as it is otherwise; other conditions are not this function's.
    let old_conditions = current.map(|c| c.conditions.as_slice()).unwrap_or_default();
    let old_online = old_conditions
        .iter()
        .find(|c| c.type_ == conditions::ONLINE);
    let next_online = match online(current, r, watched_since, now) {
        Some(want) => conditions::merge(old_conditions, &[want], None, &kube_time(now)).pop(),
        None => old_online.cloned(),
    };
    let online_changed = next_online.as_ref().map(|c| &c.status) != old_online.map(|c| &c.status);
    next.conditions = old_conditions
        .iter()
        .filter(|c| c.type_ != conditions::ONLINE)
        .cloned()
        .chain(next_online)
        .collect();
    // A heartbeat's own agent version is fresher than the info's after a cutover.
    if let Some(h) = &r.heartbeat {
        if next.agent_version.is_some() {
            next.agent_version = Some(h.agent_version.clone());
        }
    }
    let current = current.cloned().unwrap_or_default();
    // Keep the written heartbeat while the new one is within the refresh (unless the device just went online or
    // offline: that write carries the latest heartbeat at no cost).
    if let (Some(old), Some(new), false) = (
        &current.last_heartbeat,
        &next.last_heartbeat,
        online_changed,
    ) {
        let parse = |s: &str| s.parse::<Timestamp>().ok();
        if let (Some(o), Some(n)) = (parse(old), parse(new)) {
            if n.unix_ms() >= o.unix_ms() && n.since(o) < HEARTBEAT_REFRESH {
                next.last_heartbeat = current.last_heartbeat.clone();
            }
        }
    }
    (next != current).then_some(next)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_wire::{fixtures, Version};
    use std::time::Duration;

    fn now() -> Timestamp {
        Timestamp::from_unix_ms(1_796_013_600_000)
    }

    #[test]
    fn status_table() {
        let info = fixtures::device_info();
        let mut hb = fixtures::heartbeat();
        let base = Reported {
            info: Some(Arc::new(info.clone())),
            heartbeat: Some(Arc::new(hb.clone())),
            upgrade: Some(Arc::new(fixtures::failed_status())),
            workloads: None,
            usage: None,
            refused: None,
            beat: None,
        };
        let first = device_status(None, &base, None, now()).expect("first write");
        assert_eq!(first.agent_version, Some(hb.agent_version.clone()));
        assert_eq!(first.architecture, Some(info.architecture));
        assert_eq!(
            first.agent_upgrade.as_ref().map(|u| u.transitions.len()),
            Some(5)
        );
        assert_eq!(first.last_heartbeat, Some(hb.at.to_string()));

        // unchanged: nothing to write
        assert_eq!(device_status(Some(&first), &base, None, now()), None);

        // beats 10 s and 59 min later are not written; one an hour later is
        let beat = hb.at;
        for secs in [10, 59 * 60] {
            hb.at = beat.plus(Duration::from_secs(secs));
            let r = Reported {
                heartbeat: Some(Arc::new(hb.clone())),
                ..base.clone()
            };
            assert_eq!(
                device_status(Some(&first), &r, None, now()),
                None,
                "{secs} s"
            );
        }
        hb.at = beat.plus(HEARTBEAT_REFRESH);
        let r = Reported {
            heartbeat: Some(Arc::new(hb.clone())),
            ..base.clone()
        };
        assert_eq!(
            device_status(Some(&first), &r, None, now()).and_then(|s| s.last_heartbeat),
            Some(hb.at.to_string())
        );

        // a new version reported in the heartbeat is written at once
        hb.agent_version = Version::try_from("9.0.0").expect("v");
        let r = Reported {
            heartbeat: Some(Arc::new(hb.clone())),
            ..base.clone()
        };
        assert_eq!(
            device_status(Some(&first), &r, None, now()).and_then(|s| s.agent_version),
            Some(hb.agent_version.clone())
        );

        // an upgrade status change is written
        let r = Reported {
            upgrade: Some(Arc::new(fixtures::upgrade_status())),
            ..base.clone()
        };
        assert!(device_status(Some(&first), &r, None, now()).is_some());

        // a workload report is summarized; a new measurement time alone writes nothing
        let mut ws = fixtures::workload_status();
        let r = Reported {
            workloads: Some(Arc::new(ws.clone())),
            ..base.clone()
        };
        let with = device_status(Some(&first), &r, None, now()).expect("workloads summarized");
        assert_eq!(with.workloads.as_ref().map(|w| w.running), Some(1));
        ws.at = ws.at.plus(Duration::from_secs(10));
        let r = Reported {
            workloads: Some(Arc::new(ws)),
            ..base.clone()
        };
        assert_eq!(device_status(Some(&with), &r, None, now()), None);

        // an upgrade preparing since t(0): not stalled within 9 min + 1 min slack; stalled after, with its phase
        // and since when, and that stays put (no write per pass) while it lasts
        let preparing = fixtures::upgrade_status();
        let since = preparing.phase_changed_at;
        let r = Reported {
            upgrade: Some(Arc::new(preparing)),
            ..base.clone()
        };
        let at = |secs| since.plus(Duration::from_secs(secs));
        let calm = device_status(Some(&first), &r, None, at(600)).expect("upgrade written");
        assert_eq!(calm.stalled, None);
        let stuck = device_status(Some(&calm), &r, None, at(601)).expect("stalled written");
        assert_eq!(
            stuck.stalled,
            Some(Stalled {
                phase: "preparing".into(),
                since: since.to_string(),
                task_run: None,
            })
        );
        assert_eq!(device_status(Some(&stuck), &r, None, at(3600)), None);

        // a TaskRun's stall (the TaskRun controller's) is kept as it is; an agent upgrade's stall replaces it
        let task = Stalled {
            phase: "not-accepted".into(),
            since: since.to_string(),
            task_run: Some("ops/upgrade".into()),
        };
        let mut marked = calm.clone();
        marked.stalled = Some(task.clone());
        assert_eq!(device_status(Some(&marked), &r, None, at(600)), None);
        let over = device_status(Some(&marked), &r, None, at(601)).expect("agent stall wins");
        assert_eq!(over.stalled, stuck.stalled);

        // refused writes are shown, and gone an hour after the last
        let mut rec = crate::refusals::Record::new(None, now());
        rec.observe(
            &fleet_wire::device_api::WriteRefused {
                device_id: info.device_id.clone(),
                bucket: Some("device-info".into()),
                kind: "too-large".into(),
                reason: "value of 9000 bytes is over device-info's limit of 8192 bytes".into(),
                count: 4,
            },
            now(),
        );
        let r = Reported {
            refused: Some(rec),
            ..base.clone()
        };
        let refused = device_status(Some(&first), &r, None, now()).expect("refusals shown");
        let shown = refused.writes_refused.clone().expect("writesRefused");
        assert_eq!((shown.count, shown.kind.as_str()), (4, "too-large"));
        let later = now().plus(crate::refusals::QUIET);
        assert_eq!(
            device_status(Some(&refused), &r, None, later).map(|s| s.writes_refused),
            Some(None)
        );

        // nothing reported at all: nothing written
        let empty = device_status(None, &Reported::default(), None, now());
        assert_eq!(empty, None);
    }

    #[test]
    fn crash_loops_show_with_the_agent_restarts() {
        let mut info = fixtures::device_info();
        let started = info.published_at;
        let at = |secs: u64| started.plus(Duration::from_secs(secs));
        let reported = |info: &DeviceInfo, workloads: Option<DeviceWorkloadStatus>| Reported {
            info: Some(Arc::new(info.clone())),
            workloads: workloads.map(Arc::new),
            ..Default::default()
        };
        let shown = |s: &DeviceStatus| {
            (
                s.agent_restarts
                    .as_ref()
                    .map(|a| (a.count, a.crash_looping)),
                s.crash_looping,
            )
        };
        // (case, restarts, workloads crash-looping, seconds after the agent's start, shown)
        type Row = (
            &'static str,
            Option<u32>,
            bool,
            u64,
            (Option<(u32, bool)>, Option<CrashLooping>),
        );
        #[rustfmt::skip]
        let rows: [Row; 7] = [
            ("not reported", None, false, 1, (None, None)),
            ("no restarts", Some(0), false, 1, (Some((0, false)), None)),
            ("two restarts: an incident", Some(2), false, 1, (Some((2, false)), None)),
            ("three, just started", Some(3), false, 1, (Some((3, true)), Some(CrashLooping::Agent))),
            ("three, up 10 min", Some(3), false, 600, (Some((3, true)), Some(CrashLooping::Agent))),
            ("three, up 10 min 1 s: stopped looping", Some(3), false, 601, (Some((3, false)), None)),
            ("agent and a workload", Some(5), true, 1, (Some((5, true)), Some(CrashLooping::AgentAndWorkloads))),
        ];
        for (case, restarts, looping, secs, want) in rows {
            info.restarts = restarts;
            let ws = looping.then(fixtures::workload_status_crash_looping);
            let s = device_status(None, &reported(&info, ws), None, at(secs)).expect(case);
            assert_eq!(shown(&s), want, "{case}");
            if let Some(a) = &s.agent_restarts {
                assert_eq!(
                    a.since,
                    started.to_string(),
                    "{case}: since the agent's start"
                );
            }
        }
        // Only workloads: the Device's count and its state say so.
        info.restarts = Some(0);
        let r = reported(&info, Some(fixtures::workload_status_crash_looping()));
        let s = device_status(None, &r, None, at(1)).expect("workloads");
        assert_eq!(s.crash_looping, Some(CrashLooping::Workloads));
        assert_eq!(s.workloads.as_ref().map(|w| w.crash_looping), Some(1));
        // The periodic pass ends an agent's loop without a new report: one write, then none.
        info.restarts = Some(4);
        let r = reported(&info, None);
        let looping = device_status(None, &r, None, at(60)).expect("looping");
        assert_eq!(device_status(Some(&looping), &r, None, at(300)), None);
        let calm = device_status(Some(&looping), &r, None, at(601)).expect("loop over");
        assert_eq!(calm.crash_looping, None);
        assert_eq!(device_status(Some(&calm), &r, None, at(3600)), None);
    }

    #[test]
    fn online_is_written_when_liveness_changes() {
        let info = fixtures::device_info();
        let t0 = now();
        let at = |secs: u64| t0.plus(Duration::from_secs(secs));
        // The device beats at `secs`, by its clock and NATS's, seen arriving.
        let beating = |secs: u64| {
            let mut hb = fixtures::heartbeat();
            hb.at = at(secs);
            Reported {
                info: Some(Arc::new(info.clone())),
                heartbeat: Some(Arc::new(hb)),
                beat: Some(crate::liveness::Beat {
                    at: at(secs),
                    stored: Some(at(secs)),
                    arrived: true,
                }),
                ..Default::default()
            }
        };
        let online = |s: &DeviceStatus| {
            s.conditions
                .iter()
                .find(|c| c.type_ == conditions::ONLINE)
                .map(|c| {
                    (
                        c.status.clone(),
                        c.reason.clone(),
                        c.last_transition_time.clone(),
                    )
                })
        };
        let watched = Some(t0);
        // Heartbeats not watched yet (an operator starting): no Online at all.
        let first = device_status(None, &beating(0), None, at(1)).expect("first write");
        assert_eq!(online(&first), None);
        // Watched: Online=True from that pass on.
        let on = device_status(Some(&first), &beating(0), watched, at(2)).expect("online");
        assert_eq!(
            online(&on),
            Some(("True".into(), "Heartbeating".into(), kube_time(at(2))))
        );
        // Heartbeats every 30 s: no write, whatever their times.
        for secs in [30, 60, 90, 120] {
            assert_eq!(
                device_status(Some(&on), &beating(secs), watched, at(secs + 1)),
                None,
                "beat at {secs} s"
            );
        }
        // The last beat at 120 s: online 90 s after it, offline a second later, with the latest heartbeat written
        // with it (the hourly refresh aside).
        assert_eq!(
            device_status(Some(&on), &beating(120), watched, at(210)),
            None
        );
        let off = device_status(Some(&on), &beating(120), watched, at(211)).expect("offline");
        assert_eq!(
            online(&off),
            Some(("False".into(), "Silent".into(), kube_time(at(211))))
        );
        assert_eq!(off.last_heartbeat, Some(at(120).to_string()));
        // Each later pass: nothing to write; nor while the heartbeats are not watched (a watch opened anew).
        assert_eq!(
            device_status(Some(&off), &beating(120), watched, at(300)),
            None
        );
        assert_eq!(
            device_status(Some(&off), &beating(120), None, at(900)),
            None
        );
        // Heard again: online, a new transition time.
        let back = device_status(Some(&off), &beating(1000), watched, at(1001)).expect("back");
        assert_eq!(
            online(&back),
            Some(("True".into(), "Heartbeating".into(), kube_time(at(1001))))
        );
        // A device clock two hours behind, its beats seen arriving: online by NATS's time; its offset is written
        // once, then not again while it stays within 5 s.
        let behind = |secs: u64, arrived: bool| {
            let mut r = beating(secs);
            if let Some(b) = r.beat.as_mut() {
                b.at = Timestamp::from_unix_ms(at(secs).unix_ms() - 7_200_000);
                b.arrived = arrived;
            }
            r
        };
        let skewed = device_status(Some(&back), &behind(1030, true), watched, at(1031))
            .expect("the offset written");
        assert_eq!(skewed.clock_offset_seconds, Some(-7200));
        assert_eq!(
            online(&skewed),
            online(&back),
            "still online, since the same time"
        );
        assert_eq!(
            device_status(Some(&skewed), &behind(1060, true), watched, at(1061)),
            None
        );
        // An operator restarted finds that beat in the bucket: corrected by the recorded offset, not silent.
        assert_eq!(
            device_status(
                Some(&skewed),
                &behind(1060, false),
                Some(at(1070)),
                at(1071)
            ),
            None
        );
        // Without the recorded offset it would have been judged by the device's clock: silent.
        let unknown = DeviceStatus {
            clock_offset_seconds: None,
            ..skewed.clone()
        };
        let misjudged = device_status(
            Some(&unknown),
            &behind(1060, false),
            Some(at(1070)),
            at(1071),
        )
        .expect("offline");
        assert_eq!(online(&misjudged).map(|o| o.0), Some("False".into()));
    }
}
