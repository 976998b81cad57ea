//! A real OCI registry (Debian `docker-registry`, distribution 2.8) per test: filesystem storage in a temporary
//! directory, HTTPS with a [`TestCa`] certificate on a free loopback port, and pushes through the plain registry
//! HTTP API (blob upload POST + PUT, manifest PUT). Anonymous, with Bearer tokens ([`TokenServer`]), or with
//! htpasswd basic auth (bcrypt entries from `htpasswd -B`; distribution 2.8 reads the file again when it changes,
//! so [`Registry::set_password`] rotates a password while it runs). [`Registry::push_busybox`] pushes a runnable
//! image (a static busybox) for Podman to pull.

use crate::tls::TestCa;
use crate::token::{TokenServer, TOKEN_ISSUER, TOKEN_SERVICE};
use crate::util::{free_port, require_binary};
use crate::wait::wait_for;
use sha2::{Digest, Sha256};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const INSTALL_HINT: &str = "Run `scripts/setup` (it installs the Debian package docker-registry), \
    or point FLEET_DOCKER_REGISTRY at a distribution 2.x `registry` binary.";
const HTPASSWD_HINT: &str =
    "Run `scripts/setup` (it installs the Debian package apache2-utils, which has htpasswd).";

/// Media type of an OCI image config.
pub const OCI_CONFIG_MEDIA_TYPE: &str = "application/vnd.oci.image.config.v1+json";
/// Media type of an uncompressed OCI layer.
pub const OCI_LAYER_MEDIA_TYPE: &str = "application/vnd.oci.image.layer.v1.tar";
/// The realm of the htpasswd mode.
pub const HTPASSWD_REALM: &str = "fleet-test-registry";

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
    /// The htpasswd mode's user and current password (what the rig's own pushes use).
    basic: Option<(String, String)>,
}

/// How clients authenticate.
enum Mode {
    Anonymous,
    Token(TokenServer),
    Htpasswd { user: String, password: String },
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
        Self::spawn(ca, Mode::Anonymous)
    }

    /// Starts a registry that requires HTTP basic auth of `user` with `password` (an htpasswd file with a bcrypt
    /// entry), for pulls and pushes alike; anonymous requests get `401` with a `Basic` challenge.
    pub fn start_with_htpasswd(ca: &TestCa, user: &str, password: &str) -> Self {
        Self::spawn(
            ca,
            Mode::Htpasswd {
                user: user.to_owned(),
                password: password.to_owned(),
            },
        )
    }

    /// Rotates the htpasswd mode's password while the registry runs: the file is rewritten (atomically) and the
    /// registry, which re-reads it on change, accepts only the new password from the next request on. Waits
    /// until it does.
    pub fn set_password(&mut self, password: &str) {
        let user = match &self.basic {
            Some((u, _)) => u.clone(),
            None => panic!("set_password needs a registry started with htpasswd auth"),
        };
        write_htpasswd(&self._dir.path().join("htpasswd"), &user, password);
        self.basic = Some((user.clone(), password.to_owned()));
        let url = self.url("/v2/");
        let basic = basic_header(&user, password);
        let ok = wait_for(Duration::from_secs(10), || {
            self.client
                .get(&url)
                .header("Authorization", &basic)
                .call()
                .ok()
                .filter(|r| r.status() == 200)
        });
        assert!(
            ok.is_some(),
            "the registry did not take the new password within 10 s"
        );
    }

    /// Starts a registry that requires Bearer tokens from a [`TokenServer`] (anonymous token requests are
    /// granted): a client must follow the `401` challenge, as with public registries.
    pub fn start_with_token_auth(ca: &TestCa) -> Self {
        Self::spawn(ca, Mode::Token(TokenServer::start(ca)))
    }

    /// The token server, when started with token auth.
    pub fn token_server(&self) -> Option<&TokenServer> {
        self.token.as_ref()
    }

    fn spawn(ca: &TestCa, mode: Mode) -> Self {
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
        let config = match &mode {
            Mode::Anonymous => config,
            Mode::Token(t) => format!(
                "{config}auth:\n  token:\n    realm: {}\n    service: {TOKEN_SERVICE}\n    issuer: {TOKEN_ISSUER}\n    rootcertbundle: {}\n",
                t.realm(),
                ca.ca_file().display()
            ),
            Mode::Htpasswd { user, password } => {
                let file = dir.path().join("htpasswd");
                write_htpasswd(&file, user, password);
                format!(
                    "{config}auth:\n  htpasswd:\n    realm: {HTPASSWD_REALM}\n    path: {}\n",
                    file.display()
                )
            }
        };
        let (token, basic) = match mode {
            Mode::Anonymous => (None, None),
            Mode::Token(t) => (Some(t), None),
            Mode::Htpasswd { user, password } => (None, Some((user, password))),
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
            basic,
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
        if let Some((user, password)) = &self.basic {
            return Some(basic_header(user, password));
        }
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

impl Registry {
    /// Pushes a runnable image as `repo:tag`: one uncompressed layer holding a static busybox as `/bin/busybox`
    /// with `sh`, `sleep`, `cat`, `ls`, `stat`, `env` and `true` links, and a config whose command is `sh`.
    /// Returns the manifest digest; `repo:tag` then pulls as `<host>/<repo>:<tag>`.
    pub fn push_busybox(&self, repo: &str, tag: &str) -> String {
        let layer = busybox_layer();
        let diff_id = digest(&layer);
        let config = serde_json::json!({
            "architecture": oci_arch(),
            "os": "linux",
            "config": {"Cmd": ["/bin/sh"], "Env": ["PATH=/bin"]},
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        })
        .to_string()
        .into_bytes();
        self.push_blob(repo, &config);
        self.push_blob(repo, &layer);
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST_MEDIA_TYPE,
            "config": {"mediaType": OCI_CONFIG_MEDIA_TYPE, "digest": digest(&config), "size": config.len()},
            "layers": [{"mediaType": OCI_LAYER_MEDIA_TYPE, "digest": diff_id, "size": layer.len()}],
        });
        let manifest =
            serde_json::to_vec(&manifest).unwrap_or_else(|e| panic!("manifest JSON: {e}"));
        self.push_manifest(repo, tag, &manifest)
    }
}

