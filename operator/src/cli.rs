//! fleet-operator's command line: the option table, `--help`, and their parsing into [`Options`] and the
//! [`Files`] they name. A module of the binary (main.rs), not of the lib.

use std::path::PathBuf;
use std::time::Duration;

const HELP: &str = "\
fleet-operator: Harmony Fleet's Kubernetes operator. Watches Device, DeviceGroup, FleetDeployment,
AgentRelease, TaskRun, TaskSchedule and DeviceDiagnostics objects (fleet.nationtech.io/v1alpha1), creates
TaskRuns on schedule, writes each device's desired state, agent-upgrade intents, task-run plans,
system-upgrade intents and diagnostics requests into NATS JetStream KV (creating the buckets), and mirrors
device reports into Device, TaskRun and DeviceDiagnostics status.

Usage: fleet-operator [--nats-url URL] [NATS TLS] [--webhook-listen ADDR --webhook-cert FILE --webhook-key FILE]
                      [--dashboard-listen ADDR --dashboard-token-file FILE [dashboard options]]
       fleet-operator buckets [--check] [--nats-url URL] [--kv-replicas N] [--fleet-size N] [NATS TLS]
       fleet-operator --help | --version

Commands:
  buckets          create the missing NATS KV buckets (no Kubernetes needed), scale them to --kv-replicas
                   when given, and list them all;
                   with --check, create nothing and exit 1 if one is missing

