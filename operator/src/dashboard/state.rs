//! What the dashboard reads: the operator's caches of Device, DeviceGroup, TaskRun, FleetDeployment and
//! AgentRelease objects (the controllers' watches), the NATS buckets it reads single keys from (never whole
//! buckets), the FleetLock server's last status and the current alerts.

use super::alerts::{Alert, Thresholds};
use crate::crd::tasks::TaskRun;
use crate::crd::{AgentRelease, Device, DeviceGroup, FleetDeployment};
use crate::kv::{Mirror, NatsError};
use async_nats::jetstream::kv::Store;
use fleet_wire::fleetlock::ServerStatus;
use fleet_wire::{DeviceWorkloadStatus, Heartbeat, Timestamp, WorkloadState};
use kube::runtime::reflector;
use serde::de::DeserializeOwned;
use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

/// The buckets the dashboard reads keys from.
pub struct Buckets {
    stores: BTreeMap<&'static str, Store>,
}

impl Buckets {
    /// Opens (creating if missing, as the operator does) every bucket of the layout.
    pub async fn open(
        js: &async_nats::jetstream::Context,
        buckets: &crate::kv::Buckets,
    ) -> Result<Self, NatsError> {
        Ok(Self {
            stores: crate::kv::ensure_buckets(js, buckets).await?,
        })
    }

    /// The store of `bucket`.
    pub fn store(&self, bucket: &str) -> Result<&Store, NatsError> {
        self.stores.get(bucket).ok_or_else(|| NatsError {
            op: format!("open {bucket}"),
            message: "not a bucket of the layout".into(),
        })
    }

    /// Reads and parses one key: `Ok(None)` when absent or deleted; a value that does not parse is an error that
    /// names the key.
    pub async fn get<T: DeserializeOwned>(
        &self,
        bucket: &'static str,
        key: &str,
    ) -> Result<Option<T>, NatsError> {
        let bytes = self.raw(bucket, key).await?;
        match bytes {
            None => Ok(None),
            Some(b) => serde_json::from_slice(&b).map(Some).map_err(|e| NatsError {
                op: format!("read {bucket}/{key}"),
                message: format!(
                    "invalid value: {}",
                    fleet_wire::text::for_log(&e.to_string())
                ),
            }),
        }
    }
}

impl Buckets {
    /// Whether `key` was ever written and is still on record (present, or removed with a marker).
    pub async fn on_record(&self, bucket: &'static str, key: &str) -> Result<bool, NatsError> {
        let store = self.store(bucket)?;
        tokio::time::timeout(crate::kv::NATS_REQUEST_TIMEOUT, store.entry(key))
            .await
            .map_err(|_| NatsError {
                op: format!("read {bucket}/{key}"),
                message: "timed out".into(),
            })?
            .map(|e| e.is_some())
            .map_err(|e| NatsError {
                op: format!("read {bucket}/{key}"),
                message: e.to_string(),
            })
    }

    /// Reads one key's raw bytes (at most the bucket's value limit).
    pub async fn raw(&self, bucket: &'static str, key: &str) -> Result<Option<Vec<u8>>, NatsError> {
        let store = self.store(bucket)?;
        tokio::time::timeout(crate::kv::NATS_REQUEST_TIMEOUT, store.get(key))
            .await
            .map_err(|_| NatsError {
                op: format!("read {bucket}/{key}"),
                message: "timed out".into(),
            })?
            .map(|b| b.map(|b| b.to_vec()))
            .map_err(|e| NatsError {
                op: format!("read {bucket}/{key}"),
                message: e.to_string(),
            })
    }
}

/// The FleetLock server's status as last fetched.
#[derive(Debug, Clone)]
pub struct FleetLockView {
    /// When it was fetched.
    pub fetched_at: Timestamp,
    /// The status, or why it could not be read.
    pub status: Result<ServerStatus, String>,
}

/// Everything the pages read, shared by the server and the alert loop.
pub struct State {
    /// Device objects.
    pub devices: reflector::Store<Device>,
    /// DeviceGroup objects.
    pub groups: reflector::Store<DeviceGroup>,
    /// TaskRun objects (every namespace).
    pub runs: reflector::Store<TaskRun>,
    /// FleetDeployment objects (cluster-scoped).
    pub deployments: reflector::Store<FleetDeployment>,
    /// AgentRelease objects (cluster-scoped).
    pub releases: reflector::Store<AgentRelease>,
    /// DeviceDiagnostics (the device page lists a device's newest).
    pub diagnostics: reflector::Store<crate::crd::diagnostics::DeviceDiagnostics>,
    /// `device-heartbeat`, mirrored by the control loop: liveness is read here, not from the Device's
    /// `lastHeartbeat` (written only at a slow refresh: the deployments controller's `mirror::HEARTBEAT_REFRESH`).
    pub heartbeats: Arc<Mirror<Heartbeat>>,
    /// `device-workload-status`, mirrored by the control loop: the workloads of a device whose Device counts some
    /// crash-looping are read here (the alerts).
    pub workloads: Arc<Mirror<DeviceWorkloadStatus>>,
    /// `device-info`, mirrored by the control loop: the Reboots page reads each device's FleetLock client id here.
    pub info: Arc<Mirror<fleet_wire::DeviceInfo>>,
    /// NATS, once connected.
    pub nats: RwLock<Option<Arc<Buckets>>>,
    /// `None` when no FleetLock server is configured or it was not read yet.
    pub fleetlock: RwLock<Option<FleetLockView>>,
    /// The alerts of the last evaluation.
    pub alerts: RwLock<Vec<Alert>>,
    /// Alert thresholds.
    pub thresholds: Thresholds,
    /// The fleet's agent versions over the last day (one sample a minute).
    pub version_history: std::sync::Mutex<super::version_history::VersionHistory>,
}

