//! Request keys whose object is gone are deleted by a periodic sweep, not a finalizer (a finalizer on a request
//! would wedge its deletion while the operator is away). A key is gone only when no DeviceDiagnostics in the
//! cluster has its UID — checked with one unfiltered list, so that an operator with a label selector never deletes
//! the requests of objects it does not watch.

use crate::crd::diagnostics::DeviceDiagnostics;
use async_nats::jetstream::kv::Store;
use futures::StreamExt;
use std::collections::HashSet;

/// How often the sweep runs.
pub const EVERY: std::time::Duration = std::time::Duration::from_secs(300);
/// Most keys read from the bucket by one sweep.
pub const MAX_KEYS: usize = 20_000;
/// Most keys deleted by one sweep (the next takes the rest).
pub const MAX_DELETES: usize = 200;

/// Deletes request keys of `store` whose request UID is neither in `known` (the cache) nor on any object in the
/// cluster; returns how many it deleted.
pub async fn run(
    client: &kube::Client,
    store: &Store,
    known: &HashSet<String>,
) -> Result<usize, String> {
    let mut keys = store
        .keys()
        .await
        .map_err(|e| format!("list request keys: {e}"))?;
    let mut candidates = vec![];
    let mut read = 0;
    while let Some(k) = keys.next().await {
        let k = k.map_err(|e| format!("list request keys: {e}"))?;
        read += 1;
        if read > MAX_KEYS || candidates.len() >= MAX_DELETES {
            break;
        }
        let Ok((_, uid)) = fleet_wire::kv::parse_run_key(&k) else {
            continue;
        };
        if !known.contains(&uid.to_string()) {
            candidates.push((k, uid.to_string()));
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
    for (key, uid) in candidates {
        if everywhere.contains(&uid) {
            continue;
        }
        store
            .delete(&key)
            .await
            .map_err(|e| format!("delete request {key}: {e}"))?;
        log::info!("diagnostics: deleted request {key}: its DeviceDiagnostics is gone");
        deleted += 1;
    }
    Ok(deleted)
}
