//! `fleet-boot-watchdog`: one run of the boot watchdog (from fleet-boot-watchdog.timer).
//! One of the names of the `fleet-tools` multicall binary ([`crate::tools`]).

use crate::boot_watchdog::{self, config::DEFAULT_CONFIG, Outcome, WatchdogConfig};
use crate::cli::Cli;
use crate::reboot::system::Host;

const HELP: &str = "fleet-boot-watchdog: when this host has not finished booting (is-system-running not running
or degraded, systemd-user-sessions.service not active, /run/nologin present), write diagnostics to
/var/log/fleet-boot-watchdog/ (jobs, failed units, ordering cycles, mounts, apt/dpkg state), then reboot it —
at most max_reboots watchdog reboots in window_hours, counted across boots in
/var/lib/fleet-boot-watchdog/reboots.json. Past that cap the host stays up and says so (diagnostics, journal,
the console login message).

Usage: fleet-boot-watchdog [--config PATH]

  --config PATH  TOML (default /etc/harmony-fleet/boot-watchdog.toml; missing: every default):
                 reboot (true), max_reboots (2, 1-100), window_hours (24, 1-720)
  --help         this text
  --version      the version

Exit status: 0 when the host is up, left alone, diagnosed or rebooting; 1 when the cap holds or
something failed (bad config, diagnostics not written, a failed reboot command).";

/// The tool, given its arguments after its name.
pub fn main(args: Vec<String>) {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let config = Cli::config_only(args, HELP, env!("CARGO_PKG_VERSION"), DEFAULT_CONFIG)
        .unwrap_or_else(|e| fail(&e));
    let cfg = WatchdogConfig::load(&config).unwrap_or_else(|e| fail(&e.to_string()));
    match boot_watchdog::run(&cfg, &Host, fleet_wire::Timestamp::now()) {
        Ok(Outcome::CapReached(file)) => {
            eprintln!(
                "fleet-boot-watchdog: reboot cap reached; the host stays up. Diagnostics: {}",
                file.display()
            );
            std::process::exit(1);
        }
        Ok(_) => {}
        Err(e) => fail(&e.to_string()),
    }
}

fn fail(msg: &str) -> ! {
    eprintln!("fleet-boot-watchdog: {msg}");
    std::process::exit(1);
}
