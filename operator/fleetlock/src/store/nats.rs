//! The NATS store: holders of group `<group>` are the value of key `<group>` in the JetStream KV bucket
//! `fleetlock`, changed only by compare-and-set on the entry's revision, so several server replicas share one
//! truth. One task per group batches the requests of this replica into one CAS; a conflict with another replica
//! re-reads and re-applies the batch (never an error for a client). A host in several groups takes its slots in
//! name order and gives back what it took if a later group is full: all or nothing, and the transient state only
//! ever holds more slots than needed (safe: others wait, nobody reboots without a slot).
//!
//! A release learns which groups to look at from the group directory (key `_groups`,
//! [`fleet_wire::fleetlock::GroupDirectory`]), which a grant extends before it writes a group's first holder and
//! nothing shrinks: no request lists the bucket, so none creates a JetStream consumer. A refused request writes
//! nothing, so the bucket holds one key per group that ever had a holder plus the directory, whatever the
//! traffic, and a start reads one key (docs/fleetlock.md lists the cost of each request).

use super::{Applied, StoreError, COMMIT_DEADLINE, MAX_BATCH};
use crate::recent::Recent;
use crate::state::{self, Op, OpResult, Releaser};
use async_nats::jetstream::kv;
use fleet_wire::fleetlock::{
    GroupDirectory, GroupHolders, Holder, GROUP_DIRECTORY_KEY, HOLDER_INDEX_PREFIX,
};
use fleet_wire::Timestamp;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

/// Most group keys the one-time migration from the per-id index layout looks through.
pub const MAX_GROUP_KEYS: usize = 10_000;
/// How long the one-time migration may take to remove the per-id index keys of the old layout.
pub const MIGRATION_PURGE_TIMEOUT: Duration = Duration::from_secs(120);

struct Job {
    op: Op,
    ttl: Option<Duration>,
    reply: oneshot::Sender<Result<(Applied, bool), StoreError>>,
}

/// Handle to the KV bucket and the per-group writer tasks.
pub struct NatsStore {
    kv: kv::Store,
    workers: Mutex<HashMap<String, mpsc::Sender<Job>>>,
    commits: Arc<AtomicU64>,
    conflicts: Arc<AtomicU64>,
    recent: Arc<Recent>,
}

impl NatsStore {
    /// Connects without TLS settings (a `tls://` URL uses the system roots) and opens (or creates) the bucket.
    pub async fn open(url: &str, credentials: Option<&std::path::Path>) -> Result<Self, String> {
        Self::open_tls(url, credentials, &Default::default(), 1).await
    }

