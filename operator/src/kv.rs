//! NATS JetStream KV for the operator: creating the buckets of `fleet_wire::kv::BUCKETS`, mirroring buckets into
//! memory with a watch, and compare-and-set writes that re-read on conflict.

use async_nats::jetstream::{self, kv};
use fleet_kit::nats_tls::NatsTls;
use fleet_wire::log_summary::{Summaries, SUMMARY_INTERVAL};
use fleet_wire::Timestamp;
use futures::StreamExt;
use serde::{de::DeserializeOwned, Serialize};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::sync::Notify;

/// How long one NATS request may take before the operator calls NATS unreachable.
pub const NATS_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How many times a CAS write re-reads and retries after losing a race before giving up for this pass.
pub const CAS_ATTEMPTS: usize = 5;

/// A NATS failure, with the operation that failed.
#[derive(Debug, thiserror::Error)]
#[error("NATS {op}: {message}")]
pub struct NatsError {
    /// What was being done.
    pub op: String,
    /// What went wrong.
    pub message: String,
}

/// How often a mirror's watch is checked against its stream ([`Mirror::run`]'s stall guard): a stalled watch is
/// found within two of these.
pub const STALL_CHECK: std::time::Duration = std::time::Duration::from_secs(15);

impl NatsError {
    /// An error of the NATS operation `op`.
    pub fn new(op: impl Into<String>, e: impl std::fmt::Display) -> Self {
        Self {
            op: op.into(),
            message: e.to_string(),
        }
    }
}

/// How the operator reaches NATS and makes its buckets, from `main`'s flags: one value, handed to the NATS link
/// ([`crate::nats_link::NatsLink`]) that every controller connects through, instead of process-wide settings.
#[derive(Debug, Clone, Default)]
pub struct NatsSettings {
    /// `--nats-ca-file` and friends.
    pub tls: NatsTls,
    /// `--kv-replicas`, `--fleet-size`.
    pub buckets: Buckets,
}

/// How the buckets are made: the replica count of those created (`--kv-replicas`; 1 unless given; buckets that
/// exist keep theirs, except that `fleet-operator buckets` scales them to it: [`scale_buckets`]) and the fleet size
/// every bucket's byte limit is made for (`--fleet-size`; [`fleet_wire::kv::DEFAULT_FLEET_SIZE`] unless given;
/// unlike the replica count it applies to buckets that exist too, [`ensure_buckets`], so that a fleet that grows
/// past its buckets is one flag away from room).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Buckets {
    replicas: Option<usize>,
    fleet_size: u64,
}

impl Default for Buckets {
    fn default() -> Self {
        Self {
            replicas: None,
            fleet_size: fleet_wire::kv::DEFAULT_FLEET_SIZE,
        }
    }
}

pub use fleet_kit::nats::{servers, MAX_REPLICAS};

/// The largest `--fleet-size`: the byte limits of ten million devices (about 3 TB) fit no single server.
pub const MAX_FLEET_SIZE: u64 = 10_000_000;

impl Buckets {
    /// The settings given (`None`: the default); `Err` when a value is out of range (replicas
    /// 1..=[`MAX_REPLICAS`], fleet size 1..=[`MAX_FLEET_SIZE`]).
    pub fn new(replicas: Option<usize>, fleet_size: Option<u64>) -> Result<Self, String> {
        if let Some(r) = replicas.filter(|r| !(1..=MAX_REPLICAS).contains(r)) {
            return Err(format!(
                "--kv-replicas {r}: a bucket has 1 to {MAX_REPLICAS} replicas"
            ));
        }
        if let Some(n) = fleet_size.filter(|n| !(1..=MAX_FLEET_SIZE).contains(n)) {
            return Err(format!(
                "--fleet-size {n}: buckets are made for 1 to {MAX_FLEET_SIZE} devices"
            ));
        }
        Ok(Self {
            replicas,
            fleet_size: fleet_size.unwrap_or(fleet_wire::kv::DEFAULT_FLEET_SIZE),
        })
    }

