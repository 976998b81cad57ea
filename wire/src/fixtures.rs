//! Fixed example values for tests, golden files, examples and benchmarks. Deterministic: no clock, no randomness.
//! Compiled only for this crate's own tests and with the `fixtures` feature, which its users enable from their
//! `[dev-dependencies]`: no release binary contains it.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use crate::*;
use std::collections::BTreeMap;

pub const DEVICE: &str = "device-1";
pub const ATTEMPT: &str = "6f1c2b9e-8d0a-4c55-9a77-3f2e1d0c9b8a";
pub const RUN: &str = "0d9f5a62-3b1e-4f7a-8c2d-5e6f7a8b9c0d";
pub const BOOT: &str = "4c1f0e2d3b4a59687766554433221100";

/// `2026-11-30T01:00:00Z` plus `secs` seconds.
pub fn t(secs: u64) -> Timestamp {
    Timestamp::from_unix_ms((1_796_000_400 + secs) * 1000)
}

pub fn device() -> DeviceId {
    DeviceId::try_from(DEVICE).unwrap()
}

pub fn attempt() -> AgentUpgradeAttempt {
    AgentUpgradeAttempt {
        attempt_id: AttemptId::try_from(ATTEMPT).unwrap(),
        device_id: device(),
        target_version: Version::try_from("1.2.0").unwrap(),
        architecture: Architecture::Arm64,
        artifact: "https://artifacts.example.com/fleet-agent/1.2.0/fleet-agent-arm64"
            .parse()
            .unwrap(),
        byte_limit: ByteLimit::try_from(20 * 1024 * 1024).unwrap(),
        sha256: Sha256Hex::try_from(
            "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
        )
        .unwrap(),
    }
}

pub fn upgrade_status() -> AgentUpgradeStatus {
    let a = attempt();
    let mut s = AgentUpgradeStatus {
        device_id: device(),
        attempt_id: Some(a.attempt_id),
        target_version: Some(a.target_version.clone()),
        attempt_digest: Some(a.digest()),
        phase: UpgradePhase::Preparing,
        reason: None,
        detail: Some(BoundedText::lossy("downloading")),
        error: None,
        attempt_started_at: t(0),
        phase_changed_at: t(0),
        drain_duration_ms: None,
        boot_id: Some(Id128::try_from(BOOT).unwrap()),
        invocation_id: None,
        journal_unit: Some(UnitName::try_from("fleet-updater.service").unwrap()),
        transitions: Transitions::default(),
    };
    s.transitions.push(Transition {
        phase: UpgradePhase::Preparing,
        at: t(0),
        reason: None,
    });
    s
}

/// A status that went all the way through a rollback, with every optional field set.
pub fn failed_status() -> AgentUpgradeStatus {
    let mut s = upgrade_status();
    s.enter(UpgradePhase::Stopping, t(30), Some(UpgradeReason::Updater));
    s.drain_duration_ms = Some(840);
    s.enter(UpgradePhase::Starting, t(31), None);
    s.enter(
        UpgradePhase::RollingBack,
        t(271),
        Some(UpgradeReason::StartFailed),
    );
    s.enter(
        UpgradePhase::Failed,
        t(275),
        Some(UpgradeReason::StartFailed),
    );
    s.detail = Some(BoundedText::lossy("previous agent 1.1.0 restored"));
    s.error = Some(BoundedText::lossy(
        "fleet-agent.service did not become ready within 4min",
    ));
    s.invocation_id = Some(Id128::try_from("0123456789abcdef0123456789abcdef").unwrap());
    s
}

pub fn workload(name: &str) -> WorkloadSpec {
    let mut w = WorkloadSpec::new(
        WorkloadName::try_from(name).unwrap(),
        "localhost/busybox:1.36",
    )
    .unwrap();
    w.command = vec!["httpd".into(), "-f".into(), "-p".into(), "8080".into()];
    w.env = BTreeMap::from([("MODE".into(), "demo".into())]);
    w.ports = vec![PortMapping {
        host_port: 8080,
        container_port: 8080,
        protocol: Protocol::Tcp,
    }];
    w.volumes = vec![VolumeMount {
        source: "web-data".into(),
        target: "/data".into(),
        read_only: false,
    }];
    w.labels = BTreeMap::from([("app".into(), name.into())]);
    w
}

/// `workload(name)` as a real application: limits, a Secret key as env and as a file, a serial device, a group
/// and an added capability (the fields real applications added to the spec, `version` as the operator sets it).
pub fn workload_app(name: &str) -> WorkloadSpec {
    let mut w = workload(name);
    w.resources = Some(crate::Resources {
        memory_mib: Some(64),
        cpu_millis: Some(500),
        pids: Some(128),
    });
    let use_ = |env: Option<&str>, file: Option<&str>| crate::SecretUse {
        secret: "api".into(),
        key: "token".into(),
        env: env.map(Into::into),
        file: file.map(Into::into),
        uid: file.map(|_| 1000),
        version: Some("4711".into()),
    };
    w.secrets = vec![
        use_(Some("API_TOKEN"), None),
        use_(None, Some("/run/secrets/token")),
    ];
    w.devices = vec!["/dev/ttyS0".into()];
    w.groups = vec!["dialout".into()];
    w.capabilities = vec!["NET_ADMIN".into()];
    w.validate().unwrap();
    w
}

