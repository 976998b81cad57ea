//! Retiring a device against the real kube-apiserver and nats-server, the operator's engine in this process
//! (docs/device-lifecycle.md): `kubectl delete fdev NAME` (the kube API call a person's kubectl makes) → the
//! Device's finalizer holds it until the operator recorded the tombstone and deleted the device's keys in every
//! per-device bucket; the Device then stays gone while the device goes on reporting; a Device created for it
//! without the enrolment annotation is deleted again; an enrolment lifts the tombstone. The device here writes
//! straight to NATS (no callout): fleet-auth's refusals are tested in `retire_callout` (vm-tests) and
//! `auth_callout.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod kube_common;

use async_nats::jetstream::kv;
use fleet_operator::crd::{Device, ENROL_ANNOTATION, RETIRE_FINALIZER};
use fleet_wire::kv as layout;
use fleet_wire::{fixtures, DeviceId, DeviceRetirement};
use kube::api::{Api, PostParams};
use kube_common::{eventually, kubectl, Fleet};
use serde_json::json;
use std::time::Duration;

/// Writes what an agent writes for `id` every second (device info, heartbeat, workload status), until aborted.
fn reporting(f: &Fleet, id: &str) -> tokio::task::JoinHandle<()> {
    let (js, id) = (f.js.clone(), id.to_owned());
    tokio::spawn(async move {
        let mut info = fixtures::device_info();
        info.device_id = DeviceId::try_from(id.as_str()).unwrap();
        let mut beat = fixtures::heartbeat();
        beat.device_id = info.device_id.clone();
        loop {
            for (bucket, value) in [
                (layout::DEVICE_INFO, serde_json::to_vec(&info).unwrap()),
                (layout::DEVICE_HEARTBEAT, serde_json::to_vec(&beat).unwrap()),
            ] {
                if let Ok(s) = js.get_key_value(bucket).await {
                    let _ = s.put(&id, value.into()).await;
                }
            }
            beat.sequence += 1;
            beat.at = fleet_wire::Timestamp::now();
            // why: the simulated device's beat period (one write a second), not a wait
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    })
}

/// The keys `id` holds a value under in every per-device bucket (`bucket/key`).
async fn keys_left(f: &Fleet, id: &str) -> Vec<String> {
    use futures::TryStreamExt;
    let mut left = Vec::new();
    for spec in layout::per_device_buckets() {
        let Ok(store) = f.js.get_key_value(spec.name).await else {
            continue;
        };
        let keys: Vec<String> = match spec.key {
            layout::KeyShape::Device => vec![id.to_owned()],
            _ => store
                .keys()
                .await
                .unwrap()
                .try_collect::<Vec<String>>()
                .await
                .unwrap()
                .into_iter()
                .filter(|k| k.starts_with(&format!("{id}.")))
                .collect(),
        };
        for k in keys {
            if store.get(&k).await.unwrap().is_some() {
                left.push(format!("{}/{k}", spec.name));
            }
        }
    }
    left
}

async fn tombstone(f: &Fleet, id: &str) -> Option<DeviceRetirement> {
    let store = f.js.get_key_value(layout::DEVICE_RETIRED).await.ok()?;
    let v = store.get(id).await.ok()??;
    Some(serde_json::from_slice(&v).unwrap())
}

async fn bucket(f: &Fleet, name: &str) -> kv::Store {
    f.bucket_when_made(name).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_delete_retires_a_device_for_good_until_it_is_enrolled_again() {
    let mut f = Fleet::start("retire").await;
    f.start_engine();
    let id = f.name("ret-1");
    let device = reporting(&f, &id);
    let devices: Api<Device> = Api::all(f.client.clone());
    // Created from its reports, with the finalizer.
    let created = eventually("the Device, with the retirement finalizer", || async {
        let d = devices.get(&id).await.ok()?;
        d.metadata
            .finalizers
            .as_ref()?
            .contains(&RETIRE_FINALIZER.to_owned())
            .then_some(d)
    })
    .await;
    // A Device a person made (not the operator) gets the finalizer too.
    let other = f.name("ret-2");
    f.create::<Device>(
        json!({"apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "Device",
        "metadata": {"name": other, "labels": f.labels(json!({}))}, "spec": {}}),
    )
    .await;
    eventually("the finalizer added to a Device a person made", || async {
        let d = devices.get(&other).await.ok()?;
        d.metadata
            .finalizers?
            .contains(&RETIRE_FINALIZER.to_owned())
            .then_some(())
    })
    .await;
    // Keys in every per-device bucket, the run buckets included (two runs in one of them).
    let runs = [
        fleet_wire::AttemptId::new_random(),
        fleet_wire::AttemptId::new_random(),
    ];
    let run = |n: usize| format!("{id}.{}", runs[n]);
    for spec in layout::per_device_buckets() {
        let store = bucket(&f, spec.name).await;
        let keys = match spec.key {
            layout::KeyShape::Device => vec![id.clone()],
            _ => vec![run(0), run(1)],
        };
        for k in keys {
            if store.get(&k).await.unwrap().is_none() {
                store.put(&k, b"{}".to_vec().into()).await.unwrap();
            }
        }
    }
    assert!(keys_left(&f, &id).await.len() > layout::per_device_buckets().count());

    // `kubectl delete fdev NAME`, as a person runs it (it waits for the finalizer).
    let (ok, out, err) = kubectl(&["delete", "fdev", &id, "--timeout=60s"], "");
    assert!(ok, "kubectl delete: {out}{err}");
    assert!(devices.get(&id).await.is_err(), "gone once kubectl returns");
    let tomb = tombstone(&f, &id).await.expect("a tombstone");
    assert_eq!(tomb.device_id.as_str(), id);
    assert_eq!(tomb.device_uid, created.metadata.uid);
    // Its keys are gone (the device still writes two of them every second: deleted again by the sweep); the
    // others were deleted once and stay deleted.
    let left = keys_left(&f, &id).await;
    assert!(
        left.iter()
            .all(|k| k.starts_with(layout::DEVICE_INFO) || k.starts_with(layout::DEVICE_HEARTBEAT)),
        "{left:?}"
    );
    // The device keeps reporting: no Device for it for 20 s (the 2-minute check with the callout on is
    // vm-tests' retire_e2e).
    for _ in 0..20 {
        // why: 'no Device for 20 s while it reports' is the property: the window is the assertion, each second
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(devices.get(&id).await.is_err(), "the Device is back");
    }
    // Stopped reporting: its leftovers are deleted by the sweep (every 30 s).
    device.abort();
    eventually("the leftovers of the retired device deleted", || async {
        keys_left(&f, &id).await.is_empty().then_some(())
    })
    .await;

    // A Device created without the annotation (what a stale operator would create): deleted again, the
    // tombstone kept.
    f.create::<Device>(
        json!({"apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "Device",
        "metadata": {"name": id, "labels": f.labels(json!({})), "finalizers": [RETIRE_FINALIZER]},
        "spec": {}}),
    )
    .await;
    eventually("a Device of the retired device deleted again", || async {
        devices.get(&id).await.is_err().then_some(())
    })
    .await;
    assert!(tombstone(&f, &id).await.is_some(), "still retired");

    // The enrolment: a Device with the annotation lifts the tombstone.
    let enrolled: Device =
        serde_json::from_value(json!({"apiVersion": "fleet.nationtech.io/v1alpha1",
        "kind": "Device", "metadata": {"name": id, "labels": f.labels(json!({"site": "b"})),
        "annotations": {ENROL_ANNOTATION: "true"}}, "spec": {}}))
        .unwrap();
    devices
        .create(&PostParams::default(), &enrolled)
        .await
        .expect("create the enrolling Device");
    eventually("the tombstone lifted", || async {
        tombstone(&f, &id).await.is_none().then_some(())
    })
    .await;
    let kept = eventually("the enrolled Device kept, with the finalizer", || async {
        let d = devices.get(&id).await.ok()?;
        d.metadata
            .finalizers
            .as_ref()?
            .contains(&RETIRE_FINALIZER.to_owned())
            .then_some(d)
    })
    .await;
    assert_eq!(
        kept.metadata
            .labels
            .unwrap()
            .get("site")
            .map(String::as_str),
        Some("b")
    );
    let _device = reporting(&f, &id);
    eventually("the enrolled device's report mirrored", || async {
        devices
            .get(&id)
            .await
            .ok()?
            .status?
            .agent_version
            .map(|_| ())
    })
    .await;
}
