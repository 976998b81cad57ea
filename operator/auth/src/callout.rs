//! One authorization decision: open (xkey) and verify the server's request, verify the device's token, and answer
//! with a user JWT holding that device's permissions (`fleet_wire::auth::device_permissions`) or with the reason
//! for refusal. A request that cannot be attributed to a server and user is logged and dropped (the server then
//! refuses the client when its own time-out passes).

use super::jwks::Jwks;
use super::natsjwt::{self, Allow, REQUEST_AUDIENCE};
use super::token::{self, Denied, Policy};
use serde::Deserialize;
use std::sync::Arc;

/// The header carrying the server's xkey when the request is encrypted.
pub const XKEY_HEADER: &str = "Nats-Server-Xkey";

#[derive(Deserialize)]
struct RequestClaims {
    aud: Option<String>,
    #[serde(default)]
    iat: Option<u64>,
    exp: Option<u64>,
    nats: Request,
}

impl RequestClaims {
    /// How long the server waits for the answer (its authorization time-out): `exp - iat`, both by the server's
    /// clock, so no clock skew enters it.
    fn lifetime(&self) -> Option<std::time::Duration> {
        let (iat, exp) = (self.iat?, self.exp?);
        Some(std::time::Duration::from_secs(exp.checked_sub(iat)?))
    }
}

#[derive(Deserialize)]
struct Request {
    server_id: ServerId,
    user_nkey: String,
    #[serde(default)]
    client_info: ClientInfo,
    #[serde(default)]
    connect_opts: ConnectOpts,
}

#[derive(Deserialize)]
struct ServerId {
    id: String,
}

#[derive(Deserialize, Default)]
struct ClientInfo {
    #[serde(default)]
    host: String,
    #[serde(default)]
    id: u64,
}

/// Credentials from the client's CONNECT: never logged.
#[derive(Deserialize, Default)]
struct ConnectOpts {
    #[serde(default)]
    auth_token: Option<String>,
}

/// The decision maker, shared by all request tasks.
pub struct Callout {
    /// Signs the user and response JWTs.
    pub issuer: nkeys::KeyPair,
    /// Opens encrypted requests and seals responses.
    pub xkey: Option<nkeys::XKey>,
    /// Account devices are placed in.
    pub account: String,
    /// Token policy.
    pub policy: Policy,
    /// Key source.
    pub jwks: Arc<Jwks>,
    /// Devices refused for a cool-down after a flood (the flood guard's).
    pub cooldowns: Arc<std::sync::Mutex<super::flood::Cooldowns>>,
    /// The connection cap and reconnect budget per device, with the devices' open connections (the flood guard
    /// keeps them from the server's events); none without the guard.
    pub admissions: Option<(
        super::flood::Budget,
        Arc<std::sync::Mutex<super::flood::Admissions>>,
    )>,
    /// The admissions' monotonic clock starts here.
    pub started: std::time::Instant,
    /// Retired devices ([`super::retired`]): refused whatever their token says.
    pub retired: Arc<super::retired::Retired>,
}

/// The result of handling one request.
pub struct Answer {
    /// Bytes to publish on the reply subject (`None`: nothing can be answered).
    pub reply: Option<Vec<u8>>,
    /// The line to log (no secrets).
    pub log: String,
    /// Whether the client was admitted.
    pub allowed: bool,
    /// The device a refusal is logged under when its token was verified (cooling down, over its reconnect
    /// budget), so that the log holds one line per device per interval however often it is refused; `None`:
    /// logged as it is (a bad token names no device one could trust).
    pub refused: Option<String>,
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// `secs` (Unix seconds) as an RFC 3339 UTC time, for the log.
fn rfc3339(secs: u64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs);
    humantime::format_rfc3339_seconds(t).to_string()
}

