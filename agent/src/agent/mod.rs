//! The running agent's start-up, in the seed's readiness order, and its state. The event loop (`event_loop.rs`)
//! then applies desired-state changes (`desired.rs`), carries out what the upgrade relays decide (`upgrades.rs`),
//! publishes heartbeat and workload status, and drains on SIGTERM (`drain.rs`). Podman mutations run on the
//! workload worker ([`crate::workload_worker`]), so a slow container stop never delays an upgrade relay.

use crate::config::Config;
use crate::lock::ProcessLock;
use crate::nats_kv::{Buckets, Change, Nats};
use crate::paths::Paths;
use crate::podman::Podman;
use crate::relay::agent_upgrade::{Bindings, Relay};
use crate::relay::system_upgrade::SystemRelay;
use crate::updater::UpdaterClient;
use crate::workload_worker::{PassResult, Worker};
use fleet_wire::kv::{self, AGENT_REQUIRED_BUCKETS};
use fleet_wire::{
    Architecture, AttemptId, DeviceInfo, Response, Timestamp, UpgradePhase, Version, WorkloadSpec,
};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod desired;
mod diagnostics;
mod drain;
mod event_loop;
mod health;
mod upgrades;
mod usage;

/// How long start-up waits for Podman, for the updater socket, and for each of its NATS reads and writes (a
/// cluster's stream electing a new leader) before giving up.
pub const STARTUP_DEPENDENCY_WAIT: Duration = Duration::from_secs(30);
/// How long the drain waits for the final NATS flush.
pub const DRAIN_FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// A start-up or run failure; the process exits non-zero so systemd restarts it.
#[derive(Debug, thiserror::Error)]
#[error("{step}: {message}")]
pub struct AgentError {
    /// The readiness step or stage that failed.
    pub step: &'static str,
    /// What happened and what to do.
    pub message: String,
}

fn fail(step: &'static str, e: impl std::fmt::Display) -> AgentError {
    AgentError {
        step,
        message: e.to_string(),
    }
}

enum Event {
    Signal(Instant),
    Desired(Change),
    Intent(Change),
    UpgradeAnswer(AttemptId, Box<Result<Response, String>>),
    SystemIntent(String, Change),
    SystemAnswer(AttemptId, Box<Result<Response, String>>),
    Reconciled(Box<PassResult>),
    /// The health worker's findings changed.
    Health(crate::health::Findings),
    /// A change of `diagnostics-request/<key>`.
    Diagnostics(String, Change),
}

struct Agent {
    cfg: Config,
    version: Version,
    paths: Paths,
    podman: Option<Podman>,
    /// Runs reconcile passes off the event thread; started by the main loop when Podman is enabled.
    worker: Option<Worker>,
    /// Workload health checks: the health worker and what the status reports of them.
    health: health::Health,
    nats: Nats,
    kv: Buckets,
    updater: UpdaterClient,
    key: String,
    /// The device info as last written (written again when NATS loses it).
    info: DeviceInfo,
    desired: Vec<WorkloadSpec>,
    generation: u64,
    desired_rev: Option<u64>,
    /// Why the latest desired state could not be taken (the status's `desiredError`); `None` once one is.
    desired_error: Option<fleet_wire::BoundedText>,
    /// A desired state (or its absence) was taken since start: until then no pass runs, so an agent started on a
    /// value it cannot honour leaves the device's containers as they are instead of removing them.
    desired_taken: bool,
    /// Which containers the OOM killer ended ([`crate::oom::OomWatch`]).
    oom: crate::oom::OomWatch,
    errors: crate::reconcile::Errors,
    /// The desired state changed since the workload status was last published.
    status_stale: bool,
    /// Each workload's restart count as last published: a workload that restarted since is published again
    /// sooner ([`crate::reconcile::unsettled`]), so a crash loop is seen within seconds, not a status interval.
    published_restarts: crate::reconcile::RestartCounts,
    /// The agent-upgrade relay: its effects are carried out by [`Agent::apply_relay`].
    relay: Relay,
    system: SystemRelay,
    /// Intents whose published status could not be read yet; read again on the next updater poll.
    system_unread: Vec<(String, Change)>,
    beat: u64,
    /// Diagnostics requests: their buckets, the worker, which were answered.
    diagnostics: diagnostics::Diagnostics,
    /// The device's usage: its bucket, what was published.
    usage: usage::Usage,
    draining: Arc<AtomicBool>,
    tx: mpsc::Sender<Event>,
}

