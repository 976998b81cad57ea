//! The file store: every group's holders in `<dir>/state.json`, written to a temporary file, fsynced, renamed and
//! the directory fsynced before any answer. One writer task batches whatever requests queued up during the
//! previous fsync into one commit (group commit), so every answer waits for the fsync that covers it and
//! throughput is not capped at one fsync per request.

use super::{Applied, StoreError, MAX_BATCH};
use crate::fleetlock::state::{self, Op};
use fleet_wire::fleetlock::{Holder, StateFile};
use fleet_wire::Timestamp;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// Name of the state file in the store directory.
pub const STATE_FILE: &str = "state.json";
/// Largest state file read at start, in bytes.
pub const MAX_STATE_BYTES: u64 = 64 * 1024 * 1024;

type Holders = BTreeMap<String, Vec<Holder>>;

struct Job {
    op: Op,
    ttl: Option<Duration>,
    reply: oneshot::Sender<Result<Applied, StoreError>>,
}

/// Handle to the writer task.
pub struct FileStore {
    tx: mpsc::Sender<Job>,
    view: Arc<RwLock<Holders>>,
    commits: Arc<AtomicU64>,
    _lock: File,
}

impl FileStore {
    /// Opens `dir` (created if missing), takes its exclusive lock and loads the state file.
    pub fn open(dir: &Path) -> Result<Self, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let lock = lock_dir(dir)?;
        let path = dir.join(STATE_FILE);
        let held: Holders = match std::fs::metadata(&path) {
            Ok(m) if m.len() > MAX_STATE_BYTES => {
                return Err(format!(
                    "{}: larger than {MAX_STATE_BYTES} bytes",
                    path.display()
                ))
            }
            Ok(_) => {
                let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
                let s: StateFile = serde_json::from_slice(&bytes).map_err(|e| {
                    format!(
                        "{}: does not parse ({e}); the server will not guess who holds a lock: \
                         fix the file or move it away to start with no holders",
                        path.display()
                    )
                })?;
                s.groups
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Holders::new(),
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        let _ = std::fs::remove_file(dir.join(format!("{STATE_FILE}.tmp")));
        let (tx, rx) = mpsc::channel(MAX_BATCH * 4);
        let view = Arc::new(RwLock::new(held.clone()));
        let commits = Arc::new(AtomicU64::new(0));
        tokio::spawn(writer(
            rx,
            held,
            dir.to_path_buf(),
            view.clone(),
            commits.clone(),
        ));
        Ok(Self {
            tx,
            view,
            commits,
            _lock: lock,
        })
    }

    /// Applies `op`; returns once it is on disk.
    pub async fn apply(&self, op: Op, ttl: Option<Duration>) -> Result<Applied, StoreError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Job { op, ttl, reply })
            .await
            .map_err(|_| StoreError("the writer task stopped".into()))?;
        rx.await
            .map_err(|_| StoreError("the writer task stopped".into()))?
    }

    /// The durable holders.
    pub fn holders(&self) -> Holders {
        self.view.read().map(|v| v.clone()).unwrap_or_default()
    }

    /// Commits so far.
    pub fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }
}

fn lock_dir(dir: &Path) -> Result<File, String> {
    use std::os::fd::AsRawFd;
    let path = dir.join("lock");
    let f = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    // SAFETY: flock on a file descriptor we own; no memory is shared with the kernel.
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        return Err(format!(
            "{}: another fleetlock-server uses this store directory (stop it, or give this one another dir)",
            dir.display()
        ));
    }
    Ok(f)
}

async fn writer(
    mut rx: mpsc::Receiver<Job>,
    mut durable: Holders,
    dir: PathBuf,
    view: Arc<RwLock<Holders>>,
    commits: Arc<AtomicU64>,
) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while rx.recv_many(&mut batch, MAX_BATCH).await > 0 {
        let now = Timestamp::now();
        let mut working = durable.clone();
        let mut changed = false;
        let mut replies = Vec::with_capacity(batch.len());
        for job in batch.drain(..) {
            let mut expired = Vec::new();
            if job.ttl.is_some() {
                for (group, holders) in working.iter_mut() {
                    for h in state::expire(holders, job.ttl, now) {
                        expired.push((group.clone(), h));
                    }
                }
                working.retain(|_, v| !v.is_empty());
                changed |= !expired.is_empty();
            }
            let op = match job.op {
                Op::Unlock { groups, id } if groups.is_empty() => Op::Unlock {
                    groups: working.keys().cloned().collect(),
                    id,
                },
                op => op,
            };
            let (result, c) = state::apply(&mut working, &op);
            changed |= c;
            replies.push((job.reply, Applied { result, expired }));
        }
        if changed {
            let file = StateFile {
                version: 1,
                groups: working.clone(),
            };
            let d = dir.clone();
            let res = tokio::task::spawn_blocking(move || write_durable(&d, &file))
                .await
                .map_err(|e| e.to_string())
                .and_then(|r| r);
            match res {
                Ok(()) => {
                    commits.fetch_add(1, Ordering::Relaxed);
                    durable = working;
                    if let Ok(mut v) = view.write() {
                        v.clone_from(&durable);
                    }
                }
                Err(e) => {
                    log::error!("fleetlock file store: commit failed, answering 503: {e}");
                    for (reply, _) in replies {
                        let _ = reply.send(Err(StoreError(e.clone())));
                    }
                    continue;
                }
            }
        }
        for (reply, applied) in replies {
            let _ = reply.send(Ok(applied));
        }
    }
}

/// Temporary file, fsync, rename over the state file, fsync of the directory.
fn write_durable(dir: &Path, state: &StateFile) -> Result<(), String> {
    let bytes = serde_json::to_vec_pretty(state).map_err(|e| e.to_string())?;
    let tmp = dir.join(format!("{STATE_FILE}.tmp"));
    let path = dir.join(STATE_FILE);
    let io = |e: std::io::Error| format!("{}: {e}", tmp.display());
    let mut f = File::create(&tmp).map_err(io)?;
    f.write_all(&bytes).map_err(io)?;
    f.sync_all().map_err(io)?;
    drop(f);
    std::fs::rename(&tmp, &path).map_err(|e| format!("{}: {e}", path.display()))?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| format!("{}: {e}", dir.display()))
}
