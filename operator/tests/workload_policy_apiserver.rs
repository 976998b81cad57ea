//! Hardware and privileges under a WorkloadPolicy, against the real kube-apiserver + etcd (shared by this binary's
//! tests), a real nats-server, the operator's engine and its admission webhook served over HTTPS and registered as
//! `operator/deploy/webhook.yaml` has it: a FleetDeployment asking for `/dev/ttyS0` and `NET_ADMIN` is refused by
//! `kubectl apply` while no policy allows it, and placed once one does; without the webhook the operator itself
//! holds such a deployment (`NotAllowed`) and lets it proceed when a policy appears.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use fleet_operator::crd::policy::WorkloadPolicy;
use fleet_operator::crd::{Device, DeviceGroup, FleetDeployment};
use fleet_wire::{fixtures, Capability, DesiredState, DeviceId};
use kube::api::{Api, PostParams};
use serde_json::json;

mod kube_common;
use kube_common::{eventually, kubectl, Fleet};

/// A device of this test (Device object and a `device-info` advertising `WorkloadSpecV2`, which the operator
/// requires before it gives a device devices or capabilities) in a DeviceGroup of its own; returns
/// (device, group).
async fn device_in_group(f: &Fleet, device: &str, group: &str) {
    let dev: Device = serde_json::from_value(
        json!({"apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "Device",
        "metadata": {"name": device, "labels": f.labels(json!({}))}, "spec": {}}),
    )
    .unwrap();
    Api::<Device>::all(f.client.clone())
        .create(&PostParams::default(), &dev)
        .await
        .expect("device");
    let g: DeviceGroup = serde_json::from_value(
        json!({"apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "DeviceGroup",
        "metadata": {"name": group, "labels": f.labels(json!({}))}, "spec": {"devices": [device]}}),
    )
    .unwrap();
    Api::<DeviceGroup>::all(f.client.clone())
        .create(&PostParams::default(), &g)
        .await
        .expect("group");
    let info_store = f.bucket_when_made(fleet_wire::kv::DEVICE_INFO).await;
    let mut info = fixtures::device_info();
    info.device_id = DeviceId::try_from(device).unwrap();
    info.capabilities.push(Capability::WorkloadSpecV2);
    info_store
        .put(device, serde_json::to_vec(&info).unwrap().into())
        .await
        .expect("put info");
}

async fn desired(f: &Fleet, device: &str) -> Option<DesiredState> {
    let store = f.bucket_when_made(fleet_wire::kv::DESIRED_STATE).await;
    let v = store.get(device).await.ok()??;
    Some(serde_json::from_slice(&v).expect("desired state"))
}

/// The Ready condition's reason and message.
async fn ready(f: &Fleet, name: &str) -> Option<(String, String)> {
    let d = Api::<FleetDeployment>::all(f.client.clone())
        .get(name)
        .await
        .ok()?;
    d.status?
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| (c.reason, c.message))
}

fn deployment_yaml(f: &Fleet, name: &str, group: &str, workload: &str) -> String {
    format!(
        "apiVersion: fleet.nationtech.io/v1alpha1\nkind: FleetDeployment\nmetadata:\n  name: {name}\n  labels: {{fleet-test: {}}}\nspec:\n  allowedGroups: [{group}]\n  workloads:\n    - name: {workload}\n      image: localhost/serial-reader:1\n      devices: [/dev/ttyS0]\n      capabilities: [NET_ADMIN]\n",
        f.run
    )
}

fn policy_yaml(f: &Fleet, name: &str, group: &str) -> String {
    format!(
        "apiVersion: fleet.nationtech.io/v1alpha1\nkind: WorkloadPolicy\nmetadata:\n  name: {name}\n  labels: {{fleet-test: {}}}\nspec:\n  groups: [{group}]\n  devices: [/dev/ttyS*]\n  capabilities: [NET_ADMIN]\n",
        f.run
    )
}

