//! The operator's container image, the way a cluster admin ships it: `kubectl apply -k operator/deploy` against a
//! real kube-apiserver (namespace, CRDs, RBAC, Deployment, webhook, Service), the image built offline by
//! `scripts/operator-image` and run under Podman as the `fleet-operator` service account, talking to a real NATS.
//! A device's info in NATS becomes a Device; a DeviceGroup and a FleetDeployment for it are reconciled: the
//! deployment counts the device and its desired state appears in NATS.

use fleet_rig::kube::KubeApiServer;
use fleet_rig::nats_client as nats;
use fleet_rig::podman::PodmanService;
use fleet_rig::{wait_for, workspace_root, NatsServer};
use fleet_vm_tests::builds;
use fleet_vm_tests::local_fleet::{deployment_yaml, group_yaml};
use fleet_wire::kv;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const DEVICE: &str = "img-1";
const IMAGE: &str = "localhost/fleet-operator:test";

fn kubectl(config: &Path, args: &[&str], stdin: Option<&str>) -> String {
    use std::io::Write;
    let mut cmd = Command::new(builds::kubectl());
    cmd.arg("--request-timeout=30s")
        .arg("--kubeconfig")
        .arg(config)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("kubectl: {e}"));
    if let Some(text) = stdin {
        let _ = child.stdin.take().map(|mut s| s.write_all(text.as_bytes()));
    }
    let out = child
        .wait_with_output()
        .unwrap_or_else(|e| panic!("kubectl: {e}"));
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

