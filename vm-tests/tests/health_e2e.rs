//! Health over time on three whole devices, every part real: kube-apiserver + etcd, the `fleet-operator` binary
//! (dashboard and alerts on), nats-server over TLS with the auth callout, and three nspawn Debian devices installed
//! with device setup, one labelled `canary=true`. What a person does is `kubectl apply`; what is checked is what
//! that person then reads (`kubectl get`, conditions, events, the dashboard) and what the devices hold (NATS keys,
//! Podman). The scenarios run in order on the same devices:
//!
//! 1. A crash-looping container: a workload whose process exits every 5 s under `restartPolicy: always` is
//!    reported `crash-looping` (with Podman's restart count) in NATS within 30 s of its third restart, then in the
//!    Device's and the deployment's counts, a Warning event and the dashboard; a staged update that still
//!    crash-loops halts at the canary and the other two keep the previous spec.
//! 2. A silent device in a staged deployment: its agent frozen (SIGSTOP) after it was heard from, it is given the
//!    change and never reports it; it is named `stalled` in `Progressing` and `status.rollout.stalled` within its
//!    bound (heartbeat timeout plus the slack), keeps its `maxUnavailable` slot (the last device waits), and once
//!    thawed the rollout completes.
//! 3. No false alarms: the operator SIGKILLed and started three times with a live fleet and a 60-s silence
//!    threshold (shorter than the age of every Device's hourly `lastHeartbeat`) raises no `DeviceSilent` for a live
//!    device; one frozen beforehand is alerted within the threshold plus 30 s and shown `Online False`.
//! 4. An HTTP health check that starts failing after an update: a workload served by busybox's httpd on a
//!    published port, checked at `/healthz` by the agent; the staged update no longer serves it, so the canary
//!    reports `unhealthy`, fails its soak and the rollout halts; the others keep the previous spec and the canary
//!    keeps the new one (the old spec is not restored: docs/crds.md says why).
//! 5. A crash-looping agent release (ready, then killed 20 s after every start; `soakSeconds: 60`, one canary,
//!    `maxUnavailable: 1`): the release halts on the canary and **stays halted for 5 minutes after the soak
//!    window**, the other two never receive an intent, the halt proposes no retry of a soak failure, and the
//!    Device says `crash-looping` with the agent's restarts, with an `AgentCrashLooping` event.

use fleet_rig::nats_client as nats;
use fleet_vm_tests::builds::{self, V3};
use fleet_vm_tests::fleet::TEST_IMAGE;
use fleet_vm_tests::local_fleet::{
    group_yaml, kv_entry, release_yaml, reported_workload, LocalFleet,
};
use fleet_wire::{kv, DesiredState, Timestamp, UpgradePhase, WorkloadState};
use std::time::{Duration, Instant};

const CANARY: &str = "hlth-1";
const OTHERS: [&str; 2] = ["hlth-2", "hlth-3"];
/// One upgrade or rollout step on a loaded 2-core machine, well within this.
const STEP_TIMEOUT: Duration = Duration::from_secs(300);

/// A FleetDeployment `name` on the group `lab` with one workload `name` running `sh -c <script>` under
/// `restartPolicy: always`, with `rollout` (already indented YAML) when given.
fn deployment(name: &str, script: &str, rollout: &str) -> String {
    format!(
        "apiVersion: fleet.nationtech.io/v1alpha1\nkind: FleetDeployment\nmetadata:\n  name: {name}\nspec:\n  \
         allowedGroups: [lab]\n  targetSelector: {{}}\n  workloads:\n    - name: {name}\n      image: {TEST_IMAGE}\n      \
         command: [sh, -c, \"{script}\"]\n      restartPolicy: always\n{rollout}"
    )
}

