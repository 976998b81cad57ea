//! The reboot client against real local listeners (a FleetLock responder, TCP and HTTP dependencies, a CIDR of
//! loopback addresses) with a scripted command runner for systemctl and bootc, and the marker / boot-id cycle by
//! changing the boot id between two runs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use fleet_updater::reboot::system::{Output, System};
use fleet_updater::reboot::{release_after_boot, run_once, Outcome, RebootConfig, RunOptions};
mod fleetlock_responder;

use fleetlock_responder::responder;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

/// Scripted host commands: `program args` → stdout (exit 0), `Err` when absent; every call is recorded.
#[derive(Default)]
struct Script {
    answers: Mutex<HashMap<String, Result<Output, String>>>,
    calls: Mutex<Vec<String>>,
}

impl Script {
    fn set(&self, cmd: &str, stdout: &str, code: i32) {
        self.answers.lock().unwrap().insert(
            cmd.into(),
            Ok(Output {
                code: Some(code),
                stdout: stdout.as_bytes().to_vec(),
            }),
        );
    }
    fn called(&self, cmd: &str) -> bool {
        self.calls.lock().unwrap().iter().any(|c| c == cmd)
    }
}

impl System for Script {
    fn run(&self, program: &str, args: &[&str], _t: Duration) -> Result<Output, String> {
        let cmd = format!("{program} {}", args.join(" "));
        self.calls.lock().unwrap().push(cmd.clone());
        self.answers
            .lock()
            .unwrap()
            .get(&cmd)
            .cloned()
            .unwrap_or_else(|| Err(format!("{program}: not installed")))
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
    let script = Script::default();
    script.set("systemctl is-system-running", "running\n", 0);
    script.set("systemctl reboot", "", 0);
    Host { root, script }
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
    let e = run_once(&cfg, &h.script, at("2026-11-29T23:30:00Z")).unwrap_err();
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
