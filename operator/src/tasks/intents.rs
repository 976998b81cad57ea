//! System-upgrade intents in `system-upgrade-intent/<device>.<run-uid>`: released with KV create (an intent another
//! replica wrote first is left as it is, so each is written once) and removed when terminal.

use crate::kv::{Mirror, NatsError};
use async_nats::jetstream::kv::{CreateErrorKind, Store};
use fleet_wire::kv as layout;
use fleet_wire::{AttemptId, DeviceId, SystemUpgradeAttempt, TaskOperation, TaskPlan, Timestamp};
use futures::StreamExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Intent writes (or removals) in flight.
pub const INTENT_CONCURRENCY: usize = 1024;

/// Tasks one release is spread over, so that encoding and bookkeeping use more than one core; together they keep
/// at most [`INTENT_CONCURRENCY`] creates in flight.
pub const RELEASE_SHARDS: usize = 2;

/// Creates the intent of every device in `devices` for `plan` (`expiresAt` = the plan's deadline) and records each
/// in `mirror`. Returns how many this call created, or the first error (the other writes then stop).
pub async fn release(
    store: &Store,
    mirror: Option<Arc<Mirror<SystemUpgradeAttempt>>>,
    plan: &TaskPlan,
    devices: &[DeviceId],
) -> Result<usize, NatsError> {
    let started = Arc::new(AtomicUsize::new(0));
    let per_shard = devices.len().div_ceil(RELEASE_SHARDS).max(1);
    // Dropping the set (an error, or the caller gone) aborts the other shards.
    let mut shards = tokio::task::JoinSet::new();
    for part in devices.chunks(per_shard) {
        shards.spawn(release_shard(
            store.clone(),
            mirror.clone(),
            (plan.run_uid, plan.operation, plan.expires_at),
            part.to_vec(),
            (started.clone(), devices.len()),
        ));
    }
    let mut created = 0;
    while let Some(joined) = shards.join_next().await {
        created += match joined {
            Ok(r) => r?,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => {
                return Err(NatsError {
                    op: "release intents".into(),
                    message: e.to_string(),
                })
            }
        };
    }
    Ok(created)
}

async fn release_shard(
    store: Store,
    mirror: Option<Arc<Mirror<SystemUpgradeAttempt>>>,
    (uid, operation, expires_at): (AttemptId, TaskOperation, Timestamp),
    devices: Vec<DeviceId>,
    (started, total): (Arc<AtomicUsize>, usize),
) -> Result<usize, NatsError> {
    // Owned items and cloned handles: borrowed ones make the futures' lifetimes too general for a spawned task.
    let results: Vec<Result<bool, NatsError>> = futures::stream::iter(devices)
        .map(|d| {
            let (store, mirror, started) = (store.clone(), mirror.clone(), started.clone());
            async move {
                let attempt = SystemUpgradeAttempt {
                    run_uid: uid,
                    device_id: d.clone(),
                    operation,
                    expires_at,
                };
                // Crash test: stop before the second half of the release is sent.
                super::fault::mid_release(started.fetch_add(1, Ordering::SeqCst), total);
                let key = layout::run_key(&d, &uid);
                let bytes = serde_json::to_vec(&attempt).map_err(|e| NatsError {
                    op: format!("encode {key}"),
                    message: e.to_string(),
                })?;
                let t = std::time::Instant::now();
                match store.create(&key, bytes.into()).await {
                    Ok(rev) => {
                        crate::metrics::nats_write(t.elapsed());
                        if let Some(m) = mirror {
                            m.record(&key, rev, Some(attempt));
                        }
                        Ok(true)
                    }
                    Err(e) if e.kind() == CreateErrorKind::AlreadyExists => Ok(false),
                    Err(e) => Err(NatsError {
                        op: format!("create {}/{key}", layout::SYSTEM_UPGRADE_INTENT),
                        message: e.to_string(),
                    }),
                }
            }
        })
        .buffer_unordered(INTENT_CONCURRENCY / RELEASE_SHARDS)
        .collect()
        .await;
    results
        .into_iter()
        .try_fold(0, |n, r| r.map(|created| n + usize::from(created)))
}

/// Removes the intents `keys` (a delete marker stays, so the device counts as released from then on).
pub async fn remove(store: &Store, keys: &[String]) -> Result<(), NatsError> {
    let results: Vec<Result<(), NatsError>> = futures::stream::iter(keys.to_vec())
        .map(|k| {
            let store = store.clone();
            async move {
                store.delete(&k).await.map_err(|e| NatsError {
                    op: format!("remove {}/{k}", layout::SYSTEM_UPGRADE_INTENT),
                    message: e.to_string(),
                })
            }
        })
        .buffer_unordered(INTENT_CONCURRENCY)
        .collect()
        .await;
    results.into_iter().find(Result::is_err).unwrap_or(Ok(()))
}
