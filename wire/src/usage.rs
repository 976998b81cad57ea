//! What a device has left: disk, memory and load as the agent measures them (`device-usage/<device>`), and the
//! thresholds the operator alerts and gates rollouts on. Workload limits are [`crate::resources`], not this.
//! Unknown fields and roles are tolerated so that an older operator reads a newer agent.

use crate::{DeviceId, Timestamp, ValidationError};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Filesystems one report may list: the three roles, with room for roles a newer agent adds.
pub const MAX_FILESYSTEMS: usize = 8;

/// A filesystem at or above this used percent ([`FilesystemUsage::used_percent`]) is an alert. At 90 % a
/// typical device filesystem (8–32 GB) has under 1–3 GB left, which one image pull or a day of logs can take.
pub const DISK_ALERT_PERCENT: u8 = 90;

/// Memory pressure alerts when `/proc/pressure/memory` `some avg10` is at least this, in hundredths of a percent
/// (10 %): some task waited for memory one second in ten over the last 10 s, so reclaim already slows the
/// workloads, well before the kernel's OOM killer or systemd-oomd (which acts at 60 % by default) steps in.
pub const MEMORY_PRESSURE_SOME_AVG10_ALERT_CENTI: u32 = 1_000;

/// Memory pressure also alerts when `MemAvailable` is below this percent of `MemTotal` (5 %): on kernels without
/// PSI this is the only sign, and with it the page cache is nearly gone, so the next allocation burst stalls or
/// meets the OOM killer.
pub const MEMORY_AVAILABLE_ALERT_PERCENT: u8 = 5;

/// A staged rollout gives a change only to a device with at least this much free on its `containers` and
/// `agentState` filesystems (256 MiB). A change brings what it needs there: an agent artifact is at most
/// [`crate::limits::ARTIFACT_MAX_BYTES`] (100 MiB; a release agent is about 3 MB) and a workload image pull holds
/// its compressed layers while unpacking them (a device service's image is typically 10–100 MB compressed). 256
/// MiB holds the largest artifact twice (download and installed copy) or a 100 MB image with its unpacked layers,
/// with room left for the state files and logs written meanwhile; below it a change is likely to fail half-way
/// with `no space left on device`.
pub const FREE_SPACE_FLOOR_BYTES: u64 = 256 * 1024 * 1024;

/// The agent publishes its usage at most this often (and at start, and when it changed enough:
/// docs/agent-config.md), so that a change reaches NATS within this plus one measurement interval.
pub const PUBLISH_MIN_INTERVAL: Duration = Duration::from_secs(15);

/// What a filesystem holds for the fleet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum FilesystemRole {
    /// `/`.
    Root,
    /// The agent's state directory.
    AgentState,
    /// Podman's storage of the agent's user (its images and containers).
    Containers,
    /// A role this reader does not know (reported by a newer device).
    #[serde(other)]
    Unknown,
}

impl FilesystemRole {
    /// Whether a staged rollout requires [`FREE_SPACE_FLOOR_BYTES`] free here: the roles a change writes to.
    pub fn needs_floor(self) -> bool {
        matches!(self, Self::AgentState | Self::Containers)
    }
}

/// One filesystem, from `statvfs` of the path of its role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FilesystemUsage {
    /// What it holds.
    pub role: FilesystemRole,
    /// Its size (`f_blocks × f_frsize`), never 0.
    pub size_bytes: u64,
    /// What an unprivileged user may still write (`f_bavail × f_frsize`), at most `size_bytes`.
    pub available_bytes: u64,
}

impl FilesystemUsage {
    /// Percent of the size that is not available to unprivileged users, rounded up (as `df` rounds): blocks
    /// reserved for root count as used, since neither the agent's user nor its containers can write them. 0–100.
    pub fn used_percent(&self) -> u8 {
        if self.size_bytes == 0 {
            return 0;
        }
        let used = u128::from(self.size_bytes.saturating_sub(self.available_bytes));
        let size = u128::from(self.size_bytes);
        u8::try_from((used * 100).div_ceil(size)).unwrap_or(100)
    }

    /// Whether this filesystem is at or above [`DISK_ALERT_PERCENT`].
    pub fn alerting(&self) -> bool {
        self.used_percent() >= DISK_ALERT_PERCENT
    }

