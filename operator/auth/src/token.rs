//! Verifying a device's Zitadel token against one signing key: signature (RS256 or ES256, chosen by the key, never
//! by the token), `iss`, `aud`, `exp` and `nbf` with a small leeway, and the device id claim as a
//! `fleet_wire::DeviceId`, in a payload that names each claim once ([`duplicate_claim`]); and how long the session it opens lasts ([`session_end`]), so that the user JWT the
//! callout issues is one nats-server accepts. Pure: the key comes from the JWKS cache.

use fleet_wire::text::for_log;
use fleet_wire::DeviceId;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::Value;
use std::time::Duration;

/// Largest token accepted, in bytes.
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;
/// Largest leeway allowed for `exp`/`nbf`.
pub const MAX_LEEWAY: Duration = Duration::from_secs(300);
/// Longest session one admission grants: the user JWT expires then at the latest, and the device reconnects with
/// its token, which is checked again. It also keeps the user JWT's `exp` far from what nats-server cannot hold
/// (it refuses an `exp` beyond `i64`, and an `exp` more than about 292 years ahead overflows its timer and
/// disconnects the client at once).
pub const MAX_SESSION: Duration = Duration::from_secs(24 * 3600);
/// Shortest session worth admitting: nats-server disconnects a client whose user JWT expires, so a token that
/// (with the leeway) has less left than this is refused as expired rather than admitted for a moment.
pub const MIN_SESSION: Duration = Duration::from_secs(5);

/// What a token must satisfy.
#[derive(Debug, Clone)]
pub struct Policy {
    /// Expected `iss` (the Zitadel instance URL).
    pub issuer: String,
    /// Expected `aud` (one of the token's audiences; the Zitadel project id).
    pub audience: String,
    /// Claim holding the device id.
    pub device_claim: String,
    /// Clock leeway for `exp` and `nbf`.
    pub leeway: Duration,
}

/// One verification key from the JWKS.
#[derive(Clone)]
pub struct SigningKey {
    /// The key.
    pub key: DecodingKey,
    /// The only algorithm it verifies.
    pub alg: Algorithm,
}

/// Why a client was refused. The text is safe to log and to return: it never contains the token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Denied {
    /// No token in the connect options.
    #[error("no token in the connect options (send the Zitadel token as the NATS auth token)")]
    NoToken,
    /// Not a JWT, or too large.
    #[error("token is malformed: {0}")]
    Malformed(String),
    /// The `kid` is not in the JWKS, even after a refresh.
    #[error("unknown signing key id {0:?} (not in the issuer's JWKS after refresh)")]
    UnknownKid(String),
    /// The JWKS could not be fetched or is unusable: fail closed.
    #[error("JWKS unavailable: {0}")]
    Jwks(String),
    /// The token's algorithm is not the key's.
    #[error("token algorithm does not match its key (want {0})")]
    Algorithm(String),
    /// Signature does not verify.
    #[error("bad token signature")]
    BadSignature,
    /// `exp` passed.
    #[error("token expired")]
    Expired,
    /// `exp`, with the leeway, is less than [`MIN_SESSION`] away.
    #[error("token expires within {min}s even with the {1}s leeway (exp {0})", min = MIN_SESSION.as_secs())]
    ExpiresTooSoon(u64, u64),
    /// `nbf` in the future.
    #[error("token not valid yet (nbf in the future)")]
    NotYetValid,
    /// Wrong `iss`.
    #[error("wrong token issuer")]
    WrongIssuer,
    /// Wrong `aud`.
    #[error("wrong token audience")]
    WrongAudience,
    /// A registered claim is missing.
    #[error("token lacks required claim {0}")]
    MissingClaim(String),
    /// The device id claim is missing or not a string.
    #[error("token has no device id claim {0:?}")]
    NoDeviceId(String),
    /// The device id is not a valid `DeviceId`.
    #[error("token device id rejected: {0}")]
    BadDeviceId(String),
    /// The payload names a claim more than once (RFC 7519 4: claim names are unique); a JSON parser keeps one of
    /// them, so which device the token names would depend on the parser. The name is shown escaped.
    #[error("token names claim \"{0}\" more than once")]
    DuplicateClaim(String),
}

