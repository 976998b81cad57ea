//! What the agent reports about the device: OS from `<root>/etc/os-release`, the boot id, capabilities.

use fleet_wire::{BoundedText, Capability, Id128, OsInfo};
use std::path::Path;

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

/// The kernel's boot id, when readable.
pub fn boot_id() -> Option<Id128> {
    let s = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    Id128::parse_lenient(s.trim()).ok()
}

/// What this device can do: agent self-upgrade from HTTPS always (every updater has it), and OCI artifacts and
/// the apt system upgrade only when the local updater says it supports them (an older updater lacks them, so
/// the operator never plans such work for this device).
pub fn capabilities(updater: &[Capability]) -> Vec<Capability> {
    let mut c = vec![Capability::AgentUpgradeV1];
    for needs_updater in [Capability::OciArtifactsV1, Capability::AptFullUpgradeV1] {
        if updater.contains(&needs_updater) {
            c.push(needs_updater);
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use fleet_wire::Capability::*;

    #[test]
    fn capabilities_follow_the_updater() {
        assert_eq!(super::capabilities(&[]), [AgentUpgradeV1]);
        assert_eq!(
            super::capabilities(&[OciArtifactsV1]),
            [AgentUpgradeV1, OciArtifactsV1]
        );
        assert_eq!(
            super::capabilities(&[AptFullUpgradeV1, Unknown, AgentUpgradeV1, OciArtifactsV1]),
            [AgentUpgradeV1, OciArtifactsV1, AptFullUpgradeV1]
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
