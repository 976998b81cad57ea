//! fleet-auth's configuration (YAML): the NATS connection it serves on, the issuer account and xkey seeds (read
//! from files, never logged), and the Zitadel issuer whose tokens it accepts. See `docs/auth.md`.

use super::jwks::JwksSettings;
use super::token::{Policy, MAX_LEEWAY};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Largest config file read, in bytes.
pub const MAX_CONFIG_BYTES: u64 = 64 * 1024;
/// Largest secret file (password, nkey seed) read, in bytes.
pub const MAX_SECRET_BYTES: u64 = 4096;

/// The config file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    /// NATS connection.
    pub nats: RawNats,
    /// File holding the issuer account's nkey seed (`SA…`); its public key is `auth_callout.issuer`.
    pub issuer_seed_file: PathBuf,
    /// File holding the callout's curve (xkey) seed (`SX…`) when `auth_callout.xkey` is set.
    #[serde(default)]
    pub xkey_seed_file: Option<PathBuf>,
    /// Account devices are placed in (`$G` when the server config has no accounts).
    #[serde(default = "global_account")]
    pub account: String,
    /// The token issuer.
    pub zitadel: RawZitadel,
    /// Most requests handled at once.
    #[serde(default = "default_concurrency")]
    pub max_concurrent: usize,
    /// The device API: the devices' writes and watch registrations (required when devices are placed in an
    /// account of their own).
    #[serde(default)]
    pub device_api: Option<RawDeviceApi>,
    /// The flood guard: disconnects a device sending more messages a second than its budget (needs
    /// `device_api`, whose buckets' user carries its reports).
    #[serde(default)]
    pub flood_guard: Option<RawFloodGuard>,
}

/// The flood guard's system-account user and budget (docs/auth.md).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawFloodGuard {
    /// User in the system account (`system_account`), listed in `auth_callout.auth_users`.
    pub user: String,
    /// File holding that user's password.
    pub password_file: PathBuf,
    /// Messages a second one device may send, summed over its connections.
    #[serde(default = "default_max_msgs")]
    pub max_msgs_per_sec: u64,
    /// The margin: how many seconds of its budgets a device may run ahead (a burst).
    #[serde(default = "default_burst")]
    pub burst_secs: u64,
    /// Bytes a second the server may deliver to one device.
    #[serde(default = "default_max_bytes_out")]
    pub max_bytes_out_per_sec: u64,
    /// Bytes the server may hold undelivered for one device's connections.
    #[serde(default = "default_max_pending")]
    pub max_pending_bytes: u64,
    /// The first cool-down after a flood, seconds (doubled on each repeat).
    #[serde(default = "default_cooldown")]
    pub cooldown_secs: u64,
    /// The longest cool-down, seconds.
    #[serde(default = "default_max_cooldown")]
    pub max_cooldown_secs: u64,
    /// Subscriptions one device may hold over all of its connections.
    #[serde(default = "default_max_subscriptions")]
    pub max_subscriptions: u64,
    /// Connections one device may have open at once (the callout refuses more).
    #[serde(default = "default_max_connections")]
    pub max_connections: u64,
    /// Admissions of one device in a row...
    #[serde(default = "default_connects_burst")]
    pub connects_burst: u64,
    /// ...then one every this many seconds (the callout refuses the others: a reconnect flood).
    #[serde(default = "default_connect_every")]
    pub connect_every_secs: u64,
    /// Time between polls, milliseconds.
    #[serde(default = "default_poll")]
    pub interval_ms: u64,
}

fn default_max_msgs() -> u64 {
    500
}
fn default_cooldown() -> u64 {
    60
}
fn default_max_cooldown() -> u64 {
    3600
}
fn default_max_subscriptions() -> u64 {
    64
}
fn default_burst() -> u64 {
    2
}
fn default_max_bytes_out() -> u64 {
    8 * 1024 * 1024
}
fn default_max_pending() -> u64 {
    8 * 1024 * 1024
}
fn default_max_connections() -> u64 {
    4
}
fn default_connects_burst() -> u64 {
    5
}
fn default_connect_every() -> u64 {
    10
}
fn default_poll() -> u64 {
    // A flood is cut off within about one poll; each poll asks each server for two sorted lists of connections.
    500
}

