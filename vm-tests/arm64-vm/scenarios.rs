//! `fleet-arm64-vm-scenarios`: an arm64 device on a real arm64 kernel. Debian bookworm arm64 laid out like
//! Raspberry Pi OS (`scripts/setup.d/66-qemu-arm64.sh`) booted by qemu-system-aarch64 (TCG, Cortex-A72) once, then
//! on that one guest, in order: the arm64 `harmony-fleet-device` package installed with apt from a staging disk;
//! rootless Podman as device setup configures it, its libpod API's answer times measured against the agent's bounds,
//! and a workload started from a desired state; an agent upgrade v1 → v2 that commits while the workload's
//! container keeps running (same id, PID and start time); a broken v3 rolled back, the container still untouched;
//! a reboot coordinated through a real `fleetlock-server`, after which the agent brings the workload back; a
//! TaskRun created with kubectl through the real operator (kube-apiserver, the `fleet-operator` binary): `apt-get
//! full-upgrade` from a local repository and a reboot through FleetLock, the run Complete. Prints
//! PASS/FAIL per step with its time, and the measurements; exits 1 when a step failed. Run it through
//! `vm-tests/arm64-vm/run`, which builds the image first.

use fleet_rig::callout::NatsAuth;
use fleet_rig::nats_client as nats;
use fleet_rig::wait_for;
use fleet_vm_tests::builds::{self, Arch, V1, V2, V3};
use fleet_vm_tests::cluster::Cluster;
use fleet_vm_tests::fleet::{
    agent_config, desired_one_workload, start_nats, Artifacts, Operator, DEVICE, GUEST_CA_FILE,
    GUEST_NATS_CA_FILE, GUEST_TOKEN_FILE, TEST_IMAGE,
};
use fleet_vm_tests::fleetlock::FleetLockServer;
use fleet_vm_tests::local_fleet::{deployment_yaml, group_yaml};
use fleet_vm_tests::packages;
use fleet_vm_tests::qemu::{make_stage_disk, relay_unit, Image, Vm, GUEST_STAGE, HOST_FROM_GUEST};
use fleet_vm_tests::qemu_tasks;
use fleet_vm_tests::runner::Steps;
use fleet_vm_tests::tasks::{build_deb, index_repo, HolderWatch, Tasks, GUEST_REPO, REBOOT_PKG};
use fleet_wire::{
    kv, AgentUpgradeStatus, Architecture, Capability, DeviceWorkloadStatus, Timestamp,
    UpgradePhase, UpgradeReason, WorkloadState,
};
use std::path::Path;
use std::time::{Duration, Instant};

const HELP: &str = "fleet-arm64-vm-scenarios [device]\n\n\
device: one aarch64 guest under qemu-system-aarch64 (TCG, Debian's arm64 kernel, Raspberry Pi OS-style layout), in order:\n  \
boot      the guest is aarch64 on a Cortex-A72, Debian's kernel, /boot/firmware from p1, first user pi\n  \
install   apt install ./harmony-fleet-device_<v>_arm64.deb from the staging disk: agent and updater ready\n  \
podman    rootless Podman's API timed against the agent's bounds; a desired state's workload runs\n  \
commit    agent upgrade v1 -> v2 commits; the workload's container keeps running (same id, PID, start)\n  \
rollback  a v3 that dies before readiness is rolled back; v2 ready, the container untouched\n  \
reboot    /run/reboot-required: fleet-reboot takes the FleetLock slot, reboots, gives it back; the workload runs again\n  \
taskrun   kubectl create a TaskRun through the real operator: apt-get full-upgrade from a local repository, a reboot through FleetLock, Complete\n\n\
Needs qemu-system-aarch64, the image of scripts/setup.d/66-qemu-arm64.sh and FLEET_NATS_SERVER: use vm-tests/arm64-vm/run.";

