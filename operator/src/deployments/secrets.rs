//! Kubernetes Secrets in a pass, as pure functions: which Secrets the FleetDeployments name ([`referenced`]), a
//! deployment's workloads with each secret use pinned to the Secret's `resourceVersion` and its registry
//! credentials ([`resolve`]), and what each device's `device-secrets/<device>` key must hold for its desired state
//! ([`deliveries`]). No value (a password, a Secret's data) is ever put into an error, a message or `Debug`
//! output: values travel as [`Hidden`]. Table-tested. docs/secrets.md says where the values rest and why.
//!
//! - A rotated application Secret changes the `version` of every use of it, hence the spec's digest: it reaches
//!   devices through the deployment's normal (staged) rollout, and a device held back keeps its old version's
//!   value, read back from its key.
//! - Registry credentials are not in the spec: every targeted device gets the current ones in the next pass.
//! - A Secret or key that is missing, of the wrong type or too large fails the deployment closed (condition
//!   reason `SecretMissing` / `SecretInvalid` / `SecretUnreadable`): its devices keep what they run.

use crate::crd::FleetDeploymentSpec;
use base64::Engine as _;
use fleet_wire::secrets::{
    registry_of, Hidden, RegistryAuth, SecretValue, MAX_REGISTRIES, MAX_SECRET_VALUE_BYTES,
};
use fleet_wire::{DeviceId, DeviceSecrets, WorkloadSpec};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// The Secret type whose `.dockerconfigjson` key holds registry credentials.
pub const DOCKER_CONFIG_JSON: &str = "kubernetes.io/dockerconfigjson";
/// Its key.
pub const DOCKER_CONFIG_KEY: &str = ".dockerconfigjson";
/// Condition reason: a Secret or a key of it does not exist.
pub const REASON_MISSING: &str = "SecretMissing";
/// Condition reason: a Secret is of the wrong type, unparsable, or a value is too large.
pub const REASON_INVALID: &str = "SecretInvalid";
/// Condition reason: the operator could not read a Secret (RBAC, the API server).
pub const REASON_UNREADABLE: &str = "SecretUnreadable";

/// The part of a Secret the operator read: its version, type and data (base64, never shown).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretData {
    /// `metadata.resourceVersion`.
    pub version: String,
    /// `type` (`Opaque` when absent).
    pub type_: String,
    /// `data`, each value base64 (standard, padded).
    pub data: BTreeMap<String, Hidden>,
}

/// What a pass knows of one Secret named by a deployment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretState {
    /// Read.
    Found(Arc<SecretData>),
    /// It does not exist.
    Missing,
    /// It could not be read (why: an API error, never a value).
    Unreadable(String),
}

/// Why a deployment's Secrets cannot be used: its condition's reason and message (names, never values).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretError {
    /// [`REASON_MISSING`], [`REASON_INVALID`] or [`REASON_UNREADABLE`].
    pub reason: &'static str,
    /// What and where.
    pub message: String,
}

/// A deployment's workloads with the Secrets' versions, and the credentials of its pull Secrets by registry host.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Resolved {
    /// The workloads, every secret use's `version` set.
    pub workloads: Vec<WorkloadSpec>,
    /// Registry host → credentials (the first pull Secret naming a host wins, as in Kubernetes).
    pub registries: BTreeMap<String, RegistryAuth>,
}

/// Every Secret name `spec` refers to (pull Secrets and the workloads' secret uses), read from the raw JSON so
/// that the names of a spec that does not validate are known too.
pub fn referenced(spec: &FleetDeploymentSpec) -> BTreeSet<String> {
    let mut names: BTreeSet<String> = spec
        .image_pull_secrets
        .iter()
        .map(|r| r.name.clone())
        .collect();
    for w in &spec.workloads {
        let uses = w.get("secrets").and_then(|s| s.as_array());
        for u in uses.into_iter().flatten() {
            if let Some(n) = u.get("secret").and_then(|n| n.as_str()) {
                names.insert(n.to_owned());
            }
        }
    }
    names
}

/// The host a dockerconfigjson `auths` key stands for: scheme and path dropped, Docker Hub's aliases as
/// `docker.io` (what [`registry_of`] names for its images).
pub fn registry_host(key: &str) -> String {
    let k = key
        .trim()
        .trim_start_matches("https://")
        .trim_start_matches("http://");
    let host = k.split('/').next().unwrap_or(k).to_ascii_lowercase();
    match host.as_str() {
        "index.docker.io" | "registry-1.docker.io" | "registry.hub.docker.com" => {
            "docker.io".into()
        }
        _ => host,
    }
}

