//! The NATS side of a whole fleet, as whole-device scenarios and the demo run it: by default with the fleet-auth
//! auth callout on (docs/auth.md) — nats-server with [`crate::nats::callout_config`], the real `fleet-auth`, and a
//! Zitadel stand-in ([`crate::zitadel`]: its JWKS, a token per device, the JWT-profile grant of machine users) — and
//! the services' own user (`admin`, an `auth_users` entry in the buckets' account). `FLEET_NATS_AUTH=off` starts the
//! plain server (no credentials) instead: one switch, so that every scenario takes the same path. Either way the
//! server requires TLS with a private CA by default (every client trusts [`FleetNats::ca_file`]);
//! `FLEET_NATS_TLS=off` starts it without TLS.

use crate::nats::callout_config;
use crate::nats_client;
use crate::token::{b64, URL};
use crate::zitadel::Zitadel;
pub use crate::zitadel::{MachineKeyFile, AUDIENCE, TOKEN_TTL};
use crate::{wait_for, NatsServer};
use ring::rand::{SecureRandom, SystemRandom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The switch: `FLEET_NATS_AUTH` = `callout` (the default) or `off`.
pub const SWITCH: &str = "FLEET_NATS_AUTH";
/// The services' own NATS user (listed in `auth_callout.auth_users`, account FLEET).
pub const ADMIN_USER: &str = "admin";

/// The TLS switch: `FLEET_NATS_TLS` = `on` (the default) or `off`.
pub const TLS_SWITCH: &str = "FLEET_NATS_TLS";

/// Whether the fleet's NATS server requires TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NatsTransport {
    /// TLS with a private CA (no plain connections); clients trust the CA, no client certificates required.
    Tls,
    /// Plain TCP.
    Plain,
}

impl NatsTransport {
    /// The transport `FLEET_NATS_TLS` selects (default [`NatsTransport::Tls`]); any other value fails the test.
    pub fn from_env() -> Self {
        match std::env::var(TLS_SWITCH).as_deref() {
            Err(_) | Ok("") | Ok("on") => Self::Tls,
            Ok("off") => Self::Plain,
            Ok(other) => panic!("{TLS_SWITCH}={other:?}: use `on` (the default) or `off`"),
        }
    }

    /// Starts a bare [`NatsServer`] (no auth) with this transport, for tests that need no fleet around it.
    pub fn start_server(self) -> NatsServer {
        match self {
            Self::Tls => NatsServer::start_tls(false),
            Self::Plain => NatsServer::start(),
        }
    }
}

/// How devices and services authenticate to the fleet's NATS server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NatsAuth {
    /// The auth callout: devices with tokens checked by fleet-auth, services as [`ADMIN_USER`].
    Callout,
    /// A plain server: nobody authenticates.
    Off,
}

impl NatsAuth {
    /// The mode `FLEET_NATS_AUTH` selects (default [`NatsAuth::Callout`]); any other value fails the test.
    pub fn from_env() -> Self {
        match std::env::var(SWITCH).as_deref() {
            Err(_) | Ok("") | Ok("callout") => Self::Callout,
            Ok("off") => Self::Off,
            Ok(other) => panic!("{SWITCH}={other:?}: use `callout` (the default) or `off`"),
        }
    }
}

/// A device's NATS token. Its `Debug` hides the value, so that it never reaches test output by accident.
#[derive(Clone)]
pub struct DeviceToken(String);

impl DeviceToken {
    /// The token's bytes (for the device's token file).
    pub fn as_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }

    /// The token itself (for a test asserting that it is absent from logs).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for DeviceToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DeviceToken(<redacted>)")
    }
}

/// The fleet's NATS server with its authentication (see the module's doc). Stopped on drop: fleet-auth and the
/// issuer first, then the server.
pub struct FleetNats {
    callout: Option<Callout>,
    server: NatsServer,
}

struct Callout {
    auth: Option<Child>,
    auth_log: PathBuf,
    nats_log: PathBuf,
    zitadel: Zitadel,
    admin_password: String,
    _dir: tempfile::TempDir,
}

impl FleetNats {
    /// Starts the server in the mode and transport the switches select; `fleet_auth` gives the fleet-auth binary
    /// (called only when the callout is on).
    pub fn start(fleet_auth: impl FnOnce() -> PathBuf) -> Self {
        Self::start_with(NatsAuth::from_env(), NatsTransport::from_env(), fleet_auth)
    }

    /// Starts the server in `mode` over `transport`.
    pub fn start_with(
        mode: NatsAuth,
        transport: NatsTransport,
        fleet_auth: impl FnOnce() -> PathBuf,
    ) -> Self {
        match mode {
            NatsAuth::Off => Self {
                callout: None,
                server: transport.start_server(),
            },
            NatsAuth::Callout => {
                let (server, callout) = Callout::start(&fleet_auth(), transport);
                Self {
                    callout: Some(callout),
                    server,
                }
            }
        }
    }