#[test]
fn the_operator_image_reconciles_a_fleet_deployment() {
    let nats = NatsServer::start();
    let api = KubeApiServer::start();
    let podman = PodmanService::start();
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let admin = dir.path().join("admin.kubeconfig");
    std::fs::write(&admin, api.kubeconfig(api.token())).unwrap_or_else(|e| panic!("{e}"));

    // The manifests, as an admin applies them.
    let applied = kubectl(
        &admin,
        &[
            "apply",
            "-k",
            &workspace_root()
                .join("operator/deploy")
                .display()
                .to_string(),
        ],
        None,
    );
    for want in [
        "namespace/harmony-fleet",
        "serviceaccount/fleet-operator",
        "clusterrolebinding.rbac.authorization.k8s.io/fleet-operator",
        "deployment.apps/fleet-operator",
        "service/fleet-operator-webhook",
        "validatingwebhookconfiguration.admissionregistration.k8s.io/fleet-operator-taskruns",
        "customresourcedefinition.apiextensions.k8s.io/fleetdeployments.fleet.nationtech.io",
    ] {
        assert!(applied.contains(want), "missing {want:?} in:\n{applied}");
    }
    let image = kubectl(
        &admin,
        &[
            "-n",
            "harmony-fleet",
            "get",
            "deploy",
            "fleet-operator",
            "-o",
            "jsonpath={.spec.template.spec.containers[0].image}",
        ],
        None,
    );
    assert_eq!(image, "ghcr.io/nationtech/fleet-operator:0.1.0");
    // The webhooks call the in-cluster Service, which nothing routes to here (the rig has no kubelet or
    // kube-proxy), and they fail closed: every fleet object would be refused. The webhooks themselves are tested
    // against the real apiserver through a URL (operator/tests: Fleet::webhook); this test is the image.
    kubectl(
        &admin,
        &[
            "delete",
            "validatingwebhookconfiguration",
            "fleet-operator-taskruns",
        ],
        None,
    );
    kubectl(
        &admin,
        &[
            "wait",
            "--for",
            "condition=established",
            "--timeout=60s",
            "crd/devices.fleet.nationtech.io",
            "crd/devicegroups.fleet.nationtech.io",
            "crd/fleetdeployments.fleet.nationtech.io",
        ],
        None,
    );

    // The image, built offline from this build's binaries.
    let bins = dir.path().join("bin");
    std::fs::create_dir_all(&bins).unwrap_or_else(|e| panic!("{e}"));
    for (from, name) in [
        (builds::operator(), "fleet-operator"),
        (builds::fleetlock_server(), "fleetlock-server"),
        (builds::fleet_auth(), "fleet-auth"),
    ] {
        std::fs::copy(&from, bins.join(name)).unwrap_or_else(|e| panic!("copy {from:?}: {e}"));
    }
    let built = podman
        .bind_script(&mut Command::new(
            workspace_root().join("scripts/operator-image"),
        ))
        .args(["--tag", IMAGE, "--bin-dir"])
        .arg(&bins)
        .output()
        .unwrap_or_else(|e| panic!("scripts/operator-image: {e}"));
    assert!(
        built.status.success(),
        "scripts/operator-image failed:\n{}",
        String::from_utf8_lossy(&built.stderr)
    );

    // The operator's credentials, mounted read-only and readable by the image's nonroot user.
    let creds = dir.path().join("creds");
    std::fs::create_dir_all(&creds).unwrap_or_else(|e| panic!("{e}"));
    let config = api.kubeconfig(api.operator_token());
    let ca = config
        .lines()
        .find_map(|l| l.trim().strip_prefix("certificate-authority: "))
        .unwrap_or_else(|| panic!("no CA in the kubeconfig"))
        .to_string();
    std::fs::copy(&ca, creds.join("ca.crt")).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(
        creds.join("kubeconfig"),
        config.replace(&ca, "/etc/fleet-operator/kube/ca.crt"),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    use std::os::unix::fs::PermissionsExt;
    for f in ["ca.crt", "kubeconfig"] {
        std::fs::set_permissions(creds.join(f), std::fs::Permissions::from_mode(0o644))
            .unwrap_or_else(|e| panic!("{e}"));
    }
    std::fs::set_permissions(&creds, std::fs::Permissions::from_mode(0o755))
        .unwrap_or_else(|e| panic!("{e}"));
    let nats_url = format!("nats://127.0.0.1:{}", nats.port());
    podman.podman(&[
        "run",
        "-d",
        "--name",
        "fleet-operator-image",
        "--network",
        "host",
        "-v",
        &format!("{}:/etc/fleet-operator/kube:ro", creds.display()),
        "-e",
        "KUBECONFIG=/etc/fleet-operator/kube/kubeconfig",
        "-e",
        "POD_NAME=fleet-operator-image",
        IMAGE,
        "--nats-url",
        &nats_url,
    ]);
    let logs = || podman.podman(&["logs", "fleet-operator-image"]);
    assert_eq!(
        podman.podman(&["inspect", "-f", "{{.Config.User}}", "fleet-operator-image"]),
        "65532:65532"
    );

    // A device reports its info (the operator creates the buckets at start); it becomes a Device.
    let conn = nats.connect();
    let js = nats::jetstream::new(conn);
    let mut info = fleet_wire::fixtures::device_info();
    info.device_id = fleet_wire::DeviceId::try_from(DEVICE).unwrap_or_else(|e| panic!("{e}"));
    let value = serde_json::to_vec(&info).unwrap_or_else(|e| panic!("{e}"));
    let put = wait_for(Duration::from_secs(60), || {
        js.key_value(kv::DEVICE_INFO)
            .ok()?
            .put(DEVICE, value.clone())
            .ok()
    });
    assert!(put.is_some(), "no device-info bucket:\n{}", logs());
    let device = wait_for(Duration::from_secs(60), || {
        let (ok, _) = try_kubectl(&admin, &["get", "fdev", DEVICE]);
        ok.then_some(())
    });
    assert!(device.is_some(), "no Device {DEVICE}:\n{}", logs());
    kubectl(&admin, &["label", "fdev", DEVICE, "site=lab"], None);
    kubectl(
        &admin,
        &["apply", "-f", "-"],
        Some(&group_yaml("lab", &[("site", "lab")])),
    );
    kubectl(
        &admin,
        &["apply", "-f", "-"],
        Some(&deployment_yaml("web", "lab", "web")),
    );

    let targeted = wait_for(Duration::from_secs(90), || {
        let (ok, out) = try_kubectl(
            &admin,
            &[
                "get",
                "fdep",
                "web",
                "-o",
                "jsonpath={.status.targetedDevices}",
            ],
        );
        (ok && out.trim() == "1").then_some(())
    });
    assert!(
        targeted.is_some(),
        "FleetDeployment web never targeted the device:\n{}",
        logs()
    );
    let desired = wait_for(Duration::from_secs(60), || {
        let raw = js.key_value(kv::DESIRED_STATE).ok()?.get(DEVICE).ok()??;
        let d: fleet_wire::DesiredState = serde_json::from_slice(&raw).ok()?;
        Some(d)
    })
    .unwrap_or_else(|| panic!("no desired state for {DEVICE} in NATS:\n{}", logs()));
    let text = serde_json::to_string(&desired).unwrap_or_default();
    assert!(text.contains("\"web\""), "{text}");
    assert_eq!(
        podman.podman(&[
            "inspect",
            "-f",
            "{{.State.Running}}",
            "fleet-operator-image"
        ]),
        "true"
    );
}

fn try_kubectl(config: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(builds::kubectl())
        .arg("--request-timeout=30s")
        .arg("--kubeconfig")
        .arg(config)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("kubectl: {e}"));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string(),
    )
}
