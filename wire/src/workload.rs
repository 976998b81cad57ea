//! Podman workloads: the desired state the operator writes to `device-desired-state/<device>`, the labels the
//! agent puts on the containers it owns, and the workload status it reports to `device-workload-status/<device>`.

use crate::digest::canonical_digest;
use crate::error::shown;
use crate::health::{HealthCheck, HealthState, RawHealthCheck};
use crate::resources::{
    check_capability, check_device, check_group, Resources, MAX_HARDWARE_ITEMS,
};
use crate::secrets::{SecretUse, MAX_SECRET_USES};
use crate::{BoundedText, DeviceId, Sha256Hex, Timestamp, ValidationError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Domain tag of [`WorkloadSpec::digest`].
pub const WORKLOAD_DIGEST_DOMAIN: &str = "harmony-fleet/workload-spec/v1";
/// Most workloads on one device.
pub const MAX_WORKLOADS: usize = 64;
/// Prefix reserved for labels the agent sets; desired-state labels may not use it.
pub const RESERVED_LABEL_PREFIX: &str = "io.nationtech.fleet.";
/// Label marking a container as owned by the agent (value `"true"`). Containers without it are never touched.
pub const LABEL_MANAGED: &str = "io.nationtech.fleet.managed";
/// Label carrying the workload name.
pub const LABEL_WORKLOAD: &str = "io.nationtech.fleet.workload";
/// Label carrying the device id.
pub const LABEL_DEVICE: &str = "io.nationtech.fleet.device";
/// Label carrying [`WorkloadSpec::digest`]; a differing digest means the container must be replaced.
pub const LABEL_SPEC_DIGEST: &str = "io.nationtech.fleet.spec-digest";
/// Label carrying the label schema version, so older agents can read containers created by newer ones.
pub const LABEL_SCHEMA: &str = "io.nationtech.fleet.schema";
/// Current value of [`LABEL_SCHEMA`].
pub const LABEL_SCHEMA_VERSION: &str = "1";

/// The complete desired state of one device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(
    rename_all = "camelCase",
    deny_unknown_fields,
    try_from = "RawDesiredState"
)]
pub struct DesiredState {
    /// The device.
    pub device_id: DeviceId,
    /// Increases with every change the operator makes.
    pub generation: u64,
    /// The workloads, unique by name, at most [`MAX_WORKLOADS`].
    pub workloads: Vec<WorkloadSpec>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawDesiredState {
    device_id: DeviceId,
    generation: u64,
    workloads: Vec<WorkloadSpec>,
}

impl TryFrom<RawDesiredState> for DesiredState {
    type Error = ValidationError;
    fn try_from(r: RawDesiredState) -> Result<Self, ValidationError> {
        DesiredState::new(r.device_id, r.generation, r.workloads)
    }
}

impl DesiredState {
    /// Builds a desired state, checking the workload count and name uniqueness.
    pub fn new(
        device_id: DeviceId,
        generation: u64,
        workloads: Vec<WorkloadSpec>,
    ) -> Result<Self, ValidationError> {
        if workloads.len() > MAX_WORKLOADS {
            return Err(ValidationError::new(
                "desired state",
                format!("more than {MAX_WORKLOADS} workloads"),
            ));
        }
        let mut names: Vec<&str> = workloads.iter().map(|w| w.name.as_str()).collect();
        names.sort_unstable();
        if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(ValidationError::new(
                "desired state",
                format!("workload name {:?} appears twice", w[0]),
            ));
        }
        Ok(Self {
            device_id,
            generation,
            workloads,
        })
    }
}

/// A workload name: a DNS-1123 label, used in the container name `fleet-<name>`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct WorkloadName(String);

impl TryFrom<String> for WorkloadName {
    type Error = ValidationError;
    fn try_from(s: String) -> Result<Self, ValidationError> {
        // Same alphabet as device ids: it ends up in container names, labels and KV values.
        crate::DeviceId::try_from(s.as_str())
            .map(|_| Self(s.clone()))
            .map_err(|e| ValidationError::new("workload name", e.reason))
    }
}
impl TryFrom<&str> for WorkloadName {
    type Error = ValidationError;
    fn try_from(s: &str) -> Result<Self, ValidationError> {
        Self::try_from(s.to_owned())
    }
}
impl From<WorkloadName> for String {
    fn from(n: WorkloadName) -> String {
        n.0
    }
}
impl WorkloadName {
    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
    /// The Podman container name the agent gives this workload.
    pub fn container_name(&self) -> String {
        format!("fleet-{}", self.0)
    }
}

