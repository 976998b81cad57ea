//! The cluster side of a local fleet, every part real: etcd + kube-apiserver (serving a certificate of the rig's
//! CA), the CRDs and RBAC of `operator/deploy/` applied with kubectl, the `fleet-operator` binary running as the
//! `fleet-operator` service account those manifests bind and serving the admission webhook, registered as
//! `operator/deploy/webhook.yaml` has it, and kube-controller-manager's garbage collector and namespace controller
//! (owner references are collected as in a real cluster). Everything is driven with kubectl, as a person would.

use crate::builds;
use crate::controller_manager::ControllerManager;
use fleet_rig::kube::KubeApiServer;
use fleet_rig::workspace_root;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// How long one kubectl call may take (an apiserver on two busy cores answers in well under a second).
const KUBECTL_TIMEOUT: &str = "30s";

/// The operator's command line and environment, kept to start it again the same way.
/// One entry of an object's `status.conditions`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Condition {
    /// "True", "False" or "Unknown".
    pub status: String,
    /// The CamelCase reason.
    pub reason: String,
    /// The sentence for a person.
    pub message: String,
}

#[derive(Default)]
struct Launch {
    bin: PathBuf,
    args: Vec<std::ffi::OsString>,
    env: Vec<(&'static str, std::ffi::OsString)>,
}

/// A running API server with the fleet CRDs and RBAC, and the real operator. The operator is stopped on drop,
/// then the API server.
pub struct Cluster {
    /// The operator process (replaced by [`Self::kill_operator_and_restart`]).
    operator: std::sync::Mutex<Option<Child>>,
    /// How the operator is started: its binary, arguments and environment.
    launch: Launch,
    dashboard_url: String,
    dashboard_token: String,
    webhook_url: String,
    webhook_ca: fleet_rig::tls::TestCa,
    kubectl: PathBuf,
    kubeconfig: PathBuf,
    /// Declared before `api`: stopped before the API server.
    controller_manager: Option<ControllerManager>,
    dir: tempfile::TempDir,
    /// The API server and etcd.
    pub api: KubeApiServer,
}

impl Cluster {
    /// Starts the API server, applies `operator/deploy/crds.yaml` and `rbac.yaml`, waits until the CRDs are
    /// established, starts kube-controller-manager ([`crate::controller_manager`]) with the admin kubeconfig, starts `fleet-operator` with the service account's token, connecting to `nats_url` (which
    /// may carry the operator's own NATS credentials: it is passed as `FLEET_NATS_URL`, never on the command line)
    /// and serving the admission webhook on a loopback port, then registers the webhooks of
    /// `operator/deploy/webhook.yaml` ([`fleet_rig::kube::webhook_registration`]) and waits until the API server
    /// refuses a typo through them.
    pub fn start(nats_url: &str) -> Self {
        Self::start_with_nats_ca(nats_url, None)
    }

