//! The NATS side of a whole fleet, as whole-device scenarios and the demo run it: by default with the fleet-auth
//! auth callout on (docs/auth.md) — nats-server with [`crate::nats::callout_config`], the real `fleet-auth`, and a
//! Zitadel stand-in over HTTPS (a certificate of its own [`TestCa`]): its JWKS, tokens minted for devices, and a
//! token endpoint answering the JWT-profile grant of registered machine users (what `fleet-token` asks) — and the
//! services' own user (`admin`, an `auth_users` entry in the buckets' account). `FLEET_NATS_AUTH=off` starts the
//! plain server (no credentials) instead: one switch, so that every scenario takes the same path.

use crate::https::{HttpsServer, Reply, Request};
use crate::nats::{callout_config, nats_client};
use crate::tls::TestCa;
use crate::token::{b64, URL};
use crate::{wait_for, NatsServer};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use ring::rand::{SecureRandom, SystemRandom};
use ring::signature::{
    EcdsaKeyPair, KeyPair, UnparsedPublicKey, ECDSA_P256_SHA256_FIXED_SIGNING,
    RSA_PKCS1_2048_8192_SHA256,
};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The switch: `FLEET_NATS_AUTH` = `callout` (the default) or `off`.
pub const SWITCH: &str = "FLEET_NATS_AUTH";
/// The tokens' audience (fleet-auth's `zitadel.audience`: the Zitadel project id).
pub const AUDIENCE: &str = "harmony-fleet-test";
/// The services' own NATS user (listed in `auth_callout.auth_users`, account FLEET).
pub const ADMIN_USER: &str = "admin";
/// How long a minted device token is valid: longer than any scenario or a demo left running for a day.
pub const TOKEN_TTL: Duration = Duration::from_secs(24 * 3600);
/// The key id of the issuer's signing key.
const KID: &str = "fleet-test-1";

/// How devices and services authenticate to the fleet's NATS server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NatsAuth {
    /// The auth callout: devices with tokens checked by fleet-auth, services as [`ADMIN_USER`].
    Callout,
    /// A plain server: nobody authenticates.
    Off,
}

impl NatsAuth {
    /// The mode `FLEET_NATS_AUTH` selects (default [`NatsAuth::Callout`]); any other value fails the test.
    pub fn from_env() -> Self {
        match std::env::var(SWITCH).as_deref() {
            Err(_) | Ok("") | Ok("callout") => Self::Callout,
            Ok("off") => Self::Off,
            Ok(other) => panic!("{SWITCH}={other:?}: use `callout` (the default) or `off`"),
        }
    }
}

/// A device's NATS token. Its `Debug` hides the value, so that it never reaches test output by accident.
#[derive(Clone)]
pub struct DeviceToken(String);

impl DeviceToken {
    /// The token's bytes (for the device's token file).
    pub fn as_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }

    /// The token itself (for a test asserting that it is absent from logs).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for DeviceToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DeviceToken(<redacted>)")
    }
}

/// The fleet's NATS server with its authentication (see the module's doc). Stopped on drop: fleet-auth and the
/// issuer first, then the server.
pub struct FleetNats {
    callout: Option<Callout>,
    server: NatsServer,
}

struct Callout {
    auth: Option<Child>,
    auth_log: PathBuf,
    nats_log: PathBuf,
    zitadel: HttpsServer,
    ca: TestCa,
    issuer: Arc<Issuer>,
    admin_password: String,
    dir: tempfile::TempDir,
}

/// The Zitadel stand-in's state, shared with its HTTPS handler.
struct Issuer {
    /// Its URL (`https://127.0.0.1:<port>`): the tokens' `iss` and the assertions' `aud`.
    url: OnceLock<String>,
    key: EcdsaKeyPair,
    jwks: Vec<u8>,
    /// Machine users by user id.
    machines: Mutex<BTreeMap<String, Machine>>,
}

/// A registered machine user: the device it stands for, its key id and public key (DER `RSAPublicKey`), and how
/// many tokens the endpoint issued to it.
struct Machine {
    device: String,
    key_id: String,
    public_der: Vec<u8>,
    grants: usize,
}

