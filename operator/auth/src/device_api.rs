//! fleet-auth's device API (`fleet_wire::device_api`, docs/auth.md): the only way a device's messages reach the
//! buckets, and the only sender of notices to a device.
//!
//! - Writes: every KV subject devices write is a service of the device API's account. A write is checked (its
//!   bucket, its key, its size; a run key only for a run the device was given), counted against the device's
//!   write budget, and written to JetStream with its value alone — no header of the device's reaches JetStream.
//!   The answer has JetStream's acknowledgement's shape (or its error's), as a direct write would get, but its
//!   `seq` is always [`ACK_SEQ`]: the stream's sequence counts every device's writes, so it would tell a device how
//!   often the others write. The agent requires a numeric `seq` and only logs it.
//!   Writes of one device are handled in order (each device's writes go to the same worker).
//! - Watches: devices register their inbox (every replica keeps every registration); each write to a key of an
//!   operator-written bucket is noticed by one replica (a queue group), which publishes an empty notice below that
//!   device's registered inbox.
//! - Refused writes are logged and reported to the operator (`fleet.device-refusals.<device>`), at most one
//!   report per device per [`REFUSAL_REPORT_INTERVAL`]; refusals that came after a report are reported with the
//!   next refusal or, when none comes, within the next interval.
//! - Everything else a device can make fleet-auth log (refused watch registrations, writes JetStream did not take)
//!   is logged at most once per device per [`SUMMARY_INTERVAL`] with a count ([`Summaries`]); every text from a
//!   device is shown escaped (`fleet_wire::text::for_log`).

use super::config::DeviceApiSettings;
use async_nats::jetstream;
use fleet_wire::device_api::{
    check_put, key_device, notice_subject, noticed_buckets, refusals_subject, run_given_by,
    written_buckets, DevicePut, PutRefusal, WatchRegistration, WriteBudget, WriteRefused,
    REFUSAL_REPORT_INTERVAL, WATCH_ROOT, WATCH_TTL,
};
use fleet_wire::log_summary::{Summaries, SUMMARY_INTERVAL};
use fleet_wire::DeviceId;
use futures::StreamExt;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Queue group shared by fleet-auth replicas for writes and notices.
pub const QUEUE_GROUP: &str = "fleet-auth";
/// Workers handling writes; a device's writes always go to the same one, in order.
pub const WORKERS: usize = 64;
/// Writes waiting per worker; beyond that a write is dropped unanswered (the agent's put times out and is
/// tried again), so a flood never grows memory.
pub const WORKER_QUEUE: usize = 512;
/// Writes of one device waiting at once; beyond that its writes are refused at once
/// ([`PutRefusal::TooManyWaiting`]). An agent waits for each write's answer before it sends the next, so it never
/// has more than one waiting; a flooding device can take at most this many of its worker's [`WORKER_QUEUE`]
/// places, never the other devices'.
pub const DEVICE_QUEUED: usize = 4;
/// Devices whose registrations, budgets and report times are kept at most (a fleet of this many devices fits).
pub const MAX_DEVICES: usize = 1_000_000;
/// The `seq` of every acknowledgement a device gets: not the stream's (which counts every device's writes).
pub const ACK_SEQ: u64 = 0;
/// Time-out of one JetStream write or read made for a device.
pub const JS_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the device API's state of one device is kept.
#[derive(Default)]
struct DeviceState {
    /// Registered watch inbox and when it was registered.
    inbox: Option<(String, Instant)>,
    /// Write budget.
    budget: Option<WriteBudget>,
    /// When a refusal was last reported, refusals since, and the latest of them (reported by [`flush`] when no
    /// later refusal comes: a flood that stops within the interval is still reported whole).
    reported: Option<Instant>,
    refused: u64,
    latest: Option<WriteRefused>,
}

/// The device API's memory, shared by its tasks.
struct Registry {
    devices: Mutex<HashMap<DeviceId, DeviceState>>,
    /// Devices with refusals not reported yet.
    unreported: Mutex<std::collections::HashSet<DeviceId>>,
    /// What devices make fleet-auth log, besides the write refusal reports.
    logs: Mutex<Logs>,
    started: Instant,
}