/// When Podman restarts a workload's container.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RestartPolicy {
    /// Never.
    No,
    /// Always, including after a reboot of Podman's restart service.
    #[default]
    Always,
    /// When it exits non-zero.
    OnFailure,
    /// Unless stopped by a person.
    UnlessStopped,
}

impl RestartPolicy {
    /// Podman's name for the policy.
    pub fn podman_name(self) -> &'static str {
        match self {
            Self::No => "no",
            Self::Always => "always",
            Self::OnFailure => "on-failure",
            Self::UnlessStopped => "unless-stopped",
        }
    }
}

/// A port protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// TCP.
    #[default]
    Tcp,
    /// UDP.
    Udp,
}

/// A published port.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PortMapping {
    /// Port on the device (1–65535).
    pub host_port: u16,
    /// Port in the container (1–65535).
    pub container_port: u16,
    /// TCP or UDP.
    #[serde(default)]
    pub protocol: Protocol,
}

/// A mount: a named Podman volume or an absolute host path.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VolumeMount {
    /// A volume name (`[A-Za-z0-9][A-Za-z0-9_.-]*`) or an absolute host path without `..`.
    pub source: String,
    /// Absolute path in the container without `..`.
    pub target: String,
    /// Mount read-only.
    #[serde(default)]
    pub read_only: bool,
}

/// One Podman workload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(
    rename_all = "camelCase",
    deny_unknown_fields,
    try_from = "RawWorkloadSpec"
)]
pub struct WorkloadSpec {
    /// Unique on the device.
    pub name: WorkloadName,
    /// Image reference, pulled by Podman.
    pub image: String,
    /// Command and arguments; empty = the image's default.
    pub command: Vec<String>,
    /// Environment variables.
    pub env: BTreeMap<String, String>,
    /// Published ports.
    pub ports: Vec<PortMapping>,
    /// Mounts.
    pub volumes: Vec<VolumeMount>,
    /// Restart policy.
    pub restart_policy: RestartPolicy,
    /// Extra container labels (not under [`RESERVED_LABEL_PREFIX`]).
    pub labels: BTreeMap<String, String>,
    /// How the workload's health is checked ([`HealthCheck`]); absent: only its container state counts. Left out
    /// of the JSON when absent, so every spec without one keeps the digest it had before the field existed; an
    /// agent before it refuses a desired state that has one (`deny_unknown_fields`) rather than dropping it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_check: Option<HealthCheck>,
    /// Resource limits ([`Resources`]). This and every field below is left out of the JSON when empty, so a spec
    /// without them keeps its digest, and an agent before them refuses a desired state that has one
    /// (`deny_unknown_fields`); the operator gives such specs only to agents advertising
    /// [`crate::Capability::WorkloadSpecV2`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Resources>,
    /// Keys of Kubernetes Secrets as environment variables or read-only files ([`SecretUse`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<SecretUse>,
    /// Host device nodes given to the container at the same path (policy: `WorkloadPolicy`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<String>,
    /// Supplementary groups of the container's process (policy: `WorkloadPolicy`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
    /// Linux capabilities added to the default set, e.g. `NET_ADMIN` (policy: `WorkloadPolicy`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capabilities: Vec<String>,
    /// Privileged mode (policy: `WorkloadPolicy` with `privileged: true`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub privileged: bool,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawWorkloadSpec {
    name: WorkloadName,
    image: String,
    #[serde(default)]
    command: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    ports: Vec<PortMapping>,
    #[serde(default)]
    volumes: Vec<VolumeMount>,
    #[serde(default)]
    restart_policy: RestartPolicy,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    health_check: Option<RawHealthCheck>,
    #[serde(default)]
    resources: Option<Resources>,
    #[serde(default)]
    secrets: Vec<SecretUse>,
    #[serde(default)]
    devices: Vec<String>,
    #[serde(default)]
    groups: Vec<String>,
    #[serde(default)]
    capabilities: Vec<String>,
    #[serde(default)]
    privileged: bool,
}

