//! What a diagnostics bundle shows of Podman: one line per fleet-owned container (`podman ps -a` of the managed
//! label) and where Podman keeps its storage (`/info`'s `store.graphRoot`).

use super::api::{podman_health, Podman, PodmanError};
use fleet_wire::workload::{LABEL_MANAGED, LABEL_WORKLOAD};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::time::Duration;

/// A fleet-owned container as a diagnostics bundle shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetContainer {
    /// Container id (what its logs are asked by).
    pub id: String,
    /// Its name.
    pub name: String,
    /// The workload its label names.
    pub workload: Option<String>,
    /// `name image=… state=… exit=… restarts=… health=… started=… finished=…`.
    pub line: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Entry {
    id: String,
    #[serde(default)]
    names: Vec<String>,
    #[serde(default)]
    image: String,
    #[serde(default)]
    labels: Option<BTreeMap<String, String>>,
    #[serde(default)]
    state: String,
    #[serde(default)]
    status: String,
    #[serde(default)]
    exit_code: i32,
    #[serde(default)]
    exited: bool,
    #[serde(default)]
    exited_at: i64,
    #[serde(default)]
    started_at: i64,
    #[serde(default)]
    restarts: Option<u32>,
}

fn time(unix_secs: i64) -> String {
    match u64::try_from(unix_secs) {
        Ok(s) if s > 0 => fleet_wire::Timestamp::from_unix_ms(s * 1000).to_string(),
        _ => "-".into(),
    }
}

impl Podman {
    /// Every container carrying fleet's managed label, with its one-line description; the list bounded by
    /// `timeout`, and no restart count asked for after it (`restarts=?`).
    pub fn fleet_containers(&self, timeout: Duration) -> Result<Vec<FleetContainer>, PodmanError> {
        #[derive(Deserialize)]
        struct Restarts {
            #[serde(rename = "RestartCount", default)]
            restart_count: u32,
        }
        let until = std::time::Instant::now() + timeout;
        let entries: Vec<Entry> = self.list_entries(&[format!("{LABEL_MANAGED}=true")], timeout)?;
        let mut out = Vec::new();
        for e in entries {
            let labels = e.labels.unwrap_or_default();
            // Defence in depth, as for the reconcile's list: only what carries the label.
            if labels.get(LABEL_MANAGED).map(String::as_str) != Some("true") {
                continue;
            }
            let name = e.names.into_iter().next().unwrap_or_default();
            // Podman 4.3's list has no restart count: inspect says it, while the time given lasts.
            let restarts = match e.restarts {
                Some(n) => n.to_string(),
                None if std::time::Instant::now() < until => self
                    .inspect::<Restarts>(&e.id)
                    .map_or("?".into(), |r| r.restart_count.to_string()),
                None => "?".into(),
            };
            let exit = if e.exited || e.state == "exited" {
                e.exit_code.to_string()
            } else {
                "-".into()
            };
            let health = podman_health(&e.status).map_or("none".into(), |h| {
                serde_json::to_value(h)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default()
            });
            let line = format!(
                "{name} image={} state={} exit={exit} restarts={restarts} health={health} started={} finished={}",
                e.image,
                e.state,
                time(e.started_at),
                time(e.exited_at)
            );
            out.push(FleetContainer {
                id: e.id,
                name,
                workload: labels.get(LABEL_WORKLOAD).cloned(),
                line,
            });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Where Podman keeps its images and containers (`/info`'s `store.graphRoot`).
    pub fn graph_root(&self, timeout: Duration) -> Result<String, PodmanError> {
        let body = self.call("GET", "/info", None, timeout, &[200])?;
        let v: serde_json::Value =
            serde_json::from_slice(&body).map_err(|e| PodmanError::Decode {
                call: "info".into(),
                message: e.to_string(),
            })?;
        v.pointer("/store/graphRoot")
            .and_then(|g| g.as_str())
            .map(str::to_owned)
            .ok_or_else(|| PodmanError::Decode {
                call: "info".into(),
                message: "no store.graphRoot".into(),
            })
    }
}
