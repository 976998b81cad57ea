//! The capability gate of a deployment's workloads, pure: a spec with any field of
//! [`WorkloadSpec::v2_fields`] (resources, secrets, devices, groups, capabilities, privileged) is given only to a
//! device whose agent advertises [`Capability::WorkloadSpecV2`]. An older agent refuses such a desired state
//! whole (`deny_unknown_fields`), so giving it one would stop every workload update of that device; instead the
//! device keeps what it has, and is reported: on the deployment's `Ready` message, and in a staged rollout as a
//! failed device (a canary halts the rollout, the rest count against `maxFailures`), which a person sees and acts
//! on by upgrading the agent (an AgentRelease).

use fleet_wire::{Capability, DeviceId, DeviceInfo, WorkloadSpec};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// The v2 fields `workloads` use, in the order fleet-wire names them, each once.
pub fn fields(workloads: &[WorkloadSpec]) -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for f in workloads.iter().flat_map(WorkloadSpec::v2_fields) {
        if !out.contains(&f) {
            out.push(f);
        }
    }
    out
}

/// The targeted devices that cannot be given `workloads`, each with its agent's version (`None`: it has not
/// reported its device info); empty when the workloads use no v2 field.
pub fn incapable(
    workloads: &[WorkloadSpec],
    targets: &BTreeSet<DeviceId>,
    info: &BTreeMap<String, Arc<DeviceInfo>>,
) -> BTreeMap<DeviceId, Option<String>> {
    if fields(workloads).is_empty() {
        return BTreeMap::new();
    }
    targets
        .iter()
        .filter_map(|d| match info.get(d.as_str()) {
            Some(i) if i.capabilities.contains(&Capability::WorkloadSpecV2) => None,
            Some(i) => Some((d.clone(), Some(i.agent_version.to_string()))),
            None => Some((d.clone(), None)),
        })
        .collect()
}

