//! Workload health: the per-device `device-workload-status` records folded into bounded counts (running, failed,
//! pending) and one latest error, for a FleetDeployment (over its targeted devices) and for a Device. A workload
//! whose health check fails (`unhealthy`) counts as failed, its error saying so; one whose check has not passed
//! yet (`starting`) as pending. Pure.

use crate::crd::WorkloadHealth;
use fleet_wire::{
    BoundedText, DeviceWorkloadStatus, HealthState, WorkloadSpec, WorkloadState, WorkloadStatus,
};

/// Where one desired workload stands on one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Standing {
    Running,
    Failed,
    /// Failed, and counted as crash-looping too.
    CrashLooping,
    Pending,
}

/// How the device reports `w`: running only with the desired spec's digest; failed when the agent's last
/// reconcile of it failed or its container exited; pending otherwise (not reported yet, starting, being
/// replaced, no container).
fn standing(w: &WorkloadSpec, reported: Option<&WorkloadStatus>) -> Standing {
    let Some(r) = reported else {
        return Standing::Pending;
    };
    // A status of an older spec says nothing about this one.
    if r.spec_digest.as_ref().is_some_and(|d| *d != w.digest()) {
        return Standing::Pending;
    }
    match r.state {
        WorkloadState::Running => running(r),
        WorkloadState::CrashLooping => Standing::CrashLooping,
        WorkloadState::Failed | WorkloadState::Exited | WorkloadState::OomKilled => {
            Standing::Failed
        }
        WorkloadState::Starting | WorkloadState::Missing => Standing::Pending,
    }
}

/// A running workload by its health: failed when its check fails, pending while it has not passed yet, running
/// otherwise (no check, healthy, or a health a newer agent names that this operator does not know).
fn running(r: &WorkloadStatus) -> Standing {
    match r.health {
        Some(HealthState::Unhealthy) => Standing::Failed,
        Some(HealthState::Starting) => Standing::Pending,
        _ => Standing::Running,
    }
}

fn error_of(r: &WorkloadStatus) -> String {
    let exit = |code: Option<i32>| {
        code.map(|c| format!(", last exit code {c}"))
            .unwrap_or_default()
    };
    match (&r.error, r.state) {
        // The agent's text starts with `unhealthy: ` (what the failed check saw); said here whatever wrote it.
        (Some(e), WorkloadState::Running) if r.health == Some(HealthState::Unhealthy) => {
            if e.as_str().starts_with("unhealthy") {
                e.as_str().to_owned()
            } else {
                format!("unhealthy: {}", e.as_str())
            }
        }
        (None, WorkloadState::Running) if r.health == Some(HealthState::Unhealthy) => {
            "unhealthy".into()
        }
        (Some(e), _) => e.as_str().to_owned(),
        (None, WorkloadState::CrashLooping) => {
            let r = r.restarts.unwrap_or(fleet_wire::Restarts {
                count: 0,
                last_exit_code: None,
                oom_killed: false,
            });
            format!(
                "crash-looping: restarted {} times{}",
                r.count,
                exit(r.last_exit_code)
            )
        }
        (None, WorkloadState::Exited) => format!(
            "the container exited{}",
            exit(r.restarts.and_then(|r| r.last_exit_code))
        ),
        (None, _) => "failed".into(),
    }
}

/// Health of a deployment from each (device, workload placed there, that device's report), in device-name
/// order. The error shown is the one the first failing device (by name) last reported: stable while the same
/// devices fail, so the periodic re-publication of workload status causes no status writes.
pub fn deployment<'a>(
    placed: impl IntoIterator<Item = (&'a str, &'a WorkloadSpec, Option<&'a DeviceWorkloadStatus>)>,
) -> WorkloadHealth {
    let mut h = WorkloadHealth::default();
    for (device, w, status) in placed {
        let reported = status.and_then(|s| s.workloads.iter().find(|r| r.name == w.name));
        match standing(w, reported) {
            Standing::Running => h.running += 1,
            Standing::Pending => h.pending += 1,
            Standing::Failed | Standing::CrashLooping => {
                h.failed += 1;
                if standing(w, reported) == Standing::CrashLooping {
                    h.crash_looping += 1;
                }
                if let (None, Some(r)) = (&h.latest_error, reported) {
                    let text = format!("{device}: {}: {}", w.name.as_str(), error_of(r));
                    h.latest_error = Some(BoundedText::lossy(text).as_str().to_owned());
                }
            }
        }
    }
    h
}

