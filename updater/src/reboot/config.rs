//! The reboot client's config: the prototype's YAML keys (`server`, `group`, `window`, `timeout`,
//! `require_hosts`, `range`, `allow_degraded`) plus `token`, `ca_file`, `health_wait` and `root`.

use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Default config path; the timer's service only runs when it exists.
pub const DEFAULT_CONFIG: &str = "/etc/harmony-fleet/fleet-reboot.yaml";
/// Largest config file read, in bytes.
pub const MAX_CONFIG_BYTES: u64 = 256 * 1024;

/// The config file.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RebootConfig {
    /// FleetLock server base URL, e.g. `http://10.0.0.10:7450`.
    pub server: String,
    /// The group to name in requests (`default` if absent).
    #[serde(default = "default_group")]
    pub group: String,
    /// The reboot window; absent = any time.
    #[serde(default)]
    pub window: Option<WindowConfig>,
    /// Time-out of each remote check and of each request to the server, in seconds (default 2).
    #[serde(default = "default_timeout")]
    pub timeout: f64,
    /// `host:port` (must accept TCP) or `http(s)://…` (must answer 2xx).
    #[serde(default)]
    pub require_hosts: Vec<String>,
    /// At least `min_up` hosts of `cidr` must accept TCP on `port`.
    #[serde(default)]
    pub range: Option<RangeConfig>,
    /// Whether `degraded` counts as healthy.
    #[serde(default)]
    pub allow_degraded: bool,
    /// Optional bearer token for the server.
    #[serde(default)]
    pub token: Option<String>,
    /// PEM file of the CA(s) that issued an `https://` server's certificate, trusted besides the system roots
    /// (a fleet's private CA).
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// How long to wait for health after a reboot before giving up until the next run, in seconds (default 300).
    #[serde(default = "default_health_wait")]
    pub health_wait: f64,
    /// Root prefix of every path (tests point it at a temporary directory).
    #[serde(default = "default_root")]
    pub root: PathBuf,
}

/// A weekly window in a time zone: the shared maintenance window ([`fleet_wire::window`]) in the config's YAML
/// keys; [`super::window::Window::from_config`] validates it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WindowConfig {
    /// IANA time zone, e.g. `Europe/Vienna` (default `UTC`).
    #[serde(default = "utc")]
    pub timezone: String,
    /// Days the window starts on: `mon` … `sun` or `monday` … `sunday` (default every day).
    #[serde(default)]
    pub days: Vec<String>,
    /// Start, `HH:MM` local time.
    pub start: String,
    /// End, `HH:MM` local time; before `start` means the window crosses midnight; equal to `start` is refused.
    pub end: String,
}

/// A CIDR range of neighbours.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RangeConfig {
    /// e.g. `10.0.0.0/24` (at most 1,024 addresses).
    pub cidr: String,
    /// TCP port that must answer.
    pub port: u16,
    /// How many hosts must answer.
    pub min_up: u32,
}

fn default_group() -> String {
    "default".into()
}
fn default_timeout() -> f64 {
    2.0
}
fn default_health_wait() -> f64 {
    300.0
}
fn default_root() -> PathBuf {
    PathBuf::from("/")
}
fn utc() -> String {
    "UTC".into()
}

