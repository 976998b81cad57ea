//! `fleet-auth`: the NATS auth callout for device identity (Zitadel token → device-scoped permissions).

const HELP: &str = "fleet-auth: NATS auth callout; verifies a device's Zitadel token via the issuer's JWKS and answers
with a user JWT allowing only that device's subjects.

Usage: fleet-auth --config PATH

  --config PATH  YAML config: nats (url, user, password_file), issuer_seed_file, xkey_seed_file, account,
                 zitadel (issuer, audience, jwks_url, jwks_ca_file, device_id_claim, leeway_secs, …)
  --help         this text
  --version      the version

Logging: RUST_LOG (default info); tokens and keys are never logged. See docs/auth.md.";

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let args = fleet_wire::cli::Cli::from_env(
        HELP,
        env!("CARGO_PKG_VERSION"),
        &fleet_wire::cli::CONFIG_ONLY,
    )
    .unwrap_or_else(|e| fail(&e));
    let Some(config) = args.path("--config") else {
        fail("--config PATH is required (see --help)");
    };
    let settings = match fleet_auth::config::Settings::load(&config) {
        Ok(s) => s,
        Err(e) => fail(&e),
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => fail(&format!("tokio runtime: {e}")),
    };
    if let Err(e) = rt.block_on(fleet_auth::service::run(settings)) {
        fail(&e);
    }
}

fn fail(msg: &str) -> ! {
    eprintln!("fleet-auth: {msg}");
    std::process::exit(2);
}