    /// The replica count buckets are created with.
    pub fn replicas(&self) -> usize {
        self.replicas.unwrap_or(1)
    }

    /// The fleet size the buckets' byte limits are made for.
    pub fn fleet_size(&self) -> u64 {
        self.fleet_size
    }
}

/// Scales every bucket of the layout that exists to the replica count given with `--kv-replicas` (nothing when
/// none was given: an operator started without it never scales a cluster's buckets down). Returns each bucket
/// changed with its old and new count. JetStream adds or removes the copies itself, keeping every key.
pub async fn scale_buckets(
    js: &jetstream::Context,
    buckets: &Buckets,
) -> Result<Vec<(&'static str, usize, usize)>, NatsError> {
    let Some(want) = buckets.replicas else {
        return Ok(Vec::new());
    };
    let mut changed = Vec::new();
    for spec in fleet_wire::kv::BUCKETS {
        // A KV bucket is the stream `KV_<bucket>`.
        let name = format!("KV_{}", spec.name);
        let Ok(mut stream) = js.get_stream(&name).await else {
            continue;
        };
        let info = stream
            .info()
            .await
            .map_err(|e| NatsError::new(format!("stream info {name}"), e))?;
        let have = info.config.num_replicas;
        if have == want {
            continue;
        }
        let mut config = info.config.clone();
        config.num_replicas = want;
        js.update_stream(&config)
            .await
            .map_err(|e| NatsError::new(format!("scale bucket {} to {want}", spec.name), e))?;
        changed.push((spec.name, have, want));
    }
    Ok(changed)
}

/// Connects (failing fast if the server does not answer) and returns a JetStream context. A `user:password@` in
/// the URL is the operator's own NATS user (an `auth_users` entry when the fleet-auth callout is on); it is sent
/// as credentials and never appears in errors. TLS is `tls` (none by default).
pub async fn connect(
    url: &str,
    tls: &NatsTls,
) -> Result<(async_nats::Client, jetstream::Context), NatsError> {
    connect_with(url, tls, |opts| opts).await
}

/// [`connect`] with more options (`more` adds them: an event callback).
pub async fn connect_with(
    url: &str,
    tls: &NatsTls,
    more: impl FnOnce(async_nats::ConnectOptions) -> async_nats::ConnectOptions,
) -> Result<(async_nats::Client, jetstream::Context), NatsError> {
    let parts = fleet_wire::auth::split_nats_url(url);
    let mut opts = more(
        async_nats::ConnectOptions::new()
            .name("fleet-operator")
            .connection_timeout(NATS_REQUEST_TIMEOUT)
            .request_timeout(Some(NATS_REQUEST_TIMEOUT)),
    );
    if let Some((user, password)) = parts.user_password {
        opts = opts.user_and_password(user, password);
    }
    let url = parts.url;
    let opts = tls
        .apply(opts)
        .map_err(|e| NatsError::new(format!("connect to {url}"), e))?;
    let client = opts
        .connect(servers(&url))
        .await
        .map_err(|e| NatsError::new(format!("connect to {url}"), tls.explain(&e)))?;
    let js = jetstream::new(client.clone());
    Ok((client, js))
}

/// The KV configuration of one bucket of the layout: file storage, one value per key, [`replicas`] copies.
pub fn bucket_config(spec: &fleet_wire::kv::BucketSpec, buckets: &Buckets) -> kv::Config {
    kv::Config {
        bucket: spec.name.to_owned(),
        description: format!(
            "Harmony Fleet: keys {}, written by {}",
            spec.key.pattern(),
            spec.writer
        ),
        max_value_size: spec.max_value_bytes,
        max_bytes: fleet_wire::kv::max_bytes(spec, buckets.fleet_size),
        history: 1,
        max_age: spec.max_age.unwrap_or(Duration::ZERO),
        storage: jetstream::stream::StorageType::File,
        num_replicas: buckets.replicas(),
        ..Default::default()
    }
}

