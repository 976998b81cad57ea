//! Device object writes (creations and status replacements) off the control loop's pass: the pass hands them
//! over and goes on, so that a slow or saturated API server never delays a desired-state or intent write.
//!
//! Latest wins: a status queued for a device replaces the one still waiting for it (a pass that runs while the
//! writer is behind decides the same status again, which then costs nothing). At most [`CONCURRENCY`] writes are
//! in flight; a failed write is not retried here, because the next pass decides it again from the cache.
//!
//! Written, not yet seen: the watch shows a write a moment after the API server took it (seconds under load),
//! and a pass in between would decide the same change again from the stale cache and write it twice. So the
//! writer remembers each status it wrote with the resourceVersion the API server gave it, and the pass decides
//! from that status ([`DeviceWrites::overlay`]) until the cache holds the object at that version or later; a
//! Device it created is not created again for [`CREATE_ECHO`].

use crate::crd::Device;
use crate::crd::DeviceStatus;
use crate::fleet::report;
use futures::StreamExt;
use kube::Client;
use kube::ResourceExt;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// Device writes in flight at once. 16 kept an onboarding of 100,000 devices at about 220 status writes/s (49 ms
/// each) on a 2-core test machine: every first status after 604 s; 32 gave 243/s (85 ms each) and 526 s
/// (`scripts/bench fleet-scale`, 2026-12-04).
pub const CONCURRENCY: usize = 32;
/// Writes taken per round: a round's errors are logged once.
const ROUND: usize = 512;
/// A Device this writer created is not created again for this long (its watch event is due long before).
pub const CREATE_ECHO: Duration = Duration::from_secs(30);

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
    /// Statuses written, with the resourceVersion of the object written, until the cache shows that version.
    written: Mutex<HashMap<String, (DeviceStatus, u64)>>,
    /// Devices created, and when.
    created: Mutex<HashMap<String, Instant>>,
    /// Statuses being written now (taken from `pending`, not yet answered).
    in_flight: Mutex<HashMap<String, DeviceStatus>>,
}

impl DeviceWrites {
    /// Queues a creation (before any status: a status of a device not yet created would fail), unless this
    /// writer created the Device less than [`CREATE_ECHO`] ago.
    pub fn create(&self, id: String, hold: bool) {
        {
            let mut created = lock(&self.created);
            let now = Instant::now();
            created.retain(|_, at| now.duration_since(*at) < CREATE_ECHO);
            if created.contains_key(&id) {
                return;
            }
        }
        self.lock().creates.insert(id, hold);
        self.wake.notify_one();
    }

    /// `devices` as a pass decides from them: each status this writer wrote that the cached object predates (its
    /// resourceVersion is older than the write's) in place of the cached one. Writes the cache shows, and those of
    /// devices no longer cached, are forgotten; so are creations the cache shows (the guard against creating twice
    /// is needed only until the watch's echo: a Device deleted after that is created again at once).
    pub fn overlay(&self, devices: Vec<Arc<Device>>) -> Vec<Arc<Device>> {
        {
            let mut created = lock(&self.created);
            if !created.is_empty() {
                let cached: std::collections::HashSet<&str> = devices
                    .iter()
                    .filter_map(|d| d.metadata.name.as_deref())
                    .collect();
                created.retain(|id, _| !cached.contains(id.as_str()));
            }
        }
        let mut written = lock(&self.written);
        if written.is_empty() {
            return devices;
        }
        let mut kept = HashMap::with_capacity(written.len());
        let devices = devices
            .into_iter()
            .map(|d| {
                let name = d.name_any();
                let Some((status, rv)) = written.remove(&name) else {
                    return d;
                };
                match d.resource_version().and_then(|v| v.parse::<u64>().ok()) {
                    Some(cached) if cached < rv => {
                        let mut newer = (*d).clone();
                        newer.status = Some(status.clone());
                        kept.insert(name, (status, rv));
                        Arc::new(newer)
                    }
                    _ => d,
                }
            })
            .collect();
        *written = kept;
        devices
    }

    fn record_status(&self, name: String, status: DeviceStatus, rv: Option<u64>) {
        if let Some(rv) = rv {
            lock(&self.written).insert(name, (status, rv));
        }
    }

    /// Queues a status, replacing one still waiting for the same device; the status being written for it now is
    /// not queued again.
    pub fn status(&self, name: String, status: DeviceStatus) {
        if lock(&self.in_flight).get(&name) == Some(&status) {
            return;
        }
        self.lock().statuses.insert(name, status);
        self.wake.notify_one();
    }

    /// Writes waiting (creations and statuses).
    pub fn waiting(&self) -> usize {
        let p = self.lock();
        p.creates.len() + p.statuses.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        lock(&self.pending)
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
        // Marked created from now (a pass while they are in flight queues none of them again); a failed one is
        // unmarked.
        let now = Instant::now();
        lock(&self.created).extend(creates.iter().map(|(id, _)| (id.clone(), now)));
        let mut statuses = Vec::new();
        while creates.len() + statuses.len() < ROUND {
            match p.statuses.pop_first() {
                Some(s) => statuses.push(s),
                None => break,
            }
        }
        lock(&self.in_flight).extend(statuses.iter().cloned());
        Round { creates, statuses }
    }

