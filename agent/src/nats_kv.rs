//! The NATS side: connection with bounded attempts in a retry window, the required KV buckets (opened, never
//! created), bounded-time get and put, and a key watch that is re-created after every reconnect.
//!
//! The blocking `nats` crate is deprecated upstream; this module is the only place that uses it.
#![allow(deprecated)]

use crate::config::{NatsAuth, NatsConfig};
use nats::jetstream::{JetStream, PublishOptions, SubscribeOptions};
use nats::kv::Store;
use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Time-out of one KV put (publish with acknowledgement).
pub const PUT_TIMEOUT: Duration = Duration::from_secs(5);

/// A connected client with its JetStream context.
#[derive(Clone)]
pub struct Nats {
    conn: nats::Connection,
    js: JetStream,
    /// Increases on every reconnect, so watches re-create their consumers.
    reconnects: Arc<AtomicU64>,
}

/// A key's current value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// The key holds `bytes`.
    Put(Vec<u8>),
    /// The key was deleted or purged, or never existed.
    Absent,
}

/// A change seen by a watch or read by a get, with the stream revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// Stream sequence (0 when the key never existed).
    pub revision: u64,
    /// The value.
    pub value: Value,
}

/// Why the agent could not get going with NATS.
#[derive(Debug, thiserror::Error)]
pub enum NatsError {
    /// No connection within the retry window.
    #[error("could not connect to NATS at {urls} within {window:?} (last error: {last})")]
    Connect {
        /// The servers.
        urls: String,
        /// The retry window.
        window: Duration,
        /// The last attempt's error.
        last: String,
    },
    /// A required bucket could not be opened.
    #[error("KV bucket {bucket} cannot be opened: {message} (the operator creates the buckets; check that it ran)")]
    Bucket {
        /// The bucket.
        bucket: String,
        /// Why.
        message: String,
    },
    /// A required bucket does not exist (yet): nobody has created the buckets on this server.
    #[error("KV bucket {bucket} does not exist (create the buckets: `fleet-operator buckets`, docs/device-setup.md)")]
    BucketMissing {
        /// The bucket.
        bucket: String,
    },
}

impl Nats {
    /// Connects: attempts of at most `connect_timeout` each, repeated until `retry_window` has passed.
    pub fn connect(cfg: &NatsConfig, client_name: &str) -> Result<Nats, NatsError> {
        let started = Instant::now();
        let urls = cfg.urls.join(",");
        let mut last;
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let reconnects = Arc::new(AtomicU64::new(0));
            match Self::attempt(cfg, client_name, &urls, reconnects.clone()) {
                Ok(conn) => {
                    log::info!("connected to NATS ({urls}) on attempt {attempt}");
                    let js = nats::jetstream::new(conn.clone());
                    return Ok(Nats {
                        conn,
                        js,
                        reconnects,
                    });
                }
                Err(e) => {
                    last = e;
                    log::warn!("NATS connection attempt {attempt} to {urls} failed: {last}");
                }
            }
            let elapsed = started.elapsed();
            if elapsed >= cfg.retry_window {
                return Err(NatsError::Connect {
                    urls,
                    window: cfg.retry_window,
                    last,
                });
            }
            let pause = Duration::from_secs(2)
                .min(cfg.retry_window - elapsed)
                .max(Duration::from_millis(100));
            std::thread::sleep(pause);
        }
    }

    fn attempt(
        cfg: &NatsConfig,
        client_name: &str,
        urls: &str,
        reconnects: Arc<AtomicU64>,
    ) -> Result<nats::Connection, String> {
        let opts = match &cfg.auth {
            NatsAuth::None => nats::Options::new(),
            NatsAuth::UserPassword { user, password } => {
                nats::Options::with_user_pass(user, password.expose())
            }
            NatsAuth::Token(t) => nats::Options::with_token(t.expose()),
        };
        let opts = opts
            .with_name(client_name)
            .max_reconnects(None)
            .reconnect_callback(move || {
                reconnects.fetch_add(1, Ordering::SeqCst);
                log::info!("reconnected to NATS");
            })
            .disconnect_callback(|| log::warn!("disconnected from NATS; reconnecting"));
        // The client has no connect time-out of its own: bound the attempt from outside. A late success of an
        // abandoned attempt is dropped (and so closed) by its thread.
        let (tx, rx) = mpsc::channel();
        let urls = urls.to_owned();
        std::thread::Builder::new()
            .name("nats-connect".into())
            .spawn(move || {
                let r = opts.connect(urls.as_str()).map_err(|e| e.to_string());
                let _ = tx.send(r);
            })
            .map_err(|e| e.to_string())?;
        match rx.recv_timeout(cfg.connect_timeout) {
            Ok(r) => r,
            Err(_) => Err(format!("no connection within {:?}", cfg.connect_timeout)),
        }
    }

    /// Opens every bucket in `names`; the first missing one is an error naming it.
    pub fn open_buckets(&self, names: &[&str]) -> Result<Buckets, NatsError> {
        let mut stores = BTreeMap::new();
        for name in names {
            let store = self.js.key_value(name).map_err(|e| {
                // The server's "stream not found" (JetStream error 10059): the bucket's stream does not exist.
                let missing = e
                    .get_ref()
                    .and_then(|r| r.downcast_ref::<nats::jetstream::Error>())
                    .is_some_and(|j| j.error_code() == nats::jetstream::ErrorCode::StreamNotFound);
                if missing {
                    NatsError::BucketMissing {
                        bucket: (*name).to_owned(),
                    }
                } else {
                    NatsError::Bucket {
                        bucket: (*name).to_owned(),
                        message: e.to_string(),
                    }
                }
            })?;
            stores.insert((*name).to_owned(), store);
        }
        Ok(Buckets {
            nats: self.clone(),
            stores,
        })
    }

    /// Flushes pending writes to the server within `timeout`.
    pub fn flush(&self, timeout: Duration) -> io::Result<()> {
        self.conn.flush_timeout(timeout)
    }

    /// How many times the client has reconnected.
    pub fn reconnect_count(&self) -> u64 {
        self.reconnects.load(Ordering::SeqCst)
    }
}

