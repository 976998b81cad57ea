//! The device's NATS permission contract: which subjects a device may publish and subscribe to, derived from the
//! KV layout ([`crate::kv::BUCKETS`]) and the device id. `fleet-auth` grants exactly this list; the agent's KV layer
//! uses only these subjects (reply inboxes under [`device_inbox_prefix`]). Pure: no I/O.

use crate::kv::{BucketSpec, KeyShape, BUCKETS};
use crate::DeviceId;

/// Root of every device's reply inboxes: `_INBOX.device.<device-id>`. A NUID (22 characters) never equals
/// `device`, so no other client's `_INBOX.<nuid>…` inbox falls under it.
pub const DEVICE_INBOX_ROOT: &str = "_INBOX.device";

/// The largest device token file (`[nats] token_file`), in bytes: what the agent reads and what the token
/// refresher (`fleet-token`) writes.
pub const NATS_TOKEN_MAX_BYTES: usize = 16 * 1024;

/// The NATS user names of the fleet's services (nats-server's `auth_callout.auth_users` in docs/auth.md, plus
/// `admin`, the services' user of the test rig and the demo): users that log in by password and bypass the auth
/// callout, so every per-device bound. A device never uses one; the agent refuses to start with one
/// (docs/agent-config.md).
pub const SERVICE_USERS: [&str; 7] = [
    "admin",
    "fleet-auth",
    "fleet-operator",
    "fleetlock",
    "fleet-device-api",
    "fleet-device-kv",
    "fleet-auth-system",
];

/// Subscriptions one device connection may hold: the devices' account `limits { max_subscriptions }` in
/// nats-server's configuration (docs/auth.md), which the server applies to every connection fleet-auth places
/// there. An agent holds a few (its watch inbox and one per request in flight). Each subscription on one subject
/// is another delivery of every message to it, so this also bounds how many copies of one answer a device can
/// make the server hold for it.
pub const DEVICE_MAX_SUBSCRIPTIONS: u32 = 32;

/// The largest message one device connection may publish, bytes (the devices' account `limits { max_payload }`):
/// the largest value a device writes ([`device_max_write_bytes`], workload status) with room for the headers.
pub const DEVICE_MAX_PAYLOAD: u32 = 128 * 1024;

/// The largest value a device may write to any bucket, bytes.
pub fn device_max_write_bytes() -> u32 {
    BUCKETS
        .iter()
        .filter(|b| {
            matches!(
                device_access(b),
                DeviceAccess::ReadWrite | DeviceAccess::Write
            )
        })
        .map(|b| u32::try_from(b.max_value_bytes).unwrap_or(0))
        .max()
        .unwrap_or(0)
}

/// What a device may do with its own keys in one bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceAccess {
    /// Nothing (buckets not keyed by device: task plans, FleetLock).
    None,
    /// Read and watch its own keys (written by the operator).
    Read,
    /// Read, watch and write its own keys (written by the agent).
    ReadWrite,
    /// Write its own key, never read it (the agent only reports there: heartbeats, workload status). A device may
    /// direct-get only the bucket's probe key ([`device_read_filter`]), which nobody writes: its answer (404, or
    /// no responders) tells the agent the bucket exists. Were its own key readable, a device could make the
    /// server send that value, its largest (96 KiB of workload status), to any reply subject it names, thousands
    /// of times a second (docs/auth.md).
    Write,
}

/// Buckets the agent writes and never reads back ([`DeviceAccess::Write`]). A diagnostics bundle is the largest
/// value a device writes: readable, it would be the largest answer a device could make the server send.
const WRITE_ONLY: &[&str] = &[
    crate::kv::DEVICE_HEARTBEAT,
    crate::kv::DEVICE_USAGE,
    crate::kv::WORKLOAD_STATUS,
    crate::kv::DIAGNOSTICS_BUNDLE,
];

/// The key below a device's own in a write-only bucket that a device may direct-get: `<device-id>.probe`. A device
/// writes exactly `<device-id>` there and the operator never writes a device bucket, so it is always absent.
pub const PROBE_KEY: &str = "probe";