/// The device API's two NATS users (docs/auth.md): one in the account whose services the devices import, one
/// in the buckets' account. Same server URL and TLS as `nats`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDeviceApi {
    /// User in the device API's account (`DEVICE_API`), listed in `auth_callout.auth_users`.
    pub user: String,
    /// File holding that user's password.
    pub password_file: PathBuf,
    /// User in the buckets' account (`FLEET`), listed in `auth_callout.auth_users`.
    pub fleet_user: String,
    /// File holding that user's password.
    pub fleet_password_file: PathBuf,
}

fn global_account() -> String {
    "$G".into()
}

fn default_concurrency() -> usize {
    256
}

/// NATS connection settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawNats {
    /// Server URL (without credentials).
    pub url: String,
    /// fleet-auth's own user (listed in `auth_callout.auth_users`).
    pub user: String,
    /// File holding that user's password.
    pub password_file: PathBuf,
    /// TLS: PEM CA(s) the server's certificate must chain to (any TLS file makes TLS required).
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// TLS: client certificate for a server that verifies clients (mTLS), with `key_file`.
    #[serde(default)]
    pub cert_file: Option<PathBuf>,
    /// TLS: the client certificate's key.
    #[serde(default)]
    pub key_file: Option<PathBuf>,
}

/// Token issuer settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawZitadel {
    /// Expected `iss`.
    pub issuer: String,
    /// Expected `aud`.
    pub audience: String,
    /// JWKS URL (`<issuer>/oauth/v2/keys` for Zitadel).
    pub jwks_url: String,
    /// Extra CA certificate (PEM) trusted for the JWKS fetch.
    #[serde(default)]
    pub jwks_ca_file: Option<PathBuf>,
    /// Claim holding the device id.
    #[serde(default = "device_claim")]
    pub device_id_claim: String,
    /// Clock leeway for `exp`/`nbf`, seconds (at most 300).
    #[serde(default = "leeway")]
    pub leeway_secs: u64,
    /// JWKS fetch time limit, milliseconds.
    #[serde(default = "jwks_timeout")]
    pub jwks_timeout_ms: u64,
    /// Largest JWKS, bytes.
    #[serde(default = "jwks_max")]
    pub jwks_max_bytes: u64,
    /// Least time between refetches caused by unknown `kid`s, seconds.
    #[serde(default = "min_refresh")]
    pub jwks_min_refresh_secs: u64,
    /// Cache lifetime, seconds.
    #[serde(default = "max_age")]
    pub jwks_max_age_secs: u64,
}

fn device_claim() -> String {
    "device_id".into()
}
fn leeway() -> u64 {
    30
}
fn jwks_timeout() -> u64 {
    1500
}
fn jwks_max() -> u64 {
    64 * 1024
}
fn min_refresh() -> u64 {
    10
}
fn max_age() -> u64 {
    900
}

/// The validated settings with secrets loaded.
pub struct Settings {
    /// NATS URL.
    pub url: String,
    /// NATS user.
    pub user: String,
    /// NATS password.
    pub password: String,
    /// NATS TLS.
    pub tls: fleet_kit::nats_tls::NatsTls,
    /// Issuer account key pair.
    pub issuer: nkeys::KeyPair,
    /// Callout xkey, when requests are encrypted.
    pub xkey: Option<nkeys::XKey>,
    /// Account devices are placed in.
    pub account: String,
    /// Token policy.
    pub policy: Policy,
    /// JWKS settings.
    pub jwks: JwksSettings,
    /// Concurrency bound.
    pub max_concurrent: usize,
    /// The device API's users, when it is on.
    pub device_api: Option<DeviceApiSettings>,
    /// The flood guard, when it is on.
    pub flood_guard: Option<super::flood_guard::GuardSettings>,
}