/// Per-device summaries of what fleet-auth logs about a device's messages.
struct Logs {
    /// Watch registrations refused (not the device's own inbox, not JSON, too large).
    registrations: Summaries,
    /// Watch registrations dropped because [`MAX_DEVICES`] devices are registered.
    dropped: Summaries,
    /// Writes JetStream did not take.
    failed: Summaries,
    /// Writes refused on a subject that names no valid device.
    unnamed: Summaries,
    /// Writes and watch registrations of retired devices, refused.
    retired: Summaries,
}

impl Logs {
    fn new() -> Self {
        Self {
            registrations: Summaries::new("watch registration refused for", SUMMARY_INTERVAL),
            dropped: Summaries::new("watch registration dropped for", SUMMARY_INTERVAL),
            failed: Summaries::new("write failed for", SUMMARY_INTERVAL),
            unnamed: Summaries::new("write refused for", SUMMARY_INTERVAL),
            retired: Summaries::new("refused the writes of retired device", SUMMARY_INTERVAL),
        }
    }

    /// The summaries due at `now`.
    fn due(&mut self, now: Instant) -> Vec<String> {
        let mut lines = self.registrations.due(now);
        lines.extend(self.dropped.due(now));
        lines.extend(self.failed.due(now));
        lines.extend(self.unnamed.due(now));
        lines.extend(self.retired.due(now));
        lines
    }
}

impl Registry {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Records one event of `device` in the summary `pick` chooses; logs it when a line is due.
    fn log(&self, pick: impl FnOnce(&mut Logs) -> &mut Summaries, device: &str, reason: &str) {
        let line = match self.logs.lock() {
            Ok(mut logs) => pick(&mut logs).record(device, reason, Instant::now()),
            Err(_) => None,
        };
        if let Some(line) = line {
            log::warn!("{line}");
        }
    }

    /// Runs `f` on `device`'s state, making room when the map is full (dropping what expired, then refusing).
    fn with<R>(&self, device: &DeviceId, f: impl FnOnce(&mut DeviceState) -> R) -> Option<R> {
        let mut map = self.devices.lock().ok()?;
        if !map.contains_key(device) && map.len() >= MAX_DEVICES {
            let now = Instant::now();
            map.retain(|_, s| {
                s.inbox
                    .as_ref()
                    .is_some_and(|(_, at)| now.duration_since(*at) < WATCH_TTL)
            });
            if map.len() >= MAX_DEVICES {
                return None;
            }
        }
        Some(f(map.entry(device.clone()).or_default()))
    }

    /// The registered inbox of `device`, unless it expired.
    fn inbox(&self, device: &DeviceId) -> Option<String> {
        let map = self.devices.lock().ok()?;
        let (inbox, at) = map.get(device)?.inbox.as_ref()?;
        (at.elapsed() < WATCH_TTL).then(|| inbox.clone())
    }
}

/// The buckets' side: JetStream for writes and run checks, and the connection notices are published on.
struct Fleet {
    client: async_nats::Client,
    js: jetstream::Context,
}

