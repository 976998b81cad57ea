//! Application secrets in Podman: the values a workload's `SecretUse`s name, taken from the device's delivered
//! `DeviceSecrets`, become Podman secrets named [`SecretUse::podman_name`] (created once, never overwritten: a new
//! version is a new name), referenced by the container as an environment variable (`secret_env`) or a read-only
//! file (`secrets`, mode 0400, owned by the use's uid); secrets no container uses any more are removed.
//!
//! Measured with Podman 4.3.1's libpod API: `POST /secrets/create?name=` takes the raw value as the body (with a
//! non-form content type: a form body is consumed by the API's query parsing and the value arrives empty), answers
//! 500 `secret name in use` for an existing name; `DELETE /secrets/{name}` removes a secret even while a
//! container uses it, and that container then cannot start again (`no such secret`), env secrets included;
//! inspect lists file secrets only, so each container carries the names it uses in a label and only secrets no
//! container names are removed. The file driver keeps the values in `<podman root>/secrets/filedriver/secretsdata.json`
//! (mode 0600); an env secret's value is visible in `podman inspect` (`Config.Env`), a file's is not.

use super::api::{Podman, PodmanError};
use base64::Engine;
use fleet_wire::secrets::{DeviceSecrets, SecretUse, SECRET_FILE_MODE};
use fleet_wire::{WorkloadName, WorkloadSpec};
use serde::Deserialize;
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// Time-out of one secret call.
const QUICK: Duration = Duration::from_secs(30);
/// Most unused Podman secrets removed in one pass (the rest go in the next ones).
pub const GC_MAX_PER_PASS: usize = 16;
/// The container label naming the Podman secrets it uses (comma-separated): Podman 4.3's inspect lists only
/// file secrets (`Config.Secrets`), never env ones, and a container whose secret was removed cannot start again,
/// so the clean-up goes by this label.
pub const LABEL_SECRETS: &str = "io.nationtech.fleet.secrets";

/// One secret value ready for Podman: its Podman name and the decoded bytes. `Debug` shows no value.
pub struct Prepared {
    /// The Podman secret's name.
    pub name: String,
    value: Vec<u8>,
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Prepared {{ name: {:?}, value: <redacted> }}", self.name)
    }
}

/// The error of a use whose value is not delivered (`secret-missing: …`).
pub fn missing(u: &SecretUse) -> String {
    format!(
        "secret-missing: Secret {} key {} version {} not delivered yet",
        u.secret,
        u.key,
        u.version.as_deref().unwrap_or("(none)")
    )
}

/// The values of every secret `spec` uses, from `delivered`; the first one missing (or not base64) is an error
/// text naming the Secret, key and version, never a value. Pure.
pub fn prepare(
    spec: &WorkloadSpec,
    delivered: Option<&DeviceSecrets>,
) -> Result<Vec<Prepared>, String> {
    let mut out = Vec::with_capacity(spec.secrets.len());
    for u in &spec.secrets {
        let Some(v) = delivered.and_then(|d| d.value_of(u)) else {
            return Err(missing(u));
        };
        let value = base64::engine::general_purpose::STANDARD
            .decode(v.0.trim())
            .map_err(|_| format!("{}: the delivered value is not base64", missing(u)))?;
        out.push(Prepared {
            name: u.podman_name(&spec.name),
            value,
        });
    }
    Ok(out)
}

/// Adds `spec`'s secret references to its libpod `SpecGenerator`: `secret_env` for env uses, `secrets` (mount
/// target, uid, gid 0, mode 0400) for file uses, and their names as [`LABEL_SECRETS`]. Names only; no value. Pure.
pub fn apply(body: &mut serde_json::Value, spec: &WorkloadSpec) {
    if spec.secrets.is_empty() {
        return;
    }
    let names: BTreeSet<String> = spec
        .secrets
        .iter()
        .map(|u| u.podman_name(&spec.name))
        .collect();
    body["labels"][LABEL_SECRETS] = json!(names.into_iter().collect::<Vec<_>>().join(","));
    let mut env = BTreeMap::new();
    let mut files = Vec::new();
    for u in &spec.secrets {
        let name = u.podman_name(&spec.name);
        match (&u.env, &u.file) {
            (Some(var), _) => {
                env.insert(var.clone(), name);
            }
            (None, Some(path)) => files.push(json!({
                "Source": name,
                "Target": path,
                "UID": u.uid.unwrap_or(0),
                "GID": 0,
                "Mode": SECRET_FILE_MODE,
            })),
            (None, None) => {}
        }
    }
    if !env.is_empty() {
        body["secret_env"] = json!(env);
    }
    if !files.is_empty() {
        body["secrets"] = json!(files);
    }
}

