//! The agent-upgrade transaction: accepting an attempt, preparing (fetch, install, probe), the cutover (stop,
//! switch, start, commit) and the rollback path, each durable step journaled before the next begins.

use super::accept::{self, Decision};
use super::install;
use super::journal::{Journal, JournalError};
use super::machine::{self, Event, Recovery};
use super::probe::Prober;
use crate::durable;
use crate::fault::{Crashed, Faults};
use crate::fetch_runner::Fetcher;
use crate::paths::Paths;
use crate::service::ServiceManager;
use crate::system::accept::AgentSide;
use crate::system::upgrade::SystemOpenError;
use crate::system::{SystemDeps, SystemUpgrades};
use fleet_wire::limits::{UPDATER_START_BOUND, UPDATER_STOP_BOUND};
use fleet_wire::{
    AgentUpgradeAttempt, Architecture, BoundedText, Capability, DeviceId, ErrorCode, Id128,
    JournalPhase, Response, SystemUpgradeAttempt, Timestamp, UnitName, UpdaterStatus,
    UpgradeReason,
};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The updater's own unit: its journald log tells each attempt's story.
pub const UPDATER_UNIT: &str = "fleet-updater.service";

/// What the transaction needs from the outside world.
pub struct Deps {
    /// Downloads artifacts.
    pub fetcher: Box<dyn Fetcher>,
    /// Stops and starts the agent unit.
    pub services: Arc<dyn ServiceManager>,
    /// Probes candidates.
    pub prober: Prober,
    /// Crash points (tests).
    pub faults: Faults,
    /// The system upgrade's apt policy and reboot client.
    pub system: SystemDeps,
    /// This device's id from the configuration: attempts of either kind for another device are refused (the
    /// agent checks too; the root process does not rely on it). `None`: not checked.
    pub device_id: Option<DeviceId>,
}

/// Bounds of the cutover's service operations.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// `systemctl stop` bound.
    pub stop: Duration,
    /// `systemctl start` bound.
    pub start: Duration,
}

impl Default for Bounds {
    fn default() -> Self {
        Self {
            stop: UPDATER_STOP_BOUND,
            start: UPDATER_START_BOUND,
        }
    }
}

#[derive(Default)]
struct State {
    journal: Option<Journal>,
    recovering: bool,
    /// Set when the journal could not be written: the transaction stopped; a restart recovers.
    fatal: Option<String>,
}

/// The agent-upgrade part of [`Deps`] (the system part moves into [`SystemUpgrades`]).
struct AgentDeps {
    fetcher: Box<dyn Fetcher>,
    services: Arc<dyn ServiceManager>,
    prober: Prober,
    faults: Faults,
}

struct Inner {
    paths: Paths,
    unit: UnitName,
    deps: AgentDeps,
    bounds: Bounds,
    state: Mutex<State>,
    /// Held while a mutating request is being accepted: one at a time.
    mutating: Mutex<()>,
    /// Held while a diagnostics request is collected (`crate::diagnostics`): one at a time, apart from the above.
    diagnostics: Mutex<()>,
    system: SystemUpgrades,
    boot_id: Option<Id128>,
    invocation_id: Option<Id128>,
    device_id: Option<DeviceId>,
}

/// The updater: cheap to clone, shared by the socket handlers and the transaction thread.
#[derive(Clone)]
pub struct Updater {
    inner: Arc<Inner>,
}

/// Why a transaction stopped dead (nothing after the point ran, nothing was cleaned up).
#[derive(Debug)]
enum Stop {
    Crashed(Crashed),
    JournalWrite(String),
    /// The service manager went away mid-step (shutdown, power cut): nothing is journaled, so start-up recovery
    /// runs the step again on the next boot instead of recording a verdict the step never reached.
    ManagerGone(String),
}

impl From<Crashed> for Stop {
    fn from(c: Crashed) -> Self {
        Stop::Crashed(c)
    }
}

/// A step of preparation failed (the attempt fails) or the transaction stopped dead.
enum Fail {
    Stop(Stop),
    Step(UpgradeReason, String),
}