/// The `device-secrets` value of a device running [`workload_app`] from a private registry.
pub fn device_secrets() -> crate::DeviceSecrets {
    crate::DeviceSecrets {
        device_id: device(),
        registries: BTreeMap::from([(
            "registry.example.com:5000".into(),
            crate::RegistryAuth {
                username: "fleet-pull".into(),
                password: crate::Hidden("pull-password".into()),
            },
        )]),
        values: vec![crate::SecretValue {
            secret: "api".into(),
            key: "token".into(),
            version: "4711".into(),
            value: crate::Hidden("czNjcjN0".into()),
        }],
    }
}

/// `workload(name)` with a health check of `kind` (`command`, `http` or `tcp`): the HTTP and TCP probes target
/// its published container port 8080; non-default timing.
pub fn workload_with_health(name: &str, kind: &str) -> WorkloadSpec {
    let mut w = workload(name);
    let probe = match kind {
        "command" => HealthProbe::Command(vec![
            "wget".into(),
            "-q".into(),
            "-O-".into(),
            "http://127.0.0.1:8080/healthz".into(),
        ]),
        "http" => HealthProbe::Http(HttpProbe {
            port: 8080,
            path: "/healthz".into(),
        }),
        _ => HealthProbe::Tcp(TcpProbe { port: 8080 }),
    };
    w.health_check = Some(HealthCheck {
        probe,
        interval_seconds: 10,
        timeout_seconds: 2,
        retries: 3,
        start_period_seconds: 15,
    });
    w.validate().unwrap();
    w
}

pub fn desired_state() -> DesiredState {
    DesiredState::new(device(), 7, vec![workload("web")]).unwrap()
}

pub fn workload_status() -> DeviceWorkloadStatus {
    let w = workload("web");
    DeviceWorkloadStatus {
        device_id: device(),
        generation: 7,
        at: t(60),
        workloads: vec![WorkloadStatus {
            name: w.name.clone(),
            state: WorkloadState::Running,
            container_id: Some("3f2a".repeat(16)),
            spec_digest: Some(w.digest()),
            started_at: Some(t(30)),
            error: None,
            failure: None,
            restarts: None,
            health: None,
        }],
        desired_error: None,
    }
}

/// A workload whose new image could not be pulled while the previous spec's container keeps running.
pub fn workload_status_failed() -> DeviceWorkloadStatus {
    let w = workload("web");
    let mut s = workload_status();
    s.workloads = vec![WorkloadStatus {
        name: w.name.clone(),
        state: WorkloadState::Failed,
        container_id: None,
        spec_digest: None,
        started_at: None,
        error: Some(BoundedText::lossy(
            "image localhost/web:nope could not be pulled: manifest unknown",
        )),
        failure: Some(crate::WorkloadFailure {
            reason: crate::FailureReason::ImagePullFailed,
            running_container_id: Some("3f2a".repeat(16)),
            running_spec_digest: Some(w.digest()),
            rolled_back: false,
        }),
        restarts: None,
        health: None,
    }];
    s
}

/// A workload whose container Podman keeps restarting: seven restarts, the last exit seen with code 3.
pub fn workload_status_crash_looping() -> DeviceWorkloadStatus {
    let w = workload("web");
    let mut s = workload_status();
    s.workloads = vec![WorkloadStatus {
        name: w.name.clone(),
        state: WorkloadState::CrashLooping,
        container_id: Some("3f2a".repeat(16)),
        spec_digest: Some(w.digest()),
        started_at: None,
        error: None,
        failure: None,
        restarts: Some(crate::Restarts {
            count: 7,
            last_exit_code: Some(3),
            oom_killed: false,
        }),
        health: None,
    }];
    s
}

/// A workload with an HTTP health check whose container runs but failed its last three checks.
pub fn workload_status_unhealthy() -> DeviceWorkloadStatus {
    let w = workload_with_health("web", "http");
    let mut s = workload_status();
    s.workloads = vec![WorkloadStatus {
        name: w.name.clone(),
        state: WorkloadState::Running,
        container_id: Some("3f2a".repeat(16)),
        spec_digest: Some(w.digest()),
        started_at: Some(t(30)),
        error: Some(BoundedText::lossy(
            "health check: GET /healthz on port 8080 answered HTTP 503",
        )),
        failure: None,
        restarts: Some(crate::Restarts {
            count: 0,
            last_exit_code: None,
            oom_killed: false,
        }),
        health: Some(HealthState::Unhealthy),
    }];
    s
}

