//! Shared test set-up: a real nats-server with the agent's buckets, an optional real Podman service, an
//! in-test updater socket peer speaking the fleet-wire protocol, and the agent binary as a child process.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use fleet_rig::nats_client as nats;
use fleet_rig::podman::PodmanService;
use fleet_rig::{wait_for, NatsServer};
use fleet_wire::kv::AGENT_REQUIRED_BUCKETS;
use fleet_wire::socket::{parse_request, read_frame, write_frame, PROTOCOL_VERSION};
use fleet_wire::{Request, Response, ResponseFrame, UpdaterStatus};
use std::io::BufReader;
use std::os::unix::net::{UnixDatagram, UnixListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub const IMAGE: &str = "localhost/busybox:test";
pub const DEVICE: &str = "device-1";

/// Creates every bucket the agent requires (the operator does this on a real fleet).
pub fn create_buckets(nc: &nats::Connection) {
    fleet_rig::nats_client::create_buckets(nc, AGENT_REQUIRED_BUCKETS);
}

/// A KV handle for the test's own reads and writes.
pub fn store(nc: &nats::Connection, bucket: &str) -> nats::kv::Store {
    nats::jetstream::new(nc.clone())
        .key_value(bucket)
        .expect("bucket")
}

/// The in-test updater: answers `status` with the shared status and records every request.
pub struct UpdaterPeer {
    pub status: Arc<Mutex<UpdaterStatus>>,
    pub requests: Arc<Mutex<Vec<Request>>>,
    pub path: PathBuf,
    /// Milliseconds the peer waits before answering an upgrade request (a slow preparation).
    pub upgrade_delay_ms: Arc<std::sync::atomic::AtomicU64>,
}

impl UpdaterPeer {
    pub fn start(path: &Path) -> Self {
        std::fs::create_dir_all(path.parent().expect("dir")).expect("mkdir");
        let listener = UnixListener::bind(path).expect("bind updater socket");
        let status = Arc::new(Mutex::new(UpdaterStatus {
            updater_version: "test-peer".into(),
            boot_id: None,
            recovering: false,
            agent_upgrade: None,
            system_upgrade: None,
            capabilities: Vec::new(),
        }));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let upgrade_delay_ms = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (s, r, delay) = (status.clone(), requests.clone(), upgrade_delay_ms.clone());
        std::thread::spawn(move || {
            // One thread per connection, like the real updater: status stays available during an upgrade.
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let (s, r, delay) = (s.clone(), r.clone(), delay.clone());
                std::thread::spawn(move || serve(conn, &s, &r, &delay));
            }
        });
        Self {
            status,
            requests,
            path: path.to_owned(),
            upgrade_delay_ms,
        }
    }

    /// Requests other than `status`.
    pub fn mutating_requests(&self) -> Vec<Request> {
        self.requests
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.is_mutating())
            .cloned()
            .collect()
    }
}

fn serve(
    conn: std::os::unix::net::UnixStream,
    s: &Mutex<UpdaterStatus>,
    r: &Mutex<Vec<Request>>,
    delay: &std::sync::atomic::AtomicU64,
) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
    let Ok(clone) = conn.try_clone() else { return };
    let mut reader = BufReader::new(clone);
    let Ok(Some(line)) = read_frame(&mut reader, 1 << 20) else {
        return;
    };
    let response = match parse_request(&line) {
        Ok(req) => {
            r.lock().unwrap().push(req.clone());
            match req {
                Request::Status {} => Response::Status {
                    status: s.lock().unwrap().clone(),
                },
                _ => {
                    let ms = delay.load(std::sync::atomic::Ordering::SeqCst);
                    // why: a slow updater is the scenario: answers after the test's upgrade_delay_ms (0 unless set)
                    std::thread::sleep(Duration::from_millis(ms));
                    Response::Accepted {
                        status: s.lock().unwrap().clone(),
                    }
                }
            }
        }
        Err(e) => Response::error(e.code, e.message),
    };
    let mut w = conn;
    let _ = write_frame(
        &mut w,
        &ResponseFrame {
            protocol: PROTOCOL_VERSION,
            response,
        },
    );
}