/// Connects both users and serves until a connection's subscription ends.
pub async fn run(
    url: &str,
    tls: &fleet_kit::nats_tls::NatsTls,
    api: DeviceApiSettings,
    retired: Arc<super::retired::Retired>,
) -> Result<(), String> {
    use super::service::connect_user;
    let devices = connect_user(url, tls, &api.user, &api.password, "fleet-auth device API").await?;
    let fleet_client = connect_user(
        url,
        tls,
        &api.fleet_user,
        &api.fleet_password,
        "fleet-auth device API (buckets)",
    )
    .await?;
    let fleet = Arc::new(Fleet {
        js: jetstream::new(fleet_client.clone()),
        client: fleet_client,
    });
    let registry = Arc::new(Registry {
        devices: Mutex::new(HashMap::new()),
        unreported: Mutex::new(Default::default()),
        logs: Mutex::new(Logs::new()),
        started: Instant::now(),
    });

    let mut writes = Vec::new();
    for spec in written_buckets() {
        let subject = fleet_wire::auth::every_device_filter(spec);
        writes.push(
            devices
                .queue_subscribe(subject.clone(), QUEUE_GROUP.into())
                .await
                .map_err(|e| format!("subscribe {subject}: {e}"))?,
        );
    }
    let mut registrations = devices
        .subscribe(format!("{WATCH_ROOT}.*"))
        .await
        .map_err(|e| format!("subscribe {WATCH_ROOT}.*: {e}"))?;
    let mut notices = Vec::new();
    for spec in noticed_buckets() {
        let subject = fleet_wire::auth::every_device_filter(spec);
        notices.push(
            fleet
                .client
                .queue_subscribe(subject.clone(), QUEUE_GROUP.into())
                .await
                .map_err(|e| format!("subscribe {subject}: {e}"))?,
        );
    }
    devices
        .flush()
        .await
        .map_err(|e| format!("NATS flush: {e}"))?;
    fleet
        .client
        .flush()
        .await
        .map_err(|e| format!("NATS flush: {e}"))?;

    // Writes: one ordered worker per share of the devices, each device holding at most DEVICE_QUEUED places.
    let queued = Arc::new(Queued::default());
    let mut queues = Vec::with_capacity(WORKERS);
    for _ in 0..WORKERS {
        let (tx, mut rx) = mpsc::channel::<async_nats::Message>(WORKER_QUEUE);
        queues.push(tx);
        let (fleet, registry, devices) = (fleet.clone(), registry.clone(), devices.clone());
        let queued = queued.clone();
        tokio::spawn(async move {
            while let Some(msg) = rx.recv().await {
                let device = subject_device_name(&msg.subject).to_owned();
                handle_write(&fleet, &registry, &devices, msg).await;
                queued.done(&device);
            }
        });
    }
    let mut writes = futures::stream::select_all(writes);
    let dispatch = {
        let (fleet, registry, devices) = (fleet.clone(), registry.clone(), devices.clone());
        let retired = retired.clone();
        async move {
            while let Some(msg) = writes.next().await {
                let device = subject_device_name(&msg.subject).to_owned();
                // A retired device writes nothing, on whatever connection (one opened before its retirement too);
                // logged, not reported to the operator (its Device is gone).
                if retired.contains(&device) {
                    let why = format!("device {device} is retired");
                    registry.log(|l| &mut l.retired, &device, &why);
                    let answer = api_error(403, &format!("device API refused the write: {why}"));
                    answer_with(&devices, msg, answer).await;
                    continue;
                }
                if !queued.take(&device) {
                    let refusal = PutRefusal::TooManyWaiting {
                        limit: DEVICE_QUEUED,
                    };
                    let device = subject_device(&msg.subject);
                    refuse(&fleet, &registry, &devices, msg, device, refusal).await;
                    continue;
                }
                let shard = shard(&device);
                if queues[shard].try_send(msg).is_err() {
                    queued.done(&device);
                    log::debug!("device API worker {shard} busy: a write was dropped unanswered");
                }
            }
        }
    };
    let reg = {
        let registry = registry.clone();
        async move {
            while let Some(msg) = registrations.next().await {
                // One line per device per interval at most, whatever a device sends, so a device cannot fill the log.
                match WatchRegistration::parse(&msg.subject, &msg.payload) {
                    Ok((device, _)) if retired.contains(device.as_str()) => registry.log(
                        |l| &mut l.retired,
                        device.as_str(),
                        &format!("device {device} is retired (watch registration)"),
                    ),
                    Ok((device, r)) => {
                        if registry
                            .with(&device, |s| s.inbox = Some((r.inbox, Instant::now())))
                            .is_none()
                        {
                            registry.log(
                                |l| &mut l.dropped,
                                device.as_str(),
                                &format!("{MAX_DEVICES} devices registered"),
                            );
                        }
                    }
                    Err(e) => registry.log(
                        |l| &mut l.registrations,
                        registration_device_name(&msg.subject),
                        &e.to_string(),
                    ),
                }
            }
        }
    };
    let notify = {
        let (fleet, registry) = (fleet.clone(), registry.clone());
        let mut notices = futures::stream::select_all(notices);
        async move {
            while let Some(msg) = notices.next().await {
                let Some((bucket, key)) = msg
                    .subject
                    .strip_prefix("$KV.")
                    .and_then(|r| r.split_once('.'))
                else {
                    continue;
                };
                let Some(spec) = fleet_wire::kv::bucket(bucket) else {
                    continue;
                };
                let Some(device) = key_device(spec, key) else {
                    continue;
                };
                if let Some(inbox) = registry.inbox(&device) {
                    let subject = notice_subject(&inbox, bucket, key);
                    if let Err(e) = fleet.client.publish(subject, bytes::Bytes::new()).await {
                        log::warn!("notice to {device}: {e}");
                    }
                }
            }
        }
    };
    let flusher = {
        let (fleet, registry) = (fleet.clone(), registry.clone());
        async move {
            let mut tick = tokio::time::interval(REFUSAL_REPORT_INTERVAL / 2);
            loop {
                tick.tick().await;
                flush(&fleet, &registry).await;
                let lines = match registry.logs.lock() {
                    Ok(mut logs) => logs.due(Instant::now()),
                    Err(_) => Vec::new(),
                };
                for line in lines {
                    log::warn!("{line}");
                }
            }
        }
    };
    log::info!(
        "fleet-auth device API serving writes and watches as {} and {}",
        api.user,
        api.fleet_user
    );
    tokio::select! {
        _ = dispatch => {}
        _ = reg => {}
        _ = notify => {}
        _ = flusher => {}
    }
    Err("a device API subscription ended (NATS connection closed)".into())
}