    /// Whether a staged rollout must skip the device for this filesystem: a role a change writes to with less
    /// than [`FREE_SPACE_FLOOR_BYTES`] available.
    pub fn below_floor(&self) -> bool {
        self.role.needs_floor() && self.available_bytes < FREE_SPACE_FLOOR_BYTES
    }

    fn check(&self) -> Result<(), ValidationError> {
        if self.size_bytes == 0 {
            return Err(ValidationError::new("filesystem usage", "size 0"));
        }
        if self.available_bytes > self.size_bytes {
            return Err(ValidationError::new(
                "filesystem usage",
                format!(
                    "{} bytes available of {}",
                    self.available_bytes, self.size_bytes
                ),
            ));
        }
        Ok(())
    }
}

/// Memory, from `/proc/meminfo` and `/proc/pressure/memory`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryUsage {
    /// `MemTotal`, never 0.
    pub total_bytes: u64,
    /// `MemAvailable`, at most `total_bytes`.
    pub available_bytes: u64,
    /// `some avg10` of `/proc/pressure/memory` × 100 (0–10,000); absent where the kernel has PSI off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pressure_some_avg10_centi: Option<u32>,
}

impl MemoryUsage {
    /// Whether memory is under pressure: PSI at or above [`MEMORY_PRESSURE_SOME_AVG10_ALERT_CENTI`], or less than
    /// [`MEMORY_AVAILABLE_ALERT_PERCENT`] of it available.
    pub fn under_pressure(&self) -> bool {
        let psi = self
            .pressure_some_avg10_centi
            .is_some_and(|p| p >= MEMORY_PRESSURE_SOME_AVG10_ALERT_CENTI);
        let low = u128::from(self.available_bytes) * 100
            < u128::from(self.total_bytes) * u128::from(MEMORY_AVAILABLE_ALERT_PERCENT);
        psi || low
    }

    fn check(&self) -> Result<(), ValidationError> {
        if self.total_bytes == 0 || self.available_bytes > self.total_bytes {
            return Err(ValidationError::new(
                "memory usage",
                format!(
                    "{} bytes available of {}",
                    self.available_bytes, self.total_bytes
                ),
            ));
        }
        if self.pressure_some_avg10_centi.is_some_and(|p| p > 10_000) {
            return Err(ValidationError::new("memory usage", "pressure above 100 %"));
        }
        Ok(())
    }
}

/// A device's usage, published by the agent (`device-usage/<device>`): at start and when it changed enough.
/// Valid by construction ([`DeviceUsage::new`]) and on deserialization.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RawDeviceUsage", into = "RawDeviceUsage")]
pub struct DeviceUsage {
    device_id: DeviceId,
    measured_at: Timestamp,
    filesystems: Vec<FilesystemUsage>,
    memory: MemoryUsage,
    load_1m_centi: u32,
    cpus: u32,
}

/// The JSON shape.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawDeviceUsage {
    device_id: DeviceId,
    measured_at: Timestamp,
    filesystems: Vec<FilesystemUsage>,
    memory: MemoryUsage,
    #[serde(rename = "load1mCenti")]
    load_1m_centi: u32,
    cpus: u32,
}

impl DeviceUsage {
    /// Checks the parts: at most [`MAX_FILESYSTEMS`] filesystems, each known role at most once (roles on one
    /// filesystem are each listed: readers take the worst), available at most the size, at least one CPU.
    pub fn new(
        device_id: DeviceId,
        measured_at: Timestamp,
        filesystems: Vec<FilesystemUsage>,
        memory: MemoryUsage,
        load_1m_centi: u32,
        cpus: u32,
    ) -> Result<Self, ValidationError> {
        if filesystems.len() > MAX_FILESYSTEMS {
            return Err(ValidationError::new(
                "device usage",
                format!(
                    "{} filesystems (at most {MAX_FILESYSTEMS})",
                    filesystems.len()
                ),
            ));
        }
        for (i, fs) in filesystems.iter().enumerate() {
            fs.check()?;
            if fs.role != FilesystemRole::Unknown
                && filesystems[..i].iter().any(|o| o.role == fs.role)
            {
                return Err(ValidationError::new(
                    "device usage",
                    format!("role {:?} listed twice", fs.role),
                ));
            }
        }
        memory.check()?;
        if cpus == 0 {
            return Err(ValidationError::new("device usage", "0 CPUs"));
        }
        Ok(Self {
            device_id,
            measured_at,
            filesystems,
            memory,
            load_1m_centi,
            cpus,
        })
    }