impl TryFrom<RawWorkloadSpec> for WorkloadSpec {
    type Error = ValidationError;
    fn try_from(r: RawWorkloadSpec) -> Result<Self, ValidationError> {
        let health_check = r
            .health_check
            .map(HealthCheck::try_from)
            .transpose()
            .map_err(|why| {
                ValidationError::new(
                    "workload",
                    format!("{}: healthCheck: {why}", r.name.as_str()),
                )
            })?;
        let spec = WorkloadSpec {
            name: r.name,
            image: r.image,
            command: r.command,
            env: r.env,
            ports: r.ports,
            volumes: r.volumes,
            restart_policy: r.restart_policy,
            labels: r.labels,
            health_check,
            resources: r.resources,
            secrets: r.secrets,
            devices: r.devices,
            groups: r.groups,
            capabilities: r.capabilities,
            privileged: r.privileged,
        };
        spec.validate()?;
        Ok(spec)
    }
}

/// Checks `r` against the OCI distribution reference grammar
/// (`[domain[:port]/]path[:tag][@algorithm:hex]`): path components are lowercase `[a-z0-9]` runs joined by
/// `.`, `_`, `__` or dashes; a tag is `[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`; the name is at most 255 characters.
/// Pure; says which part is wrong.
pub fn image_reference(r: &str) -> Result<(), String> {
    let (rest, digest) = match r.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (r, None),
    };
    if let Some(d) = digest {
        let (alg, hex) = d
            .split_once(':')
            .ok_or("the digest needs the form algorithm:hex (e.g. sha256:…)")?;
        let alg_ok = !alg.is_empty()
            && alg.split(['+', '.', '_', '-']).all(|c| {
                !c.is_empty()
                    && c.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
            });
        if !alg_ok || hex.len() < 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!("digest {} is not algorithm:hex", shown(d)));
        }
    }
    // A tag follows the last ':' only if no '/' comes after it (otherwise the ':' is a registry port).
    let (name, tag) = match rest.rfind(':') {
        Some(i) if !rest[i..].contains('/') => (&rest[..i], Some(&rest[i + 1..])),
        _ => (rest, None),
    };
    if let Some(t) = tag {
        let ok = t.len() <= 128
            && t.bytes()
                .next()
                .is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_')
            && t.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
        if !ok {
            return Err(format!(
                "tag {} must be letters, digits, '_', '.' or '-' (at most 128, not starting with '.' or '-'), and a reference has at most one tag",
                shown(t)
            ));
        }
    }
    if name.is_empty() || name.len() > 255 {
        return Err("the name must be 1–255 characters".into());
    }
    let mut parts: Vec<&str> = name.split('/').collect();
    let first = parts[0];
    // The first component is a registry when it looks like a host: a '.', a port, or `localhost`.
    if parts.len() > 1 && (first.contains(['.', ':']) || first == "localhost") {
        let (host, port) = match first.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (first, None),
        };
        let label_ok = |l: &str| {
            !l.is_empty()
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        };
        if !host.split('.').all(label_ok)
            || port.is_some_and(|p| p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()))
        {
            return Err(format!("registry {} is not a host[:port]", shown(first)));
        }
        parts.remove(0);
    }
    for c in parts {
        if c.contains(':') {
            return Err("a reference has at most one :tag (after the last '/')".into());
        }
        if !path_component(c) {
            return Err(format!(
                "name component {} must be lowercase letters and digits, joined by '.', '_', '__' or '-'",
                shown(c)
            ));
        }
    }
    Ok(())
}

