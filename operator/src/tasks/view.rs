//! One TaskRun's per-device view, kept current from NATS KV: its keys (`*.<run-uid>`) in `system-upgrade-intent`
//! and `system-upgrade-status`, each read from its last values on and then followed by an ordered consumer, so the
//! view costs one consumer per bucket per active run and holds only that run's devices.

use crate::kv::{Mirror, NatsError};
use async_nats::jetstream::consumer::{push, DeliverPolicy, ReplayPolicy};
use async_nats::jetstream::kv::Store;
use fleet_wire::kv as layout;
use fleet_wire::{AttemptId, DeviceId, SystemUpgradeAttempt, SystemUpgradeStatus, Timestamp};
use futures::StreamExt;
use serde::de::DeserializeOwned;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

/// When NATS stored each present intent (the entry's timestamp, not this process's clock at the write), so that
/// a restarted operator judges the same devices stalled ([`super::stall`]).
type Written = Arc<RwLock<HashMap<String, Timestamp>>>;
use tokio::sync::Notify;

/// The KV view of one run.
pub struct RunView {
    /// `system-upgrade-intent/*.<run-uid>`; a removed intent stays as a key without a value.
    pub intents: Arc<Mirror<SystemUpgradeAttempt>>,
    /// `system-upgrade-status/*.<run-uid>`.
    pub statuses: Arc<Mirror<SystemUpgradeStatus>>,
    written: Written,
    synced: [Arc<AtomicBool>; 2],
    tasks: Vec<tokio::task::JoinHandle<NatsError>>,
}

impl Drop for RunView {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl RunView {
    /// Starts following run `run`'s keys; `notify` is woken on every change.
    pub fn start(
        client: &async_nats::Client,
        intents: &Store,
        statuses: &Store,
        run: &AttemptId,
        notify: &Arc<Notify>,
    ) -> Self {
        let filter = format!("*.{run}");
        let mut view = Self {
            intents: Mirror::new(layout::SYSTEM_UPGRADE_INTENT),
            statuses: Mirror::new(layout::SYSTEM_UPGRADE_STATUS),
            written: Written::default(),
            synced: [Arc::default(), Arc::default()],
            tasks: vec![],
        };
        view.tasks = vec![
            tokio::spawn(follow(
                client.clone(),
                intents.clone(),
                filter.clone(),
                view.intents.clone(),
                Some(view.written.clone()),
                view.synced[0].clone(),
                notify.clone(),
            )),
            tokio::spawn(follow(
                client.clone(),
                statuses.clone(),
                filter,
                view.statuses.clone(),
                None,
                view.synced[1].clone(),
                notify.clone(),
            )),
        ];
        view
    }

    /// True once both buckets' current values were read.
    pub fn is_synced(&self) -> bool {
        self.synced.iter().all(|s| s.load(Ordering::SeqCst))
    }

    /// True when a follower ended (NATS went away): the view must be started again.
    pub fn is_broken(&self) -> bool {
        self.tasks.iter().any(|t| t.is_finished())
    }

    /// Whether `device`'s intent for `run` was ever written (present, or removed), and its status.
    pub fn device(
        &self,
        device: &DeviceId,
        run: &AttemptId,
    ) -> (bool, Option<SystemUpgradeStatus>) {
        let key = layout::run_key(device, run);
        let status = self
            .statuses
            .with(&key, |s| s.and_then(|s| s.value.as_deref().cloned()));
        let released = self.intents.with(&key, |s| s.is_some()) || status.is_some();
        (released, status)
    }

    /// `device`'s intent for `run` as the stall check sees it ([`super::stall::Seen`]).
    pub fn intent_seen(&self, device: &DeviceId, run: &AttemptId) -> super::stall::Seen {
        let key = layout::run_key(device, run);
        super::stall::Seen {
            live: self
                .intents
                .with(&key, |s| s.is_some_and(|s| s.value.is_some())),
            written: self
                .written
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .get(&key)
                .copied(),
            reported: self.statuses.with(&key, |s| s.is_some()),
        }
    }

    /// Keys of intents that are still present.
    pub fn live_intents(&self) -> Vec<String> {
        self.intents.values().into_keys().collect()
    }
}

/// Reads `filter`'s last values from `store` into `mirror` (and each present key's NATS timestamp into
/// `written`, when given), sets `synced`, then follows changes. Returns when the consumer ends.
async fn follow<T: DeserializeOwned + Clone + Send + Sync + 'static>(
    client: async_nats::Client,
    store: Store,
    filter: String,
    mirror: Arc<Mirror<T>>,
    written: Option<Written>,
    synced: Arc<AtomicBool>,
    notify: Arc<Notify>,
) -> NatsError {
    let bucket = mirror.bucket();
    let err = |e: &dyn std::fmt::Display| NatsError {
        op: format!("follow {bucket}/{filter}"),
        message: e.to_string(),
    };
    let consumer = match store
        .stream
        .create_consumer(push::OrderedConfig {
            deliver_subject: client.new_inbox(),
            description: Some("fleet-operator task run view".into()),
            filter_subject: format!("{}{filter}", store.prefix),
            replay_policy: ReplayPolicy::Instant,
            deliver_policy: DeliverPolicy::LastPerSubject,
            ..Default::default()
        })
        .await
    {
        Ok(c) => c,
        Err(e) => return err(&e),
    };
    if consumer.cached_info().num_pending == 0 {
        synced.store(true, Ordering::SeqCst);
        notify.notify_one();
    }
    let mut messages = match consumer.messages().await {
        Ok(m) => m,
        Err(e) => return err(&e),
    };
    // Values that do not parse: one line per key per interval; the counts of the last interval come with any
    // later message.
    let mut invalid = crate::kv::invalid_values(bucket);
    let mut summarised = std::time::Instant::now();
    while let Some(m) = messages.next().await {
        let m = match m {
            Ok(m) => m,
            Err(e) => return err(&e),
        };
        if summarised.elapsed() >= fleet_wire::log_summary::SUMMARY_INTERVAL {
            summarised = std::time::Instant::now();
            for line in invalid.due(summarised) {
                log::warn!("{line}");
            }
        }
        let info = match m.info() {
            Ok(i) => (
                i.stream_sequence,
                i.pending,
                Timestamp::from_unix_ms(
                    (i.published.unix_timestamp_nanos() / 1_000_000).max(0) as u64
                ),
            ),
            Err(e) => return err(&e),
        };
        let Some(key) = m.subject.strip_prefix(store.prefix.as_str()) else {
            continue;
        };
        let removed = m
            .headers
            .as_ref()
            .and_then(|h| h.get("KV-Operation"))
            .is_some_and(|op| op.as_str() == "DEL" || op.as_str() == "PURGE");
        let value = match removed {
            true => None,
            false => match serde_json::from_slice::<T>(&m.payload) {
                Ok(v) => Some(v),
                Err(e) => {
                    let now = std::time::Instant::now();
                    if let Some(line) = invalid.record(key, &e.to_string(), now) {
                        log::warn!("{line}");
                    }
                    None
                }
            },
        };
        if let Some(w) = &written {
            let mut w = w.write().unwrap_or_else(|p| p.into_inner());
            match removed {
                true => w.remove(key),
                false => w.insert(key.to_owned(), info.2),
            };
        }
        mirror.record(key, info.0, value);
        if info.1 == 0 {
            synced.store(true, Ordering::SeqCst);
        }
        notify.notify_one();
    }
    err(&"the consumer ended")
}