impl Callout {
    /// Handles one request (`payload` as received at `received`, `server_xkey` the header's value).
    pub async fn handle(
        &self,
        payload: &[u8],
        server_xkey: Option<&str>,
        received: std::time::Instant,
    ) -> Answer {
        let drop = |why: String| Answer {
            reply: None,
            log: format!("dropped an authorization request: {why}"),
            allowed: false,
            refused: None,
        };
        let (jwt, seal_to) = match (&self.xkey, server_xkey) {
            (Some(ours), Some(theirs)) => {
                let Ok(sender) = nkeys::XKey::from_public_key(theirs) else {
                    return drop("the server's xkey header is not a curve public key".into());
                };
                match ours.open(payload, &sender) {
                    Ok(b) => (b, Some(sender)),
                    Err(e) => return drop(format!("cannot decrypt it with our xkey: {e}")),
                }
            }
            (Some(_), None) => {
                return drop("it is not encrypted but fleet-auth has an xkey (set auth_callout.xkey on the server)".into())
            }
            (None, Some(_)) => {
                return drop("it is encrypted but fleet-auth has no xkey_seed_file".into())
            }
            (None, None) => (payload.to_vec(), None),
        };
        let Ok(jwt) = String::from_utf8(jwt) else {
            return drop("not UTF-8".into());
        };
        let (_, req): (String, RequestClaims) = match natsjwt::decode_verified(&jwt, 'N') {
            Ok(r) => r,
            Err(e) => return drop(e.to_string()),
        };
        if req.aud.as_deref() != Some(REQUEST_AUDIENCE) {
            return drop(format!("audience is not {REQUEST_AUDIENCE}"));
        }
        if req.exp.is_some_and(|e| e.saturating_add(5) < now()) {
            return drop("it expired".into());
        }
        // Under a reconnect storm requests wait here longer than the server does: one the server has already
        // refused (its time-out passed since fleet-auth received it) is not worth a token check and two signatures,
        // which the requests still being waited for need.
        if let Some(lifetime) = req.lifetime() {
            let waited = received.elapsed();
            if waited >= lifetime {
                return Answer {
                    reply: None,
                    log: format!(
                        "skipped an authorization request the server stopped waiting for: it waited {:.1} s here, \
                         the server's time-out is {} s (fleet-auth is behind)",
                        waited.as_secs_f64(),
                        lifetime.as_secs()
                    ),
                    allowed: false,
                    refused: None,
                };
            }
        }
        let r = req.nats;
        let who = format!("client {} cid {}", r.client_info.host, r.client_info.id);
        let decision = self.decide(&r.connect_opts, &r.user_nkey).await;
        let (outcome, log, allowed, refused) = match &decision {
            Ok((device, until, jwt)) => (
                Ok(jwt.as_str()),
                format!("allowed {who} as device {device} until {}", rfc3339(*until)),
                true,
                None,
            ),
            Err((device, reason)) => (
                Err(reason.as_str()),
                format!("denied {who}: {reason}"),
                false,
                device.as_ref().map(|d| format!("device {d}")),
            ),
        };
        let claims = natsjwt::response_claims(&r.user_nkey, &r.server_id.id, outcome);
        let signed = match natsjwt::encode(claims, &self.issuer, now()) {
            Ok(s) => s,
            Err(e) => return drop(format!("cannot sign the response: {e}")),
        };
        let reply = match (&self.xkey, seal_to) {
            (Some(ours), Some(to)) => match ours.seal(signed.as_bytes(), &to) {
                Ok(b) => b,
                Err(e) => return drop(format!("cannot encrypt the response: {e}")),
            },
            _ => signed.into_bytes(),
        };
        Answer {
            reply: Some(reply),
            log,
            allowed,
            refused,
        }
    }

