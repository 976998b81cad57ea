//! `fleet-token`: one refresh of the device's NATS token (from fleet-token.timer).
//! One of the names of the `fleet-tools` multicall binary ([`crate::tools`]).

use crate::cli::Cli;
use crate::token::{self, TokenConfig};

const HELP: &str = "fleet-token: get a fresh NATS token for this device as its Zitadel machine user (JWT-profile
grant, RFC 7523) and replace /etc/harmony-fleet/nats-token with it (mode 0600, owned by fleet-agent); the agent
reads it on its next connection. A failure leaves the old token in place.

Usage: fleet-token [--config PATH]

  --config PATH  YAML config (default /etc/harmony-fleet/fleet-token.yaml): issuer, project_id, ca_file,
                 timeout_secs, root. The machine key is /etc/harmony-fleet/zitadel-key.json (Zitadel's key
                 JSON: keyId, key, userId; root only).
  --help         this text
  --version      the version

Exit status: 0 when a new token was written, 1 otherwise. The token and the key are never printed.";

/// The tool, given its arguments after its name.
pub fn main(args: Vec<String>) {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let config = Cli::config_only(
        args,
        HELP,
        env!("CARGO_PKG_VERSION"),
        token::config::DEFAULT_CONFIG,
    )
    .unwrap_or_else(|e| fail(&e));
    let cfg = TokenConfig::load(&config).unwrap_or_else(|e| fail(&e.to_string()));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_else(|_| fail("the clock is before 1970"));
    match token::refresh(&cfg, now) {
        Ok(r) => log::info!(
            "wrote a new NATS token for machine user {} to {}{}",
            r.user_id,
            cfg.token_file().display(),
            r.expires_in
                .map(|s| format!(" (valid for {s} s)"))
                .unwrap_or_default()
        ),
        Err(e) => fail(&format!("no new token (the old one stays): {e}")),
    }
}

fn fail(msg: &str) -> ! {
    log::error!("{msg}");
    std::process::exit(1);
}
