//! Which device holds a reboot slot. FleetLock knows a holder only by the id its client sends (`fleet-reboot`
//! sends a hash of the machine id, `fleet_wire::fleetlock::client_id`) and a hostname it chose itself. The agent
//! reports the same id as `rebootClientId` in its device info, which only that device can write (fleet-auth gives
//! each device its own `device-info/<device>` key), so a holder id names a device when exactly one device's own
//! report claims it. An id no device reports is shown as an unknown holder, and an id that two or more devices
//! report (one copied another's from `/v1/status`) names none of them: the page never picks one.

use super::alerts::{Alert, Subject};
use super::state::{FleetLockView, State};
use crate::crd::{Device, DeviceGroup};
use crate::fleet::placement::{resolve_group, Labels};
use crate::kv::Mirror;
use fleet_wire::{DeviceId, DeviceInfo};
use kube::runtime::reflector;
use std::collections::{BTreeMap, BTreeSet};

/// Most devices named for an id that several devices claim.
const MAX_CLAIMANTS: usize = 3;
/// Most DeviceGroups named for one holder.
pub const MAX_GROUPS: usize = 8;

/// What a holder id is, as far as the operator knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HolderDevice {
    /// Exactly one device reports the id: the device and the DeviceGroups that select it (sorted, the first
    /// [`MAX_GROUPS`]).
    Device {
        /// The device.
        id: DeviceId,
        /// The DeviceGroups that select it, by name.
        groups: Vec<String>,
    },
    /// No device reports the id.
    Unknown,
    /// Several devices report the id (the first [`MAX_CLAIMANTS`] of them, and how many in all): none is named.
    Contested(Vec<DeviceId>, usize),
}

/// The devices of a set of holder ids.
#[derive(Debug, Clone, Default)]
pub struct Holders {
    by_id: BTreeMap<String, HolderDevice>,
}

impl Holders {
    /// Looks up each of `ids` in the device-info mirror (one pass over it) and the groups of the devices found.
    pub fn resolve<'a>(
        ids: impl IntoIterator<Item = &'a str>,
        info: &Mirror<DeviceInfo>,
        devices: &reflector::Store<Device>,
        groups: &reflector::Store<DeviceGroup>,
    ) -> Self {
        let wanted: BTreeSet<&str> = ids.into_iter().collect();
        // The mirror's key is the device fleet-auth let write it; a value naming another device is not believed.
        let claims = info.collect(|i, _| {
            i.reboot_client_id
                .as_ref()
                .map(|r| (r.as_str().to_owned(), i.device_id.clone()))
        });
        let mut claimants: BTreeMap<&str, Vec<DeviceId>> = BTreeMap::new();
        for (key, claim) in &claims {
            let Some((rid, dev)) = claim else { continue };
            if dev.as_str() != key {
                continue;
            }
            if let Some(w) = wanted.get(rid.as_str()) {
                claimants.entry(w).or_default().push(dev.clone());
            }
        }
        let found: BTreeMap<DeviceId, Labels> = claimants
            .values()
            .filter(|c| c.len() == 1)
            .flatten()
            .map(|d| {
                let labels = devices
                    .get(&reflector::ObjectRef::new(d.as_str()))
                    .and_then(|o| o.metadata.labels.clone())
                    .unwrap_or_default();
                (d.clone(), labels.into_iter().collect())
            })
            .collect();
        let mut member_of: BTreeMap<DeviceId, Vec<String>> = BTreeMap::new();
        for g in groups.state() {
            let name = g.metadata.name.as_deref().unwrap_or_default();
            // A group that cannot be resolved shows on its own page; here it names no member.
            if let Ok(members) = resolve_group(name, &g.spec, &found) {
                for m in members {
                    member_of.entry(m).or_default().push(name.to_owned());
                }
            }
        }
        let by_id = wanted
            .into_iter()
            .map(|w| {
                let d = match claimants.remove(w) {
                    None => HolderDevice::Unknown,
                    Some(mut c) if c.len() == 1 => {
                        let id = c.remove(0);
                        let mut groups = member_of.get(&id).cloned().unwrap_or_default();
                        groups.sort();
                        groups.truncate(MAX_GROUPS);
                        HolderDevice::Device { id, groups }
                    }
                    Some(c) => {
                        let n = c.len();
                        HolderDevice::Contested(c.into_iter().take(MAX_CLAIMANTS).collect(), n)
                    }
                };
                (w.to_owned(), d)
            })
            .collect();
        Self { by_id }
    }

    /// The holders of the status in `view` (its current holders and its recent events' holders), resolved with
    /// `state`'s device-info mirror and caches.
    pub fn of_view(view: Option<&FleetLockView>, state: &State) -> Self {
        let Some(Ok(s)) = view.map(|v| &v.status) else {
            return Self::default();
        };
        let current = s.groups.iter().flat_map(|g| &g.holders);
        let ids = current
            .chain(s.recent.iter().map(|e| &e.holder))
            .map(|h| h.id.as_str());
        Self::resolve(ids, &state.info, &state.devices, &state.groups)
    }

    /// What `id` is (unknown when it was not resolved).
    pub fn get(&self, id: &str) -> &HolderDevice {
        self.by_id.get(id).unwrap_or(&HolderDevice::Unknown)
    }

    /// What the operator knows of holder `id`, for an alert's detail: `device <id>`, or why it names none.
    pub fn said(&self, id: &str) -> String {
        match self.get(id) {
            HolderDevice::Device { id, .. } => format!("device {id}"),
            HolderDevice::Unknown => "no device reports this id".into(),
            HolderDevice::Contested(_, n) => format!("{n} devices report this id"),
        }
    }

    /// A short name for `id` in a chart label: the device id, or `unknown holder <id>`.
    pub fn label(&self, id: &str) -> String {
        match self.get(id) {
            HolderDevice::Device { id, .. } => id.as_str().to_owned(),
            HolderDevice::Unknown => format!("unknown holder {id}"),
            HolderDevice::Contested(_, n) => {
                format!("unknown holder {id} (reported by {n} devices)")
            }
        }
    }
}

