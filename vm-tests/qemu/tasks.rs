//! The fleet-task scenarios on a real kernel (QEMU TCG): one guest installed from the `harmony-fleet-device`
//! package, registered through NATS over TLS with the auth callout, driven by the real operator (kube-apiserver +
//! etcd, `fleet-operator`) and a real `fleetlock-server`, with a local apt repository in the guest. The guest and
//! the host-side services are shared by the task scenarios run in one process (boot once, run several steps):
//! a scenario takes the rig, and gives it back only when it passed.

use fleet_rig::callout::{FleetNats, NatsAuth};
use fleet_rig::wait_for;
use fleet_vm_tests::builds::V1;
use fleet_vm_tests::cluster::Cluster;
use fleet_vm_tests::fleet::{
    agent_config, start_nats, DEVICE, GUEST_NATS_CA_FILE, GUEST_TOKEN_FILE,
};
use fleet_vm_tests::fleetlock::FleetLockServer;
use fleet_vm_tests::packages;
use fleet_vm_tests::qemu::{make_stage_disk, Image, Vm, GUEST_STAGE, HOST_FROM_GUEST};
use fleet_vm_tests::qemu_tasks::{self, RebootedRun};
use fleet_vm_tests::runner::step;
use fleet_vm_tests::tasks::{build_deb, index_repo, Tasks, GUEST_REPO};
use fleet_wire::{
    SystemUpgradeAttempt, SystemUpgradePhase as P, SystemUpgradeReason as R, SystemUpgradeStatus,
};
use std::cell::RefCell;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::run_dir;

const HOUR: Duration = Duration::from_secs(3600);
/// The test package whose 2.0 pulls in Debian's cloud kernel (a new kernel package with its real maintainer
/// scripts and hooks).
const KERNEL_PKG: &str = "fleet-test-kernel";
/// A plain test package (upgraded once per step that needs an apt run without side effects).
const PLAIN_PKG: &str = "fleet-test-pkg";
/// Its 2.0's postinst blocks (until killed) the first time it configures: the updater is killed meanwhile.
const SLOW_PKG: &str = "fleet-test-slow";
/// The same for the power cut in the middle of dpkg.
const CUT_PKG: &str = "fleet-test-cut";
/// Where the guest's observer copies `/run/reboot-required` and `.pkgs` the moment they appear (synced to disk,
/// so that they outlive the reboot that clears /run).
const SEEN_DIR: &str = "/var/lib/fleet-test/reboot-required-seen";

/// The host-side services and the installed guest.
pub struct TaskRig {
    vm: Vm,
    cluster: Cluster,
    lock: FleetLockServer,
    tasks: Tasks,
    _nats: FleetNats,
    /// The kernel package the `kernel` step's upgrade installs (`linux-image-<abi>-cloud-amd64`).
    kernel_package: String,
    _dir: tempfile::TempDir,
}

thread_local! {
    static SHARED: RefCell<Option<TaskRig>> = const { RefCell::new(None) };
}

/// The rig a previous task scenario left, or a new one.
fn take_rig() -> TaskRig {
    match SHARED.with(|s| s.borrow_mut().take()) {
        Some(rig) => {
            step("reusing the guest of the previous task scenario");
            rig
        }
        None => install(),
    }
}

/// Keeps the rig for the next task scenario (only after a pass: a failed scenario's rig is dropped with it).
fn keep_rig(rig: TaskRig) {
    SHARED.with(|s| *s.borrow_mut() = Some(rig));
}

/// Stops the shared guest and services (end of the run).
pub fn drop_shared() {
    SHARED.with(|s| drop(s.borrow_mut().take()));
}

fn write(p: &Path, s: &str) {
    if let Some(d) = p.parent() {
        std::fs::create_dir_all(d).unwrap_or_else(|e| panic!("mkdir {d:?}: {e}"));
    }
    std::fs::write(p, s).unwrap_or_else(|e| panic!("write {p:?}: {e}"));
}

fn copy_into(from: &Path, dir: &Path) {
    std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("mkdir {dir:?}: {e}"));
    let name = from.file_name().unwrap_or_default();
    std::fs::copy(from, dir.join(name)).unwrap_or_else(|e| panic!("copy {from:?}: {e}"));
}

/// A postinst that, the first time it configures, leaves `marker` on disk (synced: it must outlive a power cut)
/// and then blocks, so that the updater or the machine can be killed while dpkg runs it; `dpkg --configure -a`
/// runs it again and it finishes.
fn blocking_postinst(marker: &str) -> String {
    format!(
        "if [ \"$1\" = configure ] && [ ! -e {marker} ]; then mkdir -p /var/lib/fleet-test; \
         touch {marker}; sync; sleep 900; fi"
    )
}

