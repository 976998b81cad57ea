//! Workload health checks against real Podman and a real nats-server: a failing command check is Podman's own
//! (`podman ps` shows `(unhealthy)`) and the agent reports the workload `unhealthy` with Podman's failed check as
//! its error; a passing one `healthy`; an HTTP probe the agent runs turns `unhealthy` after `retries` failed
//! checks once the server at the published port answers 503, and `healthy` again when it recovers.
//!
//! What this sandbox cannot give and how the test stands in for it: Podman here has no systemd (the test rig's
//! rootful Podman, `cgroup_manager = "cgroupfs"`), so Podman's healthcheck timer never starts; the agent finds
//! that from the container's empty health log and runs Podman's check itself through the API (on a device,
//! Podman's timer runs it: checked by hand in an nspawn device, see docs/crds.md). Containers get no network
//! (`netns = "none"`), so a published port is not wired to the container: the test's own HTTP server listens on
//! the host port the workload publishes and stands in for the workload's server there.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::*;
use fleet_wire::kv;
use fleet_wire::{
    DesiredState, DeviceId, DeviceWorkloadStatus, HealthCheck, HealthProbe, HealthState, HttpProbe,
    PortMapping, Protocol, WorkloadName, WorkloadSpec, WorkloadStatus,
};
use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn sleeper(name: &str, check: Option<HealthCheck>) -> WorkloadSpec {
    let mut w = WorkloadSpec::new(WorkloadName::try_from(name).unwrap(), IMAGE).unwrap();
    w.command = vec!["sleep".into(), "1000".into()];
    w.health_check = check;
    w
}

fn command_check(argv: &[&str]) -> HealthCheck {
    HealthCheck {
        interval_seconds: 5,
        timeout_seconds: 2,
        retries: 2,
        start_period_seconds: 0,
        ..HealthCheck::new(HealthProbe::Command(
            argv.iter().map(|a| (*a).to_owned()).collect(),
        ))
    }
}

/// An HTTP server on a free port of 127.0.0.1 answering every request with the status code in `code`.
fn http_server() -> (u16, Arc<AtomicU16>) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    let code = Arc::new(AtomicU16::new(200));
    let c = code.clone();
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut req = [0u8; 1024];
            let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
            let _ = conn.read(&mut req);
            let code = c.load(Ordering::SeqCst);
            let _ = write!(conn, "HTTP/1.1 {code} X\r\nContent-Length: 0\r\n\r\n");
        }
    });
    (port, code)
}

fn status_of<'a>(s: &'a DeviceWorkloadStatus, name: &str) -> Option<&'a WorkloadStatus> {
    s.workloads.iter().find(|w| w.name.as_str() == name)
}

#[test]
fn health_checks_are_run_and_reported() {
    let rig = Rig::new(true, "");
    let p = rig.podman.as_ref().unwrap();
    let (port, code) = http_server();
    let mut api = sleeper(
        "api",
        Some(HealthCheck {
            interval_seconds: 5,
            timeout_seconds: 1,
            retries: 2,
            start_period_seconds: 0,
            ..HealthCheck::new(HealthProbe::Http(HttpProbe {
                port: 80,
                path: "/healthz".into(),
            }))
        }),
    );
    api.ports = vec![PortMapping {
        host_port: port,
        container_port: 80,
        protocol: Protocol::Tcp,
    }];
    api.validate().unwrap();
    let desired = DesiredState::new(
        DeviceId::try_from(DEVICE).unwrap(),
        1,
        vec![
            sleeper(
                "sick",
                Some(command_check(&["sh", "-c", "echo down >&2; exit 3"])),
            ),
            sleeper("well", Some(command_check(&["true"]))),
            api,
            sleeper("plain", None),
        ],
    )
    .unwrap();
    store(&rig.nc(), kv::DESIRED_STATE)
        .put(DEVICE, serde_json::to_vec(&desired).unwrap())
        .expect("put desired");

    let mut agent = rig.spawn_agent();
    agent.wait_ready();
    let st = store(&rig.nc(), kv::WORKLOAD_STATUS);
    let health = |name: &str| -> Option<(HealthState, Option<String>)> {
        let s: DeviceWorkloadStatus = get_json(&st, DEVICE)?;
        let w = status_of(&s, name)?;
        Some((w.health?, w.error.as_ref().map(|e| e.as_str().to_owned())))
    };

    // Podman's check of `sick` fails: unhealthy, with Podman's own record of the failed check as the error.
    let (_, error) = eventually(
        &agent,
        Duration::from_secs(90),
        "sick reported unhealthy",
        || health("sick").filter(|(h, _)| *h == HealthState::Unhealthy),
    );
    assert_eq!(
        error.as_deref(),
        Some("unhealthy: the check command failed: down")
    );
    eventually(
        &agent,
        Duration::from_secs(30),
        "well reported healthy",
        || health("well").filter(|(h, e)| *h == HealthState::Healthy && e.is_none()),
    );
    let ps = p.podman(&["ps", "--format", "{{.Names}} {{.Status}}"]);
    let line = |name: &str| {
        ps.lines()
            .find(|l| l.starts_with(&format!("fleet-{name} ")))
            .unwrap_or_else(|| panic!("fleet-{name} in podman ps:\n{ps}"))
            .to_owned()
    };
    assert!(line("sick").ends_with("(unhealthy)"), "{ps}");
    assert!(line("well").ends_with("(healthy)"), "{ps}");
    assert!(
        !line("plain").contains("healthy"),
        "a workload without a check has none: {ps}"
    );
    let inspect = p.podman(&[
        "inspect",
        "--format",
        "{{json .Config.Healthcheck}}",
        "fleet-sick",
    ]);
    let hc: serde_json::Value = serde_json::from_str(&inspect).expect("healthcheck json");
    assert_eq!(
        hc["Test"],
        serde_json::json!(["CMD", "sh", "-c", "echo down >&2; exit 3"])
    );
    assert_eq!(
        (hc["Interval"].as_u64(), hc["Retries"].as_u64()),
        (Some(5_000_000_000), Some(2))
    );
    assert!(
        agent
            .log_text()
            .contains("Podman did not run the health check of sick by itself"),
        "the agent says why it runs Podman's check: {}",
        agent.log_text()
    );

    // The agent's HTTP probe: healthy while the server answers 200; two failed checks after it turns to 503
    // make it unhealthy (with the answer as the error); healthy again once it recovers.
    eventually(&agent, Duration::from_secs(30), "api healthy", || {
        health("api").filter(|(h, _)| *h == HealthState::Healthy)
    });
    code.store(503, Ordering::SeqCst);
    let (_, error) = eventually(&agent, Duration::from_secs(30), "api unhealthy", || {
        health("api").filter(|(h, _)| *h == HealthState::Unhealthy)
    });
    assert_eq!(
        error,
        Some(format!(
            "unhealthy: GET /healthz on port {port} answered HTTP 503"
        ))
    );
    code.store(200, Ordering::SeqCst);
    eventually(&agent, Duration::from_secs(30), "api healthy again", || {
        health("api").filter(|(h, e)| *h == HealthState::Healthy && e.is_none())
    });
    let s: DeviceWorkloadStatus = get_json(&st, DEVICE).unwrap();
    assert_eq!(status_of(&s, "plain").and_then(|w| w.health), None);

    agent.sigterm();
    assert!(agent.wait_exit(Duration::from_secs(30)).success());
}
