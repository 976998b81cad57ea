//! The updater's configuration file (TOML, typed, validated; keys this release does not know are ignored with a
//! warning each, so a file written for a newer release, by its device setup, still starts this one).

use fleet_wire::fetch::MAX_BYTES_PER_SEC_FLOOR;
use fleet_wire::{DeviceId, UnitName};
use serde::Deserialize;
use std::num::NonZeroU64;
use std::path::{Path, PathBuf};

/// Where the configuration lives by default.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/harmony-fleet/updater.toml";
/// Largest configuration file read, in bytes.
pub const CONFIG_MAX_BYTES: u64 = 64 * 1024;

/// The file as written; every key optional.
#[derive(Debug, Default, Deserialize)]
struct RawConfig {
    root: Option<PathBuf>,
    device_id: Option<String>,
    extra_ca_file: Option<PathBuf>,
    agent_unit: Option<String>,
    agent_user: Option<String>,
    socket_group: Option<String>,
    system_reboot_retry_secs: Option<u64>,
    /// Read as any value so that a string or a fraction gets a message saying what is expected.
    download_max_bytes_per_sec: Option<toml::Value>,
    /// Keys this release does not know (collected, warned about, otherwise ignored).
    #[serde(flatten)]
    unknown: toml::Table,
}

/// The validated configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Root prefix of every managed path (`/` on a device).
    pub root: PathBuf,
    /// This device's id (device setup writes it): attempts for another device are refused. `None` only in
    /// configurations written before device setup did so; then the agent's check is the only one.
    pub device_id: Option<DeviceId>,
    /// PEM file of extra CA certificates trusted for artifact downloads, besides the system roots.
    pub extra_ca_file: Option<PathBuf>,
    /// The agent's systemd unit.
    pub agent_unit: UnitName,
    /// The user the candidate's `--self-test` runs as.
    pub agent_user: String,
    /// The group admitted to the socket (besides root).
    pub socket_group: String,
    /// Time between coordinated-reboot runs while a system upgrade waits for its reboot.
    pub system_reboot_retry: std::time::Duration,
    /// Bandwidth cap of the agent-artifact download (the `fleet-fetch` helper's reads of the artifact's body), in
    /// bytes per second; `None` (the key absent or 0): no cap. At least [`MAX_BYTES_PER_SEC_FLOOR`].
    pub download_max_bytes_per_sec: Option<NonZeroU64>,
    /// Keys of the file this release does not know, ignored; [`Config::load`] logs one warning for each.
    pub ignored_keys: Vec<String>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            root: PathBuf::from("/"),
            device_id: None,
            extra_ca_file: None,
            agent_unit: UnitName::try_from("fleet-agent.service")
                .unwrap_or_else(|_| unreachable!("a valid literal unit name")),
            agent_user: "fleet-agent".into(),
            socket_group: "fleet-agent".into(),
            system_reboot_retry: crate::system::upgrade::REBOOT_RETRY,
            download_max_bytes_per_sec: None,
            ignored_keys: Vec::new(),
        }
    }
}

/// The configuration could not be used.
#[derive(Debug, thiserror::Error)]
#[error("configuration {path}: {why}")]
pub struct ConfigError {
    path: String,
    why: String,
}

fn account_name_ok(s: &str) -> bool {
    let mut chars = s.chars();
    s.len() <= 32
        && chars
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
}

/// `download_max_bytes_per_sec`: a whole number of bytes per second, 0 for no cap, else at least the floor.
fn max_bytes_per_sec(v: &toml::Value) -> Result<Option<NonZeroU64>, String> {
    const KEY: &str = "download_max_bytes_per_sec";
    let expected = format!(
        "a whole number of bytes per second: 0 for no cap, else at least {MAX_BYTES_PER_SEC_FLOOR} (1 KiB/s); 262144 is 256 KiB/s"
    );
    let n = match v {
        toml::Value::Integer(n) => *n,
        other => return Err(format!("{KEY} {other} is not {expected}")),
    };
    let n = u64::try_from(n).map_err(|_| format!("{KEY} {n} is not {expected}"))?;
    if n != 0 && n < MAX_BYTES_PER_SEC_FLOOR {
        return Err(format!(
            "{KEY} {n} is below the floor of {MAX_BYTES_PER_SEC_FLOOR} bytes per second (the unit is bytes per second, not kbit/s or KiB/s); {expected}"
        ));
    }
    Ok(NonZeroU64::new(n))
}