impl From<Crashed> for Fail {
    fn from(c: Crashed) -> Self {
        Fail::Stop(Stop::Crashed(c))
    }
}

/// The result of accepting an upgrade request.
#[derive(Debug)]
pub enum Accepted {
    /// A new transaction was journaled; run it with [`Updater::run_transaction`].
    Started(UpdaterStatus),
    /// Same attempt as the current one: nothing to run.
    Current(UpdaterStatus),
}

/// An upgrade request was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The error code to answer with.
    pub code: ErrorCode,
    /// For a person.
    pub message: String,
}

impl Refused {
    fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

impl From<Refused> for Response {
    fn from(r: Refused) -> Response {
        Response::error(r.code, r.message)
    }
}

/// The stop/start part of start-up recovery, which continues after the updater's readiness.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PendingRecovery {
    /// Stop the agent before starting it (a cutover was interrupted).
    stop_first: bool,
    /// `failed` is already recorded (an interrupted preparation): only a start failure is journaled.
    failed_recorded: bool,
}

/// The updater could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The journal is unreadable or invalid.
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// A recovery step could not be journaled.
    #[error("start-up recovery could not write the journal: {0}")]
    JournalWrite(String),
    /// A crash point was hit during recovery (fault injection).
    #[error(transparent)]
    Crashed(#[from] Crashed),
    /// The service manager went away during recovery (a shutdown): recovery runs again at the next start.
    #[error("start-up recovery stopped, the service manager went away: {0}")]
    ManagerGone(String),
    /// The system-upgrade journal is unreadable or invalid, or its recovery could not be journaled.
    #[error(transparent)]
    System(#[from] SystemOpenError),
}

fn read_boot_id() -> Option<Id128> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .and_then(|s| Id128::parse_lenient(&s).ok())
}

