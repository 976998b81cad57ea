//! A diagnostics request over the updater's real socket, collected by the host's real `journalctl` and
//! `systemctl`: a section for each updater item, saying exactly what this host has; an out-of-bounds
//! request answered `invalid`, a second one meanwhile `busy`; an answer, with the running transaction in it, while
//! an upgrade prepares; and the installed daemon reading the agent's unit from its configuration, logging no text.

mod common;

use common::*;
use fleet_updater::agent_upgrade::transaction::Updater;
use fleet_updater::boot_watchdog::WatchdogPaths;
use fleet_updater::fault::Faults;
use fleet_updater::socket::{self, ServerConfig};
use fleet_wire::diagnostics::{DiagnosticsRequest, Item, Section};
use fleet_wire::socket::PROTOCOL_VERSION;
use fleet_wire::{ErrorCode, Request, RequestFrame, Response, ResponseFrame, Timestamp};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

fn start(dev: &Device, fetcher: Box<LocalFetcher>) -> (Updater, PathBuf) {
    require_agent_user();
    let (u, pending) = dev
        .open(fetcher, FakeServices::new(dev), Faults::none())
        .expect("open");
    assert!(pending.is_none());
    let gid = fleet_updater::users::group_gid("fleet-agent").expect("group");
    let listener = socket::bind(&dev.paths, gid).expect("bind");
    socket::spawn(listener, u.clone(), ServerConfig::new(0)).expect("serve");
    (u, dev.paths.socket())
}

fn line<T: serde::Serialize>(v: &T) -> Vec<u8> {
    let mut l = serde_json::to_vec(v).expect("json");
    l.push(b'\n');
    l
}

fn exchange(sock: &Path, line: &[u8]) -> Response {
    let mut s = UnixStream::connect(sock).expect("connect");
    s.write_all(line).expect("write");
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let mut answer = String::new();
    BufReader::new(&s)
        .read_line(&mut answer)
        .expect("response line");
    let frame: ResponseFrame = serde_json::from_str(&answer).expect("response JSON");
    assert_eq!(frame.protocol, PROTOCOL_VERSION);
    frame.response
}

fn diagnostics_line(request: DiagnosticsRequest) -> Vec<u8> {
    line(&RequestFrame {
        protocol: PROTOCOL_VERSION,
        request: Request::Diagnostics { request },
    })
}

fn ask(lines: u32) -> DiagnosticsRequest {
    DiagnosticsRequest {
        items: vec![],
        workloads: vec![],
        lines,
        since_seconds: None,
        requested_at: Timestamp::now(),
    }
}

fn sections(r: Response) -> Vec<Section> {
    match r {
        Response::Diagnostics { sections } => sections,
        other => panic!("not diagnostics: {other:?}"),
    }
}

fn section(sections: &[Section], item: Item) -> &Section {
    sections
        .iter()
        .find(|s| s.item == item)
        .unwrap_or_else(|| panic!("no {} in {sections:?}", item.name()))
}

/// Whether this host keeps a journal at all (journald's files, persistent or volatile).
fn host_has_journal_files() -> bool {
    fn any_journal(dir: &Path, depth: u32) -> bool {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return false;
        };
        rd.filter_map(|e| e.ok()).any(|e| {
            let p = e.path();
            p.extension()
                .is_some_and(|x| x == "journal" || x == "journal~")
                || (depth > 0 && p.is_dir() && any_journal(&p, depth - 1))
        })
    }
    ["/var/log/journal", "/run/log/journal"]
        .iter()
        .any(|d| any_journal(Path::new(d), 2))
}

/// What this host's journal says for `unit`: exactly "none" with journalctl's reason when the host keeps no
/// journal; else "none", or journal lines (short-iso: a date first, or a boot marker).
fn assert_journal(s: &Section, unit: &str, suffix: &str) {
    assert_eq!(s.error, None, "{s:?}");
    let none = format!("no journal entries for {unit}{suffix}");
    if !host_has_journal_files() {
        assert_eq!(
            s.text,
            format!("{none} (journalctl: No journal files were found.)")
        );
    } else if !s.text.starts_with(&none) {
        for l in s.text.lines() {
            let dated = l.len() > 10
                && l.as_bytes()[..10].iter().enumerate().all(|(i, b)| {
                    if i == 4 || i == 7 {
                        *b == b'-'
                    } else {
                        b.is_ascii_digit()
                    }
                });
            assert!(dated || l.starts_with("-- "), "not a journal line: {l:?}");
        }
    }
}

