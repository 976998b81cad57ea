//! What the system-upgrade scenarios share: a local apt repository built with `dpkg-deb` and
//! `dpkg-scanpackages` inside a guest (the only source apt sees there), the operator's side of the
//! system-upgrade buckets (intent in, status out), and a device's side of FleetLock (its configuration, the
//! holders of the slot).

use crate::fleet::{device_id, Device, DEVICE};
use fleet_rig::callout::FleetNats;
use fleet_rig::nats_client as nats;
use fleet_rig::nspawn::{ForwardHandle, Guest};
use fleet_rig::wait_for;
use fleet_wire::{
    kv, AttemptId, SystemUpgradeAttempt, SystemUpgradeStatus, TaskOperation, Timestamp,
};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Where the repository lives in the guest (`deb [trusted=yes] file:/srv/fleet-test-repo ./`).
pub const GUEST_REPO: &str = "/srv/fleet-test-repo";

/// A flat apt repository in a guest, built on the host with the real Debian tools.
pub struct AptRepo {
    dir: PathBuf,
    work: tempfile::TempDir,
}

fn run(cmd: &mut Command, what: &str) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: {e} (install dpkg-dev: scripts/setup apt)"));
    assert!(
        out.status.success(),
        "{what} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

impl AptRepo {
    /// Makes the repository the guest's only apt source (the guest has no other network anyway).
    pub fn in_guest(guest: &Guest) -> Self {
        guest.sh(&format!(
            "mkdir -p {GUEST_REPO} && rm -f /etc/apt/sources.list.d/* && \
             echo 'deb [trusted=yes] file:{GUEST_REPO} ./' > /etc/apt/sources.list"
        ));
        let repo = Self {
            dir: guest.path(GUEST_REPO),
            work: tempfile::tempdir().unwrap_or_else(|e| panic!("temp dir: {e}")),
        };
        repo.index();
        repo
    }

    /// Builds package `name` at `version` (architecture `all`, one file `/usr/share/fleet-test/<name>`
    /// holding the version) with the `postinst` script given (empty: none), returns the `.deb` on the host.
    pub fn build(&self, name: &str, version: &str, postinst: &str) -> PathBuf {
        build_deb(self.work.path(), name, version, "", postinst)
    }

    /// Installs a package built with [`Self::build`] in the guest directly (`dpkg -i`): the "before" state.
    pub fn install_now(&self, guest: &Guest, deb: &Path) {
        let name = deb
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        // Not /tmp: the running guest mounts a tmpfs over it.
        let path = format!("/var/tmp/{name}");
        guest.install_file(deb, &path, 0o644);
        guest.sh(&format!("dpkg -i {path} >/dev/null && rm {path}"));
    }

    /// Publishes a package in the repository (regenerating its index).
    pub fn publish(&self, deb: &Path) {
        let name = deb.file_name().unwrap_or_default();
        std::fs::copy(deb, self.dir.join(name)).unwrap_or_else(|e| panic!("copy deb: {e}"));
        self.index();
    }

    fn index(&self) {
        index_repo(&self.dir);
    }
}

/// Builds package `name` at `version` in `work` (architecture `all`, one file `/usr/share/fleet-test/<name>` holding
/// the version), with `Depends: <depends>` when not empty and the `postinst` script given (empty: none); returns
/// the `.deb`.
pub fn build_deb(work: &Path, name: &str, version: &str, depends: &str, postinst: &str) -> PathBuf {
    let root = work.join(format!("{name}_{version}"));
    let debian = root.join("DEBIAN");
    std::fs::create_dir_all(&debian).unwrap_or_else(|e| panic!("mkdir: {e}"));
    std::fs::create_dir_all(root.join("usr/share/fleet-test"))
        .unwrap_or_else(|e| panic!("mkdir: {e}"));
    std::fs::write(root.join("usr/share/fleet-test").join(name), version)
        .unwrap_or_else(|e| panic!("write: {e}"));
    let depends = if depends.is_empty() {
        String::new()
    } else {
        format!("Depends: {depends}\n")
    };
    std::fs::write(
        debian.join("control"),
        format!(
            "Package: {name}\nVersion: {version}\nArchitecture: all\n{depends}Maintainer: Harmony Fleet tests \
             <tests@example.invalid>\nDescription: test package for system upgrades\n"
        ),
    )
    .unwrap_or_else(|e| panic!("write control: {e}"));
    if !postinst.is_empty() {
        let p = debian.join("postinst");
        std::fs::write(&p, format!("#!/bin/sh\nset -e\n{postinst}\n"))
            .unwrap_or_else(|e| panic!("write postinst: {e}"));
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755))
            .unwrap_or_else(|e| panic!("chmod: {e}"));
    }
    let deb = work.join(format!("{name}_{version}_all.deb"));
    run(
        Command::new("dpkg-deb")
            .args(["--root-owner-group", "-Zgzip", "--build"])
            .arg(&root)
            .arg(&deb),
        "dpkg-deb --build",
    );
    deb
}

