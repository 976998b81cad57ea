//! Refused device writes as a person sees them: fleet-auth's device API reports a device's refused writes on
//! `fleet.device-refusals.<device>` (at most one report per device per 10 s, with a count); the operator keeps a
//! record per device, shows it in the Device's `status.writesRefused` (`kubectl get fdev` column Refused), publishes
//! a Warning event `WritesRefused` on the Device (at most one per device per [`EVENT_WINDOW`], and at most
//! [`EVENTS_PER_MINUTE`] for the whole fleet), and counts them in `fleet_device_writes_refused_total{bucket,kind}`
//! (labels bounded: no device label, so 10,000 devices make at most 42 series). Deciding is pure ([`Record`],
//! [`status`], [`EventLimiter`]); [`listen`] is the I/O.

use crate::crd::{Device, WritesRefused};
use crate::kv::NatsError;
use fleet_wire::device_api::{written_buckets, WriteRefused, FLOOD_KIND, REFUSALS_ROOT};
use fleet_wire::{DeviceId, Timestamp};
use futures::StreamExt;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::Store as Cache;
use kube::{Resource, ResourceExt};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

/// Event reason (and the Device status field's name for people).
pub const REASON: &str = "WritesRefused";
/// At most one `WritesRefused` event per device in each window of this length (windows are aligned to the Unix
/// epoch, and the event's name carries the window, so replicas that see the same reports publish it once).
pub const EVENT_WINDOW: Duration = Duration::from_secs(5 * 60);
/// At most this many `WritesRefused` events a minute for the whole fleet (per replica): a fleet-wide flood must
/// not turn into a flood of API writes. Refusals not evented then are in the next event of their device.
pub const EVENTS_PER_MINUTE: u32 = 60;
/// A new count is written to the Device status at most this often (a flood reports every 10 s), as heartbeats are.
pub const STATUS_COALESCE: Duration = Duration::from_secs(30);
/// `status.writesRefused` is removed once the device has had no refusal for this long.
pub const QUIET: Duration = Duration::from_secs(60 * 60);
/// Devices whose records are kept at most; past that, new devices are only counted in the metric and logged.
pub const MAX_TRACKED: usize = 100_000;
/// Most characters of a reason kept (fleet-auth's texts are short; a report is not trusted to be).
pub const MAX_REASON_CHARS: usize = 512;

/// What the operator knows of one device's refused writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Refused writes since `since`.
    pub count: u64,
    /// When the first of them was reported (or the status this record continued).
    pub since: Timestamp,
    /// When the latest report arrived.
    pub last_at: Timestamp,
    /// The latest refusal's bucket, kind and text.
    pub bucket: Option<String>,
    /// [`fleet_wire::device_api::PutRefusal::kind`].
    pub kind: String,
    /// Its text.
    pub reason: String,
    /// Refusals not yet in an event.
    pub unevented: u64,
    /// The event window ([`window`]) of the latest event.
    pub evented: Option<u64>,
    /// A flood report not in an event yet: its event does not wait for the next window.
    pub flood_pending: bool,
    /// The window of the latest flood event.
    pub flood_evented: Option<u64>,
}

/// Which event of a device: the one of a window, or a flood's (at most one of each per window).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    /// The window ([`window`]).
    pub window: u64,
    /// A flood's event.
    pub flood: bool,
}

impl std::fmt::Display for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.flood {
            write!(f, "{}-flood", self.window)
        } else {
            write!(f, "{}", self.window)
        }
    }
}

impl Record {
    /// A record for a first report at `now`, continuing `shown` (the Device's status, after an operator restart)
    /// unless that is older than [`QUIET`].
    pub fn new(shown: Option<&WritesRefused>, now: Timestamp) -> Self {
        let live = shown.filter(|s| !expired(&s.last_at, now));
        Self {
            count: live.map_or(0, |s| s.count),
            since: live
                .and_then(|s| s.since.parse().ok())
                .unwrap_or(now)
                .min(now),
            last_at: now,
            bucket: None,
            kind: String::new(),
            reason: String::new(),
            unevented: 0,
            evented: None,
            flood_pending: false,
            flood_evented: None,
        }
    }

