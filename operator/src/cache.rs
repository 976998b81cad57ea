//! Kubernetes object caches for the controllers: a reflector store per kind, filtered by the operator's label
//! selector, whose watch wakes the controller on every change.
//!
//! Objects are watched raw and decoded here, so that the fields a fleet kind's schema does not know (the CRDs keep
//! them for the admission webhook to refuse, see [`crate::schema`]) stay visible after the typed decode drops them:
//! each cached fleet object carries their paths in [`crate::schema::UNKNOWN_FIELDS_ANNOTATION`] (in memory only;
//! the operator never writes it), and every controller refuses to act on such an object even when no webhook
//! refused it (the webhook missing, bypassed or failing open).

use futures::StreamExt;
use kube::api::{ApiResource, DynamicObject};
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
    let (reader, mut writer) = reflector::store::<K>();
    let mut config = watcher::Config::default();
    if let Some(sel) = selector {
        config = config.labels(sel);
    }
    let api = Api::<DynamicObject>::all_with(client.clone(), &ApiResource::erase::<K>(&()));
    let stream = watcher(api, config).default_backoff();
    let notify = notify.clone();
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
                    }
                    Err((init, e)) => {
                        undecodable |= init;
                        log::error!("watch of {}: {e}", K::kind(&()));
                    }
                },
                Err(e) => log::warn!("watch of {}: {e}", K::kind(&())),
            }
            notify.notify_one();
        }
    });
    reader
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

/// `o` as a `K`, its unknown fields (by `K`'s fleet schema) in the marker annotation.
fn decode<K>(o: DynamicObject) -> Result<K, serde_json::Error>
where
    K: kube::Resource<DynamicType = ()> + serde::de::DeserializeOwned,
{
    let raw = serde_json::to_value(&o)?;
    let unknown = crate::schema::of(&K::kind(&()))
        .map(|root| crate::schema::unknown_fields(root, &raw))
        .unwrap_or_default();
    let mut k: K = serde_json::from_value(raw)?;
    crate::schema::mark_unknown(k.meta_mut(), &unknown);
    Ok(k)
}
