//! `fleet-qemu-scenarios`: whole-device scenarios on a real kernel (QEMU TCG), with real reboots and power cuts:
//! agent upgrades (a, e), fleet tasks (taskrun, recovery, powercut; `tasks.rs`), a workload over its memory limit
//! (oom; `oom.rs`) and one with a device node, a group and a capability (hardware; `hardware.rs`). Prints PASS/FAIL per scenario
//! with its time; exits 1 when one failed. Run it through `vm-tests/qemu/run`, which sets up QEMU, the disk image
//! and nats-server first.

mod hardware;
mod oom;
mod tasks;

use fleet_rig::callout::{FleetNats, NatsAuth, NatsTransport};
use fleet_rig::wait_for;
use fleet_vm_tests::builds::{self, V1, V2};
use fleet_vm_tests::fleet::{
    agent_config, Artifacts, Operator, DEVICE, GUEST_CA_FILE, GUEST_NATS_CA_FILE, GUEST_TOKEN_FILE,
};
use fleet_vm_tests::qemu::{
    make_stage_disk, relay_unit, stripped_copy, Image, Vm, GUEST_STAGE, HOST_FROM_GUEST,
};
use fleet_vm_tests::runner::step;
use fleet_wire::{AgentUpgradeAttempt, AgentUpgradeStatus, UpgradePhase, UpgradeReason};
use std::path::Path;
use std::time::{Duration, Instant};

const LIB: &str = "/usr/lib/harmony-fleet";
const REAL_V2: &str = "/opt/fleet-test/fleet-agent-real-v2";

const HELP: &str = "fleet-qemu-scenarios [a|e|oom|hardware|taskrun|recovery|powercut|watchdog]...\n\n\
Whole-device scenarios on a real kernel under QEMU (TCG), default all:\n  \
a         v1 -> v2 commits, the new agent is ready; the guest reboots itself and v2 comes back ready\n  \
e         power cut (kill -9 of QEMU) during `activating`; after the next boot v1 is selected and the status says so\n  \
oom       a workload limited to 32 MiB allocates 64 MiB: reported oom-killed, the agent unharmed (cgroup v2, rootless)\n  \
hardware  a rootless workload with /dev/ttyS0, the dialout group and NET_ADMIN runs with all three\n  \
taskrun   device installed from the harmony-fleet-device package; kubectl create TaskRun -> apt full-upgrade that\n            \
installs a Debian kernel package (its hook writes /run/reboot-required) -> reboot through fleetlock-server\n  \
recovery  duplicated intent runs apt once; expired intent never starts; updater SIGKILLed mid-dpkg recovers\n  \
powercut  power cut mid-dpkg and at a journal write; the next boot recovers as docs/updater.md says\n  \
watchdog  a boot held before multi-user.target: the boot watchdog writes diagnostics, reboots once, holds its cap\n\n\
The task scenarios share one guest when run in one process (`vm-tests/qemu/run tasks`).\n\
Needs qemu-system-x86_64, the image of scripts/setup.d/65-qemu.sh and FLEET_NATS_SERVER: use vm-tests/qemu/run.";

fn main() {
    fleet_vm_tests::runner::run_scenarios(
        HELP,
        "scenario",
        &[
            ("a", scenario_a),
            ("e", scenario_e),
            ("oom", oom::scenario_oom),
            ("hardware", hardware::scenario_hardware),
            ("taskrun", tasks::scenario_taskrun),
            ("recovery", tasks::scenario_recovery),
            ("powercut", tasks::scenario_powercut),
            ("watchdog", tasks::scenario_watchdog),
        ],
    );
    tasks::drop_shared();
}

/// Host-side services and a booted v1 device.
struct Rig {
    _nats: FleetNats,
    operator: Operator,
    artifacts: Artifacts,
    vm: Vm,
    dir: tempfile::TempDir,
}