/// The device API's users with their passwords loaded.
pub struct DeviceApiSettings {
    /// User in the device API's account.
    pub user: String,
    /// Its password.
    pub password: String,
    /// User in the buckets' account.
    pub fleet_user: String,
    /// Its password.
    pub fleet_password: String,
}

fn read_bounded(path: &Path, max: u64, what: &str) -> Result<Vec<u8>, String> {
    fleet_wire::bounded::read(path, max).map_err(|e| format!("{what} {e}"))
}

fn read_secret(path: &Path, what: &str) -> Result<String, String> {
    let b = read_bounded(path, MAX_SECRET_BYTES, what)?;
    let s = String::from_utf8(b).map_err(|_| format!("{what} {} is not UTF-8", path.display()))?;
    let s = s.trim().to_owned();
    if s.is_empty() {
        return Err(format!("{what} {} is empty", path.display()));
    }
    Ok(s)
}

impl Settings {
    /// Reads the config at `path` and the files it names.
    pub fn load(path: &Path) -> Result<Settings, String> {
        let text = read_bounded(path, MAX_CONFIG_BYTES, "config")?;
        let raw: RawConfig = serde_yaml_ng::from_slice(&text)
            .map_err(|e| format!("config {}: {e}", path.display()))?;
        Self::from_raw(raw)
    }