/// The workload a Podman secret name `fleet-<workload>-<16 hex>` belongs to; `None` for any other name (a secret
/// the agent did not make, which it never touches).
pub fn owner(podman_name: &str) -> Option<WorkloadName> {
    let rest = podman_name.strip_prefix("fleet-")?;
    let (workload, id) = rest.rsplit_once('-')?;
    let hex = id.len() == 16
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    hex.then(|| WorkloadName::try_from(workload).ok()).flatten()
}

impl Podman {
    /// Creates each prepared secret that does not exist yet (an existing name holds the same value: the name
    /// follows the version).
    pub fn ensure_secrets(&self, prepared: &[Prepared]) -> Result<(), PodmanError> {
        if prepared.is_empty() {
            return Ok(());
        }
        let have: BTreeSet<String> = self.secret_names()?.into_iter().collect();
        for p in prepared.iter().filter(|p| !have.contains(&p.name)) {
            let r = self.call_with(
                "POST",
                &format!("/secrets/create?name={}", super::api::enc(&p.name)),
                Some(("application/octet-stream", &p.value)),
                &[],
                QUICK,
                &[200, 201],
                &|| false,
            );
            match r {
                Ok(_) => log::info!("created Podman secret {}", p.name),
                // Made meanwhile (another pass of an earlier agent): the name fixes the value.
                Err(PodmanError::Status { message, .. }) if message.contains("in use") => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// The names of every Podman secret.
    pub fn secret_names(&self) -> Result<Vec<String>, PodmanError> {
        #[derive(Deserialize)]
        struct Spec {
            #[serde(rename = "Name", default)]
            name: String,
        }
        #[derive(Deserialize)]
        struct Entry {
            #[serde(rename = "Spec")]
            spec: Spec,
        }
        let body = self.call_with("GET", "/secrets/json", None, &[], QUICK, &[200], &|| false)?;
        let list: Vec<Entry> = serde_json::from_slice(&body).map_err(|e| PodmanError::Decode {
            call: "list secrets".into(),
            message: e.to_string(),
        })?;
        Ok(list.into_iter().map(|e| e.spec.name).collect())
    }

    /// Removes Podman secret `name` (gone already is fine).
    pub fn remove_secret(&self, name: &str) -> Result<(), PodmanError> {
        self.call_with(
            "DELETE",
            &format!("/secrets/{}", super::api::enc(name)),
            None,
            &[],
            QUICK,
            &[200, 204, 404],
            &|| false,
        )
        .map(|_| ())
    }

    /// Removes the agent's Podman secrets (`fleet-<workload>-<id>`) that neither a desired spec nor any managed
    /// container ([`LABEL_SECRETS`]; listed only when there is a candidate) uses; at most [`GC_MAX_PER_PASS`].
    /// Returns how many it removed.
    pub fn collect_secrets(&self, desired: &[WorkloadSpec]) -> Result<usize, PodmanError> {
        let wanted: BTreeSet<String> = desired
            .iter()
            .flat_map(|w| w.secrets.iter().map(|u| u.podman_name(&w.name)))
            .collect();
        let mut unused: Vec<String> = self
            .secret_names()?
            .into_iter()
            .filter(|n| owner(n).is_some() && !wanted.contains(n))
            .collect();
        if unused.is_empty() {
            return Ok(0);
        }
        let used: BTreeSet<String> = self
            .list_managed()?
            .iter()
            .filter_map(|o| o.labels.get(LABEL_SECRETS))
            .flat_map(|v| v.split(',').map(str::to_owned))
            .collect();
        unused.retain(|n| !used.contains(n));
        let mut removed = 0;
        for name in unused.into_iter().take(GC_MAX_PER_PASS) {
            match self.remove_secret(&name) {
                Ok(()) => {
                    log::info!("removed Podman secret {name}: no container uses it");
                    removed += 1;
                }
                Err(e) => log::warn!("removing Podman secret {name}: {e}"),
            }
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_wire::fixtures;
    use fleet_wire::secrets::{Hidden, SecretValue};

    fn use_(env: Option<&str>, file: Option<&str>, uid: Option<u32>) -> SecretUse {
        SecretUse {
            secret: "api".into(),
            key: if env.is_some() { "token" } else { "cert" }.into(),
            env: env.map(Into::into),
            file: file.map(Into::into),
            uid,
            version: Some("41".into()),
        }
    }

    fn spec() -> WorkloadSpec {
        let mut w = fixtures::workload("web");
        w.secrets = vec![
            use_(Some("API_TOKEN"), None, None),
            use_(None, Some("/run/secrets/cert"), Some(1000)),
        ];
        w
    }

    #[test]
    fn the_body_names_secrets_never_values() {
        let w = spec();
        let mut body = json!({});
        apply(&mut body, &w);
        let (env, file) = (
            w.secrets[0].podman_name(&w.name),
            w.secrets[1].podman_name(&w.name),
        );
        assert_eq!(body["secret_env"], json!({"API_TOKEN": env}));
        let mut both = [env.clone(), file.clone()];
        both.sort();
        assert_eq!(body["labels"][LABEL_SECRETS], json!(both.join(",")));
        assert_eq!(
            body["secrets"],
            json!([{"Source": file, "Target": "/run/secrets/cert", "UID": 1000, "GID": 0, "Mode": 256}])
        );
        let mut plain = json!({});
        apply(&mut plain, &fixtures::workload("web"));
        assert_eq!(plain, json!({}), "no secrets, no fields");
    }

    #[test]
    fn values_come_from_the_delivered_version_only() {
        let w = spec();
        let value = |key: &str, version: &str, v: &str| SecretValue {
            secret: "api".into(),
            key: key.into(),
            version: version.into(),
            value: Hidden(v.into()),
        };
        let mut d = DeviceSecrets {
            device_id: fixtures::device(),
            registries: Default::default(),
            values: vec![
                value("token", "41", "dG9rZW4="),
                value("cert", "40", "Y2VydA=="),
            ],
        };
        let e = prepare(&w, Some(&d)).expect_err("cert at 41 is missing");
        assert_eq!(
            e,
            "secret-missing: Secret api key cert version 41 not delivered yet"
        );
        assert_eq!(
            prepare(&w, None).expect_err("none").split(':').next(),
            Some("secret-missing")
        );
        d.values.push(value("cert", "41", "Y2VydA=="));
        let p = prepare(&w, Some(&d)).expect("both");
        assert_eq!(
            (p[0].value.as_slice(), p[1].value.as_slice()),
            (&b"token"[..], &b"cert"[..])
        );
        assert!(!format!("{p:?}").contains("token\""), "{p:?}");
        d.values[0].value = Hidden("not base64!".into());
        let e = prepare(&w, Some(&d)).expect_err("bad value");
        assert!(
            e.contains("not base64") && !e.contains("not base64!"),
            "{e}"
        );
    }

    #[test]
    fn only_the_agents_names_have_an_owner() {
        let w = spec();
        let n = w.secrets[0].podman_name(&w.name);
        assert_eq!(owner(&n).map(|o| o.as_str().to_owned()), Some("web".into()));
        assert_eq!(
            owner("fleet-my-app-0123456789abcdef").map(|o| o.as_str().to_owned()),
            Some("my-app".into())
        );
        for other in [
            "db-password",
            "fleet-web",
            "fleet-web-xyz",
            "fleet-web-0123456789ABCDEF",
            "fleet--0123456789abcdef",
        ] {
            assert_eq!(owner(other), None, "{other}");
        }
    }
}
