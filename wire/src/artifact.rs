//! Artifact references: a direct `https://` URL or an anonymous `oci://registry/repo` reference pinned by tag or
//! digest, and the OCI media types that mark a Harmony agent artifact.

use crate::error::shown;
use crate::{Sha256Hex, ValidationError};
use serde::{Deserialize, Serialize};
use std::fmt;

/// `artifactType` an OCI manifest must declare to be accepted as a Harmony agent artifact.
pub const OCI_AGENT_ARTIFACT_TYPE: &str = "application/vnd.nationtech.harmony-fleet.agent.v1";
/// Media type of the one layer of an agent artifact: the agent executable itself.
pub const OCI_AGENT_LAYER_MEDIA_TYPE: &str =
    "application/vnd.nationtech.harmony-fleet.agent.binary.v1";
/// The OCI image manifest media type the updater asks registries for.
pub const OCI_MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
/// Media type of the empty config blob an artifact manifest carries.
pub const OCI_EMPTY_CONFIG_MEDIA_TYPE: &str = "application/vnd.oci.empty.v1+json";
/// Largest manifest the updater reads, in bytes.
pub const OCI_MANIFEST_MAX_BYTES: u64 = 64 * 1024;
/// Longest artifact reference in characters.
pub const ARTIFACT_MAX_CHARS: usize = 2048;

/// Where the updater fetches a candidate agent from.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Artifact {
    /// A direct HTTPS URL; redirects are refused.
    Https(HttpsUrl),
    /// An anonymous OCI registry pull.
    Oci(OciReference),
}

/// A validated `https://host[:port]/path[?query]` URL without user info or fragment.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HttpsUrl {
    url: String,
    authority_end: usize,
}

impl HttpsUrl {
    /// The whole URL.
    pub fn as_str(&self) -> &str {
        &self.url
    }
    /// `host[:port]`.
    pub fn authority(&self) -> &str {
        &self.url["https://".len()..self.authority_end]
    }
}

/// `oci://registry[:port]/repository[:tag][@sha256:<hex>]`, with a tag or a digest or both (the digest wins).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OciReference {
    /// `host[:port]` of the registry, reached over HTTPS.
    pub registry: String,
    /// Repository path, e.g. `harmony/fleet-agent`.
    pub repository: String,
    /// Tag, when given.
    pub tag: Option<String>,
    /// Manifest digest (SHA-256), when pinned.
    pub digest: Option<Sha256Hex>,
}

impl OciReference {
    /// The reference to ask the registry for: the digest when pinned (`sha256:…`), otherwise the tag.
    pub fn manifest_reference(&self) -> String {
        match (&self.digest, &self.tag) {
            (Some(d), _) => format!("sha256:{d}"),
            (None, Some(t)) => t.clone(),
            (None, None) => String::new(), // unreachable by construction
        }
    }
}

impl TryFrom<String> for Artifact {
    type Error = ValidationError;
    fn try_from(s: String) -> Result<Self, ValidationError> {
        s.parse()
    }
}

impl TryFrom<&str> for Artifact {
    type Error = ValidationError;
    fn try_from(s: &str) -> Result<Self, ValidationError> {
        s.parse()
    }
}

impl std::str::FromStr for Artifact {
    type Err = ValidationError;
    fn from_str(s: &str) -> Result<Self, ValidationError> {
        let err = |why: &str| ValidationError::new("artifact", format!("{} {why}", shown(s)));
        if s.chars().count() > ARTIFACT_MAX_CHARS {
            return Err(err(&format!(
                "is longer than {ARTIFACT_MAX_CHARS} characters"
            )));
        }
        if !s.bytes().all(|b| (0x21..0x7f).contains(&b)) {
            return Err(err("contains whitespace, control or non-ASCII characters"));
        }
        if let Some(rest) = s.strip_prefix("https://") {
            parse_https(s, rest)
                .map(Artifact::Https)
                .map_err(|why| err(&why))
        } else if let Some(rest) = s.strip_prefix("oci://") {
            parse_oci(rest).map(Artifact::Oci).map_err(|why| err(&why))
        } else {
            Err(err("must be an https:// URL or an oci:// reference (http://, file:// and others are refused)"))
        }
    }
}

fn parse_https(whole: &str, rest: &str) -> Result<HttpsUrl, String> {
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..end];
    if authority.contains('@') {
        return Err("must not carry user info (credentials would end up in logs)".into());
    }
    check_host_port(authority)?;
    if whole.contains('#') {
        return Err("must not have a fragment".into());
    }
    Ok(HttpsUrl {
        url: whole.to_owned(),
        authority_end: "https://".len() + end,
    })
}