/// A machine user's key file as Zitadel hands it out (`keyId`, `key` as PKCS#1 PEM, `userId`): a secret, its
/// `Debug` hides it.
pub struct MachineKeyFile(Vec<u8>);

impl MachineKeyFile {
    /// The file's bytes (for the device's `/etc/harmony-fleet/zitadel-key.json`).
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for MachineKeyFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MachineKeyFile(<redacted>)")
    }
}

impl FleetNats {
    /// Starts the server in the mode the switch selects; `fleet_auth` gives the fleet-auth binary (called only
    /// when the callout is on).
    pub fn start(fleet_auth: impl FnOnce() -> PathBuf) -> Self {
        Self::start_with(NatsAuth::from_env(), fleet_auth)
    }

    /// Starts the server in `mode`.
    pub fn start_with(mode: NatsAuth, fleet_auth: impl FnOnce() -> PathBuf) -> Self {
        match mode {
            NatsAuth::Off => Self {
                callout: None,
                server: NatsServer::start(),
            },
            NatsAuth::Callout => {
                let (server, callout) = Callout::start(&fleet_auth());
                Self {
                    callout: Some(callout),
                    server,
                }
            }
        }
    }

    /// The mode it runs in.
    pub fn mode(&self) -> NatsAuth {
        if self.callout.is_some() {
            NatsAuth::Callout
        } else {
            NatsAuth::Off
        }
    }

    /// `nats://127.0.0.1:<port>` (no credentials).
    pub fn url(&self) -> String {
        self.server.url()
    }

    /// The port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.server.port()
    }

    /// The server's PID.
    pub fn pid(&self) -> Option<u32> {
        self.server.pid()
    }

    /// fleet-auth's PID (none without the callout).
    pub fn auth_pid(&self) -> Option<u32> {
        self.callout
            .as_ref()
            .and_then(|c| c.auth.as_ref().map(Child::id))
    }

    /// The server itself.
    pub fn server(&self) -> &NatsServer {
        &self.server
    }

    /// The URL a service (fleet-operator, `fleet-operator buckets`) connects with: its own user's credentials
    /// in it with the callout on. A secret: pass it by environment (`FLEET_NATS_URL`), never print it.
    pub fn service_url(&self) -> String {
        match &self.callout {
            Some(c) => format!(
                "nats://{ADMIN_USER}:{}@127.0.0.1:{}",
                c.admin_password,
                self.port()
            ),
            None => self.url(),
        }
    }

    /// The services' password (none without the callout); for tests asserting that it is absent from logs.
    pub fn service_password(&self) -> Option<&str> {
        self.callout.as_ref().map(|c| c.admin_password.as_str())
    }

    /// A blocking connection as the services' own user (the test playing the operator); fails the test if it
    /// cannot connect.
    pub fn connect(&self) -> nats_client::Connection {
        match &self.callout {
            Some(c) => nats_client::connect_user(&self.url(), ADMIN_USER, &c.admin_password),
            None => self.server.connect(),
        }
    }

    /// A token for `device` (its `device_id` claim), valid for [`TOKEN_TTL`]; none without the callout.
    pub fn device_token(&self, device: &str) -> Option<DeviceToken> {
        let c = self.callout.as_ref()?;
        Some(DeviceToken(c.issuer.mint(device, TOKEN_TTL)))
    }

    /// Registers a new machine user for `device` with the Zitadel stand-in and returns its key file (an RSA key
    /// made with the openssl command); the token endpoint then answers its JWT-profile grants with tokens for
    /// `device`. None without the callout.
    pub fn machine_key(&self, device: &str) -> Option<MachineKeyFile> {
        let c = self.callout.as_ref()?;
        Some(c.register_machine(device))
    }

    /// How many tokens the token endpoint issued to `device`'s machine users.
    pub fn grants_issued(&self, device: &str) -> usize {
        self.callout.as_ref().map_or(0, |c| {
            c.issuer
                .machines
                .lock()
                .map(|m| {
                    m.values()
                        .filter(|x| x.device == device)
                        .map(|x| x.grants)
                        .sum()
                })
                .unwrap_or(0)
        })
    }

    /// The Zitadel stand-in's URL (`https://127.0.0.1:<port>`, `fleet-token`'s `issuer`) and port; none without
    /// the callout.
    pub fn zitadel(&self) -> Option<(String, u16)> {
        let c = self.callout.as_ref()?;
        Some((c.issuer.url().to_string(), c.zitadel.port()))
    }

    /// The CA certificate (PEM) the Zitadel stand-in's certificate is issued by; none without the callout.
    pub fn zitadel_ca_pem(&self) -> Option<Vec<u8>> {
        let c = self.callout.as_ref()?;
        Some(
            std::fs::read(c.ca.ca_file())
                .unwrap_or_else(|e| panic!("read the Zitadel stand-in's CA: {e}")),
        )
    }

    /// fleet-auth's and nats-server's logs (empty without the callout), for failure messages: admissions and
    /// refusals with their reasons, never a token.
    pub fn auth_logs(&self) -> String {
        match &self.callout {
            Some(c) => format!(
                "--- fleet-auth ---\n{}\n--- nats-server ---\n{}",
                std::fs::read_to_string(&c.auth_log).unwrap_or_default(),
                std::fs::read_to_string(&c.nats_log).unwrap_or_default()
            ),
            None => String::new(),
        }
    }

    /// True when fleet-auth admitted a connection as `device` (always false without the callout).
    pub fn admitted(&self, device: &str) -> bool {
        self.callout.as_ref().is_some_and(|c| {
            std::fs::read_to_string(&c.auth_log)
                .unwrap_or_default()
                .contains(&format!(" as device {device}"))
        })
    }
}

