//! Diagnostics on request against a real nats-server and real rootless Podman: the agent, started
//! before the diagnostics buckets exist (an older operator), says so once and answers once they do; a workload
//! that prints a known line and a delivered Secret value and exits is asked for, and the bundle written to
//! `diagnostics-bundle/<device>.<request-uid>` holds the line, the value as `[redacted]`, the `containers`,
//! `disk` and `memory` sections, `no such workload on this device` for a name the device does not have, and
//! for each updater item what the updater said (the test's peer does not know `diagnostics`). A workload that
//! logged 100 MiB yields a section within the bounds that says it was cut. No section text reaches the agent's
//! log.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use base64::Engine;
use common::*;
use fleet_wire::diagnostics::{
    DiagnosticsBundle, DiagnosticsRequest, Item, MAX_BUNDLE_BYTES, MAX_SECTION_BYTES,
};
use fleet_wire::kv;
use fleet_wire::secrets::{DeviceSecrets, Hidden, SecretUse, SecretValue};
use fleet_wire::{
    AttemptId, DesiredState, DeviceId, RestartPolicy, Timestamp, WorkloadName, WorkloadSpec,
};
use std::time::Duration;

const KNOWN_LINE: &str = "known-line-4a7f: the workload started";
const SECRET_VALUE: &str = "diag-Secret-Value-93kq";

fn device() -> DeviceId {
    DeviceId::try_from(DEVICE).unwrap()
}

/// A workload that prints the known line and its Secret value, then exits.
fn talker() -> WorkloadSpec {
    let mut w = WorkloadSpec::new(WorkloadName::try_from("talker").unwrap(), IMAGE).unwrap();
    w.command = vec![
        "sh".into(),
        "-c".into(),
        format!("echo '{KNOWN_LINE}'; echo \"token: $APP_TOKEN\"; echo bye >&2"),
    ];
    w.restart_policy = RestartPolicy::No;
    w.secrets = vec![SecretUse {
        secret: "app".into(),
        key: "token".into(),
        env: Some("APP_TOKEN".into()),
        file: None,
        uid: None,
        version: Some("1".into()),
    }];
    w
}

/// A workload that logs 100 lines of 1 MiB each (100 MiB), then exits.
fn flood() -> WorkloadSpec {
    let mut w = WorkloadSpec::new(WorkloadName::try_from("flood").unwrap(), IMAGE).unwrap();
    w.command = vec![
        "sh".into(),
        "-c".into(),
        "i=0; while [ $i -lt 100 ]; do head -c 1048576 /dev/zero | tr '\\0' x; echo; i=$((i+1)); done; echo flood-done".into(),
    ];
    w.restart_policy = RestartPolicy::No;
    w
}

fn request(rig: &Rig, workloads: &[&str]) -> AttemptId {
    let uid = AttemptId::new_random();
    let r = DiagnosticsRequest {
        items: vec![],
        workloads: workloads
            .iter()
            .map(|w| WorkloadName::try_from(*w).unwrap())
            .collect(),
        lines: 50,
        since_seconds: None,
        requested_at: Timestamp::now(),
    };
    store(&rig.nc(), kv::DIAGNOSTICS_REQUEST)
        .put(
            &kv::run_key(&device(), &uid),
            serde_json::to_vec(&r).unwrap(),
        )
        .expect("put request");
    uid
}

fn bundle(rig: &Rig, uid: &AttemptId) -> Option<DiagnosticsBundle> {
    let bytes = store(&rig.nc(), kv::DIAGNOSTICS_BUNDLE)
        .get(&kv::run_key(&device(), uid))
        .ok()
        .flatten()?;
    Some(DiagnosticsBundle::parse(&bytes, &device(), uid).expect("the bundle parses"))
}

