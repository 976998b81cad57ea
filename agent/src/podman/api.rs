//! libpod REST API calls the agent needs: ping, list its labelled containers, make sure an image is present
//! (pulling it only when it is missing), create, start, rename, stop, remove, and Podman's health checks (the
//! state of one, and running one where Podman's own timer does not).

use super::http::{self, HttpError};
use super::registry_auth;
use fleet_wire::secrets::RegistryAuth;
use fleet_wire::workload::{
    LABEL_DEVICE, LABEL_MANAGED, LABEL_SCHEMA, LABEL_SCHEMA_VERSION, LABEL_SPEC_DIGEST,
    LABEL_WORKLOAD,
};
use fleet_wire::{DeviceId, HealthProbe, HealthState, WorkloadName, WorkloadSpec};
use serde::Deserialize;
use serde_json::json;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// API version prefix; Podman 4.x serves it.
pub(super) const API: &str = "/v4.0.0/libpod";
/// Time-out of quick calls (list, inspect, create, start, remove).
pub(super) const QUICK: Duration = Duration::from_secs(30);
/// A container started more than this after its creation may have been restarted: its count is asked for.
const RESTART_SLACK_SECS: i64 = 5;
/// Time-out of an image pull.
const PULL: Duration = Duration::from_secs(5 * 60);
/// Largest log file of one workload's container (Podman's `k8s-file` driver truncates it there): what a
/// diagnostics bundle reads its newest lines from.
pub const CONTAINER_LOG_MAX_BYTES: i64 = 8 * 1024 * 1024;