/// The device part of a write's subject (`$KV.<bucket>.<device>…`) as sent, valid or not (checked later).
fn subject_device_name(subject: &str) -> &str {
    subject.split('.').nth(2).unwrap_or("")
}

/// The device part of a watch registration's subject (`fleet.device-watch.<device>`) as sent, valid or not.
fn registration_device_name(subject: &str) -> &str {
    subject
        .strip_prefix(WATCH_ROOT)
        .and_then(|s| s.strip_prefix('.'))
        .unwrap_or(subject)
}

/// Writes waiting per device (only devices with some waiting are kept: at most the workers' places).
#[derive(Default)]
struct Queued(Mutex<HashMap<String, usize>>);

impl Queued {
    /// Takes a place for one more write of `device`; false when it has [`DEVICE_QUEUED`] waiting.
    fn take(&self, device: &str) -> bool {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let n = m.entry(device.to_owned()).or_insert(0);
        if *n >= DEVICE_QUEUED {
            return false;
        }
        *n += 1;
        true
    }

    /// One write of `device` was handled (or dropped after its place was taken).
    fn done(&self, device: &str) {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = m.get_mut(device) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                m.remove(device);
            }
        }
    }
}

/// The worker a device's writes go to, so that they stay in order.
fn shard(device: &str) -> usize {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    device.hash(&mut h);
    (h.finish() % WORKERS as u64) as usize
}

/// Handles one write: checks, budget, run check, the JetStream write, the answer; reports refusals.
async fn handle_write(
    fleet: &Fleet,
    registry: &Registry,
    devices: &async_nats::Client,
    msg: async_nats::Message,
) {
    let answer = match write(fleet, registry, &msg).await {
        Ok(stream) => serde_json::json!({ "stream": stream, "seq": ACK_SEQ }),
        Err(Failure::Refused(device, refusal)) => {
            return refuse(fleet, registry, devices, msg, device, refusal).await;
        }
        Err(Failure::Store(e)) => {
            let why = format!("{}: {e}", msg.subject);
            registry.log(|l| &mut l.failed, subject_device_name(&msg.subject), &why);
            api_error(503, &format!("device API could not write: {e}"))
        }
    };
    answer_with(devices, msg, answer).await;
}

/// Refuses a write of `device` (the one its subject names): reported, and answered in JetStream's error shape.
async fn refuse(
    fleet: &Fleet,
    registry: &Registry,
    devices: &async_nats::Client,
    msg: async_nats::Message,
    device: Option<DeviceId>,
    refusal: PutRefusal,
) {
    report(fleet, registry, device.as_ref(), &msg.subject, &refusal).await;
    let answer = api_error(400, &format!("device API refused the write: {refusal}"));
    answer_with(devices, msg, answer).await;
}

/// Sends `answer` to the write's reply subject, if it has one.
async fn answer_with(
    devices: &async_nats::Client,
    msg: async_nats::Message,
    answer: serde_json::Value,
) {
    if let Some(reply) = msg.reply {
        let body = serde_json::to_vec(&answer).unwrap_or_default();
        if let Err(e) = devices.publish(reply, body.into()).await {
            log::debug!("answer to {}: {e}", msg.subject);
        }
    }
}

