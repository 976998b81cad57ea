//! Shared set-up for the fleet-auth tests: a local HTTPS JWKS issuer with RSA and EC keys, a real nats-server with
//! `auth_callout`, the real `fleet-auth` binary, device connections with tokens, and a status-only updater peer
//! for real agents.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use fleet_rig::https::{HttpsServer, Reply};
use fleet_rig::nats_client as nats;
use fleet_rig::tls::TestCa;
use fleet_rig::{wait_for, NatsServer};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use ring::rand::SystemRandom;
use ring::signature::{EcdsaKeyPair, KeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub const ISSUER: &str = "https://zitadel.test";
pub const AUDIENCE: &str = "harmony-fleet";

pub fn now() -> u64 {
    jsonwebtoken::get_current_timestamp()
}

/// One signing key of the test issuer.
pub struct SignKey {
    pub kid: String,
    pub alg: Algorithm,
    pub enc: EncodingKey,
    pub jwk: Value,
}

impl SignKey {
    /// A P-256 key (ES256).
    pub fn ec(kid: &str) -> Self {
        let rng = SystemRandom::new();
        let pkcs8 =
            EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).expect("gen");
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .expect("pair");
        let p = pair.public_key().as_ref();
        Self {
            kid: kid.into(),
            alg: Algorithm::ES256,
            enc: EncodingKey::from_ec_der(pkcs8.as_ref()),
            jwk: json!({"kty": "EC", "crv": "P-256", "use": "sig", "alg": "ES256", "kid": kid,
                        "x": URL_SAFE_NO_PAD.encode(&p[1..33]), "y": URL_SAFE_NO_PAD.encode(&p[33..])}),
        }
    }

    /// A 2048-bit RSA key (RS256), made with the openssl command.
    pub fn rsa(kid: &str, dir: &Path) -> Self {
        let pem = dir.join(format!("{kid}.pem"));
        let out = Command::new("openssl")
            .args(["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out"])
            .arg(&pem)
            .output()
            .expect("the openssl command is needed to make the test's RSA key (apt-get install openssl)");
        assert!(out.status.success(), "openssl genpkey: {out:?}");
        let out = Command::new("openssl")
            .args(["rsa", "-noout", "-modulus", "-in"])
            .arg(&pem)
            .output()
            .expect("openssl rsa");
        let text = String::from_utf8(out.stdout).expect("utf8");
        let hex = text.trim().trim_start_matches("Modulus=");
        let n: Vec<u8> = (0..hex.len() / 2)
            .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("hex"))
            .collect();
        let pem_bytes = std::fs::read(&pem).expect("pem");
        Self {
            kid: kid.into(),
            alg: Algorithm::RS256,
            enc: EncodingKey::from_rsa_pem(&pem_bytes).expect("rsa pem"),
            jwk: json!({"kty": "RSA", "use": "sig", "alg": "RS256", "kid": kid,
                        "n": URL_SAFE_NO_PAD.encode(n), "e": "AQAB"}),
        }
    }

    /// Signs `claims` with this key, naming `kid` in the header.
    pub fn sign_as(&self, kid: &str, claims: &Value) -> String {
        let mut h = Header::new(self.alg);
        h.kid = Some(kid.into());
        jsonwebtoken::encode(&h, claims, &self.enc).expect("sign")
    }

    /// Signs `claims` under its own kid.
    pub fn sign(&self, claims: &Value) -> String {
        self.sign_as(&self.kid, claims)
    }
}

/// Valid claims for `device`, expiring in `ttl` seconds.
pub fn claims(device: &str, ttl: u64) -> Value {
    json!({"iss": ISSUER, "aud": [AUDIENCE, "zitadel-project"], "sub": "machine-user-1",
           "exp": now() + ttl, "iat": now(), "nbf": now() - 5, "device_id": device})
}

/// The JWKS endpoint: serves whatever body is set.
pub struct Jwks {
    pub server: Option<HttpsServer>,
    pub body: Arc<Mutex<Vec<u8>>>,
}

impl Jwks {
    pub fn start(ca: &TestCa, keys: &[&SignKey]) -> Self {
        let body = Arc::new(Mutex::new(Vec::new()));
        let b = body.clone();
        let server = HttpsServer::start(ca, move |_| Reply::ok(b.lock().unwrap().clone()));
        let j = Self {
            server: Some(server),
            body,
        };
        j.set(keys);
        j
    }

    pub fn set(&self, keys: &[&SignKey]) {
        let doc = json!({"keys": keys.iter().map(|k| k.jwk.clone()).collect::<Vec<_>>()});
        *self.body.lock().unwrap() = doc.to_string().into_bytes();
    }

    pub fn set_raw(&self, body: Vec<u8>) {
        *self.body.lock().unwrap() = body;
    }

