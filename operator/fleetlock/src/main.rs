//! `fleetlock-server`: the FleetLock coordinated-reboot lock server (no Kubernetes needed).

use fleetlock_server::{CertFiles, Listener};
use std::net::SocketAddr;

const HELP: &str = "fleetlock-server: a FleetLock lock server for coordinated reboots (Zincati/airlock protocol)

Usage: fleetlock-server --tls-cert PEM --tls-key PEM [--listen ADDR:PORT] [--config PATH]
       fleetlock-server --plain-http [--listen ADDR:PORT] [--config PATH]

  --tls-cert PEM      serve HTTPS with this certificate chain (leaf first); re-read when it changes on disk
  --tls-key PEM       the certificate's private key; re-read when it changes on disk
  --plain-http        serve plain HTTP instead (tokens and passwords then cross the network readable)
  --listen ADDR:PORT  where to listen (default 0.0.0.0:7450)
  --config PATH       YAML config: default_slots, groups, store, ttl, auth, audit_log, path_prefix (re-read on change).
                      Without it: group `default` with one slot, file store under /var/lib/fleetlock.
  --help              this text
  --version           the version

Endpoints: POST /v1/pre-reboot, POST /v1/steady-state (header fleet-lock-protocol: true),
GET /v1/status, GET /metrics, GET /healthz, POST /v1/admin/release. Logging: RUST_LOG (default info).
See docs/fleetlock.md.";

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let args = fleet_wire::cli::Cli::from_env(
        HELP,
        env!("CARGO_PKG_VERSION"),
        &fleet_wire::cli::Spec {
            flags: &["--plain-http"],
            options: &["--listen", "--config", "--tls-cert", "--tls-key"],
        },
    )
    .unwrap_or_else(|e| fail(&e));
    let listen: SocketAddr = match args.value("--listen").map(str::parse) {
        None => SocketAddr::from(([0, 0, 0, 0], 7450)),
        Some(Ok(a)) => a,
        Some(Err(_)) => fail("--listen needs ADDR:PORT, e.g. 0.0.0.0:7450"),
    };
    let config = args.path("--config");
    let (cert, key, plain) = (
        args.path("--tls-cert"),
        args.path("--tls-key"),
        args.flag("--plain-http"),
    );
    let mode = match (cert, key, plain) {
        (Some(cert), Some(key), false) => Listener::Https(CertFiles { cert, key }),
        (None, None, true) => Listener::PlainHttp,
        (None, None, false) => fail(
            "give --tls-cert and --tls-key to serve HTTPS, or --plain-http to serve plain HTTP (see --help)",
        ),
        (_, _, true) => fail("--plain-http and --tls-cert/--tls-key exclude each other"),
        _ => fail("--tls-cert and --tls-key go together"),
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => fail(&format!("tokio runtime: {e}")),
    };
    if let Err(e) = rt.block_on(fleetlock_server::run(listen, config, mode)) {
        fail(&e);
    }
}

fn fail(msg: &str) -> ! {
    eprintln!("fleetlock-server: {msg}");
    std::process::exit(2);
}