/// The configuration that brings a bucket that exists (created by an earlier release, or by hand) to the limits
/// that bound what a device can do to the fleet's storage: the largest value, the byte limit for the fleet size,
/// and no rollup headers (docs/kv-layout.md); `None` when it has them. Other settings (replicas, age) are left
/// alone. A byte limit below what the bucket holds now is an error: JetStream would keep the keys but refuse every
/// new key and every write that grows the bucket (measured: `maximum bytes exceeded`), so devices could not
/// onboard or report.
async fn limits_to_set(
    js: &jetstream::Context,
    spec: &fleet_wire::kv::BucketSpec,
    buckets: &Buckets,
) -> Result<Option<jetstream::stream::Config>, NatsError> {
    let name = format!("KV_{}", spec.name);
    let mut stream = js
        .get_stream(&name)
        .await
        .map_err(|e| NatsError::new(format!("stream {name}"), e))?;
    let info = stream
        .info()
        .await
        .map_err(|e| NatsError::new(format!("stream info {name}"), e))?;
    let mut config = info.config.clone();
    config.allow_rollup = spec.allow_rollup;
    config.max_bytes = fleet_wire::kv::max_bytes(spec, buckets.fleet_size);
    config.max_message_size = spec.max_value_bytes;
    let held = info.state.bytes;
    if config.max_bytes != info.config.max_bytes && held > config.max_bytes.unsigned_abs() {
        return Err(NatsError::new(
            format!("limit bucket {}", spec.name),
            format!(
                "it holds {held} bytes, more than the {} bytes --fleet-size {} allows it; with that limit \
                 JetStream would refuse every new key and every write that grows it, so no bucket was changed: \
                 give a --fleet-size of at least the fleet's device count",
                config.max_bytes,
                buckets.fleet_size,
            ),
        ));
    }
    let same = config.allow_rollup == info.config.allow_rollup
        && config.max_bytes == info.config.max_bytes
        && config.max_message_size == info.config.max_message_size;
    Ok((!same).then_some(config))
}

/// Opens every bucket of `fleet_wire::kv::BUCKETS`, creating the missing ones (agents never create buckets), and
/// brings each to the limits of the layout ([`limits_to_set`]): all or none, so that a `--fleet-size` too small
/// for one bucket changes no other.
pub async fn ensure_buckets(
    js: &jetstream::Context,
    buckets: &Buckets,
) -> Result<BTreeMap<&'static str, kv::Store>, NatsError> {
    let mut out = BTreeMap::new();
    for spec in fleet_wire::kv::BUCKETS {
        let store = match js.get_key_value(spec.name).await {
            Ok(s) => s,
            Err(_) => match js.create_key_value(bucket_config(spec, buckets)).await {
                Ok(s) => s,
                // Another replica may have created it in between.
                Err(e) => js
                    .get_key_value(spec.name)
                    .await
                    .map_err(|_| NatsError::new(format!("create bucket {}", spec.name), e))?,
            },
        };
        out.insert(spec.name, store);
    }
    let mut changes = Vec::new();
    for spec in fleet_wire::kv::BUCKETS {
        if let Some(config) = limits_to_set(js, spec, buckets).await? {
            changes.push((spec, config));
        }
    }
    for (spec, config) in changes {
        js.update_stream(&config)
            .await
            .map_err(|e| NatsError::new(format!("limit bucket {}", spec.name), e))?;
        log::info!(
            "bucket {}: limits set (largest value {} bytes, {} bytes in all for {} devices, rollup headers {})",
            spec.name,
            spec.max_value_bytes,
            config.max_bytes,
            buckets.fleet_size,
            if spec.allow_rollup { "allowed" } else { "refused" }
        );
    }
    Ok(out)
}

/// One key as last seen: its revision and its parsed value (`None`: deleted, or not a valid value). Values are
/// shared, never copied: a pass's snapshot of 100,000 devices copies pointers.
#[derive(Debug, Clone)]
pub struct Seen<T> {
    /// KV revision.
    pub revision: u64,
    /// Parsed value.
    pub value: Option<Arc<T>>,
    /// When NATS stored the value (milliseconds since the epoch by the NATS server's clock) shifted left by one,
    /// the low bit set when the watch delivered it as a new write after its initial values ([`Self::arrived`]);
    /// 0 when unknown (a value this operator wrote, or read with a single get). One word: every mirror holds one
    /// per device.
    stored: u64,
}

