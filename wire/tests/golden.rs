//! Golden files pin every wire shape: a change to a serialization must change a file under `tests/golden/`.
//! `UPDATE_GOLDEN=1 cargo test -p fleet-wire --test golden` rewrites them; review the diff.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use fleet_wire::socket::{
    ErrorCode, Request, RequestFrame, Response, ResponseFrame, PROTOCOL_VERSION,
};
use fleet_wire::*;
use serde::{de::DeserializeOwned, Serialize};
use std::fmt::Debug;
use std::path::PathBuf;

fn check<T: Serialize + DeserializeOwned + PartialEq + Debug>(name: &str, value: &T) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(format!("{name}.json"));
    let json = serde_json::to_string_pretty(value).unwrap() + "\n";
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, &json).unwrap();
    }
    let golden = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run with UPDATE_GOLDEN=1 to create it)",
            path.display()
        )
    });
    assert_eq!(
        json, golden,
        "{name}: serialization changed; if intended, UPDATE_GOLDEN=1 and review"
    );
    let back: T = serde_json::from_str(&golden)
        .unwrap_or_else(|e| panic!("{name}: golden does not parse: {e}"));
    assert_eq!(&back, value, "{name}: round trip");
}

fn request(request: Request) -> RequestFrame {
    RequestFrame {
        protocol: PROTOCOL_VERSION,
        request,
    }
}
fn response(response: Response) -> ResponseFrame {
    ResponseFrame {
        protocol: PROTOCOL_VERSION,
        response,
    }
}

#[test]
fn agent_upgrade_shapes() {
    check("agent-upgrade-attempt", &fixtures::attempt());
    let mut oci = fixtures::attempt();
    oci.artifact = format!(
        "oci://registry.example.com/harmony/fleet-agent:1.2.0@sha256:{}",
        "c".repeat(64)
    )
    .parse()
    .unwrap();
    check("agent-upgrade-attempt-oci", &oci);
    check(
        "agent-upgrade-status-preparing",
        &fixtures::upgrade_status(),
    );
    check("agent-upgrade-status-failed", &fixtures::failed_status());
}

/// The canonical digest is part of the contract: agent and updater of different releases must agree on it.
#[test]
fn attempt_digest_is_pinned() {
    assert_eq!(
        fixtures::attempt().digest().as_str(),
        include_str!("golden/agent-upgrade-attempt.digest").trim()
    );
    assert_eq!(
        fixtures::workload("web").digest().as_str(),
        include_str!("golden/workload-spec.digest").trim()
    );
}

#[test]
fn socket_shapes() {
    check("socket-request-status", &request(Request::Status {}));
    check(
        "socket-request-upgrade",
        &request(Request::Upgrade {
            attempt: fixtures::attempt(),
        }),
    );
    check(
        "socket-request-system-upgrade",
        &request(Request::SystemUpgrade {
            attempt: fixtures::system_attempt(),
        }),
    );
    check(
        "socket-response-status",
        &response(Response::Status {
            status: fixtures::updater_status(),
        }),
    );
    check(
        "socket-response-accepted",
        &response(Response::Accepted {
            status: fixtures::updater_status(),
        }),
    );
    check(
        "socket-response-error",
        &response(Response::error(
            ErrorCode::Conflict,
            "attempt 6f1c… was accepted with other content",
        )),
    );
}

#[test]
fn fetch_helper_shapes() {
    let a = fixtures::attempt();
    let mut v1 = FetchRequest::new(
        a.artifact.clone(),
        a.sha256.clone(),
        a.byte_limit,
        Some("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n".into()),
    );
    v1.protocol = fleet_wire::fetch::FETCH_PROTOCOL_V1;
    // What an updater started before protocol 2 still sends.
    check("fetch-request", &v1);
    let point = fleet_wire::fetch::ResumePoint {
        offset: 1_048_576,
        validators: fleet_wire::fetch::Validators {
            total: Some(20_000_000),
            etag: Some("\"5f3a-1312d00\"".into()),
            last_modified: Some("Tue, 01 Dec 2026 10:00:00 GMT".into()),
        },
    };
    let mut resume = FetchRequest::new(a.artifact, a.sha256, a.byte_limit, None);
    resume.resume = Some(point.clone());
    resume.time_left_ms = Some(240_000);
    resume.max_bytes_per_sec = Some(262_144);
    check("fetch-request-resume", &resume);
    check("fetch-start", &point);
    check(
        "fetch-failure",
        &FetchFailure {
            reason: UpgradeReason::ArtifactTooLarge,
            message: BoundedText::lossy(
                "the artifact exceeded its limit of 1048576 bytes while downloading",
            ),
            transient: false,
        },
    );
    check(
        "fetch-failure-transient",
        &FetchFailure {
            reason: UpgradeReason::DownloadFailed,
            message: BoundedText::lossy(
                "request to https://artifacts.example.com/fleet-agent failed: connection reset by peer",
            ),
            transient: true,
        },
    );
}

