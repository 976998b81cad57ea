//! `fleet-reboot`: one run of the coordinated-reboot client (from fleet-reboot.timer).
//! One of the names of the `fleet-tools` multicall binary ([`crate::tools`]).

use crate::cli::{Cli, Spec};
use crate::reboot::{self, Outcome, RebootConfig, RunOptions};

const HELP: &str =
    "fleet-reboot: reboot this host into a staged update when the time, its health, its
dependencies and a FleetLock slot allow it; release the slot after the reboot.

Usage: fleet-reboot [--config PATH] [--check | --after-boot | --upgrade-step]

  --check        validate the config and reach the server with its token (GET /v1/status), print what it
                 found and exit; takes and releases no lock and never reboots
  --after-boot   only finish a coordinated reboot: when the marker names another boot, wait until healthy
                 and give the slot back (fleet-reboot-release.service, right after boot); else nothing
  --upgrade-step one run for fleet-updater's system upgrade, which knows a reboot is needed (no \"something
                 staged\" check); prints the outcome as one line of JSON: {\"outcome\":\"not-now\",\"reason\":…},
                 {\"outcome\":\"rebooting\"} or {\"outcome\":\"released\"}
                 (when the system-upgrade journal shows its reboot happened, never reboots again: waits until
                 healthy and gives back a slot of an earlier boot)
  --config PATH  YAML config (default /etc/harmony-fleet/fleet-reboot.yaml): server, group,
                 window{timezone,days,start,end}, timeout, require_hosts, range{cidr,port,min_up},
                 allow_degraded, token, health_wait, root
  --help         this text
  --version      the version

Every run but --check holds one lock (/run/fleet-reboot/run.lock) for its whole run; when another run holds
it the timer's run and --after-boot say \"not now\" after 1 s, --upgrade-step after waiting up to 60 s.

Exit status (--check: 0 when the config is valid and the server answers: it accepted the token, or with
no token configured it needs none; else 1):
0 when the run finished (rebooting, released, or \"not now\" with a logged reason);
1 when something needs an operator (bad config or files, a failed reboot command).";

/// The tool, given its arguments after its name.
pub fn main(args: Vec<String>) {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let args = Cli::from_args(
        args,
        HELP,
        env!("CARGO_PKG_VERSION"),
        &Spec {
            flags: &["--check", "--after-boot", "--upgrade-step"],
            options: &["--config"],
        },
    )
    .unwrap_or_else(|e| fail(&e));
    let config = args
        .path("--config")
        .unwrap_or_else(|| reboot::config::DEFAULT_CONFIG.into());
    let check = args.flag("--check");
    let after_boot = args.flag("--after-boot");
    let upgrade_step = args.flag("--upgrade-step");
    if [check, after_boot, upgrade_step]
        .iter()
        .filter(|f| **f)
        .count()
        > 1
    {
        fail("--check, --after-boot and --upgrade-step exclude each other");
    }
    let cfg = match RebootConfig::load(&config) {
        Ok(c) => c,
        Err(e) => fail(&e.to_string()),
    };
    if check {
        match reboot::check::check(&cfg) {
            Ok(summary) => println!("fleet-reboot: {}: {summary}", config.display()),
            Err(e) => fail(&format!("{}: {e}", config.display())),
        }
        return;
    }
    let outcome = if after_boot {
        reboot::release_after_boot(&cfg, &reboot::system::Host)
    } else if upgrade_step {
        let outcome = reboot::run_once(
            &cfg,
            &reboot::system::Host,
            RunOptions {
                reboot_needed: true,
                now: None,
            },
        );
        if let Ok(o) = &outcome {
            match serde_json::to_string(o) {
                Ok(line) => println!("{line}"),
                Err(e) => fail(&format!("cannot print the outcome: {e}")),
            }
        }
        outcome
    } else {
        reboot::run_once(&cfg, &reboot::system::Host, RunOptions::default())
    };
    match outcome {
        Ok(Outcome::Rebooting) => log::info!("done: rebooting"),
        Ok(Outcome::Released) => log::info!("done: healthy after the reboot, lock released"),
        Ok(Outcome::NotNow(_)) => log::info!("done: no reboot this time"),
        Err(e) => fail(&e.to_string()),
    }
}

fn fail(msg: &str) -> ! {
    log::error!("{msg}");
    eprintln!("fleet-reboot: {msg}");
    std::process::exit(1);
}
