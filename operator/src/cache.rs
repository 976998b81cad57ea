//! Kubernetes object caches for the controllers: one reflector store per kind for the whole operator, filtered by
//! the operator's label selector, whose watch wakes every controller that reads it on every change.
//!
//! Objects are watched raw and decoded here, so that the fields a fleet kind's schema does not know (the CRDs keep
//! them for the admission webhook to refuse, see [`crate::schema`]) stay visible after the typed decode drops them:
//! each cached fleet object carries their paths in [`crate::schema::UNKNOWN_FIELDS_ANNOTATION`] (in memory only;
//! the operator never writes it), and every controller refuses to act on such an object even when no webhook
//! refused it (the webhook missing, bypassed or failing open).

use crate::crd::diagnostics::DeviceDiagnostics;
use crate::crd::policy::WorkloadPolicy;
use crate::crd::tasks::{TaskRun, TaskSchedule};
use crate::crd::{AgentRelease, Device, DeviceGroup, FleetDeployment};
use futures::StreamExt;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client};
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

/// One watch and one cache of every `K` (in all namespaces) matching the operator's label selector, shared by
/// every controller of the process ([`Caches`]): each controller [`Shared::subscribe`]s with its own `Notify`,
/// woken on every event. Watch errors are logged and retried with backoff.
pub struct Shared<K: kube::Resource<DynamicType = ()> + 'static> {
    store: Store<K>,
    wakers: Arc<Mutex<Vec<Arc<Notify>>>>,
    /// True once the first list is in the store. Kept here because the store's own `wait_until_ready` wakes
    /// only the last of several tasks waiting at once (one oneshot waker), and every controller waits.
    ready: tokio::sync::watch::Receiver<bool>,
}

impl<K: kube::Resource<DynamicType = ()> + 'static> Clone for Shared<K> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            wakers: self.wakers.clone(),
            ready: self.ready.clone(),
        }
    }
}

impl<K> Shared<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    /// Starts the watch of `K` objects matching `selector`.
    pub fn watch(client: &Client, selector: &Option<String>) -> Self {
        let (reader, mut writer) = reflector::store::<K>();
        let mut config = watcher::Config::default();
        if let Some(sel) = selector {
            config = config.labels(sel);
        }
        let api = Api::<DynamicObject>::all_with(client.clone(), &ApiResource::erase::<K>(&()));
        let stream = watcher(api, config).default_backoff();
        let wakers: Arc<Mutex<Vec<Arc<Notify>>>> = Arc::default();
        let wake = wakers.clone();
        let (ready_tx, ready) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            // An object that does not decode during a (re)list keeps that list from replacing the cache: a missing
            // object must never look deleted (a deleted deployment's workloads are removed).
            let mut undecodable = false;
            while let Some(ev) = stream.next().await {
                match ev {
                    Ok(ev) => match typed::<K>(ev) {
                        Ok(watcher::Event::InitDone) if undecodable => {
                            log::error!(
                                "list of {}: an object did not decode; the cache keeps what it had",
                                K::kind(&())
                            );
                        }
                        Ok(ev) => {
                            if matches!(ev, watcher::Event::Init) {
                                undecodable = false;
                            }
                            writer.apply_watcher_event(&ev);
                            if matches!(ev, watcher::Event::InitDone) {
                                ready_tx.send_replace(true);
                            }
                        }
                        Err((init, e)) => {
                            undecodable |= init;
                            log::error!("watch of {}: {e}", K::kind(&()));
                        }
                    },
                    Err(e) => log::warn!("watch of {}: {e}", K::kind(&())),
                }
                for n in wake.lock().unwrap_or_else(|p| p.into_inner()).iter() {
                    n.notify_one();
                }
            }
        });
        Self {
            store: reader,
            wakers,
            ready,
        }
    }

    /// Waits until the first list is in the cache (never a partial view); any number of tasks may wait at once.
    pub async fn ready(&self) -> Result<(), reflector::store::WriterDropped> {
        if self.ready.clone().wait_for(|r| *r).await.is_ok() {
            return Ok(());
        }
        // The watch ended before its first list: the store reports its writer dropped.
        self.store.wait_until_ready().await
    }

    /// True once the first list is in the cache; never false again (a watch that restarts keeps what it had).
    pub fn synced(&self) -> bool {
        *self.ready.borrow()
    }

    /// What the cache holds now, without subscribing (the admission webhook reads it per request).
    pub fn state(&self) -> Vec<Arc<K>> {
        self.store.state()
    }

    /// The cache, with `notify` woken on every event from now on.
    pub fn subscribe(&self, notify: &Arc<Notify>) -> Store<K> {
        self.wakers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(notify.clone());
        self.store.clone()
    }
}