    /// Adds a report received at `now`. A record quiet for longer than [`QUIET`] starts again.
    pub fn observe(&mut self, r: &WriteRefused, now: Timestamp) {
        if now.since(self.last_at) >= QUIET {
            *self = Self::new(None, now);
        }
        self.count = self.count.saturating_add(r.count);
        self.unevented = self.unevented.saturating_add(r.count);
        self.last_at = now;
        if r.kind == FLOOD_KIND {
            self.flood_pending = true;
        }
        // A flood outranks the refused writes queued before the device was cut off (reported after it).
        if self.kind == FLOOD_KIND && r.kind != FLOOD_KIND {
            return;
        }
        self.bucket = r
            .bucket
            .as_deref()
            .and_then(bucket_label)
            .map(str::to_owned);
        self.kind = kind_label(&r.kind).to_owned();
        self.reason = r.reason.chars().take(MAX_REASON_CHARS).collect();
    }

    /// The event due at `now`, if any (its window and text): refusals not evented yet, and no event of this
    /// device in this window. The caller marks it sent with [`Record::evented`].
    pub fn event_due(&self, device: &DeviceId, now: Timestamp) -> Option<(Slot, String)> {
        let w = window(now);
        let slot = if self.flood_pending && self.flood_evented != Some(w) {
            Slot {
                window: w,
                flood: true,
            }
        } else if self.unevented > 0 && self.evented != Some(w) {
            Slot {
                window: w,
                flood: false,
            }
        } else {
            return None;
        };
        Some((slot, self.event_text(device)))
    }

    /// Marks the event of `slot` as published (a flood's also counts as its window's).
    pub fn evented(&mut self, slot: Slot) {
        if slot.flood {
            self.flood_evented = Some(slot.window);
            self.flood_pending = false;
        }
        self.evented = Some(slot.window);
        self.unevented = 0;
    }

    /// The event's text: how many since the last event, the latest bucket and reason, the total.
    pub fn event_text(&self, device: &DeviceId) -> String {
        if self.kind == FLOOD_KIND {
            return format!(
                "fleet-auth's flood guard cut off device {device}: {}; {} refusals since {}. Only this device is \
                 cut off: every other device's connection and keys are untouched",
                self.reason, self.count, self.since,
            );
        }
        let plural = |n: u64| if n == 1 { "write" } else { "writes" };
        format!(
            "fleet-auth refused {} {} of device {device} (latest: {}{}: {}); {} refused since {}. Only this \
             device's writes fail: its other keys and every other device's are unchanged",
            self.unevented,
            plural(self.unevented),
            self.bucket.as_deref().unwrap_or("no bucket"),
            if self.kind.is_empty() {
                String::new()
            } else {
                format!(", {}", self.kind)
            },
            self.reason,
            self.count,
            self.since,
        )
    }

    fn shown(&self) -> WritesRefused {
        WritesRefused {
            count: self.count,
            since: self.since.to_string(),
            last_at: self.last_at.to_string(),
            bucket: self.bucket.clone(),
            kind: self.kind.clone(),
            reason: self.reason.clone(),
        }
    }
}

fn expired(last_at: &str, now: Timestamp) -> bool {
    last_at
        .parse::<Timestamp>()
        .map_or(true, |t| now.since(t) >= QUIET)
}

/// The event window `now` falls in.
pub fn window(now: Timestamp) -> u64 {
    now.unix_ms() / (EVENT_WINDOW.as_millis() as u64).max(1)
}

