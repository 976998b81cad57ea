//! Server configuration (YAML, the prototype's keys plus store, TTL and auth) and group membership.

use fleet_wire::fleetlock::{validate_group, DEFAULT_GROUP};
use serde::Deserialize;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Largest config file read, in bytes.
pub const MAX_CONFIG_BYTES: u64 = 1024 * 1024;
/// Most slots one group may have.
pub const MAX_SLOTS: u32 = 100_000;
/// Most groups.
pub const MAX_GROUPS: usize = 1024;
/// Default store directory.
pub const DEFAULT_DIR: &str = "/var/lib/fleetlock";
/// Default for `max_connections_per_client`: a host needs one or two; a proxy in front needs it raised.
pub const DEFAULT_CONNECTIONS_PER_CLIENT: usize = 64;

/// The whole config file.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Slots of group `default` (hosts in no group).
    #[serde(default = "one")]
    pub default_slots: u32,
    /// Named groups.
    #[serde(default)]
    pub groups: Vec<GroupConfig>,
    /// Where holders live.
    #[serde(default)]
    pub store: StoreConfig,
    /// Holders older than this lose their slot (off by default: a host that never returns keeps it).
    #[serde(default, with = "opt_duration")]
    pub ttl: Option<Duration>,
    /// Client and admin credentials (off by default).
    #[serde(default)]
    pub auth: AuthConfig,
    /// Audit log of admin releases and TTL expiries (JSON lines); default `<store dir>/audit.jsonl`.
    #[serde(default)]
    pub audit_log: Option<PathBuf>,
    /// Time a client has to send its request head, and then its body (default 10s).
    #[serde(default = "ten_seconds", with = "duration")]
    pub client_timeout: Duration,
    /// Every endpoint is served under this path as well as at the root (`/fleetlock` for a client base URL
    /// `https://host/fleetlock/`, e.g. behind a proxy); normalized without a trailing `/`, `None` for the root.
    #[serde(default)]
    pub path_prefix: Option<String>,
    /// Most connections one client (one IPv4 address, one IPv6 /64) may hold open at once; more are closed at
    /// once (default [`DEFAULT_CONNECTIONS_PER_CLIENT`]; behind a proxy every client is the proxy: raise it).
    #[serde(default = "connections_per_client")]
    pub max_connections_per_client: usize,
}

fn connections_per_client() -> usize {
    DEFAULT_CONNECTIONS_PER_CLIENT
}

/// Longest `path_prefix`.
pub const MAX_PATH_PREFIX: usize = 256;

/// `raw` as a path prefix: `/a/b` (no trailing `/`, no empty, `.` or `..` segment, URL-safe characters only);
/// `None` for the root.
fn path_prefix(raw: Option<&str>) -> Result<Option<String>, String> {
    let Some(raw) = raw else {
        return Ok(None);
    };
    let p = raw.trim_end_matches('/');
    if p.is_empty() {
        return Ok(None);
    }
    let bad = |why: &str| Err(format!("path_prefix {raw:?}: {why}"));
    if p.len() > MAX_PATH_PREFIX {
        return bad(&format!("longer than {MAX_PATH_PREFIX} bytes"));
    }
    let Some(rest) = p.strip_prefix('/') else {
        return bad("must start with / (e.g. /fleetlock)");
    };
    if let Some(c) = p
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "/-._~".contains(*c)))
    {
        return bad(&format!(
            "{c:?} is not allowed; use letters, digits, '/', '-', '.', '_' and '~'"
        ));
    }
    if rest
        .split('/')
        .any(|seg| seg.is_empty() || seg == "." || seg == "..")
    {
        return bad("has an empty, . or .. segment");
    }
    Ok(Some(p.to_owned()))
}

fn ten_seconds() -> Duration {
    Duration::from_secs(10)
}

fn one() -> u32 {
    1
}

/// One named group.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupConfig {
    /// Group name (`^[a-zA-Z0-9.-]+$`).
    pub name: String,
    /// How many members may hold a slot at once.
    pub slots: u32,
    /// Hostnames, IP addresses or machine ids (as the client sends them in `id`).
    #[serde(default)]
    pub members: Vec<String>,
}