impl Callout {
    fn start(fleet_auth: &Path) -> (NatsServer, Self) {
        let dir = tempfile::Builder::new()
            .prefix("fleet-callout-")
            .tempdir()
            .unwrap_or_else(|e| panic!("temp dir for the auth callout: {e}"));
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
            .unwrap_or_else(|e| panic!("issuer key: {e}"));
        let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .unwrap_or_else(|e| panic!("issuer key: {e}"));
        let p = key.public_key().as_ref();
        let jwks =
            serde_json::json!({"keys": [{"kty": "EC", "crv": "P-256", "use": "sig", "alg": "ES256",
            "kid": KID, "x": b64(&p[1..33], URL), "y": b64(&p[33..], URL)}]})
            .to_string()
            .into_bytes();
        let issuer = Arc::new(Issuer {
            url: OnceLock::new(),
            key,
            jwks,
            machines: Mutex::default(),
        });
        let ca = TestCa::new();
        let zitadel = {
            let issuer = issuer.clone();
            HttpsServer::start(&ca, move |req| issuer.serve(req))
        };
        let _ = issuer.url.set(zitadel.url(""));

        let account = nkeys::KeyPair::new_account();
        let seed = account
            .seed()
            .unwrap_or_else(|e| panic!("account seed: {e}"));
        let (auth_password, admin_password) = (password(&rng), password(&rng));
        let nats_log = dir.path().join("nats.log");
        let conf = write_private(
            dir.path(),
            "nats.conf",
            &callout_config(
                &nats_log,
                &account.public_key(),
                &auth_password,
                &admin_password,
                None,
            ),
        );
        let server = NatsServer::start_with_args(&["-c", &conf.display().to_string()]);
        let password_file = write_private(dir.path(), "auth-password", &auth_password);
        let seed_file = write_private(dir.path(), "issuer.nk", &seed);
        let config = write_private(
            dir.path(),
            "fleet-auth.yaml",
            &format!(
                "nats:\n  url: \"{url}\"\n  user: fleet-auth\n  password_file: \"{pw}\"\n\
                 issuer_seed_file: \"{seed}\"\naccount: DEVICES\nzitadel:\n  issuer: \"{iss}\"\n  \
                 audience: \"{AUDIENCE}\"\n  jwks_url: \"{iss}/oauth/v2/keys\"\n  jwks_ca_file: \"{ca}\"\n",
                url = server.url(),
                pw = password_file.display(),
                seed = seed_file.display(),
                iss = issuer.url(),
                ca = ca.ca_file().display(),
            ),
        );
        let auth_log = dir.path().join("fleet-auth.log");
        let log =
            std::fs::File::create(&auth_log).unwrap_or_else(|e| panic!("fleet-auth log: {e}"));
        let mut child = Command::new(fleet_auth)
            .arg("--config")
            .arg(&config)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", fleet_auth.display()));
        crate::kill_when_gone(&[child.id()]);
        let up = wait_for(Duration::from_secs(30), || {
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "fleet-auth exited at start-up with {status}:\n{}",
                    std::fs::read_to_string(&auth_log).unwrap_or_default()
                );
            }
            std::fs::read_to_string(&auth_log)
                .ok()?
                .contains("fleet-auth serving")
                .then_some(())
        });
        if up.is_none() {
            let _ = child.kill();
            panic!(
                "fleet-auth did not serve within 30 s:\n{}",
                std::fs::read_to_string(&auth_log).unwrap_or_default()
            );
        }
        let callout = Self {
            auth: Some(child),
            auth_log,
            nats_log,
            zitadel,
            ca,
            issuer,
            admin_password,
            dir,
        };
        (server, callout)
    }

    /// A new machine user for `device`: an RSA key made with openssl, registered with the issuer; its key file.
    fn register_machine(&self, device: &str) -> MachineKeyFile {
        let n = self.issuer.machines.lock().map(|m| m.len()).unwrap_or(0);
        let pem_path = self.dir.path().join(format!("machine-{n}.pem"));
        let pem = openssl(&["genrsa", "-traditional", "2048"]);
        write_private(
            self.dir.path(),
            &format!("machine-{n}.pem"),
            &String::from_utf8_lossy(&pem),
        );
        let public_der = openssl(&[
            "rsa",
            "-in",
            &pem_path.display().to_string(),
            "-RSAPublicKey_out",
            "-outform",
            "DER",
        ]);
        let _ = std::fs::remove_file(&pem_path);
        let (user_id, key_id) = (
            format!("{}", 300_000_000_000 + n),
            format!("{}", 400_000_000_000 + n),
        );
        let file = serde_json::json!({"type": "serviceaccount", "keyId": key_id,
            "key": String::from_utf8_lossy(&pem), "expirationDate": "9999-12-31T23:59:59Z", "userId": user_id});
        if let Ok(mut m) = self.issuer.machines.lock() {
            m.insert(
                user_id,
                Machine {
                    device: device.to_string(),
                    key_id,
                    public_der,
                    grants: 0,
                },
            );
        }
        MachineKeyFile(file.to_string().into_bytes())
    }
}