/// The access a device has to `spec`: buckets keyed by device are readable by that device, and writable when the
/// layout names the agent as their writer (write-only where the agent never reads them); other buckets are closed
/// to devices.
pub fn device_access(spec: &BucketSpec) -> DeviceAccess {
    match spec.key {
        KeyShape::Run | KeyShape::Group | KeyShape::Tombstone => DeviceAccess::None,
        KeyShape::Device | KeyShape::DeviceRun
            if spec.writer == "agent" && WRITE_ONLY.contains(&spec.name) =>
        {
            DeviceAccess::Write
        }
        KeyShape::Device | KeyShape::DeviceRun if spec.writer == "agent" => DeviceAccess::ReadWrite,
        KeyShape::Device | KeyShape::DeviceRun => DeviceAccess::Read,
    }
}

/// The subject filter a device may direct-get in `spec`: its own keys ([`device_key_filter`]), or only the probe
/// key `$KV.<bucket>.<device>.probe` of a write-only bucket; `None` when the bucket is closed to devices.
pub fn device_read_filter(spec: &BucketSpec, device: &DeviceId) -> Option<String> {
    match device_access(spec) {
        DeviceAccess::None => None,
        DeviceAccess::Write => Some(format!("$KV.{}.{device}.{PROBE_KEY}", spec.name)),
        DeviceAccess::Read | DeviceAccess::ReadWrite => device_key_filter(spec, device),
    }
}

/// `_INBOX.device.<device-id>`: the device's reply subjects are `<prefix>.<random token>`.
pub fn device_inbox_prefix(device: &DeviceId) -> String {
    format!("{DEVICE_INBOX_ROOT}.{device}")
}

/// The KV subject filter covering the device's keys in `spec`: `$KV.<bucket>.<device>` or
/// `$KV.<bucket>.<device>.>`; `None` when the bucket is not keyed by device.
pub fn device_key_filter(spec: &BucketSpec, device: &DeviceId) -> Option<String> {
    match spec.key {
        KeyShape::Device => Some(format!("$KV.{}.{device}", spec.name)),
        KeyShape::DeviceRun => Some(format!("$KV.{}.{device}.>", spec.name)),
        KeyShape::Run | KeyShape::Group | KeyShape::Tombstone => None,
    }
}

/// The KV subject filter covering every device's keys in `spec` (a bucket keyed by device): `$KV.<bucket>.*` or
/// `$KV.<bucket>.>` for run buckets.
pub fn every_device_filter(spec: &BucketSpec) -> String {
    match spec.key {
        KeyShape::Device => format!("$KV.{}.*", spec.name),
        _ => format!("$KV.{}.>", spec.name),
    }
}

/// Subject of a direct get of the last value of `subject` (the key's `$KV.…` subject, or a `….>` filter for the
/// newest of a device's run keys). The key is in the subject, so permissions can scope it; the body must be empty.
pub fn direct_get_subject(bucket: &str, subject: &str) -> String {
    format!("$JS.API.DIRECT.GET.KV_{bucket}.{subject}")
}

/// The account that holds the KV buckets (and the operator's and fleetlock-server's users).
pub const FLEET_ACCOUNT: &str = "FLEET";
/// The account fleet-auth's device API serves the devices' writes and watch registrations in.
pub const DEVICE_API_ACCOUNT: &str = "DEVICE_API";
/// The account devices are placed in.
pub const DEVICES_ACCOUNT: &str = "DEVICES";

/// What the devices' account imports, and from which account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Import {
    /// A service (requests whose answers come back to the requester's reply subject).
    Service {
        /// The exporting account.
        account: &'static str,
        /// The subject.
        subject: String,
    },
    /// A stream (messages published in the exporting account are delivered in the devices' account too).
    Stream {
        /// The exporting account.
        account: &'static str,
        /// The subject.
        subject: String,
    },
}