#[test]
fn self_test_report_shape() {
    let report = SelfTestReport {
        version: Version::try_from("1.2.0").unwrap(),
        passed: false,
        checks: vec![
            SelfTestCheck {
                name: "config".into(),
                ok: true,
                error: None,
            },
            SelfTestCheck {
                name: "nats".into(),
                ok: false,
                error: Some(BoundedText::lossy("connection refused")),
            },
        ],
    };
    check("self-test-report", &report);
}

#[test]
fn task_shapes() {
    check("system-upgrade-attempt", &fixtures::system_attempt());
    check("system-upgrade-status", &fixtures::system_status());
    check("task-plan", &fixtures::task_plan());
    check("task-plan-manifest", &fixtures::task_plan_manifest());
    check("task-plan-chunk", &fixtures::task_plan_chunk());
    check("task-run-status", &fixtures::task_run_status());
}

#[test]
fn device_and_workload_shapes() {
    check("device-info", &fixtures::device_info());
    check(
        "device-retirement",
        &DeviceRetirement {
            device_id: fixtures::device(),
            retired_at: Timestamp::from_unix_ms(1_800_000_000_000),
            device_uid: Some("5f0c2a3e-8d1b-4c62-9a57-0e6f1b2c3d4e".into()),
        },
    );
    check("heartbeat", &fixtures::heartbeat());
    check("device-usage", &fixtures::device_usage());
    check("desired-state", &fixtures::desired_state());
    check("workload-status", &fixtures::workload_status());
    check(
        "workload-status-failed",
        &fixtures::workload_status_failed(),
    );
    check(
        "workload-status-crash-looping",
        &fixtures::workload_status_crash_looping(),
    );
    check(
        "workload-status-unhealthy",
        &fixtures::workload_status_unhealthy(),
    );
}

#[test]
fn real_application_shapes() {
    check("workload-spec-app", &fixtures::workload_app("web"));
    check("device-secrets", &fixtures::device_secrets());
    let mut oom = fixtures::workload_status_crash_looping();
    oom.workloads[0].state = WorkloadState::OomKilled;
    oom.workloads[0].restarts.as_mut().unwrap().oom_killed = true;
    oom.desired_error = Some(BoundedText::lossy(
        "desired state revision 9 cannot be honoured: unknown field `futureField`; keeping generation 7",
    ));
    check("workload-status-oom-killed", &oom);
}

/// The new fields are additive: a spec that uses none of them serializes without them (the digest pinned since
/// the first commit holds, see below), and an agent before them refuses a desired state that uses any of them
/// (the whole value) rather than running the workload without its limits, secrets or devices.
#[test]
fn an_older_agent_refuses_real_application_fields_rather_than_dropping_them() {
    let plain = serde_json::to_value(fixtures::workload("web")).unwrap();
    for f in [
        "resources",
        "secrets",
        "devices",
        "groups",
        "capabilities",
        "privileged",
    ] {
        assert!(plain.get(f).is_none(), "{f} in {plain}");
    }
    let app = fixtures::workload_app("web");
    assert_eq!(
        app.v2_fields(),
        ["resources", "secrets", "devices", "groups", "capabilities"]
    );
    assert_ne!(app.digest(), fixtures::workload("web").digest());
    let full = serde_json::to_value(&app).unwrap();
    for field in ["resources", "secrets", "devices", "groups", "capabilities"] {
        let mut one = plain.clone();
        one[field] = full[field].clone();
        let state =
            serde_json::json!({"deviceId": "device-1", "generation": 8, "workloads": [one]});
        let e = serde_json::from_value::<OldDesiredState>(state.clone())
            .err()
            .expect("an older agent must refuse it");
        assert!(
            e.to_string().contains(&format!("unknown field `{field}`")),
            "{e}"
        );
        let back: DesiredState = serde_json::from_value(state).expect("today's reader takes it");
        assert_eq!(back.workloads.len(), 1);
    }
    // No value of a Secret is in the spec: only which key, as what, at which version.
    assert!(!full.to_string().contains("czNjcjN0"));
}

