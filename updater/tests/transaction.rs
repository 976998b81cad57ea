//! The transaction end to end on a temp root: real install and real probe (as user fleet-agent), a local fetcher,
//! and the scripted service manager.

mod common;

use common::*;
use fleet_updater::agent_upgrade::probe::Prober;
use fleet_updater::fault::Faults;
use fleet_wire::{ErrorCode, JournalPhase, Response, UpgradePhase, UpgradeReason, Version};
use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

fn phase_of(r: &Response) -> (UpgradePhase, Option<UpgradeReason>) {
    match r {
        Response::Accepted { status } => {
            let a = status.agent_upgrade.as_ref().expect("agent upgrade status");
            (a.phase, a.reason)
        }
        other => panic!("not accepted: {other:?}"),
    }
}

fn error_code(r: &Response) -> ErrorCode {
    match r {
        Response::Error { code, .. } => *code,
        other => panic!("not an error: {other:?}"),
    }
}

#[test]
fn success_installs_switches_and_commits() {
    require_agent_user();
    let dev = Device::new();
    let bytes = candidate(TARGET);
    let services = FakeServices::new(&dev);
    let (u, pending) = dev
        .open(fetcher_for(&bytes), services.clone(), Faults::none())
        .expect("open");
    assert!(pending.is_none());
    let a = attempt_for(&bytes, TARGET);
    let r = u.upgrade_blocking(a.clone()).expect("no crash");
    assert_eq!(phase_of(&r), (UpgradePhase::Complete, None));
    assert_eq!(dev.active(), TARGET);
    assert_eq!(services.take_calls(), ["stop", "start 1.2.0"]);
    let installed = dev.binary(TARGET);
    assert_eq!(std::fs::read(&installed).expect("read"), bytes);
    assert_eq!(
        std::fs::metadata(&installed)
            .expect("meta")
            .permissions()
            .mode()
            & 0o777,
        0o755
    );
    let j = dev.journal().expect("journal");
    assert_eq!(j.phase, JournalPhase::Committed);
    assert!(j.drain_duration_ms.is_some());
    let phases = j.transitions.phases();
    assert_eq!(
        phases,
        [
            JournalPhase::Preparing,
            JournalPhase::Activating,
            JournalPhase::Committed
        ]
    );
    let status = u.status().agent_upgrade.expect("status");
    let public = status.transitions.phases();
    assert_eq!(
        public,
        [
            UpgradePhase::Preparing,
            UpgradePhase::Stopping,
            UpgradePhase::Starting,
            UpgradePhase::Complete
        ],
        "append-only: starting stays after commit"
    );
    assert!(j.starting_at.is_some());
    assert_eq!(status.attempt_digest, Some(a.digest()));
    // Idempotent: the same attempt answers the current status and runs nothing.
    let again = u.upgrade_blocking(a.clone()).expect("no crash");
    assert_eq!(phase_of(&again), (UpgradePhase::Complete, None));
    assert!(services.take_calls().is_empty());
    // A reused id with other content is refused.
    let mut changed = a.clone();
    changed.target_version = Version::try_from("1.3.0").expect("v");
    assert_eq!(
        error_code(&u.upgrade_blocking(changed).expect("no crash")),
        ErrorCode::Conflict
    );
    // The download directory holds nothing afterwards.
    let leftovers = std::fs::read_dir(dev.paths.download_dir())
        .expect("ls")
        .count();
    assert_eq!(leftovers, 0);
}

#[test]
fn probe_failures_fail_without_touching_the_agent() {
    require_agent_user();
    for (bytes, reason) in [
        (failing_candidate(TARGET), UpgradeReason::ProbeFailed),
        (candidate("1.2.1"), UpgradeReason::VersionMismatch),
    ] {
        let dev = Device::new();
        let services = FakeServices::new(&dev);
        let fetcher = fetcher_for(&bytes);
        let calls = fetcher.calls.clone();
        let (u, _) = dev
            .open(fetcher, services.clone(), Faults::none())
            .expect("open");
        let a = attempt_for(&bytes, TARGET);
        let r = u.upgrade_blocking(a.clone()).expect("no crash");
        assert_eq!(phase_of(&r), (UpgradePhase::Failed, Some(reason)));
        assert_eq!(dev.active(), PREVIOUS);
        assert!(
            services.take_calls().is_empty(),
            "the old agent keeps running"
        );
        assert_eq!(dev.journal().expect("journal").phase, JournalPhase::Failed);
        // A failed attempt is never retried: sending it again answers its status.
        let again = u.upgrade_blocking(a).expect("no crash");
        assert_eq!(phase_of(&again), (UpgradePhase::Failed, Some(reason)));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        // A new attempt is accepted after a failure.
        let next = attempt_for(&candidate(TARGET), TARGET);
        assert!(matches!(
            u.upgrade_blocking(next).expect("no crash"),
            Response::Accepted { .. }
        ));
    }
}

