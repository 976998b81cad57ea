//! The watchdog's configuration, `/etc/harmony-fleet/boot-watchdog.toml` (TOML, every key optional, unknown keys
//! rejected). When it runs is the timer's business (`OnActiveSec=` in `fleet-boot-watchdog.timer`).

use serde::Deserialize;
use std::path::{Path, PathBuf};

/// Where the configuration lives by default.
pub const DEFAULT_CONFIG: &str = "/etc/harmony-fleet/boot-watchdog.toml";
/// Largest configuration file read, in bytes.
pub const CONFIG_MAX_BYTES: u64 = 64 * 1024;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    reboot: Option<bool>,
    max_reboots: Option<u32>,
    window_hours: Option<u32>,
    root: Option<PathBuf>,
}

/// The validated configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchdogConfig {
    /// Reboot a host that is not up (after writing diagnostics). Default true.
    pub reboot: bool,
    /// At most this many watchdog reboots within `window_hours` (1–100, default 2).
    pub max_reboots: u32,
    /// The cap's window in hours (1–720, default 24).
    pub window_hours: u32,
    /// Root prefix of every path (tests point it at a temporary directory).
    pub root: PathBuf,
}

impl Default for WatchdogConfig {
    fn default() -> Self {
        Self {
            reboot: true,
            max_reboots: 2,
            window_hours: 24,
            root: PathBuf::from("/"),
        }
    }
}

/// A config that cannot be used; the text names the key (and, from [`WatchdogConfig::load`], the file).
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
    /// Not TOML of this shape.
    #[error(transparent)]
    Toml(#[from] toml::de::Error),
    /// A value out of its range: `key = value: why`.
    #[error("{0}")]
    Invalid(String),
}

impl WatchdogConfig {
    /// Parses and validates TOML text.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let invalid = ConfigError::Invalid;
        let raw: Raw = toml::from_str(text)?;
        let mut c = Self::default();
        if let Some(r) = raw.reboot {
            c.reboot = r;
        }
        if let Some(n) = raw.max_reboots {
            if !(1..=100).contains(&n) {
                return Err(invalid(format!("max_reboots = {n}: must be 1-100")));
            }
            c.max_reboots = n;
        }
        if let Some(h) = raw.window_hours {
            if !(1..=720).contains(&h) {
                return Err(invalid(format!("window_hours = {h}: must be 1-720")));
            }
            c.window_hours = h;
        }
        if let Some(r) = raw.root {
            if !r.is_absolute() {
                return Err(invalid(format!("root = {}: must be absolute", r.display())));
            }
            c.root = r;
        }
        Ok(c)
    }

    /// Reads `path`; a missing file at the default path means every default.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = match crate::bounded::read_text(path, CONFIG_MAX_BYTES) {
            Ok(text) => text,
            Err(e) if e.is_not_found() && path == Path::new(DEFAULT_CONFIG) => {
                return Ok(Self::default())
            }
            Err(e) => return Err(e.into()),
        };
        Self::parse(&text).map_err(|e| ConfigError::In {
            path: path.to_path_buf(),
            source: Box::new(e),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_values_and_refusals() {
        assert_eq!(
            WatchdogConfig::parse("").expect("empty"),
            WatchdogConfig::default()
        );
        let c = WatchdogConfig::parse("reboot = false\nmax_reboots = 1\nwindow_hours = 6\n")
            .expect("ok");
        assert!(!c.reboot);
        assert_eq!((c.max_reboots, c.window_hours), (1, 6));
        for (bad, why) in [
            ("max_reboots = 0", "1-100"),
            ("window_hours = 721", "1-720"),
            ("root = \"rel\"", "absolute"),
            ("reboots = 1", "unknown field"),
            ("reboot = \"yes\"", "invalid type"),
        ] {
            let e = WatchdogConfig::parse(bad).expect_err(bad).to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }
}
