//! Secrets of real applications: what a workload names (a key of a Kubernetes Secret, as an environment variable
//! or a read-only file) and the per-device document `device-secrets/<device>` through which the operator
//! delivers the values and the registry credentials of the device's deployments. Only that device and the
//! services may read the key (docs/secrets.md says who can read what and why); no value ever appears in a spec,
//! a digest, a status, a log line or `Debug` output.

use crate::error::shown;
use crate::{DeviceId, ValidationError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// Largest value of one Secret key delivered to a device.
pub const MAX_SECRET_VALUE_BYTES: usize = 64 * 1024;
/// Most secret uses in one workload.
pub const MAX_SECRET_USES: usize = 32;
/// Largest `device-secrets/<device>` document (the bucket's value limit).
pub const MAX_DEVICE_SECRETS_BYTES: usize = 256 * 1024;
/// Most registries one device holds credentials for.
pub const MAX_REGISTRIES: usize = 16;
/// Mode of a secret mounted as a file: read-only, for its owner only.
pub const SECRET_FILE_MODE: u32 = 0o400;

/// One key of a Kubernetes Secret (in the deployment's namespace) given to a workload: exactly one of `env` (an
/// environment variable) or `file` (an absolute path in the container, mounted read-only, mode 0400, owned by
/// `uid`, 0 by default). `version` is set by the operator (the Secret's `resourceVersion` when it planned the
/// spec), so a rotated Secret changes the workload's digest and reaches devices through the normal rollout; a
/// FleetDeployment may not set it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecretUse {
    /// Name of the Secret (a DNS-1123 subdomain).
    pub secret: String,
    /// Key within the Secret's `data`.
    pub key: String,
    /// As this environment variable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<String>,
    /// As this file (absolute path in the container).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// Owner of the file (the container's user); only with `file`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// The Secret's version the operator planned; set by the operator only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// A DNS-1123 subdomain: lowercase alphanumerics, `-` and `.`, at most 253, alphanumeric at both ends.
pub fn dns_subdomain(s: &str) -> bool {
    let b = s.as_bytes();
    let alnum = |x: u8| x.is_ascii_lowercase() || x.is_ascii_digit();
    !b.is_empty()
        && b.len() <= 253
        && alnum(b[0])
        && alnum(b[b.len() - 1])
        && b.iter().all(|&x| alnum(x) || x == b'-' || x == b'.')
}

/// A Secret data key: `[-._a-zA-Z0-9]+`, at most 253 (Kubernetes' rule).
pub fn secret_key(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b))
}

impl SecretUse {
    /// Checks the fields; `Err` says which is wrong.
    pub fn check(&self) -> Result<(), String> {
        if !dns_subdomain(&self.secret) {
            return Err(format!(
                "secret {} is not a Secret name (lowercase DNS subdomain)",
                shown(&self.secret)
            ));
        }
        if !secret_key(&self.key) {
            return Err(format!(
                "key {} is not a Secret key ([-._a-zA-Z0-9], at most 253)",
                shown(&self.key)
            ));
        }
        match (&self.env, &self.file) {
            (Some(e), None) => {
                if !crate::workload::env_name(e) {
                    return Err(format!("env {} is not a variable name", shown(e)));
                }
                if self.uid.is_some() {
                    return Err("uid is only for a file".into());
                }
            }
            (None, Some(f)) => {
                if !crate::workload::clean_path(f) || f == "/" {
                    return Err(format!(
                        "file {} must be an absolute path without '..'",
                        shown(f)
                    ));
                }
            }
            _ => return Err("needs exactly one of env or file".into()),
        }
        if let Some(v) = &self.version {
            if v.is_empty() || v.len() > 64 || !v.bytes().all(|b| b.is_ascii_alphanumeric()) {
                return Err(format!("version {} is not a resourceVersion", shown(v)));
            }
        }
        Ok(())
    }

    /// The name the agent gives the Podman secret holding this use's value: derived from the Secret, key and
    /// version only (never from the value), so a rotated value is a new Podman secret.
    pub fn podman_name(&self, workload: &crate::WorkloadName) -> String {
        let id = crate::digest::canonical_digest(
            "harmony-fleet/podman-secret/v1",
            &(&self.secret, &self.key, &self.version),
        );
        format!("fleet-{}-{}", workload.as_str(), &id.as_str()[..16])
    }
}

/// A value that is never shown: `Debug` and `Display` print `<redacted>`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Hidden(pub String);

impl fmt::Debug for Hidden {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}
impl fmt::Display for Hidden {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Credentials for one registry (from a `kubernetes.io/dockerconfigjson` Secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RegistryAuth {
    /// User name.
    pub username: String,
    /// Password or token.
    pub password: Hidden,
}

/// The value of one Secret key at one version, base64 (standard alphabet, padded) as in the Secret's `data`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecretValue {
    /// Secret name.
    pub secret: String,
    /// Key.
    pub key: String,
    /// The Secret's `resourceVersion` this value is of.
    pub version: String,
    /// The value, base64.
    pub value: Hidden,
}

/// `device-secrets/<device>`: the registry credentials and secret values one device needs for its desired state,
/// written by the operator before the desired state that refers to them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeviceSecrets {
    /// The device.
    pub device_id: DeviceId,
    /// Credentials by registry host (`host[:port]`, as the image references name it).
    #[serde(default)]
    pub registries: BTreeMap<String, RegistryAuth>,
    /// Values of the Secret keys its workloads use, at the versions its desired state names.
    #[serde(default)]
    pub values: Vec<SecretValue>,
}

