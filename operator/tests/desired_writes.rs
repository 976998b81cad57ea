//! The operator's desired-state write path (`engine::write_desired`) on a real nats-server: compare-and-set by
//! revision, two replicas write each key once, a lost race re-reads, an invalid state is never written.
//! (An integration test, not a unit test: it starts a nats-server process, which the library's unit tests
//! must not do while the FleetLock file-store tests hold their lock file.)

use async_nats::jetstream::kv::Store;
use fleet_operator::deployments::engine::write_desired;
use fleet_operator::kv::{self, Mirror};
use fleet_wire::kv as layout;
use fleet_wire::{fixtures, DesiredState, DeviceId, WorkloadSpec};
use std::collections::BTreeMap;
use std::sync::Arc;

fn id(i: usize) -> DeviceId {
    DeviceId::try_from(format!("dev-{i:03}").as_str()).expect("id")
}

async fn value(store: &Store, key: &str) -> Option<(u64, DesiredState)> {
    let e = store.entry(key).await.expect("entry")?;
    Some((e.revision, serde_json::from_slice(&e.value).expect("json")))
}

/// The write path on a real nats-server: two replicas write each key once, a key another writer changed is
/// re-read and decided again (never overwritten blind), an invalid state is skipped, nothing else is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_desired_is_compare_and_set() {
    let nats = fleet_rig::NatsServer::start();
    let (_client, js) = kv::connect(&nats.url(), &Default::default())
        .await
        .expect("connect");
    let stores = kv::ensure_buckets(&js, &Default::default())
        .await
        .expect("buckets");
    let store = &stores[layout::DESIRED_STATE];
    let web: Arc<[WorkloadSpec]> = vec![fixtures::workload("web")].into();
    let n = 300;
    let per_device = || {
        (0..n)
            .map(|i| (id(i), web.clone()))
            .collect::<BTreeMap<_, _>>()
    };

    // Two replicas with their own (empty) mirrors decide the same thing at once: each key is written once.
    let (a, b) = (
        Mirror::<DesiredState>::new(layout::DESIRED_STATE),
        Mirror::<DesiredState>::new(layout::DESIRED_STATE),
    );
    let (wa, wb) = tokio::join!(
        write_desired(store, &a, per_device()),
        write_desired(store, &b, per_device())
    );
    assert_eq!(wa.expect("a") + wb.expect("b"), n);
    let mut stream = js
        .get_stream(format!("KV_{}", layout::DESIRED_STATE))
        .await
        .expect("stream");
    // Every write is one stream sequence number.
    assert_eq!(
        stream.info().await.expect("info").state.last_sequence,
        n as u64
    );
    let (rev5, s5) = value(store, id(5).as_str()).await.expect("written");
    assert_eq!((s5.generation, &s5.workloads[..]), (1, &web[..]));

    // Nothing changed: nothing written.
    assert_eq!(
        write_desired(store, &a, per_device()).await.expect("again"),
        0
    );

    // Another writer changes a key behind replica a's back, and a (its mirror stale) wants a change there
    // too: a's write loses the race, re-reads, and writes the next generation on top of what it read.
    let other = DesiredState::new(id(5), 7, vec![fixtures::workload("db")]).expect("state");
    let other_rev = store
        .update(
            id(5).as_str(),
            serde_json::to_vec(&other).expect("json").into(),
            rev5,
        )
        .await
        .expect("other writer");
    assert_eq!(
        a.get(id(5).as_str()).map(|s| s.revision),
        Some(rev5),
        "a's mirror is stale"
    );
    let mut v2 = fixtures::workload("web");
    v2.image = "localhost/busybox:1.37".into();
    let v2: Arc<[WorkloadSpec]> = vec![v2].into();
    let mut changed = per_device();
    changed.insert(id(5), v2.clone());
    assert_eq!(
        write_desired(store, &a, changed).await.expect("after race"),
        1
    );
    let (rev, s) = value(store, id(5).as_str()).await.expect("present");
    assert_eq!(rev, other_rev + 1);
    assert_eq!((s.generation, &s.workloads[..]), (8, &v2[..]));
    assert_eq!(
        a.get(id(5).as_str()).map(|s| s.revision),
        Some(rev),
        "a's mirror follows"
    );

    // An invalid state (two workloads with one name) is not written; the others are untouched.
    let twice: Arc<[WorkloadSpec]> =
        vec![fixtures::workload("web"), fixtures::workload("web")].into();
    let mut bad = per_device();
    bad.insert(id(5), v2);
    bad.insert(id(n), twice);
    assert_eq!(write_desired(store, &a, bad).await.expect("bad"), 0);
    assert!(value(store, id(n).as_str()).await.is_none());
    assert_eq!(
        stream.info().await.expect("info").state.last_sequence,
        n as u64 + 2,
        "no write besides the other writer's and a's"
    );
}
