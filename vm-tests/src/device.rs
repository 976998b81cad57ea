//! Installing Harmony Fleet into a guest the way an operator would: `scripts/device-setup` with the repository's
//! units, run inside the guest.

use fleet_rig::nspawn::Guest;
use fleet_rig::workspace_root;
use std::path::Path;
use std::process::Output;

/// Where the repository's setup material is copied inside the guest.
pub const GUEST_SETUP_DIR: &str = "/opt/harmony-fleet-setup";

/// Copies `scripts/device-setup` and the unit files into the guest at [`GUEST_SETUP_DIR`] (in the layout the
/// script expects: `scripts/`, `agent/systemd/`, `updater/systemd/`).
pub fn stage_setup(guest: &Guest) {
    let repo = workspace_root();
    for (from, to, mode) in [
        ("scripts/device-setup", "scripts/device-setup", 0o755),
        (
            "agent/systemd/fleet-agent.service",
            "agent/systemd/fleet-agent.service",
            0o644,
        ),
        (
            "updater/systemd/fleet-updater.service",
            "updater/systemd/fleet-updater.service",
            0o644,
        ),
        (
            "updater/systemd/fleet-reboot.service",
            "updater/systemd/fleet-reboot.service",
            0o644,
        ),
        (
            "updater/systemd/fleet-reboot.timer",
            "updater/systemd/fleet-reboot.timer",
            0o644,
        ),
        (
            "updater/systemd/fleet-reboot-release.service",
            "updater/systemd/fleet-reboot-release.service",
            0o644,
        ),
        (
            "updater/systemd/fleet-token.service",
            "updater/systemd/fleet-token.service",
            0o644,
        ),
        (
            "updater/systemd/fleet-token.timer",
            "updater/systemd/fleet-token.timer",
            0o644,
        ),
    ] {
        guest.install_file(&repo.join(from), &format!("{GUEST_SETUP_DIR}/{to}"), mode);
    }
}

/// Copies a host file into the guest's staging directory and returns its guest path.
pub fn stage_file(guest: &Guest, host: &Path, name: &str, mode: u32) -> String {
    let dest = format!("{GUEST_SETUP_DIR}/files/{name}");
    guest.install_file(host, &dest, mode);
    dest
}

/// Writes `contents` into the guest's staging directory and returns its guest path.
pub fn stage_bytes(guest: &Guest, contents: &[u8], name: &str, mode: u32) -> String {
    let dest = format!("{GUEST_SETUP_DIR}/files/{name}");
    guest.write_file(&dest, contents, mode);
    dest
}

/// Runs `device-setup <args>` inside the guest (through `systemd-run`, as a real root shell would be, under the
/// guest's own cgroups and seccomp filter).
pub fn device_setup(guest: &Guest, args: &[&str]) -> Output {
    let script = format!("{GUEST_SETUP_DIR}/scripts/device-setup");
    let mut all = vec!["--service-type=exec", script.as_str()];
    all.extend_from_slice(args);
    guest.systemd_run(&all)
}

/// Stdout and stderr of an [`Output`], for assertions and failure messages.
pub fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}