    /// Validates `raw` and loads its secrets.
    pub fn from_raw(raw: RawConfig) -> Result<Settings, String> {
        if !(raw.nats.url.starts_with("nats://") || raw.nats.url.starts_with("tls://"))
            || raw.nats.url.contains('@')
        {
            return Err(
                "nats.url must be nats://host:port or tls://host:port without credentials".into(),
            );
        }
        let password = read_secret(&raw.nats.password_file, "nats.password_file")?;
        fleet_kit::nats_password::refuse_placeholder(
            &password,
            &format!("nats.password_file {}", raw.nats.password_file.display()),
        )?;
        let tls = fleet_kit::nats_tls::NatsTls::new(
            raw.nats.ca_file.clone(),
            raw.nats.cert_file.clone(),
            raw.nats.key_file.clone(),
            "nats.",
        )?;
        let seed = read_secret(&raw.issuer_seed_file, "issuer_seed_file")?;
        let issuer = nkeys::KeyPair::from_seed(&seed)
            .map_err(|e| format!("issuer_seed_file: not an nkey seed: {e}"))?;
        if !issuer.public_key().starts_with('A') {
            return Err("issuer_seed_file must hold an account seed (SA…)".into());
        }
        let xkey = match &raw.xkey_seed_file {
            None => None,
            Some(p) => {
                let s = read_secret(p, "xkey_seed_file")?;
                Some(
                    nkeys::XKey::from_seed(&s)
                        .map_err(|e| format!("xkey_seed_file: not a curve seed: {e}"))?,
                )
            }
        };
        let z = raw.zitadel;
        let leeway = Duration::from_secs(z.leeway_secs);
        if leeway > MAX_LEEWAY {
            return Err(format!(
                "zitadel.leeway_secs must be at most {}",
                MAX_LEEWAY.as_secs()
            ));
        }
        if z.issuer.is_empty() || z.audience.is_empty() || z.device_id_claim.is_empty() {
            return Err("zitadel.issuer, audience and device_id_claim must not be empty".into());
        }
        if !(100..=30_000).contains(&z.jwks_timeout_ms) {
            return Err("zitadel.jwks_timeout_ms must be within 100..=30000".into());
        }
        if !(1024..=1024 * 1024).contains(&z.jwks_max_bytes) {
            return Err("zitadel.jwks_max_bytes must be within 1024..=1048576".into());
        }
        let mut extra_roots = Vec::new();
        if let Some(p) = &z.jwks_ca_file {
            let pem = read_bounded(p, 1024 * 1024, "zitadel.jwks_ca_file")?;
            for item in ureq::tls::parse_pem(&pem) {
                if let Ok(ureq::tls::PemItem::Certificate(c)) = item {
                    extra_roots.push(c.der().to_vec());
                }
            }
            if extra_roots.is_empty() {
                return Err(format!(
                    "zitadel.jwks_ca_file {}: no certificate",
                    p.display()
                ));
            }
        }
        if !(1..=4096).contains(&raw.max_concurrent) {
            return Err("max_concurrent must be within 1..=4096".into());
        }
        let device_api = match raw.device_api {
            Some(d) => Some(DeviceApiSettings {
                password: {
                    let p = read_secret(&d.password_file, "device_api.password_file")?;
                    fleet_kit::nats_password::refuse_placeholder(
                        &p,
                        &format!("device_api.password_file {}", d.password_file.display()),
                    )?;
                    p
                },
                fleet_password: {
                    let p = read_secret(&d.fleet_password_file, "device_api.fleet_password_file")?;
                    fleet_kit::nats_password::refuse_placeholder(
                        &p,
                        &format!(
                            "device_api.fleet_password_file {}",
                            d.fleet_password_file.display()
                        ),
                    )?;
                    p
                },
                user: d.user,
                fleet_user: d.fleet_user,
            }),
            // In an account of their own, devices write and watch through the device API only.
            None if raw.account != "$G" => {
                return Err(format!(
                    "device_api is required when devices are placed in account {} (docs/auth.md)",
                    raw.account
                ))
            }
            None => None,
        };
        let flood_guard = match raw.flood_guard {
            None => None,
            Some(_) if device_api.is_none() => {
                return Err(
                    "flood_guard needs device_api (its reports reach the operator through the buckets' user)"
                        .into(),
                )
            }
            Some(g) => Some(flood_guard(g)?),
        };
        Ok(Settings {
            url: raw.nats.url,
            user: raw.nats.user,
            password,
            tls,
            issuer,
            xkey,
            account: raw.account,
            policy: Policy {
                issuer: z.issuer,
                audience: z.audience,
                device_claim: z.device_id_claim,
                leeway,
            },
            jwks: JwksSettings {
                url: z.jwks_url,
                extra_roots,
                timeout: Duration::from_millis(z.jwks_timeout_ms),
                max_bytes: z.jwks_max_bytes,
                min_refresh: Duration::from_secs(z.jwks_min_refresh_secs),
                max_age: Duration::from_secs(z.jwks_max_age_secs.max(1)),
            },
            max_concurrent: raw.max_concurrent,
            device_api,
            flood_guard,
        })
    }
}

