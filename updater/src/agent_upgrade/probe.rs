//! The candidate probe: the candidate must be an ELF executable for this device's architecture (checked before
//! anything runs), then `<candidate> --self-test` runs as the agent user (uid, gid, supplementary groups, clean
//! environment), bounded and killed on time-out; its report's version must equal the target.

use super::elf;
use crate::child::{self, ChildError};
use crate::users::{self, UserIds};
use fleet_wire::probe::SELF_TEST_REPORT_MAX_BYTES;
use fleet_wire::{Architecture, SelfTestReport, UpgradeReason, Version};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// Why the probe did not pass.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ProbeError {
    /// `probe-failed` or `version-mismatch`.
    pub reason: UpgradeReason,
    /// For a person.
    pub message: String,
}

fn failed(message: String) -> ProbeError {
    ProbeError {
        reason: UpgradeReason::ProbeFailed,
        message,
    }
}

/// Runs the self-test probe of candidates as one user.
#[derive(Debug, Clone)]
pub struct Prober {
    user: String,
    bound: Duration,
    scripts: bool,
}

impl Prober {
    /// Probes as `user`, bounded by `bound` (production: [`fleet_wire::limits::PROBE_TIMEOUT`]).
    pub fn new(user: impl Into<String>, bound: Duration) -> Self {
        Self {
            user: user.into(),
            bound,
            scripts: false,
        }
    }

    /// Also lets `#!` scripts through the executable check (tests whose candidates are shell scripts); every
    /// other non-ELF file is still refused.
    pub fn allow_scripts(mut self) -> Self {
        self.scripts = true;
        self
    }

    fn check_executable(&self, candidate: &Path) -> Result<(), ProbeError> {
        if self.scripts {
            let mut head = [0u8; 2];
            let is_script = std::fs::File::open(candidate)
                .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut head))
                .is_ok_and(|()| head == *b"#!");
            if is_script {
                return Ok(());
            }
        }
        let arch = Architecture::current()
            .ok_or_else(|| failed("this device's architecture is not supported".into()))?;
        elf::check_file(candidate, arch).map_err(|e| failed(e.to_string()))
    }

    fn command(candidate: &Path, user: &UserIds) -> Command {
        let mut cmd = Command::new(candidate);
        cmd.arg("--self-test");
        child::as_user(&mut cmd, user);
        cmd
    }

    /// Runs the probe of `candidate` and checks its report against `target`.
    pub fn probe(&self, candidate: &Path, target: &Version) -> Result<SelfTestReport, ProbeError> {
        self.check_executable(candidate)?;
        let user =
            users::user_by_name(&self.user).map_err(|e| failed(format!("probe user: {e}")))?;
        let mut cmd = Self::command(candidate, &user);
        let finished = child::run_bounded(&mut cmd, self.bound, SELF_TEST_REPORT_MAX_BYTES + 1)
            .map_err(|e| match e {
                ChildError::TimedOut { bound, .. } => failed(format!(
                    "self-test did not finish within {bound:?} and was killed"
                )),
                e => failed(format!("self-test: {e}")),
            })?;
        let out = String::from_utf8_lossy(&finished.stdout);
        let line = out.trim();
        if line.is_empty() || line.contains('\n') {
            return Err(failed(format!(
                "self-test ({}) printed {} instead of exactly one report line; stderr: {}",
                finished.status,
                if line.is_empty() {
                    "nothing"
                } else {
                    "several lines"
                },
                finished.stderr_tail()
            )));
        }
        let report = SelfTestReport::parse(line.as_bytes())
            .map_err(|e| failed(format!("self-test report: {e}")))?;
        if &report.version != target {
            return Err(ProbeError {
                reason: UpgradeReason::VersionMismatch,
                message: format!(
                    "candidate reports version {}, the attempt targets {}",
                    report.version, target
                ),
            });
        }
        if !report.passed || !finished.status.success() {
            let why = report.first_failure().map_or_else(
                || format!("exit status {}", finished.status),
                |c| {
                    format!(
                        "check {} failed: {}",
                        c.name,
                        c.error.as_ref().map_or("", |e| e.as_str())
                    )
                },
            );
            return Err(failed(format!("self-test failed: {why}")));
        }
        Ok(report)
    }
}
