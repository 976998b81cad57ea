//! A local fleet driven by the real operator: nats-server, the [`Cluster`] (apiserver, CRDs, RBAC,
//! `fleet-operator`), an HTTPS artifact server, and nspawn devices installed with device setup that register
//! themselves (the operator creates their Device objects). Shared by the end-to-end test and `scripts/demo`;
//! what it reads back comes from the cluster (kubectl) and from the devices, never from what was asked for.

use crate::builds::{self, V1, V3};
use crate::cluster::Cluster;
use crate::fleet::{start_nats, Artifacts, Device, GUEST_TOKEN_FILE};
use fleet_rig::callout::{FleetNats, NatsAuth};
use fleet_wire::{AgentUpgradeStatus, UpgradePhase};
use std::path::PathBuf;
use std::time::Duration;

/// Where the real v3 agent is placed in each guest, for the broken v3 candidate to `exec` for its probe.
pub const REAL_V3: &str = "/opt/fleet-test/fleet-agent-real-v3";
/// The API group and version of the fleet CRDs.
pub const API_VERSION: &str = "fleet.nationtech.io/v1alpha1";
/// How long a device may take from boot to its Device object (device setup installs and starts both units).
const REGISTER_TIMEOUT: Duration = Duration::from_secs(300);

/// The parts of a local fleet. Fields drop in order: devices first, then the operator and API server, the
/// artifact server, and NATS last.
pub struct LocalFleet {
    /// The devices, in the order of the ids given to [`Self::start`].
    pub devices: Vec<Device>,
    /// API server, CRDs, RBAC and the real operator.
    pub cluster: Cluster,
    /// Agent binaries over HTTPS (the devices' updaters trust its CA).
    pub artifacts: Artifacts,
    /// The NATS server: with the auth callout (devices with their own tokens, the operator as its own user)
    /// unless switched off.
    pub nats: FleetNats,
    dir: tempfile::TempDir,
}

/// A device as the cluster shows it (`kubectl get fdev -o json`).
#[derive(Debug, Clone)]
pub struct DeviceView {
    /// The Device's name (the device id).
    pub id: String,
    /// `metadata.labels` as `k=v`, sorted.
    pub labels: Vec<String>,
    /// `status.agentVersion`.
    pub agent_version: Option<String>,
    /// `status.agentUpgrade`.
    pub upgrade: Option<AgentUpgradeStatus>,
    /// `status.stalled`: the phase a device is stuck in and since when (`phase`, `since`, …), as JSON.
    pub stalled: Option<serde_json::Value>,
}

impl DeviceView {
    /// A Device object (as `kubectl get fdev -o json` prints it) as a view; `None` without a name.
    pub fn from_json(v: &serde_json::Value) -> Option<Self> {
        let id = v["metadata"]["name"].as_str()?.to_string();
        let mut labels: Vec<String> = v["metadata"]["labels"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                    .collect()
            })
            .unwrap_or_default();
        labels.sort();
        let status = &v["status"];
        Some(Self {
            id,
            labels,
            agent_version: status["agentVersion"].as_str().map(str::to_string),
            upgrade: serde_json::from_value(status["agentUpgrade"].clone()).ok(),
            stalled: Some(status["stalled"].clone()).filter(|s| s.is_object()),
        })
    }

    /// The upgrade phase as kubectl prints it (`-` when none).
    pub fn phase(&self) -> String {
        self.upgrade
            .as_ref()
            .map(|u| kebab(&u.phase))
            .unwrap_or_else(|| "-".into())
    }

    /// The typed reason as kubectl prints it (`-` when none).
    pub fn reason(&self) -> String {
        self.upgrade
            .as_ref()
            .and_then(|u| u.reason.as_ref().map(kebab))
            .unwrap_or_else(|| "-".into())
    }

    /// True when the status is terminal for an attempt at `version`.
    pub fn finished(&self, version: &str) -> bool {
        self.upgrade.as_ref().is_some_and(|u| {
            u.target_version.as_ref().map(|v| v.as_str()) == Some(version) && u.phase.is_terminal()
        })
    }

    /// True when the device committed `version` and reports running it.
    pub fn committed(&self, version: &str) -> bool {
        self.finished(version)
            && self.upgrade.as_ref().map(|u| u.phase) == Some(UpgradePhase::Complete)
            && self.agent_version.as_deref() == Some(version)
    }
}

