//! The project's binaries for whole-device tests: the updater and the agent at several compiled versions
//! (`FLEET_AGENT_VERSION=… cargo build`), built once per test process into their own target directory, for this
//! host or cross-built for an arm64 device ([`Arch::Arm64`]: `aarch64-unknown-linux-gnu`, stripped).
//!
//! `cargo test` holds its own target directory's lock while tests run, so these builds use
//! `<target dir>/vm-tests-build` (override: `FLEET_VM_BUILD_DIR`). Each version is copied out after its build,
//! because the next version's build replaces the binary.

use fleet_rig::workspace_root;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

/// The bootstrap version installed by device setup in the scenarios.
pub const V1: &str = "1.0.0";
/// The first upgrade target.
pub const V2: &str = "2.0.0";
/// A later target (the intent changed again while a device was offline).
pub const V3: &str = "3.0.0";

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

fn build_root() -> PathBuf {
    if let Some(d) = std::env::var_os("FLEET_VM_BUILD_DIR") {
        return PathBuf::from(d);
    }
    target_dir().join("vm-tests-build")
}

fn cargo() -> String {
    std::env::var("CARGO")
        .ok()
        .or_else(|| option_env!("CARGO").map(str::to_string))
        .unwrap_or_else(|| "cargo".into())
}

static LOCK: Mutex<()> = Mutex::new(());
static BUILT: OnceLock<Mutex<BTreeMap<String, PathBuf>>> = OnceLock::new();

/// The device architecture a binary is built for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// This host's (x86-64): plain `cargo build`.
    Host,
    /// An arm64 device (Raspberry Pi OS): cross-built for `aarch64-unknown-linux-gnu` (`.cargo/config.toml` sets
    /// the linker; `scripts/setup cross` installs it), then stripped: debug binaries with their debug info are
    /// several times larger, and an emulated device downloads and hashes every byte of a candidate.
    Arm64,
}

impl Arch {
    /// The Rust target triple of a cross build.
    fn triple(self) -> Option<&'static str> {
        match self {
            Self::Host => None,
            Self::Arm64 => Some("aarch64-unknown-linux-gnu"),
        }
    }
}

fn build(package: &str, bin: &str, version: Option<&str>) -> PathBuf {
    build_for(Arch::Host, package, bin, version)
}

fn build_for(arch: Arch, package: &str, bin: &str, version: Option<&str>) -> PathBuf {
    let triple = arch.triple();
    let key = format!(
        "{bin}@{}{}",
        version.unwrap_or("default"),
        triple.map(|t| format!("@{t}")).unwrap_or_default()
    );
    let built = BUILT.get_or_init(|| Mutex::new(BTreeMap::new()));
    if let Some(p) = built.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
        return p.clone();
    }
    let _guard = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(p) = built.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
        return p.clone();
    }
    let root = build_root();
    // Test binaries run side by side (scripts/test's lanes) share this build directory: hold its lock from the
    // build until the copy, or another binary's build of another version replaces the binary in between.
    let _shared = lock_build_root(&root);
    let dest_dir = match triple {
        None => root.join("bin"),
        Some(t) => root.join("bin").join(t),
    };
    let dest = dest_dir.join(match version {
        Some(v) => format!("{bin}-v{v}"),
        None => bin.to_string(),
    });
    // Another test binary of this run may have built it already: reuse a copy newer than every source it is
    // built from (switching FLEET_AGENT_VERSION back and forth would otherwise rebuild the agent each time).
    if newer_than_sources(&dest, package) {
        built
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, dest.clone());
        return dest;
    }
    let mut cmd = Command::new(cargo());
    cmd.current_dir(workspace_root())
        .args(["build", "--quiet", "--locked", "-p", package, "--bin", bin])
        .env("CARGO_TARGET_DIR", root.join("target"));
    if let Some(t) = triple {
        cmd.args(["--target", t]);
    }
    match version {
        Some(v) => cmd.env("FLEET_AGENT_VERSION", v),
        None => cmd.env_remove("FLEET_AGENT_VERSION"),
    };
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run cargo to build {bin}: {e}"));
    assert!(
        out.status.success(),
        "building {bin} ({key}) failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let from = match triple {
        None => root.join("target/debug").join(bin),
        Some(t) => root.join("target").join(t).join("debug").join(bin),
    };
    std::fs::create_dir_all(&dest_dir).unwrap_or_else(|e| panic!("mkdir {dest_dir:?}: {e}"));
    match arch {
        Arch::Host => fleet_rig::util::install_executable(&from, &dest),
        Arch::Arm64 => strip_atomic("aarch64-linux-gnu-strip", &from, &dest),
    }
    built
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(key, dest.clone());
    dest
}

