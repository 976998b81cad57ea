//! fleet-token's configuration (`/etc/harmony-fleet/fleet-token.yaml`): the Zitadel instance and project, an
//! optional extra CA, the request time-out, and the root every fixed path is under (tests point it elsewhere).

use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where the configuration is by default.
pub const DEFAULT_CONFIG: &str = "/etc/harmony-fleet/fleet-token.yaml";
/// The machine user's key file (Zitadel's key JSON), under `root`.
pub const KEY_FILE: &str = "etc/harmony-fleet/zitadel-key.json";
/// The device's NATS token (the agent's `[nats] token_file`), under `root`.
pub const TOKEN_FILE: &str = "etc/harmony-fleet/nats-token";
/// The largest configuration file read, in bytes.
const MAX_CONFIG_BYTES: u64 = 16 * 1024;
/// The longest project id accepted, in characters (Zitadel's are 18 digits).
const MAX_PROJECT_ID_CHARS: usize = 64;

/// The parsed configuration.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenConfig {
    /// The Zitadel instance, `https://…` (the token endpoint is `<issuer>/oauth/v2/token`; it is also the
    /// assertion's audience).
    pub issuer: String,
    /// The Zitadel project whose id becomes the token's audience (fleet-auth's `zitadel.audience`).
    pub project_id: String,
    /// An extra trusted CA (PEM) beside the system's roots.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// The whole request's time-out in seconds (default 15, at most 120).
    #[serde(default = "default_timeout")]
    pub timeout_secs: u64,
    /// The root the key and token paths are under (default `/`).
    #[serde(default = "default_root")]
    pub root: PathBuf,
}

fn default_timeout() -> u64 {
    15
}

fn default_root() -> PathBuf {
    PathBuf::from("/")
}

/// A config that cannot be used; the text names the key (and, from [`TokenConfig::load`], the file).
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
    /// A value that cannot be used: `key: why`.
    #[error("{0}")]
    Invalid(String),
}

impl TokenConfig {
    /// Parses and validates YAML text.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let invalid = ConfigError::Invalid;
        let c: TokenConfig = serde_yaml_ng::from_str(text)?;
        let host = c
            .issuer
            .strip_prefix("https://")
            .ok_or_else(|| invalid(format!("issuer: {:?} is not an https:// URL", c.issuer)))?;
        if host.is_empty()
            || host.contains(['?', '#', '@'])
            || host.chars().any(char::is_whitespace)
        {
            return Err(invalid(format!(
                "issuer: {:?} is not a plain https:// URL",
                c.issuer
            )));
        }
        if c.project_id.is_empty()
            || c.project_id.len() > MAX_PROJECT_ID_CHARS
            || !c
                .project_id
                .chars()
                .all(|ch| ch.is_ascii_alphanumeric() || ch == '-')
        {
            return Err(invalid(format!(
                "project_id: {:?} must be 1-{MAX_PROJECT_ID_CHARS} letters, digits or '-'",
                c.project_id
            )));
        }
        if !(1..=120).contains(&c.timeout_secs) {
            return Err(invalid("timeout_secs: must be between 1 and 120".into()));
        }
        if !c.root.is_absolute() {
            return Err(invalid("root: must be an absolute path".into()));
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

    /// The token endpoint, `<issuer>/oauth/v2/token`.
    pub fn token_endpoint(&self) -> String {
        format!("{}/oauth/v2/token", self.issuer.trim_end_matches('/'))
    }

    /// The assertion's audience: the issuer URL without a trailing slash.
    pub fn audience(&self) -> &str {
        self.issuer.trim_end_matches('/')
    }

    /// The scope asking for a token whose audience is the project.
    pub fn scope(&self) -> String {
        format!(
            "openid urn:zitadel:iam:org:project:id:{}:aud",
            self.project_id
        )
    }

    /// The machine key file.
    pub fn key_file(&self) -> PathBuf {
        self.root.join(KEY_FILE)
    }

    /// The NATS token file.
    pub fn token_file(&self) -> PathBuf {
        self.root.join(TOKEN_FILE)
    }

    /// The request time-out.
    pub fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout_secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minimal_config_and_derived_values() {
        let c = TokenConfig::parse(
            "issuer: https://zitadel.example.com/\nproject_id: \"284651234567890123\"\n",
        )
        .expect("parse");
        assert_eq!(
            c.token_endpoint(),
            "https://zitadel.example.com/oauth/v2/token"
        );
        assert_eq!(c.audience(), "https://zitadel.example.com");
        assert_eq!(
            c.scope(),
            "openid urn:zitadel:iam:org:project:id:284651234567890123:aud"
        );
        assert_eq!(
            c.token_file(),
            PathBuf::from("/etc/harmony-fleet/nats-token")
        );
        assert_eq!(
            c.key_file(),
            PathBuf::from("/etc/harmony-fleet/zitadel-key.json")
        );
        assert_eq!(c.timeout(), Duration::from_secs(15));
    }

    #[test]
    fn bad_configs_say_what_is_wrong() {
        for (text, want) in [
            ("issuer: http://z\nproject_id: p\n", "issuer"),
            ("issuer: https://\nproject_id: p\n", "issuer"),
            ("issuer: https://z?x=1\nproject_id: p\n", "issuer"),
            ("issuer: https://z\nproject_id: \"a b\"\n", "project_id"),
            (
                "issuer: https://z\nproject_id: p\ntimeout_secs: 0\n",
                "timeout_secs",
            ),
            ("issuer: https://z\nproject_id: p\nroot: rel\n", "root"),
            (
                "issuer: https://z\nproject_id: p\ntoken_file: /tmp/x\n",
                "unknown field",
            ),
        ] {
            let e = TokenConfig::parse(text).expect_err(text).to_string();
            assert!(e.contains(want), "{text}: {e}");
        }
    }
}
