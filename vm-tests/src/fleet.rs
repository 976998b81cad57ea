//! A whole device for scenarios: an nspawn guest with Harmony Fleet installed by device setup, talking to a NATS
//! server on the host through its veth relay (with its own token when the auth callout is on, and over TLS with
//! the server's private CA unless `FLEET_NATS_TLS=off`, see [`start_nats`]), and the operator's side of NATS (buckets, desired state, intents, status) played by the test as the services'
//! own NATS user.

use crate::builds;
use crate::device::{device_setup, stage_bytes, stage_file, stage_setup, text};
use fleet_rig::callout::{FleetNats, NatsTransport};
use fleet_rig::nats_client as nats;
use fleet_rig::nspawn::{ForwardHandle, Guest};
use fleet_rig::wait_for;
use fleet_wire::{
    kv, AgentUpgradeAttempt, AgentUpgradeStatus, DesiredState, DeviceId, UpgradePhase,
};
use std::path::Path;
use std::time::Duration;

/// The device id every scenario device uses.
pub const DEVICE: &str = "device-1";
/// Where the test CA certificate is placed in the guest (the updater's `extra_ca_file`).
pub const GUEST_CA_FILE: &str = "/etc/harmony-fleet/test-ca.pem";
/// Where device setup installs the device's NATS token (`--nats-token`; the agent's `[nats] token_file`).
pub const GUEST_TOKEN_FILE: &str = "/etc/harmony-fleet/nats-token";
/// Where a guest keeps the CA of a NATS server that requires TLS (the agent's `[nats] ca_file`).
pub const GUEST_NATS_CA_FILE: &str = "/etc/harmony-fleet/nats-ca.pem";

/// The fleet's NATS server for a scenario or the demo: with the fleet-auth auth callout on unless
/// `FLEET_NATS_AUTH=off`, requiring TLS with a private CA unless `FLEET_NATS_TLS=off` (`fleet_rig::callout`), so
/// that every scenario takes the same path.
pub fn start_nats() -> FleetNats {
    let nats = FleetNats::start(builds::fleet_auth);
    eprintln!(
        "fleet NATS at {} ({:?}, {:?}; switches FLEET_NATS_TLS, FLEET_NATS_AUTH)",
        nats.url(),
        nats.transport(),
        nats.mode()
    );
    nats
}

/// The agent's NATS URL in `guest`, which reaches `nats` through `link`: `tls://…` when the server requires TLS,
/// with the server's CA written to [`GUEST_NATS_CA_FILE`] in the guest ([`agent_config`] then sets `ca_file`);
/// `nats://…` otherwise.
pub fn guest_nats_url(guest: &Guest, nats: &FleetNats, link: &ForwardHandle) -> String {
    if let Some(ca) = nats.ca_file() {
        install_nats_ca(guest, ca);
    }
    debug_assert_eq!(
        nats.ca_file().is_some(),
        nats.transport() == NatsTransport::Tls
    );
    nats.url_at(link.addr())
}

/// Writes the NATS server's CA (the host file `ca`) to [`GUEST_NATS_CA_FILE`] in `guest`, where an agent config
/// with a `tls://` URL points `ca_file`.
fn install_nats_ca(guest: &Guest, ca: &std::path::Path) {
    let pem = std::fs::read(ca).unwrap_or_else(|e| panic!("NATS CA {}: {e}", ca.display()));
    guest.write_file(GUEST_NATS_CA_FILE, &pem, 0o644);
}

/// The operator's side of NATS: every bucket of the layout, created as the operator would.
pub struct Operator {
    js: nats::jetstream::JetStream,
}

impl Operator {
    /// Connects to `server` as the services' own user and creates every bucket of [`kv::BUCKETS`].
    pub fn new(server: &FleetNats) -> Self {
        let conn = server.connect();
        for spec in kv::BUCKETS {
            fleet_rig::nats_client::create_bucket(&conn, spec);
        }
        Self {
            js: nats::jetstream::new(conn),
        }
    }

