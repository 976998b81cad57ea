//! Acceptance tests of `fetch` for `oci://` artifacts against a real registry (Debian `docker-registry` over
//! HTTPS with a generated CA): tag and digest references, wrong artifact type, two layers, digest mismatches,
//! oversize layers; the anonymous Bearer-token challenge against a real registry with token auth (a test token
//! server issuing ES256 JWTs) and, with blob redirects, against the in-test HTTPS server playing a registry.

use fleet_rig::https::{HttpsServer, Reply, Request};
use fleet_rig::registry::{artifact_manifest, digest, Registry};
use fleet_rig::tls::TestCa;
use fleet_updater::fetch_helper::{fetch, FetchConfig, FetchError};
use fleet_wire::artifact::{OCI_AGENT_ARTIFACT_TYPE, OCI_AGENT_LAYER_MEDIA_TYPE};
use fleet_wire::{fixtures, AgentUpgradeAttempt, ByteLimit, Sha256Hex, UpgradeReason};
use sha2::{Digest, Sha256};
use std::path::Path;

const LAYER: &str = OCI_AGENT_LAYER_MEDIA_TYPE;

/// A tag, an artifact type and the layers of a manifest.
type Case<'a> = (&'a str, Option<&'a str>, Vec<(&'a str, &'a [u8])>);

fn sha(b: &[u8]) -> Sha256Hex {
    Sha256Hex::from_bytes(Sha256::digest(b).into())
}

fn attempt(artifact: &str, sha256: Sha256Hex, limit: u64) -> AgentUpgradeAttempt {
    let mut a = fixtures::attempt();
    a.artifact = artifact.parse().expect("artifact");
    a.sha256 = sha256;
    a.byte_limit = ByteLimit::try_from(limit).expect("limit");
    a
}

fn cfg(ca: &TestCa) -> FetchConfig {
    FetchConfig {
        extra_roots: vec![ca.ca_der()],
        ..FetchConfig::default()
    }
}

fn binary(tag: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31) ^ tag).collect()
}

#[track_caller]
fn assert_empty(dir: &Path) {
    let left: Vec<_> = std::fs::read_dir(dir)
        .expect("ls")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert!(left.is_empty(), "temporary files left behind: {left:?}");
}

#[track_caller]
fn fails(a: &AgentUpgradeAttempt, tmp: &Path, ca: &TestCa, reason: UpgradeReason) -> FetchError {
    let e = fetch(a, tmp, &cfg(ca)).expect_err("must fail");
    assert_eq!(e.reason(), reason, "{e}");
    assert_empty(tmp);
    e
}

