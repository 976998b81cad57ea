//! The daemon: configuration, journal and start-up recovery, the socket, readiness, then serving forever.

use crate::agent_upgrade::probe::Prober;
use crate::agent_upgrade::transaction::{Bounds, Deps, StartError, Updater};
use crate::config::{Config, ConfigError};
use crate::fault::Faults;
use crate::fetch_runner;
use crate::paths::Paths;
use crate::service::Systemctl;
use crate::socket::{self, ServerConfig};
use crate::system::SystemDeps;
use crate::{notify, users};
use fleet_wire::limits::PROBE_TIMEOUT;
use fleet_wire::process_lock::{LockError, ProcessLock};
use std::path::Path;
use std::sync::Arc;

/// Why the daemon did not start, or stopped serving: the message tells the operator what to inspect.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The configuration file.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Another updater holds the process lock (or it cannot be taken).
    #[error(transparent)]
    Lock(#[from] LockError),
    /// The socket's group.
    #[error(transparent)]
    Group(#[from] users::LookupError),
    /// The journals and start-up recovery.
    #[error(transparent)]
    Start(#[from] StartError),
    /// The download helper cannot be set up.
    #[error("{0}")]
    Fetcher(String),
    /// A system call at the edge failed: `<what was being done>: <error>`.
    #[error("{what}: {source}")]
    Io {
        /// What was being done (`cannot create /run/fleet-updater`, `serving <socket>`).
        what: String,
        /// The error.
        source: std::io::Error,
    },
}

/// Context for an I/O error at the daemon's edge: the message says what was being done.
trait Context<T> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T, RunError>;
}

impl<T> Context<T> for std::io::Result<T> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T, RunError> {
        self.map_err(|source| RunError::Io {
            what: what(),
            source,
        })
    }
}

/// Runs the updater with the configuration at `config_path`. Returns only on a start-up error (journal,
/// configuration, socket), with a message that tells the operator what to inspect.
pub fn run(config_path: &Path) -> Result<(), RunError> {
    limit_malloc_arenas();
    let cfg = Config::load(config_path)?;
    let paths = Paths::new(&cfg.root);
    // Before anything is touched: a second updater (started by hand beside the unit's) must neither unlink the
    // live socket nor run recovery against the live transaction. Held until the process exits.
    let lock = take_lock(&paths)?;
    log::info!("holding {}", lock.path().display());
    let allowed_gid = users::group_gid(&cfg.socket_group)?;
    let deps = Deps {
        fetcher: Box::new(
            fetch_runner::production(
                beside_me("fleet-fetch", "agent-upgrade downloads")?,
                &cfg.agent_user,
                cfg.extra_ca_file.as_deref(),
            )
            .map_err(RunError::Fetcher)?
            .with_max_bytes_per_sec(cfg.download_max_bytes_per_sec),
        ),
        services: Arc::new(Systemctl::default()),
        prober: Prober::new(cfg.agent_user.clone(), PROBE_TIMEOUT),
        faults: Faults::from_env(),
        system: SystemDeps {
            reboot_retry: cfg.system_reboot_retry,
            ..SystemDeps::production(
                &paths,
                beside_me("fleet-reboot", "system upgrades that need a reboot")?,
            )
        },
        device_id: cfg.device_id.clone(),
    };
    if cfg.device_id.is_none() {
        log::warn!(
            "{} has no device_id: attempts are not checked against this device's id (device setup writes it)",
            config_path.display()
        );
    }
    let (updater, pending) = Updater::open(
        paths.clone(),
        cfg.agent_unit.clone(),
        deps,
        Bounds::default(),
    )?;
    let listener = socket::bind(&paths, allowed_gid)
        .context(|| format!("cannot create {}", paths.socket().display()))?;
    log::info!(
        "fleet-updater {} listening on {} (root {})",
        env!("CARGO_PKG_VERSION"),
        paths.socket().display(),
        paths.root().display()
    );
    if let Err(e) = notify::notify("READY=1\nSTATUS=serving") {
        log::warn!("sd_notify READY=1 failed: {e}");
    }
    if let Some(p) = pending {
        let u = updater.clone();
        std::thread::Builder::new()
            .name("recovery".into())
            .spawn(move || {
                if let Err(c) = u.finish_recovery(p) {
                    log::error!("{c}");
                }
            })
            .context(|| "cannot start the recovery thread".into())?;
    }
    if updater.system_pending() {
        let u = updater.clone();
        std::thread::Builder::new()
            .name("system-upgrade".into())
            .spawn(move || {
                if let Err(c) = u.run_system() {
                    log::error!("{c}");
                }
            })
            .context(|| "cannot start the system-upgrade thread".into())?;
    }
    socket::serve(listener, updater, ServerConfig::new(allowed_gid))
        .context(|| format!("serving {}", paths.socket().display()))
}

fn take_lock(paths: &Paths) -> Result<ProcessLock, RunError> {
    let dir = paths.state_dir();
    crate::durable::ensure_dir(&dir, 0o700)
        .context(|| format!("cannot create {}", dir.display()))?;
    Ok(ProcessLock::acquire(&paths.lock_file(), "fleet-updater")?)
}

/// A helper program installed beside this executable (`fleet-fetch`, `fleet-reboot`). Missing, what needs it
/// (`needed_for`) fails with a clear message; the updater still starts, so recovery and status never depend on it.
fn beside_me(name: &str, needed_for: &str) -> Result<std::path::PathBuf, RunError> {
    let exe = std::env::current_exe()
        .context(|| format!("cannot find this executable's path (for {name} beside it)"))?;
    let helper = exe.with_file_name(name);
    if !helper.is_file() {
        log::warn!(
            "{} is missing: {needed_for} will fail until it is installed",
            helper.display()
        );
    }
    Ok(helper)
}

/// Socket handlers are short-lived threads: one malloc arena keeps their memory from growing per thread.
fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only tunes glibc's allocator; called before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}