/// Which store holds the truth.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum StoreConfig {
    /// A state file, fsynced before every answer.
    File {
        /// Directory of `state.json` (default `/var/lib/fleetlock`).
        #[serde(default = "default_dir")]
        dir: PathBuf,
    },
    /// NATS JetStream KV (bucket `fleetlock`, key = group) with compare-and-set: several replicas share it.
    Nats {
        /// Server URL(s), comma-separated.
        url: String,
        /// Optional NATS credentials file.
        #[serde(default)]
        credentials: Option<PathBuf>,
        /// TLS: PEM CA(s) the NATS server's certificate must chain to (any TLS file makes TLS required).
        #[serde(default)]
        ca_file: Option<PathBuf>,
        /// TLS: client certificate for a NATS server that verifies clients (mTLS), with `key_file`.
        #[serde(default)]
        cert_file: Option<PathBuf>,
        /// TLS: the client certificate's key.
        #[serde(default)]
        key_file: Option<PathBuf>,
        /// Copies of the `fleetlock` bucket when this server has to create it (1 to 5: 3 on a 3-node cluster);
        /// a bucket that exists keeps its own (`fleet-operator buckets --kv-replicas N` scales it).
        #[serde(default = "one_replica")]
        replicas: usize,
    },
}

fn one_replica() -> usize {
    1
}

fn default_dir() -> PathBuf {
    PathBuf::from(DEFAULT_DIR)
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self::File { dir: default_dir() }
    }
}

impl StoreConfig {
    /// The TLS of the NATS store (none for the file store); `Err` for a certificate without its key.
    pub fn nats_tls(&self) -> Result<fleet_kit::nats_tls::NatsTls, String> {
        match self {
            Self::File { .. } => Ok(Default::default()),
            Self::Nats {
                ca_file,
                cert_file,
                key_file,
                ..
            } => fleet_kit::nats_tls::NatsTls::new(
                ca_file.clone(),
                cert_file.clone(),
                key_file.clone(),
                "store.",
            ),
        }
    }

    /// `file` or `nats`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::File { .. } => "file",
            Self::Nats { .. } => "nats",
        }
    }
}

/// Credentials. Secrets are never logged or shown in status.
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    /// Bearer tokens any client may use.
    #[serde(default)]
    pub tokens: Vec<String>,
    /// Files holding one bearer token each (the package generates `/etc/fleetlock/client-token`); read with the
    /// config, their tokens join `tokens`. A missing, unreadable or empty file makes the config invalid.
    #[serde(default)]
    pub token_files: Vec<PathBuf>,
    /// Basic-auth pairs (Zincati sends them from `http://user:password@host/` in its base URL).
    #[serde(default)]
    pub basic: Vec<BasicCredential>,
    /// Bearer tokens for `POST /v1/admin/release` (no admin release without one).
    #[serde(default)]
    pub admin_tokens: Vec<String>,
}

impl std::fmt::Debug for AuthConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "AuthConfig {{ tokens: {}, token_files: {:?}, basic: {}, admin_tokens: {} }}",
            self.tokens.len(),
            self.token_files,
            self.basic.len(),
            self.admin_tokens.len()
        )
    }
}

/// One basic-auth pair.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BasicCredential {
    /// User name.
    pub username: String,
    /// Password.
    pub password: String,
}

impl Config {
    /// What the server warns about while this config is in force: logged at start, shown in `/v1/status`.
    pub fn warnings(&self) -> Vec<String> {
        let mut w = Vec::new();
        if !self.auth.clients_need_auth() {
            w.push(
                "client authentication is off (no auth.tokens, auth.token_files or auth.basic): anyone who reaches \
                 this server can take and give back reboot slots"
                    .to_string(),
            );
        }
        w
    }
}

impl AuthConfig {
    /// Whether clients must authenticate.
    pub fn clients_need_auth(&self) -> bool {
        !self.tokens.is_empty() || !self.basic.is_empty()
    }
}