/// An exclusive lock on `<root>/.lock` across processes, released when the file is dropped.
fn lock_build_root(root: &Path) -> std::fs::File {
    std::fs::create_dir_all(root).unwrap_or_else(|e| panic!("mkdir {root:?}: {e}"));
    let path = root.join(".lock");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("open {path:?}: {e}"));
    f.lock().unwrap_or_else(|e| panic!("lock {path:?}: {e}"));
    f
}

/// True when `dest` exists and is newer than every file of the workspace manifests, `wire/` and the package.
fn newer_than_sources(dest: &Path, package: &str) -> bool {
    let Ok(built) = std::fs::metadata(dest).and_then(|m| m.modified()) else {
        return false;
    };
    let ws = workspace_root();
    // The cluster-side crates live under operator/ and share operator/kit: any change there may change them.
    let dir = match package {
        "fleetlock-server" | "fleet-auth" => "operator",
        p => p.trim_start_matches("fleet-"),
    };
    let mut newest = std::time::SystemTime::UNIX_EPOCH;
    for p in [
        ws.join("Cargo.toml"),
        ws.join("Cargo.lock"),
        ws.join("wire"),
        ws.join(dir),
    ] {
        newest = newest.max(newest_mtime(&p));
    }
    built > newest
}

fn newest_mtime(p: &Path) -> std::time::SystemTime {
    let Ok(meta) = std::fs::symlink_metadata(p) else {
        return std::time::SystemTime::UNIX_EPOCH;
    };
    let mut newest = meta.modified().unwrap_or(std::time::SystemTime::UNIX_EPOCH);
    if meta.is_dir() {
        if let Ok(entries) = std::fs::read_dir(p) {
            for e in entries.flatten() {
                newest = newest.max(newest_mtime(&e.path()));
            }
        }
    }
    newest
}

