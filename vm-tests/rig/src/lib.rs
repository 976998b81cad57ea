//! `fleet-rig`: starts the real parts Harmony Fleet's tests talk to, and stops them on drop.
//!
//! A part that is missing fails the test with a message saying how to install it; nothing is ever skipped.

pub mod callout;
pub mod fleetlock;
pub mod https;
pub mod kube;
pub mod nats;
pub mod nats_client;
pub mod nats_cluster;
pub mod nspawn;
pub mod podman;
pub mod registry;
pub mod tls;
pub mod token;
pub mod util;
pub mod wait;
pub mod zitadel;

pub use nats::NatsServer;
pub use nats_cluster::NatsCluster;
pub use util::{free_port, kill_when_gone, random_hex, require_binary, workspace_root};
pub use wait::{eventually, eventually_async, eventually_seen, wait_for};
