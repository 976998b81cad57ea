//! Retired devices (docs/auth.md, "Retired devices"): fleet-auth watches the operator's tombstone bucket
//! (`device-retired`, `fleet_wire::kv::DEVICE_RETIRED`) and refuses a retired device at the callout (`device X is
//! retired`) and at the device API (its writes, whatever connection they come on); with the flood guard on, its open
//! connections are disconnected as soon as its tombstone arrives.
//!
//! Only the ids are kept (a set, at most [`MAX_RETIRED`]), read whole when the watch starts (at fleet-auth's start
//! and after every reconnect: the new view replaces the old one only once it is complete, so a tombstone lifted while
//! fleet-auth was away is forgotten and none is ever missing meanwhile), then kept current by the watch. The callout
//! starts serving only once the first view is read ([`Retired::loaded`]); a bucket that cannot be opened (an older
//! operator that does not make it) counts as empty and is tried again every [`RETRY`].

use async_nats::jetstream;
use async_nats::jetstream::kv::Operation;
use fleet_wire::kv::DEVICE_RETIRED;
use fleet_wire::DeviceId;
use futures::StreamExt;
use std::collections::HashSet;
use std::sync::RwLock;
use std::time::Duration;
use tokio::sync::{mpsc, watch};

/// Retired device ids kept at most (about 64 MB); the bucket's byte limit keeps far fewer (two per device of the
/// fleet size it is made for). Past it, newer tombstones are not kept and an error is logged.
pub const MAX_RETIRED: usize = 1_000_000;
/// Pause before the watch is opened again after it failed or ended.
pub const RETRY: Duration = Duration::from_secs(5);
/// Newly retired devices waiting to have their connections cut at most (more are only refused from now on).
pub const KICK_QUEUE: usize = 4096;

/// The retired devices fleet-auth knows of.
pub struct Retired {
    ids: RwLock<HashSet<String>>,
    loaded_tx: watch::Sender<bool>,
    /// Devices retired after the first view was read, to be disconnected (the flood guard takes them).
    kicks: mpsc::Sender<DeviceId>,
}

impl Retired {
    /// An empty set (not loaded yet) and the receiver of the devices retired from now on.
    pub fn new() -> (std::sync::Arc<Self>, mpsc::Receiver<DeviceId>) {
        let (kicks, rx) = mpsc::channel(KICK_QUEUE);
        let (loaded_tx, _) = watch::channel(false);
        (
            std::sync::Arc::new(Self {
                ids: RwLock::new(HashSet::new()),
                loaded_tx,
                kicks,
            }),
            rx,
        )
    }

    /// True when `device` is retired.
    pub fn contains(&self, device: &str) -> bool {
        self.ids.read().map(|s| s.contains(device)).unwrap_or(false)
    }

    /// How many retired devices are known.
    pub fn len(&self) -> usize {
        self.ids.read().map(|s| s.len()).unwrap_or(0)
    }

    /// True when none is known.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits until the first view of the bucket was read (or found not to exist).
    pub async fn loaded(&self) {
        let mut rx = self.loaded_tx.subscribe();
        let _ = rx.wait_for(|l| *l).await;
    }

    fn mark_loaded(&self) {
        self.loaded_tx.send_replace(true);
    }

    fn replace(&self, ids: HashSet<String>) {
        if let Ok(mut s) = self.ids.write() {
            *s = ids;
        }
    }

    /// Records a tombstone that arrived while watching; true when it is new.
    fn insert(&self, id: &str) -> bool {
        match self.ids.write() {
            Ok(mut s) if s.len() < MAX_RETIRED || s.contains(id) => s.insert(id.to_owned()),
            Ok(_) => {
                log::error!("{MAX_RETIRED} retired devices known already: the tombstone of {id} is not kept");
                false
            }
            Err(_) => false,
        }
    }

    fn remove(&self, id: &str) {
        if let Ok(mut s) = self.ids.write() {
            s.remove(id);
        }
    }

    /// For tests and the benchmark: records `ids` as retired, marked loaded.
    pub fn set_for_test(&self, ids: impl IntoIterator<Item = String>) {
        self.replace(ids.into_iter().collect());
        self.mark_loaded();
    }
}