    /// The mode it runs in.
    pub fn mode(&self) -> NatsAuth {
        if self.callout.is_some() {
            NatsAuth::Callout
        } else {
            NatsAuth::Off
        }
    }

    /// `tls://127.0.0.1:<port>`, or `nats://…` without TLS (no credentials).
    pub fn url(&self) -> String {
        self.server.url()
    }

    /// Its transport.
    pub fn transport(&self) -> NatsTransport {
        if self.server.tls().is_some() {
            NatsTransport::Tls
        } else {
            NatsTransport::Plain
        }
    }

    /// The CA file every client must trust when the server requires TLS.
    pub fn ca_file(&self) -> Option<&Path> {
        self.server.ca_file()
    }

    /// The URL a device reaches the server at through `addr` (its relay): `tls://<addr>` when the server requires
    /// TLS (the server's certificate names 127.0.0.1, where relays listen), else `nats://<addr>`.
    pub fn url_at(&self, addr: std::net::SocketAddr) -> String {
        match self.transport() {
            NatsTransport::Tls => format!("tls://{addr}"),
            NatsTransport::Plain => format!("nats://{addr}"),
        }
    }

    /// The port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.server.port()
    }

    /// The server's PID.
    pub fn pid(&self) -> Option<u32> {
        self.server.pid()
    }

    /// fleet-auth's PID (none without the callout).
    pub fn auth_pid(&self) -> Option<u32> {
        self.callout
            .as_ref()
            .and_then(|c| c.auth.as_ref().map(Child::id))
    }

    /// The server itself.
    pub fn server(&self) -> &NatsServer {
        &self.server
    }

    /// Kills the server (SIGKILL) and starts it again on the same port with the same store: fleet-auth and every
    /// client have to reconnect by themselves.
    pub fn restart_server(&mut self) {
        self.server.start_again();
    }

    /// The URL a service (fleet-operator, `fleet-operator buckets`) connects with: its own user's credentials
    /// in it with the callout on. A secret: pass it by environment (`FLEET_NATS_URL`), never print it.
    pub fn service_url(&self) -> String {
        match &self.callout {
            Some(c) => format!(
                "{}://{ADMIN_USER}:{}@127.0.0.1:{}",
                match self.transport() {
                    NatsTransport::Tls => "tls",
                    NatsTransport::Plain => "nats",
                },
                c.admin_password,
                self.port()
            ),
            None => self.url(),
        }
    }

    /// The services' password (none without the callout); for tests asserting that it is absent from logs.
    pub fn service_password(&self) -> Option<&str> {
        self.callout.as_ref().map(|c| c.admin_password.as_str())
    }

    /// A blocking connection as the services' own user (the test playing the operator); fails the test if it
    /// cannot connect.
    pub fn connect(&self) -> nats_client::Connection {
        match &self.callout {
            Some(c) => nats_client::connect_user_ca(
                &self.url(),
                ADMIN_USER,
                &c.admin_password,
                self.ca_file(),
            ),
            None => self.server.connect(),
        }
    }

    /// A token for `device` (its `device_id` claim), valid for [`TOKEN_TTL`]; none without the callout.
    pub fn device_token(&self, device: &str) -> Option<DeviceToken> {
        let c = self.callout.as_ref()?;
        Some(DeviceToken(c.zitadel.mint(device, TOKEN_TTL)))
    }

    /// Registers a new machine user for `device` with the Zitadel stand-in and returns its key file (an RSA key
    /// made with the openssl command); the token endpoint then answers its JWT-profile grants with tokens for
    /// `device`. None without the callout.
    pub fn machine_key(&self, device: &str) -> Option<MachineKeyFile> {
        let c = self.callout.as_ref()?;
        Some(c.zitadel.register_machine(device))
    }

    /// How many tokens the token endpoint issued to `device`'s machine users.
    pub fn grants_issued(&self, device: &str) -> usize {
        self.callout
            .as_ref()
            .map_or(0, |c| c.zitadel.grants_issued(device))
    }

    /// The Zitadel stand-in's URL (`https://127.0.0.1:<port>`, `fleet-token`'s `issuer`) and port; none without
    /// the callout.
    pub fn zitadel(&self) -> Option<(String, u16)> {
        let c = self.callout.as_ref()?;
        Some((c.zitadel.url().to_string(), c.zitadel.port()))
    }

    /// The CA certificate (PEM) the Zitadel stand-in's certificate is issued by; none without the callout.
    pub fn zitadel_ca_pem(&self) -> Option<Vec<u8>> {
        let c = self.callout.as_ref()?;
        Some(c.zitadel.ca_pem())
    }

    /// fleet-auth's and nats-server's logs (empty without the callout), for failure messages: admissions and
    /// refusals with their reasons, never a token.
    pub fn auth_logs(&self) -> String {
        match &self.callout {
            Some(c) => format!(
                "--- fleet-auth ---\n{}\n--- nats-server ---\n{}",
                std::fs::read_to_string(&c.auth_log).unwrap_or_default(),
                std::fs::read_to_string(&c.nats_log).unwrap_or_default()
            ),
            None => String::new(),
        }
    }

    /// True when fleet-auth admitted a connection as `device` (always false without the callout).
    pub fn admitted(&self, device: &str) -> bool {
        self.callout.as_ref().is_some_and(|c| {
            std::fs::read_to_string(&c.auth_log)
                .unwrap_or_default()
                .contains(&format!(" as device {device}"))
        })
    }
}

