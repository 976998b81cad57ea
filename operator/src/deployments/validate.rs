//! Spec validation: turns the JSON kept in FleetDeployment and AgentRelease specs into fleet-wire types, or says
//! clearly what is wrong (condition reason `InvalidSpec`). Pure.

use crate::crd::{AgentReleaseSpec, FleetDeploymentSpec, ReleaseBuild};
use fleet_wire::{Architecture, Artifact, ByteLimit, Sha256Hex, Version, WorkloadSpec};
use std::collections::BTreeSet;

/// Most workloads in one FleetDeployment (the per-device ceiling of fleet-wire).
pub const MAX_DEPLOYMENT_WORKLOADS: usize = fleet_wire::workload::MAX_WORKLOADS;

/// One validated release build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Build {
    /// Architecture.
    pub architecture: Architecture,
    /// Target version.
    pub version: Version,
    /// Where to fetch it.
    pub artifact: Artifact,
    /// Artifact digest.
    pub sha256: Sha256Hex,
    /// Largest artifact accepted.
    pub byte_limit: ByteLimit,
}

/// Validates a FleetDeployment's workloads: each a valid `WorkloadSpec`, names unique, at most 64. On failure
/// the message names every invalid entry (`workloads[0]: …; workloads[2]: …`), not only the first.
pub fn deployment_workloads(spec: &FleetDeploymentSpec) -> Result<Vec<WorkloadSpec>, String> {
    let mut errors = Vec::new();
    if spec.workloads.len() > MAX_DEPLOYMENT_WORKLOADS {
        errors.push(format!(
            "workloads: more than {MAX_DEPLOYMENT_WORKLOADS} entries"
        ));
    }
    for (i, r) in spec.image_pull_secrets.iter().enumerate() {
        if !fleet_wire::secrets::dns_subdomain(&r.name) {
            errors.push(format!(
                "imagePullSecrets[{i}].name: {:?} is not a Secret name (lowercase DNS subdomain)",
                r.name
            ));
        }
    }
    let mut names = BTreeSet::new();
    let mut out = Vec::with_capacity(spec.workloads.len());
    for (i, raw) in spec.workloads.iter().enumerate() {
        // The version of a Secret is the operator's to set (the Secret's resourceVersion when it plans the spec):
        // one written in the CR would pin a value the operator never read.
        let versioned: Vec<usize> = raw
            .get("secrets")
            .and_then(|s| s.as_array())
            .map(|uses| {
                (0..uses.len())
                    .filter(|j| uses[*j].get("version").is_some())
                    .collect()
            })
            .unwrap_or_default();
        if !versioned.is_empty() {
            for j in versioned {
                errors.push(format!(
                    "workloads[{i}].secrets[{j}].version: set by the operator (the Secret's resourceVersion), not in a FleetDeployment; remove it"
                ));
            }
            continue;
        }
        match serde_json::from_value::<WorkloadSpec>(raw.clone()) {
            Ok(w) if !names.insert(w.name.as_str().to_owned()) => errors.push(format!(
                "workloads[{i}]: name {:?} appears twice",
                w.name.as_str()
            )),
            Ok(w) => out.push(w),
            Err(e) => errors.push(format!("workloads[{i}]: {e}")),
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors.join("; "))
    }
}

/// The workload names a FleetDeployment's spec gives, read from the raw JSON even when the spec is invalid: what
/// it already placed under those names is held while a person fixes the spec.
pub fn raw_workload_names(spec: &FleetDeploymentSpec) -> BTreeSet<String> {
    spec.workloads
        .iter()
        .filter_map(|w| w.get("name")?.as_str().map(str::to_owned))
        .collect()
}

