//! The reboot client against real local listeners (a FleetLock responder, TCP and HTTP dependencies, a CIDR of
//! loopback addresses) with a scripted command runner for systemctl and bootc, and the marker / boot-id cycle by
//! changing the boot id between two runs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use fleet_updater::fault::Faults;
use fleet_updater::reboot::system::{CommandError, Output, System};
use fleet_updater::reboot::{release_after_boot, run_once, Outcome, RebootConfig, RunOptions};
use fleet_updater::system::accept::AgentSide;
use fleet_updater::system::apt::Apt;
use fleet_updater::system::reboot::{Rebooter, StepError};
use fleet_updater::system::{SystemDeps, SystemUpgrades};
use fleet_wire::{AttemptId, DeviceId, SystemUpgradeAttempt, TaskOperation, Timestamp};
mod fleetlock_responder;

use fleetlock_responder::responder;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

/// A hook run in place of `systemctl reboot`'s answer, given the script (the host) it runs on.
type RebootHook = Box<dyn Fn(&Script) + Send + Sync>;

/// Scripted host commands: `program args` → stdout (exit 0), `Err` when absent; every call is recorded.
#[derive(Default)]
struct Script {
    answers: Mutex<HashMap<String, Output>>,
    calls: Mutex<Vec<String>>,
    /// Runs when `systemctl reboot` is called, before it answers (what else happens while the host goes down).
    on_reboot: Mutex<Option<RebootHook>>,
}

impl Script {
    fn set(&self, cmd: &str, stdout: &str, code: i32) {
        self.answers.lock().unwrap().insert(
            cmd.into(),
            Output {
                code: Some(code),
                stdout: stdout.as_bytes().to_vec(),
            },
        );
    }
    fn called(&self, cmd: &str) -> bool {
        self.times_called(cmd) > 0
    }
    fn times_called(&self, cmd: &str) -> usize {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|c| *c == cmd)
            .count()
    }
}

impl System for Script {
    fn run(&self, program: &str, args: &[&str], _t: Duration) -> Result<Output, CommandError> {
        let cmd = format!("{program} {}", args.join(" "));
        self.calls.lock().unwrap().push(cmd.clone());
        if cmd == "systemctl reboot" {
            if let Some(hook) = self.on_reboot.lock().unwrap().take() {
                hook(self);
            }
        }
        self.answers
            .lock()
            .unwrap()
            .get(&cmd)
            .cloned()
            .ok_or_else(|| CommandError::not_installed(program))
    }
}

/// A tiny HTTP server answering every GET with `code`.
fn http_server(code: u16) -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let _ = write!(
                s,
                "HTTP/1.1 {code} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
            );
        }
    });
    format!("http://{addr}/health")
}

struct Host {
    root: tempfile::TempDir,
    script: Script,
}

fn host() -> Host {
    Host {
        root: device_root(),
        script: running_host(),
    }
}

/// A device root: machine id, boot id `boot-a`, hostname, and `/run/reboot-required`.
fn device_root() -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    let w = |rel: &str, text: &str| {
        let p = root.path().join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    w("etc/machine-id", "0123456789abcdef0123456789abcdef\n");
    w("proc/sys/kernel/random/boot_id", "boot-a\n");
    w("proc/sys/kernel/hostname", "node-1\n");
    w("run/reboot-required", "");
    root
}

/// A healthy host whose reboot command succeeds.
fn running_host() -> Script {
    let script = Script::default();
    script.set("systemctl is-system-running", "running\n", 0);
    script.set("systemctl reboot", "", 0);
    script
}

fn config(root: &Path, server: SocketAddr, extra: &str) -> RebootConfig {
    RebootConfig::parse(&format!(
        "server: http://{server}\ngroup: default\ntimeout: 1\nhealth_wait: 0.2\nroot: {}\n{extra}",
        root.display()
    ))
    .unwrap()
}

fn not_now(o: Outcome, needle: &str) {
    match o {
        Outcome::NotNow(r) => assert!(r.contains(needle), "{r:?} lacks {needle:?}"),
        other => panic!("expected not now ({needle}), got {other:?}"),
    }
}

