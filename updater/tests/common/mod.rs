//! Shared test helpers: a device root in a temp dir, candidate scripts, a local fetcher, a scripted fake
//! service manager (fault injection only), attempts.
#![allow(dead_code, missing_docs)]

use fleet_updater::agent_upgrade::journal::Journal;
use fleet_updater::agent_upgrade::probe::Prober;
use fleet_updater::agent_upgrade::transaction::{
    Bounds, Deps, PendingRecovery, StartError, Updater,
};
use fleet_updater::fault::Faults;
use fleet_updater::fetch_runner::{DownloadError, Downloaded, Fetcher};
use fleet_updater::paths::Paths;
use fleet_updater::reboot::Outcome as RebootOutcome;
use fleet_updater::service::{ServiceError, ServiceManager};
use fleet_updater::system::apt::Apt;
use fleet_updater::system::reboot::{Rebooter, StepError};
use fleet_updater::system::SystemDeps;
use fleet_wire::{
    AgentUpgradeAttempt, Architecture, AttemptId, ByteLimit, DeviceId, Sha256Hex, UnitName,
    UpgradeReason, Version,
};
use sha2::{Digest, Sha256};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

pub const PREVIOUS: &str = "1.1.0";
pub const TARGET: &str = "1.2.0";

pub fn sha256(bytes: &[u8]) -> Sha256Hex {
    Sha256Hex::from_bytes(Sha256::digest(bytes).into())
}

/// A candidate `fleet-agent` that answers `--self-test` with a passing report of `version`. The check names carry
/// the ids and environment it ran with, so tests can assert them.
pub fn candidate(version: &str) -> Vec<u8> {
    format!(
        r#"#!/bin/sh
[ "$1" = "--self-test" ] || exit 64
ids="ids $(id -u) $(id -g) $(id -G)"
envs="env $(env | cut -d= -f1 | sort | tr '\n' ' ')"
echo "{{\"version\":\"{version}\",\"passed\":true,\"checks\":[{{\"name\":\"$ids\",\"ok\":true}},{{\"name\":\"$envs\",\"ok\":true}}]}}"
"#
    )
    .into_bytes()
}

/// A candidate whose self-test fails its `nats` check.
pub fn failing_candidate(version: &str) -> Vec<u8> {
    format!(
        "#!/bin/sh\necho '{{\"version\":\"{version}\",\"passed\":false,\"checks\":[{{\"name\":\"nats\",\"ok\":false,\"error\":\"connection refused\"}}]}}'\nexit 1\n"
    )
    .into_bytes()
}

pub fn attempt_for(bytes: &[u8], version: &str) -> AgentUpgradeAttempt {
    AgentUpgradeAttempt {
        attempt_id: AttemptId::new_random(),
        device_id: DeviceId::try_from("device-1").expect("id"),
        target_version: Version::try_from(version).expect("version"),
        architecture: Architecture::current().expect("supported arch"),
        artifact: format!("https://artifacts.example.com/fleet-agent-{version}")
            .parse()
            .expect("url"),
        byte_limit: ByteLimit::try_from(20 * 1024 * 1024).expect("limit"),
        sha256: sha256(bytes),
    }
}

/// A device root in a temp dir: the previous agent installed and selected.
pub struct Device {
    pub dir: tempfile::TempDir,
    pub paths: Paths,
}

impl Device {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("tmp");
        // The probe runs as fleet-agent, which must reach the candidate.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        let paths = Paths::new(dir.path());
        std::fs::create_dir_all(paths.binaries_dir()).expect("mkdir");
        std::fs::create_dir_all(paths.active_link().parent().expect("parent")).expect("mkdir");
        let prev = paths.binary(&Version::try_from(PREVIOUS).expect("v"));
        std::fs::write(&prev, candidate(PREVIOUS)).expect("write");
        std::fs::set_permissions(&prev, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        std::os::unix::fs::symlink(&prev, paths.active_link()).expect("link");
        Self { dir, paths }
    }

    pub fn binary(&self, version: &str) -> PathBuf {
        self.paths.binary(&Version::try_from(version).expect("v"))
    }

    /// The version the active link selects.
    pub fn active(&self) -> String {
        let t = std::fs::read_link(self.paths.active_link()).expect("readlink");
        t.file_name()
            .expect("name")
            .to_string_lossy()
            .trim_start_matches("fleet-agent-v")
            .to_string()
    }

    pub fn journal(&self) -> Option<Journal> {
        Journal::load(&self.paths.journal()).expect("journal")
    }

    pub fn open(
        &self,
        fetcher: Box<dyn Fetcher>,
        services: Arc<FakeServices>,
        faults: Faults,
    ) -> Result<(Updater, Option<PendingRecovery>), StartError> {
        Updater::open(
            self.paths.clone(),
            UnitName::try_from("fleet-agent.service").expect("unit"),
            Deps {
                fetcher,
                services,
                prober: Prober::new("fleet-agent", Duration::from_secs(60)).allow_scripts(),
                faults,
                system: self.system_deps(Vec::new()),
                device_id: Some(DeviceId::try_from("device-1").expect("id")),
            },
            Bounds::default(),
        )
    }

