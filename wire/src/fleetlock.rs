//! The FleetLock protocol (Zincati/airlock compatible) and the lock server's status, state and audit shapes.
//!
//! Requests: `POST /v1/pre-reboot` and `POST /v1/steady-state` with the header `fleet-lock-protocol: true` and the
//! body `{"client_params":{"id":"…","group":"…"}}`. Errors are `{"kind":"…","value":"…"}` with a kind from
//! [`ErrorKind`]. `docs/fleetlock.md` describes the whole protocol.

use crate::{Timestamp, ValidationError};
use serde::{Deserialize, Serialize};

/// The header every protocol request must carry, with the value `true`.
pub const PROTOCOL_HEADER: &str = "fleet-lock-protocol";
/// Path of the lock request.
pub const PRE_REBOOT_PATH: &str = "/v1/pre-reboot";
/// Path of the release request.
pub const STEADY_STATE_PATH: &str = "/v1/steady-state";
/// Path of the (non-protocol) status document.
pub const STATUS_PATH: &str = "/v1/status";
/// Path of the admin release request.
pub const ADMIN_RELEASE_PATH: &str = "/v1/admin/release";
/// The group a client names when it has none of its own (Zincati's default).
pub const DEFAULT_GROUP: &str = "default";
/// Largest request body the server reads, in bytes.
pub const MAX_BODY_BYTES: usize = 16 * 1024;
/// Longest client id, in bytes.
pub const MAX_ID_BYTES: usize = 256;
/// Longest group name, in bytes.
pub const MAX_GROUP_BYTES: usize = 128;
/// Longest hostname a client may report, in bytes.
pub const MAX_HOSTNAME_BYTES: usize = 253;

/// The body of both protocol requests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockRequest {
    /// Who asks, and for which group.
    pub client_params: ClientParams,
}

/// The client's identity. Unknown fields are ignored, as airlock does, so clients may send more.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientParams {
    /// The client's id: Zincati sends its app-specific machine id; fleet-reboot does the same.
    pub id: String,
    /// The group the client names (`default` if it has none).
    pub group: String,
    /// The client's hostname (an optional extension: Zincati does not send it, fleet-reboot does).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
}

impl LockRequest {
    /// Parses and validates a request body.
    pub fn parse(body: &[u8]) -> Result<Self, (ErrorKind, String)> {
        if body.len() > MAX_BODY_BYTES {
            return Err((
                ErrorKind::BodyTooLarge,
                format!("body longer than {MAX_BODY_BYTES} bytes"),
            ));
        }
        let r: LockRequest = serde_json::from_slice(body).map_err(|e| {
            (
                ErrorKind::InvalidBody,
                format!("body is not a FleetLock request: {e}"),
            )
        })?;
        validate_id(&r.client_params.id).map_err(|e| (ErrorKind::InvalidId, e.to_string()))?;
        validate_group(&r.client_params.group)
            .map_err(|e| (ErrorKind::InvalidGroup, e.to_string()))?;
        if let Some(h) = &r.client_params.hostname {
            validate_hostname(h).map_err(|e| (ErrorKind::InvalidBody, e.to_string()))?;
        }
        Ok(r)
    }
}

/// The id `fleet-reboot` sends for the host whose machine id (`/etc/machine-id`, trimmed) is `machine_id`: the first
/// 16 bytes of SHA-256 of `fleet-reboot:<machine-id>`, as 32 lowercase hex digits. An app-specific id, so the machine
/// id itself never leaves the host; the agent reports the same id in its device info.
pub fn client_id(machine_id: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(format!("fleet-reboot:{machine_id}").as_bytes());
    digest[..16].iter().map(|b| format!("{b:02x}")).collect()
}

/// A client id must be non-empty, at most [`MAX_ID_BYTES`] long and free of control characters.
pub fn validate_id(id: &str) -> Result<(), ValidationError> {
    let err = |why: &str| ValidationError::new("fleetlock id", why.to_owned());
    if id.is_empty() {
        return Err(err("must not be empty"));
    }
    if id.len() > MAX_ID_BYTES {
        return Err(err("longer than 256 bytes"));
    }
    if id.chars().any(char::is_control) {
        return Err(err("contains control characters"));
    }
    Ok(())
}

/// A group name matches `^[a-zA-Z0-9.-]+$` and is at most [`MAX_GROUP_BYTES`] long.
pub fn validate_group(group: &str) -> Result<(), ValidationError> {
    let ok = !group.is_empty()
        && group.len() <= MAX_GROUP_BYTES
        && group
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(ValidationError::new(
            "fleetlock group",
            format!(
                "{:?} does not match ^[a-zA-Z0-9.-]+$ (at most {MAX_GROUP_BYTES} bytes)",
                truncate(group)
            ),
        ))
    }
}

