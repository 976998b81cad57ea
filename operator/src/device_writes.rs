//! Device object writes (creations and status replacements) off the control loop's pass: the pass hands them
//! over and goes on, so that a slow or saturated API server never delays a desired-state or intent write.
//!
//! Latest wins: a status queued for a device replaces the one still waiting for it (a pass that runs while the
//! writer is behind decides the same status again, which then costs nothing). At most [`CONCURRENCY`] writes are
//! in flight; a failed write is not retried here, because the next pass decides it again from the cache.

use crate::crd::DeviceStatus;
use crate::report;
use futures::StreamExt;
use kube::Client;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

/// Device writes in flight at once.
pub const CONCURRENCY: usize = 16;
/// Writes taken per round: a round's errors are logged once.
const ROUND: usize = 512;

/// What waits to be written.
#[derive(Default)]
struct Pending {
    /// Devices to create (by name), with `hold` (the hold annotation).
    creates: BTreeMap<String, bool>,
    /// Device statuses to replace, by object name.
    statuses: BTreeMap<String, DeviceStatus>,
}

/// One round of writes: (name, hold) creations, then (name, status) replacements.
struct Round {
    creates: Vec<(String, bool)>,
    statuses: Vec<(String, DeviceStatus)>,
}

/// The queue between the pass and the writer task.
#[derive(Default)]
pub struct DeviceWrites {
    pending: Mutex<Pending>,
    wake: Notify,
}

impl DeviceWrites {
    /// Queues a creation (before any status: a status of a device not yet created would fail).
    pub fn create(&self, id: String, hold: bool) {
        self.lock().creates.insert(id, hold);
        self.wake.notify_one();
    }

    /// Queues a status, replacing one still waiting for the same device.
    pub fn status(&self, name: String, status: DeviceStatus) {
        self.lock().statuses.insert(name, status);
        self.wake.notify_one();
    }

    /// Writes waiting (creations and statuses).
    pub fn waiting(&self) -> usize {
        let p = self.lock();
        p.creates.len() + p.statuses.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes up to [`ROUND`] writes: creations first.
    fn take(&self) -> Round {
        let mut p = self.lock();
        let mut creates = Vec::new();
        while creates.len() < ROUND {
            match p.creates.pop_first() {
                Some(c) => creates.push(c),
                None => break,
            }
        }
        let mut statuses = Vec::new();
        while creates.len() + statuses.len() < ROUND {
            match p.statuses.pop_first() {
                Some(s) => statuses.push(s),
                None => break,
            }
        }
        Round { creates, statuses }
    }

    /// Writes what is queued, for ever. `labels` go on the Devices it creates.
    pub async fn run(self: Arc<Self>, client: Client, labels: BTreeMap<String, String>) {
        loop {
            let Round { creates, statuses } = self.take();
            if creates.is_empty() && statuses.is_empty() {
                self.wake.notified().await;
                continue;
            }
            let (client, labels) = (&client, &labels);
            let creates = futures::stream::iter(creates).map(|(id, hold)| async move {
                if hold {
                    log::warn!("Device {id} is missing but the device runs workloads: recreating it with {}=true (its workloads are kept until a person labels it and removes the annotation)", crate::crd::HOLD_ANNOTATION);
                }
                report::create_device(client, &id, labels, hold).await
            });
            let errors: Vec<kube::Error> = creates
                .buffer_unordered(CONCURRENCY)
                .filter_map(|r| async move { r.err() })
                .collect()
                .await;
            let mut errors = errors;
            let statuses = futures::stream::iter(statuses).map(|(name, s)| async move {
                report::write_device_status(client, &name, &s).await
            });
            errors.extend(
                statuses
                    .buffer_unordered(CONCURRENCY)
                    .filter_map(|r| async move { r.err() })
                    .collect::<Vec<_>>()
                    .await,
            );
            if let Some(e) = errors.first() {
                log::warn!(
                    "{} Device writes failed, e.g.: {e}; decided again on the next pass",
                    errors.len()
                );
            }
            crate::metrics::device_writes_waiting(self.waiting());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latest_status_wins_and_creations_come_first() {
        let q = DeviceWrites::default();
        let st = |v: &str| DeviceStatus {
            os: Some(v.into()),
            ..Default::default()
        };
        q.status("a".into(), st("1.0.0"));
        q.status("a".into(), st("2.0.0"));
        q.create("b".into(), false);
        assert_eq!(q.waiting(), 2);
        let Round { creates, statuses } = q.take();
        assert_eq!(creates.len(), 1);
        assert_eq!(statuses, vec![("a".into(), st("2.0.0"))]);
        assert_eq!(q.waiting(), 0);
    }

    #[test]
    fn a_round_is_bounded() {
        let q = DeviceWrites::default();
        for i in 0..(ROUND + 10) {
            q.status(format!("d{i}"), DeviceStatus::default());
        }
        let first = q.take().statuses;
        assert_eq!(first.len(), ROUND);
        let rest = q.take().statuses;
        assert_eq!(rest.len(), 10);
    }
}
