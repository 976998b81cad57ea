//! The system-upgrade transaction through the real socket: apt runs at most once per attempt id (duplicate,
//! restart), an expired attempt never starts, status answers while apt runs, one transaction at a time across
//! both kinds, typed failures with the output tail, the repair path after an interrupted upgrade, and the reboot
//! through the (scripted) coordinated-reboot client. apt and dpkg are stand-in scripts that record their
//! arguments: the real ones run in vm-tests/tests/system_upgrade.rs.

mod common;

use common::*;
use fleet_updater::agent_upgrade::transaction::{Accepted, Updater};
use fleet_updater::fault::Faults;
use fleet_updater::reboot::Outcome as RebootOutcome;
use fleet_updater::socket::{self, ServerConfig};
use fleet_updater::system::reboot::StepError;
use fleet_wire::socket::PROTOCOL_VERSION;
use fleet_wire::{
    AttemptId, Capability, DeviceId, ErrorCode, Request, RequestFrame, Response, ResponseFrame,
    SystemUpgradeAttempt, SystemUpgradePhase as P, SystemUpgradeReason as R, SystemUpgradeStatus,
    TaskOperation, Timestamp,
};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const UPDATE: &str = "apt-get -q -y -o DPkg::Lock::Timeout=120 --error-on=any update";
const FULL_UPGRADE: &str =
    "apt-get -q -y -o DPkg::Lock::Timeout=120 -o Dpkg::Options::=--force-confdef -o \
                            Dpkg::Options::=--force-confold full-upgrade";
const CONFIGURE: &str = "dpkg --force-confdef --force-confold --configure -a";

fn attempt() -> SystemUpgradeAttempt {
    SystemUpgradeAttempt {
        run_uid: AttemptId::new_random(),
        device_id: DeviceId::try_from("device-1").expect("id"),
        operation: TaskOperation::AptFullUpgradeV1,
        expires_at: Timestamp::now().plus(Duration::from_secs(3600)),
    }
}

fn serve(u: &Updater, dev: &Device) -> PathBuf {
    require_agent_user();
    let gid = fleet_updater::users::group_gid("fleet-agent").expect("group");
    let listener = socket::bind(&dev.paths, gid).expect("bind");
    socket::spawn(listener, u.clone(), ServerConfig::new(gid)).expect("serve");
    dev.paths.socket()
}

fn ask(sock: &Path, request: Request) -> Response {
    let mut s = UnixStream::connect(sock).expect("connect");
    let mut line = serde_json::to_vec(&RequestFrame {
        protocol: PROTOCOL_VERSION,
        request,
    })
    .expect("json");
    line.push(b'\n');
    s.write_all(&line).expect("write");
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let mut answer = String::new();
    BufReader::new(&s).read_line(&mut answer).expect("answer");
    let frame: ResponseFrame = serde_json::from_str(&answer).expect("response JSON");
    frame.response
}

fn system(r: &Response) -> SystemUpgradeStatus {
    match r {
        Response::Accepted { status } | Response::Status { status } => status
            .system_upgrade
            .clone()
            .expect("a system-upgrade status"),
        other => panic!("not a status: {other:?}"),
    }
}

fn code(r: &Response) -> ErrorCode {
    match r {
        Response::Error { code, .. } => *code,
        other => panic!("not an error: {other:?}"),
    }
}

