//! A Zitadel stand-in for tests, over HTTPS with a certificate of its own [`TestCa`]: its JWKS (one ES256 key), access
//! tokens minted for devices (`iss` = its URL, `aud` = [`AUDIENCE`], `device_id`), and a token endpoint that answers
//! the JWT-profile grant (RFC 7523) of machine users registered with it, as `fleet-token` asks it on a device.

use crate::callout::write_private;
use crate::https::{HttpsServer, Reply, Request};
use crate::tls::TestCa;
use crate::token::{b64, URL};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use ring::rand::SystemRandom;
use ring::signature::{
    EcdsaKeyPair, KeyPair, UnparsedPublicKey, ECDSA_P256_SHA256_FIXED_SIGNING,
    RSA_PKCS1_2048_8192_SHA256,
};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The tokens' audience (fleet-auth's `zitadel.audience`: the Zitadel project id).
pub const AUDIENCE: &str = "harmony-fleet-test";
/// How long a token is valid: longer than any scenario or a demo left running for a day.
pub const TOKEN_TTL: Duration = Duration::from_secs(24 * 3600);
/// The key id of the issuer's signing key.
const KID: &str = "fleet-test-1";

/// A running stand-in; stopped on drop.
pub struct Zitadel {
    server: HttpsServer,
    ca: TestCa,
    issuer: Arc<Issuer>,
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

impl Zitadel {
    /// Starts the stand-in on a free loopback port with a new signing key and CA.
    pub fn start() -> Self {
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
        let server = {
            let issuer = issuer.clone();
            HttpsServer::start(&ca, move |req| issuer.serve(req))
        };
        let _ = issuer.url.set(server.url(""));
        let dir = tempfile::Builder::new()
            .prefix("fleet-zitadel-")
            .tempdir()
            .unwrap_or_else(|e| panic!("temp dir for the Zitadel stand-in: {e}"));
        Self {
            server,
            ca,
            issuer,
            dir,
        }
    }

    /// `https://127.0.0.1:<port>`: the tokens' `iss`, the assertions' `aud`, `fleet-token`'s `issuer`.
    pub fn url(&self) -> &str {
        self.issuer.url()
    }

    /// The port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.server.port()
    }

    /// The CA certificate file its certificate is issued by.
    pub fn ca_file(&self) -> &Path {
        self.ca.ca_file()
    }

    /// The CA certificate as PEM.
    pub fn ca_pem(&self) -> Vec<u8> {
        std::fs::read(self.ca.ca_file())
            .unwrap_or_else(|e| panic!("read the Zitadel stand-in's CA: {e}"))
    }

    /// A token for `device`, valid for `ttl`.
    pub fn mint(&self, device: &str, ttl: Duration) -> String {
        self.issuer.mint(device, ttl)
    }

    /// How many tokens the token endpoint issued to `device`'s machine users.
    pub fn grants_issued(&self, device: &str) -> usize {
        self.issuer
            .machines
            .lock()
            .map(|m| {
                m.values()
                    .filter(|x| x.device == device)
                    .map(|x| x.grants)
                    .sum()
            })
            .unwrap_or(0)
    }

    /// Registers a new machine user for `device` (an RSA key made with the openssl command) and returns its key file.
    pub fn register_machine(&self, device: &str) -> MachineKeyFile {
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
