//! Every problem at once, each by its full path, against the real kube-apiserver + etcd, the operator's admission
//! webhook served over HTTPS and registered as `operator/deploy/webhook.yaml` has it, and the operator's engine:
//! `kubectl apply` of a FleetDeployment, a DeviceGroup and a TaskSchedule with several errors each is refused with
//! all of them (`spec.rollout.soakSeconds: …; spec.rollout.maxUnavailable: …`), and the same FleetDeployment stored
//! without the webhook gets an `InvalidSpec` condition naming the same list (docs/crds.md, "Validation").
#![allow(clippy::unwrap_used, clippy::expect_used)]

use fleet_operator::crd::FleetDeployment;
use kube::api::Api;

mod kube_common;
use kube_common::{eventually, kubectl, Fleet};

/// A FleetDeployment with three rollout values out of range and two workload fields of the wrong type or range.
fn deployment_yaml(f: &Fleet, name: &str) -> String {
    format!(
        "apiVersion: fleet.nationtech.io/v1alpha1\nkind: FleetDeployment\nmetadata:\n  name: {name}\n  labels: {{fleet-test: {}}}\nspec:\n  allowedGroups: [{}]\n  workloads:\n    - name: web\n      image: nginx:1\n      ports: [{{hostPort: 100000, containerPort: 80}}]\n      env: {{PORT: 8080}}\n  rollout:\n    soakSeconds: 100000\n    maxUnavailable: 150%\n    maxFailures: -1\n",
        f.run,
        f.name("g")
    )
}

/// What the webhook and the operator both name for [`deployment_yaml`], in this order.
const DEPLOYMENT_PROBLEMS: [&str; 5] = [
    "spec.workloads[0].env.PORT: must be a string, not the number 8080",
    "spec.workloads[0].ports[0].hostPort: 100000 is not a whole number from 0 to 65535",
    "spec.rollout.soakSeconds: must be 0 to 86400, not 100000",
    "spec.rollout.maxUnavailable: must be a count (0 or more) or a percentage from \"0%\" to \"100%\", not \"150%\"",
    "spec.rollout.maxFailures: must be a count (0 or more) or a percentage from \"0%\" to \"100%\", not -1",
];

/// `kubectl apply` of `yaml`, retried until refused (the API server loads the webhook configuration
/// asynchronously: an object stored before that is deleted and applied again); the refusal's text.
async fn refused(yaml: &str, kind: &str, name: &str) -> String {
    eventually(&format!("{kind} {name} refused by the webhook"), || async {
        match kubectl(&["apply", "-f", "-"], yaml) {
            (false, _, stderr) => Some(stderr),
            (true, _, _) => {
                kubectl(&["delete", kind, name], "");
                None
            }
        }
    })
    .await
}

fn assert_names_all(refusal: &str, prefix: &str, problems: &[&str]) {
    let want = format!("{prefix}{}", problems.join("; "));
    assert!(refusal.contains(&want), "want {want:?} in {refusal:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_problem_is_refused_at_once_and_shown_the_same_by_the_operator() {
    let mut f = Fleet::start("valid").await;
    let hooks = f.webhook().await;

    // a FleetDeployment: every out-of-range rollout value and every workload field that does not decode
    let name = f.name("web");
    let yaml = deployment_yaml(&f, &name);
    let m = refused(&yaml, "fdep", &name).await;
    assert_names_all(
        &m,
        &format!("FleetDeployment \"{name}\": "),
        &DEPLOYMENT_PROBLEMS,
    );

    // a DeviceGroup: selectAll beside a list and labels, an invalid id, an id twice
    let group = f.name("bad-group");
    let m = refused(
        &format!(
            "apiVersion: fleet.nationtech.io/v1alpha1\nkind: DeviceGroup\nmetadata:\n  name: {group}\n  labels: {{fleet-test: {}}}\nspec:\n  selectAll: true\n  devices: [dev-1, Dev_2, dev-1]\n  selector: {{matchLabels: {{site: a}}}}\n",
            f.run
        ),
        "fdg",
        &group,
    )
    .await;
    assert_names_all(
        &m,
        &format!("DeviceGroup \"{group}\": "),
        &[
            "spec.selectAll: true selects every device and cannot be combined with selector or devices",
            "spec.devices[1]: invalid device id: \"Dev_2\"",
        ],
    );
    assert!(
        m.contains("; spec.devices[2]: \"dev-1\" appears twice"),
        "{m}"
    );

    // a TaskSchedule: its schedule's field named under spec.schedule, its template's under spec.template
    let schedule = f.name("nightly");
    let m = refused(
        &format!(
            "apiVersion: fleet.nationtech.io/v1alpha1\nkind: TaskSchedule\nmetadata:\n  name: {schedule}\n  namespace: default\n  labels: {{fleet-test: {}}}\nspec:\n  schedule: {{daily: {{at: \"25:00\"}}}}\n  template:\n    allowedGroups: []\n    deadlineSeconds: 60\n    systemUpgradeV1: {{}}\n",
            f.run
        ),
        "fts",
        &schedule,
    )
    .await;
    assert_names_all(
        &m,
        &format!("TaskSchedule \"{schedule}\": "),
        &[
            "spec.schedule.daily.at: \"25:00\" must be HH:MM (UTC, 00:00 to 23:59)",
            "spec.template.allowedGroups: must name at least one DeviceGroup",
        ],
    );

    // stored without the webhook, the operator names the same problems in its condition
    hooks.remove().await;
    let stored = eventually("stored once the webhook is gone", || async {
        kubectl(&["apply", "-f", "-"], &yaml).0.then_some(())
    });
    stored.await;
    f.start_engine();
    let api: Api<FleetDeployment> = Api::all(f.client.clone());
    let message = eventually("Ready=False InvalidSpec", || async {
        let c = api
            .get(&name)
            .await
            .ok()?
            .status?
            .conditions
            .into_iter()
            .find(|c| c.type_ == "Ready")?;
        (c.reason == "InvalidSpec").then_some(c.message)
    })
    .await;
    assert_names_all(&message, "", &DEPLOYMENT_PROBLEMS);
    kubectl(&["delete", "fdep", &name], "");
}
