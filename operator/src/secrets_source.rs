//! Reading the Kubernetes Secrets the FleetDeployments name, from one namespace (the operator's secrets namespace,
//! docs/secrets.md), without holding every Secret of the cluster: a metadata-only watch of the namespace's Secrets
//! (names and `resourceVersion`s, no data) wakes the control loop when a Secret a deployment names changes, and the
//! data of only those Secrets is read with a GET, kept by `(name, resourceVersion)` and dropped when no deployment
//! names it any more. The watch starts with the first pass that needs a Secret, so an operator whose deployments
//! name none never lists Secrets. Nothing here logs a value.

use crate::deployments::secrets::{SecretData, SecretState};
use base64::Engine as _;
use fleet_wire::secrets::Hidden;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::core::PartialObjectMeta;
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, RwLock};
use tokio::sync::Notify;

/// The namespace Secrets are read from when none is given (operator/deploy/rbac.yaml creates it and grants the
/// operator its Secrets). Never the operator's own namespace: that one holds the operator's NATS password and its
/// webhook's key, which whoever may write a FleetDeployment could otherwise have delivered to a device.
pub const DEFAULT_NAMESPACE: &str = "harmony-fleet-secrets";

/// The Secrets of one namespace as the control loop needs them.
pub struct SecretSource {
    client: Client,
    namespace: String,
    /// Name → `resourceVersion`, from the metadata watch; `None` until its first list is in.
    versions: Arc<RwLock<Option<BTreeMap<String, String>>>>,
    /// The names the latest pass needed: only their changes wake the loop.
    wanted: Arc<RwLock<BTreeSet<String>>>,
    /// Secrets read, by name.
    cache: Mutex<BTreeMap<String, SecretState>>,
    watching: std::sync::Once,
}

impl SecretSource {
    /// A source of `namespace`'s Secrets; nothing is read until [`Self::read`] needs it.
    pub fn new(client: Client, namespace: impl Into<String>) -> Arc<Self> {
        Arc::new(Self {
            client,
            namespace: namespace.into(),
            versions: Arc::default(),
            wanted: Arc::default(),
            cache: Mutex::default(),
            watching: std::sync::Once::new(),
        })
    }

    /// The namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The state of each Secret in `names`, read from the cache when the watch says it is unchanged, else with a
    /// GET. `wake` is woken when one of them changes later (the watch starts on the first call that names one).
    pub async fn read(
        &self,
        names: &BTreeSet<String>,
        wake: &Arc<Notify>,
    ) -> BTreeMap<String, SecretState> {
        *self.wanted.write().unwrap_or_else(|p| p.into_inner()) = names.clone();
        if names.is_empty() {
            self.cache.lock().unwrap_or_else(|p| p.into_inner()).clear();
            return BTreeMap::new();
        }
        self.watching.call_once(|| self.start_watch(wake.clone()));
        let versions = self
            .versions
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        let mut out = BTreeMap::new();
        for name in names {
            let listed = versions.as_ref().map(|v| v.get(name));
            let cached = self
                .cache
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(name)
                .cloned();
            let state = match (listed, cached) {
                (Some(Some(v)), Some(SecretState::Found(d))) if d.version == *v => {
                    SecretState::Found(d)
                }
                // Unknown to the watch (not listed yet, no RBAC for it, or created a moment ago: a Secret made
                // just before the deployment that names it is no reason for a SecretMissing warning), new, or
                // changed: read it. A Secret that stays missing costs one GET per pass.
                _ => match api.get_opt(name).await {
                    Ok(Some(s)) => SecretState::Found(Arc::new(data_of(s))),
                    Ok(None) => SecretState::Missing,
                    Err(e) => SecretState::Unreadable(e.to_string()),
                },
            };
            out.insert(name.clone(), state);
        }
        *self.cache.lock().unwrap_or_else(|p| p.into_inner()) = out.clone();
        out
    }

    fn start_watch(&self, wake: Arc<Notify>) {
        // Metadata only: the API server sends names and versions, never the data of Secrets nobody named.
        let api: Api<PartialObjectMeta<Secret>> =
            Api::namespaced(self.client.clone(), &self.namespace);
        let stream = watcher(api, watcher::Config::default()).default_backoff();
        let (versions, wanted, ns) = (
            self.versions.clone(),
            self.wanted.clone(),
            self.namespace.clone(),
        );
        log::info!("watching the names and versions of the Secrets in namespace {ns}");
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            let mut listing: BTreeMap<String, String> = BTreeMap::new();
            while let Some(ev) = stream.next().await {
                let ev = match ev {
                    Ok(ev) => ev,
                    Err(e) => {
                        log::warn!("watch of Secrets in {ns}: {e}");
                        continue;
                    }
                };
                let is_wanted =
                    |n: &str| wanted.read().unwrap_or_else(|p| p.into_inner()).contains(n);
                let name_version = |m: &PartialObjectMeta<Secret>| {
                    (
                        m.metadata.name.clone().unwrap_or_default(),
                        m.metadata.resource_version.clone().unwrap_or_default(),
                    )
                };
                let changed = match ev {
                    watcher::Event::Init => {
                        listing.clear();
                        false
                    }
                    watcher::Event::InitApply(m) => {
                        let (n, v) = name_version(&m);
                        listing.insert(n, v);
                        false
                    }
                    watcher::Event::InitDone => {
                        *versions.write().unwrap_or_else(|p| p.into_inner()) =
                            Some(std::mem::take(&mut listing));
                        true
                    }
                    watcher::Event::Apply(m) => {
                        let (n, v) = name_version(&m);
                        let wake = is_wanted(&n);
                        if let Some(map) =
                            versions.write().unwrap_or_else(|p| p.into_inner()).as_mut()
                        {
                            map.insert(n, v);
                        }
                        wake
                    }
                    watcher::Event::Delete(m) => {
                        let (n, _) = name_version(&m);
                        let wake = is_wanted(&n);
                        if let Some(map) =
                            versions.write().unwrap_or_else(|p| p.into_inner()).as_mut()
                        {
                            map.remove(&n);
                        }
                        wake
                    }
                };
                if changed {
                    wake.notify_one();
                }
            }
        });
    }
}

/// The parts of a Secret the planner reads: its version, type and data as base64 (kept [`Hidden`]).
pub fn data_of(s: Secret) -> SecretData {
    let b = base64::engine::general_purpose::STANDARD;
    SecretData {
        version: s.metadata.resource_version.unwrap_or_default(),
        type_: s.type_.unwrap_or_else(|| "Opaque".into()),
        data: s
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, Hidden(b.encode(v.0))))
            .collect(),
    }
}