/// `[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*`.
fn path_component(c: &str) -> bool {
    let b = c.as_bytes();
    let alnum = |x: u8| x.is_ascii_lowercase() || x.is_ascii_digit();
    if b.is_empty() || !alnum(b[0]) || !alnum(b[b.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        if alnum(b[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && !alnum(b[i]) {
            i += 1;
        }
        let sep = &c[start..i];
        let ok = sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|x| x == b'-');
        if !ok {
            return false;
        }
    }
    true
}

/// An environment variable name: `[A-Za-z_][A-Za-z0-9_]*`, at most 256.
pub(crate) fn env_name(k: &str) -> bool {
    k.bytes()
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && k.len() <= 256
        && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

pub(crate) fn clean_path(p: &str) -> bool {
    p.starts_with('/')
        && p.len() <= 4096
        && !p.split('/').any(|c| c == "..")
        && !p.chars().any(char::is_control)
}

impl WorkloadSpec {
    /// A spec with defaults for everything but name and image.
    pub fn new(name: WorkloadName, image: impl Into<String>) -> Result<Self, ValidationError> {
        let spec = WorkloadSpec {
            name,
            image: image.into(),
            command: vec![],
            env: BTreeMap::new(),
            ports: vec![],
            volumes: vec![],
            restart_policy: RestartPolicy::default(),
            labels: BTreeMap::new(),
            health_check: None,
            resources: None,
            secrets: vec![],
            devices: vec![],
            groups: vec![],
            capabilities: vec![],
            privileged: false,
        };
        spec.validate()?;
        Ok(spec)
    }

    /// Checks every field; every constructor and deserialization calls it.
    pub fn validate(&self) -> Result<(), ValidationError> {
        let err = |why: String| {
            Err(ValidationError::new(
                "workload",
                format!("{}: {why}", self.name.as_str()),
            ))
        };
        let printable = |s: &str| {
            !s.is_empty() && s.len() <= 512 && s.bytes().all(|b| (0x21..0x7f).contains(&b))
        };
        if self.image.chars().any(char::is_whitespace) {
            return err(format!(
                "image {} contains whitespace; an image reference has none (e.g. nginx:1.27)",
                shown(&self.image)
            ));
        }
        if !printable(&self.image) {
            return err(format!(
                "image {} must be 1–512 printable ASCII characters",
                shown(&self.image)
            ));
        }
        if let Err(why) = image_reference(&self.image) {
            return err(format!(
                "image {} is not a valid image reference: {why}",
                shown(&self.image)
            ));
        }
        if self.command.len() > 64
            || self
                .command
                .iter()
                .any(|a| a.len() > 4096 || a.contains('\0'))
        {
            return err("command has more than 64 arguments, one over 4096 bytes, or a NUL".into());
        }
        if self.env.len() > 128 {
            return err("more than 128 environment variables".into());
        }
        for (k, v) in &self.env {
            if !env_name(k) || v.len() > 32 * 1024 || v.contains('\0') {
                return err(format!("environment variable {} is invalid", shown(k)));
            }
        }
        if self.ports.len() > 64
            || self
                .ports
                .iter()
                .any(|p| p.host_port == 0 || p.container_port == 0)
        {
            return err("ports must be 1–65535, at most 64 mappings".into());
        }
        for v in &self.volumes {
            let named = v
                .source
                .bytes()
                .next()
                .is_some_and(|b| b.is_ascii_alphanumeric())
                && v.source.len() <= 255
                && v.source
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
            if !(named || clean_path(&v.source)) || !clean_path(&v.target) {
                return err(format!(
                    "volume {} -> {} is invalid",
                    shown(&v.source),
                    shown(&v.target)
                ));
            }
        }
        if self.volumes.len() > 64 || self.labels.len() > 64 {
            return err("at most 64 volumes and 64 labels".into());
        }
        for (k, v) in &self.labels {
            if k.is_empty()
                || k.len() > 253
                || v.len() > 1024
                || k.starts_with(RESERVED_LABEL_PREFIX)
            {
                return err(format!("label {} is invalid or reserved", shown(k)));
            }
        }
        if let Some(h) = &self.health_check {
            if let Err(why) = h.check(&self.ports) {
                return err(format!("healthCheck.{why}"));
            }
        }
        if let Some(r) = &self.resources {
            if let Err(why) = r.check() {
                return err(format!("resources.{why}"));
            }
        }
        if self.secrets.len() > MAX_SECRET_USES {
            return err(format!("more than {MAX_SECRET_USES} secrets"));
        }
        let mut targets = std::collections::BTreeSet::new();
        for (i, s) in self.secrets.iter().enumerate() {
            if let Err(why) = s.check() {
                return err(format!("secrets[{i}]: {why}"));
            }
            let target = s.env.as_ref().or(s.file.as_ref()).map(String::as_str);
            let clash = s.env.as_ref().is_some_and(|e| self.env.contains_key(e));
            if clash || !targets.insert(target) {
                return err(format!(
                    "secrets[{i}]: {} is given twice",
                    shown(target.unwrap_or_default())
                ));
            }
        }
        for (what, items, check) in [
            (
                "devices",
                &self.devices,
                check_device as fn(&str) -> Result<(), String>,
            ),
            ("groups", &self.groups, check_group),
            ("capabilities", &self.capabilities, check_capability),
        ] {
            if items.len() > MAX_HARDWARE_ITEMS {
                return err(format!("{what}: more than {MAX_HARDWARE_ITEMS} entries"));
            }
            for (i, item) in items.iter().enumerate() {
                if let Err(why) = check(item) {
                    return err(format!("{what}[{i}]: {why}"));
                }
            }
        }
        Ok(())
    }

    /// The host paths among its volumes (absolute sources; the rest are named volumes).
    pub fn host_paths(&self) -> impl Iterator<Item = &str> {
        self.volumes
            .iter()
            .map(|v| v.source.as_str())
            .filter(|s| s.starts_with('/'))
    }

    /// The fields of this spec an agent must advertise [`crate::Capability::WorkloadSpecV2`] for (empty: any
    /// agent runs it).
    pub fn v2_fields(&self) -> Vec<&'static str> {
        let mut f = Vec::new();
        for (name, used) in [
            ("resources", self.resources.is_some()),
            ("secrets", !self.secrets.is_empty()),
            ("devices", !self.devices.is_empty()),
            ("groups", !self.groups.is_empty()),
            ("capabilities", !self.capabilities.is_empty()),
            ("privileged", self.privileged),
        ] {
            if used {
                f.push(name);
            }
        }
        f
    }

    /// Canonical digest of the spec; stored on the container as [`LABEL_SPEC_DIGEST`].
    pub fn digest(&self) -> Sha256Hex {
        canonical_digest(WORKLOAD_DIGEST_DOMAIN, self)
    }
}

/// What a workload's container is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WorkloadState {
    /// Running with the desired spec.
    Running,
    /// Created or starting.
    Starting,
    /// Exited (and not being restarted).
    Exited,
    /// No container exists yet.
    Missing,
    /// The last reconcile of this workload failed; see `error`.
    Failed,
    /// The container of the desired spec keeps exiting and being restarted by Podman: at least
    /// [`CRASH_LOOP_RESTARTS`] restarts, the latest start within [`CRASH_LOOP_WINDOW`] ([`is_crash_looping`]).
    /// Its `restarts` say how often and how it last exited. Readers before it was added fail to read the status
    /// whole, so the operator is upgraded before the devices (docs/crds.md).
    CrashLooping,
    /// The container of the desired spec was killed by the kernel's OOM killer at its memory limit
    /// (`resources.memoryMiB`) and is not running; `restarts.oomKilled` stays true after Podman restarts it, and a
    /// repeated kill is `crash-looping`. Readers before it was added fail to read the status whole (as with
    /// `crash-looping`).
    OomKilled,
}

/// Restarts of a container (or of the agent) at which a recent restart makes it *crash-looping*: one restart is
/// an incident, three are a pattern.
pub const CRASH_LOOP_RESTARTS: u32 = 3;
/// How recent the latest (re)start must be for a restarted container or agent to count as crash-looping: one
/// that then stayed up this long has stopped looping.
pub const CRASH_LOOP_WINDOW: std::time::Duration = std::time::Duration::from_secs(10 * 60);

/// True when something restarted `restarts` times since its current spec or version started, most recently at
/// `last_start`, is crash-looping at `now`: at least [`CRASH_LOOP_RESTARTS`] restarts and the latest start
/// within [`CRASH_LOOP_WINDOW`] (a clock that went backwards counts as recent). Pure; the agent judges its
/// containers with it, the operator the agent itself.
pub fn is_crash_looping(restarts: u32, last_start: Option<Timestamp>, now: Timestamp) -> bool {
    restarts >= CRASH_LOOP_RESTARTS
        && last_start.is_some_and(|s| s >= now || now.since(s) <= CRASH_LOOP_WINDOW)
}

/// How often the container of a workload's current spec restarted (health over time: a rollout's soak needs zero
/// restarts, a crash loop is a state of its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Restarts {
    /// Podman's restart count of the container: restarts since it was created, and a changed spec is a new
    /// container, so these are the current spec's restarts.
    pub count: u32,
    /// The exit code of its latest exit, once it exited at least once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_exit_code: Option<i32>,
    /// True when its latest exit was the kernel's OOM killer at its memory limit (absent: false).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub oom_killed: bool,
}

