//! The device API that fleet-auth serves between the devices' account and the buckets (docs/auth.md, "Why a
//! device API"): every KV write of a device and every key notice to a device go through it, so that no header,
//! reply subject, size or key count a device chooses reaches another device. Subjects, the watch registration, the
//! checks a write must pass, and the per-device write budget. Pure: no I/O.
//!
//! - **Writes**: a device publishes to its key's own subject (`$KV.<bucket>.<device>[.<run>]`) as before; in the
//!   devices' account that subject is a service of the device API's account, not of JetStream. fleet-auth checks
//!   it ([`check_put`], [`WriteBudget`]), writes only the value (no header of the device's) and answers with
//!   JetStream's acknowledgement.
//! - **Notices**: a device subscribes only below its inbox, under a random token of each connection, which no
//!   other device can name. It registers that inbox ([`WatchRegistration`] on [`watch_subject`]); fleet-auth then
//!   publishes an empty notice on [`notice_subject`] whenever one of that device's operator-written keys is
//!   written, and the agent reads the key.

use crate::auth::{device_access, device_inbox_prefix, DeviceAccess};
use crate::kv::{self, BucketSpec, KeyShape, BUCKETS, SYSTEM_UPGRADE_STATUS};
use crate::{AttemptId, DeviceId, ValidationError};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Root of the watch-registration subjects: a device registers on `fleet.device-watch.<device-id>`.
pub const WATCH_ROOT: &str = "fleet.device-watch";

/// Largest watch registration, in bytes.
pub const WATCH_REGISTRATION_MAX_BYTES: usize = 512;

/// How often the agent registers its watch inbox again (also at every connection): a restarted fleet-auth knows
/// every device again within this time, and a change it missed is read by the agent's periodic re-read.
pub const WATCH_REFRESH: Duration = Duration::from_secs(30);

/// How long fleet-auth keeps a registration that is not renewed.
pub const WATCH_TTL: Duration = Duration::from_secs(5 * 60);

/// Writes a device may make in a burst (its start-up writes every bucket, and a reconcile of many workloads
/// writes its status a few times).
pub const WRITE_BURST: u32 = 100;

/// Writes per second a device may sustain once its burst is spent: far above what an agent writes (a heartbeat
/// every 30 s, statuses on change), far below what would load the fleet's storage.
pub const WRITE_RATE_PER_SEC: u32 = 5;

/// Root of the subjects the device API reports refused writes on (in the buckets' account, where the operator
/// listens): `fleet.device-refusals.<device-id>`.
pub const REFUSALS_ROOT: &str = "fleet.device-refusals";
/// [`WriteRefused::kind`] of a report that fleet-auth's flood guard disconnected the device (it sent more
/// messages a second than its budget) and refuses its sessions for a cool-down.
pub const FLOOD_KIND: &str = "flood";
/// Every [`WriteRefused::kind`]: the [`PutRefusal::kind`]s and [`FLOOD_KIND`].
pub const REFUSAL_KINDS: [&str; 6] = [
    "not-writable",
    "bad-key",
    "too-large",
    "unknown-run",
    "over-budget",
    FLOOD_KIND,
];

/// The device API reports at most one refusal per device this often (a flood is one report with a count).
pub const REFUSAL_REPORT_INTERVAL: Duration = Duration::from_secs(10);

/// A report of a device's refused writes, published on `fleet.device-refusals.<device-id>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WriteRefused {
    /// The device.
    pub device_id: DeviceId,
    /// The bucket of the latest refused write, when its subject named one devices write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket: Option<String>,
    /// [`PutRefusal::kind`] of the latest refusal.
    pub kind: String,
    /// Its text.
    pub reason: String,
    /// Refusals since the previous report (this one included).
    pub count: u64,
}

/// The subject refusals of `device` are reported on.
pub fn refusals_subject(device: &DeviceId) -> String {
    format!("{REFUSALS_ROOT}.{device}")
}

/// The subject device `device` registers its watch inbox on.
pub fn watch_subject(device: &DeviceId) -> String {
    format!("{WATCH_ROOT}.{device}")
}

/// A device's watch registration: the inbox (`_INBOX.device.<device-id>.<token>`) its notices go to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WatchRegistration {
    /// `_INBOX.device.<device-id>.<token>`; the token is random per connection.
    pub inbox: String,
}