/// Statuses stay readable across versions: an `oomKilled` from a newer agent is ignored by nothing that reads
/// `Restarts`, and a status without `desiredError` reads as taken.
#[test]
fn oom_and_desired_error_are_additive() {
    let old: DeviceWorkloadStatus =
        serde_json::from_str(include_str!("golden/workload-status.json")).unwrap();
    assert_eq!(old.desired_error, None);
    let v = serde_json::to_value(fixtures::workload_status_crash_looping()).unwrap();
    assert!(
        v["workloads"][0]["restarts"].get("oomKilled").is_none(),
        "{v}"
    );
}

#[test]
fn health_check_shapes() {
    for kind in ["command", "http", "tcp"] {
        check(
            &format!("workload-spec-health-{kind}"),
            &fixtures::workload_with_health("web", kind),
        );
    }
}

/// A spec without a health check serializes without the field, so its digest is the one pinned before the field
/// existed (`golden/workload-spec.digest`, unchanged): adding the field replaces no running container. A spec
/// with one has another digest.
#[test]
fn a_spec_without_a_health_check_keeps_its_digest() {
    let plain = fixtures::workload("web");
    let json = serde_json::to_value(&plain).unwrap();
    assert!(json.get("healthCheck").is_none(), "{json}");
    // The value pinned since the first commit (09f5308), spelled out so that a regenerated golden file cannot
    // hide a change.
    assert_eq!(
        plain.digest().as_str(),
        "ede767cba3b43074dcb19e20b2a16fa63324454d39e59e16228c5ebf6d8b34da"
    );
    for kind in ["command", "http", "tcp"] {
        assert_ne!(
            fixtures::workload_with_health("web", kind).digest(),
            plain.digest(),
            "{kind}"
        );
    }
}

/// The workload spec as fleet-wire read it before `healthCheck` existed (`deny_unknown_fields`, every other
/// field as it was): what an older agent runs.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[allow(dead_code)]
struct OldWorkloadSpec {
    name: String,
    image: String,
    #[serde(default)]
    command: Vec<String>,
    #[serde(default)]
    env: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    ports: Vec<serde_json::Value>,
    #[serde(default)]
    volumes: Vec<serde_json::Value>,
    #[serde(default)]
    restart_policy: Option<String>,
    #[serde(default)]
    labels: std::collections::BTreeMap<String, String>,
}

/// The desired state as an older agent reads it.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[allow(dead_code)]
struct OldDesiredState {
    device_id: String,
    generation: u64,
    workloads: Vec<OldWorkloadSpec>,
}

/// An agent before `healthCheck` refuses a desired state that has one (the whole value: it keeps running its
/// last valid desired state and logs why) instead of silently running the workload without its check; one
/// without a health check it reads as before.
#[test]
fn an_older_agent_refuses_a_health_check_rather_than_dropping_it() {
    let golden = include_str!("golden/desired-state.json");
    let old: OldDesiredState =
        serde_json::from_str(golden).expect("an older agent reads today's plain spec");
    assert_eq!(old.workloads.len(), 1);
    let with = DesiredState::new(
        fixtures::device(),
        8,
        vec![fixtures::workload_with_health("web", "http")],
    )
    .unwrap();
    let json = serde_json::to_string(&with).unwrap();
    let e = serde_json::from_str::<OldDesiredState>(&json)
        .err()
        .expect("an older agent must refuse a health check");
    assert!(e.to_string().contains("unknown field `healthCheck`"), "{e}");
    // Today's reader takes it whole.
    let back: DesiredState = serde_json::from_str(&json).unwrap();
    assert_eq!(back, with);
}

