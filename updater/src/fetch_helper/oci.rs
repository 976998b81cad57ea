//! `oci://` artifacts: anonymous pull from an OCI registry over HTTPS, including the anonymous Bearer-token
//! challenge; the manifest must be a Harmony agent artifact with exactly one agent-binary layer.

use super::client::{content_length, header, redact, Client, Response};
use super::download::{begin, stream, Streamed};
use super::https::{check_success, get_resumed};
use super::FetchError;
use fleet_wire::artifact::{
    OCI_AGENT_ARTIFACT_TYPE, OCI_AGENT_LAYER_MEDIA_TYPE, OCI_MANIFEST_MAX_BYTES,
    OCI_MANIFEST_MEDIA_TYPE,
};
use fleet_wire::fetch::ResumePoint;
use fleet_wire::{OciReference, Sha256Hex};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use std::io::{Read, Write};

/// Largest token response read from a registry's token realm, in bytes.
pub const TOKEN_RESPONSE_MAX_BYTES: u64 = 64 * 1024;
/// Longest bearer token accepted, in bytes.
pub const TOKEN_MAX_BYTES: usize = 16 * 1024;
/// Redirects followed for a blob GET (to the registry's storage), each https:// only.
pub const BLOB_MAX_REDIRECTS: usize = 3;

/// Pulls the agent layer of `r` into `out`, resuming the blob after `resume` when the registry (or its storage)
/// can continue those bytes. With `announce`, the start line goes first.
#[allow(clippy::too_many_arguments)]
pub(crate) fn fetch(
    client: &Client,
    r: &OciReference,
    expected: &Sha256Hex,
    limit: u64,
    resume: Option<&ResumePoint>,
    announce: bool,
    out: &mut impl Write,
    write_err: impl Fn(std::io::Error) -> FetchError,
) -> Result<Streamed, FetchError> {
    let base = format!("https://{}/v2/{}", r.registry, r.repository);
    let mut session = Session {
        client,
        repository: &r.repository,
        token: None,
    };

    let manifest_url = format!("{base}/manifests/{}", r.manifest_reference());
    let resp = session.get(&manifest_url, Some(OCI_MANIFEST_MEDIA_TYPE), &[])?;
    check_success(&resp, &manifest_url)?;
    if let Some(declared) = content_length(&resp) {
        if declared > OCI_MANIFEST_MAX_BYTES {
            return Err(FetchError::Invalid(format!(
                "the manifest declares {declared} bytes, more than {OCI_MANIFEST_MAX_BYTES}"
            )));
        }
    }
    let raw =
        read_bounded(client, &manifest_url, resp, OCI_MANIFEST_MAX_BYTES)?.ok_or_else(|| {
            FetchError::Invalid(format!(
                "the manifest is larger than {OCI_MANIFEST_MAX_BYTES} bytes"
            ))
        })?;
    if let Some(pinned) = &r.digest {
        let actual = Sha256Hex::from_bytes(Sha256::digest(&raw).into());
        if &actual != pinned {
            return Err(FetchError::DigestMismatch {
                what: "manifest",
                expected: pinned.clone(),
                actual,
            });
        }
    }
    let layer = agent_layer(&raw, expected, limit)?;
    log::info!(
        "OCI manifest {} accepted: layer sha256:{} of {} bytes",
        redact(&manifest_url),
        layer.digest,
        layer.size
    );

    let blob_url = format!("{base}/blobs/sha256:{}", layer.digest);
    // The layer's size is part of what identifies the held bytes, whatever storage serves them.
    let resume = resume.filter(|p| p.offset > 0).map(|p| {
        let mut p = p.clone();
        p.validators.total = p.validators.total.or(Some(layer.size));
        p
    });
    let mut final_url = blob_url.clone();
    let (resp, mut start) = get_resumed(resume.as_ref(), limit, &blob_url, |headers| {
        let (resp, url) = session.get_blob(&blob_url, headers)?;
        final_url = url;
        Ok(resp)
    })?;
    if start.validators.total.is_some_and(|t| t != layer.size) {
        return Err(FetchError::Invalid(format!(
            "the blob has {} bytes, the manifest declares {}",
            start.validators.total.unwrap_or_default(),
            layer.size
        )));
    }
    start.validators.total = Some(layer.size);
    if announce {
        begin(out, &start, &write_err)?;
    }
    let fetched = stream(
        client.artifact_body(resp),
        out,
        limit.saturating_sub(start.offset),
        (start.offset == 0).then_some(&layer.digest),
        "layer",
        |e| client.map_read_error(&final_url, e),
        write_err,
    )?;
    if start.offset + fetched.bytes != layer.size {
        return Err(FetchError::Invalid(format!(
            "the layer has {} bytes, the manifest declares {}",
            start.offset + fetched.bytes,
            layer.size
        )));
    }
    Ok(fetched)
}