/// Where the versioned agent binaries live on a device.
const LIB: &str = "/usr/lib/harmony-fleet";
/// Where the real v3 agent is placed in the guest, for the broken v3's probe to `exec`.
const REAL_V3: &str = "/opt/fleet-test/fleet-agent-real-v3";
/// The workload of the desired state, and the container the agent names after it.
const WORKLOAD: &str = "web";
/// The Device's `site` label and the DeviceGroup the TaskRun and the FleetDeployment name.
const SITE: &str = "arm64";
const CONTAINER: &str = "fleet-web";
/// Generous bounds: every guest instruction is emulated.
const UNIT_WAIT: Duration = Duration::from_secs(600);
const UPGRADE_WAIT: Duration = Duration::from_secs(900);
/// The agent's own bounds on Podman (agent/src/podman/api.rs, agent/src/agent/mod.rs, wire limits): `_ping` 10 s,
/// quick calls (list, inspect, create, start) 30 s, start-up waits for Podman 30 s, the candidate probe 4 min.
const PING_BOUND: f64 = 10.0;
const QUICK_BOUND: f64 = 30.0;

fn main() {
    fleet_vm_tests::runner::run_scenarios(HELP, "arm64-vm", &[("device", device)]);
}

fn write(p: &Path, s: &[u8], mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    if let Some(d) = p.parent() {
        std::fs::create_dir_all(d).unwrap_or_else(|e| panic!("mkdir {d:?}: {e}"));
    }
    std::fs::write(p, s).unwrap_or_else(|e| panic!("write {p:?}: {e}"));
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {p:?}: {e}"));
}

/// The fleet-agent user's libpod socket, and a `curl` on it as that user.
const AS_AGENT_CURL: &str = "runuser -u fleet-agent -- curl -s --unix-socket \
     /run/user/$(id -u fleet-agent)/podman/podman.sock";

/// The libpod inspect document of the workload's container (through the agent user's API socket, as the agent
/// reads it), if it exists.
fn container(vm: &mut Vm) -> Option<serde_json::Value> {
    let (code, out) = vm.sh_code(&format!(
        "{AS_AGENT_CURL} -f --max-time 120 http://d/v4.0.0/libpod/containers/{CONTAINER}/json"
    ));
    if code != 0 {
        return None;
    }
    serde_json::from_str(&out).ok()
}

/// What identifies one run of the container: id, PID, start time.
fn run_of(c: &serde_json::Value) -> (String, u64, String) {
    (
        c["Id"].as_str().unwrap_or_default().to_string(),
        c["State"]["Pid"].as_u64().unwrap_or(0),
        c["State"]["StartedAt"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    )
}

/// The guest's clock now (the clock the device's statuses carry).
fn guest_now(vm: &mut Vm) -> Timestamp {
    let ms = vm.sh("date +%s%3N");
    Timestamp::from_unix_ms(
        ms.trim()
            .parse()
            .unwrap_or_else(|e| panic!("guest date {ms:?}: {e}")),
    )
}

/// Waits until the device's workload status in NATS, measured after `after` (the device's clock), says the
/// workload runs in container `id` (any container when `None`); returns the container id.
fn wait_running_in_nats(
    reports: &nats::kv::Store,
    vm: &mut Vm,
    after: Timestamp,
    id: Option<&str>,
) -> String {
    let mut last = None;
    let found = wait_for(UNIT_WAIT, || {
        let raw = reports.get(DEVICE).ok()??;
        let s: DeviceWorkloadStatus = serde_json::from_slice(&raw).ok()?;
        let w = s
            .workloads
            .iter()
            .find(|w| w.name.as_str() == WORKLOAD)?
            .clone();
        last = Some((s.at, w.clone()));
        let cid = w.container_id.clone()?;
        (s.at > after && w.state == WorkloadState::Running && id.is_none_or(|i| i == cid))
            .then_some(cid)
    });
    found.unwrap_or_else(|| {
        panic!(
            "NATS never said {WORKLOAD} runs{} in a status measured after {after:?}; last: {last:#?}\n{}",
            id.map(|i| format!(" in {i}")).unwrap_or_default(),
            vm.unit_logs()
        )
    })
}

/// The seconds between the transitions into `from` and `to` (the device's clock).
fn phase_secs(s: &AgentUpgradeStatus, from: UpgradePhase, to: UpgradePhase) -> Option<f64> {
    let at = |p| {
        s.transitions
            .as_slice()
            .iter()
            .find(|t| t.phase == p)
            .map(|t| t.at)
    };
    Some(at(to)?.since(at(from)?).as_secs_f64())
}

/// Answer times of the agent user's libpod API in seconds: `cold` = `_ping` right after `podman.service` was
/// stopped (socket activation starts `podman system service`, as after its 5-s idle exit on a device), `warm` =
/// `_ping` again, `list` = the container list the agent reads each pass (a ping counts as warm when the agent's own
/// call had started the service again before it). Fails on an HTTP status other than 200.
fn podman_times(vm: &mut Vm, rounds: usize) -> Vec<(&'static str, f64)> {
    let mut out = Vec::new();
    for _ in 0..rounds {
        let raw = vm.sh(&format!(
            "systemctl --user -M fleet-agent@ stop podman.service 2>/dev/null; \
             t() {{ {AS_AGENT_CURL} -o /dev/null --max-time 120 -w \"$1 %{{http_code}} %{{time_total}}\\n\" \"http://d/v4.0.0/libpod/$2\"; }}; \
             if [ \"$(systemctl --user -M fleet-agent@ is-active podman.service)\" = active ]; then t warm _ping; \
             else t cold _ping; fi; t warm _ping; t list 'containers/json?all=true'"
        ));
        for line in raw.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            match f.as_slice() {
                [name, "200", secs] => {
                    let name = match *name {
                        "cold" => "cold _ping",
                        "warm" => "warm _ping",
                        _ => "list",
                    };
                    out.push((
                        name,
                        secs.parse()
                            .unwrap_or_else(|e| panic!("time {secs:?}: {e}")),
                    ));
                }
                _ => panic!("unexpected Podman timing line {line:?} in:\n{raw}"),
            }
        }
    }
    out
}