/// A serde enum value as its wire string (`rolling-back`, `start-failed`).
pub fn kebab<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

impl LocalFleet {
    /// Starts NATS, the cluster and the artifact server, then boots and sets up one device per id (at once:
    /// most of a device's set-up waits on its own systemd), each running agent [`V1`] with the test image
    /// imported and the real [`V3`] at [`REAL_V3`]; returns when every device has its Device object.
    pub fn start(ids: &[&str]) -> Self {
        let nats = start_nats();
        let cluster = Cluster::start_with_nats_ca(&nats.service_url(), nats.ca_file());
        let artifacts = Artifacts::start();
        let v3 = builds::agent(V3);
        let devices: Vec<Device> = std::thread::scope(|s| {
            let handles: Vec<_> = ids
                .iter()
                .map(|id| {
                    let (artifacts, v3, nats) = (&artifacts, &v3, &nats);
                    s.spawn(move || {
                        let d = Device::setup(id, nats, V1, Some(artifacts));
                        d.import_test_image();
                        d.guest.install_file(v3, REAL_V3, 0o755);
                        d
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        });
        let fleet = Self {
            devices,
            cluster,
            artifacts,
            nats,
            dir: tempfile::Builder::new()
                .prefix("fleet-local-")
                .tempdir()
                .unwrap_or_else(|e| panic!("temp dir: {e}")),
        };
        for d in &fleet.devices {
            fleet.cluster.wait(
                &format!("Device {} registered", d.id),
                REGISTER_TIMEOUT,
                || fleet.view(&d.id).filter(|v| v.agent_version.is_some()),
            );
            // With the callout on, the device got in with its own token, through fleet-auth.
            assert!(
                fleet.nats.mode() == NatsAuth::Off || fleet.nats.admitted(&d.id),
                "{} registered without fleet-auth admitting it:\n{}",
                d.id,
                fleet.nats.auth_logs()
            );
        }
        fleet
    }

    /// Fails the test when a secret appears in a log (docs/auth.md: tokens and passwords are never logged): a
    /// device's token (as installed on it) or the services' NATS password, in the operator's log, fleet-auth's
    /// or nats-server's log, or any journal of any device.
    pub fn assert_no_secrets_in_logs(&self) {
        self.assert_no_secrets_in_logs_with(&[]);
    }

    /// [`Self::assert_no_secrets_in_logs`], also for the test's own `(what, value)` secrets: registry passwords,
    /// values of Kubernetes Secrets (docs/secrets.md: never logged either).
    pub fn assert_no_secrets_in_logs_with(&self, extra: &[(String, String)]) {
        let mut secrets: Vec<(String, String)> = extra.to_vec();
        if let Some(p) = self.nats.service_password() {
            secrets.push(("the services' NATS password".into(), p.to_string()));
        }
        for d in &self.devices {
            if let Ok(t) = std::fs::read_to_string(d.guest.path(GUEST_TOKEN_FILE)) {
                let t = t.trim().to_string();
                // The signature alone is a secret's distinctive part too.
                let sig = t.rsplit('.').next().unwrap_or_default().to_string();
                secrets.push((format!("{}'s token", d.id), t));
                secrets.push((format!("{}'s token signature", d.id), sig));
            }
        }
        let mut logs = vec![
            (
                "fleet-operator".to_string(),
                self.cluster.operator_log(usize::MAX),
            ),
            (
                "fleet-auth and nats-server".to_string(),
                self.nats.auth_logs(),
            ),
        ];
        for d in &self.devices {
            logs.push((
                format!("{}'s journal", d.id),
                d.guest.sh("journalctl -o cat --no-pager"),
            ));
        }
        for (what, secret) in &secrets {
            assert!(secret.len() >= 16, "{what} is too short to look for");
            for (log, text) in &logs {
                // Only where it appeared: the secret itself never goes into the failure message.
                assert!(!text.contains(secret.as_str()), "{what} appears in {log}");
            }
        }
    }

    /// Makes the private registry `host` (`127.0.0.1:<port>` on the host, TLS with a certificate of the CA
    /// `ca_pem`) reachable from every device at the same address, and trusted there the way docs/device-setup.md
    /// ("Private registries") tells a person: the CA at `/etc/containers/certs.d/<host>/ca.crt`, which Podman
    /// (rootless too) reads for that registry only.
    pub fn trust_registry(&mut self, host: &str, port: u16, ca_pem: &[u8]) {
        for d in &mut self.devices {
            d.guest.forward(port);
            d.guest.write_file(
                &format!("/etc/containers/certs.d/{host}/ca.crt"),
                ca_pem,
                0o644,
            );
        }
    }

    /// The device `id`.
    pub fn device(&self, id: &str) -> &Device {
        self.devices
            .iter()
            .find(|d| d.id == id)
            .unwrap_or_else(|| panic!("no device {id}"))
    }

    /// Every device's logs, each under a `=== <id> ===` line (for a failing test's message).
    pub fn device_logs(&self) -> String {
        self.devices
            .iter()
            .map(|d| format!("=== {} ===\n{}", d.id, d.logs()))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The Device object `id` as the cluster shows it.
    pub fn view(&self, id: &str) -> Option<DeviceView> {
        DeviceView::from_json(&self.cluster.get_json(&["fdev", id])?)
    }

    /// Every Device object, sorted by name.
    pub fn views(&self) -> Vec<DeviceView> {
        let Some(list) = self.cluster.get_json(&["fdev"]) else {
            return vec![];
        };
        let mut all: Vec<DeviceView> = list["items"]
            .as_array()
            .map(|items| items.iter().filter_map(DeviceView::from_json).collect())
            .unwrap_or_default();
        all.sort_by(|a, b| a.id.cmp(&b.id));
        all
    }

    /// Publishes the real agent `version` on the artifact server: its URL and SHA-256.
    pub fn publish_agent(&self, version: &str) -> (String, String) {
        let (url, sha) = self
            .artifacts
            .publish(&builds::agent(version), &format!("fleet-agent-v{version}"));
        (url, sha.to_string())
    }

    /// Publishes a broken [`V3`]: its probe is the real v3's (so it passes and reports 3.0.0), but the service
    /// exits before telling systemd it is ready. Every device must roll it back.
    pub fn publish_broken_v3(&self) -> (String, String) {
        self.publish_script(
            "fleet-agent-v3",
            &builds::broken_candidate_body(V3, REAL_V3),
        )
    }

    /// Publishes a crash-looping v3: it probes and starts as the real v3 (so it passes its self-test, becomes ready
    /// and commits), then is SIGKILLed `after_secs` after every start; systemd (`Restart=on-failure`) starts it
    /// again, and again. Its URL and SHA-256.
    pub fn publish_crash_looping_v3(&self, after_secs: u64) -> (String, String) {
        self.publish_script(
            "fleet-agent-v3-crash-loop",
            &format!(
                "# a {V3} that commits, then dies {after_secs} s after each start\n\
                 case \"$1\" in --self-test|--version|--help) exec {REAL_V3} \"$@\" ;; esac\n\
                 ( sleep {after_secs}; kill -KILL $$ ) &\n\
                 exec {REAL_V3} \"$@\""
            ),
        )
    }

    /// Publishes a candidate "binary" `name` that runs the shell `body` (an ELF, see
    /// [`crate::builds::script_candidate`]; fault injection through the artifact itself, delivered by the real
    /// operator): its URL and SHA-256.
    pub fn publish_script(&self, name: &str, body: &str) -> (String, String) {
        use std::os::unix::fs::PermissionsExt;
        let path: PathBuf = self.dir.path().join(name);
        std::fs::write(&path, crate::builds::script_candidate(body))
            .unwrap_or_else(|e| panic!("write the candidate {name}: {e}"));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
            .unwrap_or_else(|e| panic!("chmod: {e}"));
        let (url, sha) = self.artifacts.publish(&path, name);
        (url, sha.to_string())
    }
}

/// The namespace the operator reads Secrets from: its `--secrets-namespace`, by default `harmony-fleet-secrets`
/// (never its own: docs/secrets.md, operator/deploy/rbac.yaml).
pub const SECRETS_NS: &str = "harmony-fleet-secrets";

impl LocalFleet {
    /// `kubectl create secret <args> -n` [`SECRETS_NS`] `--dry-run=client -o yaml | kubectl apply -f -`: how a
    /// person creates or changes a Secret in one command.
    pub fn apply_secret(&self, args: &[&str]) {
        let mut all = vec!["create", "secret"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["-n", SECRETS_NS, "--dry-run=client", "-o", "yaml"]);
        let yaml = self.cluster.kubectl(&all);
        self.cluster
            .try_with_stdin(&["apply", "-f", "-"], &yaml)
            .unwrap_or_else(|e| panic!("kubectl apply of the Secret: {e}"));
    }

    /// `status.workloads` of the FleetDeployment `name` once `running` devices run it and none failed.
    pub fn running_on(&self, name: &str, running: u64) -> Option<serde_json::Value> {
        let d = self.cluster.get_json(&["fdep", name])?;
        let w = d["status"]["workloads"].clone();
        (w["running"] == running && w["failed"] == 0).then_some(w)
    }
}

/// Standard base64 (padded) of `bytes`: how a Secret's `data` and a dockerconfigjson's `auth` carry values (to
/// look for a secret in that form too).
pub fn base64(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ABC[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// A DeviceGroup `name` whose members are the Devices with every label of `match_labels` (none: every Device,
/// said explicitly with `selectAll`, since an empty selector selects nothing).
pub fn group_yaml(name: &str, match_labels: &[(&str, &str)]) -> String {
    if match_labels.is_empty() {
        return format!(
            "apiVersion: {API_VERSION}\nkind: DeviceGroup\nmetadata:\n  name: {name}\nspec:\n  selectAll: true\n"
        );
    }
    let labels: Vec<String> = match_labels
        .iter()
        .map(|(k, v)| format!("{k}: \"{v}\""))
        .collect();
    format!(
        "apiVersion: {API_VERSION}\nkind: DeviceGroup\nmetadata:\n  name: {name}\nspec:\n  selector:\n    \
         matchLabels: {{{}}}\n",
        labels.join(", ")
    )
}

/// A FleetDeployment `name` placing one long-running busybox workload `workload` on the members of `group`.
pub fn deployment_yaml(name: &str, group: &str, workload: &str) -> String {
    format!(
        "apiVersion: {API_VERSION}\nkind: FleetDeployment\nmetadata:\n  name: {name}\nspec:\n  allowedGroups: [{group}]\n  \
         targetSelector: {{}}\n  workloads:\n    - name: {workload}\n      image: {image}\n      \
         command: [sleep, \"100000\"]\n",
        image = crate::fleet::TEST_IMAGE
    )
}

/// A FleetDeployment `name` whose one workload `name` exits with code 3 every 5 s under `restartPolicy: always`:
/// Podman restarts it, and the agent reports it `crash-looping` from its third restart.
pub fn crash_looping_deployment_yaml(name: &str, group: &str) -> String {
    format!(
        "apiVersion: {API_VERSION}\nkind: FleetDeployment\nmetadata:\n  name: {name}\nspec:\n  allowedGroups: [{group}]\n  \
         targetSelector: {{}}\n  workloads:\n    - name: {name}\n      image: {image}\n      \
         command: [sh, -c, \"sleep 5; exit 3\"]\n      restartPolicy: always\n",
        image = crate::fleet::TEST_IMAGE
    )
}

/// An AgentRelease `name` for the members of `group`: one build for this host's architecture.
pub fn release_yaml(name: &str, group: &str, version: &str, url: &str, sha256: &str) -> String {
    let arch = fleet_wire::Architecture::current()
        .unwrap_or_else(|| panic!("this host's architecture is not a fleet architecture"));
    format!(
        "apiVersion: {API_VERSION}\nkind: AgentRelease\nmetadata:\n  name: {name}\nspec:\n  allowedGroups: [{group}]\n  \
         targetSelector: {{}}\n  builds:\n    - architecture: {arch}\n      version: {version}\n      \
         artifact: \"{url}\"\n      sha256: \"{sha256}\"\n      byteLimit: {limit}\n",
        arch = kebab(&arch),
        limit = fleet_wire::limits::ARTIFACT_MAX_BYTES,
    )
}

/// A TaskRun `name` (namespace `default`) running the built-in system upgrade on the members of `group`, with a
/// deadline of `deadline_secs` from its creation.
pub fn taskrun_yaml(name: &str, group: &str, deadline_secs: u64) -> String {
    format!(
        "apiVersion: {API_VERSION}\nkind: TaskRun\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  \
         allowedGroups: [{group}]\n  targetSelector: {{}}\n  deadlineSeconds: {deadline_secs}\n  systemUpgradeV1: {{}}\n"
    )
}

/// A TaskRun as the cluster shows it (`kubectl get ftr -o json`).
#[derive(Debug, Clone, Default)]
pub struct TaskRunView {
    /// `metadata.uid`: the run's attempt id, the second half of its KV keys.
    pub uid: String,
    /// `status`: phase, counts, times, reason (fleet-wire's `TaskRunStatus`; default before the first status).
    pub status: fleet_wire::TaskRunStatus,
}

impl TaskRunView {
    /// True once the run is `Complete` or `Failed`.
    pub fn terminal(&self) -> bool {
        self.status.phase.is_some_and(|p| p.is_terminal())
    }

    /// The phase as kubectl prints it (`-` before the first status).
    pub fn phase(&self) -> String {
        self.status
            .phase
            .map(|p| kebab(&p))
            .unwrap_or_else(|| "-".into())
    }
}

impl LocalFleet {
    /// The TaskRun `name` in namespace `default` as the cluster shows it.
    pub fn taskrun(&self, name: &str) -> Option<TaskRunView> {
        taskrun_view(&self.cluster, name)
    }
}

/// The TaskRun `name` (namespace `default`) as `kubectl get ftr -o json` shows it in `cluster`.
pub fn taskrun_view(cluster: &Cluster, name: &str) -> Option<TaskRunView> {
    let v = cluster.get_json(&["ftr", name])?;
    Some(TaskRunView {
        uid: v["metadata"]["uid"].as_str()?.to_string(),
        status: serde_json::from_value(v["status"].clone()).unwrap_or_default(),
    })
}

/// A KV bucket read as the services' own NATS user: the value at `key` and when NATS stored it.
pub fn kv_entry<T: serde::de::DeserializeOwned>(
    store: &fleet_rig::nats_client::kv::Store,
    key: &str,
) -> Option<(T, fleet_wire::Timestamp)> {
    let e = store.entry(key).ok()??;
    let v = serde_json::from_slice(&e.value).ok()?;
    Some((v, fleet_wire::Timestamp::from_unix_ms(e.created_unix_ms)))
}

/// `device`'s report of its workload `name` in the `device-workload-status` bucket, when it is in `state`, and
/// when NATS stored the report.
pub fn reported_workload(
    reports: &fleet_rig::nats_client::kv::Store,
    device: &str,
    name: &str,
    state: fleet_wire::WorkloadState,
) -> Option<(fleet_wire::WorkloadStatus, fleet_wire::Timestamp)> {
    let (r, at): (fleet_wire::DeviceWorkloadStatus, _) = kv_entry(reports, device)?;
    let w = r.workloads.into_iter().find(|w| w.name.as_str() == name)?;
    (w.state == state).then_some((w, at))
}
