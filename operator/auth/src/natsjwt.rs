//! NATS JWTs (the nats-io/jwt v2 format: `ed25519-nkey` signatures by nkeys): verifying the server's
//! authorization request and encoding the user and authorization-response claims the callout answers with.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use nkeys::KeyPair;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha512_256};

/// The header every NATS JWT carries.
const HEADER: &str = r#"{"typ":"JWT","alg":"ed25519-nkey"}"#;
/// Audience of the server's authorization requests.
pub const REQUEST_AUDIENCE: &str = "nats-authorization-request";
/// Largest request JWT decoded, in bytes (a request carries the client's token and TLS chain).
pub const MAX_REQUEST_JWT_BYTES: usize = 64 * 1024;

/// Why a NATS JWT was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("NATS JWT: {0}")]
pub struct JwtError(pub String);

fn err(m: impl Into<String>) -> JwtError {
    JwtError(m.into())
}

#[derive(Deserialize)]
struct Header {
    typ: String,
    alg: String,
}

/// Decodes `token`, verifying its signature with the key named by its `iss` and that `iss` is a key of the
/// expected kind (`N…` for a server, `A…` for an account). Returns the issuer and the claims.
pub fn decode_verified<T: DeserializeOwned>(
    token: &str,
    issuer_prefix: char,
) -> Result<(String, T), JwtError> {
    if token.len() > MAX_REQUEST_JWT_BYTES {
        return Err(err(format!("larger than {MAX_REQUEST_JWT_BYTES} bytes")));
    }
    let mut parts = token.trim().splitn(3, '.');
    let (Some(h), Some(p), Some(s)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(err("not three dot-separated parts"));
    };
    let header: Header = serde_json::from_slice(
        &URL_SAFE_NO_PAD
            .decode(h)
            .map_err(|e| err(format!("header: {e}")))?,
    )
    .map_err(|e| err(format!("header: {e}")))?;
    if !header.typ.eq_ignore_ascii_case("jwt") || header.alg != "ed25519-nkey" {
        return Err(err(format!(
            "unsupported header typ={} alg={}",
            header.typ, header.alg
        )));
    }
    let payload = URL_SAFE_NO_PAD
        .decode(p)
        .map_err(|e| err(format!("payload: {e}")))?;
    let claims: Value =
        serde_json::from_slice(&payload).map_err(|e| err(format!("payload: {e}")))?;
    let iss = claims
        .get("iss")
        .and_then(Value::as_str)
        .ok_or_else(|| err("no iss"))?
        .to_owned();
    if !iss.starts_with(issuer_prefix) {
        return Err(err(format!(
            "issuer {iss} is not a {issuer_prefix}… public key"
        )));
    }
    let key = KeyPair::from_public_key(&iss).map_err(|e| err(format!("issuer key: {e}")))?;
    let sig = URL_SAFE_NO_PAD
        .decode(s)
        .map_err(|e| err(format!("signature: {e}")))?;
    key.verify(format!("{h}.{p}").as_bytes(), &sig)
        .map_err(|_| err("bad signature"))?;
    let t = serde_json::from_value(claims).map_err(|e| err(format!("claims: {e}")))?;
    Ok((iss, t))
}

/// Signs `claims` (which must hold `sub`; `iss`, `iat` and `jti` are set here) with `signer`.
pub fn encode(
    mut claims: Map<String, Value>,
    signer: &KeyPair,
    now: u64,
) -> Result<String, JwtError> {
    if !claims.contains_key("sub") {
        return Err(err("claims without sub"));
    }
    claims.insert("iss".into(), json!(signer.public_key()));
    claims.insert("iat".into(), json!(now));
    claims.remove("jti");
    // The jti is a hash of the claims (as nats-io/jwt does): unique per issued JWT, repeatable.
    let body = serde_json::to_vec(&claims).map_err(|e| err(e.to_string()))?;
    let jti = data_encoding::BASE32_NOPAD.encode(&Sha512_256::digest(&body));
    claims.insert("jti".into(), json!(jti));
    let body = serde_json::to_vec(&claims).map_err(|e| err(e.to_string()))?;
    let to_sign = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(HEADER),
        URL_SAFE_NO_PAD.encode(body)
    );
    let sig = signer
        .sign(to_sign.as_bytes())
        .map_err(|e| err(format!("sign: {e}")))?;
    Ok(format!("{to_sign}.{}", URL_SAFE_NO_PAD.encode(sig)))
}