#[test]
fn every_updater_item_is_collected_from_this_host() {
    let dev = Device::new();
    // A stuck boot's snapshot, as the watchdog writes it under the device root.
    let w = WatchdogPaths::new(dev.paths.root());
    std::fs::create_dir_all(w.diagnostics_dir()).expect("mkdir");
    std::fs::write(
        w.diagnostics_dir().join("boot-1800000000000.log"),
        "fleet-boot-watchdog diagnostics at 2027-01-15T08:00:00.000Z\nreason: not up: is-system-running says starting\n",
    )
    .expect("snapshot");
    let (_u, sock) = start(&dev, fetcher_for(b"x"));
    let got = sections(exchange(&sock, &diagnostics_line(ask(50))));
    let items: Vec<Item> = got.iter().map(|s| s.item).collect();
    assert_eq!(
        items,
        [
            Item::AgentJournal,
            Item::UpdaterJournal,
            Item::FailedUnits,
            Item::BootDiagnostics,
            Item::UpdaterState
        ]
    );
    for s in &got {
        assert!(s.text.lines().count() <= 50, "{s:?}");
    }
    assert_journal(section(&got, Item::AgentJournal), "fleet-agent.service", "");
    assert_journal(
        section(&got, Item::UpdaterJournal),
        "fleet-updater.service",
        "",
    );

    let units = section(&got, Item::FailedUnits);
    if Path::new("/run/systemd/system").exists() {
        // Booted with systemd: its list, or that none failed.
        assert_eq!(units.error, None, "{units:?}");
        assert!(
            units.text == "none: no unit is failed"
                || units.text.lines().all(|l| l.contains(" failed ")),
            "{units:?}"
        );
    } else {
        // A container without systemd as PID 1: systemctl cannot answer, and the section says why.
        let e = units.error.as_deref().expect("systemctl failed");
        assert!(
            e.starts_with(
                "systemctl list-units --state=failed --no-legend --plain --no-pager failed (exit status: 1): \
                 System has not been booted with systemd as init system (PID 1). Can't operate."
            ),
            "{e}"
        );
        assert!(units.text.is_empty());
    }

    let boot = section(&got, Item::BootDiagnostics);
    assert_eq!(boot.error, None);
    let root = dev.paths.root().display();
    assert!(
        boot.text.starts_with(&format!(
            "== fleet-reboot diagnostics (written before each coordinated reboot): none ({root}/var/log/fleet-reboot does not exist)\n\
             == boot watchdog diagnostics (written when a boot did not finish): the newest of 1 in {root}/var/log/fleet-boot-watchdog: boot-1800000000000.log, written 2027-01-15T08:00:00.000Z\n\
             fleet-boot-watchdog diagnostics at 2027-01-15T08:00:00.000Z\nreason: not up: is-system-running says starting\n\
             == boot watchdog reboots: none recorded\n\
             == reboot cap: not reached in this boot (no {root}/run/motd.d/fleet-boot-watchdog)\n\
             == this boot's watchdog verdict (journalctl --unit=fleet-boot-watchdog.service --boot):\n"
        )),
        "{}",
        boot.text
    );
    let verdict = boot.text.rsplit_once("--boot):\n").expect("verdict").1;
    if !host_has_journal_files() {
        assert_eq!(
            verdict,
            "no journal entries for fleet-boot-watchdog.service in this boot (journalctl: No journal files were found.)"
        );
    }

    let state = section(&got, Item::UpdaterState);
    assert_eq!(
        state.text,
        format!(
            "fleet-updater {}, boot {}, recovering: no\ncapabilities: AgentUpgradeV1, OciArtifactsV1\n\
             agent upgrade: none journaled\nsystem upgrade: none journaled",
            env!("CARGO_PKG_VERSION"),
            std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
                .expect("boot id")
                .trim()
                .replace('-', "")
        )
    );

    // Agent items only: nothing for the updater, answered at once.
    let agent_only = DiagnosticsRequest {
        items: vec![Item::Disk, Item::Containers],
        ..ask(10)
    };
    assert_eq!(
        sections(exchange(&sock, &diagnostics_line(agent_only))),
        vec![]
    );
}

#[test]
fn an_out_of_bounds_request_is_invalid_and_one_runs_at_a_time() {
    let dev = Device::new();
    let (u, sock) = start(&dev, fetcher_for(b"x"));
    let refused = |r: Response| match r {
        Response::Error { code, message } => (code, message.as_str().to_owned()),
        other => panic!("not refused: {other:?}"),
    };
    assert_eq!(
        refused(exchange(&sock, &diagnostics_line(ask(0)))),
        (
            ErrorCode::Invalid,
            "diagnostics request: invalid lines: 0 is not within 1..=2000".to_owned()
        )
    );
    let (code, message) = refused(exchange(
        &sock,
        &diagnostics_line(DiagnosticsRequest {
            since_seconds: Some(0),
            ..ask(10)
        }),
    ));
    assert_eq!(code, ErrorCode::Invalid);
    assert!(message.contains("sinceSeconds"), "{message}");
    // No command, path or item off the menu gets through the parser.
    for bad in [
        r#"{"protocol":1,"request":{"op":"diagnostics","request":{"lines":5,"requestedAt":"2026-12-07T10:00:00.000Z","items":["shell"]}}}"#,
        r#"{"protocol":1,"request":{"op":"diagnostics","request":{"lines":5,"requestedAt":"2026-12-07T10:00:00.000Z","command":"id"}}}"#,
    ] {
        let (code, _) = refused(exchange(&sock, format!("{bad}\n").as_bytes()));
        assert_eq!(code, ErrorCode::Invalid, "{bad}");
    }
    // While one is collected (its lock held here), another is told to come back; status is still answered.
    let held = u.diagnostics_lock().lock().expect("lock");
    assert_eq!(
        refused(exchange(&sock, &diagnostics_line(ask(10)))),
        (
            ErrorCode::Busy,
            "another diagnostics request is being collected; try again".to_owned()
        )
    );
    assert!(matches!(
        exchange(&sock, b"{\"protocol\":1,\"request\":{\"op\":\"status\"}}\n"),
        Response::Status { .. }
    ));
    drop(held);
    assert_eq!(
        sections(exchange(&sock, &diagnostics_line(ask(10)))).len(),
        5
    );
}

