//! Checks the Kubernetes calls the operator makes, against a mocked API server (the `ApiServerVerifier`
//! pattern of kube-rs/controller-rs): status patches, Warning events for conditions that turned False, and
//! Device creation.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use fleet_operator::conditions::{self, Want};
use fleet_operator::crd::{
    Device, DeviceStatus, FleetDeployment, FleetDeploymentSpec, Placement, PlacementStatus,
};
use fleet_operator::fleet::report;
use http::{Method, Request, Response};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::client::Body;
use kube::Client;
use std::collections::BTreeMap;
use tower_test::mock::{self, Handle};

/// Plays the API server's side of one scenario: each expected call is checked, then answered.
struct ApiServerVerifier(Handle<Request<Body>, Response<Body>>);

impl ApiServerVerifier {
    /// Expects `method` on `path` (query ignored); returns the JSON body and answers with `status` and `reply`.
    async fn expect(
        &mut self,
        method: Method,
        path: &str,
        status: u16,
        reply: serde_json::Value,
    ) -> serde_json::Value {
        let (req, send) =
            tokio::time::timeout(std::time::Duration::from_secs(5), self.0.next_request())
                .await
                .unwrap_or_else(|_| panic!("expected {method} {path}, but no call came"))
                .expect("service not called");
        assert_eq!(req.method(), method, "{}", req.uri());
        assert_eq!(req.uri().path(), path);
        let body = req.into_body().collect_bytes().await.expect("body");
        let json = if body.is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::from_slice(&body).expect("json body")
        };
        send.send_response(
            Response::builder()
                .status(status)
                .body(Body::from(serde_json::to_vec(&reply).unwrap()))
                .unwrap(),
        );
        json
    }
}

fn mocked() -> (Client, ApiServerVerifier) {
    let (svc, handle) = mock::pair::<Request<Body>, Response<Body>>();
    (Client::new(svc, "default"), ApiServerVerifier(handle))
}

fn deployment() -> FleetDeployment {
    let mut d = FleetDeployment::new(
        "web",
        FleetDeploymentSpec {
            placement: Placement {
                allowed_groups: vec!["all".into()],
                target_selector: Default::default(),
            },
            workloads: vec![],
            rollout: None,
            image_pull_secrets: vec![],
        },
    );
    d.metadata.generation = Some(3);
    d.metadata.uid = Some("0b7c1f9e-2a55-4bb0-8d1e-6c9e5a2f3d10".into());
    d
}

fn invalid_status(
    existing: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
) -> PlacementStatus {
    let now = Time("2026-11-30T05:00:00Z".parse().unwrap());
    PlacementStatus {
        observed_generation: Some(3),
        conditions: conditions::merge(
            existing,
            &[Want {
                type_: conditions::READY,
                ok: false,
                reason: conditions::REASON_INVALID_SPEC,
                message: "targetSelector: matchExpressions is not supported yet".into(),
            }],
            Some(3),
            &now,
        ),
        ..Default::default()
    }
}