#[test]
fn a_request_is_answered_with_the_workloads_line_redacted() {
    let rig = Rig::new(true, "");
    fleet_rig::nats_client::create_buckets(&rig.nc(), &[kv::DEVICE_SECRETS]);
    let secrets = DeviceSecrets {
        device_id: device(),
        registries: Default::default(),
        values: vec![SecretValue {
            secret: "app".into(),
            key: "token".into(),
            version: "1".into(),
            value: Hidden(base64::engine::general_purpose::STANDARD.encode(SECRET_VALUE)),
        }],
    };
    store(&rig.nc(), kv::DEVICE_SECRETS)
        .put(DEVICE, serde_json::to_vec(&secrets).unwrap())
        .expect("put secrets");
    let desired = DesiredState::new(device(), 1, vec![talker(), flood()]).unwrap();
    store(&rig.nc(), kv::DESIRED_STATE)
        .put(DEVICE, serde_json::to_vec(&desired).unwrap())
        .expect("put desired");

    let mut agent = rig.spawn_agent();
    agent.wait_ready();
    let p = rig.podman.as_ref().unwrap();
    for name in ["fleet-talker", "fleet-flood"] {
        eventually(
            &agent,
            Duration::from_secs(120),
            &format!("{name} exited"),
            || {
                let state = p.podman(&["ps", "-a", "--format", "{{.Names}} {{.State}}"]);
                state
                    .lines()
                    .any(|l| {
                        l.starts_with(&format!("{name} ")) && l.to_lowercase().contains("exited")
                    })
                    .then_some(())
            },
        );
    }

    // The buckets appear after the agent started: it answers from its next resync on.
    eventually(
        &agent,
        Duration::from_secs(10),
        "the missing buckets logged",
        || {
            agent
                .log_text()
                .contains("diagnostics requests are not answered")
                .then_some(())
        },
    );
    fleet_rig::nats_client::create_buckets(
        &rig.nc(),
        &[kv::DIAGNOSTICS_REQUEST, kv::DIAGNOSTICS_BUNDLE],
    );
    let uid = request(&rig, &["talker", "nosuch"]);
    let b = eventually(&agent, Duration::from_secs(60), "the bundle", || {
        bundle(&rig, &uid)
    });

    let title = |s: &fleet_wire::diagnostics::Section| s.title();
    let titles: Vec<String> = b.sections.iter().map(title).collect();
    assert_eq!(
        titles,
        vec![
            "workloadLogs talker",
            "workloadLogs nosuch",
            "containers",
            "disk",
            "memory",
            "agentJournal",
            "updaterJournal",
            "failedUnits",
            "bootDiagnostics",
            "updaterState",
        ]
    );
    let logs = &b.sections[0];
    assert!(logs.text.contains(KNOWN_LINE), "{logs:?}");
    assert!(logs.text.contains("token: [redacted]"), "{logs:?}");
    assert!(logs.text.contains("bye"), "stderr too: {logs:?}");
    assert!(b.redacted >= 1, "{b:?}");
    assert_eq!(
        b.sections[1].error.as_deref(),
        Some("no such workload on this device")
    );
    let containers = &b.sections[2];
    assert!(
        containers.text.contains("fleet-talker image=") && containers.text.contains("state=exited"),
        "{containers:?}"
    );
    let disk = &b.sections[3];
    assert!(disk.text.starts_with("/ size="), "{disk:?}");
    assert!(
        disk.text.lines().count() >= 3,
        "/, /var and Podman's storage: {disk:?}"
    );
    assert!(
        b.sections[4].text.contains("MemTotal: "),
        "{:?}",
        b.sections[4]
    );
    for s in &b.sections[5..] {
        assert!(
            s.error
                .as_deref()
                .unwrap_or("")
                .starts_with("the updater did not answer:"),
            "{s:?}"
        );
    }
    let json = serde_json::to_string(&b).unwrap();
    assert!(!json.contains(SECRET_VALUE), "{json}");

    // A second request, for every workload (through the watch or a resync): the 100 MiB log is cut to the
    // bounds and says so; the bundle stays within its size.
    let every = request(&rig, &[]);
    let second = eventually(&agent, Duration::from_secs(60), "the second bundle", || {
        bundle(&rig, &every)
    });
    let raw = store(&rig.nc(), kv::DIAGNOSTICS_BUNDLE)
        .get(&kv::run_key(&device(), &every))
        .unwrap()
        .unwrap();
    assert!(raw.len() <= MAX_BUNDLE_BYTES, "{} bytes", raw.len());
    let titles: Vec<String> = second.sections.iter().map(title).collect();
    assert_eq!(titles[..2], ["workloadLogs flood", "workloadLogs talker"]);
    let flood = &second.sections[0];
    assert_eq!(flood.item, Item::WorkloadLogs);
    assert!(flood.cut, "{:?}", flood.error);
    assert!(flood.text.len() <= MAX_SECTION_BYTES && flood.text.contains("xxxx"));
    assert!(second.sections[1].text.contains(KNOWN_LINE));
    // A request this agent cannot read is answered with one section saying why.
    let bad = AttemptId::new_random();
    store(&rig.nc(), kv::DIAGNOSTICS_REQUEST)
        .put(
            &kv::run_key(&device(), &bad),
            br#"{"lines":0,"requestedAt":"2026-12-07T10:00:00.000Z"}"#,
        )
        .expect("put request");
    let third = eventually(&agent, Duration::from_secs(60), "the third bundle", || {
        bundle(&rig, &bad)
    });
    assert_eq!(third.sections.len(), 1, "{third:?}");
    let why = third.sections[0].error.as_deref().unwrap_or("");
    assert!(
        why.starts_with("the request could not be read:") && why.contains("lines"),
        "{why}"
    );
    let log = agent.log_text();
    assert_eq!(
        log.matches("diagnostics requests are not answered").count(),
        1,
        "{log}"
    );
    assert_eq!(
        log.matches("bundle of").count(),
        3,
        "one line per request: {log}"
    );
    for leak in [KNOWN_LINE, SECRET_VALUE, "MemTotal"] {
        assert!(!log.contains(leak), "{leak} is in the agent's log:\n{log}");
    }
    agent.sigterm();
    assert!(agent.wait_exit(Duration::from_secs(30)).success());
}
