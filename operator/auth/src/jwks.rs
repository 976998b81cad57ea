//! The issuer's JWKS: fetched over HTTPS (bounded time and size, no redirects), parsed into RS256 and ES256 keys
//! by `kid`, cached, refetched when a token names an unknown `kid` (at most once per `min_refresh`) or when the
//! cache is older than `max_age`. Every failure fails closed.

use super::token::{Denied, SigningKey};
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};
use std::collections::HashMap;
use std::io::Read;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{Mutex, RwLock};
use ureq::tls::{Certificate, RootCerts, TlsConfig, TlsProvider};

/// Most keys taken from one JWKS.
pub const MAX_KEYS: usize = 64;

/// Where and how the JWKS is fetched.
#[derive(Debug, Clone)]
pub struct JwksSettings {
    /// `https://…/oauth/v2/keys`.
    pub url: String,
    /// Extra trusted roots (DER), besides the system's.
    pub extra_roots: Vec<Vec<u8>>,
    /// Whole-fetch time limit.
    pub timeout: Duration,
    /// Largest JWKS body, in bytes.
    pub max_bytes: u64,
    /// Least time between two refetches caused by unknown `kid`s.
    pub min_refresh: Duration,
    /// A cache older than this is refetched before use.
    pub max_age: Duration,
}

struct Cached {
    keys: HashMap<String, SigningKey>,
    fetched: Option<Instant>,
}

/// The cache. Cheap to share (`Arc`).
pub struct Jwks {
    settings: JwksSettings,
    agent: ureq::Agent,
    cached: RwLock<Cached>,
    refresh: Mutex<()>,
}

impl Jwks {
    /// A cache that has fetched nothing yet.
    pub fn new(settings: JwksSettings) -> Result<Arc<Self>, String> {
        if !settings.url.starts_with("https://") {
            return Err(format!("JWKS URL must be https://, got {:?}", settings.url));
        }
        let native = rustls_native_certs::load_native_certs();
        let roots: Vec<Certificate<'static>> = native
            .certs
            .iter()
            .map(|c| Certificate::from_der(c.as_ref()).to_owned())
            .chain(
                settings
                    .extra_roots
                    .iter()
                    .map(|d| Certificate::from_der(d).to_owned()),
            )
            .collect();
        if roots.is_empty() {
            return Err("no trusted root certificates for the JWKS fetch".into());
        }
        let tls = TlsConfig::builder()
            .provider(TlsProvider::Rustls)
            .root_certs(RootCerts::Specific(Arc::new(roots)))
            .build();
        let config = ureq::Agent::config_builder()
            .https_only(true)
            .max_redirects(0)
            .http_status_as_error(false)
            .timeout_global(Some(settings.timeout))
            .user_agent(concat!("fleet-auth/", env!("CARGO_PKG_VERSION")))
            .tls_config(tls)
            .build();
        Ok(Arc::new(Self {
            agent: ureq::Agent::new_with_config(config),
            settings,
            cached: RwLock::new(Cached {
                keys: HashMap::new(),
                fetched: None,
            }),
            refresh: Mutex::new(()),
        }))
    }

    /// The key `kid`, refetching the JWKS when it is unknown or the cache is stale.
    pub async fn key(&self, kid: &str) -> Result<SigningKey, Denied> {
        {
            let c = self.cached.read().await;
            let fresh = c
                .fetched
                .is_some_and(|t| t.elapsed() < self.settings.max_age);
            if let (true, Some(k)) = (fresh, c.keys.get(kid)) {
                return Ok(k.clone());
            }
        }
        // One refetch at a time; whoever waited re-checks what the previous one brought.
        let _guard = self.refresh.lock().await;
        {
            let c = self.cached.read().await;
            let fetched = c.fetched;
            let fresh = fetched.is_some_and(|t| t.elapsed() < self.settings.max_age);
            if fresh {
                if let Some(k) = c.keys.get(kid) {
                    return Ok(k.clone());
                }
                if fetched.is_some_and(|t| t.elapsed() < self.settings.min_refresh) {
                    return Err(Denied::UnknownKid(kid.to_owned()));
                }
            }
        }
        let keys = self.fetch().await.map_err(Denied::Jwks)?;
        let found = keys.get(kid).cloned();
        log::info!(
            "JWKS {} fetched: {} usable keys",
            self.settings.url,
            keys.len()
        );
        *self.cached.write().await = Cached {
            keys,
            fetched: Some(Instant::now()),
        };
        found.ok_or_else(|| Denied::UnknownKid(kid.to_owned()))
    }