/// Polls status until the system upgrade is terminal.
fn wait_terminal(sock: &Path) -> SystemUpgradeStatus {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let s = system(&ask(sock, Request::Status {}));
        if s.phase.is_terminal() {
            return s;
        }
        assert!(Instant::now() < deadline, "not terminal: {s:#?}");
        // why: pacing of the bounded poll
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn upgrade(sock: &Path, a: &SystemUpgradeAttempt) -> Response {
    ask(sock, Request::SystemUpgrade { attempt: a.clone() })
}

#[test]
fn apt_runs_once_per_attempt_whatever_is_sent_again() {
    let dev = Device::new();
    let apt = FakeApt::new(
        &dev,
        "echo Reading package lists...",
        "echo 'Unpacking fleet-test-pkg (2.0) over (1.0) ...'",
        "true",
    );
    let (u, _) = dev.open_system(&apt, vec![], Faults::none()).expect("open");
    let sock = serve(&u, &dev);
    match ask(&sock, Request::Status {}) {
        Response::Status { status } => {
            assert!(status.system_upgrade.is_none());
            assert_eq!(
                status.capabilities,
                [
                    Capability::AgentUpgradeV1,
                    Capability::OciArtifactsV1,
                    Capability::AptFullUpgradeV1
                ]
            );
        }
        other => panic!("{other:?}"),
    }

    let a = attempt();
    let first = system(&upgrade(&sock, &a));
    assert_eq!((first.run_uid, first.phase), (a.run_uid, P::Accepted));
    let done = wait_terminal(&sock);
    assert_eq!(
        (done.phase, done.reason, done.reboot_required),
        (P::Succeeded, None, false)
    );
    assert!(done.completed_at.is_some());
    assert_eq!(
        done.transitions.phases(),
        [P::Accepted, P::Upgrading, P::Succeeded]
    );
    assert!(
        done.output_tail
            .as_ref()
            .is_some_and(|t| t.as_str().contains("fleet-test-pkg (2.0)")),
        "{done:#?}"
    );
    assert_eq!(
        apt.calls(),
        [UPDATE, FULL_UPGRADE],
        "exactly the compiled-in policy"
    );

    // The same attempt again (a duplicate intent): its status, and apt does not run.
    let again = upgrade(&sock, &a);
    assert!(matches!(again, Response::Accepted { .. }), "{again:?}");
    assert_eq!(system(&again), done);
    // The same id with other content is refused.
    let mut changed = a.clone();
    changed.expires_at = changed.expires_at.plus(Duration::from_secs(1));
    assert_eq!(code(&upgrade(&sock, &changed)), ErrorCode::Conflict);

    // A restarted updater knows the attempt from its journal.
    let (u2, _) = dev
        .open_system(&apt, vec![], Faults::none())
        .expect("reopen");
    assert!(!u2.system_pending());
    assert!(matches!(
        u2.accept_system(a.clone()),
        Ok(Accepted::Current(_))
    ));

    // A new run runs; afterwards the first id is still remembered and refused.
    let b = attempt();
    assert!(matches!(
        u2.accept_system(b.clone()),
        Ok(Accepted::Started(_))
    ));
    u2.run_system().expect("no crash");
    assert_eq!(
        u2.status().system_upgrade.map(|s| s.phase),
        Some(P::Succeeded)
    );
    let r = u2.accept_system(a).expect_err("already ran");
    assert!(r.message.contains("already ended"), "{r:?}");
    assert_eq!(apt.calls().len(), 4, "{:?}", apt.calls());
}

#[test]
fn a_corrupt_system_journal_stops_the_updater_before_its_socket_opens() {
    let dev = Device::new();
    let apt = FakeApt::new(&dev, "true", "true", "true");
    std::fs::create_dir_all(dev.paths.state_dir()).expect("mkdir");
    std::fs::write(dev.paths.system_journal(), b"{\"format\":1,").expect("write");
    let e = match dev.open_system(&apt, vec![], Faults::none()) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("opened over a corrupt journal"),
    };
    assert!(
        e.contains("system-upgrade.json") && e.contains("does not parse"),
        "{e}"
    );
    assert!(apt.calls().is_empty());
}

#[test]
fn an_expired_attempt_never_starts() {
    let dev = Device::new();
    let apt = FakeApt::new(&dev, "true", "true", "true");
    let (u, _) = dev.open_system(&apt, vec![], Faults::none()).expect("open");
    let sock = serve(&u, &dev);
    let mut a = attempt();
    a.expires_at = Timestamp::now();
    let r = upgrade(&sock, &a);
    assert_eq!(code(&r), ErrorCode::Expired, "{r:?}");
    assert!(apt.calls().is_empty());
    assert!(
        dev.paths.system_journal().exists().then_some(()).is_none(),
        "nothing journaled"
    );
}