fn build(i: usize, b: &ReleaseBuild) -> Result<Build, String> {
    let mut errors = Vec::new();
    let mut at = |what: &str, e: fleet_wire::ValidationError| {
        errors.push(format!("builds[{i}].{what}: {e}"));
    };
    let architecture =
        serde_json::from_value::<Architecture>(serde_json::Value::String(b.architecture.clone()))
            .ok();
    let version = Version::try_from(b.version.as_str())
        .map_err(|e| at("version", e))
        .ok();
    let artifact = Artifact::try_from(b.artifact.clone())
        .map_err(|e| at("artifact", e))
        .ok();
    let sha256 = Sha256Hex::try_from(b.sha256.as_str())
        .map_err(|e| at("sha256", e))
        .ok();
    let byte_limit = ByteLimit::try_from(b.byte_limit)
        .map_err(|e| at("byteLimit", e))
        .ok();
    if architecture.is_none() {
        errors.insert(
            0,
            format!(
                "builds[{i}].architecture: {:?} is not amd64 or arm64",
                b.architecture
            ),
        );
    }
    match (architecture, version, artifact, sha256, byte_limit) {
        (Some(architecture), Some(version), Some(artifact), Some(sha256), Some(byte_limit))
            if errors.is_empty() =>
        {
            Ok(Build {
                architecture,
                version,
                artifact,
                sha256,
                byte_limit,
            })
        }
        _ => Err(errors.join("; ")),
    }
}