/// Status of one workload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadStatus {
    /// The workload.
    pub name: WorkloadName,
    /// Its state.
    pub state: WorkloadState,
    /// The Podman container id, when one exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    /// Digest of the spec the container was created from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec_digest: Option<Sha256Hex>,
    /// With `state: running`: when that container last started (the device's clock, whole seconds). A restart
    /// moves it, so a rollout's soak counts from it. Absent in every other state and from agents before it was
    /// added.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Timestamp>,
    /// The latest error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<BoundedText>,
    /// Why the last reconcile of this workload failed and what keeps running meanwhile (with `state: failed`;
    /// absent from agents before it was added, and ignored by readers before it was added).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<WorkloadFailure>,
    /// How often the container of the desired spec restarted and how it last exited (absent before it was
    /// added, and while no container of the desired spec exists).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restarts: Option<Restarts>,
    /// With a `healthCheck` and a container of the desired spec that runs: `starting` (within the start period,
    /// or before a check decided), `healthy` or `unhealthy` (`retries` consecutive failures). Podman's own state
    /// for a command check, the agent's for an HTTP or TCP probe. Absent without a health check, while no
    /// container of the desired spec runs, and from agents before it was added; a value a newer agent writes
    /// reads as `unknown`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<HealthState>,
}

/// Why a workload's desired spec is not running, for an event (reason) and a person (with the status's error).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FailureReason {
    /// The image could not be pulled; nothing was touched.
    ImagePullFailed,
    /// Podman refused to create the new container; nothing running was touched.
    CreateFailed,
    /// The running container of the previous spec could not be stopped for the replacement.
    StopFailed,
    /// The new container was created but did not start.
    StartFailed,
    /// A container could not be removed.
    RemoveFailed,
    /// A Secret value the spec names has not been delivered to the device (`device-secrets`) at the version the
    /// spec names; nothing was touched.
    SecretMissing,
    /// A reason this reader does not know (written by a newer agent).
    #[serde(other)]
    Other,
}