fn logs(fleet: &LocalFleet) -> String {
    fleet.device_logs()
        + &format!(
            "\n--- fleet-operator ---\n{}",
            fleet.cluster.operator_log(80)
        )
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
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn crash_loops_halt_and_stay_halted_silent_devices_stall_no_false_alarms() {
    let started = Instant::now();
    let ids: Vec<&str> = std::iter::once(CANARY).chain(OTHERS).collect();
    let fleet = LocalFleet::start(&ids);
    eprintln!("three devices set up in {:?}", started.elapsed());
    let cluster = &fleet.cluster;
    cluster.kubectl(&["label", "fdev", CANARY, "canary=true"]);
    cluster.kubectl(&["label", "fdev", "--all", "site=lab"]);
    cluster.apply(&group_yaml("lab", &[("site", "lab")]));

    crash_looping_container(&fleet);
    eprintln!(
        "scenario 1 (a crash-looping container) done at {:?}",
        started.elapsed()
    );
    silent_device_stalls(&fleet);
    eprintln!(
        "scenario 2 (a silent device stalls) done at {:?}",
        started.elapsed()
    );
    operator_restarts_raise_no_false_alarms(&fleet);
    eprintln!(
        "scenario 3 (three operator restarts, no false DeviceSilent) done at {:?}",
        started.elapsed()
    );
    http_check_fails_after_the_update(&fleet);
    eprintln!(
        "scenario 4 (an HTTP health check failing after the update halts) done at {:?}",
        started.elapsed()
    );
    crash_looping_agent_stays_halted(&fleet);
    eprintln!(
        "scenario 5 (a crash-looping agent stays halted) done at {:?}",
        started.elapsed()
    );
    fleet.assert_no_secrets_in_logs();
}

/// Scenario 1.
fn crash_looping_container(fleet: &LocalFleet) {
    let cluster = &fleet.cluster;
    let js = nats::jetstream::new(fleet.nats.connect());
    let reports = js
        .key_value(kv::WORKLOAD_STATUS)
        .expect("workload-status bucket");
    let desired = js
        .key_value(kv::DESIRED_STATE)
        .expect("desired-state bucket");
    cluster.apply(&deployment("loop", "sleep 5; exit 3", ""));
    // Podman's own count on the canary: the loop is established at the third restart.
    let third = cluster.wait(
        "Podman restarted the canary's container three times",
        STEP_TIMEOUT,
        || {
            let c = fleet.device(CANARY).container("fleet-loop")?;
            (c["RestartCount"].as_u64()? >= 3).then(Timestamp::now)
        },
    );
    let (report, at) = cluster.wait(
        "the canary reports loop crash-looping",
        Duration::from_secs(60),
        || reported_workload(&reports, CANARY, "loop", WorkloadState::CrashLooping),
    );
    let took = Duration::from_millis(at.unix_ms().saturating_sub(third.unix_ms()));
    eprintln!("crash-looping in NATS {took:?} after Podman's third restart: {report:?}");
    assert!(
        took <= Duration::from_secs(30),
        "crash-looping reached NATS {took:?} after the third restart: {report:?}"
    );
    assert!(
        report.restarts.is_some_and(|r| r.count >= 3),
        "the restart count: {report:?}"
    );
    // What a person reads: the Device, the deployment's counts, an event, the dashboard.
    let seen = Instant::now();
    cluster.wait(
        "every Device counts its crash-looping workload",
        Duration::from_secs(30),
        || {
            ids_all()
                .iter()
                .all(|d| {
                    cluster
                        .get_json(&["fdev", d])
                        .is_some_and(|v| v["status"]["workloads"]["crashLooping"] == 1)
                })
                .then_some(())
        },
    );
    let counts = cluster.wait(
        "the deployment counts three crash-looping workloads",
        Duration::from_secs(30),
        || {
            let d = cluster.get_json(&["fdep", "loop"])?;
            let w = d["status"]["workloads"].clone();
            (w["crashLooping"] == 3 && w["failed"] == 3).then_some(w)
        },
    );
    let latest = counts["latestError"].as_str().unwrap_or_default();
    assert!(latest.contains("crash-looping: restarted"), "{counts:#}");
    let warnings = cluster.wait(
        "a Warning event about the crash loop",
        Duration::from_secs(30),
        || {
            Some(cluster.warnings("FleetDeployment", "loop"))
                .filter(|w| w.iter().any(|m| m.contains("crash-looping")))
        },
    );
    eprintln!(
        "Device, deployment and event {:?} after NATS: {warnings:?}",
        seen.elapsed()
    );
    let device_page = page(fleet, &format!("/devices/{CANARY}"));
    assert!(
        device_page.contains("crash-looping"),
        "the device page does not say crash-looping:\n{device_page}"
    );
    // The Device's typed state and its column, and the alert's event on the Device.
    let row = cluster.kubectl(&["get", "fdev", CANARY]);
    assert!(row.contains("workloads"), "kubectl get fdev:\n{row}");
    cluster.wait(
        "a WorkloadCrashLooping event on the canary's Device",
        Duration::from_secs(30),
        || {
            Some(cluster.warnings("Device", CANARY))
                .filter(|w| w.iter().any(|m| m.starts_with("WorkloadCrashLooping")))
        },
    );

    // A staged update that still crash-loops halts at the canary; the others keep the previous spec.
    let staged = "  rollout:\n    soakSeconds: 30\n    maxUnavailable: 1\n";
    cluster.apply(&deployment("loop", "sleep 4; exit 4", staged));
    let halted = halted_by_the_canary(fleet, ["fdep", "loop"], STEP_TIMEOUT);
    assert!(halted.message.contains(CANARY), "{halted:?}");
    // A soak failure is not "retried": the message says what works.
    assert!(
        !halted.message.contains("To retry the failed attempts"),
        "{halted:?}"
    );
    // why: no event marks a pass that gave the others nothing; a few seconds after the halt is the window
    std::thread::sleep(Duration::from_secs(5));
    others_keep_the_previous_spec(&desired, "loop", "exit 3");
    cluster.kubectl(&["delete", "fdep", "loop"]);
}

/// Waits until `object` (`[kind, name]`) reports `Halted=True`, and asserts a canary halted it.
fn halted_by_the_canary(
    fleet: &LocalFleet,
    object: [&str; 2],
    timeout: Duration,
) -> fleet_vm_tests::cluster::Condition {
    let halted = fleet.cluster.wait(
        &format!("{} {} halted", object[0], object[1]),
        timeout,
        || {
            fleet
                .cluster
                .condition(&object, "Halted")
                .filter(|c| c.status == "True")
        },
    );
    assert_eq!(halted.reason, "CanaryFailed", "{halted:?}\n{}", logs(fleet));
    halted
}

/// Asserts that neither of the other devices was given the update of `workload`: each one's desired-state key
/// still holds the previous spec, whose command has `marker` in it.
fn others_keep_the_previous_spec(desired: &nats::kv::Store, workload: &str, marker: &str) {
    for d in OTHERS {
        let (s, _): (DesiredState, _) = kv_entry(desired, d).expect("desired state");
        let w = s
            .workloads
            .iter()
            .find(|w| w.name.as_str() == workload)
            .expect("the workload");
        assert!(
            w.command.iter().any(|a| a.contains(marker)),
            "{d} was given the update past a halted canary: {w:?}"
        );
    }
}

fn ids_all() -> Vec<&'static str> {
    std::iter::once(CANARY).chain(OTHERS).collect()
}