    /// Connects (over TLS as `tls` says) and opens the bucket, or creates it with `replicas` copies.
    pub async fn open_tls(
        url: &str,
        credentials: Option<&std::path::Path>,
        tls: &fleet_kit::nats_tls::NatsTls,
        replicas: usize,
    ) -> Result<Self, String> {
        // `nats://user:password@host`: fleetlock-server's own user (an `auth_users` entry when the fleet-auth
        // callout is on); the password never appears in errors.
        let parts = fleet_wire::auth::split_nats_url(url);
        let user_password = &parts.user_password;
        let options = |retry: bool| async move {
            let mut opts = async_nats::ConnectOptions::new()
                .name("fleetlock-server")
                .connection_timeout(Duration::from_secs(5));
            if retry {
                opts = opts.retry_on_initial_connect();
            }
            if let Some(c) = credentials {
                opts = opts
                    .credentials_file(c)
                    .await
                    .map_err(|e| format!("{}: {e}", c.display()))?;
            }
            if let Some((user, password)) = user_password.clone() {
                opts = opts.user_and_password(user, password);
            }
            tls.apply(opts)
        };
        let url = parts.url.as_str();
        // A certificate problem is a configuration error that retrying does not fix: said at start.
        tls.refuse_bad_certificates(url, options(false).await?)
            .await?;
        let opts = options(true).await?;
        let client = tokio::time::timeout(
            Duration::from_secs(15),
            opts.connect(fleet_kit::nats::servers(url)),
        )
        .await
        .map_err(|_| format!("NATS at {url}: no connection within 15 s"))?
        .map_err(|e| format!("NATS at {url}: {}", tls.explain(&e)))?;
        let js = async_nats::jetstream::new(client);
        let bucket = fleet_wire::kv::FLEETLOCK;
        let spec =
            fleet_wire::kv::bucket(bucket).ok_or("fleetlock bucket missing from the layout")?;
        let kv = match js.get_key_value(bucket).await {
            Ok(kv) => kv,
            Err(_) => match js
                .create_key_value(kv::Config {
                    bucket: bucket.to_string(),
                    history: 1,
                    max_value_size: spec.max_value_bytes,
                    storage: async_nats::jetstream::stream::StorageType::File,
                    num_replicas: replicas,
                    ..Default::default()
                })
                .await
            {
                Ok(kv) => kv,
                // Another replica created it meanwhile.
                Err(e) => js
                    .get_key_value(bucket)
                    .await
                    .map_err(|e2| format!("KV bucket {bucket}: create: {e}; open: {e2}"))?,
            },
        };
        let store = Self {
            kv,
            workers: Mutex::new(HashMap::new()),
            commits: Arc::new(AtomicU64::new(0)),
            conflicts: Arc::new(AtomicU64::new(0)),
            recent: Arc::new(Recent::default()),
        };
        store
            .load_directory()
            .await
            .map_err(|e| format!("KV bucket {bucket}: {e}"))?;
        Ok(store)
    }

    /// At start: one read of the group directory. Only when there is none (a new bucket, or the first start after
    /// the per-id index layout) does it migrate: remove the old `_holder.*` keys (one purge, no listing of them),
    /// then list the group keys left (at most [`MAX_GROUP_KEYS`]) into a new directory. A start never depends on
    /// how many requests the bucket has seen.
    async fn load_directory(&self) -> Result<(), StoreError> {
        if read_last::<GroupDirectory>(&self.kv, GROUP_DIRECTORY_KEY)
            .await?
            .is_some()
        {
            return Ok(());
        }
        let filter = format!("{}{HOLDER_INDEX_PREFIX}>", self.kv.prefix);
        let purged = tokio::time::timeout(
            MIGRATION_PURGE_TIMEOUT,
            self.kv.stream.purge().filter(filter),
        )
        .await
        .map_err(|_| {
            StoreError(format!(
                "removing the old holder index: no answer from NATS within {MIGRATION_PURGE_TIMEOUT:?}"
            ))
        })?
        .map_err(|e| StoreError(format!("removing the old holder index: {e}")))?;
        let groups = self.group_keys().await?;
        if purged.purged > 0 || !groups.is_empty() {
            log::info!(
                "fleetlock NATS store: no group directory yet: removed {} old holder index key(s), listing {} group(s)",
                purged.purged,
                groups.len()
            );
        }
        self.list_groups(&groups).await
    }

    /// Makes the group directory list `groups` (durable before it returns; no write when it already does). Cost:
    /// one read, and one compare-and-set when something is new (repeated on a conflict, within the commit
    /// deadline).
    async fn list_groups(&self, groups: &[String]) -> Result<(), StoreError> {
        list_groups(&self.kv, groups, &self.conflicts).await
    }

    fn worker(&self, group: &str) -> Result<mpsc::Sender<Job>, StoreError> {
        let mut w = self
            .workers
            .lock()
            .map_err(|_| StoreError("worker table poisoned".into()))?;
        if let Some(tx) = w.get(group) {
            if !tx.is_closed() {
                return Ok(tx.clone());
            }
        }
        let (tx, rx) = mpsc::channel(MAX_BATCH);
        tokio::spawn(group_writer(
            self.kv.clone(),
            group.to_string(),
            rx,
            self.commits.clone(),
            self.conflicts.clone(),
            self.recent.clone(),
        ));
        w.insert(group.to_string(), tx.clone());
        Ok(tx)
    }

