//! `fleet-reboot --check`: validates the config and reaches the FleetLock server with the configured token,
//! without taking or releasing a slot, so that an administrator can test a set-up.

use super::config::RebootConfig;
use super::lock::LockClient;
use super::system::Paths;

/// Checks `cfg` and the server; `Ok` is a one-line summary, `Err` says what is wrong.
pub fn check(cfg: &RebootConfig) -> Result<String, String> {
    let timeout = cfg.timeout()?;
    cfg.health_wait()?;
    if let Some(w) = &cfg.window {
        super::window::Window::from_config(w)?;
    }
    let who = super::identity(&Paths::new(&cfg.root))?;
    let client = LockClient::from_config(cfg, timeout)?;
    let status = client.status()?;
    let group = status
        .groups
        .iter()
        .find(|g| g.name == cfg.group)
        .ok_or_else(|| {
            format!(
                "the server {} has no group {:?} (its groups: {})",
                cfg.server,
                cfg.group,
                status
                    .groups
                    .iter()
                    .map(|g| g.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })?;
    let holding = group.holders.iter().any(|h| h.id == who.id);
    Ok(format!(
        "config ok; server {} reachable, token accepted; group {}: {} slot(s), {} held{}",
        cfg.server,
        group.name,
        group.slots,
        group.holders.len(),
        if holding { ", one by this host" } else { "" }
    ))
}