fn strip_atomic(strip: &str, from: &Path, to: &Path) {
    let tmp = to.with_extension(format!("tmp{}", std::process::id()));
    let out = Command::new(strip)
        .arg("-o")
        .arg(&tmp)
        .arg(from)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {strip} (scripts/setup cross installs it): {e}"));
    assert!(
        out.status.success(),
        "{strip} {from:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::rename(&tmp, to).unwrap_or_else(|e| panic!("rename {tmp:?} to {to:?}: {e}"));
}

/// The agent compiled with `FLEET_AGENT_VERSION=version`.
pub fn agent(version: &str) -> PathBuf {
    build("fleet-agent", "fleet-agent", Some(version))
}

/// The agent compiled with `FLEET_AGENT_VERSION=version` for `arch`.
pub fn agent_for(arch: Arch, version: &str) -> PathBuf {
    build_for(arch, "fleet-agent", "fleet-agent", Some(version))
}

/// The device binaries a package carries besides the agent, built for `arch`: (binary, name) of the updater and
/// the multicall `fleet-tools` (fleet-fetch, fleet-reboot, fleet-token, fleet-boot-watchdog).
pub fn device_bins_for(arch: Arch) -> Vec<(PathBuf, &'static str)> {
    ["fleet-updater", "fleet-tools"]
        .into_iter()
        .map(|b| (build_for(arch, "fleet-updater", b, None), b))
        .collect()
}

/// The updater.
pub fn updater() -> PathBuf {
    build("fleet-updater", "fleet-updater", None)
}

/// The multicall binary of the device's root tools: installed (or copied) under a tool's name, it runs that tool
/// (fleet-fetch, the updater's download helper; fleet-reboot; fleet-token; fleet-boot-watchdog).
pub fn tools() -> PathBuf {
    build("fleet-updater", "fleet-tools", None)
}

/// A binary of the workspace's own target directory when it is newer than its sources (`cargo test --workspace`
/// builds every package's binaries before any test runs; `scripts/demo` builds them too), else a build of its own:
/// the operator's dependencies (kube, tokio) are not compiled a second time for nothing.
fn prebuilt_or_build(package: &str, bin: &str) -> PathBuf {
    let main = target_dir().join("debug").join(bin);
    if newer_than_sources(&main, package) {
        return main;
    }
    build(package, bin, None)
}

/// The marker `script-candidate` looks for between its ELF and the appended script.
pub const SCRIPT_MARKER: &str = "\n#fleet-script-candidate\n";

/// A candidate "binary" that runs the shell `body` (fault injection through the artifact): the
/// `script-candidate` ELF with `body` appended, because the updater runs only ELF executables for the device's
/// architecture.
pub fn script_candidate(body: &str) -> Vec<u8> {
    script_candidate_for(Arch::Host, body)
}

/// [`script_candidate`] for a device of `arch`.
pub fn script_candidate_for(arch: Arch, body: &str) -> Vec<u8> {
    let elf = match arch {
        Arch::Host => prebuilt_or_build("fleet-vm-tests", "script-candidate"),
        Arch::Arm64 => script_candidate_arm64(),
    };
    let mut bytes = std::fs::read(&elf).unwrap_or_else(|e| panic!("read {elf:?}: {e}"));
    bytes.extend_from_slice(SCRIPT_MARKER.as_bytes());
    bytes.extend_from_slice(body.as_bytes());
    bytes.push(b'\n');
    bytes
}

/// `src/bin/script-candidate.rs` for aarch64, compiled by `rustc` alone: it uses only `std`, while a cargo build
/// of this package for aarch64 would compile the whole rig (and its TLS and NATS dependencies) for it too.
fn script_candidate_arm64() -> PathBuf {
    static ELF: OnceLock<PathBuf> = OnceLock::new();
    ELF.get_or_init(|| {
        let src = workspace_root().join("vm-tests/src/bin/script-candidate.rs");
        let dir = build_root().join("bin/aarch64-unknown-linux-gnu");
        let dest = dir.join("script-candidate");
        if newest_mtime(&dest) > newest_mtime(&src) {
            return dest;
        }
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("mkdir {dir:?}: {e}"));
        let tmp = dest.with_extension(format!("tmp{}", std::process::id()));
        let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
        let out = Command::new(&rustc)
            .args([
                "--edition=2021",
                "--target=aarch64-unknown-linux-gnu",
                "-Clinker=aarch64-linux-gnu-gcc",
                "-Copt-level=s",
                "-Cstrip=symbols",
                "-o",
            ])
            .arg(&tmp)
            .arg(&src)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {rustc}: {e}"));
        assert!(
            out.status.success(),
            "rustc for aarch64 failed (scripts/setup cross installs the target and linker):\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::rename(&tmp, &dest).unwrap_or_else(|e| panic!("rename {tmp:?}: {e}"));
        dest
    })
    .clone()
}

/// The real `fleet-operator` binary.
pub fn operator() -> PathBuf {
    prebuilt_or_build("fleet-operator", "fleet-operator")
}

/// The real `fleetlock-server` binary.
pub fn fleetlock_server() -> PathBuf {
    prebuilt_or_build("fleetlock-server", "fleetlock-server")
}

/// The real `fleet-auth` binary (the NATS auth callout).
pub fn fleet_auth() -> PathBuf {
    prebuilt_or_build("fleet-auth", "fleet-auth")
}

/// `kubectl`, built by `scripts/setup.d/50-kube-apiserver.sh` from the same Debian source package as the API
/// server (`$FLEET_KUBECTL` overrides).
pub fn kubectl() -> PathBuf {
    let cache = std::env::var_os("FLEET_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(".cache"));
    fleet_rig::require_binary(
        "kubectl",
        "FLEET_KUBECTL",
        &[cache.join("kube-apiserver/kubectl")],
        "Run `scripts/setup kube-apiserver` (it builds kubectl beside kube-apiserver from Debian's kubernetes \
         source package into $FLEET_CACHE/kube-apiserver/), or point FLEET_KUBECTL at a kubectl binary.",
    )
}

/// `kube-controller-manager`, built by `scripts/setup.d/50-kube-apiserver.sh` from the same Debian source package
/// as the API server (`$FLEET_KUBE_CONTROLLER_MANAGER` overrides).
pub fn kube_controller_manager() -> PathBuf {
    let cache = std::env::var_os("FLEET_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(".cache"));
    fleet_rig::require_binary(
        "kube-controller-manager",
        "FLEET_KUBE_CONTROLLER_MANAGER",
        &[cache.join("kube-apiserver/kube-controller-manager")],
        "Run `scripts/setup kube-apiserver` (it builds kube-controller-manager beside kube-apiserver from Debian's \
         kubernetes source package into $FLEET_CACHE/kube-apiserver/), or point FLEET_KUBE_CONTROLLER_MANAGER at \
         a kube-controller-manager binary.",
    )
}

/// The shell body of a broken agent `version` (for [`script_candidate_for`]): its probe is the real binary's at
/// `real` (`--self-test` passes, `--version` reports `version`), but its service exits before telling systemd it is
/// ready, so the updater must roll it back.
pub fn broken_candidate_body(version: &str, real: &str) -> String {
    format!(
        "# a {version} whose probe passes but whose service dies before readiness\n\
         case \"$1\" in --self-test|--version) exec {real} \"$@\" ;; esac\n\
         echo 'fleet-agent {version}: exiting before readiness' >&2\nexit 1"
    )
}

/// A temporary file holding the broken agent `version` of [`broken_candidate_body`] for `arch`, its probe
/// `exec`ing the real binary at `real` on the device.
pub fn broken_candidate_file(arch: Arch, version: &str, real: &str) -> tempfile::NamedTempFile {
    let file = tempfile::NamedTempFile::new().unwrap_or_else(|e| panic!("temp file: {e}"));
    std::fs::write(
        file.path(),
        script_candidate_for(arch, &broken_candidate_body(version, real)),
    )
    .unwrap_or_else(|e| panic!("write the broken {version}: {e}"));
    file
}