/// The Device's `status.writesRefused` at `now`, given what it shows and the operator's record: the record (but a
/// new count of the same cause within [`STATUS_COALESCE`] of the shown report keeps the shown one, so a flood costs
/// one status write per [`STATUS_COALESCE`]), what is shown when there is no record (after a restart), nothing once
/// [`QUIET`] passed.
pub fn status(
    shown: Option<&WritesRefused>,
    record: Option<&Record>,
    now: Timestamp,
) -> Option<WritesRefused> {
    let next = match record {
        Some(r) => r.shown(),
        None => shown?.clone(),
    };
    if expired(&next.last_at, now) {
        return None;
    }
    if let Some(old) = shown {
        let same_cause =
            (&old.bucket, &old.kind, &old.since) == (&next.bucket, &next.kind, &next.since);
        let recent = old
            .last_at
            .parse::<Timestamp>()
            .is_ok_and(|o| now >= o && now.since(o) < STATUS_COALESCE);
        if same_cause && recent {
            return Some(old.clone());
        }
    }
    Some(next)
}

/// A fleet-wide token bucket of [`EVENTS_PER_MINUTE`] events (times in Unix milliseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventLimiter {
    milli: u64,
    at_ms: u64,
}

impl EventLimiter {
    /// A full bucket at `now`.
    pub fn new(now: Timestamp) -> Self {
        Self {
            milli: u64::from(EVENTS_PER_MINUTE) * 1000,
            at_ms: now.unix_ms(),
        }
    }

    /// Takes one event at `now`; false when the minute's share is spent.
    pub fn take(&mut self, now: Timestamp) -> bool {
        let cap = u64::from(EVENTS_PER_MINUTE) * 1000;
        let elapsed = now.unix_ms().saturating_sub(self.at_ms);
        // EVENTS_PER_MINUTE per 60,000 ms, in thousandths.
        self.milli = (self.milli + elapsed * u64::from(EVENTS_PER_MINUTE) / 60).min(cap);
        self.at_ms = self.at_ms.max(now.unix_ms());
        if self.milli >= 1000 {
            self.milli -= 1000;
            true
        } else {
            false
        }
    }
}

/// The metric's `bucket` label: a bucket devices write, else `other`.
pub fn bucket_label(bucket: &str) -> Option<&'static str> {
    written_buckets().map(|b| b.name).find(|b| *b == bucket)
}

/// The metric's `kind` label: one of the device API's kinds, else `other`.
pub fn kind_label(kind: &str) -> &'static str {
    fleet_wire::device_api::REFUSAL_KINDS
        .into_iter()
        .find(|k| *k == kind)
        .unwrap_or("other")
}

/// The records of every device, shared by the listener and the control loop.
#[derive(Default)]
pub struct Refusals {
    records: Mutex<HashMap<DeviceId, Record>>,
}

impl Refusals {
    /// A copy of every record (for a pass's snapshot), keyed by device id.
    pub fn snapshot(&self) -> std::collections::BTreeMap<String, Record> {
        self.records
            .lock()
            .map(|m| m.iter().map(|(k, v)| (k.to_string(), v.clone())).collect())
            .unwrap_or_default()
    }

    /// Adds a report at `now` (`shown`: the Device's status, for a device without a record); the event due, if
    /// any. False when the device cannot be tracked ([`MAX_TRACKED`]).
    fn observe(
        &self,
        r: &WriteRefused,
        shown: Option<&WritesRefused>,
        now: Timestamp,
    ) -> Result<Option<(Slot, String)>, ()> {
        let mut map = self.records.lock().map_err(|_| ())?;
        if !map.contains_key(&r.device_id) && map.len() >= MAX_TRACKED {
            map.retain(|_, rec| now.since(rec.last_at) < QUIET);
            if map.len() >= MAX_TRACKED {
                return Err(());
            }
        }
        let rec = map
            .entry(r.device_id.clone())
            .or_insert_with(|| Record::new(shown, now));
        rec.observe(r, now);
        Ok(rec.event_due(&r.device_id, now))
    }

    /// Events due at `now` for refusals that arrived after their device's last event (a flood that stopped).
    fn due(&self, now: Timestamp) -> Vec<(DeviceId, Slot, String)> {
        let Ok(mut map) = self.records.lock() else {
            return vec![];
        };
        map.retain(|_, rec| now.since(rec.last_at) < QUIET);
        map.iter()
            .filter_map(|(d, rec)| rec.event_due(d, now).map(|(w, t)| (d.clone(), w, t)))
            .collect()
    }