/// Everything one agent test needs.
pub struct Rig {
    pub nats: NatsServer,
    pub podman: Option<PodmanService>,
    pub root: tempfile::TempDir,
    pub peer: UpdaterPeer,
    pub config: PathBuf,
}

impl Rig {
    /// NATS with buckets, the peer, and Podman (with the test image) when `with_podman`.
    pub fn new(with_podman: bool, extra_config: &str) -> Self {
        Self::with_podman(with_podman.then(PodmanService::start), extra_config)
    }

    /// Like [`Rig::new`] with the test's own Podman service (e.g. its storage on a small file system), given the
    /// test image here.
    pub fn with_podman(podman: Option<PodmanService>, extra_config: &str) -> Self {
        let nats = NatsServer::start();
        create_buckets(&nats.connect());
        if let Some(p) = &podman {
            p.import_busybox(IMAGE);
        }
        let root = tempfile::Builder::new()
            .prefix("fleet-agent-root-")
            .tempdir()
            .expect("root");
        std::fs::create_dir_all(root.path().join("etc")).expect("etc");
        std::fs::write(
            root.path().join("etc/os-release"),
            "ID=debian\nVERSION_ID=\"12\"\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\n",
        )
        .expect("os-release");
        let peer = UpdaterPeer::start(&fleet_wire::socket::updater_socket(root.path()));
        let config = root.path().join("agent.toml");
        let mut rig = Self {
            nats,
            podman,
            root,
            peer,
            config,
        };
        rig.write_config(extra_config);
        rig
    }

    /// (Re)writes the config with the standard test settings plus `extra` lines at the top level.
    pub fn write_config(&mut self, extra: &str) {
        self.write_config_intervals(
            extra,
            "heartbeat_secs = 1\nstatus_secs = 1\nresync_secs = 2\nupdater_poll_ms = 200\n",
        );
    }

    /// Like [`Rig::write_config`] with `intervals` as the `[intervals]` table's lines.
    pub fn write_config_intervals(&mut self, extra: &str, intervals: &str) {
        let podman = match &self.podman {
            Some(p) => format!(
                "[podman]\nsocket = \"{}\"\nstop_timeout_secs = 4\n",
                p.socket().display()
            ),
            None => "[podman]\nenabled = false\n".into(),
        };
        let text = format!(
            "device_id = \"{DEVICE}\"\nroot = \"{}\"\n{extra}\n[nats]\nurls = [\"{}\"]\nconnect_timeout_secs = 2\nretry_window_secs = 120\n{podman}[intervals]\n{intervals}",
            self.root.path().display(),
            self.nats.url()
        );
        std::fs::write(&self.config, text).expect("config");
    }

    pub fn nc(&self) -> nats::Connection {
        self.nats.connect()
    }

    pub fn spawn_agent(&self) -> Agent {
        Agent::spawn(&self.config, self.root.path())
    }
}

/// The agent binary: `FLEET_AGENT_BIN` when set (the benchmark uses a release build), else the one cargo built
/// for this test.
pub fn agent_bin() -> PathBuf {
    std::env::var_os("FLEET_AGENT_BIN")
        .map(PathBuf::from)
        .or_else(|| option_env!("CARGO_BIN_EXE_fleet-agent").map(PathBuf::from))
        .expect("FLEET_AGENT_BIN is not set and this is not an integration test")
}

/// The agent binary as a child process (killed on drop), with its systemd notifications captured.
pub struct Agent {
    pub child: Child,
    notify: UnixDatagram,
    pub log: PathBuf,
    _notify_dir: tempfile::TempDir,
}