/// What a failed workload's status says beyond its error text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadFailure {
    /// Why.
    pub reason: FailureReason,
    /// The container of the previous spec that keeps running (never stopped, or started again), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running_container_id: Option<String>,
    /// Its spec digest (the previous spec's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running_spec_digest: Option<Sha256Hex>,
    /// True when the new container was created but did not start and the previous one was started again.
    #[serde(default)]
    pub rolled_back: bool,
}

/// Status of every workload on a device, published at a fixed interval.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceWorkloadStatus {
    /// The device.
    pub device_id: DeviceId,
    /// The desired-state generation last applied.
    pub generation: u64,
    /// When this was measured.
    pub at: Timestamp,
    /// One entry per desired or owned workload.
    pub workloads: Vec<WorkloadStatus>,
    /// Why the latest desired state could not be taken (e.g. a field this agent does not know), while the agent
    /// keeps running generation `generation`; absent when it took it, and from agents before it was added.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired_error: Option<BoundedText>,
}

#[cfg(test)]
mod tests {
    #[test]
    fn crash_loop_rule() {
        let at = |s: u64| Timestamp::from_unix_ms(1_800_000_000_000 + s * 1000);
        let w = CRASH_LOOP_WINDOW.as_secs();
        let rows = [
            ("no restarts", 0, Some(at(0)), at(1), false),
            ("two restarts: an incident", 2, Some(at(0)), at(1), false),
            (
                "three, the latest start just now",
                3,
                Some(at(0)),
                at(1),
                true,
            ),
            (
                "three, the latest start at the window's end",
                3,
                Some(at(0)),
                at(w),
                true,
            ),
            (
                "three, then up for longer than the window",
                3,
                Some(at(0)),
                at(w + 1),
                false,
            ),
            ("three, no start known", 3, None, at(1), false),
            ("a clock that went backwards", 5, Some(at(100)), at(1), true),
        ];
        for (name, restarts, start, now, want) in rows {
            assert_eq!(is_crash_looping(restarts, start, now), want, "{name}");
        }
    }

    use super::*;
    use crate::fixtures;

    #[test]
    fn validation() {
        let ok = fixtures::workload("web");
        assert!(ok.validate().is_ok());
        let mut bad = ok.clone();
        bad.labels.insert(LABEL_MANAGED.into(), "false".into());
        assert!(bad.validate().is_err(), "reserved label");
        let mut bad = ok.clone();
        bad.volumes.push(VolumeMount {
            source: "/srv/../etc".into(),
            target: "/x".into(),
            read_only: false,
        });
        assert!(bad.validate().is_err(), "dot-dot");
        let mut bad = ok.clone();
        bad.env.insert("BAD-NAME".into(), "x".into());
        assert!(bad.validate().is_err(), "env name");
        let mut bad = ok.clone();
        bad.image = "two words".into();
        assert!(bad.validate().is_err(), "image");
        assert!(WorkloadName::try_from("Web").is_err());
        bad.image = "nginx latest".into();
        let e = bad.validate().expect_err("whitespace").to_string();
        assert!(e.contains("whitespace"), "{e}");
    }