#[test]
fn status_answers_while_apt_runs_and_one_transaction_runs_at_a_time() {
    let dev = Device::new();
    let go = dev.dir.path().join("go");
    let apt = FakeApt::new(
        &dev,
        "true",
        &format!(
            "echo unpacking; while [ ! -e {} ]; do sleep 0.02; done",
            go.display()
        ),
        "true",
    );
    let (u, _) = dev.open_system(&apt, vec![], Faults::none()).expect("open");
    let sock = serve(&u, &dev);
    let a = attempt();
    upgrade(&sock, &a);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !apt.calls().iter().any(|c| c.ends_with("full-upgrade")) {
        assert!(Instant::now() < deadline, "full-upgrade never started");
        // why: pacing of the bounded poll
        std::thread::sleep(Duration::from_millis(10));
    }
    let t0 = Instant::now();
    let s = system(&ask(&sock, Request::Status {}));
    assert!(t0.elapsed() < Duration::from_secs(2));
    assert_eq!(s.phase, P::Upgrading);
    assert!(
        s.detail
            .as_ref()
            .is_some_and(|d| d.as_str().contains("full-upgrade")),
        "{s:#?}"
    );
    // Another system run and an agent upgrade are refused as busy while it runs.
    assert_eq!(code(&upgrade(&sock, &attempt())), ErrorCode::Busy);
    let agent = attempt_for(&candidate(TARGET), TARGET);
    assert_eq!(
        code(&ask(&sock, Request::Upgrade { attempt: agent })),
        ErrorCode::Busy
    );
    // Expiry does not interrupt an accepted attempt: the duplicate is still answered with its status.
    assert!(matches!(upgrade(&sock, &a), Response::Accepted { .. }));
    std::fs::write(&go, b"").expect("go");
    assert_eq!(wait_terminal(&sock).phase, P::Succeeded);
}

#[test]
fn failures_are_typed_with_the_output_tail() {
    let cases: [(&str, &str, R, &[&str]); 3] = [
        (
            "echo 'E: Failed to fetch file:/srv/repo/./InRelease  File not found' >&2; exit 100",
            "true",
            R::RepositoryUnreachable,
            &[UPDATE],
        ),
        (
            "true",
            "echo 'E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 9' >&2; exit 100",
            R::AptLockHeld,
            &[UPDATE, FULL_UPGRADE],
        ),
        (
            "true",
            "echo 'dpkg: error processing package fleet-test-pkg (--configure):'; \
             echo 'E: Sub-process /usr/bin/dpkg returned an error code (1)' >&2; exit 100",
            R::DpkgError,
            &[UPDATE, FULL_UPGRADE, CONFIGURE],
        ),
    ];
    for (update, full, reason, calls) in cases {
        let dev = Device::new();
        let apt = FakeApt::new(&dev, update, full, "true");
        let (u, _) = dev.open_system(&apt, vec![], Faults::none()).expect("open");
        assert!(matches!(
            u.accept_system(attempt()),
            Ok(Accepted::Started(_))
        ));
        u.run_system().expect("no crash");
        let s = u.status().system_upgrade.expect("status");
        assert_eq!((s.phase, s.reason), (P::Failed, Some(reason)), "{s:#?}");
        assert!(s.error.is_some() && s.output_tail.is_some(), "{s:#?}");
        assert_eq!(apt.calls(), calls);
    }
}

