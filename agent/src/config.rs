//! The agent's configuration file (TOML): typed and validated; keys this release does not know are ignored with a
//! warning each, so a file written for a newer release still starts a rolled-back one. See `docs/agent-config.md`.

use fleet_wire::limits::{NATS_CONNECT_ATTEMPT_TIMEOUT, NATS_RETRY_WINDOW};
use fleet_wire::DeviceId;
use serde::Deserialize;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where the agent reads its configuration unless `--config` says otherwise.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/harmony-fleet/agent.toml";
/// How long start-up waits for missing buckets unless `nats.bucket_wait_secs` says otherwise: long enough for an
/// operator to create them, short enough that a process whose connection went stale meanwhile is replaced.
pub const BUCKET_WAIT_DEFAULT: Duration = Duration::from_secs(600);
/// Largest configuration file read, in bytes.
pub const CONFIG_MAX_BYTES: u64 = 64 * 1024;

/// A secret string (password, token): never printed, not even by `Debug`.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// The secret value, for handing to the NATS client only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// How the agent authenticates to NATS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NatsAuth {
    /// No credentials (tests, a local server).
    None,
    /// User and password.
    UserPassword {
        /// The user.
        user: String,
        /// The password.
        password: Secret,
    },
    /// A token.
    Token(Secret),
    /// A token read from this file on every connect and reconnect (the device's Zitadel token, checked by the
    /// fleet-auth callout), so a token rotated on disk is used without a restart.
    TokenFile(PathBuf),
}

/// TLS of the NATS connection. Verification of the server is always on; there is no option to turn it off.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NatsTls {
    /// PEM file of the CA(s) the server's certificate must chain to (replaces the system roots); `None`: the
    /// system roots, for `tls://` URLs.
    pub ca_file: Option<PathBuf>,
    /// A client certificate shown to a server that verifies clients (mTLS).
    pub client: Option<ClientCert>,
}

impl NatsTls {
    /// True when nothing is configured (plain `nats://` allowed; `tls://` URLs still use TLS).
    pub fn is_off(&self) -> bool {
        self.ca_file.is_none() && self.client.is_none()
    }
}

/// A client certificate and its key (PEM files).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCert {
    /// The certificate chain.
    pub cert_file: PathBuf,
    /// Its private key.
    pub key_file: PathBuf,
}

/// NATS settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatsConfig {
    /// Server URLs, tried in turn.
    pub urls: Vec<String>,
    /// Credentials.
    pub auth: NatsAuth,
    /// TLS; any of its files set means TLS is required.
    pub tls: NatsTls,
    /// This device's reply-inbox prefix (`_INBOX.device.<device-id>`), derived from the device id.
    pub inbox_prefix: String,
    /// This device (its keys are the only ones its NATS calls name).
    pub device_id: DeviceId,
    /// One connection attempt (at most 15 s).
    pub connect_timeout: Duration,
    /// Window within which attempts are retried before giving up (at most 3 min).
    pub retry_window: Duration,
    /// How long start-up waits for buckets that do not exist yet before it exits 1 (systemd restarts it).
    pub bucket_wait: Duration,
}

/// The validated configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// This device.
    pub device_id: DeviceId,
    /// Root prefix every managed path derives from (`/` on a device).
    pub root: PathBuf,
    /// NATS.
    pub nats: NatsConfig,
    /// Whether the agent manages Podman workloads.
    pub podman_enabled: bool,
    /// The libpod REST API socket.
    pub podman_socket: PathBuf,
    /// Seconds Podman waits for a container to stop before killing it.
    pub podman_stop_timeout: Duration,
    /// The updater's socket.
    pub updater_socket: PathBuf,
    /// Heartbeat interval.
    pub heartbeat_interval: Duration,
    /// Workload status interval.
    pub status_interval: Duration,
    /// Full re-read of the desired state and reconcile, besides the watch.
    pub resync_interval: Duration,
    /// How often the updater's status is polled while an upgrade is active.
    pub updater_poll_interval: Duration,
    /// Keys of the file this release does not know (`nats.foo`), ignored: a file written for a newer release
    /// must still start this one after a rollback. [`Config::load`] logs one warning for each.
    pub ignored_keys: Vec<String>,
}

#[derive(Deserialize)]
struct RawConfig {
    device_id: String,
    #[serde(default)]
    root: Option<PathBuf>,
    nats: RawNats,
    #[serde(default)]
    podman: RawPodman,
    #[serde(default)]
    updater: RawUpdater,
    #[serde(default)]
    intervals: RawIntervals,
    /// Keys this release does not know (collected, warned about, otherwise ignored).
    #[serde(flatten)]
    unknown: toml::Table,
}