/// The OCI architecture name of this machine.
fn oci_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// A tar of `bin/busybox` (the host's static busybox) and its applet links, made with `tar`.
fn busybox_layer() -> Vec<u8> {
    let busybox = require_binary(
        "busybox",
        "FLEET_BUSYBOX",
        &["/bin/busybox".into()],
        "Run `scripts/setup` (it installs busybox-static).",
    );
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("temp dir for the image layer: {e}"));
    let bin = dir.path().join("tree/bin");
    std::fs::create_dir_all(&bin).unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
    std::fs::copy(&busybox, bin.join("busybox")).unwrap_or_else(|e| panic!("copy busybox: {e}"));
    for applet in ["sh", "sleep", "cat", "ls", "stat", "env", "true"] {
        std::os::unix::fs::symlink("busybox", bin.join(applet))
            .unwrap_or_else(|e| panic!("link {applet}: {e}"));
    }
    let tar = dir.path().join("layer.tar");
    let st = Command::new("tar")
        .arg("-C")
        .arg(dir.path().join("tree"))
        .arg("-cf")
        .arg(&tar)
        .arg(".")
        .status()
        .unwrap_or_else(|e| panic!("tar: {e}"));
    assert!(st.success(), "tar of the busybox layer failed");
    std::fs::read(&tar).unwrap_or_else(|e| panic!("read {}: {e}", tar.display()))
}

/// `Basic base64(user:password)`.
fn basic_header(user: &str, password: &str) -> String {
    use base64::Engine;
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
    )
}

/// Writes `file` with one bcrypt entry for `user` (`htpasswd -B`, the password on its standard input), through a
/// temporary file and a rename, so the registry never reads half a file.
fn write_htpasswd(file: &std::path::Path, user: &str, password: &str) {
    use std::io::Write;
    let bin = require_binary("htpasswd", "FLEET_HTPASSWD", &[], HTPASSWD_HINT);
    let mut child = Command::new(&bin)
        .args(["-niB", user])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("run {}: {e}. {HTPASSWD_HINT}", bin.display()));
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(password.as_bytes())
            .unwrap_or_else(|e| panic!("htpasswd stdin: {e}"));
    }
    let out = child
        .wait_with_output()
        .unwrap_or_else(|e| panic!("htpasswd: {e}"));
    assert!(
        out.status.success(),
        "htpasswd -niB failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tmp = file.with_extension("new");
    std::fs::write(&tmp, &out.stdout).unwrap_or_else(|e| panic!("write {}: {e}", tmp.display()));
    std::fs::rename(&tmp, file).unwrap_or_else(|e| panic!("rename to {}: {e}", file.display()));
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
