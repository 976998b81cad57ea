//! The agent's items of a diagnostics request ([`Collector::Agent`]): workload logs and the fleet containers from
//! Podman, disk and memory. Each finished section is handed on at once (the worker's deadline keeps what arrived).
//! Logs are read only of containers that carry fleet's label, found in Podman's list: a workload name from the
//! request only selects among them, it never reaches Podman.

use crate::podman::describe::FleetContainer;
use crate::podman::Podman;
use fleet_wire::diagnostics::{Collector, DiagnosticsRequest, Item};
use fleet_wire::WorkloadName;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// A collected item before redaction and bounding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Raw {
    /// The item.
    pub item: Item,
    /// The workload, for logs.
    pub workload: Option<WorkloadName>,
    /// The text (not yet redacted).
    pub text: String,
    /// Older text was already left out.
    pub cut: bool,
    /// Why it could not be collected, whole or in part.
    pub error: Option<String>,
}

impl Raw {
    fn ok(item: Item, workload: Option<WorkloadName>, text: String) -> Self {
        Self {
            item,
            workload,
            text,
            cut: false,
            error: None,
        }
    }

    fn failed(item: Item, workload: Option<WorkloadName>, error: impl Into<String>) -> Self {
        Self {
            item,
            workload,
            text: String::new(),
            cut: false,
            error: Some(error.into()),
        }
    }
}

/// What the collector tells the worker.
#[derive(Debug)]
pub enum Found {
    /// The workloads whose logs will be collected, in section order.
    Planned(Vec<WorkloadName>),
    /// One section.
    Section(Raw),
}

/// Longest wait for one Podman call (and less when the deadline is nearer).
const PODMAN_CALL: Duration = Duration::from_secs(10);

/// Collects the agent's items of `request` until `deadline`, passing each section to `send` as it is done.
pub fn agent_items(
    request: &DiagnosticsRequest,
    podman: Option<&Podman>,
    desired: &[WorkloadName],
    deadline: Instant,
    send: &mut dyn FnMut(Found),
) {
    let items: Vec<Item> = request
        .items()
        .into_iter()
        .filter(|i| i.collector() == Collector::Agent)
        .collect();
    let call = || {
        deadline
            .saturating_duration_since(Instant::now())
            .min(PODMAN_CALL)
    };
    let needs_podman = items
        .iter()
        .any(|i| matches!(i, Item::WorkloadLogs | Item::Containers));
    let containers = match podman {
        Some(p) if needs_podman => Some(p.fleet_containers(call()).map_err(|e| e.to_string())),
        _ => None,
    };
    for item in items {
        match item {
            Item::WorkloadLogs => logs(request, podman, desired, &containers, deadline, send),
            Item::Containers => send(Found::Section(match &containers {
                None => Raw::failed(item, None, "Podman is not enabled on this device"),
                Some(Err(e)) => Raw::failed(item, None, format!("listing containers: {e}")),
                Some(Ok(c)) if c.is_empty() => {
                    Raw::ok(item, None, "no fleet containers on this device".into())
                }
                Some(Ok(c)) => Raw::ok(
                    item,
                    None,
                    c.iter()
                        .map(|c| c.line.as_str())
                        .collect::<Vec<_>>()
                        .join("\n"),
                ),
            })),
            Item::Disk => {
                let graph_root = podman.and_then(|p| p.graph_root(call()).ok());
                let (text, errors) = super::system::disk(graph_root.as_deref());
                let mut raw = Raw::ok(item, None, text);
                if podman.is_some() && graph_root.is_none() {
                    raw.error = Some("Podman's storage root could not be read".into());
                }
                if !errors.is_empty() {
                    raw.error = Some(errors.join("; "));
                }
                send(Found::Section(raw));
            }
            Item::Memory => send(Found::Section(match super::system::memory() {
                Ok(t) => Raw::ok(item, None, t),
                Err(e) => Raw::failed(item, None, e),
            })),
            _ => {}
        }
    }
}

/// The workloads of this device: those of its desired state and those fleet-labelled containers name.
fn own_workloads(desired: &[WorkloadName], containers: &[FleetContainer]) -> BTreeSet<String> {
    desired
        .iter()
        .map(|w| w.as_str().to_owned())
        .chain(containers.iter().filter_map(|c| c.workload.clone()))
        .collect()
}

fn logs(
    request: &DiagnosticsRequest,
    podman: Option<&Podman>,
    desired: &[WorkloadName],
    containers: &Option<Result<Vec<FleetContainer>, String>>,
    deadline: Instant,
    send: &mut dyn FnMut(Found),
) {
    let item = Item::WorkloadLogs;
    let (Some(p), Some(listed)) = (podman, containers) else {
        send(Found::Planned(vec![]));
        send(Found::Section(Raw::failed(
            item,
            None,
            "Podman is not enabled on this device",
        )));
        return;
    };
    let listed = match listed {
        Ok(l) => l,
        Err(e) => {
            send(Found::Planned(vec![]));
            send(Found::Section(Raw::failed(
                item,
                None,
                format!("listing containers: {e}"),
            )));
            return;
        }
    };
    let own = own_workloads(desired, listed);
    let wanted: Vec<WorkloadName> = if request.workloads.is_empty() {
        own.iter()
            .filter_map(|w| WorkloadName::try_from(w.as_str()).ok())
            .collect()
    } else {
        request.workloads.clone()
    };
    if wanted.is_empty() {
        send(Found::Planned(vec![]));
        send(Found::Section(Raw::ok(
            item,
            None,
            "no fleet workloads on this device".into(),
        )));
        return;
    }
    send(Found::Planned(wanted.clone()));
    let since = request.since_seconds.map(|s| {
        let now = fleet_wire::Timestamp::now().unix_ms() / 1000;
        i64::try_from(now.saturating_sub(s)).unwrap_or(0)
    });
    for w in wanted {
        let raw = if !own.contains(w.as_str()) {
            Raw::failed(item, Some(w), "no such workload on this device")
        } else {
            // The workload's container as Podman lists it (its canonical name first, should a stale one remain).
            let name = w.container_name();
            let c = listed
                .iter()
                .filter(|c| c.workload.as_deref() == Some(w.as_str()))
                .min_by_key(|c| c.name != name);
            match c {
                None => Raw::failed(
                    item,
                    Some(w),
                    "the workload has no container on this device (yet)",
                ),
                Some(c) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    match p.logs_tail(&c.id, request.lines, since, left.min(PODMAN_CALL)) {
                        Ok(t) => Raw {
                            item,
                            workload: Some(w),
                            text: t.text,
                            cut: t.cut,
                            error: t.stopped,
                        },
                        Err(e) => Raw::failed(item, Some(w), format!("reading the log: {e}")),
                    }
                }
            }
        };
        send(Found::Section(raw));
    }
}