/// The sentence a deployment's `Ready` message carries for its incapable devices (a few named; the count
/// carries the rest), e.g. `device d3's agent 1.0.0 cannot honour secrets, resources (upgrade its agent); it
/// keeps what it runs`.
pub fn message(
    workloads: &[WorkloadSpec],
    incapable: &BTreeMap<DeviceId, Option<String>>,
    examples: usize,
) -> Option<String> {
    if incapable.is_empty() {
        return None;
    }
    let what = fields(workloads).join(", ");
    let named: Vec<String> = incapable
        .iter()
        .take(examples)
        .map(|(d, v)| match v {
            Some(v) => format!("device {d}'s agent {v}"),
            None => format!("device {d}'s agent (no device info reported)"),
        })
        .collect();
    let more = incapable.len() - named.len();
    let tail = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    let its = if incapable.len() == 1 {
        "its agent; it keeps what it runs"
    } else {
        "their agents; they keep what they run"
    };
    Some(format!(
        "{}{tail} cannot honour {what} (upgrade {its})",
        named.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_wire::fixtures;

    fn info(id: &str, version: &str, caps: &[Capability]) -> (String, Arc<DeviceInfo>) {
        let mut i = fixtures::device_info();
        i.device_id = DeviceId::try_from(id).expect("id");
        i.agent_version = fleet_wire::Version::try_from(version).expect("version");
        i.capabilities = caps.to_vec();
        (id.to_owned(), Arc::new(i))
    }

    #[test]
    fn only_agents_advertising_v2_get_v2_fields() {
        let plain = vec![fixtures::workload("web")];
        let mut limited = fixtures::workload("web");
        limited.capabilities = vec!["NET_ADMIN".into()];
        limited.privileged = true;
        let v2 = vec![limited, fixtures::workload("db")];
        let targets: BTreeSet<DeviceId> = ["new", "old", "silent"]
            .iter()
            .map(|d| DeviceId::try_from(*d).expect("id"))
            .collect();
        let infos = BTreeMap::from([
            info("new", "2.0.0", &[Capability::WorkloadSpecV2]),
            info("old", "1.4.0", &[Capability::AgentUpgradeV1]),
        ]);
        assert!(
            incapable(&plain, &targets, &infos).is_empty(),
            "any agent runs a v1 spec"
        );
        let got = incapable(&v2, &targets, &infos);
        assert_eq!(
            got.iter()
                .map(|(d, v)| (d.as_str(), v.as_deref()))
                .collect::<Vec<_>>(),
            [("old", Some("1.4.0")), ("silent", None)]
        );
        assert_eq!(fields(&v2), ["capabilities", "privileged"]);
        let one: BTreeMap<_, _> = got.clone().into_iter().take(1).collect();
        assert_eq!(
            message(&v2, &one, 5).as_deref(),
            Some("device old's agent 1.4.0 cannot honour capabilities, privileged (upgrade its agent; it keeps what it runs)")
        );
        assert_eq!(
            message(&v2, &got, 1).as_deref(),
            Some("device old's agent 1.4.0 and 1 more cannot honour capabilities, privileged (upgrade their agents; they keep what they run)")
        );
        assert_eq!(message(&v2, &BTreeMap::new(), 5), None);
    }

    /// Through a whole pass, without a rollout section: the capable device gets the spec (and its Secret's value),
    /// the older agent keeps what it runs and is named in `Ready`; a deployment whose Secret is gone fails closed.
    #[test]
    fn a_pass_gives_v2_specs_to_capable_agents_only() {
        use crate::deployments::plan::{plan, Snapshot};
        use crate::deployments::secrets::{SecretData, SecretState};
        use fleet_wire::secrets::Hidden;
        let obj = |kind: &str, name: &str, labels: serde_json::Value, spec: serde_json::Value| {
            serde_json::json!({"apiVersion": "fleet.nationtech.io/v1alpha1", "kind": kind,
                "metadata": {"name": name, "generation": 1, "labels": labels}, "spec": spec})
        };
        let mut s = Snapshot {
            secrets_namespace: "harmony-fleet".into(),
            ..Default::default()
        };
        for d in ["new", "old"] {
            s.devices.push(Arc::new(
                serde_json::from_value(obj(
                    "Device",
                    d,
                    serde_json::json!({}),
                    serde_json::json!({}),
                ))
                .expect("device"),
            ));
        }
        s.groups.push(Arc::new(
            serde_json::from_value(obj(
                "DeviceGroup",
                "all",
                serde_json::json!({}),
                serde_json::json!({"selectAll": true}),
            ))
            .expect("group"),
        ));
        s.deployments.push(Arc::new(
            serde_json::from_value(obj(
                "FleetDeployment",
                "app",
                serde_json::json!({}),
                serde_json::json!({
                "allowedGroups": ["all"],
                "workloads": [{"name": "app", "image": "localhost/app:1",
                    "secrets": [{"secret": "api", "key": "token", "env": "TOKEN"}]}]}),
            ))
            .expect("deployment"),
        ));
        s.info = BTreeMap::from([
            info("new", "2.0.0", &[Capability::WorkloadSpecV2]),
            info("old", "1.0.0", &[]),
        ]);
        s.secrets = BTreeMap::from([(
            "api".to_owned(),
            SecretState::Found(Arc::new(SecretData {
                version: "7".into(),
                type_: "Opaque".into(),
                data: BTreeMap::from([("token".to_owned(), Hidden("dDBrZW4=".into()))]),
            })),
        )]);
        let p = plan(
            &s,
            fleet_wire::Timestamp::now(),
            &mut fleet_wire::AttemptId::new_random,
        );
        let given = |d: &str| p.desired[&DeviceId::try_from(d).expect("id")].len();
        assert_eq!((given("new"), given("old")), (1, 0));
        let ready = &p.deployments[0].wants[0];
        assert!(
            ready.ok && ready.message == "placed on 2 devices; device old's agent 1.0.0 cannot honour secrets (upgrade its agent; it keeps what it runs)",
            "{ready:?}"
        );
        assert_eq!(
            p.device_secrets
                .keys()
                .map(DeviceId::as_str)
                .collect::<Vec<_>>(),
            ["new"]
        );
        // The Secret gone: SecretMissing, and what the devices have is kept (no device-secrets change either).
        s.secrets.insert("api".into(), SecretState::Missing);
        let placed = Arc::new(
            fleet_wire::DesiredState::new(
                DeviceId::try_from("new").expect("id"),
                1,
                p.desired[&DeviceId::try_from("new").expect("id")].to_vec(),
            )
            .expect("state"),
        );
        s.desired = BTreeMap::from([("new".to_owned(), placed.clone())]);
        let p2 = plan(
            &s,
            fleet_wire::Timestamp::now(),
            &mut fleet_wire::AttemptId::new_random,
        );
        let ready = &p2.deployments[0].wants[0];
        assert_eq!(ready.reason, "SecretMissing");
        assert!(
            ready
                .message
                .contains("Secret harmony-fleet/api (workload app secrets[0]) does not exist"),
            "{}",
            ready.message
        );
        assert_eq!(
            p2.desired[&DeviceId::try_from("new").expect("id")][..],
            placed.workloads[..]
        );
        assert!(
            p2.device_secrets.is_empty(),
            "nothing was delivered before, nothing is now"
        );
    }
}
