//! The JWT-profile assertion (RFC 7523) a Zitadel machine user signs with its key: the key file Zitadel hands
//! out (`keyId`, `key` as PEM, `userId`) and the RS256-signed JWT (`iss` = `sub` = the user, `aud` = the
//! issuer). Pure: no I/O, time passed in.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use ring::rand::SystemRandom;
use ring::signature::{RsaKeyPair, RSA_PKCS1_SHA256};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::PrivateKeyDer;
use serde::Deserialize;

/// How long an assertion is valid, in seconds (Zitadel accepts at most an hour).
pub const ASSERTION_LIFETIME_SECS: u64 = 300;
/// The longest key id or user id accepted, in characters.
const MAX_ID_CHARS: usize = 128;

/// Zitadel's key file for a machine user, as downloaded (unknown fields such as `type` and `expirationDate`
/// are ignored).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct KeyFile {
    key_id: String,
    key: String,
    user_id: String,
}

/// A machine user's signing key. Its `Debug` shows the ids only, never the key.
pub struct MachineKey {
    key_id: String,
    user_id: String,
    pair: RsaKeyPair,
}

impl std::fmt::Debug for MachineKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MachineKey")
            .field("key_id", &self.key_id)
            .field("user_id", &self.user_id)
            .finish_non_exhaustive()
    }
}

/// A key file that cannot be used, or an assertion that cannot be signed. The text never quotes the key.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// Not Zitadel's key JSON.
    #[error("not a Zitadel key file (keyId, key, userId): {0}")]
    NotKeyFile(serde_json::Error),
    /// `keyId` or `userId` is not an id.
    #[error("{0}: must be 1-{max} letters, digits, '-' or '_'", max = MAX_ID_CHARS)]
    BadId(&'static str),
    /// `key` is not PEM.
    #[error("key: not a PEM private key")]
    NotPem,
    /// `key` is PEM but not RSA.
    #[error("key: not an RSA key")]
    NotRsa,
    /// `key` is an RSA key `ring` refuses.
    #[error("key: not a usable RSA key ({0})")]
    Unusable(ring::error::KeyRejected),
    /// Signing failed.
    #[error("cannot sign the assertion")]
    Sign,
}

fn valid_id(what: &'static str, id: &str) -> Result<(), KeyError> {
    if id.is_empty()
        || id.len() > MAX_ID_CHARS
        || !id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(KeyError::BadId(what));
    }
    Ok(())
}

impl MachineKey {
    /// Parses Zitadel's key JSON: an RSA key (PKCS#1 or PKCS#8 PEM) with its key id and user id. Errors never
    /// quote the key.
    pub fn parse(json: &[u8]) -> Result<Self, KeyError> {
        let f: KeyFile = serde_json::from_slice(json).map_err(KeyError::NotKeyFile)?;
        valid_id("keyId", &f.key_id)?;
        valid_id("userId", &f.user_id)?;
        let der = PrivateKeyDer::from_pem_slice(f.key.as_bytes()).map_err(|_| KeyError::NotPem)?;
        let pair = match &der {
            PrivateKeyDer::Pkcs1(k) => RsaKeyPair::from_der(k.secret_pkcs1_der()),
            PrivateKeyDer::Pkcs8(k) => RsaKeyPair::from_pkcs8(k.secret_pkcs8_der()),
            _ => return Err(KeyError::NotRsa),
        }
        .map_err(KeyError::Unusable)?;
        Ok(Self {
            key_id: f.key_id,
            user_id: f.user_id,
            pair,
        })
    }

    /// The machine user's id.
    pub fn user_id(&self) -> &str {
        &self.user_id
    }

