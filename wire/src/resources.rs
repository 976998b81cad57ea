//! What a workload may use of its device: resource limits (memory, CPU, PIDs) and hardware and privileges (device
//! nodes, supplementary groups, added capabilities, privileged mode). Limits are the workload's own; hardware and
//! privileges are allowed only where a cluster-scoped `WorkloadPolicy` permits them (checked by the operator and
//! its admission webhook, docs/crds.md), and host paths as volumes likewise.

use crate::error::shown;
use serde::{Deserialize, Serialize};

/// Smallest memory limit: below it a container's runtime itself does not start.
pub const MIN_MEMORY_MIB: u32 = 6;
/// Largest memory limit.
pub const MAX_MEMORY_MIB: u32 = 1024 * 1024;
/// CPU limit bounds, in thousandths of a CPU.
pub const CPU_MILLIS: std::ops::RangeInclusive<u32> = 10..=256_000;
/// PID limit bounds.
pub const PIDS: std::ops::RangeInclusive<u32> = 8..=1_000_000;
/// Most device nodes, groups or capabilities one workload may name (each).
pub const MAX_HARDWARE_ITEMS: usize = 32;

/// The Linux capabilities a workload may add (`capabilities`), by the names Podman takes (without `CAP_`).
pub const CAPABILITIES: &[&str] = &[
    "AUDIT_CONTROL",
    "AUDIT_READ",
    "AUDIT_WRITE",
    "BLOCK_SUSPEND",
    "BPF",
    "CHECKPOINT_RESTORE",
    "CHOWN",
    "DAC_OVERRIDE",
    "DAC_READ_SEARCH",
    "FOWNER",
    "FSETID",
    "IPC_LOCK",
    "IPC_OWNER",
    "KILL",
    "LEASE",
    "LINUX_IMMUTABLE",
    "MAC_ADMIN",
    "MAC_OVERRIDE",
    "MKNOD",
    "NET_ADMIN",
    "NET_BIND_SERVICE",
    "NET_BROADCAST",
    "NET_RAW",
    "PERFMON",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYSLOG",
    "SYS_ADMIN",
    "SYS_BOOT",
    "SYS_CHROOT",
    "SYS_MODULE",
    "SYS_NICE",
    "SYS_PACCT",
    "SYS_PTRACE",
    "SYS_RAWIO",
    "SYS_RESOURCE",
    "SYS_TIME",
    "SYS_TTY_CONFIG",
    "WAKE_ALARM",
];

/// A workload's resource limits; each absent one is Podman's default (none for memory and CPU). docs/crds.md
/// gives the sizing for a 1 GiB device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Resources {
    /// Hard memory limit in MiB (swap included): above it the kernel kills the container (`oom-killed`).
    #[serde(default, rename = "memoryMiB", skip_serializing_if = "Option::is_none")]
    pub memory_mib: Option<u32>,
    /// CPU quota in thousandths of a CPU (500 = half a CPU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_millis: Option<u32>,
    /// Most processes and threads at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids: Option<u32>,
}

impl Resources {
    /// Checks the bounds; `Err` names the field.
    pub fn check(&self) -> Result<(), String> {
        if let Some(m) = self.memory_mib {
            if !(MIN_MEMORY_MIB..=MAX_MEMORY_MIB).contains(&m) {
                return Err(format!(
                    "memoryMiB: {m} is outside {MIN_MEMORY_MIB}–{MAX_MEMORY_MIB}"
                ));
            }
        }
        if let Some(c) = self.cpu_millis {
            if !CPU_MILLIS.contains(&c) {
                return Err(format!(
                    "cpuMillis: {c} is outside {}–{}",
                    CPU_MILLIS.start(),
                    CPU_MILLIS.end()
                ));
            }
        }
        if let Some(p) = self.pids {
            if !PIDS.contains(&p) {
                return Err(format!(
                    "pids: {p} is outside {}–{}",
                    PIDS.start(),
                    PIDS.end()
                ));
            }
        }
        Ok(())
    }
}

/// A host device node given to a container at the same path: `/dev/…`, clean, no `..`.
pub fn check_device(path: &str) -> Result<(), String> {
    let ok = path.starts_with("/dev/")
        && path.len() > 5
        && path.len() <= 255
        && !path.split('/').any(|c| c == ".." || c == ".")
        && !path.ends_with('/')
        && path
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/_.:-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "device {} must be a path under /dev/ (letters, digits, '/', '_', '.', ':', '-')",
            shown(path)
        ))
    }
}

/// A supplementary group: a group name of the device (`[a-z_][a-z0-9_-]*`, at most 32) or a numeric gid.
pub fn check_group(g: &str) -> Result<(), String> {
    let numeric = !g.is_empty() && g.len() <= 10 && g.bytes().all(|b| b.is_ascii_digit());
    let name = g
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_lowercase() || b == b'_')
        && g.len() <= 32
        && g.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_-".contains(&b));
    if numeric || name {
        Ok(())
    } else {
        Err(format!("group {} is not a group name or gid", shown(g)))
    }
}

/// An added capability: one of [`CAPABILITIES`].
pub fn check_capability(c: &str) -> Result<(), String> {
    if CAPABILITIES.contains(&c) {
        Ok(())
    } else if c
        .strip_prefix("CAP_")
        .is_some_and(|s| CAPABILITIES.contains(&s))
    {
        Err(format!(
            "capability {} is written without CAP_ (e.g. NET_ADMIN)",
            shown(c)
        ))
    } else {
        Err(format!("capability {} is not a Linux capability", shown(c)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_and_names() {
        assert!(Resources::default().check().is_ok());
        let r = Resources {
            memory_mib: Some(32),
            cpu_millis: Some(500),
            pids: Some(64),
        };
        assert!(r.check().is_ok());
        for (r, frag) in [
            (
                Resources {
                    memory_mib: Some(1),
                    ..Default::default()
                },
                "memoryMiB",
            ),
            (
                Resources {
                    cpu_millis: Some(0),
                    ..Default::default()
                },
                "cpuMillis",
            ),
            (
                Resources {
                    pids: Some(1),
                    ..Default::default()
                },
                "pids",
            ),
        ] {
            assert!(r.check().unwrap_err().contains(frag), "{frag}");
        }
        assert!(check_device("/dev/ttyS0").is_ok());
        assert!(check_device("/dev/serial/by-id/usb-FTDI_1-if00").is_ok());
        for bad in [
            "/dev/",
            "/dev/../etc/shadow",
            "/etc/shadow",
            "/dev/a b",
            "dev/x",
        ] {
            assert!(check_device(bad).is_err(), "{bad}");
        }
        assert!(check_group("dialout").is_ok() && check_group("20").is_ok());
        assert!(check_group("Dial Out").is_err());
        assert!(check_capability("NET_ADMIN").is_ok());
        assert!(check_capability("CAP_NET_ADMIN")
            .unwrap_err()
            .contains("without CAP_"));
        assert!(check_capability("ALL").is_err());
    }
}
