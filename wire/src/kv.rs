//! NATS JetStream KV layout: bucket names, who writes them, and key builders. `docs/kv-layout.md` is checked
//! against [`BUCKETS`] by a test.

use crate::{AttemptId, DeviceId, ValidationError};
use std::time::Duration;

/// Device information, key `<device-id>`; written by the agent.
pub const DEVICE_INFO: &str = "device-info";
/// Heartbeats, key `<device-id>`; written by the agent.
pub const DEVICE_HEARTBEAT: &str = "device-heartbeat";
/// Disk, memory and load ([`crate::usage::DeviceUsage`]), key `<device-id>`; written by the agent at start and
/// when they changed enough.
pub const DEVICE_USAGE: &str = "device-usage";
/// Desired Podman workloads, key `<device-id>`; written by the operator.
pub const DESIRED_STATE: &str = "device-desired-state";
/// Registry credentials and secret values per device ([`crate::DeviceSecrets`]), written by the operator.
pub const DEVICE_SECRETS: &str = "device-secrets";
/// Workload status, key `<device-id>`; written by the agent.
pub const WORKLOAD_STATUS: &str = "device-workload-status";
/// Agent-upgrade intent (`AgentUpgradeAttempt`), key `<device-id>`; CAS-written by the operator.
pub const AGENT_UPGRADE_INTENT: &str = "agent-upgrade-intent";
/// Agent-upgrade status, key `<device-id>`; written by the agent from the updater's journal.
pub const AGENT_UPGRADE_STATUS: &str = "agent-upgrade-status";
/// System-upgrade intent, key `<device-id>.<run-uid>`; written by the operator, removed when terminal.
pub const SYSTEM_UPGRADE_INTENT: &str = "system-upgrade-intent";
/// System-upgrade status, key `<device-id>.<run-uid>`; written by the agent; kept for bounded diagnostics.
pub const SYSTEM_UPGRADE_STATUS: &str = "system-upgrade-status";
/// Diagnostics requests ([`crate::diagnostics::DiagnosticsRequest`]), key `<device-id>.<request-uid>`; written
/// by the operator, removed once answered or withdrawn.
pub const DIAGNOSTICS_REQUEST: &str = "diagnostics-request";
/// Diagnostics bundles ([`crate::diagnostics::DiagnosticsBundle`]), key `<device-id>.<request-uid>`; written by
/// the agent for a request it was given; kept a day (the operator copies each into its `DeviceDiagnostics`).
pub const DIAGNOSTICS_BUNDLE: &str = "diagnostics-bundle";
/// Frozen task-run target plans, key `<run-uid>`; created atomically by the operator.
pub const TASK_PLANS: &str = "task-plans";
/// FleetLock holders for the HA store, key `<group>`; written by fleetlock-server replicas with CAS.
pub const FLEETLOCK: &str = "fleetlock";
/// Tombstones of retired devices ([`crate::device::DeviceRetirement`]), key `<device-id>`; written by the operator
/// before it deletes the device's keys in every per-device bucket ([`per_device_buckets`]), removed only by an
/// explicit enrolment (docs/device-lifecycle.md). fleet-auth refuses a device that has one.
pub const DEVICE_RETIRED: &str = "device-retired";

/// How a bucket's keys are formed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyShape {
    /// `<device-id>`
    Device,
    /// `<device-id>.<run-uid>`
    DeviceRun,
    /// `<run-uid>`
    Run,
    /// `<group>` (FleetLock group name)
    Group,
    /// `<device-id>` of a retired device: the tombstone bucket ([`DEVICE_RETIRED`]). Keyed like [`Self::Device`]
    /// but not a bucket of the device's own keys: closed to devices, and never cleared when a device is retired
    /// ([`per_device_buckets`]).
    Tombstone,
}