/// The one agent layer a manifest names.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Layer {
    /// Its SHA-256 (equal to the attempt's).
    pub digest: Sha256Hex,
    /// Its declared size in bytes.
    pub size: u64,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Manifest {
    schema_version: u32,
    #[serde(default)]
    media_type: Option<String>,
    #[serde(default)]
    artifact_type: Option<String>,
    layers: Vec<Descriptor>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Descriptor {
    media_type: String,
    digest: String,
    size: u64,
}

/// Validates a manifest as a Harmony agent artifact and returns its layer.
///
/// The layer digest must equal the attempt's SHA-256: the attempt hashes the agent binary, which is exactly the
/// layer blob, so a different digest means the tag now points at another build. Refused before downloading.
pub(crate) fn agent_layer(
    raw: &[u8],
    expected: &Sha256Hex,
    limit: u64,
) -> Result<Layer, FetchError> {
    let m: Manifest = serde_json::from_slice(raw)
        .map_err(|e| FetchError::Invalid(format!("the manifest is not OCI manifest JSON: {e}")))?;
    if m.schema_version != 2 {
        return Err(FetchError::Invalid(format!(
            "schemaVersion is {}, not 2",
            m.schema_version
        )));
    }
    if let Some(mt) = m.media_type.as_deref() {
        if mt != OCI_MANIFEST_MEDIA_TYPE {
            return Err(FetchError::Invalid(format!(
                "mediaType is {mt:?}, not {OCI_MANIFEST_MEDIA_TYPE:?}"
            )));
        }
    }
    if m.artifact_type.as_deref() != Some(OCI_AGENT_ARTIFACT_TYPE) {
        return Err(FetchError::Invalid(format!(
            "artifactType is {:?}, not {OCI_AGENT_ARTIFACT_TYPE:?}",
            m.artifact_type.as_deref().unwrap_or("(absent)")
        )));
    }
    let [layer] = m.layers.as_slice() else {
        return Err(FetchError::Invalid(format!(
            "the manifest has {} layers; an agent artifact has exactly one",
            m.layers.len()
        )));
    };
    if layer.media_type != OCI_AGENT_LAYER_MEDIA_TYPE {
        return Err(FetchError::Invalid(format!(
            "the layer's mediaType is {:?}, not {OCI_AGENT_LAYER_MEDIA_TYPE:?}",
            layer.media_type
        )));
    }
    let digest = layer
        .digest
        .strip_prefix("sha256:")
        .and_then(|h| Sha256Hex::try_from(h).ok())
        .ok_or_else(|| {
            FetchError::Invalid("the layer digest is not sha256:<64 lowercase hex>".into())
        })?;
    if &digest != expected {
        return Err(FetchError::DigestMismatch {
            what: "layer",
            expected: expected.clone(),
            actual: digest,
        });
    }
    if layer.size > limit {
        return Err(FetchError::DeclaredTooLarge {
            declared: layer.size,
            limit,
        });
    }
    Ok(Layer {
        digest,
        size: layer.size,
    })
}

/// Reads at most `max` bytes of a body; `None` when it is longer.
fn read_bounded(
    client: &Client,
    url: &str,
    resp: Response,
    max: u64,
) -> Result<Option<Vec<u8>>, FetchError> {
    let mut out = Vec::new();
    resp.into_body()
        .into_reader()
        .take(max + 1)
        .read_to_end(&mut out)
        .map_err(|e| client.map_read_error(url, e))?;
    Ok((out.len() as u64 <= max).then_some(out))
}

/// Requests to one registry, carrying an anonymous bearer token once a challenge asked for one.
struct Session<'a> {
    client: &'a Client,
    repository: &'a str,
    token: Option<String>,
}

