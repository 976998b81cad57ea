//! The guardrails on the demo's own cluster: `fleet_vm_tests::cluster::Cluster::start`, the path `scripts/demo`
//! (and every local-fleet test) sets its cluster up by, with the admission webhooks registered as
//! `operator/deploy/webhook.yaml` has them. Driven with kubectl, as a person would: a typo is refused at every depth
//! of every fleet kind (each closed object of each kind's published schema is covered, read back from the
//! cluster), inside the fleet-wire parts too, nothing refused is stored, and neither a TaskRun's nor a
//! DeviceDiagnostics' spec can be edited;
//! and the dashboard `scripts/demo --keep` points a person to answers with its token only.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use fleet_rig::NatsServer;
use fleet_vm_tests::cluster::Cluster;
use fleet_vm_tests::instructions;
use fleet_wire::kv;
use serde_json::Value;
use std::collections::BTreeSet;
use std::sync::OnceLock;
use std::time::Duration;

const API: &str = "apiVersion: fleet.nationtech.io/v1alpha1";
const BUILD: &str =
    "{architecture: amd64, version: 1.2.0, artifact: \"https://example.com/fleet-agent\", \
    sha256: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa, byteLimit: 1000}";
const RUN_SPEC: &str =
    "allowedGroups: [demo], targetSelector: {}, deadlineSeconds: 600, systemUpgradeV1: {}";