/// A Podman failure.
#[derive(Debug, thiserror::Error)]
pub enum PodmanError {
    /// The socket could not be used.
    #[error("{0}")]
    Http(#[from] HttpError),
    /// Podman refused a call (an error status); shown as what failed and Podman's own reason.
    #[error("{}: {message} (Podman answered HTTP {status})", what(call))]
    Status {
        /// The call (`METHOD /path`).
        call: String,
        /// HTTP status.
        status: u16,
        /// Podman's message.
        message: String,
    },
    /// An image pull that Podman reported as failed in its progress stream (the HTTP status itself is 200).
    #[error("image {image} could not be pulled: {message}")]
    Pull {
        /// The image reference.
        image: String,
        /// Podman's reason (e.g. `manifest unknown`, a DNS or TLS error).
        message: String,
    },
    /// The registry refused the pull: wrong, expired or missing credentials (`image-pull-failed: unauthorized`).
    #[error("image-pull-failed: unauthorized: registry {registry} refused image {image} {}: {message}", if *with_credentials { "with the credentials delivered to this device" } else { "without credentials (none delivered to this device for it)" })]
    Unauthorized {
        /// The image reference.
        image: String,
        /// Its registry (`host[:port]`).
        registry: String,
        /// Whether credentials were sent.
        with_credentials: bool,
        /// Podman's reason (the registry's answer; the credentials are not in it).
        message: String,
    },
    /// A host-path volume whose source does not resolve to itself ([`super::host_paths`]).
    #[error("volume source {path} {why}")]
    HostPath {
        /// The source as the spec names it.
        path: String,
        /// What it resolves to, or why it does not.
        why: String,
    },
    /// The device's registry credentials could not be read (NATS) before a pull that may need them.
    #[error("image-pull-failed: the credentials for registry {registry} could not be read: {why}")]
    Credentials {
        /// The registry.
        registry: String,
        /// Why (a NATS error).
        why: String,
    },
    /// The answer did not have the expected shape.
    #[error("Podman gave an unexpected answer to {call}: {message}")]
    Decode {
        /// The call.
        call: String,
        /// What was wrong.
        message: String,
    },
}

impl PodmanError {
    /// True when the caller stopped waiting (a pull abandoned for a newer desired state or a drain): nothing
    /// failed, so nothing is reported.
    pub fn is_cancelled(&self) -> bool {
        matches!(self, Self::Http(HttpError::Cancelled))
    }
}

/// What a Podman call does, in words a person reads in a workload error (`POST /containers/create` → "creating
/// the container").
fn what(call: &str) -> String {
    let (method, path) = call.split_once(' ').unwrap_or(("", call));
    let last = path.rsplit('/').next().unwrap_or_default();
    if path.starts_with("/secrets") {
        return match method {
            "POST" => "creating a Podman secret".into(),
            "DELETE" => "removing a Podman secret".into(),
            _ => "listing Podman secrets".into(),
        };
    }
    match (method, last) {
        ("POST", "create") => "creating the container".into(),
        ("POST", "start") => "starting the container".into(),
        ("POST", "stop") => "stopping the container".into(),
        ("POST", "rename") => "renaming the container".into(),
        ("DELETE", _) => "removing the container".into(),
        ("POST", "pull") => "pulling the image".into(),
        ("GET", "json") => "listing containers".into(),
        ("GET", "_ping") => "reaching Podman".into(),
        _ => format!("Podman {call}"),
    }
}

/// A container as listed by Podman.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// Container id.
    pub id: String,
    /// First name.
    pub name: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Podman state: `created`, `running`, `exited`, ...
    pub state: String,
    /// Start time (Unix seconds), 0 if never started.
    pub started_at: i64,
    /// How often Podman restarted it under its restart policy (since it was created); 0 until
    /// [`Podman::count_restarts`] filled it in where the list did not say.
    pub restarts: u32,
    /// The exit code of its latest exit, as the list shows it (Podman 4 resets it when it restarts the
    /// container: only an exited container's is known).
    pub exit_code: i32,
    /// True when it is exited now (Podman's `Exited`).
    pub exited: bool,
    /// Creation time (Unix seconds).
    pub created: i64,
    /// The list carried no restart count (Podman before 4.4): [`Podman::count_restarts`] asks for it.
    pub restarts_unknown: bool,
    /// Podman's health of a container with a healthcheck (libpod's list says it in `Status`); `None` without one.
    pub health: Option<HealthState>,
    /// The kernel's OOM killer ended it at its latest exit: inspect's `State.OOMKilled` ([`Podman::count_restarts`]
    /// asks only for a container that restarted or exited non-zero) or the agent's own judgement
    /// ([`crate::oom::OomWatch`]); false until either said so.
    pub oom_killed: bool,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ListEntry {
    id: String,
    #[serde(default)]
    names: Vec<String>,
    #[serde(default)]
    labels: Option<BTreeMap<String, String>>,
    #[serde(default)]
    state: String,
    #[serde(default)]
    started_at: i64,
    #[serde(default)]
    restarts: Option<u32>,
    #[serde(default)]
    exit_code: i32,
    #[serde(default)]
    exited: bool,
    /// Unix seconds in some versions, RFC 3339 text in Podman 4.3's libpod API.
    #[serde(default)]
    created: serde_json::Value,
    /// libpod's list puts the health here: `healthy`, `unhealthy`, `starting`, or empty without a healthcheck.
    #[serde(default)]
    status: String,
}

/// A list entry's creation time in Unix seconds; 0 when it cannot be read (the restart count is then asked for,
/// which costs an inspect but never misses a restart).
fn created_secs(v: &serde_json::Value) -> i64 {
    match v {
        serde_json::Value::Number(n) => n.as_i64().unwrap_or(0),
        serde_json::Value::String(s) => s
            .parse::<fleet_wire::Timestamp>()
            .map(|t| i64::try_from(t.unix_ms() / 1000).unwrap_or(0))
            .unwrap_or(0),
        _ => 0,
    }
}

/// Podman's health name (libpod's list `Status`, inspect's `State.Health.Status`) as a health state; `None` for
/// no healthcheck (empty) or a text this agent does not know.
pub fn podman_health(s: &str) -> Option<HealthState> {
    match s {
        "healthy" => Some(HealthState::Healthy),
        "unhealthy" => Some(HealthState::Unhealthy),
        "starting" => Some(HealthState::Starting),
        _ => None,
    }
}

/// A container's healthcheck record as `inspect` shows it (`State.Health`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthLog {
    /// Podman's health.
    pub state: Option<HealthState>,
    /// How many checks Podman recorded (it keeps the latest five): 0 means no check ever ran.
    pub runs: usize,
    /// The latest check's exit code and the start of its output.
    pub last: Option<(i32, String)>,
    /// When the latest check started, as Podman wrote it (RFC 3339): a new run has another.
    pub last_start: Option<String>,
}

