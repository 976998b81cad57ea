//! The test rig's blocking NATS client: async-nats (the operator's client, rustls 0.23) on one runtime of the
//! rig's, behind the blocking calls the tests make — connect, publish, request, subscribe, flush, and JetStream KV.
//! The tests' side of every NATS test, independent of the agent's own client (`fleet-nats`) under test.

pub mod buckets;
pub mod connection;
pub mod jetstream;
pub mod kv;
pub mod options;
pub mod runtime;

pub use buckets::{create_bucket, create_buckets};
pub use connection::{Connection, Message, Subscription};
pub use kv::Store;
pub use options::Options;

/// Message headers.
pub mod header {
    pub use async_nats::HeaderMap;
}

/// Connects, failing the test with the URL on error (`urls` may list several servers, comma-separated).
pub fn connect(urls: &str) -> Connection {
    Options::new()
        .with_name("fleet-rig")
        .connect(urls)
        .unwrap_or_else(|e| panic!("connect to {urls}: {e}"))
}

/// Connects over TLS trusting only `ca_file`, showing `client`'s certificate when given; fails the test on error.
pub fn connect_tls(
    url: &str,
    ca_file: &std::path::Path,
    client: Option<&crate::tls::ServerCert>,
) -> Connection {
    let mut o = Options::new()
        .with_name("fleet-rig")
        .tls_required(true)
        .add_root_certificate(ca_file);
    if let Some(c) = client {
        o = o.client_cert(&c.cert_file, &c.key_file);
    }
    o.connect(url)
        .unwrap_or_else(|e| panic!("connect to {url} over TLS: {e}"))
}

/// Connects as `user` (a FLEET user of [`crate::nats::callout_config`], such as `admin`), failing the test on
/// error.
pub fn connect_user(url: &str, user: &str, password: &str) -> Connection {
    connect_user_ca(url, user, password, None)
}

/// [`connect_user`] over TLS trusting only `ca_file` when given.
pub fn connect_user_ca(
    url: &str,
    user: &str,
    password: &str,
    ca_file: Option<&std::path::Path>,
) -> Connection {
    let mut o = Options::with_user_pass(user, password).with_name("fleet-rig");
    if let Some(ca) = ca_file {
        o = o.tls_required(true).add_root_certificate(ca);
    }
    o.connect(url)
        .unwrap_or_else(|e| panic!("connect to {url} as {user}: {e}"))
}
