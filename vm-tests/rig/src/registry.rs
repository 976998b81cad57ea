//! A real OCI registry (Debian `docker-registry`, distribution 2.8) per test: filesystem storage in a temporary
//! directory, HTTPS with a [`TestCa`] certificate on a free loopback port, and pushes through the plain registry
//! HTTP API (blob upload POST + PUT, manifest PUT).

use crate::tls::TestCa;
use crate::token::{TokenServer, TOKEN_ISSUER, TOKEN_SERVICE};
use crate::util::{free_port, require_binary, wait_for};
use sha2::{Digest, Sha256};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const INSTALL_HINT: &str = "Run `scripts/setup` (it installs the Debian package docker-registry), \
    or point FLEET_DOCKER_REGISTRY at a distribution 2.x `registry` binary.";

/// Media type of the empty config blob `{}`.
pub const EMPTY_CONFIG_MEDIA_TYPE: &str = "application/vnd.oci.empty.v1+json";
/// Media type of an OCI image manifest.
pub const OCI_MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";

/// A running registry; killed and its storage removed on drop.
pub struct Registry {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
    client: ureq::Agent,
    token: Option<TokenServer>,
}

/// `sha256:<hex>` of `bytes`.
pub fn digest(bytes: &[u8]) -> String {
    let d = Sha256::digest(bytes);
    format!(
        "sha256:{}",
        d.iter().map(|b| format!("{b:02x}")).collect::<String>()
    )
}

/// An OCI image manifest JSON with an empty `{}` config, the given `artifactType` (omitted when `None`) and
/// one layer per `(media type, blob)`.
pub fn artifact_manifest(artifact_type: Option<&str>, layers: &[(&str, &[u8])]) -> Vec<u8> {
    let layers: Vec<serde_json::Value> = layers
        .iter()
        .map(|(mt, blob)| {
            serde_json::json!({"mediaType": mt, "digest": digest(blob), "size": blob.len()})
        })
        .collect();
    let mut m = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST_MEDIA_TYPE,
        "config": {"mediaType": EMPTY_CONFIG_MEDIA_TYPE, "digest": digest(b"{}"), "size": 2},
        "layers": layers,
    });
    if let Some(t) = artifact_type {
        m["artifactType"] = serde_json::json!(t);
    }
    serde_json::to_vec_pretty(&m).unwrap_or_else(|e| panic!("manifest JSON: {e}"))
}

impl Registry {
    /// The registry binary.
    pub fn binary() -> std::path::PathBuf {
        require_binary(
            "docker-registry",
            "FLEET_DOCKER_REGISTRY",
            &["/usr/bin/docker-registry".into()],
            INSTALL_HINT,
        )
    }

    /// Starts a registry serving HTTPS with a certificate from `ca`; ready when `GET /v2/` answers 200.
    pub fn start(ca: &TestCa) -> Self {
        Self::spawn(ca, None)
    }

    /// Starts a registry that requires Bearer tokens from a [`TokenServer`] (anonymous token requests are
    /// granted): a client must follow the `401` challenge, as with public registries.
    pub fn start_with_token_auth(ca: &TestCa) -> Self {
        Self::spawn(ca, Some(TokenServer::start(ca)))
    }

    /// The token server, when started with token auth.
    pub fn token_server(&self) -> Option<&TokenServer> {
        self.token.as_ref()
    }