/// Most characters of a check's output kept for an error text.
const HEALTH_OUTPUT_CHARS: usize = 200;

/// A call Podman refused with `status`, with its own reason (`message` of its JSON answer, else the body's start).
pub(super) fn status_error(method: &str, path: &str, status: u16, body: &[u8]) -> PodmanError {
    let message = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("message").and_then(|m| m.as_str()).map(str::to_owned))
        .unwrap_or_else(|| String::from_utf8_lossy(body).chars().take(512).collect());
    PodmanError::Status {
        call: format!("{method} {}", path.split('?').next().unwrap_or(path)),
        status,
        message,
    }
}

/// A libpod API client bound to one socket.
#[derive(Debug, Clone)]
pub struct Podman {
    socket: PathBuf,
    stop_timeout: Duration,
}

pub(super) fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

impl Podman {
    /// A client for the socket at `socket`; `stop_timeout` is Podman's grace period before it kills.
    pub fn new(socket: &Path, stop_timeout: Duration) -> Self {
        Self {
            socket: socket.to_owned(),
            stop_timeout,
        }
    }

    /// The socket path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    pub(super) fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&serde_json::Value>,
        timeout: Duration,
        ok: &[u16],
    ) -> Result<Vec<u8>, PodmanError> {
        self.call_until(method, path, body, timeout, ok, &|| false)
    }

    fn call_until(
        &self,
        method: &str,
        path: &str,
        body: Option<&serde_json::Value>,
        timeout: Duration,
        ok: &[u16],
        cancel: &dyn Fn() -> bool,
    ) -> Result<Vec<u8>, PodmanError> {
        let bytes = body.map(|b| b.to_string().into_bytes());
        let body = bytes.as_deref().map(|b| ("application/json", b));
        self.call_with(method, path, body, &[], timeout, ok, cancel)
    }

    /// A call with a body of any content type (`(type, bytes)`) and extra headers (e.g. `X-Registry-Auth`: a
    /// header value appears in no error).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn call_with(
        &self,
        method: &str,
        path: &str,
        body: Option<(&str, &[u8])>,
        headers: &[(&str, &str)],
        timeout: Duration,
        ok: &[u16],
        cancel: &dyn Fn() -> bool,
    ) -> Result<Vec<u8>, PodmanError> {
        let r = http::request_with(
            &self.socket,
            method,
            &format!("{API}{path}"),
            body,
            headers,
            timeout,
            cancel,
        )?;
        if ok.contains(&r.status) {
            return Ok(r.body);
        }
        Err(status_error(method, path, r.status, &r.body))
    }

    /// `GET /_ping`: Podman answers.
    pub fn ping(&self) -> Result<(), PodmanError> {
        self.call("GET", "/_ping", None, Duration::from_secs(10), &[200])
            .map(|_| ())
    }

    /// Every container carrying the managed label, running or not.
    pub fn list_managed(&self) -> Result<Vec<Observed>, PodmanError> {
        self.list(&[format!("{LABEL_MANAGED}=true")])
    }

    /// The managed containers labelled as workload `name` (any device, any spec): what a pass that changes only
    /// this workload needs to see. Podman still checks every container's labels, but reads the state of these
    /// only, so the call does not grow with the number of unchanged workloads the way [`Self::list_managed`] does.
    pub fn list_workload(&self, name: &WorkloadName) -> Result<Vec<Observed>, PodmanError> {
        self.list(&[
            format!("{LABEL_MANAGED}=true"),
            format!("{LABEL_WORKLOAD}={}", name.as_str()),
        ])
    }

    /// The list entries of the containers matching every label filter (`key=value`; Podman ANDs them), decoded
    /// into the part the caller names.
    pub(super) fn list_entries<T: serde::de::DeserializeOwned>(
        &self,
        labels: &[String],
        timeout: Duration,
    ) -> Result<Vec<T>, PodmanError> {
        let filters = json!({ "label": labels }).to_string();
        let body = self.call(
            "GET",
            &format!("/containers/json?all=true&filters={}", enc(&filters)),
            None,
            timeout,
            &[200],
        )?;
        serde_json::from_slice(&body).map_err(|e| PodmanError::Decode {
            call: "list containers".into(),
            message: e.to_string(),
        })
    }

    /// Containers matching every label filter (`key=value`; Podman ANDs them), managed ones only.
    fn list(&self, labels: &[String]) -> Result<Vec<Observed>, PodmanError> {
        let list: Vec<ListEntry> = self.list_entries(labels, QUICK)?;
        Ok(list
            .into_iter()
            .map(|e| Observed {
                id: e.id,
                name: e.names.into_iter().next().unwrap_or_default(),
                labels: e.labels.unwrap_or_default(),
                state: e.state,
                started_at: e.started_at,
                restarts: e.restarts.unwrap_or(0),
                exit_code: e.exit_code,
                exited: e.exited,
                created: created_secs(&e.created),
                restarts_unknown: e.restarts.is_none(),
                health: podman_health(&e.status),
                oom_killed: false,
            })
            // Defence in depth: never act on a container without the label, whatever the filter did.
            .filter(|o| o.labels.get(LABEL_MANAGED).map(String::as_str) == Some("true"))
            .collect())
    }

    /// Makes sure Podman has `image`, pulling it only when it is missing; true when it pulled. While the pull runs
    /// it asks `cancel` every [`http::CANCEL_POLL`] and gives up when it says so (the pull is abandoned, not
    /// failed). Touches no container.
    ///
    /// `auth` is asked for the credentials of the image's registry only when a pull is needed (the caller reads
    /// them fresh then, so a rotated credential is used by the next pull); they go to Podman in the
    /// `X-Registry-Auth` header, never to a file. A pull the registry refused is [`PodmanError::Unauthorized`].
    pub fn ensure_image(
        &self,
        image: &str,
        auth: &mut dyn FnMut(&str) -> Result<Option<RegistryAuth>, String>,
        cancel: &dyn Fn() -> bool,
    ) -> Result<bool, PodmanError> {
        let exists = self.call(
            "GET",
            &format!("/images/{}/exists", enc(image)),
            None,
            QUICK,
            &[204, 404],
        );
        // `exists` answers 204 with an empty body and 404 with a JSON message.
        if let Ok(body) = &exists {
            if body.is_empty() {
                return Ok(false);
            }
        }
        let host = fleet_wire::secrets::registry_of(image);
        let creds = auth(host).map_err(|why| PodmanError::Credentials {
            registry: host.to_owned(),
            why,
        })?;
        let header = creds.as_ref().map(|a| registry_auth::header_value(host, a));
        let headers: Vec<(&str, &str)> = header
            .as_deref()
            .map(|h| (registry_auth::HEADER, h))
            .into_iter()
            .collect();
        let body = self.call_with(
            "POST",
            &format!("/images/pull?reference={}&quiet=true", enc(image)),
            None,
            &headers,
            PULL,
            &[200],
            cancel,
        )?;
        // The pull answers 200 and streams progress objects; a failure is an object with "error".
        for line in body.split(|b| *b == b'\n') {
            if let Ok(v) = serde_json::from_slice::<serde_json::Value>(line) {
                if let Some(e) = v.get("error").and_then(|e| e.as_str()) {
                    if !e.is_empty() && registry_auth::is_unauthorized(e) {
                        return Err(PodmanError::Unauthorized {
                            image: image.to_owned(),
                            registry: host.to_owned(),
                            with_credentials: creds.is_some(),
                            message: e.trim().chars().take(512).collect(),
                        });
                    }
                    if !e.is_empty() {
                        return Err(PodmanError::Pull {
                            image: image.to_owned(),
                            message: e.trim().chars().take(512).collect(),
                        });
                    }
                }
            }
        }
        Ok(true)
    }

    /// Creates the container for `spec` with the agent's labels; returns its id. The image must be present
    /// ([`Self::ensure_image`] first): a create never pulls, so nothing is touched before the image is known good.
    pub fn create(&self, device: &DeviceId, spec: &WorkloadSpec) -> Result<String, PodmanError> {
        let workload = spec.name.as_str();
        super::host_paths::check(spec.host_paths())
            .map_err(|(path, why)| PodmanError::HostPath { path, why })?;
        let body = create_body(device, spec);
        let out = self.call("POST", "/containers/create", Some(&body), QUICK, &[201])?;
        crate::timing::mark("created", format_args!("workload={workload}"));
        serde_json::from_slice::<serde_json::Value>(&out)
            .ok()
            .and_then(|v| v.get("Id").and_then(|i| i.as_str()).map(str::to_owned))
            .ok_or_else(|| PodmanError::Decode {
                call: "create container".into(),
                message: "no Id".into(),
            })
    }

    /// Fills in the restart count of each container whose list entry had none (Podman 4.3's list does not carry
    /// it) and whether its latest exit was an OOM kill, from one `inspect` per container that may have either to
    /// tell ([`exits_unknown`]) — one that never restarted nor failed needs no question, so a quiet device asks
    /// nothing. A failed inspect leaves 0 and false.
    pub fn count_restarts(&self, observed: &mut [Observed]) {
        for o in observed.iter_mut().filter(|o| exits_unknown(o)) {
            match self.inspect_exits(&o.id) {
                Ok((n, oom)) => {
                    if o.restarts_unknown {
                        o.restarts = n;
                    }
                    o.oom_killed = oom;
                }
                Err(e) => log::debug!("restart count of {}: {e}", o.name),
            }
        }
    }

    /// The restart count and `State.OOMKilled` of one container.
    fn inspect_exits(&self, id: &str) -> Result<(u32, bool), PodmanError> {
        #[derive(Deserialize, Default)]
        struct State {
            #[serde(rename = "OOMKilled", default)]
            oom_killed: bool,
        }
        #[derive(Deserialize)]
        struct Inspect {
            #[serde(rename = "RestartCount", default)]
            restart_count: u32,
            #[serde(rename = "State", default)]
            state: State,
        }
        self.inspect::<Inspect>(id)
            .map(|i| (i.restart_count, i.state.oom_killed))
    }

    /// `GET /containers/{id}/json`, decoded into the part of the inspect document the caller names.
    pub(super) fn inspect<T: serde::de::DeserializeOwned>(
        &self,
        id: &str,
    ) -> Result<T, PodmanError> {
        let body = self.call(
            "GET",
            &format!("/containers/{}/json", enc(id)),
            None,
            QUICK,
            &[200],
        )?;
        serde_json::from_slice(&body).map_err(|e| PodmanError::Decode {
            call: "inspect container".into(),
            message: e.to_string(),
        })
    }

    /// The healthcheck record of container `id` (`State.Health` of its inspect).
    pub fn health_log(&self, id: &str) -> Result<HealthLog, PodmanError> {
        #[derive(Deserialize)]
        #[serde(rename_all = "PascalCase")]
        struct Run {
            #[serde(default)]
            start: String,
            #[serde(default)]
            exit_code: i32,
            #[serde(default)]
            output: String,
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "PascalCase")]
        struct Health {
            #[serde(default)]
            status: String,
            #[serde(default)]
            log: Option<Vec<Run>>,
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "PascalCase")]
        struct State {
            #[serde(default)]
            health: Option<Health>,
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "PascalCase")]
        struct Inspect {
            state: State,
        }
        let i: Inspect = self.inspect(id)?;
        let h = i.state.health.unwrap_or(Health {
            status: String::new(),
            log: None,
        });
        let log = h.log.unwrap_or_default();
        Ok(HealthLog {
            state: podman_health(&h.status),
            runs: log.len(),
            last: log.last().map(|r| {
                let out = r.output.trim();
                let out: String = out.chars().take(HEALTH_OUTPUT_CHARS).collect();
                (r.exit_code, out)
            }),
            last_start: log.last().map(|r| r.start.clone()),
        })
    }

    /// Runs container `id`'s healthcheck once, now (`GET /containers/{id}/healthcheck`): Podman executes it and
    /// records the result in the container's health, as its own timer would. True when this run passed. Bounded by
    /// `timeout` (the check's own timeout, which Podman enforces, plus slack).
    pub fn run_healthcheck(&self, id: &str, timeout: Duration) -> Result<bool, PodmanError> {
        let body = self.call(
            "GET",
            &format!("/containers/{}/healthcheck", enc(id)),
            None,
            timeout,
            &[200],
        )?;
        let v: serde_json::Value =
            serde_json::from_slice(&body).map_err(|e| PodmanError::Decode {
                call: "run healthcheck".into(),
                message: e.to_string(),
            })?;
        Ok(v.get("Status").and_then(|s| s.as_str()) == Some("healthy"))
    }

    /// Starts a container (already running is fine).
    pub fn start(&self, id: &str) -> Result<(), PodmanError> {
        self.call(
            "POST",
            &format!("/containers/{}/start", enc(id)),
            None,
            QUICK,
            &[204, 304],
        )
        .map(|_| ())
    }

    /// Renames a container (running or not): the old container of a workload steps aside under another name
    /// while the new one is created, so it can be named back and started again if the new one fails.
    pub fn rename(&self, id: &str, name: &str) -> Result<(), PodmanError> {
        self.call(
            "POST",
            &format!("/containers/{}/rename?name={}", enc(id), enc(name)),
            None,
            QUICK,
            &[204],
        )
        .map(|_| ())
    }

    /// The container's name as Podman's own database has it. A rename that fails part-way (no space left for
    /// its storage's record) may have changed it there all the same: the caller looks rather than assumes.
    pub fn name_of(&self, id: &str) -> Result<String, PodmanError> {
        #[derive(Deserialize)]
        struct Inspect {
            #[serde(rename = "Name")]
            name: String,
        }
        self.inspect::<Inspect>(id).map(|i| i.name)
    }

    /// Stops a container (grace period, then kill); already stopped or gone is fine.
    pub fn stop(&self, id: &str) -> Result<(), PodmanError> {
        let grace = self.stop_timeout.as_secs();
        self.call(
            "POST",
            &format!("/containers/{}/stop?timeout={grace}", enc(id)),
            None,
            QUICK + self.stop_timeout,
            &[204, 304, 404],
        )
        .map(|_| ())
    }

    /// Stops (grace period, then kill) and removes a container.
    pub fn remove(&self, id: &str) -> Result<(), PodmanError> {
        self.stop(id)?;
        self.call(
            "DELETE",
            &format!("/containers/{}?force=true&timeout=0", enc(id)),
            None,
            QUICK,
            &[200, 204, 404],
        )
        .map(|_| ())
    }
}