/// Scenario 2.
fn silent_device_stalls(fleet: &LocalFleet) {
    let cluster = &fleet.cluster;
    let silent = OTHERS[0];
    let last = OTHERS[1];
    let js = nats::jetstream::new(fleet.nats.connect());
    let desired = js
        .key_value(kv::DESIRED_STATE)
        .expect("desired-state bucket");
    let heartbeats = js
        .key_value(kv::DEVICE_HEARTBEAT)
        .expect("heartbeat bucket");
    let has_web = |d: &str| {
        kv_entry::<DesiredState>(&desired, d)
            .is_some_and(|(s, _)| s.workloads.iter().any(|w| w.name.as_str() == "web"))
    };
    let staged = "  rollout:\n    soakSeconds: 30\n    maxUnavailable: 1\n";
    cluster.apply(&deployment("web", "sleep 100000", staged));
    cluster.wait("the canary given web", STEP_TIMEOUT, || {
        has_web(CANARY).then_some(())
    });
    // Frozen during the canary's soak, heard from moments before: it is released next, and never answers.
    fleet
        .device(silent)
        .guest
        .systemctl(&["kill", "-s", "SIGSTOP", "fleet-agent"]);
    let (beat, _): (fleet_wire::Heartbeat, _) =
        kv_entry(&heartbeats, silent).expect("a heartbeat before the freeze");
    cluster.wait("the frozen device given web", STEP_TIMEOUT, || {
        has_web(silent).then_some(())
    });
    let stalled = cluster.wait(
        "the frozen device named stalled",
        Duration::from_secs(90 + 60 + 90),
        || {
            let d = cluster.get_json(&["fdep", "web"])?;
            let c = d["status"]["conditions"]
                .as_array()?
                .iter()
                .find(|c| c["type"] == "Progressing")?
                .clone();
            (c["status"] == "False" && c["reason"] == "Stalled").then_some((d, c))
        },
    );
    let quiet = Timestamp::now().since(beat.at);
    eprintln!(
        "named stalled {quiet:?} after its last heartbeat: {:#}",
        stalled.1
    );
    assert!(
        stalled.1["message"]
            .as_str()
            .unwrap_or_default()
            .contains(&format!("{silent} (silent for")),
        "{:#}",
        stalled.1
    );
    assert_eq!(
        stalled.0["status"]["rollout"]["stalled"], 1,
        "{:#}",
        stalled.0["status"]
    );
    // Its bound: the heartbeat timeout (90 s) plus the slack (60 s), and a pass.
    assert!(
        quiet <= Duration::from_secs(90 + 60 + 45),
        "stalled only {quiet:?} after its last heartbeat"
    );
    let page = page(fleet, "/deployments/web");
    assert!(
        page.contains(silent) && page.contains("silent for"),
        "the deployment's page does not name the stalled device:\n{page}"
    );
    assert!(
        !has_web(last),
        "{last} was given web while the stalled device held the only slot"
    );
    // Thawed: it reports, and the rollout completes.
    fleet
        .device(silent)
        .guest
        .systemctl(&["kill", "-s", "SIGCONT", "fleet-agent"]);
    cluster.wait("the rollout completed", STEP_TIMEOUT, || {
        let d = cluster.get_json(&["fdep", "web"])?;
        (d["status"]["rollout"]["phase"] == "Complete" && d["status"]["workloads"]["running"] == 3)
            .then_some(())
    });
    cluster.kubectl(&["delete", "fdep", "web"]);
}