    async fn one(
        &self,
        group: &str,
        op: Op,
        ttl: Option<Duration>,
    ) -> Result<(Applied, bool), StoreError> {
        let (reply, rx) = oneshot::channel();
        self.worker(group)?
            .send(Job { op, ttl, reply })
            .await
            .map_err(|_| StoreError("group writer stopped".into()))?;
        rx.await
            .map_err(|_| StoreError("group writer stopped".into()))?
    }

    /// Applies `op`; returns once every changed group is written.
    pub async fn apply(&self, op: Op, ttl: Option<Duration>) -> Result<Applied, StoreError> {
        match op {
            Op::Lock { groups, holder } => {
                // Each group's writer lists its group in the directory before it writes a grant: a refused
                // request writes nothing, and a slot written is always one a release will find.
                let mut taken = Vec::new();
                let mut expired = Vec::new();
                for (g, slots) in groups {
                    let single = Op::Lock {
                        groups: vec![(g.clone(), slots)],
                        holder: holder.clone(),
                    };
                    let res = self.one(&g, single, ttl).await;
                    let (applied, changed) = match res {
                        Ok(x) => x,
                        Err(e) => {
                            self.undo(&taken, &holder.id).await;
                            return Err(e);
                        }
                    };
                    expired.extend(applied.expired);
                    if let OpResult::Full { .. } = applied.result {
                        self.undo(&taken, &holder.id).await;
                        return Ok(Applied {
                            result: applied.result,
                            expired,
                        });
                    }
                    if changed {
                        taken.push(g);
                    }
                }
                Ok(Applied {
                    result: OpResult::Locked,
                    expired,
                })
            }
            Op::Unlock { groups, id, by } => {
                // No groups: every group of the directory, configured or not (a release never depends on the
                // current config). The groups are independent writers: asked at once.
                let groups = match groups.is_empty() {
                    true => load_directory(&self.kv).await?.0,
                    false => groups,
                };
                let asks = groups.into_iter().map(|g| {
                    let single = Op::Unlock {
                        groups: vec![g.clone()],
                        id: id.clone(),
                        by,
                    };
                    async move { self.one(&g, single, ttl).await }
                });
                let mut removed = 0;
                let mut expired = Vec::new();
                for res in futures::future::join_all(asks).await {
                    let (applied, _) = res?;
                    expired.extend(applied.expired);
                    if let OpResult::Unlocked { removed: r } = applied.result {
                        removed += r;
                    }
                }
                Ok(Applied {
                    result: OpResult::Unlocked { removed },
                    expired,
                })
            }
        }
    }

    /// Every group with a key in the bucket (at most [`MAX_GROUP_KEYS`]; the directory and old index keys left out),
    /// from the stream's subject list (`STREAM.INFO` with a subject filter, paged): no consumer. Only for the
    /// one-time migration, after the old index keys are gone.
    async fn group_keys(&self) -> Result<Vec<String>, StoreError> {
        use futures::{StreamExt, TryStreamExt};
        let prefix = self.kv.prefix.clone();
        let list = async {
            let subjects = self
                .kv
                .stream
                .info_with_subjects(format!("{prefix}>"))
                .await
                .map_err(|e| e.to_string())?;
            subjects
                .map_err(|e| e.to_string())
                .try_filter_map(|(subject, _)| {
                    let key = subject.strip_prefix(prefix.as_str()).map(str::to_string);
                    std::future::ready(Ok(key.filter(|k| {
                        !k.starts_with(HOLDER_INDEX_PREFIX) && k != GROUP_DIRECTORY_KEY
                    })))
                })
                .take(MAX_GROUP_KEYS)
                .try_collect::<Vec<String>>()
                .await
        };
        tokio::time::timeout(Duration::from_secs(5), list)
            .await
            .map_err(|_| StoreError("listing groups: no answer from NATS within 5 s".into()))?
            .map_err(|e| StoreError(format!("listing groups: {e}")))
    }

