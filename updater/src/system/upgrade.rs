//! The system-upgrade transaction: accepting an attempt, then `apt-get update`, `apt-get full-upgrade`, the
//! coordinated reboot when one is needed, and the repair path (`dpkg --configure -a`), each durable step
//! journaled before the next begins. Status stays answerable: it only reads the in-memory copy.

use super::accept::{self, AgentSide, Decision};
use super::apt::{Apt, Outcome, Step};
use super::journal::{SystemJournal, SystemJournalError};
use super::machine::{self, Event, Recovery};
use super::reboot::Rebooter;
use crate::agent_upgrade::transaction::Refused;
use crate::fault::{Crashed, Faults};
use crate::paths::Paths;
use crate::reboot::Outcome as RebootOutcome;
use fleet_wire::{
    BoundedText, ErrorCode, SystemJournalPhase, SystemUpgradeAttempt, SystemUpgradeReason,
    SystemUpgradeStatus, Timestamp,
};
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// Time between coordinated-reboot runs while the reboot waits ("not now") or is under way.
pub const REBOOT_RETRY: Duration = Duration::from_secs(60);

/// What the system upgrade needs from the outside world.
pub struct SystemDeps {
    /// The compiled-in apt policy.
    pub apt: Apt,
    /// The coordinated-reboot client.
    pub rebooter: Box<dyn Rebooter>,
    /// Time between reboot-client runs.
    pub reboot_retry: Duration,
}

#[derive(Default)]
struct State {
    journal: Option<SystemJournal>,
    detail: Option<String>,
    /// A thread is running the transaction.
    running: bool,
}

/// The system-upgrade side of the updater.
pub struct SystemUpgrades {
    journal_path: PathBuf,
    reboot_flag: PathBuf,
    /// The kernel's boot id, recorded in the journal on entering `rebooting`.
    boot_id: PathBuf,
    deps: SystemDeps,
    faults: Faults,
    state: Mutex<State>,
}

/// A journal write failed: the transaction stopped; a restart recovers from the last durable phase.
struct Stopped;

enum Halt {
    Crashed(Crashed),
    Stopped,
}

impl From<Crashed> for Halt {
    fn from(c: Crashed) -> Self {
        Halt::Crashed(c)
    }
}

impl From<Stopped> for Halt {
    fn from(_: Stopped) -> Self {
        Halt::Stopped
    }
}