#[test]
fn marker_boot_id_cycle() {
    let h = host();
    let srv = responder();
    let cfg = config(h.root.path(), srv.addr, "");
    let o = run_once(&cfg, &h.script, RunOptions::default()).unwrap();
    assert_eq!(o, Outcome::Rebooting);
    assert!(h.script.called("systemctl reboot"));
    let id = srv.holder.lock().unwrap().clone().expect("lock held");
    assert_eq!(id.len(), 32, "app-specific id, not the machine id");
    assert!(!id.contains("0123456789abcdef0123"));
    assert!(
        srv.requests.lock().unwrap()[0].contains("\"node-1\""),
        "hostname sent"
    );
    let marker =
        std::fs::read_to_string(h.root.path().join("var/lib/fleet-reboot/marker.json")).unwrap();
    assert!(marker.contains("\"boot-a\""), "{marker}");
    let diag: Vec<_> = std::fs::read_dir(h.root.path().join("var/log/fleet-reboot"))
        .unwrap()
        .collect();
    assert_eq!(diag.len(), 1);

    // "Reboot": new boot id, nothing staged any more; first the host is not healthy yet.
    std::fs::write(
        h.root.path().join("proc/sys/kernel/random/boot_id"),
        "boot-b\n",
    )
    .unwrap();
    std::fs::remove_file(h.root.path().join("run/reboot-required")).unwrap();
    h.script.set("systemctl is-system-running", "starting\n", 1);
    not_now(
        run_once(&cfg, &h.script, RunOptions::default()).unwrap(),
        "lock stays held",
    );
    assert!(srv.holder.lock().unwrap().is_some());
    h.script.set("systemctl is-system-running", "running\n", 0);
    std::fs::write(h.root.path().join("run/nologin"), "").unwrap();
    not_now(
        run_once(&cfg, &h.script, RunOptions::default()).unwrap(),
        "nologin",
    );
    std::fs::remove_file(h.root.path().join("run/nologin")).unwrap();
    let o = run_once(&cfg, &h.script, RunOptions::default()).unwrap();
    assert_eq!(o, Outcome::Released);
    assert!(srv.holder.lock().unwrap().is_none());
    assert!(!h
        .root
        .path()
        .join("var/lib/fleet-reboot/marker.json")
        .exists());
    // Next run: nothing staged.
    not_now(
        run_once(&cfg, &h.script, RunOptions::default()).unwrap(),
        "nothing staged",
    );
}

#[test]
fn server_unreachable_or_full_means_no() {
    let h = host();
    let dead = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let cfg = config(h.root.path(), dead, "");
    not_now(
        run_once(&cfg, &h.script, RunOptions::default()).unwrap(),
        "unreachable",
    );
    assert!(!h.script.called("systemctl reboot"));
    assert!(!h
        .root
        .path()
        .join("var/lib/fleet-reboot/marker.json")
        .exists());
    let srv = responder();
    *srv.holder.lock().unwrap() = Some("someone-else".into());
    let cfg = config(h.root.path(), srv.addr, "");
    not_now(
        run_once(&cfg, &h.script, RunOptions::default()).unwrap(),
        "all-slots-taken",
    );
    assert!(!h.script.called("systemctl reboot"));
}

#[test]
fn staged_sources_and_health() {
    let h = host();
    let srv = responder();
    std::fs::remove_file(h.root.path().join("run/reboot-required")).unwrap();
    let cfg = config(h.root.path(), srv.addr, "");
    not_now(
        run_once(&cfg, &h.script, RunOptions::default()).unwrap(),
        "no bootc",
    );
    h.script.set(
        "bootc status --json",
        r#"{"status":{"staged":null,"booted":{}}}"#,
        0,
    );
    not_now(
        run_once(&cfg, &h.script, RunOptions::default()).unwrap(),
        "nothing staged",
    );
    h.script.set(
        "bootc status --json",
        r#"{"status":{"staged":{"image":{"image":{"image":"quay.io/x/c-os:cloud"}}}}}"#,
        0,
    );
    h.script.set("systemctl is-system-running", "degraded\n", 1);
    not_now(
        run_once(&cfg, &h.script, RunOptions::default()).unwrap(),
        "degraded",
    );
    let cfg2 = config(h.root.path(), srv.addr, "allow_degraded: true\n");
    assert_eq!(
        run_once(&cfg2, &h.script, RunOptions::default()).unwrap(),
        Outcome::Rebooting
    );
    // A system upgrade that knows it needs a reboot skips the staged check.
    let h = host();
    std::fs::remove_file(h.root.path().join("run/reboot-required")).unwrap();
    let srv = responder();
    let cfg = config(h.root.path(), srv.addr, "");
    let opts = RunOptions {
        reboot_needed: true,
        now: None,
    };
    assert_eq!(run_once(&cfg, &h.script, opts).unwrap(), Outcome::Rebooting);
}