mod duration {
    use serde::{Deserialize, Deserializer};
    use std::time::Duration;

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        humantime::parse_duration(&s).map_err(serde::de::Error::custom)
    }
}

mod opt_duration {
    use serde::{Deserialize, Deserializer};
    use std::time::Duration;

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        let s: Option<String> = Option::deserialize(d)?;
        s.map(|s| humantime::parse_duration(&s).map_err(serde::de::Error::custom))
            .transpose()
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            default_slots: 1,
            groups: Vec::new(),
            store: StoreConfig::default(),
            ttl: None,
            auth: AuthConfig::default(),
            audit_log: None,
            client_timeout: ten_seconds(),
            path_prefix: None,
            max_connections_per_client: DEFAULT_CONNECTIONS_PER_CLIENT,
        }
    }
}

/// The groups a request belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Membership {
    /// (group, slots), sorted by name.
    pub groups: Vec<(String, u32)>,
}

/// Largest token file read, in bytes.
pub const MAX_TOKEN_FILE_BYTES: u64 = 4096;

/// The token in `path`: its text without surrounding white space; an error names the file (never the token).
fn read_token_file(path: &Path) -> Result<String, String> {
    use std::io::Read;
    let what = format!("auth.token_files: {}", path.display());
    let f = std::fs::File::open(path).map_err(|e| format!("{what}: {e}"))?;
    let mut text = String::new();
    f.take(MAX_TOKEN_FILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| format!("{what}: {e}"))?;
    if text.len() as u64 > MAX_TOKEN_FILE_BYTES {
        return Err(format!("{what}: longer than {MAX_TOKEN_FILE_BYTES} bytes"));
    }
    let token = text.trim();
    if token.is_empty() {
        return Err(format!("{what}: empty"));
    }
    Ok(token.to_owned())
}