/// The synchronous part of start-up recovery could not be journaled.
#[derive(Debug, thiserror::Error)]
pub enum SystemOpenError {
    /// The journal is unreadable or invalid.
    #[error(transparent)]
    Journal(#[from] SystemJournalError),
    /// Recording `repairing` failed.
    #[error("start-up recovery could not write the system-upgrade journal: {0}")]
    JournalWrite(String),
}

impl SystemUpgrades {
    /// Reads the journal and runs the synchronous part of start-up recovery: an interrupted `upgrading` is
    /// journaled as `repairing` (reason `interrupted`) before the socket opens, so no answer ever says apt might
    /// still run. The rest runs in [`Self::run`].
    pub fn open(paths: &Paths, deps: SystemDeps, faults: Faults) -> Result<Self, SystemOpenError> {
        let journal_path = paths.system_journal();
        let journal = SystemJournal::load(&journal_path)?;
        let this = Self {
            journal_path,
            reboot_flag: paths.reboot_required(),
            boot_id: crate::reboot::system::Paths::new(paths.root()).boot_id(),
            deps,
            faults,
            state: Mutex::new(State {
                journal,
                ..State::default()
            }),
        };
        if let Some(phase) = this.phase() {
            let plan = machine::recovery(phase);
            log::info!("start-up recovery: system-upgrade phase {phase:?}: {plan:?}");
            if plan == Recovery::Interrupted {
                this.transition(
                    Event::NeedsRepair(SystemUpgradeReason::Interrupted),
                    None,
                    None,
                )
                .map_err(|_| {
                    SystemOpenError::JournalWrite(format!(
                        "recording `repairing` in {} failed (see the log line before)",
                        this.journal_path.display()
                    ))
                })?;
            }
        }
        Ok(this)
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn phase(&self) -> Option<SystemJournalPhase> {
        self.state().journal.as_ref().map(|j| j.phase)
    }

    /// The current or last attempt's public status.
    pub fn public(&self) -> Option<SystemUpgradeStatus> {
        let st = self.state();
        st.journal.as_ref().map(|j| j.public(st.detail.as_deref()))
    }

    /// True while an attempt is not terminal (one mutating transaction at a time across both kinds).
    pub fn active(&self) -> bool {
        self.phase().is_some_and(|p| !p.is_terminal())
    }

    /// Whether this device can run the upgrade at all (apt-get and dpkg installed).
    pub fn available(&self) -> bool {
        self.deps.apt.available()
    }

    /// Whether start-up left work for [`Self::run`] (accepted, repairing or rebooting).
    pub fn pending(&self) -> bool {
        self.phase()
            .is_some_and(|p| machine::recovery(p) != Recovery::Keep)
    }

    /// Decides on a request and, for a new attempt, journals `accepted`. `Ok(true)`: run [`Self::run`] now;
    /// `Ok(false)`: the same attempt is already known (apt does not run again). The caller holds the updater's
    /// one-mutating-request lock.
    pub fn accept(
        &self,
        attempt: SystemUpgradeAttempt,
        agent: AgentSide,
        now: Timestamp,
    ) -> Result<bool, Refused> {
        let refuse = |code, message: String| Refused { code, message };
        let mut st = self.state();
        let earlier = match accept::decide(st.journal.as_ref(), &attempt, agent, now) {
            Decision::Current => return Ok(false),
            Decision::Conflict(m) => return Err(refuse(ErrorCode::Conflict, m)),
            Decision::Quarantined => {
                return Err(refuse(
                    ErrorCode::Quarantined,
                    "the updater is in rollback-failed and refuses every new attempt until root repair \
                     (docs/updater.md, \"Root repair\")"
                        .into(),
                ))
            }
            Decision::Expired => {
                log::warn!(
                    "run {}: refused: it expired at {} before it was accepted; it never starts",
                    attempt.run_uid,
                    attempt.expires_at
                );
                return Err(refuse(
                    ErrorCode::Expired,
                    format!(
                        "run {} expired at {} before this updater accepted it; it never starts",
                        attempt.run_uid, attempt.expires_at
                    ),
                ));
            }
            Decision::Busy(why) => return Err(refuse(ErrorCode::Busy, format!("{why}; try again"))),
            Decision::Start => st
                .journal
                .as_ref()
                .map(SystemJournal::successor_history)
                .unwrap_or_default(),
        };
        let id = attempt.run_uid;
        let j = SystemJournal::begin(attempt, earlier, now);
        j.store(&self.journal_path).map_err(|e| {
            refuse(
                ErrorCode::Internal,
                format!("writing {}: {e}", self.journal_path.display()),
            )
        })?;
        log::info!("run {id}: accepted, system-upgrade journal accepted");
        st.journal = Some(j);
        st.detail = Some("accepted".into());
        Ok(true)
    }

    /// Moves the journal by `event`, persisting before returning.
    fn transition(
        &self,
        event: Event,
        error: Option<String>,
        tail: Option<BoundedText>,
    ) -> Result<(), Stopped> {
        let Some(mut j) = self.state().journal.clone() else {
            return Err(Stopped);
        };
        let from = j.phase;
        let boot_id = match event {
            Event::Upgraded { reboot: true } => self.boot_id(),
            _ => None,
        };
        if let Err(e) = j.apply_in_boot(event, Timestamp::now(), boot_id.as_deref()) {
            log::error!("run {}: {e}", j.attempt.run_uid);
            return Err(Stopped);
        }
        if let Some(e) = &error {
            j.error = Some(BoundedText::lossy(e));
        }
        if tail.is_some() {
            j.output_tail = tail;
        }
        if let Err(e) = j.store(&self.journal_path) {
            let msg = format!(
                "writing {} failed: {e}; the transaction stopped: restart fleet-updater to recover",
                self.journal_path.display()
            );
            log::error!("run {}: {msg}", j.attempt.run_uid);
            self.state().detail = Some(msg);
            return Err(Stopped);
        }
        log::info!(
            "run {}: {from:?} -> {:?}{}{}",
            j.attempt.run_uid,
            j.phase,
            j.reason.map(|r| format!(" ({r:?})")).unwrap_or_default(),
            error.map(|e| format!(": {e}")).unwrap_or_default()
        );
        let mut st = self.state();
        st.detail = None;
        st.journal = Some(j);
        Ok(())
    }

    /// This boot's id, `None` (logged) when it cannot be read: the reboot client's marker decides then.
    fn boot_id(&self) -> Option<String> {
        match crate::reboot::system::read_small(&self.boot_id) {
            Ok(b) if !b.is_empty() => Some(b),
            Ok(_) | Err(_) => {
                log::warn!(
                    "cannot read the boot id from {}: the journal records none, so the reboot client's marker \
                     decides whether the reboot happened",
                    self.boot_id.display()
                );
                None
            }
        }
    }

    fn set_detail(&self, d: impl Into<String>) {
        self.state().detail = Some(d.into());
    }

    fn run_id(&self) -> String {
        self.state()
            .journal
            .as_ref()
            .map(|j| j.attempt.run_uid.to_string())
            .unwrap_or_default()
    }

    /// Runs the journal's transaction from its durable phase to its end (or, while a reboot waits, for as long
    /// as the process lives). `Err` only when a crash point stopped it dead. At most one thread runs it.
    pub fn run(&self) -> Result<(), Crashed> {
        {
            let mut st = self.state();
            if st.running {
                return Ok(());
            }
            st.running = true;
        }
        let r = self.drive();
        self.state().running = false;
        match r {
            Ok(()) | Err(Halt::Stopped) => Ok(()),
            Err(Halt::Crashed(c)) => Err(c),
        }
    }

    fn drive(&self) -> Result<(), Halt> {
        loop {
            let Some(phase) = self.phase() else {
                return Ok(());
            };
            match phase {
                SystemJournalPhase::Accepted => {
                    self.transition(Event::Start, None, None)?;
                    self.faults.check("system-journal-upgrading")?;
                    self.upgrade()?;
                }
                // Only seen here if a journal write failed in between: never run apt twice.
                SystemJournalPhase::Upgrading => self.transition(
                    Event::NeedsRepair(SystemUpgradeReason::Interrupted),
                    None,
                    None,
                )?,
                SystemJournalPhase::Repairing => self.repair()?,
                SystemJournalPhase::Rebooting => self.reboot()?,
                SystemJournalPhase::Succeeded | SystemJournalPhase::Failed => return Ok(()),
            }
        }
    }

    fn upgrade(&self) -> Result<(), Halt> {
        let id = self.run_id();
        let apt = &self.deps.apt;
        for step in [Step::Update, Step::FullUpgrade] {
            self.set_detail(format!("running {}", step.command_line()));
            let out = match apt.run(step, &id) {
                Ok(o) => o,
                Err(e) => {
                    self.transition(
                        Event::AptFailed(SystemUpgradeReason::AptFailed),
                        Some(e.to_string()),
                        None,
                    )?;
                    return Ok(());
                }
            };
            if step == Step::FullUpgrade {
                self.faults.check("system-upgraded")?;
            }
            if !out.success() {
                let reason = out.signals.reason(step);
                let error = failure_text(step, &out);
                // A dpkg run that failed or was killed can leave packages unpacked but not configured.
                let event = if reason == SystemUpgradeReason::DpkgError
                    || (step == Step::FullUpgrade && out.timed_out)
                {
                    Event::NeedsRepair(reason)
                } else {
                    Event::AptFailed(reason)
                };
                self.transition(event, Some(error), Some(out.tail_text()))?;
                return Ok(());
            }
            if step == Step::FullUpgrade {
                let reboot = self.reboot_flag.exists() || out.signals.reboot_package;
                self.transition(Event::Upgraded { reboot }, None, Some(out.tail_text()))?;
            }
        }
        Ok(())
    }

    fn repair(&self) -> Result<(), Halt> {
        let id = self.run_id();
        let (reason, before) = {
            let st = self.state();
            let j = st.journal.as_ref();
            (
                j.and_then(|j| j.reason)
                    .unwrap_or(SystemUpgradeReason::Interrupted),
                j.and_then(|j| j.error.as_ref().map(|e| e.to_string())),
            )
        };
        let what = match (reason, before) {
            (SystemUpgradeReason::Interrupted, _) => {
                "apt-get full-upgrade was interrupted (the updater stopped during the upgrade); packages may be \
                 partly upgraded and apt is not run again for this run"
                    .to_string()
            }
            (_, Some(e)) => e,
            (r, None) => format!("{r:?}"),
        };
        self.set_detail(format!("running {}", Step::ConfigurePending.command_line()));
        let (event, error, tail) = match self.deps.apt.run(Step::ConfigurePending, &id) {
            Ok(out) if out.success() => (
                Event::Repaired(reason),
                format!("{what}; dpkg --configure -a completed"),
                Some(out.tail_text()),
            ),
            Ok(out) => (
                Event::Repaired(SystemUpgradeReason::DpkgError),
                format!(
                    "{what}; then {}; dpkg needs root repair (dpkg --audit)",
                    failure_text(Step::ConfigurePending, &out)
                ),
                Some(out.tail_text()),
            ),
            Err(e) => (
                Event::Repaired(SystemUpgradeReason::DpkgError),
                format!("{what}; then {e}"),
                None,
            ),
        };
        self.transition(event, Some(error), tail)?;
        Ok(())
    }

    fn reboot(&self) -> Result<(), Halt> {
        loop {
            match self.deps.rebooter.step() {
                Ok(RebootOutcome::Released) => {
                    self.transition(Event::Rebooted, None, None)?;
                    return Ok(());
                }
                Ok(RebootOutcome::NotNow(why)) => {
                    self.set_detail(format!("the upgrade needs a reboot; not now: {why}"));
                }
                Ok(RebootOutcome::Rebooting) => {
                    self.set_detail(
                        "rebooting: the FleetLock slot is taken and diagnostics are written",
                    );
                }
                Err(e) => {
                    self.transition(Event::RebootFailed(e.reason()), Some(e.to_string()), None)?;
                    return Ok(());
                }
            }
            std::thread::sleep(self.deps.reboot_retry);
        }
    }
}

fn failure_text(step: Step, out: &Outcome) -> String {
    if out.timed_out {
        format!(
            "{} ran longer than {:?} and was killed",
            step.command_line(),
            step.bound()
        )
    } else {
        format!(
            "{} exited with {}",
            step.command_line(),
            out.code
                .map_or_else(|| "a signal".to_string(), |c| c.to_string())
        )
    }
}

impl SystemDeps {
    /// A device's: apt from `/usr/bin`, the coordinated-reboot client `reboot_program` configured by
    /// `paths.reboot_config()`.
    pub fn production(paths: &Paths, reboot_program: PathBuf) -> Self {
        Self {
            apt: Apt::default(),
            rebooter: Box::new(super::reboot::Coordinated::new(
                reboot_program,
                paths.reboot_config(),
            )),
            reboot_retry: REBOOT_RETRY,
        }
    }
}
