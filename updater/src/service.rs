//! The narrow service-manager interface the cutover needs, and its production implementation (`systemctl`).

use crate::child;
use fleet_wire::UnitName;
use std::process::Command;
use std::time::Duration;

/// A service operation failed or ran past its bound.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ServiceError(pub String);

/// What `systemctl` prints when the service manager itself is going away (a shutdown, or PID 1 gone at a power
/// cut) rather than when the unit failed.
const MANAGER_GONE: [&str; 7] = [
    "D-Bus connection terminated",
    "Connection reset by peer",
    "Failed to connect to bus",
    "Transport endpoint is not connected",
    "System has not been booted with systemd",
    "is destructive",
    "shutdown.target",
];

impl ServiceError {
    /// The service manager went away (or is shutting down) during the operation: it says nothing about the unit,
    /// so a caller must not judge the unit by it.
    pub fn manager_gone(&self) -> bool {
        MANAGER_GONE.iter().any(|m| self.0.contains(m))
    }
}

/// Stops and starts the agent's unit. `start` returns once the unit is active (after `READY=1` for
/// `Type=notify`), or fails.
pub trait ServiceManager: Send + Sync {
    /// Stops `unit`, waiting at most `bound`; returns once it is inactive.
    fn stop(&self, unit: &UnitName, bound: Duration) -> Result<(), ServiceError>;
    /// Starts `unit`, waiting at most `bound`; returns once it is active.
    fn start(&self, unit: &UnitName, bound: Duration) -> Result<(), ServiceError>;
}

/// `systemctl` of the host's system manager.
#[derive(Debug, Clone)]
pub struct Systemctl {
    program: std::path::PathBuf,
}

impl Default for Systemctl {
    fn default() -> Self {
        Self {
            program: "systemctl".into(),
        }
    }
}

impl Systemctl {
    /// Runs `program` instead of `systemctl` (tests).
    pub fn with_program(program: impl Into<std::path::PathBuf>) -> Self {
        Self {
            program: program.into(),
        }
    }
}

const OUTPUT_MAX_BYTES: usize = 16 * 1024;

fn systemctl(
    program: &std::path::Path,
    args: &[&str],
    bound: Duration,
) -> Result<child::Finished, ServiceError> {
    let mut cmd = Command::new(program);
    cmd.args(args);
    let f = child::run_bounded(&mut cmd, bound, OUTPUT_MAX_BYTES)
        .map_err(|e| ServiceError(e.to_string()))?;
    if f.status.success() {
        Ok(f)
    } else {
        Err(ServiceError(format!(
            "systemctl {} failed ({}): {}",
            args.join(" "),
            f.status,
            f.stderr_tail()
        )))
    }
}

impl ServiceManager for Systemctl {
    fn stop(&self, unit: &UnitName, bound: Duration) -> Result<(), ServiceError> {
        systemctl(&self.program, &["stop", unit.as_str()], bound).map(|_| ())
    }

    fn start(&self, unit: &UnitName, bound: Duration) -> Result<(), ServiceError> {
        systemctl(&self.program, &["start", unit.as_str()], bound).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn script(dir: &std::path::Path, body: &str) -> std::path::PathBuf {
        let p = dir.join(format!("systemctl-{}", body.len()));
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).expect("write");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        p
    }

    #[test]
    fn runs_bounded_and_reports_failures() {
        let d = tempfile::tempdir().expect("tmp");
        let unit = UnitName::try_from("fleet-agent.service").expect("unit");
        let log = d.path().join("log");
        let ok = script(d.path(), &format!("echo \"$@\" >> {}", log.display()));
        let s = Systemctl::with_program(&ok);
        s.stop(&unit, Duration::from_secs(10)).expect("stop");
        s.start(&unit, Duration::from_secs(10)).expect("start");
        assert_eq!(
            std::fs::read_to_string(&log).expect("log"),
            "stop fleet-agent.service\nstart fleet-agent.service\n"
        );
        let failing = script(
            d.path(),
            "echo 'Job for fleet-agent.service failed' >&2; exit 1",
        );
        let e = Systemctl::with_program(&failing)
            .start(&unit, Duration::from_secs(10))
            .expect_err("fails");
        assert!(e.0.contains("Job for fleet-agent.service failed"), "{e}");
        assert!(!e.manager_gone(), "a failed unit is the unit's failure");
        // PID 1 went away mid-call (as at a power cut in the test devices), or a shutdown is under way.
        for said in [
            "Warning! D-Bus connection terminated. | Failed to wait for response: Connection reset by peer",
            "Failed to start fleet-agent.service: Transaction for fleet-agent.service/start is destructive (shutdown.target has 'start' job queued, but 'stop' is included in transaction).",
        ] {
            let gone = script(d.path(), &format!("echo '{said}' >&2; exit 1"));
            let e = Systemctl::with_program(&gone)
                .start(&unit, Duration::from_secs(10))
                .expect_err("fails");
            assert!(e.manager_gone(), "{e}");
        }
        let hanging = script(d.path(), "sleep 60");
        let e = Systemctl::with_program(&hanging)
            .stop(&unit, Duration::from_millis(300))
            .expect_err("times out");
        assert!(e.0.contains("killed"), "{e}");
    }
}
