//! Real applications as a person runs them (docs/crds.md), every part real: `kubectl` → kube-apiserver + etcd → the
//! `fleet-operator` binary (its admission webhook, its dashboard) → nats-server over TLS with the auth callout →
//! three nspawn Debian devices installed with device setup, two in the group `apps` the deployments target and
//! one outside it; a private registry (Debian's `docker-registry` with htpasswd authentication, TLS with a
//! private CA). The devices are set up once and the steps run on them in order:
//!
//! 1. The registry is reachable from the devices and they trust its CA the way docs/device-setup.md ("Private
//!    registries") tells a person: `/etc/containers/certs.d/<host:port>/ca.crt`. A busybox image is pushed to it;
//!    without credentials a device is refused (`unauthorized`), not failed on the certificate.
//! 2. `kubectl create secret docker-registry regcred` and a FleetDeployment with `imagePullSecrets: [regcred]`:
//!    running on the two targeted devices (`kubectl get fdep`, the Devices, Podman in the guests); the third never
//!    got the credentials (its `device-secrets` key is absent) nor the container.
//! 3. A changed registry password and Secret (`kubectl create secret … --dry-run=client -o yaml | kubectl apply`),
//!    then a new tag: pulled and running. A wrong password and a new tag: `image-pull-failed` with `unauthorized`,
//!    the old container keeps running (same container id).
//! 4. `kubectl create secret generic api` as an environment variable and as a file: the container sees both (the
//!    file mode 0400, owned by uid 0), `kubectl get fdep -o yaml` does not.
//! 5. A workload asking for `/dev/ttyS0` and `NET_ADMIN`: refused by the admission webhook naming the policy;
//!    after a WorkloadPolicy allows them for the group, running, with the node and the capability in the
//!    container.
//! 6. No password or secret value in any status (`kubectl get fdep,fdev -o yaml`), any Event, any log line of the
//!    run (operator, fleet-auth, nats-server, every device's journal) or any dashboard page.
//!
//! The OOM-kill acceptance is QEMU's (nspawn guests here cannot enforce memory limits: hybrid cgroups).

use fleet_rig::nats_client as nats;
use fleet_rig::registry::Registry;
use fleet_vm_tests::fleet::{Device, TEST_IMAGE};
use fleet_vm_tests::local_fleet::{
    base64, group_yaml, kv_entry, reported_workload, LocalFleet, API_VERSION, SECRETS_NS,
};
use fleet_wire::{kv, FailureReason, WorkloadState};
use std::time::{Duration, Instant};

/// The devices the deployments target (labelled `role=app`, the group `apps`).
const TARGETED: [&str; 2] = ["app-1", "app-2"];
/// The device outside the group.
const OUTSIDE: &str = "app-3";
/// The group of the targeted devices.
const GROUP: &str = "apps";
/// The registry user and its passwords: the first, the rotated one, and one the registry never had. Long and
/// distinctive so that a search of the logs for them cannot match by chance.
const REGISTRY_USER: &str = "fleet-puller";
const PASSWORD_1: &str = "pw1-Kq7ZrT9vLm2XwB4nHc8J";
const PASSWORD_2: &str = "pw2-Yd3FgP6sQa1RtE5uVz0M";
const WRONG_PASSWORD: &str = "pw3-Wrong8NhL4xCj7oIbS2e";
/// The application secret's value.
const API_TOKEN: &str = "tok-Gm5Vq8Rw2Zs7Lp3Nx9Ka4Hd";
/// Where the application secret is mounted as a file in the container.
const TOKEN_FILE: &str = "/run/secrets/api-token";
/// One step (a pull and a start on two loaded cores) well within this.
const STEP_TIMEOUT: Duration = Duration::from_secs(180);

fn logs(fleet: &LocalFleet) -> String {
    fleet.device_logs()
        + &format!(
            "\n--- fleet-operator ---\n{}",
            fleet.cluster.operator_log(60)
        )
}