/// Validates an AgentRelease's builds: at least one, each valid, one per architecture. On failure the message
/// names every invalid build, not only the first.
pub fn release_builds(spec: &AgentReleaseSpec) -> Result<Vec<Build>, String> {
    if spec.builds.is_empty() {
        return Err("builds: at least one build is needed".into());
    }
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    let mut errors = Vec::new();
    for (i, b) in spec.builds.iter().enumerate() {
        match build(i, b) {
            Ok(b) if !seen.insert(b.architecture.to_string()) => errors.push(format!(
                "builds[{i}]: architecture {} appears twice",
                b.architecture
            )),
            Ok(b) => out.push(b),
            Err(e) => errors.push(e),
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::Placement;
    use serde_json::json;

    fn rb(arch: &str, version: &str, sha: &str, limit: u64) -> ReleaseBuild {
        ReleaseBuild {
            architecture: arch.into(),
            version: version.into(),
            artifact: "https://example.com/fleet-agent".into(),
            sha256: sha.into(),
            byte_limit: limit,
        }
    }

    #[test]
    fn deployment_table() {
        let cases: Vec<(Vec<serde_json::Value>, Result<usize, &str>)> = vec![
            (vec![], Ok(0)),
            (vec![json!({"name": "web", "image": "nginx"})], Ok(1)),
            (
                vec![
                    json!({"name": "web", "image": "a"}),
                    json!({"name": "web", "image": "b"}),
                ],
                Err("appears twice"),
            ),
            (
                vec![json!({"name": "Bad_Name", "image": "a"})],
                Err("workloads[0]"),
            ),
            (
                vec![json!({"name": "web", "image": "a", "extra": 1})],
                Err("workloads[0]"),
            ),
            (
                vec![json!({"name": "web", "image": "Nginx:Latest:bad"})],
                Err("not a valid image reference"),
            ),
            (
                vec![json!({"name": "web", "image": "nginx latest"})],
                Err("whitespace"),
            ),
            (
                vec![json!({"name": "web", "image": "nginx", "ports": [{"hostPort": 8080, "containerPort": 80}],
                            "healthCheck": {"http": {"port": 80}}})],
                Ok(1),
            ),
            (
                vec![json!({"name": "db", "image": "postgres:16", "healthCheck": {"command": ["pg_isready"], "retries": 0}})],
                Err("workloads[0]: invalid workload: db: healthCheck.retries: 0 is outside 1–10"),
            ),
            (
                vec![json!({"name": "web", "image": "nginx", "healthCheck": {"http": {"port": 80}}})],
                Err("workloads[0]: invalid workload: web: healthCheck.http.port: container port 80 is not published"),
            ),
            (
                vec![json!({"name": "web", "image": "nginx", "healthCheck": {"tcp": {"port": 80}, "http": {"port": 80}}})],
                Err("workloads[0]: invalid workload: web: healthCheck: needs exactly one of command, http or tcp"),
            ),
            // every error, not only the first
            (
                vec![
                    json!({"name": "a", "image": "Bad"}),
                    json!({"name": "b", "image": "nginx:1"}),
                    json!({"name": "c", "image": "x y"}),
                    json!({"name": "b", "image": "nginx:2"}),
                ],
                Err("workloads[0]: invalid workload: a: image \"Bad\" is not a valid image reference: name component \"Bad\" must be lowercase letters and digits, joined by '.', '_', '__' or '-'; workloads[2]: invalid workload: c: image \"x y\" contains whitespace; an image reference has none (e.g. nginx:1.27); workloads[3]: name \"b\" appears twice"),
            ),
        ];
        let cases = cases.into_iter().chain([
            // a secret as env and as a file, without a version: valid
            (
                vec![json!({"name": "a", "image": "nginx:1", "secrets": [
                    {"secret": "api", "key": "token", "env": "API_TOKEN"},
                    {"secret": "tls", "key": "tls.key", "file": "/run/secrets/tls.key", "uid": 101}]})],
                Ok(1),
            ),
            // the version is the operator's
            (
                vec![json!({"name": "a", "image": "nginx:1", "secrets": [
                    {"secret": "api", "key": "token", "env": "A"},
                    {"secret": "api", "key": "token", "env": "B", "version": "4711"}]})],
                Err("workloads[0].secrets[1].version: set by the operator (the Secret's resourceVersion), not in a FleetDeployment; remove it"),
            ),
            (
                vec![json!({"name": "a", "image": "nginx:1", "secrets": [
                    {"secret": "api", "key": "token"}]})],
                Err("workloads[0]: invalid workload: a: secrets[0]: needs exactly one of env or file"),
            ),
        ]);
        for (i, (workloads, want)) in cases.enumerate() {
            let spec = FleetDeploymentSpec {
                placement: Placement::default(),
                workloads,
                rollout: None,
                image_pull_secrets: vec![],
            };
            match (deployment_workloads(&spec), want) {
                (Ok(v), Ok(n)) => assert_eq!(v.len(), n, "case {i}"),
                (Err(e), Err(frag)) => assert!(e.contains(frag), "case {i}: {e}"),
                (got, want) => panic!("case {i}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn release_table() {
        let sha = "a".repeat(64);
        let cases: Vec<(Vec<ReleaseBuild>, Result<usize, &str>)> =
            vec![
            (vec![], Err("at least one")),
            (vec![rb("amd64", "1.2.0", &sha, 1000)], Ok(1)),
            (
                vec![
                    rb("amd64", "1.2.0", &sha, 1000),
                    rb("arm64", "1.2.0", &sha, 1000),
                ],
                Ok(2),
            ),
            (
                vec![
                    rb("amd64", "1.2.0", &sha, 1000),
                    rb("amd64", "1.3.0", &sha, 1000),
                ],
                Err("appears twice"),
            ),
            (vec![rb("riscv", "1.2.0", &sha, 1000)], Err("architecture")),
            (vec![rb("amd64", "1.2.0", "xyz", 1000)], Err("sha256")),
            (vec![rb("amd64", "1.2.0", &sha, 0)], Err("byteLimit")),
            (vec![rb("amd64", "../1", &sha, 10)], Err("version")),
            (
                vec![rb("riscv", "../1", "xyz", 0)],
                Err("builds[0].architecture: \"riscv\" is not amd64 or arm64; builds[0].version"),
            ),
            (
                vec![rb("riscv", "../1", "xyz", 0)],
                Err("; builds[0].sha256: "),
            ),
            (
                vec![rb("amd64", "1.2.0", "xyz", 10), rb("arm64", "1.2.0", &sha, 0)],
                Err("byteLimit"),
            ),
        ];
        for (i, (builds, want)) in cases.into_iter().enumerate() {
            let spec = AgentReleaseSpec {
                placement: Placement::default(),
                builds,
                rollout: None,
            };
            match (release_builds(&spec), want) {
                (Ok(v), Ok(n)) => assert_eq!(v.len(), n, "case {i}"),
                (Err(e), Err(frag)) => assert!(e.contains(frag), "case {i}: {e}"),
                (got, want) => panic!("case {i}: got {got:?}, want {want:?}"),
            }
        }
    }
}