/// (kind, name, the spec as YAML flow text or a whole document tail, the path the refusal must name). Each kind's
/// closed objects all appear as the parent of some path (checked against the published schemas below).
fn typos() -> Vec<(&'static str, &'static str, String, &'static str)> {
    vec![
        // Device
        ("Device", "t-dev-root", "spec: {}\nsepc: {}".into(), "sepc"),
        ("Device", "t-dev-spec", "spec: {descriptio: x}".into(), "spec.descriptio"),
        // at the root of each kind: labels belong in metadata
        ("DeviceGroup", "t-grp-root", "spec: {selectAll: true}\nlabels: {a: b}".into(), "labels"),
        (
            "FleetDeployment",
            "t-dep-root",
            "spec: {allowedGroups: [demo], workloads: []}\nlabels: {a: b}".into(),
            "labels",
        ),
        (
            "AgentRelease",
            "t-rel-root",
            format!("spec: {{allowedGroups: [demo], builds: [{BUILD}]}}\nlabels: {{a: b}}"),
            "labels",
        ),
        ("TaskRun", "t-run-root", format!("spec: {{{RUN_SPEC}}}\nlabels: {{a: b}}"), "labels"),
        (
            "TaskSchedule",
            "t-sch-root",
            format!("spec: {{schedule: {{cron: \"0 3 * * *\"}}, template: {{{RUN_SPEC}}}}}\nlabels: {{a: b}}"),
            "labels",
        ),
        // DeviceGroup
        ("DeviceGroup", "t-grp-spec", "spec: {devicez: [d-1]}".into(), "spec.devicez"),
        (
            "DeviceGroup",
            "t-grp-sel",
            "spec: {selector: {matchLabel: {site: a}}}".into(),
            "spec.selector.matchLabel",
        ),
        (
            "DeviceGroup",
            "t-grp-expr",
            "spec: {selector: {matchExpressions: [{key: k, operator: In, values: [a], valuez: [b]}]}}".into(),
            "spec.selector.matchExpressions[0].valuez",
        ),
        // FleetDeployment
        (
            "FleetDeployment",
            "t-dep-rollout",
            "spec: {allowedGroups: [demo], workloads: [], rollout: {maxUnavailabe: 1}}".into(),
            "spec.rollout.maxUnavailabe",
        ),
        (
            "FleetDeployment",
            "t-dep-spec",
            "spec: {allowedGroups: [demo], workloads: [], targetSelecter: {}}".into(),
            "spec.targetSelecter",
        ),
        (
            "FleetDeployment",
            "t-dep-sel",
            "spec: {allowedGroups: [demo], workloads: [], targetSelector: {matchLabel: {site: a}}}".into(),
            "spec.targetSelector.matchLabel",
        ),
        (
            "FleetDeployment",
            "t-dep-expr",
            "spec: {allowedGroups: [demo], workloads: [], targetSelector: {matchExpressions: [{key: k, operator: Exists, operater: In}]}}".into(),
            "spec.targetSelector.matchExpressions[0].operater",
        ),
        (
            "FleetDeployment",
            "t-dep-pull",
            "spec: {allowedGroups: [demo], workloads: [], imagePullSecrets: [{name: regcred, nmae: x}]}".into(),
            "spec.imagePullSecrets[0].nmae",
        ),
        // DeviceDiagnostics
        ("DeviceDiagnostics", "t-diag-root", "spec: {device: demo-1}\nlabels: {a: b}".into(), "labels"),
        ("DeviceDiagnostics", "t-diag-spec", "spec: {device: demo-1, linez: 5}".into(), "spec.linez"),
        // WorkloadPolicy
        ("WorkloadPolicy", "t-pol-root", "spec: {groups: [demo]}\nlabels: {a: b}".into(), "labels"),
        (
            "WorkloadPolicy",
            "t-pol-spec",
            "spec: {groups: [demo], capabilitys: [NET_ADMIN]}".into(),
            "spec.capabilitys",
        ),
        (
            "WorkloadPolicy",
            "t-pol-path",
            "spec: {groups: [demo], hostPaths: [{path: /srv, readOnly: true, readonly: false}]}".into(),
            "spec.hostPaths[0].readonly",
        ),
        // inside a fleet-wire workload (open in the CRD schema, validated by fleet-wire's own type)
        (
            "FleetDeployment",
            "t-dep-wl",
            "spec: {allowedGroups: [demo], workloads: [{name: web, imag: \"busybox:1\"}]}".into(),
            "spec.workloads[0]",
        ),
        // AgentRelease
        (
            "AgentRelease",
            "t-rel-spec",
            format!("spec: {{allowedGroups: [demo], builds: [{BUILD}], canarie: true}}"),
            "spec.canarie",
        ),
        (
            "AgentRelease",
            "t-rel-build",
            "spec: {allowedGroups: [demo], builds: [{architecture: amd64, version: 1.2.0, artifact: \"https://example.com/a\", sha256: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa, byteLimit: 1000, sha: x}]}".into(),
            "spec.builds[0].sha",
        ),
        (
            "AgentRelease",
            "t-rel-rollout",
            format!("spec: {{allowedGroups: [demo], builds: [{BUILD}], rollout: {{soakSecond: 60}}}}"),
            "spec.rollout.soakSecond",
        ),
        (
            "AgentRelease",
            "t-rel-sel",
            format!("spec: {{allowedGroups: [demo], builds: [{BUILD}], targetSelector: {{matchLabel: {{a: b}}}}}}"),
            "spec.targetSelector.matchLabel",
        ),
        (
            "AgentRelease",
            "t-rel-expr",
            format!("spec: {{allowedGroups: [demo], builds: [{BUILD}], targetSelector: {{matchExpressions: [{{key: k, operator: Exists, value: x}}]}}}}"),
            "spec.targetSelector.matchExpressions[0].value",
        ),
        // TaskRun (namespaced)
        (
            "TaskRun",
            "t-run-spec",
            format!("spec: {{{RUN_SPEC}, retries: 3}}"),
            "spec.retries",
        ),
        (
            "TaskRun",
            "t-run-sel",
            "spec: {allowedGroups: [demo], targetSelector: {matchLabel: {canary: \"true\"}}, deadlineSeconds: 600, systemUpgradeV1: {}}".into(),
            "spec.targetSelector.matchLabel",
        ),
        (
            "TaskRun",
            "t-run-expr",
            "spec: {allowedGroups: [demo], targetSelector: {matchExpressions: [{key: k, operator: Exists, valus: []}]}, deadlineSeconds: 600, systemUpgradeV1: {}}".into(),
            "spec.targetSelector.matchExpressions[0].valus",
        ),
        // TaskSchedule: the issue's `suspended: true`, then every depth of the template
        (
            "TaskSchedule",
            "t-sch-spec",
            format!("spec: {{schedule: {{cron: \"*/2 * * * *\"}}, suspended: true, template: {{{RUN_SPEC}}}}}"),
            "spec.suspended",
        ),
        (
            "TaskSchedule",
            "t-sch-tpl",
            format!("spec: {{schedule: {{cron: \"*/2 * * * *\"}}, template: {{{RUN_SPEC}, deadline: 5}}}}"),
            "spec.template.deadline",
        ),
        (
            "TaskSchedule",
            "t-sch-sel",
            "spec: {schedule: {cron: \"*/2 * * * *\"}, template: {allowedGroups: [demo], targetSelector: {matchLabel: {a: b}}, deadlineSeconds: 600, systemUpgradeV1: {}}}".into(),
            "spec.template.targetSelector.matchLabel",
        ),
        (
            "TaskSchedule",
            "t-sch-expr",
            "spec: {schedule: {cron: \"*/2 * * * *\"}, template: {allowedGroups: [demo], targetSelector: {matchExpressions: [{key: k, operator: Exists, vals: []}]}, deadlineSeconds: 600, systemUpgradeV1: {}}}".into(),
            "spec.template.targetSelector.matchExpressions[0].vals",
        ),
        // inside the schedule (validated by the schedule's own parser): a time-zone field does not exist
        (
            "TaskSchedule",
            "t-sch-tz",
            format!("spec: {{schedule: {{daily: {{at: \"03:00\", timeZone: Europe/Paris}}}}, template: {{{RUN_SPEC}}}}}"),
            "spec.schedule",
        ),
    ]
}