/// `sh -c <script>` inside the container `fleet-<workload>` on `device` (`podman exec`): its output; fails the
/// test when it fails. The test images link only a few busybox applets (`sh`, `cat`, `echo`, `ls`, `sleep`).
fn in_container(device: &Device, workload: &str, script: &str) -> String {
    let (ok, out) = device.podman(&format!("exec fleet-{workload} sh -c '{script}' 2>&1"));
    assert!(
        ok,
        "{}: `{script}` in fleet-{workload} failed: {out}",
        device.id
    );
    out
}

/// A FleetDeployment `name` on the group [`GROUP`] with one workload `name` of `image` running `sleep`, with
/// `extra` (already indented as workload fields) and `spec_extra` (as spec fields).
fn deployment(name: &str, image: &str, extra: &str, spec_extra: &str) -> String {
    format!(
        "apiVersion: {API_VERSION}\nkind: FleetDeployment\nmetadata:\n  name: {name}\nspec:\n  \
         allowedGroups: [{GROUP}]\n  targetSelector: {{}}\n{spec_extra}  workloads:\n    - name: {name}\n      \
         image: {image}\n      command: [sleep, \"100000\"]\n{extra}"
    )
}

/// The container `fleet-<workload>` on `device`: (container id, image, running).
fn container(device: &Device, workload: &str) -> Option<(String, String, bool)> {
    let c = device.container(&format!("fleet-{workload}"))?;
    Some((
        c["Id"].as_str()?.to_string(),
        c["ImageName"].as_str().unwrap_or_default().to_string(),
        c["State"]["Running"] == true,
    ))
}

/// The dockerconfigjson Secret `regcred` for `registry` with `password`, created or changed in one command.
fn regcred(fleet: &LocalFleet, registry: &str, password: &str) {
    fleet.apply_secret(&[
        "docker-registry",
        "regcred",
        &format!("--docker-server={registry}"),
        &format!("--docker-username={REGISTRY_USER}"),
        &format!("--docker-password={password}"),
    ]);
}

/// Waits until every targeted device's `device-secrets` key holds `password` for `registry` (read as the services'
/// own NATS user): a changed Secret reaches the devices before the change that needs it is applied, so that the
/// pull after it is the one the step is about.
fn wait_credentials(
    fleet: &LocalFleet,
    secrets: &nats::kv::Store,
    registry: &str,
    password: &str,
    what: &str,
) {
    for d in TARGETED {
        fleet.cluster.wait(
            &format!("{d} given the {what} (device-secrets/{d})"),
            Duration::from_secs(60),
            || {
                let (s, _): (fleet_wire::DeviceSecrets, _) = kv_entry(secrets, d)?;
                (s.registries.get(registry)?.password.0 == password).then_some(())
            },
        );
    }
}