#[derive(Deserialize)]
struct RawNats {
    urls: Vec<String>,
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    password: Option<Secret>,
    #[serde(default)]
    token: Option<Secret>,
    #[serde(default)]
    token_file: Option<PathBuf>,
    #[serde(default)]
    ca_file: Option<PathBuf>,
    #[serde(default)]
    cert_file: Option<PathBuf>,
    #[serde(default)]
    key_file: Option<PathBuf>,
    #[serde(default)]
    connect_timeout_secs: Option<u64>,
    #[serde(default)]
    retry_window_secs: Option<u64>,
    #[serde(default)]
    bucket_wait_secs: Option<u64>,
    /// Keys this release does not know (collected, warned about, otherwise ignored).
    #[serde(flatten)]
    unknown: toml::Table,
}

#[derive(Deserialize, Default)]
struct RawPodman {
    #[serde(default)]
    enabled: Option<bool>,
    #[serde(default)]
    socket: Option<PathBuf>,
    #[serde(default)]
    stop_timeout_secs: Option<u64>,
    /// Keys this release does not know (collected, warned about, otherwise ignored).
    #[serde(flatten)]
    unknown: toml::Table,
}

#[derive(Deserialize, Default)]
struct RawUpdater {
    #[serde(default)]
    socket: Option<PathBuf>,
    /// Keys this release does not know (collected, warned about, otherwise ignored).
    #[serde(flatten)]
    unknown: toml::Table,
}

#[derive(Deserialize, Default)]
struct RawIntervals {
    #[serde(default)]
    heartbeat_secs: Option<u64>,
    #[serde(default)]
    status_secs: Option<u64>,
    #[serde(default)]
    resync_secs: Option<u64>,
    #[serde(default)]
    updater_poll_ms: Option<u64>,
    /// Keys this release does not know (collected, warned about, otherwise ignored).
    #[serde(flatten)]
    unknown: toml::Table,
}

/// Why the configuration is unusable.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read configuration {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid TOML or has mistyped values.
    #[error("configuration {path} is invalid: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        message: String,
    },
    /// A value is out of range.
    #[error("configuration key `{key}` is invalid: {message}")]
    Invalid {
        /// The key.
        key: &'static str,
        /// What is wrong and what is allowed.
        message: String,
    },
}

fn invalid(key: &'static str, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key,
        message: message.into(),
    }
}

/// A device's NATS password user is its own: named as its `device_id` and never one of the fleet's services
/// users ([`fleet_wire::auth::SERVICE_USERS`]), whose password bypasses the auth callout and every per-device bound
/// (docs/agent-config.md). Refused at start with the setting named and the documented way in.
fn password_user(user: &str, device_id: &DeviceId) -> Result<(), ConfigError> {
    const WAY: &str = "a device authenticates with its own identity: set `token_file = \"/etc/harmony-fleet/nats-token\"` \
        (its Zitadel token, kept fresh by fleet-token; docs/auth.md, \"Enrolling a device\") and remove `user` and `password`";
    if fleet_wire::auth::SERVICE_USERS.contains(&user) {
        return Err(invalid(
            "nats.user",
            format!("\"{user}\" is a services user of the fleet's NATS server, whose password bypasses every per-device bound; {WAY}"),
        ));
    }
    if user != device_id.as_str() {
        return Err(invalid(
            "nats.user",
            format!("\"{user}\" is not this device's own user (a password user must be named as device_id \"{device_id}\"); {WAY}"),
        ));
    }
    Ok(())
}

fn secs(
    key: &'static str,
    v: Option<u64>,
    default: u64,
    min: u64,
    max: u64,
) -> Result<Duration, ConfigError> {
    let v = v.unwrap_or(default);
    if v < min || v > max {
        return Err(invalid(key, format!("{v} is outside {min}..={max}")));
    }
    Ok(Duration::from_secs(v))
}

/// The dotted names of `unknown`'s keys under `table` (`""` for the top level), sorted.
fn unknown_keys(table: &str, unknown: &toml::Table) -> Vec<String> {
    unknown
        .keys()
        .map(|k| {
            if table.is_empty() {
                k.clone()
            } else {
                format!("{table}.{k}")
            }
        })
        .collect()
}