#[test]
fn tag_and_digest_references_from_a_real_registry() {
    let ca = TestCa::new();
    let reg = Registry::start(&ca);
    let agent = binary(1, 2 * 1024 * 1024 + 5);
    let manifest = reg.push_artifact(
        "harmony/fleet-agent",
        "1.2.0",
        Some(OCI_AGENT_ARTIFACT_TYPE),
        &[(LAYER, &agent)],
    );
    let tmp = tempfile::tempdir().expect("tmp");
    let host = reg.host();
    for reference in [
        format!("oci://{host}/harmony/fleet-agent:1.2.0"),
        format!("oci://{host}/harmony/fleet-agent@{manifest}"),
        format!("oci://{host}/harmony/fleet-agent:1.2.0@{manifest}"),
    ] {
        let f = fetch(
            &attempt(&reference, sha(&agent), 4 << 20),
            tmp.path(),
            &cfg(&ca),
        )
        .unwrap_or_else(|e| panic!("{reference}: {e}"));
        assert_eq!(f.bytes, agent.len() as u64, "{reference}");
        assert_eq!(f.sha256, sha(&agent));
        assert_eq!(std::fs::read(&f.path).expect("read"), agent);
        std::fs::remove_file(&f.path).expect("rm");
    }

    // Pinned by a digest the registry's manifest does not have: the tag moved, or the pin is wrong.
    let other = binary(2, 1000);
    let other_manifest = artifact_manifest(Some(OCI_AGENT_ARTIFACT_TYPE), &[(LAYER, &other)]);
    let pinned_elsewhere = format!(
        "oci://{host}/harmony/fleet-agent:1.2.0@{}",
        digest(&other_manifest)
    );
    // The digest wins over the tag: the registry has no such manifest and answers 404.
    let e = fails(
        &attempt(&pinned_elsewhere, sha(&agent), 4 << 20),
        tmp.path(),
        &ca,
        UpgradeReason::DownloadFailed,
    );
    assert!(matches!(e, FetchError::Status { status: 404, .. }), "{e}");

    // The manifest's layer is another build than the attempt's SHA-256: refused before downloading.
    let e = fails(
        &attempt(
            &format!("oci://{host}/harmony/fleet-agent:1.2.0"),
            sha(&other),
            4 << 20,
        ),
        tmp.path(),
        &ca,
        UpgradeReason::DigestMismatch,
    );
    assert!(
        matches!(e, FetchError::DigestMismatch { what: "layer", .. }),
        "{e}"
    );

    // The declared layer size is over the attempt's limit: refused before downloading.
    let e = fails(
        &attempt(
            &format!("oci://{host}/harmony/fleet-agent:1.2.0"),
            sha(&agent),
            1 << 20,
        ),
        tmp.path(),
        &ca,
        UpgradeReason::ArtifactTooLarge,
    );
    assert!(matches!(e, FetchError::DeclaredTooLarge { .. }), "{e}");

    // An unknown tag.
    fails(
        &attempt(
            &format!("oci://{host}/harmony/fleet-agent:9.9.9"),
            sha(&agent),
            4 << 20,
        ),
        tmp.path(),
        &ca,
        UpgradeReason::DownloadFailed,
    );
}

#[test]
fn wrong_artifact_type_and_two_layers_are_invalid() {
    let ca = TestCa::new();
    let reg = Registry::start(&ca);
    let agent = binary(3, 10_000);
    let tmp = tempfile::tempdir().expect("tmp");
    let host = reg.host();
    let cases: [Case; 4] = [
        (
            "image",
            Some("application/vnd.example.other.v1"),
            vec![(LAYER, &agent)],
        ),
        ("untyped", None, vec![(LAYER, &agent)]),
        (
            "two",
            Some(OCI_AGENT_ARTIFACT_TYPE),
            vec![(LAYER, &agent), (LAYER, b"second layer")],
        ),
        (
            "tarball",
            Some(OCI_AGENT_ARTIFACT_TYPE),
            vec![("application/vnd.oci.image.layer.v1.tar", &agent)],
        ),
    ];
    for (tag, artifact_type, layers) in cases {
        let manifest = reg.push_artifact("fleet-agent", tag, artifact_type, &layers);
        for reference in [
            format!("oci://{host}/fleet-agent:{tag}"),
            format!("oci://{host}/fleet-agent@{manifest}"),
        ] {
            let e = fails(
                &attempt(&reference, sha(&agent), 1 << 20),
                tmp.path(),
                &ca,
                UpgradeReason::ArtifactInvalid,
            );
            assert!(matches!(e, FetchError::Invalid(_)), "{reference}: {e}");
        }
    }
}