    fn store(&self, bucket: &str) -> nats::kv::Store {
        self.js
            .key_value(bucket)
            .unwrap_or_else(|e| panic!("open bucket {bucket}: {e}"))
    }

    /// Writes the device's desired state.
    pub fn put_desired(&self, desired: &DesiredState) {
        let value = serde_json::to_vec(desired).unwrap_or_else(|e| panic!("json: {e}"));
        self.store(kv::DESIRED_STATE)
            .put(DEVICE, value)
            .unwrap_or_else(|e| panic!("put desired state: {e}"));
    }

    /// Writes an upgrade intent (create on first write, else update by the current revision, like the operator).
    pub fn put_intent(&self, attempt: &AgentUpgradeAttempt) {
        let store = self.store(kv::AGENT_UPGRADE_INTENT);
        let value = serde_json::to_vec(attempt).unwrap_or_else(|e| panic!("json: {e}"));
        let current = store.entry(DEVICE).ok().flatten();
        match current {
            Some(e) if !e.value.is_empty() => {
                store
                    .update(DEVICE, value, e.revision)
                    .unwrap_or_else(|e| panic!("CAS update intent: {e}"));
            }
            _ => {
                store
                    .put(DEVICE, value)
                    .unwrap_or_else(|e| panic!("put intent: {e}"));
            }
        }
    }

    /// The device's current upgrade status in NATS, if any.
    pub fn status(&self) -> Option<AgentUpgradeStatus> {
        let raw = self.store(kv::AGENT_UPGRADE_STATUS).get(DEVICE).ok()??;
        serde_json::from_slice(&raw).ok()
    }

    /// The device's published device info, if any.
    pub fn device_info(&self) -> Option<fleet_wire::DeviceInfo> {
        let raw = self.store(kv::DEVICE_INFO).get(DEVICE).ok()??;
        serde_json::from_slice(&raw).ok()
    }

    /// Whether the device has published its device info (the agent is up and talking to NATS).
    pub fn has_device_info(&self) -> bool {
        matches!(self.store(kv::DEVICE_INFO).get(DEVICE), Ok(Some(_)))
    }

    /// Waits until the status for `attempt` reaches `phase`; fails with the last status seen otherwise.
    pub fn wait_phase(
        &self,
        attempt: &AgentUpgradeAttempt,
        phase: UpgradePhase,
        timeout: Duration,
    ) -> AgentUpgradeStatus {
        let mut last = None;
        let found = wait_for(timeout, || {
            let s = self.status()?;
            let hit = s.attempt_id.as_ref() == Some(&attempt.attempt_id) && s.phase == phase;
            last = Some(s.clone());
            hit.then_some(s)
        });
        found.unwrap_or_else(|| {
            panic!(
                "status of attempt {} did not reach {phase:?} within {timeout:?}; last: {last:#?}",
                attempt.attempt_id
            )
        })
    }
}

impl Operator {
    /// Waits until the status of `attempt` is terminal; fails after `timeout` with the last status and `logs()`.
    pub fn wait_terminal(
        &self,
        attempt: &AgentUpgradeAttempt,
        timeout: Duration,
        logs: impl FnOnce() -> String,
    ) -> AgentUpgradeStatus {
        let mut last = None;
        let done = wait_for(timeout, || {
            let s = self.status()?;
            let hit = s.attempt_id.as_ref() == Some(&attempt.attempt_id) && s.phase.is_terminal();
            last = Some(s.clone());
            hit.then_some(s)
        });
        done.unwrap_or_else(|| {
            panic!(
                "attempt {} did not finish within {timeout:?}; last status: {last:#?}\n{}",
                attempt.attempt_id,
                logs()
            )
        })
    }
}

/// A device: the guest, its NATS relay, and the versions installed.
pub struct Device {
    /// The device id (its agent's `device_id`).
    pub id: String,
    /// The booted guest.
    pub guest: Guest,
    /// The guest's connection to NATS (switch it off for an offline device).
    pub nats_link: ForwardHandle,
}