    pub fn url(&self) -> String {
        self.server.as_ref().expect("running").url("/oauth/v2/keys")
    }
}

/// The fleet-auth binary: `FLEET_AUTH_BIN` when set (the benchmark uses a release build), else the one Cargo built
/// for this crate's tests (`cargo test -p fleet-auth`), else (this module in the operator's tests and examples) a
/// debug build of the `fleet-auth` crate, rebuilt when its sources changed (fleet-vm-tests' builds).
pub fn fleet_auth_bin() -> PathBuf {
    std::env::var_os("FLEET_AUTH_BIN")
        .map(PathBuf::from)
        .or_else(|| option_env!("CARGO_BIN_EXE_fleet-auth").map(PathBuf::from))
        .unwrap_or_else(fleet_vm_tests::builds::fleet_auth)
}

/// Runs the real `fleet-operator buckets` (fleet-vm-tests' build of it) against `url` (credentials in it), trusting
/// `ca` when given: the KV layout's buckets made as a fleet makes them, with the operator's limits (largest value,
/// byte limits, no rollup headers), which the attacks here run into. Its exit status and output.
pub fn operator_buckets(url: &str, ca: Option<&Path>) -> (bool, String) {
    let mut cmd = Command::new(fleet_vm_tests::builds::operator());
    match ca {
        Some(ca) => cmd.env("FLEET_NATS_CA_FILE", ca),
        None => cmd.env_remove("FLEET_NATS_CA_FILE"),
    };
    let out = cmd
        .arg("buckets")
        .env("FLEET_NATS_URL", url)
        .env_remove("FLEET_KV_REPLICAS")
        .env_remove("FLEET_SIZE")
        .output()
        .unwrap_or_else(|e| panic!("run fleet-operator buckets: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// [`operator_buckets`], failing the test when it fails.
pub fn make_buckets(url: &str, ca: Option<&Path>) {
    let (ok, text) = operator_buckets(url, ca);
    assert!(ok, "fleet-operator buckets failed: {text}");
}

/// nats-server with `auth_callout`, fleet-auth and an admin user (both in `auth_users`).
pub struct Stack {
    pub dir: tempfile::TempDir,
    pub nats: NatsServer,
    pub auth: Option<Child>,
    pub auth_log: PathBuf,
    pub auth_config: PathBuf,
    pub admin_password: String,
    pub issuer: nkeys::KeyPair,
}

fn password() -> String {
    let mut b = [0u8; 18];
    ring::rand::SecureRandom::fill(&SystemRandom::new(), &mut b).expect("rand");
    URL_SAFE_NO_PAD.encode(b)
}

impl Stack {
    /// Starts nats-server (with an xkey when `xkey`) and fleet-auth trusting `jwks_url` with the CA `ca`.
    pub fn start(ca: &TestCa, jwks_url: &str, xkey: bool) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("fleet-auth-test-")
            .tempdir()
            .expect("tmp");
        let issuer = nkeys::KeyPair::new_account();
        let curve = nkeys::XKey::new();
        let passwords = fleet_rig::nats::CalloutPasswords {
            auth: password(),
            admin: password(),
            device_api: password(),
            system: password(),
        };
        let conf = dir.path().join("nats.conf");
        std::fs::write(
            &conf,
            fleet_rig::nats::callout_config(
                &dir.path().join("nats.log"),
                &issuer.public_key(),
                &passwords,
                xkey.then(|| curve.public_key()).as_deref(),
            ),
        )
        .expect("nats.conf");
        let nats = NatsServer::start_with_args(&["-c", conf.to_str().expect("utf8")]);
        let write = |name: &str, text: &str| {
            let p = dir.path().join(name);
            std::fs::write(&p, text).expect("write");
            p
        };
        let pw = write("auth-password", &passwords.auth);
        let api_pw = write("device-api-password", &passwords.device_api);
        let admin_pw = write("admin-password", &passwords.admin);
        let system_pw = write("system-password", &passwords.system);
        let seed = write("issuer.nk", &issuer.seed().expect("seed"));
        let xkey_file = xkey.then(|| write("xkey.nk", &curve.seed().expect("xseed")));
        let auth_config = dir.path().join("fleet-auth.yaml");
        std::fs::write(
            &auth_config,
            format!(
                r#"nats:
  url: "{url}"
  user: fleet-auth
  password_file: "{pw}"
issuer_seed_file: "{seed}"
account: DEVICES
device_api:
  user: {api_user}
  password_file: "{api_pw}"
  fleet_user: admin
  fleet_password_file: "{admin_pw}"
flood_guard:
  user: {guard_user}
  password_file: "{system_pw}"
{xkey}
zitadel:
  issuer: "{ISSUER}"
  audience: "{AUDIENCE}"
  jwks_url: "{jwks_url}"
  jwks_ca_file: "{ca}"
  leeway_secs: 2
  jwks_timeout_ms: 1000
  jwks_max_bytes: 8192
  jwks_min_refresh_secs: 0
"#,
                url = nats.url(),
                pw = pw.display(),
                api_user = fleet_rig::nats::DEVICE_API_USER,
                api_pw = api_pw.display(),
                admin_pw = admin_pw.display(),
                guard_user = fleet_rig::nats::FLOOD_GUARD_USER,
                system_pw = system_pw.display(),
                seed = seed.display(),
                xkey = xkey_file
                    .map(|p| format!("xkey_seed_file: \"{}\"", p.display()))
                    .unwrap_or_default(),
                ca = ca.ca_file().display(),
            ),
        )
        .expect("fleet-auth.yaml");
        let mut s = Self {
            auth_log: dir.path().join("fleet-auth.log"),
            dir,
            nats,
            auth: None,
            auth_config,
            admin_password: passwords.admin,
            issuer,
        };
        s.start_auth();
        s
    }

    /// (Re)starts fleet-auth and waits until it serves.
    pub fn start_auth(&mut self) {
        self.stop_auth();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.auth_log)
            .expect("log");
        let before = self.auth_log_text().matches("fleet-auth serving").count();
        let child = Command::new(fleet_auth_bin())
            .arg("--config")
            .arg(&self.auth_config)
            .env(
                "RUST_LOG",
                std::env::var("FLEET_AUTH_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn fleet-auth");
        self.auth = Some(child);
        let up = wait_for(Duration::from_secs(20), || {
            (self.auth_log_text().matches("fleet-auth serving").count() > before).then_some(())
        });
        assert!(
            up.is_some(),
            "fleet-auth did not start:\n{}",
            self.auth_log_text()
        );
    }

    pub fn stop_auth(&mut self) {
        if let Some(mut c) = self.auth.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn auth_log_text(&self) -> String {
        std::fs::read_to_string(&self.auth_log).unwrap_or_default()
    }

    pub fn nats_log_text(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("nats.log")).unwrap_or_default()
    }

    /// `nats://admin:<password>@127.0.0.1:<port>`: the operator's own credentials (an `auth_users` user).
    pub fn admin_url(&self) -> String {
        format!(
            "nats://admin:{}@127.0.0.1:{}",
            self.admin_password,
            self.nats.port()
        )
    }

    /// A blocking admin connection.
    pub fn admin(&self) -> nats::Connection {
        fleet_rig::nats_client::connect_user(&self.nats.url(), "admin", &self.admin_password)
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        self.stop_auth();
    }
}

/// A device connection made with `token` (sent as the CONNECT auth token, as the agent does); server errors (permission
/// violations) are collected.
pub struct Device {
    pub conn: nats::Connection,
    pub errors: Arc<Mutex<Vec<String>>>,
}

/// Connects with `token`; the client's error text on refusal.
pub fn connect_device(url: &str, token: &str) -> Result<Device, String> {
    let errors = Arc::new(Mutex::new(Vec::new()));
    let e = errors.clone();
    nats::Options::with_token(token)
        .with_name("test-device")
        .error_callback(move |err| e.lock().unwrap().push(err.to_string()))
        .connect(url)
        .map(|conn| Device { conn, errors })
        .map_err(|e| e.to_string())
}

impl Device {
    /// Waits up to `timeout` for a server error containing `text`.
    pub fn wait_error(&self, text: &str, timeout: Duration) -> bool {
        wait_for(timeout, || {
            self.errors
                .lock()
                .unwrap()
                .iter()
                .any(|e| e.contains(text))
                .then_some(())
        })
        .is_some()
    }
}

/// A status-only updater peer (answers `status` with an idle updater), enough for an agent to become ready.
pub fn updater_peer(path: &Path) {
    use fleet_wire::socket::{parse_request, read_frame, write_frame, PROTOCOL_VERSION};
    use fleet_wire::{Request, Response, ResponseFrame};
    std::fs::create_dir_all(path.parent().expect("dir")).expect("mkdir");
    let listener = std::os::unix::net::UnixListener::bind(path).expect("bind updater socket");
    let status = fleet_wire::UpdaterStatus {
        updater_version: "test-peer".into(),
        boot_id: None,
        recovering: false,
        agent_upgrade: None,
        system_upgrade: None,
        capabilities: vec![fleet_wire::Capability::AgentUpgradeV1],
    };
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            let status = status.clone();
            std::thread::spawn(move || {
                let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
                let Ok(clone) = conn.try_clone() else { return };
                let mut reader = std::io::BufReader::new(clone);
                let Ok(Some(line)) = read_frame(&mut reader, 1 << 20) else {
                    return;
                };
                let response = match parse_request(&line) {
                    Ok(Request::Status {}) => Response::Status { status },
                    Ok(_) => Response::error(
                        fleet_wire::ErrorCode::Malformed,
                        "test peer answers status only",
                    ),
                    Err(e) => Response::error(e.code, e.message),
                };
                let mut w = conn;
                let _ = write_frame(
                    &mut w,
                    &ResponseFrame {
                        protocol: PROTOCOL_VERSION,
                        response,
                    },
                );
            });
        }
    });
}