/// The devices' account's imports (`docs/auth.md`): direct gets from the buckets' account; KV writes and watch
/// registrations from the device API's account (fleet-auth checks every write and writes only its value); and
/// the notices fleet-auth publishes below the devices' inboxes. Nothing else: no JetStream API but direct gets,
/// no KV subject stream — so no answer and no message a device can cause lands on a subject that another device
/// subscribes to, whose subscriptions all sit below a random token of each connection.
pub fn device_imports() -> Vec<Import> {
    let mut v = vec![Import::Service {
        account: FLEET_ACCOUNT,
        subject: "$JS.API.DIRECT.GET.>".to_owned(),
    }];
    for spec in BUCKETS {
        if matches!(
            device_access(spec),
            DeviceAccess::ReadWrite | DeviceAccess::Write
        ) {
            let subject = every_device_filter(spec);
            v.push(Import::Service {
                account: DEVICE_API_ACCOUNT,
                subject,
            });
        }
    }
    v.push(Import::Service {
        account: DEVICE_API_ACCOUNT,
        subject: format!("{}.*", crate::device_api::WATCH_ROOT),
    });
    v.push(Import::Stream {
        account: FLEET_ACCOUNT,
        subject: format!("{DEVICE_INBOX_ROOT}.>"),
    });
    v
}

/// A NATS server URL split from the user and password it may carry (`nats://user:password@host:port`): the
/// services that bypass the callout (operator, fleetlock-server, fleet-auth) authenticate with their own
/// `auth_users` credentials, and the URL without them is what may be logged.
#[derive(Clone, PartialEq, Eq)]
pub struct NatsUrl {
    /// The URL without credentials.
    pub url: String,
    /// User and password, when the URL had them.
    pub user_password: Option<(String, String)>,
}

impl std::fmt::Debug for NatsUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let user = self.user_password.as_ref().map(|(u, _)| u.as_str());
        write!(f, "NatsUrl {{ url: {:?}, user: {user:?} }}", self.url)
    }
}

/// Splits `url` (one URL or a comma-separated list whose first entry may carry `user:password@`). The user and
/// password are taken literally (no percent-decoding): they must not contain `@`, `:` or `/`.
pub fn split_nats_url(url: &str) -> NatsUrl {
    let Some((scheme, rest)) = url.split_once("://") else {
        return NatsUrl {
            url: url.to_owned(),
            user_password: None,
        };
    };
    let host_end = rest.find(['/', ',']).unwrap_or(rest.len());
    match rest[..host_end].rsplit_once('@') {
        Some((userinfo, host)) => {
            let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
            NatsUrl {
                url: format!("{scheme}://{host}{}", &rest[host_end..]),
                user_password: Some((user.to_owned(), password.to_owned())),
            }
        }
        None => NatsUrl {
            url: url.to_owned(),
            user_password: None,
        },
    }
}

/// A device's permissions: allowed publish and subscribe subjects; everything else is denied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevicePermissions {
    /// Subjects the device may publish to.
    pub publish: Vec<String>,
    /// Subjects the device may subscribe to.
    pub subscribe: Vec<String>,
}