/// The staging disk's apt material: the 1.0 packages installed at set-up (`base/`) and one flat repository per
/// step (`repos/<step>/`, with its `Packages` index), each holding only what that step upgrades.
fn stage_repos(stage: &Path, image: &Image) -> String {
    let work = tempfile::tempdir().unwrap_or_else(|e| panic!("temp dir: {e}"));
    let w = work.path();
    let base = stage.join("base");
    for name in [KERNEL_PKG, PLAIN_PKG, SLOW_PKG, CUT_PKG] {
        copy_into(&build_deb(w, name, "1.0", "", ""), &base);
    }
    let repos = stage.join("repos");
    // kernel: fleet-test-kernel 2.0 depends on Debian's linux-image-cloud-amd64, which full-upgrade installs
    // with the real kernel package behind it (another flavour than the booted linux-image-amd64).
    let kernel = repos.join("kernel");
    copy_into(
        &build_deb(w, KERNEL_PKG, "2.0", "linux-image-cloud-amd64", ""),
        &kernel,
    );
    let mut kernel_package = None;
    let debs = std::fs::read_dir(&image.kernel_upgrade).unwrap_or_else(|e| {
        panic!(
            "{:?}: {e} (the image predates the kernel download: run scripts/setup qemu)",
            image.kernel_upgrade
        )
    });
    for d in debs.flatten() {
        let name = d.file_name().to_string_lossy().into_owned();
        if let Some(pkg) = name.split('_').next() {
            if pkg != "linux-image-cloud-amd64" && pkg.starts_with("linux-image-") {
                kernel_package = Some(pkg.to_string());
            }
        }
        copy_into(&d.path(), &kernel);
    }
    let kernel_package = kernel_package.unwrap_or_else(|| {
        panic!(
            "no kernel package in {:?}: rebuild the image (scripts/setup qemu)",
            image.kernel_upgrade
        )
    });
    copy_into(&build_deb(w, PLAIN_PKG, "2.0", "", ""), &repos.join("pkg"));
    copy_into(
        &build_deb(
            w,
            SLOW_PKG,
            "2.0",
            "",
            &blocking_postinst("/var/lib/fleet-test/slow-started"),
        ),
        &repos.join("slow"),
    );
    copy_into(
        &build_deb(
            w,
            CUT_PKG,
            "2.0",
            "",
            &blocking_postinst("/var/lib/fleet-test/cut-started"),
        ),
        &repos.join("cut"),
    );
    copy_into(
        &build_deb(w, PLAIN_PKG, "3.0", "", ""),
        &repos.join("journal"),
    );
    for r in ["kernel", "pkg", "slow", "cut", "journal"] {
        index_repo(&repos.join(r));
    }
    kernel_package
}

/// The guest's observer of Debian's reboot flag: a path unit that copies `/run/reboot-required` and its `.pkgs`
/// list (which names the package whose hook wrote it) to [`SEEN_DIR`] when they appear.
fn reboot_flag_observer(files: &Path) {
    write(
        &files.join("fleet-test-reboot-seen.path"),
        "[Unit]\nDescription=Watch for Debian's /run/reboot-required (test observer)\n\n[Path]\n\
         PathExists=/run/reboot-required.pkgs\n\n[Install]\nWantedBy=multi-user.target\n",
    );
    write(
        &files.join("fleet-test-reboot-seen.service"),
        &format!(
            "[Unit]\nDescription=Keep a copy of Debian's reboot flag (test observer)\n\n[Service]\nType=oneshot\n\
             ExecStart=/bin/sh -c 'mkdir -p {SEEN_DIR} && sleep 1 && cp /run/reboot-required \
             /run/reboot-required.pkgs {SEEN_DIR}/ && sync'\n"
        ),
    );
}

