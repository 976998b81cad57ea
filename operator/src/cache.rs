//! Kubernetes object caches for the controllers: a reflector store per kind, filtered by the operator's label
//! selector, whose watch wakes the controller on every change.

use futures::StreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client};
use std::sync::Arc;
use tokio::sync::Notify;

/// A cache of every `K` (in all namespaces) matching `selector`, kept by a spawned watch that wakes `notify` on
/// every event; watch errors are logged and retried with backoff.
pub fn cache<K>(client: &Client, selector: &Option<String>, notify: &Arc<Notify>) -> Store<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store::<K>();
    let mut config = watcher::Config::default();
    if let Some(sel) = selector {
        config = config.labels(sel);
    }
    let stream = reflector::reflector(writer, watcher(Api::<K>::all(client.clone()), config))
        .default_backoff();
    let notify = notify.clone();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(ev) = stream.next().await {
            if let Err(e) = ev {
                log::warn!("watch of {}: {e}", K::kind(&()));
            }
            notify.notify_one();
        }
    });
    reader
}