fn namespaced(kind: &str) -> bool {
    matches!(kind, "TaskRun" | "TaskSchedule")
}

fn document(kind: &str, name: &str, body: &str) -> String {
    let ns = if namespaced(kind) {
        "\n  namespace: default"
    } else {
        ""
    };
    format!("{API}\nkind: {kind}\nmetadata:\n  name: {name}{ns}\n{body}\n")
}

/// The parent object of a field path, its list indices as `[]`: `spec.a[0].b` → `spec.a[]`, `sepc` → ``.
fn parent(path: &str) -> String {
    let parent = path.rsplit_once('.').map_or("", |(p, _)| p);
    let mut out = String::new();
    let mut in_index = false;
    for c in parent.chars() {
        match c {
            '[' => {
                in_index = true;
                out.push_str("[]");
            }
            ']' => in_index = false,
            _ if in_index => {}
            _ => out.push(c),
        }
    }
    out
}

/// Every closed object (one that lists `properties`) under `spec` of a published schema, and the root.
fn closed_objects(node: &Value, path: &str, out: &mut BTreeSet<String>) {
    if let Some(props) = node["properties"].as_object() {
        out.insert(path.to_owned());
        for (k, child) in props {
            if path.is_empty() && k != "spec" {
                continue;
            }
            let at = if path.is_empty() {
                k.clone()
            } else {
                format!("{path}.{k}")
            };
            closed_objects(child, &at, out);
        }
    }
    if node["items"].is_object() {
        closed_objects(&node["items"], &format!("{path}[]"), out);
    }
}

/// The demo's cluster, one for the whole test binary (each test uses its own object names). Kept in a static, never
/// dropped: its processes are stopped, and its directories removed, once this test process is gone.
fn cluster() -> &'static Cluster {
    &demo().1
}

/// The demo's NATS server and cluster (see [`cluster`]).
fn demo() -> &'static (NatsServer, Cluster) {
    static C: OnceLock<(NatsServer, Cluster)> = OnceLock::new();
    C.get_or_init(|| {
        let nats = NatsServer::start();
        if let Some(pid) = nats.pid() {
            fleet_rig::kill_when_gone(&[pid]);
        }
        let c = Cluster::start(&nats.url());
        (nats, c)
    })
}