fn flood_guard(g: RawFloodGuard) -> Result<super::flood_guard::GuardSettings, String> {
    let password = read_secret(&g.password_file, "flood_guard.password_file")?;
    fleet_kit::nats_password::refuse_placeholder(
        &password,
        &format!("flood_guard.password_file {}", g.password_file.display()),
    )?;
    if !(10..=1_000_000).contains(&g.max_msgs_per_sec) {
        return Err("flood_guard.max_msgs_per_sec must be within 10..=1000000".into());
    }
    if !(16..=1_000_000).contains(&g.max_subscriptions) {
        return Err("flood_guard.max_subscriptions must be within 16..=1000000".into());
    }
    if !(1..=60).contains(&g.burst_secs) {
        return Err("flood_guard.burst_secs must be within 1..=60".into());
    }
    if !(64 * 1024..=1 << 40).contains(&g.max_bytes_out_per_sec)
        || !(64 * 1024..=1 << 40).contains(&g.max_pending_bytes)
    {
        return Err(
            "flood_guard.max_bytes_out_per_sec and max_pending_bytes must be within 65536..=1099511627776".into(),
        );
    }
    if !(1..=1_000).contains(&g.max_connections) {
        return Err("flood_guard.max_connections must be within 1..=1000".into());
    }
    if !(1..=1_000).contains(&g.connects_burst) || !(1..=3_600).contains(&g.connect_every_secs) {
        return Err(
            "flood_guard.connects_burst must be within 1..=1000 and connect_every_secs within 1..=3600".into(),
        );
    }
    if !(1..=86_400).contains(&g.cooldown_secs)
        || !(g.cooldown_secs..=7 * 86_400).contains(&g.max_cooldown_secs)
    {
        return Err(
            "flood_guard.cooldown_secs must be within 1..=86400 and max_cooldown_secs within cooldown_secs..=604800"
                .into(),
        );
    }
    if !(250..=60_000).contains(&g.interval_ms) {
        return Err("flood_guard.interval_ms must be within 250..=60000".into());
    }
    Ok(super::flood_guard::GuardSettings {
        user: g.user,
        password,
        budget: super::flood::Budget {
            max_msgs_per_sec: g.max_msgs_per_sec,
            burst_secs: g.burst_secs,
            max_bytes_out_per_sec: g.max_bytes_out_per_sec,
            max_pending_bytes: g.max_pending_bytes,
            max_subscriptions: g.max_subscriptions,
            max_connections: g.max_connections,
            connects_burst: g.connects_burst,
            connect_every_secs: g.connect_every_secs,
            cooldown_secs: g.cooldown_secs,
            max_cooldown_secs: g.max_cooldown_secs,
        },
        interval: Duration::from_millis(g.interval_ms),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endless_secret_file_is_refused_at_the_bound() {
        // A FIFO or a device sizes as 0 bytes: the bound must hold while reading, not only by the file's size.
        let e = read_bounded(Path::new("/dev/zero"), MAX_SECRET_BYTES, "password_file")
            .expect_err("endless");
        assert!(e.starts_with("password_file /dev/zero: larger than"), "{e}");
    }

    /// A config with the secrets it names written to `dir`, and `extra` appended.
    fn load(dir: &Path, extra: &str) -> Result<Settings, String> {
        let seed = nkeys::KeyPair::new_account().seed().unwrap();
        for (name, text) in [
            ("pw", "servicePw1"),
            ("seed", seed.as_str()),
            ("guard", "guardPw2"),
            ("placeholder", "$FLOOD_GUARD_PASSWORD"),
        ] {
            std::fs::write(dir.join(name), text).unwrap();
        }
        let d = dir.display();
        let text = format!(
            "nats: {{url: \"nats://127.0.0.1:4222\", user: fleet-auth, password_file: \"{d}/pw\"}}\n\
             issuer_seed_file: \"{d}/seed\"\n\
             zitadel: {{issuer: \"https://z\", audience: \"a\", jwks_url: \"https://z/keys\"}}\n{extra}"
        );
        let raw: RawConfig = serde_yaml_ng::from_str(&text).map_err(|e| e.to_string())?;
        Settings::from_raw(raw)
    }

    const API: &str = "device_api: {user: api, password_file: \"DIR/pw\", fleet_user: kv, fleet_password_file: \"DIR/pw\"}\n";

    #[test]
    fn the_flood_guard_is_checked_and_defaults_are_written_down() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display().to_string();
        let api = API.replace("DIR", &d);
        let guard = |more: &str| {
            format!("{api}flood_guard: {{user: sys, password_file: \"{d}/guard\"{more}}}\n")
        };
        let guard = |more: &str| format!("account: DEVICES\n{}", guard(more));
        let s = load(dir.path(), &guard("")).expect("defaults");
        let g = s.flood_guard.expect("on");
        assert_eq!(
            g.budget,
            crate::flood::Budget {
                max_msgs_per_sec: 500,
                burst_secs: 2,
                max_bytes_out_per_sec: 8 << 20,
                max_pending_bytes: 8 << 20,
                max_subscriptions: 64,
                max_connections: 4,
                connects_burst: 5,
                connect_every_secs: 10,
                cooldown_secs: 60,
                max_cooldown_secs: 3600,
            }
        );
        assert_eq!(
            (g.interval, g.user.as_str(), g.password.as_str()),
            (Duration::from_millis(500), "sys", "guardPw2")
        );
        assert!(
            load(dir.path(), &api).unwrap().flood_guard.is_none(),
            "off unless configured"
        );
        for (more, why) in [
            (", max_msgs_per_sec: 5", "max_msgs_per_sec"),
            (", cooldown_secs: 0", "cooldown_secs"),
            (
                ", cooldown_secs: 600, max_cooldown_secs: 60",
                "cooldown_secs",
            ),
            (", interval_ms: 10", "interval_ms"),
            (", max_subscriptions: 2", "max_subscriptions"),
            (", burst_secs: 0", "burst_secs"),
            (", max_pending_bytes: 10", "max_pending_bytes"),
            (", max_connections: 0", "max_connections"),
            (", connect_every_secs: 0", "connect_every_secs"),
        ] {
            let e = load(dir.path(), &guard(more)).err().unwrap_or_default();
            assert!(e.contains(why), "{more}: {e}");
        }
        let e = load(dir.path(), &guard("").replace("/guard", "/placeholder"))
            .err()
            .unwrap_or_default();
        assert!(e.contains("placeholder"), "{e}");
        let alone = format!("flood_guard: {{user: sys, password_file: \"{d}/guard\"}}\n");
        let e = load(dir.path(), &alone).err().unwrap_or_default();
        assert!(e.contains("flood_guard needs device_api"), "{e}");
    }

    /// docs/auth.md's fleet-auth configuration, copied verbatim (only its directory moved to a temporary one, with
    /// the secret files it names), is accepted as documented: a person who copies it gets what it says.
    #[test]
    fn the_documented_configuration_is_accepted_verbatim() {
        let doc = include_str!("../../../docs/auth.md");
        let section = &doc[doc
            .find("## fleet-auth configuration")
            .expect("the section")..];
        let start = section.find("```yaml\n").expect("its yaml block") + "```yaml\n".len();
        let block = &section[start..start + section[start..].find("```").expect("block end")];
        let dir = tempfile::tempdir().unwrap();
        let seed = nkeys::KeyPair::new_account().seed().unwrap();
        for (name, text) in [
            ("nats-password", "servicePw1"),
            ("issuer.nk", seed.as_str()),
            ("device-api-password", "apiPw3"),
            ("device-kv-password", "kvPw4"),
            ("flood-guard-password", "guardPw2"),
        ] {
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        let text = block.replace("/etc/fleet-auth/", &format!("{}/", dir.path().display()));
        let raw: RawConfig = serde_yaml_ng::from_str(&text).expect("the documented YAML parses");
        let s = Settings::from_raw(raw).expect("the documented configuration is accepted");
        assert_eq!(s.url, "tls://nats.fleet:4222");
        assert_eq!(
            (s.user.as_str(), s.password.as_str()),
            ("fleet-auth", "servicePw1")
        );
        assert!(s.tls.ca_file.is_some(), "the server's CA is named");
        assert_eq!(s.account, "DEVICES");
        let api = s.device_api.expect("device API on");
        assert_eq!(
            (api.user.as_str(), api.fleet_user.as_str()),
            ("fleet-device-api", "fleet-device-kv")
        );
        let g = s.flood_guard.expect("flood guard on");
        assert_eq!(
            (g.user.as_str(), g.budget.max_msgs_per_sec),
            ("fleet-auth-system", 500)
        );
        assert_eq!(s.max_concurrent, 256);
    }
}