/// `/var/lib/fleet-updater/reboot-required` (written by a person or another tool, not by the product) asks for a
/// reboot as Debian's flag does, and is deleted once the host is healthy after that reboot, so it asks only once.
#[test]
fn the_fleet_updater_flag_asks_for_one_reboot() {
    let h = host();
    let srv = responder();
    std::fs::remove_file(h.root.path().join("run/reboot-required")).unwrap();
    let flag = h.root.path().join("var/lib/fleet-updater/reboot-required");
    std::fs::create_dir_all(flag.parent().unwrap()).unwrap();
    std::fs::write(&flag, "").unwrap();
    let cfg = config(h.root.path(), srv.addr, "");
    assert_eq!(
        run_once(&cfg, &h.script, RunOptions::default()).unwrap(),
        Outcome::Rebooting
    );
    assert!(h.script.called("systemctl reboot"));
    assert!(
        flag.exists(),
        "kept until the host is healthy after the reboot"
    );
    std::fs::write(
        h.root.path().join("proc/sys/kernel/random/boot_id"),
        "boot-b\n",
    )
    .unwrap();
    assert_eq!(
        run_once(&cfg, &h.script, RunOptions::default()).unwrap(),
        Outcome::Released
    );
    assert!(srv.holder.lock().unwrap().is_none());
    assert!(!flag.exists(), "deleted after the reboot");
    not_now(
        run_once(&cfg, &h.script, RunOptions::default()).unwrap(),
        "nothing staged",
    );
}

#[test]
fn dependencies_against_real_listeners() {
    let h = host();
    let srv = responder();
    let up = TcpListener::bind("127.0.0.1:0").unwrap();
    let down = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let ok_url = http_server(204);
    let bad_url = http_server(503);
    let up_addr = up.local_addr().unwrap();
    let cfg = config(
        h.root.path(),
        srv.addr,
        &format!("require_hosts: ['{up_addr}', '{ok_url}', '{down}']\n"),
    );
    not_now(
        run_once(&cfg, &h.script, RunOptions::default()).unwrap(),
        &down.to_string(),
    );
    let cfg = config(
        h.root.path(),
        srv.addr,
        &format!("require_hosts: ['{up_addr}', '{bad_url}']\n"),
    );
    not_now(
        run_once(&cfg, &h.script, RunOptions::default()).unwrap(),
        "HTTP 503",
    );
    // Three loopback hosts of 127.0.0.0/29 answer on one port.
    let port = up_addr.port();
    let _l2 = TcpListener::bind(("127.0.0.2", port)).unwrap();
    let _l3 = TcpListener::bind(("127.0.0.3", port)).unwrap();
    let range = |n: u32| format!("range: {{cidr: 127.0.0.0/29, port: {port}, min_up: {n}}}\n");
    let cfg = config(
        h.root.path(),
        srv.addr,
        &format!("require_hosts: ['{up_addr}', '{ok_url}']\n{}", range(4)),
    );
    not_now(
        run_once(&cfg, &h.script, RunOptions::default()).unwrap(),
        "only 3 of the required 4",
    );
    assert!(!h.script.called("systemctl reboot"));
    let cfg = config(
        h.root.path(),
        srv.addr,
        &format!("require_hosts: ['{up_addr}', '{ok_url}']\n{}", range(3)),
    );
    assert_eq!(
        run_once(&cfg, &h.script, RunOptions::default()).unwrap(),
        Outcome::Rebooting
    );
}