/// Boots a fresh guest, installs the updater and agent v1 with `scripts/device-setup` from the staging disk, and
/// waits until both units are active and the agent has published its device info.
fn install_v1() -> Rig {
    // TLS unless FLEET_NATS_TLS=off: the guest reaches the host at 10.0.2.2, which the rig's server certificate
    // names.
    let nats = FleetNats::start_with(
        NatsAuth::from_env(),
        NatsTransport::from_env(),
        builds::fleet_auth,
    );
    let operator = Operator::new(&nats);
    let artifacts = Artifacts::start();
    let dir = tempfile::Builder::new()
        .prefix("fleet-qemu-")
        .tempdir_in(run_dir())
        .unwrap_or_else(|e| panic!("temp dir: {e}"));
    let stage = dir.path().join("stage");
    let repo = fleet_rig::workspace_root();
    for sub in ["scripts", "agent/systemd", "updater/systemd", "files"] {
        std::fs::create_dir_all(stage.join(sub)).unwrap_or_else(|e| panic!("mkdir: {e}"));
    }
    for f in [
        "scripts/device-setup",
        "agent/systemd/fleet-agent.service",
        "updater/systemd/fleet-updater.service",
        "updater/systemd/fleet-reboot.service",
        "updater/systemd/fleet-reboot.timer",
        "updater/systemd/fleet-reboot-release.service",
    ] {
        std::fs::copy(repo.join(f), stage.join(f)).unwrap_or_else(|e| panic!("copy {f}: {e}"));
    }
    step("building agent v1, v2 and the updater");
    let files = stage.join("files");
    stripped_copy(
        &builds::agent(V1),
        &files.join(format!("fleet-agent-v{V1}")),
    );
    stripped_copy(&builds::agent(V2), &files.join("fleet-agent-real-v2"));
    stripped_copy(&builds::updater(), &files.join("fleet-updater"));
    stripped_copy(&builds::tools(), &files.join("fleet-fetch"));
    stripped_copy(&builds::tools(), &files.join("fleet-reboot"));
    let nats_url = match nats.ca_file() {
        Some(ca) => {
            std::fs::copy(ca, files.join("nats-ca.pem"))
                .unwrap_or_else(|e| panic!("copy NATS CA: {e}"));
            format!("tls://{HOST_FROM_GUEST}:{}", nats.port())
        }
        None => format!("nats://{HOST_FROM_GUEST}:{}", nats.port()),
    };
    step(&format!("the guest's NATS: {nats_url}"));
    // The device's NATS token (auth callout on): a root-only file that device setup installs for the agent.
    let token = nats.device_token(DEVICE);
    if let Some(t) = &token {
        use std::os::unix::fs::PermissionsExt;
        let p = files.join("nats-token");
        std::fs::write(&p, t.as_bytes()).unwrap_or_else(|e| panic!("write token: {e}"));
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600))
            .unwrap_or_else(|e| panic!("chmod token: {e}"));
    }
    let token_arg = if token.is_some() {
        format!(" --nats-token {GUEST_STAGE}/files/nats-token")
    } else {
        String::new()
    };
    write(
        &files.join("agent.toml"),
        &agent_config(DEVICE, &nats_url, token.as_ref().map(|_| GUEST_TOKEN_FILE)),
    );
    write(
        &files.join("updater.toml"),
        &format!("extra_ca_file = \"{GUEST_CA_FILE}\"\n"),
    );
    std::fs::write(files.join("test-ca.pem"), artifacts.ca_pem())
        .unwrap_or_else(|e| panic!("write CA: {e}"));
    // The artifact URL and the test certificate name 127.0.0.1: inside the guest, socat relays it to the host.
    write(
        &files.join("fleet-artifact-relay.service"),
        &relay_unit("artifact server", artifacts.port()),
    );
    let disk = dir.path().join("stage.raw");
    make_stage_disk(&stage, &disk);

    step("booting the guest (QEMU TCG)");
    let mut vm = Vm::new(dir.path(), Image::amd64(), &disk);
    let boot = vm.power_on();
    step(&format!("guest up, boot id {boot}"));
    let s = GUEST_STAGE;
    vm.sh(&format!(
        "mkdir -p {s} && mount -o ro /dev/vdb {s} && \
         install -D -m 0644 {s}/files/test-ca.pem {GUEST_CA_FILE} && \
         {{ [ ! -e {s}/files/nats-ca.pem ] || install -D -m 0644 {s}/files/nats-ca.pem {GUEST_NATS_CA_FILE}; }} && \
         install -D -m 0755 {s}/files/fleet-agent-real-v2 {REAL_V2} && \
         install -m 0644 {s}/files/fleet-artifact-relay.service /etc/systemd/system/ && \
         systemctl daemon-reload && systemctl enable --now fleet-artifact-relay.service"
    ));
    step("device-setup");
    let (code, out) = vm.sh_code(&format!(
        "{s}/scripts/device-setup --agent {s}/files/fleet-agent-v{V1} --updater {s}/files/fleet-updater \
         --agent-config {s}/files/agent.toml --updater-config {s}/files/updater.toml{token_arg}"
    ));
    assert!(code == 0, "device-setup failed ({code}):\n{out}");
    let mut rig = Rig {
        _nats: nats,
        operator,
        artifacts,
        vm,
        dir,
    };
    rig.vm
        .wait_unit("fleet-updater.service", "active", Duration::from_secs(120));
    rig.vm
        .wait_unit("fleet-agent.service", "active", Duration::from_secs(240));
    let info = wait_for(Duration::from_secs(120), || {
        rig.operator.has_device_info().then_some(())
    });
    if info.is_none() {
        panic!(
            "the agent published no device info.\n{}",
            rig.vm.unit_logs()
        );
    }
    assert_eq!(rig.vm.active_link(), format!("{LIB}/fleet-agent-v{V1}"));
    step("v1 installed, active and talking to NATS");
    rig
}

