//! The file store: every group's holders in `<dir>/state.json`, written to a temporary file, fsynced, renamed and
//! the directory fsynced before any answer. Group commit in a two-stage pipeline: the writer thread applies
//! whatever requests queued up into one batch and writes + fsyncs its temporary file while the committer thread
//! renames the previous batch's file and fsyncs the directory. Batches are renamed and answered strictly in order,
//! every answer waits for the rename + directory fsync that covers it, and throughput is not capped at one fsync
//! per request. A failed commit fails every batch built on it, and the writer starts again from the durable state.

use super::{Applied, StoreError, MAX_BATCH};
use crate::recent::Recent;
use crate::state::{self, Change, Op};
use fleet_wire::fleetlock::{Holder, StateFile};
use fleet_wire::Timestamp;
use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
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
    recent: Arc<Recent>,
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
        remove_temporaries(dir);
        let (tx, rx) = mpsc::channel(MAX_BATCH * 4);
        let view = Arc::new(RwLock::new(held.clone()));
        let commits = Arc::new(AtomicU64::new(0));
        // Plain threads: the fsyncs block anyway, and no async hop sits between a batch and its fsync.
        let shared = Arc::new(Shared {
            epoch: AtomicU64::new(0),
            durable: Mutex::new(held.clone()),
        });
        // At most one batch waits between the stages: two commits in flight.
        let (to_commit, commit_rx) = std::sync::mpsc::sync_channel::<Staged>(1);
        let (d, sh) = (dir.to_path_buf(), shared.clone());
        std::thread::Builder::new()
            .name("fleetlock-writer".into())
            .spawn(move || writer(rx, held, d, sh, to_commit))
            .map_err(|e| format!("writer thread: {e}"))?;
        let recent = Arc::new(Recent::default());
        let (d, v, c, r) = (
            dir.to_path_buf(),
            view.clone(),
            commits.clone(),
            recent.clone(),
        );
        std::thread::Builder::new()
            .name("fleetlock-commit".into())
            .spawn(move || committer(commit_rx, d, shared, v, c, r))
            .map_err(|e| format!("commit thread: {e}"))?;
        Ok(Self {
            tx,
            view,
            commits,
            recent,
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

    /// The history of changes made durable.
    pub fn recent(&self) -> &Recent {
        &self.recent
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

/// State shared by the two stages.
struct Shared {
    /// Bumped by the committer when a commit fails: batches built in an older epoch fail too.
    epoch: AtomicU64,
    /// The state as last made durable (the writer restarts from it after a failure).
    durable: Mutex<Holders>,
}

/// A batch between the stages.
struct Staged {
    epoch: u64,
    /// The fsynced temporary file to rename, if the batch changed anything.
    tmp: Option<Result<PathBuf, String>>,
    state: Holders,
    replies: Vec<(oneshot::Sender<Result<Applied, StoreError>>, Applied)>,
    /// Grants and releases of the batch, in order: logged once it is durable.
    lines: Vec<String>,
    /// Every change of the batch (expiries included), in order: recorded once it is durable.
    changes: Vec<Change>,
}

fn writer(
    mut rx: mpsc::Receiver<Job>,
    mut working: Holders,
    dir: PathBuf,
    shared: Arc<Shared>,
    to_commit: std::sync::mpsc::SyncSender<Staged>,
) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    let mut epoch = 0;
    let mut seq: u64 = 0;
    while let Some(first) = rx.blocking_recv() {
        // Everything that queued up meanwhile goes into this batch.
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let now_epoch = shared.epoch.load(Ordering::Acquire);
        if now_epoch != epoch {
            epoch = now_epoch;
            working = shared.durable.lock().map(|d| d.clone()).unwrap_or_default();
        }
        let now = Timestamp::now();
        let mut replies = Vec::with_capacity(batch.len());
        let mut lines = Vec::new();
        let mut changes = Vec::new();
        for job in batch.drain(..) {
            let gone = state::expire_all(&mut working, job.ttl, now);
            let expired = gone
                .iter()
                .map(|c| (c.group.clone(), c.holder.clone()))
                .collect();
            changes.extend(gone);
            let op = match job.op {
                Op::Unlock { groups, id, by } if groups.is_empty() => Op::Unlock {
                    groups: working.keys().cloned().collect(),
                    id,
                    by,
                },
                op => op,
            };
            let outcome = state::apply(&mut working, &op);
            lines.extend(outcome.line);
            changes.extend(outcome.changes);
            replies.push((
                job.reply,
                Applied {
                    result: outcome.result,
                    expired,
                },
            ));
        }
        let changed = !changes.is_empty();
        let tmp = changed.then(|| {
            seq += 1;
            let file = StateFile {
                version: 1,
                groups: working.clone(),
            };
            let tmp = dir.join(format!("{STATE_FILE}.tmp.{seq}"));
            write_synced(&tmp, &file).map(|()| tmp)
        });
        let staged = Staged {
            epoch,
            tmp,
            state: working.clone(),
            replies,
            lines,
            changes,
        };
        if to_commit.send(staged).is_err() {
            return;
        }
    }
}

fn committer(
    rx: std::sync::mpsc::Receiver<Staged>,
    dir: PathBuf,
    shared: Arc<Shared>,
    view: Arc<RwLock<Holders>>,
    commits: Arc<AtomicU64>,
    recent: Arc<Recent>,
) {
    while let Ok(staged) = rx.recv() {
        let current = shared.epoch.load(Ordering::Acquire);
        let result = if staged.epoch != current {
            if let Some(Ok(tmp)) = &staged.tmp {
                let _ = std::fs::remove_file(tmp);
            }
            Err("an earlier commit failed; ask again".to_string())
        } else {
            match staged.tmp {
                None => Ok(()),
                Some(Err(e)) => Err(e),
                Some(Ok(tmp)) => rename_synced(&dir, &tmp).map(|()| {
                    commits.fetch_add(1, Ordering::Relaxed);
                    if let Ok(mut d) = shared.durable.lock() {
                        d.clone_from(&staged.state);
                    }
                    if let Ok(mut v) = view.write() {
                        v.clone_from(&staged.state);
                    }
                }),
            }
        };
        match result {
            Ok(()) => {
                for line in &staged.lines {
                    log::info!("{line}");
                }
                // Stamped with the time the rename made the batch durable.
                recent.push(staged.changes, Timestamp::now());
                for (reply, applied) in staged.replies {
                    let _ = reply.send(Ok(applied));
                }
            }
            Err(e) => {
                if staged.epoch == current {
                    // Later batches were built on this one: fail them and restart from the durable state.
                    shared.epoch.fetch_add(1, Ordering::AcqRel);
                    log::error!("fleetlock file store: commit failed, answering 503: {e}");
                    remove_temporaries(&dir);
                }
                for (reply, _) in staged.replies {
                    let _ = reply.send(Err(StoreError(e.clone())));
                }
            }
        }
    }
}

fn remove_temporaries(dir: &Path) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name();
        if name
            .to_str()
            .is_some_and(|n| n.starts_with(&format!("{STATE_FILE}.tmp")))
        {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Writes `state` to the temporary file `tmp` and fsyncs it (the first half of the tree's one atomic write,
/// `fleet_wire::durable`; the committer thread does the second).
fn write_synced(tmp: &Path, state: &StateFile) -> Result<(), String> {
    let bytes = serde_json::to_vec_pretty(state).map_err(|e| e.to_string())?;
    fleet_wire::durable::stage(tmp, &bytes, 0o644).map_err(|e| format!("{}: {e}", tmp.display()))
}

/// Renames the fsynced `tmp` over the state file and fsyncs the directory.
fn rename_synced(dir: &Path, tmp: &Path) -> Result<(), String> {
    let path = dir.join(STATE_FILE);
    fleet_wire::durable::commit(tmp, &path).map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::OpResult;

    fn lock(id: &str) -> Op {
        Op::Lock {
            groups: vec![("g".into(), 5)],
            holder: Holder {
                id: id.into(),
                hostname: None,
                ip: "127.0.0.1".into(),
                taken_at: Timestamp::from_unix_ms(1),
            },
        }
    }

    /// A real file-system fault: a directory where the state file goes makes the rename fail.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_commit_answers_503_and_changes_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path().join(STATE_FILE);
        {
            let s = FileStore::open(dir.path()).expect("open");
            let ok = s.apply(lock("a"), None).await.expect("a");
            assert_eq!(ok.result, OpResult::Locked);
            std::fs::remove_file(&state).expect("rm");
            std::fs::create_dir(&state).expect("mkdir");
            assert!(s.apply(lock("b"), None).await.is_err(), "b must fail");
            std::fs::remove_dir(&state).expect("rmdir");
            assert!(s.apply(lock("c"), None).await.is_ok());
            let ids: Vec<String> = s.holders()["g"].iter().map(|h| h.id.clone()).collect();
            assert_eq!(ids, ["a", "c"], "b's failed commit left no trace");
            // Nor in the history, which holds only what was made durable, newest first.
            let recent: Vec<String> = s
                .recent()
                .newest_first()
                .into_iter()
                .map(|e| e.holder.id)
                .collect();
            assert_eq!(recent, ["c", "a"]);
        }
        // Reopened from disk: the same holders; no temporary files left.
        let s = FileStore::open(dir.path()).expect("reopen");
        let ids: Vec<String> = s.holders()["g"].iter().map(|h| h.id.clone()).collect();
        assert_eq!(ids, ["a", "c"]);
        let temps = std::fs::read_dir(dir.path())
            .expect("ls")
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().contains(".tmp"))
            .count();
        assert_eq!(temps, 0);
    }
}