    /// Fetches now (start-up warm-up); the error says why it failed.
    pub async fn prefetch(&self) -> Result<usize, String> {
        let _guard = self.refresh.lock().await;
        let keys = self.fetch().await?;
        let n = keys.len();
        *self.cached.write().await = Cached {
            keys,
            fetched: Some(Instant::now()),
        };
        Ok(n)
    }

    async fn fetch(&self) -> Result<HashMap<String, SigningKey>, String> {
        let agent = self.agent.clone();
        let url = self.settings.url.clone();
        let max = self.settings.max_bytes;
        let body = tokio::task::spawn_blocking(move || -> Result<Vec<u8>, String> {
            let mut resp = agent
                .get(&url)
                .header("Accept", "application/json")
                .call()
                .map_err(|e| format!("GET {url}: {e}"))?;
            if resp.status() != 200 {
                return Err(format!("GET {url}: HTTP {}", resp.status()));
            }
            let mut buf = Vec::new();
            resp.body_mut()
                .as_reader()
                .take(max + 1)
                .read_to_end(&mut buf)
                .map_err(|e| format!("GET {url}: {e}"))?;
            if buf.len() as u64 > max {
                return Err(format!("JWKS at {url} is larger than {max} bytes"));
            }
            Ok(buf)
        })
        .await
        .map_err(|e| format!("JWKS fetch task: {e}"))??;
        parse(&body)
    }
}

/// Parses a JWKS document: RSA keys (RS256, 2048 bits or more) and EC P-256 keys (ES256) with a `kid`; other
/// keys are skipped. A document with no usable key is an error.
pub fn parse(body: &[u8]) -> Result<HashMap<String, SigningKey>, String> {
    #[derive(serde::Deserialize)]
    struct Set {
        keys: Vec<serde_json::Value>,
    }
    let set: Set = serde_json::from_slice(body).map_err(|e| format!("JWKS is not JSON: {e}"))?;
    if set.keys.len() > MAX_KEYS {
        return Err(format!("JWKS has more than {MAX_KEYS} keys"));
    }
    let mut out = HashMap::new();
    for v in set.keys {
        let Ok(jwk) = serde_json::from_value::<Jwk>(v) else {
            continue;
        };
        let Some(kid) = jwk.common.key_id.clone().filter(|k| !k.is_empty()) else {
            continue;
        };
        if matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption)) {
            continue;
        }
        let alg = match &jwk.algorithm {
            AlgorithmParameters::RSA(p) => {
                // Modulus length in bits from its base64url size: refuse keys under 2048 bits.
                if p.n.len() * 6 < 2040 {
                    continue;
                }
                Algorithm::RS256
            }
            AlgorithmParameters::EllipticCurve(p) if p.curve == EllipticCurve::P256 => {
                Algorithm::ES256
            }
            _ => continue,
        };
        let Ok(key) = DecodingKey::from_jwk(&jwk) else {
            continue;
        };
        out.insert(kid, SigningKey { key, alg });
    }
    if out.is_empty() {
        return Err("JWKS holds no usable RS256 or ES256 key".into());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_keeps_rsa_and_p256_only() {
        let n = "A".repeat(342); // 2048 bits of base64url
        let doc = serde_json::json!({"keys": [
            {"kty": "RSA", "kid": "r1", "use": "sig", "alg": "RS256", "n": n, "e": "AQAB"},
            {"kty": "RSA", "kid": "small", "n": "xxxx", "e": "AQAB"},
            {"kty": "RSA", "kid": "enc", "use": "enc", "n": n, "e": "AQAB"},
            {"kty": "EC", "kid": "e1", "crv": "P-256", "x": "AAAA", "y": "AAAA"},
            {"kty": "EC", "kid": "e384", "crv": "P-384", "x": "AAAA", "y": "AAAA"},
            {"kty": "oct", "kid": "h", "k": "c2VjcmV0"},
            {"kty": "RSA", "n": n, "e": "AQAB"},
            {"weird": true}
        ]});
        let keys = parse(doc.to_string().as_bytes()).expect("parse");
        let mut kids: Vec<_> = keys.keys().cloned().collect();
        kids.sort();
        assert_eq!(kids, vec!["e1", "r1"]);
        assert_eq!(keys["r1"].alg, Algorithm::RS256);
        assert_eq!(keys["e1"].alg, Algorithm::ES256);
        assert!(parse(b"{\"keys\": []}").is_err());
        assert!(parse(b"not json").is_err());
        let many: Vec<_> = (0..MAX_KEYS + 1)
            .map(|i| serde_json::json!({"kty": "EC", "kid": i.to_string(), "crv": "P-256", "x": "A", "y": "A"}))
            .collect();
        assert!(parse(serde_json::json!({ "keys": many }).to_string().as_bytes()).is_err());
    }
}
