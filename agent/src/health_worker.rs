//! The health worker: one thread for every health check the agent runs (HTTP and TCP probes, and Podman's own
//! check where Podman's timer does not run it), whatever the number of workloads. It sleeps until the earliest
//! check is due ([`Schedule`]: checks due within a second run in the same wake-up), runs the due HTTP and TCP
//! probes as one batch (one `poll` for every answer) and then Podman's checks one after another, each bounded by
//! its timeout, and reports to the event loop only when what it found changed. A slow
//! probe never delays the event loop (upgrade relay, heartbeats, the drain), and no check adds a wake-up to the
//! event loop unless a container's health changed.

use crate::health::{Findings, How, Schedule, Target};
use crate::health_probe::Probe;
use crate::podman::Podman;
use fleet_wire::Timestamp;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Slack on top of a check's own timeout for the API call that runs Podman's check (Podman enforces the timeout).
const PODMAN_CHECK_SLACK: Duration = Duration::from_secs(5);

enum Msg {
    Targets(Vec<Target>),
    Stop,
}

/// A running health worker.
pub struct HealthWorker {
    tx: mpsc::Sender<Msg>,
    thread: Option<JoinHandle<()>>,
}

impl HealthWorker {
    /// Starts the worker; `changed` receives what it found (on the worker thread) whenever that changed.
    pub fn spawn(
        podman: Podman,
        changed: impl Fn(Findings) + Send + 'static,
    ) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("health".into())
            .spawn(move || run(&podman, &rx, &changed))?;
        Ok(Self {
            tx,
            thread: Some(thread),
        })
    }

    /// Replaces the containers checked (the caller sends only a changed list).
    pub fn set(&self, targets: Vec<Target>) {
        let _ = self.tx.send(Msg::Targets(targets));
    }

    /// Stops the worker without waiting for a check in progress (checks change nothing; the process may exit
    /// while one runs).
    pub fn finish(&mut self) {
        let _ = self.tx.send(Msg::Stop);
        self.thread.take();
    }
}

impl Drop for HealthWorker {
    fn drop(&mut self) {
        self.finish();
    }
}

fn run(podman: &Podman, rx: &mpsc::Receiver<Msg>, changed: &dyn Fn(Findings)) {
    let mut schedule = Schedule::default();
    let mut reported = Findings::new();
    let apply = |schedule: &mut Schedule, msg: Msg| -> bool {
        match msg {
            Msg::Targets(t) => {
                schedule.set(t, Instant::now(), Timestamp::now());
                true
            }
            Msg::Stop => false,
        }
    };
    loop {
        // A check whose state Podman keeps changes no finding, yet Podman's state changed: report it too.
        let mut podman_changed = false;
        let msg = match schedule.next_due() {
            Some(at) => rx.recv_timeout(at.saturating_duration_since(Instant::now())),
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        match msg {
            Ok(m) => {
                if !apply(&mut schedule, m) {
                    return;
                }
            }
            Err(RecvTimeoutError::Disconnected) => return,
            Err(RecvTimeoutError::Timeout) => {
                let due = schedule.due(Instant::now());
                // The agent's probes of this wake-up run as one batch (one poll for every answer); Podman's checks
                // after it, one at a time.
                let probes: Vec<(String, Probe)> = due.iter().filter_map(probe).collect();
                let results = crate::health_probe::batch(
                    &probes.iter().map(|(_, p)| p.clone()).collect::<Vec<_>>(),
                );
                for ((container, _), result) in probes.iter().zip(results) {
                    if let Err(e) = &result {
                        log::debug!("health check of container {container}: {e}");
                    }
                    schedule.record(container, result, Timestamp::now());
                }
                for t in due.iter().filter(|t| t.how == How::Podman) {
                    let result = podman_check(podman, t);
                    if let Err(e) = &result {
                        log::debug!("health check of {}: {e}", t.name.as_str());
                    }
                    podman_changed |= schedule.record(&t.container, result, Timestamp::now());
                    // A new list or a stop between two checks is taken at once.
                    while let Ok(m) = rx.try_recv() {
                        if !apply(&mut schedule, m) {
                            return;
                        }
                    }
                }
            }
        }
        let now = schedule.findings();
        if podman_changed || now != reported {
            reported = now.clone();
            changed(now);
        }
    }
}

/// The agent's probe of `t` (for the batch), with its container; `None` for a check Podman runs.
fn probe(t: &Target) -> Option<(String, Probe)> {
    let (host_port, path) = match &t.how {
        How::Http { host_port, path } => (*host_port, Some(path.clone())),
        How::Tcp { host_port } => (*host_port, None),
        How::Podman => return None,
    };
    Some((
        t.container.clone(),
        Probe {
            host_port,
            path,
            timeout: t.check.timeout(),
        },
    ))
}

/// Runs Podman's own check of `t` through the API.
fn podman_check(podman: &Podman, t: &Target) -> Result<(), String> {
    match podman.run_healthcheck(&t.container, t.check.timeout() + PODMAN_CHECK_SLACK) {
        Ok(true) => Ok(()),
        Ok(false) => Err("the check command failed".into()),
        Err(e) => Err(e.to_string()),
    }
}