/// DeviceSilent events on `device`'s Device.
fn silent_events(fleet: &LocalFleet, device: &str) -> usize {
    fleet
        .cluster
        .warnings("Device", device)
        .iter()
        .filter(|m| m.starts_with("DeviceSilent"))
        .count()
}

/// Scenario 3: the operator restarted three times (SIGKILL, as a node loss would) with a live fleet and a silence
/// threshold of 60 s, shorter than the age of every Device's `lastHeartbeat` (refreshed hourly): no DeviceSilent
/// event for a live device; a device frozen beforehand is alerted within the threshold plus 30 s of its last
/// heartbeat.
fn operator_restarts_raise_no_false_alarms(fleet: &LocalFleet) {
    let cluster = &fleet.cluster;
    let frozen = OTHERS[1];
    let js = nats::jetstream::new(fleet.nats.connect());
    let heartbeats = js
        .key_value(kv::DEVICE_HEARTBEAT)
        .expect("heartbeat bucket");
    let live = [CANARY, OTHERS[0]];
    let before: Vec<usize> = live.iter().map(|d| silent_events(fleet, d)).collect();
    fleet
        .device(frozen)
        .guest
        .systemctl(&["kill", "-s", "SIGSTOP", "fleet-agent"]);
    let (beat, _): (fleet_wire::Heartbeat, _) =
        kv_entry(&heartbeats, frozen).expect("a heartbeat before the freeze");
    for _ in 0..3 {
        cluster.kill_operator_and_restart_with(&["--alert-silent-after", "60s"]);
        // why: the scenario's pacing: each operator judges for 20 s before the next restart, none past 60 s alone
        std::thread::sleep(Duration::from_secs(20));
    }
    let alerted = cluster.wait(
        "the frozen device alerted as silent",
        Duration::from_secs(120),
        || (silent_events(fleet, frozen) > 0).then(Timestamp::now),
    );
    let after = alerted.since(beat.at);
    eprintln!("the frozen device alerted {after:?} after its last heartbeat");
    assert!(
        after <= Duration::from_secs(60 + 30 + 5),
        "alerted {after:?} after its last heartbeat (threshold 60 s)"
    );
    // Every live device was watched past the threshold by the last operator: not one false alarm.
    // why: "no false alarm" has no event; 20 s more of the last operator's judging is the window
    std::thread::sleep(Duration::from_secs(20));
    for (d, n) in live.iter().zip(before) {
        assert_eq!(
            silent_events(fleet, d),
            n,
            "{d} alerted as silent across operator restarts: {:?}",
            cluster.warnings("Device", d)
        );
    }
    // Online turns False after 90 s of silence (three missed heartbeats), later than the 60-s alert here.
    cluster.wait(
        "the frozen device shown offline",
        Duration::from_secs(90),
        || {
            cluster
                .condition(&["fdev", frozen], "Online")
                .filter(|c| c.status == "False")
        },
    );
    let offline = Timestamp::now().since(beat.at);
    assert!(
        offline <= Duration::from_secs(90 + 30),
        "Online=False only {offline:?} after its last heartbeat"
    );
    let row = cluster.kubectl(&["get", "fdev", frozen]);
    assert!(
        row.contains("False"),
        "kubectl get fdev shows it offline:\n{row}"
    );
    fleet
        .device(frozen)
        .guest
        .systemctl(&["kill", "-s", "SIGCONT", "fleet-agent"]);
    cluster.wait("the thawed device online again", STEP_TIMEOUT, || {
        cluster
            .condition(&["fdev", frozen], "Online")
            .filter(|c| c.status == "True")
    });
}