    async fn undo(&self, taken: &[String], id: &str) {
        for g in taken {
            // The holder's own request gives back what it took: the history shows a grant and a release.
            let op = Op::Unlock {
                groups: vec![g.clone()],
                id: id.to_string(),
                by: Releaser::Holder,
            };
            if let Err(e) = self.one(g, op, None).await {
                // Safe direction: the host keeps a slot it does not use until it asks again or an admin frees it.
                log::error!(
                    "fleetlock: could not give back {id}'s slot in {g} after a full group: {e}"
                );
            }
        }
    }

    /// Current holders of `groups`.
    pub async fn holders(
        &self,
        groups: &[String],
    ) -> Result<BTreeMap<String, Vec<Holder>>, StoreError> {
        let mut out = BTreeMap::new();
        for g in groups {
            let (holders, _) = load(&self.kv, g).await?;
            if !holders.is_empty() {
                out.insert(g.clone(), holders);
            }
        }
        Ok(out)
    }

    /// The history of changes this replica made durable (not the other replicas').
    pub fn recent(&self) -> &Recent {
        &self.recent
    }

    /// Commits so far.
    pub fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }

    /// CAS conflicts retried so far.
    pub fn conflicts(&self) -> u64 {
        self.conflicts.load(Ordering::Relaxed)
    }
}

/// The holders of `group` and the key's revision, read from the stream's leader: on a NATS cluster a direct get
/// (what `kv::Store::entry` does when the bucket allows it) may be answered by a replica that has not applied the
/// last write yet, and a lock server must read its own writes (`/v1/status` right after a grant shows the holder;
/// a compare-and-set starts from the current revision rather than losing a round to a stale one).
async fn load(kv: &kv::Store, group: &str) -> Result<(Vec<Holder>, Option<u64>), StoreError> {
    Ok(match read_last::<GroupHolders>(kv, group).await? {
        Some((v, revision)) => (v.holders, Some(revision)),
        None => (Vec::new(), None),
    })
}

/// The groups the directory lists and the key's revision; read from the leader like [`load`]: a release right
/// after a grant through another replica must see the group that grant added.
async fn load_directory(kv: &kv::Store) -> Result<(Vec<String>, Option<u64>), StoreError> {
    Ok(
        match read_last::<GroupDirectory>(kv, GROUP_DIRECTORY_KEY).await? {
            Some((v, revision)) => (v.groups, Some(revision)),
            None => (Vec::new(), None),
        },
    )
}

/// Makes the directory list `groups`: one read, and a compare-and-set when something is new (repeated on a
/// conflict within the commit deadline). The directory only grows, so a group once listed stays listed.
async fn list_groups(
    kv: &kv::Store,
    groups: &[String],
    conflicts: &AtomicU64,
) -> Result<(), StoreError> {
    let deadline = Instant::now() + COMMIT_DEADLINE;
    let mut attempt = 0u32;
    loop {
        let (mut listed, revision) = load_directory(kv).await?;
        let before = listed.len();
        for g in groups {
            if let Err(at) = listed.binary_search(g) {
                listed.insert(at, g.clone());
            }
        }
        if listed.len() == before && revision.is_some() {
            return Ok(());
        }
        let value = serde_json::to_vec(&GroupDirectory {
            version: 1,
            groups: listed,
        })
        .map_err(|e| StoreError(e.to_string()))?;
        match write(kv, GROUP_DIRECTORY_KEY, value, revision).await {
            Ok(()) => return Ok(()),
            Err(e) => {
                retry_after(e, deadline, &mut attempt, conflicts, "the group directory").await?
            }
        }
    }
}