impl Issuer {
    fn url(&self) -> &str {
        self.url.get().map(String::as_str).unwrap_or_default()
    }

    /// The stand-in's two endpoints: the JWKS and the token endpoint (JWT-profile grant).
    fn serve(&self, req: &Request) -> Reply {
        match (req.method.as_str(), req.path()) {
            ("GET", "/oauth/v2/keys") => Reply::ok(self.jwks.clone()),
            ("POST", "/oauth/v2/token") => match self.grant(req) {
                Ok(token) => Reply::ok(
                    serde_json::json!({"access_token": token, "token_type": "Bearer",
                        "expires_in": TOKEN_TTL.as_secs()})
                    .to_string(),
                ),
                Err(why) => Reply::Body {
                    status: 400,
                    headers: vec![("Content-Type".into(), "application/json".into())],
                    body: Arc::new(
                        serde_json::json!({"error": "invalid_grant", "error_description": why})
                            .to_string()
                            .into_bytes(),
                    ),
                },
            },
            _ => Reply::status(404, &[]),
        }
    }

    /// Checks a JWT-profile grant (RFC 7523) as Zitadel does: the grant type, the project audience scope, and an
    /// assertion signed by a registered machine key naming its user as `iss` and `sub`, this issuer as `aud`,
    /// valid now for at most an hour. Mints the device's token.
    fn grant(&self, req: &Request) -> Result<String, String> {
        let form = |key: &str| {
            Request {
                method: String::new(),
                target: format!("/?{}", String::from_utf8_lossy(&req.body)),
                headers: vec![],
                body: vec![],
            }
            .query(key)
        };
        if form("grant_type").as_deref() != Some("urn:ietf:params:oauth:grant-type:jwt-bearer") {
            return Err("unsupported grant_type".into());
        }
        let scope = form("scope").unwrap_or_default();
        let aud_scope = format!("urn:zitadel:iam:org:project:id:{AUDIENCE}:aud");
        if !scope.split(' ').any(|s| s == aud_scope) {
            return Err(format!("scope lacks {aud_scope}"));
        }
        let jwt = form("assertion").ok_or("no assertion")?;
        let (input, sig) = jwt.rsplit_once('.').ok_or("assertion is not a JWS")?;
        let (h, c) = input.split_once('.').ok_or("assertion is not a JWS")?;
        let json = |part: &str| -> Result<serde_json::Value, String> {
            let bytes = URL_SAFE_NO_PAD
                .decode(part)
                .map_err(|_| "assertion is not base64url")?;
            serde_json::from_slice(&bytes).map_err(|_| "assertion is not JSON".to_string())
        };
        let (header, claims) = (json(h)?, json(c)?);
        let user = claims["iss"].as_str().ok_or("assertion has no iss")?;
        let mut machines = self.machines.lock().map_err(|_| "poisoned")?;
        let machine = machines
            .get_mut(user)
            .ok_or_else(|| format!("unknown machine user {user}"))?;
        if header["alg"] != "RS256" || header["kid"] != machine.key_id.as_str() {
            return Err("assertion header: alg or kid".into());
        }
        let sig = URL_SAFE_NO_PAD
            .decode(sig)
            .map_err(|_| "signature is not base64url")?;
        UnparsedPublicKey::new(&RSA_PKCS1_2048_8192_SHA256, &machine.public_der)
            .verify(input.as_bytes(), &sig)
            .map_err(|_| "bad assertion signature")?;
        let now = unix_now();
        let (iat, exp) = (
            claims["iat"].as_u64().unwrap_or(0),
            claims["exp"].as_u64().unwrap_or(0),
        );
        if claims["sub"] != user
            || claims["aud"] != self.url()
            || exp <= now
            || iat > now + 60
            || exp.saturating_sub(iat) > 3600
        {
            return Err("assertion claims: sub, aud, iat or exp".into());
        }
        machine.grants += 1;
        Ok(self.mint(&machine.device, TOKEN_TTL))
    }