impl Callout {
    fn start(fleet_auth: &Path, transport: NatsTransport) -> (NatsServer, Self) {
        let dir = tempfile::Builder::new()
            .prefix("fleet-callout-")
            .tempdir()
            .unwrap_or_else(|e| panic!("temp dir for the auth callout: {e}"));
        let rng = SystemRandom::new();
        let zitadel = Zitadel::start();

        let account = nkeys::KeyPair::new_account();
        let seed = account
            .seed()
            .unwrap_or_else(|e| panic!("account seed: {e}"));
        let passwords = crate::nats::CalloutPasswords {
            auth: password(&rng),
            admin: password(&rng),
            device_api: password(&rng),
            system: password(&rng),
        };
        let nats_log = dir.path().join("nats.log");
        let conf = write_private(
            dir.path(),
            "nats.conf",
            &callout_config(&nats_log, &account.public_key(), &passwords, None),
        );
        let conf = conf.display().to_string();
        let server = match transport {
            NatsTransport::Tls => NatsServer::start_tls_with_args(false, &["-c", &conf]),
            NatsTransport::Plain => NatsServer::start_with_args(&["-c", &conf]),
        };
        let nats_ca = server
            .ca_file()
            .map(|ca| format!("  ca_file: \"{}\"\n", ca.display()))
            .unwrap_or_default();
        let password_file = write_private(dir.path(), "auth-password", &passwords.auth);
        let api_password_file =
            write_private(dir.path(), "device-api-password", &passwords.device_api);
        let admin_password_file = write_private(dir.path(), "admin-password", &passwords.admin);
        let system_password_file = write_private(dir.path(), "system-password", &passwords.system);
        let seed_file = write_private(dir.path(), "issuer.nk", &seed);
        let config = write_private(
            dir.path(),
            "fleet-auth.yaml",
            &format!(
                "nats:\n  url: \"{url}\"\n  user: fleet-auth\n  password_file: \"{pw}\"\n{nats_ca}\
                 issuer_seed_file: \"{seed}\"\naccount: DEVICES\ndevice_api:\n  user: {api_user}\n  \
                 password_file: \"{api_pw}\"\n  fleet_user: admin\n  fleet_password_file: \"{admin_pw}\"\n\
                 flood_guard:\n  user: {guard_user}\n  password_file: \"{system_pw}\"\nzitadel:\n  issuer: \"{iss}\"\n  \
                 audience: \"{AUDIENCE}\"\n  jwks_url: \"{iss}/oauth/v2/keys\"\n  jwks_ca_file: \"{ca}\"\n",
                url = server.url(),
                pw = password_file.display(),
                api_user = crate::nats::DEVICE_API_USER,
                api_pw = api_password_file.display(),
                admin_pw = admin_password_file.display(),
                guard_user = crate::nats::FLOOD_GUARD_USER,
                system_pw = system_password_file.display(),
                seed = seed_file.display(),
                iss = zitadel.url(),
                ca = zitadel.ca_file().display(),
            ),
        );
        let auth_log = dir.path().join("fleet-auth.log");
        let log =
            std::fs::File::create(&auth_log).unwrap_or_else(|e| panic!("fleet-auth log: {e}"));
        let mut child = Command::new(fleet_auth)
            .arg("--config")
            .arg(&config)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", fleet_auth.display()));
        crate::kill_when_gone(&[child.id()]);
        let up = wait_for(Duration::from_secs(30), || {
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "fleet-auth exited at start-up with {status}:\n{}",
                    std::fs::read_to_string(&auth_log).unwrap_or_default()
                );
            }
            std::fs::read_to_string(&auth_log)
                .ok()?
                .contains("fleet-auth serving")
                .then_some(())
        });
        if up.is_none() {
            let _ = child.kill();
            panic!(
                "fleet-auth did not serve within 30 s:\n{}",
                std::fs::read_to_string(&auth_log).unwrap_or_default()
            );
        }
        let callout = Self {
            auth: Some(child),
            auth_log,
            nats_log,
            zitadel,
            admin_password: passwords.admin,
            _dir: dir,
        };
        (server, callout)
    }
}

impl Drop for Callout {
    fn drop(&mut self) {
        if let Some(mut c) = self.auth.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn password(rng: &SystemRandom) -> String {
    let mut b = [0u8; 18];
    rng.fill(&mut b)
        .unwrap_or_else(|e| panic!("random password: {e}"));
    b64(&b, URL)
}

/// Writes `text` to `dir/name` with mode 0600; its path.
pub(crate) fn write_private(dir: &Path, name: &str, text: &str) -> PathBuf {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join(name);
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(&path)
        .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    f.write_all(text.as_bytes())
        .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    path
}