fn check_host_port(authority: &str) -> Result<(), String> {
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (authority, None),
    };
    let host_ok = !host.is_empty()
        && host.len() <= 253
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
        && !host.starts_with(['.', '-']);
    if !host_ok {
        return Err("has no valid host name".into());
    }
    if let Some(p) = port {
        match p.parse::<u16>() {
            Ok(n) if n > 0 && p.len() <= 5 => {}
            _ => return Err("has an invalid port".into()),
        }
    }
    Ok(())
}

fn parse_oci(rest: &str) -> Result<OciReference, String> {
    let (registry, path) = rest
        .split_once('/')
        .ok_or("has no repository after the registry")?;
    check_host_port(registry)?;
    let (name_tag, digest) = match path.split_once('@') {
        Some((n, d)) => {
            let hex = d
                .strip_prefix("sha256:")
                .ok_or("has a digest that is not sha256:<64 hex>")?;
            let digest = Sha256Hex::try_from(hex)
                .map_err(|_| "has a digest that is not sha256:<64 hex>".to_string())?;
            (n, Some(digest))
        }
        None => (path, None),
    };
    let last_slash = name_tag.rfind('/').map(|i| i + 1).unwrap_or(0);
    let (repository, tag) = match name_tag[last_slash..].find(':') {
        Some(i) => (
            &name_tag[..last_slash + i],
            Some(&name_tag[last_slash + i + 1..]),
        ),
        None => (name_tag, None),
    };
    if repository.is_empty()
        || repository.len() > 255
        || !repository.split('/').all(repo_component_ok)
    {
        return Err("has an invalid repository (lowercase components separated by '/')".into());
    }
    if let Some(t) = tag {
        let first_ok = t
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !first_ok
            || t.len() > 128
            || !t
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        {
            return Err("has an invalid tag".into());
        }
    }
    if tag.is_none() && digest.is_none() {
        return Err("needs an explicit :tag or @sha256:<digest>".into());
    }
    Ok(OciReference {
        registry: registry.to_owned(),
        repository: repository.to_owned(),
        tag: tag.map(str::to_owned),
        digest,
    })
}

fn repo_component_ok(c: &str) -> bool {
    let b = c.as_bytes();
    let sep = |x: u8| b"._-".contains(&x);
    !b.is_empty()
        && b.iter()
            .all(|&x| x.is_ascii_lowercase() || x.is_ascii_digit() || sep(x))
        && !sep(b[0])
        && !sep(b[b.len() - 1])
        && !c.contains("..")
}

impl fmt::Display for Artifact {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Artifact::Https(u) => f.write_str(u.as_str()),
            Artifact::Oci(r) => {
                write!(f, "oci://{}/{}", r.registry, r.repository)?;
                if let Some(t) = &r.tag {
                    write!(f, ":{t}")?;
                }
                if let Some(d) = &r.digest {
                    write!(f, "@sha256:{d}")?;
                }
                Ok(())
            }
        }
    }
}

impl From<Artifact> for String {
    fn from(a: Artifact) -> String {
        a.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_https_and_pinned_oci() {
        let d = "b".repeat(64);
        for ok in [
            "https://artifacts.example.com/fleet-agent/1.2.3/fleet-agent-arm64".to_string(),
            "https://127.0.0.1:8443/a?x=1".to_string(),
            "oci://registry.example.com/harmony/fleet-agent:1.2.3".to_string(),
            "oci://127.0.0.1:5000/fleet-agent@sha256:".to_string() + &d,
            "oci://127.0.0.1:5000/a/b-c/fleet_agent:v1@sha256:".to_string() + &d,
        ] {
            let a: Artifact = ok.parse().expect(&ok);
            assert_eq!(a.to_string(), ok, "canonical round trip");
        }
        let Ok(Artifact::Oci(r)) = "oci://r.io:443/x/y:t1".parse() else {
            panic!("oci")
        };
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str(), r.tag.as_deref()),
            ("r.io:443", "x/y", Some("t1"))
        );
        assert_eq!(r.manifest_reference(), "t1");
    }

    #[test]
    fn rejects_unsafe_artifacts() {
        for bad in [
            "http://example.com/a",
            "file:///etc/passwd",
            "oci://registry.example.com/fleet-agent",
            "oci://registry.example.com/",
            "oci://registry.example.com/Fleet:1",
            "oci://registry.example.com/a@sha256:abc",
            "https://user:pw@example.com/a",
            "https://",
            "https://exa mple.com/",
            "https://example.com/a#frag",
            "https://example.com:99999/a",
            "ftp://x",
            "",
        ] {
            let e = bad.parse::<Artifact>().expect_err(bad);
            assert_eq!(e.field, "artifact", "{bad}");
        }
    }
}
