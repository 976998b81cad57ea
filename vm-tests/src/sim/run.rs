//! Starts the connections, prints a line of counters every 10 s, and stops on SIGINT/SIGTERM or after
//! `--duration-secs`.

use crate::sim::args::Args;
use crate::sim::conn;
use crate::sim::stats::Stats;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the counters are printed.
pub const REPORT_EVERY: Duration = Duration::from_secs(10);

/// Runs the simulation; the error says why it could not start or why it ended early (a connection closed).
pub fn run(args: &Args) -> Result<(), String> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone())
            .map_err(|e| format!("signal handler: {e}"))?;
    }
    if args.token_dir.is_some() {
        // A device costs a file descriptor.
        let limit = crate::sim::device_io::raise_fd_limit();
        if limit < args.devices as u64 + 64 {
            println!("fleet-sim: open files limited to {limit}, fewer than the devices need");
        }
    }
    let stats = Arc::new(Stats::default());
    let started = Instant::now();
    let mut conns = Vec::with_capacity(args.connections);
    for c in 0..args.connections {
        match conn::start(args, c, stats.clone(), stop.clone()) {
            Ok(x) => conns.push(x),
            Err(e) => {
                stop.store(true, Ordering::SeqCst);
                return Err(format!("connection {c} to NATS: {e}"));
            }
        }
    }
    let over = match args.token_dir {
        None => format!("over {} connections", args.connections),
        Some(_) => format!(
            "each on a connection of its own through the auth callout, on {} I/O threads",
            args.connections
        ),
    };
    println!(
        "fleet-sim: {} devices {over}{}, heartbeat every {:?}, workload status every {:?}, {:.1}% failing",
        args.devices,
        if args.ca_file.is_some() { " over TLS" } else { "" },
        args.heartbeat,
        args.status,
        args.fail_fraction * 100.0
    );
    let line = |stats: &Stats, conns: &[conn::Conn]| {
        let in_flight = conns.iter().map(conn::Conn::in_flight).sum();
        let dropped: u64 = conns.iter().map(conn::Conn::dropped).sum();
        let mut l = format!(
            "{} sub_dropped={dropped}",
            stats.line(started.elapsed(), args.devices, in_flight)
        );
        if args.token_dir.is_some() {
            let connected = conns.iter().map(conn::Conn::connected).sum();
            l.push_str(&stats.device_line(connected, args.devices));
        }
        l
    };
    let mut next = Instant::now() + REPORT_EVERY;
    let mut ended = None;
    let mut all_connected = false;
    while !stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(200));
        if let Some((c, why)) = conns
            .iter()
            .enumerate()
            .find_map(|(c, x)| x.closed().map(|w| (c, w)))
        {
            ended = Some(format!("connection {c} closed: {why}"));
            break;
        }
        if args.duration.is_some_and(|d| started.elapsed() >= d) {
            break;
        }
        if args.token_dir.is_some() && !all_connected {
            let connected: usize = conns.iter().map(conn::Conn::connected).sum();
            if connected == args.devices {
                all_connected = true;
                // Once: how long the whole fleet took to be admitted and subscribed (within 200 ms).
                println!(
                    "fleet-sim all connected after_ms={}",
                    started.elapsed().as_millis()
                );
            }
        }
        if Instant::now() >= next {
            next += REPORT_EVERY;
            println!("{}", line(&stats, &conns));
        }
    }
    stop.store(true, Ordering::SeqCst);
    println!("{}", line(&stats, &conns));
    for c in conns {
        for t in c.threads {
            let _ = t.join();
        }
    }
    ended.map_or(Ok(()), Err)
}
