//! Crash tests: for every durable step, the transaction stops dead there (fault injection), a fresh updater over
//! the same root runs start-up recovery, and the outcome is what the seed's recovery table prescribes: which
//! binary the symlink selects, the journal phase, the public phase, and which service calls recovery made.
#![cfg(feature = "fault-injection")]

mod common;

use common::*;
use fleet_updater::agent_upgrade::transaction::StartError;
use fleet_updater::fault::{Crashed, Faults, POINTS};
use fleet_wire::{ErrorCode, JournalPhase as J, Response, UpgradePhase as P, UpgradeReason as R};
use std::sync::atomic::Ordering;

/// How the first run is scripted before it crashes.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Scenario {
    /// Every service call succeeds.
    Ok,
    /// The candidate's start fails: the rollback path.
    StartFails,
    /// The candidate's and the previous agent's starts fail: rollback-failed.
    RollbackFails,
    /// The probe fails: preparation fails.
    ProbeFails,
}

struct Row {
    point: &'static str,
    scenario: Scenario,
    /// Starts that fail during recovery.
    recovery_start_failures: usize,
    /// Journal phase persisted before readiness (after the synchronous part of recovery).
    before_ready: J,
    /// Active binary after recovery.
    active: &'static str,
    journal: J,
    public: P,
    reason: Option<R>,
    /// Service calls recovery made.
    calls: &'static [&'static str],
}

#[allow(clippy::too_many_arguments)] // one table row, written positionally for readability
const fn row(
    point: &'static str,
    scenario: Scenario,
    recovery_start_failures: usize,
    before_ready: J,
    active: &'static str,
    journal: J,
    public: P,
    reason: Option<R>,
    calls: &'static [&'static str],
) -> Row {
    Row {
        point,
        scenario,
        recovery_start_failures,
        before_ready,
        active,
        journal,
        public,
        reason,
        calls,
    }
}

use Scenario::*;
const PREV: &str = PREVIOUS;
const TGT: &str = TARGET;
const START_PREV: &[&str] = &["start 1.1.0"];
const STOP_START_PREV: &[&str] = &["stop", "start 1.1.0"];
const NONE: &[&str] = &[];

