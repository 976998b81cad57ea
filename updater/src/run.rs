//! The daemon: configuration, journal and start-up recovery, the socket, readiness, then serving forever.

use crate::agent_upgrade::probe::Prober;
use crate::agent_upgrade::transaction::{Bounds, Deps, Updater};
use crate::config::Config;
use crate::fault::Faults;
use crate::fetch_runner;
use crate::paths::Paths;
use crate::service::Systemctl;
use crate::socket::{self, ServerConfig};
use crate::system::SystemDeps;
use crate::{notify, users};
use fleet_wire::limits::PROBE_TIMEOUT;
use fleet_wire::process_lock::ProcessLock;
use std::path::Path;
use std::sync::Arc;

/// Runs the updater with the configuration at `config_path`. Returns only on a start-up error (journal,
/// configuration, socket), with a message that tells the operator what to inspect.
pub fn run(config_path: &Path) -> Result<(), String> {
    limit_malloc_arenas();
    let cfg = Config::load(config_path).map_err(|e| e.to_string())?;
    let paths = Paths::new(&cfg.root);
    // Before anything is touched: a second updater (started by hand beside the unit's) must neither unlink the
    // live socket nor run recovery against the live transaction. Held until the process exits.
    let lock = take_lock(&paths)?;
    log::info!("holding {}", lock.path().display());
    let allowed_gid = users::group_gid(&cfg.socket_group).map_err(|e| e.to_string())?;
    let deps = Deps {
        fetcher: Box::new(
            fetch_runner::production(
                beside_me("fleet-fetch", "agent-upgrade downloads")?,
                &cfg.agent_user,
                cfg.extra_ca_file.as_deref(),
            )?
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
    )
    .map_err(|e| e.to_string())?;
    let listener = socket::bind(&paths, allowed_gid)
        .map_err(|e| format!("cannot create {}: {e}", paths.socket().display()))?;
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
            .map_err(|e| format!("cannot start the recovery thread: {e}"))?;
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
            .map_err(|e| format!("cannot start the system-upgrade thread: {e}"))?;
    }
    socket::serve(listener, updater, ServerConfig::new(allowed_gid))
        .map_err(|e| format!("serving {}: {e}", paths.socket().display()))
}

fn take_lock(paths: &Paths) -> Result<ProcessLock, String> {
    let dir = paths.state_dir();
    crate::durable::ensure_dir(&dir, 0o700)
        .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    ProcessLock::acquire(&paths.lock_file(), "fleet-updater").map_err(|e| e.to_string())
}

/// A helper program installed beside this executable (`fleet-fetch`, `fleet-reboot`). Missing, what needs it
/// (`needed_for`) fails with a clear message; the updater still starts, so recovery and status never depend on it.
fn beside_me(name: &str, needed_for: &str) -> Result<std::path::PathBuf, String> {
    let exe = std::env::current_exe()
        .map_err(|e| format!("cannot find this executable's path (for {name} beside it): {e}"))?;
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