impl<T> Seen<T> {
    /// When NATS stored this value, by the NATS server's clock (not the writer's), when the watch said so.
    pub fn stored_at(&self) -> Option<Timestamp> {
        (self.stored >> 1 != 0).then(|| Timestamp::from_unix_ms(self.stored >> 1))
    }

    /// True when the mirror's watch delivered this value as a new write while it watched (this operator saw it
    /// arrive), false for a value that was already in the bucket when the watch started.
    pub fn arrived(&self) -> bool {
        self.stored & 1 == 1
    }
}

/// [`Seen`]'s packed store time.
/// How values of `bucket` that do not parse are logged: per key, the first at once and then one line per
/// [`SUMMARY_INTERVAL`] with the count, the key and the parser's text (which quotes the value, written by a device:
/// an unknown `architecture`, say) shown escaped, so a device can neither write forged lines into the operator's
/// log nor fill it.
pub fn invalid_values(bucket: &str) -> Summaries {
    Summaries::new(
        format!("{bucket}: ignoring invalid value of"),
        SUMMARY_INTERVAL,
    )
}

fn pack_stored(stored: Option<Timestamp>, arrived: bool) -> u64 {
    stored.map_or(0, |t| {
        t.unix_ms().min(u64::MAX >> 1) << 1 | u64::from(arrived)
    })
}

/// Whether a change of `key` from the first value to the second wakes the control loop.
pub type WakeWhen<T> = Box<dyn Fn(&str, Option<&T>, Option<&T>) -> bool + Send + Sync>;

/// An in-memory mirror of one bucket, kept current by a watch task.
pub struct Mirror<T> {
    bucket: &'static str,
    map: RwLock<BTreeMap<String, Seen<T>>>,
    synced: std::sync::atomic::AtomicBool,
    /// When the running watch had read the bucket's initial values (milliseconds since the epoch, the operator's
    /// clock); 0 while no watch runs or it has not read them yet ([`Self::watched_since`]).
    watched_since: AtomicU64,
    /// `None`: every change wakes.
    wake_when: Option<WakeWhen<T>>,
    /// Woken with the watch's own `notify`: the other controllers that read this mirror ([`Self::subscribe`]).
    subscribers: std::sync::Mutex<Vec<Arc<Notify>>>,
}

