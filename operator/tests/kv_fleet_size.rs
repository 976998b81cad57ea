//! `fleet-operator buckets --fleet-size N` on a real nats-server, as an admin whose fleet outgrows the default
//! 10,000 devices makes room: every bucket's byte limit becomes its per-device share times N, on buckets that
//! exist as well; asked for a size whose limit is below what a bucket holds, the command fails naming the bucket
//! and changes no bucket (JetStream would otherwise refuse every new key of it: devices could not onboard).

use fleet_rig::nats_client as nats;
use fleet_rig::NatsServer;
use std::process::{Command, Output};

fn buckets(url: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fleet-operator"))
        .arg("buckets")
        .args(args)
        .env("FLEET_NATS_URL", url)
        .env_remove("FLEET_SIZE")
        .env_remove("FLEET_KV_REPLICAS")
        .output()
        .expect("run fleet-operator buckets")
}

fn ok(out: Output, what: &str) -> String {
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{what} failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

fn limit(js: &nats::jetstream::JetStream, bucket: &str) -> i64 {
    js.stream_info(format!("KV_{bucket}"))
        .unwrap_or_else(|e| panic!("stream info {bucket}: {e}"))
        .config
        .max_bytes
}

#[test]
fn bucket_limits_follow_the_fleet_size_and_never_fall_below_what_a_bucket_holds() {
    let server = NatsServer::start();
    let url = server.url();
    let js = nats::jetstream::new(server.connect());
    let limits_for = |devices: u64| {
        for spec in fleet_wire::kv::BUCKETS {
            assert_eq!(
                limit(&js, spec.name),
                fleet_wire::kv::max_bytes(spec, devices),
                "{} at {devices} devices",
                spec.name
            );
        }
    };

    // Created for the default fleet, then grown (the buckets exist: the limit is raised on them).
    let out = ok(buckets(&url, &[]), "buckets");
    assert!(out.contains("byte limits made for 10000 devices"), "{out}");
    limits_for(fleet_wire::kv::DEFAULT_FLEET_SIZE);
    let out = ok(
        buckets(&url, &["--fleet-size", "20000"]),
        "buckets --fleet-size 20000",
    );
    assert!(out.contains("byte limits made for 20000 devices"), "{out}");
    limits_for(20_000);

    // 9 MiB of workload reports: more than the 8 MiB floor a fleet of one device would give the bucket.
    let bucket = fleet_wire::kv::WORKLOAD_STATUS;
    let kv = js.key_value(bucket).expect("open the bucket");
    let value = vec![b'x'; 90 * 1024];
    for i in 0..105 {
        kv.put(&format!("dev-{i}"), &value).expect("put");
    }
    let out = buckets(&url, &["--fleet-size", "1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a limit below the bucket's bytes was set: {err}"
    );
    assert!(
        err.contains(bucket) && err.contains("refuse every new key"),
        "the refusal names the bucket and why: {err}"
    );
    assert_eq!(
        limit(&js, bucket),
        fleet_wire::kv::max_bytes(fleet_wire::kv::bucket(bucket).expect("spec"), 20_000),
        "the limit stayed"
    );
    for i in 0..105 {
        let entry = kv.entry(&format!("dev-{i}")).expect("get");
        assert_eq!(
            entry.map(|e| e.value.len()),
            Some(value.len()),
            "dev-{i} kept"
        );
    }
    kv.put("dev-new", b"{}")
        .expect("a new device's key still fits the bucket");

    // Out of range or not a number: refused before anything is touched.
    for bad in ["0", "10000001", "ten"] {
        let out = buckets(&url, &["--fleet-size", bad]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "--fleet-size {bad}: {err}");
        assert!(err.contains("--fleet-size"), "{err}");
    }
    limits_for(20_000);
}