/// After a failed compare-and-set write of `what`: a conflict before `deadline` is counted and waited out (the
/// caller reads and tries again); a conflict past it, or any other error, is the caller's error.
async fn retry_after(
    e: WriteError,
    deadline: Instant,
    attempt: &mut u32,
    conflicts: &AtomicU64,
    what: &str,
) -> Result<(), StoreError> {
    match e {
        WriteError::Conflict if Instant::now() < deadline => {
            conflicts.fetch_add(1, Ordering::Relaxed);
            *attempt = attempt.saturating_add(1);
            tokio::time::sleep(backoff(*attempt)).await;
            Ok(())
        }
        WriteError::Conflict => Err(StoreError(format!(
            "{what}: compare-and-set kept conflicting for {COMMIT_DEADLINE:?}"
        ))),
        WriteError::Other(e) => Err(StoreError(format!("writing {what}: {e}"))),
    }
}

/// The value of `key` and its revision (one `STREAM.MSG.GET` request to the stream's leader, no consumer); `None`
/// when the key does not exist or was deleted.
async fn read_last<T: serde::de::DeserializeOwned>(
    kv: &kv::Store,
    key: &str,
) -> Result<Option<(T, u64)>, StoreError> {
    use async_nats::jetstream::stream::LastRawMessageErrorKind;
    let subject = format!("{}{key}", kv.prefix);
    let read = tokio::time::timeout(
        Duration::from_secs(5),
        kv.stream.get_last_raw_message_by_subject(&subject),
    )
    .await
    .map_err(|_| StoreError(format!("reading {key}: no answer from NATS within 5 s")))?;
    let msg = match read {
        Ok(m) => m,
        Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => return Ok(None),
        Err(e) => return Err(StoreError(format!("reading {key}: {e}"))),
    };
    let op = msg
        .headers
        .get("KV-Operation")
        .map(|v| v.as_str().to_owned());
    if matches!(op.as_deref(), Some("DEL") | Some("PURGE")) {
        return Ok(None);
    }
    let v: T = serde_json::from_slice(&msg.payload).map_err(|err| {
        StoreError(format!(
            "key {key} of bucket fleetlock does not parse: {err}"
        ))
    })?;
    Ok(Some((v, msg.sequence)))
}

enum WriteError {
    Conflict,
    Other(String),
}

/// Writes `value` to `key` if its revision is still `revision` (`None`: the key must not exist).
async fn write(
    kv: &kv::Store,
    key: &str,
    value: Vec<u8>,
    revision: Option<u64>,
) -> Result<(), WriteError> {
    let fut = async {
        match revision {
            None => kv.create(key, value.into()).await.map(drop).map_err(|e| {
                if e.kind() == kv::CreateErrorKind::AlreadyExists || lost_race(&e) {
                    WriteError::Conflict
                } else {
                    WriteError::Other(e.to_string())
                }
            }),
            Some(r) => kv
                .update(key, value.into(), r)
                .await
                .map(drop)
                .map_err(|e| {
                    if e.kind() == kv::UpdateErrorKind::WrongLastRevision || lost_race(&e) {
                        WriteError::Conflict
                    } else {
                        WriteError::Other(e.to_string())
                    }
                }),
        }
    };
    tokio::time::timeout(Duration::from_secs(5), fut)
        .await
        .map_err(|_| WriteError::Other("no answer from NATS within 5 s".into()))?
}