/// A reported hostname: letters, digits, `.`, `-` and `_`, at most [`MAX_HOSTNAME_BYTES`] long.
pub fn validate_hostname(h: &str) -> Result<(), ValidationError> {
    let ok = !h.is_empty()
        && h.len() <= MAX_HOSTNAME_BYTES
        && h.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'));
    if ok {
        Ok(())
    } else {
        Err(ValidationError::new(
            "fleetlock hostname",
            format!("{:?} is not a hostname", truncate(h)),
        ))
    }
}

fn truncate(s: &str) -> String {
    s.chars().take(64).collect()
}

/// The fixed set of error kinds a FleetLock server answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ErrorKind {
    /// The `fleet-lock-protocol: true` header is missing or has another value (400).
    MissingProtocolHeader,
    /// The body is not JSON of the request shape (400).
    InvalidBody,
    /// The body is larger than [`MAX_BODY_BYTES`] (413).
    BodyTooLarge,
    /// `client_params.id` is empty or too long (400).
    InvalidId,
    /// `client_params.group` does not match `^[a-zA-Z0-9.-]+$` (400).
    InvalidGroup,
    /// The group named in the request is not configured (400).
    UnknownGroup,
    /// Every slot of one of the client's groups is held by another client (409).
    AllSlotsTaken,
    /// Missing or wrong credentials (401).
    Unauthorized,
    /// No such endpoint (404).
    NotFound,
    /// The endpoint does not take this method (405).
    MethodNotAllowed,
    /// The client was too slow to send its request (408).
    Timeout,
    /// The lock store could not make the change durable (503); nothing changed.
    StoreUnavailable,
}

impl ErrorKind {
    /// Every kind, for metrics.
    pub const ALL: [ErrorKind; 12] = [
        Self::MissingProtocolHeader,
        Self::InvalidBody,
        Self::BodyTooLarge,
        Self::InvalidId,
        Self::InvalidGroup,
        Self::UnknownGroup,
        Self::AllSlotsTaken,
        Self::Unauthorized,
        Self::NotFound,
        Self::MethodNotAllowed,
        Self::Timeout,
        Self::StoreUnavailable,
    ];

    /// The kind as it appears on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MissingProtocolHeader => "missing-protocol-header",
            Self::InvalidBody => "invalid-body",
            Self::BodyTooLarge => "body-too-large",
            Self::InvalidId => "invalid-id",
            Self::InvalidGroup => "invalid-group",
            Self::UnknownGroup => "unknown-group",
            Self::AllSlotsTaken => "all-slots-taken",
            Self::Unauthorized => "unauthorized",
            Self::NotFound => "not-found",
            Self::MethodNotAllowed => "method-not-allowed",
            Self::Timeout => "timeout",
            Self::StoreUnavailable => "store-unavailable",
        }
    }

    /// The HTTP status the server answers with.
    pub fn http_status(self) -> u16 {
        match self {
            Self::MissingProtocolHeader
            | Self::InvalidBody
            | Self::InvalidId
            | Self::InvalidGroup
            | Self::UnknownGroup => 400,
            Self::BodyTooLarge => 413,
            Self::AllSlotsTaken => 409,
            Self::Unauthorized => 401,
            Self::NotFound => 404,
            Self::MethodNotAllowed => 405,
            Self::Timeout => 408,
            Self::StoreUnavailable => 503,
        }
    }
}

/// Every error answer: `{"kind":"…","value":"…"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// What went wrong.
    pub kind: ErrorKind,
    /// A human-readable explanation.
    pub value: String,
}

/// One lock holder as stored and reported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Holder {
    /// The client id from the request.
    pub id: String,
    /// The hostname the client reported, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// The client's IP address as the server saw it.
    pub ip: String,
    /// When the slot was taken.
    pub taken_at: Timestamp,
}

/// The holders of one group: the value of key `<group>` in the `fleetlock` KV bucket.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupHolders {
    /// Format version (1).
    pub version: u32,
    /// Current holders, oldest first.
    pub holders: Vec<Holder>,
}

/// Every group that may have holders in the NATS store: the value of key [`GROUP_DIRECTORY_KEY`] in the `fleetlock`
/// bucket. A release (`steady-state`) reads it and then each listed group, instead of listing the bucket's keys
/// (which needs a JetStream consumer per request). A grant adds its group before it writes the group's first holder,
/// and nothing removes a group while servers run, so it always covers every slot held. It grows with the groups ever
/// configured, never with requests: a refused request writes nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupDirectory {
    /// Format version (1).
    pub version: u32,
    /// Group names, sorted, without duplicates.
    pub groups: Vec<String>,
}

/// Key of the [`GroupDirectory`]. `_` cannot start a group name (`^[a-zA-Z0-9.-]+$`), so no group key collides.
pub const GROUP_DIRECTORY_KEY: &str = "_groups";

/// Prefix of the per-id holder index keys of the layout before the [`GroupDirectory`] (`_holder.<digest>`, one per
/// id that ever asked, refused or not). The first start of a server with the directory removes them.
pub const HOLDER_INDEX_PREFIX: &str = "_holder.";

/// The file store's state file: every group's holders.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateFile {
    /// Format version (1).
    pub version: u32,
    /// Holders per group (groups without holders are omitted).
    pub groups: std::collections::BTreeMap<String, Vec<Holder>>,
}