/// A config that cannot be used; the text names the key (and, from [`RebootConfig::load`], the file).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error(transparent)]
    Read(#[from] crate::bounded::ReadError),
    /// The file (named) does not parse or is not valid.
    #[error("{}: {source}", path.display())]
    In {
        /// The config file.
        path: PathBuf,
        /// What is wrong in it.
        source: Box<ConfigError>,
    },
    /// Not YAML of this shape.
    #[error(transparent)]
    Yaml(#[from] serde_yaml_ng::Error),
    /// A duration out of its range.
    #[error("{what}: must be between 0 and {max} seconds")]
    Seconds {
        /// The key.
        what: &'static str,
        /// The largest value allowed.
        max: f64,
    },
    /// `range.cidr`.
    #[error(transparent)]
    Cidr(#[from] super::deps::CidrError),
    /// Any other key with a value that cannot be used: `key: why`.
    #[error("{0}")]
    Invalid(String),
}

fn secs(v: f64, what: &'static str, max: f64) -> Result<Duration, ConfigError> {
    if !(v.is_finite() && v > 0.0 && v <= max) {
        return Err(ConfigError::Seconds { what, max });
    }
    Ok(Duration::from_secs_f64(v))
}

impl RebootConfig {
    /// Parses and validates YAML text.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let invalid = ConfigError::Invalid;
        let c: RebootConfig = serde_yaml_ng::from_str(text)?;
        if !(c.server.starts_with("http://") || c.server.starts_with("https://")) {
            return Err(invalid(format!(
                "server: {:?} is not an http(s) URL",
                c.server
            )));
        }
        fleet_wire::fleetlock::validate_group(&c.group)
            .map_err(|e| invalid(format!("group: {e}")))?;
        if c.ca_file.as_ref().is_some_and(|p| !p.is_absolute()) {
            return Err(invalid("ca_file: must be an absolute path".into()));
        }
        c.timeout()?;
        c.health_wait()?;
        if c.require_hosts.len() > 64 {
            return Err(invalid("require_hosts: more than 64 entries".into()));
        }
        if let Some(w) = &c.window {
            super::window::Window::from_config(w).map_err(invalid)?;
        }
        if let Some(r) = &c.range {
            let n = super::deps::cidr_hosts(&r.cidr)?.len();
            if r.min_up as usize > n {
                return Err(invalid(format!(
                    "range.min_up: {} but {} has only {n} hosts",
                    r.min_up, r.cidr
                )));
            }
        }
        Ok(c)
    }

    /// Reads and parses a config file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = crate::bounded::read_text(path, MAX_CONFIG_BYTES)?;
        Self::parse(&text).map_err(|e| ConfigError::In {
            path: path.to_path_buf(),
            source: Box::new(e),
        })
    }

    /// The per-check time-out.
    pub fn timeout(&self) -> Result<Duration, ConfigError> {
        secs(self.timeout, "timeout", 60.0)
    }

    /// How long to wait for health after a reboot.
    pub fn health_wait(&self) -> Result<Duration, ConfigError> {
        secs(self.health_wait, "health_wait", 3600.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prototype_example_parses() {
        let c = RebootConfig::parse(
            r#"server: http://10.0.0.10:7450
group: default
window:
  timezone: UTC
  days: [mon, tue, wed, thu, fri, sat, sun]
  start: "02:00"
  end: "05:00"
timeout: 2
require_hosts:
  - 10.0.0.5:443
  - https://status.example.lan/health
range:
  cidr: 10.0.0.0/24
  port: 22
  min_up: 7
allow_degraded: false
"#,
        )
        .expect("parses");
        assert_eq!(c.timeout().ok(), Some(Duration::from_secs(2)));
        assert_eq!(c.range.map(|r| r.min_up), Some(7));
        assert_eq!(c.root, PathBuf::from("/"));
    }

    #[test]
    fn bad_configs_are_rejected() {
        for bad in [
            "server: 10.0.0.10:7450",
            "server: http://x\ngroup: 'a b'",
            "server: http://x\ntimeout: 0",
            "server: http://x\nwindow: {timezone: Mars/Base, start: '02:00', end: '03:00'}",
            "server: http://x\nwindow: {start: '25:00', end: '03:00'}",
            "server: http://x\nwindow: {days: [someday], start: '01:00', end: '03:00'}",
            "server: http://x\nwindow: {start: '03:00', end: '03:00'}",
            "server: http://x\nrange: {cidr: 10.0.0.0/8, port: 22, min_up: 1}",
            "server: http://x\nrange: {cidr: 10.0.0.0/30, port: 22, min_up: 3}",
            "server: http://x\nunknown: 1",
            "server: https://x\nca_file: ca.pem",
        ] {
            assert!(RebootConfig::parse(bad).is_err(), "{bad}");
        }
    }
}