impl State {
    /// The agent-version samples, oldest first.
    pub fn version_samples(&self) -> Vec<super::version_history::Sample> {
        self.version_history
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .samples()
    }

    /// When `device` last beat (its own clock): the mirrored heartbeat, else (the mirror not read yet) the
    /// Device's `lastHeartbeat`.
    pub fn last_heartbeat(&self, device: &Device) -> Option<Timestamp> {
        let name = device.metadata.name.as_deref().unwrap_or_default();
        self.heartbeats
            .with(name, |s| s.and_then(|s| s.value.as_ref()).map(|h| h.at))
            .or_else(|| {
                device
                    .status
                    .as_ref()
                    .and_then(|s| s.last_heartbeat.as_deref())
                    .and_then(super::html::parse_time)
            })
    }

    /// What the operator knows of `device`'s heartbeats, for [`crate::liveness::judge`]: whether (and since when)
    /// the heartbeat mirror is watched, the mirrored heartbeat with when NATS stored it, and the Device's
    /// `lastHeartbeat`.
    pub fn heartbeat_facts(&self, device: &Device) -> crate::liveness::Facts {
        let name = device.metadata.name.as_deref().unwrap_or_default();
        crate::liveness::Facts {
            watched_since: self.heartbeats.watched_since(),
            beat: self.heartbeats.with(name, |s| {
                let s = s?;
                Some(crate::liveness::Beat::of(s.value.as_deref()?, s))
            }),
            recorded: device
                .status
                .as_ref()
                .and_then(|s| s.last_heartbeat.as_deref())
                .and_then(super::html::parse_time),
            offset_secs: device.status.as_ref().and_then(|s| s.clock_offset_seconds),
        }
    }

    /// The workloads `device` reports crash-looping, with their restarts, read from the workload-status mirror
    /// only when its Device counts some (`status.workloads.crashLooping`).
    pub fn looping_workloads(
        &self,
        device: &Device,
    ) -> Vec<(String, Option<fleet_wire::Restarts>)> {
        self.reported_workloads(
            device,
            |h| h.crash_looping > 0,
            |w| (w.state == WorkloadState::CrashLooping).then_some(w.restarts),
        )
    }

    /// The workloads `device` reports running but `unhealthy`, with their error, read from the workload-status
    /// mirror only when its Device counts failed workloads (an unhealthy one is counted failed).
    pub fn unhealthy_workloads(&self, device: &Device) -> Vec<(String, String)> {
        self.reported_workloads(
            device,
            |h| h.failed > 0,
            |w| {
                (w.health == Some(fleet_wire::HealthState::Unhealthy)).then(|| {
                    // The device's own words: logged and put in an Event, so no control character of it
                    // (a newline forging a log line) passes as it is.
                    let error = w.error.as_ref().map(|e| e.as_str()).unwrap_or("unhealthy");
                    error.escape_debug().to_string()
                })
            },
        )
    }

    /// Each workload of `device`'s report that `pick` picks, by name, read from the workload-status mirror only
    /// when the Device's own counts say there is something to find (`counted`): a pass over the alerts reads
    /// no report of a healthy device.
    fn reported_workloads<T>(
        &self,
        device: &Device,
        counted: impl Fn(&crate::crd::WorkloadHealth) -> bool,
        pick: impl Fn(&fleet_wire::WorkloadStatus) -> Option<T>,
    ) -> Vec<(String, T)> {
        let counted = device
            .status
            .as_ref()
            .and_then(|s| s.workloads.as_ref())
            .is_some_and(counted);
        if !counted {
            return Vec::new();
        }
        let name = device.metadata.name.as_deref().unwrap_or_default();
        self.workloads.with(name, |s| {
            s.and_then(|s| s.value.as_deref())
                .map(|st| {
                    st.workloads
                        .iter()
                        .filter_map(|w| Some((w.name.as_str().to_owned(), pick(w)?)))
                        .collect()
                })
                .unwrap_or_default()
        })
    }

    /// The NATS buckets, or why there are none yet.
    pub fn buckets(&self) -> Result<Arc<Buckets>, NatsError> {
        self.nats
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| NatsError {
                op: "connect".into(),
                message: "not connected to NATS yet".into(),
            })
    }

    /// The current alerts.
    pub fn alerts(&self) -> Vec<Alert> {
        self.alerts
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The last FleetLock status.
    pub fn fleetlock(&self) -> Option<FleetLockView> {
        self.fleetlock
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}
