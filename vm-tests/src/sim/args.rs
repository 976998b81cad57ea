//! The simulator's flags.

use std::path::PathBuf;
use std::time::Duration;

/// What to simulate.
#[derive(Debug, Clone, PartialEq)]
pub struct Args {
    /// How many devices.
    pub devices: usize,
    /// How many NATS connections they share (devices `i` with `i % connections == c` use connection `c`); with
    /// [`Self::token_dir`], how many groups they form, each with a driver thread and one I/O thread for all its
    /// devices' connections (each device then has a connection of its own).
    pub connections: usize,
    /// Each device's token in `<dir>/<device-id>` (read at every connection, as the agent reads its token file):
    /// one connection per device through the fleet-auth callout, writes through its device API.
    pub token_dir: Option<PathBuf>,
    /// The CA (PEM) that signed the server's certificate: TLS is then required.
    pub ca_file: Option<PathBuf>,
    /// The server (a `user:password@` is passed as credentials, never printed).
    pub nats_url: String,
    /// Fraction of devices whose upgrades and workloads fail (0–1).
    pub fail_fraction: f64,
    /// Heartbeat interval of every device.
    pub heartbeat: Duration,
    /// Workload-status interval of every device (the agent's `status_secs`, 30 s by default).
    pub status: Duration,
    /// First device index (so that several simulators can share a server without sharing ids).
    pub first: usize,
    /// Writes in flight per connection at most.
    pub max_in_flight: usize,
    /// Stop after this long (none: until SIGINT/SIGTERM).
    pub duration: Option<Duration>,
}

/// Usage text.
pub const USAGE: &str =
    "usage: fleet-sim --devices N [--connections K] [--nats-url URL] [--token-dir DIR] [--ca-file PEM] \
[--fail-fraction F] [--heartbeat-secs S] [--status-secs S] [--first I] [--max-in-flight M] [--duration-secs S]";

impl Default for Args {
    fn default() -> Self {
        Args {
            devices: 0,
            connections: 8,
            nats_url: "nats://127.0.0.1:4222".into(),
            token_dir: None,
            ca_file: None,
            fail_fraction: 0.0,
            heartbeat: Duration::from_secs(30),
            status: Duration::from_secs(30),
            first: 0,
            max_in_flight: 256,
            duration: None,
        }
    }
}

/// Parses the flags (not the program name).
pub fn parse(argv: &[String]) -> Result<Args, String> {
    let mut a = Args::default();
    let mut it = argv.iter();
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        let num = |v: String| -> Result<u64, String> {
            v.parse::<u64>()
                .map_err(|_| format!("{flag}: {v:?} is not a whole number"))
        };
        match flag.as_str() {
            "--devices" => a.devices = num(value()?)? as usize,
            "--connections" => a.connections = num(value()?)? as usize,
            "--nats-url" => a.nats_url = value()?,
            "--token-dir" => a.token_dir = Some(PathBuf::from(value()?)),
            "--ca-file" => a.ca_file = Some(PathBuf::from(value()?)),
            "--fail-fraction" => {
                let v = value()?;
                a.fail_fraction = v
                    .parse::<f64>()
                    .ok()
                    .filter(|f| (0.0..=1.0).contains(f))
                    .ok_or_else(|| format!("--fail-fraction: {v:?} is not a number in 0..=1"))?;
            }
            "--heartbeat-secs" => a.heartbeat = Duration::from_secs(num(value()?)?),
            "--status-secs" => a.status = Duration::from_secs(num(value()?)?),
            "--first" => a.first = num(value()?)? as usize,
            "--max-in-flight" => a.max_in_flight = num(value()?)? as usize,
            "--duration-secs" => a.duration = Some(Duration::from_secs(num(value()?)?)),
            other => return Err(format!("unknown flag {other:?}\n{USAGE}")),
        }
    }
    if a.devices == 0 || a.devices > 1_000_000 {
        return Err(format!("--devices must be 1..=1000000\n{USAGE}"));
    }
    if a.connections == 0 || a.connections > a.devices.min(10_000) {
        return Err("--connections must be 1..=min(devices, 10000)".into());
    }
    if a.heartbeat.is_zero() || a.status.is_zero() {
        return Err("intervals must be at least 1 s".into());
    }
    if a.max_in_flight == 0 || a.max_in_flight > 65_536 {
        return Err("--max-in-flight must be 1..=65536".into());
    }
    Ok(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn flags() {
        let a = parse(&v("--devices 1000 --connections 4 --nats-url nats://h:1 --fail-fraction 0.05 --heartbeat-secs 10"))
            .expect("parse");
        assert_eq!(a.devices, 1000);
        assert_eq!(a.connections, 4);
        assert_eq!(a.nats_url, "nats://h:1");
        assert_eq!(a.fail_fraction, 0.05);
        assert_eq!(a.heartbeat, Duration::from_secs(10));
        assert_eq!(a.status, Duration::from_secs(30));
        assert_eq!(a.token_dir, None);
        let a = parse(&v(
            "--devices 3 --connections 1 --token-dir /t --ca-file /ca.pem",
        ))
        .expect("parse");
        assert_eq!(a.token_dir, Some(PathBuf::from("/t")));
        assert_eq!(a.ca_file, Some(PathBuf::from("/ca.pem")));
    }

    #[test]
    fn refusals() {
        assert!(parse(&v("")).is_err(), "devices required");
        assert!(parse(&v("--devices 2 --connections 3")).is_err());
        assert!(parse(&v("--devices 2 --fail-fraction 1.5")).is_err());
        assert!(parse(&v("--devices 2 --heartbeat-secs 0")).is_err());
        assert!(parse(&v("--devices 2 --bogus 1")).is_err());
        assert!(parse(&v("--devices")).is_err());
    }
}