/// Health of every workload a device reports.
pub fn device(status: &DeviceWorkloadStatus) -> WorkloadHealth {
    let mut h = WorkloadHealth::default();
    for r in &status.workloads {
        let standing = match r.state {
            WorkloadState::Running => running(r),
            WorkloadState::Failed
            | WorkloadState::Exited
            | WorkloadState::CrashLooping
            | WorkloadState::OomKilled => Standing::Failed,
            WorkloadState::Starting | WorkloadState::Missing => Standing::Pending,
        };
        match standing {
            Standing::Running => h.running += 1,
            Standing::Failed | Standing::CrashLooping => {
                h.failed += 1;
                if r.state == WorkloadState::CrashLooping {
                    h.crash_looping += 1;
                }
                if h.latest_error.is_none() {
                    let text = format!("{}: {}", r.name.as_str(), error_of(r));
                    h.latest_error = Some(BoundedText::lossy(text).as_str().to_owned());
                }
            }
            Standing::Pending => h.pending += 1,
        }
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_wire::{fixtures, WorkloadName};
    use std::time::Duration;

    fn st(w: &WorkloadSpec, state: WorkloadState, error: Option<&str>) -> WorkloadStatus {
        WorkloadStatus {
            name: w.name.clone(),
            state,
            container_id: None,
            spec_digest: matches!(state, WorkloadState::Running).then(|| w.digest()),
            started_at: None,
            error: error.map(BoundedText::lossy),
            failure: None,
            restarts: None,
            health: None,
        }
    }

    #[test]
    fn deployment_table() {
        let web = fixtures::workload("web");
        let db = fixtures::workload("db");
        let mut other = web.clone();
        other.image = "nginx:2".into();
        let mut a = fixtures::workload_status();
        a.workloads = vec![
            st(&web, WorkloadState::Running, None),
            st(&db, WorkloadState::Failed, Some("image pull failed: old")),
        ];
        let mut b = a.clone();
        b.at = a.at.plus(Duration::from_secs(5));
        b.workloads = vec![st(
            &db,
            WorkloadState::Failed,
            Some("image pull failed: new"),
        )];
        let mut stale = a.clone();
        stale.workloads = vec![st(&other, WorkloadState::Running, None)];
        let both = [web.clone(), db.clone()];
        fn on<'a>(
            both: &'a [WorkloadSpec],
            d: &'a str,
            s: Option<&'a DeviceWorkloadStatus>,
        ) -> Vec<(&'a str, &'a WorkloadSpec, Option<&'a DeviceWorkloadStatus>)> {
            both.iter().map(|w| (d, w, s)).collect()
        }
        let cases = vec![
            (vec![], (0, 0, 0), None),
            (
                on(&both, "d2", Some(&b)),
                (0, 1, 1),
                Some("d2: db: image pull failed: new"),
            ),
            (on(&both, "d1", None), (0, 0, 2), None),
            (
                on(&both, "d1", Some(&a)),
                (1, 1, 0),
                Some("d1: db: image pull failed: old"),
            ),
            (
                [on(&both, "d1", Some(&a)), on(&both, "d2", Some(&b))].concat(),
                (1, 2, 1),
                Some("d1: db: image pull failed: old"),
            ),
            (vec![("d1", &web, Some(&stale))], (0, 0, 1), None),
        ];
        for (i, (placed, (r, f, p), err)) in cases.into_iter().enumerate() {
            let h = deployment(placed);
            assert_eq!((h.running, h.failed, h.pending), (r, f, p), "case {i}");
            assert_eq!(h.latest_error.as_deref(), err, "case {i}");
        }
    }

    #[test]
    fn device_summary_and_bounded_error() {
        let mut s = fixtures::workload_status();
        let long = "x".repeat(5000);
        s.workloads.push(WorkloadStatus {
            name: WorkloadName::try_from("db").expect("name"),
            state: WorkloadState::Failed,
            container_id: None,
            spec_digest: None,
            started_at: None,
            error: Some(BoundedText::lossy(&long)),
            failure: None,
            restarts: None,
            health: None,
        });
        s.workloads.push(WorkloadStatus {
            name: WorkloadName::try_from("job").expect("name"),
            state: WorkloadState::Missing,
            container_id: None,
            spec_digest: None,
            started_at: None,
            error: None,
            failure: None,
            restarts: None,
            health: None,
        });
        let h = device(&s);
        assert_eq!((h.running, h.failed, h.pending), (1, 1, 1));
        let e = h.latest_error.expect("error");
        assert!(e.starts_with("db: xxx") && e.chars().count() <= 1024, "{e}");
    }

    /// Health counts: an unhealthy workload is failed with its error saying `unhealthy` (the agent's text, or the
    /// word alone), a `starting` one pending, a healthy one (or one a newer agent names otherwise) running; on a
    /// FleetDeployment and on a Device alike.
    #[test]
    fn unhealthy_workloads_count_as_failed() {
        use fleet_wire::HealthState::*;
        let web = fixtures::workload_with_health("web", "http");
        let with = |h: Option<HealthState>, error: Option<&str>| {
            let mut r = st(&web, WorkloadState::Running, error);
            r.health = h;
            let mut s = fixtures::workload_status();
            s.workloads = vec![r];
            s
        };
        let rows = [
            ("healthy", with(Some(Healthy), None), (1, 0, 0), None),
            ("starting", with(Some(Starting), None), (0, 0, 1), None),
            ("newer agent", with(Some(Unknown), None), (1, 0, 0), None),
            (
                "unhealthy, the agent's text",
                with(
                    Some(Unhealthy),
                    Some("unhealthy: GET /healthz on port 8080 answered HTTP 503"),
                ),
                (0, 1, 0),
                Some("web: unhealthy: GET /healthz on port 8080 answered HTTP 503"),
            ),
            (
                "unhealthy, other text",
                with(Some(Unhealthy), Some("HTTP 503")),
                (0, 1, 0),
                Some("web: unhealthy: HTTP 503"),
            ),
            (
                "unhealthy, no text",
                with(Some(Unhealthy), None),
                (0, 1, 0),
                Some("web: unhealthy"),
            ),
        ];
        for (name, status, (r, f, p), err) in rows {
            let h = device(&status);
            assert_eq!((h.running, h.failed, h.pending), (r, f, p), "{name}");
            assert_eq!(h.latest_error.as_deref(), err, "{name}");
            assert_eq!(h.crash_looping, 0, "{name}");
            let d = deployment([("d1", &web, Some(&status))]);
            assert_eq!((d.running, d.failed, d.pending), (r, f, p), "{name}");
            assert_eq!(d.latest_error, err.map(|e| format!("d1: {e}")), "{name}");
        }
    }
}