/// The acceptance, in the cluster: refused by the webhook without a policy (the message names the
/// situation), accepted and placed with one (the desired state in NATS holds the device and the capability); a
/// policy with a mistyped field is refused too; removing the policy holds what runs (`NotAllowed`, kept
/// unchanged) and refuses a changed spec.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn devices_and_capabilities_need_a_policy_at_admission() {
    let mut f = Fleet::start("wp-hook").await;
    let hooks = f.webhook().await;
    f.start_engine();
    let (dev, group) = (f.name("serial-1"), f.name("field"));
    device_in_group(&f, &dev, &group).await;
    let name = f.name("reader");
    let yaml = deployment_yaml(&f, &name, &group, "reader");

    // refused while no policy applies (the API server loads the webhook configuration asynchronously: an object
    // stored before that is deleted and applied again)
    let refused = eventually("the deployment refused by the webhook", || async {
        match kubectl(&["apply", "-f", "-"], &yaml) {
            (false, _, stderr) => Some(stderr),
            (true, _, _) => {
                kubectl(&["delete", "fdep", &name], "");
                None
            }
        }
    })
    .await;
    assert!(
        refused.contains(&format!(
            "FleetDeployment \"{name}\": spec.workloads[0] (reader): device /dev/ttyS0 and capability NET_ADMIN are not allowed for groups [{group}]: no WorkloadPolicy applies"
        )),
        "{refused}"
    );
    assert!(
        Api::<FleetDeployment>::all(f.client.clone())
            .get(&name)
            .await
            .is_err(),
        "nothing was stored"
    );

    // a policy with a mistyped field is refused, not stored as one that allows less (or more)
    let typo = f.name("typo");
    let (ok, _, stderr) = kubectl(
        &["apply", "-f", "-"],
        &format!(
            "apiVersion: fleet.nationtech.io/v1alpha1\nkind: WorkloadPolicy\nmetadata:\n  name: {typo}\n  labels: {{fleet-test: {}}}\nspec:\n  groups: [{group}]\n  device: [/dev/ttyS0]\n",
            f.run
        ),
    );
    assert!(!ok, "a policy with an unknown field is refused");
    assert!(
        stderr.contains(&format!(
            "WorkloadPolicy \"{typo}\": unknown field spec.device "
        )),
        "{stderr}"
    );

    // a policy for that group: accepted, and placed with its devices and capabilities
    let policy = f.name("serial");
    let (ok, _, stderr) = kubectl(&["apply", "-f", "-"], &policy_yaml(&f, &policy, &group));
    assert!(ok, "policy applied: {stderr}");
    let (ok, _, stderr) = eventually("the deployment accepted once the policy is seen", || {
        let yaml = yaml.clone();
        async move {
            let out = kubectl(&["apply", "-f", "-"], &yaml);
            (out.0 || !out.2.contains("no WorkloadPolicy applies")).then_some(out)
        }
    })
    .await;
    assert!(ok, "accepted: {stderr}");
    let placed = eventually("placed with its device and capability", || async {
        desired(&f, &dev)
            .await
            .filter(|s| s.workloads.iter().any(|w| w.name.as_str() == "reader"))
    })
    .await;
    let w = &placed.workloads[0];
    assert_eq!(w.devices, ["/dev/ttyS0"]);
    assert_eq!(w.capabilities, ["NET_ADMIN"]);
    let (reason, _) = eventually("Ready=Placed", || async {
        ready(&f, &name).await.filter(|(r, _)| r == "Placed")
    })
    .await;
    assert_eq!(reason, "Placed");
    let (ok, table, _) = kubectl(&["get", "fwp", &policy], "");
    assert!(
        ok && table.contains("/dev/ttyS*") && table.contains("NET_ADMIN"),
        "{table}"
    );

    // the policy removed: what runs is held and says why; a changed spec is refused
    let (ok, _, stderr) = kubectl(&["delete", "fwp", &policy], "");
    assert!(ok, "{stderr}");
    let (_, m) = eventually("NotAllowed once the policy is gone", || async {
        ready(&f, &name).await.filter(|(r, _)| r == "NotAllowed")
    })
    .await;
    assert!(
        m.contains("no WorkloadPolicy applies") && m.contains("kept unchanged"),
        "{m}"
    );
    assert_eq!(desired(&f, &dev).await, Some(placed), "what runs is held");
    // (each try a new image: one accepted before the webhook's cache saw the removal makes the next a change too)
    let mut tag = 1;
    let (_, _, stderr) = eventually("a changed spec refused once the removal is seen", || {
        tag += 1;
        let changed = yaml.replace("serial-reader:1", &format!("serial-reader:{tag}"));
        async move {
            let out = kubectl(&["apply", "-f", "-"], &changed);
            (!out.0).then_some(out)
        }
    })
    .await;
    assert!(stderr.contains("no WorkloadPolicy applies"), "{stderr}");
    // an update that leaves the spec as it was (a label) is not refused: the deployment stays manageable
    let (ok, _, stderr) = kubectl(&["label", "fdep", &name, "team=sensors"], "");
    assert!(ok, "{stderr}");
    hooks.remove().await;
}