/// The deployment `site`: one workload serving `/www` with busybox's httpd on container port 8080, published on
/// host port 18080 of each device, with an HTTP check of `/healthz` every 5 s (two failures make it unhealthy).
fn site(script: &str, rollout: &str) -> String {
    format!(
        "apiVersion: fleet.nationtech.io/v1alpha1\nkind: FleetDeployment\nmetadata:\n  name: site\nspec:\n  \
         allowedGroups: [lab]\n  targetSelector: {{}}\n  workloads:\n    - name: site\n      image: {TEST_IMAGE}\n      \
         command: [sh, -c, \"{script}\"]\n      ports: [{{hostPort: 18080, containerPort: 8080}}]\n      \
         healthCheck:\n        http: {{port: 8080, path: /healthz}}\n        intervalSeconds: 5\n        retries: 2\n\
         {rollout}"
    )
}

/// Scenario 4.
fn http_check_fails_after_the_update(fleet: &LocalFleet) {
    use fleet_wire::health::HealthState;
    let cluster = &fleet.cluster;
    let js = nats::jetstream::new(fleet.nats.connect());
    let reports = js
        .key_value(kv::WORKLOAD_STATUS)
        .expect("workload-status bucket");
    let desired = js
        .key_value(kv::DESIRED_STATE)
        .expect("desired-state bucket");
    let serving =
        "busybox mkdir -p /www && echo ok > /www/healthz && exec busybox httpd -f -p 8080 -h /www";
    let broken = "busybox mkdir -p /www && exec busybox httpd -f -p 8080 -h /www";
    cluster.apply(&site(
        serving,
        "  rollout:\n    soakSeconds: 0\n    maxUnavailable: 3\n",
    ));
    cluster.wait("site healthy on all three", STEP_TIMEOUT, || {
        ids_all()
            .iter()
            .all(|d| {
                reported_workload(&reports, d, "site", WorkloadState::Running)
                    .is_some_and(|(w, _)| w.health == Some(HealthState::Healthy))
            })
            .then_some(())
    });
    cluster.apply(&site(
        broken,
        "  rollout:\n    soakSeconds: 60\n    maxUnavailable: 1\n",
    ));
    let (report, _) = cluster.wait("the canary reports site unhealthy", STEP_TIMEOUT, || {
        reported_workload(&reports, CANARY, "site", WorkloadState::Running)
            .filter(|(w, _)| w.health == Some(HealthState::Unhealthy))
    });
    eprintln!("the canary's report: {report:?}");
    let halted = halted_by_the_canary(fleet, ["fdep", "site"], Duration::from_secs(120));
    assert!(
        halted.message.contains(&format!("{CANARY} (unhealthy)")),
        "{halted:?}"
    );
    cluster.wait(
        "a WorkloadUnhealthy event on the canary's Device",
        Duration::from_secs(60),
        || {
            Some(cluster.warnings("Device", CANARY)).filter(|w| {
                w.iter()
                    .any(|m| m.starts_with("WorkloadUnhealthy") && m.contains("site"))
            })
        },
    );
    // why: no event marks a pass that gave the others nothing; 10 s after the halt's event is the window
    std::thread::sleep(Duration::from_secs(10));
    others_keep_the_previous_spec(&desired, "site", "healthz");
    // The canary keeps the change: its container runs the new spec (not restored to the old one).
    let cmd = fleet
        .device(CANARY)
        .container("fleet-site")
        .expect("fleet-site")["Config"]["Cmd"]
        .clone();
    assert!(
        cmd.to_string()
            .contains(broken.split(" && ").next().unwrap_or_default())
            && !cmd.to_string().contains("healthz"),
        "the canary's container: {cmd}"
    );
    cluster.kubectl(&["delete", "fdep", "site"]);
}

