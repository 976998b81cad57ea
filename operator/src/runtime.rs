//! The operator's one runtime, built once by `main` and taken by every controller and the dashboard: the
//! Kubernetes client, one watch and cache per fleet kind, the one NATS connection with its settings, and the NATS
//! mirrors that more than one of them reads (heartbeats for liveness, device info for capabilities, workload status
//! for crash loops). Nothing of it is a process global.

use crate::cache::Caches;
use crate::deployments::engine::{heartbeat_mirror, workload_mirror, HeartbeatWatch};
use crate::kv::{Mirror, NatsSettings};
use crate::nats_link::NatsLink;
use fleet_wire::kv as layout;
use fleet_wire::{DeviceInfo, DeviceRetirement, DeviceWorkloadStatus, Heartbeat};
use kube::Client;
use std::sync::Arc;

/// What the controllers share.
pub struct Runtime {
    /// The Kubernetes client.
    pub client: Client,
    /// One reflector cache per kind, filtered by the operator's label selector.
    pub caches: Caches,
    /// The one NATS connection (URL, TLS and bucket settings).
    pub nats: Arc<NatsLink>,
    /// Which devices' heartbeats someone waits on (the deployments controller's pass), so that a heartbeat that
    /// changes nothing else wakes only them.
    pub heartbeat_watch: HeartbeatWatch,
    /// The heartbeat mirror: the deployments controller keeps it current, the dashboard and alerts read liveness.
    pub heartbeats: Arc<Mirror<Heartbeat>>,
    /// The device-info mirror: the deployments controller keeps it current, the TaskRun controller reads
    /// capabilities from it.
    pub info: Arc<Mirror<DeviceInfo>>,
    /// The workload-status mirror: the deployments controller keeps it current, the alerts read crash-looping
    /// workloads from it.
    pub workloads: Arc<Mirror<DeviceWorkloadStatus>>,
    /// The TaskRun controller publishes each device's reasons here; the deployments controller, the one writer of
    /// Device status, lists them in `status.blocking` ([`crate::task_reasons`]).
    pub task_reasons: Arc<crate::task_reasons::TaskReasons>,
    /// The tombstones of retired devices (`device-retired`): the deployments controller keeps it current and
    /// decides from it (no Device is created or placed for a retired device); the retirement controller
    /// ([`crate::retire`]) writes and lifts them.
    pub retired: Arc<Mirror<DeviceRetirement>>,
}

impl Runtime {
    /// Starts the watches of every kind (objects matching `label_selector`) and prepares the NATS connection to
    /// `nats_url`, made on first use.
    pub fn new(
        client: Client,
        label_selector: &Option<String>,
        nats_url: &str,
        nats: NatsSettings,
    ) -> Self {
        let heartbeat_watch = HeartbeatWatch::default();
        Self {
            caches: Caches::watch(&client, label_selector),
            client,
            nats: NatsLink::new(nats_url, nats),
            heartbeats: heartbeat_mirror(heartbeat_watch.clone()),
            workloads: workload_mirror(heartbeat_watch.clone()),
            heartbeat_watch,
            info: Mirror::new(layout::DEVICE_INFO),
            task_reasons: Arc::default(),
            retired: Mirror::new(layout::DEVICE_RETIRED),
        }
    }
}