impl<T: DeserializeOwned + Clone + Send + Sync + 'static> Mirror<T> {
    /// The bucket this mirrors.
    pub fn bucket(&self) -> &'static str {
        self.bucket
    }

    /// An empty mirror of `bucket`.
    pub fn new(bucket: &'static str) -> Arc<Self> {
        Arc::new(Self {
            bucket,
            map: RwLock::new(BTreeMap::new()),
            synced: false.into(),
            watched_since: AtomicU64::new(0),
            wake_when: None,
            subscribers: Default::default(),
        })
    }

    /// An empty mirror of `bucket` whose watch wakes its `notify` only for the changes `wake_when` picks (a
    /// device's periodic report that changes nothing a pass decides from is recorded, quietly).
    pub fn waking_when(bucket: &'static str, wake_when: WakeWhen<T>) -> Arc<Self> {
        Arc::new(Self {
            bucket,
            map: RwLock::new(BTreeMap::new()),
            synced: false.into(),
            watched_since: AtomicU64::new(0),
            wake_when: Some(wake_when),
            subscribers: Default::default(),
        })
    }

    /// Watches `store` from its current values on, updating the mirror and waking `notify` on each change (each
    /// that `wake_when` picks, when set).
    /// Returns when the watch ends (NATS went away); the caller starts it again.
    pub async fn run(self: Arc<Self>, store: kv::Store, notify: Arc<Notify>) -> NatsError {
        // Whatever ends this watch (an error, its end, the task dropped), the mirror is no longer watched.
        struct Unwatched<'a>(&'a AtomicU64);
        impl Drop for Unwatched<'_> {
            fn drop(&mut self) {
                self.0.store(0, Ordering::SeqCst);
            }
        }
        self.watched_since.store(0, Ordering::SeqCst);
        let _unwatched = Unwatched(&self.watched_since);
        let mut watch = match store.watch_with_history(">").await {
            Ok(w) => w,
            Err(e) => return NatsError::new(format!("watch {}", self.bucket), e),
        };
        // An empty bucket never delivers an entry: it is synced from the start.
        let empty = store
            .status()
            .await
            .map(|s| s.values() == 0)
            .unwrap_or(false);
        // This watch's initial values are read (a watch opened again reads them again).
        let mut read = false;
        if empty {
            read = true;
            self.watched_since
                .store(Timestamp::now().unix_ms().max(1), Ordering::SeqCst);
            self.synced.store(true, std::sync::atomic::Ordering::SeqCst);
            self.wake(&notify);
        }
        // The stall guard: a watch whose stream's leader moved while this client's own server stayed up can go
        // silent without an error or a disconnect (nats_node_loss saw a device-info watch do so). Every
        // STALL_CHECK the stream's last sequence is noted; a watch that delivered nothing since and is still
        // short of it at the next check is stalled, and ends so that the caller opens a new one. A watch that
        // lags but delivers (a busy operator) is never cut off.
        let mut check = tokio::time::interval(STALL_CHECK);
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut seen = 0u64;
        let mut delivered = false;
        let mut owed: Option<u64> = None;
        let mut invalid = invalid_values(self.bucket);
        loop {
            let entry = tokio::select! {
                e = watch.next() => e,
                _ = check.tick() => {
                    for line in invalid.due(std::time::Instant::now()) {
                        log::warn!("{line}");
                    }
                    if let Some(target) = owed.filter(|t| !delivered && seen < *t) {
                        log::warn!(
                            "watch {}: stalled at sequence {seen} of {target}; opening it anew",
                            self.bucket
                        );
                        return NatsError::new(
                            format!("watch {}", self.bucket),
                            format!("stalled: the stream holds sequence {target}, the watch delivered up to {seen} and nothing for {} s", STALL_CHECK.as_secs()),
                        );
                    }
                    delivered = false;
                    // Only a last message the stream still holds can be owed (an expired one is never delivered).
                    owed = store
                        .status()
                        .await
                        .ok()
                        .map(|s| (s.info.state.messages, s.info.state.last_sequence))
                        .filter(|(messages, last)| *messages > 0 && *last > seen)
                        .map(|(_, last)| last);
                    continue;
                }
            };
            let Some(entry) = entry else { break };
            let entry = match entry {
                Ok(e) => e,
                Err(e) => return NatsError::new(format!("watch {}", self.bucket), e),
            };
            seen = seen.max(entry.revision);
            delivered = true;
            // The operator's own writes come back through the watch, already recorded: an entry the mirror holds
            // at this revision or a newer one would not be recorded, so it is not parsed either.
            let held = self.with(&entry.key, |s| {
                s.is_some_and(|s| s.revision >= entry.revision)
            });
            // The operator's own writes, echoed, wake as before (a pass decides from what it wrote).
            let mut wake = true;
            if !held {
                let value = match entry.operation {
                    kv::Operation::Put => match serde_json::from_slice::<T>(&entry.value) {
                        Ok(v) => Some(v),
                        Err(e) => {
                            let now = std::time::Instant::now();
                            if let Some(line) = invalid.record(&entry.key, &e.to_string(), now) {
                                log::warn!("{line}");
                            }
                            None
                        }
                    },
                    kv::Operation::Delete | kv::Operation::Purge => None,
                };
                if let Some(when) = &self.wake_when {
                    wake = self.with(&entry.key, |old| {
                        when(
                            &entry.key,
                            old.and_then(|o| o.value.as_deref()),
                            value.as_ref(),
                        )
                    });
                }
                let stored = u64::try_from(entry.created.unix_timestamp_nanos() / 1_000_000)
                    .ok()
                    .map(Timestamp::from_unix_ms);
                self.record_seen(
                    &entry.key,
                    entry.revision,
                    value.map(Arc::new),
                    pack_stored(stored, read),
                );
            }
            // The end of the initial values always wakes: the loop waits for it.
            if entry.delta == 0 && !read {
                read = true;
                self.watched_since
                    .store(Timestamp::now().unix_ms().max(1), Ordering::SeqCst);
                self.synced.store(true, std::sync::atomic::Ordering::SeqCst);
                wake = true;
            }
            if wake {
                self.wake(&notify);
            }
        }
        NatsError::new(format!("watch {}", self.bucket), "the watch ended")
    }

    /// Also wakes `notify` whenever the watch wakes its own: a second reader of one mirror, which one controller
    /// watches (one copy of the bucket in memory, however many controllers read it).
    pub fn subscribe(&self, notify: &Arc<Notify>) {
        self.subscribers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(notify.clone());
    }

    fn wake(&self, notify: &Notify) {
        notify.notify_one();
        for n in self
            .subscribers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            n.notify_one();
        }
    }

    /// Records a value seen (or written) at `revision`; older revisions never overwrite newer ones.
    pub fn record(&self, key: &str, revision: u64, value: Option<T>) {
        self.record_shared(key, revision, value.map(Arc::new));
    }

    /// [`Self::record`] of a value already shared.
    pub fn record_shared(&self, key: &str, revision: u64, value: Option<Arc<T>>) {
        self.record_seen(key, revision, value, 0);
    }

    fn record_seen(&self, key: &str, revision: u64, value: Option<Arc<T>>, stored: u64) {
        let mut map = self.map.write().unwrap_or_else(|p| p.into_inner());
        let seen = Seen {
            revision,
            value,
            stored,
        };
        match map.get_mut(key) {
            Some(old) if old.revision >= revision => {}
            Some(old) => *old = seen,
            None => {
                map.insert(key.to_owned(), seen);
            }
        }
    }

    /// When the running watch had read every value the bucket held when it started (the operator's clock):
    /// from then on the mirror is what NATS holds. `None` while no watch runs (NATS unreachable, a watch being
    /// opened anew) or it is still reading: what the mirror holds then may be stale, and liveness is not judged
    /// from it ([`crate::liveness`]).
    pub fn watched_since(&self) -> Option<Timestamp> {
        match self.watched_since.load(Ordering::SeqCst) {
            0 => None,
            ms => Some(Timestamp::from_unix_ms(ms)),
        }
    }

    /// Calls `f` with the current entry of `key`, in place (no copy of the value). `f` runs under the mirror's
    /// read lock: it must be quick and must not use this mirror.
    pub fn with<R>(&self, key: &str, f: impl FnOnce(Option<&Seen<T>>) -> R) -> R {
        f(self.map.read().unwrap_or_else(|p| p.into_inner()).get(key))
    }

    /// True once the initial values have been read.
    pub fn is_synced(&self) -> bool {
        self.synced.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The current entry of `key`.
    pub fn get(&self, key: &str) -> Option<Seen<T>> {
        self.map
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .cloned()
    }

    /// Every live value (shared, not copied).
    pub fn values(&self) -> BTreeMap<String, Arc<T>> {
        self.map
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter_map(|(k, s)| s.value.clone().map(|v| (k.clone(), v)))
            .collect()
    }

    /// `f` of every live value with what the mirror knows of it.
    pub fn collect<R>(&self, f: impl Fn(&T, &Seen<T>) -> R) -> BTreeMap<String, R> {
        self.map
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter_map(|(k, s)| Some((k.clone(), f(s.value.as_deref()?, s))))
            .collect()
    }

    /// Number of keys seen (including deleted ones).
    pub fn len(&self) -> usize {
        self.map.read().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// True when no key has been seen.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What a CAS write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CasOutcome {
    /// The current value already was what `decide` wants.
    Unchanged,
    /// Written at this revision.
    Written(u64),
}

async fn read<T: DeserializeOwned>(
    store: &kv::Store,
    bucket: &str,
    key: &str,
) -> Result<Option<Seen<T>>, NatsError> {
    let entry = store
        .entry(key)
        .await
        .map_err(|e| NatsError::new(format!("read {bucket}/{key}"), e))?;
    Ok(entry.map(|e| Seen {
        stored: 0,
        revision: e.revision,
        value: match e.operation {
            kv::Operation::Put => serde_json::from_slice(&e.value).ok().map(Arc::new),
            _ => None,
        },
    }))
}

/// Compare-and-set write of one key.
///
/// `decide` sees the current value (`None` if absent, deleted or invalid) and returns the value to write, or
/// `None` when the current one is right. The first try uses `known` (the mirror's view) without a read; a lost
/// race (another writer changed the key) re-reads the key and decides again, so writers never overwrite each
/// other and two operators deciding the same thing write it once.
pub async fn cas_write<T: Serialize + DeserializeOwned + Clone + Send + Sync + 'static>(
    store: &kv::Store,
    mirror: &Mirror<T>,
    key: &str,
    mut decide: impl FnMut(Option<&T>) -> Option<T>,
) -> Result<CasOutcome, NatsError> {
    let started = std::time::Instant::now();
    let r = cas_write_inner(store, mirror, key, &mut decide).await;
    if matches!(r, Ok(CasOutcome::Written(_))) {
        crate::metrics::nats_write(started.elapsed());
    }
    r
}

