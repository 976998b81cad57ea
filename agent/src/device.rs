//! What the agent reports about the device: OS from `<root>/etc/os-release`, the boot id, capabilities, and
//! how often systemd restarted the agent.

use fleet_wire::{BoundedText, Capability, Id128, OsInfo};
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Longest wait for `systemctl show` (it asks the system manager over D-Bus).
const SYSTEMCTL_TIMEOUT: Duration = Duration::from_secs(3);

/// Parses os-release text (`KEY=value`, optionally quoted).
pub fn parse_os_release(text: &str) -> OsInfo {
    let mut id = None;
    let mut version_id = None;
    let mut pretty = None;
    for line in text.lines().take(256) {
        let Some((k, v)) = line.split_once('=') else {
            continue;
        };
        let v = v.trim().trim_matches(|c| c == '"' || c == '\'');
        match k.trim() {
            "ID" => id = Some(BoundedText::lossy(v)),
            "VERSION_ID" => version_id = Some(BoundedText::lossy(v)),
            "PRETTY_NAME" => pretty = Some(BoundedText::lossy(v)),
            _ => {}
        }
    }
    OsInfo {
        id: id.unwrap_or_else(|| BoundedText::lossy("linux")),
        version_id,
        pretty_name: pretty,
    }
}

/// The OS of the device under `os_release` (`linux` when the file is missing).
pub fn os_info(os_release: &Path) -> OsInfo {
    let text = std::fs::read(os_release)
        .map(|b| String::from_utf8_lossy(&b[..b.len().min(64 * 1024)]).into_owned())
        .unwrap_or_default();
    parse_os_release(&text)
}

/// The id the device's FleetLock client sends ([`fleet_wire::fleetlock::client_id`] of the machine id under
/// `machine_id`), reported in device info so the Reboots page shows a holder as its device; `None` when the file
/// is missing or holds no machine id.
pub fn reboot_client_id(machine_id: &Path) -> Option<Id128> {
    let text = std::fs::read(machine_id).ok()?;
    // Read as fleet-reboot reads it (at most 64 KiB, trimmed), so both hash the same text.
    let machine = String::from_utf8_lossy(&text[..text.len().min(64 * 1024)])
        .trim()
        .to_owned();
    if machine.is_empty() {
        return None;
    }
    Id128::parse_lenient(&fleet_wire::fleetlock::client_id(&machine)).ok()
}

/// The kernel's boot id, when readable.
pub fn boot_id() -> Option<Id128> {
    let s = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    Id128::parse_lenient(s.trim()).ok()
}

/// The systemd unit this process runs in, from `/proc/self/cgroup` (`…/fleet-agent.service`), when it runs
/// under systemd at all (`INVOCATION_ID` is set for a unit's processes).
fn own_unit() -> Option<String> {
    std::env::var_os("INVOCATION_ID")?;
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    unit_of_cgroup(&text)
}

/// The `.service` unit named by the last component of a `/proc/self/cgroup` line.
fn unit_of_cgroup(text: &str) -> Option<String> {
    text.lines()
        .filter_map(|l| l.rsplit('/').next())
        .find(|u| {
            u.ends_with(".service")
                && u.len() <= 256
                && u.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.@:\\".contains(&b))
        })
        .map(str::to_owned)
}

/// systemd's `NRestarts` of the agent's own unit: how often systemd restarted it after a failure since it was
/// last started by a person, a boot or a cutover. `None` outside systemd or when `systemctl` does not answer
/// within [`SYSTEMCTL_TIMEOUT`]. Asked once per agent process, at start.
pub fn restarts() -> Option<u32> {
    let unit = own_unit()?;
    let mut child = Command::new("systemctl")
        .args(["show", "--property=NRestarts", "--value", "--", &unit])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| log::warn!("systemctl show {unit}: {e}"))
        .ok()?;
    let deadline = Instant::now() + SYSTEMCTL_TIMEOUT;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                log::warn!("systemctl show {unit}: no answer within {SYSTEMCTL_TIMEOUT:?}");
                return None;
            }
        }
    }
    let mut out = String::new();
    child
        .stdout
        .take()?
        .take(64)
        .read_to_string(&mut out)
        .ok()?;
    out.trim().parse().ok()
}

/// What this device can do: agent self-upgrade from HTTPS and the workload spec's second version (limits,
/// hardware, privileges, secrets: the agent's own) always (every updater has the first), and OCI artifacts and
/// the apt system upgrade only when the local updater says it supports them (an older updater lacks them, so
/// the operator never plans such work for this device).
pub fn capabilities(updater: &[Capability]) -> Vec<Capability> {
    let mut c = vec![Capability::AgentUpgradeV1, Capability::WorkloadSpecV2];
    for needs_updater in [Capability::OciArtifactsV1, Capability::AptFullUpgradeV1] {
        if updater.contains(&needs_updater) {
            c.push(needs_updater);
        }
    }
    c
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_reboot_client_id_is_fleet_reboots() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("machine-id");
        std::fs::write(&file, "0123456789abcdef0123456789abcdef\n").expect("write");
        assert_eq!(
            super::reboot_client_id(&file).map(|i| i.as_str().to_owned()),
            Some(fleet_wire::fleetlock::client_id(
                "0123456789abcdef0123456789abcdef"
            ))
        );
        std::fs::write(&file, "\n").expect("write");
        assert_eq!(super::reboot_client_id(&file), None);
        assert_eq!(super::reboot_client_id(&dir.path().join("absent")), None);
    }

    #[test]
    fn the_unit_comes_from_the_cgroup() {
        let v2 = "0::/system.slice/fleet-agent.service\n";
        assert_eq!(
            super::unit_of_cgroup(v2).as_deref(),
            Some("fleet-agent.service")
        );
        let v1 =
            "12:pids:/system.slice/x.service\n1:name=systemd:/system.slice/fleet-agent.service\n";
        assert_eq!(super::unit_of_cgroup(v1).as_deref(), Some("x.service"));
        assert_eq!(
            super::unit_of_cgroup("0::/user.slice/session-1.scope\n"),
            None
        );
        assert_eq!(super::unit_of_cgroup("0::/a;rm -rf.service\n"), None);
    }

    use fleet_wire::Capability::*;

    #[test]
    fn capabilities_follow_the_updater() {
        assert_eq!(super::capabilities(&[]), [AgentUpgradeV1, WorkloadSpecV2]);
        assert_eq!(
            super::capabilities(&[OciArtifactsV1]),
            [AgentUpgradeV1, WorkloadSpecV2, OciArtifactsV1]
        );
        assert_eq!(
            super::capabilities(&[AptFullUpgradeV1, Unknown, AgentUpgradeV1, OciArtifactsV1]),
            [
                AgentUpgradeV1,
                WorkloadSpecV2,
                OciArtifactsV1,
                AptFullUpgradeV1
            ]
        );
    }

    #[test]
    fn parses_os_release() {
        let o = super::parse_os_release(
            "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nID=debian\nVERSION_ID=\"12\"\n",
        );
        assert_eq!(o.id.as_str(), "debian");
        assert_eq!(o.version_id.map(|v| v.to_string()).as_deref(), Some("12"));
        assert!(o.pretty_name.is_some());
        assert_eq!(super::parse_os_release("").id.as_str(), "linux");
    }
}
