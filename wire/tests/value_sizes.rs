//! The byte limits of the buckets devices write (`fleet_wire::kv::BUCKETS`, enforced by JetStream and by the
//! device API) fit the largest value a real agent writes: every bounded text at its longest, all 16 transitions,
//! and the most workloads a desired state may hold (each with an error at its longest). A limit that a real value
//! could exceed would make that device's own status disappear, so each is checked here with room to spare.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use fleet_wire::fixtures;
use fleet_wire::kv;
use fleet_wire::workload::MAX_WORKLOADS;
use fleet_wire::{BoundedText, Transition, WorkloadName, WorkloadState, WorkloadStatus};

/// A text at its longest. Agents write ASCII (journald lines, Podman and apt messages); JSON escapes none of it.
fn longest() -> Option<BoundedText> {
    Some(BoundedText::lossy(
        "e".repeat(fleet_wire::limits::MAX_TEXT_CHARS),
    ))
}

fn limit(bucket: &str) -> usize {
    kv::bucket(bucket).expect("bucket").max_value_bytes as usize
}

/// Asserts that `value` fits `bucket` (with a quarter of the limit to spare unless `tight`), and prints the
/// numbers.
fn fits(bucket: &str, value: &impl serde::Serialize) -> usize {
    fits_with(bucket, value, false)
}

fn fits_with(bucket: &str, value: &impl serde::Serialize, tight: bool) -> usize {
    let bytes = serde_json::to_vec(value).expect("json").len();
    let limit = limit(bucket);
    println!("{bucket}: largest real value {bytes} bytes, limit {limit} bytes");
    assert!(
        if tight {
            bytes <= limit
        } else {
            bytes * 4 <= limit * 3
        },
        "{bucket}: the largest real value is {bytes} bytes, too close to the limit of {limit}"
    );
    bytes
}