/// Fail closed without the webhook (none is registered here): a deployment asking for a device and a capability
/// is stored, but the operator places nothing of it (`NotAllowed`, the message naming the situation) until a
/// policy allows it, and then places it without anyone touching the deployment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_webhook_the_operator_holds_what_no_policy_allows() {
    let mut f = Fleet::start("wp-op").await;
    f.start_engine();
    let (dev, group) = (f.name("serial-2"), f.name("field"));
    device_in_group(&f, &dev, &group).await;
    let name = f.name("reader");
    let (ok, _, stderr) = kubectl(
        &["apply", "-f", "-"],
        &deployment_yaml(&f, &name, &group, "reader"),
    );
    assert!(ok, "stored: no webhook is registered: {stderr}");
    let (_, m) = eventually("NotAllowed", || async {
        ready(&f, &name).await.filter(|(r, _)| r == "NotAllowed")
    })
    .await;
    assert!(
        m.contains(&format!("workloads[0] (reader): device /dev/ttyS0 and capability NET_ADMIN are not allowed for groups [{group}]: no WorkloadPolicy applies"))
            && m.contains("nothing is placed"),
        "{m}"
    );
    assert!(
        desired(&f, &dev)
            .await
            .is_none_or(|s| s.workloads.is_empty()),
        "nothing placed"
    );

    // a policy that allows less names itself; one that allows it lets the deployment proceed
    let narrow = f.name("usb-only");
    let p: WorkloadPolicy = serde_json::from_value(
        json!({"apiVersion": "fleet.nationtech.io/v1alpha1", "kind": "WorkloadPolicy",
        "metadata": {"name": narrow, "labels": f.labels(json!({}))},
        "spec": {"groups": [group], "devices": ["/dev/ttyUSB*"]}}),
    )
    .unwrap();
    let policies: Api<WorkloadPolicy> = Api::all(f.client.clone());
    policies
        .create(&PostParams::default(), &p)
        .await
        .expect("policy");
    let (_, m) = eventually("the narrow policy named", || async {
        ready(&f, &name)
            .await
            .filter(|(_, m)| m.contains(&format!("WorkloadPolicy \"{narrow}\"")))
    })
    .await;
    assert!(
        m.contains("allows devices [/dev/ttyUSB*] and capabilities [] only"),
        "{m}"
    );
    let (ok, _, stderr) = kubectl(
        &["apply", "-f", "-"],
        &policy_yaml(&f, &f.name("serial"), &group),
    );
    assert!(ok, "{stderr}");
    let placed = eventually("placed once a policy allows it", || async {
        desired(&f, &dev)
            .await
            .filter(|s| s.workloads.iter().any(|w| w.name.as_str() == "reader"))
    })
    .await;
    assert_eq!(placed.workloads[0].devices, ["/dev/ttyS0"]);
    assert_eq!(placed.workloads[0].capabilities, ["NET_ADMIN"]);
    eventually("Ready=Placed", || async {
        ready(&f, &name).await.filter(|(r, _)| r == "Placed")
    })
    .await;
}
