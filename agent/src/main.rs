//! fleet-agent: parses arguments, sets up logging and calls the library.

use fleet_wire::cli::{Cli, Spec};
use std::path::PathBuf;
use std::process::ExitCode;

const HELP: &str = "\
fleet-agent: Harmony Fleet device agent

USAGE:
  fleet-agent [--config PATH]               run the agent (systemd Type=notify)
  fleet-agent --self-test [--config PATH]   probe the set-up; prints one JSON report line; exit 0 only if it passed
  fleet-agent --version                     print the compiled version
  fleet-agent --help                        this text

The configuration defaults to /etc/harmony-fleet/agent.toml (see docs/agent-config.md).
Logging goes to stderr; set RUST_LOG (e.g. RUST_LOG=debug) for more detail.
Exit codes: 0 success or clean drain, 1 failure (systemd restarts the agent), 2 usage error.";

fn main() -> ExitCode {
    let spec = Spec {
        flags: &["--self-test"],
        options: &["--config"],
    };
    let args = match Cli::from_env(HELP, fleet_agent::VERSION, &spec) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}\n\n{HELP}");
            return ExitCode::from(2);
        }
    };
    let config = args
        .path("--config")
        .unwrap_or_else(|| PathBuf::from(fleet_agent::config::DEFAULT_CONFIG_PATH));
    let self_test = args.flag("--self-test");
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    if self_test {
        let report = fleet_agent::probe::self_test(&config);
        match serde_json::to_string(&report) {
            Ok(line) => println!("{line}"),
            Err(e) => {
                eprintln!("cannot print the report: {e}");
                return ExitCode::FAILURE;
            }
        }
        if let Some(c) = report.first_failure() {
            log::error!(
                "self-test failed at {}: {}",
                c.name,
                c.error.as_ref().map(|e| e.as_str()).unwrap_or("")
            );
        }
        // Exit at once: a timed-out check's thread must not keep the process alive.
        std::process::exit(if report.passed { 0 } else { 1 });
    }
    match fleet_agent::agent::run(&config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            log::error!("{e}");
            ExitCode::FAILURE
        }
    }
}
