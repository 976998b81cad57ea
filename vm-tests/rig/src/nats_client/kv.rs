//! A blocking KV bucket (async-nats's key-value store): get, put, create, compare-and-set update, delete, keys, and
//! a watch that starts with the last value of every matching key.

use super::runtime::{block_on, io_error};
use bytes::Bytes;
use futures::StreamExt;
use std::io;
use std::sync::Arc;
use std::time::Duration;

pub use async_nats::jetstream::kv::Operation;

/// How long [`Watch`]'s iterator waits for the next entry before it ends.
pub const WATCH_WAIT: Duration = Duration::from_secs(60);

/// A KV bucket handle.
#[derive(Clone)]
pub struct Store {
    inner: async_nats::jetstream::kv::Store,
}

/// One revision of a key: a value, or a delete or purge marker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The bucket's name.
    pub bucket: String,
    /// The key.
    pub key: String,
    /// The value (empty for a delete or purge).
    pub value: Vec<u8>,
    /// The revision (the stream sequence).
    pub revision: u64,
    /// What the revision did.
    pub operation: Operation,
    /// When the server stored it (Unix ms).
    pub created_unix_ms: u64,
}

impl From<async_nats::jetstream::kv::Entry> for Entry {
    fn from(e: async_nats::jetstream::kv::Entry) -> Self {
        Self {
            bucket: e.bucket,
            key: e.key,
            value: e.value.to_vec(),
            revision: e.revision,
            operation: e.operation,
            created_unix_ms: (e.created.unix_timestamp_nanos() / 1_000_000).max(0) as u64,
        }
    }
}

impl Store {
    pub(crate) fn new(inner: async_nats::jetstream::kv::Store) -> Self {
        Self { inner }
    }

    /// The key's value; `None` when absent, deleted or purged.
    pub fn get(&self, key: &str) -> io::Result<Option<Vec<u8>>> {
        let (s, key) = (self.inner.clone(), key.to_owned());
        block_on(async move { s.get(key).await })
            .map(|v| v.map(|b| b.to_vec()))
            .map_err(io_error)
    }

    /// The key's latest revision, delete and purge markers included; `None` when it never had one.
    pub fn entry(&self, key: &str) -> io::Result<Option<Entry>> {
        let (s, key) = (self.inner.clone(), key.to_owned());
        block_on(async move { s.entry(key).await })
            .map(|e| e.map(Entry::from))
            .map_err(io_error)
    }

    /// Writes `value`; its revision.
    pub fn put(&self, key: &str, value: impl AsRef<[u8]>) -> io::Result<u64> {
        let (s, key, v) = (self.inner.clone(), key.to_owned(), bytes(value));
        block_on(async move { s.put(key, v).await }).map_err(io_error)
    }

    /// Writes `value` only when the key has no value (absent, deleted or purged); its revision.
    pub fn create(&self, key: &str, value: impl AsRef<[u8]>) -> io::Result<u64> {
        let (s, key, v) = (self.inner.clone(), key.to_owned(), bytes(value));
        block_on(async move { s.create(key, v).await }).map_err(io_error)
    }

    /// Writes `value` only when the key's latest revision is `revision` (JetStream error 10071 otherwise); the
    /// new revision.
    pub fn update(&self, key: &str, value: impl AsRef<[u8]>, revision: u64) -> io::Result<u64> {
        let (s, key, v) = (self.inner.clone(), key.to_owned(), bytes(value));
        block_on(async move { s.update(key, v, revision).await }).map_err(io_error)
    }

    /// Writes a delete marker.
    pub fn delete(&self, key: &str) -> io::Result<()> {
        let (s, key) = (self.inner.clone(), key.to_owned());
        block_on(async move { s.delete(key).await }).map_err(io_error)
    }

    /// Every key with a value (deleted and purged ones left out).
    pub fn keys(&self) -> io::Result<std::vec::IntoIter<String>> {
        let s = self.inner.clone();
        block_on(async move {
            let mut keys = s.keys().await.map_err(io_error)?;
            let mut all = Vec::new();
            while let Some(k) = keys.next().await {
                all.push(k.map_err(io_error)?);
            }
            Ok(all.into_iter())
        })
    }

    /// Watches the keys matching `key` (a key or a wildcard filter such as `prefix.>`): first the latest
    /// revision of each, then every later one.
    pub fn watch(&self, key: impl AsRef<str>) -> io::Result<Watch> {
        let (s, key) = (self.inner.clone(), key.as_ref().to_owned());
        block_on(async move { s.watch_with_history(key).await })
            .map(|w| Watch {
                inner: Arc::new(tokio::sync::Mutex::new(w)),
            })
            .map_err(io_error)
    }
}

fn bytes(v: impl AsRef<[u8]>) -> Bytes {
    Bytes::copy_from_slice(v.as_ref())
}

/// A watch of [`Store::watch`]; as an iterator it yields entries and ends after [`WATCH_WAIT`] without one (or
/// on an error).
pub struct Watch {
    inner: Arc<tokio::sync::Mutex<async_nats::jetstream::kv::Watch>>,
}

impl Iterator for Watch {
    type Item = Entry;

    fn next(&mut self) -> Option<Entry> {
        let w = self.inner.clone();
        block_on(async move { tokio::time::timeout(WATCH_WAIT, w.lock().await.next()).await })
            .ok()
            .flatten()
            .and_then(Result::ok)
            .map(Entry::from)
    }
}