    /// [`Self::start`] with the operator trusting the NATS server's CA file (`--nats-ca-file`).
    pub fn start_with_nats_ca(nats_url: &str, nats_ca: Option<&std::path::Path>) -> Self {
        let kubectl = builds::kubectl();
        let operator_bin = builds::operator();
        let api = KubeApiServer::start();
        let dir = tempfile::Builder::new()
            .prefix("fleet-cluster-")
            .tempdir()
            .unwrap_or_else(|e| panic!("temp dir for the cluster: {e}"));
        let kubeconfig = dir.path().join("kubeconfig");
        write_private(&kubeconfig, &api.kubeconfig(api.token()));
        let webhook_ca = fleet_rig::tls::TestCa::new();
        let webhook_port = fleet_rig::free_port();
        let dashboard_port = fleet_rig::free_port();
        let mut c = Self {
            operator: std::sync::Mutex::new(None),
            launch: Launch::default(),
            dashboard_url: format!("http://127.0.0.1:{dashboard_port}"),
            dashboard_token: random_token(),
            webhook_url: format!("https://127.0.0.1:{webhook_port}"),
            webhook_ca,
            kubectl,
            kubeconfig,
            controller_manager: None,
            dir,
            api,
        };
        let deploy = workspace_root().join("operator/deploy");
        c.kubectl(&[
            "apply",
            "-f",
            &deploy.join("crds.yaml").display().to_string(),
            "-f",
            &deploy.join("rbac.yaml").display().to_string(),
        ]);
        c.kubectl(&[
            "wait",
            "--for",
            "condition=established",
            "--timeout=60s",
            "crd/devices.fleet.nationtech.io",
            "crd/devicegroups.fleet.nationtech.io",
            "crd/fleetdeployments.fleet.nationtech.io",
            "crd/agentreleases.fleet.nationtech.io",
            "crd/taskruns.fleet.nationtech.io",
            "crd/taskschedules.fleet.nationtech.io",
            "crd/workloadpolicies.fleet.nationtech.io",
        ]);
        // After the CRDs are served, so that its garbage collector watches the fleet kinds from its first sync.
        c.controller_manager = Some(ControllerManager::start(
            &c.kubeconfig,
            &c.dir.path().join("kube-controller-manager.log"),
        ));
        let op_config = c.dir.path().join("operator.kubeconfig");
        write_private(&op_config, &c.api.kubeconfig(c.api.operator_token()));
        let mut args: Vec<std::ffi::OsString> = vec![];
        if let Some(ca) = nats_ca {
            args.extend(["--nats-ca-file".into(), ca.into()]);
        }
        // The dashboard on, as a person who wants to look at the fleet runs it (docs/dashboard.md).
        let token_file = c.dir.path().join("dashboard-token");
        write_private(&token_file, &format!("{}\n", c.dashboard_token));
        args.extend([
            "--dashboard-listen".into(),
            format!("127.0.0.1:{dashboard_port}").into(),
            "--dashboard-token-file".into(),
            token_file.into(),
        ]);
        let serving = c.webhook_ca.server_cert("fleet-operator-webhook");
        args.extend([
            "--webhook-listen".into(),
            format!("127.0.0.1:{webhook_port}").into(),
            "--webhook-cert".into(),
            serving.cert_file.clone().into(),
            "--webhook-key".into(),
            serving.key_file.clone().into(),
        ]);
        c.launch = Launch {
            bin: operator_bin,
            args,
            env: vec![
                ("FLEET_NATS_URL", nats_url.into()),
                ("KUBECONFIG", op_config.into()),
                ("POD_NAME", "fleet-operator-local".into()),
                ("RUST_LOG", "info".into()),
            ],
        };
        let child = c.spawn_operator(&[]);
        // Also for a cluster kept in a `static` (never dropped): its directory (kubeconfigs, keys) goes too.
        fleet_rig::util::kill_and_remove_when_gone(&[child.id()], c.dir.path());
        *c.operator.lock().unwrap_or_else(|p| p.into_inner()) = Some(child);
        c.register_webhooks();
        c
    }

    /// Starts the operator as [`Launch`] says, with `extra` arguments after its own, its output appended to
    /// `fleet-operator.log`.
    fn spawn_operator(&self, extra: &[&str]) -> Child {
        let log = self.dir.path().join("fleet-operator.log");
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap_or_else(|e| panic!("operator log: {e}"));
        let err = out
            .try_clone()
            .unwrap_or_else(|e| panic!("operator log: {e}"));
        let mut cmd = Command::new(&self.launch.bin);
        cmd.args(&self.launch.args).args(extra);
        for (k, v) in &self.launch.env {
            cmd.env(k, v);
        }
        cmd.stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", self.launch.bin.display()))
    }

    /// SIGKILLs the operator (no shutdown of any kind, as a node lost or an OOM kill would) and starts it again
    /// the same way; returns the new process's PID. The log keeps both runs, with a line between them.
    pub fn kill_operator_and_restart(&self) -> u32 {
        self.kill_operator_and_restart_with(&[])
    }

    /// [`Self::kill_operator_and_restart`], the new operator started with `extra` arguments as well (e.g. a short
    /// `--alert-silent-after`).
    pub fn kill_operator_and_restart_with(&self, extra: &[&str]) -> u32 {
        let mut slot = self.operator.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(mut old) = slot.take() {
            let _ = old.kill();
            let _ = old.wait();
        }
        let log = self.dir.path().join("fleet-operator.log");
        if let Ok(mut f) = std::fs::OpenOptions::new().append(true).open(&log) {
            let _ = writeln!(f, "--- fleet-operator SIGKILLed and started again ---");
        }
        let child = self.spawn_operator(extra);
        let pid = child.id();
        fleet_rig::util::kill_when_gone(&[pid]);
        *slot = Some(child);
        pid
    }