fn run_dir() -> std::path::PathBuf {
    std::env::var_os("FLEET_QEMU_RUN_DIR")
        .map(Into::into)
        .unwrap_or_else(std::env::temp_dir)
}

fn write(p: &Path, s: &str) {
    std::fs::write(p, s).unwrap_or_else(|e| panic!("write {p:?}: {e}"));
}

fn wait_complete(
    rig: &mut Rig,
    attempt: &AgentUpgradeAttempt,
    phase: UpgradePhase,
) -> AgentUpgradeStatus {
    let mut last = None;
    let found = wait_for(Duration::from_secs(480), || {
        let s = rig.operator.status()?;
        let hit = s.attempt_id.as_ref() == Some(&attempt.attempt_id) && s.phase == phase;
        last = Some(s.clone());
        hit.then_some(s)
    });
    found.unwrap_or_else(|| {
        panic!(
            "the status did not reach {phase:?}; last: {last:#?}\n{}",
            rig.vm.unit_logs()
        )
    })
}

/// a. v1 → v2 commits and the new agent is ready (Type=notify unit active, new process, `--version` 2.0.0,
/// journal `committed`, NATS status `complete` for this attempt with its digest); then the guest reboots itself
/// and, on the new boot, v2 is still selected, started by systemd and ready, and the journal still `committed`.
fn scenario_a() {
    let mut rig = install_v1();
    let old_pid = rig.vm.agent_pid();
    let v2 = rig.dir.path().join("fleet-agent-v2");
    stripped_copy(&builds::agent(V2), &v2);
    let attempt = rig.artifacts.attempt(&v2, "fleet-agent-v2", V2);
    rig.operator.put_intent(&attempt);
    step("intent v2 written; waiting for complete");
    let status = wait_complete(&mut rig, &attempt, UpgradePhase::Complete);
    let vm = &mut rig.vm;
    assert_eq!(vm.active_link(), format!("{LIB}/fleet-agent-v{V2}"));
    assert_eq!(
        vm.sh_code("systemctl is-active fleet-agent.service")
            .1
            .trim(),
        "active"
    );
    assert_ne!(vm.agent_pid(), old_pid, "the old agent process still runs");
    assert_eq!(vm.active_version(), V2);
    assert_eq!(vm.journal_phase("journal.json"), "committed");
    assert_eq!(status.target_version.as_ref().map(|v| v.as_str()), Some(V2));
    assert_eq!(status.attempt_digest.as_ref(), Some(&attempt.digest()));
    assert_eq!(rig.artifacts.requests_for("fleet-agent-v2"), 1);
    step("committed; the guest reboots itself");

    let boot_before = vm
        .sh("cat /proc/sys/kernel/random/boot_id")
        .trim()
        .to_string();
    vm.reboot();
    let boot_after = vm.wait_boot(Some(&boot_before), Duration::from_secs(300));
    assert_ne!(boot_after, boot_before);
    step(&format!("rebooted: boot id {boot_before} -> {boot_after}"));
    vm.wait_unit("fleet-updater.service", "active", Duration::from_secs(120));
    vm.wait_unit("fleet-agent.service", "active", Duration::from_secs(240));
    assert_eq!(vm.active_link(), format!("{LIB}/fleet-agent-v{V2}"));
    assert_eq!(vm.active_version(), V2);
    assert_eq!(vm.journal_phase("journal.json"), "committed");
    // The unit is Type=notify: `active` means this boot's v2 process sent READY.
    let since =
        vm.sh("systemctl show -p ActiveEnterTimestampMonotonic --value fleet-agent.service");
    assert!(since.trim().parse::<u64>().unwrap_or(0) > 0, "{since}");
    let after = rig
        .operator
        .status()
        .unwrap_or_else(|| panic!("no status after reboot"));
    assert_eq!(after.phase, UpgradePhase::Complete, "{after:#?}");
    assert_eq!(after.attempt_id.as_ref(), Some(&attempt.attempt_id));
}