Options:
  --nats-url URL          NATS server, or every node of a cluster comma-separated (default: $FLEET_NATS_URL,
                          else nats://127.0.0.1:4222);
                          nats://user:password@host:port connects as the operator's own NATS user (never
                          logged; docs/auth.md)
  --kv-replicas N         copies of each bucket created, on as many servers of a NATS cluster (1-5; default
                          $FLEET_KV_REPLICAS, else 1; 3 for a 3-node cluster: docs/kv-layout.md). The operator
                          leaves buckets that exist as they are; `buckets` scales them to N
  --fleet-size N          the number of devices each bucket's byte limit is made for (1-10000000; default
                          $FLEET_SIZE, else 10000; docs/kv-layout.md). Applied to buckets that exist too; a limit
                          below what a bucket holds is refused, never set. JetStream reserves the limits on its
                          store: about 0.3 MB per device (3 GB at 10000); give every replica the same N
  --nats-ca-file FILE     NATS TLS: PEM CA(s) the server's certificate must chain to (replaces the system
                          roots; default $FLEET_NATS_CA_FILE). Any NATS TLS file makes TLS required.
  --nats-cert-file FILE   NATS TLS: client certificate for a server that verifies clients (mTLS;
                          default $FLEET_NATS_CERT_FILE); goes with --nats-key-file
  --nats-key-file FILE    its PEM private key (default $FLEET_NATS_KEY_FILE)
  --webhook-listen ADDR   also serve the admission webhook over HTTPS on ADDR (e.g. 0.0.0.0:8443):
                          /validate-fields refuses unknown fields in every fleet object and FleetDeployments
                          whose hardware and privileges no WorkloadPolicy allows, /validate-taskrun refuses
                          TaskRun spec changes (operator/deploy/webhook.yaml)
  --webhook-cert FILE     its PEM certificate chain
  --webhook-key FILE      its PEM private key
  --dashboard-listen ADDR         also serve the read-only dashboard and /metrics over HTTP on ADDR
                                  (e.g. 0.0.0.0:8081; off by default; docs/dashboard.md)
  --dashboard-token-file FILE     the token it requires (Authorization: Bearer, or as the Basic password)
  --dashboard-fleetlock-url URL   the FleetLock server whose /v1/status the Reboots page and the FleetLock
                                  alerts read
  --dashboard-fleetlock-token-file FILE   a client or admin token of that server
  --dashboard-fleetlock-ca-file FILE      PEM CA certificate(s) trusted for an https:// FleetLock URL
  Alerts are evaluated and published as Warning events whether or not the dashboard is served:
  --alert-silent-after DURATION   a device without heartbeat for longer alerts (default 15m)
  --alert-slot-held-after DURATION  a FleetLock slot held for longer alerts (default 1h)
  --alert-failed-run-for DURATION   a failed TaskRun alerts for this long after it ended (default 24h)
  --secrets-namespace NS  the namespace of the Secrets FleetDeployments name (imagePullSecrets, workload
                          secrets; default $FLEET_SECRETS_NAMESPACE, else harmony-fleet-secrets; never the
                          operator's own: the operator needs get, list and watch on its Secrets: docs/secrets.md)
  --task-accept-timeout DURATION    a TaskRun device whose intent has no status for longer is stalled:
                                    Progressing=False on the run, status.stalled on the Device, an alert
                                    (default 2m: three 30 s agent heartbeats and one resync; 1s to 24h; raise
                                    it for agents with slower heartbeats; docs/crds.md)
Environment:
  POD_NAMESPACE    this replica's namespace (events about the FleetLock server regard its Pod)
  KUBECONFIG / in-cluster service account   how the Kubernetes API is reached
  POD_NAME         this replica's name in events
  FLEET_LABEL_SELECTOR  handle only fleet objects with these labels (e.g. fleet=eu)
  RUST_LOG         log filter (default: info)

Several replicas may run at once: every NATS write is compare-and-set by revision (docs/crds.md).";

/// What the command line and the FLEET_* environment ask for, checked.
pub struct Options {
    /// `Some(--check)` for the `buckets` command.
    pub buckets: Option<bool>,
    pub nats_url: String,
    /// One value for every NATS user of the process (no process-wide settings).
    pub nats: fleet_operator::kv::NatsSettings,
    pub accept_timeout: Duration,
    pub secrets_namespace: Option<String>,
}

/// The webhook's and the dashboard's options as given; [`Files::read`] reads the files they name.
pub struct Files {
    webhook: (Option<String>, Option<PathBuf>, Option<PathBuf>),
    dashboard: DashboardArgs,
}

/// The webhook's address and TLS set-up (`None` when it is off), the dashboard's and the alerts' options.
pub struct Serving {
    pub webhook: Option<(String, rustls::ServerConfig)>,
    pub dashboard: fleet_operator::dashboard::Options,
}

/// Parses the arguments after the program's name (`--help` and `--version` print and exit here). An error is
/// a usage error, its message complete.
pub fn parse(args: impl Iterator<Item = String>) -> Result<(Options, Files), String> {
    let mut nats_url =
        std::env::var("FLEET_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    let env_path = |k: &str| std::env::var_os(k).map(std::path::PathBuf::from);
    let mut nats_ca = env_path("FLEET_NATS_CA_FILE");
    let mut nats_cert = env_path("FLEET_NATS_CERT_FILE");
    let mut nats_key = env_path("FLEET_NATS_KEY_FILE");
    let mut replicas = std::env::var("FLEET_KV_REPLICAS").ok();
    let mut fleet_size = std::env::var("FLEET_SIZE").ok();
    let mut args = args.peekable();
    let buckets = args.next_if(|a| a == "buckets").is_some();
    let spec = fleet_wire::cli::Spec {
        flags: if buckets { &["--check"] } else { &[] },
        options: &[
            "--nats-url",
            "--kv-replicas",
            "--fleet-size",
            "--nats-ca-file",
            "--nats-cert-file",
            "--nats-key-file",
            "--webhook-listen",
            "--webhook-cert",
            "--webhook-key",
            "--task-accept-timeout",
            "--secrets-namespace",
            "--dashboard-listen",
            "--dashboard-token-file",
            "--dashboard-fleetlock-url",
            "--dashboard-fleetlock-ca-file",
            "--dashboard-fleetlock-token-file",
            "--alert-silent-after",
            "--alert-failed-run-for",
            "--alert-slot-held-after",
        ],
    };
    let given = fleet_wire::cli::Cli::from_args(args, HELP, env!("CARGO_PKG_VERSION"), &spec)?;
    let check = given.flag("--check");
    if let Some(u) = given.value("--nats-url") {
        nats_url = u.to_owned();
    }
    replicas = given.value("--kv-replicas").map(str::to_owned).or(replicas);
    fleet_size = given
        .value("--fleet-size")
        .map(str::to_owned)
        .or(fleet_size);
    nats_ca = given.path("--nats-ca-file").or(nats_ca);
    nats_cert = given.path("--nats-cert-file").or(nats_cert);
    nats_key = given.path("--nats-key-file").or(nats_key);
    let webhook_listen = given.value("--webhook-listen").map(str::to_owned);
    let (webhook_cert, webhook_key) = (given.path("--webhook-cert"), given.path("--webhook-key"));
    let mut accept_timeout = fleet_operator::tasks::stall::DEFAULT_ACCEPT_TIMEOUT;
    if let Some(v) = given.value("--task-accept-timeout") {
        use fleet_operator::tasks::stall::{MAX_ACCEPT_TIMEOUT, MIN_ACCEPT_TIMEOUT};
        accept_timeout = humantime::parse_duration(v)
            .map_err(|e| format!("--task-accept-timeout {v:?}: {e}"))
            .and_then(|d| {
                (MIN_ACCEPT_TIMEOUT..=MAX_ACCEPT_TIMEOUT)
                    .contains(&d)
                    .then_some(d)
                    .ok_or_else(|| "--task-accept-timeout must be 1s to 24h".to_owned())
            })
            .map_err(|e| format!("{e}; see --help"))?;
    }
    let mut dash = DashboardArgs::default();
    for (flag, v) in given
        .options()
        .filter(|(f, _)| f.starts_with("--dashboard-") || f.starts_with("--alert-"))
    {
        dash.set(flag, v.to_owned())
            .map_err(|e| format!("{e}; see --help"))?;
    }
    if let Some((_, password)) = fleet_wire::auth::split_nats_url(&nats_url).user_password {
        fleet_operator::nats_password::refuse_placeholder(
            &password,
            "the password in --nats-url (or FLEET_NATS_URL)",
        )?;
    }
    let nats = (|| {
        let tls = fleet_operator::nats_tls::NatsTls::new(nats_ca, nats_cert, nats_key, "--nats-")?;
        let replicas = replicas.map(|n| number("--kv-replicas", &n)).transpose()?;
        let fleet_size = fleet_size.map(|n| number("--fleet-size", &n)).transpose()?;
        let buckets = fleet_operator::kv::Buckets::new(replicas, fleet_size)?;
        Ok::<_, String>(fleet_operator::kv::NatsSettings { tls, buckets })
    })()
    .map_err(|e| format!("{e}; see --help"))?;
    let options = Options {
        buckets: buckets.then_some(check),
        nats_url,
        nats,
        accept_timeout,
        secrets_namespace: given
            .value("--secrets-namespace")
            .map(str::to_owned)
            .or_else(|| std::env::var("FLEET_SECRETS_NAMESPACE").ok())
            .filter(|s| !s.is_empty()),
    };
    let files = Files {
        webhook: (webhook_listen, webhook_cert, webhook_key),
        dashboard: dash,
    };
    Ok((options, files))
}

impl Files {
    /// Reads the files the options name; an error is a usage error, its message complete.
    pub fn read(self) -> Result<Serving, String> {
        let webhook =
            match self.webhook {
                (None, None, None) => None,
                (Some(addr), Some(cert), Some(key)) => {
                    Some((addr, fleet_operator::webhook::tls_config(&cert, &key)?))
                }
                _ => return Err(
                    "--webhook-listen, --webhook-cert and --webhook-key go together; see --help"
                        .into(),
                ),
            };
        Ok(Serving {
            webhook,
            dashboard: self.dashboard.options()?,
        })
    }
}

/// The dashboard's flags as given.
#[derive(Default)]
struct DashboardArgs {
    listen: Option<String>,
    token_file: Option<String>,
    fleetlock_url: Option<String>,
    fleetlock_token_file: Option<String>,
    fleetlock_ca_file: Option<String>,
    thresholds: fleet_operator::dashboard::alerts::Thresholds,
}

impl DashboardArgs {
    fn set(&mut self, flag: &str, v: String) -> Result<(), String> {
        let duration =
            |v: &str| humantime::parse_duration(v).map_err(|e| format!("{flag} {v:?}: {e}"));
        match flag {
            "--dashboard-listen" => self.listen = Some(v),
            "--dashboard-token-file" => self.token_file = Some(v),
            "--dashboard-fleetlock-url" => self.fleetlock_url = Some(v),
            "--dashboard-fleetlock-token-file" => self.fleetlock_token_file = Some(v),
            "--dashboard-fleetlock-ca-file" => self.fleetlock_ca_file = Some(v),
            "--alert-silent-after" => self.thresholds.silent_after = duration(&v)?,
            "--alert-slot-held-after" => self.thresholds.slot_held_after = duration(&v)?,
            "--alert-failed-run-for" => self.thresholds.failed_run_for = duration(&v)?,
            other => return Err(format!("unknown argument {other:?}")),
        }
        Ok(())
    }

    /// The alerts' and dashboard's options (`serve` is `None` when the dashboard is off: alerts run all the
    /// same); an error for an incomplete or unreadable set.
    fn options(self) -> Result<fleet_operator::dashboard::Options, String> {
        use fleet_operator::dashboard::{
            auth::Token, events::OwnPod, reboots::FleetLockSource, Serve,
        };
        let serve = match (self.listen, self.token_file) {
            (None, None) => None,
            (Some(listen), Some(t)) => Some(Serve {
                listen,
                token: Token::from_file(std::path::Path::new(&t))?,
            }),
            _ => {
                return Err(
                    "--dashboard-listen and --dashboard-token-file go together; see --help".into(),
                )
            }
        };
        let fleetlock = match self.fleetlock_url {
            None => None,
            Some(url) => Some(FleetLockSource {
                ca: Vec::new(),
                url,
                token: match self.fleetlock_token_file {
                    None => None,
                    Some(f) => Some(
                        std::fs::read_to_string(&f)
                            .map_err(|e| format!("--dashboard-fleetlock-token-file {f}: {e}"))?
                            .trim()
                            .to_owned(),
                    ),
                },
            }),
        };
        let fleetlock = match (fleetlock, self.fleetlock_ca_file) {
            (Some(src), Some(f)) => {
                let pem = std::fs::read(&f)
                    .map_err(|e| format!("--dashboard-fleetlock-ca-file {f}: {e}"))?;
                Some(
                    src.with_ca_pem(&pem)
                        .map_err(|e| format!("--dashboard-fleetlock-ca-file {f}: {e}"))?,
                )
            }
            (src, _) => src,
        };
        let env = |k: &str, default: &str| {
            std::env::var(k)
                .ok()
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| default.to_owned())
        };
        Ok(fleet_operator::dashboard::Options {
            serve,
            label_selector: std::env::var("FLEET_LABEL_SELECTOR")
                .ok()
                .filter(|s| !s.is_empty()),
            fleetlock,
            thresholds: self.thresholds,
            pod: OwnPod {
                name: env("POD_NAME", "fleet-operator"),
                namespace: env("POD_NAMESPACE", "default"),
            },
            instance: std::env::var("POD_NAME").ok(),
        })
    }
}

/// Parses the value `n` of the number flag `flag` and hands it to `set` (which checks its range).
fn number<T: std::str::FromStr>(flag: &str, n: &str) -> Result<T, String> {
    n.trim()
        .parse::<T>()
        .map_err(|_| format!("{flag} {n:?} is not a number"))
}
