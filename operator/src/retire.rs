//! Retiring a device (docs/device-lifecycle.md): the one action is deleting its Device (`kubectl delete fdev <name>`).
//!
//! The operator keeps [`RETIRE_FINALIZER`] on every Device it manages (on the Devices it creates, and added to
//! every Device found without it), so a deleted Device stays until the operator has:
//!
//! 1. recorded the device's tombstone ([`DeviceRetirement`] in `device-retired`, key `<device-id>`) — first, so
//!    that from then on fleet-auth refuses the device (at the callout and at the device API) and no operator
//!    replica creates its Device again, whatever it reports meanwhile;
//! 2. deleted the device's keys in every per-device bucket ([`fleet_wire::kv::per_device_buckets`]: every bucket
//!    keyed `<device-id>` or `<device-id>.<run-uid>`, read from the layout, so a bucket added later is covered);
//! 3. removed the finalizer (the API server then deletes the Device).
//!
//! A tombstone is lifted only by an enrolment: a Device a person creates with [`ENROL_ANNOTATION`]`: "true"`,
//! whose uid differs from the one the tombstone records (the deleted object). The operator never sets that
//! annotation, and a stale view of the deleted object has the tombstone's uid, so neither a stale cache nor the
//! operator's own creation of a Device from a device's reports can lift it. A Device of a retired device that is
//! not such an enrolment (created from a stale view, or by a person without the annotation) is deleted again, with
//! a Warning event saying how to enrol.
//!
//! Keys a retired device managed to write after its tombstone (a write already in flight at fleet-auth) are found
//! by [`SWEEP`] in the operator's mirrors and deleted again.
//!
//! Every step is idempotent, so replicas need no leader: two that retire the same device write the same
//! tombstone and delete the same keys; the finalizer patch is tested, so only one removes it.

use crate::crd::{Device, ENROL_ANNOTATION, RETIRE_FINALIZER};
use crate::fleet::report;
use crate::kv::{Mirror, NatsError, Seen};
use crate::nats_link::{Kept, Link};
use crate::runtime::Runtime;
use async_nats::jetstream::kv::Store;
use fleet_wire::kv as layout;
use fleet_wire::{DeviceId, DeviceRetirement, Timestamp};
use futures::StreamExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Client, Resource, ResourceExt};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// How often the controller looks again without a change (finalizers, leftovers of retired devices).
pub const SWEEP: Duration = Duration::from_secs(30);
/// Changes arriving within this window are handled by one pass.
pub const DEBOUNCE: Duration = Duration::from_millis(100);
/// After a pass of duration `d` the next starts no sooner than `PACE × d` later: a pass looks at every Device, and
/// a fleet whose Devices change all the time (their status writes) would otherwise spend a core on passes (the
/// deployments controller's rule, [`crate::deployments::engine::PACE`]). At 100,000 Devices a pass takes a few
/// milliseconds.
pub const PACE: u32 = 2;
/// Devices retired, enrolled or refused at once.
pub const CONCURRENCY: usize = 16;
/// Retired devices whose leftover keys one sweep deletes at most.
pub const SWEEP_MAX: usize = 256;
/// Event reasons.
pub const REASON_RETIRED: &str = "Retired";
/// The Device of a retired device was deleted again (it was not an enrolment).
pub const REASON_RETIRED_REFUSED: &str = "RetiredDeviceRefused";
/// A retired device was enrolled again (its tombstone lifted).
pub const REASON_ENROLLED: &str = "Enrolled";

/// What one pass does with one Device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Nothing to do.
    Nothing,
    /// Add [`RETIRE_FINALIZER`].
    AddFinalizer,
    /// The Device is being deleted and holds the finalizer: tombstone, keys, finalizer.
    Retire,
    /// An enrolment of a retired device: delete the tombstone (at this revision).
    Lift {
        /// The tombstone's revision.
        revision: u64,
    },
    /// A Device of a retired device that is not an enrolment: delete it again.
    Refuse {
        /// When the device was retired.
        retired_at: Timestamp,
    },
}

/// True when `d` asks to enrol its device again ([`ENROL_ANNOTATION`] `"true"`).
pub fn enrols(d: &Device) -> bool {
    d.annotations()
        .get(ENROL_ANNOTATION)
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
}

/// True when `d` holds [`RETIRE_FINALIZER`].
pub fn has_finalizer(d: &Device) -> bool {
    d.finalizers().iter().any(|f| f == RETIRE_FINALIZER)
}

