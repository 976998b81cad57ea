//! A pass's Devices: the ones to create for devices that reported, and the status each one mirrors.

use super::*;

/// Devices: create the ones that reported, mirror what they report.
pub(super) fn devices_to_write(s: &Snapshot, fleet: &Fleet, now: Timestamp, plan: &mut Plan) {
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