pub fn device_info() -> DeviceInfo {
    DeviceInfo {
        device_id: device(),
        agent_version: Version::try_from("1.1.0").unwrap(),
        architecture: Architecture::Arm64,
        os: OsInfo {
            id: BoundedText::lossy("debian"),
            version_id: Some(BoundedText::lossy("12")),
            pretty_name: Some(BoundedText::lossy("Debian GNU/Linux 12 (bookworm)")),
        },
        capabilities: vec![
            Capability::AgentUpgradeV1,
            Capability::OciArtifactsV1,
            Capability::AptFullUpgradeV1,
        ],
        boot_id: Some(Id128::try_from(BOOT).unwrap()),
        published_at: t(1),
        restarts: Some(0),
        reboot_client_id: None,
    }
}

pub fn heartbeat() -> Heartbeat {
    Heartbeat {
        device_id: device(),
        at: t(90),
        agent_version: Version::try_from("1.1.0").unwrap(),
        boot_id: Some(Id128::try_from(BOOT).unwrap()),
        sequence: 3,
    }
}

pub fn device_usage() -> DeviceUsage {
    use crate::usage::{FilesystemRole, FilesystemUsage, MemoryUsage};
    const GIB: u64 = 1 << 30;
    let fs = |role, size_bytes, available_bytes| FilesystemUsage {
        role,
        size_bytes,
        available_bytes,
    };
    DeviceUsage::new(
        device(),
        t(95),
        vec![
            fs(FilesystemRole::Root, 30 * GIB, 3 * GIB / 2),
            fs(FilesystemRole::AgentState, 30 * GIB, 3 * GIB / 2),
            fs(FilesystemRole::Containers, 30 * GIB, 3 * GIB / 2),
        ],
        MemoryUsage {
            total_bytes: 4 * GIB,
            available_bytes: 3 * GIB,
            pressure_some_avg10_centi: Some(12),
        },
        37,
        4,
    )
    .unwrap()
}

pub fn system_attempt() -> SystemUpgradeAttempt {
    SystemUpgradeAttempt {
        run_uid: AttemptId::try_from(RUN).unwrap(),
        device_id: device(),
        operation: TaskOperation::AptFullUpgradeV1,
        expires_at: t(21600),
    }
}

pub fn system_status() -> SystemUpgradeStatus {
    let mut transitions = Transitions::default();
    transitions.push(Transition {
        phase: SystemUpgradePhase::Accepted,
        at: t(10),
        reason: None,
    });
    transitions.push(Transition {
        phase: SystemUpgradePhase::Upgrading,
        at: t(11),
        reason: None,
    });
    transitions.push(Transition {
        phase: SystemUpgradePhase::Rebooting,
        at: t(400),
        reason: None,
    });
    transitions.push(Transition {
        phase: SystemUpgradePhase::Succeeded,
        at: t(460),
        reason: None,
    });
    SystemUpgradeStatus {
        run_uid: AttemptId::try_from(RUN).unwrap(),
        device_id: device(),
        phase: SystemUpgradePhase::Succeeded,
        reason: None,
        error: None,
        accepted_at: t(10),
        completed_at: Some(t(460)),
        first_heartbeat_after_completion: Some(t(470)),
        reboot_required: true,
        detail: None,
        output_tail: None,
        transitions,
    }
}

pub fn updater_status() -> UpdaterStatus {
    UpdaterStatus {
        updater_version: "0.1.0".into(),
        boot_id: Some(Id128::try_from(BOOT).unwrap()),
        recovering: false,
        agent_upgrade: Some(upgrade_status()),
        system_upgrade: Some(system_status()),
        capabilities: vec![
            Capability::AgentUpgradeV1,
            Capability::OciArtifactsV1,
            Capability::AptFullUpgradeV1,
        ],
    }
}

pub fn task_plan() -> TaskPlan {
    let d = |s: &str| DeviceId::try_from(s).unwrap();
    TaskPlan::new(
        AttemptId::try_from(RUN).unwrap(),
        TaskOperation::AptFullUpgradeV1,
        t(21600),
        vec![d("device-1")],
        vec![d("device-2"), d("device-3")],
        t(5),
    )
    .unwrap()
}

pub fn task_run_status() -> TaskRunStatus {
    TaskRunStatus {
        phase: Some(TaskRunPhase::Failed),
        targets: 3,
        succeeded: 0,
        failed: 1,
        start_time: Some(t(5)),
        completion_time: Some(t(700)),
        reason: Some(TaskRunReason::CanaryFailed),
        latest_error: Some(BoundedText::lossy(
            "device-1: apt-get full-upgrade exited with 100",
        )),
    }
}

pub fn task_plan_manifest() -> TaskPlanManifest {
    task_plan().to_stored().0
}

pub fn task_plan_chunk() -> TaskPlanChunk {
    serde_json::from_slice(&task_plan().to_stored().1[0].1).unwrap()
}