/// The `auths` of a `.dockerconfigjson` value (base64 of the JSON), by host. Each entry gives `username` and
/// `password`, or `auth` (base64 of `user:password`). Errors say what is wrong, never a value.
pub fn docker_auths(b64: &Hidden) -> Result<BTreeMap<String, RegistryAuth>, String> {
    #[derive(serde::Deserialize)]
    struct Config {
        #[serde(default)]
        auths: BTreeMap<String, Entry>,
    }
    #[derive(serde::Deserialize)]
    struct Entry {
        #[serde(default)]
        username: Option<String>,
        #[serde(default)]
        password: Option<String>,
        #[serde(default)]
        auth: Option<String>,
    }
    let b = base64::engine::general_purpose::STANDARD;
    let raw = b
        .decode(b64.0.as_bytes())
        .map_err(|_| format!("{DOCKER_CONFIG_KEY} is not base64"))?;
    // serde's error may quote the text it failed on: only its position is kept.
    let config: Config = serde_json::from_slice(&raw).map_err(|e| {
        format!(
            "{DOCKER_CONFIG_KEY} is not a Docker config (JSON with \"auths\"; line {} column {})",
            e.line(),
            e.column()
        )
    })?;
    let mut out = BTreeMap::new();
    for (key, e) in config.auths {
        let host = registry_host(&key);
        let (username, password) = match (e.username, e.password, e.auth) {
            (Some(u), Some(p), _) => (u, p),
            (_, _, Some(auth)) => {
                let pair = b
                    .decode(auth.trim().as_bytes())
                    .ok()
                    .and_then(|v| String::from_utf8(v).ok())
                    .and_then(|s| s.split_once(':').map(|(u, p)| (u.to_owned(), p.to_owned())))
                    .ok_or_else(|| {
                        format!("{DOCKER_CONFIG_KEY}: the auth of {host} is not base64 of user:password")
                    })?;
                pair
            }
            _ => {
                return Err(format!(
                    "{DOCKER_CONFIG_KEY}: {host} has neither username and password nor auth"
                ))
            }
        };
        out.entry(host).or_insert(RegistryAuth {
            username,
            password: Hidden(password),
        });
    }
    Ok(out)
}

fn found<'a>(
    ns: &str,
    name: &str,
    secrets: &'a BTreeMap<String, SecretState>,
    used_by: &str,
) -> Result<&'a SecretData, SecretError> {
    match secrets.get(name) {
        Some(SecretState::Found(d)) => Ok(d),
        Some(SecretState::Unreadable(why)) => Err(SecretError {
            reason: REASON_UNREADABLE,
            message: format!("Secret {ns}/{name} ({used_by}) could not be read: {why}"),
        }),
        Some(SecretState::Missing) | None => Err(SecretError {
            reason: REASON_MISSING,
            message: format!("Secret {ns}/{name} ({used_by}) does not exist"),
        }),
    }
}

/// `workloads` with each secret use's `version` set to its Secret's `resourceVersion`, and the registry
/// credentials of the `pull` Secrets; or the first reason they cannot be used. `ns` is the secrets namespace
/// (for messages).
pub fn resolve(
    ns: &str,
    workloads: &[WorkloadSpec],
    pull: &[String],
    secrets: &BTreeMap<String, SecretState>,
) -> Result<Resolved, SecretError> {
    let mut registries = BTreeMap::new();
    for (i, name) in pull.iter().enumerate() {
        let used_by = format!("imagePullSecrets[{i}]");
        let d = found(ns, name, secrets, &used_by)?;
        let invalid = |why: String| SecretError {
            reason: REASON_INVALID,
            message: format!("Secret {ns}/{name} ({used_by}): {why}"),
        };
        if d.type_ != DOCKER_CONFIG_JSON {
            return Err(invalid(format!(
                "is of type {}, not {DOCKER_CONFIG_JSON}",
                d.type_
            )));
        }
        let value = d
            .data
            .get(DOCKER_CONFIG_KEY)
            .ok_or_else(|| invalid(format!("has no key {DOCKER_CONFIG_KEY}")))?;
        for (host, auth) in docker_auths(value).map_err(invalid)? {
            registries.entry(host).or_insert(auth);
        }
    }
    if registries.len() > MAX_REGISTRIES {
        return Err(SecretError {
            reason: REASON_INVALID,
            message: format!(
                "imagePullSecrets name {} registries, more than {MAX_REGISTRIES}",
                registries.len()
            ),
        });
    }
    let mut out = workloads.to_vec();
    for w in &mut out {
        let workload = w.name.as_str().to_owned();
        for (j, u) in w.secrets.iter_mut().enumerate() {
            let used_by = format!("workload {workload} secrets[{j}]");
            let d = found(ns, &u.secret, secrets, &used_by)?;
            let Some(value) = d.data.get(&u.key) else {
                return Err(SecretError {
                    reason: REASON_MISSING,
                    message: format!("Secret {ns}/{} ({used_by}) has no key {}", u.secret, u.key),
                });
            };
            if decoded_len(value) > MAX_SECRET_VALUE_BYTES {
                return Err(SecretError {
                    reason: REASON_INVALID,
                    message: format!(
                        "Secret {ns}/{} ({used_by}): key {} is over {MAX_SECRET_VALUE_BYTES} bytes",
                        u.secret, u.key
                    ),
                });
            }
            u.version = Some(d.version.clone());
        }
    }
    Ok(Resolved {
        workloads: out,
        registries,
    })
}