/// The opened buckets.
#[derive(Clone)]
pub struct Buckets {
    nats: Nats,
    stores: BTreeMap<String, Store>,
}

fn store_missing(bucket: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("bucket {bucket} was not opened"),
    )
}

impl Buckets {
    /// Reads `key` (bounded by the client's 5 s JetStream request time-out).
    pub fn get(&self, bucket: &str, key: &str) -> io::Result<Change> {
        let store = self
            .stores
            .get(bucket)
            .ok_or_else(|| store_missing(bucket))?;
        Ok(match store.entry(key)? {
            None => Change {
                revision: 0,
                value: Value::Absent,
            },
            Some(e) => Change {
                revision: e.revision,
                value: match e.operation {
                    nats::kv::Operation::Put => Value::Put(e.value),
                    _ => Value::Absent,
                },
            },
        })
    }

    /// Writes `key` and waits (at most [`PUT_TIMEOUT`]) for JetStream's acknowledgement; returns the revision.
    pub fn put(&self, bucket: &str, key: &str, value: &[u8]) -> io::Result<u64> {
        if !self.stores.contains_key(bucket) {
            return Err(store_missing(bucket));
        }
        let opts = PublishOptions {
            timeout: Some(PUT_TIMEOUT),
            ..Default::default()
        };
        let ack =
            self.nats
                .js
                .publish_with_options(&format!("$KV.{bucket}.{key}"), value, &opts)?;
        Ok(ack.sequence)
    }

    /// Creates a filtered consumer on `key` (an ordered push consumer, as a KV watch) and drops it: what the
    /// probe checks.
    pub fn probe_consumer(&self, bucket: &str, key: &str) -> io::Result<()> {
        let sub = self.subscribe(bucket, key)?;
        sub.unsubscribe()
    }

    fn subscribe(&self, bucket: &str, key: &str) -> io::Result<nats::jetstream::PushSubscription> {
        if !self.stores.contains_key(bucket) {
            return Err(store_missing(bucket));
        }
        self.nats.js.subscribe_with_options(
            &format!("$KV.{bucket}.{key}"),
            &SubscribeOptions::ordered()
                .deliver_last_per_subject()
                .enable_flow_control()
                .idle_heartbeat(Duration::from_secs(5)),
        )
    }

    /// Watches `key` on a thread: every change is passed to `send` until it returns false or `stop` is set. The
    /// consumer is re-created after each reconnect (a restarted server may have lost it); callers still re-read
    /// the key periodically, so a missed change is only late, never lost.
    pub fn watch(
        &self,
        bucket: &str,
        key: &str,
        stop: Arc<AtomicBool>,
        send: impl Fn(Change) -> bool + Send + 'static,
    ) -> io::Result<std::thread::JoinHandle<()>> {
        self.watch_keys(bucket, key, stop, move |_, c| send(c))
    }

    /// Like [`Self::watch`] for a key filter such as `<device-id>.>`: every current key's latest value first
    /// (so nothing written before the watch is missed), then every change, each with its key.
    pub fn watch_keys(
        &self,
        bucket: &str,
        key: &str,
        stop: Arc<AtomicBool>,
        send: impl Fn(String, Change) -> bool + Send + 'static,
    ) -> io::Result<std::thread::JoinHandle<()>> {
        let this = self.clone();
        let (bucket, key) = (bucket.to_owned(), key.to_owned());
        std::thread::Builder::new()
            .name(format!("watch-{bucket}"))
            .spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    let epoch = this.nats.reconnect_count();
                    let sub = match this.subscribe(&bucket, &key) {
                        Ok(s) => s,
                        Err(e) => {
                            log::debug!("watch {bucket}/{key}: {e}; retrying");
                            std::thread::sleep(Duration::from_secs(1));
                            continue;
                        }
                    };
                    loop {
                        if stop.load(Ordering::SeqCst) {
                            let _ = sub.unsubscribe();
                            return;
                        }
                        if this.nats.reconnect_count() != epoch {
                            let _ = sub.unsubscribe();
                            break;
                        }
                        let Ok(msg) = sub.next_timeout(Duration::from_millis(500)) else {
                            continue;
                        };
                        let Some(info) = msg.jetstream_message_info() else {
                            continue;
                        };
                        let revision = info.stream_seq;
                        let op = msg
                            .headers
                            .as_ref()
                            .and_then(|h| h.get("KV-Operation").cloned());
                        let value = match op.as_deref() {
                            Some("DEL") | Some("PURGE") => Value::Absent,
                            _ => Value::Put(msg.data.clone()),
                        };
                        let prefix = format!("$KV.{bucket}.");
                        let Some(k) = msg.subject.strip_prefix(prefix.as_str()) else {
                            continue;
                        };
                        if !send(k.to_owned(), Change { revision, value }) {
                            let _ = sub.unsubscribe();
                            return;
                        }
                    }
                }
            })
    }
}