#[test]
fn window_and_giving_back_an_unused_lock() {
    let h = host();
    let srv = responder();
    let win = "window: {timezone: Europe/Vienna, days: [sun], start: '23:00', end: '01:00'}\n";
    let cfg = config(h.root.path(), srv.addr, win);
    let at = |s: &str| RunOptions {
        reboot_needed: false,
        now: Some(s.parse().unwrap()),
    };
    // Sunday 2026-11-29 23:30 in Vienna = 22:30 UTC; Monday 00:30 = Sunday 23:30 UTC.
    not_now(
        run_once(&cfg, &h.script, at("2026-11-29T21:59:00Z")).unwrap(),
        "outside the reboot window",
    );
    h.script.set("systemctl reboot", "", 1); // the reboot command fails
    let e = run_once(&cfg, &h.script, at("2026-11-29T23:30:00Z"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("systemctl reboot failed"), "{e}");
    assert!(
        srv.holder.lock().unwrap().is_some(),
        "lock held, marker written"
    );
    // Same boot, later, outside the window: the lock taken earlier is given back.
    not_now(
        run_once(&cfg, &h.script, at("2026-11-30T09:00:00Z")).unwrap(),
        "outside",
    );
    assert!(srv.holder.lock().unwrap().is_none());
    assert!(!h
        .root
        .path()
        .join("var/lib/fleet-reboot/marker.json")
        .exists());
}

#[test]
fn release_after_boot_only_finishes_a_coordinated_reboot() {
    let h = host();
    let srv = responder();
    let cfg = config(h.root.path(), srv.addr, "");
    // No marker: nothing to do, nothing sent.
    not_now(
        release_after_boot(&cfg, &h.script).unwrap(),
        "no coordinated reboot",
    );
    assert!(srv.requests.lock().unwrap().is_empty());
    assert_eq!(
        run_once(&cfg, &h.script, RunOptions::default()).unwrap(),
        Outcome::Rebooting
    );
    // The same boot (the reboot has not happened): the slot stays held.
    not_now(
        release_after_boot(&cfg, &h.script).unwrap(),
        "no coordinated reboot",
    );
    assert!(srv.holder.lock().unwrap().is_some());
    // The next boot, not healthy within health_wait: the slot stays held.
    std::fs::write(
        h.root.path().join("proc/sys/kernel/random/boot_id"),
        "boot-b\n",
    )
    .unwrap();
    h.script.set("systemctl is-system-running", "starting\n", 1);
    not_now(
        release_after_boot(&cfg, &h.script).unwrap(),
        "lock stays held",
    );
    assert!(srv.holder.lock().unwrap().is_some());
    // Healthy: given back at once, marker gone.
    h.script.set("systemctl is-system-running", "running\n", 0);
    assert_eq!(
        release_after_boot(&cfg, &h.script).unwrap(),
        Outcome::Released
    );
    assert!(srv.holder.lock().unwrap().is_none());
    assert!(!h
        .root
        .path()
        .join("var/lib/fleet-reboot/marker.json")
        .exists());
}

#[test]
fn the_documented_id_command_prints_the_id_the_client_sends() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/fleetlock.md"))
        .unwrap();
    let command = "printf 'fleet-reboot:%s' \"$(cat /etc/machine-id)\" | sha256sum | cut -c1-32";
    assert!(doc.contains(command), "docs/fleetlock.md names the command");
    let h = host();
    let srv = responder();
    let cfg = config(h.root.path(), srv.addr, "");
    run_once(&cfg, &h.script, RunOptions::default()).unwrap();
    let sent = srv.holder.lock().unwrap().clone().expect("lock held");
    let machine_id = h.root.path().join("etc/machine-id");
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(command.replace("/etc/machine-id", &machine_id.display().to_string()))
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8(out.stdout).unwrap().trim(), sent);
}

