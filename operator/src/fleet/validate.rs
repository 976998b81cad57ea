//! Spec validation: turns the JSON kept in FleetDeployment and AgentRelease specs into fleet-wire types, or says
//! clearly what is wrong (condition reason `InvalidSpec`). Pure.

use crate::crd::{
    AgentRelease, AgentReleaseSpec, FleetDeployment, FleetDeploymentSpec, ReleaseBuild, RolloutSpec,
};
use fleet_wire::{Architecture, Artifact, ByteLimit, Sha256Hex, Version, WorkloadSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
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

/// Validates a stored FleetDeployment as the operator acts on it: the unknown fields its cache marked and every
/// problem of its spec ([`deployment_problems`]), all in one message (its condition `InvalidSpec`).
pub fn deployment(d: &FleetDeployment) -> Result<Vec<WorkloadSpec>, String> {
    match (
        crate::schema::unknown_problem(d),
        deployment_problems(&d.spec),
    ) {
        (None, r) => r.map_err(|e| e.join("; ")),
        (Some(_), r) => {
            Err(crate::validation::refusal_of(d, r.err().unwrap_or_default()).unwrap_or_default())
        }
    }
}

/// Validates a stored AgentRelease as the operator acts on it, like [`deployment`].
pub fn release(r: &AgentRelease) -> Result<Vec<Build>, String> {
    match (crate::schema::unknown_problem(r), release_problems(&r.spec)) {
        (None, x) => x.map_err(|e| e.join("; ")),
        (Some(_), x) => {
            Err(crate::validation::refusal_of(r, x.err().unwrap_or_default()).unwrap_or_default())
        }
    }
}

/// Validates a FleetDeployment's spec ([`deployment_problems`]), its problems joined by `; `.
pub fn deployment_workloads(spec: &FleetDeploymentSpec) -> Result<Vec<WorkloadSpec>, String> {
    deployment_problems(spec).map_err(|e| e.join("; "))
}

/// Validates a FleetDeployment's spec: its placement ([`crate::validation::placement`]), its workloads (each a valid
/// `WorkloadSpec`, names unique, at most 64), its image pull Secrets' names and its rollout section
/// ([`rollout_problems`]). On failure every problem, each with its full path (`spec.workloads[0].image: …`,
/// `spec.rollout.soakSeconds: …`), not only the first.
pub fn deployment_problems(spec: &FleetDeploymentSpec) -> Result<Vec<WorkloadSpec>, Vec<String>> {
    let mut errors = crate::validation::placement(&spec.placement, "spec");
    if spec.workloads.len() > MAX_DEPLOYMENT_WORKLOADS {
        errors.push(format!(
            "spec.workloads: more than {MAX_DEPLOYMENT_WORKLOADS} entries"
        ));
    }
    for (i, r) in spec.image_pull_secrets.iter().enumerate() {
        if !fleet_wire::secrets::dns_subdomain(&r.name) {
            errors.push(format!(
                "spec.imagePullSecrets[{i}].name: {:?} is not a Secret name (lowercase DNS subdomain)",
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
                    "spec.workloads[{i}].secrets[{j}].version: set by the operator (the Secret's resourceVersion), not in a FleetDeployment; remove it"
                ));
            }
            continue;
        }
        match crate::validation::typed_at::<WorkloadSpec>(raw, &format!("spec.workloads[{i}]")) {
            Ok(w) if !names.insert(w.name.as_str().to_owned()) => errors.push(format!(
                "spec.workloads[{i}]: name {:?} appears twice",
                w.name.as_str()
            )),
            Ok(w) => out.push(w),
            Err(e) => errors.extend(e),
        }
    }
    if let Some(r) = &spec.rollout {
        errors.extend(rollout_problems(r));
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

/// Every problem of a `rollout` section (FleetDeployment or AgentRelease), each with its full path and the range
/// it must be in (`spec.rollout.soakSeconds: must be 0 to 86400, not 100000`); empty: valid.
/// [`crate::fleet::rollout::Policy::from_spec`] refuses exactly these.
pub fn rollout_problems(r: &RolloutSpec) -> Vec<String> {
    use crate::fleet::rollout::{MAX_SECONDS, MIN_HEARTBEAT_TIMEOUT_SECS};
    let mut out = Vec::new();
    if let Some(soak) = r.soak_seconds.filter(|s| *s > MAX_SECONDS) {
        out.push(format!(
            "spec.rollout.soakSeconds: must be 0 to {MAX_SECONDS}, not {soak}"
        ));
    }
    for (field, v) in [
        ("maxUnavailable", &r.max_unavailable),
        ("maxFailures", &r.max_failures),
    ] {
        let valid = v
            .as_ref()
            .is_none_or(|v| crate::fleet::rollout::Amount::parse(v).is_some());
        if !valid {
            let shown = match v {
                Some(IntOrString::Int(n)) => n.to_string(),
                Some(IntOrString::String(s)) => format!("{s:?}"),
                None => String::new(),
            };
            out.push(format!(
                "spec.rollout.{field}: must be a count (0 or more) or a percentage from \"0%\" to \"100%\", not {shown}"
            ));
        }
    }
    if let Some(t) = r
        .heartbeat_timeout_seconds
        .filter(|t| !(MIN_HEARTBEAT_TIMEOUT_SECS..=MAX_SECONDS).contains(t))
    {
        out.push(format!(
            "spec.rollout.heartbeatTimeoutSeconds: must be {MIN_HEARTBEAT_TIMEOUT_SECS} to {MAX_SECONDS}, not {t}"
        ));
    }
    out
}

/// The workload names a FleetDeployment's spec gives, read from the raw JSON even when the spec is invalid: what
/// it already placed under those names is held while a person fixes the spec.
pub fn raw_workload_names(spec: &FleetDeploymentSpec) -> BTreeSet<String> {
    spec.workloads
        .iter()
        .filter_map(|w| w.get("name")?.as_str().map(str::to_owned))
        .collect()
}

fn build(i: usize, b: &ReleaseBuild) -> Result<Build, Vec<String>> {
    let mut errors = Vec::new();
    let mut at = |what: &str, e: fleet_wire::ValidationError| {
        errors.push(format!("spec.builds[{i}].{what}: {e}"));
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
                "spec.builds[{i}].architecture: {:?} is not amd64 or arm64",
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
        _ => Err(errors),
    }
}

/// Validates an AgentRelease's spec ([`release_problems`]), its problems joined by `; `.
pub fn release_builds(spec: &AgentReleaseSpec) -> Result<Vec<Build>, String> {
    release_problems(spec).map_err(|e| e.join("; "))
}

/// Validates an AgentRelease's spec: its placement, its builds (at least one, each valid, one per architecture)
/// and its rollout section. On failure every problem, each with its full path, not only the first.
pub fn release_problems(spec: &AgentReleaseSpec) -> Result<Vec<Build>, Vec<String>> {
    let mut errors = crate::validation::placement(&spec.placement, "spec");
    if spec.builds.is_empty() {
        errors.push("spec.builds: at least one build is needed".into());
    }
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for (i, b) in spec.builds.iter().enumerate() {
        match build(i, b) {
            Ok(b) if !seen.insert(b.architecture.to_string()) => errors.push(format!(
                "spec.builds[{i}]: architecture {} appears twice",
                b.architecture
            )),
            Ok(b) => out.push(b),
            Err(e) => errors.extend(e),
        }
    }
    if let Some(r) = &spec.rollout {
        errors.extend(rollout_problems(r));
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::Placement;
    use serde_json::json;

    fn placed() -> Placement {
        Placement {
            allowed_groups: vec!["g".into()],
            ..Default::default()
        }
    }

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
                Err("spec.workloads[0]: invalid workload: a: image \"Bad\" is not a valid image reference: name component \"Bad\" must be lowercase letters and digits, joined by '.', '_', '__' or '-'; spec.workloads[2]: invalid workload: c: image \"x y\" contains whitespace; an image reference has none (e.g. nginx:1.27); spec.workloads[3]: name \"b\" appears twice"),
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
                placement: placed(),
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
                Err("spec.builds[0].architecture: \"riscv\" is not amd64 or arm64; spec.builds[0].version"),
            ),
            (
                vec![rb("riscv", "../1", "xyz", 0)],
                Err("; spec.builds[0].sha256: "),
            ),
            (
                vec![rb("amd64", "1.2.0", "xyz", 10), rb("arm64", "1.2.0", &sha, 0)],
                Err("byteLimit"),
            ),
        ];
        for (i, (builds, want)) in cases.into_iter().enumerate() {
            let spec = AgentReleaseSpec {
                placement: placed(),
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