/// The agent configuration scenarios use, for the device `id`; with `token_file` when the device has a token, and
/// `ca_file` = [`GUEST_NATS_CA_FILE`] for a `tls://` URL (see [`guest_nats_url`]).
pub fn agent_config(id: &str, nats_url: &str, token_file: Option<&str>) -> String {
    agent_config_urls(id, &[nats_url.to_string()], token_file)
}

/// [`agent_config`] with several NATS servers (the nodes of a cluster), which the agent fails over between; with
/// `ca_file` = [`GUEST_NATS_CA_FILE`] when they are `tls://` URLs.
pub fn agent_config_urls(id: &str, nats_urls: &[String], token_file: Option<&str>) -> String {
    let mut token = token_file
        .map(|f| format!("token_file = \"{f}\"\n"))
        .unwrap_or_default();
    if nats_urls.iter().any(|u| u.starts_with("tls://")) {
        token.push_str(&format!("ca_file = \"{GUEST_NATS_CA_FILE}\"\n"));
    }
    let urls: Vec<String> = nats_urls.iter().map(|u| format!("\"{u}\"")).collect();
    format!(
        "device_id = \"{id}\"\n\n[nats]\nurls = [{}]\n{token}connect_timeout_secs = 5\n\n\
         [intervals]\nheartbeat_secs = 5\nupdater_poll_ms = 200\n",
        urls.join(", ")
    )
}

impl Device {
    /// Boots a guest and installs the updater and agent `bootstrap` with device setup; waits until both units
    /// are active and the agent has published its device info. The updater trusts `artifacts`' CA, and the
    /// artifact server is reachable from the guest at the same URL as from the host.
    pub fn install(
        nats: &FleetNats,
        operator: &Operator,
        bootstrap: &str,
        artifacts: Option<&Artifacts>,
    ) -> Self {
        let d = Self::setup(DEVICE, nats, bootstrap, artifacts);
        let info = wait_for(Duration::from_secs(60), || {
            operator.has_device_info().then_some(())
        });
        assert!(
            info.is_some(),
            "the agent published no device info.\n{}\n{}",
            d.guest.journal("fleet-agent.service", 60),
            nats.auth_logs()
        );
        d
    }

    /// Boots a guest and installs the updater and agent `bootstrap` as device `id` with device setup, talking to
    /// `nats` on the host (with a token of its own, `--nats-token`, when the callout is on; over TLS trusting the
    /// server's CA when it requires TLS, see [`guest_nats_url`]); waits until both
    /// units are active. The updater trusts `artifacts`' CA, reachable from the guest at the same URL as from the
    /// host.
    pub fn setup(
        id: &str,
        nats: &FleetNats,
        bootstrap: &str,
        artifacts: Option<&Artifacts>,
    ) -> Self {
        Self::setup_on(
            id,
            &[nats.port()],
            nats.ca_file(),
            nats.device_token(id),
            bootstrap,
            artifacts,
        )
    }