    /// The device.
    pub fn device_id(&self) -> &DeviceId {
        &self.device_id
    }
    /// When the agent measured this.
    pub fn measured_at(&self) -> Timestamp {
        self.measured_at
    }
    /// The filesystems measured (a role whose measurement failed is absent).
    pub fn filesystems(&self) -> &[FilesystemUsage] {
        &self.filesystems
    }
    /// Memory.
    pub fn memory(&self) -> &MemoryUsage {
        &self.memory
    }
    /// The 1-minute load average × 100 (`/proc/loadavg`).
    pub fn load_1m_centi(&self) -> u32 {
        self.load_1m_centi
    }
    /// Online CPUs.
    pub fn cpus(&self) -> u32 {
        self.cpus
    }

    /// The filesystem of a known role, if it was measured.
    pub fn filesystem(&self, role: FilesystemRole) -> Option<&FilesystemUsage> {
        self.filesystems.iter().find(|f| f.role == role)
    }

    /// The fullest filesystem (highest [`FilesystemUsage::used_percent`]).
    pub fn fullest(&self) -> Option<&FilesystemUsage> {
        self.filesystems.iter().max_by_key(|f| f.used_percent())
    }

    /// The filesystems at or above [`DISK_ALERT_PERCENT`].
    pub fn disk_alerts(&self) -> impl Iterator<Item = &FilesystemUsage> {
        self.filesystems.iter().filter(|f| f.alerting())
    }

    /// The filesystem with the least available below [`FREE_SPACE_FLOOR_BYTES`] among the roles a change writes
    /// to, if any: a staged rollout does not give this device a change.
    pub fn below_floor(&self) -> Option<&FilesystemUsage> {
        self.filesystems
            .iter()
            .filter(|f| f.below_floor())
            .min_by_key(|f| f.available_bytes)
    }
}

impl TryFrom<RawDeviceUsage> for DeviceUsage {
    type Error = ValidationError;
    fn try_from(r: RawDeviceUsage) -> Result<Self, ValidationError> {
        Self::new(
            r.device_id,
            r.measured_at,
            r.filesystems,
            r.memory,
            r.load_1m_centi,
            r.cpus,
        )
    }
}

