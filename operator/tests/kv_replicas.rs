//! `fleet-operator buckets --kv-replicas N` on a real 3-node NATS cluster, as an admin grows a single-copy fleet to
//! three copies: the buckets created with one replica are scaled to three, every key kept; running the command
//! again without the option changes nothing. fleetlock-server's NATS store, configured with `replicas: 3`, creates
//! its bucket with three copies.

use fleet_rig::nats_client as nats;
use fleet_rig::NatsCluster;
use std::process::Command;
use std::time::Duration;

/// Runs `fleet-operator buckets` with `args` against `urls`; returns stdout, failing the test on a non-zero exit.
fn buckets(urls: &str, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_fleet-operator"))
        .arg("buckets")
        .args(args)
        .env("FLEET_NATS_URL", urls)
        .env_remove("FLEET_KV_REPLICAS")
        .output()
        .expect("run fleet-operator buckets");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "fleet-operator buckets {args:?} failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

fn replicas(cluster: &NatsCluster, bucket: &str) -> u64 {
    let info = cluster
        .stream_info(&format!("KV_{bucket}"))
        .unwrap_or_else(|e| panic!("stream info {bucket}: {e}"));
    info["config"]["num_replicas"]
        .as_u64()
        .expect("num_replicas")
}

#[test]
fn buckets_scale_to_the_replicas_asked_for_and_keep_their_keys() {
    let cluster = NatsCluster::start(3);
    cluster.wait_meta_leader(Duration::from_secs(30));
    let urls = cluster.url_list();

    // fleetlock-server comes first and creates its bucket, as its config asks, with three copies.
    let store: fleetlock_server::config::StoreConfig =
        serde_yaml_ng::from_str(&format!("{{kind: nats, url: \"{urls}\", replicas: 3}}"))
            .expect("store config");
    tokio::runtime::Runtime::new()
        .expect("runtime")
        .block_on(fleetlock_server::store::Store::open(&store))
        .expect("open the fleetlock store");
    let lock = fleet_wire::kv::FLEETLOCK;
    assert_eq!(replicas(&cluster, lock), 3);

    let out = buckets(&urls, &[]);
    assert!(out.contains("created"), "{out}");
    for spec in fleet_wire::kv::BUCKETS.iter().filter(|b| b.name != lock) {
        assert_eq!(replicas(&cluster, spec.name), 1, "{}", spec.name);
    }
    // A key written while there is one copy.
    let js = nats::jetstream::new(cluster.connect());
    let kv = js
        .key_value(fleet_wire::kv::DESIRED_STATE)
        .expect("open desired-state");
    let rev = kv.put("dev-1", b"{\"kept\":true}").expect("put");

    let out = buckets(&urls, &["--kv-replicas", "3"]);
    assert!(!out.contains(&format!("{lock:<28} scaled")), "{out}");
    for spec in fleet_wire::kv::BUCKETS.iter().filter(|b| b.name != lock) {
        assert!(
            out.contains(&format!("{:<28} scaled from 1 to 3 replicas", spec.name)),
            "{}: {out}",
            spec.name
        );
        assert_eq!(replicas(&cluster, spec.name), 3, "{}", spec.name);
        cluster.wait_stream_current(&format!("KV_{}", spec.name), Duration::from_secs(30));
    }
    let entry = kv.entry("dev-1").expect("get").expect("the key survived");
    assert_eq!(
        (entry.revision, entry.value),
        (rev, b"{\"kept\":true}".to_vec())
    );

    // Without the option nothing is scaled (down or otherwise); asked again for 3, nothing is left to do.
    for args in [&[][..], &["--kv-replicas", "3"][..]] {
        let out = buckets(&urls, args);
        assert!(!out.contains("scaled"), "{args:?}: {out}");
    }
    for spec in fleet_wire::kv::BUCKETS {
        assert_eq!(replicas(&cluster, spec.name), 3, "{}", spec.name);
    }
}
