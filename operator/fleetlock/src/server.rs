//! The server: shared state, the accept loop with bounded connections and time-outs, and config reloading.

use super::config::Config;
use super::conns::{ClientConns, Refusal};
use super::http;
use super::metrics::Metrics;
use super::store::Store;
use super::tls::{CertReloader, Listener};
use fleet_wire::Timestamp;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::net::TcpListener;

/// Most connections served at once; more are closed right away (and at most `max_connections_per_client` of
/// them from one client).
pub const MAX_CONNECTIONS: usize = 4096;
/// Largest buffered request head (request line + headers), in bytes.
pub const MAX_HEAD_BYTES: usize = 16 * 1024;
/// How often the config file is checked for changes.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(1);

/// Everything a request handler needs.
pub struct App {
    config: RwLock<Arc<Config>>,
    config_error: RwLock<Option<String>>,
    /// The lock store.
    pub store: Store,
    /// Counters.
    pub metrics: Metrics,
    /// When the server started (`/v1/status`: its history covers the time since).
    pub started_at: Timestamp,
    /// Open connections per client and refusals.
    pub conns: Arc<ClientConns>,
}

impl App {
    /// A new app with a valid config and an opened store. Its start time is now: every request, hence every
    /// change in the store's history, comes after.
    pub fn new(config: Config, store: Store) -> Self {
        Self {
            config: RwLock::new(Arc::new(config)),
            config_error: RwLock::new(None),
            store,
            metrics: Metrics::default(),
            started_at: Timestamp::now(),
            conns: Arc::new(ClientConns::default()),
        }
    }

    /// The config in force (the last good one).
    pub fn config(&self) -> Arc<Config> {
        self.config
            .read()
            .map(|c| c.clone())
            .unwrap_or_else(|p| p.into_inner().clone())
    }

    /// Why the config file on disk was rejected, if it was.
    pub fn config_error(&self) -> Option<String> {
        self.config_error.read().ok().and_then(|e| e.clone())
    }

    fn set_config(&self, c: Config) {
        if let Ok(mut g) = self.config.write() {
            *g = Arc::new(c);
        }
        if let Ok(mut e) = self.config_error.write() {
            *e = None;
        }
    }

    fn set_error(&self, why: String) {
        if let Ok(mut e) = self.config_error.write() {
            *e = Some(why);
        }
    }
}

/// Loads the config (defaults when `path` is `None`), opens the store, binds `listen` and serves HTTPS (or plain
/// HTTP, when `mode` says so) until SIGTERM or SIGINT.
pub async fn run(listen: SocketAddr, path: Option<PathBuf>, mode: Listener) -> Result<(), String> {
    // Certificate problems are reported before anything else starts.
    let tls = match &mode {
        Listener::Https(files) => Some(Arc::new(CertReloader::new(files.clone())?)),
        Listener::PlainHttp => None,
    };
    let config = match &path {
        Some(p) => Config::load(p).map_err(|e| format!("config {}: {e}", p.display()))?,
        None => Config::default(),
    };
    let store = Store::open(&config.store).await?;
    log::info!(
        "fleetlock-server: {} store, {} group(s) besides default, listening on {listen} ({})",
        store.kind(),
        config.groups.len(),
        if tls.is_some() { "HTTPS" } else { "plain HTTP" }
    );
    if tls.is_none() && (config.auth.clients_need_auth() || !config.auth.admin_tokens.is_empty()) {
        log::warn!(
            "credentials are configured but the listener is plain HTTP: tokens and passwords cross the network \
             readable. Serve HTTPS with --tls-cert and --tls-key (docs/fleetlock.md)"
        );
    }
    for w in config.warnings() {
        let anyone = match listen.ip().is_unspecified() {
            true => format!(" (listening on all addresses, {listen})"),
            false => String::new(),
        };
        log::warn!(
            "{w}{anyone}. Set auth.tokens (or auth.basic) in the config, or --listen on an address only the fleet \
             reaches (docs/fleetlock.md)"
        );
    }
    let app = Arc::new(App::new(config, store));
    if let Some(p) = path {
        tokio::spawn(watch_config(app.clone(), p));
    }
    let acceptor = match &tls {
        Some(r) => {
            tokio::spawn(watch_cert(r.clone()));
            Some(tokio_rustls::TlsAcceptor::from(Arc::new(
                r.server_config()?,
            )))
        }
        None => None,
    };
    let listener = TcpListener::bind(listen)
        .await
        .map_err(|e| format!("listen on {listen}: {e}"))?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| e.to_string())?;
    tokio::select! {
        r = serve(listener, app, acceptor) => r,
        _ = term.recv() => { log::info!("SIGTERM: stopping"); Ok(()) }
        _ = tokio::signal::ctrl_c() => { log::info!("SIGINT: stopping"); Ok(()) }
    }
}

