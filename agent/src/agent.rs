//! The running agent: start-up in the seed's readiness order, then one event loop that applies desired-state
//! changes, relays agent-upgrade and system-upgrade intents, mirrors the updater's status, publishes heartbeat and
//! workload status, and drains on SIGTERM. Podman mutations run on the workload worker
//! ([`crate::workload_worker`]), so a slow container stop never delays an upgrade relay.

use crate::config::Config;
use crate::lock::ProcessLock;
use crate::nats_kv::{Buckets, Change, Nats, Value};
use crate::paths::Paths;
use crate::podman::Podman;
use crate::reconcile;
use crate::relay::{self, Bindings, Decision};
use crate::system_relay::{self, SystemRelay};
use crate::updater::UpdaterClient;
use crate::workload_worker::{PassResult, Worker};
use fleet_wire::kv::{self, AGENT_REQUIRED_BUCKETS};
use fleet_wire::{
    AgentUpgradeAttempt, AgentUpgradeStatus, Architecture, AttemptId, BoundedText, DesiredState,
    DeviceInfo, DeviceWorkloadStatus, ErrorCode, Heartbeat, Response, SystemUpgradeStatus,
    Timestamp, UpgradePhase, UpgradeReason, Version, WorkloadName, WorkloadSpec,
};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

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
}

struct Agent {
    cfg: Config,
    version: Version,
    arch: Architecture,
    paths: Paths,
    podman: Option<Podman>,
    /// Runs reconcile passes off the event thread; started by the main loop when Podman is enabled.
    worker: Option<Worker>,
    nats: Nats,
    kv: Buckets,
    updater: UpdaterClient,
    key: String,
    bindings: Bindings,
    desired: Vec<WorkloadSpec>,
    generation: u64,
    desired_rev: Option<u64>,
    intent_rev: Option<u64>,
    errors: BTreeMap<WorkloadName, String>,
    /// The desired state changed since the workload status was last published.
    status_stale: bool,
    mirrored: Option<AgentUpgradeStatus>,
    in_flight: Option<AttemptId>,
    /// The attempt last published as pending because the updater was unreachable, with its error text.
    last_pending: Option<(AttemptId, Option<BoundedText>)>,
    system: SystemRelay,
    /// Intents whose published status could not be read yet; read again on the next updater poll.
    system_unread: Vec<(String, Change)>,
    beat: u64,
    draining: Arc<AtomicBool>,
    tx: mpsc::Sender<Event>,
}

