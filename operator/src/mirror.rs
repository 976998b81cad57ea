//! Device status mirrored from NATS KV (`device-info`, `device-heartbeat`, `agent-upgrade-status`,
//! `device-workload-status`), as a pure function. Heartbeats are coalesced so that a large fleet does not turn every beat into an API write.

use crate::crd::{DeviceStatus, Stalled};
use fleet_wire::{AgentUpgradeStatus, DeviceInfo, DeviceWorkloadStatus, Heartbeat, Timestamp};
use std::time::Duration;

/// A heartbeat newer than the mirrored one by less than this is not written to the Device status.
pub const HEARTBEAT_COALESCE: Duration = Duration::from_secs(30);

/// What NATS says about one device.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reported {
    /// From `device-info`.
    pub info: Option<DeviceInfo>,
    /// From `device-heartbeat`.
    pub heartbeat: Option<Heartbeat>,
    /// From `agent-upgrade-status`.
    pub upgrade: Option<AgentUpgradeStatus>,
    /// From `device-workload-status`.
    pub workloads: Option<DeviceWorkloadStatus>,
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
        agent_upgrade: r.upgrade.clone(),
        workloads: r.workloads.as_ref().map(crate::health::device),
        stalled: r.upgrade.as_ref().and_then(|u| {
            crate::rollout::is_stalled(u.phase, u.phase_changed_at, now).then(|| Stalled {
                phase: serde_json::to_value(u.phase)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default(),
                since: u.phase_changed_at.to_string(),
            })
        }),
    };
    // A heartbeat's own agent version is fresher than the info's after a cutover.
    if let Some(h) = &r.heartbeat {
        if next.agent_version.is_some() {
            next.agent_version = Some(h.agent_version.clone());
        }
    }
    let current = current.cloned().unwrap_or_default();
    // Keep the mirrored heartbeat when the new one is within the coalescing window.
    if let (Some(old), Some(new)) = (&current.last_heartbeat, &next.last_heartbeat) {
        let parse = |s: &str| s.parse::<Timestamp>().ok();
        if let (Some(o), Some(n)) = (parse(old), parse(new)) {
            if n.unix_ms() >= o.unix_ms() && n.since(o) < HEARTBEAT_COALESCE {
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

    #[test]
    fn status_table() {
        let info = fixtures::device_info();
        let mut hb = fixtures::heartbeat();
        let base = Reported {
            info: Some(info.clone()),
            heartbeat: Some(hb.clone()),
            upgrade: Some(fixtures::failed_status()),
            workloads: None,
        };
        let first = device_status(None, &base, hb.at).expect("first write");
        assert_eq!(first.agent_version, Some(hb.agent_version.clone()));
        assert_eq!(first.architecture, Some(info.architecture));
        assert_eq!(
            first.agent_upgrade.as_ref().map(|u| u.transitions.len()),
            Some(5)
        );
        assert_eq!(first.last_heartbeat, Some(hb.at.to_string()));

        // unchanged: nothing to write
        assert_eq!(device_status(Some(&first), &base, hb.at), None);

        // a beat 10 s later is coalesced; 40 s later is written
        hb.at = hb.at.plus(Duration::from_secs(10));
        let r = Reported {
            heartbeat: Some(hb.clone()),
            ..base.clone()
        };
        assert_eq!(device_status(Some(&first), &r, hb.at), None);
        hb.at = hb.at.plus(Duration::from_secs(30));
        let r = Reported {
            heartbeat: Some(hb.clone()),
            ..base.clone()
        };
        assert_eq!(
            device_status(Some(&first), &r, hb.at).and_then(|s| s.last_heartbeat),
            Some(hb.at.to_string())
        );

        // a new version reported in the heartbeat is written at once
        hb.agent_version = Version::try_from("9.0.0").expect("v");
        let r = Reported {
            heartbeat: Some(hb.clone()),
            ..base.clone()
        };
        assert_eq!(
            device_status(Some(&first), &r, hb.at).and_then(|s| s.agent_version),
            Some(hb.agent_version.clone())
        );

        // an upgrade status change is written
        let r = Reported {
            upgrade: Some(fixtures::upgrade_status()),
            ..base.clone()
        };
        assert!(device_status(Some(&first), &r, hb.at).is_some());

        // a workload report is summarized; a new measurement time alone writes nothing
        let mut ws = fixtures::workload_status();
        let r = Reported {
            workloads: Some(ws.clone()),
            ..base.clone()
        };
        let with = device_status(Some(&first), &r, hb.at).expect("workloads summarized");
        assert_eq!(with.workloads.as_ref().map(|w| w.running), Some(1));
        ws.at = ws.at.plus(Duration::from_secs(10));
        let r = Reported {
            workloads: Some(ws),
            ..base.clone()
        };
        assert_eq!(device_status(Some(&with), &r, hb.at), None);

        // an upgrade preparing since t(0): not stalled within 9 min + 1 min slack; stalled after, with its phase
        // and since when, and that stays put (no write per pass) while it lasts
        let preparing = fixtures::upgrade_status();
        let since = preparing.phase_changed_at;
        let r = Reported {
            upgrade: Some(preparing),
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
                since: since.to_string()
            })
        );
        assert_eq!(device_status(Some(&stuck), &r, at(3600)), None);

        // nothing reported at all: an empty status, written once
        let empty = device_status(None, &Reported::default(), hb.at);
        assert_eq!(empty, None);
    }
}
