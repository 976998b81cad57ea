//! The operator's one NATS connection, shared by the deployments controller, the TaskRun controller, the refusal
//! reports and the dashboard: made on first use, then kept for the life of the process.
//!
//! async-nats reconnects a connection by itself, without limit (and fails over between a cluster's nodes), so a
//! lost server costs each user only its watches, which it opens again on this same connection. One connection per
//! operator keeps the server's client count at one per replica, and a 100,000-device fleet's watches and writes on
//! one socket's buffers (issue 32, point 3).

use crate::kv::{self, NatsError};
use async_nats::jetstream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

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