    /// The signed assertion for `audience` (the issuer URL), issued at `now` (Unix seconds).
    pub fn assertion(&self, audience: &str, now: u64) -> Result<String, KeyError> {
        let header = serde_json::json!({"alg": "RS256", "typ": "JWT", "kid": self.key_id});
        let claims = serde_json::json!({
            "iss": self.user_id, "sub": self.user_id, "aud": audience,
            "iat": now, "exp": now + ASSERTION_LIFETIME_SECS,
        });
        let input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let mut sig = vec![0u8; self.pair.public().modulus_len()];
        self.pair
            .sign(
                &RSA_PKCS1_SHA256,
                &SystemRandom::new(),
                input.as_bytes(),
                &mut sig,
            )
            .map_err(|_| KeyError::Sign)?;
        Ok(format!("{input}.{}", URL_SAFE_NO_PAD.encode(sig)))
    }

    /// The public key (DER `RSAPublicKey`), for tests that verify assertions.
    pub fn public_key_der(&self) -> Vec<u8> {
        self.pair.public().as_ref().to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring::signature::{UnparsedPublicKey, RSA_PKCS1_2048_8192_SHA256};

    /// A 2048-bit RSA key (PKCS#1 PEM, as Zitadel hands it out), made once with the openssl command.
    fn key_json(key_id: &str, user_id: &str) -> Vec<u8> {
        let out = std::process::Command::new("openssl")
            .args(["genrsa", "-traditional", "2048"])
            .output()
            .expect("the openssl command is needed to make the test's RSA key (apt-get install openssl)");
        assert!(out.status.success(), "openssl genrsa: {out:?}");
        let pem = String::from_utf8(out.stdout).expect("pem");
        assert!(pem.starts_with("-----BEGIN RSA PRIVATE KEY-----"), "{pem}");
        serde_json::to_vec(
            &serde_json::json!({"type": "serviceaccount", "keyId": key_id,
            "key": pem, "expirationDate": "9999-12-31T23:59:59Z", "userId": user_id}),
        )
        .expect("json")
    }

    fn part(jwt: &str, i: usize) -> serde_json::Value {
        let p = jwt.split('.').nth(i).expect("part");
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(p).expect("b64")).expect("json")
    }

    #[test]
    fn assertion_is_signed_by_the_key_with_the_profile_claims() {
        let key = MachineKey::parse(&key_json("k-1", "2845")).expect("key");
        let jwt = key
            .assertion("https://zitadel.example.com", 1_000)
            .expect("sign");
        let (input, sig) = jwt.rsplit_once('.').expect("jws");
        UnparsedPublicKey::new(&RSA_PKCS1_2048_8192_SHA256, key.public_key_der())
            .verify(input.as_bytes(), &URL_SAFE_NO_PAD.decode(sig).expect("b64"))
            .expect("signature verifies");
        assert_eq!(
            part(&jwt, 0),
            serde_json::json!({"alg": "RS256", "typ": "JWT", "kid": "k-1"})
        );
        assert_eq!(
            part(&jwt, 1),
            serde_json::json!({"iss": "2845", "sub": "2845",
                "aud": "https://zitadel.example.com", "iat": 1_000, "exp": 1_300})
        );
        assert!(!format!("{key:?}").contains("PRIVATE"));
    }

    #[test]
    fn bad_key_files_are_refused_without_quoting_the_key() {
        assert!(MachineKey::parse(b"{}").is_err());
        let good: serde_json::Value =
            serde_json::from_slice(&key_json("k-1", "u-1")).expect("json");
        let mut bad = good.clone();
        bad["keyId"] = serde_json::json!("k 1");
        assert!(MachineKey::parse(bad.to_string().as_bytes())
            .expect_err("id")
            .to_string()
            .contains("keyId"));
        let mut bad = good.clone();
        let pem = bad["key"].as_str().expect("pem").replace('M', "A");
        bad["key"] = serde_json::json!(pem);
        let e = MachineKey::parse(bad.to_string().as_bytes())
            .expect_err("key")
            .to_string();
        assert!(e.starts_with("key:") && !e.contains("AAA"), "{e}");
        let mut bad = good;
        bad["key"] = serde_json::json!("secret-but-not-pem");
        let e = MachineKey::parse(bad.to_string().as_bytes())
            .expect_err("pem")
            .to_string();
        assert!(!e.contains("secret-but-not-pem"), "{e}");
    }
}