/// Watches the tombstone bucket on `client` (a user of the buckets' account) for ever: each (re)start reads every
/// tombstone, then follows the changes.
pub async fn watch(client: async_nats::Client, retired: std::sync::Arc<Retired>) {
    let js = jetstream::new(client);
    loop {
        match watch_once(&js, &retired).await {
            Ok(()) => {
                log::warn!("retired devices: the watch of {DEVICE_RETIRED} ended; opening it again")
            }
            Err(e) => {
                // Nothing to read (the operator has not made the bucket yet, JetStream unreachable): nobody is
                // known to be retired; the callout is not held back by it.
                if !*retired.loaded_tx.borrow() {
                    log::warn!("retired devices: {e}; none known until it can be read (tried again every {} s)", RETRY.as_secs());
                    retired.mark_loaded();
                } else {
                    log::warn!("retired devices: {e}; tried again in {} s", RETRY.as_secs());
                }
            }
        }
        tokio::time::sleep(RETRY).await;
    }
}

async fn watch_once(js: &jetstream::Context, retired: &Retired) -> Result<(), String> {
    let store = js
        .get_key_value(DEVICE_RETIRED)
        .await
        .map_err(|e| format!("open bucket {DEVICE_RETIRED}: {e}"))?;
    let pending = store
        .status()
        .await
        .map_err(|e| format!("status of {DEVICE_RETIRED}: {e}"))?
        .values();
    let mut w = store
        .watch_with_history(">")
        .await
        .map_err(|e| format!("watch {DEVICE_RETIRED}: {e}"))?;
    // The first view, built aside and swapped in whole.
    let mut view: Option<HashSet<String>> = Some(HashSet::new());
    if pending == 0 {
        finish(retired, &mut view);
    }
    while let Some(entry) = w.next().await {
        let e = entry.map_err(|e| format!("watch {DEVICE_RETIRED}: {e}"))?;
        let put = e.operation == Operation::Put;
        match view.as_mut() {
            Some(v) => {
                if put && v.len() < MAX_RETIRED {
                    v.insert(e.key.clone());
                } else if !put {
                    v.remove(&e.key);
                }
                if e.delta == 0 {
                    finish(retired, &mut view);
                }
            }
            None if put => {
                if retired.insert(&e.key) {
                    log::info!("device {} is retired: refused from now on", e.key);
                    if let Ok(id) = DeviceId::try_from(e.key.as_str()) {
                        match retired.kicks.try_send(id) {
                            Ok(()) => {}
                            // No flood guard (no system user to disconnect with): an open connection keeps its
                            // session until it ends, its writes refused by the device API.
                            Err(mpsc::error::TrySendError::Closed(_)) => {}
                            Err(mpsc::error::TrySendError::Full(_)) => log::warn!(
                                "device {}: its open connections are not cut (too many retirements at once); its writes are refused",
                                e.key
                            ),
                        }
                    }
                }
            }
            None => {
                retired.remove(&e.key);
                log::info!("device {} is no longer retired (enrolled again)", e.key);
            }
        }
    }
    Ok(())
}

fn finish(retired: &Retired, view: &mut Option<HashSet<String>>) {
    if let Some(v) = view.take() {
        log::info!("retired devices: {} known ({DEVICE_RETIRED})", v.len());
        retired.replace(v);
        retired.mark_loaded();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_set_that_knows_its_devices_and_when_it_is_loaded() {
        let (r, _rx) = Retired::new();
        assert!(!r.contains("dev-1") && r.is_empty());
        let waiting = tokio::time::timeout(Duration::from_millis(50), r.loaded()).await;
        assert!(waiting.is_err(), "not loaded yet");
        r.set_for_test(["dev-1".to_owned()]);
        r.loaded().await;
        assert!(r.contains("dev-1") && !r.contains("dev-2"));
        assert!(r.insert("dev-2") && !r.insert("dev-2"));
        r.remove("dev-1");
        assert!(!r.contains("dev-1") && r.len() == 1);
    }
}