/// What to do with Device `d` given its device's tombstone (`None`: not retired). Pure.
pub fn decide(d: &Device, tomb: Option<&Seen<DeviceRetirement>>) -> Step {
    let Some(name) = d.metadata.name.as_deref() else {
        return Step::Nothing;
    };
    if DeviceId::try_from(name).is_err() {
        // Not a device (the deployments controller names it ignored): never managed, never held.
        return Step::Nothing;
    }
    if d.metadata.deletion_timestamp.is_some() {
        return match has_finalizer(d) {
            true => Step::Retire,
            false => Step::Nothing,
        };
    }
    match tomb.and_then(|t| Some((t.revision, t.value.as_ref()?))) {
        Some((revision, t)) => {
            let same_object = t.device_uid.is_some() && t.device_uid == d.metadata.uid;
            if enrols(d) && !same_object {
                Step::Lift { revision }
            } else {
                Step::Refuse {
                    retired_at: t.retired_at,
                }
            }
        }
        None if !has_finalizer(d) => Step::AddFinalizer,
        None => Step::Nothing,
    }
}

/// Whether a mirror of a per-device bucket holds a value for a device.
type Holds = Box<dyn Fn(&str) -> bool + Send + Sync>;

/// The retirement controller's state.
struct Retirer {
    client: Client,
    recorder: Recorder,
    retired: Arc<Mirror<DeviceRetirement>>,
    /// Mirrors of per-device buckets the operator keeps anyway: a retired device's key in one is a leftover.
    leftovers: Vec<Holds>,
}

/// Runs the retirement controller on the operator's [`Runtime`] until the task is dropped (started by the
/// deployments controller, whose NATS link keeps [`Runtime::retired`] current).
pub async fn run_with(
    rt: &Runtime,
    instance: Option<String>,
) -> Result<(), kube::runtime::reflector::store::WriterDropped> {
    let notify = Arc::new(Notify::new());
    let devices = rt.caches.devices.subscribe(&notify);
    rt.retired.subscribe(&notify);
    rt.caches.devices.ready().await?;
    let (info, heartbeats, workloads) =
        (rt.info.clone(), rt.heartbeats.clone(), rt.workloads.clone());
    let this = Retirer {
        client: rt.client.clone(),
        recorder: report::recorder(rt.client.clone(), instance),
        retired: rt.retired.clone(),
        leftovers: vec![
            Box::new(move |k| info.get(k).is_some_and(|s| s.value.is_some())),
            Box::new(move |k| heartbeats.get(k).is_some_and(|s| s.value.is_some())),
            Box::new(move |k| workloads.get(k).is_some_and(|s| s.value.is_some())),
        ],
    };
    let mut link: Option<Link> = None;
    let mut last_sweep = tokio::time::Instant::now();
    loop {
        let kept = Link::keep(&mut link, &rt.nats, "retirement", || Link::open(&rt.nats)).await;
        let started = tokio::time::Instant::now();
        if let (Kept::Same | Kept::Opened, Some(l)) = (kept, link.as_ref()) {
            let sweep = last_sweep.elapsed() >= SWEEP;
            if sweep {
                last_sweep = tokio::time::Instant::now();
            }
            this.pass(l, &devices.state(), sweep).await;
        }
        let pace_until = tokio::time::Instant::now() + started.elapsed() * PACE;
        let wait = if link.is_none() {
            Duration::from_secs(2)
        } else {
            SWEEP
        };
        tokio::select! {
            _ = notify.notified() => {}
            _ = tokio::time::sleep(wait) => {}
        }
        tokio::time::sleep(DEBOUNCE).await;
        tokio::time::sleep_until(pace_until).await;
    }
}