    /// Writes what is queued, for ever. `labels` go on the Devices it creates; none is created for a device
    /// `retired` holds a tombstone of (checked again just before the creation: the pass may have decided from a
    /// view older than the tombstone).
    pub async fn run(
        self: Arc<Self>,
        client: Client,
        labels: BTreeMap<String, String>,
        retired: Arc<crate::kv::Mirror<fleet_wire::DeviceRetirement>>,
    ) {
        loop {
            let Round { creates, statuses } = self.take();
            if creates.is_empty() && statuses.is_empty() {
                self.wake.notified().await;
                continue;
            }
            let (client, labels, this) = (&client, &labels, &self);
            let creates = creates.into_iter().filter(|(id, _)| {
                let gone = retired.get(id).is_some_and(|t| t.value.is_some());
                if gone {
                    log::info!("Device {id} not created: the device is retired");
                    lock(&this.created).remove(id);
                }
                !gone
            });
            let creates = futures::stream::iter(creates).map(|(id, hold)| async move {
                if hold {
                    log::warn!("Device {id} is missing but the device runs workloads: recreating it with {}=true (its workloads are kept until a person labels it and removes the annotation)", crate::crd::HOLD_ANNOTATION);
                }
                let t = Instant::now();
                let r = report::create_device(client, &id, labels, hold).await;
                crate::metrics::device_write("create", t.elapsed());
                if r.is_err() {
                    lock(&this.created).remove(&id);
                }
                r
            });
            let errors: Vec<kube::Error> = creates
                .buffer_unordered(CONCURRENCY)
                .filter_map(|r| async move { r.err() })
                .collect()
                .await;
            let mut errors = errors;
            let statuses = futures::stream::iter(statuses).map(|(name, s)| async move {
                let t = Instant::now();
                let r = report::write_device_status(client, &name, &s).await;
                crate::metrics::device_write("status", t.elapsed());
                // Remembered as written before it stops being in flight: a pass in between sees one of the two.
                let r = r.map(|rv| this.record_status(name.clone(), s, rv));
                lock(&this.in_flight).remove(&name);
                r
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

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
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

    fn device(name: &str, rv: &str, os: &str) -> Arc<Device> {
        let mut d = Device::new(name, Default::default());
        d.metadata.resource_version = Some(rv.into());
        d.status = Some(DeviceStatus {
            os: Some(os.into()),
            ..Default::default()
        });
        Arc::new(d)
    }

    fn os(d: &Device) -> &str {
        d.status
            .as_ref()
            .and_then(|s| s.os.as_deref())
            .unwrap_or("")
    }

    #[test]
    fn a_written_status_is_decided_from_until_the_cache_shows_it() {
        let q = DeviceWrites::default();
        let st = DeviceStatus {
            os: Some("written".into()),
            ..Default::default()
        };
        q.record_status("a".into(), st.clone(), Some(10));
        q.record_status("gone".into(), st.clone(), Some(10));
        // The watch has not shown the write yet: the pass sees what was written.
        let seen = q.overlay(vec![device("a", "9", "cached"), device("b", "3", "b")]);
        assert_eq!(os(&seen[0]), "written");
        assert_eq!(os(&seen[1]), "b");
        // A device no longer cached is forgotten; "a" is kept until its echo.
        assert_eq!(lock(&q.written).len(), 1);
        // The watch shows the write (or a later one): the cache wins and the write is forgotten.
        let seen = q.overlay(vec![device("a", "12", "later")]);
        assert_eq!(os(&seen[0]), "later");
        assert!(lock(&q.written).is_empty());
        // A resourceVersion that is not a number is never compared: the cache wins.
        q.record_status("a".into(), st, Some(10));
        assert_eq!(
            os(&q.overlay(vec![device("a", "x1", "cached")])[0]),
            "cached"
        );
    }

    #[test]
    fn a_device_just_created_is_not_created_again() {
        let q = DeviceWrites::default();
        q.create("a".into(), false);
        assert_eq!(q.take().creates, vec![("a".to_owned(), false)]);
        // Taken (in flight or written): a pass that decides it again queues nothing.
        q.create("a".into(), false);
        q.create("b".into(), false);
        assert_eq!(q.take().creates, vec![("b".to_owned(), false)]);
        // A failed creation is unmarked, so the next pass queues it again.
        lock(&q.created).remove("a");
        q.create("a".into(), false);
        assert_eq!(q.take().creates, vec![("a".to_owned(), false)]);
        // Once the cache shows it, a Device deleted after that is created again at once (not CREATE_ECHO later).
        let mut shown = Device::new("a", Default::default());
        shown.metadata.resource_version = Some("7".into());
        let _ = q.overlay(vec![Arc::new(shown)]);
        q.create("a".into(), true);
        assert_eq!(q.take().creates, vec![("a".to_owned(), true)]);
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
