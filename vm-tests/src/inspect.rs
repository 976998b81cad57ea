//! What a device says about its agent upgrade, read from the host: the updater's journal (parsed and validated by
//! the updater's own parser), the updater's socket status (through the agent's own socket client), the selected
//! agent binary and the processes that run an agent binary. Works while the guest is off for the journal and the
//! link (the overlay stays mounted), and while it runs for the rest.

use crate::fleet::Device;
use crate::scene::LIB;
use fleet_updater::agent_upgrade::journal::Journal;
use fleet_wire::UpdaterStatus;
use sha2::Digest;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

/// The agent-upgrade journal's path in the guest.
pub const JOURNAL: &str = "/var/lib/fleet-updater/journal.json";
/// The active symlink `fleet-agent.service` executes.
pub const ACTIVE_LINK: &str = "/usr/local/bin/fleet-agent";

/// The guest path of the versioned binary of `version` (`/usr/lib/harmony-fleet/fleet-agent-v<version>`).
pub fn versioned(version: &str) -> String {
    format!("{LIB}/fleet-agent-v{version}")
}

/// The journal as the updater reads it at start-up: `Ok(None)` without one, `Err` when it does not parse or does
/// not validate (the updater would refuse to start).
pub fn journal(device: &Device) -> Result<Option<Journal>, String> {
    Journal::load(&device.guest.path(JOURNAL)).map_err(|e| e.to_string())
}

/// The updater's `status` answer, asked from the host through the guest's root (`/proc/<PID 1>/root/…`); the
/// test runs as root, which the updater admits.
pub fn updater_status(device: &Device) -> Result<UpdaterStatus, String> {
    let pid = device
        .guest
        .pid1()
        .ok_or_else(|| "the guest is not running".to_string())?;
    let root = PathBuf::from(format!("/proc/{pid}/root"));
    let socket = fleet_wire::socket::updater_socket(&root);
    fleet_agent::updater::UpdaterClient::new(&socket)
        .status()
        .map_err(|e| e.to_string())
}

/// The selected agent: where the active symlink points, and what is there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selected {
    /// The symlink's target, exactly as stored.
    pub link: String,
    /// True when the target is a regular file (not a link, not missing) with an execute bit.
    pub executable_file: bool,
    /// The SHA-256 of the target file (hex), when it could be read.
    pub sha256: Option<String>,
}

/// Reads the active symlink and its target from the host side of the guest's disk.
pub fn selected(device: &Device) -> Result<Selected, String> {
    let link_path = device.guest.path(ACTIVE_LINK);
    let meta = std::fs::symlink_metadata(&link_path).map_err(|e| format!("{ACTIVE_LINK}: {e}"))?;
    if !meta.file_type().is_symlink() {
        return Err(format!("{ACTIVE_LINK} is not a symlink"));
    }
    let target = std::fs::read_link(&link_path).map_err(|e| format!("{ACTIVE_LINK}: {e}"))?;
    let link = target.to_string_lossy().to_string();
    let file = device.guest.path(&link);
    let executable_file = std::fs::symlink_metadata(&file)
        .map(|m| m.file_type().is_file() && m.permissions().mode() & 0o111 == 0o111)
        .unwrap_or(false);
    let sha256 = std::fs::read(&file)
        .ok()
        .map(|b| hex(&sha2::Sha256::digest(&b)));
    Ok(Selected {
        link,
        executable_file,
        sha256,
    })
}

/// SHA-256 of a host file, hex.
pub fn file_sha256(path: &std::path::Path) -> String {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("read {path:?}: {e}"));
    hex(&sha2::Sha256::digest(&bytes))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Every process in the guest whose executable is a versioned agent binary: `(pid, executable)`.
pub fn agent_processes(device: &Device) -> Vec<(u32, String)> {
    let out = device.guest.sh(&format!(
        "for p in /proc/[0-9]*; do e=$(readlink $p/exe 2>/dev/null) || continue; \
         case \"$e\" in {LIB}/fleet-agent-v*) echo \"${{p#/proc/}} $e\" ;; esac; done"
    ));
    out.lines()
        .filter_map(|l| {
            let (pid, exe) = l.split_once(' ')?;
            Some((pid.parse().ok()?, exe.to_string()))
        })
        .collect()
}

/// Temporary files of interrupted durable writes (`fleet_wire::durable::temp_beside`) beside the journals and the
/// active link: guest paths. The updater removes them at start-up.
pub fn interrupted_writes(device: &Device) -> Vec<String> {
    let mut found = vec![];
    for dir in ["/var/lib/fleet-updater", "/usr/local/bin"] {
        let Ok(entries) = std::fs::read_dir(device.guest.path(dir)) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            if name.starts_with('.') && name.contains(".tmp-") {
                found.push(format!("{dir}/{name}"));
            }
        }
    }
    found
}

/// The files in the updater's download directory (`/usr/lib/harmony-fleet/.partial`): at most one artifact's
/// resumable download (its bytes and its state) survives an interruption.
pub fn partial_downloads(device: &Device) -> Vec<String> {
    std::fs::read_dir(device.guest.path(&format!("{LIB}/.partial")))
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().to_string())
                .collect()
        })
        .unwrap_or_default()
}