impl WatchRegistration {
    /// Parses a registration received on `subject`: the subject names the device (its permissions let it
    /// publish only its own), and the inbox must be that device's, with a token of 16–64 letters and digits.
    pub fn parse(subject: &str, body: &[u8]) -> Result<(DeviceId, Self), ValidationError> {
        let device = subject
            .strip_prefix(WATCH_ROOT)
            .and_then(|s| s.strip_prefix('.'))
            .ok_or_else(|| {
                ValidationError::new(
                    "watch subject",
                    format!("{subject:?} is not {WATCH_ROOT}.<id>"),
                )
            })?;
        let device = DeviceId::try_from(device)?;
        if body.len() > WATCH_REGISTRATION_MAX_BYTES {
            return Err(ValidationError::new(
                "watch registration",
                format!(
                    "{} bytes (at most {WATCH_REGISTRATION_MAX_BYTES})",
                    body.len()
                ),
            ));
        }
        let reg: Self = serde_json::from_slice(body)
            .map_err(|e| ValidationError::new("watch registration", e.to_string()))?;
        let own = format!("{}.", device_inbox_prefix(&device));
        let token = reg.inbox.strip_prefix(&own).ok_or_else(|| {
            ValidationError::new(
                "watch registration",
                format!("inbox {:?} is not under {own}", reg.inbox),
            )
        })?;
        if !(16..=64).contains(&token.len()) || !token.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(ValidationError::new(
                "watch registration",
                "the inbox token must be 16 to 64 letters and digits",
            ));
        }
        Ok((device, reg))
    }
}

/// The subject of a notice that `key` of `bucket` was written: `<inbox>.<bucket>.<key>`.
pub fn notice_subject(inbox: &str, bucket: &str, key: &str) -> String {
    format!("{inbox}.{bucket}.{key}")
}

/// The buckets whose writes are noticed to their device: those keyed by device that the operator writes and the
/// device reads (desired state, intents).
pub fn noticed_buckets() -> impl Iterator<Item = &'static BucketSpec> {
    BUCKETS
        .iter()
        .filter(|b| device_access(b) == DeviceAccess::Read)
}

/// The buckets a device writes through the device API.
pub fn written_buckets() -> impl Iterator<Item = &'static BucketSpec> {
    BUCKETS.iter().filter(|b| {
        matches!(
            device_access(b),
            DeviceAccess::ReadWrite | DeviceAccess::Write
        )
    })
}

/// The device whose key `key` of `spec` is (`<device-id>` or `<device-id>.<run-uid>`).
pub fn key_device(spec: &BucketSpec, key: &str) -> Option<DeviceId> {
    let id = match spec.key {
        KeyShape::Device => key,
        KeyShape::DeviceRun => key.split_once('.')?.0,
        KeyShape::Run | KeyShape::Group | KeyShape::Tombstone => return None,
    };
    DeviceId::try_from(id).ok()
}

/// The buckets whose key `<device-id>.<run-uid>` must exist for a device to write that key in run bucket
/// `bucket`: the run was given to the device (its intent or request) or the device wrote it before (an intent is
/// removed once its run is terminal). A diagnostics bundle answers only a request that is still there.
pub fn run_given_by(bucket: &str) -> &'static [&'static str] {
    match bucket {
        kv::SYSTEM_UPGRADE_STATUS => &[kv::SYSTEM_UPGRADE_INTENT, kv::SYSTEM_UPGRADE_STATUS],
        kv::DIAGNOSTICS_BUNDLE => &[kv::DIAGNOSTICS_REQUEST],
        _ => &[],
    }
}

/// A device write that passed [`check_put`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevicePut {
    /// The bucket.
    pub bucket: &'static BucketSpec,
    /// The writing device (named by the subject, which its permissions scope).
    pub device: DeviceId,
    /// The run, for a `<device-id>.<run-uid>` key: the device API writes it only when the device was given that
    /// run (an intent exists) or has written its status before.
    pub run: Option<AttemptId>,
}

impl DevicePut {
    /// The key written.
    pub fn key(&self) -> String {
        match &self.run {
            Some(run) => format!("{}.{run}", self.device),
            None => self.device.to_string(),
        }
    }

    /// The KV subject written: `$KV.<bucket>.<key>`.
    pub fn subject(&self) -> String {
        format!("$KV.{}.{}", self.bucket.name, self.key())
    }
}