    /// Registers the webhooks of `operator/deploy/webhook.yaml`, pointed at the operator's loopback port, and waits
    /// until they refuse a typo (the API server loads a new configuration asynchronously, and the operator may still
    /// be starting).
    fn register_webhooks(&self) {
        let ca =
            std::fs::read(self.webhook_ca.ca_file()).unwrap_or_else(|e| panic!("webhook CA: {e}"));
        let config = fleet_rig::kube::webhook_registration(
            "fleet-operator-webhooks",
            &self.webhook_url,
            &ca,
            None,
        );
        self.apply(&config.to_string());
        self.wait_webhooks_ready();
    }

    /// Waits until the admission webhook refuses a typo (after a start or a restart of the operator).
    pub fn wait_webhooks_ready(&self) {
        let typo = "apiVersion: fleet.nationtech.io/v1alpha1\nkind: DeviceGroup\nmetadata: {name: webhook-probe}\nspec: {selectAll: true, selectAl: true}\n";
        self.wait(
            "the admission webhook refusing a typo",
            Duration::from_secs(60),
            || match self.try_with_stdin(&["create", "--dry-run=server", "-f", "-"], typo) {
                Err(e) if e.contains("unknown field spec.selectAl") => Some(()),
                _ => None,
            },
        );
    }

    /// Where the operator serves its dashboard (`http://127.0.0.1:<port>`).
    pub fn dashboard_url(&self) -> &str {
        &self.dashboard_url
    }

    /// The dashboard's access token (a bearer token, or the password of HTTP Basic with any user name).
    pub fn dashboard_token(&self) -> &str {
        &self.dashboard_token
    }