    fn spawn(ca: &TestCa, token: Option<TokenServer>) -> Self {
        let bin = Self::binary();
        let dir = tempfile::Builder::new()
            .prefix("fleet-registry-")
            .tempdir()
            .unwrap_or_else(|e| panic!("temp dir for the registry: {e}"));
        let cert = ca.server_cert("registry");
        let port = free_port();
        let config = format!(
            "version: 0.1\nlog:\n  level: warn\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n  tls:\n    certificate: {}\n    key: {}\n",
            dir.path().join("data").display(),
            cert.cert_file.display(),
            cert.key_file.display(),
        );
        let config = match &token {
            None => config,
            Some(t) => format!(
                "{config}auth:\n  token:\n    realm: {}\n    service: {TOKEN_SERVICE}\n    issuer: {TOKEN_ISSUER}\n    rootcertbundle: {}\n",
                t.realm(),
                ca.ca_file().display()
            ),
        };
        let config_file = dir.path().join("config.yml");
        std::fs::write(&config_file, config)
            .unwrap_or_else(|e| panic!("write registry config: {e}"));
        let log = std::fs::File::create(dir.path().join("registry.log"))
            .unwrap_or_else(|e| panic!("registry log: {e}"));
        let log2 = log
            .try_clone()
            .unwrap_or_else(|e| panic!("registry log: {e}"));
        let child = Command::new(&bin)
            .arg("serve")
            .arg(&config_file)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}. {INSTALL_HINT}", bin.display()));
        let mut reg = Self {
            child,
            port,
            _dir: dir,
            client: ca.client(),
            token,
        };
        let url = reg.url("/v2/");
        let up = wait_for(Duration::from_secs(20), || {
            if let Ok(Some(status)) = reg.child.try_wait() {
                let log = std::fs::read_to_string(reg._dir.path().join("registry.log"))
                    .unwrap_or_default();
                panic!("docker-registry exited at start-up with {status}:\n{log}");
            }
            reg.client
                .get(&url)
                .call()
                .ok()
                .filter(|r| r.status() == 200 || r.status() == 401)
        });
        if up.is_none() {
            let _ = reg.child.kill();
            panic!("docker-registry did not answer GET {url} within 20 s");
        }
        reg
    }

    /// `127.0.0.1:<port>`, the registry part of an `oci://` reference.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `https://127.0.0.1:<port><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("https://127.0.0.1:{}{path}", self.port)
    }

    /// `Authorization` for pushing to `repo`: a pull+push token when the registry uses token auth.
    fn auth(&self, repo: &str) -> Option<String> {
        let t = self.token.as_ref()?;
        let scope = format!("repository:{repo}:pull,push");
        let mut resp = self
            .client
            .get(t.realm())
            .query("service", TOKEN_SERVICE)
            .query("scope", &scope)
            .call()
            .unwrap_or_else(|e| panic!("token request: {e}"));
        let text = resp
            .body_mut()
            .read_to_string()
            .unwrap_or_else(|e| panic!("token response: {e}"));
        let body: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("token response {text}: {e}"));
        let token = body["token"]
            .as_str()
            .unwrap_or_else(|| panic!("token response without a token: {body}"));
        Some(format!("Bearer {token}"))
    }

    /// Uploads `blob` to `repo` (POST an upload session, then one monolithic PUT); returns its digest.
    pub fn push_blob(&self, repo: &str, blob: &[u8]) -> String {
        let d = digest(blob);
        let auth = self.auth(repo);
        let mut post = self
            .client
            .post(self.url(&format!("/v2/{repo}/blobs/uploads/")));
        if let Some(a) = &auth {
            post = post.header("Authorization", a);
        }
        let start = post
            .send_empty()
            .unwrap_or_else(|e| panic!("start blob upload: {e}"));
        assert_eq!(start.status(), 202, "start blob upload to {repo}");
        let location = start
            .headers()
            .get("location")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_else(|| panic!("upload answer without Location"))
            .to_owned();
        let location = if location.starts_with("https://") {
            location
        } else {
            self.url(&location)
        };
        let sep = if location.contains('?') { '&' } else { '?' };
        let mut put = self
            .client
            .put(format!("{location}{sep}digest={d}"))
            .header("Content-Type", "application/octet-stream");
        if let Some(a) = &auth {
            put = put.header("Authorization", a);
        }
        let put = put.send(blob).unwrap_or_else(|e| panic!("blob PUT: {e}"));
        assert_eq!(put.status(), 201, "blob PUT {d} to {repo}");
        d
    }

    /// PUTs `manifest` (an OCI image manifest) as `repo:reference`; returns the manifest's digest.
    pub fn push_manifest(&self, repo: &str, reference: &str, manifest: &[u8]) -> String {
        let mut put = self
            .client
            .put(self.url(&format!("/v2/{repo}/manifests/{reference}")))
            .header("Content-Type", OCI_MANIFEST_MEDIA_TYPE);
        if let Some(a) = self.auth(repo) {
            put = put.header("Authorization", a);
        }
        let mut resp = put
            .send(manifest)
            .unwrap_or_else(|e| panic!("manifest PUT: {e}"));
        let status = resp.status();
        let body = resp.body_mut().read_to_string().unwrap_or_default();
        assert_eq!(status, 201, "manifest PUT {repo}:{reference}: {body}");
        digest(manifest)
    }

    /// Pushes the empty config and every layer blob, then the manifest under `tag`; returns the manifest digest.
    pub fn push_artifact(
        &self,
        repo: &str,
        tag: &str,
        artifact_type: Option<&str>,
        layers: &[(&str, &[u8])],
    ) -> String {
        self.push_blob(repo, b"{}");
        for (_, blob) in layers {
            self.push_blob(repo, blob);
        }
        self.push_manifest(repo, tag, &artifact_manifest(artifact_type, layers))
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