/// The recovery table, row by row, for every crash point.
const TABLE: &[Row] = &[
    // preparing: restore the previous link, record failed (before readiness), start the previous service.
    row(
        "journal-preparing",
        Ok,
        0,
        J::Failed,
        PREV,
        J::Failed,
        P::Failed,
        Some(R::Interrupted),
        START_PREV,
    ),
    row(
        "fetched",
        Ok,
        0,
        J::Failed,
        PREV,
        J::Failed,
        P::Failed,
        Some(R::Interrupted),
        START_PREV,
    ),
    row(
        "installed",
        Ok,
        0,
        J::Failed,
        PREV,
        J::Failed,
        P::Failed,
        Some(R::Interrupted),
        START_PREV,
    ),
    row(
        "probed",
        Ok,
        0,
        J::Failed,
        PREV,
        J::Failed,
        P::Failed,
        Some(R::Interrupted),
        START_PREV,
    ),
    // preparing, and the start of the previous service fails: failed, then rollback-failed.
    row(
        "probed",
        Ok,
        1,
        J::Failed,
        PREV,
        J::RollbackFailed,
        P::RollbackFailed,
        Some(R::RestoreFailed),
        START_PREV,
    ),
    // activating: record rolling-back, restore the previous link, stop, start the previous service.
    row(
        "journal-activating",
        Ok,
        0,
        J::RollingBack,
        PREV,
        J::Failed,
        P::Failed,
        Some(R::Interrupted),
        STOP_START_PREV,
    ),
    row(
        "stopped",
        Ok,
        0,
        J::RollingBack,
        PREV,
        J::Failed,
        P::Failed,
        Some(R::Interrupted),
        STOP_START_PREV,
    ),
    row(
        "link-switched",
        Ok,
        0,
        J::RollingBack,
        PREV,
        J::Failed,
        P::Failed,
        Some(R::Interrupted),
        STOP_START_PREV,
    ),
    row(
        "started",
        Ok,
        0,
        J::RollingBack,
        PREV,
        J::Failed,
        P::Failed,
        Some(R::Interrupted),
        STOP_START_PREV,
    ),
    // activating, and the previous agent does not start: rollback-failed.
    row(
        "link-switched",
        Ok,
        1,
        J::RollingBack,
        PREV,
        J::RollbackFailed,
        P::RollbackFailed,
        Some(R::RestoreFailed),
        STOP_START_PREV,
    ),
    // committed: keep the target.
    row(
        "journal-committed",
        Ok,
        0,
        J::Committed,
        TGT,
        J::Committed,
        P::Complete,
        None,
        NONE,
    ),
    // rolling-back: restore the previous link and repeat stop/start.
    row(
        "journal-rolling-back",
        StartFails,
        0,
        J::RollingBack,
        PREV,
        J::Failed,
        P::Failed,
        Some(R::Interrupted),
        STOP_START_PREV,
    ),
    row(
        "link-restored",
        StartFails,
        0,
        J::RollingBack,
        PREV,
        J::Failed,
        P::Failed,
        Some(R::Interrupted),
        STOP_START_PREV,
    ),
    row(
        "rollback-stopped",
        StartFails,
        0,
        J::RollingBack,
        PREV,
        J::Failed,
        P::Failed,
        Some(R::Interrupted),
        STOP_START_PREV,
    ),
    row(
        "rollback-started",
        StartFails,
        0,
        J::RollingBack,
        PREV,
        J::Failed,
        P::Failed,
        Some(R::Interrupted),
        STOP_START_PREV,
    ),
    row(
        "rollback-started",
        StartFails,
        1,
        J::RollingBack,
        PREV,
        J::RollbackFailed,
        P::RollbackFailed,
        Some(R::RestoreFailed),
        STOP_START_PREV,
    ),
    // failed: keep the previous target; no automatic retry.
    row(
        "journal-failed",
        StartFails,
        0,
        J::Failed,
        PREV,
        J::Failed,
        P::Failed,
        Some(R::StartFailed),
        NONE,
    ),
    row(
        "journal-failed",
        ProbeFails,
        0,
        J::Failed,
        PREV,
        J::Failed,
        P::Failed,
        Some(R::ProbeFailed),
        NONE,
    ),
    // rollback-failed: refuse every new attempt until direct root repair.
    row(
        "journal-rollback-failed",
        RollbackFails,
        0,
        J::RollbackFailed,
        PREV,
        J::RollbackFailed,
        P::RollbackFailed,
        Some(R::RestoreFailed),
        NONE,
    ),
];