#[test]
fn the_demo_cluster_refuses_typos_at_every_depth_and_taskrun_edits() {
    let c = cluster();

    // every typo: refused by `kubectl apply`, naming its path; nothing stored
    let typos = typos();
    for (kind, name, body, path) in &typos {
        let doc = document(kind, name, body);
        let err = c
            .try_with_stdin(&["apply", "-f", "-"], &doc)
            .expect_err(&format!("{kind} {name} with {path} was accepted:\n{doc}"));
        let unknown = format!("{kind} \"{name}\": unknown field {path} ");
        let wire = format!("{kind} \"{name}\": {path}");
        assert!(
            err.contains("admission webhook") && (err.contains(&unknown) || err.contains(&wire)),
            "{kind} {name}: refused, but not naming {path} through the webhook:\n{err}"
        );
        let ns: &[&str] = if namespaced(kind) {
            &["-n", "default"]
        } else {
            &[]
        };
        let mut get = vec!["get", kind, name];
        get.extend_from_slice(ns);
        assert!(c.try_kubectl(&get).is_err(), "{kind} {name} was stored");
    }

    // every depth of every kind: each closed object of each published schema has a typo above
    let crds = c
        .get_json(&["crd"])
        .expect("kubectl get crd")
        .get("items")
        .cloned()
        .expect("items");
    let mut kinds = 0;
    for crd in crds.as_array().expect("list") {
        if crd["spec"]["group"] != "fleet.nationtech.io" {
            continue;
        }
        kinds += 1;
        let kind = crd["spec"]["names"]["kind"].as_str().expect("kind");
        let mut closed = BTreeSet::new();
        closed_objects(
            &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"],
            "",
            &mut closed,
        );
        let covered: BTreeSet<String> = typos
            .iter()
            .filter(|t| t.0 == kind)
            .map(|t| parent(t.3))
            .collect();
        let missing: Vec<&String> = closed.difference(&covered).collect();
        assert!(
            missing.is_empty(),
            "{kind}: no typo tried in {missing:?} (closed objects: {closed:?})"
        );
    }
    assert_eq!(kinds, 8, "every fleet kind");

    // the issue's own messages, exactly as a person reads them
    let err = c
        .try_with_stdin(
            &["apply", "-f", "-"],
            &document(
                "TaskSchedule",
                "upgrade-often",
                &format!("spec: {{schedule: {{cron: \"*/2 * * * *\"}}, suspended: true, template: {{{RUN_SPEC}}}}}"),
            ),
        )
        .expect_err("suspended refused");
    assert!(
        err.contains("TaskSchedule \"upgrade-often\": unknown field spec.suspended (refused rather than silently dropped; see docs/crds.md); known fields there: schedule, suspend, template"),
        "{err}"
    );

    // a TaskRun's spec cannot change; its labels can
    c.create(&document(
        "TaskRun",
        "upgrade",
        &format!("spec: {{{RUN_SPEC}}}"),
    ));
    let err = c
        .try_kubectl(&[
            "patch",
            "ftr",
            "upgrade",
            "-n",
            "default",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"allowedGroups":["demo","production"]}}"#,
        ])
        .expect_err("spec edit refused");
    assert!(
        err.contains("TaskRun spec is immutable") && err.contains("create a new TaskRun"),
        "{err}"
    );
    let run = c
        .get_json(&["ftr", "upgrade", "-n", "default"])
        .expect("run");
    assert_eq!(run["spec"]["allowedGroups"], serde_json::json!(["demo"]));
    c.kubectl(&["label", "ftr", "upgrade", "-n", "default", "note=x"]);

    // nor a DeviceDiagnostics' (its UID names the one request written to the device); its labels can
    c.create(&document(
        "DeviceDiagnostics",
        "ask-once",
        "spec: {device: demo-1, lines: 10}",
    ));
    let err = c
        .try_kubectl(&[
            "patch",
            "fdiag",
            "ask-once",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"lines":20}}"#,
        ])
        .expect_err("spec edit refused");
    assert!(
        err.contains("DeviceDiagnostics \"ask-once\": spec is immutable"),
        "{err}"
    );
    c.kubectl(&["label", "fdiag", "ask-once", "note=x"]);

    // the dashboard `scripts/demo --keep` prints: served by the demo's operator, with its token only
    let addr = c
        .dashboard_url()
        .strip_prefix("http://")
        .expect("an http URL")
        .to_owned();
    let token = c.dashboard_token().to_owned();
    let answered = fleet_rig::wait_for(std::time::Duration::from_secs(30), || {
        http_status(&addr, Some(&token)).filter(|s| *s == 200)
    });
    assert_eq!(
        answered,
        Some(200),
        "the dashboard at {addr} with its token"
    );
    assert_eq!(http_status(&addr, None), Some(401), "without the token");
    assert_eq!(http_status(&addr, Some("not-the-token")), Some(401));
}

