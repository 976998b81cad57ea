//! A Docker-registry token server for tests: answers `GET /token?service=…&scope=…` anonymously with an ES256 JWT
//! that distribution 2.x verifies offline (`auth.token` with `rootcertbundle` = the [`TestCa`] root; the signing
//! certificate travels in the JWT's `x5c` header). It grants whatever repository scope is asked for.

use crate::https::{HttpsServer, Reply, Request};
use crate::tls::TestCa;
use ring::rand::SystemRandom;
use ring::signature::{EcdsaKeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// The `service` the registry and the tokens name.
pub const TOKEN_SERVICE: &str = "fleet-test-registry";
/// The `iss` of the tokens.
pub const TOKEN_ISSUER: &str = "fleet-test-token-issuer";

/// A running token server.
pub struct TokenServer {
    server: HttpsServer,
}

impl TokenServer {
    /// Starts a token server whose signing certificate is issued by `ca`.
    pub fn start(ca: &TestCa) -> Self {
        let signer = ca.server_cert("token-signer");
        let key = EcdsaKeyPair::from_pkcs8(
            &ECDSA_P256_SHA256_FIXED_SIGNING,
            signer.key.secret_der(),
            &SystemRandom::new(),
        )
        .unwrap_or_else(|e| panic!("token signing key: {e}"));
        let x5c = b64(signer.chain[0].as_ref(), STD);
        let key = Arc::new(key);
        let server = HttpsServer::start(ca, move |req: &Request| {
            if req.path() != "/token" || req.query("service").as_deref() != Some(TOKEN_SERVICE) {
                return Reply::status(400, &[]);
            }
            let access: Vec<serde_json::Value> = req
                .query("scope")
                .iter()
                .filter_map(|s| {
                    let mut p = s.splitn(3, ':');
                    let (kind, name, actions) = (p.next()?, p.next()?, p.next()?);
                    Some(serde_json::json!({"type": kind, "name": name,
                        "actions": actions.split(',').collect::<Vec<_>>()}))
                })
                .collect();
            match jwt(&key, &x5c, access) {
                Some(t) => Reply::ok(
                    serde_json::json!({"token": t, "access_token": t, "expires_in": 300})
                        .to_string()
                        .into_bytes(),
                ),
                None => Reply::status(500, &[]),
            }
        });
        Self { server }
    }

    /// `https://127.0.0.1:<port>/token`.
    pub fn realm(&self) -> String {
        self.server.url("/token")
    }

    /// Every token request so far.
    pub fn requests(&self) -> Vec<Request> {
        self.server.requests()
    }
}

fn jwt(key: &EcdsaKeyPair, x5c: &str, access: Vec<serde_json::Value>) -> Option<String> {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).ok()?.as_secs();
    let header = serde_json::json!({"typ": "JWT", "alg": "ES256", "x5c": [x5c]});
    let claims = serde_json::json!({
        "iss": TOKEN_ISSUER, "sub": "", "aud": TOKEN_SERVICE,
        "exp": now + 300, "nbf": now.saturating_sub(10), "iat": now,
        "jti": format!("{now}-{}", std::process::id()), "access": access,
    });
    let input = format!(
        "{}.{}",
        b64(header.to_string().as_bytes(), URL),
        b64(claims.to_string().as_bytes(), URL)
    );
    let sig = key.sign(&SystemRandom::new(), input.as_bytes()).ok()?;
    Some(format!("{input}.{}", b64(sig.as_ref(), URL)))
}

pub(crate) const STD: &[u8; 64] =
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
pub(crate) const URL: &[u8; 64] =
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// Base64 with `alphabet`: padded for the standard alphabet (x5c), unpadded for the URL one (JWS).
pub(crate) fn b64(data: &[u8], alphabet: &[u8; 64]) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let n = chunk.iter().fold(0u32, |acc, &b| acc << 8 | b as u32) << (8 * (3 - chunk.len()));
        for i in 0..=chunk.len() {
            out.push(alphabet[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
        if alphabet == STD {
            for _ in chunk.len()..3 {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64() {
        assert_eq!(super::b64(b"foob", super::STD), "Zm9vYg==");
        assert_eq!(super::b64(b"fooba", super::URL), "Zm9vYmE");
        assert_eq!(super::b64(&[0xfb, 0xff], super::URL), "-_8");
    }
}