/// The permissions of `device`: for each bucket keyed by device, a direct get of its own keys (of the probe key
/// only in a write-only bucket, [`device_read_filter`]), and a write of its own keys where the agent is the writer (served by the device API, [`device_imports`]); a watch
/// registration of its own; and subscriptions below its own inbox only (replies, and the device API's notices).
/// No JetStream consumer API at all: a consumer's deliver subject cannot be scoped by permissions (see
/// `docs/auth.md`).
pub fn device_permissions(device: &DeviceId) -> DevicePermissions {
    let mut publish = Vec::new();
    let subscribe = vec![format!("{}.>", device_inbox_prefix(device))];
    for spec in BUCKETS {
        let (Some(read), Some(own)) = (
            device_read_filter(spec, device),
            device_key_filter(spec, device),
        ) else {
            continue;
        };
        publish.push(direct_get_subject(spec.name, &read));
        if matches!(
            device_access(spec),
            DeviceAccess::ReadWrite | DeviceAccess::Write
        ) {
            publish.push(own);
        }
    }
    publish.push(crate::device_api::watch_subject(device));
    DevicePermissions { publish, subscribe }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv;

    fn dev(s: &str) -> DeviceId {
        DeviceId::try_from(s).expect("device id")
    }

    #[test]
    fn access_per_bucket() {
        let table = [
            (kv::DEVICE_INFO, DeviceAccess::ReadWrite),
            (kv::DEVICE_HEARTBEAT, DeviceAccess::Write),
            (kv::DEVICE_USAGE, DeviceAccess::Write),
            (kv::DESIRED_STATE, DeviceAccess::Read),
            (kv::DEVICE_SECRETS, DeviceAccess::Read),
            (kv::WORKLOAD_STATUS, DeviceAccess::Write),
            (kv::AGENT_UPGRADE_INTENT, DeviceAccess::Read),
            (kv::AGENT_UPGRADE_STATUS, DeviceAccess::ReadWrite),
            (kv::SYSTEM_UPGRADE_INTENT, DeviceAccess::Read),
            (kv::SYSTEM_UPGRADE_STATUS, DeviceAccess::ReadWrite),
            (kv::DIAGNOSTICS_REQUEST, DeviceAccess::Read),
            (kv::DIAGNOSTICS_BUNDLE, DeviceAccess::Write),
            (kv::TASK_PLANS, DeviceAccess::None),
            (kv::FLEETLOCK, DeviceAccess::None),
            (kv::DEVICE_RETIRED, DeviceAccess::None),
        ];
        assert_eq!(table.len(), BUCKETS.len(), "every bucket has a decision");
        for (name, want) in table {
            let spec = kv::bucket(name).expect("bucket");
            assert_eq!(device_access(spec), want, "{name}");
        }
        // Every bucket the agent needs is open to it.
        for name in kv::AGENT_REQUIRED_BUCKETS {
            let spec = kv::bucket(name).expect("bucket");
            assert_ne!(device_access(spec), DeviceAccess::None, "{name}");
        }
    }

    #[test]
    fn permissions_of_one_device() {
        let p = device_permissions(&dev("dev-a"));
        assert_eq!(p.subscribe[0], "_INBOX.device.dev-a.>");
        for want in [
            "$KV.device-heartbeat.dev-a",
            "$KV.system-upgrade-status.dev-a.>",
            "$JS.API.DIRECT.GET.KV_device-desired-state.$KV.device-desired-state.dev-a",
            "$JS.API.DIRECT.GET.KV_system-upgrade-intent.$KV.system-upgrade-intent.dev-a.>",
        ] {
            assert!(
                p.publish.iter().any(|s| s == want),
                "missing publish {want}"
            );
        }
        assert!(p.publish.iter().any(|s| s == "fleet.device-watch.dev-a"));
        // What it only writes, it cannot read: only the probe key, which nobody writes.
        for (bucket, probe) in [
            ("device-heartbeat", "$KV.device-heartbeat.dev-a.probe"),
            (
                "device-workload-status",
                "$KV.device-workload-status.dev-a.probe",
            ),
        ] {
            assert!(p
                .publish
                .iter()
                .any(|s| s == &format!("$KV.{bucket}.dev-a")));
            assert!(p
                .publish
                .iter()
                .any(|s| s == &direct_get_subject(bucket, probe)));
            assert!(!p
                .publish
                .iter()
                .any(|s| s == &direct_get_subject(bucket, &format!("$KV.{bucket}.dev-a"))));
        }
        // Subscriptions below its own inbox only: no KV subject, which another device could name as the reply
        // subject of a request and so deliver answers to.
        assert_eq!(p.subscribe, ["_INBOX.device.dev-a.>"]);
        for forbidden in [
            "$KV.device-desired-state.dev-a",
            "$KV.agent-upgrade-intent.dev-a",
            "$KV.system-upgrade-intent.dev-a.>",
        ] {
            assert!(!p.publish.iter().any(|s| s == forbidden), "{forbidden}");
        }
        // Only the device's own subjects; no consumer or stream API, no `$SYS`, no bare wildcard.
        for s in p.publish.iter().chain(&p.subscribe) {
            assert!(s.split('.').any(|t| t == "dev-a"), "{s}");
            assert!(
                !s.starts_with("$SYS") && !s.contains("CONSUMER") && !s.contains("STREAM"),
                "{s}"
            );
            assert!(!s.split('.').any(|t| t == "*"), "{s}");
        }
        assert!(!p
            .publish
            .iter()
            .chain(&p.subscribe)
            .any(|s| s.contains("task-plans") || s.contains("fleetlock")));
    }

    #[test]
    fn imports_cover_what_devices_publish() {
        let imports = device_imports();
        let services: Vec<(&str, &str)> = imports
            .iter()
            .filter_map(|i| match i {
                Import::Service { account, subject } => Some((*account, subject.as_str())),
                Import::Stream { .. } => None,
            })
            .collect();
        assert_eq!(services[0], (FLEET_ACCOUNT, "$JS.API.DIRECT.GET.>"));
        assert!(services.contains(&(DEVICE_API_ACCOUNT, "$KV.device-heartbeat.*")));
        assert!(services.contains(&(DEVICE_API_ACCOUNT, "$KV.system-upgrade-status.>")));
        assert!(services.contains(&(DEVICE_API_ACCOUNT, "fleet.device-watch.*")));
        // Writes never reach JetStream directly: only direct gets are imported from the buckets' account.
        assert_eq!(
            services.iter().filter(|(a, _)| *a == FLEET_ACCOUNT).count(),
            1
        );
        assert!(!services
            .iter()
            .any(|(_, s)| s.contains("intent") || s.contains("desired")));
        assert_eq!(
            imports
                .iter()
                .filter(|i| matches!(i, Import::Stream { .. }))
                .collect::<Vec<_>>(),
            [&Import::Stream {
                account: FLEET_ACCOUNT,
                subject: "_INBOX.device.>".into()
            }]
        );
        // Every publish a device is allowed is served by one of the imports.
        let matches = |pat: &str, subj: &str| {
            let (p, s): (Vec<&str>, Vec<&str>) =
                (pat.split('.').collect(), subj.split('.').collect());
            p.iter()
                .enumerate()
                .all(|(i, t)| *t == ">" || s.get(i).is_some_and(|x| *t == "*" || t == x))
                && (p.last() == Some(&">") || p.len() == s.len())
        };
        for subj in device_permissions(&dev("dev-a")).publish {
            assert!(
                services.iter().any(|(_, i)| matches(i, &subj)),
                "{subj} is not imported"
            );
        }
    }

    #[test]
    fn url_credentials_are_split_off() {
        let u = split_nats_url("nats://operator:s3cret@nats.fleet:4222");
        assert_eq!(u.url, "nats://nats.fleet:4222");
        assert_eq!(
            u.user_password,
            Some(("operator".to_owned(), "s3cret".to_owned()))
        );
        assert!(!format!("{u:?}").contains("s3cret"));
        let u = split_nats_url("nats://127.0.0.1:4222");
        assert_eq!(
            (u.url.as_str(), u.user_password),
            ("nats://127.0.0.1:4222", None)
        );
        let u = split_nats_url("tls://a:b@h1:4222,tls://h2:4222");
        assert_eq!(u.url, "tls://h1:4222,tls://h2:4222");
        assert_eq!(split_nats_url("127.0.0.1").url, "127.0.0.1");
    }

    #[test]
    fn a_devices_largest_write_fits_its_payload_limit() {
        assert_eq!(device_max_write_bytes(), 112 * 1024);
        assert!(DEVICE_MAX_PAYLOAD >= device_max_write_bytes() + 4 * 1024);
    }

    #[test]
    fn devices_do_not_overlap() {
        // A device id is one subject token, so `a`'s subjects never match `a-b`'s keys or inbox.
        let a = device_permissions(&dev("a"));
        for s in a.publish.iter().chain(&a.subscribe) {
            assert!(!s.contains("a-b"), "{s}");
            assert!(s.split('.').all(|t| t != "a-b"));
        }
        assert_eq!(device_inbox_prefix(&dev("a")), "_INBOX.device.a");
    }
}
