//! `fleet-token`, the real binary, against a local HTTPS token endpoint made here (a CA of fleet-rig): it signs a
//! JWT-profile assertion with a Zitadel-style machine key (RSA, PKCS#1 PEM, made with openssl), the endpoint checks
//! the grant, the scope and the assertion (signature with the public key openssl derives, `kid`, `iss`, `sub`,
//! `aud`, lifetime), and the new token replaces the token file (mode 0600, same owner); a second run rotates it.
//! A refused grant, an oversize answer, an unreachable or untrusted endpoint each exit 1 with the reason and leave
//! the old token in place. Neither the token nor the key ever reaches the output.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use fleet_rig::https::{HttpsServer, Reply, Request};
use fleet_rig::tls::TestCa;
use ring::signature::{UnparsedPublicKey, RSA_PKCS1_2048_8192_SHA256};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

/// fleet-token is a name of the multicall `fleet-tools`; here it is named by the first argument.
const BIN: &str = env!("CARGO_BIN_EXE_fleet-tools");
const KEY_ID: &str = "293857230985723";
const USER_ID: &str = "293857230985001";
const PROJECT: &str = "284651234567890123";

/// How the endpoint answers next.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Grant,
    Refuse,
    Oversize,
}

/// Form field `key` of a request body (percent-decoded by the rig's query parser).
fn form(req: &Request, key: &str) -> Option<String> {
    Request {
        method: String::new(),
        target: format!("/?{}", String::from_utf8_lossy(&req.body)),
        headers: vec![],
        body: vec![],
    }
    .query(key)
}

fn openssl(args: &[&str]) -> Vec<u8> {
    let out = Command::new("openssl").args(args).output().expect(
        "the openssl command is needed to make the test's RSA key (apt-get install openssl)",
    );
    assert!(out.status.success(), "openssl {args:?}: {out:?}");
    out.stdout
}

/// What the endpoint checked about the last grant request; `None` when it was acceptable.
fn check_grant(req: &Request, issuer: &str, public_der: &[u8]) -> Option<String> {
    if req.method != "POST" || req.path() != "/oauth/v2/token" {
        return Some(format!("{} {}", req.method, req.target));
    }
    if req.header("content-type") != Some("application/x-www-form-urlencoded") {
        return Some(format!("content-type {:?}", req.header("content-type")));
    }
    if form(req, "grant_type").as_deref() != Some("urn:ietf:params:oauth:grant-type:jwt-bearer") {
        return Some("grant_type".into());
    }
    let scope = format!("openid urn:zitadel:iam:org:project:id:{PROJECT}:aud");
    if form(req, "scope").as_deref() != Some(scope.as_str()) {
        return Some(format!("scope {:?}", form(req, "scope")));
    }
    let jwt = form(req, "assertion")?;
    let (input, sig) = jwt.rsplit_once('.')?;
    let sig = URL_SAFE_NO_PAD.decode(sig).ok()?;
    if UnparsedPublicKey::new(&RSA_PKCS1_2048_8192_SHA256, public_der)
        .verify(input.as_bytes(), &sig)
        .is_err()
    {
        return Some("bad assertion signature".into());
    }
    let part = |i: usize| -> serde_json::Value {
        let p = input.split('.').nth(i).unwrap_or_default();
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(p).unwrap_or_default()).unwrap_or_default()
    };
    let (h, c) = (part(0), part(1));
    let life = c["exp"].as_u64().unwrap_or(0) as i64 - c["iat"].as_u64().unwrap_or(0) as i64;
    let ok = h["alg"] == "RS256"
        && h["kid"] == KEY_ID
        && c["iss"] == USER_ID
        && c["sub"] == USER_ID
        && c["aud"] == issuer
        && (1..=3600).contains(&life);
    (!ok).then(|| format!("assertion header {h} claims {c}"))
}

struct Endpoint {
    server: HttpsServer,
    mode: Arc<Mutex<Mode>>,
    issued: Arc<Mutex<Vec<String>>>,
    complaints: Arc<Mutex<Vec<String>>>,
}

impl Endpoint {
    fn start(ca: &TestCa, public_der: Vec<u8>) -> Self {
        let mode = Arc::new(Mutex::new(Mode::Grant));
        let issued = Arc::new(Mutex::new(Vec::new()));
        let complaints = Arc::new(Mutex::new(Vec::new()));
        let issuer: Arc<Mutex<String>> = Arc::default();
        let (m, i, c, iss) = (
            mode.clone(),
            issued.clone(),
            complaints.clone(),
            issuer.clone(),
        );
        let server = HttpsServer::start(ca, move |req| {
            if let Some(why) = check_grant(req, &iss.lock().unwrap(), &public_der) {
                c.lock().unwrap().push(why);
                return Reply::status(400, &[]);
            }
            match *m.lock().unwrap() {
                Mode::Grant => {
                    let mut issued = i.lock().unwrap();
                    let token =
                        format!("eyJhbGciOiJSUzI1NiJ9.issued-{}.c2lnbmF0dXJl", issued.len());
                    issued.push(token.clone());
                    Reply::ok(
                        serde_json::json!({"access_token": token, "token_type": "Bearer",
                            "expires_in": 43199})
                        .to_string(),
                    )
                }
                Mode::Refuse => Reply::Body {
                    status: 400,
                    headers: vec![],
                    body: Arc::new(
                        br#"{"error":"invalid_grant","error_description":"key expired"}"#.to_vec(),
                    ),
                },
                Mode::Oversize => Reply::Unsized { bytes: 1 << 20 },
            }
        });
        *issuer.lock().unwrap() = server.url("");
        Self {
            server,
            mode,
            issued,
            complaints,
        }
    }
}

