//! Diagnostics of a device as a person asks for them (docs/diagnostics.md), every part real: `kubectl`
//! → kube-apiserver (RBAC) → the `fleet-operator` binary → nats-server over TLS with the auth callout → two nspawn
//! Debian devices installed with device setup (the real agent and updater, rootless Podman). Requests are the docs'
//! `kubectl apply` example and bundles are read with the docs' one-liner. One boot, then in order:
//!
//! 1. A workload that prints a known line and a Secret value given to it as an environment variable, and exits
//!    (Podman restarts it). `kubectl create` of a `DeviceDiagnostics` for its device → Complete within 10 s with
//!    every item of the menu, none failed: the known line (`workloadLogs`), the agent's journal (`agentJournal`,
//!    with a line the agent logs), the container (`containers`), `/` (`disk`); the Secret value is nowhere in the
//!    object nor on the device's dashboard page, only `[redacted]`, and the bundle counts it; the request key is
//!    deleted once answered.
//! 2. A user without RBAC rights on `devicediagnostics` is refused (Forbidden); one bound to the docs' role may ask,
//!    but only from the menu: an item outside it and a workload "name" that is a path are refused, a workload the
//!    device does not have is answered with a section saying so.
//! 3. A workload that logs 100 MiB (and three that log 1 MiB each): the bundle stays within its bound (112 KiB of
//!    JSON) and says it was cut, and so does the flood's section; the newest lines are the ones kept.
//! 4. A device that is offline (its NATS link cut since the start, so that the operator's 90 s judgement has
//!    passed by now): its request waits (`Waiting`, the message naming the device and "offline"), and completes
//!    when the device is back. Then no log of the run (operator, fleet-auth, nats-server, device journals) holds
//!    the Secret value.

use fleet_vm_tests::fleet::TEST_IMAGE;
use fleet_vm_tests::local_fleet::{base64, group_yaml, LocalFleet, API_VERSION};
use std::time::{Duration, Instant};

/// The device that runs the workloads.
const DEVICE: &str = "diag-1";
/// The device that goes offline.
const OFFLINE: &str = "diag-2";
/// The group of [`DEVICE`].
const GROUP: &str = "diag";
/// The line the workload `hello` prints.
const KNOWN_LINE: &str = "hello-from-the-workload 7f3a9c";
/// The Secret value `hello` is given as `API_TOKEN` and prints (28 characters: shorter than a token-like run,
/// so only the redaction of the device's own Secret values can catch it).
const API_TOKEN: &str = "tok-Dg7Wq2Lm9Xr4Pz8Kv3Bn6Hs";
/// What a redacted string becomes (docs/diagnostics.md, "Redaction").
const REDACTED: &str = "[redacted]";
/// A line the agent logs once it has its desired state (agent/src/agent/desired.rs).
const AGENT_LINE: &str = "desired state generation";
/// The last line of the 100 MiB workload, printed after the flood.
const FLOOD_DONE: &str = "flood-done 51c2e8";
/// How many workloads log 1 MiB beside the 100 MiB one.
const CHATTY: usize = 3;
/// The bundle's bound (fleet-wire's `MAX_BUNDLE_BYTES`).
const BUNDLE_BOUND: usize = fleet_wire::diagnostics::MAX_BUNDLE_BYTES;
/// What the issue asks: a bundle within 10 s of `kubectl create`.
const ANSWER_WITHIN: Duration = Duration::from_secs(10);
/// A deployment's pull-free start on two loaded cores, well within this.
const STEP_TIMEOUT: Duration = Duration::from_secs(180);

/// A FleetDeployment `name` on [`GROUP`] with one workload `name` running `sh -c <script>` under
/// `restartPolicy: always`, with `extra` workload fields (already indented).
fn deployment(name: &str, script: &str, extra: &str) -> String {
    format!(
        "apiVersion: {API_VERSION}\nkind: FleetDeployment\nmetadata:\n  name: {name}\nspec:\n  \
         allowedGroups: [{GROUP}]\n  targetSelector: {{}}\n  workloads:\n    - name: {name}\n      \
         image: {TEST_IMAGE}\n      command: [sh, -c, '{script}']\n      restartPolicy: always\n{extra}"
    )
}