#[test]
fn diagnostics_are_answered_while_an_upgrade_prepares() {
    let dev = Device::new();
    let bytes = candidate(TARGET);
    let gate = Arc::new(Gate::default());
    let mut fetcher = LocalFetcher::new(bytes.clone());
    fetcher.gate = Some(gate.clone());
    let (_u, sock) = start(&dev, Box::new(fetcher));
    let a = attempt_for(&bytes, TARGET);
    let upgrade = line(&RequestFrame {
        protocol: PROTOCOL_VERSION,
        request: Request::Upgrade { attempt: a.clone() },
    });
    assert!(matches!(
        exchange(&sock, &upgrade),
        Response::Accepted { .. }
    ));
    // The download is held: the transaction runs, and diagnostics show it.
    let got = sections(exchange(
        &sock,
        &diagnostics_line(DiagnosticsRequest {
            items: vec![Item::UpdaterState],
            ..ask(200)
        }),
    ));
    let state = &section(&got, Item::UpdaterState).text;
    for l in [
        "agent upgrade:\n".to_owned(),
        format!("  attemptId: {}\n", a.attempt_id),
        "  phase: preparing\n".to_owned(),
        format!("  targetVersion: {TARGET}\n"),
    ] {
        assert!(state.contains(&l), "{l:?} in {state}");
    }
    // A mutating request is still one at a time while it runs.
    let other = attempt_for(&candidate("1.3.0"), "1.3.0");
    let busy = exchange(
        &sock,
        &line(&RequestFrame {
            protocol: PROTOCOL_VERSION,
            request: Request::Upgrade { attempt: other },
        }),
    );
    assert!(
        matches!(
            busy,
            Response::Error {
                code: ErrorCode::Busy,
                ..
            }
        ),
        "{busy:?}"
    );
    gate.open();
}

/// Kills the daemon when the test ends, however it ends.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The `fleet-updater` binary as installed: the agent's unit comes from its configuration, and one log line per
/// request names the items and bytes, never the text.
#[test]
fn the_daemon_reads_the_configured_agent_unit_and_logs_no_text() {
    require_agent_user();
    let dev = Device::new();
    let cfg = dev.dir.path().join("updater.toml");
    std::fs::write(
        &cfg,
        format!(
            "root = \"{}\"\nagent_unit = \"edge-agent.service\"\n",
            dev.dir.path().display()
        ),
    )
    .expect("config");
    let notify_path = dev.dir.path().join("notify.sock");
    let notify = std::os::unix::net::UnixDatagram::bind(&notify_path).expect("bind");
    notify
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let log = dev.dir.path().join("updater.log");
    let _daemon = Killed(
        std::process::Command::new(env!("CARGO_BIN_EXE_fleet-updater"))
            .args(["--config", cfg.to_str().expect("utf8")])
            .env("NOTIFY_SOCKET", &notify_path)
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log"))
            .spawn()
            .expect("spawn"),
    );
    let mut buf = [0u8; 256];
    if let Err(e) = notify.recv(&mut buf) {
        panic!(
            "no READY=1 within 30 s ({e}):\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }
    let got = sections(exchange(
        &dev.paths.socket(),
        &diagnostics_line(DiagnosticsRequest {
            items: vec![Item::AgentJournal, Item::UpdaterState],
            since_seconds: Some(600),
            ..ask(5)
        }),
    ));
    assert_journal(
        section(&got, Item::AgentJournal),
        "edge-agent.service",
        " in the last 600 s",
    );
    let state = &section(&got, Item::UpdaterState).text;
    let text = std::fs::read_to_string(&log).expect("log");
    let line: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("diagnostics:"))
        .collect();
    assert_eq!(line.len(), 1, "{text}");
    let bytes = got.iter().map(|s| s.text.len()).sum::<usize>();
    assert!(
        line[0].contains(&format!(
            "diagnostics: agentJournal, updaterState ({bytes} bytes of text, 5 lines asked) in "
        )),
        "{text}"
    );
    for s in &got {
        assert!(!text.contains(&s.text), "{} logged:\n{text}", s.item.name());
    }
    assert!(state.starts_with("fleet-updater "), "{state}");
}