#[test]
fn a_reboot_goes_through_the_coordinated_client() {
    // The upgrade sets /run/reboot-required; the client first says "not now", then the reboot happens.
    let dev = Device::new();
    let full = "mkdir -p $ROOT/run && touch $ROOT/run/reboot-required";
    let apt = FakeApt::new(&dev, "true", full, "true");
    let (u, _) = dev
        .open_system(
            &apt,
            vec![
                Ok(RebootOutcome::NotNow("outside the reboot window".into())),
                Ok(RebootOutcome::Rebooting),
            ],
            Faults::none(),
        )
        .expect("open");
    let sock = serve(&u, &dev);
    upgrade(&sock, &attempt());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = system(&ask(&sock, Request::Status {}));
        if s.phase == P::Rebooting
            && s.detail
                .as_ref()
                .is_some_and(|d| d.as_str().contains("rebooting"))
        {
            assert!(s.reboot_required);
            break;
        }
        assert!(Instant::now() < deadline, "{s:#?}");
        // why: pacing of the bounded poll
        std::thread::sleep(Duration::from_millis(10));
    }
    // "After the boot": a new updater over the same root resumes and the client releases the lock.
    let (after, _) = dev
        .open_system(&apt, vec![Ok(RebootOutcome::Released)], Faults::none())
        .expect("reopen");
    assert!(after.system_pending());
    after.run_system().expect("no crash");
    let s = after.status().system_upgrade.expect("status");
    assert_eq!(s.phase, P::Succeeded, "{s:#?}");
    assert!(s.reboot_required);
    assert_eq!(
        s.transitions.phases(),
        [P::Accepted, P::Upgrading, P::Rebooting, P::Succeeded]
    );
    assert_eq!(
        apt.calls(),
        [UPDATE, FULL_UPGRADE],
        "apt ran once across the reboot"
    );

    // A device that cannot reboot fails with a typed reason that says why (packages stay upgraded): the client
    // refused (its configuration is missing), or the client did not run to an answer.
    for (err, want) in [
        (
            StepError::Refused("no fleet-reboot.yaml".into()),
            R::RebootRefused,
        ),
        (
            StepError::ClientFailed("fleet-reboot: No such file or directory".into()),
            R::RebootFailed,
        ),
    ] {
        let dev = Device::new();
        let apt = FakeApt::new(&dev, "true", full, "true");
        let (u, _) = dev
            .open_system(&apt, vec![Err(err.clone())], Faults::none())
            .expect("open");
        assert!(matches!(
            u.accept_system(attempt()),
            Ok(Accepted::Started(_))
        ));
        u.run_system().expect("no crash");
        let s = u.status().system_upgrade.expect("status");
        assert_eq!((s.phase, s.reason), (P::Failed, Some(want)), "{s:#?}");
        assert_eq!(
            s.error.as_ref().map(|e| e.as_str()),
            Some(err.to_string().as_str()),
            "{s:#?}"
        );
    }
}

#[cfg(feature = "fault-injection")]
#[test]
fn an_updater_killed_mid_upgrade_repairs_with_dpkg_configure_and_never_reruns_apt() {
    for point in fleet_updater::fault::SYSTEM_POINTS {
        let dev = Device::new();
        let apt = FakeApt::new(
            &dev,
            "true",
            "true",
            "echo 'Setting up fleet-test-pkg (2.0) ...'",
        );
        let (u, _) = dev
            .open_system(&apt, vec![], Faults::crash_at(point))
            .expect("open");
        let a = attempt();
        assert!(matches!(
            u.accept_system(a.clone()),
            Ok(Accepted::Started(_))
        ));
        assert!(u.run_system().is_err(), "crashed at {point}");
        drop(u);
        let ran_before = apt.calls().len();
        // Start-up journals `repairing` before the socket opens; the repair runs after readiness.
        let (u, _) = dev
            .open_system(&apt, vec![], Faults::none())
            .expect("reopen");
        let s = u.status().system_upgrade.expect("status");
        assert_eq!(s.phase, P::Upgrading, "{point}: {s:#?}");
        assert!(u.system_pending());
        // The agent sends the attempt again meanwhile: known, not started again.
        assert!(matches!(
            u.accept_system(a.clone()),
            Ok(Accepted::Current(_))
        ));
        u.run_system().expect("no crash");
        let s = u.status().system_upgrade.expect("status");
        assert_eq!(
            (s.phase, s.reason),
            (P::Failed, Some(R::Interrupted)),
            "{point}: {s:#?}"
        );
        let e = s.error.expect("error").to_string();
        assert!(
            e.contains("interrupted") && e.contains("dpkg --configure -a completed"),
            "{e}"
        );
        let calls = apt.calls();
        assert_eq!(calls[ran_before..], [CONFIGURE], "{point}: {calls:?}");
        // A third start changes nothing.
        let (u, _) = dev
            .open_system(&apt, vec![], Faults::none())
            .expect("reopen");
        assert!(!u.system_pending());
        assert_eq!(apt.calls().len(), calls.len());
    }
}