#[test]
fn the_largest_values_fit_their_buckets() {
    let mut info = fixtures::device_info();
    info.os.id = longest().unwrap();
    info.os.version_id = longest();
    info.os.pretty_name = longest();
    info.restarts = Some(u32::MAX);
    fits(kv::DEVICE_INFO, &info);

    fits(kv::DEVICE_HEARTBEAT, &fixtures::heartbeat());

    // Every filesystem a report may list, each number at its widest, and the device id at its longest.
    use fleet_wire::FilesystemRole::*;
    let widest = |role| fleet_wire::FilesystemUsage {
        role,
        size_bytes: u64::MAX,
        available_bytes: u64::MAX,
    };
    let mut filesystems = vec![widest(Root), widest(AgentState), widest(Containers)];
    filesystems.resize(fleet_wire::usage::MAX_FILESYSTEMS, widest(Unknown));
    let usage = fleet_wire::DeviceUsage::new(
        fleet_wire::DeviceId::try_from("d".repeat(63).as_str()).expect("id"),
        fixtures::t(0),
        filesystems,
        fleet_wire::MemoryUsage {
            total_bytes: u64::MAX,
            available_bytes: u64::MAX,
            pressure_some_avg10_centi: Some(10_000),
        },
        u32::MAX,
        u32::MAX,
    );
    fits(kv::DEVICE_USAGE, &usage.expect("valid"));

    let mut status = fixtures::workload_status();
    let one = status.workloads[0].clone();
    status.workloads = (0..MAX_WORKLOADS)
        .map(|i| WorkloadStatus {
            name: WorkloadName::try_from(format!("workload-{i:02}-{}", "n".repeat(40)).as_str())
                .expect("name"),
            state: WorkloadState::Failed,
            error: longest(),
            // Only a running workload says when it started.
            started_at: None,
            // The failure details at their largest: a 64-hex container id and a digest.
            failure: fixtures::workload_status_failed().workloads[0]
                .failure
                .clone(),
            // A failed workload carries its failure, not restart counts (the agent reports those only for a
            // container of the desired spec that did not fail: see the crash-looping shape below).
            restarts: None,
            ..one.clone()
        })
        .collect();
    // All 64 workloads failing with the longest error fit; fifty, as a device runs them, with a fifth of the limit
    // to spare (75,684 of 98,304 bytes: a quarter would need a limit that, times the documented fleet, no longer
    // fits a modest server's store; see the next test).
    let n = fits_with(kv::WORKLOAD_STATUS, &status, true);
    // Every workload crash-looping, restart counts at their widest, no error: smaller than the failed shape.
    let mut looping = status.clone();
    for w in &mut looping.workloads {
        w.state = WorkloadState::CrashLooping;
        w.error = None;
        w.failure = None;
        w.restarts = Some(fleet_wire::Restarts {
            count: u32::MAX,
            last_exit_code: Some(i32::MIN),
            oom_killed: false,
        });
    }
    assert!(fits_with(kv::WORKLOAD_STATUS, &looping, true) < n);
    // Every workload running but unhealthy, with the longest error (what its check last saw) and restart counts:
    // smaller than the failed shape too.
    let mut unhealthy = status.clone();
    for w in &mut unhealthy.workloads {
        w.state = WorkloadState::Running;
        w.failure = None;
        w.started_at = Some(fixtures::t(30));
        w.restarts = Some(fleet_wire::Restarts {
            count: u32::MAX,
            last_exit_code: Some(i32::MIN),
            oom_killed: false,
        });
        w.health = Some(fleet_wire::HealthState::Unhealthy);
    }
    assert!(fits_with(kv::WORKLOAD_STATUS, &unhealthy, true) < n);
    status.workloads.truncate(50);
    let fifty = serde_json::to_vec(&status).expect("json").len();
    println!("{}: 50 workloads {fifty} bytes", kv::WORKLOAD_STATUS);
    assert!(
        fifty < n && fifty * 5 <= limit(kv::WORKLOAD_STATUS) * 4,
        "{fifty}"
    );

    let mut up = fixtures::failed_status();
    up.detail = longest();
    up.error = longest();
    for i in 0..fleet_wire::limits::MAX_TRANSITIONS {
        up.transitions.push(Transition {
            phase: fleet_wire::UpgradePhase::RollingBack,
            at: fixtures::t(i as u64),
            reason: Some(fleet_wire::UpgradeReason::StartFailed),
        });
    }
    fits(kv::AGENT_UPGRADE_STATUS, &up);

    let mut sys = fixtures::system_status();
    sys.error = longest();
    sys.detail = longest();
    sys.output_tail = longest();
    for i in 0..fleet_wire::limits::MAX_TRANSITIONS {
        sys.transitions.push(Transition {
            phase: fleet_wire::SystemUpgradePhase::Upgrading,
            at: fixtures::t(i as u64),
            reason: None,
        });
    }
    fits(kv::SYSTEM_UPGRADE_STATUS, &sys);
}

#[test]
fn every_bucket_has_a_byte_limit_for_the_documented_fleet() {
    let mut total = 0;
    for spec in kv::BUCKETS {
        let bytes = kv::max_bytes(spec, kv::DEFAULT_FLEET_SIZE);
        total += bytes;
        assert!(bytes >= 8 << 20, "{}", spec.name);
        // A device's share holds every key it may write at its largest value.
        if spec.name == kv::DIAGNOSTICS_BUNDLE {
            // The exception: a bundle is written only for a request the operator opened, and the operator opens
            // at most as many as the bucket holds (fleet_wire::diagnostics::max_open_requests).
            let open = fleet_wire::diagnostics::max_open_requests(kv::DEFAULT_FLEET_SIZE);
            assert!(open * spec.max_value_bytes as u64 <= bytes as u64);
            assert!(open >= 300, "{open} open requests at 10,000 devices");
        } else if spec.writer == "agent" {
            let keys = match spec.key {
                kv::KeyShape::Device => 1,
                _ => kv::RUNS_PER_DEVICE,
            };
            assert!(
                spec.bytes_per_device >= keys * spec.max_value_bytes as u64,
                "{}",
                spec.name
            );
        }
        println!(
            "{}: {} MiB for {} devices",
            spec.name,
            bytes >> 20,
            kv::DEFAULT_FLEET_SIZE
        );
    }
    // What JetStream reserves for the whole layout: it must fit a modest server's store. "About 3 GB"
    // (docs/kv-layout.md): 3 GiB until device-usage (22 MiB) took it past, so 3 GiB with 64 MiB for small buckets.
    println!("all buckets: {} MiB", total >> 20);
    assert!(total < (3 << 30) + (64 << 20), "{total}");
}