/// Health is additive: a status from an agent before it reads as "no health reported", and a health value from
/// a newer agent reads as `unknown` rather than failing the whole status.
#[test]
fn workload_health_is_additive() {
    let old: DeviceWorkloadStatus =
        serde_json::from_str(include_str!("golden/workload-status.json")).unwrap();
    assert_eq!(old.workloads[0].health, None);
    let mut v = serde_json::to_value(fixtures::workload_status_unhealthy()).unwrap();
    v["workloads"][0]["health"] = serde_json::json!("degraded");
    let s: DeviceWorkloadStatus = serde_json::from_value(v).unwrap();
    assert_eq!(s.workloads[0].health, Some(HealthState::Unknown));
}

/// Restart counts are additive: a device info and a workload status from agents before them read as "not
/// known" (`None`), never as zero restarts.
#[test]
fn restart_counts_are_additive() {
    let mut v = serde_json::to_value(fixtures::device_info()).unwrap();
    v.as_object_mut().unwrap().remove("restarts");
    let info: DeviceInfo = serde_json::from_value(v).unwrap();
    assert_eq!(info.restarts, None);
    let old: DeviceWorkloadStatus =
        serde_json::from_str(include_str!("golden/workload-status.json")).unwrap();
    assert_eq!(old.workloads[0].restarts, None);
    let looping = fixtures::workload_status_crash_looping();
    let w = &looping.workloads[0];
    assert_eq!(w.state, fleet_wire::WorkloadState::CrashLooping);
    assert_eq!(w.restarts.map(|r| r.count), Some(7));
}

/// The failure details are additive: an agent before them writes a status this reader takes (no failure), and a
/// reason from a newer agent reads as `other` rather than failing the whole status.
#[test]
fn workload_failure_is_additive() {
    let old: DeviceWorkloadStatus =
        serde_json::from_str(include_str!("golden/workload-status.json")).unwrap();
    assert_eq!(old.workloads[0].failure, None);
    let mut v = serde_json::to_value(fixtures::workload_status_failed()).unwrap();
    v["workloads"][0]["failure"]["reason"] = serde_json::json!("disk-on-fire");
    let s: DeviceWorkloadStatus = serde_json::from_value(v).unwrap();
    let f = s.workloads[0].failure.as_ref().unwrap();
    assert_eq!(f.reason, FailureReason::Other);
}

/// Older readers must cope with newer devices: unknown fields and capabilities in device info are tolerated.
#[test]
fn device_info_tolerates_newer_writers() {
    let mut v = serde_json::to_value(fixtures::device_info()).unwrap();
    v["futureField"] = serde_json::json!({"x": 1});
    v["capabilities"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!("TeleportV9"));
    let info: DeviceInfo = serde_json::from_value(v).expect("tolerant");
    assert_eq!(info.capabilities.last(), Some(&Capability::Unknown));
}

#[test]
fn diagnostics_shapes() {
    use fleet_wire::diagnostics::{DiagnosticsBundle, DiagnosticsRequest, Item, Section};
    let req = DiagnosticsRequest {
        items: vec![Item::WorkloadLogs, Item::AgentJournal, Item::Disk],
        workloads: vec![WorkloadName::try_from("web").unwrap()],
        lines: 200,
        since_seconds: Some(3600),
        requested_at: Timestamp::from_unix_ms(1_796_000_000_000),
    };
    check("diagnostics-request", &req);
    check(
        "socket-request-diagnostics",
        &request(Request::Diagnostics {
            request: req.clone(),
        }),
    );
    let journal = Section::new(Item::AgentJournal, None, "line 1\nline 2\nline 3\n", 2);
    check(
        "socket-response-diagnostics",
        &response(Response::Diagnostics {
            sections: vec![journal.clone()],
        }),
    );
    check(
        "diagnostics-bundle",
        &DiagnosticsBundle {
            device: DeviceId::try_from("device-1").unwrap(),
            request: "0a5b3c1e-8f2d-4b7a-9c6e-1d2f3a4b5c6d".parse().unwrap(),
            collected_at: Timestamp::from_unix_ms(1_796_000_001_000),
            sections: vec![
                Section::new(
                    Item::WorkloadLogs,
                    Some(WorkloadName::try_from("web").unwrap()),
                    "listening on :8080\n",
                    200,
                ),
                journal,
                Section::failed(Item::Disk, None, "statvfs /var: permission denied"),
            ],
            redacted: 1,
            cut: false,
        },
    );
}