/// Whether a failed write lost a compare-and-set race: JetStream's `wrong last sequence`, which a clustered stream
/// also reports as error code 10164 (a concurrent proposal; async-nats maps only 10071 to a wrong revision, so
/// on a 3-node cluster the race surfaced as a 503 `store-unavailable`).
fn lost_race(e: &(dyn std::error::Error + 'static)) -> bool {
    use async_nats::jetstream::{Error as ApiError, ErrorCode};
    const WRONG_LAST_SEQUENCE_CLUSTERED: ErrorCode = ErrorCode(10164);
    let mut next = Some(e);
    while let Some(err) = next {
        if let Some(api) = err.downcast_ref::<ApiError>() {
            let code = api.error_code();
            return code == ErrorCode::STREAM_WRONG_LAST_SEQUENCE
                || code == WRONG_LAST_SEQUENCE_CLUSTERED;
        }
        next = err.source();
    }
    false
}

async fn group_writer(
    kv: kv::Store,
    group: String,
    mut rx: mpsc::Receiver<Job>,
    commits: Arc<AtomicU64>,
    conflicts: Arc<AtomicU64>,
    recent: Arc<Recent>,
) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    let mut attempt: u32 = 0;
    // Whether the directory lists this group; it never shrinks, so once true it stays true.
    let mut listed = false;
    while rx.recv_many(&mut batch, MAX_BATCH).await > 0 {
        let deadline = Instant::now() + COMMIT_DEADLINE;
        let outcome: Result<Vec<(Applied, bool)>, StoreError> = loop {
            let (holders, revision) = match load(&kv, &group).await {
                Ok(x) => x,
                Err(e) => break Err(e),
            };
            let mut map = BTreeMap::from([(group.clone(), holders)]);
            let now = Timestamp::now();
            let mut results = Vec::with_capacity(batch.len());
            let mut lines = Vec::new();
            let mut changes = Vec::new();
            for job in &batch {
                let gone = state::expire_all(&mut map, job.ttl, now);
                let expired = gone
                    .iter()
                    .map(|c| (c.group.clone(), c.holder.clone()))
                    .collect();
                changes.extend(gone);
                let outcome = state::apply(&mut map, &job.op);
                let c = outcome.changed();
                lines.extend(outcome.line);
                changes.extend(outcome.changes);
                results.push((
                    Applied {
                        result: outcome.result,
                        expired,
                    },
                    c,
                ));
            }
            if changes.is_empty() {
                break Ok(results);
            }
            let grants = changes
                .iter()
                .any(|c| c.kind == fleet_wire::fleetlock::LockEventKind::Granted);
            if grants && !listed {
                // Before the first holder is written: a crash in between leaves a listed group without holders
                // (a release reads it for nothing), never a holder no release finds.
                if let Err(e) = list_groups(&kv, std::slice::from_ref(&group), &conflicts).await {
                    break Err(e);
                }
                listed = true;
            }
            let holders = map.remove(&group).unwrap_or_default();
            let value = serde_json::to_vec(&GroupHolders {
                version: 1,
                holders,
            });
            let written = match value {
                Ok(v) => write(&kv, &group, v, revision).await,
                Err(e) => Err(WriteError::Other(e.to_string())),
            };
            match written {
                Ok(()) => {
                    commits.fetch_add(1, Ordering::Relaxed);
                    attempt = 0;
                    // Grants and releases in commit order, once durable; the history stamped with that moment.
                    for line in &lines {
                        log::info!("{line}");
                    }
                    recent.push(changes, Timestamp::now());
                    break Ok(results);
                }
                Err(e) => {
                    let what = format!("group {group}");
                    if let Err(e) = retry_after(e, deadline, &mut attempt, &conflicts, &what).await
                    {
                        break Err(e);
                    }
                }
            }
        };
        match outcome {
            Ok(results) => {
                for (job, r) in batch.drain(..).zip(results) {
                    let _ = job.reply.send(Ok(r));
                }
            }
            Err(e) => {
                log::error!("fleetlock NATS store: {e}");
                for job in batch.drain(..) {
                    let _ = job.reply.send(Err(e.clone()));
                }
            }
        }
    }
}

/// A short randomised pause after a conflict, so replicas stop colliding (at most about 8 ms).
fn backoff(attempt: u32) -> Duration {
    let cap_us = 250u64 << attempt.min(5);
    let nanos = u64::from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .subsec_nanos(),
    );
    Duration::from_micros(nanos % cap_us.max(1))
}