/// A real fleet-agent for `device` (Podman off) with its token in `token_file`; killed on drop.
pub struct AgentProc {
    pub child: Child,
    pub log: PathBuf,
    pub root: tempfile::TempDir,
}

impl AgentProc {
    /// Starts the agent; with `podman` (a libpod socket) it reconciles real containers, else Podman is off.
    pub fn start(device: &str, nats_url: &str, token_file: &Path, podman: Option<&Path>) -> Self {
        Self::start_with_resync(device, nats_url, token_file, podman, 2)
    }

    /// [`Self::start`] re-reading its keys every `resync_secs` (long: only a watch notices a change in time).
    pub fn start_with_resync(
        device: &str,
        nats_url: &str,
        token_file: &Path,
        podman: Option<&Path>,
        resync_secs: u64,
    ) -> Self {
        let root = tempfile::Builder::new()
            .prefix("fleet-auth-agent-")
            .tempdir()
            .expect("root");
        std::fs::create_dir_all(root.path().join("etc")).expect("etc");
        std::fs::write(
            root.path().join("etc/os-release"),
            "ID=debian\nVERSION_ID=\"12\"\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\n",
        )
        .expect("os-release");
        updater_peer(&fleet_wire::socket::updater_socket(root.path()));
        let config = root.path().join("agent.toml");
        std::fs::write(
            &config,
            format!(
                "device_id = \"{device}\"\nroot = \"{}\"\n[nats]\nurls = [\"{nats_url}\"]\ntoken_file = \"{}\"\nconnect_timeout_secs = 2\nretry_window_secs = 60\n{}[intervals]\nheartbeat_secs = 1\nstatus_secs = 1\nresync_secs = {resync_secs}\nupdater_poll_ms = 200\n",
                root.path().display(),
                token_file.display(),
                match podman {
                    Some(sock) => format!(
                        "[podman]\nsocket = \"{}\"\nstop_timeout_secs = 2\n",
                        sock.display()
                    ),
                    None => "[podman]\nenabled = false\n".into(),
                }
            ),
        )
        .expect("agent.toml");
        let log = root.path().join("agent.log");
        let child = Command::new(fleet_vm_tests::builds::agent(fleet_vm_tests::builds::V1))
            .arg("--config")
            .arg(&config)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log"))
            .spawn()
            .expect("spawn fleet-agent");
        Self { child, log, root }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for AgentProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Writes `text` to `path` with mode 0600 (as device setup makes the token file).
pub fn write_token(path: &Path, text: &str) {
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .expect("token tmp");
    std::io::Write::write_all(&mut f, text.as_bytes()).expect("write token");
    std::fs::rename(&tmp, path).expect("rename token");
}

/// The bucket (keyed by device) where a device can store its largest value *and* read it back by a direct get:
/// the most it can make the server send to a reply subject it names per request. Write-only buckets (workload
/// status, 96 KiB) are excluded by the permissions, which is the point.
#[allow(dead_code)]
pub fn largest_readable_own_bucket() -> &'static fleet_wire::kv::BucketSpec {
    use fleet_wire::auth::{device_access, DeviceAccess};
    fleet_wire::device_api::written_buckets()
        .filter(|b| b.key == fleet_wire::kv::KeyShape::Device)
        .filter(|b| device_access(b) == DeviceAccess::ReadWrite)
        .max_by_key(|b| b.max_value_bytes)
        .expect("a bucket a device writes and reads")
}

/// The fleet's NATS as it runs (the rig's `FleetNats`: TLS with a private CA, the real fleet-auth, the Zitadel
/// stand-in), for a test binary kept in a static: never dropped, so the server and fleet-auth are killed when the
/// test process ends.
pub fn fleet_nats_tls() -> fleet_rig::callout::FleetNats {
    use fleet_rig::callout::{FleetNats, NatsAuth, NatsTransport};
    let nats = FleetNats::start_with(NatsAuth::Callout, NatsTransport::Tls, fleet_auth_bin);
    let pids: Vec<u32> = [nats.pid(), nats.auth_pid()]
        .into_iter()
        .flatten()
        .collect();
    fleet_rig::kill_when_gone(&pids);
    nats
}