/// The status code of `GET /` on `addr` (with `Authorization: Bearer <token>` when given); `None` when nothing
/// answers.
fn http_status(addr: &str, token: Option<&str>) -> Option<u16> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .ok()?;
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "GET / HTTP/1.1\r\nHost: {addr}\r\n{auth}Connection: close\r\n\r\n"
    )
    .ok()?;
    let mut head = [0u8; 12];
    s.read_exact(&mut head).ok()?;
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}

/// How long kube-controller-manager may take to collect what a deleted object owned (well under a second once its
/// garbage collector watches every resource, which `Cluster::start` waits for).
const COLLECTED: Duration = Duration::from_secs(60);

#[test]
fn deleting_a_task_schedule_deletes_its_runs_and_a_deleted_namespace_empties() {
    let c = cluster();
    // A schedule that does not fire during the test, and a run owned by it exactly as the scheduler creates one.
    c.apply(&document(
        "TaskSchedule",
        "nightly",
        &format!("spec: {{schedule: {{cron: \"0 3 * * *\"}}, template: {{{RUN_SPEC}}}}}"),
    ));
    let schedule = c
        .get_json(&["fts", "nightly", "-n", "default"])
        .expect("the schedule");
    let uid = schedule["metadata"]["uid"].as_str().expect("uid");
    c.create(&format!(
        "{API}\nkind: TaskRun\nmetadata:\n  name: nightly-by-hand\n  namespace: default\n  \
         labels: {{fleet.nationtech.io/schedule: nightly}}\n  ownerReferences:\n  \
         - {{apiVersion: fleet.nationtech.io/v1alpha1, kind: TaskSchedule, name: nightly, uid: {uid}, \
         controller: true, blockOwnerDeletion: true}}\nspec: {{{RUN_SPEC}}}\n"
    ));
    c.kubectl(&["delete", "fts", "nightly", "-n", "default"]);
    c.wait("the schedule's run deleted with it", COLLECTED, || {
        c.try_kubectl(&["get", "ftr", "nightly-by-hand", "-n", "default"])
            .is_err()
            .then_some(())
    });
    let left = c.kubectl(&[
        "get",
        "ftr",
        "-n",
        "default",
        "-l",
        "fleet.nationtech.io/schedule=nightly",
        "-o",
        "name",
    ]);
    assert_eq!(left.trim(), "", "no run of the deleted schedule is left");

    // A namespace deleted with a run in it goes, run and all (the namespace controller empties it first).
    c.kubectl(&["create", "namespace", "gc-probe"]);
    c.create(
        &document(
            "TaskRun",
            "in-a-namespace",
            &format!("spec: {{{RUN_SPEC}}}"),
        )
        .replace("namespace: default", "namespace: gc-probe"),
    );
    c.kubectl(&["delete", "namespace", "gc-probe", "--wait=false"]);
    c.wait("the deleted namespace gone", COLLECTED, || {
        c.try_kubectl(&["get", "namespace", "gc-probe"])
            .is_err()
            .then_some(())
    });
}