/// Starts NATS (TLS, auth callout), the cluster with the real operator and fleetlock-server; boots a guest and
/// installs `harmony-fleet-device` from its `.deb` with the admin's configuration in place; waits until the
/// operator shows the Device.
fn install() -> TaskRig {
    let t0 = Instant::now();
    let image = Image::amd64();
    let nats = start_nats();
    let cluster = Cluster::start_with_nats_ca(&nats.service_url(), nats.ca_file());
    let lock = FleetLockServer::start();
    let dir = tempfile::Builder::new()
        .prefix("fleet-qemu-tasks-")
        .tempdir_in(run_dir())
        .unwrap_or_else(|e| panic!("temp dir: {e}"));
    let stage = dir.path().join("stage");
    step("building the harmony-fleet-device package (scripts/package on the test builds)");
    let deb = packages::file_name("harmony-fleet-device");
    copy_into(&packages::amd64(V1).join(&deb), &stage.join("pkgs"));
    let files = stage.join("files");
    let nats_url = match nats.ca_file() {
        Some(ca) => {
            copy_into(ca, &files);
            let name = ca.file_name().unwrap_or_default().to_string_lossy();
            std::fs::rename(files.join(&*name), files.join("nats-ca.pem"))
                .unwrap_or_else(|e| panic!("rename CA: {e}"));
            format!("tls://{HOST_FROM_GUEST}:{}", nats.port())
        }
        None => format!("nats://{HOST_FROM_GUEST}:{}", nats.port()),
    };
    let token = nats.device_token(DEVICE);
    if let Some(t) = &token {
        std::fs::write(files.join("nats-token"), t.as_bytes())
            .unwrap_or_else(|e| panic!("write token: {e}"));
    }
    write(
        &files.join("agent.toml"),
        &agent_config(DEVICE, &nats_url, token.as_ref().map(|_| GUEST_TOKEN_FILE)),
    );
    // A device waiting for the FleetLock slot asks again every 3 s instead of every minute.
    write(
        &files.join("updater.toml"),
        "system_reboot_retry_secs = 3\n",
    );
    // fleetlock-server listens on the host's loopback: the guest's 10.0.2.2.
    write(
        &files.join("fleet-reboot.yaml"),
        &format!(
            "server: http://{HOST_FROM_GUEST}:{}\ngroup: default\ntimeout: 5\nallow_degraded: true\n\
             health_wait: 300\n",
            lock.port()
        ),
    );
    reboot_flag_observer(&files);
    let kernel_package = stage_repos(&stage, &image);
    let disk = dir.path().join("stage.raw");
    make_stage_disk(&stage, &disk);

    step("booting the guest (QEMU TCG)");
    let mut vm = Vm::new(dir.path(), image, &disk);
    let boot = vm.power_on();
    step(&format!("guest up, boot id {boot}"));
    let s = GUEST_STAGE;
    // The admin's configuration first (docs/packages.md, step 1), then the package.
    vm.sh(&format!(
        "mkdir -p {s} && mount -o ro /dev/vdb {s} && install -d -m 0750 /etc/harmony-fleet && \
         install -m 0600 {s}/files/agent.toml /etc/harmony-fleet/agent.toml && \
         {{ [ ! -e {s}/files/nats-token ] || install -m 0600 {s}/files/nats-token {GUEST_TOKEN_FILE}; }} && \
         {{ [ ! -e {s}/files/nats-ca.pem ] || install -m 0644 {s}/files/nats-ca.pem {GUEST_NATS_CA_FILE}; }} && \
         install -m 0644 {s}/files/updater.toml {s}/files/fleet-reboot.yaml /etc/harmony-fleet/ && \
         install -m 0644 {s}/files/fleet-test-reboot-seen.path {s}/files/fleet-test-reboot-seen.service \
           /etc/systemd/system/ && systemctl daemon-reload && \
         systemctl enable --now --quiet fleet-test-reboot-seen.path && \
         dpkg -i {s}/base/*.deb >/dev/null"
    ));
    step("apt install ./harmony-fleet-device (its postinst runs device setup)");
    let (code, out) = vm.sh_code(&format!(
        "DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends {s}/pkgs/{deb} 2>&1"
    ));
    assert!(
        code == 0,
        "apt install of the package failed ({code}):\n{out}"
    );
    vm.wait_unit("fleet-updater.service", "active", Duration::from_secs(120));
    vm.wait_unit("fleet-agent.service", "active", Duration::from_secs(240));
    let registered = wait_for(Duration::from_secs(300), || {
        cluster
            .get_json(&["fdev", DEVICE])
            .filter(|v| v["status"]["agentVersion"].is_string())
    });
    assert!(
        registered.is_some(),
        "the operator shows no Device {DEVICE}.\n{}\n--- fleet-operator ---\n{}",
        vm.unit_logs(),
        cluster.operator_log(40)
    );
    assert!(
        nats.mode() == NatsAuth::Off || nats.admitted(DEVICE),
        "{DEVICE} registered without fleet-auth admitting it:\n{}",
        nats.auth_logs()
    );
    let tasks = Tasks::new(&nats);
    step(&format!(
        "installed from the package and registered in {:.0} s",
        t0.elapsed().as_secs_f64()
    ));
    TaskRig {
        vm,
        cluster,
        lock,
        tasks,
        _nats: nats,
        kernel_package,
        _dir: dir,
    }
}

impl TaskRig {
    /// Makes the step's repository the guest's only apt source (`deb [trusted=yes] file:/srv/fleet-test-repo ./`).
    fn use_repo(&mut self, step: &str) {
        let s = GUEST_STAGE;
        self.vm.sh(&format!(
            "{{ mountpoint -q {s} || mount -o ro /dev/vdb {s}; }} && rm -rf {GUEST_REPO} && \
             cp -a {s}/repos/{step} {GUEST_REPO} && rm -f /etc/apt/sources.list.d/* && \
             echo 'deb [trusted=yes] file:{GUEST_REPO} ./' > /etc/apt/sources.list"
        ));
    }

