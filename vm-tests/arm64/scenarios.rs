//! `fleet-arm64-scenarios`: arm64 under emulation (binfmt qemu-aarch64). `device`: an arm64 device (Debian
//! bookworm arm64, as Raspberry Pi OS) booted with systemd-nspawn, set up with the arm64 `harmony-fleet-device`
//! package as an admin would, then, on that one guest in order: an agent upgrade v1 → v2 that commits, a broken v3
//! that is rolled back to v2, a reboot coordinated through a real `fleetlock-server`, and `apt purge`. `image`: the
//! operator image for amd64 and arm64 with its manifest list (`scripts/operator-image`), the arm64 image's three
//! binaries started under Podman. Prints PASS/FAIL per step with its time; exits 1 when a step failed. Run it
//! through `vm-tests/arm64/run`, which registers qemu-aarch64 with binfmt_misc and builds the arm64 tree first;
//! without them it fails and says so.
//!
//! The device binaries are debug builds cross-compiled for aarch64 (`builds::Arch::Arm64`) and packaged by
//! `scripts/package --arch arm64`, like the amd64 package test. Podman is off in the agent's configuration:
//! rootless Podman's socket-activated API under qemu-user answers too slowly for the agent's probe.

use fleet_rig::nspawn::{Guest, GuestOptions};
use fleet_rig::wait_for;
use fleet_vm_tests::builds::{self, Arch, V1, V2, V3};
use fleet_vm_tests::device::text;
use fleet_vm_tests::fleet::{
    agent_config, guest_nats_url, start_nats, Artifacts, Operator, DEVICE, GUEST_CA_FILE,
    GUEST_TOKEN_FILE,
};
use fleet_vm_tests::fleetlock::FleetLockServer;
use fleet_vm_tests::packages::{self, apt};
use fleet_vm_tests::runner::Steps;
use fleet_vm_tests::tasks::HolderWatch;
use fleet_wire::{Architecture, UpgradePhase, UpgradeReason};
use std::path::PathBuf;
use std::time::Duration;

const HELP: &str = "fleet-arm64-scenarios [device|image]...   (default: both)\n\n\
device: an arm64 device under systemd-nspawn + binfmt qemu-aarch64, set up with the arm64 package, then in order:\n  \
install  apt install ./harmony-fleet-device_<v>_arm64.deb: agent and updater ready, timers active\n  \
commit   agent upgrade v1 -> v2 commits; v2 ready\n  \
rollback a v3 that dies before readiness is rolled back; v2 ready again\n  \
reboot   /run/reboot-required: fleet-reboot takes the FleetLock slot, reboots, gives the slot back\n  \
purge    apt purge leaves nothing of the package\n\
image: scripts/operator-image --arch amd64 --arch arm64 (a manifest list); the arm64 image's binaries start\n\n\
Needs qemu-aarch64 registered with binfmt_misc and the arm64 tree: use vm-tests/arm64/run.";

/// Where the versioned agent binaries live on a device.
const LIB: &str = "/usr/lib/harmony-fleet";
/// Where the real v3 agent is placed in the guest, for the broken v3's probe to `exec`.
const REAL_V3: &str = "/opt/fleet-test/fleet-agent-real-v3";
/// The arm64 tree's recipe (vm-tests/arm64/build-tree's `recipe=`).
const TREE_RECIPE: &str = "bookworm-arm64-v1";
/// Generous bounds: every guest process runs under instruction-set emulation.
const UNIT_WAIT: Duration = Duration::from_secs(240);
const UPGRADE_WAIT: Duration = Duration::from_secs(480);

fn main() {
    fleet_vm_tests::runner::run_scenarios(HELP, "arm64", &[("device", device), ("image", image)]);
}

