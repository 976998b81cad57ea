//! The operator shows a device over its share (docs/auth.md, "Refusals"): a real nats-server with the fleet-auth
//! callout and device API, the real fleet-auth, the operator against the real kube-apiserver. One device floods
//! writes; its Device shows `status.writesRefused` (kubectl's Refused column), one `WritesRefused` Warning event
//! per window with the bucket, the reason and the count, and `fleet_device_writes_refused_total` counts them; the
//! other device, writing normally, shows nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../auth/tests/auth_common/mod.rs"]
mod auth_common;
mod kube_common;

use auth_common::{claims, Jwks, SignKey, Stack};
use fleet_operator::crd::Device;
use fleet_operator::deployments::engine::Options;
use fleet_rig::tls::TestCa;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, ListParams, PostParams};
use kube_common::{eventually, kubectl};
use std::time::Duration;

/// A device's connection with its token (async-nats; replies below the device's own inbox prefix).
async fn device(url: &str, token: String, id: &str) -> async_nats::Client {
    async_nats::ConnectOptions::with_token(token)
        .name(id)
        .custom_inbox_prefix(format!("_INBOX.device.{id}"))
        .connection_timeout(Duration::from_secs(5))
        .connect(url)
        .await
        .unwrap_or_else(|e| panic!("{id} connects: {e}"))
}

/// A write through the device API; the answer's text (empty on time-out).
async fn put(c: &async_nats::Client, subject: String, body: Vec<u8>) -> String {
    match tokio::time::timeout(Duration::from_secs(5), c.request(subject, body.into())).await {
        Ok(Ok(m)) => String::from_utf8_lossy(&m.payload).into_owned(),
        _ => String::new(),
    }
}

async fn events_of(client: &kube::Client, name: &str) -> Vec<Event> {
    Api::<Event>::namespaced(client.clone(), "default")
        .list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("WritesRefused"))
        .collect()
}

