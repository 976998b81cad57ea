//! `fleet-sim`: N simulated devices over real NATS, for `scripts/bench fleet-scale`. Each device writes what the
//! real agent writes, to the same buckets and keys, with the fleet-wire types: device info, a workload status and a
//! heartbeat at start (as the agent does when it starts), then a heartbeat and a workload status on their intervals, a workload status for every desired state, and statuses
//! for agent-upgrade and system-upgrade intents. Devices share `--connections` NATS connections.
//!
//! One concern per file: [`args`] (flags), [`fleet`] (device ids, which devices fail), [`schedule`] (when each
//! device's next write is due), [`reply`] (the values a device writes), [`stats`] (counters and latencies),
//! [`conn`] (one NATS connection and its devices), [`run`] (start, print counters, stop).

pub mod args;
pub mod conn;
pub mod fleet;
pub mod reply;
pub mod run;
pub mod schedule;
pub mod stats;
