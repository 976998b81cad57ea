//! Local checks: is something staged, and is this host healthy.

use super::system::{Paths, System};
use super::Reason;
use std::time::Duration;

/// Time-out of local commands.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

/// Something waits for a reboot: `bootc status --json` has a staged image, `/run/reboot-required` exists, or
/// `/var/lib/fleet-updater/reboot-required` does (nothing in the product writes it). `Err` says why not.
pub fn staged(sys: &dyn System, paths: &Paths) -> Result<String, Reason> {
    if paths.reboot_required().exists() {
        return Ok("/run/reboot-required exists".into());
    }
    if paths.reboot_flag().exists() {
        return Ok("/var/lib/fleet-updater/reboot-required exists".into());
    }
    match sys.run("bootc", &["status", "--json"], COMMAND_TIMEOUT) {
        Ok(out) if out.code == Some(0) => {
            let v: serde_json::Value = serde_json::from_slice(&out.stdout)
                .map_err(|e| Reason(format!("bootc status --json does not parse: {e}")))?;
            let staged = v.pointer("/status/staged").filter(|s| !s.is_null());
            if let Some(s) = staged {
                let image = s
                    .pointer("/image/image/image")
                    .and_then(|i| i.as_str())
                    .unwrap_or("an image");
                return Ok(format!("bootc has {image} staged"));
            }
            Err(Reason(
                "nothing staged (bootc: no staged image; no /run/reboot-required)".into(),
            ))
        }
        Ok(out) => Err(Reason(format!(
            "nothing staged (bootc status failed with {:?}; no /run/reboot-required)",
            out.code
        ))),
        Err(_) => Err(Reason(
            "nothing staged (no bootc; no /run/reboot-required)".into(),
        )),
    }
}

/// The host is going down: `systemctl is-system-running` says `stopping` (a shutdown or reboot job is queued,
/// which `systemctl reboot` does before it returns).
pub fn shutting_down(sys: &dyn System) -> bool {
    sys.run("systemctl", &["is-system-running"], COMMAND_TIMEOUT)
        .is_ok_and(|out| out.text() == "stopping")
}

/// The host is healthy: `systemctl is-system-running` says `running` (or `degraded` when allowed) and
/// `/run/nologin` does not exist.
pub fn healthy(sys: &dyn System, paths: &Paths, allow_degraded: bool) -> Result<(), Reason> {
    let out = sys
        .run("systemctl", &["is-system-running"], COMMAND_TIMEOUT)
        .map_err(|e| Reason(format!("not healthy: {e}")))?;
    let state = out.text();
    match state.as_str() {
        "running" => {}
        "degraded" if allow_degraded => {}
        "degraded" => {
            return Err(Reason(
                "not healthy: system is degraded (allow_degraded is false)".into(),
            ))
        }
        other => return Err(Reason(format!("not healthy: system is {other:?}"))),
    }
    if paths.nologin().exists() {
        return Err(Reason(
            "not healthy: /run/nologin exists (still booting: systemd-user-sessions has not run)"
                .into(),
        ));
    }
    Ok(())
}