/// Bytes of a padded base64 value.
fn decoded_len(b64: &Hidden) -> usize {
    let s = b64.0.trim_end_matches('=');
    s.len() * 3 / 4
}

/// One placed deployment as delivery sees it: where it goes, its workload names and its pull credentials.
#[derive(Debug, Clone)]
pub struct Placed<'a> {
    /// Its targeted devices (those given its workloads).
    pub targets: &'a BTreeSet<DeviceId>,
    /// The names of its workloads.
    pub names: BTreeSet<&'a str>,
    /// Its credentials by registry host.
    pub registries: &'a BTreeMap<String, RegistryAuth>,
}

/// What each device's `device-secrets` key must become, for the devices where it changes (`None`: delete it):
/// the credentials of the registries its desired workloads' images name, from the deployment that placed each
/// workload there (a workload only held, its deployment failing, keeps what the key has); and the value of every
/// secret use of its desired state at the version the use names — the current value when that is the Secret's
/// current version, else the one the key already holds (a device a staged rollout holds back keeps its old
/// value). `placed` is in deployment-name order (the first claims a workload name, as placement does).
pub fn deliveries(
    desired: &BTreeMap<DeviceId, Arc<[WorkloadSpec]>>,
    placed: &[Placed<'_>],
    secrets: &BTreeMap<String, SecretState>,
    current: &BTreeMap<String, Arc<DeviceSecrets>>,
) -> BTreeMap<DeviceId, Option<DeviceSecrets>> {
    let mut out = BTreeMap::new();
    // A fleet without credentials or secrets costs a scan of its desired states, nothing more.
    let any_credentials = placed.iter().any(|p| !p.registries.is_empty());
    for (dev, workloads) in desired {
        let have = current.get(dev.as_str()).map(Arc::as_ref);
        if have.is_none() && !any_credentials && workloads.iter().all(|w| w.secrets.is_empty()) {
            continue;
        }
        let mut registries = BTreeMap::new();
        let mut values: Vec<SecretValue> = Vec::new();
        for w in workloads.iter() {
            let host = registry_of(&w.image);
            let owner = placed
                .iter()
                .find(|p| p.targets.contains(dev) && p.names.contains(w.name.as_str()));
            let auth = match owner {
                Some(p) => p.registries.get(host),
                None => have.and_then(|h| h.registries.get(host)),
            };
            if let Some(a) = auth {
                registries.insert(host.to_owned(), a.clone());
            }
            for u in &w.secrets {
                let Some(version) = u.version.as_deref() else {
                    continue;
                };
                if values
                    .iter()
                    .any(|v| v.secret == u.secret && v.key == u.key && v.version == version)
                {
                    continue;
                }
                let fresh = match secrets.get(&u.secret) {
                    Some(SecretState::Found(d)) if d.version == version => d.data.get(&u.key),
                    _ => None,
                };
                if let Some(value) = fresh.or_else(|| have.and_then(|h| h.value_of(u))) {
                    values.push(SecretValue {
                        secret: u.secret.clone(),
                        key: u.key.clone(),
                        version: version.to_owned(),
                        value: value.clone(),
                    });
                }
            }
        }
        values
            .sort_by(|a, b| (&a.secret, &a.key, &a.version).cmp(&(&b.secret, &b.key, &b.version)));
        let next = (!registries.is_empty() || !values.is_empty()).then(|| DeviceSecrets {
            device_id: dev.clone(),
            registries,
            values,
        });
        if next.as_ref() != have {
            out.insert(dev.clone(), next);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_wire::fixtures;
    use fleet_wire::secrets::SecretUse;

    fn b64(s: &str) -> Hidden {
        Hidden(base64::engine::general_purpose::STANDARD.encode(s))
    }
    fn secret(version: &str, type_: &str, data: &[(&str, &str)]) -> SecretState {
        SecretState::Found(Arc::new(SecretData {
            version: version.into(),
            type_: type_.into(),
            data: data
                .iter()
                .map(|(k, v)| ((*k).to_owned(), b64(v)))
                .collect(),
        }))
    }
    fn docker(auths: serde_json::Value) -> SecretState {
        secret(
            "10",
            DOCKER_CONFIG_JSON,
            &[(
                DOCKER_CONFIG_KEY,
                &serde_json::json!({ "auths": auths }).to_string(),
            )],
        )
    }
    fn env_use(secret: &str, key: &str, env: &str) -> SecretUse {
        SecretUse {
            secret: secret.into(),
            key: key.into(),
            env: Some(env.into()),
            file: None,
            uid: None,
            version: None,
        }
    }
    fn app(image: &str, uses: Vec<SecretUse>) -> WorkloadSpec {
        let mut w = fixtures::workload("app");
        w.image = image.into();
        w.secrets = uses;
        w
    }
    fn auth(user: &str, password: &str) -> RegistryAuth {
        RegistryAuth {
            username: user.into(),
            password: Hidden(password.into()),
        }
    }

    #[test]
    fn docker_config_entries_and_hosts() {
        let user_pass = base64::engine::general_purpose::STANDARD.encode("robot:s3cret");
        let cfg = docker(serde_json::json!({
            "https://index.docker.io/v1/": {"auth": user_pass},
            "registry.example:5000": {"username": "fleet", "password": "hunter2"},
            "https://Quay.io/v2/": {"username": "q", "password": "p", "auth": "ignored"},
        }));
        let SecretState::Found(d) = cfg else { panic!() };
        let got = docker_auths(&d.data[DOCKER_CONFIG_KEY]).expect("parses");
        assert_eq!(
            got,
            BTreeMap::from([
                ("docker.io".to_owned(), auth("robot", "s3cret")),
                ("quay.io".to_owned(), auth("q", "p")),
                ("registry.example:5000".to_owned(), auth("fleet", "hunter2")),
            ])
        );
        for (key, host) in [
            ("docker.io", "docker.io"),
            ("index.docker.io", "docker.io"),
            ("https://index.docker.io/v1/", "docker.io"),
            ("http://localhost:5000/v2", "localhost:5000"),
        ] {
            assert_eq!(registry_host(key), host, "{key}");
        }
        // Errors name the problem, never the text: a password that is not JSON stays out.
        for (raw, frag) in [
            (
                "{\"auths\": {\"r.example\": {\"auth\": \"bm9jb2xvbg==\"}}}",
                "not base64 of user:password",
            ),
            (
                "{\"auths\": {\"r.example\": {\"username\": \"u\"}}}",
                "neither username and password nor auth",
            ),
            ("hunter2-not-json", "is not a Docker config"),
        ] {
            let e = docker_auths(&b64(raw)).expect_err(frag);
            assert!(
                e.contains(frag) && !e.contains("hunter2") && !e.contains("nocolon"),
                "{e}"
            );
        }
        assert!(docker_auths(&Hidden("%%%".into()))
            .unwrap_err()
            .contains("not base64"));
    }

    #[test]
    fn resolve_table() {
        let ns = "harmony-fleet";
        let secrets = BTreeMap::from([
            (
                "api".to_owned(),
                secret("41", "Opaque", &[("token", "t0ken")]),
            ),
            (
                "regcred".to_owned(),
                docker(
                    serde_json::json!({"registry.example:5000": {"username": "fleet", "password": "hunter2"}}),
                ),
            ),
            (
                "opaque".to_owned(),
                secret("7", "Opaque", &[(".dockerconfigjson", "{}")]),
            ),
            (
                "big".to_owned(),
                secret(
                    "8",
                    "Opaque",
                    &[("blob", &"x".repeat(MAX_SECRET_VALUE_BYTES + 1))],
                ),
            ),
            (
                "denied".to_owned(),
                SecretState::Unreadable("secrets \"denied\" is forbidden".into()),
            ),
            ("gone".to_owned(), SecretState::Missing),
        ]);
        let uses = |s: &str, k: &str| {
            vec![app(
                "registry.example:5000/team/app:1",
                vec![env_use(s, k, "TOKEN")],
            )]
        };
        type Row<'a> = (
            &'a str,
            Vec<WorkloadSpec>,
            Vec<&'a str>,
            Result<(), (&'a str, &'a str)>,
        );
        let rows: Vec<Row> = vec![
            ("a use and a pull Secret", uses("api", "token"), vec!["regcred"], Ok(())),
            ("no Secrets at all", vec![app("nginx:1", vec![])], vec![], Ok(())),
            ("a missing Secret", uses("gone", "token"), vec![], Err((REASON_MISSING, "Secret harmony-fleet/gone (workload app secrets[0]) does not exist"))),
            ("a Secret never read", uses("unknown", "token"), vec![], Err((REASON_MISSING, "Secret harmony-fleet/unknown (workload app secrets[0]) does not exist"))),
            ("a missing key", uses("api", "password"), vec![], Err((REASON_MISSING, "Secret harmony-fleet/api (workload app secrets[0]) has no key password"))),
            ("a value too large", uses("big", "blob"), vec![], Err((REASON_INVALID, "key blob is over 65536 bytes"))),
            ("unreadable", uses("denied", "x"), vec![], Err((REASON_UNREADABLE, "could not be read: secrets \"denied\" is forbidden"))),
            ("a pull Secret of the wrong type", vec![], vec!["opaque"], Err((REASON_INVALID, "Secret harmony-fleet/opaque (imagePullSecrets[0]): is of type Opaque, not kubernetes.io/dockerconfigjson"))),
            ("a missing pull Secret", vec![], vec!["regcred", "gone"], Err((REASON_MISSING, "Secret harmony-fleet/gone (imagePullSecrets[1]) does not exist"))),
            ("an Opaque Secret as a pull Secret", vec![], vec!["api"], Err((REASON_INVALID, "is of type Opaque"))),
        ];
        for (what, workloads, pull, want) in rows {
            let pull: Vec<String> = pull.into_iter().map(Into::into).collect();
            let got = resolve(ns, &workloads, &pull, &secrets);
            match (got, want) {
                (Ok(r), Ok(())) => {
                    for (w, before) in r.workloads.iter().zip(&workloads) {
                        assert_eq!(w.secrets.len(), before.secrets.len(), "{what}");
                        for u in &w.secrets {
                            assert_eq!(u.version.as_deref(), Some("41"), "{what}");
                        }
                        // The version is in the digest; a workload without secrets keeps its digest.
                        assert_eq!(
                            w.digest() == before.digest(),
                            before.secrets.is_empty(),
                            "{what}"
                        );
                    }
                    if !pull.is_empty() {
                        assert_eq!(
                            r.registries.keys().collect::<Vec<_>>(),
                            ["registry.example:5000"],
                            "{what}"
                        );
                    }
                }
                (Err(e), Err((reason, frag))) => {
                    assert_eq!(e.reason, reason, "{what}: {e:?}");
                    assert!(e.message.contains(frag), "{what}: {}", e.message);
                    for value in ["t0ken", "hunter2", "xxxx"] {
                        assert!(!e.message.contains(value), "{what}: {}", e.message);
                    }
                }
                (got, want) => panic!("{what}: got {got:?}, want {want:?}"),
            }
        }
        // A rotated Secret: a new version, a new digest.
        let mut rotated = secrets.clone();
        rotated.insert("api".into(), secret("42", "Opaque", &[("token", "n3w")]));
        let a = resolve(ns, &uses("api", "token"), &[], &secrets).expect("a");
        let b = resolve(ns, &uses("api", "token"), &[], &rotated).expect("b");
        assert_ne!(a.workloads[0].digest(), b.workloads[0].digest());
    }

    #[test]
    fn referenced_reads_the_raw_spec() {
        let spec: FleetDeploymentSpec = serde_json::from_value(serde_json::json!({
            "allowedGroups": ["all"],
            "imagePullSecrets": [{"name": "regcred"}],
            "workloads": [
                {"name": "a", "image": "x", "secrets": [{"secret": "api", "key": "k", "env": "K"}]},
                {"name": "b", "image": "BAD", "secrets": [{"secret": "tls"}]},
            ]
        }))
        .expect("spec");
        assert_eq!(
            referenced(&spec).into_iter().collect::<Vec<_>>(),
            ["api", "regcred", "tls"]
        );
    }

    fn dev(id: &str) -> DeviceId {
        DeviceId::try_from(id).expect("id")
    }

    /// Who gets what: only targeted devices, only the registries their images name; values at the version their
    /// desired state names (the current value, else the one already delivered); a key rewritten only when it
    /// changes, deleted when the device needs nothing.
    #[test]
    fn deliveries_table() {
        let secrets = BTreeMap::from([(
            "api".to_owned(),
            secret("42", "Opaque", &[("token", "n3w")]),
        )]);
        let regs = BTreeMap::from([
            ("registry.example:5000".to_owned(), auth("fleet", "hunter2")),
            ("docker.io".to_owned(), auth("hub", "hubpass")),
        ]);
        let pinned = |v: &str| {
            let mut u = env_use("api", "token", "TOKEN");
            u.version = Some(v.into());
            app("registry.example:5000/team/app:1", vec![u])
        };
        let value = |v: &str, s: &str| SecretValue {
            secret: "api".into(),
            key: "token".into(),
            version: v.into(),
            value: b64(s),
        };
        let doc = |d: &str, r: &[(&str, RegistryAuth)], vs: Vec<SecretValue>| DeviceSecrets {
            device_id: dev(d),
            registries: r
                .iter()
                .map(|(h, a)| ((*h).to_owned(), a.clone()))
                .collect(),
            values: vs,
        };
        let targets: BTreeSet<DeviceId> = [dev("d1"), dev("d2")].into();
        let placed = [Placed {
            targets: &targets,
            names: ["app"].into(),
            registries: &regs,
        }];
        let list = |ws: Vec<WorkloadSpec>| -> Arc<[WorkloadSpec]> { ws.into() };
        let desired = BTreeMap::from([
            // updated to the Secret's current version
            (dev("d1"), list(vec![pinned("42")])),
            // held back by the rollout at the old version
            (dev("d2"), list(vec![pinned("41")])),
            // outside the deployment: a public image of its own
            (dev("d3"), list(vec![app("nginx:1", vec![])])),
            // nothing any more
            (dev("d4"), list(vec![])),
        ]);
        let current = BTreeMap::from([
            (
                "d2".to_owned(),
                Arc::new(doc("d2", &[], vec![value("41", "old")])),
            ),
            (
                "d4".to_owned(),
                Arc::new(doc(
                    "d4",
                    &[("registry.example:5000", auth("fleet", "hunter2"))],
                    vec![value("41", "old")],
                )),
            ),
        ]);
        let got = deliveries(&desired, &placed, &secrets, &current);
        let reg = [("registry.example:5000", auth("fleet", "hunter2"))];
        assert_eq!(
            got,
            BTreeMap::from([
                (dev("d1"), Some(doc("d1", &reg, vec![value("42", "n3w")]))),
                (dev("d2"), Some(doc("d2", &reg, vec![value("41", "old")]))),
                (dev("d4"), None),
            ]),
            "d3 gets nothing: it is outside the deployment and docker.io's credentials are not for it"
        );
        // Written once: the same pass again changes nothing.
        let written: BTreeMap<String, Arc<DeviceSecrets>> = got
            .into_iter()
            .filter_map(|(d, s)| Some((d.as_str().to_owned(), Arc::new(s?))))
            .collect();
        assert!(deliveries(&desired, &placed, &secrets, &written).is_empty());
        // A rotated pull Secret reaches every targeted device in the same pass, without a spec change.
        let rotated =
            BTreeMap::from([("registry.example:5000".to_owned(), auth("fleet", "rotated"))]);
        let placed2 = [Placed {
            targets: &targets,
            names: ["app"].into(),
            registries: &rotated,
        }];
        let again = deliveries(&desired, &placed2, &secrets, &written);
        assert_eq!(
            again.keys().map(DeviceId::as_str).collect::<Vec<_>>(),
            ["d1", "d2"]
        );
        // A workload only held (its deployment fails now) keeps the credentials its device has.
        let held = deliveries(&desired, &[], &secrets, &written);
        assert!(held.is_empty(), "{held:?}");
        // A device whose old value was never delivered gets none for it (its agent reports secret-missing).
        let fresh = deliveries(&desired, &placed, &secrets, &BTreeMap::new());
        assert_eq!(fresh[&dev("d2")].as_ref().map(|d| d.values.len()), Some(0));
    }
}