impl Session<'_> {
    /// GET with the current token (and `extra` headers); on a 401 with a Bearer challenge, get a token once
    /// and retry.
    fn get(
        &mut self,
        url: &str,
        accept: Option<&str>,
        extra: &[(&str, String)],
    ) -> Result<Response, FetchError> {
        let resp = self
            .client
            .get(url, accept, self.token.as_deref(), &[], extra)?;
        if resp.status().as_u16() != 401 {
            return Ok(resp);
        }
        let challenge = header(&resp, "www-authenticate")
            .and_then(parse_bearer_challenge)
            .ok_or_else(|| {
                FetchError::Auth(format!(
                    "{} answered 401 without a Bearer challenge; only anonymous pulls are supported",
                    redact(url)
                ))
            })?;
        drop(resp);
        self.token = Some(self.fetch_token(&challenge)?);
        let resp = self
            .client
            .get(url, accept, self.token.as_deref(), &[], extra)?;
        if resp.status().as_u16() == 401 {
            return Err(FetchError::Auth(format!(
                "{} refused the anonymous token; the repository must allow anonymous pulls",
                redact(url)
            )));
        }
        Ok(resp)
    }

    /// GET a blob, following up to [`BLOB_MAX_REDIRECTS`] https:// redirects to the registry's storage (the
    /// token is not sent there; a range is). Returns the final answer (not a redirect) and the URL that produced
    /// it; its status is for the caller to judge.
    fn get_blob(
        &mut self,
        url: &str,
        extra: &[(&str, String)],
    ) -> Result<(Response, String), FetchError> {
        let mut resp = self.get(url, None, extra)?;
        let mut current = url.to_owned();
        for hop in 0..=BLOB_MAX_REDIRECTS {
            let status = resp.status().as_u16();
            if !(300..=399).contains(&status) {
                return Ok((resp, current));
            }
            let next = header(&resp, "location")
                .and_then(|l| resolve_location(&current, l))
                .filter(|_| hop < BLOB_MAX_REDIRECTS)
                .ok_or(FetchError::Redirected {
                    url: redact(&current),
                    status,
                })?;
            log::info!("blob redirected to {}", redact(&next));
            drop(resp);
            resp = self.client.get(&next, None, None, &[], extra)?;
            current = next;
        }
        Err(FetchError::Redirected {
            url: redact(&current),
            status: resp.status().as_u16(),
        })
    }

    /// Anonymous GET of the realm with service and scope; the JSON answer's `token` (or `access_token`).
    fn fetch_token(&self, c: &Challenge) -> Result<String, FetchError> {
        if !c.realm.starts_with("https://") {
            return Err(FetchError::Auth(format!(
                "the token realm {} is not https://",
                redact(&c.realm)
            )));
        }
        let default_scope = format!("repository:{}:pull", self.repository);
        let scope = c.scope.as_deref().unwrap_or(&default_scope);
        let mut query = vec![("scope", scope)];
        if let Some(s) = c.service.as_deref() {
            query.insert(0, ("service", s));
        }
        let resp = self
            .client
            .get(&c.realm, Some("application/json"), None, &query, &[])?;
        check_success(&resp, &c.realm)?;
        let body = read_bounded(self.client, &c.realm, resp, TOKEN_RESPONSE_MAX_BYTES)?
            .ok_or_else(|| {
                FetchError::Auth(format!(
                    "the token response of {} is larger than {TOKEN_RESPONSE_MAX_BYTES} bytes",
                    redact(&c.realm)
                ))
            })?;
        parse_token(&body).ok_or_else(|| {
            FetchError::Auth(format!(
                "the token response of {} holds no usable token",
                redact(&c.realm)
            ))
        })
    }
}

/// The `token` (or `access_token`) of a token response: non-empty, bounded, visible ASCII.
fn parse_token(body: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct TokenResponse {
        token: Option<String>,
        access_token: Option<String>,
    }
    let t: TokenResponse = serde_json::from_slice(body).ok()?;
    t.token
        .filter(|s| !s.is_empty())
        .or(t.access_token)
        .filter(|s| !s.is_empty() && s.len() <= TOKEN_MAX_BYTES)
        .filter(|s| s.bytes().all(|b| (0x21..0x7f).contains(&b)))
}

/// A `WWW-Authenticate: Bearer realm=…,service=…,scope=…` challenge.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Challenge {
    /// Token endpoint.
    pub realm: String,
    /// `service` parameter, when given.
    pub service: Option<String>,
    /// `scope` parameter, when given.
    pub scope: Option<String>,
}

/// Parses a Bearer challenge (auth-params with quoted strings, which may contain commas).
pub(crate) fn parse_bearer_challenge(h: &str) -> Option<Challenge> {
    let (scheme, rest) = h.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let (mut realm, mut service, mut scope) = (None, None, None);
    let mut s = rest.trim_start();
    while !s.is_empty() {
        let eq = s.find('=')?;
        let key = s[..eq].trim().to_ascii_lowercase();
        s = &s[eq + 1..];
        let value;
        if let Some(q) = s.strip_prefix('"') {
            let mut out = String::new();
            let mut chars = q.char_indices();
            let mut end = None;
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => out.push(chars.next()?.1),
                    '"' => {
                        end = Some(i);
                        break;
                    }
                    c => out.push(c),
                }
            }
            value = out;
            s = &q[end? + 1..];
        } else {
            let end = s.find(',').unwrap_or(s.len());
            value = s[..end].trim().to_owned();
            s = &s[end..];
        }
        match key.as_str() {
            "realm" => realm = Some(value),
            "service" => service = Some(value),
            "scope" => scope = Some(value),
            _ => {}
        }
        s = s.trim_start().strip_prefix(',').unwrap_or(s).trim_start();
    }
    Some(Challenge {
        realm: realm?,
        service,
        scope,
    })
}