impl Retirer {
    async fn pass(&self, link: &Link, devices: &[Arc<Device>], sweep: bool) {
        let synced = self.retired.is_synced();
        // Most passes find every Device managed and no device retired: nothing is looked up then.
        let none_retired = self.retired.is_empty();
        let steps: Vec<(Arc<Device>, Step)> = devices
            .iter()
            .filter(|d| {
                !none_retired || d.metadata.deletion_timestamp.is_some() || !has_finalizer(d)
            })
            .filter_map(|d| {
                let tomb = match none_retired {
                    true => None,
                    false => self.retired.get(d.metadata.name.as_deref()?),
                };
                let step = decide(d, tomb.as_ref());
                // Lifting and refusing read the tombstones: only from a mirror that has read them all.
                let needs_sync = matches!(step, Step::Lift { .. } | Step::Refuse { .. });
                (step != Step::Nothing && (synced || !needs_sync)).then(|| (d.clone(), step))
            })
            .collect();
        futures::stream::iter(steps)
            .for_each_concurrent(CONCURRENCY, |(d, step)| async move {
                if let Err(e) = self.act(link, &d, step).await {
                    log::warn!("Device {}: {e}; tried again on the next pass", d.name_any());
                }
            })
            .await;
        if sweep && synced {
            self.sweep(link).await;
        }
    }

    async fn act(&self, link: &Link, d: &Device, step: Step) -> Result<(), String> {
        let name = d.name_any();
        match step {
            Step::Nothing => Ok(()),
            Step::AddFinalizer => self.add_finalizer(d).await,
            Step::Retire => {
                let id = DeviceId::try_from(name.as_str()).map_err(|e| e.to_string())?;
                let tomb = DeviceRetirement {
                    device_id: id.clone(),
                    retired_at: Timestamp::now(),
                    device_uid: d.metadata.uid.clone(),
                };
                let recorded = self
                    .retired
                    .get(&name)
                    .and_then(|s| s.value)
                    .is_some_and(|t| t.device_uid == tomb.device_uid);
                if !recorded {
                    write_tombstone(link, &tomb)
                        .await
                        .map_err(|e| e.to_string())?;
                }
                let removed = clear_device(link, &id).await.map_err(|e| e.to_string())?;
                self.remove_finalizer(d).await?;
                let note = format!(
                    "device {id} retired: tombstone recorded in {}, {removed} of its keys deleted from every \
                     per-device bucket; fleet-auth refuses it until it is enrolled again (create its Device with \
                     {ENROL_ANNOTATION}=true)",
                    layout::DEVICE_RETIRED
                );
                log::info!("{note}");
                self.event(d, EventType::Normal, REASON_RETIRED, note).await;
                Ok(())
            }
            Step::Lift { revision } => {
                let store = link
                    .store(layout::DEVICE_RETIRED)
                    .map_err(|e| e.to_string())?;
                match store.delete_expect_revision(&name, Some(revision)).await {
                    Ok(()) => {
                        self.retired.record(&name, revision + 1, None);
                        let note = format!(
                            "device {name} enrolled again: its tombstone is lifted ({ENROL_ANNOTATION}=true on a \
                             Device created after it was retired); fleet-auth admits it again"
                        );
                        log::info!("{note}");
                        self.event(d, EventType::Normal, REASON_ENROLLED, note)
                            .await;
                        Ok(())
                    }
                    // Lifted by another replica, or retired again meanwhile: the next pass decides from the new value.
                    Err(e) => Err(format!("tombstone not lifted: {e}")),
                }
            }
            Step::Refuse { retired_at } => {
                let note = format!(
                    "device {name} was retired at {retired_at}: its Device is deleted again. To enrol it again, \
                     create its Device with the annotation {ENROL_ANNOTATION}: \"true\" (docs/device-lifecycle.md)"
                );
                log::warn!("{note}");
                self.event(d, EventType::Warning, REASON_RETIRED_REFUSED, note)
                    .await;
                let api: Api<Device> = Api::all(self.client.clone());
                let params = DeleteParams {
                    preconditions: Some(Preconditions {
                        uid: d.metadata.uid.clone(),
                        resource_version: None,
                    }),
                    ..Default::default()
                };
                match api.delete(&name, &params).await {
                    Ok(_) => Ok(()),
                    Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
                    Err(e) => Err(format!("delete: {e}")),
                }
            }
        }
    }

    /// Deletes again the keys retired devices wrote after their tombstone (seen in the operator's mirrors).
    async fn sweep(&self, link: &Link) {
        let retired = self.retired.values();
        let left: Vec<DeviceId> = retired
            .values()
            .filter(|t| self.leftovers.iter().any(|has| has(t.device_id.as_str())))
            .map(|t| t.device_id.clone())
            .take(SWEEP_MAX)
            .collect();
        for id in left {
            match clear_device(link, &id).await {
                Ok(n) => log::info!(
                    "retired device {id}: {n} keys it wrote after its retirement deleted"
                ),
                Err(e) => log::warn!("retired device {id}: leftover keys not deleted: {e}"),
            }
        }
    }