/// Scenario 5: the agent build dies 20 s after every start, after it became ready and committed.
fn crash_looping_agent_stays_halted(fleet: &LocalFleet) {
    let cluster = &fleet.cluster;
    let js = nats::jetstream::new(fleet.nats.connect());
    let intents = js
        .key_value(kv::AGENT_UPGRADE_INTENT)
        .expect("intent bucket");
    let (url, sha) = fleet.publish_crash_looping_v3(20);
    let soak = 60;
    cluster.apply(&format!(
        "{}  rollout:\n    soakSeconds: {soak}\n    maxUnavailable: 1\n",
        release_yaml("looping", "lab", V3, &url, &sha)
    ));
    let committed = cluster.wait("the canary committed", STEP_TIMEOUT, || {
        fleet.view(CANARY)?.upgrade.filter(|u| {
            u.phase == UpgradePhase::Complete
                && u.target_version.as_ref().map(|v| v.as_str()) == Some(V3)
        })
    });
    let halted = halted_by_the_canary(fleet, ["frel", "looping"], Duration::from_secs(120));
    assert!(halted.message.contains(CANARY), "{halted:?}");
    assert!(
        !halted.message.contains("To retry the failed attempts")
            && halted.message.contains("does not undo a failed soak"),
        "the halt proposes an action that cannot work: {halted:?}"
    );
    // Watched for 5 minutes past the soak window: still halted, nobody else given the build.
    let until = committed
        .phase_changed_at
        .plus(Duration::from_secs(soak + 300));
    let mut passes = 0;
    while Timestamp::now() < until {
        let r = cluster.get_json(&["frel", "looping"]).expect("release");
        assert_eq!(
            r["status"]["rollout"]["phase"],
            "Halted",
            "the halt lifted {:?} after the commit: {:#}",
            Timestamp::now().since(committed.phase_changed_at),
            r["status"]
        );
        for d in OTHERS {
            assert!(
                intents.entry(d).ok().flatten().is_none(),
                "{d} received an intent from a halted release"
            );
        }
        passes += 1;
        // why: pacing of the watch over the soak window plus 5 minutes (the window is the assertion)
        std::thread::sleep(Duration::from_secs(5));
    }
    eprintln!("halted through {passes} checks over the soak window plus 5 minutes");
    for d in OTHERS {
        assert_eq!(
            fleet.view(d).and_then(|v| v.agent_version).as_deref(),
            Some(builds::V1),
            "{d} left v1"
        );
    }
    // The canary's agent has been restarting all along: systemd's count, as its device info reports it.
    let info = fleet.device(CANARY).guest.systemctl(&[
        "show",
        "--property=NRestarts",
        "--value",
        "fleet-agent",
    ]);
    let nrestarts: u32 = info.trim().parse().unwrap_or(0);
    assert!(nrestarts >= 3, "NRestarts {info:?}");
    let reported = js
        .key_value(kv::DEVICE_INFO)
        .ok()
        .and_then(|s| kv_entry::<fleet_wire::DeviceInfo>(&s, CANARY))
        .and_then(|(i, _)| i.restarts);
    assert!(
        reported.is_some_and(|n| n >= 2),
        "device-info restarts {reported:?} (systemd says {nrestarts})"
    );
    // What a person reads: the Device says crash-looping with the restart count, and the alert's event.
    let device = cluster.get_json(&["fdev", CANARY]).expect("Device");
    let status = &device["status"];
    assert!(
        status["crashLooping"]
            .as_str()
            .is_some_and(|c| c.starts_with("agent"))
            && status["agentRestarts"]["count"]
                .as_u64()
                .is_some_and(|n| n >= 2),
        "the Device: {status:#}"
    );
    let warnings = cluster.wait(
        "an AgentCrashLooping event on the canary's Device",
        Duration::from_secs(30),
        || {
            Some(cluster.warnings("Device", CANARY))
                .filter(|w| w.iter().any(|m| m.starts_with("AgentCrashLooping")))
        },
    );
    eprintln!("the canary's Device events: {warnings:?}");
    cluster.kubectl(&["delete", "frel", "looping"]);
}