/// True when the list does not tell all of a container's restarts and latest exit: it started later than
/// [`RESTART_SLACK_SECS`] after its creation and the list carries no restart count (Podman 4.3), or it restarted,
/// or it is exited non-zero (an OOM kill ends the main process with 137, and a shell whose child the killer took
/// with what the shell makes of it).
fn exits_unknown(o: &Observed) -> bool {
    (o.restarts_unknown && o.started_at > o.created + RESTART_SLACK_SECS)
        || o.restarts > 0
        || (o.state != "running" && o.exit_code != 0)
}

/// The libpod `SpecGenerator` for a workload.
pub fn create_body(device: &DeviceId, spec: &WorkloadSpec) -> serde_json::Value {
    let mut labels = spec.labels.clone();
    labels.insert(LABEL_MANAGED.into(), "true".into());
    labels.insert(LABEL_WORKLOAD.into(), spec.name.as_str().into());
    labels.insert(LABEL_DEVICE.into(), device.as_str().into());
    labels.insert(LABEL_SPEC_DIGEST.into(), spec.digest().to_string());
    labels.insert(LABEL_SCHEMA.into(), LABEL_SCHEMA_VERSION.into());
    let ports: Vec<_> = spec
        .ports
        .iter()
        .map(|p| {
            json!({
                "host_port": p.host_port,
                "container_port": p.container_port,
                "protocol": match p.protocol { fleet_wire::Protocol::Tcp => "tcp", fleet_wire::Protocol::Udp => "udp" },
            })
        })
        .collect();
    let ro = |r: bool| if r { vec!["ro"] } else { vec!["rw"] };
    let mounts: Vec<_> = spec
        .volumes
        .iter()
        .filter(|v| v.source.starts_with('/'))
        .map(|v| json!({"type": "bind", "source": v.source, "destination": v.target, "options": ro(v.read_only)}))
        .collect();
    let volumes: Vec<_> = spec
        .volumes
        .iter()
        .filter(|v| !v.source.starts_with('/'))
        .map(|v| json!({"Name": v.source, "Dest": v.target, "Options": ro(v.read_only)}))
        .collect();
    let mut body = json!({
        "name": spec.name.container_name(),
        "image": spec.image,
        "env": spec.env,
        "labels": labels,
        "portmappings": ports,
        "mounts": mounts,
        "volumes": volumes,
        "restart_policy": spec.restart_policy.podman_name(),
        // A file of the agent's own user, bounded: with Podman's default on Debian (journald) the entries of a
        // system user's containers go to the system journal, which the agent's user cannot read, and every
        // diagnostics request's workload logs failed ("initial journal cursor: failed to get cursor").
        "log_configuration": {"driver": "k8s-file", "size": CONTAINER_LOG_MAX_BYTES},
    });
    if !spec.command.is_empty() {
        body["command"] = json!(spec.command);
    }
    super::secrets::apply(&mut body, spec);
    if let Some(h) = spec.health_check.as_ref() {
        if let HealthProbe::Command(argv) = &h.probe {
            // Podman's native healthcheck: `podman ps` shows it, and Podman runs it from a systemd timer of its own
            // (the agent runs it through the API where that timer does not exist: crate::health).
            let ns = |secs: u32| u64::from(secs) * 1_000_000_000;
            let mut test = vec!["CMD".to_owned()];
            test.extend(argv.iter().cloned());
            body["healthconfig"] = json!({
                "Test": test,
                "Interval": ns(h.interval_seconds),
                "Timeout": ns(h.timeout_seconds),
                "Retries": h.retries,
                "StartPeriod": ns(h.start_period_seconds),
            });
        }
    }
    super::limits::apply(&mut body, spec, &super::limits::read_group_file());
    body
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_wire::fixtures;

    /// A list entry as Podman 4.3's libpod API writes it (captured from `GET /libpod/containers/json`): `Created`
    /// is RFC 3339 text and there is no `Restarts`; a newer Podman writes Unix seconds. Either decodes.
    #[test]
    fn list_entries_of_podman_4_3_and_later_decode() {
        let v43 = r#"{"Id":"ab","Names":["fleet-web"],"Labels":{},"State":"running","StartedAt":1796605634,
            "ExitCode":0,"Exited":false,"Created":"2026-12-07T01:07:05.772509649Z","Status":""}"#;
        let e: ListEntry = serde_json::from_str(v43).expect("4.3 entry");
        assert_eq!(
            (e.restarts, created_secs(&e.created)),
            (None, 1_796_605_625)
        );
        let later =
            r#"{"Id":"ab","State":"running","StartedAt":5,"Created":1796605625,"Restarts":2}"#;
        let e: ListEntry = serde_json::from_str(later).expect("later entry");
        assert_eq!(
            (e.restarts, created_secs(&e.created)),
            (Some(2), 1_796_605_625)
        );
        let odd = r#"{"Id":"ab","Created":"yesterday"}"#;
        let e: ListEntry = serde_json::from_str(odd).expect("odd entry");
        assert_eq!(
            created_secs(&e.created),
            0,
            "unknown: the count is asked for"
        );
    }

    #[test]
    fn errors_are_worded_for_people() {
        let pull = PodmanError::Pull {
            image: "localhost/nope:1".into(),
            message: "manifest unknown".into(),
        };
        assert_eq!(
            pull.to_string(),
            "image localhost/nope:1 could not be pulled: manifest unknown"
        );
        let create = PodmanError::Status {
            call: "POST /containers/create".into(),
            status: 500,
            message: "port 80 is already in use".into(),
        };
        assert_eq!(
            create.to_string(),
            "creating the container: port 80 is already in use (Podman answered HTTP 500)"
        );
        let start = PodmanError::Status {
            call: "POST /containers/3f2a/start".into(),
            status: 500,
            message: "x".into(),
        };
        assert!(start.to_string().starts_with("starting the container: x"));
    }

    #[test]
    fn create_body_carries_labels_and_spec() {
        let w = fixtures::workload("web");
        let b = create_body(&fixtures::device(), &w);
        assert_eq!(b["name"], "fleet-web");
        assert_eq!(b["labels"][LABEL_MANAGED], "true");
        assert_eq!(b["labels"][LABEL_SPEC_DIGEST], w.digest().to_string());
        assert_eq!(b["labels"]["app"], "web");
        assert_eq!(b["volumes"][0]["Name"], "web-data");
        assert_eq!(b["portmappings"][0]["host_port"], 8080);
        assert_eq!(b["restart_policy"], "always");
        assert_eq!(b["log_configuration"]["driver"], "k8s-file");
        assert_eq!(enc("a b/c"), "a%20b%2Fc");
        assert!(b.get("healthconfig").is_none(), "no health check");
    }

    /// A command check becomes Podman's native healthcheck (argv form, nanoseconds); an HTTP or TCP probe is the
    /// agent's and gives Podman none.
    #[test]
    fn create_body_carries_a_command_check_as_podmans_healthcheck() {
        let w = fixtures::workload_with_health("web", "command");
        let b = create_body(&fixtures::device(), &w);
        assert_eq!(
            b["healthconfig"],
            json!({
                "Test": ["CMD", "wget", "-q", "-O-", "http://127.0.0.1:8080/healthz"],
                "Interval": 10_000_000_000u64,
                "Timeout": 2_000_000_000u64,
                "Retries": 3,
                "StartPeriod": 15_000_000_000u64,
            })
        );
        for kind in ["http", "tcp"] {
            let b = create_body(
                &fixtures::device(),
                &fixtures::workload_with_health("web", kind),
            );
            assert!(b.get("healthconfig").is_none(), "{kind}");
        }
        assert_eq!(podman_health("unhealthy"), Some(HealthState::Unhealthy));
        assert_eq!(podman_health("starting"), Some(HealthState::Starting));
        assert_eq!(podman_health(""), None);
        assert_eq!(podman_health("Up 3 seconds"), None);
    }
}