impl Config {
    /// Parses and validates YAML text (reading the files of `auth.token_files`).
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut c: Config = if text.trim().is_empty() {
            Config::default()
        } else {
            serde_yaml_ng::from_str(text).map_err(|e| e.to_string())?
        };
        c.path_prefix = path_prefix(c.path_prefix.as_deref())?;
        for f in &c.auth.token_files {
            let token = read_token_file(f)?;
            c.auth.tokens.push(token);
        }
        c.validate()?;
        Ok(c)
    }

    /// Reads and parses a config file (at most [`MAX_CONFIG_BYTES`]).
    pub fn load(path: &Path) -> Result<Self, String> {
        let text = read_bounded(path)?;
        Self::parse(&text)
    }

    fn validate(&self) -> Result<(), String> {
        if self.default_slots > MAX_SLOTS {
            return Err(format!("default_slots: more than {MAX_SLOTS}"));
        }
        if self.groups.len() > MAX_GROUPS {
            return Err(format!("groups: more than {MAX_GROUPS}"));
        }
        let mut names = BTreeSet::new();
        for (i, g) in self.groups.iter().enumerate() {
            validate_group(&g.name).map_err(|e| format!("groups[{i}].name: {e}"))?;
            if g.name == DEFAULT_GROUP {
                return Err(format!(
                    "groups[{i}]: `default` is configured with default_slots, not as a group"
                ));
            }
            if !names.insert(g.name.as_str()) {
                return Err(format!("groups[{i}]: duplicate group {:?}", g.name));
            }
            if g.slots > MAX_SLOTS {
                return Err(format!("groups[{i}].slots: more than {MAX_SLOTS}"));
            }
        }
        if let Some(t) = self.ttl {
            if t < Duration::from_secs(1) {
                return Err("ttl: shorter than 1s".into());
            }
        }
        if self.client_timeout < Duration::from_millis(100)
            || self.client_timeout > Duration::from_secs(300)
        {
            return Err("client_timeout: must be between 100ms and 5min".into());
        }
        let total = crate::server::MAX_CONNECTIONS;
        if !(1..=total).contains(&self.max_connections_per_client) {
            return Err(format!(
                "max_connections_per_client: {}: must be between 1 and {total}",
                self.max_connections_per_client
            ));
        }
        if let StoreConfig::Nats { url, replicas, .. } = &self.store {
            if url.trim().is_empty() {
                return Err("store.url: empty".into());
            }
            if let Some((_, password)) = fleet_wire::auth::split_nats_url(url).user_password {
                fleet_kit::nats_password::refuse_placeholder(&password, "store.url's password")?;
            }
            if !(1..=fleet_kit::nats::MAX_REPLICAS).contains(replicas) {
                return Err(format!(
                    "store.replicas: {replicas}: a bucket has 1 to {} replicas",
                    fleet_kit::nats::MAX_REPLICAS
                ));
            }
            self.store.nats_tls()?;
        }
        Ok(())
    }

    /// The slots of `group`, if it is configured (`default` always is).
    pub fn slots(&self, group: &str) -> Option<u32> {
        if group == DEFAULT_GROUP {
            return Some(self.default_slots);
        }
        self.groups
            .iter()
            .find(|g| g.name == group)
            .map(|g| g.slots)
    }

    /// Every configured group name, `default` first.
    pub fn group_names(&self) -> Vec<String> {
        std::iter::once(DEFAULT_GROUP.to_string())
            .chain(self.groups.iter().map(|g| g.name.clone()))
            .collect()
    }

    /// The groups of a client: every group listing its id, hostname or IP as a member, plus the group it named
    /// (unless that is `default`); `default` if none. `Err` names an unknown group.
    pub fn membership(
        &self,
        id: &str,
        hostname: Option<&str>,
        ip: &str,
        named: &str,
    ) -> Result<Membership, String> {
        let mut out = std::collections::BTreeMap::new();
        if named != DEFAULT_GROUP {
            let slots = self
                .slots(named)
                .ok_or_else(|| format!("group {named:?} is not configured on this server"))?;
            out.insert(named.to_string(), slots);
        }
        for g in &self.groups {
            let hit = g
                .members
                .iter()
                .any(|m| m == id || m == ip || Some(m.as_str()) == hostname);
            if hit {
                out.insert(g.name.clone(), g.slots);
            }
        }
        if out.is_empty() {
            out.insert(DEFAULT_GROUP.to_string(), self.default_slots);
        }
        Ok(Membership {
            groups: out.into_iter().collect(),
        })
    }

    /// Where audit records go.
    pub fn audit_path(&self) -> PathBuf {
        if let Some(p) = &self.audit_log {
            return p.clone();
        }
        match &self.store {
            StoreConfig::File { dir } => dir.join("audit.jsonl"),
            StoreConfig::Nats { .. } => default_dir().join("audit.jsonl"),
        }
    }
}