    /// [`Self::setup`] against the NATS servers on the host's 127.0.0.1 `nats_ports` (each relayed into the
    /// guest at the same address; the agent is given them all, as for the nodes of a cluster): over TLS trusting
    /// `nats_ca` (installed at [`GUEST_NATS_CA_FILE`]) when given, with `token` as the device's NATS token when
    /// there is one. [`Self::nats_link`] is the first server's relay.
    pub fn setup_on(
        id: &str,
        nats_ports: &[u16],
        nats_ca: Option<&std::path::Path>,
        token: Option<fleet_rig::callout::DeviceToken>,
        bootstrap: &str,
        artifacts: Option<&Artifacts>,
    ) -> Self {
        let mut guest = Guest::boot();
        let mut links: Vec<ForwardHandle> = nats_ports.iter().map(|p| guest.forward(*p)).collect();
        assert!(!links.is_empty(), "a device needs a NATS server");
        let urls: Vec<String> = links
            .iter()
            .map(|l| match nats_ca {
                Some(_) => format!("tls://{}", l.addr()),
                None => format!("nats://{}", l.addr()),
            })
            .collect();
        if let Some(ca) = nats_ca {
            install_nats_ca(&guest, ca);
        }
        let nats_link = links.remove(0);
        let ca_pem = artifacts.map(|a| {
            guest.forward(a.port());
            a.ca_pem()
        });
        stage_setup(&guest);
        let agent = stage_file(
            &guest,
            &builds::agent(bootstrap),
            &format!("fleet-agent-v{bootstrap}"),
            0o755,
        );
        let updater = stage_file(&guest, &builds::updater(), "fleet-updater", 0o755);
        // device-setup installs the download helper from beside the updater.
        stage_file(&guest, &builds::tools(), "fleet-fetch", 0o755);
        stage_file(&guest, &builds::tools(), "fleet-reboot", 0o755);
        // The token as an administrator would bring it: a root-only file that device setup installs for the agent.
        let token = token.map(|t| stage_bytes(&guest, t.as_bytes(), "nats-token", 0o600));
        let acfg = stage_bytes(
            &guest,
            agent_config_urls(id, &urls, token.as_ref().map(|_| GUEST_TOKEN_FILE)).as_bytes(),
            "agent.toml",
            0o644,
        );
        let mut ucfg = String::new();
        if let Some(pem) = ca_pem {
            guest.write_file(GUEST_CA_FILE, pem.as_slice(), 0o644);
            ucfg.push_str(&format!("extra_ca_file = \"{GUEST_CA_FILE}\"\n"));
        }
        let ucfg = stage_bytes(&guest, ucfg.as_bytes(), "updater.toml", 0o644);
        let mut args = vec![
            "--agent",
            &agent,
            "--updater",
            &updater,
            "--agent-config",
            &acfg,
            "--updater-config",
            &ucfg,
        ];
        if let Some(t) = &token {
            args.extend(["--nats-token", t.as_str()]);
        }
        let out = device_setup(&guest, &args);
        if let Some(t) = &token {
            guest.sh(&format!("rm -f {t}"));
        }
        assert!(
            out.status.success(),
            "device-setup failed:\n{}\n{}\n{}",
            text(&out),
            guest.journal("fleet-agent.service", 40),
            guest.journal("fleet-updater.service", 40)
        );
        let d = Self {
            id: id.to_string(),
            guest,
            nats_link,
        };
        d.guest
            .wait_unit("fleet-updater.service", "active", Duration::from_secs(60));
        d.guest
            .wait_unit("fleet-agent.service", "active", Duration::from_secs(240));
        d
    }

    /// The active symlink's target.
    pub fn active_link(&self) -> String {
        self.guest
            .sh("readlink /usr/local/bin/fleet-agent")
            .trim()
            .to_string()
    }

    /// The updater journal's durable phase (`none` without a journal).
    pub fn journal_phase(&self) -> String {
        let path = self.guest.path("/var/lib/fleet-updater/journal.json");
        let Ok(raw) = std::fs::read(&path) else {
            return "none".into();
        };
        let v: serde_json::Value =
            serde_json::from_slice(&raw).unwrap_or_else(|e| panic!("journal is not JSON: {e}"));
        v["phase"].as_str().unwrap_or("unknown").to_string()
    }

    /// Waits until the journal's durable phase is `phase`; fails the test with both units' logs otherwise.
    pub fn wait_journal_phase(&self, phase: &str, timeout: Duration) {
        let ok = wait_for(timeout, || (self.journal_phase() == phase).then_some(()));
        assert!(
            ok.is_some(),
            "the journal did not reach {phase} within {timeout:?} (it is {}).\n{}",
            self.journal_phase(),
            self.logs()
        );
    }

