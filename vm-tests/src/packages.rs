//! The Debian packages in whole-device tests: `scripts/package` run on this process's test builds (debug binaries
//! of the bootstrap agent, the updater and its helpers, fleetlock-server). Lintian is left to `scripts/package`'s
//! own release builds; here the packaging itself (layout, maintainer scripts, device setup) is under test.

use crate::builds;
use fleet_rig::workspace_root;
use std::path::{Path, PathBuf};
use std::process::Command;
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

static BUILT: OnceLock<PathBuf> = OnceLock::new();

/// The directory holding `harmony-fleet-device_<v>_amd64.deb` and `fleetlock-server_<v>_amd64.deb`, built once
/// per test process with the agent at `bootstrap` as the bootstrap agent.
pub fn amd64(bootstrap: &str) -> &'static Path {
    BUILT.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("fleet-packages-{}", std::process::id()));
        let bins = dir.join("bin");
        let out = dir.join("out");
        std::fs::create_dir_all(&bins).unwrap_or_else(|e| panic!("mkdir {bins:?}: {e}"));
        for (from, name) in [
            (builds::agent(bootstrap), "fleet-agent"),
            (builds::updater(), "fleet-updater"),
            (builds::fetch_helper(), "fleet-fetch"),
            (builds::reboot_client(), "fleet-reboot"),
            (builds::boot_watchdog(), "fleet-boot-watchdog"),
            (builds::token_refresher(), "fleet-token"),
            (builds::fleetlock_server(), "fleetlock-server"),
        ] {
            std::fs::copy(&from, bins.join(name)).unwrap_or_else(|e| panic!("copy {from:?}: {e}"));
        }
        let run = Command::new(workspace_root().join("scripts/package"))
            .args([
                "--arch",
                "amd64",
                "--no-lintian",
                "--uncompressed",
                "--bin-dir",
            ])
            .arg(&bins)
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
        let _ = std::fs::remove_dir_all(&bins);
        out
    })
}

/// The file name of package `name` for amd64.
pub fn file_name(name: &str) -> String {
    format!("{name}_{}_amd64.deb", version())
}
