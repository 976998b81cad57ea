//! Which bundle keys arrived: a watch of every device's keys of `diagnostics-bundle` (its current values first, so
//! that a bundle written while no operator ran is found) that notes the keys and wakes the controller. Keys only:
//! the controller reads the bundle of a request it knows with one get, so a flood of bundles costs no memory
//! beyond [`MAX_PENDING`] keys.

use crate::kv::NatsError;
use async_nats::jetstream::kv::{Operation, Store};
use futures::StreamExt;
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

/// Most keys noted between two passes; past it the next pass reads the bundle of every open request instead.
pub const MAX_PENDING: usize = 4096;

/// The keys noted since the controller last took them.
#[derive(Default)]
pub struct Arrived {
    keys: Mutex<(BTreeSet<String>, bool)>,
}

impl Arrived {
    /// Notes `key`; past [`MAX_PENDING`] keys, only that some were dropped.
    pub(crate) fn note(&self, key: String) {
        let mut g = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        if g.0.len() < MAX_PENDING {
            g.0.insert(key);
        } else {
            g.1 = true;
        }
    }

    /// The keys noted, and whether some were dropped (the caller then looks at every open request).
    pub fn take(&self) -> (BTreeSet<String>, bool) {
        std::mem::take(&mut *self.keys.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// Watches `store` (the bundle bucket) until the watch ends, noting every put into `arrived` and waking `notify`.
pub async fn watch(store: Store, arrived: Arc<Arrived>, notify: Arc<Notify>) -> NatsError {
    let mut w = match store.watch_with_history(">").await {
        Ok(w) => w,
        Err(e) => {
            return NatsError {
                op: format!("watch {}", fleet_wire::kv::DIAGNOSTICS_BUNDLE),
                message: e.to_string(),
            }
        }
    };
    while let Some(entry) = w.next().await {
        match entry {
            Ok(e) if e.operation == Operation::Put => {
                arrived.note(e.key);
                notify.notify_one();
            }
            Ok(_) => {}
            Err(e) => {
                return NatsError {
                    op: format!("watch {}", fleet_wire::kv::DIAGNOSTICS_BUNDLE),
                    message: e.to_string(),
                }
            }
        }
    }
    NatsError {
        op: format!("watch {}", fleet_wire::kv::DIAGNOSTICS_BUNDLE),
        message: "ended".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrived_keys_are_bounded() {
        let a = Arrived::default();
        for i in 0..MAX_PENDING + 5 {
            a.note(format!("d.{i}"));
        }
        let (keys, dropped) = a.take();
        assert_eq!((keys.len(), dropped), (MAX_PENDING, true));
        assert_eq!(a.take(), (BTreeSet::new(), false));
    }
}