    /// The version the running agent reports (`fleet-agent --version` of the active link).
    pub fn active_version(&self) -> String {
        self.guest
            .sh("/usr/local/bin/fleet-agent --version")
            .trim()
            .to_string()
    }

    /// The main PID of the agent's unit (0 when it is not running).
    pub fn agent_pid(&self) -> u32 {
        self.guest
            .systemctl(&["show", "-p", "MainPID", "--value", "fleet-agent.service"])
            .parse()
            .unwrap_or(0)
    }

    /// Both units' journals, for failure messages.
    pub fn logs(&self) -> String {
        format!(
            "--- fleet-updater ---\n{}\n--- fleet-agent ---\n{}",
            self.guest.journal("fleet-updater.service", 80),
            self.guest.journal("fleet-agent.service", 80)
        )
    }
}

/// The device id as a wire type.
pub fn device_id() -> DeviceId {
    DeviceId::try_from(DEVICE).unwrap_or_else(|e| panic!("device id: {e}"))
}

/// Copies `host` into the guest at `guest_path` (helper for artifacts and wrappers).
pub fn put(guest: &Guest, host: &Path, guest_path: &str) {
    guest.install_file(host, guest_path, 0o755);
}

/// Agent binaries served over HTTPS by a test CA's server, as the operator's artifact store would.
pub struct Artifacts {
    /// The CA the updater trusts (`extra_ca_file`).
    pub ca: fleet_rig::tls::TestCa,
    server: fleet_rig::https::HttpsServer,
    files: std::sync::Arc<std::sync::Mutex<std::collections::BTreeMap<String, std::path::PathBuf>>>,
    flaky: std::sync::Arc<std::sync::Mutex<std::collections::BTreeMap<String, Flaky>>>,
    /// Paths answered with headers (the file's length) and then no byte: a download that hangs.
    stalling: std::sync::Arc<std::sync::Mutex<std::collections::BTreeMap<String, u64>>>,
}

/// An artifact served with range support over a link that drops: response `i` is cut after `cuts[i]` bytes.
struct Flaky {
    body: std::sync::Arc<Vec<u8>>,
    cuts: Vec<u64>,
    served: usize,
    sent: u64,
}

impl Default for Artifacts {
    fn default() -> Self {
        Self::start()
    }
}

impl Artifacts {
    /// Starts the server (on the host's 127.0.0.1; [`Device::install`] relays it into the guest).
    pub fn start() -> Self {
        use fleet_rig::https::{HttpsServer, Reply};
        let ca = fleet_rig::tls::TestCa::new();
        let files: std::sync::Arc<
            std::sync::Mutex<std::collections::BTreeMap<String, std::path::PathBuf>>,
        > = Default::default();
        let flaky: std::sync::Arc<std::sync::Mutex<std::collections::BTreeMap<String, Flaky>>> =
            Default::default();
        let stalling: std::sync::Arc<std::sync::Mutex<std::collections::BTreeMap<String, u64>>> =
            Default::default();
        let (f, fl, st) = (files.clone(), flaky.clone(), stalling.clone());
        let server = HttpsServer::start(&ca, move |req| {
            if let Some(len) = st.lock().unwrap_or_else(|p| p.into_inner()).get(req.path()) {
                return Reply::StallAfterHeaders {
                    content_length: *len,
                };
            }
            if let Some(a) = fl
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_mut(req.path())
            {
                let reply = Reply::ranged(
                    req,
                    a.body.clone(),
                    "\"flaky\"",
                    a.cuts.get(a.served).copied(),
                );
                a.served += 1;
                a.sent += reply.body_bytes();
                return reply;
            }
            let map = f.lock().unwrap_or_else(|p| p.into_inner());
            match map.get(req.path()) {
                Some(p) => Reply::File(p.clone()),
                None => Reply::status(404, &[]),
            }
        });
        Self {
            ca,
            server,
            files,
            flaky,
            stalling,
        }
    }