fn run(config: &Path) -> (bool, String) {
    let out = Command::new(BIN)
        .arg("fleet-token")
        .arg("--config")
        .arg(config)
        .env("RUST_LOG", "debug")
        .output()
        .expect("run fleet-token");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn write_config(dir: &Path, issuer: &str, ca: Option<&Path>, root: &Path) -> PathBuf {
    let p = dir.join("fleet-token.yaml");
    std::fs::write(
        &p,
        format!(
            "issuer: \"{issuer}\"\nproject_id: \"{PROJECT}\"\ntimeout_secs: 5\nroot: \"{}\"\n{}",
            root.display(),
            ca.map(|c| format!("ca_file: \"{}\"\n", c.display()))
                .unwrap_or_default()
        ),
    )
    .unwrap();
    p
}

#[test]
fn fleet_token_refreshes_the_device_token_with_the_jwt_profile_grant() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let etc = root.join("etc/harmony-fleet");
    std::fs::create_dir_all(&etc).unwrap();
    // The machine key as Zitadel hands it out (PKCS#1 PEM in its key JSON), root-only on the device.
    let pem_path = dir.path().join("key.pem");
    std::fs::write(&pem_path, openssl(&["genrsa", "-traditional", "2048"])).unwrap();
    let pem = std::fs::read_to_string(&pem_path).unwrap();
    assert!(pem.starts_with("-----BEGIN RSA PRIVATE KEY-----"));
    let public_der = openssl(&[
        "rsa",
        "-in",
        pem_path.to_str().unwrap(),
        "-RSAPublicKey_out",
        "-outform",
        "DER",
    ]);
    let key_file = etc.join("zitadel-key.json");
    std::fs::write(
        &key_file,
        serde_json::json!({"type": "serviceaccount", "keyId": KEY_ID, "key": pem,
            "expirationDate": "9999-12-31T23:59:59Z", "userId": USER_ID})
        .to_string(),
    )
    .unwrap();
    std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    // The token device setup installed first (owner and mode kept by every refresh).
    let token_file = etc.join("nats-token");
    std::fs::write(&token_file, "first-token\n").unwrap();
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let owner = std::fs::metadata(&token_file).unwrap().uid();

    let ca = TestCa::new();
    let endpoint = Endpoint::start(&ca, public_der);
    let issuer = endpoint.server.url("");
    let config = write_config(dir.path(), &issuer, Some(ca.ca_file()), &root);
    let secrets = |out: &str| {
        let key_body = pem.lines().nth(1).unwrap();
        let leaked = endpoint
            .issued
            .lock()
            .unwrap()
            .iter()
            .any(|t| out.contains(t.as_str()))
            || out.contains(key_body)
            || out.contains("issued-");
        assert!(!leaked, "a token or the key reached the output");
    };

    // A refresh: the endpoint accepted the grant, the new token is in place, 0600, same owner.
    let (ok, out) = run(&config);
    assert!(
        ok,
        "{out}\ncomplaints: {:?}",
        endpoint.complaints.lock().unwrap()
    );
    assert!(
        out.contains(&format!(
            "wrote a new NATS token for machine user {USER_ID}"
        )) && out.contains("valid for 43199 s"),
        "{out}"
    );
    secrets(&out);
    assert!(endpoint.complaints.lock().unwrap().is_empty());
    let read = || std::fs::read_to_string(&token_file).unwrap();
    assert_eq!(read(), format!("{}\n", endpoint.issued.lock().unwrap()[0]));
    let meta = std::fs::metadata(&token_file).unwrap();
    assert_eq!((meta.mode() & 0o777, meta.uid()), (0o600, owner));

    // The next run (the timer's) rotates it.
    let (ok, out) = run(&config);
    assert!(ok, "{out}");
    secrets(&out);
    assert_eq!(read(), format!("{}\n", endpoint.issued.lock().unwrap()[1]));
    let current = read();

    // Failures keep the token on disk and say why.
    *endpoint.mode.lock().unwrap() = Mode::Refuse;
    let (ok, out) = run(&config);
    assert!(
        !ok && out.contains("HTTP 400: invalid_grant: key expired")
            && out.contains("old one stays"),
        "{out}"
    );
    *endpoint.mode.lock().unwrap() = Mode::Oversize;
    let (ok, out) = run(&config);
    assert!(!ok && out.contains("answer not read"), "{out}");
    let unreachable = write_config(
        dir.path(),
        &format!("https://127.0.0.1:{}", fleet_rig::free_port()),
        Some(ca.ca_file()),
        &root,
    );
    let (ok, out) = run(&unreachable);
    assert!(!ok && out.contains("unreachable"), "{out}");
    let untrusted = write_config(dir.path(), &issuer, None, &root);
    let (ok, out) = run(&untrusted);
    assert!(!ok && out.contains("unreachable"), "{out}");
    assert_eq!(read(), current, "a failed refresh changed the token");
    assert_eq!(
        std::fs::read_dir(&etc).unwrap().count(),
        2,
        "a temporary file stayed beside the token"
    );
    assert!(endpoint.complaints.lock().unwrap().is_empty());
}
