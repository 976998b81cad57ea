//! Lock stores: where holders live and how a change becomes durable before the client gets its answer.
//! `file` (the default; group commit: one fsync covers a batch) and `nats` (JetStream KV with compare-and-set, for
//! several replicas).

pub mod file;
pub mod nats;

use super::config::StoreConfig;
use super::recent::Recent;
use super::state::{Op, OpResult};
use fleet_wire::fleetlock::{Holder, LockEvent};
use std::collections::BTreeMap;
use std::time::Duration;

/// Most operations one commit covers.
pub const MAX_BATCH: usize = 4096;
/// How long the server tries to get a change durable before answering 503 (NATS CAS retries included).
pub const COMMIT_DEADLINE: Duration = Duration::from_secs(10);

/// The store could not make a change durable; nothing changed from the client's point of view.
#[derive(Debug, Clone, thiserror::Error)]
#[error("lock store unavailable: {0}")]
pub struct StoreError(pub String);

/// The outcome of an operation, with holders the TTL removed on the way (for the audit log).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// What the operation did.
    pub result: OpResult,
    /// (group, holder) removed because their TTL ran out.
    pub expired: Vec<(String, Holder)>,
}

/// A store: file or NATS.
pub enum Store {
    /// State file with group commit.
    File(file::FileStore),
    /// NATS JetStream KV with compare-and-set.
    Nats(Box<nats::NatsStore>),
}

impl Store {
    /// Opens the configured store (file: takes the directory's lock; NATS: connects and opens the bucket).
    pub async fn open(cfg: &StoreConfig) -> Result<Self, String> {
        match cfg {
            StoreConfig::File { dir } => Ok(Self::File(file::FileStore::open(dir)?)),
            StoreConfig::Nats {
                url,
                credentials,
                replicas,
                ..
            } => Ok(Self::Nats(Box::new(
                nats::NatsStore::open_tls(url, credentials.as_deref(), &cfg.nats_tls()?, *replicas)
                    .await?,
            ))),
        }
    }

    /// `file` or `nats`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::File(_) => "file",
            Self::Nats(_) => "nats",
        }
    }

    /// Applies `op` and returns once the result is durable. An `Unlock` with no groups releases `id` in every
    /// group that has holders, configured or not.
    pub async fn apply(&self, op: Op, ttl: Option<Duration>) -> Result<Applied, StoreError> {
        match self {
            Self::File(s) => s.apply(op, ttl).await,
            Self::Nats(s) => s.apply(op, ttl).await,
        }
    }

    /// Current holders of `groups` (file store: of every group with holders as well).
    pub async fn holders(
        &self,
        groups: &[String],
    ) -> Result<BTreeMap<String, Vec<Holder>>, StoreError> {
        match self {
            Self::File(s) => Ok(s.holders()),
            Self::Nats(s) => s.holders(groups).await,
        }
    }

    /// The grants, releases, expiries and admin releases this store made durable, newest first (bounded).
    pub fn recent(&self) -> Vec<LockEvent> {
        self.history().newest_first()
    }

    fn history(&self) -> &Recent {
        match self {
            Self::File(s) => s.recent(),
            Self::Nats(s) => s.recent(),
        }
    }

    /// Durable commits made so far (for metrics).
    pub fn commits(&self) -> u64 {
        match self {
            Self::File(s) => s.commits(),
            Self::Nats(s) => s.commits(),
        }
    }

    /// Compare-and-set conflicts retried so far (always 0 for the file store).
    pub fn conflicts(&self) -> u64 {
        match self {
            Self::File(_) => 0,
            Self::Nats(s) => s.conflicts(),
        }
    }
}