    /// Publishes `file` at `/<name>` as a download that hangs: the answer declares the file's length, then no
    /// byte follows. Its URL and SHA-256, as [`Self::publish`].
    pub fn publish_stalling(&self, file: &Path, name: &str) -> (String, fleet_wire::Sha256Hex) {
        let len = std::fs::metadata(file)
            .unwrap_or_else(|e| panic!("stat {file:?}: {e}"))
            .len();
        self.stalling
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(format!("/{name}"), len);
        self.planned(file, name)
    }

    /// Publishes `file` at `/<name>` with HTTP range support over a link that drops: the `i`-th response is cut
    /// after `cuts[i]` bytes, later ones are whole. Returns an attempt for it targeting `version` on [`DEVICE`].
    pub fn attempt_flaky(
        &self,
        file: &Path,
        name: &str,
        version: &str,
        cuts: Vec<u64>,
    ) -> AgentUpgradeAttempt {
        let attempt = self.attempt(file, name, version);
        let body = std::fs::read(file).unwrap_or_else(|e| panic!("read {file:?}: {e}"));
        self.flaky.lock().unwrap_or_else(|p| p.into_inner()).insert(
            format!("/{name}"),
            Flaky {
                body: std::sync::Arc::new(body),
                cuts,
                served: 0,
                sent: 0,
            },
        );
        attempt
    }

    /// For `/<name>`: where each request's `Range: bytes=N-` started (`None`: no range), in order.
    pub fn range_starts(&self, name: &str) -> Vec<Option<u64>> {
        let path = format!("/{name}");
        self.server
            .requests()
            .iter()
            .filter(|r| r.path() == path)
            .map(|r| {
                r.header("range")
                    .and_then(|v| v.strip_prefix("bytes="))
                    .and_then(|v| v.strip_suffix('-'))
                    .and_then(|v| v.parse().ok())
            })
            .collect()
    }

    /// For a flaky artifact `/<name>`: the responses served and the body bytes sent in all.
    pub fn flaky_served(&self, name: &str) -> (usize, u64) {
        self.flaky
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&format!("/{name}"))
            .map_or((0, 0), |a| (a.served, a.sent))
    }

    /// The server's port on 127.0.0.1 (host and guest alike).
    pub fn port(&self) -> u16 {
        self.server.port()
    }

    /// The CA certificate as PEM.
    pub fn ca_pem(&self) -> Vec<u8> {
        std::fs::read(self.ca.ca_file()).unwrap_or_else(|e| panic!("read CA: {e}"))
    }

    /// The URL and SHA-256 `file` will have once published at `/<name>`, without serving it yet (until
    /// [`Self::publish`], a download answers 404).
    pub fn planned(&self, file: &Path, name: &str) -> (String, fleet_wire::Sha256Hex) {
        use sha2::Digest;
        let bytes = std::fs::read(file).unwrap_or_else(|e| panic!("read {file:?}: {e}"));
        let sha: [u8; 32] = sha2::Sha256::digest(&bytes).into();
        (
            self.server.url(&format!("/{name}")),
            fleet_wire::Sha256Hex::from_bytes(sha),
        )
    }

    /// Publishes `file` at `/<name>`: its URL (the same on the host and in guests) and SHA-256.
    pub fn publish(&self, file: &Path, name: &str) -> (String, fleet_wire::Sha256Hex) {
        use sha2::Digest;
        let bytes = std::fs::read(file).unwrap_or_else(|e| panic!("read {file:?}: {e}"));
        let sha: [u8; 32] = sha2::Sha256::digest(&bytes).into();
        self.files
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(format!("/{name}"), file.to_path_buf());
        (
            self.server.url(&format!("/{name}")),
            fleet_wire::Sha256Hex::from_bytes(sha),
        )
    }

    /// Publishes `file` at `/<name>` and returns an attempt for it targeting `version` on [`DEVICE`].
    pub fn attempt(&self, file: &Path, name: &str, version: &str) -> AgentUpgradeAttempt {
        self.attempt_for(DEVICE, file, name, version)
    }

    /// Publishes `file` at `/<name>` and returns an attempt for it targeting `version` on `device`.
    pub fn attempt_for(
        &self,
        device: &str,
        file: &Path,
        name: &str,
        version: &str,
    ) -> AgentUpgradeAttempt {
        let arch = fleet_wire::Architecture::current()
            .unwrap_or_else(|| panic!("this host's architecture is not a fleet architecture"));
        self.attempt_for_arch(device, arch, file, name, version)
    }

    /// Publishes `file` at `/<name>` and returns an attempt for it targeting `version` on `device`, a device of
    /// architecture `arch`.
    pub fn attempt_for_arch(
        &self,
        device: &str,
        arch: fleet_wire::Architecture,
        file: &Path,
        name: &str,
        version: &str,
    ) -> AgentUpgradeAttempt {
        let (url, sha) = self.publish(file, name);
        let json = serde_json::json!({
            "attemptId": fleet_wire::AttemptId::new_random(),
            "deviceId": device,
            "targetVersion": version,
            "architecture": arch,
            "artifact": url,
            "byteLimit": fleet_wire::limits::ARTIFACT_MAX_BYTES,
            "sha256": sha,
        });
        serde_json::from_value(json).unwrap_or_else(|e| panic!("attempt: {e}"))
    }

    /// How many requests the server answered for `/<name>`.
    pub fn requests_for(&self, name: &str) -> usize {
        let path = format!("/{name}");
        self.server
            .requests()
            .iter()
            .filter(|r| r.path() == path)
            .count()
    }
}

