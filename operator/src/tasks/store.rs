//! The frozen target plan in `task-plans`: chunks first (content-addressed, `<run-uid>.<sha256>`), then one
//! manifest (`<run-uid>`) created with KV create. The manifest's create is the commit point: concurrent operator
//! instances race on it, the loser loads the winner's plan, and a plan whose manifest does not exist yet (a writer
//! died after some chunks) is never loaded.

use crate::kv::NatsError;
use async_nats::jetstream::kv::{CreateErrorKind, Store};
use fleet_wire::kv as layout;
use fleet_wire::taskrun::{plan_chunk_key, plan_manifest_key};
use fleet_wire::{AttemptId, TaskPlan, TaskPlanManifest};
use futures::{StreamExt, TryStreamExt};

/// Chunk reads or writes in flight for one plan.
pub const CHUNK_CONCURRENCY: usize = 8;

/// A plan that could not be stored or loaded.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// NATS failed; retried on the next pass.
    #[error(transparent)]
    Nats(#[from] NatsError),
    /// The stored plan does not hold together (a chunk missing, altered or aged out).
    #[error("stored plan of run {run} is unusable: {error}")]
    Invalid {
        /// The run.
        run: AttemptId,
        /// Why.
        error: String,
    },
}

/// What [`create`] ended with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Created {
    /// This writer's plan is the run's plan.
    Written(TaskPlan),
    /// Another writer created the manifest first: its plan, loaded.
    Loaded(TaskPlan),
}

impl Created {
    /// The run's plan, whoever wrote it.
    pub fn plan(self) -> TaskPlan {
        match self {
            Self::Written(p) | Self::Loaded(p) => p,
        }
    }
}

fn nats(op: String, e: impl std::fmt::Display) -> StoreError {
    StoreError::Nats(NatsError {
        op,
        message: e.to_string(),
    })
}

async fn load_manifest(
    store: &Store,
    run: &AttemptId,
) -> Result<Option<TaskPlanManifest>, StoreError> {
    let key = plan_manifest_key(run);
    let Some(bytes) = store
        .get(&key)
        .await
        .map_err(|e| nats(format!("read {}/{key}", layout::TASK_PLANS), e))?
    else {
        return Ok(None);
    };
    let m: TaskPlanManifest = serde_json::from_slice(&bytes).map_err(|e| StoreError::Invalid {
        run: *run,
        error: format!("manifest: {e}"),
    })?;
    if &m.run_uid != run {
        return Err(StoreError::Invalid {
            run: *run,
            error: format!("the manifest is run {}'s", m.run_uid),
        });
    }
    Ok(Some(m))
}

/// Loads run `run`'s plan: `None` while no manifest exists; an error when a chunk it names is missing or does not
/// match its digest (a half-written or altered plan is never returned).
pub async fn load(store: &Store, run: &AttemptId) -> Result<Option<TaskPlan>, StoreError> {
    let Some(m) = load_manifest(store, run).await? else {
        return Ok(None);
    };
    // Owned items and cloned handles (see the controller's release).
    let run = *run;
    let chunks: Vec<Vec<u8>> = futures::stream::iter(m.chunks.clone())
        .map(|d| {
            let store = store.clone();
            async move {
                let key = plan_chunk_key(&run, &d);
                match store.get(&key).await {
                    Ok(Some(b)) => Ok(b.to_vec()),
                    Ok(None) => Err(StoreError::Invalid {
                        run,
                        error: format!("chunk {key} is missing"),
                    }),
                    Err(e) => Err(nats(format!("read {}/{key}", layout::TASK_PLANS), e)),
                }
            }
        })
        .buffered(CHUNK_CONCURRENCY)
        .try_collect()
        .await?;
    TaskPlan::from_stored(&m, &chunks)
        .map(Some)
        .map_err(|e| StoreError::Invalid {
            run,
            error: e.to_string(),
        })
}

/// Stores `plan` unless the run already has one: writes every chunk, then creates the manifest. A lost race
/// (the manifest exists) loads and returns the winner's plan and removes this writer's chunks the winner does not
/// name.
pub async fn create(store: &Store, plan: &TaskPlan) -> Result<Created, StoreError> {
    let run = plan.run_uid;
    let (manifest, chunks) = plan.to_stored();
    let digests: Vec<_> = chunks.iter().map(|c| c.0.clone()).collect();
    futures::stream::iter(chunks)
        .map(|(digest, bytes)| {
            let store = store.clone();
            async move {
                let key = plan_chunk_key(&run, &digest);
                store
                    .put(&key, bytes.into())
                    .await
                    .map_err(|e| nats(format!("write {}/{key}", layout::TASK_PLANS), e))
            }
        })
        .buffer_unordered(CHUNK_CONCURRENCY)
        .try_collect::<Vec<u64>>()
        .await?;
    let bytes = serde_json::to_vec(&manifest).map_err(|e| StoreError::Invalid {
        run,
        error: e.to_string(),
    })?;
    let key = plan_manifest_key(&run);
    match store.create(&key, bytes.into()).await {
        Ok(_) => Ok(Created::Written(plan.clone())),
        Err(e) if e.kind() == CreateErrorKind::AlreadyExists => {
            let winner = load_manifest(store, &run).await?;
            let named = winner.map(|m| m.chunks).unwrap_or_default();
            for d in digests.iter().filter(|d| !named.contains(d)) {
                // Best effort: an orphan chunk only costs space until the bucket's age limit removes it.
                if let Err(e) = store.purge(plan_chunk_key(&run, d)).await {
                    log::warn!("run {run}: removing an unused plan chunk: {e}");
                }
            }
            match load(store, &run).await? {
                Some(p) => Ok(Created::Loaded(p)),
                None => Err(StoreError::Invalid {
                    run,
                    error: "the manifest vanished after its create failed".into(),
                }),
            }
        }
        Err(e) => Err(nats(format!("create {}/{key}", layout::TASK_PLANS), e)),
    }
}