/// The timer's run racing the upgrade step, in one process: the upgrade step takes the slot and asks for the reboot; while the host goes
/// down (`systemctl is-system-running` says `stopping`) the timer's run comes, during the reboot command and
/// after it. Neither timer run may give the slot back or remove the marker: the host is rebooting.
#[test]
fn a_timer_run_during_an_upgrade_steps_reboot_never_gives_the_slot_back() {
    let h = host();
    let srv = responder();
    let cfg = config(h.root.path(), srv.addr, "");
    let marker = h.root.path().join("var/lib/fleet-reboot/marker.json");
    let during = std::sync::Arc::new(Mutex::new(None));
    {
        let (cfg, during) = (cfg.clone(), during.clone());
        *h.script.on_reboot.lock().unwrap() = Some(Box::new(move |host: &Script| {
            host.set("systemctl is-system-running", "stopping\n", 1);
            *during.lock().unwrap() = Some(run_once(&cfg, host, RunOptions::default()));
        }));
    }
    let step = RunOptions {
        reboot_needed: true,
        now: None,
    };
    assert_eq!(run_once(&cfg, &h.script, step).unwrap(), Outcome::Rebooting);
    let timer_during = during.lock().unwrap().take().expect("the timer ran");
    let me = srv.holder.lock().unwrap().clone();
    assert!(
        me.is_some() && marker.exists(),
        "a timer run during the upgrade step's reboot gave the slot back under the rebooting host \
         (timer: {timer_during:?}; holder {me:?}; marker kept: {})",
        marker.exists()
    );
    not_now(timer_during.unwrap(), "another fleet-reboot run");
    // After the step's run ended, the host still going down: the timer again.
    let timer_after = run_once(&cfg, &h.script, RunOptions::default());
    assert!(
        srv.holder.lock().unwrap().is_some() && marker.exists(),
        "a timer run after the reboot was requested gave the slot back (timer: {timer_after:?})"
    );
    not_now(timer_after.unwrap(), "is under way");
    // Another host of the one-slot group still gets no slot while this one reboots.
    assert_eq!(srv.holder.lock().unwrap().clone(), me);
    assert_eq!(h.script.times_called("systemctl reboot"), 1);
}

/// The system upgrade's reboot, the reboot client run in this process with a scripted reboot command.
struct InProcess {
    cfg: RebootConfig,
    script: std::sync::Arc<Script>,
}

impl Rebooter for InProcess {
    fn step(&self) -> Result<Outcome, StepError> {
        let opts = RunOptions {
            reboot_needed: true,
            now: None,
        };
        run_once(&self.cfg, &*self.script, opts).map_err(|e| StepError::Refused(e.to_string()))
    }
}