/// The image scenarios run: the cached tree's static busybox, imported into the fleet-agent user's Podman.
pub const TEST_IMAGE: &str = "localhost/busybox:fleet-test";

impl Device {
    /// Imports [`TEST_IMAGE`] into the fleet-agent user's rootless Podman.
    pub fn import_test_image(&self) {
        self.guest.sh(&format!(
            "cd /tmp && runuser -u fleet-agent -- env XDG_RUNTIME_DIR=/run/user/$(id -u fleet-agent) \
             podman import --quiet /usr/share/fleet-test/busybox-rootfs.tar {TEST_IMAGE} >/dev/null"
        ));
    }

    /// `podman <args>` as the fleet-agent user (rootless: the agent's own Podman): success and output.
    pub fn podman(&self, args: &str) -> (bool, String) {
        self.guest.try_sh(&format!(
            "cd /tmp && runuser -u fleet-agent -- env XDG_RUNTIME_DIR=/run/user/$(id -u fleet-agent) podman {args}"
        ))
    }

    /// The libpod inspect document of a container of the fleet-agent user, if it exists.
    pub fn container(&self, name: &str) -> Option<serde_json::Value> {
        let (ok, out) = self.guest.try_sh(&format!(
            "curl -sf --max-time 10 --unix-socket /run/user/$(id -u fleet-agent)/podman/podman.sock \
             http://d/v4.0.0/libpod/containers/{name}/json"
        ));
        if !ok {
            return None;
        }
        serde_json::from_str(&out).ok()
    }
}

/// A desired state with one long-running busybox workload called `name`.
pub fn desired_one_workload(generation: u64, name: &str) -> DesiredState {
    let mut w = fleet_wire::WorkloadSpec::new(
        fleet_wire::WorkloadName::try_from(name).unwrap_or_else(|e| panic!("name: {e}")),
        TEST_IMAGE,
    )
    .unwrap_or_else(|e| panic!("workload: {e}"));
    w.command = vec!["sleep".into(), "100000".into()];
    DesiredState::new(device_id(), generation, vec![w]).unwrap_or_else(|e| panic!("desired: {e}"))
}

static ONE_DEVICE: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Serializes whole-device scenarios within a test binary: each one boots a guest running systemd, Podman, the
/// agent and the updater, and two cores do not carry several of them well.
pub fn one_device_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_DEVICE.lock().unwrap_or_else(|p| p.into_inner())
}