/// The operator's caches, one per kind, made once by `main` and shared by the deployments controller, the task
/// controllers and the dashboard (so the API server serves one watch per kind, and each object is decoded and held
/// once).
#[derive(Clone)]
pub struct Caches {
    /// Devices.
    pub devices: Shared<Device>,
    /// DeviceGroups.
    pub groups: Shared<DeviceGroup>,
    /// FleetDeployments.
    pub deployments: Shared<FleetDeployment>,
    /// AgentReleases.
    pub releases: Shared<AgentRelease>,
    /// TaskRuns.
    pub runs: Shared<TaskRun>,
    /// TaskSchedules.
    pub schedules: Shared<TaskSchedule>,
    /// WorkloadPolicies (the deployments controller and the admission webhook).
    pub policies: Shared<WorkloadPolicy>,
    /// DeviceDiagnostics (the diagnostics controller and the dashboard).
    pub diagnostics: Shared<DeviceDiagnostics>,
}

impl Caches {
    /// Starts one watch per kind, filtered by `selector` (the operator's `FLEET_LABEL_SELECTOR`).
    pub fn watch(client: &Client, selector: &Option<String>) -> Self {
        Self {
            devices: Shared::watch(client, selector),
            groups: Shared::watch(client, selector),
            deployments: Shared::watch(client, selector),
            releases: Shared::watch(client, selector),
            runs: Shared::watch(client, selector),
            schedules: Shared::watch(client, selector),
            policies: Shared::watch(client, selector),
            diagnostics: Shared::watch(client, selector),
        }
    }
}

/// The typed event of a raw one, with unknown fields marked (see the module docs). `Err` carries whether the
/// object came from a list, and why it did not decode.
fn typed<K>(
    ev: watcher::Event<DynamicObject>,
) -> Result<watcher::Event<K>, (bool, serde_json::Error)>
where
    K: kube::Resource<DynamicType = ()> + serde::de::DeserializeOwned,
{
    use watcher::Event;
    Ok(match ev {
        Event::Init => Event::Init,
        Event::InitDone => Event::InitDone,
        Event::InitApply(o) => Event::InitApply(decode(o).map_err(|e| (true, e))?),
        Event::Apply(o) => Event::Apply(decode(o).map_err(|e| (false, e))?),
        Event::Delete(o) => Event::Delete(decode(o).map_err(|e| (false, e))?),
    })
}

/// `o` as a `K`, its unknown fields (by `K`'s fleet schema) in the marker annotation, without its
/// `managedFields`: the API server's record of who set which field, which no controller reads, is most of a cached
/// Device's memory (a JSON tree of every status field it ever had, per writer), at 100,000 devices hundreds of MiB.
fn decode<K>(mut o: DynamicObject) -> Result<K, serde_json::Error>
where
    K: kube::Resource<DynamicType = ()> + serde::de::DeserializeOwned,
{
    o.metadata.managed_fields = None;
    let raw = serde_json::to_value(&o)?;
    let unknown = crate::schema::of(&K::kind(&()))
        .map(|root| crate::schema::unknown_fields(root, &raw))
        .unwrap_or_default();
    let mut k: K = serde_json::from_value(raw)?;
    crate::schema::mark_unknown(k.meta_mut(), &unknown);
    Ok(k)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cached_object_keeps_its_fields_but_not_the_servers_field_ownership() {
        let o: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "Device",
            "metadata": {"name": "d1", "labels": {"site": "a"}, "resourceVersion": "7",
                "managedFields": [{"manager": "fleet-operator", "operation": "Update", "subresource": "status",
                    "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:os": {}}}}]},
            "spec": {}, "status": {"os": "Debian GNU/Linux 12"}
        }))
        .expect("object");
        assert!(o.metadata.managed_fields.is_some());
        let d: Device = decode(o).expect("decodes");
        assert_eq!(d.metadata.managed_fields, None);
        assert_eq!(d.metadata.resource_version.as_deref(), Some("7"));
        assert_eq!(
            d.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("site"))
                .map(String::as_str),
            Some("a")
        );
        assert_eq!(
            d.status.and_then(|s| s.os).as_deref(),
            Some("Debian GNU/Linux 12")
        );
    }
}
