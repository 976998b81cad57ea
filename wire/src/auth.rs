//! The device's NATS permission contract: which subjects a device may publish and subscribe to, derived from the
//! KV layout ([`crate::kv::BUCKETS`]) and the device id. `fleet-auth` grants exactly this list; the agent's KV layer
//! uses only these subjects (reply inboxes under [`device_inbox_prefix`]). Pure: no I/O.

use crate::kv::{BucketSpec, KeyShape, BUCKETS};
use crate::DeviceId;

/// Root of every device's reply inboxes: `_INBOX.device.<device-id>`. A NUID (22 characters) never equals
/// `device`, so no other client's `_INBOX.<nuid>…` inbox falls under it.
pub const DEVICE_INBOX_ROOT: &str = "_INBOX.device";

/// What a device may do with its own keys in one bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceAccess {
    /// Nothing (buckets not keyed by device: task plans, FleetLock).
    None,
    /// Read and watch its own keys (written by the operator).
    Read,
    /// Read, watch and write its own keys (written by the agent).
    ReadWrite,
}

/// The access a device has to `spec`: buckets keyed by device are readable by that device, and writable when the
/// layout names the agent as their writer; other buckets are closed to devices.
pub fn device_access(spec: &BucketSpec) -> DeviceAccess {
    match spec.key {
        KeyShape::Run | KeyShape::Group => DeviceAccess::None,
        KeyShape::Device | KeyShape::DeviceRun if spec.writer == "agent" => DeviceAccess::ReadWrite,
        KeyShape::Device | KeyShape::DeviceRun => DeviceAccess::Read,
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
        KeyShape::Run | KeyShape::Group => None,
    }
}

/// Subject of a filtered ephemeral consumer create (nats-server 2.10+ checks that the request's filter equals
/// the subject's): `$JS.API.CONSUMER.CREATE.KV_<bucket>.<name>.<filter>`.
pub fn consumer_create_subject(bucket: &str, name: &str, filter: &str) -> String {
    format!("$JS.API.CONSUMER.CREATE.KV_{bucket}.{name}.{filter}")
}

/// Subject of a direct get of the last value of `subject` (the key's `$KV.…` subject).
pub fn direct_get_subject(bucket: &str, subject: &str) -> String {
    format!("$JS.API.DIRECT.GET.KV_{bucket}.{subject}")
}

/// Subject of the stream-info request that opens a bucket.
pub fn stream_info_subject(bucket: &str) -> String {
    format!("$JS.API.STREAM.INFO.KV_{bucket}")
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

/// The permissions of `device`: for each bucket keyed by device, opening the bucket (stream info), a direct get
/// and a filtered consumer on its own keys, and a put on its own keys where the agent is the writer; subscribing
/// only to its own reply inboxes (which also receive its consumers' deliveries).
pub fn device_permissions(device: &DeviceId) -> DevicePermissions {
    let mut publish = Vec::new();
    for spec in BUCKETS {
        let access = device_access(spec);
        let Some(filter) = device_key_filter(spec, device) else {
            continue;
        };
        if access == DeviceAccess::None {
            continue;
        }
        publish.push(stream_info_subject(spec.name));
        publish.push(direct_get_subject(spec.name, &filter));
        publish.push(consumer_create_subject(spec.name, "*", &filter));
        if access == DeviceAccess::ReadWrite {
            publish.push(filter);
        }
    }
    DevicePermissions {
        publish,
        subscribe: vec![format!("{}.>", device_inbox_prefix(device))],
    }
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
            (kv::DEVICE_HEARTBEAT, DeviceAccess::ReadWrite),
            (kv::DESIRED_STATE, DeviceAccess::Read),
            (kv::WORKLOAD_STATUS, DeviceAccess::ReadWrite),
            (kv::AGENT_UPGRADE_INTENT, DeviceAccess::Read),
            (kv::AGENT_UPGRADE_STATUS, DeviceAccess::ReadWrite),
            (kv::SYSTEM_UPGRADE_INTENT, DeviceAccess::Read),
            (kv::SYSTEM_UPGRADE_STATUS, DeviceAccess::ReadWrite),
            (kv::TASK_PLANS, DeviceAccess::None),
            (kv::FLEETLOCK, DeviceAccess::None),
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
        assert_eq!(p.subscribe, vec!["_INBOX.device.dev-a.>".to_owned()]);
        for want in [
            "$KV.device-heartbeat.dev-a",
            "$KV.system-upgrade-status.dev-a.>",
            "$JS.API.STREAM.INFO.KV_device-desired-state",
            "$JS.API.DIRECT.GET.KV_device-desired-state.$KV.device-desired-state.dev-a",
            "$JS.API.CONSUMER.CREATE.KV_agent-upgrade-intent.*.$KV.agent-upgrade-intent.dev-a",
            "$JS.API.CONSUMER.CREATE.KV_system-upgrade-intent.*.$KV.system-upgrade-intent.dev-a.>",
            "$JS.API.DIRECT.GET.KV_system-upgrade-intent.$KV.system-upgrade-intent.dev-a.>",
        ] {
            assert!(p.publish.iter().any(|s| s == want), "missing {want}");
        }
        for forbidden in [
            "$KV.device-desired-state.dev-a",
            "$KV.agent-upgrade-intent.dev-a",
            "$KV.system-upgrade-intent.dev-a.>",
            "$JS.API.STREAM.INFO.KV_task-plans",
            "$JS.API.STREAM.INFO.KV_fleetlock",
        ] {
            assert!(!p.publish.iter().any(|s| s == forbidden), "{forbidden}");
        }
        // Nothing is a bare wildcard or names another device; no `$SYS`, no unfiltered JetStream API.
        for s in p.publish.iter().chain(&p.subscribe) {
            assert!(
                s.contains("dev-a") || s.starts_with("$JS.API.STREAM.INFO.KV_"),
                "{s}"
            );
            assert!(
                !s.starts_with("$SYS") && s != ">" && !s.ends_with(".*"),
                "{s}"
            );
            let wild = s.split('.').filter(|t| *t == "*" || *t == ">").count();
            assert!(wild <= 2, "{s}");
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