fn run_row(r: &Row) {
    let ctx = format!(
        "{} / {:?} / {} recovery start failures",
        r.point, r.scenario, r.recovery_start_failures
    );
    let dev = Device::new();
    let bytes = match r.scenario {
        ProbeFails => failing_candidate(TARGET),
        _ => candidate(TARGET),
    };
    let services = FakeServices::new(&dev);
    services.fail_starts.store(
        match r.scenario {
            StartFails => 1,
            RollbackFails => 2,
            _ => 0,
        },
        Ordering::SeqCst,
    );
    let attempt = attempt_for(&bytes, TARGET);
    {
        let (u, pending) = dev
            .open(
                fetcher_for(&bytes),
                services.clone(),
                Faults::crash_at(r.point),
            )
            .expect("open");
        assert!(pending.is_none());
        assert_eq!(
            u.upgrade_blocking(attempt.clone()).expect_err(&ctx),
            Crashed(r.point),
            "{ctx}"
        );
        // The updater is dropped here: all in-memory state gone, nothing cleaned up.
    }
    services.take_calls();
    services
        .fail_starts
        .store(r.recovery_start_failures, Ordering::SeqCst);
    let (u, pending) = dev
        .open(fetcher_for(&bytes), services.clone(), Faults::none())
        .expect(&ctx);
    // Before readiness: the previous link is selected (pre-commit) and the recovery phase is persisted.
    assert_eq!(
        dev.journal().expect("journal").phase,
        r.before_ready,
        "{ctx}: journal before readiness"
    );
    if r.active == PREV {
        assert_eq!(dev.active(), PREV, "{ctx}: link before readiness");
    }
    assert_eq!(u.status().recovering, pending.is_some(), "{ctx}");
    if let Some(p) = pending {
        u.finish_recovery(p).expect(&ctx);
    }
    assert!(!u.status().recovering, "{ctx}");
    assert_eq!(dev.active(), r.active, "{ctx}: active binary");
    let j = dev.journal().expect("journal");
    assert_eq!(j.phase, r.journal, "{ctx}: journal phase");
    let status = u.status().agent_upgrade.expect("status");
    assert_eq!(
        (status.phase, status.reason),
        (r.public, r.reason),
        "{ctx}: public phase"
    );
    assert_eq!(services.take_calls(), r.calls, "{ctx}: service calls");
    // A restart after recovery changes nothing more.
    drop(u);
    let (u, pending) = dev
        .open(fetcher_for(&bytes), services.clone(), Faults::none())
        .expect(&ctx);
    assert!(pending.is_none(), "{ctx}: recovery is finished");
    assert_eq!(dev.journal().expect("journal").phase, r.journal, "{ctx}");
    // No automatic retry: the same attempt answers its status; quarantine refuses a new one.
    match u.upgrade_blocking(attempt).expect("no crash") {
        Response::Accepted { status } => {
            assert_eq!(
                status.agent_upgrade.expect("status").phase,
                r.public,
                "{ctx}"
            )
        }
        other => panic!("{ctx}: {other:?}"),
    }
    let next = attempt_for(&candidate("1.3.0"), "1.3.0");
    let answer = u.upgrade_blocking(next).expect("no crash");
    if r.journal == J::RollbackFailed {
        assert!(
            matches!(
                answer,
                Response::Error {
                    code: ErrorCode::Quarantined,
                    ..
                }
            ),
            "{ctx}: {answer:?}"
        );
    } else {
        assert!(
            matches!(answer, Response::Accepted { .. }),
            "{ctx}: {answer:?}"
        );
    }
}

#[test]
fn every_crash_point_recovers_as_the_table_prescribes() {
    require_agent_user();
    for p in POINTS {
        assert!(
            TABLE.iter().any(|r| r.point == *p),
            "crash point {p} has no row"
        );
    }
    for r in TABLE {
        run_row(r);
    }
}

#[test]
fn a_crash_during_recovery_is_recovered_again() {
    require_agent_user();
    let dev = Device::new();
    let bytes = candidate(TARGET);
    let services = FakeServices::new(&dev);
    let a = attempt_for(&bytes, TARGET);
    let (u, _) = dev
        .open(
            fetcher_for(&bytes),
            services.clone(),
            Faults::crash_at("link-switched"),
        )
        .expect("open");
    u.upgrade_blocking(a).expect_err("crash");
    drop(u);
    // Recovery itself crashes after persisting rolling-back, then after restoring the link, then mid stop/start.
    for point in ["journal-rolling-back", "link-restored"] {
        let e = dev
            .open(
                fetcher_for(&bytes),
                services.clone(),
                Faults::crash_at(point),
            )
            .err()
            .expect("recovery crashes");
        assert!(
            matches!(e, StartError::Crashed(Crashed(p)) if p == point),
            "{e}"
        );
    }
    let (u, pending) = dev
        .open(
            fetcher_for(&bytes),
            services.clone(),
            Faults::crash_at("rollback-stopped"),
        )
        .expect("open");
    assert_eq!(
        u.finish_recovery(pending.expect("pending")),
        Err(Crashed("rollback-stopped"))
    );
    drop(u);
    let (u, pending) = dev
        .open(fetcher_for(&bytes), services.clone(), Faults::none())
        .expect("open");
    u.finish_recovery(pending.expect("pending"))
        .expect("recovers");
    assert_eq!(dev.active(), PREVIOUS);
    let j = dev.journal().expect("journal");
    assert_eq!(j.phase, J::Failed);
    let phases = j.transitions.phases();
    assert_eq!(
        phases,
        [
            J::Preparing,
            J::Activating,
            J::RollingBack,
            J::RollingBack,
            J::RollingBack,
            J::RollingBack,
            J::Failed
        ]
    );
}