    fn logs(&mut self) -> String {
        qemu_tasks::logs(&mut self.vm, &self.lock)
    }

    fn installed(&mut self, package: &str) -> String {
        qemu_tasks::installed(&mut self.vm, package)
    }

    fn apt_runs(&mut self) -> usize {
        qemu_tasks::apt_runs(&mut self.vm)
    }

    fn full_upgrades(&mut self, run: &str, this_boot: bool) -> usize {
        qemu_tasks::full_upgrades(&mut self.vm, run, this_boot)
    }

    /// Waits for the run's status in NATS to satisfy `done`, printing each new phase.
    fn wait_status(
        &mut self,
        a: &SystemUpgradeAttempt,
        timeout: Duration,
        what: &str,
        done: impl Fn(&SystemUpgradeStatus) -> bool,
    ) -> SystemUpgradeStatus {
        self.wait_run(&a.run_uid.to_string(), timeout, what, done)
    }

    fn wait_run(
        &mut self,
        run: &str,
        timeout: Duration,
        what: &str,
        done: impl Fn(&SystemUpgradeStatus) -> bool,
    ) -> SystemUpgradeStatus {
        qemu_tasks::wait_run(
            &mut self.vm,
            &self.tasks,
            &self.lock,
            run,
            timeout,
            what,
            done,
        )
    }
}

/// taskrun. `kubectl create` a TaskRun (systemUpgradeV1) for the guest's group: the real operator writes the
/// intent, the updater runs apt-get full-upgrade from the local repository, which installs Debian's cloud kernel
/// package (its postinst runs /etc/kernel/postinst.d, where unattended-upgrades' hook writes
/// /run/reboot-required naming the kernel package); the device takes the slot of the real fleetlock-server,
/// reboots for real (new boot id), releases the slot after a healthy boot; the TaskRun is Complete in `kubectl
/// get ftr`, the status in NATS succeeded with the first heartbeat after completion, apt ran once across the
/// reboot.
pub fn scenario_taskrun() {
    let mut rig = take_rig();
    rig.use_repo("kernel");
    let kpkg = rig.kernel_package.clone();
    let kver = kpkg.trim_start_matches("linux-image-").to_string();
    let uname0 = rig.vm.sh("uname -r").trim().to_string();
    // The TaskRun through the operator, the reboot through FleetLock and what both architectures assert
    // (fleet_vm_tests::qemu_tasks); then what is particular to the kernel package.
    let TaskRig {
        vm,
        cluster,
        lock,
        tasks,
        ..
    } = &mut rig;
    let RebootedRun { boots, .. } =
        qemu_tasks::taskrun_with_reboot(vm, cluster, lock, tasks, "kernel-upgrade", "qemu");
    step(&format!(
        "rebooted through FleetLock: boot id {} -> {}",
        boots.0, boots.1
    ));

    // The device: the kernel package installed by its own maintainer scripts, Debian's flag written by the
    // kernel's hook, the reboot's diagnostics.
    let vm = &mut rig.vm;
    let facts = vm.sh(&format!(
        "dpkg-query -W -f '${{Version}}|${{Status}}\\n' {kpkg}; dpkg-query -W -f '${{Version}}|${{Status}}\\n' \
         {KERNEL_PKG}; ls /boot; \
         cat {SEEN_DIR}/reboot-required.pkgs; test -e /run/reboot-required && echo FLAG-STILL-THERE; \
         ls /var/log/fleet-reboot/; journalctl --list-boots --no-pager | wc -l"
    ));
    step(&format!("on the device after the reboot:\n{facts}"));
    let lines: Vec<&str> = facts.lines().collect();
    assert!(
        lines
            .first()
            .is_some_and(|l| l.ends_with("|install ok installed")),
        "{kpkg} is not installed:\n{facts}"
    );
    assert_eq!(
        lines.get(1).copied(),
        Some("2.0|install ok installed"),
        "{facts}"
    );
    assert!(
        facts.contains(&format!("vmlinuz-{kver}")) && facts.contains(&format!("initrd.img-{kver}")),
        "the kernel's image and the initramfs its hook builds are not in /boot:\n{facts}"
    );
    let seen = vm.sh(&format!("cat {SEEN_DIR}/reboot-required.pkgs"));
    assert_eq!(
        seen.trim(),
        kpkg,
        "/run/reboot-required.pkgs (written by Debian's kernel hook) does not name the kernel package"
    );
    assert!(
        !facts.contains("FLAG-STILL-THERE"),
        "/run survived the reboot?\n{facts}"
    );
    assert!(facts.contains("reboot-"), "no reboot diagnostics:\n{facts}");
    let uname1 = vm.sh("uname -r").trim().to_string();
    step(&format!(
        "kernel running before and after: {uname0} -> {uname1} (QEMU boots the image's cached kernel with -kernel; \
         {kver} is installed in /boot but no bootloader boots it)"
    ));
    keep_rig(rig);
}

