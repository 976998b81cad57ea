//! The coordinated-reboot client (FleetLock), blocking: used by system upgrades and by `fleet-reboot` from its
//! timer. One run walks the chain window → staged → healthy → dependencies → lock → marker → diagnostics →
//! reboot, and every step can say "not now" with a logged reason. After the reboot the next run sees the marker
//! with another boot id, waits until the host is healthy, releases the lock and removes the marker.
//!
//! Every entry point (the timer's run, `--after-boot`, `--upgrade-step`) holds one process lock for its whole run
//! (`fleet_wire::process_lock`, on [`system::Paths::run_lock`]), so no run reads the marker while another one
//! writes it, gives the slot back or reboots. A system upgrade decides whether its reboot happened from its own
//! journal (the boot id recorded when it entered `rebooting`), never from the marker another run may consume.

pub mod check;
pub mod checks;
pub mod cli;
pub mod config;
pub mod deps;
pub mod diag;
pub mod lock;
pub mod marker;
pub mod system;
pub mod window;

use crate::system::journal::{SystemJournal, SystemJournalError};
pub use config::{ConfigError, RebootConfig};
use fleet_wire::process_lock::{LockError, ProcessLock};
use fleet_wire::SystemJournalPhase;
use lock::{FleetLockError, Identity, LockClient};
use marker::{Marker, MarkerError};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use system::{CommandError, FileError, Paths, System};

/// How often health is polled while waiting after a reboot.
pub const HEALTH_POLL: Duration = Duration::from_secs(5);

/// How long the timer's run waits for the run lock: a moment only (a run that is ending, or a child it forked and
/// that has not yet exec'd and closed the inherited descriptor), then "not now". Whoever holds it is doing this
/// run's work (asking for the slot, rebooting, or giving the slot back after a reboot); the timer comes back in 15
/// minutes, and a holder waiting for health after a reboot (up to `health_wait`, 1 h) would outlast the unit's
/// start time-out.
pub const TIMER_LOCK_WAIT: Duration = Duration::from_secs(1);
/// How long `--after-boot` waits for the run lock: a moment only, as the timer. In the boot after a coordinated
/// reboot any other run (the upgrade step, the timer) finds the same marker from the earlier boot and gives the
/// slot back itself.
pub const AFTER_BOOT_LOCK_WAIT: Duration = Duration::from_secs(1);
/// How long `--upgrade-step` waits for the run lock: fleet-updater blocks on the step anyway, and
/// after a short wait (a timer run's checks) the step can still reboot now instead of after the updater's retry
/// interval (60 s); a longer holder (a health wait after a reboot) means "not now" and the updater's next try.
pub const UPGRADE_STEP_LOCK_WAIT: Duration = Duration::from_secs(60);
/// How often a waiting run tries the lock again.
const LOCK_POLL: Duration = Duration::from_millis(100);

/// What one run did. `fleet-reboot --upgrade-step` prints it as one line of JSON for `fleet-updater`
/// (`{"outcome":"not-now","reason":"…"}`, `{"outcome":"rebooting"}`, `{"outcome":"released"}`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "outcome", content = "reason", rename_all = "kebab-case")]
pub enum Outcome {
    /// A check said "not now" (the reason is logged too).
    NotNow(String),
    /// The lock is held, the marker written and the reboot requested.
    Rebooting,
    /// The reboot happened, the host is healthy and the lock is given back.
    Released,
}

/// Why a reboot is not for now (a check said no): logged and reported as the run's [`Outcome::NotNow`], never
/// a failure of the run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Reason(pub String);