/// A power cut during start-up recovery, while the previous agent is being started: systemd goes away mid-call.
/// That says nothing about the previous agent, so nothing is journaled (no rollback-failed, no quarantine), and
/// the next boot's recovery starts it and records failed/interrupted. (Found by `vm-tests/tests/powercut.rs`,
/// seed 1796317012655802737: "rollback-failed at the cut … D-Bus connection terminated".)
#[test]
fn the_service_manager_going_away_during_recovery_is_no_verdict() {
    require_agent_user();
    let dev = Device::new();
    let bytes = candidate(TARGET);
    let services = FakeServices::new(&dev);
    let a = attempt_for(&bytes, TARGET);
    let (u, _) = dev
        .open(
            fetcher_for(&bytes),
            services.clone(),
            Faults::crash_at("link-switched"),
        )
        .expect("open");
    u.upgrade_blocking(a).expect_err("crash");
    drop(u);
    services.manager_gone_starts.store(1, Ordering::SeqCst);
    let (u, pending) = dev
        .open(fetcher_for(&bytes), services.clone(), Faults::none())
        .expect("open");
    u.finish_recovery(pending.expect("pending"))
        .expect("stops without a verdict");
    assert_eq!(dev.journal().expect("journal").phase, J::RollingBack);
    drop(u);
    let (u, pending) = dev
        .open(fetcher_for(&bytes), services.clone(), Faults::none())
        .expect("the next boot opens");
    u.finish_recovery(pending.expect("pending"))
        .expect("recovers");
    assert_eq!(dev.active(), PREVIOUS);
    let j = dev.journal().expect("journal");
    assert_eq!((j.phase, j.reason), (J::Failed, Some(R::Interrupted)));
}

#[test]
fn a_corrupt_journal_stops_the_updater_before_anything_else() {
    let dev = Device::new();
    let services = FakeServices::new(&dev);
    std::fs::create_dir_all(dev.paths.state_dir()).expect("mkdir");
    for bad in [&b"{\"format\":1,"[..], b"not json", b"{}"] {
        std::fs::write(dev.paths.journal(), bad).expect("write");
        let e = dev
            .open(fetcher_for(b"x"), services.clone(), Faults::none())
            .err()
            .expect("refused");
        let msg = e.to_string();
        assert!(matches!(e, StartError::Journal(_)), "{msg}");
        assert!(
            msg.contains(&dev.paths.journal().display().to_string()) && msg.contains("inspect"),
            "{msg}"
        );
    }
    assert!(services.take_calls().is_empty());
    assert_eq!(dev.active(), PREVIOUS);
}

#[test]
fn status_answers_on_the_socket_while_recovery_restarts_the_agent() {
    use fleet_updater::socket::{self, ServerConfig};
    use std::io::{BufRead, BufReader, Write};
    use std::os::unix::net::UnixStream;
    use std::sync::Arc;

    require_agent_user();
    let dev = Device::new();
    let bytes = candidate(TARGET);
    let services = FakeServices::new(&dev);
    let (u, _) = dev
        .open(
            fetcher_for(&bytes),
            services.clone(),
            Faults::crash_at("link-switched"),
        )
        .expect("open");
    u.upgrade_blocking(attempt_for(&bytes, TARGET))
        .expect_err("crash");
    drop(u);
    let gate = Arc::new(Gate::default());
    *services.start_gate.lock().expect("lock") = Some(gate.clone());
    let (u, pending) = dev
        .open(fetcher_for(&bytes), services.clone(), Faults::none())
        .expect("open");
    let gid = fleet_updater::users::group_gid("fleet-agent").expect("group");
    let listener = socket::bind(&dev.paths, gid).expect("bind");
    socket::spawn(listener, u.clone(), ServerConfig::new(0)).expect("serve");
    let recovery = {
        let u = u.clone();
        let p = pending.expect("pending");
        std::thread::spawn(move || u.finish_recovery(p))
    };
    let status = || -> fleet_wire::UpdaterStatus {
        let mut s = UnixStream::connect(dev.paths.socket()).expect("connect");
        s.write_all(b"{\"protocol\":1,\"request\":{\"op\":\"status\"}}\n")
            .expect("write");
        let mut line = String::new();
        BufReader::new(&s).read_line(&mut line).expect("read");
        match serde_json::from_str::<fleet_wire::ResponseFrame>(&line)
            .expect("json")
            .response
        {
            Response::Status { status } => status,
            other => panic!("{other:?}"),
        }
    };
    // The start of the previous agent is held: status answers, recovering, rolling back.
    let s = status();
    assert!(s.recovering);
    assert_eq!(s.agent_upgrade.expect("status").phase, P::RollingBack);
    gate.open();
    recovery.join().expect("thread").expect("recovers");
    let s = status();
    assert!(!s.recovering);
    assert_eq!(s.agent_upgrade.expect("status").phase, P::Failed);
}