fn refused_count(bucket: &'static str, kind: &'static str) -> u64 {
    fleet_operator::metrics::global()
        .writes_refused
        .get_or_create(&vec![("bucket", bucket), ("kind", kind)])
        .get()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_from_one_device_shows_on_its_device_only() {
    let client = kube_common::client().await;
    let run = format!("refusals-{}", std::process::id());
    let (attacker, victim) = (
        format!("atk-{}", std::process::id()),
        format!("vic-{}", std::process::id()),
    );
    let (stack, ec, _jwks) = tokio::task::spawn_blocking(|| {
        let ca = TestCa::new();
        let ec = SignKey::ec("ec-1");
        let jwks = Jwks::start(&ca, &[&ec]);
        let stack = Stack::start(&ca, &jwks.url(), false);
        (stack, ec, jwks)
    })
    .await
    .unwrap();
    let (admin, js) = fleet_operator::kv::connect(&stack.admin_url(), &Default::default())
        .await
        .expect("admin connects");
    fleet_operator::kv::ensure_buckets(&js, &Default::default())
        .await
        .expect("buckets");
    let devices: Api<Device> = Api::all(client.clone());
    for name in [&attacker, &victim] {
        let d: Device = serde_json::from_value(serde_json::json!({
            "apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "Device",
            "metadata": {"name": name, "labels": {"fleet-test": run}}, "spec": {}
        }))
        .unwrap();
        devices
            .create(&PostParams::default(), &d)
            .await
            .expect("Device");
    }
    let opts = Options {
        nats_url: stack.admin_url(),
        instance: Some("op-0".into()),
        label_selector: Some(format!("fleet-test={run}")),
        nats: Default::default(),
        secrets_namespace: None,
    };
    let op = kube_common::spawn_engine(client.clone(), opts);
    // The operator listens once its NATS link is up: its first pass writes the victim's heartbeat status below.
    let mut reports = admin.subscribe("fleet.device-refusals.>").await.unwrap();

    let a = device(
        &stack.nats.url(),
        ec.sign(&claims(&attacker, 3600)),
        &attacker,
    )
    .await;
    let v = device(&stack.nats.url(), ec.sign(&claims(&victim, 3600)), &victim).await;
    let hb = |id: &str| {
        let h = fleet_wire::Heartbeat {
            device_id: fleet_wire::DeviceId::try_from(id).unwrap(),
            ..fleet_wire::fixtures::heartbeat()
        };
        serde_json::to_vec(&h).unwrap()
    };
    // The victim writes as an agent does: a heartbeat, taken.
    let ok = put(&v, format!("$KV.device-heartbeat.{victim}"), hb(&victim)).await;
    assert!(ok.contains("\"seq\""), "the victim's heartbeat: {ok}");
    eventually("the victim's heartbeat on its Device", || async {
        devices
            .get(&victim)
            .await
            .ok()?
            .status?
            .last_heartbeat
            .map(|_| ())
    })
    .await;

    // The attacker floods: 300 heartbeats (a burst of 100, then 5 a second), one oversize info.
    let before = refused_count("device-heartbeat", "over-budget");
    let mut over = 0;
    for _ in 0..300 {
        if put(
            &a,
            format!("$KV.device-heartbeat.{attacker}"),
            hb(&attacker),
        )
        .await
        .contains("write budget")
        {
            over += 1;
        }
    }
    assert!(over > 150, "only {over} of 300 writes refused");
    let first = tokio::time::timeout(Duration::from_secs(5), reports.next())
        .await
        .expect("a refusal report")
        .expect("report");
    assert_eq!(
        first.subject.as_str(),
        format!("fleet.device-refusals.{attacker}")
    );

    // The Device shows it: status, kubectl's column, one event naming the bucket, the reason and the count.
    let shown = eventually("the attacker's Device shows writesRefused", || async {
        devices.get(&attacker).await.ok()?.status?.writes_refused
    })
    .await;
    assert_eq!(shown.kind, "over-budget", "{shown:?}");
    assert_eq!(shown.bucket.as_deref(), Some("device-heartbeat"));
    assert!(shown.reason.contains("write budget"), "{shown:?}");
    assert!(shown.count >= 1, "{shown:?}");
    let ev = eventually("a WritesRefused event on the attacker's Device", || async {
        events_of(&client, &attacker).await.into_iter().next()
    })
    .await;
    let text = ev.message.clone().unwrap_or_default();
    assert_eq!(ev.type_.as_deref(), Some("Warning"));
    assert_eq!(ev.involved_object.kind.as_deref(), Some("Device"));
    assert!(
        text.starts_with("fleet-auth refused ")
            && text.contains(&format!("of device {attacker} (latest: device-heartbeat, over-budget: over the write budget"))
            && text.contains(" refused since "),
        "{text}"
    );
    // The flood goes on (20 writes a second, 4 times the budget's rate): fleet-auth reports every 10 s, and the
    // Device's count follows at most every 30 s, with no second event in the window; the metric counts every
    // refusal.
    let flood = {
        let (a, id, body) = (a.clone(), attacker.clone(), hb(&attacker));
        tokio::spawn(async move {
            loop {
                let _ = put(&a, format!("$KV.device-heartbeat.{id}"), body.clone()).await;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let second = tokio::time::timeout(Duration::from_secs(15), reports.next())
        .await
        .expect("a second report")
        .expect("report");
    let r: fleet_wire::device_api::WriteRefused = serde_json::from_slice(&second.payload).unwrap();
    assert!(r.count > 1, "{r:?}");
    let total = eventually("the Device's count includes the second report", || async {
        let s = devices.get(&attacker).await.ok()?.status?.writes_refused?;
        (s.count > shown.count).then_some(s.count)
    })
    .await;
    flood.abort();
    let counted = refused_count("device-heartbeat", "over-budget") - before;
    assert!(counted >= total, "metric {counted}, Device {total}");
    let events = events_of(&client, &attacker).await;
    assert!(
        (1..=2).contains(&events.len()),
        "{} WritesRefused events for {total} refusals (at most one per 5-minute window)",
        events.len()
    );

    // kubectl get/describe show it to a person.
    let (ok, out, err) = kubectl(&["get", "fdev", &attacker], "");
    assert!(ok, "{err}");
    assert!(
        out.lines().next().unwrap_or_default().contains("REFUSED"),
        "{out}"
    );
    assert!(
        out.lines()
            .nth(1)
            .unwrap_or_default()
            .contains(&total.to_string()),
        "{out}"
    );
    let (ok, out, err) = kubectl(&["describe", "fdev", &attacker], "");
    assert!(ok, "{err}");
    assert!(
        out.contains("Writes Refused") && out.contains("WritesRefused"),
        "{out}"
    );

    // The other device shows nothing.
    let vs = devices
        .get(&victim)
        .await
        .unwrap()
        .status
        .unwrap_or_default();
    assert_eq!(vs.writes_refused, None);
    assert!(vs.last_heartbeat.is_some());
    assert!(events_of(&client, &victim).await.is_empty());
    let ok = put(&v, format!("$KV.device-heartbeat.{victim}"), hb(&victim)).await;
    assert!(
        ok.contains("\"seq\""),
        "the victim's writes still go through: {ok}"
    );
    println!(
        "{total} refusals shown on {attacker}, {} event(s), metric +{counted}; {victim} shows none",
        events.len()
    );
    op.abort();
    drop(stack);
}