impl From<DeviceUsage> for RawDeviceUsage {
    fn from(u: DeviceUsage) -> Self {
        Self {
            device_id: u.device_id,
            measured_at: u.measured_at,
            filesystems: u.filesystems,
            memory: u.memory,
            load_1m_centi: u.load_1m_centi,
            cpus: u.cpus,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn fs(role: FilesystemRole, size: u64, available: u64) -> FilesystemUsage {
        FilesystemUsage {
            role,
            size_bytes: size,
            available_bytes: available,
        }
    }

    fn mem(total: u64, available: u64, psi: Option<u32>) -> MemoryUsage {
        MemoryUsage {
            total_bytes: total,
            available_bytes: available,
            pressure_some_avg10_centi: psi,
        }
    }

    fn usage(filesystems: Vec<FilesystemUsage>) -> Result<DeviceUsage, ValidationError> {
        DeviceUsage::new(
            DeviceId::try_from("dev-a").expect("id"),
            Timestamp::from_unix_ms(1),
            filesystems,
            mem(GIB, GIB / 2, None),
            25,
            4,
        )
    }

    #[test]
    fn used_percent_rounds_up_and_counts_reserved_blocks() {
        assert_eq!(fs(FilesystemRole::Root, 100, 100).used_percent(), 0);
        assert_eq!(fs(FilesystemRole::Root, 100, 0).used_percent(), 100);
        assert_eq!(fs(FilesystemRole::Root, 1000, 901).used_percent(), 10);
        assert_eq!(fs(FilesystemRole::Root, 1000, 899).used_percent(), 11);
        assert_eq!(fs(FilesystemRole::Root, u64::MAX, 0).used_percent(), 100);
        assert!(fs(FilesystemRole::Root, 100, 10).alerting());
        assert!(!fs(FilesystemRole::Root, 100, 11).alerting());
    }

    #[test]
    fn the_floor_applies_to_the_roles_a_change_writes() {
        let u = usage(vec![
            fs(FilesystemRole::Root, 10 * GIB, 0),
            fs(FilesystemRole::AgentState, 10 * GIB, FREE_SPACE_FLOOR_BYTES),
            fs(
                FilesystemRole::Containers,
                10 * GIB,
                FREE_SPACE_FLOOR_BYTES - 1,
            ),
        ])
        .expect("valid");
        assert_eq!(
            u.below_floor().map(|f| f.role),
            Some(FilesystemRole::Containers)
        );
        assert_eq!(u.fullest().map(|f| f.role), Some(FilesystemRole::Root));
        assert_eq!(u.disk_alerts().count(), 3);
    }

    #[test]
    fn memory_pressure_by_psi_or_by_what_is_left() {
        assert!(!mem(100, 5, None).under_pressure());
        assert!(mem(100, 4, None).under_pressure());
        assert!(mem(100, 50, Some(1_000)).under_pressure());
        assert!(!mem(100, 50, Some(999)).under_pressure());
    }

    /// Its bucket is written by its own device only (through the device API, which sizes and budgets every write)
    /// and never read back by it: the device may direct-get only the probe key.
    #[test]
    fn the_bucket_is_its_own_devices_write_only() {
        use crate::auth::{device_access, device_permissions, DeviceAccess};
        use crate::device_api::check_put;
        let spec = crate::kv::bucket(crate::kv::DEVICE_USAGE).expect("in the layout");
        assert_eq!(device_access(spec), DeviceAccess::Write);
        assert!(!crate::kv::AGENT_REQUIRED_BUCKETS.contains(&spec.name));
        let p = device_permissions(&DeviceId::try_from("dev-a").expect("id"));
        let usage: Vec<_> = p
            .publish
            .iter()
            .filter(|s| s.contains("device-usage"))
            .collect();
        assert_eq!(
            usage,
            [
                "$JS.API.DIRECT.GET.KV_device-usage.$KV.device-usage.dev-a.probe",
                "$KV.device-usage.dev-a"
            ]
        );
        let put = check_put("$KV.device-usage.dev-a", 2048).expect("at the limit");
        assert_eq!(put.device.as_str(), "dev-a");
        assert!(check_put("$KV.device-usage.dev-a", 2049).is_err());
        assert!(check_put("$KV.device-usage.dev-a.x", 1).is_err());
    }

    #[test]
    fn invalid_reports_are_refused() {
        assert!(usage(vec![fs(FilesystemRole::Root, 0, 0)]).is_err());
        assert!(usage(vec![fs(FilesystemRole::Root, 1, 2)]).is_err());
        assert!(usage(vec![
            fs(FilesystemRole::Root, 1, 1),
            fs(FilesystemRole::Root, 2, 1)
        ])
        .is_err());
        assert!(usage(vec![fs(FilesystemRole::Unknown, 1, 1); MAX_FILESYSTEMS]).is_ok());
        assert!(usage(vec![fs(FilesystemRole::Unknown, 1, 1); MAX_FILESYSTEMS + 1]).is_err());
        let ok = usage(vec![fs(FilesystemRole::Root, 2, 1)]).expect("valid");
        let json = serde_json::to_string(&ok).expect("json");
        for bad in [
            json.replace("\"cpus\":4", "\"cpus\":0"),
            json.replace("\"availableBytes\":1", "\"availableBytes\":3"),
            json.replace(
                "\"availableBytes\":536870912",
                "\"availableBytes\":1073741825",
            ),
        ] {
            assert_ne!(bad, json);
            assert!(serde_json::from_str::<DeviceUsage>(&bad).is_err(), "{bad}");
        }
        // A newer agent's role and field are read, not refused.
        let newer = json
            .replace("\"root\"", "\"data\"")
            .replace("\"cpus\":4", "\"cpus\":4,\"swap\":1");
        let back: DeviceUsage = serde_json::from_str(&newer).expect("newer agent");
        assert_eq!(back.filesystems()[0].role, FilesystemRole::Unknown);
    }
}