impl Config {
    /// Reads and validates the file at `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let read_err = |source| ConfigError::Read {
            path: path.to_owned(),
            source,
        };
        let meta = std::fs::metadata(path).map_err(read_err)?;
        if meta.len() > CONFIG_MAX_BYTES {
            return Err(ConfigError::Parse {
                path: path.to_owned(),
                message: format!("larger than {CONFIG_MAX_BYTES} bytes"),
            });
        }
        let text = std::fs::read_to_string(path).map_err(read_err)?;
        let cfg = Self::parse(&text).map_err(|e| match e {
            ConfigError::Parse { message, .. } => ConfigError::Parse {
                path: path.to_owned(),
                message,
            },
            other => other,
        })?;
        for key in &cfg.ignored_keys {
            log::warn!(
                "configuration {}: unknown key `{key}` ignored (written for a newer release, or a typo)",
                path.display()
            );
        }
        Ok(cfg)
    }

    /// Parses and validates configuration text.
    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: PathBuf::new(),
            message: e.to_string(),
        })?;
        let device_id = DeviceId::try_from(raw.device_id.as_str())
            .map_err(|e| invalid("device_id", e.to_string()))?;
        let root = raw.root.unwrap_or_else(|| PathBuf::from("/"));
        if !root.is_absolute() {
            return Err(invalid("root", "must be an absolute path"));
        }
        let mut ignored_keys = unknown_keys("", &raw.unknown);
        for (table, unknown) in [
            ("nats", &raw.nats.unknown),
            ("podman", &raw.podman.unknown),
            ("updater", &raw.updater.unknown),
            ("intervals", &raw.intervals.unknown),
        ] {
            ignored_keys.extend(unknown_keys(table, unknown));
        }
        let n = raw.nats;
        if n.urls.is_empty() || n.urls.len() > 16 {
            return Err(invalid("nats.urls", "give 1 to 16 server URLs"));
        }
        for u in &n.urls {
            let ok = ["nats://", "tls://"].iter().any(|p| u.starts_with(p))
                && u.len() <= 512
                && !u.contains('@');
            if !ok {
                return Err(invalid(
                    "nats.urls",
                    "each URL must be nats://host:port or tls://host:port, without credentials (use user/password or token)",
                ));
            }
        }
        let auth = match (n.user, n.password, n.token, n.token_file) {
            (None, None, None, None) => NatsAuth::None,
            (Some(user), Some(password), None, None) if !user.is_empty() => {
                password_user(&user, &device_id)?;
                NatsAuth::UserPassword { user, password }
            }
            (None, None, Some(t), None) if !t.expose().is_empty() => NatsAuth::Token(t),
            (None, None, None, Some(p)) if p.is_absolute() => NatsAuth::TokenFile(p),
            (None, None, None, Some(_)) => {
                return Err(invalid("nats.token_file", "must be an absolute path"))
            }
            _ => return Err(invalid(
                "nats",
                "set either `user` and `password`, or `token`, or `token_file`, or none of them",
            )),
        };
        for (key, p) in [
            ("nats.ca_file", &n.ca_file),
            ("nats.cert_file", &n.cert_file),
            ("nats.key_file", &n.key_file),
        ] {
            if p.as_ref().is_some_and(|p| !p.is_absolute()) {
                return Err(invalid(key, "must be an absolute path"));
            }
        }
        let client = match (n.cert_file, n.key_file) {
            (Some(cert_file), Some(key_file)) => Some(ClientCert {
                cert_file,
                key_file,
            }),
            (None, None) => None,
            _ => return Err(invalid(
                "nats",
                "cert_file and key_file go together (a client certificate and its key, for mTLS)",
            )),
        };
        let nats = NatsConfig {
            urls: n.urls,
            auth,
            tls: NatsTls {
                ca_file: n.ca_file,
                client,
            },
            inbox_prefix: fleet_wire::auth::device_inbox_prefix(&device_id),
            device_id: device_id.clone(),
            connect_timeout: secs(
                "nats.connect_timeout_secs",
                n.connect_timeout_secs,
                NATS_CONNECT_ATTEMPT_TIMEOUT.as_secs(),
                1,
                NATS_CONNECT_ATTEMPT_TIMEOUT.as_secs(),
            )?,
            retry_window: secs(
                "nats.retry_window_secs",
                n.retry_window_secs,
                NATS_RETRY_WINDOW.as_secs(),
                0,
                NATS_RETRY_WINDOW.as_secs(),
            )?,
            bucket_wait: secs(
                "nats.bucket_wait_secs",
                n.bucket_wait_secs,
                BUCKET_WAIT_DEFAULT.as_secs(),
                1,
                3600,
            )?,
        };
        let podman_socket = match raw.podman.socket {
            Some(p) if p.is_absolute() => p,
            Some(_) => return Err(invalid("podman.socket", "must be an absolute path")),
            // Rootless Podman of the user the agent runs as (fleet-agent on a device).
            // SAFETY: getuid has no preconditions and cannot fail.
            None => PathBuf::from(format!("/run/user/{}/podman/podman.sock", unsafe {
                libc::getuid()
            })),
        };
        let updater_socket = match raw.updater.socket {
            Some(p) if p.is_absolute() => p,
            Some(_) => return Err(invalid("updater.socket", "must be an absolute path")),
            None => crate::paths::Paths::new(&root).updater_socket(),
        };
        let i = raw.intervals;
        let poll_ms = i.updater_poll_ms.unwrap_or(2000);
        if !(100..=60_000).contains(&poll_ms) {
            return Err(invalid(
                "intervals.updater_poll_ms",
                format!("{poll_ms} is outside 100..=60000"),
            ));
        }
        Ok(Config {
            device_id,
            root,
            nats,
            podman_enabled: raw.podman.enabled.unwrap_or(true),
            podman_socket,
            podman_stop_timeout: secs(
                "podman.stop_timeout_secs",
                raw.podman.stop_timeout_secs,
                10,
                0,
                40,
            )?,
            updater_socket,
            heartbeat_interval: secs("intervals.heartbeat_secs", i.heartbeat_secs, 30, 1, 3600)?,
            status_interval: secs("intervals.status_secs", i.status_secs, 30, 1, 3600)?,
            resync_interval: secs("intervals.resync_secs", i.resync_secs, 60, 1, 3600)?,
            updater_poll_interval: Duration::from_millis(poll_ms),
            ignored_keys,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: &str = "device_id = \"device-1\"\n[nats]\nurls = [\"nats://127.0.0.1:4222\"]\n";

    #[test]
    fn minimal_config_gets_defaults() {
        let c = Config::parse(MIN).expect("valid");
        assert_eq!(c.root, PathBuf::from("/"));
        assert_eq!(
            c.updater_socket,
            PathBuf::from("/run/fleet-updater/updater.sock")
        );
        assert_eq!(c.nats.connect_timeout, Duration::from_secs(15));
        assert_eq!(c.nats.retry_window, Duration::from_secs(180));
        assert_eq!(c.nats.bucket_wait, Duration::from_secs(600));
        assert!(c.podman_enabled);
        assert_eq!(c.nats.auth, NatsAuth::None);
    }

    #[test]
    fn ignores_unknown_keys_and_rejects_bad_values() {
        let c = Config::parse(&format!(
            "colour = 1\n{MIN}compression = \"zstd\"\n[podman]\nenabled = false\npull_policy = \"never\"\n\
             [intervals]\nheartbeat_secs = 5\nmetrics_secs = 9\n[metrics]\nport = 9100\n"
        ))
        .expect("unknown keys are ignored");
        assert_eq!(
            c.ignored_keys,
            [
                "colour",
                "metrics",
                "nats.compression",
                "podman.pull_policy",
                "intervals.metrics_secs"
            ]
        );
        // The keys it knows beside them still apply.
        assert!(!c.podman_enabled);
        assert_eq!(c.heartbeat_interval, Duration::from_secs(5));
        assert!(Config::parse(MIN).expect("valid").ignored_keys.is_empty());
        // A known key with a wrong type is still an error.
        let e = Config::parse(&format!("{MIN}[podman]\nenabled = \"yes\"\n")).expect_err("type");
        assert!(matches!(e, ConfigError::Parse { .. }), "{e}");
        let e = Config::parse(&MIN.replace("device-1", "Device 1")).expect_err("id");
        assert!(e.to_string().contains("device_id"), "{e}");
        let e = Config::parse(&format!("{MIN}connect_timeout_secs = 60\n")).expect_err("range");
        assert!(e.to_string().contains("connect_timeout_secs"), "{e}");
        let e = Config::parse(&format!("{MIN}token = \"t\"\nuser = \"u\"\n")).expect_err("auth");
        assert!(e.to_string().contains("either"), "{e}");
        let e = Config::parse(&MIN.replace("nats://", "nats://u:p@")).expect_err("url creds");
        assert!(e.to_string().contains("credentials"), "{e}");
    }

    /// The package's example, copied verbatim, is the documented set-up: TLS with the private CA, the device's
    /// token from fleet-token (docs/packages.md, docs/auth.md).
    #[test]
    fn the_packaged_example_is_the_documented_tls_setup() {
        let text = include_str!("../../scripts/debian/harmony-fleet-device/examples/agent.toml");
        let c = Config::parse(text).expect("the example parses");
        assert!(c.ignored_keys.is_empty(), "{:?}", c.ignored_keys);
        assert!(
            c.nats.urls.iter().all(|u| u.starts_with("tls://")),
            "{:?}",
            c.nats.urls
        );
        assert_eq!(
            c.nats.auth,
            NatsAuth::TokenFile(PathBuf::from("/etc/harmony-fleet/nats-token"))
        );
        assert_eq!(
            c.nats.tls.ca_file.as_deref(),
            Some(Path::new("/etc/harmony-fleet/nats-ca.pem"))
        );
    }

    #[test]
    fn token_file_and_inbox() {
        let c = Config::parse(&format!(
            "{MIN}token_file = \"/etc/harmony-fleet/nats-token\"\n"
        ))
        .expect("valid");
        assert_eq!(
            c.nats.auth,
            NatsAuth::TokenFile(PathBuf::from("/etc/harmony-fleet/nats-token"))
        );
        assert_eq!(c.nats.inbox_prefix, "_INBOX.device.device-1");
        let e = Config::parse(&format!("{MIN}token_file = \"relative\"\n")).expect_err("rel");
        assert!(e.to_string().contains("token_file"), "{e}");
        let e =
            Config::parse(&format!("{MIN}token_file = \"/t\"\ntoken = \"x\"\n")).expect_err("both");
        assert!(e.to_string().contains("either"), "{e}");
    }

    #[test]
    fn tls_files() {
        let c = Config::parse(MIN).expect("valid");
        assert!(c.nats.tls.is_off());
        let c = Config::parse(&format!(
            "{MIN}ca_file = \"/etc/harmony-fleet/nats-ca.pem\"\ncert_file = \"/etc/harmony-fleet/device.crt\"\n\
             key_file = \"/etc/harmony-fleet/device.key\"\n"
        ))
        .expect("valid");
        assert_eq!(
            c.nats.tls,
            NatsTls {
                ca_file: Some(PathBuf::from("/etc/harmony-fleet/nats-ca.pem")),
                client: Some(ClientCert {
                    cert_file: PathBuf::from("/etc/harmony-fleet/device.crt"),
                    key_file: PathBuf::from("/etc/harmony-fleet/device.key"),
                }),
            }
        );
        for (bad, words) in [
            ("ca_file = \"ca.pem\"\n", "nats.ca_file"),
            ("cert_file = \"/c.pem\"\n", "go together"),
            ("key_file = \"/k.pem\"\n", "go together"),
        ] {
            let e = Config::parse(&format!("{MIN}{bad}")).expect_err(bad);
            assert!(e.to_string().contains(words), "{bad}: {e}");
        }
        // There is no key to turn verification off: one that looks like it is only ignored (with a warning).
        let c = Config::parse(&format!("{MIN}insecure_skip_verify = true\n")).expect("ignored");
        assert_eq!(c.ignored_keys, ["nats.insecure_skip_verify"]);
        assert!(c.nats.tls.is_off());
    }

    #[test]
    fn a_services_user_or_another_devices_user_is_refused() {
        for user in fleet_wire::auth::SERVICE_USERS {
            let e = Config::parse(&format!("{MIN}user = \"{user}\"\npassword = \"pw\"\n"))
                .expect_err(user)
                .to_string();
            assert!(
                e.contains("`nats.user`")
                    && e.contains("services user")
                    && e.contains("token_file"),
                "{user}: {e}"
            );
        }
        let e = Config::parse(&format!("{MIN}user = \"device-2\"\npassword = \"pw\"\n"))
            .expect_err("another device's user")
            .to_string();
        assert!(
            e.contains("not this device's own user") && e.contains("token_file"),
            "{e}"
        );
        // Its own user is accepted (a server with a password user per device, no callout).
        let c = Config::parse(&format!("{MIN}user = \"device-1\"\npassword = \"pw\"\n"))
            .expect("its own user");
        assert!(matches!(c.nats.auth, NatsAuth::UserPassword { .. }));
    }

    #[test]
    fn secrets_are_not_printed() {
        let c = Config::parse(&format!(
            "{MIN}user = \"device-1\"\npassword = \"hunter2\"\n"
        ))
        .expect("valid");
        let shown = format!("{c:?}");
        assert!(!shown.contains("hunter2") && shown.contains("<redacted>"));
    }
}
