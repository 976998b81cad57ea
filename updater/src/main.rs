//! fleet-updater: the root updater daemon (thin main: arguments, logging, then the library).

use fleet_updater::config::DEFAULT_CONFIG_PATH;

const HELP: &str = "\
fleet-updater: the root updater of Harmony Fleet devices. Owns the agent-upgrade transaction (download, verify,
install, probe, stop, switch, start, commit or roll back), the system upgrade (apt-get update, apt-get
full-upgrade, a coordinated reboot when needed) and their crash-safe journals, and answers the agent on
<root>/run/fleet-updater/updater.sock. Runs as root under systemd (Type=notify). Downloads run in the helper
fleet-fetch, installed beside this executable, as agent_user; the updater checks size and SHA-256 again itself.
The reboot a system upgrade needs runs as `fleet-reboot --upgrade-step`, installed beside this executable too.

Usage:
  fleet-updater [--config PATH]   run (default config: /etc/harmony-fleet/updater.toml)
  fleet-updater --version         print the version
  fleet-updater --help            this text

Configuration keys (TOML, all optional): root, device_id, extra_ca_file, agent_unit, agent_user, socket_group,
system_reboot_retry_secs, download_max_bytes_per_sec (the agent-artifact download's cap in bytes per second, 0
for none).
Logging: RUST_LOG (default info). See docs/updater.md.";

fn main() {
    let config = fleet_updater::cli::Cli::config_only(
        std::env::args().skip(1),
        HELP,
        env!("CARGO_PKG_VERSION"),
        DEFAULT_CONFIG_PATH,
    )
    .unwrap_or_else(|e| usage(&e));
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    if let Err(e) = fleet_updater::run::run(&config) {
        log::error!("{e}");
        eprintln!("fleet-updater: {e}");
        std::process::exit(1);
    }
}

fn usage(why: &str) -> ! {
    eprintln!("fleet-updater: {why}\n\n{HELP}");
    std::process::exit(2);
}
