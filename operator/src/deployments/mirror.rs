//! Device status mirrored from NATS KV (`device-info`, `device-heartbeat`, `agent-upgrade-status`,
//! `device-workload-status`), as a pure function. A heartbeat alone is written at most once per
//! [`HEARTBEAT_REFRESH`]: liveness is read from the heartbeat mirror (the dashboard, alerts, rollouts), so the API
//! server carries writes that follow change, not N devices / 30 s for ever (Kubernetes moved node heartbeats out
//! of NodeStatus for the same reason, KEP-589).

use crate::crd::{DeviceStatus, Stalled};
use fleet_wire::{AgentUpgradeStatus, DeviceInfo, DeviceWorkloadStatus, Heartbeat, Timestamp};
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
    /// fleet-auth's reports of refused writes ([`crate::refusals`]).
    pub refused: Option<crate::refusals::Record>,
}

/// The Device status to write at `now` (the operator's clock), given what is currently mirrored; `None` when
/// nothing needs writing. `stalled` is set once the upgrade's phase outlasted its bound (the operator's periodic
/// pass notices it without a new report).
pub fn device_status(
    current: Option<&DeviceStatus>,
    r: &Reported,
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
                crate::deployments::rollout::is_stalled(u.phase, u.phase_changed_at, now).then(
                    || Stalled {
                        phase: crate::deployments::rollout::phase_word(u.phase),
                        since: u.phase_changed_at.to_string(),
                        task_run: None,
                    },
                )
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
    };
    // A heartbeat's own agent version is fresher than the info's after a cutover.
    if let Some(h) = &r.heartbeat {
        if next.agent_version.is_some() {
            next.agent_version = Some(h.agent_version.clone());
        }
    }
    let current = current.cloned().unwrap_or_default();
    // Keep the written heartbeat while the new one is within the refresh.
    if let (Some(old), Some(new)) = (&current.last_heartbeat, &next.last_heartbeat) {
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
            refused: None,
        };
        let first = device_status(None, &base, now()).expect("first write");
        assert_eq!(first.agent_version, Some(hb.agent_version.clone()));
        assert_eq!(first.architecture, Some(info.architecture));
        assert_eq!(
            first.agent_upgrade.as_ref().map(|u| u.transitions.len()),
            Some(5)
        );
        assert_eq!(first.last_heartbeat, Some(hb.at.to_string()));

        // unchanged: nothing to write
        assert_eq!(device_status(Some(&first), &base, now()), None);

        // beats 10 s and 59 min later are not written; one an hour later is
        let beat = hb.at;
        for secs in [10, 59 * 60] {
            hb.at = beat.plus(Duration::from_secs(secs));
            let r = Reported {
                heartbeat: Some(Arc::new(hb.clone())),
                ..base.clone()
            };
            assert_eq!(device_status(Some(&first), &r, now()), None, "{secs} s");
        }
        hb.at = beat.plus(HEARTBEAT_REFRESH);
        let r = Reported {
            heartbeat: Some(Arc::new(hb.clone())),
            ..base.clone()
        };
        assert_eq!(
            device_status(Some(&first), &r, now()).and_then(|s| s.last_heartbeat),
            Some(hb.at.to_string())
        );

        // a new version reported in the heartbeat is written at once
        hb.agent_version = Version::try_from("9.0.0").expect("v");
        let r = Reported {
            heartbeat: Some(Arc::new(hb.clone())),
            ..base.clone()
        };
        assert_eq!(
            device_status(Some(&first), &r, now()).and_then(|s| s.agent_version),
            Some(hb.agent_version.clone())
        );

        // an upgrade status change is written
        let r = Reported {
            upgrade: Some(Arc::new(fixtures::upgrade_status())),
            ..base.clone()
        };
        assert!(device_status(Some(&first), &r, now()).is_some());

        // a workload report is summarized; a new measurement time alone writes nothing
        let mut ws = fixtures::workload_status();
        let r = Reported {
            workloads: Some(Arc::new(ws.clone())),
            ..base.clone()
        };
        let with = device_status(Some(&first), &r, now()).expect("workloads summarized");
        assert_eq!(with.workloads.as_ref().map(|w| w.running), Some(1));
        ws.at = ws.at.plus(Duration::from_secs(10));
        let r = Reported {
            workloads: Some(Arc::new(ws)),
            ..base.clone()
        };
        assert_eq!(device_status(Some(&with), &r, now()), None);

        // an upgrade preparing since t(0): not stalled within 9 min + 1 min slack; stalled after, with its phase
        // and since when, and that stays put (no write per pass) while it lasts
        let preparing = fixtures::upgrade_status();
        let since = preparing.phase_changed_at;
        let r = Reported {
            upgrade: Some(Arc::new(preparing)),
            ..base.clone()
        };
        let at = |secs| since.plus(Duration::from_secs(secs));
        let calm = device_status(Some(&first), &r, at(600)).expect("upgrade written");
        assert_eq!(calm.stalled, None);
        let stuck = device_status(Some(&calm), &r, at(601)).expect("stalled written");
        assert_eq!(
            stuck.stalled,
            Some(Stalled {
                phase: "preparing".into(),
                since: since.to_string(),
                task_run: None,
            })
        );
        assert_eq!(device_status(Some(&stuck), &r, at(3600)), None);

        // a TaskRun's stall (the TaskRun controller's) is kept as it is; an agent upgrade's stall replaces it
        let task = Stalled {
            phase: "not-accepted".into(),
            since: since.to_string(),
            task_run: Some("ops/upgrade".into()),
        };
        let mut marked = calm.clone();
        marked.stalled = Some(task.clone());
        assert_eq!(device_status(Some(&marked), &r, at(600)), None);
        let over = device_status(Some(&marked), &r, at(601)).expect("agent stall wins");
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
        let refused = device_status(Some(&first), &r, now()).expect("refusals shown");
        let shown = refused.writes_refused.clone().expect("writesRefused");
        assert_eq!((shown.count, shown.kind.as_str()), (4, "too-large"));
        let later = now().plus(crate::refusals::QUIET);
        assert_eq!(
            device_status(Some(&refused), &r, later).map(|s| s.writes_refused),
            Some(None)
        );

        // nothing reported at all: an empty status, written once
        let empty = device_status(None, &Reported::default(), now());
        assert_eq!(empty, None);
    }
}