#[test]
fn digest_mismatch_and_reverification() {
    require_agent_user();
    let dev = Device::new();
    let bytes = candidate(TARGET);
    let services = FakeServices::new(&dev);
    let (u, _) = dev
        .open(
            fetcher_for(b"something else"),
            services.clone(),
            Faults::none(),
        )
        .expect("open");
    let r = u
        .upgrade_blocking(attempt_for(&bytes, TARGET))
        .expect("no crash");
    assert_eq!(
        phase_of(&r),
        (UpgradePhase::Failed, Some(UpgradeReason::DigestMismatch))
    );
    assert!(!dev.binary(TARGET).exists());
    drop(u);
    // An already-present binary is re-verified, not downloaded again.
    std::fs::write(dev.binary(TARGET), &bytes).expect("write");
    std::fs::set_permissions(dev.binary(TARGET), std::fs::Permissions::from_mode(0o755))
        .expect("chmod");
    let fetcher = fetcher_for(&bytes);
    let calls = fetcher.calls.clone();
    let (u, _) = dev
        .open(fetcher, services.clone(), Faults::none())
        .expect("open");
    let r = u
        .upgrade_blocking(attempt_for(&bytes, TARGET))
        .expect("no crash");
    assert_eq!(phase_of(&r), (UpgradePhase::Complete, None));
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    // A present binary with other content is a digest mismatch, never overwritten silently.
    let other = candidate("1.3.0");
    std::fs::write(dev.binary("1.3.0"), b"tampered").expect("write");
    let r = u
        .upgrade_blocking(attempt_for(&other, "1.3.0"))
        .expect("no crash");
    assert_eq!(
        phase_of(&r),
        (UpgradePhase::Failed, Some(UpgradeReason::DigestMismatch))
    );
    assert_eq!(dev.active(), TARGET);
}

#[test]
fn failed_start_rolls_back_and_failed_rollback_quarantines() {
    require_agent_user();
    let dev = Device::new();
    let bytes = candidate(TARGET);
    let services = FakeServices::new(&dev);
    services.fail_starts.store(1, Ordering::SeqCst);
    let (u, _) = dev
        .open(fetcher_for(&bytes), services.clone(), Faults::none())
        .expect("open");
    let r = u
        .upgrade_blocking(attempt_for(&bytes, TARGET))
        .expect("no crash");
    assert_eq!(
        phase_of(&r),
        (UpgradePhase::Failed, Some(UpgradeReason::StartFailed))
    );
    assert_eq!(dev.active(), PREVIOUS);
    assert_eq!(
        services.take_calls(),
        ["stop", "start 1.2.0", "stop", "start 1.1.0"]
    );
    let j = dev.journal().expect("journal");
    let phases = j.transitions.phases();
    assert_eq!(
        phases,
        [
            JournalPhase::Preparing,
            JournalPhase::Activating,
            JournalPhase::RollingBack,
            JournalPhase::Failed
        ]
    );
    assert!(j
        .error
        .expect("error")
        .as_str()
        .contains("scripted start failure"));

    // A stop failure rolls back too.
    services.fail_stops.store(1, Ordering::SeqCst);
    let v = candidate("1.3.0");
    let (u, _) = {
        drop(u);
        dev.open(fetcher_for(&v), services.clone(), Faults::none())
            .expect("open")
    };
    let r = u
        .upgrade_blocking(attempt_for(&v, "1.3.0"))
        .expect("no crash");
    assert_eq!(
        phase_of(&r),
        (UpgradePhase::Failed, Some(UpgradeReason::StopFailed))
    );
    assert_eq!(dev.active(), PREVIOUS);
    services.take_calls();

    // Both starts fail: rollback-failed, and every new attempt is refused.
    services.fail_starts.store(2, Ordering::SeqCst);
    let w = candidate("1.4.0");
    drop(u);
    let (u, _) = dev
        .open(fetcher_for(&w), services.clone(), Faults::none())
        .expect("open");
    let a = attempt_for(&w, "1.4.0");
    let r = u.upgrade_blocking(a.clone()).expect("no crash");
    assert_eq!(
        phase_of(&r),
        (
            UpgradePhase::RollbackFailed,
            Some(UpgradeReason::RestoreFailed)
        )
    );
    assert_eq!(
        dev.active(),
        PREVIOUS,
        "the previous link is restored even though its start failed"
    );
    let next = attempt_for(&candidate("1.5.0"), "1.5.0");
    assert_eq!(
        error_code(&u.upgrade_blocking(next.clone()).expect("no crash")),
        ErrorCode::Quarantined
    );
    assert_eq!(
        phase_of(&u.upgrade_blocking(a).expect("no crash")).0,
        UpgradePhase::RollbackFailed
    );
    // Restarting the updater keeps the quarantine.
    drop(u);
    let (u, pending) = dev
        .open(fetcher_for(&w), services.clone(), Faults::none())
        .expect("open");
    assert!(pending.is_none());
    assert_eq!(
        error_code(&u.upgrade_blocking(next).expect("no crash")),
        ErrorCode::Quarantined
    );
}

