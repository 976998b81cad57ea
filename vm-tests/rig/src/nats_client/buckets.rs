//! KV buckets of the layout (`fleet_wire::kv`) created for a test as the operator creates them.

use super::connection::Connection;
use super::jetstream;
use super::kv::Store;

/// Creates the bucket `spec` the way the operator (async-nats) does: file-backed, one value per key, the
/// layout's value size and age limits, and direct get allowed (the agent reads keys with direct gets, the only
/// read a device's permissions scope to its own key). The stream is created with a JetStream API request, so that
/// its configuration is written out here field by field. Fails the test on error.
pub fn create_bucket(conn: &Connection, spec: &fleet_wire::kv::BucketSpec) -> Store {
    let age = spec.max_age.unwrap_or(std::time::Duration::ZERO);
    let dup = if age.is_zero() {
        std::time::Duration::from_secs(120)
    } else {
        age.min(std::time::Duration::from_secs(120))
    };
    let config = serde_json::json!({
        "name": format!("KV_{}", spec.name),
        "subjects": [format!("$KV.{}.>", spec.name)],
        "retention": "limits",
        "max_consumers": -1,
        "max_msgs": -1,
        "max_bytes": -1,
        "max_msgs_per_subject": 1,
        "max_age": age.as_nanos() as u64,
        "max_msg_size": spec.max_value_bytes,
        "storage": "file",
        "discard": "new",
        "num_replicas": 1,
        "duplicate_window": dup.as_nanos() as u64,
        "allow_rollup_hdrs": true,
        "deny_delete": true,
        "allow_direct": true,
    });
    let reply = conn
        .request(
            &format!("$JS.API.STREAM.CREATE.KV_{}", spec.name),
            config.to_string(),
        )
        .unwrap_or_else(|e| panic!("create bucket {}: {e}", spec.name));
    let answer: serde_json::Value = serde_json::from_slice(&reply.data)
        .unwrap_or_else(|e| panic!("create bucket {}: {e}", spec.name));
    if let Some(err) = answer.get("error") {
        panic!("create bucket {}: {err}", spec.name);
    }
    jetstream::new(conn.clone())
        .key_value(spec.name)
        .unwrap_or_else(|e| panic!("open bucket {}: {e}", spec.name))
}

/// Creates the named buckets of the layout ([`fleet_wire::kv::BUCKETS`]); a name outside it fails the test.
pub fn create_buckets(conn: &Connection, names: &[&str]) {
    for name in names {
        let spec = fleet_wire::kv::bucket(name)
            .unwrap_or_else(|| panic!("bucket {name} is not in the KV layout"));
        create_bucket(conn, spec);
    }
}
