//! Agent-upgrade intents through a real nats-server: the operator's CAS write of `AgentUpgradeAttempt` and the
//! agent's read, with the `fleet-wire` types and KV layout.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use fleet_rig::nats_client as nats;
use fleet_rig::nats_client::create_bucket;
use fleet_rig::NatsServer;
use fleet_wire::{fixtures, kv, AgentUpgradeAttempt, AttemptId, Version};

fn open(server: &NatsServer, name: &str) -> nats::kv::Store {
    create_bucket(
        &server.connect(),
        kv::bucket(name).expect("bucket in layout"),
    )
}

#[test]
fn attempt_create_then_cas_update_by_revision() {
    let server = NatsServer::start();
    let store = open(&server, kv::AGENT_UPGRADE_INTENT);
    let first = fixtures::attempt();
    let key = kv::device_key(&first.device_id);

    let rev1 = store
        .create(&key, serde_json::to_vec(&first).unwrap())
        .expect("create");
    // A second create of the same key is refused: two operators cannot both write the first attempt.
    assert!(store
        .create(&key, serde_json::to_vec(&first).unwrap())
        .is_err());

    let mut second = first.clone();
    second.attempt_id = AttemptId::new_random();
    second.target_version = Version::try_from("1.3.0").unwrap();
    let rev2 = store
        .update(&key, serde_json::to_vec(&second).unwrap(), rev1)
        .expect("CAS update");
    assert!(rev2 > rev1);

    // A writer holding the stale revision loses (JetStream error 10071) and nothing changes.
    let mut stale = first.clone();
    stale.attempt_id = AttemptId::new_random();
    let err = store
        .update(&key, serde_json::to_vec(&stale).unwrap(), rev1)
        .expect_err("stale revision");
    assert!(
        err.to_string().contains("10071")
            || err
                .to_string()
                .to_lowercase()
                .contains("wrong last sequence"),
        "{err}"
    );

    let entry = store.entry(&key).expect("get").expect("present");
    assert_eq!(entry.revision, rev2);
    let read: AgentUpgradeAttempt = serde_json::from_slice(&entry.value).expect("valid attempt");
    assert_eq!(read, second);
    assert_eq!(read.digest(), second.digest());
    assert_ne!(read.digest(), first.digest());
}

#[test]
fn an_invalid_value_in_kv_is_rejected_by_the_reader() {
    let server = NatsServer::start();
    let store = open(&server, kv::AGENT_UPGRADE_INTENT);
    let mut v = serde_json::to_value(fixtures::attempt()).unwrap();
    v["artifact"] = serde_json::json!("http://insecure.example.com/agent");
    store
        .put("device-1", serde_json::to_vec(&v).unwrap())
        .expect("put");
    let raw = store.get("device-1").expect("get").expect("present");
    let err = serde_json::from_slice::<AgentUpgradeAttempt>(&raw).expect_err("rejected");
    assert!(err.to_string().contains("invalid artifact"), "{err}");
}

#[test]
fn every_bucket_in_the_layout_can_be_created_and_system_run_keys_watched() {
    let server = NatsServer::start();
    for spec in kv::BUCKETS {
        open(&server, spec.name);
    }
    let store = open(&server, kv::SYSTEM_UPGRADE_INTENT);
    let attempt = fixtures::system_attempt();
    let watch = store
        .watch(kv::device_runs_filter(&attempt.device_id))
        .expect("watch");
    store
        .put(
            &kv::run_key(&attempt.device_id, &attempt.run_uid),
            serde_json::to_vec(&attempt).unwrap(),
        )
        .expect("put");
    store
        .put(
            "device-2.0d9f5a62-3b1e-4f7a-8c2d-5e6f7a8b9c0d",
            b"other device",
        )
        .expect("put other");
    let entry = watch.into_iter().next().expect("one entry");
    let (device, run) = kv::parse_run_key(&entry.key).expect("run key");
    assert_eq!((device, run), (attempt.device_id.clone(), attempt.run_uid));
    let read: fleet_wire::SystemUpgradeAttempt =
        serde_json::from_slice(&entry.value).expect("valid");
    assert_eq!(read, attempt);
}