/// Why the device API refused a write. Each is the writing device's own problem: no other device's keys change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PutRefusal {
    /// Not `$KV.<bucket>.<key>` of a bucket the agent writes.
    #[error("{0:?} is not a key of a bucket devices write")]
    NotWritable(String),
    /// The key is not a valid key of the bucket.
    #[error("invalid key {key:?} in {bucket}: {why}")]
    BadKey {
        /// Bucket.
        bucket: String,
        /// Key.
        key: String,
        /// Why.
        why: String,
    },
    /// The value is larger than the bucket's limit.
    #[error("value of {bytes} bytes is over {bucket}'s limit of {limit} bytes")]
    TooLarge {
        /// Bucket.
        bucket: String,
        /// Size of the value.
        bytes: usize,
        /// The limit.
        limit: usize,
    },
    /// A status for a run the device was not given.
    #[error("no intent for run {run} of this device: a device writes only for runs and requests it was given (a system-upgrade intent, a diagnostics request)")]
    UnknownRun {
        /// The run.
        run: String,
    },
    /// The device spent its write budget.
    #[error("over the write budget ({WRITE_BURST} writes, then {WRITE_RATE_PER_SEC} a second)")]
    OverBudget,
    /// The device already has this many writes waiting to be handled (an agent sends a write only after the
    /// previous one's answer): a flood never takes another device's places in the queue.
    #[error("over the write budget: {limit} writes of this device wait already (an agent waits for each answer)")]
    TooManyWaiting {
        /// Writes a device may have waiting.
        limit: usize,
    },
}

impl PutRefusal {
    /// A short stable name for metrics and events.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::NotWritable(_) => "not-writable",
            Self::BadKey { .. } => "bad-key",
            Self::TooLarge { .. } => "too-large",
            Self::UnknownRun { .. } => "unknown-run",
            Self::OverBudget | Self::TooManyWaiting { .. } => "over-budget",
        }
    }
}

/// Checks a device's write of `len` bytes to `subject` (the device is named by the subject: its permissions let
/// it publish only its own keys' subjects). Whether a run key's run was given is the caller's to check
/// ([`DevicePut::run`]); so is the budget.
pub fn check_put(subject: &str, len: usize) -> Result<DevicePut, PutRefusal> {
    let not_writable = || PutRefusal::NotWritable(subject.to_owned());
    let rest = subject.strip_prefix("$KV.").ok_or_else(not_writable)?;
    let (bucket, key) = rest.split_once('.').ok_or_else(not_writable)?;
    let spec = written_buckets()
        .find(|b| b.name == bucket)
        .ok_or_else(not_writable)?;
    let bad = |why: String| PutRefusal::BadKey {
        bucket: bucket.to_owned(),
        key: key.to_owned(),
        why,
    };
    let (device, run) = match spec.key {
        KeyShape::Device => (
            DeviceId::try_from(key).map_err(|e| bad(e.to_string()))?,
            None,
        ),
        KeyShape::DeviceRun => {
            let (d, r) = crate::kv::parse_run_key(key).map_err(|e| bad(e.to_string()))?;
            // The run id must read back as written (one spelling per run: no second key for the same run).
            if format!("{d}.{r}") != key {
                return Err(bad("not in canonical form".into()));
            }
            (d, Some(r))
        }
        KeyShape::Run | KeyShape::Group | KeyShape::Tombstone => return Err(not_writable()),
    };
    let limit = usize::try_from(spec.max_value_bytes).unwrap_or(0);
    if len > limit {
        return Err(PutRefusal::TooLarge {
            bucket: bucket.to_owned(),
            bytes: len,
            limit,
        });
    }
    debug_assert!(spec.name != SYSTEM_UPGRADE_STATUS || run.is_some());
    Ok(DevicePut {
        bucket: spec,
        device,
        run,
    })
}

/// A device's write budget: a token bucket of [`WRITE_BURST`] writes refilled at [`WRITE_RATE_PER_SEC`].
/// Times are the caller's (milliseconds of a monotonic clock), so the arithmetic is testable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteBudget {
    /// Writes left, in thousandths.
    milli: u64,
    /// When it was last refilled.
    at_ms: u64,
}

impl WriteBudget {
    /// A full budget at `now_ms`.
    pub fn full(now_ms: u64) -> Self {
        Self {
            milli: u64::from(WRITE_BURST) * 1000,
            at_ms: now_ms,
        }
    }

