//! Every path the updater manages, derived from one root prefix (`/` on a device, a temp dir in tests).

use fleet_wire::Version;
use std::path::{Path, PathBuf};

/// The managed paths under a root prefix. Callers never choose a path: they only pick the root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Paths {
    root: PathBuf,
}

impl Paths {
    /// Paths under `root` (`/` in production).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The root prefix.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn under(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    /// `<root>/usr/lib/harmony-fleet`: the versioned agent binaries.
    pub fn binaries_dir(&self) -> PathBuf {
        self.under("usr/lib/harmony-fleet")
    }

    /// `<root>/usr/lib/harmony-fleet/fleet-agent-v<version>`.
    pub fn binary(&self, version: &Version) -> PathBuf {
        self.binaries_dir()
            .join(format!("fleet-agent-v{}", version.as_str()))
    }

    /// `<root>/usr/lib/harmony-fleet/.partial`: downloads land here, on the same file system as the binaries, so
    /// that installing is a rename.
    pub fn download_dir(&self) -> PathBuf {
        self.binaries_dir().join(".partial")
    }

    /// `<root>/usr/local/bin/fleet-agent`: the active symlink that `fleet-agent.service` executes.
    pub fn active_link(&self) -> PathBuf {
        self.under("usr/local/bin/fleet-agent")
    }

    /// `<root>/var/lib/fleet-updater`: the updater's durable state.
    pub fn state_dir(&self) -> PathBuf {
        self.under("var/lib/fleet-updater")
    }

    /// `<root>/var/lib/fleet-updater/journal.json`.
    pub fn journal(&self) -> PathBuf {
        self.state_dir().join("journal.json")
    }

    /// `<root>/var/lib/fleet-updater/updater.lock`: the process lock, taken before recovery and the socket.
    pub fn lock_file(&self) -> PathBuf {
        self.state_dir().join("updater.lock")
    }

    /// `<root>/var/lib/fleet-updater/system-upgrade.json`: the system-upgrade journal.
    pub fn system_journal(&self) -> PathBuf {
        self.state_dir().join("system-upgrade.json")
    }

    /// `<root>/run/reboot-required`: Debian's flag that an upgraded package wants a reboot.
    pub fn reboot_required(&self) -> PathBuf {
        self.under("run/reboot-required")
    }

    /// `<root>/etc/harmony-fleet/fleet-reboot.yaml`: the coordinated-reboot configuration (shared with
    /// `fleet-reboot`).
    pub fn reboot_config(&self) -> PathBuf {
        self.under("etc/harmony-fleet/fleet-reboot.yaml")
    }

    /// `<root>/run/fleet-updater`: the socket's directory.
    pub fn run_dir(&self) -> PathBuf {
        self.under(fleet_wire::socket::UPDATER_RUN_DIR)
    }

    /// `<root>/run/fleet-updater/updater.sock`.
    pub fn socket(&self) -> PathBuf {
        fleet_wire::socket::updater_socket(&self.root)
    }

    /// Where a symlink target (as stored in the link) points, seen from this process.
    pub fn resolve_link_target(&self, target: &Path) -> PathBuf {
        if target.is_absolute() {
            target.to_path_buf()
        } else {
            let link = self.active_link();
            link.parent().unwrap_or(Path::new("/")).join(target)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derives_under_root() {
        let p = Paths::new("/tmp/r");
        let v = Version::try_from("1.2.0").expect("v");
        assert_eq!(
            p.binary(&v),
            Path::new("/tmp/r/usr/lib/harmony-fleet/fleet-agent-v1.2.0")
        );
        assert_eq!(
            p.active_link(),
            Path::new("/tmp/r/usr/local/bin/fleet-agent")
        );
        assert_eq!(
            p.journal(),
            Path::new("/tmp/r/var/lib/fleet-updater/journal.json")
        );
        assert_eq!(
            p.socket(),
            Path::new("/tmp/r/run/fleet-updater/updater.sock")
        );
        assert_eq!(
            p.resolve_link_target(Path::new("../../lib/x")),
            Path::new("/tmp/r/usr/local/bin/../../lib/x")
        );
        let root = Paths::new("/");
        assert_eq!(root.active_link(), Path::new("/usr/local/bin/fleet-agent"));
    }
}