/// Runs the agent with the configuration at `config_path` until SIGTERM; returns after a completed drain.
pub fn run(config_path: &Path) -> Result<(), AgentError> {
    let version = crate::compiled_version();
    // Readiness 1: configuration (read-only) and then the process lock, before anything is touched.
    let cfg = Config::load(config_path).map_err(|e| fail("config", e))?;
    let paths = Paths::new(&cfg.root);
    let lock = ProcessLock::acquire(&paths.lock_file(), crate::lock::PROGRAM)
        .map_err(|e| fail("lock", e))?;
    log::info!(
        "fleet-agent {version} for device {} holds {}",
        cfg.device_id,
        lock.path().display()
    );
    let arch = Architecture::current()
        .ok_or_else(|| fail("architecture", "unsupported CPU architecture"))?;

    let draining = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel();
    spawn_signal_thread(draining.clone(), tx.clone())?;
    let stop_early = |d: &AtomicBool| d.load(Ordering::SeqCst);

    // Readiness 2: Podman.
    let podman = if cfg.podman_enabled {
        let p = Podman::new(&cfg.podman_socket, cfg.podman_stop_timeout);
        retry_until(STARTUP_DEPENDENCY_WAIT, &draining, || p.ping()).map_err(|e| {
            fail(
                "podman",
                format!("{e} (is podman.socket running for this user?)"),
            )
        })?;
        Some(p)
    } else {
        None
    };
    if stop_early(&draining) {
        return early_exit();
    }

    // Readiness 3: NATS and buckets.
    let nats = Nats::connect(&cfg.nats, &format!("fleet-agent {}", cfg.device_id))
        .map_err(|e| fail("nats", e))?;
    let Some(kv) = wait_for_buckets(&nats, &draining, cfg.nats.bucket_wait)? else {
        return early_exit();
    };
    let key = kv::device_key(&cfg.device_id);

    // The updater's status first: device info advertises only what the local updater supports.
    let updater = UpdaterClient::new(&cfg.updater_socket);
    let status =
        retry_until(STARTUP_DEPENDENCY_WAIT, &draining, || updater.status()).map_err(|e| {
            fail(
                "updater",
                format!("{e} (is fleet-updater.service running?)"),
            )
        })?;

    // Readiness 4: device info.
    let info = DeviceInfo {
        device_id: cfg.device_id.clone(),
        agent_version: version.clone(),
        architecture: arch,
        os: crate::device::os_info(&paths.os_release()),
        capabilities: crate::device::capabilities(&status.capabilities),
        boot_id: crate::device::boot_id(),
        published_at: Timestamp::now(),
        restarts: crate::device::restarts(),
        reboot_client_id: crate::device::reboot_client_id(&paths.machine_id()),
    };
    // Retried like the other dependencies: on a NATS cluster a bucket whose stream leader was just lost answers
    // "no responders" for a few seconds, and failing readiness then would roll a good upgrade back.
    retry_until(STARTUP_DEPENDENCY_WAIT, &draining, || {
        put_json(&kv, kv::DEVICE_INFO, &key, &info)
    })
    .map_err(|e| fail("device-info", e))?;

    // Readiness 5 and 6: the recovered updater transaction, and this binary's version against its target.
    let recovered_system = status.system_upgrade.clone();
    let recovered = status
        .agent_upgrade
        .filter(|s| s.device_id == cfg.device_id);
    if let Some(s) = &recovered {
        log::info!(
            "updater transaction: attempt {:?} phase {:?} target {:?}",
            s.attempt_id.map(|a| a.to_string()),
            s.phase,
            s.target_version.as_ref().map(Version::as_str)
        );
        if s.phase == UpgradePhase::Starting && s.target_version.as_ref() != Some(&version) {
            return Err(fail(
                "version",
                format!(
                    "the updater is activating {:?} but this binary is {version}; refusing readiness so it rolls back",
                    s.target_version.as_ref().map(Version::as_str)
                ),
            ));
        }
    }
    let bindings = Bindings::load(&paths.bindings_file()).map_err(|e| fail("state", e))?;

    let cfg_device = cfg.device_id.clone();
    let relay = Relay::new(cfg.device_id.clone(), arch, bindings);
    let system = SystemRelay::new(cfg.device_id.clone());
    let mut agent = Agent {
        cfg,
        version,
        paths,
        podman,
        worker: None,
        health: Default::default(),
        nats,
        kv,
        updater,
        key,
        info,
        desired: Vec::new(),
        generation: 0,
        desired_rev: None,
        desired_error: None,
        desired_taken: false,
        oom: Default::default(),
        errors: crate::reconcile::Errors::new(),
        status_stale: true,
        published_restarts: Default::default(),
        relay,
        system,
        system_unread: Vec::new(),
        beat: 0,
        diagnostics: diagnostics::Diagnostics::new(cfg_device.clone()),
        usage: Default::default(),
        draining,
        tx,
    };

    // Readiness 7: a complete desired-state snapshot.
    let snapshot = retry_until(STARTUP_DEPENDENCY_WAIT, &agent.draining, || {
        agent.kv.get(kv::DESIRED_STATE, &agent.key)
    })
    .map_err(|e| fail("snapshot", e))?;
    agent.apply_desired(snapshot);

    // Readiness 8: transaction status, when an upgrade is active (or our own drain record is stale).
    agent.publish_recovered(recovered)?;
    // A system upgrade the updater finished or continued while the agent was down (e.g. across its reboot).
    agent.reflect_system(recovered_system);
    if stop_early(&agent.draining) {
        return early_exit();
    }

    match crate::notify::notify("READY=1") {
        Ok(sent) => log::info!(
            "ready (READY=1 {})",
            if sent { "sent" } else { "not under systemd" }
        ),
        Err(e) => log::warn!("READY=1 could not be sent: {e}"),
    }
    agent.main_loop(rx)
}