    /// Opens the updater with the fake apt of [`FakeApt`] and a scripted reboot client.
    pub fn open_system(
        &self,
        apt: &FakeApt,
        reboots: Vec<Result<RebootOutcome, StepError>>,
        faults: Faults,
    ) -> Result<(Updater, Option<PendingRecovery>), StartError> {
        let mut system = self.system_deps(reboots);
        system.apt = Apt::new(apt.dir.clone());
        Updater::open(
            self.paths.clone(),
            UnitName::try_from("fleet-agent.service").expect("unit"),
            Deps {
                fetcher: fetcher_for(b"x"),
                services: FakeServices::new(self),
                prober: Prober::new("fleet-agent", Duration::from_secs(60)).allow_scripts(),
                faults,
                system,
                device_id: Some(DeviceId::try_from("device-1").expect("id")),
            },
            Bounds::default(),
        )
    }

    /// No apt (an empty binary directory) and a reboot client answering `reboots` in order.
    pub fn system_deps(&self, reboots: Vec<Result<RebootOutcome, StepError>>) -> SystemDeps {
        SystemDeps {
            apt: Apt::new(self.dir.path().join("no-apt")),
            rebooter: Box::new(ScriptedReboots(Mutex::new(reboots.into()))),
            reboot_retry: Duration::from_millis(20),
        }
    }
}

/// The real `fleet-fetch` helper (the multicall `fleet-tools` under that name), copied into `dir` (mode 0755)
/// where the agent user, which runs it, can reach it.
pub fn fetch_helper_in(dir: &Path) -> PathBuf {
    let helper = dir.join("fleet-fetch");
    fleet_rig::util::install_executable(Path::new(env!("CARGO_BIN_EXE_fleet-tools")), &helper);
    helper
}

/// Serves one artifact from memory, as the real fetcher would: a fsynced temp file inside `tmp_dir`, size limit
/// and SHA-256 enforced. An optional gate holds each download until opened.
pub struct LocalFetcher {
    pub artifact: Vec<u8>,
    pub calls: Arc<AtomicUsize>,
    pub gate: Option<Arc<Gate>>,
}

impl LocalFetcher {
    pub fn new(artifact: Vec<u8>) -> Self {
        Self {
            artifact,
            calls: Arc::new(AtomicUsize::new(0)),
            gate: None,
        }
    }
}

#[derive(Default)]
pub struct Gate {
    open: Mutex<bool>,
    cv: Condvar,
}

impl Gate {
    pub fn open(&self) {
        *self.open.lock().expect("lock") = true;
        self.cv.notify_all();
    }
    fn wait(&self) {
        let mut g = self.open.lock().expect("lock");
        while !*g {
            g = self.cv.wait(g).expect("wait");
        }
    }
}

impl Fetcher for LocalFetcher {
    fn fetch(
        &self,
        attempt: &AgentUpgradeAttempt,
        tmp_dir: &Path,
    ) -> Result<Downloaded, DownloadError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if let Some(g) = &self.gate {
            g.wait();
        }
        let fail = |reason, message: &str| DownloadError {
            reason,
            message: message.into(),
        };
        if self.artifact.len() as u64 > attempt.effective_byte_limit() {
            return Err(fail(UpgradeReason::ArtifactTooLarge, "too large"));
        }
        let got = sha256(&self.artifact);
        if got != attempt.sha256 {
            return Err(fail(UpgradeReason::DigestMismatch, "sha256 mismatch"));
        }
        let path = tmp_dir.join(format!("download-{}", attempt.attempt_id));
        let mut f = std::fs::File::create(&path).expect("create");
        f.write_all(&self.artifact).expect("write");
        f.sync_all().expect("sync");
        Ok(Downloaded {
            path,
            sha256: got,
            bytes: self.artifact.len() as u64,
        })
    }
}

/// A scripted service manager for fault injection: records calls (a start records the version the active link
/// selects at that moment) and fails the next N stops or starts on request.
pub struct FakeServices {
    link: PathBuf,
    pub calls: Mutex<Vec<String>>,
    pub fail_starts: AtomicUsize,
    pub fail_stops: AtomicUsize,
    /// The next N starts fail the way `systemctl` does when PID 1 goes away mid-call (a power cut, a shutdown).
    pub manager_gone_starts: AtomicUsize,
    /// When set, every start waits for this gate.
    pub start_gate: Mutex<Option<Arc<Gate>>>,
}

