//! What the cluster-side programs share — fleet-operator, fleet-auth and fleetlock-server: the TLS of their NATS
//! connections, the server list of a cluster URL, the guard against a docs placeholder as a password, and error
//! chains. Nothing here knows Kubernetes, so the lock server and the auth callout build without it.

pub mod nats;
pub mod nats_password;
pub mod nats_tls;
