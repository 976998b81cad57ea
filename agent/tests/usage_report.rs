//! The device's usage in `device-usage/<device>`: published at start with the three filesystems the
//! agent derives (the root prefix, its state directory, Podman's storage as real Podman names it), memory and
//! load; a state directory filled to 97 % reaches NATS within `PUBLISH_MIN_INTERVAL` plus a heartbeat; and an
//! agent whose operator has not made the bucket starts, says so once, and reports once the bucket exists.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::*;
use fleet_wire::kv;
use fleet_wire::usage::{FilesystemRole, DISK_ALERT_PERCENT, PUBLISH_MIN_INTERVAL};
use fleet_wire::DeviceUsage;
use std::io::Write;
use std::time::{Duration, Instant};

fn usage(rig: &Rig) -> Option<DeviceUsage> {
    get_json(&store(&rig.nc(), kv::DEVICE_USAGE), DEVICE)
}

#[test]
fn a_filling_disk_reaches_nats_within_the_bound() {
    let rig = Rig::new(true, "");
    fleet_rig::nats_client::create_buckets(&rig.nc(), &[kv::DEVICE_USAGE]);
    // The agent's state directory on a file system of its own, which the test fills.
    let state = Tmpfs::mount_at(&rig.root.path().join("var/lib/fleet-agent"), "64m");
    let mut agent = rig.spawn_agent();
    agent.wait_ready();
    let first = eventually(&agent, Duration::from_secs(10), "usage published", || {
        usage(&rig)
    });
    let roles: Vec<_> = first.filesystems().iter().map(|f| f.role).collect();
    assert_eq!(
        roles,
        [
            FilesystemRole::Root,
            FilesystemRole::AgentState,
            FilesystemRole::Containers
        ]
    );
    let st = first.filesystem(FilesystemRole::AgentState).unwrap();
    assert_eq!(st.size_bytes, 64 << 20, "the tmpfs: {st:?}");
    assert!(!st.alerting());
    assert!(first.memory().total_bytes > 0 && first.cpus() >= 1);
    // Podman's storage as Podman says (the test service's --root), not a configured path: the same file system
    // as the service's directory.
    let podman_root = rig.podman.as_ref().unwrap().dir().to_owned();
    let (size, _) = fleet_agent::usage::statvfs(&podman_root).unwrap();
    assert_eq!(
        first
            .filesystem(FilesystemRole::Containers)
            .unwrap()
            .size_bytes,
        size
    );

    // Fill the state directory's file system to 97 %.
    let (size, available) = fleet_agent::usage::statvfs(&state.0).unwrap();
    let keep = size * 3 / 100;
    let mut f = std::fs::File::create(state.0.join("fill")).unwrap();
    let mut left = available - keep;
    let chunk = vec![0u8; 1 << 20];
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        f.write_all(&chunk[..n]).unwrap();
        left -= n as u64;
    }
    f.sync_all().unwrap();
    let filled = Instant::now();
    let full = eventually(
        &agent,
        PUBLISH_MIN_INTERVAL + Duration::from_secs(10),
        "the full state directory in NATS",
        || {
            usage(&rig).filter(|u| {
                u.filesystem(FilesystemRole::AgentState)
                    .is_some_and(|f| f.used_percent() >= 96)
            })
        },
    );
    let took = filled.elapsed();
    println!("97 % full in NATS {took:?} after the fill");
    // The first publication may have been just before the fill: 15 s since it, plus one heartbeat (1 s here).
    assert!(
        took <= PUBLISH_MIN_INTERVAL + Duration::from_secs(3),
        "{took:?}"
    );
    let st = full.filesystem(FilesystemRole::AgentState).unwrap();
    assert!(st.used_percent() >= DISK_ALERT_PERCENT && st.alerting());
    assert!(full
        .disk_alerts()
        .any(|f| f.role == FilesystemRole::AgentState));
    assert_eq!(
        full.below_floor().map(|f| f.role),
        Some(FilesystemRole::AgentState),
        "2 MiB left is below the floor"
    );
    // Not again while nothing changes: a value written again differs in what it shows, not only in its time (on a
    // shared host the root filesystem, memory or load may really change meanwhile).
    // why: "not again within the minimum interval" is the property: the window is the interval plus 2 s
    std::thread::sleep(PUBLISH_MIN_INTERVAL + Duration::from_secs(2));
    let shown = |u: &DeviceUsage| {
        let mut v = serde_json::to_value(u).expect("json");
        v.as_object_mut().expect("an object").remove("measuredAt");
        v
    };
    let later = usage(&rig).unwrap();
    assert!(
        later.measured_at() == full.measured_at() || shown(&later) != shown(&full),
        "rewritten with nothing changed: {later:?}"
    );

    std::fs::remove_file(state.0.join("fill")).unwrap();
    agent.sigterm();
    assert!(agent.wait_exit(Duration::from_secs(30)).success());
}

#[test]
fn an_agent_newer_than_its_operator_starts_without_the_bucket() {
    let rig = Rig::new(false, "");
    let mut agent = rig.spawn_agent();
    agent.wait_ready();
    eventually(
        &agent,
        Duration::from_secs(10),
        "the missing bucket logged",
        || {
            agent
                .log_text()
                .contains(
                    "the device's usage is not reported: KV bucket device-usage does not exist",
                )
                .then_some(())
        },
    );
    // The operator catches up: the next resync (2 s here) finds the bucket and the usage follows.
    fleet_rig::nats_client::create_buckets(&rig.nc(), &[kv::DEVICE_USAGE]);
    let u = eventually(&agent, Duration::from_secs(15), "usage published", || {
        usage(&rig)
    });
    // No Podman here: no containers role.
    let roles: Vec<_> = u.filesystems().iter().map(|f| f.role).collect();
    assert_eq!(roles, [FilesystemRole::Root, FilesystemRole::AgentState]);
    let log = agent.log_text();
    assert_eq!(
        log.matches("the device's usage is not reported").count(),
        1,
        "{log}"
    );
    assert!(
        log.contains("the device-usage bucket exists now: reporting usage"),
        "{log}"
    );
    agent.sigterm();
    assert!(agent.wait_exit(Duration::from_secs(30)).success());
}