/// recovery. On the same device, intents written as the operator writes them: a duplicated intent (written
/// twice at once, again after it ended, again after agent and updater restarts) runs apt once; an expired intent
/// never starts; the updater SIGKILLed while dpkg runs a postinst → after the restart `dpkg --configure -a` runs
/// and the run ends failed/interrupted saying so, the package configured, dpkg consistent, apt not run again.
pub fn scenario_recovery() {
    let mut rig = take_rig();

    // 1. A duplicated intent runs apt once.
    rig.use_repo("pkg");
    let runs0 = rig.apt_runs();
    let a = Tasks::attempt(HOUR);
    rig.tasks.put_intent(&a);
    rig.tasks.put_intent(&a);
    let done = rig.wait_status(
        &a,
        Duration::from_secs(600),
        "success with the first heartbeat",
        |s| s.phase == P::Succeeded && s.first_heartbeat_after_completion.is_some(),
    );
    assert_eq!(rig.installed(PLAIN_PKG), "2.0|install ok installed");
    assert_eq!(
        done.transitions.phases(),
        [P::Accepted, P::Upgrading, P::Succeeded]
    );
    rig.tasks.put_intent(&a);
    rig.vm
        .sh("systemctl restart fleet-agent.service fleet-updater.service");
    rig.vm
        .wait_unit("fleet-updater.service", "active", Duration::from_secs(120));
    rig.vm
        .wait_unit("fleet-agent.service", "active", Duration::from_secs(240));
    rig.tasks.put_intent(&a);
    std::thread::sleep(Duration::from_secs(15));
    let run = a.run_uid.to_string();
    assert_eq!(rig.apt_runs(), runs0 + 1, "apt ran again.\n{}", rig.logs());
    assert_eq!(rig.full_upgrades(&run, false), 1, "{}", rig.logs());
    assert_eq!(
        rig.tasks.status(&a).as_ref(),
        Some(&done),
        "the status changed"
    );
    step("duplicated intent: apt ran once");

    // 2. An expired intent never starts. Expired 10 minutes ago by the host's clock: the device judges expiry by
    //    its own clock, and the guest's clock starts from the emulated RTC's whole second, so it can lag the
    //    host's (a run with "expired now" was accepted and ran apt: by the guest's clock it had not expired).
    let skew = guest_clock_lag_ms(&mut rig.vm);
    step(&format!("the guest's clock lags the host's by {skew} ms"));
    let mut expired = Tasks::attempt(Duration::ZERO);
    expired.expires_at = fleet_wire::Timestamp::from_unix_ms(
        fleet_wire::Timestamp::now()
            .unix_ms()
            .saturating_sub(600_000),
    );
    rig.tasks.put_intent(&expired);
    let s = rig.wait_status(&expired, Duration::from_secs(120), "failed/expired", |s| {
        s.phase.is_terminal()
    });
    assert_eq!((s.phase, s.reason), (P::Failed, Some(R::Expired)), "{s:#?}");
    assert_eq!(rig.full_upgrades(&expired.run_uid.to_string(), false), 0);
    assert_eq!(rig.apt_runs(), runs0 + 1);
    step("expired intent: failed/expired, apt not run");

    // 3. The updater SIGKILLed while dpkg runs the slow postinst.
    rig.use_repo("slow");
    let k = Tasks::attempt(HOUR);
    rig.tasks.put_intent(&k);
    wait_guest_file(&mut rig, "/var/lib/fleet-test/slow-started", 600);
    rig.wait_status(&k, Duration::from_secs(30), "upgrading", |s| {
        s.phase == P::Upgrading
    });
    let during = rig.installed(SLOW_PKG);
    step(&format!(
        "dpkg runs the postinst ({during}): SIGKILL to the updater"
    ));
    rig.vm
        .sh("systemctl kill --kill-whom=main --signal=SIGKILL fleet-updater.service");
    let s = rig.wait_status(
        &k,
        Duration::from_secs(600),
        "a terminal status after the kill",
        |s| s.phase.is_terminal(),
    );
    assert_eq!(
        (s.phase, s.reason),
        (P::Failed, Some(R::Interrupted)),
        "{s:#?}"
    );
    let error = s.error.as_ref().map(|e| e.to_string()).unwrap_or_default();
    assert!(error.contains("dpkg --configure -a completed"), "{error}");
    assert_eq!(rig.installed(SLOW_PKG), "2.0|install ok installed");
    assert_eq!(rig.vm.sh("dpkg --audit").trim(), "", "dpkg is consistent");
    let journal = rig
        .vm
        .sh("journalctl -b --no-pager -o cat -u fleet-updater.service");
    assert!(
        journal.contains(&format!(
            "run {}: running dpkg --force-confdef --force-confold --configure -a",
            k.run_uid
        )),
        "{journal}"
    );
    let runs = rig.apt_runs();
    rig.tasks.put_intent(&k);
    std::thread::sleep(Duration::from_secs(10));
    assert_eq!(
        rig.apt_runs(),
        runs,
        "apt ran again for the interrupted run"
    );
    assert_eq!(rig.full_upgrades(&k.run_uid.to_string(), false), 1);
    step(&format!(
        "killed mid-dpkg: {:?}/{:?}: {error}",
        s.phase, s.reason
    ));
    keep_rig(rig);
}