/// Publish and subscribe allow-lists of a user.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Allow {
    /// Allowed publish subjects.
    pub publish: Vec<String>,
    /// Allowed subscribe subjects.
    pub subscribe: Vec<String>,
}

/// The user claims (`type: user`) for the connecting client `user_nkey`, placed in `account`, named `name`,
/// allowed only `allow`, valid until `expires` (Unix seconds; the server disconnects the client then).
pub fn user_claims(
    user_nkey: &str,
    account: &str,
    name: &str,
    allow: &Allow,
    expires: u64,
) -> Map<String, Value> {
    let v = json!({
        "sub": user_nkey,
        "aud": account,
        "name": name,
        "exp": expires,
        "nats": {
            "pub": { "allow": allow.publish },
            "sub": { "allow": allow.subscribe },
            // The same limits as the devices' account (docs/auth.md): nats-server 2.15 does not apply a user JWT's
            // limits to users the auth callout admits (it drops the JWT before it registers the user), so the
            // account's `limits` enforce them; these say the same for a server that does.
            "subs": fleet_wire::auth::DEVICE_MAX_SUBSCRIPTIONS,
            "data": -1,
            "payload": fleet_wire::auth::DEVICE_MAX_PAYLOAD,
            "type": "user",
            "version": 2,
        },
    });
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// The authorization response for `user_nkey` to server `server_id`: the user JWT, or an error.
pub fn response_claims(
    user_nkey: &str,
    server_id: &str,
    outcome: Result<&str, &str>,
) -> Map<String, Value> {
    let mut nats = json!({ "type": "authorization_response", "version": 2 });
    match outcome {
        Ok(jwt) => nats["jwt"] = json!(jwt),
        Err(e) => nats["error"] = json!(e),
    }
    let v = json!({ "sub": user_nkey, "aud": server_id, "nats": nats });
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    struct Back {
        sub: String,
        aud: String,
        jti: String,
        nats: Value,
    }

    #[test]
    fn encode_then_verify() {
        let account = KeyPair::new_account();
        let user = KeyPair::new_user().public_key();
        let allow = Allow {
            publish: vec!["a.b".into()],
            subscribe: vec!["_INBOX.device.x.>".into()],
        };
        let claims = user_claims(&user, "$G", "x", &allow, 2_000_000_000);
        let jwt = encode(claims, &account, 1_700_000_000).expect("encode");
        let (iss, back): (String, Back) = decode_verified(&jwt, 'A').expect("verify");
        assert_eq!(iss, account.public_key());
        assert_eq!(
            (back.sub.as_str(), back.aud.as_str()),
            (user.as_str(), "$G")
        );
        assert_eq!(back.jti.len(), 52);
        assert_eq!(back.nats["pub"]["allow"][0], "a.b");
        assert_eq!(back.nats["type"], "user");
        // Wrong kind of issuer, tampered payload, truncated token.
        assert!(decode_verified::<Back>(&jwt, 'N').is_err());
        let mut parts: Vec<&str> = jwt.split('.').collect();
        let forged = URL_SAFE_NO_PAD.encode(br#"{"iss":"x"}"#);
        parts[1] = &forged;
        assert!(decode_verified::<Back>(&parts.join("."), 'A').is_err());
        let other = encode(
            user_claims(&user, "$G", "y", &allow, 1),
            &KeyPair::new_account(),
            1,
        )
        .expect("encode");
        let mixed = format!(
            "{}.{}.{}",
            jwt.split('.').next().unwrap_or(""),
            other.split('.').nth(1).unwrap_or(""),
            jwt.split('.').nth(2).unwrap_or("")
        );
        assert_eq!(
            decode_verified::<Back>(&mixed, 'A').map(|_| ()),
            Err(err("bad signature"))
        );
        assert!(decode_verified::<Back>("a.b", 'A').is_err());
    }

    #[test]
    fn responses_carry_jwt_or_error() {
        let r = response_claims("U1", "N1", Err("token expired"));
        assert_eq!(r["nats"]["error"], "token expired");
        assert!(r["nats"].get("jwt").is_none());
        let r = response_claims("U1", "N1", Ok("j"));
        assert_eq!(r["nats"]["jwt"], "j");
        assert_eq!(r["nats"]["type"], "authorization_response");
        assert_eq!(
            (r["sub"].as_str(), r["aud"].as_str()),
            (Some("U1"), Some("N1"))
        );
    }
}