/// Serves connections from `listener` forever, over TLS when `tls` is given.
pub async fn serve(
    listener: TcpListener,
    app: Arc<App>,
    tls: Option<tokio_rustls::TlsAcceptor>,
) -> Result<(), String> {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                // Out of file descriptors and similar: back off instead of spinning.
                log::warn!("accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // A refused connection is dropped here: closed at once, before a byte is read.
        let cap = app.config().max_connections_per_client;
        let Some(client) = app.conns.try_open(peer.ip(), cap) else {
            app.conns
                .refused(Refusal::PerClient, peer.ip(), cap, MAX_CONNECTIONS);
            continue;
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            app.conns
                .refused(Refusal::Total, peer.ip(), cap, MAX_CONNECTIONS);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        let timeout = app.config().client_timeout;
        let tls = tls.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| http::handle(app.clone(), peer, req));
            let http = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(timeout)
                .max_buf_size(MAX_HEAD_BYTES)
                .clone();
            let result = match tls {
                None => http.serve_connection(TokioIo::new(stream), svc).await,
                // The handshake gets the same time as a request head: a silent client cannot hold a slot.
                Some(acceptor) => {
                    match tokio::time::timeout(timeout, acceptor.accept(stream)).await {
                        Ok(Ok(s)) => http.serve_connection(TokioIo::new(s), svc).await,
                        Ok(Err(e)) => {
                            log::debug!("TLS handshake from {peer}: {e}");
                            Ok(())
                        }
                        Err(_) => {
                            log::debug!(
                                "TLS handshake from {peer}: no handshake within {timeout:?}"
                            );
                            Ok(())
                        }
                    }
                }
            };
            if let Err(e) = result {
                log::debug!("connection from {peer}: {e}");
            }
            drop(permit);
            drop(client);
        });
    }
}

/// Re-reads the config file when its content changes; an invalid file keeps the last good config.
async fn watch_config(app: Arc<App>, path: PathBuf) {
    let mut last = read(&path);
    loop {
        tokio::time::sleep(RELOAD_INTERVAL).await;
        let now = read(&path);
        if now == last {
            continue;
        }
        last = now.clone();
        match now.and_then(|t| Config::parse(&t)) {
            Ok(mut c) => {
                let old = app.config();
                if c.store != old.store {
                    log::warn!(
                        "config {}: the store changed; that takes a restart, the running store stays",
                        path.display()
                    );
                    c.store = old.store.clone();
                }
                log::info!(
                    "config {}: reloaded ({} groups)",
                    path.display(),
                    c.groups.len()
                );
                app.set_config(c);
            }
            Err(e) => {
                log::error!(
                    "config {}: invalid, keeping the last good config: {e}",
                    path.display()
                );
                app.metrics
                    .reload_failures
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                app.set_error(e);
            }
        }
    }
}

/// Re-reads the certificate and key every [`RELOAD_INTERVAL`]; a rotated pair is served from the next handshake.
async fn watch_cert(reloader: Arc<CertReloader>) {
    loop {
        tokio::time::sleep(RELOAD_INTERVAL).await;
        let r = reloader.clone();
        match tokio::task::spawn_blocking(move || r.reload()).await {
            Ok(Ok(true)) => log::info!("TLS certificate reloaded from disk"),
            Ok(Ok(false)) => {}
            Ok(Err(e)) => log::error!("{e}; the last good certificate stays in use"),
            Err(e) => log::error!("TLS certificate reload: {e}"),
        }
    }
}

fn read(path: &Path) -> Result<String, String> {
    super::config::read_bounded(path)
}