#[test]
fn invalid_attempts_are_refused() {
    let dev = Device::new();
    let services = FakeServices::new(&dev);
    let (u, _) = dev
        .open(fetcher_for(b"x"), services, Faults::none())
        .expect("open");
    let mut a = attempt_for(b"x", TARGET);
    a.architecture = match a.architecture {
        fleet_wire::Architecture::Amd64 => fleet_wire::Architecture::Arm64,
        fleet_wire::Architecture::Arm64 => fleet_wire::Architecture::Amd64,
    };
    assert_eq!(
        error_code(&u.upgrade_blocking(a).expect("no crash")),
        ErrorCode::Invalid
    );
    std::fs::remove_file(dev.paths.active_link()).expect("rm");
    let r = u
        .upgrade_blocking(attempt_for(b"x", TARGET))
        .expect("no crash");
    assert_eq!(error_code(&r), ErrorCode::Internal);
    assert!(
        dev.journal().is_none(),
        "nothing is journaled for a refused attempt"
    );
}

#[test]
fn probe_runs_as_the_agent_user_with_a_clean_environment() {
    require_agent_user();
    let dev = Device::new();
    let path = dev.binary(PREVIOUS);
    let user = fleet_updater::users::user_by_name("fleet-agent").expect("user");
    let report = Prober::new("fleet-agent", Duration::from_secs(60))
        .allow_scripts()
        .probe(&path, &Version::try_from(PREVIOUS).expect("v"))
        .expect("passes");
    let groups: Vec<String> = user.groups.iter().map(|g| g.to_string()).collect();
    let ids = format!("ids {} {} {}", user.uid, user.gid, groups.join(" "));
    assert_eq!(report.checks[0].name.trim(), ids);
    let env: Vec<&str> = report.checks[1].name.split_whitespace().skip(1).collect();
    for name in &env {
        assert!(
            ["HOME", "LANG", "LOGNAME", "PATH", "PWD", "USER", "SHLVL", "OLDPWD", "_"]
                .contains(name),
            "unexpected variable {name} in the probe's environment: {env:?}"
        );
    }
    assert!(env.contains(&"HOME") && env.contains(&"PATH"));
}