impl KeyShape {
    /// The pattern as written in the docs.
    pub fn pattern(self) -> &'static str {
        match self {
            Self::Device => "<device-id>",
            Self::DeviceRun => "<device-id>.<run-uid>",
            Self::Run => "<run-uid>",
            Self::Group => "<group>",
            Self::Tombstone => "<device-id>",
        }
    }
}

/// One bucket of the layout and its settings. Buckets are file-backed and keep one value per key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketSpec {
    /// Bucket name.
    pub name: &'static str,
    /// Key shape.
    pub key: KeyShape,
    /// Who writes it.
    pub writer: &'static str,
    /// Largest value in bytes.
    pub max_value_bytes: i32,
    /// Values older than this are removed by JetStream (`None`: kept).
    pub max_age: Option<Duration>,
    /// The bucket's share per device of the fleet, in bytes: its byte limit is this times the fleet size the
    /// buckets are made for ([`max_bytes`]). For a bucket a device writes it covers every key that device may
    /// write at its largest value.
    pub bytes_per_device: u64,
    /// Whether JetStream honours `Nats-Rollup` headers (a purge of a key or of the whole bucket in one message).
    /// Off everywhere but in the task plans, which only the operator writes: a rollup names no key, so a
    /// `Nats-Rollup: all` on one's own key would erase every key (docs/kv-layout.md).
    pub allow_rollup: bool,
}

const KIB: i32 = 1024;
const MIB: i32 = 1024 * 1024;

/// The fleet size buckets are made for unless `fleet-operator --fleet-size` says otherwise: their byte limits
/// are [`BucketSpec::bytes_per_device`] times it.
pub const DEFAULT_FLEET_SIZE: u64 = 10_000;

/// Keys `<device-id>.<run-uid>` a device holds at most in a bucket that keeps runs, for sizing: the runs of 30 to
/// 90 days (intents are removed when terminal; statuses age out after 90 days).
pub const RUNS_PER_DEVICE: u64 = 16;

/// Per-message overhead JetStream stores beside a value (subject, headers, sequence, time), for sizing.
const MESSAGE_OVERHEAD: u64 = 256;