    /// Takes one write at `now_ms`; false when the budget is spent.
    pub fn take(&mut self, now_ms: u64) -> bool {
        let elapsed = now_ms.saturating_sub(self.at_ms);
        let cap = u64::from(WRITE_BURST) * 1000;
        self.milli = (self.milli + elapsed * u64::from(WRITE_RATE_PER_SEC)).min(cap);
        self.at_ms = now_ms.max(self.at_ms);
        if self.milli >= 1000 {
            self.milli -= 1000;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(s: &str) -> DeviceId {
        DeviceId::try_from(s).expect("device id")
    }

    #[test]
    fn every_refusal_kind_is_listed() {
        let all = [
            PutRefusal::NotWritable("x".into()),
            PutRefusal::BadKey {
                bucket: "b".into(),
                key: "k".into(),
                why: "w".into(),
            },
            PutRefusal::TooLarge {
                bucket: "b".into(),
                bytes: 2,
                limit: 1,
            },
            PutRefusal::UnknownRun { run: "r".into() },
            PutRefusal::OverBudget,
            PutRefusal::TooManyWaiting { limit: 4 },
        ];
        for r in &all {
            assert!(REFUSAL_KINDS.contains(&r.kind()), "{}", r.kind());
        }
        // Every kind but the flood guard's is a refusal's.
        let kinds: std::collections::BTreeSet<_> = all.iter().map(PutRefusal::kind).collect();
        assert_eq!(REFUSAL_KINDS.len(), kinds.len() + 1);
    }

    #[test]
    fn puts_are_checked() {
        let run = "0a5b3c1e-8f2d-4b7a-9c6e-1d2f3a4b5c6d";
        let ok = check_put("$KV.device-heartbeat.dev-a", 100).expect("heartbeat");
        assert_eq!(
            (ok.bucket.name, ok.device.as_str(), ok.run),
            ("device-heartbeat", "dev-a", None)
        );
        assert_eq!(ok.subject(), "$KV.device-heartbeat.dev-a");
        let ok = check_put(&format!("$KV.system-upgrade-status.dev-a.{run}"), 10).expect("run");
        assert_eq!(ok.key(), format!("dev-a.{run}"));
        assert_eq!(ok.run.map(|r| r.to_string()).as_deref(), Some(run));

        let table: &[(&str, usize, &str)] = &[
            ("$KV.device-desired-state.dev-a", 1, "not-writable"),
            ("$KV.agent-upgrade-intent.dev-a", 1, "not-writable"),
            ("$KV.task-plans.x", 1, "not-writable"),
            ("$JS.API.STREAM.DELETE.KV_device-info", 1, "not-writable"),
            ("$KV.device-info", 1, "not-writable"),
            ("$KV.device-info.dev-a.extra", 1, "bad-key"),
            ("$KV.device-info.DEV", 1, "bad-key"),
            ("$KV.system-upgrade-status.dev-a", 1, "bad-key"),
            ("$KV.system-upgrade-status.dev-a.anything", 1, "bad-key"),
            (
                "$KV.system-upgrade-status.dev-a.0A5B3C1E-8F2D-4B7A-9C6E-1D2F3A4B5C6D",
                1,
                "bad-key",
            ),
            ("$KV.device-heartbeat.dev-a", 1_000_000, "too-large"),
        ];
        for (subject, len, kind) in table {
            let e = check_put(subject, *len).expect_err(subject);
            assert_eq!(e.kind(), *kind, "{subject}: {e}");
        }
        // Exactly at the limit is fine; one byte over is not.
        for spec in written_buckets() {
            let key = match spec.key {
                KeyShape::Device => "dev-a".to_owned(),
                _ => format!("dev-a.{run}"),
            };
            let subject = format!("$KV.{}.{key}", spec.name);
            let limit = spec.max_value_bytes as usize;
            assert!(check_put(&subject, limit).is_ok(), "{subject}");
            assert_eq!(
                check_put(&subject, limit + 1).map_err(|e| e.kind()),
                Err("too-large")
            );
        }
    }

    #[test]
    fn registrations_name_only_the_devices_own_inbox() {
        let body = |inbox: &str| {
            serde_json::to_vec(&WatchRegistration {
                inbox: inbox.into(),
            })
            .expect("json")
        };
        let (d, r) = WatchRegistration::parse(
            "fleet.device-watch.dev-a",
            &body("_INBOX.device.dev-a.AbCdEfGhIjKlMnOpQrStUv"),
        )
        .expect("own inbox");
        assert_eq!(
            (d.as_str(), r.inbox.as_str()),
            ("dev-a", "_INBOX.device.dev-a.AbCdEfGhIjKlMnOpQrStUv")
        );
        for (subject, inbox) in [
            (
                "fleet.device-watch.dev-a",
                "_INBOX.device.dev-b.AbCdEfGhIjKlMnOpQrStUv",
            ),
            (
                "fleet.device-watch.dev-a",
                "_INBOX.device.dev-a-b.AbCdEfGhIjKlMnOpQrStUv",
            ),
            ("fleet.device-watch.dev-a", "_INBOX.device.dev-a.short"),
            (
                "fleet.device-watch.dev-a",
                "_INBOX.device.dev-a.AbCdEfGhIjKlMnOp.>",
            ),
            (
                "fleet.device-watch.dev-a",
                "_INBOX.device.dev-a.AbCdEfGhIjKlMnOp*",
            ),
            ("fleet.device-watch.dev-a", "$KV.device-desired-state.dev-b"),
            (
                "fleet.device-watch.*",
                "_INBOX.device.dev-a.AbCdEfGhIjKlMnOpQrStUv",
            ),
            (
                "fleet.other.dev-a",
                "_INBOX.device.dev-a.AbCdEfGhIjKlMnOpQrStUv",
            ),
        ] {
            assert!(
                WatchRegistration::parse(subject, &body(inbox)).is_err(),
                "{subject} {inbox}"
            );
        }
        assert!(WatchRegistration::parse("fleet.device-watch.dev-a", &[b' '; 600]).is_err());
        assert!(WatchRegistration::parse("fleet.device-watch.dev-a", b"{\"inbox\":1}").is_err());
        assert!(WatchRegistration::parse(
            "fleet.device-watch.dev-a",
            b"{\"inbox\":\"_INBOX.device.dev-a.AbCdEfGhIjKlMnOpQrStUv\",\"x\":1}"
        )
        .is_err());
        assert_eq!(watch_subject(&dev("dev-a")), "fleet.device-watch.dev-a");
    }

    #[test]
    fn noticed_and_written_buckets_split_the_device_keyed_ones() {
        let noticed: Vec<_> = noticed_buckets().map(|b| b.name).collect();
        assert_eq!(
            noticed,
            [
                kv::DESIRED_STATE,
                kv::DEVICE_SECRETS,
                kv::AGENT_UPGRADE_INTENT,
                kv::SYSTEM_UPGRADE_INTENT,
                kv::DIAGNOSTICS_REQUEST
            ]
        );
        let written: Vec<_> = written_buckets().map(|b| b.name).collect();
        assert_eq!(
            written,
            [
                kv::DEVICE_INFO,
                kv::DEVICE_HEARTBEAT,
                kv::DEVICE_USAGE,
                kv::WORKLOAD_STATUS,
                kv::AGENT_UPGRADE_STATUS,
                kv::SYSTEM_UPGRADE_STATUS,
                kv::DIAGNOSTICS_BUNDLE
            ]
        );
        assert_eq!(
            run_given_by(kv::DIAGNOSTICS_BUNDLE),
            [kv::DIAGNOSTICS_REQUEST]
        );
        assert!(run_given_by(kv::DEVICE_INFO).is_empty());
        let spec = kv::bucket(kv::SYSTEM_UPGRADE_INTENT).expect("bucket");
        assert_eq!(
            key_device(spec, "dev-a.0a5b3c1e-8f2d-4b7a-9c6e-1d2f3a4b5c6d").map(|d| d.to_string()),
            Some("dev-a".into())
        );
        assert_eq!(
            key_device(kv::bucket(kv::DESIRED_STATE).expect("b"), "dev-a").map(|d| d.to_string()),
            Some("dev-a".into())
        );
        assert_eq!(
            key_device(kv::bucket(kv::TASK_PLANS).expect("b"), "x"),
            None
        );
        assert_eq!(
            notice_subject("_INBOX.device.dev-a.T", "device-desired-state", "dev-a"),
            "_INBOX.device.dev-a.T.device-desired-state.dev-a"
        );
    }

    #[test]
    fn the_write_budget_allows_a_burst_then_a_rate() {
        let mut b = WriteBudget::full(0);
        for i in 0..WRITE_BURST {
            assert!(b.take(0), "write {i} of the burst");
        }
        assert!(!b.take(0), "burst spent");
        assert!(!b.take(100), "0.5 of a write after 100 ms");
        assert!(b.take(200), "one write after 200 ms at 5/s");
        assert!(!b.take(200));
        // A long pause refills only up to the burst.
        let mut b = WriteBudget::full(0);
        assert!(b.take(3_600_000));
        let mut n = 0;
        while b.take(3_600_000) {
            n += 1;
        }
        assert_eq!(n, WRITE_BURST - 1);
        // A clock that goes back refills nothing.
        let mut b = WriteBudget::full(10_000);
        while b.take(10_000) {}
        assert!(!b.take(5_000));
    }
}