    #[test]
    fn image_reference_table() {
        let good = [
            "nginx",
            "nginx:1.27",
            "library/nginx:latest",
            "docker.io/library/nginx:1.27-alpine",
            "localhost/busybox:1.36",
            "localhost:5000/team/app_x__y:v1.0",
            "registry.example.com:443/a/b-c.d",
            "quay.io/x/y@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "nginx:1@sha256:0123456789abcdef0123456789abcdef",
        ];
        for r in good {
            assert_eq!(image_reference(r), Ok(()), "{r}");
        }
        let bad = [
            ("Nginx:Latest:bad", "one :tag"),
            ("Nginx", "name component"),
            ("nginx:", "tag"),
            ("nginx:-x", "tag"),
            ("a//b", "name component"),
            ("a-/b", "name component"),
            ("a..b", "name component"),
            ("exa_mple.com/x", "registry"),
            ("host:abc/x", "registry"),
            ("nginx@sha256:zz", "digest"),
            ("nginx@latest", "digest"),
            ("", "name"),
        ];
        for (r, frag) in bad {
            let e = image_reference(r).expect_err(r);
            assert!(e.contains(frag), "{r}: {e}");
        }
    }

    #[test]
    fn desired_state_rejects_duplicates_and_defaults_fields() {
        let d = fixtures::device();
        let dup = DesiredState::new(
            d.clone(),
            1,
            vec![fixtures::workload("a"), fixtures::workload("a")],
        );
        assert!(dup.is_err());
        let json = r#"{"deviceId":"device-1","generation":3,"workloads":[{"name":"a","image":"localhost/busybox:1"}]}"#;
        let s: DesiredState = serde_json::from_str(json).expect("minimal spec");
        assert_eq!(s.workloads[0].restart_policy, RestartPolicy::Always);
        let bad = r#"{"deviceId":"device-1","generation":3,"workloads":[{"name":"a","image":"x","labels":{"io.nationtech.fleet.managed":"no"}}]}"#;
        assert!(serde_json::from_str::<DesiredState>(bad).is_err());
    }

    #[test]
    fn health_check_errors_name_the_field() {
        let spec = |hc: &str| {
            format!(
                r#"{{"name":"web","image":"nginx","ports":[{{"hostPort":18080,"containerPort":80}}],"healthCheck":{hc}}}"#
            )
        };
        let ok: WorkloadSpec =
            serde_json::from_str(&spec(r#"{"http":{"port":80,"path":"/ready"}}"#)).expect("valid");
        assert_eq!(ok.health_check.as_ref().and_then(|h| h.port()), Some(80));
        let cases = [
            (
                r#"{"http":{"port":80},"intervalSeconds":1}"#,
                "invalid workload: web: healthCheck.intervalSeconds: 1 is outside 5–3600",
            ),
            (
                r#"{"tcp":{"port":81}}"#,
                "invalid workload: web: healthCheck.tcp.port: container port 81 is not published",
            ),
            (
                r#"{}"#,
                "invalid workload: web: healthCheck: needs exactly one of command, http or tcp",
            ),
            (r#"{"command":["true"],"bogus":1}"#, "unknown field `bogus`"),
            (
                r#"{"command":["true"],"retries":11}"#,
                "web: healthCheck.retries: 11 is outside 1–10",
            ),
        ];
        for (hc, want) in cases {
            let e = serde_json::from_str::<WorkloadSpec>(&spec(hc)).expect_err(hc);
            assert!(e.to_string().contains(want), "{hc}: {e}");
        }
        // A spec built in code is checked the same way.
        let mut w = fixtures::workload("web");
        w.health_check = Some(HealthCheck::new(crate::HealthProbe::Tcp(crate::TcpProbe {
            port: 9999,
        })));
        let e = w.validate().expect_err("unpublished").to_string();
        assert!(e.contains("healthCheck.tcp.port"), "{e}");
    }

    #[test]
    fn digest_changes_with_the_spec() {
        let a = fixtures::workload("a");
        let mut b = a.clone();
        b.env.insert("X".into(), "1".into());
        assert_ne!(a.digest(), b.digest());
    }
}