/// Resolves a redirect `Location` against `base`; only https:// targets (absolute or host-relative).
fn resolve_location(base: &str, location: &str) -> Option<String> {
    if location.starts_with("https://") {
        return Some(location.to_owned());
    }
    if location.starts_with('/') && !location.starts_with("//") {
        let rest = base.strip_prefix("https://")?;
        let host_end = rest.find('/').unwrap_or(rest.len());
        return Some(format!("https://{}{location}", &rest[..host_end]));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(c: char) -> Sha256Hex {
        Sha256Hex::try_from(c.to_string().repeat(64)).expect("hex")
    }

    fn manifest(artifact_type: Option<&str>, layers: &[(&str, char, u64)]) -> Vec<u8> {
        let layers: Vec<_> = layers
            .iter()
            .map(|(mt, d, size)| {
                serde_json::json!({"mediaType": mt, "digest": format!("sha256:{}", hex(*d)), "size": size})
            })
            .collect();
        let mut m = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST_MEDIA_TYPE,
            "config": {"mediaType": "application/vnd.oci.empty.v1+json",
                       "digest": "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a", "size": 2},
            "layers": layers,
        });
        if let Some(t) = artifact_type {
            m["artifactType"] = serde_json::json!(t);
        }
        serde_json::to_vec(&m).expect("json")
    }

    #[test]
    fn manifest_table() {
        let a = Some(OCI_AGENT_ARTIFACT_TYPE);
        let l = OCI_AGENT_LAYER_MEDIA_TYPE;
        let ok = agent_layer(&manifest(a, &[(l, 'a', 10)]), &hex('a'), 10).expect("ok");
        assert_eq!(
            ok,
            Layer {
                digest: hex('a'),
                size: 10
            }
        );
        let reason = |raw: Vec<u8>| {
            agent_layer(&raw, &hex('a'), 10)
                .expect_err("must fail")
                .reason()
        };
        use fleet_wire::UpgradeReason::*;
        assert_eq!(reason(manifest(None, &[(l, 'a', 10)])), ArtifactInvalid);
        assert_eq!(
            reason(manifest(Some("application/x"), &[(l, 'a', 10)])),
            ArtifactInvalid
        );
        assert_eq!(reason(manifest(a, &[])), ArtifactInvalid);
        assert_eq!(
            reason(manifest(a, &[(l, 'a', 10), (l, 'a', 10)])),
            ArtifactInvalid
        );
        assert_eq!(
            reason(manifest(a, &[("application/octet-stream", 'a', 10)])),
            ArtifactInvalid
        );
        assert_eq!(reason(manifest(a, &[(l, 'b', 10)])), DigestMismatch);
        assert_eq!(reason(manifest(a, &[(l, 'a', 11)])), ArtifactTooLarge);
        assert_eq!(reason(b"not json".to_vec()), ArtifactInvalid);
    }

    #[test]
    fn bearer_challenges() {
        let c = parse_bearer_challenge(
            r#"Bearer realm="https://auth.example.com/token",service="registry.example.com",scope="repository:a/b:pull,push""#,
        )
        .expect("challenge");
        assert_eq!(c.realm, "https://auth.example.com/token");
        assert_eq!(c.service.as_deref(), Some("registry.example.com"));
        assert_eq!(c.scope.as_deref(), Some("repository:a/b:pull,push"));
        let c = parse_bearer_challenge("bearer realm=https://t/x").expect("token form");
        assert_eq!(
            (c.realm.as_str(), c.service, c.scope),
            ("https://t/x", None, None)
        );
        assert!(parse_bearer_challenge(r#"Basic realm="x""#).is_none());
        assert!(parse_bearer_challenge(r#"Bearer service="x""#).is_none());
        assert!(parse_bearer_challenge(r#"Bearer realm="unterminated"#).is_none());
    }

    #[test]
    fn tokens_and_locations() {
        assert_eq!(parse_token(br#"{"token":"abc"}"#).as_deref(), Some("abc"));
        assert_eq!(
            parse_token(br#"{"access_token":"xyz"}"#).as_deref(),
            Some("xyz")
        );
        assert_eq!(parse_token(br#"{"token":"a b"}"#), None);
        assert_eq!(parse_token(br#"{}"#), None);
        assert_eq!(
            resolve_location("https://r:5000/v2/x/blobs/sha256:a", "/store/a?sig=1").as_deref(),
            Some("https://r:5000/store/a?sig=1")
        );
        assert_eq!(resolve_location("https://r/v2", "http://s/a"), None);
        assert_eq!(resolve_location("https://r/v2", "//s/a"), None);
        assert_eq!(
            resolve_location("https://r/v2", "https://s/a").as_deref(),
            Some("https://s/a")
        );
    }
}