    /// A Zitadel-shaped access token (ES256, `kid`, `iss`, `aud`, `exp`, `nbf`, `device_id`) signed by the issuer.
    fn mint(&self, device: &str, ttl: Duration) -> String {
        let now = unix_now();
        let header = serde_json::json!({"typ": "JWT", "alg": "ES256", "kid": KID});
        let claims = serde_json::json!({
            "iss": self.url(), "aud": [AUDIENCE], "sub": format!("machine-{device}"),
            "iat": now, "nbf": now.saturating_sub(10), "exp": now + ttl.as_secs(),
            "device_id": device,
        });
        let input = format!(
            "{}.{}",
            b64(header.to_string().as_bytes(), URL),
            b64(claims.to_string().as_bytes(), URL)
        );
        let sig = self
            .key
            .sign(&SystemRandom::new(), input.as_bytes())
            .unwrap_or_else(|e| panic!("sign a device token: {e}"));
        format!("{input}.{}", b64(sig.as_ref(), URL))
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn openssl(args: &[&str]) -> Vec<u8> {
    let out = Command::new("openssl")
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!("the openssl command makes the test machine users' RSA keys (apt-get install openssl): {e}")
        });
    assert!(
        out.status.success(),
        "openssl {}: {}",
        args.first().unwrap_or(&""),
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

impl Drop for Callout {
    fn drop(&mut self) {
        if let Some(mut c) = self.auth.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn password(rng: &SystemRandom) -> String {
    let mut b = [0u8; 18];
    rng.fill(&mut b)
        .unwrap_or_else(|e| panic!("random password: {e}"));
    b64(&b, URL)
}

/// Writes `text` to `dir/name` with mode 0600; its path.
fn write_private(dir: &Path, name: &str, text: &str) -> PathBuf {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join(name);
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(&path)
        .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    f.write_all(text.as_bytes())
        .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    path
}
