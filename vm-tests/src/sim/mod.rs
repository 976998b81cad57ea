//! `fleet-sim`: N simulated devices over real NATS, for `scripts/bench fleet-scale`. Each device writes what the
//! real agent writes, to the same buckets and keys, with the fleet-wire types: device info, a workload status and a
//! heartbeat at start (as the agent does when it starts), then a heartbeat and a workload status on their intervals, a workload status for every desired state, and statuses
//! for agent-upgrade and system-upgrade intents.
//!
//! Two ways in:
//! - by default devices share `--connections` NATS connections as the services' user and write straight to
//!   JetStream (what `scripts/bench fleet-scale` runs);
//! - with `--token-dir DIR` (and `--ca-file` for TLS) each device has a connection of its own, made with its own
//!   token (`DIR/<device-id>`) through the fleet-auth callout, as fleet-agent does: its writes go through the
//!   device API to its own keys, it hears of desired states and intents through the device API's notices to its
//!   own inbox and reads them with direct gets, and when its connection is lost it connects again by itself (at
//!   once, then after a random 1 to 3 s, never giving up), writing its device info again once back (or once a
//!   heartbeat is acknowledged after its device info was not written), as fleet-agent writes a missing device
//!   info again. An upgraded device publishes its device info at `starting`, before it commits, as the new agent
//!   does. Counter lines then also say how many devices are connected, the
//!   server's admissions and refusals, failed attempts, writes skipped while away, and devices back (a heartbeat
//!   acknowledged after a lost connection); a device back and a refused attempt are also printed, a line each, and once every device is connected, how long that took (`fleet-sim all connected after_ms=`). `operator/examples/auth_bench.rs
//!   --storm-sim N` runs it for the reconnect storm. The device connections are event-driven
//!   ([`device_io`]): `--connections K` groups, each with one I/O thread that owns all its devices' sockets
//!   (epoll, rustls sessions driven by hand, the agent's NATS parser, a timer heap), besides its driver and acks
//!   threads; a device costs one file descriptor and no thread (the soft limit of open files is raised to the
//!   hard one). Measured 2026-12-07 (`fleet_sim`'s ignored test `cost_of_a_device_on_its_own_connection`; release
//!   builds of fleet-sim and fleet-auth, TLS, 2 cores, `--connections 2`, heartbeat and workload status every 30
//!   s): 1,000 devices — fleet-sim 16.4 MiB RSS, 1,009 file descriptors, 7 threads, every device admitted and
//!   subscribed 0.8 s after start, no attempt refused; 10,000 devices (two runs) — fleet-sim 119.5 MiB RSS (12.2
//!   KiB a device; 11.7 KiB a device between the two sizes), 10,009 file descriptors, 7 threads, 5% of a core;
//!   every device admitted 12.3–13.5 s after start, all of them starting at once: 4,966 and 5,905 attempts
//!   refused in the first seconds, each of those devices admitted after the agent's pause; nats-server 1.65–1.69
//!   GiB RSS (about 170 KiB a TLS connection), fleet-auth 68–70 MiB RSS, 3.8–4.3 CPU-seconds for the admissions
//!   and 9% of a core afterwards. Not measured: more than 10,000 devices (the open-files hard limit here is
//!   20,000; nats-server would need about 16 GiB for 100,000 at that cost a connection).
//!
//! One concern per file: [`args`] (flags), [`fleet`] (device ids, which devices fail), [`schedule`] (when each
//! device's next write is due), [`reply`] (the values a device writes), [`stats`] (counters and latencies),
//! [`conn`] (one NATS connection, or one group of devices, and its driver), [`device_conn`] (what the driver
//! sees of one device's own connection through the callout), [`device_io`] (those connections' I/O), [`run`] (start, print counters, stop).

pub mod args;
pub mod conn;
pub mod device_conn;
pub mod device_io;
pub mod fleet;
pub mod reply;
pub mod run;
pub mod schedule;
pub mod stats;
