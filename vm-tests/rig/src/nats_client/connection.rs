//! A blocking core-NATS connection (async-nats underneath): publish with a reply subject and headers, request,
//! subscribe with a bounded wait for the next message, flush.

use super::runtime::{block_on, io_error};
use async_nats::HeaderMap;
use bytes::Bytes;
use futures::StreamExt;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Time-out of [`Connection::request`] and [`Connection::flush`] (async-nats's default request time-out).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// A connection; clones share it.
#[derive(Clone)]
pub struct Connection {
    client: async_nats::Client,
}

/// A received message.
#[derive(Clone, Debug)]
pub struct Message {
    /// The connection it came on (for [`Self::respond`]).
    client: async_nats::Client,
    /// The subject it was published to.
    pub subject: String,
    /// Its reply subject.
    pub reply: Option<String>,
    /// Its payload.
    pub data: Vec<u8>,
    /// Its headers (and the status of a no-responders or JetStream answer).
    pub headers: Option<HeaderMap>,
}

impl Message {
    fn new(client: async_nats::Client, m: async_nats::Message) -> Self {
        Self {
            client,
            subject: m.subject.to_string(),
            reply: m.reply.map(|r| r.to_string()),
            data: m.payload.to_vec(),
            headers: m.headers,
        }
    }

    /// Publishes `data` to the message's reply subject (an error when it has none).
    pub fn respond(&self, data: impl AsRef<[u8]>) -> io::Result<()> {
        let reply = self.reply.clone().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "the message has no reply subject",
            )
        })?;
        Connection::new(self.client.clone()).publish(&reply, data)
    }
}

impl Connection {
    pub(crate) fn new(client: async_nats::Client) -> Self {
        Self { client }
    }

    /// The async-nats client (for the JetStream layer).
    pub(crate) fn client(&self) -> &async_nats::Client {
        &self.client
    }

    /// A new unique inbox subject (`_INBOX.<random>`).
    pub fn new_inbox(&self) -> String {
        self.client.new_inbox()
    }

    /// Publishes `data` to `subject`.
    pub fn publish(&self, subject: &str, data: impl AsRef<[u8]>) -> io::Result<()> {
        self.publish_with_reply_or_headers(subject, None, None, data)
    }

    /// Publishes `data` to `subject` with the reply subject `reply`.
    pub fn publish_request(
        &self,
        subject: &str,
        reply: &str,
        data: impl AsRef<[u8]>,
    ) -> io::Result<()> {
        self.publish_with_reply_or_headers(subject, Some(reply), None, data)
    }

    /// Publishes `data` to `subject`, with a reply subject and headers when given.
    pub fn publish_with_reply_or_headers(
        &self,
        subject: &str,
        reply: Option<&str>,
        headers: Option<&HeaderMap>,
        data: impl AsRef<[u8]>,
    ) -> io::Result<()> {
        let c = self.client.clone();
        let (subject, reply) = (subject.to_owned(), reply.map(str::to_owned));
        let headers = headers.cloned();
        let data = Bytes::copy_from_slice(data.as_ref());
        block_on(async move {
            match (reply, headers) {
                (None, None) => c.publish(subject, data).await,
                (None, Some(h)) => c.publish_with_headers(subject, h, data).await,
                (Some(r), None) => c.publish_with_reply(subject, r, data).await,
                (Some(r), Some(h)) => c.publish_with_reply_and_headers(subject, r, h, data).await,
            }
        })
        .map_err(io_error)
    }

    /// A request on a new inbox, answered within [`DEFAULT_TIMEOUT`].
    pub fn request(&self, subject: &str, data: impl AsRef<[u8]>) -> io::Result<Message> {
        self.request_timeout(subject, data, DEFAULT_TIMEOUT)
    }

    /// A request on a new inbox, answered within `timeout`.
    pub fn request_timeout(
        &self,
        subject: &str,
        data: impl AsRef<[u8]>,
        timeout: Duration,
    ) -> io::Result<Message> {
        let c = self.client.clone();
        let subject = subject.to_owned();
        let req = async_nats::Request::new()
            .payload(Bytes::copy_from_slice(data.as_ref()))
            .timeout(Some(timeout));
        let client = self.client.clone();
        block_on(async move { c.send_request(subject, req).await })
            .map(|m| Message::new(client, m))
            .map_err(io_error)
    }

    /// Subscribes to `subject`.
    pub fn subscribe(&self, subject: &str) -> io::Result<Subscription> {
        let c = self.client.clone();
        let subject = subject.to_owned();
        block_on(async move { c.subscribe(subject).await })
            .map(|s| Subscription {
                client: self.client.clone(),
                inner: Arc::new(tokio::sync::Mutex::new(s)),
            })
            .map_err(io_error)
    }

    /// Writes out everything published so far, within [`DEFAULT_TIMEOUT`].
    pub fn flush(&self) -> io::Result<()> {
        self.flush_timeout(DEFAULT_TIMEOUT)
    }

    /// Writes out everything published so far, within `timeout`. Unlike the blocking `nats` 0.26 client this
    /// replaced, async-nats's flush ends when the bytes are written, not at the server's PONG.
    pub fn flush_timeout(&self, timeout: Duration) -> io::Result<()> {
        let c = self.client.clone();
        match block_on(async move { tokio::time::timeout(timeout, c.flush()).await }) {
            Ok(r) => r.map_err(io_error),
            Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "flush timed out")),
        }
    }
}

/// A subscription; dropping it unsubscribes.
pub struct Subscription {
    client: async_nats::Client,
    inner: Arc<tokio::sync::Mutex<async_nats::Subscriber>>,
}

impl Subscription {
    /// The next message, waiting at most `timeout` (`TimedOut` then).
    pub fn next_timeout(&self, timeout: Duration) -> io::Result<Message> {
        let s = self.inner.clone();
        match block_on(async move { tokio::time::timeout(timeout, s.lock().await.next()).await }) {
            Ok(Some(m)) => Ok(Message::new(self.client.clone(), m)),
            Ok(None) => Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "subscription ended",
            )),
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "next_timeout: timed out",
            )),
        }
    }

    /// Unsubscribes.
    pub fn unsubscribe(&self) -> io::Result<()> {
        let s = self.inner.clone();
        block_on(async move { s.lock().await.unsubscribe().await }).map_err(io_error)
    }

    /// Calls `f` on every message from a thread of its own until the returned [`Handler`] is dropped (then
    /// within [`HANDLER_POLL`]) or the subscription ends.
    pub fn with_handler(self, f: impl Fn(Message) -> io::Result<()> + Send + 'static) -> Handler {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        std::thread::spawn(move || {
            while !stopped.load(Ordering::SeqCst) {
                match self.next_timeout(HANDLER_POLL) {
                    Ok(m) => {
                        let _ = f(m);
                    }
                    Err(e) if e.kind() == io::ErrorKind::TimedOut => {}
                    Err(_) => break,
                }
            }
        });
        Handler { stop }
    }
}

/// How often a [`Subscription::with_handler`] thread looks whether its handler was dropped.
pub const HANDLER_POLL: Duration = Duration::from_millis(200);

/// The handler thread of [`Subscription::with_handler`]; dropping it stops the thread (and unsubscribes).
pub struct Handler {
    stop: Arc<AtomicBool>,
}

impl Drop for Handler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}
