//! The reconnect storm with fleet-sim's devices (`auth_bench --storm-sim N`): N simulated devices, each on a
//! connection of its own with its own token through fleet-auth (`fleet-sim --token-dir`: writes through the device
//! API, notices on its own inbox, reconnecting by itself after 1 to 3 s drawn at random, as fleet-agent does). Once
//! every device has a heartbeat stored, nats-server is killed and started again on the same port and store. A device is
//! back when fleet-sim prints that a heartbeat of it was acknowledged on a new connection; the row also says when
//! fleet-auth had admitted every device again (its log), how many connection attempts the server refused in the
//! storm (must be none; those at the first connection, all devices at once too, are shown apart), and fleet-auth's
//! memory.

use crate::auth_common::{claims, SignKey, Stack};
use crate::{admitted, pct, rss_mib};
use std::collections::HashMap;
use std::io::BufRead;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long each phase may take before the row says "not within".
const LIMIT: Duration = Duration::from_secs(180);
/// The simulated devices' heartbeat interval: a device's first heartbeat after reconnecting is due within it (the
/// agent does not send one on reconnecting), so it bounds how much of "back" is waiting for the schedule.
pub const HEARTBEAT_SECS: u64 = 10;
/// Driver threads of fleet-sim (each device still has its own connection).
const DRIVERS: usize = 8;

/// What fleet-sim printed: when each device's "back" line arrived, when each refusal's line did, and its latest
/// counter line.
#[derive(Default)]
struct Output {
    back: HashMap<usize, Instant>,
    refused: Vec<Instant>,
    last: String,
}

/// `FLEET_SIM_BIN`, else the `fleet-sim` of the same build as this example (`target/<profile>/fleet-sim`).
fn sim_bin() -> PathBuf {
    let bin = std::env::var_os("FLEET_SIM_BIN")
        .map(PathBuf::from)
        .or_else(|| {
            let exe = std::env::current_exe().ok()?;
            Some(exe.parent()?.parent()?.join("fleet-sim"))
        })
        .expect("FLEET_SIM_BIN is not set and this example's directory is unknown");
    assert!(
        bin.is_file(),
        "{} is missing: cargo build --release -p fleet-vm-tests --bin fleet-sim (or set FLEET_SIM_BIN)",
        bin.display()
    );
    bin
}

/// The value of `name=` on fleet-sim's counter line (empty when absent).
fn field<'a>(line: &'a str, name: &str) -> &'a str {
    line.split_whitespace()
        .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
        .unwrap_or("")
}