/// One group in the status document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupStatus {
    /// Group name.
    pub name: String,
    /// Configured slots.
    pub slots: u32,
    /// Current holders.
    pub holders: Vec<Holder>,
}

/// `GET /v1/status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerStatus {
    /// Which store holds the truth: `file` or `nats`.
    pub store: String,
    /// Whether the config file as it is now on disk is valid (false: the last good one is in use).
    pub config_valid: bool,
    /// Why the config file on disk was rejected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_error: Option<String>,
    /// Lock time-to-live in seconds, if one is configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_secs: Option<u64>,
    /// Whether `pre-reboot` and `steady-state` need client credentials (`auth.tokens` or `auth.basic`); `false`:
    /// anyone who reaches the port can take and give back slots. Absent from servers before this field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_auth: Option<bool>,
    /// What the server warns about at start and for as long as it holds (e.g. client authentication off).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// Every configured group (and any group that still has holders).
    pub groups: Vec<GroupStatus>,
    /// When this server process started: `recent` covers what it made durable since then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Timestamp>,
    /// The latest grants, releases, expiries and admin releases this server made durable, newest first, at most
    /// [`MAX_RECENT_EVENTS`]. Kept in the server's memory: a restart empties it, and each replica of an HA server
    /// reports only its own.
    #[serde(default)]
    pub recent: Vec<LockEvent>,
}

/// Most events [`ServerStatus::recent`] holds.
pub const MAX_RECENT_EVENTS: usize = 200;

/// What happened to a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LockEventKind {
    /// The holder was given the slot (`POST /v1/pre-reboot`).
    Granted,
    /// The holder gave it back (`POST /v1/steady-state`).
    Released,
    /// Its time-to-live ran out.
    Expired,
    /// An administrator released it (`POST /v1/admin/release`).
    AdminReleased,
}

/// One change to one group's holders.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LockEvent {
    /// When the change was made durable.
    pub at: Timestamp,
    /// What happened.
    pub kind: LockEventKind,
    /// The group.
    pub group: String,
    /// The holder it concerns (for a release: as it was when it held the slot; `taken_at` tells how long).
    pub holder: Holder,
}

/// `POST /v1/admin/release`: frees one holder's slot by hand.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminRelease {
    /// The group to release in.
    pub group: String,
    /// The holder's id.
    pub id: String,
    /// Why (kept in the audit record).
    pub reason: String,
}

/// Why a holder lost its slot without asking.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AuditAction {
    /// An administrator released it.
    AdminRelease,
    /// Its time-to-live ran out.
    TtlExpired,
}

/// One line of the audit log (JSON lines).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditRecord {
    /// When.
    pub at: Timestamp,
    /// What.
    pub action: AuditAction,
    /// In which group.
    pub group: String,
    /// Which holder id.
    pub id: String,
    /// Whether a holder was actually removed.
    pub removed: bool,
    /// Who asked (client IP for admin releases, `server` for expiry).
    pub actor: String,
    /// The administrator's reason, or the TTL.
    pub reason: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_client_id_is_the_documented_hash() {
        // docs/fleetlock.md: printf 'fleet-reboot:%s' "$(cat /etc/machine-id)" | sha256sum | cut -c1-32
        assert_eq!(
            client_id("0123456789abcdef0123456789abcdef"),
            "761c89190f176e1e42a5a939fa2a4ace"
        );
    }

    #[test]
    fn requests_validate() {
        let ok = br#"{"client_params":{"id":"abc","group":"default","extra":1}}"#;
        assert_eq!(
            LockRequest::parse(ok).map(|r| r.client_params.id),
            Ok("abc".into())
        );
        let e = |b: &[u8]| LockRequest::parse(b).map_err(|e| e.0).err();
        assert_eq!(
            e(br#"{"client_params":{"id":"","group":"a"}}"#),
            Some(ErrorKind::InvalidId)
        );
        assert_eq!(
            e(br#"{"client_params":{"id":"x","group":"a b"}}"#),
            Some(ErrorKind::InvalidGroup)
        );
        assert_eq!(
            e(br#"{"client_params":{"id":"x","group":""}}"#),
            Some(ErrorKind::InvalidGroup)
        );
        assert_eq!(e(b"nope"), Some(ErrorKind::InvalidBody));
        assert_eq!(
            e(&vec![b' '; MAX_BODY_BYTES + 1]),
            Some(ErrorKind::BodyTooLarge)
        );
        assert!(validate_group("a-B.9").is_ok());
        assert!(validate_group("a_b").is_err());
    }

    #[test]
    fn kinds_are_kebab_and_distinct() {
        for k in ErrorKind::ALL {
            let json = serde_json::to_string(&k).expect("json");
            assert_eq!(json, format!("\"{}\"", k.as_str()));
            assert!(k.http_status() >= 400);
        }
        assert_eq!(ErrorKind::AllSlotsTaken.as_str(), "all-slots-taken");
    }
}
