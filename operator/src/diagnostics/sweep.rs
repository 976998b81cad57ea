//! Request and bundle keys whose object is gone are deleted by a periodic sweep, not a finalizer (a finalizer on a
//! request would wedge its deletion while the operator is away). A key is gone only when no DeviceDiagnostics in
//! the cluster has its UID — checked with one unfiltered list, so that an operator with a label selector never
//! deletes the requests or bundles of objects it does not watch.

use crate::crd::diagnostics::DeviceDiagnostics;
use async_nats::jetstream::kv::Store;
use futures::StreamExt;
use std::collections::HashSet;

/// How often the sweep runs.
pub const EVERY: std::time::Duration = std::time::Duration::from_secs(300);
/// Most keys read from a bucket by one sweep (and by the controller's listing of the open requests).
pub const MAX_KEYS: usize = 20_000;
/// Most keys deleted by one sweep (the next takes the rest).
pub const MAX_DELETES: usize = 200;

/// The keys of `store` (`<device>.<uid>`) with their request UID, at most [`MAX_KEYS`]; keys of another shape are
/// left out.
pub async fn keys(store: &Store) -> Result<Vec<(String, String)>, String> {
    let name = store.name.clone();
    let mut keys = store
        .keys()
        .await
        .map_err(|e| format!("list {name} keys: {e}"))?;
    let mut out = vec![];
    while let Some(k) = keys.next().await {
        let k = k.map_err(|e| format!("list {name} keys: {e}"))?;
        if out.len() >= MAX_KEYS {
            break;
        }
        if let Ok((_, uid)) = fleet_wire::kv::parse_run_key(&k) {
            out.push((k, uid.to_string()));
        }
    }
    Ok(out)
}

/// Deletes the keys of `stores` (the request and the bundle bucket) whose request UID is neither in `known` (the
/// cache) nor on any object in the cluster; returns how many it deleted.
pub async fn run(
    client: &kube::Client,
    stores: &[&Store],
    known: &HashSet<String>,
) -> Result<usize, String> {
    let mut candidates = vec![];
    for (i, store) in stores.iter().enumerate() {
        for (k, uid) in keys(store).await? {
            if candidates.len() >= MAX_DELETES {
                break;
            }
            if !known.contains(&uid) {
                candidates.push((i, k, uid));
            }
        }
    }
    if candidates.is_empty() {
        return Ok(0);
    }
    let api = kube::Api::<DeviceDiagnostics>::all(client.clone());
    let mut everywhere = HashSet::new();
    let mut params = kube::api::ListParams::default().limit(500);
    loop {
        let page = api
            .list_metadata(&params)
            .await
            .map_err(|e| format!("list DeviceDiagnostics: {e}"))?;
        everywhere.extend(page.items.into_iter().filter_map(|o| o.metadata.uid));
        match page.metadata.continue_ {
            Some(c) if !c.is_empty() => params = params.continue_token(&c),
            _ => break,
        }
    }
    let mut deleted = 0;
    for (i, key, uid) in candidates {
        if everywhere.contains(&uid) {
            continue;
        }
        let store = stores[i];
        store
            .delete(&key)
            .await
            .map_err(|e| format!("delete {}/{key}: {e}", store.name))?;
        log::info!(
            "diagnostics: deleted {}/{key}: its DeviceDiagnostics is gone",
            store.name
        );
        deleted += 1;
    }
    Ok(deleted)
}