/// The verified identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The device.
    pub device: DeviceId,
    /// Token expiry (Unix seconds).
    pub expires: u64,
    /// When the session ends (Unix seconds): the user JWT's `exp`, from [`session_end`].
    pub session_until: u64,
}

/// The end of the session a token with expiry `exp` opens at `now` (Unix seconds): `exp` plus the leeway (the
/// token is valid that long in this clock, so nats-server must not disconnect the device earlier), at most
/// [`MAX_SESSION`] from now. A session shorter than [`MIN_SESSION`] is refused: nats-server refuses a user JWT
/// whose `exp` has passed and disconnects at once one whose `exp` is now, so admitting it would be a lie in the
/// log.
pub fn session_end(exp: u64, leeway: Duration, now: u64) -> Result<u64, Denied> {
    let end = exp.saturating_add(leeway.as_secs());
    if end < now.saturating_add(MIN_SESSION.as_secs()) {
        return Err(if exp.saturating_add(leeway.as_secs()) < now {
            Denied::Expired
        } else {
            Denied::ExpiresTooSoon(exp, leeway.as_secs())
        });
    }
    Ok(end.min(now.saturating_add(MAX_SESSION.as_secs())))
}

/// The `kid` of `token`'s header (tokens without one are refused).
pub fn kid(token: &str) -> Result<String, Denied> {
    if token.len() > MAX_TOKEN_BYTES {
        return Err(Denied::Malformed(format!(
            "larger than {MAX_TOKEN_BYTES} bytes"
        )));
    }
    // The JSON error may quote the header's text (an unknown `alg`): shown escaped, as one line.
    let h = jsonwebtoken::decode_header(token)
        .map_err(|e| Denied::Malformed(format!("header: {}", for_log(&e.to_string()))))?;
    h.kid
        .filter(|k| !k.is_empty() && k.len() <= 256)
        .ok_or_else(|| Denied::Malformed("no kid in the header".into()))
}

/// Verifies `token` with `key` under `policy` at the current time.
pub fn verify(token: &str, key: &SigningKey, policy: &Policy) -> Result<Identity, Denied> {
    verify_at(token, key, policy, jsonwebtoken::get_current_timestamp())
}

/// [`verify`] with the session computed for `now` (Unix seconds; jsonwebtoken's own `exp`/`nbf` check uses the
/// system clock).
pub fn verify_at(
    token: &str,
    key: &SigningKey,
    policy: &Policy,
    now: u64,
) -> Result<Identity, Denied> {
    if let Some(name) = duplicate_claim(token)? {
        return Err(Denied::DuplicateClaim(for_log(&name)));
    }
    let mut v = Validation::new(key.alg);
    v.algorithms = vec![key.alg];
    v.leeway = policy.leeway.as_secs();
    v.validate_nbf = true;
    v.set_issuer(&[policy.issuer.as_str()]);
    v.set_audience(&[policy.audience.as_str()]);
    v.set_required_spec_claims(&["exp", "iss", "aud"]);
    let data = jsonwebtoken::decode::<serde_json::Map<String, Value>>(token, &key.key, &v)
        .map_err(|e| match e.into_kind() {
            ErrorKind::InvalidSignature => Denied::BadSignature,
            ErrorKind::ExpiredSignature => Denied::Expired,
            ErrorKind::ImmatureSignature => Denied::NotYetValid,
            ErrorKind::InvalidIssuer => Denied::WrongIssuer,
            ErrorKind::InvalidAudience => Denied::WrongAudience,
            ErrorKind::MissingRequiredClaim(c) => Denied::MissingClaim(c),
            ErrorKind::InvalidAlgorithm => Denied::Algorithm(format!("{:?}", key.alg)),
            other => Denied::Malformed(for_log(&format!("{other:?}"))),
        })?;
    let claims = data.claims;
    // A NumericDate may have a fraction (RFC 7519); jsonwebtoken accepted it, so it is a non-negative number.
    let expires = claims
        .get("exp")
        .and_then(|v| {
            v.as_u64().or_else(|| {
                v.as_f64()
                    .filter(|f| f.is_finite() && *f >= 0.0)
                    .map(|f| f as u64)
            })
        })
        .ok_or_else(|| Denied::MissingClaim("exp".into()))?;
    let raw = claims
        .get(&policy.device_claim)
        .and_then(Value::as_str)
        .ok_or_else(|| Denied::NoDeviceId(policy.device_claim.clone()))?;
    let device = DeviceId::try_from(raw).map_err(|e| Denied::BadDeviceId(e.to_string()))?;
    let session_until = session_end(expires, policy.leeway, now)?;
    Ok(Identity {
        device,
        expires,
        session_until,
    })
}