/// An answer in JetStream's error shape, which the agent reads as it reads JetStream's own.
fn api_error(code: u16, description: &str) -> serde_json::Value {
    serde_json::json!({ "error": { "code": code, "err_code": 0, "description": description } })
}

enum Failure {
    /// The device's own fault: reported.
    Refused(Option<DeviceId>, PutRefusal),
    /// JetStream did not take it.
    Store(String),
}

async fn write(
    fleet: &Fleet,
    registry: &Registry,
    msg: &async_nats::Message,
) -> Result<String, Failure> {
    let put: DevicePut = check_put(&msg.subject, msg.payload.len())
        .map_err(|r| Failure::Refused(subject_device(&msg.subject), r))?;
    let now = registry.now_ms();
    let allowed = registry
        .with(&put.device, |s| {
            s.budget
                .get_or_insert_with(|| WriteBudget::full(now))
                .take(now)
        })
        .unwrap_or(false);
    if !allowed {
        return Err(Failure::Refused(Some(put.device), PutRefusal::OverBudget));
    }
    if let Some(run) = &put.run {
        if !run_given(fleet, put.bucket.name, &put.key())
            .await
            .map_err(Failure::Store)?
        {
            return Err(Failure::Refused(
                Some(put.device.clone()),
                PutRefusal::UnknownRun {
                    run: run.to_string(),
                },
            ));
        }
    }
    // The value alone: no header of the device's (`Nats-Rollup`, `KV-Operation`, `Nats-Expected-*`,
    // `Nats-Msg-Id`, `Nats-TTL`, …) reaches JetStream.
    let ack = tokio::time::timeout(JS_TIMEOUT, async {
        fleet
            .js
            .publish(put.subject(), msg.payload.clone())
            .await
            .map_err(|e| e.to_string())?
            .await
            .map_err(|e| e.to_string())
    })
    .await
    .map_err(|_| Failure::Store(format!("no acknowledgement within {JS_TIMEOUT:?}")))?
    .map_err(Failure::Store)?;
    Ok(ack.stream)
}

