//! Alerts, always evaluated and published as Kubernetes events, and the read-only dashboard served by the
//! operator (its own listen address, off by default): fleet overview, device pages, task run history with
//! per-device results, agent releases and deployments with their rollouts, reboots (FleetLock holders) and
//! alerts, as server-rendered HTML that needs no JavaScript; `/metrics` for Prometheus. Access to the pages
//! needs the dashboard's token.
//!
//! A product folder: it takes CRD types, caches, KV helpers and the event recorder from the operator's shared
//! modules and nothing from `engine.rs` or another product folder.

pub mod alerts;
pub mod auth;
pub mod bars;
pub mod blocking;
pub mod device;
pub mod diagnostics;
pub mod events;
pub mod fleet_counts;
pub mod holder_devices;
pub mod holds;
pub mod html;
pub mod metrics;
pub mod named_devices;
pub mod overview;
pub mod reboots;
pub mod rollouts;
pub mod runs;
pub mod server;
pub mod state;
pub mod timeline;
pub mod version_history;

use crate::nats_link::NatsLink;
use alerts::{DeviceFacts, RunFacts, Thresholds};
use fleet_wire::Timestamp;
use kube::Client;
use state::{Buckets, FleetLockView, State};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::sync::Notify;

/// How often the FleetLock status is read, and alerts evaluated at the latest.
pub const ALERT_INTERVAL: Duration = Duration::from_secs(15);
/// Least time between two alert evaluations (a change of a watched object wakes one).
pub const ALERT_DEBOUNCE: Duration = Duration::from_secs(1);

/// Where and how the dashboard's pages and `/metrics` are served.
#[derive(Debug, Clone)]
pub struct Serve {
    /// Where to listen, e.g. `0.0.0.0:8081`.
    pub listen: String,
    /// The access token.
    pub token: auth::Token,
}

/// How the alerts and (when served) the dashboard run.
#[derive(Debug, Clone)]
pub struct Options {
    /// The pages and `/metrics`; `None`: off (alerts and their events run all the same).
    pub serve: Option<Serve>,
    /// Only objects with these labels (the operator's `FLEET_LABEL_SELECTOR`).
    pub label_selector: Option<String>,
    /// The FleetLock server to show, if any.
    pub fleetlock: Option<reboots::FleetLockSource>,
    /// When conditions become alerts.
    pub thresholds: Thresholds,
    /// The operator's Pod, for events about the FleetLock server.
    pub pod: events::OwnPod,
    /// The event reporter's instance name.
    pub instance: Option<String>,
}

/// Evaluates the alerts and publishes their events, always; binds `opts.serve`'s address when given and serves
/// the dashboard. Returns only on a bind error (the caller exits).
pub async fn run(rt: &crate::runtime::Runtime, opts: Options) -> Result<(), String> {
    let (client, caches, nats) = (rt.client.clone(), &rt.caches, rt.nats.clone());
    let heartbeats = rt.heartbeats.clone();
    let listener = match &opts.serve {
        Some(s) => Some(
            tokio::net::TcpListener::bind(&s.listen)
                .await
                .map_err(|e| format!("dashboard: listen on {}: {e}", s.listen))?,
        ),
        None => None,
    };
    let notify = Arc::new(Notify::new());
    // The heartbeat mirror wakes the alerts when it has read the bucket (liveness is judged from then on) and for
    // the heartbeats that wake the control loop (a first one, a new agent version).
    heartbeats.subscribe(&notify);
    // Only pages read deployments and releases (no alert depends on them): their changes wake nothing.
    let unheard = Arc::new(Notify::new());
    let state = Arc::new(State {
        devices: caches.devices.subscribe(&notify),
        groups: caches.groups.subscribe(&notify),
        runs: caches.runs.subscribe(&notify),
        deployments: caches.deployments.subscribe(&unheard),
        releases: caches.releases.subscribe(&unheard),
        diagnostics: caches.diagnostics.subscribe(&unheard),
        heartbeats,
        workloads: rt.workloads.clone(),
        info: rt.info.clone(),
        nats: RwLock::new(None),
        fleetlock: RwLock::new(None),
        alerts: RwLock::new(Vec::new()),
        thresholds: opts.thresholds,
        version_history: Default::default(),
    });
    let (devices, runs) = (caches.devices.clone(), caches.runs.clone());
    let ready = async move { devices.ready().await.is_ok() && runs.ready().await.is_ok() };
    tokio::spawn(watch_alerts(
        client,
        state.clone(),
        opts.clone(),
        notify,
        ready,
    ));
    match (listener, opts.serve) {
        (Some(listener), Some(serve)) => {
            log::info!("dashboard on http://{}/", serve.listen);
            tokio::spawn(connect_nats(state.clone(), nats));
            server::serve(listener, state, Arc::new(serve.token)).await;
        }
        _ => {
            log::info!("alerts are evaluated and published as events; the dashboard is not served (--dashboard-listen)");
            std::future::pending::<()>().await;
        }
    }
    Ok(())
}