/// How far the guest's clock is behind the host's (negative: ahead), in milliseconds, measured around one
/// command-channel round trip.
fn guest_clock_lag_ms(vm: &mut Vm) -> i64 {
    let host_ms = || fleet_wire::Timestamp::now().unix_ms() as i64;
    let before = host_ms();
    let guest: i64 = vm.sh("date +%s%3N").trim().parse().unwrap_or(0);
    let after = host_ms();
    (before + after) / 2 - guest
}

fn wait_guest_file(rig: &mut TaskRig, path: &str, secs: u64) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while rig.vm.sh_code(&format!("test -e {path}")).0 != 0 {
        if Instant::now() >= deadline {
            let logs = rig.logs();
            panic!("{path} did not appear within {secs} s.\n{logs}");
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// powercut. Two power cuts on the real kernel (SIGKILL of QEMU: nothing the guest did not write to its disk
/// survives): one while dpkg runs a postinst (the journal says `upgrading`) → next boot: the updater journals
/// `repairing`, runs `dpkg --configure -a`, the run ends failed/interrupted, dpkg consistent, apt not run again;
/// one the moment the updater's system-upgrade journal stages a write (its temporary file appears) → next boot:
/// the journal loads (old or new, never torn), no temporary file is left, the run ends terminal and what its
/// status says matches the packages on the disk.
pub fn scenario_powercut() {
    let mut rig = take_rig();

    // 1. Mid-dpkg.
    rig.use_repo("cut");
    let c = Tasks::attempt(HOUR);
    rig.tasks.put_intent(&c);
    wait_guest_file(&mut rig, "/var/lib/fleet-test/cut-started", 600);
    rig.wait_status(&c, Duration::from_secs(30), "upgrading", |s| {
        s.phase == P::Upgrading
    });
    let during = rig.installed(CUT_PKG);
    let boot0 = rig.vm.boot_id();
    step(&format!(
        "dpkg runs the postinst ({during}): power cut (kill -9 of QEMU)"
    ));
    rig.vm.power_cut();
    let boot1 = rig.vm.power_on();
    assert_ne!(boot0, boot1);
    step(&format!("powered on again: boot id {boot0} -> {boot1}"));
    let s = rig.wait_status(
        &c,
        Duration::from_secs(900),
        "a terminal status after the power cut",
        |s| s.phase.is_terminal(),
    );
    assert_eq!(
        (s.phase, s.reason),
        (P::Failed, Some(R::Interrupted)),
        "{s:#?}"
    );
    let error = s.error.as_ref().map(|e| e.to_string()).unwrap_or_default();
    assert!(error.contains("dpkg --configure -a completed"), "{error}");
    assert_eq!(rig.installed(CUT_PKG), "2.0|install ok installed");
    assert_eq!(rig.vm.sh("dpkg --audit").trim(), "", "dpkg is consistent");
    let run = c.run_uid.to_string();
    let journal = rig
        .vm
        .sh("journalctl -b --no-pager -o cat -u fleet-updater.service");
    assert!(
        journal.contains(&format!(
            "run {run}: running dpkg --force-confdef --force-confold --configure -a"
        )),
        "{journal}"
    );
    assert_eq!(
        rig.full_upgrades(&run, true),
        0,
        "apt ran again after the boot"
    );
    let phase = rig.vm.journal_phase("system-upgrade.json");
    assert_eq!(phase, "failed", "system-upgrade journal");
    step(&format!(
        "power cut mid-dpkg: {:?}/{:?}: {error}",
        s.phase, s.reason
    ));

    // 2. The moment the system-upgrade journal stages a write.
    rig.use_repo("journal");
    let j = Tasks::attempt(HOUR);
    let watch = "end=$((SECONDS+300)); while [ $SECONDS -lt $end ]; do \
                 for f in /var/lib/fleet-updater/.system-upgrade.json.tmp-*; do \
                 [ -e \"$f\" ] && { echo \"$f\"; exit 0; }; done; done; exit 1";
    let boot1 = rig.vm.boot_id();
    let TaskRig { vm, tasks, .. } = &mut rig;
    let seen = std::thread::scope(|sc| {
        sc.spawn(|| {
            // After the guest's watcher has started.
            std::thread::sleep(Duration::from_secs(3));
            tasks.put_intent(&j);
        });
        vm.try_run(watch, Duration::from_secs(320))
    });
    let seen = match seen {
        Some(a) if a.code == 0 => a.output.trim().to_string(),
        other => {
            let logs = rig.logs();
            panic!(
                "the guest never saw the journal's temporary file ({:?}).\n{logs}",
                other.map(|a| a.code)
            )
        }
    };
    rig.vm.power_cut();
    step(&format!("{seen} appeared: power cut (kill -9 of QEMU)"));
    let boot2 = rig.vm.power_on();
    assert_ne!(boot1, boot2);
    rig.vm
        .wait_unit("fleet-updater.service", "active", Duration::from_secs(240));
    let left = rig
        .vm
        .sh("ls -a /var/lib/fleet-updater/ | grep -c '^\\.system-upgrade.json.tmp-' || true");
    assert_eq!(left.trim(), "0", "a temporary journal file is left behind");
    let after_boot = journal_summary(&mut rig.vm);
    let whose = if after_boot.contains(&j.run_uid.to_string()) {
        "this run"
    } else {
        "the run before: this run's journal write did not reach the disk"
    };
    step(&format!(
        "the journal on disk after the boot: {after_boot} ({whose})"
    ));
    let s = rig.wait_status(
        &j,
        Duration::from_secs(900),
        "a terminal status after the power cut",
        |s| {
            s.phase.is_terminal()
                && (s.phase != P::Succeeded || s.first_heartbeat_after_completion.is_some())
        },
    );
    let pkg = rig.installed(PLAIN_PKG);
    match (s.phase, s.reason) {
        (P::Succeeded, None) => assert_eq!(pkg, "3.0|install ok installed", "{s:#?}"),
        (P::Failed, Some(R::Interrupted)) => {
            let error = s.error.as_ref().map(|e| e.to_string()).unwrap_or_default();
            assert!(error.contains("dpkg --configure -a completed"), "{error}");
            assert!(pkg.ends_with("|install ok installed"), "{pkg}");
        }
        other => panic!("unexpected outcome {other:?}: {s:#?}"),
    }
    assert_eq!(rig.vm.sh("dpkg --audit").trim(), "", "dpkg is consistent");
    let phase = rig.vm.journal_phase("system-upgrade.json");
    assert_eq!(
        phase,
        if s.phase == P::Succeeded {
            "succeeded"
        } else {
            "failed"
        },
        "the journal and the status disagree"
    );
    step(&format!(
        "power cut at the journal write: run ended {:?}/{:?}, {PLAIN_PKG} {pkg}",
        s.phase, s.reason
    ));
    keep_rig(rig);
}

/// The run id and phase of the system-upgrade journal, for the record.
fn journal_summary(vm: &mut Vm) -> String {
    let (code, raw) = vm.sh_code("cat /var/lib/fleet-updater/system-upgrade.json");
    if code != 0 {
        return "none".into();
    }
    let v: serde_json::Value = serde_json::from_str(&raw)
        .unwrap_or_else(|e| panic!("system-upgrade.json is not JSON: {e}: {raw}"));
    format!(
        "run {} phase {}",
        v["attempt"]["runUid"].as_str().unwrap_or("?"),
        v["phase"].as_str().unwrap_or("?")
    )
}

/// A unit that holds `multi-user.target` forever: the boot stays `starting`, as with the seed's hanging mount.
const HOLD_UNIT: &str = "[Unit]\nDescription=Holds multi-user.target (boot watchdog test)\nBefore=multi-user.target\n\n\
    [Service]\nType=oneshot\nExecStart=/bin/sleep infinity\nTimeoutStartSec=infinity\n\n\
    [Install]\nWantedBy=multi-user.target\n";

/// watchdog. The package's boot watchdog on the real kernel (docs/boot-watchdog.md): with a unit that holds
/// `multi-user.target`, every boot stays `starting`. The timer shortened to 90 s by a drop-in and
/// `max_reboots = 1`: the first held boot writes its diagnostics (durably, before anything else), then reboots
/// once (a new boot id); the second held boot writes diagnostics and holds the cap: same boot, the unit failed,
/// the console login message names the cap. Then the unit is removed and the next boot comes up.
pub fn scenario_watchdog() {
    let mut rig = take_rig();
    let vm = &mut rig.vm;
    vm.sh(&format!(
        "printf 'max_reboots = 1\\nwindow_hours = 24\\n' > /etc/harmony-fleet/boot-watchdog.toml && \
         mkdir -p /etc/systemd/system/fleet-boot-watchdog.timer.d && \
         printf '[Timer]\\nOnActiveSec=\\nOnActiveSec=90s\\n' > /etc/systemd/system/fleet-boot-watchdog.timer.d/test.conf && \
         printf '{}' > /etc/systemd/system/fleet-test-hold.service && \
         rm -rf /var/log/fleet-boot-watchdog /var/lib/fleet-boot-watchdog && \
         systemctl daemon-reload && systemctl enable --quiet fleet-test-hold.service && \
         systemctl is-enabled fleet-boot-watchdog.timer",
        HOLD_UNIT.replace('\n', "\\n")
    ));
    let healthy = vm.boot_id();
    step("rebooting into a boot held at multi-user.target");
    vm.reboot();
    let first = vm.wait_boot(Some(&healthy), Duration::from_secs(300));
    step(&format!("held boot 1: {first}"));
    assert_eq!(
        vm.sh_code("systemctl is-system-running").1.trim(),
        "starting",
        "the boot is not held"
    );
    // The watchdog's run: 90 s after its timer started, then diagnostics, then the reboot.
    let second = vm.wait_boot(Some(&first), Duration::from_secs(600));
    step(&format!("the watchdog rebooted: held boot 2: {second}"));
    let deadline = Instant::now() + Duration::from_secs(600);
    let motd = loop {
        let (code, out) = vm.sh_code("cat /run/motd.d/fleet-boot-watchdog");
        if code == 0 {
            break out;
        }
        assert!(
            Instant::now() < deadline,
            "no cap message in the second held boot:\n{}",
            vm.sh_code("journalctl -b --no-pager -n 40 -u fleet-boot-watchdog.service")
                .1
        );
        std::thread::sleep(Duration::from_secs(2));
    };
    step(&format!("/run/motd.d/fleet-boot-watchdog:\n{motd}"));
    assert!(
        motd.contains("did not finish booting")
            && motd.contains("reboot cap reached: 1 watchdog reboot(s)"),
        "{motd}"
    );
    // The cap holds: no third boot, still held, the unit failed with its reason.
    std::thread::sleep(Duration::from_secs(30));
    assert_eq!(vm.boot_id(), second, "rebooted past the cap");
    assert_eq!(
        vm.sh_code("systemctl is-system-running").1.trim(),
        "starting"
    );
    assert_eq!(
        vm.sh_code("systemctl is-failed fleet-boot-watchdog.service")
            .1
            .trim(),
        "failed"
    );
    let journal = vm.sh("journalctl -b --no-pager -o cat -u fleet-boot-watchdog.service");
    assert!(journal.contains("the host stays up"), "{journal}");
    let listing = vm.sh("ls /var/log/fleet-boot-watchdog/");
    let files: Vec<String> = listing.lines().map(str::to_string).collect();
    assert_eq!(files.len(), 2, "diagnostics of both held boots: {listing}");
    let one = vm.sh(&format!("cat /var/log/fleet-boot-watchdog/{}", files[0]));
    let two = vm.sh(&format!("cat /var/log/fleet-boot-watchdog/{}", files[1]));
    for d in [&one, &two] {
        for want in [
            "is-system-running says starting",
            "== jobs: systemctl list-jobs",
            "fleet-test-hold.service",
            "== failed units",
            "== dpkg audit",
            "== mounts",
        ] {
            assert!(d.contains(want), "missing {want:?} in:\n{d}");
        }
    }
    assert!(one.contains("decision: rebooting"), "{one}");
    assert!(two.contains("decision: reboot cap reached"), "{two}");
    let record = vm.sh("cat /var/lib/fleet-boot-watchdog/reboots.json");
    assert_eq!(
        record.matches('Z').count(),
        1,
        "one watchdog reboot recorded: {record}"
    );
    // The first held boot's journal (persistent): the diagnostics were written before the reboot was asked for.
    let before = vm.sh("journalctl -b -1 --no-pager -o cat -u fleet-boot-watchdog.service");
    step(&format!("held boot 1, the watchdog's log:\n{before}"));

    // The person removes the unit and reboots: the host comes up.
    vm.sh(
        "systemctl disable --quiet fleet-test-hold.service && rm -f /etc/systemd/system/fleet-test-hold.service && \
         rm -rf /etc/systemd/system/fleet-boot-watchdog.timer.d /etc/harmony-fleet/boot-watchdog.toml && \
         systemctl daemon-reload",
    );
    vm.reboot();
    let fixed = vm.wait_boot(Some(&second), Duration::from_secs(300));
    vm.wait_unit("fleet-agent.service", "active", Duration::from_secs(240));
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let state = vm.sh_code("systemctl is-system-running").1;
        if matches!(state.trim(), "running" | "degraded") {
            break;
        }
        assert!(Instant::now() < deadline, "the fixed boot is {state}");
        std::thread::sleep(Duration::from_secs(2));
    }
    step(&format!("fixed: boot {fixed} is up"));
    keep_rig(rig);
}
