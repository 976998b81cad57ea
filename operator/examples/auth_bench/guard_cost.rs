//! What the flood guard costs (`auth_bench --guard-cost N`): N fleet-sim devices, each on a connection of its own
//! with its own token, writing a heartbeat through the device API every few seconds; fleet-auth's and nats-server's
//! CPU over a steady window with the guard on (its CONNZ polls, events and watches of new connections), then the
//! same window after fleet-auth is started again without `flood_guard` (the devices stay connected to the server).
//! One row: both, and the difference, which is the guard's cost.

use crate::auth_common::{SignKey, Stack};
use crate::rss_mib;
use crate::storm_sim::Sim;
use std::time::{Duration, Instant};

/// The steady window each measurement takes.
const WINDOW: Duration = Duration::from_secs(30);
/// Left to settle after fleet-auth starts (its first polls, the devices' writes resuming).
const SETTLE: Duration = Duration::from_secs(5);

/// CPU seconds (user + system) of process `pid` so far.
fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command's closing parenthesis: utime and stime are the 12th and 13th.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or(Vec::new(), |(_, r)| r.split_whitespace().collect());
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    (ticks(11) + ticks(12)) / hz
}

/// fleet-auth's and nats-server's CPU over [`WINDOW`], percent of one core.
fn window(stack: &Stack) -> (f64, f64) {
    let auth = stack.auth.as_ref().map_or(0, |c| c.id());
    let nats = stack.nats.pid().unwrap_or(0);
    let (a0, n0, t0) = (cpu_secs(auth), cpu_secs(nats), Instant::now());
    std::thread::sleep(WINDOW);
    let secs = t0.elapsed().as_secs_f64();
    (
        100.0 * (cpu_secs(auth) - a0) / secs,
        100.0 * (cpu_secs(nats) - n0) / secs,
    )
}

/// `config` (fleet-auth's YAML) without its `flood_guard` section.
fn without_guard(config: &str) -> String {
    let mut out = String::new();
    let mut skipping = false;
    for line in config.lines() {
        if line.starts_with("flood_guard:") {
            skipping = true;
            continue;
        }
        if skipping && line.starts_with(' ') {
            continue;
        }
        skipping = false;
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// Measures and prints the row.
pub fn run(stack: &mut Stack, key: &SignKey, devices: usize) {
    let sim = Sim::start(stack, key, devices);
    let connected = sim
        .first
        .map_or("no".to_owned(), |d| format!("{:.1}", d.as_secs_f64()));
    std::thread::sleep(SETTLE);
    let (auth_on, nats_on) = window(stack);
    let (rss, _) = rss_mib(stack);
    let config = std::fs::read_to_string(&stack.auth_config).expect("fleet-auth's config");
    std::fs::write(&stack.auth_config, without_guard(&config)).expect("config without the guard");
    stack.start_auth();
    std::thread::sleep(SETTLE);
    let (auth_off, nats_off) = window(stack);
    std::fs::write(&stack.auth_config, config).expect("config restored");
    stack.start_auth();
    let last = sim.stop();
    eprintln!("fleet-sim's last counters: {last}");
    println!(
        "| {devices} fleet-sim devices, one connection and token each | {connected} | {auth_on:.1} | {auth_off:.1} | \
         {:.1} | {nats_on:.1} / {nats_off:.1} | {:.1} | {rss:.0} |",
        auth_on - auth_off,
        nats_on - nats_off
    );
}