/// The DeviceDiagnostics `name` as `kubectl get fdiag <name> -o json` shows it.
fn fdiag(fleet: &LocalFleet, name: &str) -> Option<serde_json::Value> {
    fleet.cluster.get_json(&["fdiag", name])
}

/// `status.phase` of the DeviceDiagnostics `name` ("" before the operator set one).
fn phase(fleet: &LocalFleet, name: &str) -> String {
    fdiag(fleet, name)
        .and_then(|o| o["status"]["phase"].as_str().map(str::to_string))
        .unwrap_or_default()
}

/// Waits up to `within` for the DeviceDiagnostics `name` to be Complete; the object.
fn complete(fleet: &LocalFleet, name: &str, within: Duration) -> serde_json::Value {
    let o = fleet.cluster.wait(
        &format!("DeviceDiagnostics {name} Complete"),
        within,
        || {
            let o = fdiag(fleet, name)?;
            matches!(o["status"]["phase"].as_str(), Some("Complete" | "Failed")).then_some(o)
        },
    );
    assert_eq!(
        o["status"]["phase"], "Complete",
        "DeviceDiagnostics {name}: {:#}",
        o["status"]
    );
    o
}

/// The sections of a DeviceDiagnostics' bundle with `item` (and `workload`, when given).
fn sections<'a>(
    o: &'a serde_json::Value,
    item: &str,
    workload: Option<&str>,
) -> Vec<&'a serde_json::Value> {
    o["status"]["bundle"]["sections"]
        .as_array()
        .map(|all| {
            all.iter()
                .filter(|s| s["item"] == item)
                .filter(|s| workload.is_none_or(|w| s["workload"] == w))
                .collect()
        })
        .unwrap_or_default()
}

/// The text of the one section with `item` (and `workload`); fails the test when there is none or it failed.
fn text(o: &serde_json::Value, item: &str, workload: Option<&str>) -> String {
    let found = sections(o, item, workload);
    let s = found.first().unwrap_or_else(|| {
        panic!(
            "no {item} {workload:?} section in the bundle: {:#}",
            o["status"]["bundle"]
        )
    });
    assert!(
        s["error"].is_null(),
        "the {item} {workload:?} section failed: {}",
        s["error"]
    );
    s["text"].as_str().unwrap_or_default().to_string()
}

/// Waits up to [`STEP_TIMEOUT`] until the container `fleet-<workload>` on [`DEVICE`] has the file `marker` (its
/// script touches it once it has printed what the step reads back); fails with the device's logs. Returns the
/// container's log driver (`podman inspect`), for the record.
fn wait_marker(fleet: &LocalFleet, workload: &str, marker: &str) -> String {
    let d = fleet.device(DEVICE);
    let seen = fleet_rig::wait_for(STEP_TIMEOUT, || {
        let (ok, _) = d.podman(&format!("exec fleet-{workload} ls {marker} 2>&1"));
        if !ok {
            // why: pacing of the poll (each look is a podman exec in the guest)
            std::thread::sleep(Duration::from_millis(500));
        }
        ok.then_some(())
    });
    assert!(
        seen.is_some(),
        "fleet-{workload} on {DEVICE} has no {marker} after {STEP_TIMEOUT:?}:\n{}",
        d.logs()
    );
    d.podman(&format!(
        "inspect --format '{{{{.HostConfig.LogConfig.Type}}}}' fleet-{workload}"
    ))
    .1
    .trim()
    .to_string()
}