/// Fails, saying how to fix it, unless qemu-aarch64 is registered with binfmt_misc (flag F: the interpreter is
/// opened at registration, so it works inside containers and guests too).
fn require_binfmt() {
    let binfmt =
        std::fs::read_to_string("/proc/sys/fs/binfmt_misc/qemu-aarch64").unwrap_or_default();
    assert!(
        binfmt.starts_with("enabled") && binfmt.lines().any(|l| l.starts_with("flags:") && l.contains('F')),
        "qemu-aarch64 is not registered with binfmt_misc (with flag F): run vm-tests/arm64/run, which registers \
         it from /usr/lib/binfmt.d/qemu-aarch64.conf (apt-get install qemu-user-static)"
    );
}

/// The arm64 tree, or a failure that says how to get it (and binfmt's qemu-aarch64, without which it cannot boot).
fn arm64_tree() -> PathBuf {
    require_binfmt();
    let cache = std::env::var_os("FLEET_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| fleet_rig::workspace_root().join(".cache"));
    let tree = cache.join("nspawn-arm64").join(TREE_RECIPE);
    let stamp = std::fs::read_to_string(tree.join("etc/fleet-test-tree")).unwrap_or_default();
    assert_eq!(
        stamp.trim(),
        TREE_RECIPE,
        "no complete arm64 tree at {}: run vm-tests/arm64/run (vm-tests/arm64/build-tree debootstraps it)",
        tree.display()
    );
    tree
}

fn journal_phase(guest: &Guest) -> String {
    let Ok(raw) = std::fs::read(guest.path("/var/lib/fleet-updater/journal.json")) else {
        return "none".into();
    };
    let v: serde_json::Value =
        serde_json::from_slice(&raw).unwrap_or_else(|e| panic!("journal is not JSON: {e}"));
    v["phase"].as_str().unwrap_or("unknown").to_string()
}

fn agent_pid(guest: &Guest) -> String {
    guest.systemctl(&["show", "-P", "MainPID", "fleet-agent.service"])
}

fn logs(guest: &Guest) -> String {
    format!(
        "--- fleet-updater ---\n{}\n--- fleet-agent ---\n{}",
        guest.journal("fleet-updater.service", 60),
        guest.journal("fleet-agent.service", 60)
    )
}

fn device() {
    let tree = arm64_tree();
    let mut steps = Steps;
    let (deb, v2, v3, broken_v3) = steps.run(
        "build (agent v1, v2, v3 and the device binaries for aarch64; package)",
        || {
            let dir = packages::arm64(V1);
            // A v3 whose probe is the real v3's but whose service exits before readiness: rolled back.
            let broken = builds::broken_candidate_file(Arch::Arm64, V3, REAL_V3);
            (
                dir.join(packages::file_name_for("harmony-fleet-device", "arm64")),
                builds::agent_for(Arch::Arm64, V2),
                builds::agent_for(Arch::Arm64, V3),
                broken,
            )
        },
    );

    let nats = start_nats();
    let operator = Operator::new(&nats);
    let artifacts = Artifacts::start();
    let lock = FleetLockServer::start();
    let mut guest = steps.run("boot (systemd-nspawn, aarch64 under qemu-user)", || {
        let guest = Guest::boot_with(GuestOptions {
            tree: Some(tree),
            ..Default::default()
        });
        assert_eq!(guest.sh("uname -m").trim(), "aarch64");
        guest
    });
    let link = guest.forward(nats.port());
    guest.forward(artifacts.port());
    let _lock_link = guest.forward(lock.port());

    steps.run("install (apt install ./harmony-fleet-device_<v>_arm64.deb)", || {
        let token = nats.device_token(DEVICE);
        if let Some(t) = &token {
            guest.write_file(GUEST_TOKEN_FILE, t.as_bytes(), 0o600);
        }
        // tls:// with the fleet CA installed in the guest, unless FLEET_NATS_TLS=off.
        let url = guest_nats_url(&guest, &nats, &link);
        let mut cfg = agent_config(DEVICE, &url, token.as_ref().map(|_| GUEST_TOKEN_FILE));
        // See the file comment: no Podman on the emulated device.
        cfg.push_str("\n[podman]\nenabled = false\n");
        guest.write_file("/etc/harmony-fleet/agent.toml", cfg.as_bytes(), 0o600);
        guest.write_file(GUEST_CA_FILE, &artifacts.ca_pem(), 0o644);
        guest.write_file(
            "/etc/harmony-fleet/updater.toml",
            format!("extra_ca_file = \"{GUEST_CA_FILE}\"\n").as_bytes(),
            0o644,
        );
        guest.install_file(&deb, "/root/pkgs/harmony-fleet-device.deb", 0o644);
        let out = apt(&guest, &["install", "/root/pkgs/harmony-fleet-device.deb"]);
        assert!(out.status.success(), "apt install failed:\n{}", text(&out));
        for unit in [
            "fleet-updater.service",
            "fleet-agent.service",
            "fleet-reboot.timer",
            "fleet-boot-watchdog.timer",
        ] {
            guest.wait_unit(unit, "active", UNIT_WAIT);
        }
        let info = wait_for(Duration::from_secs(120), || operator.has_device_info().then_some(()));
        assert!(info.is_some(), "no device info in NATS.\n{}", logs(&guest));
        // Every binary the package installed is an aarch64 ELF (e_machine 0xb7), run as such.
        let machines = guest.sh(
            "for f in /usr/local/sbin/fleet-updater /usr/local/sbin/fleet-fetch /usr/local/sbin/fleet-reboot \
               $(readlink -f /usr/local/bin/fleet-agent); do od -An -tx1 -j18 -N2 $f | tr -d ' '; done",
        );
        assert_eq!(machines.lines().collect::<Vec<_>>(), ["b700"; 4], "{machines}");
        assert_eq!(guest.sh("/usr/local/bin/fleet-agent --version").trim(), V1);
    });

    steps.run("commit (agent upgrade v1 -> v2)", || {
        let v1_pid = agent_pid(&guest);
        let attempt =
            artifacts.attempt_for_arch(DEVICE, Architecture::Arm64, &v2, "fleet-agent-v2", V2);
        operator.put_intent(&attempt);
        let status = operator.wait_terminal(&attempt, UPGRADE_WAIT, || logs(&guest));
        assert_eq!(
            status.phase,
            UpgradePhase::Complete,
            "{status:#?}\n{}",
            logs(&guest)
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
        assert_eq!(
            guest.sh("readlink /usr/local/bin/fleet-agent").trim(),
            format!("{LIB}/fleet-agent-v{V2}")
        );
        assert_eq!(guest.unit_state("fleet-agent.service"), "active");
        assert_ne!(agent_pid(&guest), v1_pid, "v1 still runs");
        assert_eq!(guest.sh("/usr/local/bin/fleet-agent --version").trim(), V2);
        assert_eq!(journal_phase(&guest), "committed");
    });

    steps.run("rollback (a v3 that dies before readiness)", || {
        guest.install_file(&v3, REAL_V3, 0o755);
        let v2_pid = agent_pid(&guest);
        let attempt = artifacts.attempt_for_arch(
            DEVICE,
            Architecture::Arm64,
            broken_v3.path(),
            "fleet-agent-v3-broken",
            V3,
        );
        operator.put_intent(&attempt);
        let status = operator.wait_terminal(&attempt, UPGRADE_WAIT, || logs(&guest));
        assert_eq!(
            (status.phase, status.reason),
            (UpgradePhase::Failed, Some(UpgradeReason::StartFailed)),
            "{status:#?}\n{}",
            logs(&guest)
        );
        let phases = status.transitions.phases();
        for want in [UpgradePhase::Stopping, UpgradePhase::RollingBack] {
            assert!(phases.contains(&want), "{want:?} missing: {status:#?}");
        }
        guest.wait_unit("fleet-agent.service", "active", UNIT_WAIT);
        assert_eq!(
            guest.sh("readlink /usr/local/bin/fleet-agent").trim(),
            format!("{LIB}/fleet-agent-v{V2}")
        );
        assert_eq!(guest.sh("/usr/local/bin/fleet-agent --version").trim(), V2);
        assert_ne!(agent_pid(&guest), v2_pid, "v2 was not restarted");
        assert_eq!(journal_phase(&guest), "failed");
    });

    steps.run("reboot (coordinated through fleetlock-server)", || {
        guest.write_file(
            "/etc/harmony-fleet/fleet-reboot.yaml",
            lock.client_config().as_bytes(),
            0o600,
        );
        let watch = HolderWatch::start(&lock);
        guest.sh("touch /run/reboot-required");
        let (first_boot, old_pid1) = (guest.boot_id(), guest.pid1());
        let _ = guest.exec(&["systemctl", "start", "--no-block", "fleet-reboot.service"]);
        let down = wait_for(Duration::from_secs(120), || {
            (guest.pid1() != old_pid1).then_some(())
        });
        assert!(
            down.is_some(),
            "no reboot:\n{}\n{}",
            guest.journal("fleet-reboot.service", 30),
            lock.log()
        );
        guest.wait_up(Duration::from_secs(120));
        assert_ne!(guest.boot_id(), first_boot, "the boot id did not change");
        // After the boot fleet-reboot-release.service gives the slot back once the host is healthy.
        let released = wait_for(Duration::from_secs(180), || {
            (lock.holders() == 0).then_some(())
        });
        let (max, order) = watch.stop();
        assert!(
            released.is_some(),
            "the slot was not given back:\n{}\n{}",
            guest.journal("fleet-reboot-release.service", 30),
            lock.log()
        );
        assert_eq!((max, order.len()), (1, 1), "holders seen: {order:?}");
        guest.sh("test ! -e /var/lib/fleet-reboot/marker.json");
        for unit in ["fleet-updater.service", "fleet-agent.service"] {
            guest.wait_unit(unit, "active", UNIT_WAIT);
        }
        assert_eq!(guest.sh("/usr/local/bin/fleet-agent --version").trim(), V2);
    });

    steps.run("purge (apt purge harmony-fleet-device)", || {
        let out = apt(&guest, &["purge", "harmony-fleet-device"]);
        assert!(out.status.success(), "apt purge failed:\n{}", text(&out));
        let (_, left) = guest.try_sh(
            "ls -d /usr/local/bin/fleet-agent /usr/local/sbin/fleet-* /usr/lib/harmony-fleet /etc/harmony-fleet \
               /etc/systemd/system/fleet-* /var/lib/fleet-updater /var/lib/fleet-agent /var/lib/fleet-reboot \
               2>/dev/null; getent passwd fleet-agent",
        );
        assert_eq!(left.trim(), "", "purge left these behind");
    });
}

/// The image name of the `image` scenario (not the release name: the test's store is its own anyway).
const IMAGE: &str = "localhost/fleet-operator:arm64-check";

/// The operator image for amd64 (the test's debug binaries) and arm64 (the aarch64 release build
/// `scripts/operator-image` itself would make), a manifest list over both, and the arm64 image's binaries started
/// under Podman through binfmt (`--help`: running it against the API server is the amd64 image's test,
/// vm-tests/tests/operator_image.rs, and would take minutes under emulation).
fn image() {
    require_binfmt();
    let mut steps = Steps;
    let podman = fleet_rig::podman::PodmanService::start();
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("temp dir: {e}"));
    steps.run("image build (amd64 + arm64, manifest list)", || {
        let amd64 = dir.path().join("amd64");
        std::fs::create_dir_all(&amd64).unwrap_or_else(|e| panic!("mkdir: {e}"));
        for (from, name) in [
            (builds::operator(), "fleet-operator"),
            (builds::fleetlock_server(), "fleetlock-server"),
            (builds::fleet_auth(), "fleet-auth"),
        ] {
            std::fs::copy(&from, amd64.join(name)).unwrap_or_else(|e| panic!("copy {from:?}: {e}"));
        }
        let triple = "aarch64-unknown-linux-gnu";
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let out = std::process::Command::new(&cargo)
            .current_dir(fleet_rig::workspace_root())
            .args([
                "build",
                "--quiet",
                "--release",
                "--locked",
                "--target",
                triple,
            ])
            .args([
                "-p",
                "fleet-operator",
                "--bin",
                "fleet-operator",
                "--bin",
                "fleetlock-server",
            ])
            .args(["--bin", "fleet-auth"])
            .output()
            .unwrap_or_else(|e| panic!("cannot run {cargo}: {e}"));
        assert!(
            out.status.success(),
            "the aarch64 release build failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| fleet_rig::workspace_root().join("target"));
        std::os::unix::fs::symlink(
            target.join(triple).join("release"),
            dir.path().join("arm64"),
        )
        .unwrap_or_else(|e| panic!("symlink: {e}"));
        let built = podman
            .bind_script(&mut std::process::Command::new(
                fleet_rig::workspace_root().join("scripts/operator-image"),
            ))
            .args([
                "--arch",
                "amd64",
                "--arch",
                "arm64",
                "--tag",
                IMAGE,
                "--bin-dir",
            ])
            .arg(dir.path())
            .output()
            .unwrap_or_else(|e| panic!("scripts/operator-image: {e}"));
        assert!(
            built.status.success(),
            "scripts/operator-image failed:\n{}",
            text(&built)
        );
    });
    steps.run("image manifest list (linux/amd64, linux/arm64)", || {
        let list: serde_json::Value =
            serde_json::from_str(&podman.podman(&["manifest", "inspect", IMAGE]))
                .unwrap_or_else(|e| panic!("manifest inspect: {e}"));
        let mut platforms: Vec<String> = list["manifests"]
            .as_array()
            .unwrap_or_else(|| panic!("no manifests in {list:#}"))
            .iter()
            .map(|m| {
                format!(
                    "{}/{}",
                    m["platform"]["os"].as_str().unwrap_or("?"),
                    m["platform"]["architecture"].as_str().unwrap_or("?")
                )
            })
            .collect();
        platforms.sort();
        assert_eq!(platforms, ["linux/amd64", "linux/arm64"], "{list:#}");
        for arch in ["amd64", "arm64"] {
            let name = format!("{IMAGE}-{arch}");
            assert_eq!(
                podman.podman(&[
                    "image",
                    "inspect",
                    "-f",
                    "{{.Os}}/{{.Architecture}} {{.Config.User}}",
                    &name
                ]),
                format!("linux/{arch} 65532:65532")
            );
        }
    });
    steps.run(
        "image arm64 binaries start (podman run --arch arm64 … --help)",
        || {
            let arm64 = format!("{IMAGE}-arm64");
            // What the arm64 image holds is aarch64 code (e_machine 0xb7): an amd64 binary would run here as well.
            podman.podman(&["create", "--name", "arm64-files", &arm64]);
            for f in [
                "/usr/local/bin/fleet-operator",
                "/usr/local/bin/fleetlock-server",
                "/usr/local/bin/fleet-auth",
                "/lib/ld-linux-aarch64.so.1",
            ] {
                let to = dir.path().join("copied");
                podman.podman(&["cp", &format!("arm64-files:{f}"), &to.to_string_lossy()]);
                let bytes = std::fs::read(&to).unwrap_or_else(|e| panic!("read {f}: {e}"));
                assert_eq!(
                    bytes.get(18..20),
                    Some(&[0xb7, 0][..]),
                    "{f} is not an aarch64 ELF"
                );
                std::fs::remove_file(&to).unwrap_or_else(|e| panic!("rm: {e}"));
            }
            podman.podman(&["rm", "arm64-files"]);
            // Each binary's help starts with its own name.
            for bin in ["fleet-operator", "fleetlock-server", "fleet-auth"] {
                let out = podman.try_podman(&[
                    "run",
                    "--rm",
                    "--arch",
                    "arm64",
                    "--network",
                    "none",
                    "--entrypoint",
                    &format!("/usr/local/bin/{bin}"),
                    &arm64,
                    "--help",
                ]);
                let help = String::from_utf8_lossy(&out.stdout);
                assert!(
                    out.status.success() && help.starts_with(&format!("{bin}: ")),
                    "{bin} --help in the arm64 image:\n{}",
                    text(&out)
                );
            }
        },
    );
}