/// Writes the `Packages` index of the flat repository in `dir` (`dpkg-scanpackages --multiversion .`).
pub fn index_repo(dir: &Path) {
    let packages = run(
        Command::new("dpkg-scanpackages")
            .args(["--multiversion", "."])
            .current_dir(dir),
        "dpkg-scanpackages",
    );
    std::fs::write(dir.join("Packages"), packages)
        .unwrap_or_else(|e| panic!("write Packages: {e}"));
}

/// The version of `package` installed in the guest (`dpkg-query`), with its status.
pub fn installed(guest: &Guest, package: &str) -> (String, String) {
    let out = guest.sh(&format!(
        "dpkg-query -W -f '${{Version}}|${{Status}}' {package}"
    ));
    let (v, s) = out.split_once('|').unwrap_or((&out, ""));
    (v.to_string(), s.to_string())
}

/// Entries apt wrote to its history log (one per apt-get run that changed packages).
pub fn apt_history_runs(guest: &Guest) -> usize {
    std::fs::read_to_string(guest.path("/var/log/apt/history.log"))
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("Start-Date:"))
        .count()
}

/// The operator's side of the system-upgrade buckets.
pub struct Tasks {
    intents: nats::kv::Store,
    statuses: nats::kv::Store,
    info: nats::kv::Store,
}

impl Tasks {
    /// Opens the buckets (the scenario's `Operator` created them) as the services' own user.
    pub fn new(nats: &FleetNats) -> Self {
        let js = nats::jetstream::new(nats.connect());
        let open = |b: &str| {
            js.key_value(b)
                .unwrap_or_else(|e| panic!("open bucket {b}: {e}"))
        };
        Self {
            intents: open(kv::SYSTEM_UPGRADE_INTENT),
            statuses: open(kv::SYSTEM_UPGRADE_STATUS),
            info: open(kv::DEVICE_INFO),
        }
    }

    /// The capabilities the device advertises in its device info.
    pub fn capabilities(&self) -> Vec<fleet_wire::Capability> {
        self.info
            .get(DEVICE)
            .ok()
            .flatten()
            .and_then(|raw| serde_json::from_slice::<fleet_wire::DeviceInfo>(&raw).ok())
            .map(|i| i.capabilities)
            .unwrap_or_default()
    }

    /// A new attempt for the scenario device that expires `expires_in` from now.
    pub fn attempt(expires_in: Duration) -> SystemUpgradeAttempt {
        SystemUpgradeAttempt {
            run_uid: AttemptId::new_random(),
            device_id: device_id(),
            operation: TaskOperation::AptFullUpgradeV1,
            expires_at: Timestamp::now().plus(expires_in),
        }
    }

    /// Writes the intent as the operator does (again: a new revision with the same value).
    pub fn put_intent(&self, a: &SystemUpgradeAttempt) {
        let value = serde_json::to_vec(a).unwrap_or_else(|e| panic!("json: {e}"));
        self.intents
            .put(&kv::run_key(&a.device_id, &a.run_uid), value)
            .unwrap_or_else(|e| panic!("put intent: {e}"));
    }

    /// The run's status in NATS.
    pub fn status(&self, a: &SystemUpgradeAttempt) -> Option<SystemUpgradeStatus> {
        self.status_of(a.device_id.as_str(), &a.run_uid.to_string())
    }

    /// The status of run `run_uid` (a TaskRun's UID) on `device` in NATS; `None` when absent or not valid.
    pub fn status_of(&self, device: &str, run_uid: &str) -> Option<SystemUpgradeStatus> {
        let key = kv::run_key(
            &fleet_wire::DeviceId::try_from(device).ok()?,
            &AttemptId::try_from(run_uid).ok()?,
        );
        serde_json::from_slice(&self.statuses.get(&key).ok()??).ok()
    }