    /// A dashboard page as a person's browser gets it (with the token); `None` unless it answers 2xx.
    pub fn dashboard_page(&self, path: &str) -> Option<String> {
        let out = Command::new("curl")
            .args(["-sf", "--max-time", "10", "-H"])
            .arg(format!("Authorization: Bearer {}", self.dashboard_token))
            .arg(format!("{}{path}", self.dashboard_url))
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Where the operator serves the admission webhook (`https://127.0.0.1:<port>`).
    pub fn webhook_url(&self) -> &str {
        &self.webhook_url
    }

    /// The admin kubeconfig (`system:masters`; verifies the server with the rig's CA).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The kubectl binary.
    pub fn kubectl_bin(&self) -> &Path {
        &self.kubectl
    }

    /// The operator's PID while it runs.
    pub fn operator_pid(&self) -> Option<u32> {
        self.operator
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(Child::id)
    }

    /// kube-controller-manager's PID.
    pub fn controller_manager_pid(&self) -> Option<u32> {
        self.controller_manager.as_ref().map(ControllerManager::pid)
    }

    /// The last `lines` lines of the operator's log (for failure messages).
    pub fn operator_log(&self, lines: usize) -> String {
        let text =
            std::fs::read_to_string(self.dir.path().join("fleet-operator.log")).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(&self.kubectl);
        cmd.arg(format!("--request-timeout={KUBECTL_TIMEOUT}"))
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .stdin(Stdio::null());
        cmd
    }

    /// `kubectl <args>`: its stdout, or its stderr as the error.
    pub fn try_kubectl(&self, args: &[&str]) -> Result<String, String> {
        let out = self
            .command(args)
            .output()
            .map_err(|e| format!("run kubectl: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).to_string())
        } else {
            Err(format!(
                "kubectl {} failed with {}: {}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    /// `kubectl <args>`; fails the test (with the operator's log) when it fails.
    pub fn kubectl(&self, args: &[&str]) -> String {
        self.try_kubectl(args).unwrap_or_else(|e| {
            panic!("{e}\n--- fleet-operator log ---\n{}", self.operator_log(40))
        })
    }

    /// `kubectl apply -f -` with `yaml` on stdin; its output.
    pub fn apply(&self, yaml: &str) -> String {
        self.with_stdin("apply", yaml)
    }

    /// `kubectl create -f -` with `yaml` on stdin (a TaskRun is created, never applied: its spec is immutable);
    /// its output.
    pub fn create(&self, yaml: &str) -> String {
        self.with_stdin("create", yaml)
    }

    /// `kubectl <args>` with `stdin`: its stdout, or its stderr as the error.
    pub fn try_with_stdin(&self, args: &[&str], stdin: &str) -> Result<String, String> {
        let mut child = self
            .command(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("run kubectl: {e}"))?;
        if let Some(mut input) = child.stdin.take() {
            input
                .write_all(stdin.as_bytes())
                .map_err(|e| format!("kubectl stdin: {e}"))?;
        }
        let out = child
            .wait_with_output()
            .map_err(|e| format!("kubectl {}: {e}", args.join(" ")))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).to_string())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).to_string())
        }
    }

    fn with_stdin(&self, verb: &str, yaml: &str) -> String {
        let mut child = self
            .command(&[verb, "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("run kubectl: {e}"));
        if let Some(mut stdin) = child.stdin.take() {
            stdin
                .write_all(yaml.as_bytes())
                .unwrap_or_else(|e| panic!("kubectl stdin: {e}"));
        }
        let out = child
            .wait_with_output()
            .unwrap_or_else(|e| panic!("kubectl {verb}: {e}"));
        assert!(
            out.status.success(),
            "kubectl {verb} failed: {}\n{yaml}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).to_string()
    }

    /// `kubectl get <what> -o json`, parsed; `None` when kubectl fails (for example: not found yet).
    pub fn get_json(&self, what: &[&str]) -> Option<serde_json::Value> {
        let mut args = vec!["get"];
        args.extend_from_slice(what);
        args.extend_from_slice(&["-o", "json"]);
        let out = self.try_kubectl(&args).ok()?;
        serde_json::from_str(&out).ok()
    }

    /// Every Device's `status.blocking` as (kind, message) pairs, as `kubectl get fdev -o json` shows them now (one
    /// read for all; empty when the read failed).
    pub fn blocking(&self) -> std::collections::BTreeMap<String, Vec<(String, String)>> {
        let Some(list) = self.get_json(&["fdev"]) else {
            return Default::default();
        };
        let mut out = std::collections::BTreeMap::new();
        for d in list["items"].as_array().into_iter().flatten() {
            let name = d["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let rs = d["status"]["blocking"].as_array().into_iter().flatten();
            let rs = rs
                .map(|b| {
                    let s = |k: &str| b[k].as_str().unwrap_or_default().to_owned();
                    (s("kind"), s("message"))
                })
                .collect();
            out.insert(name, rs);
        }
        out
    }

    /// The condition `type_` of the object `what` (e.g. `["frel", "good"]`) as a person reads it in
    /// `kubectl describe`; `None` while the object or the condition is missing.
    pub fn condition(&self, what: &[&str], type_: &str) -> Option<Condition> {
        let obj = self.get_json(what)?;
        let c = obj["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == type_)?;
        let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
        Some(Condition {
            status: s("status"),
            reason: s("reason"),
            message: s("message"),
        })
    }

    /// Warning events about the object of `kind` and `name`, in every namespace, as `kubectl get events` shows
    /// them: "reason: message".
    pub fn warnings(&self, kind: &str, name: &str) -> Vec<String> {
        let selector =
            format!("involvedObject.kind={kind},involvedObject.name={name},type=Warning");
        let Some(v) = self.get_json(&["events", "-A", "--field-selector", &selector]) else {
            return Vec::new();
        };
        let items = v["items"].as_array().map(Vec::as_slice).unwrap_or_default();
        items
            .iter()
            .map(|e| {
                let s = |k: &str| e[k].as_str().unwrap_or_default().to_string();
                format!("{}: {}", s("reason"), s("message"))
            })
            .collect()
    }

    /// Waits until `check` (polled every `every`, with kubectl calls inside) returns `Some`; fails with `what` and
    /// the operator's log otherwise.
    pub fn wait<T>(
        &self,
        what: &str,
        timeout: Duration,
        mut check: impl FnMut() -> Option<T>,
    ) -> T {
        fleet_rig::wait::poll_every(timeout, POLL, || check().ok_or(fleet_rig::wait::Nothing))
            .unwrap_or_else(|t| {
                panic!(
                    "{}.\n--- fleet-operator log ---\n{}",
                    t.message(what),
                    self.operator_log(40)
                )
            })
    }
}

/// How often a wait asks the cluster again: each ask starts kubectl, which costs a little CPU.
pub const POLL: Duration = Duration::from_millis(400);

fn write_private(path: &Path, contents: &str) {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(path)
        .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    f.write_all(contents.as_bytes())
        .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(mut c) = self
            .operator
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// 32 hex characters from the kernel's random source (the dashboard's token).
fn random_token() -> String {
    use std::io::Read;
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .unwrap_or_else(|e| panic!("read /dev/urandom: {e}"));
    b.iter().map(|x| format!("{x:02x}")).collect()
}
