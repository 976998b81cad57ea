//! The coordinated-reboot client (FleetLock), blocking: used by system upgrades and by `fleet-reboot` from its
//! timer. One run walks the chain window → staged → healthy → dependencies → lock → marker → diagnostics →
//! reboot, and every step can say "not now" with a logged reason. After the reboot the next run sees the marker
//! with another boot id, waits until the host is healthy, releases the lock and removes the marker.

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

pub use config::RebootConfig;
use lock::{Identity, LockClient};
use marker::Marker;
use sha2::{Digest, Sha256};
use std::time::{Duration, Instant};
use system::{Paths, System};

/// How often health is polled while waiting after a reboot.
pub const HEALTH_POLL: Duration = Duration::from_secs(5);

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

/// Options of one run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunOptions {
    /// Skip the "something staged" check (a caller such as the system upgrade knows a reboot is needed).
    pub reboot_needed: bool,
    /// The current time for the window check (`None`: the clock).
    pub now: Option<jiff::Timestamp>,
}

/// The client's identity: an app-specific id derived from the machine id (the raw machine id never leaves the
/// host), and the hostname.
pub fn identity(paths: &Paths) -> Result<Identity, String> {
    let machine = system::read_small(&paths.machine_id())?;
    if machine.is_empty() {
        return Err(format!("{}: empty", paths.machine_id().display()));
    }
    let digest = Sha256::digest(format!("fleet-reboot:{machine}").as_bytes());
    let id: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    let hostname = system::read_small(&paths.hostname())
        .ok()
        .filter(|h| fleet_wire::fleetlock::validate_hostname(h).is_ok());
    Ok(Identity { id, hostname })
}

fn not_now(reason: String) -> Result<Outcome, String> {
    log::info!("not now: {reason}");
    Ok(Outcome::NotNow(reason))
}

/// One run of the chain. `Err` is for things an operator must fix (bad files, a reboot command that failed).
pub fn run_once(cfg: &RebootConfig, sys: &dyn System, opts: RunOptions) -> Result<Outcome, String> {
    let paths = Paths::new(&cfg.root);
    let timeout = cfg.timeout()?;
    let who = identity(&paths)?;
    let client = LockClient::from_config(cfg, timeout)?;
    let boot_id = system::read_small(&paths.boot_id())?;
    let existing = marker::read(&paths.marker())?;

    if let Some(m) = &existing {
        if m.boot_id != boot_id {
            return after_reboot(cfg, sys, &paths, &client, &who);
        }
        log::warn!(
            "a reboot was requested in this boot ({}) but did not happen; checking again",
            m.taken_at
        );
    }

    let verdict = checks_before_lock(cfg, sys, &paths, timeout, opts);
    if let Err(reason) = verdict {
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
        return Err(format!(
            "systemctl reboot failed with {:?}; the lock stays held and the next run tries again",
            out.code
        ));
    }
    Ok(Outcome::Rebooting)
}

/// Right after a boot (`fleet-reboot --after-boot`, from `fleet-reboot-release.service`): when the marker names
/// another boot, the coordinated reboot happened, so wait for health and give the slot back at once, as the
/// timer's next run would minutes later; an unhealthy host keeps its slot. Without such a marker, nothing.
pub fn release_after_boot(cfg: &RebootConfig, sys: &dyn System) -> Result<Outcome, String> {
    let paths = Paths::new(&cfg.root);
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
) -> Result<(), String> {
    if let Some(w) = &cfg.window {
        let w = window::Window::from_config(w)?;
        w.check(opts.now.unwrap_or_else(jiff::Timestamp::now))?;
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

fn after_reboot(
    cfg: &RebootConfig,
    sys: &dyn System,
    paths: &Paths,
    client: &LockClient,
    who: &Identity,
) -> Result<Outcome, String> {
    log::info!("the reboot happened (new boot id); waiting until healthy to release the lock");
    let deadline = Instant::now() + cfg.health_wait()?;
    loop {
        match checks::healthy(sys, paths, cfg.allow_degraded) {
            Ok(()) => break,
            Err(e) if Instant::now() >= deadline => {
                return not_now(format!("after the reboot: {e}; the lock stays held"))
            }
            Err(_) => std::thread::sleep(
                HEALTH_POLL.min(deadline.saturating_duration_since(Instant::now())),
            ),
        }
    }
    if let Err(e) = client.steady_state(who) {
        return not_now(format!("after the reboot: could not release the lock: {e}"));
    }
    marker::remove(&paths.marker())?;
    let _ = std::fs::remove_file(paths.system_upgrade_done());
    log::info!("healthy after the reboot: lock released");
    Ok(Outcome::Released)
}