    async fn event(&self, d: &Device, type_: EventType, reason: &str, note: String) {
        let ev = Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: "Retire".into(),
            secondary: None,
        };
        if let Err(e) =
            report::publish_cluster_scoped(&self.client, &self.recorder, &ev, &d.object_ref(&()))
                .await
        {
            log::warn!("event {reason} for Device {}: {e}", d.name_any());
        }
    }

    /// Adds [`RETIRE_FINALIZER`] (a JSON patch tested against the finalizers seen: a change meanwhile fails it,
    /// and the next pass looks again).
    async fn add_finalizer(&self, d: &Device) -> Result<(), String> {
        let mut ops = vec![
            serde_json::json!({"op": "test", "path": "/metadata/finalizers",
            "value": d.metadata.finalizers}),
        ];
        ops.push(match d.finalizers().is_empty() {
            true => serde_json::json!({"op": "add", "path": "/metadata/finalizers", "value": [RETIRE_FINALIZER]}),
            false => serde_json::json!({"op": "add", "path": "/metadata/finalizers/-", "value": RETIRE_FINALIZER}),
        });
        match self.patch(d, ops).await {
            Ok(()) => {
                log::debug!(
                    "Device {}: finalizer {RETIRE_FINALIZER} added",
                    d.name_any()
                );
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 422 => Ok(()),
            Err(e) => Err(format!("adding the finalizer: {e}")),
        }
    }

    /// Removes [`RETIRE_FINALIZER`] (tested by index, so another finalizer is never removed instead).
    async fn remove_finalizer(&self, d: &Device) -> Result<(), String> {
        let Some(i) = d.finalizers().iter().position(|f| f == RETIRE_FINALIZER) else {
            return Ok(());
        };
        let path = format!("/metadata/finalizers/{i}");
        let ops = vec![
            serde_json::json!({"op": "test", "path": path, "value": RETIRE_FINALIZER}),
            serde_json::json!({"op": "remove", "path": path}),
        ];
        match self.patch(d, ops).await {
            Ok(()) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(format!("removing the finalizer: {e}")),
        }
    }

    async fn patch(&self, d: &Device, ops: Vec<serde_json::Value>) -> Result<(), kube::Error> {
        let patch: json_patch::Patch = serde_json::from_value(serde_json::Value::Array(ops))
            .map_err(kube::Error::SerdeError)?;
        let api: Api<Device> = Api::all(self.client.clone());
        api.patch(
            &d.name_any(),
            &PatchParams::default(),
            &Patch::<()>::Json(patch),
        )
        .await
        .map(|_| ())
    }
}

/// Records `tomb` in `device-retired` (a plain put: the latest retirement wins).
pub async fn write_tombstone(link: &Link, tomb: &DeviceRetirement) -> Result<u64, NatsError> {
    let store = link.store(layout::DEVICE_RETIRED)?;
    let bytes = serde_json::to_vec(tomb).map_err(|e| NatsError::new("encode tombstone", e))?;
    store
        .put(layout::device_key(&tomb.device_id), bytes.into())
        .await
        .map_err(|e| NatsError::new(format!("put {}", layout::DEVICE_RETIRED), e))
}

/// Deletes every key of device `id` in every per-device bucket of the layout (`<device-id>` and
/// `<device-id>.<run-uid>`; never the tombstone bucket). Returns how many keys held a value.
pub async fn clear_device(link: &Link, id: &DeviceId) -> Result<usize, NatsError> {
    let mut removed = 0;
    for spec in layout::per_device_buckets() {
        let store = link.store(spec.name)?;
        let keys = match spec.key {
            layout::KeyShape::Device => vec![layout::device_key(id)],
            _ => run_keys(store, id).await?,
        };
        for key in keys {
            removed += usize::from(delete_key(store, &key).await?);
        }
    }
    Ok(removed)
}

/// The keys `<device-id>.…` of `store` (the stream's subjects under the device's filter: no consumer).
async fn run_keys(store: &Store, id: &DeviceId) -> Result<Vec<String>, NatsError> {
    let filter = format!("{}{}", store.prefix, layout::device_runs_filter(id));
    let mut subjects = store
        .stream
        .info_with_subjects(&filter)
        .await
        .map_err(|e| NatsError::new(format!("list {filter}"), e))?;
    let mut keys = Vec::new();
    while let Some(s) = subjects.next().await {
        let (subject, _) = s.map_err(|e| NatsError::new(format!("list {filter}"), e))?;
        if let Some(k) = subject.strip_prefix(store.prefix.as_str()) {
            keys.push(k.to_owned());
        }
    }
    Ok(keys)
}