    fn mark(&self, device: &DeviceId, w: Slot) {
        if let Ok(mut map) = self.records.lock() {
            if let Some(rec) = map.get_mut(device) {
                rec.evented(w);
            }
        }
    }
}

/// What [`listen`] needs besides the NATS connection.
#[derive(Clone)]
pub struct Reporting {
    /// The records, read by the control loop.
    pub refusals: Arc<Refusals>,
    /// The Device cache (events regard an existing Device; its status seeds a record after a restart).
    pub devices: Cache<Device>,
    /// The Kubernetes client and event reporter.
    pub client: kube::Client,
    /// Event reporter.
    pub recorder: Recorder,
    /// Woken on every report, so the control loop writes the status.
    pub notify: Arc<Notify>,
}

/// Subscribes to `fleet.device-refusals.>` and handles every report until the subscription ends.
pub async fn listen(nats: async_nats::Client, r: Reporting) -> NatsError {
    let subject = format!("{REFUSALS_ROOT}.>");
    let mut sub = match nats.subscribe(subject.clone()).await {
        Ok(s) => s,
        Err(e) => {
            return NatsError {
                op: format!("subscribe {subject}"),
                message: e.to_string(),
            }
        }
    };
    let mut limiter = EventLimiter::new(Timestamp::now());
    let mut tick = tokio::time::interval(EVENT_WINDOW / 5);
    loop {
        tokio::select! {
            msg = sub.next() => {
                let Some(msg) = msg else { break };
                handle(&r, &mut limiter, &msg.subject, &msg.payload).await;
            }
            _ = tick.tick() => {
                for (device, w, text) in r.refusals.due(Timestamp::now()) {
                    publish(&r, &mut limiter, &device, w, text).await;
                }
            }
        }
    }
    NatsError {
        op: format!("subscribe {subject}"),
        message: "the subscription ended".into(),
    }
}

async fn handle(r: &Reporting, limiter: &mut EventLimiter, subject: &str, payload: &[u8]) {
    let report: WriteRefused = match serde_json::from_slice(payload) {
        Ok(v) => v,
        Err(e) => {
            log::warn!(
                "refusal report on {subject} ignored: {}",
                fleet_wire::text::for_log(&e.to_string())
            );
            return;
        }
    };
    // The subject names the device (only fleet-auth may publish there); a body naming another is not believed.
    if subject
        .strip_prefix(REFUSALS_ROOT)
        .and_then(|s| s.strip_prefix('.'))
        != Some(report.device_id.as_str())
    {
        log::warn!(
            "refusal report on {subject} names device {}: ignored",
            report.device_id
        );
        return;
    }
    crate::metrics::writes_refused(
        report
            .bucket
            .as_deref()
            .and_then(bucket_label)
            .unwrap_or("other"),
        kind_label(&report.kind),
        report.count,
    );
    let shown = device(r, &report.device_id).and_then(|d| d.status.clone()?.writes_refused);
    let now = Timestamp::now();
    match r.refusals.observe(&report, shown.as_ref(), now) {
        Ok(Some((w, text))) => publish(r, limiter, &report.device_id, w, text).await,
        Ok(None) => {}
        Err(()) => log::warn!(
            "device {}: {} writes refused (not shown on its Device: {MAX_TRACKED} devices tracked)",
            report.device_id,
            report.count
        ),
    }
    r.notify.notify_one();
}

fn device(r: &Reporting, id: &DeviceId) -> Option<Arc<Device>> {
    r.devices
        .get(&kube::runtime::reflector::ObjectRef::new(id.as_str()))
}

