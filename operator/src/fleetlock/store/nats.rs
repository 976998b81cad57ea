//! The NATS store: holders of group `<group>` are the value of key `<group>` in the JetStream KV bucket
//! `fleetlock`, changed only by compare-and-set on the entry's revision, so several server replicas share one
//! truth. One task per group batches the requests of this replica into one CAS; a conflict with another replica
//! re-reads and re-applies the batch (never an error for a client). A host in several groups takes its slots in
//! name order and gives back what it took if a later group is full: all or nothing, and the transient state only
//! ever holds more slots than needed (safe: others wait, nobody reboots without a slot).

use super::{Applied, StoreError, COMMIT_DEADLINE, MAX_BATCH};
use crate::fleetlock::state::{self, Op, OpResult};
use async_nats::jetstream::kv;
use fleet_wire::fleetlock::{GroupHolders, Holder};
use fleet_wire::Timestamp;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

/// Most group keys a release looks through.
pub const MAX_GROUP_KEYS: usize = 10_000;

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
        tls: &crate::nats_tls::NatsTls,
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
            opts.connect(crate::kv::servers(url)),
        )
        .await
        .map_err(|_| format!("NATS at {url}: no connection within 15 s"))?
        .map_err(|e| {
            format!(
                "NATS at {url}: {}",
                tls.explain(&crate::kv::error_chain(&e))
            )
        })?;
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
        Ok(Self {
            kv,
            workers: Mutex::new(HashMap::new()),
            commits: Arc::new(AtomicU64::new(0)),
            conflicts: Arc::new(AtomicU64::new(0)),
        })
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
            Op::Unlock { groups, id } => {
                // No groups: every group the bucket holds, configured or not (a release never depends on the
                // current config).
                let groups = match groups.is_empty() {
                    true => self.group_keys().await?,
                    false => groups,
                };
                let mut removed = 0;
                let mut expired = Vec::new();
                for g in groups {
                    let single = Op::Unlock {
                        groups: vec![g.clone()],
                        id: id.clone(),
                    };
                    let (applied, _) = self.one(&g, single, ttl).await?;
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

    /// Every group with a key in the bucket (at most [`MAX_GROUP_KEYS`]).
    async fn group_keys(&self) -> Result<Vec<String>, StoreError> {
        use futures::{StreamExt, TryStreamExt};
        let list = async {
            let keys = self.kv.keys().await.map_err(|e| e.to_string())?;
            keys.take(MAX_GROUP_KEYS)
                .try_collect::<Vec<String>>()
                .await
                .map_err(|e| e.to_string())
        };
        tokio::time::timeout(Duration::from_secs(5), list)
            .await
            .map_err(|_| StoreError("listing groups: no answer from NATS within 5 s".into()))?
            .map_err(|e| StoreError(format!("listing groups: {e}")))
    }

    async fn undo(&self, taken: &[String], id: &str) {
        for g in taken {
            let op = Op::Unlock {
                groups: vec![g.clone()],
                id: id.to_string(),
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
    use async_nats::jetstream::stream::LastRawMessageErrorKind;
    let subject = format!("{}{group}", kv.prefix);
    let read = tokio::time::timeout(
        Duration::from_secs(5),
        kv.stream.get_last_raw_message_by_subject(&subject),
    )
    .await
    .map_err(|_| StoreError(format!("reading {group}: no answer from NATS within 5 s")))?;
    let msg = match read {
        Ok(m) => m,
        Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => {
            return Ok((Vec::new(), None))
        }
        Err(e) => return Err(StoreError(format!("reading {group}: {e}"))),
    };
    let op = msg
        .headers
        .get("KV-Operation")
        .map(|v| v.as_str().to_owned());
    if matches!(op.as_deref(), Some("DEL") | Some("PURGE")) {
        return Ok((Vec::new(), None));
    }
    let v: GroupHolders = serde_json::from_slice(&msg.payload).map_err(|err| {
        StoreError(format!(
            "key {group} of bucket fleetlock does not parse: {err}"
        ))
    })?;
    Ok((v.holders, Some(msg.sequence)))
}

enum WriteError {
    Conflict,
    Other(String),
}

async fn write(
    kv: &kv::Store,
    group: &str,
    holders: Vec<Holder>,
    revision: Option<u64>,
) -> Result<(), WriteError> {
    let value = serde_json::to_vec(&GroupHolders {
        version: 1,
        holders,
    })
    .map_err(|e| WriteError::Other(e.to_string()))?;
    let fut = async {
        match revision {
            None => kv.create(group, value.into()).await.map(drop).map_err(|e| {
                if e.kind() == kv::CreateErrorKind::AlreadyExists {
                    WriteError::Conflict
                } else {
                    WriteError::Other(e.to_string())
                }
            }),
            Some(r) => kv
                .update(group, value.into(), r)
                .await
                .map(drop)
                .map_err(|e| {
                    if e.kind() == kv::UpdateErrorKind::WrongLastRevision {
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

async fn group_writer(
    kv: kv::Store,
    group: String,
    mut rx: mpsc::Receiver<Job>,
    commits: Arc<AtomicU64>,
    conflicts: Arc<AtomicU64>,
) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    let mut attempt: u32 = 0;
    while rx.recv_many(&mut batch, MAX_BATCH).await > 0 {
        let deadline = Instant::now() + COMMIT_DEADLINE;
        let outcome: Result<Vec<(Applied, bool)>, StoreError> = loop {
            let (holders, revision) = match load(&kv, &group).await {
                Ok(x) => x,
                Err(e) => break Err(e),
            };
            let mut map = BTreeMap::from([(group.clone(), holders)]);
            let now = Timestamp::now();
            let mut changed = false;
            let mut results = Vec::with_capacity(batch.len());
            let mut lines = Vec::new();
            for job in &batch {
                let mut expired = Vec::new();
                if let Some(hs) = map.get_mut(&group) {
                    for h in state::expire(hs, job.ttl, now) {
                        expired.push((group.clone(), h));
                    }
                }
                changed |= !expired.is_empty();
                let (result, c, line) = state::apply_logged(&mut map, &job.op);
                changed |= c;
                lines.extend(line);
                results.push((Applied { result, expired }, c));
            }
            if !changed {
                break Ok(results);
            }
            let holders = map.remove(&group).unwrap_or_default();
            match write(&kv, &group, holders, revision).await {
                Ok(()) => {
                    commits.fetch_add(1, Ordering::Relaxed);
                    attempt = 0;
                    // Grants and releases in commit order, once durable.
                    for line in &lines {
                        log::info!("{line}");
                    }
                    break Ok(results);
                }
                Err(WriteError::Conflict) if Instant::now() < deadline => {
                    conflicts.fetch_add(1, Ordering::Relaxed);
                    attempt = attempt.saturating_add(1);
                    tokio::time::sleep(backoff(attempt)).await;
                }
                Err(WriteError::Conflict) => {
                    break Err(StoreError(format!(
                        "group {group}: compare-and-set kept conflicting for {COMMIT_DEADLINE:?}"
                    )))
                }
                Err(WriteError::Other(e)) => {
                    break Err(StoreError(format!("writing {group}: {e}")))
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