/// Polls `check` every 100 ms (the log and the KV are read each time: not every 20 ms during the storm) for at
/// most [`LIMIT`].
fn poll<T>(mut check: impl FnMut() -> Option<T>) -> Option<T> {
    let end = Instant::now() + LIMIT;
    loop {
        if let Some(v) = check() {
            return Some(v);
        }
        if Instant::now() >= end {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// fleet-sim running `devices` devices against `stack`, each on a connection of its own with its own token.
pub struct Sim {
    child: std::process::Child,
    out: Arc<Mutex<Output>>,
    reader: std::thread::JoinHandle<()>,
    _tokens: tempfile::TempDir,
    /// How long until every device had a heartbeat stored (none: not within [`LIMIT`]).
    pub first: Option<Duration>,
}

impl Sim {
    /// Starts fleet-sim and waits until every device has a heartbeat stored.
    pub fn start(stack: &Stack, key: &SignKey, devices: usize) -> Self {
        let admin = stack.admin();
        let names: Vec<&str> = fleet_wire::kv::BUCKETS.iter().map(|b| b.name).collect();
        fleet_rig::nats_client::create_buckets(&admin, &names);
        let tokens = tempfile::tempdir().unwrap();
        for i in 0..devices {
            let id = format!("sim-{i:06}");
            std::fs::write(tokens.path().join(&id), key.sign(&claims(&id, 3600))).unwrap();
        }
        let opening = Instant::now();
        let mut child = Command::new(sim_bin())
            .args(["--devices", &devices.to_string()])
            .args(["--connections", &DRIVERS.to_string()])
            .args(["--nats-url", &stack.nats.url()])
            .arg("--token-dir")
            .arg(tokens.path())
            .args(["--heartbeat-secs", &HEARTBEAT_SECS.to_string()])
            .stdout(Stdio::piped())
            .spawn()
            .expect("start fleet-sim");
        let out = Arc::new(Mutex::new(Output::default()));
        let reader = {
            let (out, stdout) = (out.clone(), child.stdout.take().unwrap());
            // Read without pause: a full pipe would stall fleet-sim's threads.
            std::thread::spawn(move || {
                for line in std::io::BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    let mut o = out.lock().unwrap();
                    if let Some(rest) = line.strip_prefix("fleet-sim back sim-") {
                        if let Some(i) = rest.split(' ').next().and_then(|i| i.parse().ok()) {
                            o.back.entry(i).or_insert_with(Instant::now);
                        }
                    } else if line.starts_with("fleet-sim refused ") {
                        o.refused.push(Instant::now());
                    } else if line.starts_with("fleet-sim t=") {
                        o.last = line;
                    }
                }
            })
        };
        // Every device connected and its first heartbeat stored.
        let beats = fleet_rig::nats_client::jetstream::new(admin.clone())
            .key_value(fleet_wire::kv::DEVICE_HEARTBEAT)
            .unwrap();
        let mut seen = vec![false; devices];
        let first = poll(|| {
            for (i, s) in seen.iter_mut().enumerate().filter(|(_, s)| !**s) {
                *s = matches!(beats.get(&format!("sim-{i:06}")), Ok(Some(_)));
            }
            seen.iter().all(|s| *s).then(|| opening.elapsed())
        });
        Self {
            child,
            out,
            reader,
            _tokens: tokens,
            first,
        }
    }

    /// Stops fleet-sim; its latest counter line.
    pub fn stop(self) -> String {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let mut child = self.child;
        let _ = child.wait();
        let _ = self.reader.join();
        let last = self.out.lock().unwrap().last.clone();
        last
    }
}

/// Runs the storm and prints its row.
pub fn run(stack: &mut Stack, key: &SignKey, devices: usize) {
    let sim = Sim::start(stack, key, devices);
    let (first, out) = (sim.first, sim.out.clone());
    let (rss_before, _) = rss_mib(stack);
    let offset = stack.auth_log_text().len();
    out.lock().unwrap().back.clear();
    let t0 = Instant::now();
    stack.nats.start_again();
    let restarted = t0.elapsed();
    let mut readmitted: Vec<Option<Duration>> = vec![None; devices];
    let all_back = poll(|| {
        let log = stack.auth_log_text();
        for i in admitted(log.get(offset..).unwrap_or(""), "sim-") {
            if let Some(r) = readmitted.get_mut(i) {
                r.get_or_insert_with(|| t0.elapsed());
            }
        }
        let o = out.lock().unwrap();
        (o.back.len() >= devices).then(|| o.back.values().max().map(|t| *t - t0))?
    });
    // The last admissions may reach the log after the heartbeats that followed them.
    if all_back.is_some() {
        poll(|| {
            let log = stack.auth_log_text();
            for i in admitted(log.get(offset..).unwrap_or(""), "sim-") {
                if let Some(r) = readmitted.get_mut(i) {
                    r.get_or_insert_with(|| t0.elapsed());
                }
            }
            readmitted.iter().all(Option::is_some).then_some(())
        });
    }
    let (rss_after, peak) = rss_mib(stack);
    let admissions = stack
        .auth_log_text()
        .get(offset..)
        .unwrap_or("")
        .matches("] allowed client")
        .count();
    sim.stop();
    let o = out.lock().unwrap();
    let mut times: Vec<Duration> = o.back.values().map(|t| *t - t0).collect();
    times.sort();
    let not_back = devices - times.len().min(devices);
    let refused_in_storm = o.refused.iter().filter(|t| **t >= t0).count();
    let refused_at_first = o.refused.len() - refused_in_storm;
    let all_readmitted = readmitted
        .iter()
        .copied()
        .collect::<Option<Vec<_>>>()
        .and_then(|v| v.into_iter().max());
    let within = |d: Option<Duration>| {
        d.map_or(format!("not within {} s", LIMIT.as_secs()), |d| {
            format!("{:.1}", d.as_secs_f64())
        })
    };
    let last = &o.last;
    println!(
        "| {devices} fleet-sim devices, one connection and token each, heartbeat every {HEARTBEAT_SECS} s | {} | {:.1} \
         | {} | {} | {:.1} / {:.1} | {admissions} | {refused_in_storm} (at the first connection: \
         {refused_at_first}) | {not_back} | {} / {} | {rss_before:.0} / {peak:.0} / {rss_after:.0} |",
        within(first),
        restarted.as_secs_f64(),
        within(all_readmitted),
        within(all_back),
        pct(&times, 0.5) / 1000.0,
        pct(&times, 0.99) / 1000.0,
        field(last, "errors"),
        field(last, "offline"),
    );
    eprintln!("fleet-sim's last counters: {last}");
    if !o.refused.is_empty() {
        // Why: nats-server's (whole run) and fleet-auth's (storm) errors and warnings, each kind once with a count.
        let mut why: std::collections::BTreeMap<String, usize> = Default::default();
        let auth_log = stack.auth_log_text();
        let logs = [
            stack.nats_log_text(),
            auth_log.get(offset..).unwrap_or("").to_owned(),
        ];
        for line in logs.iter().flat_map(|l| l.lines()) {
            let low = line.to_ascii_lowercase();
            if [
                "authoriz",
                "authentic",
                "refus",
                "expired",
                "[err]",
                "[wrn]",
                "warn",
                "error",
            ]
            .iter()
            .any(|w| low.contains(w))
            {
                // Without the time stamp and client ids, so that lines of one kind count together.
                let text: String = line
                    .split_whitespace()
                    .filter(|w| !w.chars().any(|c| c.is_ascii_digit()))
                    .collect::<Vec<_>>()
                    .join(" ");
                *why.entry(text).or_default() += 1;
            }
        }
        for (text, n) in why {
            eprintln!("{n} × {text}");
        }
    }
}