/// Reads a text file of at most [`MAX_CONFIG_BYTES`].
pub fn read_bounded(path: &Path) -> Result<String, String> {
    Ok(fleet_wire::bounded::read_text(path, MAX_CONFIG_BYTES)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROTOTYPE: &str = "default_slots: 1 # hosts in no group share the group 'default'
groups:
  - name: db
    slots: 1
    members:
      - db1
      - db2
      - 10.0.0.23
  - name: swarm
    slots: 2
    members: [db2, m-1]
";

    #[test]
    fn token_files_add_their_tokens_and_a_bad_file_is_refused() {
        let dir = std::env::temp_dir().join(format!("fleetlock-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_default();
        let good = dir.join("good");
        std::fs::write(&good, "  0123456789abcdef\n").unwrap_or_default();
        let empty = dir.join("empty");
        std::fs::write(&empty, "\n").unwrap_or_default();
        let yaml = |f: &Path| format!("auth: {{token_files: [{}]}}\n", f.display());
        let c = Config::parse(&yaml(&good)).unwrap_or_default();
        assert_eq!(c.auth.tokens, vec!["0123456789abcdef"]);
        assert!(c.auth.clients_need_auth() && c.warnings().is_empty());
        let e = Config::parse(&yaml(&empty)).err().unwrap_or_default();
        assert!(e.contains("empty") && e.contains("token_files"), "{e}");
        let e = Config::parse(&yaml(&dir.join("missing")))
            .err()
            .unwrap_or_default();
        assert!(e.contains("missing"), "{e}");
        assert_eq!(Config::default().warnings().len(), 1, "no auth: a warning");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn path_prefix_table() {
        let cases: &[(&str, Result<Option<&str>, &str>)] = &[
            ("", Ok(None)),
            ("path_prefix: /", Ok(None)),
            ("path_prefix: /fleetlock/", Ok(Some("/fleetlock"))),
            ("path_prefix: /fleetlock", Ok(Some("/fleetlock"))),
            ("path_prefix: /a/b.c_d~e-f", Ok(Some("/a/b.c_d~e-f"))),
            ("path_prefix: fleetlock", Err("must start with /")),
            ("path_prefix: /a//b", Err("empty")),
            ("path_prefix: /a/../b", Err(".. segment")),
            ("path_prefix: /a?b", Err("'?' is not allowed")),
            ("path_prefix: /a b", Err("' ' is not allowed")),
        ];
        for (yaml, want) in cases {
            let got = Config::parse(yaml).map(|c| c.path_prefix);
            match (got, want) {
                (Ok(p), Ok(w)) => assert_eq!(p.as_deref(), *w, "{yaml}"),
                (Err(e), Err(frag)) => assert!(e.contains(frag), "{yaml}: {e}"),
                (got, want) => panic!("{yaml}: got {got:?}, want {want:?}"),
            }
        }
        let long = format!("path_prefix: /{}", "a".repeat(MAX_PATH_PREFIX));
        assert!(Config::parse(&long).is_err());
    }

    #[test]
    fn prototype_config_and_membership() {
        let c = Config::parse(PROTOTYPE).expect("parses");
        assert_eq!(c.store, StoreConfig::default());
        let m = |id, host, ip, named| c.membership(id, host, ip, named).map(|m| m.groups);
        let g = |v: &[(&str, u32)]| Ok(v.iter().map(|(a, b)| (a.to_string(), *b)).collect());
        assert_eq!(m("x", None, "10.0.0.1", "default"), g(&[("default", 1)]));
        assert_eq!(m("x", Some("db1"), "10.0.0.1", "default"), g(&[("db", 1)]));
        assert_eq!(m("x", None, "10.0.0.23", "default"), g(&[("db", 1)]));
        assert_eq!(m("m-1", None, "10.0.0.1", "default"), g(&[("swarm", 2)]));
        assert_eq!(
            m("x", Some("db2"), "10.0.0.1", "default"),
            g(&[("db", 1), ("swarm", 2)])
        );
        assert_eq!(m("x", None, "10.0.0.1", "swarm"), g(&[("swarm", 2)]));
        assert!(m("x", None, "10.0.0.1", "nope").is_err());
    }

    #[test]
    fn invalid_configs_are_rejected() {
        for bad in [
            "groups: [{name: 'a b', slots: 1}]",
            "groups: [{name: a, slots: 1}, {name: a, slots: 2}]",
            "groups: [{name: default, slots: 1}]",
            "default_slots: -1",
            "ttl: soon",
            "store: {kind: nats, url: ''}",
            "store: {kind: nats, url: 'tls://x:4222', cert_file: /c.pem}",
            "store: {kind: nats, url: 'nats://x:4222', replicas: 0}",
            "store: {kind: nats, url: 'nats://x:4222', replicas: 6}",
            "store: {kind: nats, url: 'nats://fleetlock:$FLEETLOCK_PASSWORD@x:4222'}",
            "store: {kind: file, replicas: 3}",
            "unknown: 1",
        ] {
            assert!(Config::parse(bad).is_err(), "{bad}");
        }
        let c =
            Config::parse("ttl: 2h\nstore: {kind: file, dir: /tmp/x}\nauth: {tokens: [s3cret]}")
                .expect("ok");
        assert_eq!(c.ttl, Some(Duration::from_secs(7200)));
        assert!(!format!("{:?}", c.auth).contains("s3cret"));
    }
}
