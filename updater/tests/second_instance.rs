//! Two real `fleet-updater` processes on one root: the second (started by hand beside the unit's) refuses at once
//! with a clear message, and touches neither the live socket nor the state directory's journals.

mod common;

use common::*;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::MetadataExt;
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

/// Starts the updater and waits (at most 30 s) for its `READY=1`.
fn start_ready(dev: &Device, cfg: &Path, name: &str) -> Killed {
    let notify_path = dev.dir.path().join(name);
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
    let mut buf = [0u8; 256];
    let n = notify.recv(&mut buf).expect("READY=1 within 30 s");
    assert!(String::from_utf8_lossy(&buf[..n]).contains("READY=1"));
    child
}

/// Runs a second updater to its end (killed after 30 s: today's code serves forever); returns its exit code and
/// stderr.
fn run_second(cfg: &Path) -> (Option<i32>, String) {
    let mut child = Command::new(BIN)
        .args(["--config", cfg.to_str().expect("utf8")])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let deadline = Instant::now() + Duration::from_secs(30);
    let code = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st.code();
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        // why: pacing of the bounded poll
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut err);
    }
    (code, err)
}

/// What the second process could have changed: the socket's inode and the state directory's files with their
/// modification times.
fn footprint(dev: &Device) -> (u64, Vec<(String, i64, i64)>) {
    let ino = std::fs::metadata(dev.paths.socket()).expect("socket").ino();
    let mut files: Vec<_> = std::fs::read_dir(dev.paths.state_dir())
        .into_iter()
        .flatten()
        .map(|e| {
            let e = e.expect("entry");
            let m = e.metadata().expect("meta");
            (
                e.file_name().to_string_lossy().into_owned(),
                m.mtime(),
                m.mtime_nsec(),
            )
        })
        .collect();
    files.sort();
    (ino, files)
}

#[test]
fn a_second_updater_refuses_and_touches_nothing() {
    require_agent_user();
    let dev = Device::new();
    let cfg = dev.dir.path().join("updater.toml");
    std::fs::write(
        &cfg,
        format!(
            "root = \"{}\"\ndevice_id = \"device-1\"\n",
            dev.dir.path().display()
        ),
    )
    .expect("write config");
    let first = start_ready(&dev, &cfg, "notify-1.sock");
    // Twice: with the state the first left, and with a journal the second would stop at if it read it (it does not
    // parse), standing for a transaction the first is carrying out.
    for corrupt_journal in [false, true] {
        if corrupt_journal {
            std::fs::write(dev.paths.journal(), b"{\"format\":1,\"attempt\":").expect("write");
        }
        let before = footprint(&dev);
        let (code, err) = run_second(&cfg);
        assert_eq!(
            code,
            Some(1),
            "the second updater must exit 1; stderr: {err}"
        );
        assert!(
            err.contains("another fleet-updater holds")
                && err.contains(
                    &dev.paths
                        .state_dir()
                        .join("updater.lock")
                        .display()
                        .to_string()
                ),
            "{err}"
        );
        assert!(
            !err.contains("journal"),
            "the second updater read the journal: {err}"
        );
        assert_eq!(footprint(&dev), before, "socket or state directory changed");
        assert!(
            status_ok(&dev.paths.socket()),
            "the first updater still answers"
        );
    }

    // The kernel releases the lock with the process, however it ends: a new updater starts at once.
    drop(first);
    std::fs::remove_file(dev.paths.journal()).expect("rm");
    let _again = start_ready(&dev, &cfg, "notify-2.sock");
    assert!(status_ok(&dev.paths.socket()));
}
