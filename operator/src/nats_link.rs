//! The operator's one NATS connection, shared by the deployments controller, the TaskRun controller, the refusal
//! reports and the dashboard: made on first use, then kept for the life of the process.
//!
//! async-nats reconnects a connection by itself, without limit (and fails over between a cluster's nodes), so a
//! lost server costs each user only its watches, which it opens again on this same connection. One connection per
//! operator keeps the server's client count at one per replica, and a 100,000-device fleet's watches and writes on
//! one socket's buffers, not one connection per controller.

use crate::kv::{self, Mirror, NatsError};
use async_nats::jetstream;
use async_nats::jetstream::kv::Store;
use serde::de::DeserializeOwned;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::Notify;

/// The shared connection, made by `main` (or by a controller run alone, in tests) and handed to every user.
pub struct NatsLink {
    url: String,
    settings: kv::NatsSettings,
    client: tokio::sync::Mutex<Option<async_nats::Client>>,
    /// Times the connection was lost or a subscription of it dropped messages ([`Self::interruptions`]).
    interruptions: Arc<AtomicU64>,
}

impl NatsLink {
    /// A link to `url` (see [`kv::connect`]: a comma-separated node list, `user:password@` credentials) with
    /// `settings` (its TLS, and how its users make the buckets); nothing connects until the first
    /// [`Self::connect`].
    pub fn new(url: impl Into<String>, settings: kv::NatsSettings) -> Arc<Self> {
        Arc::new(Self {
            url: url.into(),
            settings,
            client: tokio::sync::Mutex::new(None),
            interruptions: Arc::default(),
        })
    }

    /// How many times the connection was lost, or a subscription of it dropped messages (a slow consumer), so
    /// far. A user that saw another count when it opened its watches opens them again: the server went away (a
    /// node of a cluster lost, a leader moved) or a watch missed changes, and a watch read anew from the current
    /// values is the one sure way back, as with a new connection.
    pub fn interruptions(&self) -> u64 {
        self.interruptions.load(Ordering::SeqCst)
    }

    /// How the buckets are made ([`kv::ensure_buckets`]).
    pub fn buckets(&self) -> &kv::Buckets {
        &self.settings.buckets
    }

    /// The URL without its credentials, for logs.
    pub fn display_url(&self) -> String {
        fleet_wire::auth::split_nats_url(&self.url).url
    }

    /// The connection and a JetStream context on it. The first call connects (failing fast when the server does
    /// not answer: the caller retries); every later call returns the same connection, whether or not it is
    /// connected at this moment (its users see that in their requests and in `connection_state`).
    pub async fn connect(&self) -> Result<(async_nats::Client, jetstream::Context), NatsError> {
        let mut slot = self.client.lock().await;
        let client = match slot.as_ref() {
            Some(c) => c.clone(),
            None => {
                let count = self.interruptions.clone();
                let (c, _) = kv::connect_with(&self.url, &self.settings.tls, |opts| {
                    opts.event_callback(move |event| {
                        if matches!(
                            event,
                            async_nats::Event::Disconnected | async_nats::Event::SlowConsumer(_)
                        ) {
                            count.fetch_add(1, Ordering::SeqCst);
                        }
                        async {}
                    })
                })
                .await?;
                log::info!("NATS connection to {} made", self.display_url());
                *slot = Some(c.clone());
                c
            }
        };
        let js = jetstream::new(client.clone());
        Ok((client, js))
    }
}

/// One controller's use of the connection: its buckets and the tasks (watches, listeners) that live as long as
/// it. [`Self::broken`] says when to drop it and open another; dropping it stops its tasks.
pub struct Link {
    /// The connection.
    pub client: async_nats::Client,
    /// [`NatsLink::interruptions`] when it was opened.
    interruptions: u64,
    stores: BTreeMap<&'static str, Store>,
    tasks: Vec<tokio::task::JoinHandle<NatsError>>,
}

impl Drop for Link {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// What [`Link::keep`] found.
pub enum Kept {
    /// The link was good.
    Same,
    /// A new link was opened (the first, or after a loss): views read from the old one are stale.
    Opened,
    /// There is no link: NATS could not be reached (the error, for the status).
    Failed(String),
}

impl Link {
    /// A controller's reconnect step, at the top of each pass: drops `slot`'s link when it is broken and opens
    /// one with `open` when there is none. `who` prefixes the log lines.
    pub async fn keep<F: std::future::Future<Output = Result<Link, NatsError>>>(
        slot: &mut Option<Link>,
        nats: &NatsLink,
        who: &str,
        open: impl FnOnce() -> F,
    ) -> Kept {
        if let Some(why) = slot.as_ref().and_then(|l| l.broken(nats)) {
            log::warn!("{who}: NATS link lost ({why}); reconnecting");
            *slot = None;
        }
        if slot.is_some() {
            return Kept::Same;
        }
        match open().await {
            Ok(l) => {
                *slot = Some(l);
                Kept::Opened
            }
            Err(e) => {
                log::warn!("{who}: {e}");
                Kept::Failed(e.to_string())
            }
        }
    }

    /// Connects (or takes the shared connection) and opens every bucket of the layout.
    pub async fn open(nats: &NatsLink) -> Result<Self, NatsError> {
        let interruptions = nats.interruptions();
        let (client, js) = nats.connect().await?;
        let stores = kv::ensure_buckets(&js, nats.buckets()).await?;
        Ok(Self {
            client,
            interruptions,
            stores,
            tasks: vec![],
        })
    }

    /// Feeds `mirror` from a watch of its own bucket, waking `notify` on every change.
    pub fn watch<T: DeserializeOwned + Clone + Send + Sync + 'static>(
        &mut self,
        mirror: &Arc<Mirror<T>>,
        notify: &Arc<Notify>,
    ) -> Result<(), NatsError> {
        let store = self.store(mirror.bucket())?.clone();
        self.spawn(mirror.clone().run(store, notify.clone()));
        Ok(())
    }

    /// Runs `task` as long as the link; its end (its error) breaks the link.
    pub fn spawn(&mut self, task: impl std::future::Future<Output = NatsError> + Send + 'static) {
        self.tasks.push(tokio::spawn(task));
    }

    /// A bucket of the layout.
    pub fn store(&self, bucket: &str) -> Result<&Store, NatsError> {
        self.stores.get(bucket).ok_or_else(|| NatsError {
            op: format!("open bucket {bucket}"),
            message: "not in the layout".into(),
        })
    }

    /// Why the link is no good any more, if it is not: a task ended, or the connection was lost since it was
    /// opened (watches read anew from the current values are the sure way back).
    pub fn broken(&self, nats: &NatsLink) -> Option<String> {
        if self.tasks.iter().any(|t| t.is_finished()) {
            return Some("a KV watch ended".into());
        }
        if nats.interruptions() != self.interruptions {
            return Some("the connection was interrupted".into());
        }
        match self.client.connection_state() {
            async_nats::connection::State::Connected => None,
            s => Some(format!("connection {s}")),
        }
    }
}