/// Where the product tells a person what to run in the cluster: the docs, the example alerting rules, the README and
/// the operator's texts (alerts, status and event messages, `--help`).
fn cluster_sources() -> Vec<String> {
    let mut s = instructions::files("docs", ".md");
    s.push("docs/dashboard/prometheus-rules.yaml".into());
    s.push("README.md".into());
    s.extend(instructions::files("operator/src", ".rs"));
    s
}

/// Printed commands that name a verb (and kind) in passing, acting on no object: kubectl must know them as
/// written (`<command> --help` exits 0).
const MENTIONS: [&str; 9] = [
    "kubectl",
    "kubectl apply",
    "kubectl create",
    "kubectl delete fdev",
    "kubectl delete ftr",
    "kubectl describe",
    "kubectl explain",
    "kubectl get -o yaml",
    "kubectl port-forward",
];

/// Printed commands that install the operator as a cluster's admin does: run with `--dry-run=server` (the API
/// server checks every object, admission included, and stores none), so that they do not replace this cluster's
/// own install, whose webhooks point at the local operator.
const INSTALLS: [&str; 2] = [
    "kubectl apply -k operator/deploy",
    "kubectl apply -f operator/deploy/crds.yaml -f operator/deploy/rbac.yaml -f operator/deploy/deployment.yaml -f operator/deploy/webhook.yaml",
];

/// The demo's devices as `scripts/demo` has them (`vm-tests/src/demo.rs`): each publishes its device info (an
/// agent that can run the system upgrade), the operator makes its Device, which is labelled as the demo labels it;
/// and the demo's group `demo`.
fn set_up_as_the_demo(nats: &NatsServer, c: &Cluster) {
    use fleet_vm_tests::demo::DEVICES;
    let js = fleet_rig::nats_client::jetstream::new(nats.connect());
    let info = fleet_rig::wait_for(Duration::from_secs(60), || {
        js.key_value(kv::DEVICE_INFO).ok()
    })
    .expect("the operator creates its buckets");
    for d in DEVICES {
        let mut i = fleet_wire::fixtures::device_info();
        i.device_id = fleet_wire::DeviceId::try_from(d).expect("id");
        i.architecture = fleet_wire::Architecture::current().expect("a fleet architecture");
        info.put(d, serde_json::to_vec(&i).expect("json"))
            .expect("put device info");
    }
    for d in DEVICES {
        c.wait(
            &format!("the operator making Device {d}"),
            Duration::from_secs(60),
            || c.try_kubectl(&["get", "fdev", d]).ok(),
        );
    }
    c.kubectl(&["label", "fdev", DEVICES[0], "canary=true"]);
    c.kubectl(&["label", "fdev", "--all", "site=demo"]);
    c.apply(&fleet_vm_tests::local_fleet::group_yaml(
        "demo",
        &[("site", "demo")],
    ));
}