/// Adds to each `FleetLockSlotHeldTooLong` alert's detail the device that holds the slot (or that none is known), so
/// its page and Kubernetes event say which device to check. The subject stays the FleetLock id: a device info that
/// changes while the slot is held starts no second alert.
pub fn name_in_alerts(alerts: &mut [Alert], view: Option<&FleetLockView>, state: &State) {
    if !alerts
        .iter()
        .any(|a| matches!(a.subject, Subject::Holder { .. }))
    {
        return;
    }
    let names = Holders::of_view(view, state);
    for a in alerts {
        if let Subject::Holder { id, .. } = &a.subject {
            let said = names.said(id);
            a.detail.push_str("; ");
            a.detail.push_str(&said);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_wire::{fixtures, Id128};
    use serde_json::json;

    fn store<K>(objs: Vec<serde_json::Value>) -> reflector::Store<K>
    where
        K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned,
    {
        let (reader, mut writer) = reflector::store::<K>();
        for o in objs {
            let k: K = serde_json::from_value(o).expect("object");
            writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(k));
        }
        reader
    }

    fn info(device: &str, rid: Option<&str>) -> DeviceInfo {
        let mut i = fixtures::device_info();
        i.device_id = DeviceId::try_from(device).expect("id");
        i.reboot_client_id = rid.map(|r| Id128::try_from(r.to_owned()).expect("id128"));
        i
    }

    const A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
    const C: &str = "cccccccccccccccccccccccccccccccc";

    #[test]
    fn a_holder_is_the_one_device_that_reports_its_id() {
        let mirror = Mirror::<DeviceInfo>::new(fleet_wire::kv::DEVICE_INFO);
        mirror.record("pi-1", 1, Some(info("pi-1", Some(A))));
        // Two devices report B: neither is named.
        mirror.record("pi-2", 2, Some(info("pi-2", Some(B))));
        mirror.record("pi-3", 3, Some(info("pi-3", Some(B))));
        // A value under pi-4's key that names pi-1 is not believed.
        mirror.record("pi-4", 4, Some(info("pi-1", Some(C))));
        let devices = store::<Device>(vec![json!({
            "apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "Device",
            "metadata": {"name": "pi-1", "labels": {"site": "lab"}}, "spec": {}
        })]);
        let groups = store::<DeviceGroup>(vec![
            json!({"apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "DeviceGroup",
                   "metadata": {"name": "lab"}, "spec": {"selector": {"matchLabels": {"site": "lab"}}}}),
            json!({"apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "DeviceGroup",
                   "metadata": {"name": "other"}, "spec": {"devices": ["pi-9"]}}),
            json!({"apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "DeviceGroup",
                   "metadata": {"name": "all"}, "spec": {"selectAll": true}}),
        ]);
        let h = Holders::resolve([A, B, C, "pi-1"], &mirror, &devices, &groups);
        assert_eq!(
            h.get(A),
            &HolderDevice::Device {
                id: DeviceId::try_from("pi-1").expect("id"),
                groups: vec!["all".into(), "lab".into()],
            }
        );
        assert!(matches!(h.get(B), HolderDevice::Contested(c, 2) if c.len() == 2));
        assert_eq!(h.get(C), &HolderDevice::Unknown);
        // A holder id that is a device's name is no claim of that device.
        assert_eq!(h.get("pi-1"), &HolderDevice::Unknown);
        assert_eq!(h.label(A), "pi-1");
        assert_eq!(h.label(C), format!("unknown holder {C}"));
        assert_eq!(
            h.label(B),
            format!("unknown holder {B} (reported by 2 devices)")
        );
        assert_eq!(
            (h.said(A), h.said(B), h.said(C)),
            (
                "device pi-1".to_owned(),
                "2 devices report this id".to_owned(),
                "no device reports this id".to_owned()
            )
        );
    }
}