/// A bucket's byte limit for a fleet of `fleet_size` devices (at least 8 MiB). JetStream reserves it on the
/// server's storage when the bucket is made, so the sum over the layout (about 3 GB at the default fleet size)
/// must fit the server's `max_file_store` (75 % of the free disk unless configured).
pub fn max_bytes(spec: &BucketSpec, fleet_size: u64) -> i64 {
    let bytes = spec
        .bytes_per_device
        .saturating_mul(fleet_size)
        .max(8 << 20);
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

/// The share of a bucket keyed by device with `keys` keys per device at most `value` bytes each.
const fn share(keys: u64, value: i32) -> u64 {
    keys * (value as u64 + MESSAGE_OVERHEAD)
}

/// The whole layout. The operator creates these buckets; agents only open them.
pub const BUCKETS: &[BucketSpec] = &[
    BucketSpec {
        name: DEVICE_INFO,
        key: KeyShape::Device,
        writer: "agent",
        max_value_bytes: 8 * KIB,
        max_age: None,
        bytes_per_device: share(1, 8 * KIB),
        allow_rollup: false,
    },
    BucketSpec {
        name: DEVICE_HEARTBEAT,
        key: KeyShape::Device,
        writer: "agent",
        max_value_bytes: KIB,
        max_age: None,
        bytes_per_device: share(1, KIB),
        allow_rollup: false,
    },
    BucketSpec {
        name: DEVICE_USAGE,
        key: KeyShape::Device,
        writer: "agent",
        max_value_bytes: 2 * KIB,
        max_age: None,
        bytes_per_device: share(1, 2 * KIB),
        allow_rollup: false,
    },
    BucketSpec {
        name: DESIRED_STATE,
        key: KeyShape::Device,
        writer: "operator",
        max_value_bytes: MIB,
        max_age: None,
        bytes_per_device: 16 * 1024,
        allow_rollup: false,
    },
    BucketSpec {
        name: DEVICE_SECRETS,
        key: KeyShape::Device,
        writer: "operator",
        max_value_bytes: crate::secrets::MAX_DEVICE_SECRETS_BYTES as i32,
        max_age: None,
        bytes_per_device: 16 * 1024,
        allow_rollup: false,
    },
    BucketSpec {
        name: WORKLOAD_STATUS,
        key: KeyShape::Device,
        writer: "agent",
        max_value_bytes: 96 * KIB,
        max_age: None,
        bytes_per_device: share(1, 96 * KIB),
        allow_rollup: false,
    },
    BucketSpec {
        name: AGENT_UPGRADE_INTENT,
        key: KeyShape::Device,
        writer: "operator (CAS)",
        max_value_bytes: 16 * KIB,
        max_age: None,
        bytes_per_device: 4 * 1024,
        allow_rollup: false,
    },
    BucketSpec {
        name: AGENT_UPGRADE_STATUS,
        key: KeyShape::Device,
        writer: "agent",
        max_value_bytes: 8 * KIB,
        max_age: None,
        bytes_per_device: share(1, 8 * KIB),
        allow_rollup: false,
    },
    BucketSpec {
        name: SYSTEM_UPGRADE_INTENT,
        key: KeyShape::DeviceRun,
        writer: "operator",
        max_value_bytes: KIB,
        max_age: Some(Duration::from_secs(30 * 24 * 3600)),
        bytes_per_device: share(RUNS_PER_DEVICE, KIB),
        allow_rollup: false,
    },
    BucketSpec {
        name: SYSTEM_UPGRADE_STATUS,
        key: KeyShape::DeviceRun,
        writer: "agent",
        max_value_bytes: 8 * KIB,
        max_age: Some(Duration::from_secs(90 * 24 * 3600)),
        bytes_per_device: share(RUNS_PER_DEVICE, 8 * KIB),
        allow_rollup: false,
    },
    BucketSpec {
        name: DIAGNOSTICS_REQUEST,
        key: KeyShape::DeviceRun,
        writer: "operator",
        max_value_bytes: crate::diagnostics::MAX_REQUEST_BYTES as i32,
        max_age: Some(Duration::from_secs(7 * 24 * 3600)),
        // Only open requests are written (at most diagnostics::max_open_requests at once): the 8 MiB floor.
        bytes_per_device: 512,
        allow_rollup: false,
    },
    BucketSpec {
        name: DIAGNOSTICS_BUNDLE,
        key: KeyShape::DeviceRun,
        writer: "agent",
        max_value_bytes: crate::diagnostics::MAX_BUNDLE_BYTES as i32,
        max_age: Some(Duration::from_secs(24 * 3600)),
        // Bundles are rare and short-lived: the share is a 32nd of one bundle per device, about 300 bundles of
        // the largest size at the default fleet size; the operator opens at most that many requests at once
        // (diagnostics::max_open_requests) and deletes each bundle once it has copied it.
        bytes_per_device: (crate::diagnostics::MAX_BUNDLE_BYTES / 32) as u64,
        allow_rollup: false,
    },
    BucketSpec {
        name: TASK_PLANS,
        key: KeyShape::Run,
        writer: "operator",
        max_value_bytes: MIB,
        max_age: Some(Duration::from_secs(90 * 24 * 3600)),
        bytes_per_device: 4 * 1024,
        allow_rollup: true,
    },
    BucketSpec {
        name: FLEETLOCK,
        key: KeyShape::Group,
        writer: "fleetlock-server (CAS)",
        max_value_bytes: 64 * KIB,
        max_age: None,
        bytes_per_device: 4 * 1024,
        allow_rollup: true,
    },
    BucketSpec {
        name: DEVICE_RETIRED,
        key: KeyShape::Tombstone,
        writer: "operator",
        max_value_bytes: KIB,
        max_age: None,
        // Tombstones are kept until an enrolment lifts them: room for two retirements per device of the fleet.
        bytes_per_device: share(2, 256),
        allow_rollup: false,
    },
];

/// The buckets that hold a device's own keys (`<device-id>` or `<device-id>.<run-uid>`): every one is cleared when
/// the device is retired. Read from [`BUCKETS`] by key shape, so a bucket added to the layout is covered without
/// a change here; the tombstone bucket ([`DEVICE_RETIRED`]) is not one of them.
pub fn per_device_buckets() -> impl Iterator<Item = &'static BucketSpec> {
    BUCKETS
        .iter()
        .filter(|b| matches!(b.key, KeyShape::Device | KeyShape::DeviceRun))
}