/// Runs the agent with the configuration at `config_path` until SIGTERM; returns after a completed drain.
pub fn run(config_path: &Path) -> Result<(), AgentError> {
    let version = crate::compiled_version();
    // Readiness 1: configuration (read-only) and then the process lock, before anything is touched.
    let cfg = Config::load(config_path).map_err(|e| fail("config", e))?;
    let paths = Paths::new(&cfg.root);
    let lock = ProcessLock::acquire(&paths.lock_file()).map_err(|e| fail("lock", e))?;
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
    let Some(kv) = wait_for_buckets(&nats, &draining)? else {
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

    let system = SystemRelay::new(cfg.device_id.clone());
    let mut agent = Agent {
        cfg,
        version,
        arch,
        paths,
        podman,
        worker: None,
        nats,
        kv,
        updater,
        key,
        bindings,
        desired: Vec::new(),
        generation: 0,
        desired_rev: None,
        intent_rev: None,
        errors: BTreeMap::new(),
        status_stale: true,
        mirrored: None,
        in_flight: None,
        last_pending: None,
        system,
        system_unread: Vec::new(),
        beat: 0,
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
/// it waits, logging one INFO line, instead of failing into a restart loop: each poll extends systemd's start
/// timeout (`EXTEND_TIMEOUT_USEC`), and `STATUS=` says what it waits for (`systemctl status fleet-agent`).
/// During an upgrade the updater's own start bound still ends the wait (it rolls back). `None`: SIGTERM came.
fn wait_for_buckets(nats: &Nats, draining: &AtomicBool) -> Result<Option<Buckets>, AgentError> {
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
                if !waiting {
                    log::info!("{e}; waiting for it (checking every {BUCKET_POLL:?})");
                    waiting = true;
                }
                let status = format!(
                    "STATUS=waiting for the NATS buckets: {e}\nEXTEND_TIMEOUT_USEC={}",
                    (BUCKET_POLL * 6).as_micros()
                );
                let _ = crate::notify::notify(&status);
            }
            Err(e) => return Err(fail("buckets", e)),
        }
        let slept = Instant::now();
        while slept.elapsed() < BUCKET_POLL {
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

impl Agent {
    fn main_loop(&mut self, rx: mpsc::Receiver<Event>) -> Result<(), AgentError> {
        if let Some(p) = &self.podman {
            let tx = self.tx.clone();
            let worker = Worker::spawn(
                p.clone(),
                self.cfg.device_id.clone(),
                self.draining.clone(),
                move |r| {
                    let _ = tx.send(Event::Reconciled(Box::new(r)));
                },
            )
            .map_err(|e| fail("workload worker", e))?;
            self.worker = Some(worker);
        }
        self.reconcile_now(true);
        self.publish_status();
        self.heartbeat();
        // The intent is read once now (like the desired state) and then followed by its watch.
        match self.kv.get(kv::AGENT_UPGRADE_INTENT, &self.key) {
            Ok(c) => self.on_intent(c),
            Err(e) => log::warn!("reading the upgrade intent: {e}"),
        }
        let stop = Arc::new(AtomicBool::new(false));
        for (bucket, intent) in [(kv::DESIRED_STATE, false), (kv::AGENT_UPGRADE_INTENT, true)] {
            let tx = self.tx.clone();
            self.kv
                .watch(bucket, &self.key, stop.clone(), move |c| {
                    tx.send(if intent {
                        Event::Intent(c)
                    } else {
                        Event::Desired(c)
                    })
                    .is_ok()
                })
                .map_err(|e| fail("watch", e))?;
        }
        // Every run key of this device, current and new, so a reboot never loses the active run.
        let tx = self.tx.clone();
        self.kv
            .watch_keys(
                kv::SYSTEM_UPGRADE_INTENT,
                &kv::device_runs_filter(&self.cfg.device_id),
                stop.clone(),
                move |k, c| tx.send(Event::SystemIntent(k, c)).is_ok(),
            )
            .map_err(|e| fail("watch", e))?;
        let now = Instant::now();
        let mut next_beat = now + self.cfg.heartbeat_interval;
        let mut next_status = now + self.cfg.status_interval;
        let mut next_resync = now + self.cfg.resync_interval;
        let mut next_poll = now + self.cfg.updater_poll_interval;
        loop {
            let soonest = next_beat.min(next_status).min(next_resync).min(next_poll);
            let wait = soonest.saturating_duration_since(Instant::now());
            match rx.recv_timeout(wait) {
                Ok(Event::Signal(at)) => {
                    stop.store(true, Ordering::SeqCst);
                    self.nats.wake_watches();
                    // The drain flag is set: the worker starts no new mutation; wait for the one in progress.
                    if let Some(w) = &mut self.worker {
                        w.finish();
                    }
                    return self.drain(at);
                }
                Ok(Event::Desired(c)) => {
                    if self.apply_desired(c) {
                        self.reconcile_now(false);
                    }
                }
                Ok(Event::Reconciled(r)) => {
                    // A pass that changed nothing (the resync's, mostly) leaves the published status true.
                    if self.on_reconciled(*r) || self.status_stale {
                        self.publish_status();
                        next_status = Instant::now() + self.cfg.status_interval;
                    }
                }
                Ok(Event::Intent(c)) => self.on_intent(c),
                Ok(Event::UpgradeAnswer(id, r)) => self.on_upgrade_answer(id, *r),
                Ok(Event::SystemIntent(k, c)) => self.on_system_intent(&k, c),
                Ok(Event::SystemAnswer(id, r)) => {
                    let effects = self.system.on_answer(id, *r, Timestamp::now());
                    self.apply_system(effects);
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(fail("event loop", "event channel closed"));
                }
            }
            if self.draining.load(Ordering::SeqCst) {
                continue; // the signal event is next in the channel
            }
            let now = Instant::now();
            // An attempt that just became active (sent, accepted) is polled at the active rate from now on, not
            // after the idle interval that was scheduled before it.
            if self.upgrade_active() {
                next_poll = next_poll.min(now + self.cfg.updater_poll_interval);
            }
            if now >= next_resync {
                next_resync = now + self.cfg.resync_interval;
                match self.kv.get(kv::DESIRED_STATE, &self.key) {
                    Ok(c) => {
                        self.apply_desired_from(c, true);
                    }
                    Err(e) => log::warn!("re-reading the desired state: {e}; keeping the last one"),
                }
                self.reconcile_now(true);
                // An intent deferred while a request was in flight, or missed by a lost watch, is read again.
                if self.in_flight.is_none() {
                    if let Ok(c) = self.kv.get(kv::AGENT_UPGRADE_INTENT, &self.key) {
                        if self.intent_rev != Some(c.revision) {
                            self.intent_rev = None;
                            self.on_intent(c);
                        }
                    }
                }
            }
            if now >= next_poll {
                next_poll = now
                    + if self.upgrade_active() {
                        self.cfg.updater_poll_interval
                    } else {
                        self.cfg.resync_interval
                    };
                self.poll_updater();
            }
            if now >= next_status {
                next_status = now + self.cfg.status_interval;
                self.publish_status();
            }
            if now >= next_beat {
                next_beat = now + self.cfg.heartbeat_interval;
                self.heartbeat();
            }
        }
    }

    /// Takes a desired-state value; returns true when it changed what the agent wants.
    fn apply_desired(&mut self, c: Change) -> bool {
        self.apply_desired_from(c, false)
    }

    /// `reread`: the value comes from a full read, so any other revision counts (a re-created bucket restarts
    /// its revisions); watch events only count when newer.
    fn apply_desired_from(&mut self, c: Change, reread: bool) -> bool {
        let changed = self.take_desired(c, reread);
        self.status_stale |= changed;
        changed
    }

    fn take_desired(&mut self, c: Change, reread: bool) -> bool {
        let stale = match self.desired_rev {
            Some(r) if reread => c.revision == r,
            Some(r) => c.revision <= r,
            None => false,
        };
        if stale {
            return false;
        }
        self.desired_rev = Some(c.revision);
        match c.value {
            Value::Absent => {
                log::info!("no desired state for this device (revision {})", c.revision);
                self.desired.clear();
                true
            }
            Value::Put(bytes) => match serde_json::from_slice::<DesiredState>(&bytes) {
                Ok(d) if d.device_id == self.cfg.device_id => {
                    crate::timing::mark("decoded", format_args!("rev={}", c.revision));
                    log::info!(
                        "desired state generation {} with {} workloads (revision {})",
                        d.generation,
                        d.workloads.len(),
                        c.revision
                    );
                    self.generation = d.generation;
                    self.desired = d.workloads;
                    true
                }
                Ok(d) => {
                    log::error!(
                        "desired state is for device {}, not this one; ignored",
                        d.device_id
                    );
                    false
                }
                Err(e) => {
                    // Keep running what we have: a bad write must not remove workloads.
                    log::error!(
                        "desired state revision {} is invalid; keeping the last valid one: {e}",
                        c.revision
                    );
                    false
                }
            },
        }
    }

    /// Asks the workload worker for a pass toward the current desired state (`full`: compare every container,
    /// else only what changed since the last pass); its result arrives as `Event::Reconciled`.
    fn reconcile_now(&mut self, full: bool) {
        if let Some(w) = &self.worker {
            w.request(self.desired.clone(), full);
        }
    }

    /// Takes a pass's result; true when it may have changed what the workload status shows.
    fn on_reconciled(&mut self, r: PassResult) -> bool {
        match r {
            Ok(out) => {
                if out.mutations > 0 {
                    log::info!(
                        "reconcile: {} mutations, {} errors",
                        out.mutations,
                        out.errors.len()
                    );
                }
                let changed = out.mutations > 0 || out.errors != self.errors;
                self.errors = out.errors;
                changed
            }
            Err(e) => {
                log::warn!("reconcile: {e}");
                true
            }
        }
    }

    fn publish_status(&mut self) {
        let Some(p) = &self.podman else { return };
        let observed = match p.list_managed() {
            Ok(o) => o,
            Err(e) => {
                log::warn!("workload status: {e}");
                return;
            }
        };
        let s = DeviceWorkloadStatus {
            device_id: self.cfg.device_id.clone(),
            generation: self.generation,
            at: Timestamp::now(),
            workloads: reconcile::statuses(&self.desired, &observed, &self.errors),
        };
        match put_json(&self.kv, kv::WORKLOAD_STATUS, &self.key, &s) {
            Ok(_) => self.status_stale = false,
            Err(e) => log::warn!("publishing workload status: {e}"),
        }
    }

    fn heartbeat(&mut self) {
        self.beat += 1;
        let h = Heartbeat {
            device_id: self.cfg.device_id.clone(),
            at: Timestamp::now(),
            agent_version: self.version.clone(),
            boot_id: crate::device::boot_id(),
            sequence: self.beat,
        };
        match put_json(&self.kv, kv::DEVICE_HEARTBEAT, &self.key, &h) {
            Ok(_) => {
                // Only a heartbeat NATS acknowledged counts as the first one after a system upgrade.
                let effects = self.system.on_heartbeat(h.at);
                self.apply_system(effects);
            }
            Err(e) => log::warn!("publishing heartbeat: {e}"),
        }
    }

    fn on_system_intent(&mut self, key: &str, c: Change) {
        // A run seen for the first time: what was published for it decides whether it is new (agent restart).
        let published = if self.system.knows(key) {
            None
        } else {
            match self.kv.get(kv::SYSTEM_UPGRADE_STATUS, key) {
                Ok(Change {
                    value: Value::Put(b),
                    ..
                }) => serde_json::from_slice::<SystemUpgradeStatus>(&b).ok(),
                Ok(_) => None,
                Err(e) => {
                    // Without knowing, never send: the next updater poll tries again.
                    log::warn!("reading system-upgrade-status/{key}: {e}; will retry");
                    self.system_unread.push((key.to_owned(), c));
                    return;
                }
            }
        };
        let value = match &c.value {
            Value::Put(b) => Some(b.as_slice()),
            Value::Absent => None,
        };
        let effects = self
            .system
            .on_intent(key, value, published, Timestamp::now());
        self.apply_system(effects);
    }

    /// Reflects the updater's system-upgrade status. For a run the relay does not know yet (agent restart), what
    /// NATS holds is read first, so that the agent's own fields (the heartbeat) are kept.
    fn reflect_system(&mut self, status: Option<SystemUpgradeStatus>) {
        if let Some(s) = &status {
            if s.device_id == self.cfg.device_id && !self.system.knows_run(&s.run_uid) {
                let key = kv::run_key(&s.device_id, &s.run_uid);
                match self.kv.get(kv::SYSTEM_UPGRADE_STATUS, &key) {
                    Ok(Change {
                        value: Value::Put(b),
                        ..
                    }) => {
                        if let Ok(p) = serde_json::from_slice::<SystemUpgradeStatus>(&b) {
                            self.system.remember(p);
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        log::warn!("reading system-upgrade-status/{key}: {e}; will retry");
                        return;
                    }
                }
            }
        }
        let effects = self.system.on_updater_status(status);
        self.apply_system(effects);
    }

    /// Carries out the system relay's effects: acknowledged status writes, one request to the updater.
    fn apply_system(&mut self, effects: Vec<system_relay::Effect>) {
        for e in effects {
            match e {
                system_relay::Effect::Publish(s) => {
                    let key = kv::run_key(&s.device_id, &s.run_uid);
                    match put_json(&self.kv, kv::SYSTEM_UPGRADE_STATUS, &key, &s) {
                        Ok(_) => self.system.published(*s),
                        Err(e) => {
                            log::warn!("publishing system-upgrade-status/{key}: {e}; will retry")
                        }
                    }
                }
                system_relay::Effect::Send(a) => {
                    let id = a.run_uid;
                    log::info!("sending system upgrade run {id} to the updater");
                    let client = self.updater.clone();
                    let tx = self.tx.clone();
                    let spawned = std::thread::Builder::new()
                        .name("system-upgrade-request".into())
                        .spawn(move || {
                            let r = client.system_upgrade(*a).map_err(|e| e.to_string());
                            let _ = tx.send(Event::SystemAnswer(id, Box::new(r)));
                        });
                    if let Err(e) = spawned {
                        log::error!("cannot start the system-upgrade request: {e}");
                        let effects =
                            self.system
                                .on_answer(id, Err(e.to_string()), Timestamp::now());
                        self.apply_system(effects);
                    }
                }
            }
        }
    }

    fn put_upgrade_status(&self, s: &AgentUpgradeStatus) -> std::io::Result<u64> {
        put_json(&self.kv, kv::AGENT_UPGRADE_STATUS, &self.key, s)
    }

    fn publish_recovered(
        &mut self,
        recovered: Option<AgentUpgradeStatus>,
    ) -> Result<(), AgentError> {
        let current = retry_until(STARTUP_DEPENDENCY_WAIT, &self.draining, || {
            self.kv.get(kv::AGENT_UPGRADE_STATUS, &self.key)
        })
        .map_err(|e| fail("upgrade-status", e))?;
        let published = match &current.value {
            Value::Put(b) => serde_json::from_slice::<AgentUpgradeStatus>(b).ok(),
            Value::Absent => None,
        };
        let stale_drain = published
            .as_ref()
            .is_some_and(|p| p.phase == UpgradePhase::Stopping);
        if let Some(s) = recovered {
            // Publish an active transaction, replace our own drain record, and bring an older record of the
            // same attempt up to date (e.g. `complete` that the previous process did not mirror).
            let outdated = published
                .as_ref()
                .is_some_and(|p| p.attempt_id == s.attempt_id && p != &s);
            if !s.phase.is_terminal() || stale_drain || outdated {
                retry_until(STARTUP_DEPENDENCY_WAIT, &self.draining, || {
                    self.put_upgrade_status(&s)
                })
                .map_err(|e| fail("upgrade-status", e))?;
            }
            self.mirrored = Some(s);
        }
        Ok(())
    }

    fn upgrade_active(&self) -> bool {
        self.in_flight.is_some()
            || self.system.active()
            || self
                .mirrored
                .as_ref()
                .is_some_and(|s| !s.phase.is_terminal())
    }

    fn poll_updater(&mut self) {
        match self.updater.status() {
            Ok(st) => {
                self.reflect_system(st.system_upgrade);
                let effects = self.system.drive(Timestamp::now());
                self.apply_system(effects);
                for (k, c) in std::mem::take(&mut self.system_unread) {
                    self.on_system_intent(&k, c);
                }
                if let Some(s) = st
                    .agent_upgrade
                    .filter(|s| s.device_id == self.cfg.device_id)
                {
                    self.mirror(s);
                }
            }
            Err(e) => log::warn!("polling the updater: {e}"),
        }
    }

    fn mirror(&mut self, s: AgentUpgradeStatus) {
        if self.mirrored.as_ref() == Some(&s) {
            return;
        }
        log::info!(
            "upgrade {:?}: phase {:?} reason {:?}",
            s.attempt_id.map(|a| a.to_string()),
            s.phase,
            s.reason
        );
        match self.put_upgrade_status(&s) {
            Ok(_) => self.mirrored = Some(s),
            Err(e) => log::warn!("mirroring upgrade status: {e}; will retry"),
        }
    }

    fn on_intent(&mut self, c: Change) {
        if self.intent_rev.is_some_and(|r| c.revision <= r) {
            return;
        }
        self.intent_rev = Some(c.revision);
        let Value::Put(bytes) = c.value else { return };
        let decision = relay::evaluate(&bytes, &self.cfg.device_id, self.arch, &self.bindings);
        match decision {
            Decision::Reject { ref error, .. } => {
                log::warn!("upgrade intent revision {} rejected: {error}", c.revision);
                if let Some(s) =
                    relay::rejected_status(&self.cfg.device_id, &decision, Timestamp::now())
                {
                    if let Err(e) = self.put_upgrade_status(&s) {
                        log::warn!("publishing the rejection: {e}");
                    }
                }
            }
            Decision::Known(a) => {
                let accepted = self.bindings.get(&a.attempt_id).is_some_and(|b| b.accepted);
                let updater_knows = self
                    .mirrored
                    .as_ref()
                    .is_some_and(|s| s.attempt_id == Some(a.attempt_id));
                // Bound but never accepted (the agent stopped in between): ask again; the updater is idempotent
                // for the same id and digest.
                if !accepted && !updater_knows && self.in_flight.is_none() {
                    self.send(*a);
                }
            }
            Decision::New(a) => {
                if self.in_flight.is_some() {
                    log::warn!("attempt {} arrived while another request is in flight; it will be read again", a.attempt_id);
                    self.intent_rev = None;
                    return;
                }
                self.bindings
                    .bind(&a.attempt_id, &a.digest(), Timestamp::now());
                if let Err(e) = self.bindings.save(&self.paths.bindings_file()) {
                    log::error!(
                        "cannot record attempt {}: {e}; not sending it",
                        a.attempt_id
                    );
                    return;
                }
                let s = relay::new_status(
                    &self.cfg.device_id,
                    Some(a.attempt_id),
                    Some(a.target_version.clone()),
                    Some(a.digest()),
                    UpgradePhase::Preparing,
                    None,
                    Timestamp::now(),
                );
                if let Err(e) = self.put_upgrade_status(&s) {
                    log::warn!("publishing preparing: {e}");
                }
                self.send(*a);
            }
        }
    }

    fn send(&mut self, a: AgentUpgradeAttempt) {
        let id = a.attempt_id;
        log::info!(
            "sending upgrade attempt {id} (target {}) to the updater",
            a.target_version
        );
        self.in_flight = Some(id);
        let client = self.updater.clone();
        let tx = self.tx.clone();
        let spawned = std::thread::Builder::new()
            .name("upgrade-request".into())
            .spawn(move || {
                let r = client.upgrade(a).map_err(|e| e.to_string());
                let _ = tx.send(Event::UpgradeAnswer(id, Box::new(r)));
            });
        if let Err(e) = spawned {
            log::error!("cannot start the upgrade request: {e}");
            self.in_flight = None;
        }
    }

    fn on_upgrade_answer(&mut self, id: AttemptId, r: Result<Response, String>) {
        self.in_flight = None;
        match r {
            Ok(Response::Accepted { status }) | Ok(Response::Status { status }) => {
                log::info!("updater accepted attempt {id}");
                self.last_pending = None;
                self.bindings.mark_accepted(&id);
                if let Err(e) = self.bindings.save(&self.paths.bindings_file()) {
                    log::warn!("recording acceptance of {id}: {e}");
                }
                if let Some(s) = status
                    .agent_upgrade
                    .filter(|s| s.device_id == self.cfg.device_id)
                {
                    self.mirror(s);
                }
            }
            Ok(Response::Error { code, message }) => {
                log::warn!("updater refused attempt {id}: {code:?}: {message}");
                let reason = match code {
                    ErrorCode::Quarantined => UpgradeReason::Quarantined,
                    ErrorCode::Busy => UpgradeReason::Busy,
                    _ => UpgradeReason::Rejected,
                };
                self.fail_attempt(id, reason, format!("updater refused: {code:?}: {message}"));
            }
            Err(e) => {
                // The updater may still have it: the status poll shows the truth if it does.
                self.poll_updater();
                if self.mirrored.as_ref().and_then(|s| s.attempt_id) != Some(id) {
                    self.updater_unreachable(id, &e);
                }
            }
        }
    }

    /// The updater never accepted attempt `id` because it could not be reached (socket absent, updater
    /// restarting): the attempt has not failed. Publish it as pending with reason `updater-unreachable` and read
    /// the intent again at the next resync, which sends it once the updater answers (it is bound, not accepted).
    fn updater_unreachable(&mut self, id: AttemptId, e: &str) {
        log::info!("upgrade attempt {id} not delivered, the updater is unreachable ({e}); it stays pending and is sent again when the updater answers");
        self.intent_rev = None;
        let bound = self.bindings.get(&id).map(|b| b.digest.clone());
        let mut s = relay::new_status(
            &self.cfg.device_id,
            Some(id),
            None,
            bound.and_then(|d| fleet_wire::Sha256Hex::try_from(d.as_str()).ok()),
            UpgradePhase::Preparing,
            Some(UpgradeReason::UpdaterUnreachable),
            Timestamp::now(),
        );
        s.error = Some(BoundedText::lossy(format!(
            "the updater is unreachable ({e}); the attempt is delivered when it answers again"
        )));
        if self.last_pending.as_ref() == Some(&(id, s.error.clone())) {
            return; // the same wait, already published
        }
        match self.put_upgrade_status(&s) {
            Ok(_) => self.last_pending = Some((id, s.error.clone())),
            Err(e) => log::warn!("publishing the pending attempt {id}: {e}"),
        }
    }

    fn fail_attempt(&mut self, id: AttemptId, reason: UpgradeReason, error: String) {
        let bound = self.bindings.get(&id).map(|b| b.digest.clone());
        let mut s = relay::new_status(
            &self.cfg.device_id,
            Some(id),
            None,
            bound.and_then(|d| fleet_wire::Sha256Hex::try_from(d.as_str()).ok()),
            UpgradePhase::Failed,
            Some(reason),
            Timestamp::now(),
        );
        s.error = Some(BoundedText::lossy(error));
        if let Err(e) = self.put_upgrade_status(&s) {
            log::warn!("publishing failure of {id}: {e}");
        }
    }

    /// SIGTERM: mutations are no longer admitted (the flag was set by the signal thread) and the current one has
    /// finished (the main loop waited for the workload worker). During a cutover (or with an attempt in progress) publish the
    /// acknowledged `stopping` status; otherwise only log the drain. Then flush, notify, exit.
    fn drain(&mut self, signalled: Instant) -> Result<(), AgentError> {
        let drain_ms = u64::try_from(signalled.elapsed().as_millis()).unwrap_or(u64::MAX);
        let current = self
            .updater
            .status()
            .ok()
            .and_then(|st| st.agent_upgrade)
            .filter(|s| s.device_id == self.cfg.device_id);
        // The updater writes `activating` (public phase `stopping`) before it runs `systemctl stop`.
        let by_updater = current
            .as_ref()
            .is_some_and(|s| s.phase == UpgradePhase::Stopping);
        let reason = if by_updater {
            UpgradeReason::Updater
        } else {
            UpgradeReason::Shutdown
        };
        let now = Timestamp::now();
        // `agent-upgrade-status` describes the last attempt. A stop with no attempt in progress (a reboot, an
        // admin's restart) is not part of one: writing `stopping` there would erase a terminal record (a failed
        // upgrade would look in progress), so it is only logged.
        let mut s = match current {
            Some(s) if by_updater || !s.phase.is_terminal() => s,
            _ => {
                log::info!(
                    "drained in {drain_ms} ms ({reason:?}); no upgrade attempt in progress, agent-upgrade-status left as it is"
                );
                return self.finish_drain();
            }
        };
        if s.phase == UpgradePhase::Stopping {
            // The updater already recorded the transition; add the reason without a duplicate entry.
            s.reason = Some(reason);
        } else {
            s.enter(UpgradePhase::Stopping, now, Some(reason));
        }
        s.drain_duration_ms = Some(drain_ms);
        s.detail = Some(BoundedText::lossy(format!(
            "agent {} drained in {drain_ms} ms",
            self.version
        )));
        match self.put_upgrade_status(&s) {
            Ok(rev) => log::info!(
                "stopping status ({reason:?}, drain {drain_ms} ms) acknowledged at revision {rev}"
            ),
            Err(e) => log::warn!("stopping status not acknowledged: {e}"),
        }
        self.finish_drain()
    }

    /// The end of every drain: flush NATS, notify STOPPING=1, exit.
    fn finish_drain(&mut self) -> Result<(), AgentError> {
        if let Err(e) = self.nats.flush(DRAIN_FLUSH_TIMEOUT) {
            log::warn!("NATS flush: {e}");
        }
        if let Err(e) = crate::notify::notify("STOPPING=1") {
            log::warn!("STOPPING=1: {e}");
        }
        log::info!("drained; exiting");
        Ok(())
    }
}
