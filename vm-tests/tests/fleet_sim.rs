//! `fleet-sim` against a real nats-server with the layout's buckets: its devices publish device info and
//! heartbeats, answer a desired state with a workload status, an agent-upgrade intent with statuses up to
//! `complete` and device info at the new version (or `failed` on a failing device), and a system-upgrade intent
//! with `accepted` then `succeeded` and the first heartbeat after it. With `--token-dir`, each device on a
//! connection of its own through the real fleet-auth: its keys written through the device API, a desired state
//! heard of through the device API's notices, and every device back by itself after nats-server restarts. Waits
//! are bounds on failure only.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use fleet_rig::callout::{FleetNats, NatsAuth, NatsTransport};
use fleet_rig::nats_client::buckets::create_buckets;
use fleet_rig::{eventually, NatsServer};
use fleet_wire::{
    fixtures, AgentUpgradeStatus, Architecture, DeviceId, DeviceInfo, DeviceWorkloadStatus,
    SystemUpgradePhase, SystemUpgradeStatus, Timestamp, UpgradePhase, WorkloadState,
};
use std::time::Duration;

/// How long each wait of these tests may take.
const WAIT: Duration = Duration::from_secs(60);

struct Sim(std::process::Child);
impl Sim {
    /// SIGTERM, as a service manager stops it: it must exit with success. Everything it printed.
    fn stop(&mut self) -> String {
        let killed = std::process::Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status()
            .unwrap();
        assert!(killed.success());
        let text = std::io::read_to_string(self.0.stdout.take().unwrap()).unwrap();
        let status = self.0.wait().unwrap();
        assert!(status.success(), "fleet-sim exited with {status}:\n{text}");
        text
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn simulated_devices_write_what_the_agent_writes() {
    let nats = NatsServer::start();
    let conn = nats.connect();
    let names: Vec<&str> = fleet_wire::kv::BUCKETS.iter().map(|b| b.name).collect();
    create_buckets(&conn, &names);
    let js = fleet_rig::nats_client::jetstream::new(conn.clone());
    let kv = |b: &str| js.key_value(b).unwrap();
    // Four devices on two connections; a quarter failing is device 3.
    let mut sim = Sim(std::process::Command::new(env!("CARGO_BIN_EXE_fleet-sim"))
        .args([
            "--devices",
            "4",
            "--connections",
            "2",
            "--nats-url",
            &nats.url(),
        ])
        .args([
            "--fail-fraction",
            "0.25",
            "--heartbeat-secs",
            "1",
            "--status-secs",
            "1",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start fleet-sim"));
    let (info, beats) = (
        kv(fleet_wire::kv::DEVICE_INFO),
        kv(fleet_wire::kv::DEVICE_HEARTBEAT),
    );
    for i in 0..4 {
        let id = format!("sim-{i:06}");
        let got: DeviceInfo = eventually("device info", WAIT, || {
            info.get(&id)
                .unwrap()
                .map(|v| serde_json::from_slice(&v).unwrap())
        });
        assert_eq!(got.device_id.as_str(), id);
        assert_eq!(got.agent_version.as_str(), "1.0.0");
        eventually("a heartbeat", WAIT, || beats.get(&id).unwrap());
    }

    // A desired state → a workload status of its generation.
    let dev1 = DeviceId::try_from("sim-000001").unwrap();
    let mut desired = fixtures::desired_state();
    desired.device_id = dev1.clone();
    kv(fleet_wire::kv::DESIRED_STATE)
        .put(dev1.as_str(), serde_json::to_vec(&desired).unwrap())
        .unwrap();
    let statuses = kv(fleet_wire::kv::WORKLOAD_STATUS);
    let ws: DeviceWorkloadStatus = eventually("workload status", WAIT, || {
        let v = statuses.get(dev1.as_str()).unwrap()?;
        let s: DeviceWorkloadStatus = serde_json::from_slice(&v).unwrap();
        (s.generation == desired.generation).then_some(s)
    });
    assert_eq!(ws.workloads.len(), 1);
    assert_eq!(ws.workloads[0].state, WorkloadState::Running);

    // An agent-upgrade intent → complete and device info at the target; on the failing device → failed.
    let intents = kv(fleet_wire::kv::AGENT_UPGRADE_INTENT);
    let upgrades = kv(fleet_wire::kv::AGENT_UPGRADE_STATUS);
    for (dev, end) in [
        ("sim-000001", UpgradePhase::Complete),
        ("sim-000003", UpgradePhase::Failed),
    ] {
        let mut a = fixtures::attempt();
        a.device_id = DeviceId::try_from(dev).unwrap();
        a.architecture = Architecture::Amd64;
        intents.put(dev, serde_json::to_vec(&a).unwrap()).unwrap();
        let s: AgentUpgradeStatus = eventually("a terminal agent-upgrade status", WAIT, || {
            let s: AgentUpgradeStatus =
                serde_json::from_slice(&upgrades.get(dev).unwrap()?).unwrap();
            s.phase.is_terminal().then_some(s)
        });
        assert_eq!(s.phase, end, "{dev}");
        assert_eq!(s.attempt_id, Some(a.attempt_id));
        assert_eq!(s.transitions.phases()[0], UpgradePhase::Preparing);
        if end == UpgradePhase::Complete {
            eventually("device info at the new version", WAIT, || {
                let i: DeviceInfo = serde_json::from_slice(&info.get(dev).unwrap()?).unwrap();
                (i.agent_version == a.target_version).then_some(())
            });
        }
    }

    // A system-upgrade intent → accepted, succeeded, then the first heartbeat after it.
    let mut run = fixtures::system_attempt();
    run.device_id = DeviceId::try_from("sim-000002").unwrap();
    run.expires_at = Timestamp::from_unix_ms(Timestamp::now().unix_ms() + 3_600_000);
    let key = format!("sim-000002.{}", run.run_uid);
    kv(fleet_wire::kv::SYSTEM_UPGRADE_INTENT)
        .put(&key, serde_json::to_vec(&run).unwrap())
        .unwrap();
    let runs = kv(fleet_wire::kv::SYSTEM_UPGRADE_STATUS);
    let s: SystemUpgradeStatus =
        eventually("succeeded, with the first heartbeat after it", WAIT, || {
            let s: SystemUpgradeStatus = serde_json::from_slice(&runs.get(&key).unwrap()?).unwrap();
            s.first_heartbeat_after_completion.is_some().then_some(s)
        });
    assert_eq!(s.phase, SystemUpgradePhase::Succeeded);
    assert_eq!(
        s.transitions.phases(),
        [SystemUpgradePhase::Accepted, SystemUpgradePhase::Succeeded]
    );

    // SIGTERM: it stops, printing its counters with no error.
    let text = sim.stop();
    let last = text.lines().last().unwrap_or("");
    assert!(
        last.contains(" errors=0 ") && last.contains(" bad=0 "),
        "{last}"
    );
}

/// A token for each of `n` devices (`sim-000000` …) in a new dir, as an enrolled device holds its own, and the
/// command that runs them with `bin` (fleet-sim), each on its own connection through the callout (TLS when the
/// fleet has a CA), with a heartbeat and a workload status every `interval_secs`.
fn token_sim(
    fleet: &FleetNats,
    bin: impl AsRef<std::ffi::OsStr>,
    n: usize,
    interval_secs: u64,
) -> (tempfile::TempDir, std::process::Command) {
    let tokens = tempfile::tempdir().unwrap();
    for i in 0..n {
        let id = format!("sim-{i:06}");
        let token = fleet
            .device_token(&id)
            .expect("a token with the callout on");
        std::fs::write(tokens.path().join(&id), token.as_bytes()).unwrap();
    }
    // The URL carries no credentials: a device can only get in with its token.
    let interval = interval_secs.to_string();
    let mut cmd = std::process::Command::new(bin);
    cmd.args(["--devices", &n.to_string(), "--connections", "2"])
        .args(["--nats-url", &fleet.url()])
        .arg("--token-dir")
        .arg(tokens.path())
        .args(["--heartbeat-secs", &interval, "--status-secs", &interval]);
    if let Some(ca) = fleet.ca_file() {
        cmd.arg("--ca-file").arg(ca);
    }
    (tokens, cmd)
}

/// The value of `name=` on a counter line.
fn field<'a>(line: &'a str, name: &str) -> &'a str {
    line.split_whitespace()
        .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("no {name}= in {line}"))
}

#[test]
fn simulated_devices_connect_with_their_own_tokens_through_fleet_auth() {
    // TLS as the rig's switch says (on by default): the simulator trusts the server's CA.
    let mut fleet = FleetNats::start_with(
        NatsAuth::Callout,
        NatsTransport::from_env(),
        fleet_vm_tests::builds::fleet_auth,
    );
    let conn = fleet.connect();
    let names: Vec<&str> = fleet_wire::kv::BUCKETS.iter().map(|b| b.name).collect();
    create_buckets(&conn, &names);
    let n = 3;
    let (_tokens, mut cmd) = token_sim(&fleet, env!("CARGO_BIN_EXE_fleet-sim"), n, 1);
    let mut sim = Sim(cmd
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start fleet-sim"));
    let js = fleet_rig::nats_client::jetstream::new(conn.clone());
    let kv = |b: &str| js.key_value(b).unwrap();
    let (info, beats, statuses) = (
        kv(fleet_wire::kv::DEVICE_INFO),
        kv(fleet_wire::kv::DEVICE_HEARTBEAT),
        kv(fleet_wire::kv::WORKLOAD_STATUS),
    );
    let heartbeat = |id: &str| -> Option<fleet_wire::Heartbeat> {
        beats
            .get(id)
            .ok()?
            .map(|v| serde_json::from_slice(&v).unwrap())
    };
    for i in 0..n {
        let id = format!("sim-{i:06}");
        let got: DeviceInfo = eventually("device info", WAIT, || {
            info.get(&id)
                .unwrap()
                .map(|v| serde_json::from_slice(&v).unwrap())
        });
        assert_eq!(got.device_id.as_str(), id);
        eventually("a first workload status", WAIT, || {
            statuses.get(&id).unwrap()
        });
        let h = eventually("a heartbeat", WAIT, || heartbeat(&id));
        assert_eq!(h.device_id.as_str(), id);
        assert!(
            fleet.admitted(&id),
            "fleet-auth admitted no connection as {id}:\n{}",
            fleet.auth_logs()
        );
    }

    // A desired state, which a device hears of only through the device API's notice to its own inbox → a
    // workload status of its generation.
    let dev1 = DeviceId::try_from("sim-000001").unwrap();
    let mut desired = fixtures::desired_state();
    desired.device_id = dev1.clone();
    kv(fleet_wire::kv::DESIRED_STATE)
        .put(dev1.as_str(), serde_json::to_vec(&desired).unwrap())
        .unwrap();
    eventually(
        "a workload status of the desired state's generation",
        WAIT,
        || {
            let v = statuses.get(dev1.as_str()).ok()??;
            let s: DeviceWorkloadStatus = serde_json::from_slice(&v).unwrap();
            (s.generation == desired.generation).then_some(())
        },
    );

    // nats-server killed and started again: every device connects again by itself (through fleet-auth, which
    // reconnects too) and its heartbeats go on.
    let before: Vec<u64> = (0..n)
        .map(|i| heartbeat(&format!("sim-{i:06}")).unwrap().sequence)
        .collect();
    let restarted = Timestamp::now();
    fleet.restart_server();
    for (i, seq) in before.iter().enumerate() {
        let id = format!("sim-{i:06}");
        eventually("a heartbeat after the restart", WAIT, || {
            heartbeat(&id).filter(|h| h.sequence > *seq && h.at.unix_ms() > restarted.unix_ms())
        });
    }

    let text = sim.stop();
    let last = text
        .lines()
        .rfind(|l| l.starts_with("fleet-sim t="))
        .unwrap_or("");
    // One connection per device, each admitted again after the restart; none refused.
    assert_eq!(field(last, "connected"), format!("{n}/{n}"), "{last}");
    assert_eq!(field(last, "connects"), (2 * n).to_string(), "{last}");
    assert_eq!(field(last, "reconnects"), n.to_string(), "{last}");
    assert_eq!(field(last, "refused"), "0", "{last}");
    assert_eq!(field(last, "back"), n.to_string(), "{last}");
    assert_eq!(text.matches("fleet-sim back sim-").count(), n, "{text}");
    assert_eq!(field(last, "bad"), "0", "{last}");
    let acked: u64 = field(last, "acked").parse().unwrap();
    assert!(acked >= 3 * n as u64, "{last}");
}

/// The `--token-dir` mode at a small fleet's size: 50 devices on two I/O threads, each on its own TLS connection
/// (as the rig's switch says) with its own token through the real fleet-auth: every device admitted, its device
/// info, first workload status and first heartbeat written through the device API and acknowledged, and a
/// desired state to every device heard of through its notice and answered with a workload status of its
/// generation.
#[test]
fn fifty_devices_on_their_own_connections_through_fleet_auth() {
    let fleet = FleetNats::start_with(
        NatsAuth::Callout,
        NatsTransport::from_env(),
        fleet_vm_tests::builds::fleet_auth,
    );
    let conn = fleet.connect();
    let names: Vec<&str> = fleet_wire::kv::BUCKETS.iter().map(|b| b.name).collect();
    create_buckets(&conn, &names);
    let n = 50;
    let ids: Vec<String> = (0..n).map(|i| format!("sim-{i:06}")).collect();
    // One heartbeat and one workload status per device at start; the next ones an hour later at the earliest
    // (spread over the interval), so the counters below are those of the start.
    let (_tokens, mut cmd) = token_sim(&fleet, env!("CARGO_BIN_EXE_fleet-sim"), n, 3600);
    let mut sim = Sim(cmd
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start fleet-sim"));
    let js = fleet_rig::nats_client::jetstream::new(conn.clone());
    let kv = |b: &str| js.key_value(b).unwrap();
    let (info, beats, statuses) = (
        kv(fleet_wire::kv::DEVICE_INFO),
        kv(fleet_wire::kv::DEVICE_HEARTBEAT),
        kv(fleet_wire::kv::WORKLOAD_STATUS),
    );
    for id in &ids {
        eventually("device info", WAIT, || info.get(id).unwrap());
        eventually("a first workload status", WAIT, || {
            statuses.get(id).unwrap()
        });
        let h: fleet_wire::Heartbeat = eventually("a heartbeat", WAIT, || {
            beats
                .get(id)
                .unwrap()
                .map(|v| serde_json::from_slice(&v).unwrap())
        });
        assert_eq!(h.device_id.as_str(), id);
    }
    let logs = fleet.auth_logs();
    for id in &ids {
        assert!(
            logs.contains(&format!(" as device {id}")),
            "fleet-auth admitted no connection as {id}:\n{logs}"
        );
    }

    // A desired state to every device → a workload status of its generation from each.
    let desired_kv = kv(fleet_wire::kv::DESIRED_STATE);
    let mut desired = fixtures::desired_state();
    for id in &ids {
        desired.device_id = DeviceId::try_from(id.as_str()).unwrap();
        desired_kv
            .put(id, serde_json::to_vec(&desired).unwrap())
            .unwrap();
    }
    for id in &ids {
        eventually(
            "a workload status of the desired state's generation",
            WAIT,
            || {
                let v = statuses.get(id).ok()??;
                let s: DeviceWorkloadStatus = serde_json::from_slice(&v).unwrap();
                (s.generation == desired.generation).then_some(())
            },
        );
    }

    let text = sim.stop();
    let last = text
        .lines()
        .rfind(|l| l.starts_with("fleet-sim t="))
        .unwrap_or("");
    assert_eq!(field(last, "connected"), format!("{n}/{n}"), "{last}");
    assert_eq!(field(last, "connects"), n.to_string(), "{last}");
    assert_eq!(field(last, "refused"), "0", "{last}");
    assert_eq!(field(last, "errors"), "0", "{last}");
    assert_eq!(field(last, "bad"), "0", "{last}");
    // sent/acked/errors: every device's info and first heartbeat acknowledged; its first workload status and
    // its answer to the desired state too.
    assert_eq!(field(last, "info"), format!("{n}/{n}/0"), "{last}");
    let hb: Vec<u64> = field(last, "hb")
        .split('/')
        .map(|x| x.parse().unwrap())
        .collect();
    assert!(hb[1] >= n as u64 && hb[2] == 0, "{last}");
    let wl: Vec<u64> = field(last, "wl")
        .split('/')
        .map(|x| x.parse().unwrap())
        .collect();
    assert!(wl[1] >= 2 * n as u64 && wl[2] == 0, "{last}");
}

/// A /proc/<pid>/status field's number (`VmRSS:` in KiB, `Threads:`).
fn proc_status(pid: u32, name: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// CPU seconds a process has used (user and system, from /proc/<pid>/stat).
fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(") ").map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = f.get(11).and_then(|u| u.parse().ok()).unwrap_or(0)
        + f.get(12).and_then(|s| s.parse().ok()).unwrap_or(0);
    ticks as f64 / 100.0
}

/// What one simulated device of the `--token-dir` mode costs: `FLEET_SIM_COST_DEVICES` devices (1,000 by
/// default) on two I/O threads, each on its own connection (TLS as the rig's switch says) through the real
/// fleet-auth, heartbeat and workload status every 30 s. Prints the time until all are admitted and subscribed,
/// then, 20 s later, fleet-sim's memory, file descriptors, threads and CPU over those 20 s, nats-server's memory,
/// fleet-auth's memory and CPU. A measurement, not a check: `cargo test -p fleet-vm-tests --test fleet_sim -- --ignored --nocapture
/// cost` (`FLEET_AUTH_BIN`, `FLEET_SIM_BIN`: release builds to measure instead).
#[test]
#[ignore = "a measurement: thousands of connections"]
fn cost_of_a_device_on_its_own_connection() {
    let n: usize = std::env::var("FLEET_SIM_COST_DEVICES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    // `FLEET_AUTH_BIN`, `FLEET_SIM_BIN`: other builds (a release build) of fleet-auth and fleet-sim.
    let fleet = FleetNats::start_with(NatsAuth::Callout, NatsTransport::from_env(), || {
        std::env::var_os("FLEET_AUTH_BIN")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(fleet_vm_tests::builds::fleet_auth)
    });
    let conn = fleet.connect();
    let names: Vec<&str> = fleet_wire::kv::BUCKETS.iter().map(|b| b.name).collect();
    create_buckets(&conn, &names);
    let sim_bin =
        std::env::var_os("FLEET_SIM_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_fleet-sim").into());
    let (_tokens, mut cmd) = token_sim(&fleet, sim_bin, n, 30);
    let (auth, server) = (fleet.auth_pid().unwrap(), fleet.pid().unwrap());
    let (auth_cpu0, server_rss0) = (cpu_secs(auth), proc_status(server, "VmRSS:"));
    let started = std::time::Instant::now();
    let mut sim = Sim(cmd
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start fleet-sim"));
    let pid = sim.0.id();
    let out = std::io::BufReader::new(sim.0.stdout.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in std::io::BufRead::lines(out).map_while(Result::ok) {
            if l.starts_with("fleet-sim all connected") || l.starts_with("fleet-sim t=") {
                let _ = tx.send(l);
            }
        }
    });
    let deadline = started + Duration::from_secs(600);
    let mut last = String::new();
    let admitted = loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) if l.starts_with("fleet-sim all connected") => {
                break field(&l, "after_ms").to_owned()
            }
            Ok(l) => last = l,
            Err(_) => panic!("not all {n} devices connected within 600 s; last: {last}"),
        }
    };
    let auth_cpu_admission = cpu_secs(auth) - auth_cpu0;
    let (auth_cpu1, sim_cpu1) = (cpu_secs(auth), cpu_secs(pid));
    // why: the steady-state window whose CPU and memory the measurement reads (the window is the measurement)
    std::thread::sleep(Duration::from_secs(20));
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count();
    let rss = proc_status(pid, "VmRSS:");
    println!(
        "fleet-sim cost devices={n} all_admitted_ms={admitted} sim_rss_mib={:.1} sim_rss_kib_per_device={:.1} \
         sim_fds={fds} sim_threads={} nats_rss_mib={:.1} nats_rss_kib_per_device={:.1} auth_rss_mib={:.1} \
         auth_cpu_s_admission={auth_cpu_admission:.1} auth_cpu_pct_steady={:.1} sim_cpu_pct_steady={:.1}",
        rss as f64 / 1024.0,
        rss as f64 / n as f64,
        proc_status(pid, "Threads:"),
        proc_status(server, "VmRSS:") as f64 / 1024.0,
        (proc_status(server, "VmRSS:").saturating_sub(server_rss0)) as f64 / n as f64,
        proc_status(auth, "VmRSS:") as f64 / 1024.0,
        (cpu_secs(auth) - auth_cpu1) / 20.0 * 100.0,
        (cpu_secs(pid) - sim_cpu1) / 20.0 * 100.0,
    );
    let _ = rx.try_iter().last().map(|l| println!("{l}"));
}