async fn cas_write_inner<T: Serialize + DeserializeOwned + Clone + Send + Sync + 'static>(
    store: &kv::Store,
    mirror: &Mirror<T>,
    key: &str,
    decide: &mut impl FnMut(Option<&T>) -> Option<T>,
) -> Result<CasOutcome, NatsError> {
    let bucket = mirror.bucket;
    // What the last try saw: on the first try the mirror (read in place), after a lost race a fresh read.
    let mut known: Option<Seen<T>> = None;
    for attempt in 0..CAS_ATTEMPTS {
        let (revision, next) = if attempt == 0 {
            mirror.with(key, |seen| {
                (
                    seen.map(|s| s.revision),
                    decide(seen.and_then(|s| s.value.as_deref())),
                )
            })
        } else {
            (
                known.as_ref().map(|s| s.revision),
                decide(known.as_ref().and_then(|s| s.value.as_deref())),
            )
        };
        let Some(next) = next else {
            return Ok(CasOutcome::Unchanged);
        };
        let bytes = serde_json::to_vec(&next)
            .map_err(|e| NatsError::new(format!("encode {bucket}/{key}"), e))?;
        let result = match revision {
            None => store.create(key, bytes.into()).await.map_err(|e| {
                if e.kind() == kv::CreateErrorKind::AlreadyExists {
                    None
                } else {
                    Some(NatsError::new(format!("create {bucket}/{key}"), e))
                }
            }),
            Some(revision) => store
                .update(key, bytes.into(), revision)
                .await
                .map_err(|e| {
                    if e.kind() == kv::UpdateErrorKind::WrongLastRevision {
                        None
                    } else {
                        Some(NatsError::new(format!("update {bucket}/{key}"), e))
                    }
                }),
        };
        match result {
            Ok(rev) => {
                mirror.record(key, rev, Some(next));
                return Ok(CasOutcome::Written(rev));
            }
            Err(Some(e)) => return Err(e),
            Err(None) => {
                // Lost a race: re-read and decide again.
                known = read(store, bucket, key).await?;
                if let Some(s) = &known {
                    mirror.record_shared(key, s.revision, s.value.clone());
                }
            }
        }
    }
    Err(NatsError::new(
        format!("write {bucket}/{key}"),
        format!("still conflicting after {CAS_ATTEMPTS} re-reads; retried on the next pass"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_invalid_value_from_a_device_is_logged_on_one_line() {
        let forged = "arm64\n[2026-12-07T04:00:00Z WARN  fleet_operator] forged";
        let info = serde_json::json!({"architecture": forged});
        let e = serde_json::from_value::<fleet_wire::Architecture>(info["architecture"].clone())
            .expect_err("not an architecture");
        assert!(
            e.to_string().contains('\n'),
            "serde quotes the value raw: {e}"
        );
        let t0 = std::time::Instant::now();
        let mut invalid = invalid_values("device-info");
        let line = invalid
            .record("dev-a\u{1b}[2K", &e.to_string(), t0)
            .expect("the first is logged");
        assert!(!line.chars().any(char::is_control), "{line}");
        assert!(
            line.contains("arm64\\n[2026-12-07T04:00:00Z WARN"),
            "{line}"
        );
        assert!(
            line.starts_with("device-info: ignoring invalid value of dev-a\\u{1b}[2K: "),
            "{line}"
        );
        // A device writing nothing but bad values (5 a second, its write budget): one line per interval.
        for i in 1..50 {
            let at = t0 + Duration::from_millis(200 * i);
            assert_eq!(invalid.record("dev-a\u{1b}[2K", &e.to_string(), at), None);
        }
        let due = invalid.due(t0 + SUMMARY_INTERVAL);
        assert_eq!(due.len(), 1);
        assert!(
            due[0].contains(": 49 more in the last 10 s, the latest: "),
            "{}",
            due[0]
        );
    }

    #[test]
    fn bucket_settings_out_of_range_are_refused() {
        for n in [0, MAX_REPLICAS + 1] {
            let e = Buckets::new(Some(n), None).expect_err("out of range");
            assert!(e.contains("1 to 5"), "{e}");
        }
        for n in [0, MAX_FLEET_SIZE + 1] {
            let e = Buckets::new(None, Some(n)).expect_err("out of range");
            assert!(e.contains("--fleet-size"), "{e}");
        }
        let default = Buckets::new(None, None).expect("default");
        assert_eq!(default, Buckets::default());
        assert_eq!(default.replicas(), 1);
        let spec = &fleet_wire::kv::BUCKETS[0];
        assert_eq!(bucket_config(spec, &default).num_replicas, 1);
        let given = Buckets::new(Some(3), Some(100_000)).expect("in range");
        assert_eq!(bucket_config(spec, &given).num_replicas, 3);
        assert_eq!(
            bucket_config(spec, &given).max_bytes,
            fleet_wire::kv::max_bytes(spec, 100_000)
        );
    }

    #[test]
    fn seen_keeps_when_nats_stored_it_and_whether_it_arrived() {
        let m = Mirror::<String>::new("b");
        let t = Timestamp::from_unix_ms(1_800_000_000_123);
        let cases = [
            ("found", Some(t), false, Some(t), false),
            ("arrived", Some(t), true, Some(t), true),
            ("written by the operator", None, false, None, false),
        ];
        for (rev, (case, stored, arrived, want_at, want_arrived)) in (1..).zip(cases) {
            m.record_seen("k", rev, None, pack_stored(stored, arrived));
            let got = m.with("k", |s| s.map(|s| (s.stored_at(), s.arrived())));
            assert_eq!(got, Some((want_at, want_arrived)), "{case}");
        }
        assert_eq!(m.watched_since(), None, "no watch ran");
    }

    #[test]
    fn mirror_keeps_the_newest_revision() {
        let m = Mirror::<String>::new("b");
        type Held<'a> = (u64, Option<&'a str>);
        // (record revision, value) → what the mirror then holds
        let cases: &[(u64, Option<&str>, Held)] = &[
            (3, Some("a"), (3, Some("a"))),
            (2, Some("old"), (3, Some("a"))),
            (3, Some("same revision"), (3, Some("a"))),
            (4, None, (4, None)),
            (5, Some("b"), (5, Some("b"))),
        ];
        for (i, (rev, value, want)) in cases.iter().enumerate() {
            m.record("k", *rev, value.map(str::to_owned));
            let got = m.with("k", |s| {
                s.map(|s| (s.revision, s.value.as_deref().cloned()))
            });
            assert_eq!(got, Some((want.0, want.1.map(str::to_owned))), "case {i}");
        }
        assert!(m.with("other", |s| s.is_none()));
        assert_eq!(m.values().len(), 1);
    }
}