/// Temporary files of downloads interrupted by a crash are useless and go; a resumable partial download
/// (`crate::fetch_runner::partial`) stays, so that the next attempt for the same artifact resumes after its bytes.
fn remove_partial_downloads(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let resumable = e
                .file_name()
                .to_str()
                .is_some_and(crate::fetch_runner::partial::is_resumable_name);
            if e.file_type().is_ok_and(|t| t.is_file()) && !resumable {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

/// A power cut between staging a durable write and renaming it leaves its temporary file (`durable::temp_beside`)
/// beside the target: a stale journal copy, or a temporary symlink that selects a candidate. Nothing reads them;
/// they go at start-up so that repeated cuts do not pile them up next to the active link.
fn remove_interrupted_writes(paths: &Paths) {
    for target in [paths.journal(), paths.system_journal(), paths.active_link()] {
        durable::remove_stale_temps(&target);
    }
}

fn path_text(p: &Path) -> Option<String> {
    p.to_str().map(str::to_owned)
}

impl Updater {
    /// Opens the updater over `paths`: reads the journal (an unreadable or invalid one is an error: the socket
    /// must not open) and runs the synchronous part of start-up recovery, which selects the previous link and
    /// persists the recovery phase. Run the returned [`PendingRecovery`] (stop/start) after readiness.
    pub fn open(
        paths: Paths,
        unit: UnitName,
        deps: Deps,
        bounds: Bounds,
    ) -> Result<(Updater, Option<PendingRecovery>), StartError> {
        let journal = Journal::load(&paths.journal())?;
        let Deps {
            fetcher,
            services,
            prober,
            faults,
            system,
            device_id,
        } = deps;
        let system = SystemUpgrades::open(&paths, system, faults.clone())?;
        let deps = AgentDeps {
            fetcher,
            services,
            prober,
            faults,
        };
        remove_partial_downloads(&paths.download_dir());
        remove_interrupted_writes(&paths);
        let updater = Updater {
            inner: Arc::new(Inner {
                paths,
                unit,
                deps,
                bounds,
                device_id,
                state: Mutex::new(State {
                    journal,
                    ..State::default()
                }),
                mutating: Mutex::new(()),
                diagnostics: Mutex::new(()),
                system,
                boot_id: read_boot_id(),
                invocation_id: std::env::var("INVOCATION_ID")
                    .ok()
                    .and_then(|s| Id128::parse_lenient(&s).ok()),
            }),
        };
        let pending = updater.recover_sync().map_err(|s| match s {
            Stop::Crashed(c) => StartError::Crashed(c),
            Stop::JournalWrite(e) => StartError::JournalWrite(e),
            Stop::ManagerGone(e) => StartError::ManagerGone(e),
        })?;
        updater.state().recovering = pending.is_some();
        Ok((updater, pending))
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A poisoned lock only means a handler panicked; the state itself stays consistent.
        self.inner
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn faults(&self) -> &Faults {
        &self.inner.deps.faults
    }

    /// The paths this updater manages.
    pub fn paths(&self) -> &Paths {
        &self.inner.paths
    }

    /// The agent's systemd unit (from the configuration).
    pub fn agent_unit(&self) -> &UnitName {
        &self.inner.unit
    }

    /// The lock that keeps diagnostics requests one at a time (never the mutating one).
    pub fn diagnostics_lock(&self) -> &Mutex<()> {
        &self.inner.diagnostics
    }

    /// What the updater knows; never waits for a transaction step.
    pub fn status(&self) -> UpdaterStatus {
        let st = self.state();
        let agent_upgrade = st.journal.as_ref().map(|j| {
            let mut s = j.public(
                self.inner.boot_id.clone(),
                self.inner.invocation_id.clone(),
                UnitName::try_from(UPDATER_UNIT).ok(),
            );
            if let Some(f) = &st.fatal {
                s.error = Some(BoundedText::lossy(f));
            }
            s
        });
        UpdaterStatus {
            updater_version: env!("CARGO_PKG_VERSION").into(),
            boot_id: self.inner.boot_id.clone(),
            recovering: st.recovering,
            agent_upgrade,
            system_upgrade: self.inner.system.public(),
            capabilities: self.capabilities(),
        }
    }

    /// What this updater can do: agent upgrades from HTTPS and OCI artifacts always, the system upgrade when
    /// apt-get and dpkg are installed.
    pub fn capabilities(&self) -> Vec<Capability> {
        let mut c = vec![Capability::AgentUpgradeV1, Capability::OciArtifactsV1];
        if self.inner.system.available() {
            c.push(Capability::AptFullUpgradeV1);
        }
        c
    }

    /// Accepts a `system-upgrade` request (one mutating request at a time, one transaction at a time across
    /// both kinds): `Started` means run [`Updater::run_system`]; `Current` means the attempt is already known and
    /// apt does not run again.
    pub fn accept_system(&self, attempt: SystemUpgradeAttempt) -> Result<Accepted, Refused> {
        let Ok(_one_at_a_time) = self.inner.mutating.try_lock() else {
            return Err(Refused::new(
                ErrorCode::Busy,
                "another mutating request is being handled; try again",
            ));
        };
        self.check_device(&attempt.device_id)?;
        let agent = {
            let st = self.state();
            AgentSide {
                busy: st.recovering || st.journal.as_ref().is_some_and(|j| !j.phase.is_terminal()),
                quarantined: st
                    .journal
                    .as_ref()
                    .is_some_and(|j| j.phase == JournalPhase::RollbackFailed),
            }
        };
        let started = self.inner.system.accept(attempt, agent, Timestamp::now())?;
        Ok(if started {
            Accepted::Started(self.status())
        } else {
            Accepted::Current(self.status())
        })
    }

    /// Runs the system-upgrade transaction from its durable phase (after acceptance, or work start-up recovery
    /// left). `Err` only when a crash point stopped it dead.
    pub fn run_system(&self) -> Result<(), Crashed> {
        self.inner.system.run()
    }

    /// Whether start-up left system-upgrade work to run after readiness.
    pub fn system_pending(&self) -> bool {
        self.inner.system.pending()
    }

    /// Moves the journal by `event`, persisting before returning; `error` replaces the stored error if given.
    fn transition(&self, event: Event, error: Option<String>) -> Result<(), Stop> {
        let Some(mut j) = self.state().journal.clone() else {
            return Err(Stop::JournalWrite("no transaction to move".into()));
        };
        let from = j.phase;
        j.apply(event, Timestamp::now())
            .map_err(|e| Stop::JournalWrite(e.to_string()))?;
        if let Some(e) = &error {
            j.error = Some(BoundedText::lossy(e));
        }
        self.persist(&j)?;
        log::info!(
            "attempt {}: {:?} -> {:?}{}{}",
            j.attempt.attempt_id,
            from,
            j.phase,
            j.reason.map(|r| format!(" ({r:?})")).unwrap_or_default(),
            error.map(|e| format!(": {e}")).unwrap_or_default()
        );
        self.state().journal = Some(j);
        Ok(())
    }

    fn set_detail(&self, detail: &str) {
        if let Some(j) = self.state().journal.as_mut() {
            j.detail = Some(BoundedText::lossy(detail));
        }
    }

    /// Writes `j` durably; a failed write stops the transaction (status shows why; a restart recovers).
    fn persist(&self, j: &Journal) -> Result<(), Stop> {
        if let Err(e) = j.store(&self.inner.paths.journal()) {
            let msg = format!("{e}; the transaction stopped: restart fleet-updater to recover");
            log::error!("attempt {}: {msg}", j.attempt.attempt_id);
            self.state().fatal = Some(msg.clone());
            return Err(Stop::JournalWrite(msg));
        }
        Ok(())
    }

    /// Persists that the cutover is starting the candidate (public `starting`), so the history keeps it.
    fn record_starting(&self) -> Result<(), Stop> {
        let Some(mut j) = self.state().journal.clone() else {
            return Err(Stop::JournalWrite("no transaction to move".into()));
        };
        j.starting_at = Some(Timestamp::now());
        self.persist(&j)?;
        log::info!("attempt {}: starting the candidate", j.attempt.attempt_id);
        self.state().journal = Some(j);
        Ok(())
    }

    /// Refuses an attempt for another device than the configured one.
    fn check_device(&self, device: &DeviceId) -> Result<(), Refused> {
        match &self.inner.device_id {
            Some(mine) if mine != device => Err(Refused::new(
                ErrorCode::Invalid,
                format!("invalid device: the attempt is for {device}, this device is {mine}"),
            )),
            _ => Ok(()),
        }
    }

    /// Accepts an upgrade request: validates it, decides (idempotent, conflict, quarantined, busy) and journals a
    /// new transaction in `preparing`. Only one mutating request is accepted at a time.
    pub fn accept(&self, attempt: AgentUpgradeAttempt) -> Result<Accepted, Refused> {
        let Ok(_one_at_a_time) = self.inner.mutating.try_lock() else {
            return Err(Refused::new(
                ErrorCode::Busy,
                "another mutating request is being handled; try again",
            ));
        };
        self.check_device(&attempt.device_id)?;
        if Architecture::current() != Some(attempt.architecture) {
            return Err(Refused::new(
                ErrorCode::Invalid,
                format!(
                    "invalid architecture: the attempt is for {}, this device is {}",
                    attempt.architecture,
                    Architecture::current().map_or("unsupported", |a| a.as_str())
                ),
            ));
        }
        let earlier = {
            let st = self.state();
            match accept::decide(st.journal.as_ref(), &attempt) {
                Decision::Current => {
                    drop(st);
                    return Ok(Accepted::Current(self.status()));
                }
                Decision::Conflict(m) => return Err(Refused::new(ErrorCode::Conflict, m)),
                Decision::Quarantined => {
                    return Err(Refused::new(
                        ErrorCode::Quarantined,
                        "the updater is in rollback-failed and refuses every new attempt until root repair \
                         (docs/updater.md, \"Root repair\")",
                    ))
                }
                Decision::Busy => {
                    return Err(Refused::new(
                        ErrorCode::Busy,
                        "another upgrade transaction is running; try again when it has ended",
                    ))
                }
                Decision::Start if self.inner.system.active() => {
                    return Err(Refused::new(
                        ErrorCode::Busy,
                        "a system upgrade is running; try again when it has ended",
                    ))
                }
                // Recovery restarting the previous agent is part of the last transaction.
                Decision::Start if st.recovering => {
                    return Err(Refused::new(
                        ErrorCode::Busy,
                        "start-up recovery is still restarting the previous agent; try again",
                    ))
                }
                Decision::Start => st
                    .journal
                    .as_ref()
                    .map(Journal::successor_history)
                    .unwrap_or_default(),
            }
        };
        let paths = &self.inner.paths;
        let link = paths.active_link();
        let internal = |m: String| Refused::new(ErrorCode::Internal, m);
        let previous = std::fs::read_link(&link).map_err(|e| {
            internal(format!(
                "cannot read the active agent link {}: {e}; device setup installs it",
                link.display()
            ))
        })?;
        if !paths.resolve_link_target(&previous).is_file() {
            return Err(internal(format!(
                "the active agent link {} points at {}, which is not a file; repair as root",
                link.display(),
                previous.display()
            )));
        }
        let target = paths.binary(&attempt.target_version);
        let (Some(previous), Some(target)) = (path_text(&previous), path_text(&target)) else {
            return Err(internal("a managed path is not UTF-8".into()));
        };
        let id = attempt.attempt_id;
        let mut j = Journal::begin(attempt, previous, target, earlier, Timestamp::now());
        j.detail = Some(BoundedText::lossy("accepted"));
        j.validate().map_err(|e| internal(e.to_string()))?;
        j.store(&paths.journal())
            .map_err(|e| internal(e.to_string()))?;
        log::info!("attempt {id}: accepted, journal preparing");
        {
            let mut st = self.state();
            st.journal = Some(j);
            st.fatal = None;
        }
        Ok(Accepted::Started(self.status()))
    }

    /// Accepts `attempt` and, when it starts a transaction, runs it on this thread (tests and tools).
    pub fn upgrade_blocking(&self, attempt: AgentUpgradeAttempt) -> Result<Response, Crashed> {
        match self.accept(attempt) {
            Err(r) => Ok(r.into()),
            Ok(Accepted::Current(status)) => Ok(Response::Accepted { status }),
            Ok(Accepted::Started(_)) => {
                self.run_transaction()?;
                Ok(Response::Accepted {
                    status: self.status(),
                })
            }
        }
    }

    /// Runs the accepted transaction to its end (committed, failed or rollback-failed). `Err` only when a crash
    /// point stopped it dead.
    pub fn run_transaction(&self) -> Result<(), Crashed> {
        match self.transact() {
            Ok(()) => Ok(()),
            Err(Stop::Crashed(c)) => Err(c),
            Err(Stop::JournalWrite(e)) => {
                log::error!("transaction stopped: {e}");
                Ok(())
            }
            Err(Stop::ManagerGone(e)) => {
                log::warn!("transaction stopped, the service manager went away (recovered at the next start): {e}");
                Ok(())
            }
        }
    }

    fn transact(&self) -> Result<(), Stop> {
        self.faults().check("journal-preparing")?;
        let Some(j) = self.state().journal.clone() else {
            return Ok(());
        };
        if j.phase != JournalPhase::Preparing {
            return Ok(());
        }
        match self.prepare(&j.attempt) {
            Ok(()) => {}
            Err(Fail::Stop(s)) => return Err(s),
            Err(Fail::Step(reason, msg)) => {
                self.set_detail("preparation failed; the previous agent keeps running");
                self.transition(Event::PrepareFailed(reason), Some(msg))?;
                self.faults().check("journal-failed")?;
                return Ok(());
            }
        }
        self.set_detail("candidate probed; stopping the agent");
        self.transition(Event::Prepared, None)?;
        self.faults().check("journal-activating")?;
        self.cutover(&j)
    }

    fn prepare(&self, attempt: &AgentUpgradeAttempt) -> Result<(), Fail> {
        let paths = &self.inner.paths;
        let dest = paths.binary(&attempt.target_version);
        let limit = attempt.effective_byte_limit();
        let step = |r: UpgradeReason, m: String| Fail::Step(r, m);
        if std::fs::symlink_metadata(&dest).is_ok() {
            self.set_detail("re-verifying the installed candidate");
            install::reverify(&dest, &attempt.sha256, limit)
                .map_err(|e| step(e.reason, e.message))?;
        } else {
            let tmp = paths.download_dir();
            durable::ensure_dir(&paths.binaries_dir(), 0o755)
                .and_then(|()| durable::ensure_dir(&tmp, 0o700))
                .map_err(|e| {
                    step(
                        UpgradeReason::InstallFailed,
                        format!("creating {}: {e}", tmp.display()),
                    )
                })?;
            self.set_detail("downloading the candidate");
            let d = self
                .inner
                .deps
                .fetcher
                .fetch(attempt, &tmp)
                .map_err(|e| step(e.reason, e.message))?;
            self.faults().check("fetched")?;
            if d.sha256 != attempt.sha256 {
                let _ = std::fs::remove_file(&d.path);
                return Err(step(
                    UpgradeReason::DigestMismatch,
                    format!("downloaded SHA-256 {} is not {}", d.sha256, attempt.sha256),
                ));
            }
            install::install(&d.path, &dest).map_err(|e| step(e.reason, e.message))?;
            self.faults().check("installed")?;
        }
        self.set_detail("probing the candidate (--self-test)");
        self.inner
            .deps
            .prober
            .probe(&dest, &attempt.target_version)
            .map_err(|e| step(e.reason, e.message))?;
        self.faults().check("probed")?;
        Ok(())
    }

    fn cutover(&self, j: &Journal) -> Result<(), Stop> {
        let unit = &self.inner.unit;
        let services = &self.inner.deps.services;
        let t0 = Instant::now();
        if let Err(e) = services.stop(unit, self.inner.bounds.stop) {
            return self.roll_back(UpgradeReason::StopFailed, format!("stopping {unit}: {e}"));
        }
        let drained = u64::try_from(t0.elapsed().as_millis()).unwrap_or(u64::MAX);
        if let Some(j) = self.state().journal.as_mut() {
            j.drain_duration_ms = Some(drained);
        }
        self.faults().check("stopped")?;
        let link = self.inner.paths.active_link();
        if let Err(e) = durable::replace_symlink(&link, Path::new(&j.target_link)) {
            return self.roll_back(
                UpgradeReason::StartFailed,
                format!("switching {} to {}: {e}", link.display(), j.target_link),
            );
        }
        self.faults().check("link-switched")?;
        self.set_detail("starting the candidate; commit on readiness");
        self.record_starting()?;
        if let Err(e) = services.start(unit, self.inner.bounds.start) {
            return self.roll_back(
                UpgradeReason::StartFailed,
                format!("starting {unit} with the candidate: {e}"),
            );
        }
        self.faults().check("started")?;
        self.set_detail("the candidate is ready: committed");
        self.transition(Event::Ready, None)?;
        self.faults().check("journal-committed")?;
        Ok(())
    }

    fn roll_back(&self, reason: UpgradeReason, error: String) -> Result<(), Stop> {
        self.set_detail("rolling back to the previous agent");
        self.transition(Event::CutoverFailed(reason), Some(error))?;
        self.faults().check("journal-rolling-back")?;
        if self.restore_link()? {
            self.restart_previous(
                PendingRecovery {
                    stop_first: true,
                    failed_recorded: false,
                },
                reason,
            )?;
        }
        Ok(())
    }

    /// Selects the previous binary again. On failure journals `rollback-failed` and returns false.
    fn restore_link(&self) -> Result<bool, Stop> {
        let Some(previous) = self
            .state()
            .journal
            .as_ref()
            .map(|j| j.previous_link.clone())
        else {
            return Ok(false);
        };
        let link = self.inner.paths.active_link();
        if let Err(e) = durable::replace_symlink(&link, Path::new(&previous)) {
            self.set_detail("restoring the previous link failed: quarantined");
            self.transition(
                Event::RestoreFailed,
                Some(format!("restoring {} -> {previous}: {e}", link.display())),
            )?;
            self.faults().check("journal-rollback-failed")?;
            return Ok(false);
        }
        self.faults().check("link-restored")?;
        Ok(true)
    }

    /// Stops (when `stop_first`) and starts the agent unit with the previous link selected, then journals
    /// `failed` (previous agent running; already journaled when `failed_recorded`) or `rollback-failed`.
    fn restart_previous(&self, how: PendingRecovery, reason: UpgradeReason) -> Result<(), Stop> {
        let unit = &self.inner.unit;
        let services = &self.inner.deps.services;
        if how.stop_first {
            self.set_detail("stopping the agent to restore the previous binary");
            if let Err(e) = services.stop(unit, self.inner.bounds.stop) {
                // Starting still decides: systemd's own stop time-out has killed the agent by now.
                log::warn!("rollback: stopping {unit}: {e}");
            }
            self.faults().check("rollback-stopped")?;
        }
        self.set_detail("starting the previous agent");
        if let Err(e) = services.start(unit, self.inner.bounds.start) {
            if e.manager_gone() {
                return Err(Stop::ManagerGone(format!(
                    "starting {unit} with the previous binary: {e}"
                )));
            }
            self.set_detail("starting the previous agent failed: quarantined");
            self.transition(
                Event::RestoreFailed,
                Some(format!("starting {unit} with the previous binary: {e}")),
            )?;
            self.faults().check("journal-rollback-failed")?;
            return Ok(());
        }
        self.faults().check("rollback-started")?;
        self.set_detail("the previous agent is running again");
        if !how.failed_recorded {
            self.transition(Event::RolledBack(reason), None)?;
            self.faults().check("journal-failed")?;
        }
        Ok(())
    }

    /// The synchronous part of start-up recovery (before readiness): the seed's table, row by row.
    fn recover_sync(&self) -> Result<Option<PendingRecovery>, Stop> {
        let Some(phase) = self.state().journal.as_ref().map(|j| j.phase) else {
            return Ok(None);
        };
        let plan = machine::recovery(phase);
        log::info!("start-up recovery: journal phase {phase:?}: {plan:?}");
        match plan {
            Recovery::Keep => Ok(None),
            Recovery::Quarantine => {
                log::error!(
                    "the updater is quarantined (rollback-failed): every new attempt is refused until root repair"
                );
                Ok(None)
            }
            Recovery::RestoreAndStart => {
                // The seed's order: restore the link, record `failed`, then start the previous service. A crash
                // after `failed` is harmless: preparation never stopped the agent, and a boot starts it anyway.
                self.set_detail("interrupted during preparation: restoring the previous agent");
                if !self.restore_link()? {
                    return Ok(None);
                }
                self.set_detail("interrupted during preparation: starting the previous agent");
                self.transition(Event::RolledBack(UpgradeReason::Interrupted), None)?;
                self.faults().check("journal-failed")?;
                Ok(Some(PendingRecovery {
                    stop_first: false,
                    failed_recorded: true,
                }))
            }
            Recovery::RollBack | Recovery::RepeatRollBack => {
                self.set_detail("interrupted: rolling back to the previous agent");
                self.transition(Event::Interrupted, None)?;
                self.faults().check("journal-rolling-back")?;
                Ok(self.restore_link()?.then_some(PendingRecovery {
                    stop_first: true,
                    failed_recorded: false,
                }))
            }
        }
    }

    /// The rest of start-up recovery (stop/start of the previous agent), run after readiness while status
    /// answers with `recovering: true`.
    pub fn finish_recovery(&self, pending: PendingRecovery) -> Result<(), Crashed> {
        let r = self.restart_previous(pending, UpgradeReason::Interrupted);
        self.state().recovering = false;
        match r {
            Ok(()) => Ok(()),
            Err(Stop::Crashed(c)) => Err(c),
            Err(Stop::JournalWrite(e)) => {
                log::error!("recovery stopped: {e}");
                Ok(())
            }
            Err(Stop::ManagerGone(e)) => {
                log::warn!("recovery stopped, the service manager went away (run again at the next start): {e}");
                Ok(())
            }
        }
    }
}