#[tokio::test]
async fn invalid_spec_patches_status_and_publishes_one_warning() {
    let (client, mut server) = mocked();
    let recorder = report::recorder(client.clone(), Some("op-0".into()));
    let dep = deployment();
    let status = invalid_status(&[]);
    let failing = conditions::newly_failing(&[], &status.conditions);
    assert_eq!(failing.len(), 1);
    let call = {
        let (client, recorder, dep, status) =
            (client.clone(), recorder, dep.clone(), status.clone());
        let failing: Vec<_> = failing.into_iter().cloned().collect();
        tokio::spawn(async move {
            let f: Vec<_> = failing.iter().collect();
            report::write_status(&client, &recorder, &dep, &status, &f).await
        })
    };
    // 1. the Warning event about the deployment itself: a core/v1 event of the old form in `default` (what a
    // 1.20 API server accepts for a cluster-scoped object), so `kubectl describe` finds it
    let ev = server
        .expect(
            Method::POST,
            "/api/v1/namespaces/default/events",
            201,
            serde_json::json!({}),
        )
        .await;
    assert_eq!(ev["type"], "Warning");
    assert_eq!(ev["reason"], "InvalidSpec");
    assert_eq!(ev["involvedObject"]["kind"], "FleetDeployment");
    assert_eq!(ev["involvedObject"]["name"], "web");
    assert!(ev["involvedObject"].get("namespace").is_none());
    assert!(ev["message"].as_str().unwrap().contains("matchExpressions"));
    assert_eq!(ev["source"]["component"], "fleet-operator");
    // 2. the status patch with the condition
    let mut reply = dep.clone();
    reply.status = Some(status.clone());
    let patch = server
        .expect(
            Method::PATCH,
            "/apis/fleet.nationtech.io/v1alpha1/fleetdeployments/web/status",
            200,
            serde_json::to_value(&reply).unwrap(),
        )
        .await;
    // a JSON patch that replaces the status whole (nothing from an earlier status stays)
    assert_eq!(
        (&patch[0]["op"], &patch[0]["path"]),
        (&"add".into(), &"/status".into())
    );
    let sent: PlacementStatus = serde_json::from_value(patch[0]["value"].clone()).unwrap();
    assert_eq!(sent, status);
    assert_eq!(sent.conditions[0].reason, "InvalidSpec");
    assert_eq!(sent.conditions[0].observed_generation, Some(3));
    call.await.unwrap().expect("write_status");

    // unchanged condition: no new event, only the status patch (the loop skips even that when equal)
    let again = invalid_status(&status.conditions);
    assert_eq!(again, status);
    assert!(conditions::newly_failing(&status.conditions, &again.conditions).is_empty());
}

#[tokio::test]
async fn reported_devices_are_created_and_conflicts_tolerated() {
    let (client, mut server) = mocked();
    let labels: BTreeMap<String, String> = [("fleet".to_string(), "eu".to_string())].into();
    let call = {
        let (client, labels) = (client.clone(), labels.clone());
        tokio::spawn(async move { report::create_device(&client, "pi-7", &labels, false).await })
    };
    let body = server
        .expect(
            Method::POST,
            "/apis/fleet.nationtech.io/v1alpha1/devices",
            201,
            serde_json::to_value(Device::new("pi-7", Default::default())).unwrap(),
        )
        .await;
    assert_eq!(body["metadata"]["name"], "pi-7");
    assert_eq!(body["metadata"]["labels"]["fleet"], "eu");
    call.await.unwrap().expect("created");

    // another replica created it first: 409 is fine
    let call = {
        let client = client.clone();
        tokio::spawn(async move {
            report::create_device(&client, "pi-7", &BTreeMap::new(), false).await
        })
    };
    let conflict = serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "AlreadyExists", "code": 409, "message": "exists"});
    server
        .expect(
            Method::POST,
            "/apis/fleet.nationtech.io/v1alpha1/devices",
            409,
            conflict,
        )
        .await;
    call.await.unwrap().expect("409 tolerated");

    // status mirror: the status subresource replaced whole
    let status = DeviceStatus {
        agent_version: Some(fleet_wire::Version::try_from("1.2.0").unwrap()),
        ..Default::default()
    };
    let call = {
        let (client, status) = (client.clone(), status.clone());
        tokio::spawn(async move { report::write_device_status(&client, "pi-7", &status).await })
    };
    let mut reply = Device::new("pi-7", Default::default());
    reply.status = Some(status);
    let patch = server
        .expect(
            Method::PATCH,
            "/apis/fleet.nationtech.io/v1alpha1/devices/pi-7/status",
            200,
            serde_json::to_value(&reply).unwrap(),
        )
        .await;
    assert_eq!(
        (&patch[0]["op"], &patch[0]["path"]),
        (&"add".into(), &"/status".into())
    );
    assert_eq!(patch[0]["value"]["agentVersion"], "1.2.0");
    assert!(patch[0]["value"].get("agentUpgrade").is_none());
    call.await.unwrap().expect("status");
}