#[test]
fn anonymous_pull_through_a_real_registry_token_challenge() {
    let ca = TestCa::new();
    let reg = Registry::start_with_token_auth(&ca);
    let agent = binary(6, 500_000);
    let manifest = reg.push_artifact(
        "harmony/fleet-agent",
        "1.2.0",
        Some(OCI_AGENT_ARTIFACT_TYPE),
        &[(LAYER, &agent)],
    );
    // Without a token the registry refuses and challenges.
    let resp = ca
        .client()
        .get(reg.url("/v2/harmony/fleet-agent/manifests/1.2.0"))
        .call()
        .expect("GET");
    assert_eq!(resp.status(), 401);
    let challenge = resp
        .headers()
        .get("www-authenticate")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    assert!(challenge.starts_with("Bearer realm="), "{challenge}");

    let pushes = reg.token_server().expect("token server").requests().len();
    let tmp = tempfile::tempdir().expect("tmp");
    let host = reg.host();
    for reference in [
        format!("oci://{host}/harmony/fleet-agent:1.2.0"),
        format!("oci://{host}/harmony/fleet-agent@{manifest}"),
    ] {
        let f = fetch(
            &attempt(&reference, sha(&agent), 1 << 20),
            tmp.path(),
            &cfg(&ca),
        )
        .unwrap_or_else(|e| panic!("{reference}: {e}"));
        assert_eq!(std::fs::read(&f.path).expect("read"), agent);
        std::fs::remove_file(&f.path).expect("rm");
    }
    let token_requests = reg.token_server().expect("token server").requests();
    let ours = &token_requests[pushes..];
    assert_eq!(ours.len(), 2, "one anonymous token per fetch: {ours:?}");
    for r in ours {
        assert_eq!(
            r.query("scope").as_deref(),
            Some("repository:harmony/fleet-agent:pull")
        );
        assert!(r.header("authorization").is_none(), "anonymous");
    }
    // A failure through the same flow still leaves nothing behind.
    fails(
        &attempt(
            &format!("oci://{host}/harmony/fleet-agent:1.2.0"),
            sha(b"other"),
            1 << 20,
        ),
        tmp.path(),
        &ca,
        UpgradeReason::DigestMismatch,
    );
}

