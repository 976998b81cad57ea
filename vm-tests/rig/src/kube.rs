//! A real kube-apiserver (built by `scripts/setup.d/50-kube-apiserver.sh`) on a real etcd (Debian `etcd-server`),
//! both on free loopback ports with temporary state, token authentication and a serving certificate issued by a
//! [`TestCa`] (clients verify it: [`KubeApiServer::kubeconfig`] carries the CA).
//!
//! Both processes are killed on drop, and also by a small watchdog once the test process is gone, so that a
//! server kept in a `static` for a whole test binary does not outlive it.

use crate::tls::TestCa;
use crate::util::{free_port, kill_and_remove_when_gone, require_binary, workspace_root};
use crate::wait::wait_for;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const APISERVER_HINT: &str = "Run `scripts/setup` (its part 50-kube-apiserver builds kube-apiserver from Debian's \
    kubernetes source package into $FLEET_CACHE/kube-apiserver/), or point FLEET_KUBE_APISERVER at a binary.";
const ETCD_HINT: &str =
    "Run `scripts/setup` (it installs Debian's etcd-server), or point FLEET_ETCD at an etcd 3.4+ binary.";
/// How long the API server may take to answer `/readyz` (about 4 s on an idle 2-core machine).
pub const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// The user name the operator's token authenticates as: the `fleet-operator` service account of
/// `operator/deploy/rbac.yaml`, so that RBAC grants it exactly what the deployed operator gets.
pub const OPERATOR_USER: &str = "system:serviceaccount:harmony-fleet:fleet-operator";

/// A running etcd + kube-apiserver pair.
pub struct KubeApiServer {
    dir: tempfile::TempDir,
    ca: TestCa,
    port: u16,
    token: String,
    operator_token: String,
    etcd: Option<Child>,
    apiserver: Option<Child>,
}