/// Opens the buckets on the operator's NATS connection (every 2 s until it answers; the connection reconnects by
/// itself afterwards).
async fn connect_nats(state: Arc<State>, nats: Arc<NatsLink>) {
    loop {
        match nats.connect().await {
            Ok((_client, js)) => match Buckets::open(&js, nats.buckets()).await {
                Ok(b) => {
                    *state.nats.write().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(b));
                    return;
                }
                Err(e) => log::warn!("dashboard: {e}"),
            },
            Err(e) => log::warn!("dashboard: {e}"),
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// On every change of a watched object (at most once per [`ALERT_DEBOUNCE`]) and every [`ALERT_INTERVAL`]:
/// evaluates the alerts and publishes an event for each new one; reads the FleetLock status every
/// [`ALERT_INTERVAL`].
async fn watch_alerts(
    client: Client,
    state: Arc<State>,
    opts: Options,
    notify: Arc<Notify>,
    ready: impl std::future::Future<Output = bool>,
) {
    let recorder = crate::fleet::report::recorder(client.clone(), opts.instance.clone());
    // Alerts are evaluated only once the caches hold the whole fleet: a partial view would miss alerts now and
    // raise them again (a second event) a moment later.
    if !ready.await {
        log::error!(
            "dashboard: the Device or TaskRun watch ended before its first list; no alerts"
        );
        return;
    }
    let mut fetched: Option<tokio::time::Instant> = None;
    loop {
        let due = fetched.is_none_or(|t| t.elapsed() >= ALERT_INTERVAL);
        if let (true, Some(src)) = (due, opts.fleetlock.clone()) {
            fetched = Some(tokio::time::Instant::now());
            let status = tokio::task::spawn_blocking(move || reboots::fetch(&src))
                .await
                .unwrap_or_else(|e| Err(e.to_string()));
            if let Err(e) = &status {
                log::warn!("dashboard: FleetLock status: {e}");
            }
            *state.fleetlock.write().unwrap_or_else(|p| p.into_inner()) = Some(FleetLockView {
                fetched_at: Timestamp::now(),
                status,
            });
        }
        let now = Timestamp::now();
        let devices = state.devices.state();
        let runs = state.runs.state();
        {
            let mut history = state
                .version_history
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if history.due(now) {
                history.record(now, &fleet_counts::versions(&devices));
            }
        }
        let fl = state.fleetlock();
        let before = state.alerts();
        let silent_before: std::collections::HashMap<&str, Option<Timestamp>> = before
            .iter()
            .filter_map(|a| match (&a.kind, &a.subject) {
                (alerts::AlertKind::DeviceSilent, alerts::Subject::Device(d)) => {
                    Some((d.as_str(), a.since))
                }
                _ => None,
            })
            .collect();
        // A Device being deleted is being retired: gone, not silent (docs/device-lifecycle.md).
        let staying = devices
            .iter()
            .filter(|d| d.metadata.deletion_timestamp.is_none());
        let mut next = alerts::evaluate(
            staying.map(|d| {
                let s = d.status.as_ref();
                DeviceFacts {
                    name: d.metadata.name.as_deref().unwrap_or(""),
                    upgrade: s.and_then(|s| s.agent_upgrade.as_ref()),
                    heartbeat: state.heartbeat_facts(d),
                    silent_before: d
                        .metadata
                        .name
                        .as_deref()
                        .and_then(|n| silent_before.get(n).copied().flatten()),
                    writes_refused: s
                        .and_then(|s| s.writes_refused.as_ref())
                        .and_then(|w| Some((w, html::parse_time(&w.last_at)?))),
                    stalled: s.and_then(|s| s.stalled.as_ref()),
                    agent_restarts: s.and_then(|s| s.agent_restarts.as_ref()),
                    looping_workloads: state.looping_workloads(d),
                    unhealthy_workloads: state.unhealthy_workloads(d),
                    usage: s.and_then(|s| s.usage.as_ref()),
                }
            }),
            runs.iter().filter_map(|r| {
                Some(RunFacts {
                    namespace: r.metadata.namespace.as_deref()?,
                    name: r.metadata.name.as_deref()?,
                    status: &r.status.as_ref()?.run,
                })
            }),
            fl.as_ref().and_then(|v| v.status.as_ref().ok()),
            &state.thresholds,
            now,
        );
        holder_devices::name_in_alerts(&mut next, fl.as_ref(), &state);
        for a in alerts::appeared(&before, &next) {
            if !a.kind.publishes_event() {
                log::warn!("alert: {}: {}: {}", a.kind.title(), a.subject, a.detail);
                continue;
            }
            log::warn!("alert: {}: {}: {}", a.kind.title(), a.subject, a.detail);
            events::publish(
                &client,
                &recorder,
                a,
                &opts.pod,
                &state.devices,
                &state.runs,
            )
            .await;
        }
        *state.alerts.write().unwrap_or_else(|p| p.into_inner()) = next;
        tokio::select! {
            _ = notify.notified() => {}
            _ = tokio::time::sleep(ALERT_INTERVAL) => {}
        }
        tokio::time::sleep(ALERT_DEBOUNCE).await;
    }
}