#[test]
fn a_crash_after_recovery_records_failed_keeps_failed() {
    require_agent_user();
    let dev = Device::new();
    let bytes = candidate(TARGET);
    let services = FakeServices::new(&dev);
    let (u, _) = dev
        .open(
            fetcher_for(&bytes),
            services.clone(),
            Faults::crash_at("probed"),
        )
        .expect("open");
    u.upgrade_blocking(attempt_for(&bytes, TARGET))
        .expect_err("crash");
    drop(u);
    // Recovery of `preparing` persists `failed` before it starts anything, then crashes.
    let e = dev
        .open(
            fetcher_for(&bytes),
            services.clone(),
            Faults::crash_at("journal-failed"),
        )
        .err()
        .expect("recovery crashes");
    assert!(
        matches!(e, StartError::Crashed(Crashed("journal-failed"))),
        "{e}"
    );
    assert_eq!(dev.journal().expect("journal").phase, J::Failed);
    assert!(services.take_calls().is_empty(), "nothing started yet");
    // The next start keeps `failed`: preparation never stopped the agent, and a boot starts it.
    let (_u, pending) = dev
        .open(fetcher_for(&bytes), services.clone(), Faults::none())
        .expect("open");
    assert!(pending.is_none());
    assert_eq!(dev.active(), PREVIOUS);
    let j = dev.journal().expect("journal");
    assert_eq!(j.transitions.phases(), [J::Preparing, J::Failed]);
}

/// A power cut between staging a durable write and its rename (the loop in vm-tests/tests/powercut.rs cuts at
/// random moments) leaves the staged temporary files: a journal copy and a temporary symlink that selects the
/// candidate. The next start removes them and keeps what the renames had made durable.
#[test]
fn a_cut_between_stage_and_rename_leaves_nothing_behind_after_the_next_start() {
    use fleet_wire::durable::{stage, temp_beside};
    let dev = Device::new();
    let bytes = candidate(TARGET);
    std::fs::create_dir_all(dev.paths.state_dir()).expect("state dir");
    let mut stale = vec![];
    for target in [dev.paths.journal(), dev.paths.system_journal()] {
        let tmp = temp_beside(&target).expect("temp name");
        stage(&tmp, b"{\"format\":1}", 0o600).expect("stage");
        stale.push(tmp);
    }
    let tmp_link = temp_beside(&dev.paths.active_link()).expect("temp name");
    std::os::unix::fs::symlink(dev.binary(TARGET), &tmp_link).expect("temp symlink");
    stale.push(tmp_link);

    let services = FakeServices::new(&dev);
    let (_u, pending) = dev
        .open(fetcher_for(&bytes), services.clone(), Faults::none())
        .expect("open");
    assert!(pending.is_none());
    for p in &stale {
        assert!(
            std::fs::symlink_metadata(p).is_err(),
            "{} survived the start",
            p.display()
        );
    }
    assert_eq!(dev.active(), PREVIOUS);
    assert!(
        dev.journal().is_none(),
        "a staged journal was taken for one"
    );
    assert!(services.take_calls().is_empty());
}
