//! Shared by the operator's tests against the real kube-apiserver: one API server + etcd per test binary, a client
//! that verifies it with the rig's CA (as kubectl does with the same kubeconfig), the CRDs installed exactly as
//! `operator/deploy/crds.yaml` has them, and `eventually`.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use async_nats::jetstream;
use fleet_rig::kube::KubeApiServer;
use fleet_rig::NatsServer;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use kube::Client;
use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;

/// The API server of this test binary, started by the first [`client`].
pub static API: OnceLock<KubeApiServer> = OnceLock::new();
/// How long [`eventually`] waits.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// A client of the shared API server (started on first use), with the CRDs installed.
pub async fn client() -> Client {
    let _ = env_logger::builder().is_test(true).try_init();
    let api = tokio::task::spawn_blocking(|| API.get_or_init(KubeApiServer::start))
        .await
        .expect("apiserver start");
    // The server's certificate is verified against the rig's CA, as kubectl does with the same kubeconfig.
    let kubeconfig =
        kube::config::Kubeconfig::from_yaml(&api.kubeconfig(api.token())).expect("kubeconfig");
    let cfg = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("client config");
    let client = Client::try_from(cfg).expect("client");
    install_crds(&client).await;
    client
}

/// Applies the CRDs exactly as `operator/deploy/crds.yaml` has them and waits until they are established.
pub async fn install_crds(client: &Client) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in fleet_operator::crd::all_crds() {
        let name = crd.metadata.name.clone().expect("name");
        api.patch(
            &name,
            &PatchParams::apply("fleet-test").force(),
            &Patch::Apply(&crd),
        )
        .await
        .expect("apply CRD");
        eventually("CRD established", || async {
            let c = api.get(&name).await.ok()?;
            let conds = c.status?.conditions?;
            conds
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
                .then_some(())
        })
        .await;
    }
}

/// Polls `f` until it returns `Some`; fails the test after [`DEADLINE`] (the rig's one wait,
/// [`fleet_rig::eventually_async`]).
pub async fn eventually<T, F, Fut>(what: &str, f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    fleet_rig::eventually_async(what, DEADLINE, f).await
}

/// One test's world: the API client, its own nats-server, the operators it started (aborted on drop) and `run`,
/// the label value (`fleet-test=<run>`) and name suffix that keep its objects apart from other tests'.
pub struct Fleet {
    /// Client of the shared API server.
    pub client: Client,
    /// This test's nats-server.
    pub nats: NatsServer,
    /// JetStream on it.
    pub js: jetstream::Context,
    /// `<test name>-<pid>`.
    pub run: String,
    /// Operators started in this process.
    pub operators: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for o in &self.operators {
            o.abort();
        }
    }
}

impl Fleet {
    /// Creates the cluster-scoped object `obj` (JSON of kind `K`) and returns it as the API server stored it.
    #[allow(dead_code)] // not every test binary creates typed objects
    pub async fn create<K>(&self, obj: serde_json::Value) -> K
    where
        K: kube::Resource<DynamicType = (), Scope = k8s_openapi::ClusterResourceScope>
            + Clone
            + serde::de::DeserializeOwned
            + serde::Serialize
            + std::fmt::Debug,
    {
        let k: K = serde_json::from_value(obj).expect("object");
        kube::Api::<K>::all(self.client.clone())
            .create(&kube::api::PostParams::default(), &k)
            .await
            .expect("create")
    }

    /// The shared API server (CRDs installed), a nats-server of this test's own, no operator yet.
    pub async fn start(run: &str) -> Self {
        let client = client().await;
        let nats = NatsServer::start();
        let nc = async_nats::connect(nats.url()).await.expect("nats");
        Self {
            client,
            js: jetstream::new(nc),
            nats,
            run: format!("{run}-{}", std::process::id()),
            operators: vec![],
        }
    }

    /// Starts one more deployments-and-releases engine in this process for this test's objects only (its own
    /// instance name, the test's label selector).
    pub fn start_engine(&mut self) {
        let opts = fleet_operator::deployments::engine::Options {
            nats_url: self.nats.url(),
            instance: Some(format!("op-{}", self.operators.len())),
            label_selector: Some(format!("fleet-test={}", self.run)),
            nats: Default::default(),
            secrets_namespace: None,
        };
        self.operators.push(spawn_engine(self.client.clone(), opts));
    }

    /// Stops every operator of this test at once (as a SIGKILL would: the task is dropped mid-pass).
    pub async fn kill_operators(&mut self) {
        for o in self.operators.drain(..) {
            o.abort();
            let _ = o.await;
        }
    }

