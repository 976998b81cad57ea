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
//!   hard one).
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