/// The first claim `token`'s payload names more than once, if any. serde_json (and so jsonwebtoken's claims map)
/// keeps the last of two `device_id`s, so a token naming two devices would be admitted as the last one;
/// names are compared as JSON reads them (`"device\u005fid"` is `device_id`).
pub fn duplicate_claim(token: &str) -> Result<Option<String>, Denied> {
    use base64::Engine;
    use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};

    struct FirstDuplicate;
    impl<'de> Visitor<'de> for FirstDuplicate {
        type Value = Option<String>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON object of claims")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut seen = std::collections::HashSet::new();
            let mut first = None;
            while let Some(name) = map.next_key::<String>()? {
                map.next_value::<IgnoredAny>()?;
                if first.is_none() && seen.contains(&name) {
                    first = Some(name);
                } else {
                    seen.insert(name);
                }
            }
            Ok(first)
        }
    }

    let mut parts = token.split('.');
    let payload = match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(_), Some(p), Some(_), None) => p,
        _ => return Err(Denied::Malformed("not three dot-separated parts".into())),
    };
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .map_err(|e| Denied::Malformed(format!("payload: {e}")))?;
    serde_json::Deserializer::from_slice(&bytes)
        .deserialize_map(FirstDuplicate)
        .map_err(|e| Denied::Malformed(format!("payload: {}", for_log(&e.to_string()))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{EncodingKey, Header};
    use ring::rand::SystemRandom;
    use ring::signature::{EcdsaKeyPair, KeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};
    use serde_json::json;

    fn now() -> u64 {
        jsonwebtoken::get_current_timestamp()
    }

    struct Ec {
        enc: EncodingKey,
        key: SigningKey,
    }

    fn ec_key() -> Ec {
        let rng = SystemRandom::new();
        let pkcs8 =
            EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).expect("gen");
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .expect("pair");
        let point = pair.public_key().as_ref();
        use base64::Engine;
        let b = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let dec =
            DecodingKey::from_ec_components(&b.encode(&point[1..33]), &b.encode(&point[33..]))
                .expect("dec");
        Ec {
            enc: EncodingKey::from_ec_der(pkcs8.as_ref()),
            key: SigningKey {
                key: dec,
                alg: Algorithm::ES256,
            },
        }
    }

    fn policy() -> Policy {
        Policy {
            issuer: "https://zitadel.test".into(),
            audience: "fleet".into(),
            device_claim: "device_id".into(),
            leeway: Duration::from_secs(5),
        }
    }

    fn sign(k: &Ec, claims: Value) -> String {
        let mut h = Header::new(Algorithm::ES256);
        h.kid = Some("k1".into());
        jsonwebtoken::encode(&h, &claims, &k.enc).expect("sign")
    }

    fn good() -> Value {
        json!({"iss": "https://zitadel.test", "aud": ["fleet", "other"], "exp": now() + 600,
               "nbf": now() - 10, "device_id": "dev-a"})
    }

    /// A token of `payload` exactly as written (a JSON map cannot hold two keys of one name), signed by `k`.
    fn sign_raw(k: &Ec, payload: &str) -> String {
        use base64::Engine;
        let b = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let message = format!(
            "{}.{}",
            b.encode(br#"{"alg":"ES256","typ":"JWT","kid":"k1"}"#),
            b.encode(payload)
        );
        let sig =
            jsonwebtoken::crypto::sign(message.as_bytes(), &k.enc, Algorithm::ES256).expect("sign");
        format!("{message}.{sig}")
    }

    #[test]
    fn a_token_naming_a_claim_twice_is_refused() {
        let k = ec_key();
        let p = policy();
        let (exp, nbf) = (now() + 600, now() - 10);
        let base =
            format!(r#""iss":"https://zitadel.test","aud":["fleet"],"exp":{exp},"nbf":{nbf}"#);
        let once = sign_raw(&k, &format!(r#"{{{base},"device_id":"dev-a"}}"#));
        assert_eq!(
            verify(&once, &k.key, &p).expect("valid").device.as_str(),
            "dev-a"
        );
        let table = [
            (
                r#""device_id":"dev-b","device_id":"dev-a""#.to_owned(),
                "device_id",
            ),
            (
                r#""device_id":"dev-b","device\u005fid":"dev-a""#.to_owned(),
                "device_id",
            ),
            (
                r#""device_id":"dev-a","iss":"https://evil.test""#.to_owned(),
                "iss",
            ),
            (r#""device_id":"dev-a","aud":"other""#.to_owned(), "aud"),
            (
                format!(r#""device_id":"dev-a","exp":{}"#, exp + 999_999),
                "exp",
            ),
            (
                r#""device_id":"dev-a","x\ny":1,"x\ny":2"#.to_owned(),
                "x\\ny",
            ),
        ];
        for (claims, name) in table {
            let t = sign_raw(&k, &format!(r#"{{{base},{claims}}}"#));
            let got = verify(&t, &k.key, &p);
            assert_eq!(got, Err(Denied::DuplicateClaim(name.into())), "{claims}");
            let text = got.expect_err("refused").to_string();
            assert!(!text.contains('\n'), "{text}");
        }
        // Nested objects may repeat a name of the claims set; only the claims set's own names must be unique.
        let nested = sign_raw(
            &k,
            &format!(r#"{{{base},"device_id":"dev-a","extra":{{"device_id":"dev-b"}}}}"#),
        );
        assert_eq!(
            verify(&nested, &k.key, &p).expect("valid").device.as_str(),
            "dev-a"
        );
        assert_eq!(
            duplicate_claim("a.b"),
            Err(Denied::Malformed("not three dot-separated parts".into()))
        );
    }

    #[test]
    fn sessions_end_with_the_leeway_capped_and_never_too_soon() {
        let l = Duration::from_secs(30);
        let now = 1_800_000_000;
        let cap = now + MAX_SESSION.as_secs();
        let table = [
            (now + 600, Ok(now + 630)),
            (now, Ok(now + 30)),
            (now - 25, Ok(now + 5)),
            (now - 26, Err(Denied::ExpiresTooSoon(now - 26, 30))),
            (now - 30, Err(Denied::ExpiresTooSoon(now - 30, 30))),
            (now - 31, Err(Denied::Expired)),
            (0, Err(Denied::Expired)),
            (cap - 30, Ok(cap)),
            (cap, Ok(cap)),
            (u64::MAX, Ok(cap)),
        ];
        for (exp, want) in table {
            assert_eq!(session_end(exp, l, now), want, "exp {exp}");
        }
        assert_eq!(
            session_end(now, Duration::ZERO, now),
            Err(Denied::ExpiresTooSoon(now, 0))
        );
    }

    #[test]
    fn decisions() {
        let k = ec_key();
        let other = ec_key();
        let p = policy();
        let ok = verify(&sign(&k, good()), &k.key, &p).expect("valid");
        assert_eq!(ok.device.as_str(), "dev-a");
        assert_eq!(kid(&sign(&k, good())), Ok("k1".into()));

        let with = |f: &dyn Fn(&mut Value)| {
            let mut c = good();
            f(&mut c);
            verify(&sign(&k, c), &k.key, &p)
        };
        let table: Vec<(&str, Result<Identity, Denied>, Denied)> = vec![
            (
                "bad signature",
                verify(&sign(&other, good()), &k.key, &p),
                Denied::BadSignature,
            ),
            (
                "expired",
                with(&|c| c["exp"] = json!(now() - 60)),
                Denied::Expired,
            ),
            (
                "nbf future",
                with(&|c| c["nbf"] = json!(now() + 60)),
                Denied::NotYetValid,
            ),
            (
                "iss",
                with(&|c| c["iss"] = json!("https://evil.test")),
                Denied::WrongIssuer,
            ),
            (
                "aud",
                with(&|c| c["aud"] = json!("nope")),
                Denied::WrongAudience,
            ),
            (
                "no exp",
                with(&|c| {
                    c.as_object_mut().map(|m| m.remove("exp"));
                }),
                Denied::MissingClaim("exp".into()),
            ),
            (
                "no device",
                with(&|c| {
                    c.as_object_mut().map(|m| m.remove("device_id"));
                }),
                Denied::NoDeviceId("device_id".into()),
            ),
            (
                "number device",
                with(&|c| c["device_id"] = json!(7)),
                Denied::NoDeviceId("device_id".into()),
            ),
        ];
        for (name, got, want) in table {
            assert_eq!(got, Err(want), "{name}");
        }
        for bad in ["a.b", "a*", ">", "a b", "", "A", "a\u{0}"] {
            let got = with(&|c| c["device_id"] = json!(bad));
            assert!(
                matches!(got, Err(Denied::BadDeviceId(_))),
                "{bad:?}: {got:?}"
            );
        }
        // Within the leeway only if the session it opens is long enough for nats-server to keep the device.
        let p60 = Policy {
            leeway: Duration::from_secs(60),
            ..policy()
        };
        let lee = |exp: u64| {
            let mut c = good();
            c["exp"] = json!(exp);
            verify(&sign(&k, c), &k.key, &p60)
        };
        let t = now();
        let id = lee(t - 30).expect("30 s into a 60 s leeway");
        assert_eq!((id.expires, id.session_until), (t - 30, t + 30));
        assert_eq!(lee(t - 58), Err(Denied::ExpiresTooSoon(t - 58, 60)));
        assert_eq!(lee(t - 61), Err(Denied::Expired));
        // Far and huge expiries open a capped session.
        for exp in [t + 10 * 366 * 86400, i64::MAX as u64, u64::MAX] {
            let id = lee(exp).expect("far exp");
            let ahead = id.session_until - t;
            assert!(
                (MAX_SESSION.as_secs()..=MAX_SESSION.as_secs() + 1).contains(&ahead),
                "{exp}: {ahead}"
            );
        }
        // A token signed with HS256 by someone holding the public key is refused (alg from the key).
        let hs = jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &good(),
            &EncodingKey::from_secret(b"x"),
        )
        .expect("hs");
        assert!(matches!(verify(&hs, &k.key, &p), Err(Denied::Algorithm(_))));
        assert!(matches!(kid(&hs), Err(Denied::Malformed(_))));
        assert!(matches!(kid("garbage"), Err(Denied::Malformed(_))));
        // The error text never contains the token.
        let t = sign(&k, json!({"exp": now() - 60}));
        let e = verify(&t, &k.key, &p).expect_err("expired").to_string();
        assert!(!e.contains(&t[..20]));
    }
}