    /// Bucket `name`, once the operator has made it.
    pub async fn bucket_when_made(&self, name: &str) -> async_nats::jetstream::kv::Store {
        eventually(&format!("bucket {name}"), || async {
            self.js.get_key_value(name).await.ok()
        })
        .await
    }

    /// `base` made unique to this test.
    pub fn name(&self, base: &str) -> String {
        format!("{base}-{}", self.run)
    }

    /// This test's label plus `extra` (a JSON object of labels).
    pub fn labels(&self, extra: serde_json::Value) -> serde_json::Value {
        let mut labels = serde_json::json!({"fleet-test": self.run});
        for (k, v) in extra.as_object().into_iter().flatten() {
            labels[k] = v.clone();
        }
        labels
    }
}

/// The operator's admission webhook served in this process over HTTPS (a test CA of its own) and registered as
/// `operator/deploy/webhook.yaml` has it ([`fleet_rig::kube::webhook_registration`], as the demo's cluster does):
/// every hook pointed at 127.0.0.1 by its service path, for this test's objects only (the API server is shared by
/// the tests of the binary). [`Webhook::remove`] unregisters it.
pub struct Webhook {
    /// The ValidatingWebhookConfiguration's name.
    pub name: String,
    client: Client,
    server: tokio::task::JoinHandle<()>,
    _ca: fleet_rig::tls::TestCa,
}

impl Drop for Webhook {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl Webhook {
    /// Unregisters the hooks and stops the server.
    pub async fn remove(self) {
        use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
        Api::<ValidatingWebhookConfiguration>::all(self.client.clone())
            .delete(&self.name, &Default::default())
            .await
            .expect("unregister webhook");
    }
}

impl Fleet {
    /// Serves and registers the admission webhook for this test's objects (see [`Webhook`]). The API server loads
    /// the configuration asynchronously: callers retry until the first refusal.
    pub async fn webhook(&self) -> Webhook {
        use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
        let ca = fleet_rig::tls::TestCa::new();
        let cert = ca.server_cert("webhook");
        let tls =
            fleet_operator::webhook::tls_config(&cert.cert_file, &cert.key_file).expect("tls");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        // The webhook reads the WorkloadPolicies from a cache of its own here (main gives it the operator's).
        let policies = fleet_operator::cache::Shared::watch(
            &self.client,
            &Some(format!("fleet-test={}", self.run)),
        );
        let server = tokio::spawn(fleet_operator::webhook::serve(listener, tls, policies));
        let name = self.name("webhooks");
        let ca_pem = std::fs::read(ca.ca_file()).unwrap();
        let config: ValidatingWebhookConfiguration =
            serde_json::from_value(fleet_rig::kube::webhook_registration(
                &name,
                &format!("https://127.0.0.1:{port}"),
                &ca_pem,
                Some(serde_json::json!({"matchLabels": {"fleet-test": self.run}})),
            ))
            .expect("webhook configuration");
        Api::<ValidatingWebhookConfiguration>::all(self.client.clone())
            .create(&Default::default(), &config)
            .await
            .expect("register webhook");
        Webhook {
            name,
            client: self.client.clone(),
            server,
            _ca: ca,
        }
    }
}

/// `kubectl <args>` against the shared API server as a person runs it (verifying it with the rig's CA), with
/// `stdin`; returns (success, stdout, stderr).
pub fn kubectl(args: &[&str], stdin: &str) -> (bool, String, String) {
    use std::io::Write;
    let api = API.get().expect("apiserver started");
    let cache = std::env::var_os("FLEET_CACHE")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| fleet_rig::workspace_root().join(".cache"));
    let bin = fleet_rig::require_binary(
        "kubectl",
        "FLEET_KUBECTL",
        &[cache.join("kube-apiserver/kubectl")],
        "Run `scripts/setup kube-apiserver`, or point FLEET_KUBECTL at a kubectl binary.",
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("kubeconfig");
    std::fs::write(&config, api.kubeconfig(api.token())).expect("kubeconfig");
    let mut child = std::process::Command::new(bin)
        .arg("--kubeconfig")
        .arg(&config)
        .args(["--request-timeout", "30s"])
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run kubectl");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .expect("write stdin");
    let out = child.wait_with_output().expect("kubectl output");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The deployments controller run alone, on a runtime of its own (main runs it on the operator's shared one).
pub fn spawn_engine(
    client: Client,
    opts: fleet_operator::deployments::engine::Options,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let rt = fleet_operator::runtime::Runtime::new(
            client,
            &opts.label_selector,
            &opts.nats_url,
            opts.nats.clone(),
        );
        let _ = fleet_operator::deployments::engine::run_with(&rt, opts).await;
    })
}