#[test]
fn every_printed_kubectl_command_runs_and_the_readme_examples_work_on_the_demo() {
    let (nats, c) = demo();
    set_up_as_the_demo(nats, c);
    // The objects the examples name, made by hand.
    c.apply(&format!(
        "{API}\nkind: Device\nmetadata:\n  name: pi-7\n  annotations: {{fleet.nationtech.io/hold-workloads: \"true\"}}\nspec: {{}}\n"
    ));
    c.apply(&document(
        "DeviceGroup",
        "everything",
        "spec: {selectAll: true}",
    ));
    c.apply(&document(
        "DeviceGroup",
        "printed-none",
        "spec: {selector: {matchLabels: {printed: none}}}",
    ));
    c.apply(&document(
        "AgentRelease",
        "agent-1-2-0",
        &format!("spec: {{allowedGroups: [printed-none], builds: [{BUILD}]}}"),
    ));
    c.create(&document(
        "TaskRun",
        "printed-name",
        &format!("spec: {{{RUN_SPEC}}}"),
    ));
    // `<name>` in a Device's instructions, and the deployment the rollout docs retry.
    c.apply(&format!(
        "{API}\nkind: Device\nmetadata:\n  name: printed-name\nspec: {{}}\n"
    ));
    c.apply(&document(
        "FleetDeployment",
        "web",
        "spec: {allowedGroups: [printed-none], workloads: []}",
    ));

    let commands = instructions::printed(&cluster_sources(), &["kubectl"]);
    for expected in [
        "kubectl annotate frel agent-1-2-0 fleet.nationtech.io/retry=2026-12-01-a --overwrite",
        "kubectl get events -A --field-selector reason=DeviceRollbackFailed",
        INSTALLS[1],
    ] {
        assert!(
            commands.iter().any(|(_, cmd)| cmd == expected),
            "`{expected}` is among the printed commands: {commands:#?}"
        );
    }
    let root = fleet_rig::util::workspace_root();
    let bin_dir = c
        .kubectl_bin()
        .parent()
        .expect("kubectl's directory")
        .to_owned();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut bad = Vec::new();
    let mut ran = 0;
    let mut retired = 0;
    for (src, printed) in &commands {
        let command = if MENTIONS.contains(&printed.as_str()) {
            format!("{printed} --help")
        } else if INSTALLS.contains(&printed.as_str()) {
            format!("{printed} --dry-run=server")
        } else if printed.starts_with("kubectl delete fdev ") {
            // Retiring a device (docs/device-lifecycle.md) takes its Device for good: each printed retirement
            // retires a Device of its own, made for it, never one the other commands name (the name it prints,
            // a placeholder or an example, is replaced).
            retired += 1;
            let name = format!("printed-retired-{retired}");
            c.apply(&format!(
                "{API}\nkind: Device\nmetadata:\n  name: {name}\nspec: {{}}\n"
            ));
            let mut words: Vec<&str> = printed.split_whitespace().collect();
            words[3] = &name;
            words.join(" ")
        } else {
            printed.replace("<name>", "printed-name")
        };
        // `<<<` and a here-document (`<<'EOF'`) are not placeholders.
        let first_line = command.lines().next().unwrap_or_default();
        if first_line.contains('<')
            && !first_line.contains("<<<")
            && !first_line.ends_with("<<'EOF'")
        {
            bad.push(format!(
                "{src}: `{printed}`: a placeholder this test does not fill"
            ));
            continue;
        }
        // As a person runs it: in a shell at the repository's root, kubectl on PATH, the demo's kubeconfig.
        let out = std::process::Command::new("timeout")
            .args(["60", "bash", "-c", &command])
            .current_dir(&root)
            .env("KUBECONFIG", c.kubeconfig())
            .env("PATH", &path)
            .stdin(std::process::Stdio::null())
            .output()
            .expect("run bash");
        ran += 1;
        if !out.status.success() {
            bad.push(format!(
                "{src}: `{command}`: {}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
    }
    assert!(
        bad.is_empty(),
        "printed commands kubectl does not run as printed ({} of {ran}):\n{}",
        bad.len(),
        bad.join("\n")
    );

    // The README's TaskRun example (created above as printed) names groups the demo has, and runs on its devices,
    // the canary first.
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let mut groups = BTreeSet::new();
    for part in readme.split("\"allowedGroups\":[").skip(1) {
        let list = part.split(']').next().unwrap_or_default();
        groups.extend(
            list.split(',')
                .map(|g| g.trim().trim_matches('"').to_owned()),
        );
    }
    assert!(!groups.is_empty(), "the README has a TaskRun example");
    for g in &groups {
        assert!(
            c.try_kubectl(&["get", "fdg", g]).is_ok(),
            "the README's example names group {g}, which the demo does not have"
        );
    }
    let run = c.wait(
        "the README's TaskRun running on the demo's devices",
        Duration::from_secs(60),
        || {
            let run = c.get_json(&["ftr", "upgrade-1"])?;
            (run["status"]["phase"] == "Running").then_some(run)
        },
    );
    assert_eq!(
        run["status"]["targets"],
        fleet_vm_tests::demo::DEVICES.len(),
        "{run:#}"
    );
}

/// The set-up script, spelt in two pieces so that this file's own mentions are not read as instructions.
const SETUP: &str = concat!("scripts", "/setup");

/// How docs name a part in prose (setup part, then the name in backticks), spelt so as not to match here.
const PART_MARK: &str = concat!("setup part ", "`");

/// The parts of the set-up script: each `scripts/setup.d/NN-<part>.sh`.
fn setup_parts() -> BTreeSet<String> {
    instructions::files(&format!("{SETUP}.d"), ".sh")
        .iter()
        .filter_map(|f| {
            let name = f.rsplit('/').next()?.strip_suffix(".sh")?;
            Some(name.split_once('-')?.1.to_string())
        })
        .collect()
}

/// The part names a text tells a person to give the set-up script: the words after `scripts/setup ` (the first
/// one always; then as long as they are parts, as in `scripts/setup nats apt cross`), and `setup part \`X\``.
fn named_parts(text: &str, parts: &BTreeSet<String>) -> Vec<String> {
    let mut out = Vec::new();
    for (i, _) in text.match_indices(SETUP) {
        let Some(rest) = text[i + SETUP.len()..].strip_prefix(' ') else {
            continue;
        };
        for (n, word) in rest.split_whitespace().enumerate() {
            let bare = word.trim_end_matches(['`', ')', ',', '.', ';', ':', '"', '\'']);
            let name_shaped = !bare.is_empty()
                && bare
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !bare.starts_with('-');
            if !name_shaped || (n > 0 && !parts.contains(bare)) {
                break;
            }
            out.push(bare.to_string());
            if bare.len() != word.len() {
                break;
            }
        }
    }
    for (i, _) in text.match_indices(PART_MARK) {
        let rest = &text[i + PART_MARK.len()..];
        if let Some((name, _)) = rest.split_once('`') {
            out.push(name.to_string());
        }
    }
    out
}

/// Every `scripts/setup <part>` a doc, script, message or test tells a person to run names a real part, and the
/// script refuses an unknown one (exit 2) with the list of parts.
#[test]
fn every_setup_part_named_anywhere_exists_and_an_unknown_one_is_refused() {
    let parts = setup_parts();
    assert!(
        parts.contains("package") && parts.contains("qemu-arm64"),
        "{parts:?}"
    );
    let mut sources = vec!["README.md".to_string()];
    for dir in [
        "docs", "scripts", "vm-tests", "agent", "updater", "operator", "wire",
    ] {
        sources.extend(instructions::files(dir, ""));
    }
    let root = fleet_rig::util::workspace_root();
    let (mut bad, mut seen) = (Vec::new(), 0);
    for src in &sources {
        let Ok(text) = std::fs::read_to_string(root.join(src)) else {
            continue;
        };
        for name in named_parts(&text, &parts) {
            seen += 1;
            if !parts.contains(&name) {
                bad.push(format!("{src}: {SETUP} {name}"));
            }
        }
    }
    assert!(
        seen > 10,
        "found only {seen} part names: the scan is broken"
    );
    assert!(
        bad.is_empty(),
        "part names that do not exist (the parts: {parts:?}):\n{}",
        bad.join("\n")
    );
    assert_eq!(
        named_parts(&format!("run {SETUP} lintian (or)"), &parts),
        ["lintian"],
        "the scan reads a message's part"
    );

    let script = root.join(SETUP);
    let out = std::process::Command::new(&script)
        .arg("nosuchpart")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("no part named 'nosuchpart'"), "{err}");
    for p in &parts {
        assert!(err.contains(p.as_str()), "{p} missing from: {err}");
    }
    let list = std::process::Command::new(&script)
        .arg("--list")
        .output()
        .unwrap();
    assert!(list.status.success());
    let listed: BTreeSet<String> = String::from_utf8_lossy(&list.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(listed, parts);
}