/// Buckets the agent must be able to open before it is ready. Not [`DEVICE_USAGE`]: an agent newer than its
/// operator (or than its nats-server's configuration) must start without it.
pub const AGENT_REQUIRED_BUCKETS: &[&str] = &[
    DEVICE_INFO,
    DEVICE_HEARTBEAT,
    DESIRED_STATE,
    WORKLOAD_STATUS,
    AGENT_UPGRADE_INTENT,
    AGENT_UPGRADE_STATUS,
    SYSTEM_UPGRADE_INTENT,
    SYSTEM_UPGRADE_STATUS,
];

/// The spec of bucket `name`, if it is part of the layout.
pub fn bucket(name: &str) -> Option<&'static BucketSpec> {
    BUCKETS.iter().find(|b| b.name == name)
}

/// Key `<device-id>`.
pub fn device_key(device: &DeviceId) -> String {
    device.as_str().to_owned()
}

/// Key `<device-id>.<run-uid>`.
pub fn run_key(device: &DeviceId, run: &AttemptId) -> String {
    format!("{device}.{run}")
}

/// The KV watch filter for every run key of one device: `<device-id>.>`.
pub fn device_runs_filter(device: &DeviceId) -> String {
    format!("{device}.>")
}

/// Splits a `<device-id>.<run-uid>` key, validating both parts.
pub fn parse_run_key(key: &str) -> Result<(DeviceId, AttemptId), ValidationError> {
    let (d, r) = key.split_once('.').ok_or_else(|| {
        ValidationError::new("run key", format!("{key:?} is not <device-id>.<run-uid>"))
    })?;
    Ok((DeviceId::try_from(d)?, AttemptId::try_from(r)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_names_are_valid_and_unique() {
        let mut names: Vec<&str> = BUCKETS.iter().map(|b| b.name).collect();
        assert!(names.iter().all(|n| n
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')));
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), BUCKETS.len());
        assert!(AGENT_REQUIRED_BUCKETS.iter().all(|n| bucket(n).is_some()));
    }

    #[test]
    fn retirement_clears_every_per_device_bucket_but_the_tombstones() {
        let cleared: Vec<&str> = per_device_buckets().map(|b| b.name).collect();
        assert!(!cleared.contains(&DEVICE_RETIRED));
        for b in BUCKETS {
            let keyed_by_device = b.key.pattern().starts_with("<device-id>");
            assert_eq!(
                cleared.contains(&b.name),
                keyed_by_device && b.name != DEVICE_RETIRED,
                "{}",
                b.name
            );
        }
        assert!(cleared.contains(&DEVICE_HEARTBEAT) && cleared.contains(&DIAGNOSTICS_BUNDLE));
    }

    #[test]
    fn run_keys_round_trip() {
        let d = DeviceId::try_from("device-1").expect("id");
        let r = AttemptId::new_random();
        let k = run_key(&d, &r);
        assert_eq!(parse_run_key(&k), Ok((d.clone(), r)));
        assert_eq!(device_runs_filter(&d), "device-1.>");
        assert!(parse_run_key("device-1").is_err());
        assert!(parse_run_key("a.b.c").is_err());
    }
}