/// docs/diagnostics.md, as a person reads it.
fn docs() -> String {
    let path = fleet_rig::workspace_root().join("docs/diagnostics.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The YAML of the docs' `kubectl apply -f - <<'EOF'` example that holds `marker`.
fn docs_yaml(marker: &str) -> String {
    docs()
        .split("<<'EOF'\n")
        .skip(1)
        .filter_map(|rest| rest.split_once("\nEOF").map(|(yaml, _)| yaml.to_string()))
        .find(|yaml| yaml.contains(marker))
        .unwrap_or_else(|| {
            panic!("docs/diagnostics.md has no kubectl apply example with {marker:?}")
        })
}

/// The docs' example request (`kubectl apply -f -`) for `device` under `name`, with its spec's fields after
/// `device` replaced by `extra` (already indented; none: the docs' own).
fn docs_request(name: &str, device: &str, extra: Option<&str>) -> String {
    let yaml = docs_yaml("kind: DeviceDiagnostics");
    let (head, spec) = yaml
        .split_once("spec:\n")
        .unwrap_or_else(|| panic!("no spec in the docs' request:\n{yaml}"));
    let example_name = head
        .lines()
        .find_map(|l| l.trim().strip_prefix("name: "))
        .unwrap_or_else(|| panic!("no name in the docs' request:\n{yaml}"));
    let head = head.replace(&format!("name: {example_name}"), &format!("name: {name}"));
    let fields = match extra {
        Some(e) => e.to_string(),
        None => spec
            .lines()
            .filter(|l| !l.trim_start().starts_with("device:"))
            .map(|l| format!("{l}\n"))
            .collect(),
    };
    format!("{head}spec:\n  device: {device}\n{fields}")
}

/// `kubectl apply -f -` of a request, as docs/diagnostics.md shows it.
fn ask(fleet: &LocalFleet, yaml: &str) {
    fleet
        .cluster
        .try_with_stdin(&["apply", "-f", "-"], yaml)
        .unwrap_or_else(|e| panic!("kubectl apply of a DeviceDiagnostics: {e}\n{yaml}"));
}

/// The kubectl one-liner of docs/diagnostics.md that prints a request's bundle, section after section, run for the
/// request `name`: its output.
fn read_bundle_as_the_docs_say(fleet: &LocalFleet, name: &str) -> String {
    let docs = docs();
    let line = docs
        .lines()
        .find(|l| l.starts_with("kubectl get fdiag ") && l.contains("jsonpath="))
        .unwrap_or_else(|| panic!("docs/diagnostics.md prints no kubectl one-liner for a bundle"));
    // `kubectl get fdiag <example> -o jsonpath='<template>'`: the words, the quoted template one of them.
    let q = line.find('\'').expect("a quoted template");
    let mut args: Vec<String> = line[..q].split_whitespace().map(str::to_string).collect();
    let flag = args.pop().expect("jsonpath=");
    let template = &line[q + 1..line.rfind('\'').expect("closing quote")];
    args.push(format!("{flag}{template}"));
    assert_eq!(args[..3], ["kubectl", "get", "fdiag"], "{line}");
    args[3] = name.to_string();
    let args: Vec<&str> = args[1..].iter().map(String::as_str).collect();
    fleet.cluster.kubectl(&args)
}

#[test]
fn a_person_reads_a_devices_diagnostics_with_kubectl() {
    let started = Instant::now();
    let fleet = LocalFleet::start(&[DEVICE, OFFLINE]);
    eprintln!("two devices set up in {:?}", started.elapsed());
    // The offline device: online first (judged so by the operator), then its NATS link cut, so that the
    // operator's judgement (90 s without a heartbeat) has passed when step 4 comes.
    fleet.cluster.wait(
        &format!("{OFFLINE} Online"),
        Duration::from_secs(120),
        || {
            let c = fleet.cluster.condition(&["fdev", OFFLINE], "Online")?;
            (c.status == "True").then_some(())
        },
    );
    fleet.device(OFFLINE).nats_link.set_connected(false);
    let cut_at = Instant::now();
    fleet
        .cluster
        .kubectl(&["label", "fdev", DEVICE, "role=diag"]);
    fleet.cluster.apply(&group_yaml(GROUP, &[("role", "diag")]));

    // 1. A workload that prints a known line and a Secret value, and exits (restarted by Podman).
    fleet.apply_secret(&[
        "generic",
        "api",
        &format!("--from-literal=token={API_TOKEN}"),
    ]);
    let hello = deployment(
        "hello",
        &format!(
            "echo {KNOWN_LINE}; echo \"the api token is $API_TOKEN\"; : >/dev/shm/printed; sleep 30; exit 0"
        ),
        "      secrets:\n        - {secret: api, key: token, env: API_TOKEN}\n",
    );
    fleet.cluster.apply(&hello);
    let driver = wait_marker(&fleet, "hello", "/dev/shm/printed");
    eprintln!("step 1: hello printed its lines (its log driver: {driver})");
    eprintln!("step 1: hello running at {:?}", started.elapsed());
    // Created with `kubectl create` (as the issue says a person does), every item.
    fleet
        .cluster
        .create(&docs_request("hello-now", DEVICE, Some("")));
    let asked = Instant::now();
    let o = complete(&fleet, "hello-now", ANSWER_WITHIN);
    eprintln!(
        "step 1: Complete {:?} after kubectl create: {}",
        asked.elapsed(),
        o["status"]["message"]
    );
    // Every item of the menu, collected on a device set up as the docs say: none failed.
    let all = o["status"]["bundle"]["sections"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for sec in &all {
        eprintln!(
            "  section {} {}: {} bytes{}{}",
            sec["item"].as_str().unwrap_or_default(),
            sec["workload"].as_str().unwrap_or_default(),
            sec["text"].as_str().map_or(0, str::len),
            if sec["cut"] == true { ", cut" } else { "" },
            sec["error"]
                .as_str()
                .map(|e| format!(", error: {e}"))
                .unwrap_or_default()
        );
    }
    let items: std::collections::BTreeSet<&str> =
        all.iter().filter_map(|s| s["item"].as_str()).collect();
    let menu: std::collections::BTreeSet<&str> = fleet_wire::diagnostics::Item::ALL
        .iter()
        .map(|i| i.name())
        .collect();
    assert_eq!(items, menu, "the bundle's items are not the whole menu");
    let failed: Vec<String> = all
        .iter()
        .filter(|s| !s["error"].is_null())
        .map(|s| format!("{} {}: {}", s["item"], s["workload"], s["error"]))
        .collect();
    assert!(
        failed.is_empty(),
        "sections failed on a healthy device:\n{}",
        failed.join("\n")
    );
    let logs = text(&o, "workloadLogs", Some("hello"));
    assert!(
        logs.contains(KNOWN_LINE),
        "the workload's known line is not in its workloadLogs section:\n{logs}"
    );
    assert!(
        logs.contains(&format!("the api token is {REDACTED}")),
        "the Secret value was not replaced by {REDACTED} in the workload's logs:\n{logs}"
    );
    let journal = text(&o, "agentJournal", None);
    assert!(
        journal.contains(AGENT_LINE),
        "the agent's journal section has no {AGENT_LINE:?}:\n{journal}"
    );
    let containers = text(&o, "containers", None);
    assert!(
        containers.contains("fleet-hello"),
        "the containers section does not list fleet-hello:\n{containers}"
    );
    let disk = text(&o, "disk", None);
    assert!(
        disk.lines().any(|l| l.split_whitespace().any(|w| w == "/")),
        "the disk section has no row for /:\n{disk}"
    );
    let redacted = o["status"]["bundle"]["redacted"].as_u64().unwrap_or(0);
    assert!(redacted >= 1, "bundle.redacted is {redacted}");
    let yaml = fleet
        .cluster
        .kubectl(&["get", "fdiag", "hello-now", "-o", "yaml"]);
    assert!(
        !yaml.contains(API_TOKEN) && !yaml.contains(&base64(API_TOKEN.as_bytes())),
        "the Secret value appears in kubectl get fdiag hello-now -o yaml"
    );
    assert!(yaml.contains(REDACTED));
    let printed = read_bundle_as_the_docs_say(&fleet, "hello-now");
    eprintln!(
        "the docs' one-liner prints {} lines",
        printed.lines().count()
    );
    assert!(
        printed.contains(KNOWN_LINE) && !printed.contains(API_TOKEN),
        "the docs' one-liner printed:\n{printed}"
    );
    // The device's page on the dashboard shows the bundle, the value redacted there too.
    let page = fleet.cluster.wait(
        "the dashboard's device page shows hello-now's bundle",
        Duration::from_secs(30),
        || {
            fleet
                .cluster
                .dashboard_page(&format!("/devices/{DEVICE}"))
                .filter(|p| p.contains(KNOWN_LINE))
        },
    );
    assert!(
        !page.contains(API_TOKEN) && page.contains(REDACTED),
        "the dashboard's page of {DEVICE} shows the Secret value, or not as {REDACTED}"
    );
    // Answered: the operator deleted the request (docs/diagnostics.md, "Phases"), so no further bundle is taken.
    let uid = o["metadata"]["uid"].as_str().expect("uid").to_string();
    let requests = fleet_rig::nats_client::jetstream::new(fleet.nats.connect())
        .key_value(fleet_wire::kv::DIAGNOSTICS_REQUEST)
        .expect("the diagnostics-request bucket");
    fleet.cluster.wait(
        "hello-now's request key deleted once answered",
        Duration::from_secs(30),
        || {
            // Its latest revision a delete or purge marker: it was written, then removed.
            let e = requests.entry(&format!("{DEVICE}.{uid}")).ok()??;
            (e.operation != fleet_rig::nats_client::kv::Operation::Put).then_some(())
        },
    );
    eprintln!(
        "step 1 (bundle with the known line, the agent's journal, containers, disk; the Secret redacted {redacted}x) done at {:?}",
        started.elapsed()
    );

    // 2. RBAC: a user without rights is refused; one bound to a role that grants them may ask.
    let refused = fleet
        .cluster
        .try_with_stdin(
            &["--as=mallory", "create", "-f", "-"],
            &docs_request("by-mallory", DEVICE, None),
        )
        .expect_err("a user without RBAC rights created a DeviceDiagnostics");
    assert!(
        refused.contains("Forbidden") && refused.contains("mallory"),
        "refused, but not by RBAC: {refused}"
    );
    assert!(fdiag(&fleet, "by-mallory").is_none(), "by-mallory exists");
    // The role docs/diagnostics.md gives, bound to one user with a ClusterRoleBinding as it says.
    let role = docs_yaml("kind: ClusterRole");
    let role_name = role
        .lines()
        .find_map(|l| l.trim().strip_prefix("name: "))
        .unwrap_or_else(|| panic!("no name in the docs' role:\n{role}"))
        .to_string();
    fleet.cluster.apply(&role);
    fleet.cluster.kubectl(&[
        "create",
        "clusterrolebinding",
        "support-diagnostics",
        &format!("--clusterrole={role_name}"),
        "--user=support",
    ]);
    fleet.cluster.wait(
        "a user bound to diagnostics-requester may create a DeviceDiagnostics",
        Duration::from_secs(30),
        || {
            fleet
                .cluster
                .try_with_stdin(
                    &["--as=support", "create", "-f", "-"],
                    &docs_request("by-support", DEVICE, Some("  items: [disk]\n")),
                )
                .ok()
        },
    );
    let o = complete(&fleet, "by-support", ANSWER_WITHIN);
    assert_eq!(
        sections(&o, "disk", None).len(),
        o["status"]["bundle"]["sections"]
            .as_array()
            .map_or(0, Vec::len),
        "by-support asked for disk only: {:#}",
        o["status"]["bundle"]
    );
    // What may be asked is the menu, never a command, a path or a shell: an item outside the menu and a workload
    // "name" that is a path are refused when created; a workload the device does not have gets a section saying so.
    for (name, fields, refusal) in [
        ("a-shell", "  items: [shell]\n", "items"),
        (
            "a-path",
            "  items: [workloadLogs]\n  workloads: [\"../../etc/shadow\"]\n",
            "spec.workloads[0]",
        ),
    ] {
        let refused = fleet
            .cluster
            .try_with_stdin(
                &["--as=support", "create", "-f", "-"],
                &docs_request(name, DEVICE, Some(fields)),
            )
            .expect_err("a request outside the menu was created");
        eprintln!("step 2: {name} refused: {}", refused.trim());
        assert!(
            refused.contains(refusal) && fdiag(&fleet, name).is_none(),
            "{name}: not refused naming {refusal}: {refused}"
        );
    }
    ask(
        &fleet,
        &docs_request(
            "no-such-app",
            DEVICE,
            Some("  items: [workloadLogs]\n  workloads: [no-such-app]\n"),
        ),
    );
    let o = complete(&fleet, "no-such-app", ANSWER_WITHIN);
    let missing = sections(&o, "workloadLogs", Some("no-such-app"));
    assert!(
        missing.len() == 1
            && missing[0]["error"]
                .as_str()
                .is_some_and(|e| e.contains("no such workload")),
        "a workload the device does not have: {:#}",
        o["status"]["bundle"]
    );
    eprintln!(
        "step 2 (mallory Forbidden, support allowed; outside the menu refused) done at {:?}",
        started.elapsed()
    );

    // 3. 100 MiB of log: the bundle stays within its bound and says what it cut. Three more workloads log 1 MiB
    // each, so that their sections (32 KiB each at most) and the flood's take the whole bundle over its bound too.
    fleet.cluster.apply(&deployment(
        "flood",
        &format!(
            "busybox yes \"flood line: the same words again and again\" | busybox head -c 104857600; \
             echo {FLOOD_DONE}; : >/dev/shm/flood-done; exec sleep 100000"
        ),
        "",
    ));
    for i in 1..=CHATTY {
        fleet.cluster.apply(&deployment(
            &format!("chatty-{i}"),
            &format!(
                "busybox yes \"chatty {i}: a line of ordinary words\" | busybox head -c 1048576; \
                 : >/dev/shm/done; exec sleep 100000"
            ),
            "",
        ));
    }
    wait_marker(&fleet, "flood", "/dev/shm/flood-done");
    for i in 1..=CHATTY {
        wait_marker(&fleet, &format!("chatty-{i}"), "/dev/shm/done");
    }
    eprintln!(
        "step 3: flood logged 100 MiB and {CHATTY} others 1 MiB each at {:?}",
        started.elapsed()
    );
    ask(
        &fleet,
        &docs_request("flood-now", DEVICE, Some("  lines: 2000\n")),
    );
    let o = complete(&fleet, "flood-now", ANSWER_WITHIN);
    let bundle = serde_json::to_vec(&o["status"]["bundle"]).expect("json");
    eprintln!(
        "step 3: the bundle is {} bytes of JSON (bound {BUNDLE_BOUND})",
        bundle.len()
    );
    assert!(
        bundle.len() <= BUNDLE_BOUND,
        "the bundle is {} bytes of JSON, over its bound of {BUNDLE_BOUND}",
        bundle.len()
    );
    assert_eq!(
        o["status"]["bundle"]["cut"],
        true,
        "the bundle of {} workloads' logs of 32 KiB each does not say it was cut to fit",
        CHATTY + 1
    );
    let message = o["status"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("cut"),
        "kubectl get fdiag flood-now -o wide does not say the bundle was cut: {message}"
    );
    let flood = sections(&o, "workloadLogs", Some("flood"));
    let flood = flood.first().unwrap_or_else(|| {
        panic!(
            "no workloadLogs section for flood: {:#}",
            o["status"]["bundle"]
        )
    });
    assert_eq!(
        flood["cut"], true,
        "the flood's section does not say it was cut"
    );
    let kept = flood["text"].as_str().unwrap_or_default();
    assert!(
        kept.contains(FLOOD_DONE),
        "the flood's newest line was not kept: …{}",
        &kept[kept.len().saturating_sub(300)..]
    );
    eprintln!(
        "step 3 (100 MiB of log → {} bytes, cut) done at {:?}",
        bundle.len(),
        started.elapsed()
    );
    fleet.cluster.kubectl(&["delete", "fdep", "flood"]);
    for i in 1..=CHATTY {
        fleet
            .cluster
            .kubectl(&["delete", "fdep", &format!("chatty-{i}")]);
    }

    // 4. An offline device: the request waits, and says so; the device comes back and answers.
    fleet.cluster.wait(
        &format!("{OFFLINE} judged offline (Online=False)"),
        Duration::from_secs(180),
        || {
            let c = fleet.cluster.condition(&["fdev", OFFLINE], "Online")?;
            (c.status == "False").then_some(())
        },
    );
    eprintln!(
        "step 4: {OFFLINE} offline {:?} after its link was cut",
        cut_at.elapsed()
    );
    ask(&fleet, &docs_request("offline-now", OFFLINE, None));
    let message = fleet
        .cluster
        .wait("offline-now Waiting", Duration::from_secs(30), || {
            let o = fdiag(&fleet, "offline-now")?;
            (o["status"]["phase"] == "Waiting").then(|| {
                o["status"]["message"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
            })
        });
    eprintln!("step 4: Waiting: {message}");
    assert!(
        message.contains(OFFLINE) && message.contains("offline"),
        "the Waiting message does not name the device and say it is offline: {message}"
    );
    let row = fleet
        .cluster
        .kubectl(&["get", "fdiag", "offline-now", "-o", "wide"]);
    eprintln!("kubectl get fdiag offline-now -o wide:\n{row}");
    assert!(row.contains("Waiting"), "{row}");
    fleet.device(OFFLINE).nats_link.set_connected(true);
    let back = Instant::now();
    let o = complete(&fleet, "offline-now", Duration::from_secs(120));
    eprintln!(
        "step 4: Complete {:?} after the device's link came back",
        back.elapsed()
    );
    // For the record: when the agent got back in (its reconnect backoff grows to 60 s while offline) and when it
    // answered.
    let journal = fleet
        .device(OFFLINE)
        .guest
        .journal("fleet-agent.service", 400);
    for l in journal.lines().filter(|l| {
        ["connected to NATS", "reconnected", "diagnostics request"]
            .iter()
            .any(|w| l.contains(w))
    }) {
        eprintln!("  {OFFLINE}: {l}");
    }
    let disk = text(&o, "disk", None);
    assert!(
        disk.lines().any(|l| l.split_whitespace().any(|w| w == "/")),
        "{OFFLINE}'s disk section has no row for /:\n{disk}"
    );
    assert_eq!(
        phase(&fleet, "hello-now"),
        "Complete",
        "a finished request changed"
    );
    eprintln!(
        "step 4 (offline: Waiting, then Complete) done at {:?}",
        started.elapsed()
    );

    // The value the workload printed never reached a log off its container: the operator's, fleet-auth's,
    // nats-server's, any device journal (the agent logs one line per request, never a section's text).
    fleet.assert_no_secrets_in_logs_with(&[
        ("the api Secret's value".to_string(), API_TOKEN.to_string()),
        (
            "the api Secret's value in base64".to_string(),
            base64(API_TOKEN.as_bytes()),
        ),
    ]);
}