fn kube_apiserver_binary() -> PathBuf {
    let cache = std::env::var_os("FLEET_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(".cache"));
    require_binary(
        "kube-apiserver",
        "FLEET_KUBE_APISERVER",
        &[cache.join("kube-apiserver/kube-apiserver")],
        APISERVER_HINT,
    )
}

fn log_tail(path: &Path) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

impl KubeApiServer {
    /// Starts etcd and kube-apiserver and waits for `/readyz`. Panics (failing the test) if either cannot start.
    pub fn start() -> Self {
        let apiserver_bin = kube_apiserver_binary();
        let etcd_bin = require_binary(
            "etcd",
            "FLEET_ETCD",
            &[PathBuf::from("/usr/bin/etcd")],
            ETCD_HINT,
        );
        let dir = tempfile::Builder::new()
            .prefix("fleet-kube-")
            .tempdir()
            .unwrap_or_else(|e| panic!("temp dir for kube-apiserver: {e}"));
        let d = dir.path().to_path_buf();
        let d = d.as_path();
        let token = format!("fleet-test-{}", crate::util::random_hex());
        let operator_token = format!("fleet-operator-{}", crate::util::random_hex());
        fs::write(
            d.join("tokens.csv"),
            format!(
                "{token},fleet-admin,fleet-admin,\"system:masters\"\n\
                 {operator_token},{OPERATOR_USER},fleet-operator-sa,\"system:serviceaccounts,system:serviceaccounts:harmony-fleet\"\n"
            ),
        )
        .unwrap_or_else(|e| panic!("token file: {e}"));
        let ca = TestCa::new();
        let serving = ca.server_cert("kube-apiserver");
        let key = d.join("sa.key");
        let status = Command::new("openssl")
            .args(["genrsa", "-out"])
            .arg(&key)
            .arg("2048")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap_or_else(|e| panic!("openssl (apt-get install openssl): {e}"));
        assert!(status.success(), "openssl genrsa failed");
        let log = |name: &str| {
            fs::File::create(d.join(name)).unwrap_or_else(|e| panic!("log file {name}: {e}"))
        };

        let (client_port, peer_port) = (free_port(), free_port());
        let etcd = Command::new(&etcd_bin)
            .arg("--data-dir")
            .arg(d.join("etcd"))
            .args([
                "--name",
                "fleet-test",
                "--listen-client-urls",
                &format!("http://127.0.0.1:{client_port}"),
                "--advertise-client-urls",
                &format!("http://127.0.0.1:{client_port}"),
                "--listen-peer-urls",
                &format!("http://127.0.0.1:{peer_port}"),
                "--initial-advertise-peer-urls",
                &format!("http://127.0.0.1:{peer_port}"),
                "--initial-cluster",
                &format!("fleet-test=http://127.0.0.1:{peer_port}"),
                "--unsafe-no-fsync",
            ])
            .env("ETCD_UNSUPPORTED_ARCH", "")
            .stdin(Stdio::null())
            .stdout(log("etcd.log"))
            .stderr(log("etcd.err"))
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", etcd_bin.display()));
        let port = free_port();
        let mut s = Self {
            dir,
            ca,
            port,
            token,
            operator_token,
            etcd: Some(etcd),
            apiserver: None,
        };
        let d = s.dir.path().to_path_buf();
        let up = wait_for(Duration::from_secs(30), || {
            std::net::TcpStream::connect(("127.0.0.1", client_port)).ok()
        });
        assert!(
            up.is_some(),
            "etcd did not listen on {client_port}:\n{}",
            log_tail(&d.join("etcd.err"))
        );
        let apiserver = Command::new(&apiserver_bin)
            .args([
                &format!("--etcd-servers=http://127.0.0.1:{client_port}"),
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                &format!("--secure-port={port}"),
                "--insecure-port=0",
                &format!("--tls-cert-file={}", serving.cert_file.display()),
                &format!("--tls-private-key-file={}", serving.key_file.display()),
                &format!("--token-auth-file={}", d.join("tokens.csv").display()),
                "--authorization-mode=RBAC",
                &format!("--service-account-key-file={}", key.display()),
                &format!("--service-account-signing-key-file={}", key.display()),
                "--service-account-issuer=https://kubernetes.default.svc",
                "--service-cluster-ip-range=10.96.0.0/24",
                "--enable-priority-and-fairness=false",
                "--v=1",
            ])
            .stdin(Stdio::null())
            .stdout(log("apiserver.log"))
            .stderr(log("apiserver.err"))
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", apiserver_bin.display()));
        s.apiserver = Some(apiserver);
        s.spawn_watchdog();
        let url = s.url();
        let auth = format!("Authorization: Bearer {}", s.token);
        let ready = wait_for(READY_TIMEOUT, || {
            if let Some(Ok(Some(st))) = s.apiserver.as_mut().map(|c| c.try_wait()) {
                panic!(
                    "kube-apiserver exited with {st}:\n{}",
                    log_tail(&d.join("apiserver.err"))
                );
            }
            let out = Command::new("curl")
                .args([
                    "-s",
                    "--cacert",
                    &s.ca.ca_file().display().to_string(),
                    "--max-time",
                    "2",
                    "-H",
                    &auth,
                    &format!("{url}/readyz"),
                ])
                .output()
                .ok()?;
            (out.stdout == b"ok").then_some(())
        });
        assert!(
            ready.is_some(),
            "kube-apiserver at {url} was not ready within {READY_TIMEOUT:?}:\n{}",
            log_tail(&d.join("apiserver.err"))
        );
        s
    }

    fn spawn_watchdog(&self) {
        kill_and_remove_when_gone(&self.pids(), self.dir.path());
    }

    /// `https://127.0.0.1:<port>` (certificate issued by [`Self::ca_file`]'s CA).
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// A bearer token of a `system:masters` user.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// A bearer token of [`OPERATOR_USER`] (no rights until `operator/deploy/rbac.yaml` is applied).
    pub fn operator_token(&self) -> &str {
        &self.operator_token
    }

    /// The CA certificate (PEM file) the API server's serving certificate is issued by.
    pub fn ca_file(&self) -> &Path {
        self.ca.ca_file()
    }

    /// A kubeconfig for `token` that verifies the server against [`Self::ca_file`] (no verification turned off;
    /// valid while this server runs).
    pub fn kubeconfig(&self, token: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\n\
             clusters:\n- name: fleet\n  cluster:\n    server: {url}\n    certificate-authority: {ca}\n\
             users:\n- name: fleet\n  user:\n    token: {token}\n\
             contexts:\n- name: fleet\n  context:\n    cluster: fleet\n    user: fleet\n\
             current-context: fleet\n",
            url = self.url(),
            ca = self.ca.ca_file().display(),
        )
    }

    /// The PIDs of etcd and kube-apiserver (for a caller that records what it started).
    pub fn pids(&self) -> Vec<u32> {
        [&self.etcd, &self.apiserver]
            .iter()
            .filter_map(|c| c.as_ref().map(Child::id))
            .collect()
    }

    /// The directory with the servers' logs (`apiserver.err`, `etcd.err`).
    pub fn log_dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for KubeApiServer {
    fn drop(&mut self) {
        for c in [self.apiserver.take(), self.etcd.take()]
            .into_iter()
            .flatten()
        {
            let mut c = c;
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The admission webhooks exactly as `operator/deploy/webhook.yaml` registers them (the same hooks, rules, paths,
/// failure policy and time-outs), for an operator serving them outside a cluster: each hook's `clientConfig`
/// points at `base_url` plus its service path instead of the in-cluster Service (this API server runs no cluster
/// network), trusts `ca_pem`, and, when given, only sees objects matching `object_selector` (tests that share one
/// API server). Named `name`. Used by the demo's cluster and by the operator's tests alike.
pub fn webhook_registration(
    name: &str,
    base_url: &str,
    ca_pem: &[u8],
    object_selector: Option<serde_json::Value>,
) -> serde_json::Value {
    use base64::Engine;
    let path = workspace_root().join("operator/deploy/webhook.yaml");
    let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let mut config = text
        .split("\n---\n")
        .map(|doc| {
            serde_yaml_ng::from_str::<serde_json::Value>(doc)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        })
        .find(|d| d["kind"] == "ValidatingWebhookConfiguration")
        .unwrap_or_else(|| panic!("no ValidatingWebhookConfiguration in {}", path.display()));
    config["metadata"] = serde_json::json!({ "name": name });
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let hooks = config["webhooks"]
        .as_array_mut()
        .unwrap_or_else(|| panic!("{}: no webhooks", path.display()));
    for hook in hooks {
        let service_path = hook["clientConfig"]["service"]["path"]
            .as_str()
            .unwrap_or_else(|| panic!("{}: a hook without a service path", path.display()))
            .to_owned();
        hook["clientConfig"] =
            serde_json::json!({ "url": format!("{base_url}{service_path}"), "caBundle": ca });
        if let Some(sel) = &object_selector {
            hook["objectSelector"] = sel.clone();
        }
    }
    config
}