/// The slow candidate: probes like the real v2; as a service it starts 30 s late (TCG is slow: the window must
/// outlast a few polls of the journal over the command channel).
fn slow_candidate(dir: &Path) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join("slow-v2");
    let body = format!(
        "case \"$1\" in --self-test|--version|--help) exec {REAL_V2} \"$@\" ;; esac\n\
         sleep 30 & wait $!\n\
         exec {REAL_V2} \"$@\""
    );
    // An ELF that runs the script: the updater runs only ELF executables for the device's architecture.
    std::fs::write(&p, builds::script_candidate(&body))
        .unwrap_or_else(|e| panic!("write {p:?}: {e}"));
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755))
        .unwrap_or_else(|e| panic!("chmod: {e}"));
    p
}

/// e. A power cut (SIGKILL of QEMU) while the updater's journal says `activating`; after the next boot v1 is
/// selected, active and reporting version 1.0.0, the journal says `failed`, and the NATS status of the attempt is
/// `failed` with reason `interrupted`, went through `rolling-back`, and carries the new boot's id.
fn scenario_e() {
    let mut rig = install_v1();
    let attempt = rig
        .artifacts
        .attempt(&slow_candidate(rig.dir.path()), "fleet-agent-v2-slow", V2);
    rig.operator.put_intent(&attempt);
    step("intent (slow v2) written; waiting for the journal to say activating");
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let phase = rig.vm.journal_phase("journal.json");
        if phase == "activating" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the journal did not reach activating (it is {phase}).\n{}",
            rig.vm.unit_logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let boot_before = rig
        .vm
        .sh("cat /proc/sys/kernel/random/boot_id")
        .trim()
        .to_string();
    step("activating: power cut (kill -9 of QEMU)");
    rig.vm.power_cut();
    let boot_after = rig.vm.power_on();
    assert_ne!(boot_after, boot_before);
    step(&format!(
        "powered on again: boot id {boot_before} -> {boot_after}"
    ));

    let status = wait_complete(&mut rig, &attempt, UpgradePhase::Failed);
    let vm = &mut rig.vm;
    assert_eq!(vm.active_link(), format!("{LIB}/fleet-agent-v{V1}"));
    assert_eq!(
        vm.journal_phase("journal.json"),
        "failed",
        "{}",
        vm.unit_logs()
    );
    vm.wait_unit("fleet-agent.service", "active", Duration::from_secs(240));
    vm.wait_unit("fleet-updater.service", "active", Duration::from_secs(120));
    assert_eq!(vm.active_version(), V1);
    assert_eq!(
        status.reason,
        Some(UpgradeReason::Interrupted),
        "{status:#?}"
    );
    let phases = status.transitions.phases();
    assert!(phases.contains(&UpgradePhase::RollingBack), "{phases:?}");
    assert_eq!(
        status.boot_id.map(|b| b.to_string().replace('-', "")),
        Some(boot_after.replace('-', "")),
        "the status is not from the new boot"
    );
}