/// Whether run key `key` (`<device>.<run>`) of `bucket` may be written: it is in one of the buckets
/// [`run_given_by`] names (the device was given the run, or wrote its status before).
async fn run_given(fleet: &Fleet, bucket: &str, key: &str) -> Result<bool, String> {
    for &bucket in run_given_by(bucket) {
        let found = tokio::time::timeout(JS_TIMEOUT, async {
            let store = fleet
                .js
                .get_key_value(bucket)
                .await
                .map_err(|e| format!("bucket {bucket}: {e}"))?;
            store
                .get(key)
                .await
                .map(|v| v.is_some())
                .map_err(|e| format!("read {bucket}/{key}: {e}"))
        })
        .await
        .map_err(|_| format!("read {bucket}/{key}: no answer within {JS_TIMEOUT:?}"))??;
        if found {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The device named by a KV subject (`$KV.<bucket>.<device>…`), if it is a valid id.
fn subject_device(subject: &str) -> Option<DeviceId> {
    DeviceId::try_from(subject.split('.').nth(2)?).ok()
}

/// The bucket devices write named by a KV subject (`$KV.<bucket>.…`), if any.
fn subject_bucket(subject: &str) -> Option<String> {
    let bucket = subject.strip_prefix("$KV.")?.split('.').next()?;
    written_buckets()
        .any(|b| b.name == bucket)
        .then(|| bucket.to_owned())
}

/// Logs a refusal and reports it to the operator, at most once per device per [`REFUSAL_REPORT_INTERVAL`].
async fn report(
    fleet: &Fleet,
    registry: &Registry,
    device: Option<&DeviceId>,
    subject: &str,
    refusal: &PutRefusal,
) {
    let Some(device) = device else {
        registry.log(
            |l| &mut l.unnamed,
            subject_device_name(subject),
            &refusal.to_string(),
        );
        return;
    };
    let latest = WriteRefused {
        device_id: device.clone(),
        bucket: subject_bucket(subject),
        kind: refusal.kind().into(),
        reason: refusal.to_string(),
        count: 0,
    };
    let due = registry
        .with(device, |s| {
            s.refused += 1;
            s.latest = Some(latest);
            take_due(s)
        })
        .flatten();
    match due {
        Some(body) => publish_report(fleet, &body).await,
        None => {
            if let Ok(mut set) = registry.unreported.lock() {
                set.insert(device.clone());
            }
        }
    }
}

/// The report due for a device's state (its interval passed and it has refusals), taking its count.
fn take_due(s: &mut DeviceState) -> Option<WriteRefused> {
    let due = s.refused > 0
        && s.reported
            .is_none_or(|at| at.elapsed() >= REFUSAL_REPORT_INTERVAL);
    if !due {
        return None;
    }
    s.reported = Some(Instant::now());
    let mut body = s.latest.clone()?;
    body.count = std::mem::take(&mut s.refused);
    Some(body)
}

/// Reports the refusals that no later refusal reported (the flood stopped), once their interval passed.
async fn flush(fleet: &Fleet, registry: &Registry) {
    let devices: Vec<DeviceId> = match registry.unreported.lock() {
        Ok(mut set) => set.drain().collect(),
        Err(_) => return,
    };
    for device in devices {
        match registry.with(&device, take_due).flatten() {
            Some(body) => publish_report(fleet, &body).await,
            None => {
                let pending = registry.with(&device, |s| s.refused > 0).unwrap_or(false);
                if pending {
                    if let Ok(mut set) = registry.unreported.lock() {
                        set.insert(device);
                    }
                }
            }
        }
    }
}

async fn publish_report(fleet: &Fleet, body: &WriteRefused) {
    log::warn!(
        "write of device {} refused ({} since the last report): {}",
        body.device_id,
        body.count,
        fleet_wire::text::for_log(&body.reason)
    );
    if let Ok(bytes) = serde_json::to_vec(body) {
        let _ = fleet
            .client
            .publish(refusals_subject(&body.device_id), bytes.into())
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_devices_writes_share_one_worker() {
        let device = |s| shard(subject_device_name(s));
        let a = device("$KV.device-info.dev-a");
        assert_eq!(device("$KV.device-heartbeat.dev-a"), a);
        assert_eq!(
            device("$KV.system-upgrade-status.dev-a.0a5b3c1e-8f2d-4b7a-9c6e-1d2f3a4b5c6d"),
            a
        );
        assert!(a < WORKERS);
    }

    #[test]
    fn a_flooding_device_holds_at_most_its_own_places() {
        let q = Queued::default();
        for _ in 0..DEVICE_QUEUED {
            assert!(q.take("dev-a"));
        }
        assert!(!q.take("dev-a"), "a fifth waiting write of dev-a");
        assert!(q.take("dev-b"), "another device is not held up by dev-a");
        q.done("dev-a");
        assert!(q.take("dev-a"), "a place freed is dev-a's again");
        for _ in 0..DEVICE_QUEUED {
            q.done("dev-a");
        }
        q.done("dev-b");
        q.done("dev-b");
        assert!(
            q.0.lock().unwrap().is_empty(),
            "devices with nothing waiting are not kept"
        );
    }

    #[test]
    fn a_report_takes_every_refusal_since_the_last() {
        let mut s = DeviceState::default();
        assert_eq!(take_due(&mut s), None, "nothing refused");
        s.refused = 3;
        s.latest = Some(WriteRefused {
            device_id: DeviceId::try_from("dev-a").expect("id"),
            bucket: Some("device-heartbeat".into()),
            kind: "over-budget".into(),
            reason: "over the write budget".into(),
            count: 0,
        });
        assert_eq!(take_due(&mut s).map(|r| r.count), Some(3));
        s.refused = 2;
        assert_eq!(
            take_due(&mut s),
            None,
            "within the interval: kept for later"
        );
        assert_eq!(s.refused, 2);
    }

    #[test]
    fn reports_name_only_buckets_devices_write() {
        assert_eq!(
            subject_bucket("$KV.device-info.dev-a").as_deref(),
            Some("device-info")
        );
        assert_eq!(subject_bucket("$KV.device-desired-state.dev-a"), None);
        assert_eq!(subject_bucket("fleet.device-watch.dev-a"), None);
    }
}