/// apt-get and dpkg stand-ins in `<root>/fake-apt`: the full upgrade sets `/run/reboot-required`.
fn fake_apt(root: &Path) -> Apt {
    use std::os::unix::fs::PermissionsExt;
    let dir = root.join("fake-apt");
    std::fs::create_dir_all(&dir).unwrap();
    for (name, body) in [
        (
            "apt-get",
            format!(
                "case \"$*\" in *full-upgrade) touch {}/run/reboot-required ;; esac",
                root.display()
            ),
        ),
        ("dpkg", String::new()),
    ] {
        let p = dir.join(name);
        std::fs::write(&p, format!("#!/bin/sh\n{body}\nexit 0\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    Apt::new(dir)
}

/// The system upgrade over `root` with the reboot client in this process on `script`.
fn system_upgrades(
    root: &Path,
    cfg: &RebootConfig,
    script: &std::sync::Arc<Script>,
    retry: Duration,
) -> std::sync::Arc<SystemUpgrades> {
    let deps = SystemDeps {
        apt: fake_apt(root),
        rebooter: Box::new(InProcess {
            cfg: cfg.clone(),
            script: script.clone(),
        }),
        reboot_retry: retry,
    };
    std::sync::Arc::new(
        SystemUpgrades::open(
            &fleet_updater::paths::Paths::new(root),
            deps,
            Faults::none(),
        )
        .unwrap(),
    )
}

/// The post-boot release consumes the marker before the updater's upgrade step runs in the new
/// boot. The upgrade must end `succeeded` from its journal, without taking the slot or rebooting a second time.
#[test]
fn a_consumed_marker_never_causes_a_second_reboot() {
    let root = device_root();
    std::fs::remove_file(root.path().join("run/reboot-required")).unwrap();
    let srv = responder();
    let cfg = config(root.path(), srv.addr, "");
    let before = std::sync::Arc::new(running_host());
    // The daemon waits an hour between client runs: it is "killed by the reboot" after the first.
    let upgrades = system_upgrades(root.path(), &cfg, &before, Duration::from_secs(3600));
    let attempt = SystemUpgradeAttempt {
        run_uid: AttemptId::new_random(),
        device_id: DeviceId::try_from("device-1").unwrap(),
        operation: TaskOperation::AptFullUpgradeV1,
        expires_at: Timestamp::now().plus(Duration::from_secs(3600)),
    };
    assert!(upgrades
        .accept(attempt, AgentSide::default(), Timestamp::now())
        .unwrap());
    let u = upgrades.clone();
    std::thread::spawn(move || u.run());
    let asked = fleet_rig::wait_for(Duration::from_secs(20), || {
        before.called("systemctl reboot").then_some(())
    });
    assert!(asked.is_some(), "{:#?}", upgrades.public());
    assert_eq!(
        upgrades.public().unwrap().phase,
        fleet_wire::SystemUpgradePhase::Rebooting
    );
    assert!(srv.holder.lock().unwrap().is_some());

    // The reboot: a new boot id; the post-boot release gives the slot back and consumes the marker.
    std::fs::write(
        root.path().join("proc/sys/kernel/random/boot_id"),
        "boot-b\n",
    )
    .unwrap();
    std::fs::remove_file(root.path().join("run/reboot-required")).unwrap();
    let after = std::sync::Arc::new(running_host());
    assert_eq!(
        release_after_boot(&cfg, &*after).unwrap(),
        Outcome::Released
    );
    assert!(srv.holder.lock().unwrap().is_none());

    // The updater starts in the new boot and resumes `rebooting`.
    let resumed = system_upgrades(root.path(), &cfg, &after, Duration::from_millis(50));
    let r = resumed.clone();
    std::thread::spawn(move || r.run());
    let end = fleet_rig::wait_for(Duration::from_secs(20), || {
        let phase = resumed.public().map(|s| s.phase);
        (after.called("systemctl reboot")
            || phase != Some(fleet_wire::SystemUpgradePhase::Rebooting))
        .then_some(phase)
    });
    assert!(
        !after.called("systemctl reboot"),
        "a second reboot: the resumed upgrade took the slot and rebooted again ({:?}; slot holder {:?})",
        resumed.public().map(|s| s.phase),
        srv.holder.lock().unwrap()
    );
    assert_eq!(
        end,
        Some(Some(fleet_wire::SystemUpgradePhase::Succeeded)),
        "{:#?}",
        resumed.public()
    );
    assert!(srv.holder.lock().unwrap().is_none(), "no slot taken again");
    let locks = srv
        .requests
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.starts_with("/v1/pre-reboot"))
        .count();
    assert_eq!(locks, 1, "one slot taken for one reboot");
}

/// A system-upgrade journal written before the boot id was recorded still loads, and the upgrade step then goes
/// by the marker as before: the slot taken before the reboot is given back after it, with no second reboot.
#[test]
fn an_old_journal_without_a_boot_id_leaves_the_decision_to_the_marker() {
    use fleet_updater::system::journal::SystemJournal;
    use fleet_updater::system::machine::Event;
    let h = host();
    let srv = responder();
    let cfg = config(h.root.path(), srv.addr, "");
    let mut j = SystemJournal::begin(
        fleet_wire::fixtures::system_attempt(),
        vec![],
        Timestamp::now(),
    );
    j.apply(Event::Start, Timestamp::now()).unwrap();
    j.apply(Event::Upgraded { reboot: true }, Timestamp::now())
        .unwrap();
    let mut old = serde_json::to_value(&j).unwrap();
    old.as_object_mut().unwrap().remove("rebootBootId");
    let path = fleet_updater::paths::Paths::new(h.root.path()).system_journal();
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, serde_json::to_vec(&old).unwrap()).unwrap();
    let step = RunOptions {
        reboot_needed: true,
        now: None,
    };
    assert_eq!(run_once(&cfg, &h.script, step).unwrap(), Outcome::Rebooting);
    std::fs::write(
        h.root.path().join("proc/sys/kernel/random/boot_id"),
        "boot-b\n",
    )
    .unwrap();
    assert_eq!(run_once(&cfg, &h.script, step).unwrap(), Outcome::Released);
    assert!(srv.holder.lock().unwrap().is_none());
    assert_eq!(h.script.times_called("systemctl reboot"), 1);
}
