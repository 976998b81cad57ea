//! The small blocking core-NATS client of the Harmony Fleet agent: connect (token or user/password, plain or TLS
//! with a private CA and an optional client certificate, several servers tried in turn), publish (with a reply
//! subject and headers), subscribe, next with a time-out, unsubscribe, flush. No JetStream API (the agent's KV
//! layer is its own, over core NATS), no reconnection (a closed connection is reported through
//! [`Options::on_closed`]; the caller makes a new one, with fresh credentials), no async runtime.
//!
//! One thread per connection owns the socket and the TLS session (`conn`); callers hand it encoded frames through
//! a bounded queue and a wake-up (`client`). Every bound is explicit: control lines and messages
//! ([`proto::Limits`], `max_payload` from the server's `INFO`), the send queue ([`Options::max_outbox_bytes`]),
//! each subscription's queue ([`Options::sub_max_msgs`], [`Options::sub_max_bytes`]; a full queue drops and counts,
//! it never blocks the socket), connect ([`Options::connect_timeout`]), flush (its argument, the `PONG`
//! included), and a silent server ([`Options::ping_interval`] × [`Options::max_pings_out`]).

mod client;
mod conn;
mod failure;
pub mod proto;
mod transport;

pub use client::{Client, Message, Subscription};
pub use conn::{connect, ServerAddr};
pub use failure::{tls_problem, TlsProblem};
pub use proto::Headers;
pub use transport::{client_config, TlsOptions};

use std::sync::Arc;
use std::time::Duration;

/// Called once, from the connection's I/O thread, when the connection ends for any reason but the client's own
/// drop; the argument says why.
pub type ClosedCallback = Arc<dyn Fn(&str) + Send + Sync>;

/// Credentials.
#[derive(Clone, Default)]
pub enum Auth {
    /// None.
    #[default]
    None,
    /// A token (`auth_token`; also how a callout JWT is passed).
    Token(String),
    /// User and password.
    UserPassword {
        /// User.
        user: String,
        /// Password.
        password: String,
    },
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret.
        match self {
            Auth::None => f.write_str("None"),
            Auth::Token(_) => f.write_str("Token(…)"),
            Auth::UserPassword { user, .. } => write!(f, "UserPassword({user}, …)"),
        }
    }
}

/// How to connect, and the connection's bounds.
#[derive(Clone)]
pub struct Options {
    /// Servers, tried in turn (`nats://host:port`, `tls://host:port`, `host:port`).
    pub urls: Vec<String>,
    /// The connection's name as the server shows it.
    pub name: String,
    /// Credentials.
    pub auth: Auth,
    /// TLS settings; `Some` means TLS is required (no plain fallback). A `tls://` URL or a server that requires
    /// TLS also starts TLS, then with the system's CAs when this is `None`.
    pub tls: Option<TlsOptions>,
    /// Bound of one connection attempt over all servers.
    pub connect_timeout: Duration,
    /// Keep-alive `PING` after this long without a frame from the server: the I/O thread's only timer, and it
    /// does not fire while replies and messages arrive.
    pub ping_interval: Duration,
    /// Unanswered `PING`s after which the server counts as gone.
    pub max_pings_out: u32,
    /// How long a publish waits for room in the send queue, and how long the server may take none of our bytes.
    pub write_timeout: Duration,
    /// Bytes queued for the I/O thread at most (a single larger frame still goes, alone).
    pub max_outbox_bytes: usize,
    /// Messages queued per subscription at most; more are dropped and counted.
    pub sub_max_msgs: usize,
    /// Payload bytes queued per subscription at most; more are dropped and counted.
    pub sub_max_bytes: usize,
    /// See [`ClosedCallback`].
    pub on_closed: Option<ClosedCallback>,
}

impl Options {
    /// Defaults for `urls` (a comma-separated list is split): 10 s connect, a `PING` after 30 s without a frame from the
    /// server and 2 unanswered ones allowed, 10 s write time-out, 8 MiB send queue, 1024 messages or 16 MiB per subscription.
    pub fn new(urls: &str) -> Options {
        Options {
            urls: urls
                .split(',')
                .map(str::trim)
                .filter(|u| !u.is_empty())
                .map(str::to_owned)
                .collect(),
            name: String::new(),
            auth: Auth::None,
            tls: None,
            connect_timeout: Duration::from_secs(10),
            ping_interval: Duration::from_secs(30),
            max_pings_out: 2,
            write_timeout: Duration::from_secs(10),
            max_outbox_bytes: 8 * 1024 * 1024,
            sub_max_msgs: 1024,
            sub_max_bytes: 16 * 1024 * 1024,
            on_closed: None,
        }
    }
}