/// Deletes `key` (a delete marker) when it holds a value; true when it did.
async fn delete_key(store: &Store, key: &str) -> Result<bool, NatsError> {
    let held = store
        .get(key)
        .await
        .map_err(|e| NatsError::new(format!("get {}/{key}", store.name), e))?;
    if held.is_none() {
        return Ok(false);
    }
    store
        .delete(key)
        .await
        .map_err(|e| NatsError::new(format!("delete {}/{key}", store.name), e))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn device(meta: serde_json::Value) -> Device {
        let mut m = json!({"name": "dev-1", "uid": "uid-2"});
        for (k, v) in meta.as_object().into_iter().flatten() {
            m[k] = v.clone();
        }
        serde_json::from_value(
            json!({"apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "Device",
            "metadata": m, "spec": {}}),
        )
        .expect("device")
    }

    fn tomb(uid: &str) -> Seen<DeviceRetirement> {
        let v = DeviceRetirement {
            device_id: DeviceId::try_from("dev-1").expect("id"),
            retired_at: Timestamp::from_unix_ms(1_800_000_000_000),
            device_uid: Some(uid.into()),
        };
        let m = Mirror::<DeviceRetirement>::new(layout::DEVICE_RETIRED);
        m.record("dev-1", 7, Some(v));
        m.get("dev-1").expect("seen")
    }

    /// Every case of a Device against its tombstone: the finalizer added to a managed Device, a deleted one
    /// retired, an enrolment lifts the tombstone only from another object than the one retired, anything else of
    /// a retired device deleted again.
    #[test]
    fn decisions() {
        let fin = json!([RETIRE_FINALIZER]);
        let deleting = json!("2026-12-07T13:00:00Z");
        let enrol = json!({ENROL_ANNOTATION: "true"});
        let rows: Vec<(&str, serde_json::Value, Option<&str>, Step)> = vec![
            (
                "a new Device gets the finalizer",
                json!({}),
                None,
                Step::AddFinalizer,
            ),
            (
                "one with it: nothing",
                json!({"finalizers": fin}),
                None,
                Step::Nothing,
            ),
            (
                "deleted with the finalizer: retired",
                json!({"finalizers": fin, "deletionTimestamp": deleting}),
                None,
                Step::Retire,
            ),
            (
                "deleted again while its tombstone exists: still retired (idempotent)",
                json!({"finalizers": fin, "deletionTimestamp": deleting}),
                Some("uid-2"),
                Step::Retire,
            ),
            (
                "deleted without it: not ours",
                json!({"deletionTimestamp": deleting, "finalizers": ["other"]}),
                None,
                Step::Nothing,
            ),
            (
                "an enrolment: a new object with the annotation",
                json!({"annotations": enrol}),
                Some("uid-1"),
                Step::Lift { revision: 7 },
            ),
            (
                "a stale view of the retired object, annotated, never lifts it",
                json!({"annotations": enrol, "finalizers": fin}),
                Some("uid-2"),
                Step::Refuse {
                    retired_at: Timestamp::from_unix_ms(1_800_000_000_000),
                },
            ),
            (
                "a Device created from reports (no annotation): deleted again",
                json!({"finalizers": fin}),
                Some("uid-1"),
                Step::Refuse {
                    retired_at: Timestamp::from_unix_ms(1_800_000_000_000),
                },
            ),
            (
                "annotation false",
                json!({"annotations": {ENROL_ANNOTATION: "false"}}),
                Some("uid-1"),
                Step::Refuse {
                    retired_at: Timestamp::from_unix_ms(1_800_000_000_000),
                },
            ),
            (
                "the annotation on a device that is not retired: nothing but the finalizer",
                json!({"annotations": enrol}),
                None,
                Step::AddFinalizer,
            ),
        ];
        for (name, meta, tombstone, want) in rows {
            let t = tombstone.map(tomb);
            assert_eq!(decide(&device(meta), t.as_ref()), want, "{name}");
        }
        let mut bad = device(json!({}));
        bad.metadata.name = Some("Not_A_Device".into());
        assert_eq!(decide(&bad, None), Step::Nothing);
    }
}
