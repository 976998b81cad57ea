//! The real `fleetlock-server` on a free loopback port with a file store in a temporary directory (one slot in
//! group `default`), for a local fleet. Killed on drop.

use crate::builds;
use fleet_rig::{free_port, wait_for};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A running fleetlock-server.
pub struct FleetLockServer {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    token: String,
}

impl FleetLockServer {
    /// Starts the server, requiring a fresh random bearer token from clients (as the package does), and waits
    /// until `/healthz` answers.
    pub fn start() -> Self {
        Self::start_with_token(&fleet_rig::random_hex())
    }

    /// Starts the server, requiring the bearer `token` from clients.
    pub fn start_with_token(token: &str) -> Self {
        let bin = builds::fleetlock_server();
        let dir = tempfile::Builder::new()
            .prefix("fleetlock-")
            .tempdir()
            .unwrap_or_else(|e| panic!("temp dir for fleetlock-server: {e}"));
        let config = dir.path().join("config.yaml");
        let store = dir.path().join("store");
        std::fs::write(
            &config,
            format!(
                "default_slots: 1\nstore: {{kind: file, dir: \"{}\"}}\nauth: {{tokens: [\"{token}\"]}}\n",
                store.display(),
            ),
        )
        .unwrap_or_else(|e| panic!("fleetlock config: {e}"));
        let port = free_port();
        let log = std::fs::File::create(dir.path().join("fleetlock.log"))
            .unwrap_or_else(|e| panic!("fleetlock log: {e}"));
        let child = Command::new(&bin)
            // Plain HTTP on loopback (relayed into guests): these tests are about reboot coordination; HTTPS is
            // covered by the operator's fleetlock_protocol tests.
            .args([
                "--plain-http",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--config",
            ])
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", bin.display()));
        fleet_rig::kill_when_gone(&[child.id()]);
        let s = Self {
            child: Some(child),
            port,
            dir,
            token: token.to_owned(),
        };
        let up = wait_for(Duration::from_secs(30), || {
            (s.get("/healthz").as_deref() == Some("ok")).then_some(())
        });
        assert!(up.is_some(), "fleetlock-server did not answer /healthz");
        s
    }

    /// Its port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its PID while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `GET <path>`: the trimmed body of a 2xx answer.
    pub fn get(&self, path: &str) -> Option<String> {
        let out = Command::new("curl")
            .args(["-sf", "--max-time", "5"])
            .arg(format!("http://127.0.0.1:{}{path}", self.port))
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    }
}

impl FleetLockServer {
    /// The bearer token its clients send.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The ids holding a slot of group `default` now.
    pub fn holder_ids(&self) -> Vec<String> {
        crate::tasks::holder_ids_at(self.port, &self.token)
    }

    /// How many ids hold a slot of group `default` now.
    pub fn holders(&self) -> usize {
        self.holder_ids().len()
    }

    /// The guest configuration for `fleet-reboot` and the updater's reboots: this server, group `default`.
    pub fn client_config(&self) -> String {
        crate::tasks::fleetlock_client_config(self.port, &self.token)
    }

    /// Gives `cluster`'s operator this server for its dashboard's Reboots page and FleetLock alerts
    /// (`--dashboard-fleetlock-url` and a file with the client token, as docs/dashboard.md has it): the operator is
    /// started again with them, and this waits until its webhook answers again. Returns the operator's new PID.
    pub fn show_on_dashboard(&self, cluster: &crate::cluster::Cluster) -> u32 {
        let token = self.dir.path().join("dashboard-client-token");
        std::fs::write(&token, &self.token)
            .unwrap_or_else(|e| panic!("write {}: {e}", token.display()));
        let pid = cluster.kill_operator_and_restart_with(&[
            "--dashboard-fleetlock-url",
            &format!("http://127.0.0.1:{}", self.port),
            "--dashboard-fleetlock-token-file",
            &token.to_string_lossy(),
        ]);
        cluster.wait_webhooks_ready();
        pid
    }

    /// The server's log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("fleetlock.log")).unwrap_or_default()
    }
}

impl Drop for FleetLockServer {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