impl Config {
    /// Parses and validates TOML text; `origin` names the file in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Self, ConfigError> {
        let fail = |why: String| ConfigError {
            path: origin.into(),
            why,
        };
        let raw: RawConfig = toml::from_str(text).map_err(|e| fail(e.to_string()))?;
        let mut c = Config {
            ignored_keys: raw.unknown.keys().cloned().collect(),
            ..Config::default()
        };
        if let Some(root) = raw.root {
            if !root.is_absolute() {
                return Err(fail(format!(
                    "root {} must be an absolute path",
                    root.display()
                )));
            }
            c.root = root;
        }
        if let Some(id) = raw.device_id {
            c.device_id =
                Some(DeviceId::try_from(id).map_err(|e| fail(format!("device_id: {e}")))?);
        }
        if let Some(ca) = raw.extra_ca_file {
            if !ca.is_absolute() {
                return Err(fail(format!(
                    "extra_ca_file {} must be an absolute path",
                    ca.display()
                )));
            }
            c.extra_ca_file = Some(ca);
        }
        if let Some(unit) = raw.agent_unit {
            c.agent_unit =
                UnitName::try_from(unit).map_err(|e| fail(format!("agent_unit: {e}")))?;
            if !c.agent_unit.as_str().ends_with(".service") {
                return Err(fail("agent_unit must name a .service unit".into()));
            }
        }
        if let Some(secs) = raw.system_reboot_retry_secs {
            if !(1..=3600).contains(&secs) {
                return Err(fail(format!(
                    "system_reboot_retry_secs {secs} must be between 1 and 3600"
                )));
            }
            c.system_reboot_retry = std::time::Duration::from_secs(secs);
        }
        if let Some(v) = raw.download_max_bytes_per_sec {
            c.download_max_bytes_per_sec = max_bytes_per_sec(&v).map_err(fail)?;
        }
        for (key, value, slot) in [
            ("agent_user", raw.agent_user, &mut c.agent_user),
            ("socket_group", raw.socket_group, &mut c.socket_group),
        ] {
            if let Some(v) = value {
                if !account_name_ok(&v) {
                    return Err(fail(format!(
                        "{key} {v:?} is not a user/group name ([a-z_][a-z0-9_-]*, at most 32)"
                    )));
                }
                *slot = v;
            }
        }
        Ok(c)
    }

    /// Reads and validates the file at `path`. A missing file at the default path means the defaults.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let origin = path.display().to_string();
        let fail = |why: String| ConfigError {
            path: origin.clone(),
            why,
        };
        let meta = match std::fs::metadata(path) {
            Ok(m) => m,
            Err(e)
                if e.kind() == std::io::ErrorKind::NotFound
                    && path == Path::new(DEFAULT_CONFIG_PATH) =>
            {
                return Ok(Config::default())
            }
            Err(e) => return Err(fail(e.to_string())),
        };
        if meta.len() > CONFIG_MAX_BYTES {
            return Err(fail(format!("larger than {CONFIG_MAX_BYTES} bytes")));
        }
        let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
        let c = Self::parse(&text, &origin)?;
        for key in &c.ignored_keys {
            log::warn!(
                "configuration {origin}: unknown key `{key}` ignored (written for a newer release, or a typo)"
            );
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_validates_and_ignores_unknown_keys() {
        let c = Config::parse(
            "root = \"/tmp/x\"\ndevice_id = \"device-1\"\nextra_ca_file = \"/etc/ca.pem\"\nagent_unit = \"a.service\"\nagent_user = \"agent\"\n",
            "t",
        )
        .expect("valid");
        assert_eq!(c.root, Path::new("/tmp/x"));
        assert_eq!(c.agent_unit.as_str(), "a.service");
        assert_eq!(c.socket_group, "fleet-agent");
        assert_eq!(c.device_id.as_ref().map(|d| d.as_str()), Some("device-1"));
        assert_eq!(
            Config::parse("system_reboot_retry_secs = 5", "t")
                .expect("valid")
                .system_reboot_retry,
            std::time::Duration::from_secs(5)
        );
        assert_eq!(Config::parse("", "t").expect("empty"), Config::default());
        for bad in [
            "root = \"relative\"",
            "agent_unit = \"x\"",
            "agent_unit = \"x.socket\"",
            "agent_user = \"Root;rm\"",
            "root = 3",
            "device_id = \"a b\"",
            "system_reboot_retry_secs = 0",
            "system_reboot_retry_secs = 9999",
        ] {
            assert!(Config::parse(bad, "t").is_err(), "{bad}");
        }
        let c = Config::parse(
            "rooot = \"/x\"\nagent_user = \"agent\"\n[reboot]\nwindow = \"Sun\"\n",
            "/etc/u.toml",
        )
        .expect("unknown keys are ignored");
        assert_eq!(c.ignored_keys, ["reboot", "rooot"]);
        assert_eq!(
            (c.root.as_path(), c.agent_user.as_str()),
            (Path::new("/"), "agent")
        );
        // A known key with a wrong type is still an error, with the key named.
        let e = Config::parse("socket_group = 5", "/etc/u.toml").expect_err("type");
        assert!(e.to_string().contains("socket_group"), "{e}");
    }

    #[test]
    fn download_cap_is_bytes_per_second_with_a_floor() {
        let cap = |text: &str| {
            Config::parse(text, "t").map(|c| c.download_max_bytes_per_sec.map(NonZeroU64::get))
        };
        assert_eq!(cap("").expect("absent"), None);
        assert_eq!(cap("download_max_bytes_per_sec = 0").expect("zero"), None);
        assert_eq!(
            cap("download_max_bytes_per_sec = 262144").expect("256 KiB/s"),
            Some(262_144)
        );
        assert_eq!(
            cap("download_max_bytes_per_sec = 1024").expect("the floor"),
            Some(1024)
        );
        for (bad, says) in [
            (
                "download_max_bytes_per_sec = 256",
                "below the floor of 1024",
            ),
            ("download_max_bytes_per_sec = -5", "is not a whole number"),
            (
                "download_max_bytes_per_sec = 2.5e5",
                "is not a whole number",
            ),
            (
                "download_max_bytes_per_sec = \"256 KiB\"",
                "is not a whole number",
            ),
        ] {
            let e = cap(bad).expect_err(bad).to_string();
            assert!(
                e.contains(says) && e.contains("download_max_bytes_per_sec"),
                "{bad}: {e}"
            );
        }
    }
}
