//! The operator's one NATS connection, shared by the deployments controller, the TaskRun controller, the refusal
//! reports and the dashboard: made on first use, then kept for the life of the process.
//!
//! async-nats reconnects a connection by itself, without limit (and fails over between a cluster's nodes), so a
//! lost server costs each user only its watches, which it opens again on this same connection. One connection per
//! operator keeps the server's client count at one per replica, and a 100,000-device fleet's watches and writes on
//! one socket's buffers (issue 32, point 3).

use crate::kv::{self, NatsError};
use async_nats::jetstream;
use std::sync::Arc;

/// The shared connection, made by `main` (or by a controller run alone, in tests) and handed to every user.
pub struct NatsLink {
    url: String,
    client: tokio::sync::Mutex<Option<async_nats::Client>>,
}

impl NatsLink {
    /// A link to `url` (see [`kv::connect`]: a comma-separated node list, `user:password@` credentials); nothing
    /// connects until the first [`Self::connect`].
    pub fn new(url: impl Into<String>) -> Arc<Self> {
        Arc::new(Self {
            url: url.into(),
            client: tokio::sync::Mutex::new(None),
        })
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
                let (c, _) = kv::connect(&self.url).await?;
                log::info!("NATS connection to {} made", self.display_url());
                *slot = Some(c.clone());
                c
            }
        };
        let js = jetstream::new(client.clone());
        Ok((client, js))
    }
}