    /// Verifies the token; on success the device, the session's end (Unix seconds) and the user JWT for
    /// `user_nkey` with its permissions; on refusal the device when the token named one, and why.
    async fn decide(
        &self,
        opts: &ConnectOpts,
        user_nkey: &str,
    ) -> Result<(String, u64, String), (Option<String>, String)> {
        // In server-config mode nats-server drops a client's `jwt` option, so the token travels as `auth_token`.
        let Some(token) = opts.auth_token.as_deref().filter(|s| !s.is_empty()) else {
            return Err((None, Denied::NoToken.to_string()));
        };
        let identity = self
            .verify(token)
            .await
            .map_err(|d| (None, d.to_string()))?;
        let refused = |why: String| (Some(identity.device.to_string()), why);
        // Retired (its Device deleted): refused until a person enrols it again, whatever its token.
        if self.retired.contains(identity.device.as_str()) {
            return Err(refused(format!(
                "device {} is retired (its tombstone is in {}; enrol it again to admit it: docs/device-lifecycle.md)",
                identity.device,
                fleet_wire::kv::DEVICE_RETIRED
            )));
        }
        let cooling = self
            .cooldowns
            .lock()
            .ok()
            .and_then(|c| c.cooling(&identity.device, now()));
        if let Some(c) = cooling {
            return Err(refused(format!(
                "device {} is cooling down after a message flood (flood {} in a row): refused until {}",
                identity.device,
                c.strikes,
                rfc3339(c.until)
            )));
        }
        // Counted last: a refused attempt (cooling, bad token) takes nothing from the device's reconnect budget.
        if let Some((budget, admissions)) = &self.admissions {
            let now_ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
            let admitted = admissions
                .lock()
                .map_err(|_| refused("admissions unavailable".to_owned()))?
                .admit(&identity.device, now_ms, budget);
            if let Err(why) = admitted {
                return Err(refused(format!(
                    "device {} refused: {why}",
                    identity.device
                )));
            }
        }
        let perms = fleet_wire::auth::device_permissions(&identity.device);
        let allow = Allow {
            publish: perms.publish,
            subscribe: perms.subscribe,
        };
        let device = identity.device.to_string();
        // The server disconnects the client when the session ends (token expiry plus leeway, capped); it
        // reconnects with the token on disk.
        let until = identity.session_until;
        let claims = natsjwt::user_claims(user_nkey, &self.account, &device, &allow, until);
        let jwt =
            natsjwt::encode(claims, &self.issuer, now()).map_err(|e| refused(e.to_string()))?;
        Ok((device, until, jwt))
    }

    async fn verify(&self, token: &str) -> Result<token::Identity, Denied> {
        let kid = token::kid(token)?;
        let key = self.jwks.key(&kid).await?;
        token::verify(token, &key, &self.policy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::time::{Duration, Instant};

    fn callout() -> Callout {
        Callout {
            issuer: nkeys::KeyPair::new_account(),
            xkey: None,
            account: fleet_wire::auth::DEVICES_ACCOUNT.into(),
            policy: Policy {
                issuer: "https://zitadel.test".into(),
                audience: "fleet".into(),
                device_claim: "device_id".into(),
                leeway: Duration::from_secs(5),
            },
            jwks: Jwks::new(crate::jwks::JwksSettings {
                url: "https://127.0.0.1:9/keys".into(),
                extra_roots: Vec::new(),
                timeout: Duration::from_secs(1),
                max_bytes: 1024,
                min_refresh: Duration::from_secs(1),
                max_age: Duration::from_secs(60),
            })
            .unwrap(),
            cooldowns: Default::default(),
            admissions: None,
            started: Instant::now(),
            retired: crate::retired::Retired::new().0,
        }
    }

    /// A request as nats-server signs it, waited for `timeout` seconds (its `exp - iat`).
    fn request(timeout: u64) -> Vec<u8> {
        let server = nkeys::KeyPair::new_server();
        let user = nkeys::KeyPair::new_user();
        let claims = json!({
            "sub": user.public_key(),
            "aud": REQUEST_AUDIENCE,
            "exp": now() + timeout,
            "nats": {
                "server_id": { "id": server.public_key() },
                "user_nkey": user.public_key(),
                "connect_opts": { "auth_token": "not-a-jwt" },
            },
        });
        let claims = claims.as_object().unwrap().clone();
        natsjwt::encode(claims, &server, now())
            .unwrap()
            .into_bytes()
    }

    #[tokio::test]
    async fn a_request_the_server_stopped_waiting_for_is_skipped_unanswered() {
        let c = callout();
        let long_ago = Instant::now()
            .checked_sub(Duration::from_millis(3_100))
            .unwrap();
        let stale = c.handle(&request(3), None, long_ago).await;
        assert!(stale.reply.is_none(), "{}", stale.log);
        assert!(
            stale.log.contains("the server stopped waiting for")
                && stale.log.contains("time-out is 3 s"),
            "{}",
            stale.log
        );
        // Within the server's time-out it is decided (here: refused, with the reason, as an answer).
        let fresh = c.handle(&request(3), None, Instant::now()).await;
        assert!(fresh.reply.is_some() && !fresh.allowed, "{}", fresh.log);
        assert!(fresh.log.starts_with("denied"), "{}", fresh.log);
    }
}
