//! The Debian packages in whole-device tests: `scripts/package` run on this process's test builds (debug binaries
//! of the bootstrap agent, the updater and its helpers, fleetlock-server). Lintian is left to `scripts/package`'s
//! own release builds; here the packaging itself (layout, maintainer scripts, device setup) is under test.

use crate::builds::{self, Arch};
use fleet_rig::nspawn::Guest;
use fleet_rig::workspace_root;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// The workspace version: every package's version.
pub fn version() -> String {
    let manifest = std::fs::read_to_string(workspace_root().join("Cargo.toml"))
        .unwrap_or_else(|e| panic!("read Cargo.toml: {e}"));
    manifest
        .lines()
        .find_map(|l| l.strip_prefix("version = \""))
        .and_then(|v| v.strip_suffix('"'))
        .unwrap_or_else(|| panic!("no workspace version in Cargo.toml"))
        .to_string()
}

static AMD64: OnceLock<PathBuf> = OnceLock::new();
static ARM64: OnceLock<PathBuf> = OnceLock::new();

/// The directory holding `harmony-fleet-device_<v>_amd64.deb` and `fleetlock-server_<v>_amd64.deb`, built once
/// per test process with the agent at `bootstrap` as the bootstrap agent.
pub fn amd64(bootstrap: &str) -> &'static Path {
    AMD64.get_or_init(|| {
        let mut bins = vec![(builds::agent(bootstrap), "fleet-agent")];
        bins.extend(builds::device_bins_for(Arch::Host));
        bins.push((builds::fleetlock_server(), "fleetlock-server"));
        package("amd64", &bins)
    })
}

/// The directory holding `harmony-fleet-device_<v>_arm64.deb`, built once per process from binaries cross-built
/// for aarch64, with the agent at `bootstrap` as the bootstrap agent.
pub fn arm64(bootstrap: &str) -> &'static Path {
    ARM64.get_or_init(|| {
        let mut bins = vec![(builds::agent_for(Arch::Arm64, bootstrap), "fleet-agent")];
        bins.extend(builds::device_bins_for(Arch::Arm64));
        package("arm64", &bins)
    })
}

/// Runs `scripts/package --arch <arch> --bin-dir` on `bins` (path, name); returns the output directory.
fn package(arch: &str, bins: &[(PathBuf, &str)]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fleet-packages-{arch}-{}", std::process::id()));
    let bin_dir = dir.join("bin");
    let out = dir.join("out");
    std::fs::create_dir_all(&bin_dir).unwrap_or_else(|e| panic!("mkdir {bin_dir:?}: {e}"));
    for (from, name) in bins {
        std::fs::copy(from, bin_dir.join(name)).unwrap_or_else(|e| panic!("copy {from:?}: {e}"));
    }
    let run = Command::new(workspace_root().join("scripts/package"))
        .args([
            "--arch",
            arch,
            "--no-lintian",
            "--uncompressed",
            "--bin-dir",
        ])
        .arg(&bin_dir)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap_or_else(|e| panic!("run scripts/package: {e}"));
    assert!(
        run.status.success(),
        "scripts/package failed:\n{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    let _ = std::fs::remove_dir_all(&bin_dir);
    out
}

/// The file name of package `name` for amd64.
pub fn file_name(name: &str) -> String {
    file_name_for(name, "amd64")
}

/// The file name of package `name` for `arch` (`amd64`, `arm64`).
pub fn file_name_for(name: &str, arch: &str) -> String {
    format!("{name}_{}_{arch}.deb", version())
}

/// `apt-get -y --no-install-recommends <args>` in the guest as an admin runs it (a transient unit, so under the
/// guest's own cgroups and seccomp filter, without prompts).
pub fn apt(guest: &Guest, args: &[&str]) -> Output {
    let mut all = vec![
        "--service-type=exec",
        "--setenv=DEBIAN_FRONTEND=noninteractive",
        "apt-get",
        "-y",
        "--no-install-recommends",
    ];
    all.extend_from_slice(args);
    guest.systemd_run(&all)
}