    /// Waits until the run's status satisfies `done`; fails with the last status and `logs()` otherwise.
    pub fn wait(
        &self,
        a: &SystemUpgradeAttempt,
        timeout: Duration,
        what: &str,
        done: impl Fn(&SystemUpgradeStatus) -> bool,
        logs: impl Fn() -> String,
    ) -> SystemUpgradeStatus {
        let mut last = None;
        let got = wait_for(timeout, || {
            let s = self.status(a)?;
            let hit = done(&s);
            last = Some(s.clone());
            hit.then_some(s)
        });
        got.unwrap_or_else(|| {
            panic!(
                "run {} on {DEVICE}: no {what} within {timeout:?}; last status: {last:#?}\n{}",
                a.run_uid,
                logs()
            )
        })
    }
}

/// `GET <path>` from a server on 127.0.0.1:`port` with a bearer `token`; the body of a 200 answer.
fn get(port: u16, path: &str, token: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    c.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        c,
        "GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    c.take(1 << 20).read_to_string(&mut out).ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| body.to_string())
}

/// The ids holding a slot of group `default` of the FleetLock server on 127.0.0.1:`port` (`/v1/status`, which
/// needs the clients' `token`).
pub fn holder_ids_at(port: u16, token: &str) -> Vec<String> {
    let body = get(port, "/v1/status", token).unwrap_or_default();
    fleet_rig::fleetlock::default_holders(&serde_json::from_str(&body).unwrap_or_default())
}

/// The guest configuration for `fleet-reboot` and the updater's reboots: the FleetLock server relayed to the
/// guest's 127.0.0.1:`port`, group `default`, with the clients' bearer `token`.
pub fn fleetlock_client_config(port: u16, token: &str) -> String {
    format!(
        "server: http://127.0.0.1:{port}\ngroup: default\ntoken: {token}\ntimeout: 2\nallow_degraded: true\nhealth_wait: 120\n"
    )
}

/// The package the fleet-task scenarios upgrade: 1.0 installed, 2.0 in the repository, whose `postinst` sets
/// `/run/reboot-required`, so that the upgrade ends with a reboot coordinated through FleetLock.
pub const REBOOT_PKG: &str = "fleet-test-reboot";

/// What [`ready_for_reboot_upgrade`] leaves in place; keep it while the device upgrades.
pub struct RebootUpgradeReady {
    /// The device's apt repository.
    pub repo: AptRepo,
    /// The FleetLock server's relay into the guest.
    pub lock_link: ForwardHandle,
}

/// Readies `device` for a system upgrade that reboots: the FleetLock server `lock` relayed into its guest and
/// configured for reboots (a device waiting for the slot asks again every 3 s instead of every
/// minute), and a local apt repository with [`REBOOT_PKG`] 1.0 installed and 2.0 published.
pub fn ready_for_reboot_upgrade(
    device: &mut Device,
    lock: &crate::fleetlock::FleetLockServer,
) -> RebootUpgradeReady {
    let lock_link = device.guest.forward(lock.port());
    let guest = &device.guest;
    guest.write_file(
        "/etc/harmony-fleet/fleet-reboot.yaml",
        lock.client_config().as_bytes(),
        0o644,
    );
    guest.sh(
        "echo 'system_reboot_retry_secs = 3' >> /etc/harmony-fleet/updater.toml && \
         systemctl restart fleet-updater.service",
    );
    guest.wait_unit("fleet-updater.service", "active", Duration::from_secs(60));
    let repo = AptRepo::in_guest(guest);
    repo.install_now(guest, &repo.build(REBOOT_PKG, "1.0", ""));
    repo.publish(&repo.build(
        REBOOT_PKG,
        "2.0",
        "[ \"$1\" = configure ] && touch /run/reboot-required || true",
    ));
    RebootUpgradeReady { repo, lock_link }
}

/// Watches the holders of group `default` of a FleetLock server (every 50 ms, on a thread) until
/// [`HolderWatch::stop`].
pub struct HolderWatch {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<(usize, Vec<String>)>,
}

impl HolderWatch {
    /// Starts watching `lock`.
    pub fn start(lock: &crate::fleetlock::FleetLockServer) -> Self {
        let (port, token) = (lock.port(), lock.token().to_owned());
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let (mut max, mut order) = (0usize, Vec::<String>::new());
            while !flag.load(std::sync::atomic::Ordering::SeqCst) {
                let ids = holder_ids_at(port, &token);
                max = max.max(ids.len());
                for id in ids {
                    if order.last() != Some(&id) {
                        order.push(id);
                    }
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            (max, order)
        });
        Self { stop, thread }
    }

    /// Stops watching: the most holders seen at once, and the holders in the order they held the slot.
    pub fn stop(self) -> (usize, Vec<String>) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.thread
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
    }
}