impl Agent {
    pub fn spawn(config: &Path, root: &Path) -> Agent {
        Self::spawn_logging(config, root, "info")
    }

    /// Like [`Agent::spawn`] with `RUST_LOG` set to `rust_log` (the benchmark turns the timing marks on).
    pub fn spawn_logging(config: &Path, root: &Path, rust_log: &str) -> Agent {
        let dir = tempfile::tempdir().expect("notify dir");
        let sock = dir.path().join("notify");
        let notify = UnixDatagram::bind(&sock).expect("bind notify");
        notify
            .set_read_timeout(Some(Duration::from_millis(200)))
            .expect("timeout");
        let n = std::fs::read_dir(root).map(|d| d.count()).unwrap_or(0);
        let log = root.join(format!("agent-{n}.log"));
        let child = Command::new(agent_bin())
            .arg("--config")
            .arg(config)
            .env("NOTIFY_SOCKET", &sock)
            .env("RUST_LOG", rust_log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log"))
            .spawn()
            .expect("spawn fleet-agent");
        Agent {
            child,
            notify,
            log,
            _notify_dir: dir,
        }
    }

    /// Waits for a notification equal to `state`; panics with the agent's log on time-out.
    pub fn wait_notify(&mut self, state: &str, timeout: Duration) {
        let got = wait_for(timeout, || {
            let mut buf = [0u8; 256];
            match self.notify.recv(&mut buf) {
                Ok(n) if &buf[..n] == state.as_bytes() => Some(()),
                _ => None,
            }
        });
        if got.is_none() {
            panic!(
                "no {state} within {timeout:?}; agent log:\n{}",
                self.log_text()
            );
        }
    }

    pub fn wait_ready(&mut self) {
        self.wait_notify("READY=1", Duration::from_secs(60));
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn sigterm(&self) {
        let pid = i32::try_from(self.child.id()).expect("pid");
        // SAFETY: kill on our own child's pid.
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }

    /// Waits for exit; panics after `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let child = &mut self.child;
        match wait_for(timeout, || child.try_wait().ok().flatten()) {
            Some(s) => s,
            None => panic!(
                "agent did not exit within {timeout:?}; log:\n{}",
                self.log_text()
            ),
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `f` up to `timeout` (the rig's one wait), failing with `what` (and the agent log) on time-out.
pub fn eventually<T>(
    agent: &Agent,
    timeout: Duration,
    what: &str,
    mut f: impl FnMut() -> Option<T>,
) -> T {
    fleet_rig::wait::poll(timeout, || f().ok_or(fleet_rig::wait::Nothing))
        .unwrap_or_else(|t| panic!("{}; agent log:\n{}", t.message(what), agent.log_text()))
}

/// Reads and parses a KV JSON value.
pub fn get_json<T: serde::de::DeserializeOwned>(store: &nats::kv::Store, key: &str) -> Option<T> {
    store
        .get(key)
        .ok()
        .flatten()
        .and_then(|b| serde_json::from_slice(&b).ok())
}

/// A tmpfs mounted for the test, unmounted (lazily, should a process still hold it) when dropped.
pub struct Tmpfs(pub PathBuf, Option<tempfile::TempDir>);

impl Tmpfs {
    /// A tmpfs of `size` (`64m`) in a directory of its own.
    pub fn mount(size: &str) -> Tmpfs {
        let dir = tempfile::Builder::new()
            .prefix("fleet-tmpfs-")
            .tempdir()
            .expect("dir");
        let mut t = Self::mount_at(&dir.path().join("fs"), size);
        t.1 = Some(dir);
        t
    }

    /// A tmpfs of `size` on `at` (made when missing).
    pub fn mount_at(at: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(at).expect("mkdir");
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .status()
            .expect("run mount");
        assert!(
            st.success(),
            "mount -t tmpfs {}: the test needs root",
            at.display()
        );
        Tmpfs(at.to_owned(), None)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}