fn early_exit() -> Result<(), AgentError> {
    let _ = crate::notify::notify("STOPPING=1");
    log::info!("stopped before readiness");
    Ok(())
}

fn spawn_signal_thread(
    draining: Arc<AtomicBool>,
    tx: mpsc::Sender<Event>,
) -> Result<(), AgentError> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals =
        signal_hook::iterator::Signals::new([SIGTERM, SIGINT]).map_err(|e| fail("signals", e))?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                // Stop admitting mutations at once; the event loop does the rest.
                draining.store(true, Ordering::SeqCst);
                log::info!("signal {sig}: draining");
                let _ = tx.send(Event::Signal(Instant::now()));
            }
        })
        .map_err(|e| fail("signals", e))?;
    Ok(())
}

/// How often start-up looks again for buckets that do not exist yet.
pub const BUCKET_POLL: Duration = Duration::from_secs(5);

/// Opens the required buckets. While one does not exist yet (a device set up before anyone created the buckets)
/// it waits, logging one INFO line, instead of failing into a fast restart loop: each poll extends systemd's start
/// timeout (`EXTEND_TIMEOUT_USEC`), and `STATUS=` says what it waits for (`systemctl status fleet-agent`). The
/// wait is bounded by `bound` (`nats.bucket_wait_secs`): then it fails, the process exits 1 and systemd starts
/// it anew with a fresh connection. During an upgrade the updater's own start bound ends the wait sooner
/// (it rolls back). `None`: SIGTERM came.
fn wait_for_buckets(
    nats: &Nats,
    draining: &AtomicBool,
    bound: Duration,
) -> Result<Option<Buckets>, AgentError> {
    let started = Instant::now();
    let mut waiting = false;
    loop {
        match nats.open_buckets(AGENT_REQUIRED_BUCKETS) {
            Ok(kv) => {
                if waiting {
                    log::info!("the NATS buckets exist now; going on");
                    let _ = crate::notify::notify("STATUS=");
                }
                return Ok(Some(kv));
            }
            Err(e @ crate::nats_kv::NatsError::BucketMissing { .. }) => {
                let left = bound.saturating_sub(started.elapsed());
                if left.is_zero() {
                    return Err(fail(
                        "buckets",
                        format!(
                            "{e}; still missing after {}s (nats.bucket_wait_secs): exiting so that systemd starts the agent again",
                            bound.as_secs()
                        ),
                    ));
                }
                if !waiting {
                    log::info!(
                        "{e}; waiting for it (checking every {BUCKET_POLL:?}, at most {}s)",
                        bound.as_secs()
                    );
                    waiting = true;
                }
                // Extended by what the next poll can take (the poll, its requests), never past the bound by more.
                let status = format!(
                    "STATUS=waiting for the NATS buckets: {e}\nEXTEND_TIMEOUT_USEC={}",
                    (BUCKET_POLL * 6).min(left + BUCKET_POLL * 2).as_micros()
                );
                let _ = crate::notify::notify(&status);
            }
            Err(e) => return Err(fail("buckets", e)),
        }
        let nap = BUCKET_POLL.min(bound.saturating_sub(started.elapsed()));
        let slept = Instant::now();
        while slept.elapsed() < nap {
            if draining.load(Ordering::SeqCst) {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

fn retry_until<T, E: std::fmt::Display>(
    window: Duration,
    draining: &AtomicBool,
    mut f: impl FnMut() -> Result<T, E>,
) -> Result<T, E> {
    let start = Instant::now();
    loop {
        match f() {
            Ok(v) => return Ok(v),
            Err(e) if start.elapsed() >= window || draining.load(Ordering::SeqCst) => {
                return Err(e)
            }
            Err(e) => log::warn!("{e}; retrying"),
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn put_json<T: serde::Serialize>(
    kv: &Buckets,
    bucket: &str,
    key: &str,
    v: &T,
) -> std::io::Result<u64> {
    let bytes = serde_json::to_vec(v).map_err(std::io::Error::other)?;
    kv.put(bucket, key, &bytes)
}
