//! kube-controller-manager beside the local cluster's API server, so that what a real cluster collects is
//! collected here too: a TaskRun owned by a TaskSchedule goes with it (the garbage collector), and a deleted
//! namespace is emptied (the namespace controller). Only those two controllers run: the others manage Pods,
//! Nodes and the like, which this cluster has none of.

use crate::builds;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The controllers started (`--controllers`).
pub const CONTROLLERS: &str = "garbagecollector,namespace";

/// How long the garbage collector may take to watch every resource (about 2 s on an idle 2-core machine).
const SYNC_TIMEOUT: Duration = Duration::from_secs(90);

/// What the garbage collector logs once it watches every resource and collects.
const SYNCED: &str = "all resource monitors have synced";

/// A running kube-controller-manager; killed on drop (and by a watchdog once the test process is gone).
pub struct ControllerManager {
    child: Child,
    log: std::path::PathBuf,
}

impl ControllerManager {
    /// Starts it with `kubeconfig` (its own credentials for every controller: no service-account tokens, which
    /// this cluster does not issue), listening on no port at all, and waits until the garbage collector watches
    /// every resource served then, the CRDs included. Its log goes to `log`.
    pub fn start(kubeconfig: &Path, log: &Path) -> Self {
        let bin = builds::kube_controller_manager();
        let out = std::fs::File::create(log)
            .unwrap_or_else(|e| panic!("kube-controller-manager log {}: {e}", log.display()));
        let err = out
            .try_clone()
            .unwrap_or_else(|e| panic!("kube-controller-manager log: {e}"));
        let child = Command::new(&bin)
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .args([
                &format!("--controllers={CONTROLLERS}"),
                "--use-service-account-credentials=false",
                "--leader-elect=false",
                // No health or metrics endpoint: nothing listens, on loopback or elsewhere.
                "--bind-address=127.0.0.1",
                "--secure-port=0",
                "--port=0",
                "--v=1",
            ])
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", bin.display()));
        fleet_rig::kill_when_gone(&[child.id()]);
        let mut cm = Self {
            child,
            log: log.to_path_buf(),
        };
        let deadline = Instant::now() + SYNC_TIMEOUT;
        loop {
            if let Ok(Some(st)) = cm.child.try_wait() {
                panic!(
                    "kube-controller-manager exited with {st}:\n{}",
                    cm.log_tail(20)
                );
            }
            if std::fs::read_to_string(&cm.log)
                .unwrap_or_default()
                .contains(SYNCED)
            {
                return cm;
            }
            assert!(
                Instant::now() < deadline,
                "kube-controller-manager's garbage collector did not sync within {SYNC_TIMEOUT:?}:\n{}",
                cm.log_tail(20)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Its PID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for ControllerManager {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