/// Publishes the `WritesRefused` event of window `w` on `device`'s Device, within the fleet-wide limit.
async fn publish(
    r: &Reporting,
    limiter: &mut EventLimiter,
    device: &DeviceId,
    w: Slot,
    text: String,
) {
    let Some(obj) = self::device(r, device) else {
        // No Device yet (the control loop creates it): the refusals are evented once it exists.
        return;
    };
    if !limiter.take(Timestamp::now()) {
        log::debug!(
            "WritesRefused event of {device} deferred: {EVENTS_PER_MINUTE} events a minute"
        );
        return;
    }
    log::warn!(
        "Device {}: {REASON}: {}",
        obj.name_any(),
        fleet_wire::text::for_log(&text)
    );
    let ev = Event {
        type_: EventType::Warning,
        reason: REASON.into(),
        note: Some(text),
        action: "WriteNats".into(),
        secondary: None,
    };
    let name = format!("{device}.writes-refused.{w}");
    match crate::fleet::report::publish_named(&r.client, &ev, &obj.object_ref(&()), &name).await {
        Ok(()) => r.refusals.mark(device, w),
        // Another replica published this window's event.
        Err(kube::Error::Api(s)) if s.code == 409 => r.refusals.mark(device, w),
        Err(e) => log::warn!("event {REASON} for {device}: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(s: &str) -> DeviceId {
        DeviceId::try_from(s).expect("id")
    }

    fn report(count: u64, bucket: &str, kind: &str) -> WriteRefused {
        WriteRefused {
            device_id: dev("dev-a"),
            bucket: Some(bucket.into()),
            kind: kind.into(),
            reason: format!("{kind} in {bucket}"),
            count,
        }
    }

    const T0: u64 = 1_796_013_600_000; // a window boundary (divisible by 300,000)

    fn t(secs: u64) -> Timestamp {
        Timestamp::from_unix_ms(T0 + secs * 1000)
    }

    #[test]
    fn one_event_per_window_with_the_count_since_the_last() {
        let d = dev("dev-a");
        let mut r = Record::new(None, t(0));
        r.observe(&report(1, "device-heartbeat", "over-budget"), t(0));
        let (w, text) = r.event_due(&d, t(0)).expect("first report: an event");
        assert_eq!(
            text,
            format!(
                "fleet-auth refused 1 write of device dev-a (latest: device-heartbeat, over-budget: over-budget \
                 in device-heartbeat); 1 refused since {}. Only this device's writes fail: its other keys and \
                 every other device's are unchanged",
                t(0)
            )
        );
        r.evented(w);
        assert_eq!(r.event_due(&d, t(0)), None);
        r.observe(&report(500, "device-heartbeat", "over-budget"), t(10));
        assert_eq!(r.event_due(&d, t(10)), None, "same window");
        r.observe(&report(300, "device-info", "too-large"), t(20));
        let (w2, text) = r.event_due(&d, t(300)).expect("next window");
        assert_eq!(w2.window, w.window + 1);
        assert!(
            text.starts_with(
                "fleet-auth refused 800 writes of device dev-a (latest: device-info, too-large"
            ),
            "{text}"
        );
        assert!(text.contains("801 refused since"), "{text}");
        r.evented(w2);
        assert_eq!(r.event_due(&d, t(900)), None, "nothing new");
    }

    #[test]
    fn a_flood_outranks_the_refusals_reported_after_it() {
        let d = dev("dev-a");
        let mut r = Record::new(None, t(0));
        r.observe(&report(3, "device-heartbeat", "over-budget"), t(0));
        let (first, _) = r.event_due(&d, t(0)).expect("first event");
        assert!(!first.flood);
        r.evented(first);
        let mut flood = report(1, "device-heartbeat", FLOOD_KIND);
        flood.bucket = None;
        flood.reason = "disconnected: 30000 messages a second over 2.0 s".into();
        r.observe(&flood, t(1));
        r.observe(&report(400, "device-heartbeat", "over-budget"), t(2));
        let shown = status(None, Some(&r), t(2)).expect("shown");
        assert_eq!((shown.kind.as_str(), shown.count), (FLOOD_KIND, 404));
        assert_eq!(shown.bucket, None);
        // Its event does not wait for the next window, and has a name of its own.
        let (slot, text) = r
            .event_due(&d, t(2))
            .expect("the flood's event in the same window");
        assert_eq!(slot.window, first.window);
        assert_eq!(
            (slot.to_string(), first.to_string()),
            (format!("{}-flood", first.window), first.window.to_string())
        );
        r.evented(slot);
        assert_eq!(r.event_due(&d, t(3)), None, "one flood event per window");
        assert!(
            text.starts_with(
                "fleet-auth's flood guard cut off device dev-a: disconnected: 30000 messages a second"
            ),
            "{text}"
        );
    }

    #[test]
    fn status_coalesces_counts_and_clears_after_quiet() {
        let mut r = Record::new(None, t(0));
        r.observe(&report(1, "device-heartbeat", "over-budget"), t(0));
        let first = status(None, Some(&r), t(0)).expect("shown");
        assert_eq!((first.count, first.kind.as_str()), (1, "over-budget"));
        assert_eq!(first.bucket.as_deref(), Some("device-heartbeat"));
        r.observe(&report(500, "device-heartbeat", "over-budget"), t(10));
        assert_eq!(
            status(Some(&first), Some(&r), t(10)),
            Some(first.clone()),
            "coalesced"
        );
        r.observe(&report(50, "device-heartbeat", "over-budget"), t(20));
        assert_eq!(
            status(Some(&first), Some(&r), t(29)),
            Some(first.clone()),
            "coalesced"
        );
        // The flood stopped: the next pass after the coalescing time writes the count, then nothing changes.
        let later = status(Some(&first), Some(&r), t(30)).expect("shown");
        assert_eq!(later.count, 551, "30 s later the count is written");
        assert_eq!(status(Some(&later), Some(&r), t(70)), Some(later.clone()));
        r.observe(&report(1, "device-info", "too-large"), t(75));
        assert_eq!(
            status(Some(&later), Some(&r), t(75)).map(|s| s.kind),
            Some("too-large".into()),
            "a new cause is written at once"
        );
        // After a restart (no record) the shown status stays until it is quiet for an hour.
        assert_eq!(status(Some(&later), None, t(3000)), Some(later.clone()));
        assert_eq!(status(Some(&later), None, t(20 + 3600)), None);
        assert_eq!(status(None, None, t(0)), None);
        // A record continues what a restart's predecessor showed.
        let mut again = Record::new(Some(&later), t(200));
        again.observe(&report(5, "device-heartbeat", "over-budget"), t(200));
        assert_eq!((again.count, again.since), (556, t(0)));
        assert_eq!(Record::new(Some(&later), t(20 + 3600)).count, 0);
    }

    #[test]
    fn a_quiet_record_starts_again() {
        let mut r = Record::new(None, t(0));
        r.observe(&report(9, "device-heartbeat", "over-budget"), t(0));
        r.observe(&report(2, "device-heartbeat", "over-budget"), t(3600));
        assert_eq!((r.count, r.since), (2, t(3600)));
    }

    #[test]
    fn the_fleet_wide_event_limit() {
        let mut l = EventLimiter::new(t(0));
        let n = (0..1000).filter(|_| l.take(t(0))).count();
        assert_eq!(n, EVENTS_PER_MINUTE as usize);
        assert!(!l.take(t(0)));
        assert!(l.take(t(1)), "one a second refills");
        assert!(!l.take(t(1)));
    }

    #[test]
    fn labels_are_bounded() {
        assert_eq!(bucket_label("device-info"), Some("device-info"));
        assert_eq!(bucket_label("device-desired-state"), None);
        assert_eq!(kind_label("over-budget"), "over-budget");
        assert_eq!(kind_label("x".repeat(100).as_str()), "other");
    }

    #[test]
    fn records_are_bounded_and_ignore_nothing_they_can_keep() {
        let rs = Refusals::default();
        let r = report(3, "device-info", "too-large");
        assert!(matches!(rs.observe(&r, None, t(0)), Ok(Some(_))));
        assert_eq!(rs.snapshot()["dev-a"].count, 3);
        // Quiet records are dropped by the periodic check.
        assert!(rs.due(t(4000)).is_empty());
        assert!(rs.snapshot().is_empty());
    }
}
