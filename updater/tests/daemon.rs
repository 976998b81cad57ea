//! The `fleet-updater` binary: arguments, configuration errors, a corrupt journal that keeps the socket closed,
//! and readiness (`READY=1` on `$NOTIFY_SOCKET`) only after the socket answers.

mod common;

use common::*;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixDatagram, UnixStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_fleet-updater");

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn config(dev: &Device, extra: &str) -> std::path::PathBuf {
    let p = dev.dir.path().join("updater.toml");
    std::fs::write(
        &p,
        format!("root = \"{}\"\n{extra}", dev.dir.path().display()),
    )
    .expect("write config");
    p
}

fn run_to_end(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN).args(args).output().expect("runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn arguments() {
    let (code, out, _) = run_to_end(&["--version"]);
    assert_eq!((code, out.trim()), (0, env!("CARGO_PKG_VERSION")));
    let (code, out, _) = run_to_end(&["--help"]);
    assert_eq!(code, 0);
    for key in [
        "--config",
        "root",
        "extra_ca_file",
        "agent_unit",
        "agent_user",
    ] {
        assert!(out.contains(key), "--help lacks {key}");
    }
    let (code, _, err) = run_to_end(&["--frobnicate"]);
    assert_eq!(code, 2);
    assert!(err.contains("--frobnicate"));
}

#[test]
fn configuration_errors_stop_the_updater() {
    let dev = Device::new();
    let cfg = config(&dev, "agent_user = \"Root;rm\"\n");
    let (code, _, err) = run_to_end(&["--config", cfg.to_str().expect("utf8")]);
    assert_eq!(code, 1);
    assert!(err.contains("agent_user"), "{err}");
    let (code, _, err) = run_to_end(&["--config", "/nonexistent/updater.toml"]);
    assert_eq!(code, 1);
    assert!(err.contains("/nonexistent/updater.toml"), "{err}");
    assert!(!dev.paths.socket().exists());
}

/// A configuration written for a newer release (its device setup) still starts this one: each key it does not
/// know is one warning, and the keys it knows apply.
#[test]
fn unknown_configuration_keys_are_ignored_with_a_warning_each() {
    require_agent_user();
    let dev = Device::new();
    let cfg = config(
        &dev,
        "agent_usr = \"x\"\ndevice_id = \"device-1\"\n[metrics]\nport = 9100\n",
    );
    let notify_path = dev.dir.path().join("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).expect("bind");
    notify
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let log = dev.dir.path().join("updater.log");
    let _child = Killed(
        Command::new(BIN)
            .args(["--config", cfg.to_str().expect("utf8")])
            .env("NOTIFY_SOCKET", &notify_path)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log"))
            .spawn()
            .expect("spawn"),
    );
    let mut buf = [0u8; 256];
    let got = notify.recv(&mut buf);
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    got.unwrap_or_else(|e| panic!("no READY=1 within 30 s ({e}):\n{text}"));
    assert!(status_ok(&dev.paths.socket()), "{text}");
    for key in ["agent_usr", "metrics"] {
        let line = format!("unknown key `{key}` ignored");
        assert_eq!(text.matches(&line).count(), 1, "{key}:\n{text}");
    }
}

#[test]
fn a_corrupt_journal_keeps_the_socket_closed() {
    require_agent_user();
    let dev = Device::new();
    let cfg = config(&dev, "");
    std::fs::create_dir_all(dev.paths.state_dir()).expect("mkdir");
    std::fs::write(dev.paths.journal(), b"{\"format\":1,\"attempt\":").expect("write");
    let (code, _, err) = run_to_end(&["--config", cfg.to_str().expect("utf8")]);
    assert_eq!(code, 1);
    assert!(
        err.contains(&dev.paths.journal().display().to_string()) && err.contains("inspect"),
        "{err}"
    );
    assert!(!dev.paths.socket().exists(), "the socket must never open");
    assert!(!dev.paths.run_dir().exists());
}

fn status_ok(sock: &Path) -> bool {
    let Ok(mut s) = UnixStream::connect(sock) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(15)));
    if s.write_all(b"{\"protocol\":1,\"request\":{\"op\":\"status\"}}\n")
        .is_err()
    {
        return false;
    }
    let mut line = String::new();
    BufReader::new(&s).read_line(&mut line).is_ok() && line.contains("\"kind\":\"status\"")
}

/// Starts the daemon with `cfg` under a test `NOTIFY_SOCKET` (receiving with a 30 s time-out); killed on drop.
fn spawn_notified(dev: &Device, cfg: &Path) -> (Killed, UnixDatagram) {
    let notify_path = dev.dir.path().join("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).expect("bind");
    notify
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let child = Killed(
        Command::new(BIN)
            .args(["--config", cfg.to_str().expect("utf8")])
            .env("NOTIFY_SOCKET", &notify_path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn"),
    );
    (child, notify)
}

#[test]
fn ready_only_after_the_socket_answers() {
    require_agent_user();
    let dev = Device::new();
    let cfg = config(&dev, "");
    let (_child, notify) = spawn_notified(&dev, &cfg);
    let started = Instant::now();
    let mut buf = [0u8; 256];
    let n = notify.recv(&mut buf).expect("READY=1 within 30 s");
    let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(msg.lines().any(|l| l == "READY=1"), "{msg}");
    assert!(status_ok(&dev.paths.socket()), "status right after READY=1");
    assert!(started.elapsed() < Duration::from_secs(30));
}

/// Defence in depth: the root process itself refuses an attempt (either kind) for another device than the
/// `device_id` of its configuration, before anything is journaled.
#[test]
fn the_daemon_refuses_attempts_for_another_device() {
    require_agent_user();
    let dev = Device::new();
    let cfg = config(&dev, "device_id = \"device-1\"\n");
    let (_child, notify) = spawn_notified(&dev, &cfg);
    let mut buf = [0u8; 256];
    notify.recv(&mut buf).expect("READY=1 within 30 s");
    let ask = |request: fleet_wire::Request| -> String {
        let frame = fleet_wire::RequestFrame {
            protocol: fleet_wire::socket::PROTOCOL_VERSION,
            request,
        };
        let mut s = UnixStream::connect(dev.paths.socket()).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(15)))
            .expect("timeout");
        let mut line = serde_json::to_vec(&frame).expect("json");
        line.push(b'\n');
        s.write_all(&line).expect("write");
        let mut answer = String::new();
        BufReader::new(&s).read_line(&mut answer).expect("answer");
        answer
    };
    let mut agent = attempt_for(b"bytes", "1.2.0");
    agent.device_id = fleet_wire::DeviceId::try_from("device-2").expect("id");
    let mut system = fleet_wire::fixtures::system_attempt();
    system.device_id = fleet_wire::DeviceId::try_from("device-2").expect("id");
    for request in [
        fleet_wire::Request::Upgrade { attempt: agent },
        fleet_wire::Request::SystemUpgrade { attempt: system },
    ] {
        let answer = ask(request);
        assert!(
            answer.contains("\"invalid\"")
                && answer.contains("device-2")
                && answer.contains("device-1"),
            "{answer}"
        );
    }
    assert!(dev.journal().is_none(), "nothing journaled");
    assert!(!dev.paths.system_journal().exists());
}