#[test]
fn probe_is_killed_at_its_bound() {
    require_agent_user();
    let dev = Device::new();
    let slow = dev.binary("9.9.9");
    std::fs::write(&slow, "#!/bin/sh\nsleep 60 &\nsleep 60\n").expect("write");
    std::fs::set_permissions(&slow, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let started = Instant::now();
    let e = Prober::new("fleet-agent", Duration::from_millis(500))
        .allow_scripts()
        .probe(&slow, &Version::try_from("9.9.9").expect("v"))
        .expect_err("times out");
    assert_eq!(e.reason, UpgradeReason::ProbeFailed);
    assert!(e.message.contains("killed"), "{e}");
    assert!(started.elapsed() < Duration::from_secs(30));
}

#[test]
fn success_over_real_https_with_the_production_fetcher() {
    require_agent_user();
    let dev = Device::new();
    let bytes = candidate(TARGET);
    let ca = fleet_rig::tls::TestCa::new();
    let server =
        fleet_rig::https::HttpsServer::serve(&ca, fleet_rig::https::Reply::ok(bytes.clone()));
    let fetcher = fleet_updater::fetch_runner::production(
        fetch_helper_in(dev.dir.path()),
        "fleet-agent",
        Some(ca.ca_file()),
    )
    .expect("fetcher");
    let services = FakeServices::new(&dev);
    let (u, _) = fleet_updater::agent_upgrade::transaction::Updater::open(
        dev.paths.clone(),
        fleet_wire::UnitName::try_from("fleet-agent.service").expect("unit"),
        fleet_updater::agent_upgrade::transaction::Deps {
            fetcher: Box::new(fetcher),
            services: services.clone(),
            prober: Prober::new("fleet-agent", Duration::from_secs(60)).allow_scripts(),
            faults: Faults::none(),
            system: dev.system_deps(Vec::new()),
            device_id: None,
        },
        fleet_updater::agent_upgrade::transaction::Bounds::default(),
    )
    .expect("open");
    let mut a = attempt_for(&bytes, TARGET);
    a.artifact = server.url("/fleet-agent-1.2.0").parse().expect("url");
    let r = u.upgrade_blocking(a).expect("no crash");
    assert_eq!(phase_of(&r), (UpgradePhase::Complete, None));
    assert_eq!(dev.active(), TARGET);
    assert_eq!(std::fs::read(dev.binary(TARGET)).expect("read"), bytes);
    // A wrong digest over the network fails with the fetcher's typed reason and leaves nothing behind.
    let mut bad = attempt_for(b"other bytes", "1.3.0");
    bad.artifact = server.url("/fleet-agent-1.3.0").parse().expect("url");
    let r = u.upgrade_blocking(bad).expect("no crash");
    assert_eq!(
        phase_of(&r),
        (UpgradePhase::Failed, Some(UpgradeReason::DigestMismatch))
    );
    assert_eq!(
        std::fs::read_dir(dev.paths.download_dir())
            .expect("ls")
            .count(),
        0
    );
    assert!(!dev.binary("1.3.0").exists());
}

/// The executable check before the probe, with the production prober (no scripts): a script, a blob and an ELF
/// for the other architecture are refused before anything runs, with a printable, bounded error.
#[test]
fn a_candidate_that_is_not_an_elf_for_this_device_is_never_run() {
    require_agent_user();
    let dev = Device::new();
    let marker = dev.dir.path().join("ran");
    let script = format!("#!/bin/sh\ntouch {}\n", marker.display()).into_bytes();
    let mut blob: Vec<u8> = (0u8..=255).cycle().take(4096).collect();
    blob[..4].copy_from_slice(b"\x1b[2J");
    // This test binary's own header with the other architecture's machine number.
    let mut other_arch = std::fs::read(std::env::current_exe().expect("exe")).expect("read exe");
    other_arch.truncate(4096);
    let other = match fleet_wire::Architecture::current().expect("arch") {
        fleet_wire::Architecture::Amd64 => 183u16,
        fleet_wire::Architecture::Arm64 => 62u16,
    };
    other_arch[18..20].copy_from_slice(&other.to_le_bytes());
    let services = FakeServices::new(&dev);
    for (i, (bytes, want)) in [
        (script, "not an ELF"),
        (blob, "not an ELF"),
        (other_arch, "built for"),
    ]
    .into_iter()
    .enumerate()
    {
        let version = format!("2.0.{i}");
        let (u, _) = fleet_updater::agent_upgrade::transaction::Updater::open(
            dev.paths.clone(),
            fleet_wire::UnitName::try_from("fleet-agent.service").expect("unit"),
            fleet_updater::agent_upgrade::transaction::Deps {
                fetcher: fetcher_for(&bytes),
                services: services.clone(),
                prober: Prober::new("fleet-agent", Duration::from_secs(60)),
                faults: Faults::none(),
                system: dev.system_deps(Vec::new()),
                device_id: None,
            },
            fleet_updater::agent_upgrade::transaction::Bounds::default(),
        )
        .expect("open");
        let r = u
            .upgrade_blocking(attempt_for(&bytes, &version))
            .expect("no crash");
        assert_eq!(
            phase_of(&r),
            (UpgradePhase::Failed, Some(UpgradeReason::ProbeFailed)),
            "{version}"
        );
        let status = u.status().agent_upgrade.expect("status");
        let error = status.error.expect("error").to_string();
        assert!(error.contains(want), "{version}: {error}");
        assert!(
            error.chars().all(|c| !c.is_control()) && error.chars().count() <= 1024,
            "{version}: {error:?}"
        );
        assert_eq!(dev.active(), PREVIOUS);
    }
    assert!(!marker.exists(), "the script candidate was run");
    assert!(services.take_calls().is_empty());
}