impl FakeServices {
    pub fn new(device: &Device) -> Arc<Self> {
        Arc::new(Self {
            link: device.paths.active_link(),
            calls: Mutex::new(Vec::new()),
            fail_starts: AtomicUsize::new(0),
            fail_stops: AtomicUsize::new(0),
            manager_gone_starts: AtomicUsize::new(0),
            start_gate: Mutex::new(None),
        })
    }
    pub fn take_calls(&self) -> Vec<String> {
        std::mem::take(&mut *self.calls.lock().expect("lock"))
    }
    fn take_failure(n: &AtomicUsize) -> bool {
        n.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| v.checked_sub(1))
            .is_ok()
    }
}

impl ServiceManager for FakeServices {
    fn stop(&self, _unit: &UnitName, _bound: Duration) -> Result<(), ServiceError> {
        self.calls.lock().expect("lock").push("stop".into());
        if Self::take_failure(&self.fail_stops) {
            return Err(ServiceError("scripted stop failure".into()));
        }
        Ok(())
    }
    fn start(&self, _unit: &UnitName, _bound: Duration) -> Result<(), ServiceError> {
        let t = std::fs::read_link(&self.link)
            .map(|t| {
                t.file_name()
                    .map(|n| {
                        n.to_string_lossy()
                            .trim_start_matches("fleet-agent-v")
                            .to_string()
                    })
                    .unwrap_or_default()
            })
            .unwrap_or_else(|_| "no-link".into());
        self.calls.lock().expect("lock").push(format!("start {t}"));
        let gate = self.start_gate.lock().expect("lock").clone();
        if let Some(g) = gate {
            g.wait();
        }
        if Self::take_failure(&self.manager_gone_starts) {
            return Err(ServiceError(
                "systemctl start fleet-agent.service failed (exit status: 1): Warning! D-Bus connection \
                 terminated. | Failed to wait for response: Connection reset by peer"
                    .into(),
            ));
        }
        if Self::take_failure(&self.fail_starts) {
            return Err(ServiceError("scripted start failure".into()));
        }
        Ok(())
    }
}

/// Installs the candidate artifact the attempts refer to.
pub fn fetcher_for(bytes: &[u8]) -> Box<LocalFetcher> {
    Box::new(LocalFetcher::new(bytes.to_vec()))
}

/// Fails loudly when the fleet-agent user is missing.
pub fn require_agent_user() {
    if fleet_updater::users::user_by_name("fleet-agent").is_err() {
        panic!("the fleet-agent user is missing: run scripts/setup (scripts/setup.d/30-users.sh) as root");
    }
}

/// A reboot client scripted for fault injection: answers in order, then `NotNow` forever.
pub struct ScriptedReboots(Mutex<std::collections::VecDeque<Result<RebootOutcome, StepError>>>);

impl Rebooter for ScriptedReboots {
    fn step(&self) -> Result<RebootOutcome, StepError> {
        self.0
            .lock()
            .expect("lock")
            .pop_front()
            .unwrap_or_else(|| Ok(RebootOutcome::NotNow("scripted: no more answers".into())))
    }
}

/// `apt-get` and `dpkg` stand-ins in a directory: each call appends its arguments to `calls`, then runs the
/// shell body given for that command (`update`, `full-upgrade`, `dpkg`). `$ROOT` in a body is the device root.
pub struct FakeApt {
    pub dir: PathBuf,
}

impl FakeApt {
    pub fn new(device: &Device, update: &str, full_upgrade: &str, dpkg: &str) -> Self {
        let dir = device.dir.path().join("fake-apt");
        std::fs::create_dir_all(&dir).expect("mkdir");
        let calls = dir.join("calls");
        let root = device.dir.path().display().to_string();
        let write = |name: &str, body: String| {
            let p = dir.join(name);
            std::fs::write(
                &p,
                format!(
                    "#!/bin/sh\nROOT={root}\necho \"{name} $*\" >> {}\n{body}\n",
                    calls.display()
                ),
            )
            .expect("write");
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        };
        write(
            "apt-get",
            format!("case \"$*\" in\n*full-upgrade) {full_upgrade} ;;\n*update) {update} ;;\nesac"),
        );
        write("dpkg", dpkg.to_string());
        Self { dir }
    }

    /// The calls so far, one line each (`apt-get <args>` / `dpkg <args>`).
    pub fn calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.join("calls"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

/// The fetch tests' scene: a dir the agent user can reach (the helper's copy lives there), the root-only download
/// dir inside it, and the test CA the artifact servers use.
pub struct Scene {
    pub dir: tempfile::TempDir,
    pub downloads: PathBuf,
    pub ca: fleet_rig::tls::TestCa,
}

impl Scene {
    pub fn new() -> Self {
        require_agent_user();
        let dir = tempfile::tempdir().expect("tmp");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        let downloads = dir.path().join("partial");
        std::fs::create_dir(&downloads).expect("mkdir");
        std::fs::set_permissions(&downloads, std::fs::Permissions::from_mode(0o700))
            .expect("chmod");
        Self {
            downloads,
            ca: fleet_rig::tls::TestCa::new(),
            dir,
        }
    }
}
