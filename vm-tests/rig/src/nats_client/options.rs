//! How a test connects: credentials, TLS, a name, reconnect attempts and callbacks for server errors,
//! disconnects and the close of the connection (async-nats's event callback, split the way the tests use it).

use super::connection::Connection;
use super::runtime::{block_on, error_text};
use async_nats::{ConnectOptions, Event, ServerAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

type Callback = Arc<dyn Fn() + Send + Sync>;
type ErrorCallback = Arc<dyn Fn(String) + Send + Sync>;

/// Connection options (a builder); [`Self::connect`] makes the connection.
#[derive(Default)]
pub struct Options {
    token: Option<String>,
    user_pass: Option<(String, String)>,
    name: Option<String>,
    tls_required: bool,
    root: Option<PathBuf>,
    client_cert: Option<(PathBuf, PathBuf)>,
    max_reconnects: Option<usize>,
    on_error: Option<ErrorCallback>,
    on_disconnect: Option<Callback>,
    on_close: Option<Callback>,
}

impl Options {
    /// No credentials.
    pub fn new() -> Self {
        Self::default()
    }

    /// A token in CONNECT (a device token through the auth callout).
    pub fn with_token(token: &str) -> Self {
        Self {
            token: Some(token.to_owned()),
            ..Self::default()
        }
    }

    /// A user and password.
    pub fn with_user_pass(user: &str, password: &str) -> Self {
        Self {
            user_pass: Some((user.to_owned(), password.to_owned())),
            ..Self::default()
        }
    }

    /// The connection's name as the server shows it (`/connz`).
    pub fn with_name(mut self, name: &str) -> Self {
        self.name = Some(name.to_owned());
        self
    }

    /// TLS is required (no plain connection).
    pub fn tls_required(mut self, required: bool) -> Self {
        self.tls_required = required;
        self
    }

    /// Trusts only the CA in `ca_file` (PEM).
    pub fn add_root_certificate(mut self, ca_file: impl AsRef<Path>) -> Self {
        self.root = Some(ca_file.as_ref().to_owned());
        self
    }

    /// Shows this client certificate and key (PEM files).
    pub fn client_cert(mut self, cert: impl AsRef<Path>, key: impl AsRef<Path>) -> Self {
        self.client_cert = Some((cert.as_ref().to_owned(), key.as_ref().to_owned()));
        self
    }

    /// Connection attempts at most, the first included (async-nats counts the same way).
    pub fn max_reconnects(mut self, attempts: usize) -> Self {
        self.max_reconnects = Some(attempts);
        self
    }

    /// Called with the text of every server error (`-ERR`, such as a permissions violation) and client error.
    pub fn error_callback(mut self, f: impl Fn(String) + Send + Sync + 'static) -> Self {
        self.on_error = Some(Arc::new(f));
        self
    }

    /// Called when the connection to a server is lost.
    pub fn disconnect_callback(mut self, f: impl Fn() + Send + Sync + 'static) -> Self {
        self.on_disconnect = Some(Arc::new(f));
        self
    }

    /// Called when the client gives up (reconnect attempts spent) or is closed.
    pub fn close_callback(mut self, f: impl Fn() + Send + Sync + 'static) -> Self {
        self.on_close = Some(Arc::new(f));
        self
    }

    /// Connects to `urls` (one URL or a comma-separated list); the error's text on failure.
    pub fn connect(self, urls: &str) -> std::io::Result<Connection> {
        let addrs = urls
            .split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .map(|u| u.parse::<ServerAddr>())
            .collect::<std::io::Result<Vec<_>>>()?;
        let mut o = match (self.token, self.user_pass) {
            (Some(t), _) => ConnectOptions::with_token(t),
            (None, Some((u, p))) => ConnectOptions::with_user_and_password(u, p),
            (None, None) => ConnectOptions::new(),
        };
        if let Some(n) = self.name {
            o = o.name(n);
        }
        if self.tls_required {
            o = o.require_tls(true);
        }
        if let Some(ca) = self.root {
            o = o.add_root_certificates(ca);
        }
        if let Some((cert, key)) = self.client_cert {
            o = o.add_client_certificate(cert, key);
        }
        if let Some(n) = self.max_reconnects {
            o = o.max_reconnects(n);
        }
        let (on_error, on_disconnect, on_close) =
            (self.on_error, self.on_disconnect, self.on_close);
        o = o.event_callback(move |event| {
            let (on_error, on_disconnect, on_close) =
                (on_error.clone(), on_disconnect.clone(), on_close.clone());
            async move {
                let call = |f: &Option<Callback>| {
                    if let Some(f) = f {
                        f();
                    }
                };
                match event {
                    Event::ServerError(e) => {
                        if let Some(f) = &on_error {
                            f(error_text(&e));
                        }
                    }
                    Event::ClientError(e) => {
                        if let Some(f) = &on_error {
                            f(e.to_string());
                        }
                        if e == async_nats::ClientError::MaxReconnects {
                            call(&on_close);
                        }
                    }
                    Event::Disconnected => call(&on_disconnect),
                    Event::Closed => call(&on_close),
                    _ => {}
                }
            }
        });
        block_on(async move { o.connect(addrs).await })
            .map(Connection::new)
            .map_err(super::runtime::io_error)
    }
}