/// A dashboard page as a person's browser gets it (the bearer token the operator was started with).
fn page(fleet: &LocalFleet, path: &str) -> String {
    let out = std::process::Command::new("curl")
        .args(["-sf", "--max-time", "10", "-H"])
        .arg(format!(
            "Authorization: Bearer {}",
            fleet.cluster.dashboard_token()
        ))
        .arg(format!("{}{path}", fleet.cluster.dashboard_url()))
        .output()
        .unwrap_or_else(|e| panic!("curl: {e}"));
    assert!(
        out.status.success(),
        "dashboard {path}: curl exited with {}",
        out.status
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn private_images_secrets_and_hardware_reach_only_the_targeted_devices() {
    let started = Instant::now();
    let ids: Vec<&str> = TARGETED.iter().copied().chain([OUTSIDE]).collect();
    let mut fleet = LocalFleet::start(&ids);
    eprintln!("three devices set up in {:?}", started.elapsed());
    for d in TARGETED {
        fleet.cluster.kubectl(&["label", "fdev", d, "role=app"]);
    }
    fleet.cluster.apply(&group_yaml(GROUP, &[("role", "app")]));

    // 1. The private registry, trusted by every device as docs/device-setup.md says.
    let mut registry =
        Registry::start_with_htpasswd(&fleet.artifacts.ca, REGISTRY_USER, PASSWORD_1);
    let host = registry.host();
    let port: u16 = host
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("registry host {host}"));
    let ca_pem = fleet.artifacts.ca_pem();
    fleet.trust_registry(&host, port, &ca_pem);
    let image = |tag: &str| format!("{host}/apps/busybox:{tag}");
    registry.push_busybox("apps/busybox", "1");
    // Without credentials a device is refused by the registry, after TLS succeeded with the trusted CA.
    let (ok, out) = fleet
        .device(OUTSIDE)
        .podman(&format!("pull {} 2>&1", image("1")));
    assert!(
        !ok && (out.contains("unauthorized") || out.contains("authentication required")),
        "an anonymous pull from the private registry: {out}"
    );
    eprintln!(
        "step 1 (private registry trusted by the devices) done at {:?}",
        started.elapsed()
    );

    // 2. Registry credentials from a dockerconfigjson Secret, only to the targeted devices.
    // Created as docs/secrets.md shows a person; changed later with the create | apply of `regcred`.
    fleet.cluster.kubectl(&[
        "-n",
        SECRETS_NS,
        "create",
        "secret",
        "docker-registry",
        "regcred",
        &format!("--docker-server={host}"),
        &format!("--docker-username={REGISTRY_USER}"),
        &format!("--docker-password={PASSWORD_1}"),
    ]);
    let pull_secrets = "  imagePullSecrets: [{name: regcred}]\n";
    fleet
        .cluster
        .apply(&deployment("app", &image("1"), "", pull_secrets));
    fleet.cluster.wait(
        "app running on the two targeted devices (kubectl get fdep)",
        STEP_TIMEOUT,
        || fleet.running_on("app", 2),
    );
    let row = fleet.cluster.kubectl(&["get", "fdep", "app"]);
    eprintln!("kubectl get fdep app:\n{row}");
    for d in TARGETED {
        let (_, img, running) = container(fleet.device(d), "app")
            .unwrap_or_else(|| panic!("{d} has no fleet-app\n{}", logs(&fleet)));
        assert!(running && img == image("1"), "{d}: {img} running={running}");
        let w =
            fleet.cluster.get_json(&["fdev", d]).expect("Device")["status"]["workloads"].clone();
        assert_eq!(w["running"], 1, "{d}'s Device status: {w:#}");
    }
    let js = nats::jetstream::new(fleet.nats.connect());
    let secrets = js
        .key_value(kv::DEVICE_SECRETS)
        .unwrap_or_else(|e| panic!("open {}: {e}", kv::DEVICE_SECRETS));
    for d in TARGETED {
        let s: fleet_wire::DeviceSecrets = kv_entry(&secrets, d)
            .unwrap_or_else(|| panic!("no device-secrets/{d}"))
            .0;
        assert!(
            s.registries.contains_key(&host),
            "{d}'s credentials name {:?}, not {host}",
            s.registries.keys().collect::<Vec<_>>()
        );
    }
    // A few passes later the third device still has neither credentials nor container.
    // why: no event marks an operator pass that left a device out; a few passes' window is the assertion
    std::thread::sleep(Duration::from_secs(5));
    assert!(
        secrets.entry(OUTSIDE).ok().flatten().is_none(),
        "{OUTSIDE}, outside the deployment, was given registry credentials"
    );
    assert!(
        fleet.device(OUTSIDE).container("fleet-app").is_none(),
        "{OUTSIDE} runs fleet-app"
    );
    let (_, images) = fleet
        .device(OUTSIDE)
        .podman("images --format '{{.Repository}}'");
    assert!(!images.contains(&host), "{OUTSIDE} pulled: {images}");
    eprintln!(
        "step 2 (pulled with a dockerconfigjson Secret on the targeted devices only) done at {:?}",
        started.elapsed()
    );

    // 3. Rotation: a new password at the registry and in the Secret, then a new tag.
    registry.set_password(PASSWORD_2);
    regcred(&fleet, &host, PASSWORD_2);
    wait_credentials(&fleet, &secrets, &host, PASSWORD_2, "rotated password");
    registry.push_busybox("apps/busybox", "2");
    fleet
        .cluster
        .apply(&deployment("app", &image("2"), "", pull_secrets));
    fleet.cluster.wait(
        "app:2 pulled with the rotated password and running on both",
        STEP_TIMEOUT,
        || {
            fleet.running_on("app", 2)?;
            TARGETED
                .iter()
                .all(|d| {
                    container(fleet.device(d), "app").is_some_and(|(_, i, r)| r && i == image("2"))
                })
                .then_some(())
        },
    );
    let before: Vec<(String, String, bool)> = TARGETED
        .iter()
        .map(|d| container(fleet.device(d), "app").expect("fleet-app"))
        .collect();
    // A wrong password and a new tag: refused by the registry, reported, and the old container keeps running.
    regcred(&fleet, &host, WRONG_PASSWORD);
    wait_credentials(&fleet, &secrets, &host, WRONG_PASSWORD, "wrong password");
    registry.push_busybox("apps/busybox", "3");
    fleet
        .cluster
        .apply(&deployment("app", &image("3"), "", pull_secrets));
    let reports = js
        .key_value(kv::WORKLOAD_STATUS)
        .expect("workload-status bucket");
    for d in TARGETED {
        let (report, _) = fleet.cluster.wait(
            &format!("{d} reports app failed to pull"),
            STEP_TIMEOUT,
            || reported_workload(&reports, d, "app", WorkloadState::Failed),
        );
        let failure = report.failure.as_ref().expect("failure");
        let error = report
            .error
            .as_ref()
            .map(|e| e.as_str())
            .unwrap_or_default();
        eprintln!("{d} reports: {error}");
        assert_eq!(failure.reason, FailureReason::ImagePullFailed, "{report:?}");
        assert!(
            error.starts_with("image-pull-failed: unauthorized"),
            "{d}: {report:?}"
        );
    }
    let status = fleet.cluster.wait(
        "kubectl get fdep app shows the pull error",
        Duration::from_secs(60),
        || {
            let w = fleet.cluster.get_json(&["fdep", "app"])?["status"]["workloads"].clone();
            w["latestError"]
                .as_str()
                .filter(|e| e.contains("unauthorized"))
                .map(str::to_string)
        },
    );
    eprintln!("kubectl get fdep app: latestError {status}");
    for (d, old) in TARGETED.iter().zip(&before) {
        assert_eq!(
            container(fleet.device(d), "app").as_ref(),
            Some(old),
            "{d}'s running container was touched by a pull that failed"
        );
    }
    // With credentials on the devices and a pull error in the status: nothing shows them.
    assert_not_shown(&fleet, &["app"]);
    // Back to the right password, so that what remains of the run pulls as a person's fleet would.
    regcred(&fleet, &host, PASSWORD_2);
    fleet.cluster.kubectl(&["delete", "fdep", "app"]);
    eprintln!(
        "step 3 (rotation works; a wrong password fails unauthorized and keeps the old container) done at {:?}",
        started.elapsed()
    );

    // 4. An application secret as an environment variable and as a read-only file.
    fleet.apply_secret(&[
        "generic",
        "api",
        &format!("--from-literal=token={API_TOKEN}"),
    ]);
    let uses = format!(
        "      secrets:\n        - {{secret: api, key: token, env: API_TOKEN}}\n        \
         - {{secret: api, key: token, file: {TOKEN_FILE}}}\n"
    );
    fleet
        .cluster
        .apply(&deployment("api", TEST_IMAGE, &uses, ""));
    fleet.cluster.wait(
        "api running on the two targeted devices",
        STEP_TIMEOUT,
        || fleet.running_on("api", 2),
    );
    for d in TARGETED {
        let dev = fleet.device(d);
        let env = in_container(dev, "api", "echo \"$API_TOKEN\"");
        assert_eq!(env.trim(), API_TOKEN, "{d}: API_TOKEN in the container");
        let file = in_container(dev, "api", &format!("cat {TOKEN_FILE}"));
        assert_eq!(file.trim(), API_TOKEN, "{d}: {TOKEN_FILE} in the container");
        // `ls -ln`: mode and numeric owner (the test image has no stat).
        let ls = in_container(dev, "api", &format!("ls -ln {TOKEN_FILE}"));
        let f: Vec<&str> = ls.split_whitespace().collect();
        assert_eq!(
            (f.first().copied(), f.get(2).copied()),
            (Some("-r--------"), Some("0")),
            "{d}: {TOKEN_FILE} is not mode 0400 owned by uid 0: {ls}"
        );
        // Where the file rests, and that `podman inspect` on the device shows an env value, are Podman 4.3's
        // (docs/secrets.md, "On the device"): a copy in the fleet-agent user's container directory, so that a device
        // offline after a reboot starts its workloads again. What the device's fleet-agent user sees is not checked
        // here; what leaves the device (statuses, logs, the dashboard) is, in step 6.
    }
    let yaml = fleet.cluster.kubectl(&["get", "fdep", "api", "-o", "yaml"]);
    assert!(
        !yaml.contains(API_TOKEN) && !yaml.contains(&base64(API_TOKEN.as_bytes())),
        "the token appears in kubectl get fdep api -o yaml"
    );
    eprintln!(
        "step 4 (a Secret as env and as a 0400 file) done at {:?}",
        started.elapsed()
    );

    // 5. Hardware under a policy: /dev/ttyS0 and NET_ADMIN.
    hardware_under_a_policy(&fleet);
    eprintln!(
        "step 5 (/dev/ttyS0 and NET_ADMIN refused without a policy, running with one) done at {:?}",
        started.elapsed()
    );

    // 6. No password or value anywhere a person or a log collector reads.
    assert_not_shown(&fleet, &["api", "serial"]);
    fleet.assert_no_secrets_in_logs_with(&secret_values());
    eprintln!(
        "step 6 (no password or value in statuses, events, logs, dashboard) done at {:?}",
        started.elapsed()
    );
}

/// Every secret of the run as `(what, value)`: the registry passwords and the application token, each also in
/// base64 (a Secret's `data`, the `device-secrets` values) and as a dockerconfigjson `auth` (`user:password`).
fn secret_values() -> Vec<(String, String)> {
    [
        ("the first registry password", PASSWORD_1),
        ("the rotated registry password", PASSWORD_2),
        ("the wrong registry password", WRONG_PASSWORD),
        ("the application token", API_TOKEN),
    ]
    .iter()
    .flat_map(|(what, v)| {
        [
            (what.to_string(), v.to_string()),
            (format!("{what} in base64"), base64(v.as_bytes())),
            (
                format!("{what} as a dockerconfigjson auth"),
                base64(format!("{REGISTRY_USER}:{v}").as_bytes()),
            ),
        ]
    })
    .collect()
}

/// Fails the test when a secret of [`secret_values`] shows in what a person reads: `kubectl get fdep,fdev -o
/// yaml`, every Event, and the dashboard's pages (overview, alerts, devices and each device, deployments and each
/// of `deployments`, metrics).
fn assert_not_shown(fleet: &LocalFleet, deployments: &[&str]) {
    let mut shown = vec![
        (
            "kubectl get fdep,fdev -o yaml".to_string(),
            fleet.cluster.kubectl(&["get", "fdep,fdev", "-o", "yaml"]),
        ),
        (
            "kubectl get events -A -o yaml".to_string(),
            fleet
                .cluster
                .kubectl(&["get", "events", "-A", "-o", "yaml"]),
        ),
    ];
    let mut pages: Vec<String> = ["/", "/alerts", "/devices", "/deployments", "/metrics"]
        .iter()
        .map(|p| p.to_string())
        .collect();
    pages.extend(deployments.iter().map(|d| format!("/deployments/{d}")));
    pages.extend(fleet.devices.iter().map(|d| format!("/devices/{}", d.id)));
    for p in &pages {
        shown.push((format!("the dashboard page {p}"), page(fleet, p)));
    }
    for (what, secret) in &secret_values() {
        for (place, text) in &shown {
            // Only where it appeared: the secret itself never goes into the failure message.
            assert!(!text.contains(secret.as_str()), "{what} appears in {place}");
        }
    }
}

/// Step 5: a workload asking for `/dev/ttyS0` and `NET_ADMIN` is refused by the webhook without a policy, and runs
/// with one, the node and the capability visible inside the container.
fn hardware_under_a_policy(fleet: &LocalFleet) {
    // The node a device with a serial port has (nspawn gives a guest none); created on every device, the one
    // outside the group too.
    for d in &fleet.devices {
        d.guest.sh(
            "[ -e /dev/ttyS0 ] || { mknod -m 0660 /dev/ttyS0 c 4 64 && chgrp dialout /dev/ttyS0; }",
        );
    }
    let hardware = "      devices: [/dev/ttyS0]\n      capabilities: [NET_ADMIN]\n";
    let yaml = deployment("serial", TEST_IMAGE, hardware, "");
    let refused = fleet
        .cluster
        .try_with_stdin(&["apply", "-f", "-"], &yaml)
        .expect_err("a workload asking for /dev/ttyS0 and NET_ADMIN was admitted without a policy");
    eprintln!("kubectl apply without a policy: {refused}");
    assert!(
        refused.contains("admission webhook") && refused.contains("WorkloadPolicy"),
        "refused, but not by the webhook naming the policy: {refused}"
    );
    assert!(
        fleet.cluster.get_json(&["fdep", "serial"]).is_none(),
        "the refused deployment exists"
    );
    // Cluster-scoped FleetDeployments have no namespace: a policy for them names the group only.
    fleet.cluster.apply(&format!(
        "apiVersion: {API_VERSION}\nkind: WorkloadPolicy\nmetadata:\n  name: serial-ports\nspec:\n  \
         groups: [{GROUP}]\n  devices: [/dev/ttyS0]\n  capabilities: [NET_ADMIN]\n"
    ));
    let applied = fleet
        .cluster
        .try_with_stdin(&["apply", "-f", "-"], &yaml)
        .unwrap_or_else(|e| panic!("kubectl apply with the policy: {e}"));
    eprintln!("kubectl apply with the policy: {applied}");
    fleet.cluster.wait(
        "serial running on the two targeted devices",
        STEP_TIMEOUT,
        || fleet.running_on("serial", 2),
    );
    for d in TARGETED {
        let dev = fleet.device(d);
        let ls = in_container(dev, "serial", "ls -l /dev/ttyS0");
        eprintln!("{d}: ls -l /dev/ttyS0 in the container: {}", ls.trim());
        assert!(
            ls.starts_with('c') && ls.contains("4,") && ls.contains("64"),
            "{d}: /dev/ttyS0 in the container: {ls}"
        );
        let status = in_container(dev, "serial", "cat /proc/self/status");
        let caps = status
            .lines()
            .find(|l| l.starts_with("CapEff:"))
            .unwrap_or_else(|| panic!("{d}: no CapEff in {status}"));
        let eff = u64::from_str_radix(caps.split_whitespace().nth(1).unwrap_or_default(), 16)
            .unwrap_or_else(|e| panic!("{d}: CapEff {caps}: {e}"));
        // CAP_NET_ADMIN is capability 12.
        assert!(eff & (1 << 12) != 0, "{d}: no NET_ADMIN in {caps}");
    }
    let w = fleet.device(OUTSIDE).container("fleet-serial");
    assert!(w.is_none(), "{OUTSIDE} runs fleet-serial");
}