/// The in-test HTTPS server playing a registry that requires an anonymous bearer token, stores its blob behind a
/// redirect to "storage" with a signed query, and can serve a corrupt blob or a manifest with a wrong pin.
fn token_registry(ca: &TestCa, agent: Vec<u8>, corrupt_blob: bool) -> (HttpsServer, Vec<u8>) {
    let manifest = artifact_manifest(Some(OCI_AGENT_ARTIFACT_TYPE), &[(LAYER, &agent)]);
    let m = manifest.clone();
    let layer_digest = digest(&agent);
    let manifest_digest = digest(&manifest);
    let port = std::sync::Arc::new(std::sync::OnceLock::<u16>::new());
    let p = port.clone();
    let server = HttpsServer::start(ca, move |req: &Request| {
        let port = p.get().copied().unwrap_or(0);
        let authed = req.header("authorization") == Some("Bearer anon-token-123");
        let challenge = format!(
            "Bearer realm=\"https://127.0.0.1:{port}/token\",service=\"test-registry\",scope=\"repository:harmony/fleet-agent:pull\""
        );
        match req.path() {
            "/token" => {
                let ok = req.query("service").as_deref() == Some("test-registry")
                    && req.query("scope").as_deref() == Some("repository:harmony/fleet-agent:pull")
                    && req.header("authorization").is_none();
                if ok {
                    Reply::ok(br#"{"token":"anon-token-123","expires_in":300}"#.to_vec())
                } else {
                    Reply::status(400, &[])
                }
            }
            p if p.starts_with("/v2/") && !authed => {
                Reply::status(401, &[("WWW-Authenticate", &challenge)])
            }
            p if p == "/v2/harmony/fleet-agent/manifests/1.2.0"
                || p == format!("/v2/harmony/fleet-agent/manifests/{manifest_digest}") =>
            {
                Reply::Body {
                    status: 200,
                    headers: vec![(
                        "Content-Type".into(),
                        "application/vnd.oci.image.manifest.v1+json".into(),
                    )],
                    body: std::sync::Arc::new(m.clone()),
                }
            }
            p if p == format!("/v2/harmony/fleet-agent/blobs/{layer_digest}") => Reply::Redirect {
                status: 307,
                location: "/storage/blob?X-Signature=secret".into(),
            },
            "/storage/blob" if req.header("authorization").is_none() => {
                let mut body = agent.clone();
                if corrupt_blob {
                    body[0] ^= 0xff;
                }
                Reply::ok(body)
            }
            _ => Reply::status(404, &[]),
        }
    });
    let _ = port.set(server.port());
    (server, manifest)
}

#[test]
fn anonymous_bearer_challenge_and_blob_redirect() {
    let ca = TestCa::new();
    let agent = binary(4, 300_000);
    let (server, manifest) = token_registry(&ca, agent.clone(), false);
    let tmp = tempfile::tempdir().expect("tmp");
    let reference = format!(
        "oci://127.0.0.1:{}/harmony/fleet-agent:1.2.0",
        server.port()
    );
    let f = fetch(
        &attempt(&reference, sha(&agent), 1 << 20),
        tmp.path(),
        &cfg(&ca),
    )
    .expect("fetch");
    assert_eq!(std::fs::read(&f.path).expect("read"), agent);
    let seen: Vec<(String, bool)> = server
        .requests()
        .iter()
        .map(|r| (r.path().to_owned(), r.header("authorization").is_some()))
        .collect();
    let blob = format!("/v2/harmony/fleet-agent/blobs/{}", digest(&agent));
    assert_eq!(
        seen,
        [
            ("/v2/harmony/fleet-agent/manifests/1.2.0".to_owned(), false),
            ("/token".to_owned(), false),
            ("/v2/harmony/fleet-agent/manifests/1.2.0".to_owned(), true),
            (blob, true),
            ("/storage/blob".to_owned(), false),
        ],
        "challenge, token, retry with the token, blob, redirect followed without the token"
    );
    assert_eq!(
        server.requests()[0].header("accept"),
        Some("application/vnd.oci.image.manifest.v1+json")
    );

    // Pinned by the right digest through the same flow.
    let pinned = format!("{reference}@{}", digest(&manifest));
    fetch(
        &attempt(&pinned, sha(&agent), 1 << 20),
        tmp.path(),
        &cfg(&ca),
    )
    .expect("pinned");
}

#[test]
fn a_corrupt_blob_or_manifest_is_a_digest_mismatch() {
    let ca = TestCa::new();
    let agent = binary(5, 200_000);
    let (server, _) = token_registry(&ca, agent.clone(), true);
    let tmp = tempfile::tempdir().expect("tmp");
    let reference = format!(
        "oci://127.0.0.1:{}/harmony/fleet-agent:1.2.0",
        server.port()
    );
    let e = fails(
        &attempt(&reference, sha(&agent), 1 << 20),
        tmp.path(),
        &ca,
        UpgradeReason::DigestMismatch,
    );
    assert!(
        matches!(e, FetchError::DigestMismatch { what: "layer", .. }),
        "{e}"
    );

    // A server that answers every manifest request with the same manifest, whatever digest was asked for: the
    // pinned digest is verified by the updater itself.
    let manifest = artifact_manifest(Some(OCI_AGENT_ARTIFACT_TYPE), &[(LAYER, &agent)]);
    let any = HttpsServer::serve(&ca, Reply::ok(manifest));
    let wrong_pin = format!(
        "oci://127.0.0.1:{}/harmony/fleet-agent@sha256:{}",
        any.port(),
        "0".repeat(64)
    );
    let e = fails(
        &attempt(&wrong_pin, sha(&agent), 1 << 20),
        tmp.path(),
        &ca,
        UpgradeReason::DigestMismatch,
    );
    assert!(
        matches!(
            e,
            FetchError::DigestMismatch {
                what: "manifest",
                ..
            }
        ),
        "{e}"
    );

    // A manifest request answered with a redirect is refused (only blob GETs follow redirects).
    let redirecting = HttpsServer::serve(
        &ca,
        Reply::Redirect {
            status: 302,
            location: "/elsewhere".into(),
        },
    );
    let r = format!(
        "oci://127.0.0.1:{}/harmony/fleet-agent:1.2.0",
        redirecting.port()
    );
    let e = fails(
        &attempt(&r, sha(&agent), 1 << 20),
        tmp.path(),
        &ca,
        UpgradeReason::DownloadFailed,
    );
    assert!(matches!(e, FetchError::Redirected { .. }), "{e}");
}
