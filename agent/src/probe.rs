//! `fleet-agent --self-test`: the candidate probe of the seed. It parses the real configuration, reaches Podman
//! when enabled, authenticates to NATS, opens the required buckets, reads the per-device keys, subscribes where the
//! live watch listens for its desired-state key (the key's subject, or with a device token its watch inbox) and reads
//! the key (a plain subscription and a direct get: no JetStream consumer), checks the updater socket and reads and
//! checks the desired state. No loops, no normal status or heartbeat, no workload mutation, no process lock (the
//! live agent holds it). Bounded to 4 minutes.

use crate::config::Config;
use crate::nats_kv::{Nats, Value};
use crate::podman::Podman;
use crate::updater::UpdaterClient;
use fleet_wire::kv::{self, AGENT_REQUIRED_BUCKETS};
use fleet_wire::limits::PROBE_TIMEOUT;
use fleet_wire::{BoundedText, DesiredState, SelfTestCheck, SelfTestReport};
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The check names, in order.
pub const CHECKS: [&str; 8] = [
    "config",
    "podman",
    "nats",
    "buckets",
    "device-keys",
    "watch",
    "updater-socket",
    "snapshot",
];

fn run_checks(config_path: &Path, tx: &mpsc::Sender<SelfTestCheck>) {
    let send = |name: &str, r: Result<(), String>| {
        let ok = r.is_ok();
        let _ = tx.send(SelfTestCheck {
            name: name.to_owned(),
            ok,
            error: r.err().map(BoundedText::lossy),
        });
        ok
    };
    let cfg = match Config::load(config_path) {
        Ok(c) => c,
        Err(e) => {
            send("config", Err(e.to_string()));
            return;
        }
    };
    send("config", Ok(()));
    if cfg.podman_enabled {
        let p = Podman::new(&cfg.podman_socket, cfg.podman_stop_timeout);
        if !send("podman", p.ping().map_err(|e| e.to_string())) {
            return;
        }
    }
    let nats = match Nats::connect(&cfg.nats, &format!("fleet-agent-probe {}", cfg.device_id)) {
        Ok(n) => n,
        Err(e) => {
            send("nats", Err(e.to_string()));
            return;
        }
    };
    send("nats", Ok(()));
    let kv = match nats.open_buckets(AGENT_REQUIRED_BUCKETS) {
        Ok(b) => b,
        Err(e) => {
            send("buckets", Err(e.to_string()));
            return;
        }
    };
    send("buckets", Ok(()));
    let key = kv::device_key(&cfg.device_id);
    let keys = [
        kv::DESIRED_STATE,
        kv::AGENT_UPGRADE_INTENT,
        kv::AGENT_UPGRADE_STATUS,
        kv::DEVICE_INFO,
    ];
    let read = keys.iter().try_for_each(|b| {
        kv.get(b, &key)
            .map(|_| ())
            .map_err(|e| format!("{b}/{key}: {e}"))
    });
    if !send("device-keys", read) {
        return;
    }
    let watch = kv
        .probe_watch(kv::DESIRED_STATE, &key)
        .map_err(|e| format!("watch of {}/{key}: {e}", kv::DESIRED_STATE));
    if !send("watch", watch) {
        return;
    }
    let updater = UpdaterClient::new(&cfg.updater_socket);
    if !send(
        "updater-socket",
        updater.status().map(|_| ()).map_err(|e| e.to_string()),
    ) {
        return;
    }
    let snapshot = kv
        .get(kv::DESIRED_STATE, &key)
        .map_err(|e| e.to_string())
        .and_then(|c| match c.value {
            Value::Absent => Ok(()),
            Value::Put(b) => serde_json::from_slice::<DesiredState>(&b)
                .map_err(|e| format!("desired state is invalid: {e}"))
                .and_then(|d| {
                    if d.device_id == cfg.device_id {
                        Ok(())
                    } else {
                        Err(format!("desired state is for device {}", d.device_id))
                    }
                }),
        });
    send("snapshot", snapshot);
}

/// Runs the probe within `limit` (the seed's 4 minutes unless a test asks for less) and returns the report.
pub fn self_test_within(config_path: &Path, limit: Duration) -> SelfTestReport {
    let (tx, rx) = mpsc::channel();
    let path = config_path.to_owned();
    let spawned = std::thread::Builder::new()
        .name("self-test".into())
        .spawn(move || run_checks(&path, &tx));
    let mut checks: Vec<SelfTestCheck> = Vec::new();
    if let Err(e) = spawned {
        checks.push(SelfTestCheck {
            name: "config".into(),
            ok: false,
            error: Some(BoundedText::lossy(format!("cannot start the probe: {e}"))),
        });
    }
    let deadline = Instant::now() + limit;
    while spawned_ok(&checks) {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(c) => checks.push(c),
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                // Name the check that was running when time ran out.
                let next = CHECKS
                    .iter()
                    .find(|n| !checks.iter().any(|c| c.name == **n) && **n != "podman")
                    .copied()
                    .unwrap_or("snapshot");
                checks.push(SelfTestCheck {
                    name: next.into(),
                    ok: false,
                    error: Some(BoundedText::lossy(format!(
                        "the probe did not finish within {limit:?}"
                    ))),
                });
                break;
            }
        }
    }
    let passed = !checks.is_empty()
        && checks.iter().all(|c| c.ok)
        && checks.last().is_some_and(|c| c.name == "snapshot");
    if !passed && checks.iter().all(|c| c.ok) {
        checks.push(SelfTestCheck {
            name: "probe".into(),
            ok: false,
            error: Some(BoundedText::lossy("the probe ended before every check ran")),
        });
    }
    SelfTestReport {
        version: crate::compiled_version(),
        passed,
        checks,
    }
}

fn spawned_ok(checks: &[SelfTestCheck]) -> bool {
    checks.iter().all(|c| c.ok)
}

/// Runs the probe with the seed's 4-minute bound.
pub fn self_test(config_path: &Path) -> SelfTestReport {
    self_test_within(config_path, PROBE_TIMEOUT)
}