/// Prints a measurement at once (a later failure keeps it) and keeps it for the summary at the end.
fn note(measured: &mut Vec<String>, line: String) {
    println!("  measured: {line}");
    measured.push(line);
}

fn summary(times: &[(&'static str, f64)]) -> Vec<String> {
    let mut lines = Vec::new();
    for (name, bound) in [
        ("cold _ping", PING_BOUND),
        ("warm _ping", PING_BOUND),
        ("list", QUICK_BOUND),
    ] {
        let mut v: Vec<f64> = times
            .iter()
            .filter(|(n, _)| *n == name)
            .map(|(_, t)| *t)
            .collect();
        v.sort_by(f64::total_cmp);
        let (Some(min), Some(max)) = (v.first(), v.last()) else {
            continue;
        };
        let median = v[v.len() / 2];
        lines.push(format!(
            "{name:<11} n={} min {min:.2} s, median {median:.2} s, max {max:.2} s; bound {bound:.0} s, max is {:.1}% of it",
            v.len(),
            max / bound * 100.0
        ));
    }
    lines
}

fn device() {
    let mut steps = Steps;
    let mut measured: Vec<String> = Vec::new();
    let (deb, v2, broken_v3) = steps.run(
        "build (agent v1, v2, v3 and the device binaries for aarch64; package)",
        || {
            let dir = packages::arm64(V1);
            // A v3 whose probe is the real v3's (it passes and reports 3.0.0) but whose service exits before it
            // tells systemd it is ready: the updater must roll it back.
            let broken = builds::broken_candidate_file(Arch::Arm64, V3, REAL_V3);
            (
                dir.join(packages::file_name_for("harmony-fleet-device", "arm64")),
                builds::agent_for(Arch::Arm64, V2),
                broken,
            )
        },
    );

    let nats = start_nats();
    let operator = Operator::new(&nats);
    let reports = nats::jetstream::new(nats.connect())
        .key_value(kv::WORKLOAD_STATUS)
        .unwrap_or_else(|e| panic!("open bucket {}: {e}", kv::WORKLOAD_STATUS));
    let artifacts = Artifacts::start();
    let lock = FleetLockServer::start();
    let run_dir = std::env::var_os("FLEET_QEMU_RUN_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let dir = tempfile::Builder::new()
        .prefix("fleet-arm64-vm-")
        .tempdir_in(run_dir)
        .unwrap_or_else(|e| panic!("temp dir: {e}"));

    // The staging disk: the package, the admin's configuration, the test CAs and the relays.
    let stage = dir.path().join("stage");
    let files = stage.join("files");
    std::fs::create_dir_all(&files).unwrap_or_else(|e| panic!("mkdir: {e}"));
    let deb_name = packages::file_name_for("harmony-fleet-device", "arm64");
    std::fs::copy(&deb, files.join(&deb_name)).unwrap_or_else(|e| panic!("copy {deb:?}: {e}"));
    std::fs::copy(
        builds::agent_for(Arch::Arm64, V3),
        files.join("fleet-agent-real-v3"),
    )
    .unwrap_or_else(|e| panic!("copy v3: {e}"));
    let nats_url = match nats.ca_file() {
        Some(ca) => {
            std::fs::copy(ca, files.join("nats-ca.pem"))
                .unwrap_or_else(|e| panic!("copy NATS CA: {e}"));
            format!("tls://{HOST_FROM_GUEST}:{}", nats.port())
        }
        None => format!("nats://{HOST_FROM_GUEST}:{}", nats.port()),
    };
    let token = nats.device_token(DEVICE);
    if let Some(t) = &token {
        write(&files.join("nats-token"), t.as_bytes(), 0o600);
    }
    // Podman on, as on a device: the agent's configuration names no [podman] section (enabled, the agent user's
    // socket).
    write(
        &files.join("agent.toml"),
        agent_config(DEVICE, &nats_url, token.as_ref().map(|_| GUEST_TOKEN_FILE)).as_bytes(),
        0o600,
    );
    write(
        &files.join("updater.toml"),
        format!("extra_ca_file = \"{GUEST_CA_FILE}\"\n").as_bytes(),
        0o644,
    );
    write(&files.join("test-ca.pem"), &artifacts.ca_pem(), 0o644);
    write(
        &files.join("fleet-reboot.yaml"),
        lock.client_config().as_bytes(),
        0o600,
    );
    write(
        &files.join("fleet-artifact-relay.service"),
        relay_unit("artifact server", artifacts.port()).as_bytes(),
        0o644,
    );
    write(
        &files.join("fleet-lock-relay.service"),
        relay_unit("FleetLock server", lock.port()).as_bytes(),
        0o644,
    );
    // The system upgrade's packages (as in vm-tests/tests/system_upgrade.rs): fleet-test-reboot 1.0 installed
    // first, 2.0 (its postinst asks for a reboot) in a flat repository the guest's apt will see alone.
    let debs = dir.path().join("debs");
    let old_pkg = build_deb(&debs, REBOOT_PKG, "1.0", "", "");
    let new_pkg = build_deb(
        &debs,
        REBOOT_PKG,
        "2.0",
        "",
        "[ \"$1\" = configure ] && touch /run/reboot-required || true",
    );
    std::fs::copy(&old_pkg, files.join("reboot-pkg-1.0.deb"))
        .unwrap_or_else(|e| panic!("copy {old_pkg:?}: {e}"));
    let repo = files.join("repo");
    std::fs::create_dir_all(&repo).unwrap_or_else(|e| panic!("mkdir {repo:?}: {e}"));
    std::fs::copy(&new_pkg, repo.join(new_pkg.file_name().unwrap_or_default()))
        .unwrap_or_else(|e| panic!("copy {new_pkg:?}: {e}"));
    index_repo(&repo);
    let disk = dir.path().join("stage.raw");
    make_stage_disk(&stage, &disk);

    let mut vm = Vm::new(dir.path(), Image::arm64(), &disk);
    let boot_started = Instant::now();
    steps.run(
        "boot (qemu-system-aarch64 TCG, Debian's arm64 kernel, Raspberry Pi OS layout)",
        || {
            let boot = vm.power_on();
            eprintln!("boot id {boot}");
            note(&mut measured, format!(
                "first boot to the command channel: {:.0} s",
                boot_started.elapsed().as_secs_f64()
            ));
            assert_eq!(vm.sh("uname -m").trim(), "aarch64");
            let kernel = vm.sh("uname -r").trim().to_string();
            assert!(kernel.ends_with("-arm64"), "not Debian's arm64 kernel: {kernel}");
            // Cortex-A72 (the Raspberry Pi 4's core): implementer 0x41 (Arm), part 0xd08.
            let cpu = vm.sh("grep -m1 'CPU part' /proc/cpuinfo");
            assert!(cpu.contains("0xd08"), "{cpu}");
            // Root and /boot/firmware from the MBR partitions by PARTUUID, FAT32 for the firmware as on the card.
            assert_eq!(
                vm.sh("findmnt -n -o SOURCE,FSTYPE /boot/firmware").trim(),
                "/dev/vda1 vfat"
            );
            assert_eq!(vm.sh("findmnt -n -o SOURCE,FSTYPE /").trim(), "/dev/vda2 ext4");
            vm.sh("grep -q 'root=PARTUUID=5eedf1ee-02' /proc/cmdline /boot/firmware/cmdline.txt");
            // raspi-firmware's files: the Raspberry Pi 4's boot firmware, config.txt and the kernel copies.
            vm.sh(
                "cd /boot/firmware && test -s start4.elf && test -s fixup4.dat && test -s config.txt && \
                 ls vmlinuz-* initrd.img-* bcm2711-rpi-4-b.dtb >/dev/null",
            );
            assert_eq!(vm.sh("id -u pi").trim(), "1000", "the first user pi");
            let groups = vm.sh("id -nG pi");
            for g in ["sudo", "video", "adm", "dialout"] {
                assert!(groups.split_whitespace().any(|x| x == g), "pi is not in {g}: {groups}");
            }
            assert_eq!(vm.sh("hostname").trim(), "raspberrypi");
            let state = vm.sh_code("systemctl is-system-running --wait").1;
            assert_eq!(
                state.trim(),
                "running",
                "failed units:\n{}",
                vm.sh_code("systemctl --failed --no-legend").1
            );
        },
    );

    steps.run(
        "install (apt install ./harmony-fleet-device_<v>_arm64.deb from the staging disk)",
        || {
            let s = GUEST_STAGE;
            vm.sh(&format!(
                "mkdir -p {s} && mount -o ro /dev/vdb {s} && f={s}/files && \
                 install -D -m 0644 $f/test-ca.pem {GUEST_CA_FILE} && \
                 {{ [ ! -e $f/nats-ca.pem ] || install -m 0644 $f/nats-ca.pem {GUEST_NATS_CA_FILE}; }} && \
                 {{ [ ! -e $f/nats-token ] || install -m 0600 $f/nats-token {GUEST_TOKEN_FILE}; }} && \
                 install -m 0600 $f/agent.toml /etc/harmony-fleet/agent.toml && \
                 install -m 0644 $f/updater.toml /etc/harmony-fleet/updater.toml && \
                 install -D -m 0755 $f/fleet-agent-real-v3 {REAL_V3} && \
                 install -m 0644 $f/fleet-artifact-relay.service $f/fleet-lock-relay.service /etc/systemd/system/ && \
                 systemctl daemon-reload && systemctl enable --now fleet-artifact-relay fleet-lock-relay"
            ));
            let t = Instant::now();
            let (code, out) = vm.sh_code(&format!(
                "DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends {s}/files/{deb_name} 2>&1"
            ));
            assert_eq!(code, 0, "apt install failed:\n{out}\n{}", vm.unit_logs());
            note(&mut measured, format!(
                "apt install of the package (postinst runs device setup, starts the agent): {:.0} s",
                t.elapsed().as_secs_f64()
            ));
            for unit in [
                "fleet-updater.service",
                "fleet-agent.service",
                "fleet-reboot.timer",
                "fleet-boot-watchdog.timer",
            ] {
                vm.wait_unit(unit, "active", UNIT_WAIT);
            }
            let info = wait_for(Duration::from_secs(300), || {
                operator.device_info()
            });
            let info = info.unwrap_or_else(|| panic!("no device info in NATS.\n{}", vm.unit_logs()));
            assert_eq!(info.architecture, Architecture::Arm64, "{info:?}");
            // Every binary the package installed is an aarch64 ELF (e_machine 0xb7).
            let machines = vm.sh(
                "for f in /usr/local/sbin/fleet-updater /usr/local/sbin/fleet-fetch /usr/local/sbin/fleet-reboot \
                   $(readlink -f /usr/local/bin/fleet-agent); do od -An -tx1 -j18 -N2 $f | tr -d ' '; done",
            );
            assert_eq!(machines.lines().collect::<Vec<_>>(), ["b700"; 4], "{machines}");
            assert_eq!(vm.active_version(), V1);
            // Device setup gave the agent user subordinate ids after the first user's (Raspberry Pi OS's useradd
            // gives pi 100000:65536): rootless Podman needs a range of its own.
            let subuid = vm.sh("cat /etc/subuid");
            let range = |user: &str| -> (u64, u64) {
                let l = subuid
                    .lines()
                    .find(|l| l.starts_with(&format!("{user}:")))
                    .unwrap_or_else(|| panic!("no subuid range for {user}:\n{subuid}"));
                let f: Vec<u64> = l.split(':').skip(1).map(|x| x.parse().unwrap_or(0)).collect();
                (f[0], f[1])
            };
            let (pi, agent) = (range("pi"), range("fleet-agent"));
            assert!(
                agent.0 >= pi.0 + pi.1 || agent.0 + agent.1 <= pi.0,
                "overlapping subordinate ids:\n{subuid}"
            );
        },
    );

    let run0 = steps.run(
        "podman (rootless API timed against the agent's bounds; a desired state's workload runs)",
        || {
            vm.sh(&format!(
                "cd / && runuser -u fleet-agent -- env XDG_RUNTIME_DIR=/run/user/$(id -u fleet-agent) \
                 podman import --quiet /usr/share/fleet-test/busybox-rootfs.tar {TEST_IMAGE} >/dev/null"
            ));
            let times = podman_times(&mut vm, 5);
            for l in summary(&times) {
                note(&mut measured, format!("Podman API before any workload: {l}"));
            }
            let (t, before) = (Instant::now(), guest_now(&mut vm));
            operator.put_desired(&desired_one_workload(1, WORKLOAD));
            let id = wait_running_in_nats(&reports, &mut vm, before, None);
            let secs = t.elapsed().as_secs_f64();
            note(&mut measured, format!(
                "desired state put -> NATS says {WORKLOAD} runs: {secs:.1} s"
            ));
            let c = container(&mut vm)
                .unwrap_or_else(|| panic!("no container {CONTAINER}.\n{}", vm.unit_logs()));
            assert_eq!(c["State"]["Running"], true, "{c:#}");
            let run = run_of(&c);
            assert_eq!(run.0, id, "NATS and Podman disagree on the container");
            // The container runs aarch64 busybox under the guest's own cgroups (a libpod conmon scope of the agent
            // user), not inside the agent's service.
            let cg = vm.sh(&format!("cat /proc/{}/cgroup", run.1));
            assert!(
                cg.contains("user@") && !cg.contains("fleet-agent.service"),
                "{cg}"
            );
            let times = podman_times(&mut vm, 3);
            for l in summary(&times) {
                note(&mut measured, format!("Podman API, the workload running: {l}"));
            }
            run
        },
    );

    steps.run(
        "commit (agent upgrade v1 -> v2; the workload keeps running)",
        || {
            let v1_pid = vm.agent_pid();
            let attempt =
                artifacts.attempt_for_arch(DEVICE, Architecture::Arm64, &v2, "fleet-agent-v2", V2);
            operator.put_intent(&attempt);
            let status = operator.wait_terminal(&attempt, UPGRADE_WAIT, || vm.unit_logs());
            assert_eq!(
                status.phase,
                UpgradePhase::Complete,
                "{status:#?}\n{}",
                vm.unit_logs()
            );
            assert_eq!(
                status.transitions.phases(),
                [
                    UpgradePhase::Preparing,
                    UpgradePhase::Stopping,
                    UpgradePhase::Starting,
                    UpgradePhase::Complete
                ],
                "{status:#?}"
            );
            assert_eq!(status.attempt_digest.as_ref(), Some(&attempt.digest()));
            for (what, from, to) in [
                (
                    "download, verify, install, probe",
                    UpgradePhase::Preparing,
                    UpgradePhase::Stopping,
                ),
                (
                    "drain of v1",
                    UpgradePhase::Stopping,
                    UpgradePhase::Starting,
                ),
                (
                    "start of v2 until ready (its Podman ping included)",
                    UpgradePhase::Starting,
                    UpgradePhase::Complete,
                ),
            ] {
                if let Some(s) = phase_secs(&status, from, to) {
                    note(&mut measured, format!("commit: {what}: {s:.1} s"));
                }
            }
            assert_eq!(
                vm.sh("readlink /usr/local/bin/fleet-agent").trim(),
                format!("{LIB}/fleet-agent-v{V2}")
            );
            assert_eq!(
                vm.sh("systemctl is-active fleet-agent.service").trim(),
                "active"
            );
            assert_ne!(vm.agent_pid(), v1_pid, "v1 still runs");
            assert_eq!(vm.active_version(), V2);
            assert_eq!(vm.journal_phase("journal.json"), "committed");
            // The same container, never restarted: id, PID and start time unchanged, still running; and the new
            // agent reports it running.
            let c = container(&mut vm)
                .unwrap_or_else(|| panic!("{CONTAINER} is gone after the cutover"));
            assert_eq!(c["State"]["Running"], true, "{c:#}");
            assert_eq!(
                run_of(&c),
                run0,
                "the container was restarted by the cutover"
            );
            // v2 itself reports it running (a status measured after the commit).
            wait_running_in_nats(&reports, &mut vm, status.phase_changed_at, Some(&run0.0));
        },
    );

    steps.run(
        "rollback (a v3 that dies before readiness; the workload untouched)",
        || {
            let v2_pid = vm.agent_pid();
            let attempt = artifacts.attempt_for_arch(
                DEVICE,
                Architecture::Arm64,
                broken_v3.path(),
                "fleet-agent-v3-broken",
                V3,
            );
            operator.put_intent(&attempt);
            let status = operator.wait_terminal(&attempt, UPGRADE_WAIT, || vm.unit_logs());
            assert_eq!(
                (status.phase, status.reason),
                (UpgradePhase::Failed, Some(UpgradeReason::StartFailed)),
                "{status:#?}\n{}",
                vm.unit_logs()
            );
            let phases = status.transitions.phases();
            for want in [UpgradePhase::Stopping, UpgradePhase::RollingBack] {
                assert!(phases.contains(&want), "{want:?} missing: {status:#?}");
            }
            vm.wait_unit("fleet-agent.service", "active", UNIT_WAIT);
            assert_eq!(
                vm.sh("readlink /usr/local/bin/fleet-agent").trim(),
                format!("{LIB}/fleet-agent-v{V2}")
            );
            assert_eq!(vm.active_version(), V2);
            assert_ne!(vm.agent_pid(), v2_pid, "v2 was not restarted");
            assert_eq!(vm.journal_phase("journal.json"), "failed");
            let c = container(&mut vm)
                .unwrap_or_else(|| panic!("{CONTAINER} is gone after the rollback"));
            assert_eq!(c["State"]["Running"], true, "{c:#}");
            assert_eq!(
                run_of(&c),
                run0,
                "the container was restarted by the rollback"
            );
            wait_running_in_nats(&reports, &mut vm, status.phase_changed_at, Some(&run0.0));
        },
    );

    steps.run(
        "reboot (coordinated through fleetlock-server; the workload runs again)",
        || {
            vm.sh(&format!(
                "install -m 0600 {GUEST_STAGE}/files/fleet-reboot.yaml /etc/harmony-fleet/fleet-reboot.yaml && \
                 touch /run/reboot-required"
            ));
            let watch = HolderWatch::start(&lock);
            let first_boot = vm.boot_id();
            let (t, before) = (Instant::now(), guest_now(&mut vm));
            vm.sh("systemctl start --no-block fleet-reboot.service");
            let second_boot = vm.wait_boot(Some(&first_boot), vm.boot_wait());
            assert_ne!(second_boot, first_boot);
            note(&mut measured, format!(
                "reboot: fleet-reboot started -> new boot answering: {:.0} s",
                t.elapsed().as_secs_f64()
            ));
            // After the boot fleet-reboot-release.service gives the slot back once the host is healthy.
            let released = wait_for(UNIT_WAIT, || (lock.holders() == 0).then_some(()));
            let (max, order) = watch.stop();
            assert!(
                released.is_some(),
                "the slot was not given back:\n{}\n{}",
                vm.sh_code("journalctl -b --no-pager -n 30 -u fleet-reboot-release.service").1,
                lock.log()
            );
            assert_eq!((max, order.len()), (1, 1), "holders seen: {order:?}");
            vm.sh("test ! -e /var/lib/fleet-reboot/marker.json");
            for unit in ["fleet-updater.service", "fleet-agent.service"] {
                vm.wait_unit(unit, "active", UNIT_WAIT);
            }
            assert_eq!(vm.active_version(), V2);
            // The agent brings the workload back on the new boot: running, in NATS and in Podman.
            let id = wait_running_in_nats(&reports, &mut vm, before, None);
            note(&mut measured, format!(
                "reboot: fleet-reboot started -> NATS says {WORKLOAD} runs again: {:.0} s",
                t.elapsed().as_secs_f64()
            ));
            let c = container(&mut vm)
                .unwrap_or_else(|| panic!("no {CONTAINER} after the reboot.\n{}", vm.unit_logs()));
            assert_eq!(c["State"]["Running"], true, "{c:#}");
            assert_eq!(run_of(&c).0, id);
            assert_ne!(run_of(&c), run0, "the container did not start again on the new boot");
            let times = podman_times(&mut vm, 3);
            for l in summary(&times) {
                note(&mut measured, format!("Podman API after the reboot: {l}"));
            }
        },
    );

    steps.run(
        "taskrun (kubectl create TaskRun through the real operator: apt full-upgrade from a local repository, \
         reboot through fleetlock-server, Complete)",
        || {
            // From here the real operator runs on the host: kube-apiserver + etcd and fleet-operator on the same
            // NATS (TLS, the auth callout). The steps above wrote the desired state and the agent-upgrade intents
            // straight into NATS as the operator would (fleet::Operator); the operator now owns the desired state,
            // so the workload is declared to it as a FleetDeployment with the same spec, for every Device at once
            // (the group selects all until the TaskRun flow labels the device).
            let t = Instant::now();
            let cluster = Cluster::start_with_nats_ca(&nats.service_url(), nats.ca_file());
            cluster.apply(&group_yaml(SITE, &[]));
            cluster.apply(&deployment_yaml("web", SITE, WORKLOAD));
            let registered = wait_for(UNIT_WAIT, || {
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
            note(
                &mut measured,
                format!(
                    "taskrun: cluster started, the operator shows the Device: {:.0} s",
                    t.elapsed().as_secs_f64()
                ),
            );
            let tasks = Tasks::new(&nats);
            assert!(
                tasks.capabilities().contains(&Capability::AptFullUpgradeV1),
                "the device does not advertise AptFullUpgradeV1: {:?}",
                tasks.capabilities()
            );
            // The staging disk again (the reboot unmounted it); the repository is the guest's only apt source; a
            // denied slot is asked for again every 3 s.
            vm.sh(&format!(
                "{{ mountpoint -q {GUEST_STAGE} || mount -o ro /dev/vdb {GUEST_STAGE}; }} && \
                 dpkg -i {GUEST_STAGE}/files/reboot-pkg-1.0.deb >/dev/null && mkdir -p {GUEST_REPO} && \
                 cp {GUEST_STAGE}/files/repo/* {GUEST_REPO}/ && rm -f /etc/apt/sources.list.d/* && \
                 echo 'deb [trusted=yes] file:{GUEST_REPO} ./' > /etc/apt/sources.list && \
                 echo 'system_reboot_retry_secs = 3' >> /etc/harmony-fleet/updater.toml && \
                 systemctl restart fleet-updater.service"
            ));
            vm.wait_unit("fleet-updater.service", "active", UNIT_WAIT);
            let before = guest_now(&mut vm);
            // The same flow and assertions as the amd64 guest's taskrun scenario (vm-tests/qemu/tasks.rs).
            let run =
                qemu_tasks::taskrun_with_reboot(&mut vm, &cluster, &lock, &tasks, "arm64-upgrade", SITE);
            note(
                &mut measured,
                format!(
                    "taskrun: kubectl create -> TaskRun Complete (apt, reboot, first heartbeat): {:.0} s",
                    run.secs
                ),
            );
            assert_eq!(
                qemu_tasks::installed(&mut vm, REBOOT_PKG),
                "2.0|install ok installed"
            );
            // The workload is back on the new boot, now placed by the operator's FleetDeployment.
            wait_running_in_nats(&reports, &mut vm, before, None);
        },
    );

    println!("measured on this run (guest: 2 vCPUs, TCG on the host's cores):");
    for l in &measured {
        println!("  {l}");
    }
}