/// Something an operator must fix (bad files, a reboot command that failed): the run ends with it.
#[derive(Debug, thiserror::Error)]
pub enum RebootError {
    /// The config.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A file of the host (boot id, machine id).
    #[error(transparent)]
    File(#[from] FileError),
    /// The machine id is empty.
    #[error("{}: empty", .0.display())]
    EmptyMachineId(PathBuf),
    /// The reboot window in the config.
    #[error("{0}")]
    Window(String),
    /// The FleetLock client or server.
    #[error(transparent)]
    FleetLock(#[from] FleetLockError),
    /// `--check`: the server has no such group.
    #[error("the server {server} has no group {group:?} (its groups: {groups})")]
    NoGroup {
        /// The configured server.
        server: String,
        /// The configured group.
        group: String,
        /// The groups it has, comma-separated.
        groups: String,
    },
    /// The reboot marker.
    #[error(transparent)]
    Marker(#[from] MarkerError),
    /// The run lock.
    #[error("{0}")]
    RunLock(LockError),
    /// The system-upgrade journal.
    #[error(transparent)]
    Journal(#[from] SystemJournalError),
    /// A command that could not be run.
    #[error(transparent)]
    Command(#[from] CommandError),
    /// `systemctl reboot` failed.
    #[error(
        "systemctl reboot failed with {0:?}; the lock stays held and the next run tries again"
    )]
    RebootFailed(Option<i32>),
}

/// Options of one run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunOptions {
    /// The run is the system upgrade's step (`--upgrade-step`): it knows a reboot is needed (no "something
    /// staged" check), waits up to [`UPGRADE_STEP_LOCK_WAIT`] for the run lock, and reads whether its reboot
    /// already happened from the system-upgrade journal's boot id. Otherwise the timer's run.
    pub reboot_needed: bool,
    /// The current time for the window check (`None`: the clock).
    pub now: Option<jiff::Timestamp>,
}

/// The client's identity: an app-specific id derived from the machine id (the raw machine id never leaves the
/// host), and the hostname.
pub fn identity(paths: &Paths) -> Result<Identity, RebootError> {
    let machine = system::read_small(&paths.machine_id())?;
    if machine.is_empty() {
        return Err(RebootError::EmptyMachineId(paths.machine_id()));
    }
    let id = fleet_wire::fleetlock::client_id(&machine);
    let hostname = system::read_small(&paths.hostname())
        .ok()
        .filter(|h| fleet_wire::fleetlock::validate_hostname(h).is_ok());
    Ok(Identity { id, hostname })
}

fn not_now(reason: String) -> Result<Outcome, RebootError> {
    log::info!("not now: {reason}");
    Ok(Outcome::NotNow(reason))
}

/// Takes the run lock, waiting up to `wait`. `Ok(Err(reason))`: another run holds it ("not now").
fn run_lock(paths: &Paths, wait: Duration) -> Result<Result<ProcessLock, Reason>, RebootError> {
    let path = paths.run_lock();
    let deadline = Instant::now() + wait;
    loop {
        match ProcessLock::acquire(&path, "fleet-reboot") {
            Ok(l) => return Ok(Ok(l)),
            Err(LockError::Held { .. }) if Instant::now() < deadline => std::thread::sleep(
                LOCK_POLL.min(deadline.saturating_duration_since(Instant::now())),
            ),
            Err(LockError::Held { .. }) => {
                let who = "another fleet-reboot run (the timer's, --after-boot or --upgrade-step)";
                return Ok(Err(Reason(format!(
                    "{who} holds {} (waited {wait:?}); it is doing this work",
                    path.display()
                ))));
            }
            Err(e) => return Err(RebootError::RunLock(e)),
        }
    }
}

/// Whether the system upgrade's reboot happened, from its journal: `Some(true)` when the journal is in
/// `rebooting` with a boot id other than this boot's, `Some(false)` with this boot's, `None` when there is no
/// such journal or it predates the boot id (the marker decides then, as before).
fn upgrade_rebooted(paths: &Paths, boot_id: &str) -> Result<Option<bool>, RebootError> {
    let journal = SystemJournal::load(&paths.system_journal())?;
    Ok(journal
        .filter(|j| j.phase == SystemJournalPhase::Rebooting)
        .and_then(|j| j.rebooted_since(boot_id)))
}

/// One run of the chain. `Err` is for things an operator must fix (bad files, a reboot command that failed).
pub fn run_once(
    cfg: &RebootConfig,
    sys: &dyn System,
    opts: RunOptions,
) -> Result<Outcome, RebootError> {
    let paths = Paths::new(&cfg.root);
    let wait = if opts.reboot_needed {
        UPGRADE_STEP_LOCK_WAIT
    } else {
        TIMER_LOCK_WAIT
    };
    let _lock = match run_lock(&paths, wait)? {
        Ok(l) => l,
        Err(Reason(reason)) => return not_now(reason),
    };
    let timeout = cfg.timeout()?;
    let who = identity(&paths)?;
    let client = LockClient::from_config(cfg, timeout)?;
    let boot_id = system::read_small(&paths.boot_id())?;
    let existing = marker::read(&paths.marker())?;

    if opts.reboot_needed && upgrade_rebooted(&paths, &boot_id)? == Some(true) {
        return finish_upgrade_reboot(cfg, sys, &paths, &client, &who, existing.as_ref(), &boot_id);
    }
    if let Some(m) = &existing {
        if m.boot_id != boot_id {
            return after_reboot(cfg, sys, &paths, &client, &who);
        }
        if checks::shutting_down(sys) {
            // The reboot asked for in this boot is under way: the slot is this host's until it is back.
            return not_now(format!(
                "the reboot requested at {} is under way (the system is stopping); the slot stays held",
                m.taken_at
            ));
        }
        log::warn!(
            "a reboot was requested in this boot ({}) but did not happen; checking again",
            m.taken_at
        );
    }

    let verdict = checks_before_lock(cfg, sys, &paths, timeout, opts);
    if let Err(Reason(reason)) = verdict {
        if existing.is_some() {
            // We hold the lock from an earlier try in this boot but will not reboot now: give it back.
            match client.steady_state(&who) {
                Ok(()) => {
                    marker::remove(&paths.marker())?;
                    log::info!("released the lock taken earlier in this boot");
                }
                Err(e) => log::warn!("could not release the lock taken earlier in this boot: {e}"),
            }
        }
        return not_now(reason);
    }

    if let Err(e) = client.pre_reboot(&who) {
        return not_now(format!("no reboot slot: {e}"));
    }
    log::info!("lock taken from {} (group {})", cfg.server, cfg.group);
    marker::write(
        &paths.marker(),
        &Marker {
            version: 1,
            boot_id,
            taken_at: fleet_wire::Timestamp::now(),
            server: cfg.server.clone(),
            group: cfg.group.clone(),
        },
    )?;
    match diag::snapshot(sys, &paths, "coordinated reboot") {
        Ok(p) => log::info!("diagnostics written to {}", p.display()),
        Err(e) => log::warn!("diagnostics snapshot failed (rebooting anyway): {e}"),
    }
    log::info!("rebooting");
    let out = sys.run("systemctl", &["reboot"], checks::COMMAND_TIMEOUT)?;
    if out.code != Some(0) {
        return Err(RebootError::RebootFailed(out.code));
    }
    Ok(Outcome::Rebooting)
}

/// Right after a boot (`fleet-reboot --after-boot`, from `fleet-reboot-release.service`): when the marker names
/// another boot, the coordinated reboot happened, so wait for health and give the slot back at once, as the
/// timer's next run would minutes later; an unhealthy host keeps its slot. Without such a marker, nothing.
pub fn release_after_boot(cfg: &RebootConfig, sys: &dyn System) -> Result<Outcome, RebootError> {
    let paths = Paths::new(&cfg.root);
    let _lock = match run_lock(&paths, AFTER_BOOT_LOCK_WAIT)? {
        Ok(l) => l,
        Err(Reason(reason)) => return not_now(reason),
    };
    let boot_id = system::read_small(&paths.boot_id())?;
    match marker::read(&paths.marker())? {
        Some(m) if m.boot_id != boot_id => {
            let who = identity(&paths)?;
            let client = LockClient::from_config(cfg, cfg.timeout()?)?;
            after_reboot(cfg, sys, &paths, &client, &who)
        }
        _ => not_now("no coordinated reboot to finish in this boot".into()),
    }
}

fn checks_before_lock(
    cfg: &RebootConfig,
    sys: &dyn System,
    paths: &Paths,
    timeout: Duration,
    opts: RunOptions,
) -> Result<(), Reason> {
    if let Some(w) = &cfg.window {
        let w = window::Window::from_config(w).map_err(Reason)?;
        w.check(opts.now.unwrap_or_else(jiff::Timestamp::now))
            .map_err(Reason)?;
    }
    if !opts.reboot_needed {
        let what = checks::staged(sys, paths)?;
        log::info!("staged: {what}");
    }
    checks::healthy(sys, paths, cfg.allow_degraded)?;
    deps::require_hosts(&cfg.require_hosts, timeout)?;
    if let Some(r) = &cfg.range {
        let n = deps::range(r, timeout)?;
        log::info!("{n} hosts of {} answer on port {}", r.cidr, r.port);
    }
    Ok(())
}

/// Waits up to `health_wait` until the host is healthy; `Err` says why it is not.
fn wait_healthy(cfg: &RebootConfig, sys: &dyn System, paths: &Paths) -> Result<(), Reason> {
    let health_wait = cfg.health_wait().map_err(|e| Reason(e.to_string()))?;
    let deadline = Instant::now() + health_wait;
    loop {
        match checks::healthy(sys, paths, cfg.allow_degraded) {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => std::thread::sleep(
                HEALTH_POLL.min(deadline.saturating_duration_since(Instant::now())),
            ),
        }
    }
}

/// The upgrade step in the boot after its reboot (the journal's boot id is another): never asks for a slot or
/// reboots. Once healthy it gives back the slot a marker from an earlier boot names; when another run already
/// consumed that marker there is nothing to give back, and the reboot is still done.
fn finish_upgrade_reboot(
    cfg: &RebootConfig,
    sys: &dyn System,
    paths: &Paths,
    client: &LockClient,
    who: &Identity,
    existing: Option<&Marker>,
    boot_id: &str,
) -> Result<Outcome, RebootError> {
    log::info!("the system upgrade's reboot happened (its journal names another boot)");
    match existing {
        Some(m) if m.boot_id != boot_id => after_reboot(cfg, sys, paths, client, who),
        _ => {
            if let Err(e) = wait_healthy(cfg, sys, paths) {
                return not_now(format!("after the reboot: {e}"));
            }
            let _ = std::fs::remove_file(paths.reboot_flag());
            // A marker of this boot belongs to a later reboot another run asked for: left alone.
            log::info!(
                "healthy after the upgrade's reboot; no slot of an earlier boot to give back{}",
                if existing.is_some() {
                    " (the slot this boot holds is for another reboot)"
                } else {
                    " (another run gave it back)"
                }
            );
            Ok(Outcome::Released)
        }
    }
}

fn after_reboot(
    cfg: &RebootConfig,
    sys: &dyn System,
    paths: &Paths,
    client: &LockClient,
    who: &Identity,
) -> Result<Outcome, RebootError> {
    log::info!("the reboot happened (new boot id); waiting until healthy to release the lock");
    if let Err(e) = wait_healthy(cfg, sys, paths) {
        return not_now(format!("after the reboot: {e}; the lock stays held"));
    }
    if let Err(e) = client.steady_state(who) {
        return not_now(format!("after the reboot: could not release the lock: {e}"));
    }
    marker::remove(&paths.marker())?;
    let _ = std::fs::remove_file(paths.reboot_flag());
    log::info!("healthy after the reboot: lock released");
    Ok(Outcome::Released)
}