impl DeviceSecrets {
    /// Checks counts and sizes.
    pub fn check(&self) -> Result<(), ValidationError> {
        let err = |why: String| Err(ValidationError::new("device secrets", why));
        if self.registries.len() > MAX_REGISTRIES {
            return err(format!("more than {MAX_REGISTRIES} registries"));
        }
        for v in &self.values {
            if v.value.0.len() > MAX_SECRET_VALUE_BYTES / 3 * 4 + 4 {
                return err(format!(
                    "secret {} key {} is over {MAX_SECRET_VALUE_BYTES} bytes",
                    shown(&v.secret),
                    shown(&v.key)
                ));
            }
        }
        Ok(())
    }

    /// The value (base64) of `use_` at its version, if delivered.
    pub fn value_of(&self, use_: &SecretUse) -> Option<&Hidden> {
        let version = use_.version.as_deref()?;
        self.values
            .iter()
            .find(|v| v.secret == use_.secret && v.key == use_.key && v.version == version)
            .map(|v| &v.value)
    }
}

/// The registry host an image reference names (`docker.io` when it names none), as Podman and dockerconfigjson
/// key it.
pub fn registry_of(image: &str) -> &str {
    let name = image.split('@').next().unwrap_or(image);
    match name.split_once('/') {
        Some((first, _)) if first.contains(['.', ':']) || first == "localhost" => first,
        _ => "docker.io",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn use_(env: Option<&str>, file: Option<&str>) -> SecretUse {
        SecretUse {
            secret: "api".into(),
            key: "token".into(),
            env: env.map(Into::into),
            file: file.map(Into::into),
            uid: None,
            version: Some("4711".into()),
        }
    }

    #[test]
    fn checks_name_the_field() {
        assert_eq!(use_(Some("API_TOKEN"), None).check(), Ok(()));
        assert_eq!(use_(None, Some("/run/secrets/token")).check(), Ok(()));
        let rows = [
            (use_(None, None), "exactly one"),
            (use_(Some("A"), Some("/x")), "exactly one"),
            (use_(Some("BAD-NAME"), None), "env"),
            (use_(None, Some("relative")), "file"),
            (use_(None, Some("/a/../b")), "file"),
            (use_(None, Some("/")), "file"),
        ];
        for (u, frag) in rows {
            let e = u.check().expect_err(frag);
            assert!(e.contains(frag), "{e}");
        }
        let mut u = use_(Some("A"), None);
        u.secret = "Api".into();
        assert!(u.check().unwrap_err().contains("secret"));
        let mut u = use_(Some("A"), None);
        u.key = "a/b".into();
        assert!(u.check().unwrap_err().contains("key"));
        let mut u = use_(Some("A"), None);
        u.uid = Some(1000);
        assert!(u.check().unwrap_err().contains("uid"));
    }

    #[test]
    fn values_never_show() {
        let s = DeviceSecrets {
            device_id: crate::fixtures::device(),
            registries: BTreeMap::from([(
                "registry.example:5000".into(),
                RegistryAuth {
                    username: "fleet".into(),
                    password: Hidden("hunter2".into()),
                },
            )]),
            values: vec![SecretValue {
                secret: "api".into(),
                key: "token".into(),
                version: "4711".into(),
                value: Hidden("c2VjcmV0".into()),
            }],
        };
        let shown = format!("{s:?} {}", s.values[0].value);
        assert!(
            !shown.contains("hunter2") && !shown.contains("c2VjcmV0"),
            "{shown}"
        );
        assert_eq!(
            s.value_of(&use_(Some("A"), None)).map(|h| h.0.as_str()),
            Some("c2VjcmV0")
        );
        let mut other = use_(Some("A"), None);
        other.version = Some("4712".into());
        assert!(
            s.value_of(&other).is_none(),
            "another version is not delivered"
        );
    }

    #[test]
    fn podman_names_follow_the_version_not_the_value() {
        let w = crate::WorkloadName::try_from("web").unwrap();
        let a = use_(Some("A"), None);
        let mut b = a.clone();
        b.version = Some("4712".into());
        assert_ne!(a.podman_name(&w), b.podman_name(&w));
        assert!(a.podman_name(&w).starts_with("fleet-web-"));
        assert_eq!(a.podman_name(&w).len(), "fleet-web-".len() + 16);
    }

    #[test]
    fn registry_hosts() {
        for (image, host) in [
            ("nginx", "docker.io"),
            ("library/nginx:1", "docker.io"),
            ("registry.example:5000/team/app:1", "registry.example:5000"),
            ("localhost/busybox:1", "localhost"),
            ("quay.io/x/y@sha256:00", "quay.io"),
        ] {
            assert_eq!(registry_of(image), host, "{image}");
        }
    }
}
