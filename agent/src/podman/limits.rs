//! What a workload may use of its device, as libpod's `SpecGenerator` says it (Podman 4.3, checked against the
//! real Podman's inspect in agent/tests/podman_limits.rs): resource limits (`resource_limits`, the OCI runtime
//! spec's `LinuxResources`), device nodes, supplementary groups, added capabilities, privileged mode, and the
//! container's OOM score.

use fleet_wire::WorkloadSpec;
use serde_json::{json, Value};

/// Every container's `oom_score_adj`: when the device runs out of memory, the kernel's OOM killer takes a
/// container before the agent and the updater (their units set `OOMScoreAdjust=-900`) and before other
/// processes of the system (0). Rootless Podman may only raise a score above its own, which 500 is.
pub const CONTAINER_OOM_SCORE_ADJ: i32 = 500;
/// The CFS period the CPU quota is given in, in microseconds (the kernel's default).
pub const CPU_PERIOD_US: u64 = 100_000;
/// Bytes in a MiB.
const MIB: u64 = 1024 * 1024;
/// The device's group file: a group named by a workload is the device's group of that name.
pub const GROUP_FILE: &str = "/etc/group";

/// Adds the workload's limits, hardware and privileges to a create body. A group name is looked up in
/// `group_file` (the device's `/etc/group` text) and given to Podman as its gid, because Podman would look a name
/// up in the image's own group file, where a device's `dialout` usually does not exist; a name the device does
/// not have is passed on as it is, and Podman's refusal to start then names it.
pub fn apply(body: &mut Value, spec: &WorkloadSpec, group_file: &str) {
    body["oom_score_adj"] = json!(CONTAINER_OOM_SCORE_ADJ);
    if let Some(r) = &spec.resources {
        let mut limits = serde_json::Map::new();
        if let Some(m) = r.memory_mib {
            let bytes = u64::from(m) * MIB;
            // Swap equal to the limit: memory plus swap may not exceed it, so the limit is a hard one.
            limits.insert("memory".into(), json!({ "limit": bytes, "swap": bytes }));
        }
        if let Some(c) = r.cpu_millis {
            // A thousandth of a CPU is a thousandth of the period.
            let quota = u64::from(c) * CPU_PERIOD_US / 1000;
            limits.insert(
                "cpu".into(),
                json!({ "quota": quota, "period": CPU_PERIOD_US }),
            );
        }
        if let Some(p) = r.pids {
            limits.insert("pids".into(), json!({ "limit": p }));
        }
        if !limits.is_empty() {
            body["resource_limits"] = Value::Object(limits);
        }
    }
    if !spec.devices.is_empty() {
        let devices: Vec<_> = spec.devices.iter().map(|d| json!({ "path": d })).collect();
        body["devices"] = json!(devices);
    }
    if !spec.groups.is_empty() {
        let groups: Vec<String> = spec
            .groups
            .iter()
            .map(|g| gid_of(group_file, g).map_or_else(|| g.clone(), |gid| gid.to_string()))
            .collect();
        body["groups"] = json!(groups);
    }
    if !spec.capabilities.is_empty() {
        body["cap_add"] = json!(spec.capabilities);
    }
    if spec.privileged {
        body["privileged"] = json!(true);
    }
}

/// The gid of `group` (a name or already a number) in group-file text (`name:x:gid:members`); `None` for a name
/// the file lacks.
pub fn gid_of(group_file: &str, group: &str) -> Option<u32> {
    if let Ok(gid) = group.parse() {
        return Some(gid);
    }
    group_file.lines().find_map(|line| {
        let mut f = line.split(':');
        (f.next()? == group).then_some(())?;
        f.nth(1)?.trim().parse().ok()
    })
}

/// The device's group file, empty when it cannot be read (names are then passed on as they are).
pub fn read_group_file() -> String {
    std::fs::read_to_string(GROUP_FILE).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_wire::fixtures;
    use fleet_wire::resources::Resources;

    const GROUPS: &str = "root:x:0:\ndialout:x:20:fleet-agent\nvideo:x:44:\n";

    #[test]
    fn a_plain_workload_gets_only_its_oom_score() {
        let mut b = json!({});
        apply(&mut b, &fixtures::workload("web"), GROUPS);
        assert_eq!(b, json!({ "oom_score_adj": 500 }));
    }

    #[test]
    fn limits_hardware_and_privileges_map_to_the_spec_generator() {
        let mut w = fixtures::workload("web");
        w.resources = Some(Resources {
            memory_mib: Some(32),
            cpu_millis: Some(250),
            pids: Some(64),
        });
        w.devices = vec!["/dev/ttyS0".into()];
        w.groups = vec!["dialout".into(), "1234".into(), "nosuch".into()];
        w.capabilities = vec!["NET_ADMIN".into()];
        w.privileged = true;
        let mut b = json!({});
        apply(&mut b, &w, GROUPS);
        assert_eq!(
            b,
            json!({
                "oom_score_adj": 500,
                "resource_limits": {
                    "memory": { "limit": 33_554_432u64, "swap": 33_554_432u64 },
                    "cpu": { "quota": 25_000, "period": 100_000 },
                    "pids": { "limit": 64 },
                },
                "devices": [{ "path": "/dev/ttyS0" }],
                "groups": ["20", "1234", "nosuch"],
                "cap_add": ["NET_ADMIN"],
                "privileged": true,
            })
        );
        // Only the limits that are set.
        w.resources = Some(Resources {
            pids: Some(8),
            ..Default::default()
        });
        let mut b = json!({});
        apply(&mut b, &w, GROUPS);
        assert_eq!(b["resource_limits"], json!({ "pids": { "limit": 8 } }));
    }

    #[test]
    fn group_names_are_the_devices() {
        assert_eq!(gid_of(GROUPS, "video"), Some(44));
        assert_eq!(gid_of(GROUPS, "dial"), None, "a whole name only");
        assert_eq!(gid_of(GROUPS, "7"), Some(7));
        assert_eq!(gid_of("broken line\n", "broken line"), None);
    }
}
