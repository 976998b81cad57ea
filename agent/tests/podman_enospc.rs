//! A spec change on a full disk: real Podman whose storage (`--root`: images, containers, its
//! database) is on a small tmpfs the test fills to the last byte. The replacement fails with `no space left on
//! device`, and the old container keeps running under its own name at once (Podman renames a container in its
//! database and then fails to write its storage's record, answering an error for a rename that happened: the
//! agent used to leave it as `fleet-<name>.previous`, and the next try failed `name … is already in use`). With
//! the space freed, the failed spec's retry replaces it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use fleet_rig::nats_client as nats;
mod common;
use common::*;
use fleet_rig::podman::PodmanService;
use fleet_wire::kv;
use fleet_wire::{DesiredState, DeviceId, DeviceWorkloadStatus, WorkloadName, WorkloadSpec};
use fleet_wire::{WorkloadState, WorkloadStatus};
use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// Writes `path` until the file system has no byte left.
fn fill(path: &Path) {
    let mut f = std::fs::File::create(path).expect("fill file");
    // Big chunks first, then what is left in small ones.
    for size in [1 << 20, 4096, 1] {
        let chunk = vec![0u8; size];
        loop {
            match f.write_all(&chunk) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::StorageFull => break,
                Err(e) => panic!("filling {}: {e}", path.display()),
            }
        }
    }
    let out = Command::new("df")
        .arg("-B1")
        .arg(path)
        .output()
        .expect("df");
    println!("{}", String::from_utf8_lossy(&out.stdout).trim());
}

fn workload(marker: &str) -> WorkloadSpec {
    let mut w = WorkloadSpec::new(WorkloadName::try_from("web").unwrap(), IMAGE).unwrap();
    w.command = vec!["sleep".into(), "1000".into()];
    w.env.insert("MARKER".into(), marker.into());
    w
}

fn put_desired(rig: &Rig, generation: u64, w: WorkloadSpec) {
    let d = DesiredState::new(DeviceId::try_from(DEVICE).unwrap(), generation, vec![w]).unwrap();
    store(&rig.nc(), kv::DESIRED_STATE)
        .put(DEVICE, serde_json::to_vec(&d).unwrap())
        .expect("put desired");
}

fn status_of(store: &nats::kv::Store, generation: u64) -> Option<WorkloadStatus> {
    let s: DeviceWorkloadStatus = get_json(store, DEVICE)?;
    (s.generation == generation)
        .then(|| s.workloads.into_iter().next())
        .flatten()
}

/// `(name, id, state)` of every container.
fn containers(p: &PodmanService) -> Vec<(String, String, String)> {
    let out = p.podman(&["ps", "-a", "--format", "json"]);
    let list: Vec<serde_json::Value> =
        serde_json::from_str(if out.is_empty() { "[]" } else { &out }).expect("ps json");
    let s = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
    list.iter()
        .map(|c| (s(&c["Names"][0]), s(&c["Id"]), s(&c["State"])))
        .collect()
}

#[test]
fn a_spec_change_on_a_full_disk_leaves_the_old_container_running_under_its_name() {
    // Dropped last: Podman (in the rig) goes first.
    let fs = Tmpfs::mount("64m");
    let rig = Rig::with_podman(
        Some(PodmanService::start_with_root(Some(&fs.0.join("root")))),
        "",
    );
    let p = rig.podman.as_ref().unwrap();
    put_desired(&rig, 1, workload("1"));
    let mut agent = rig.spawn_agent();
    agent.wait_ready();
    let wl = store(&rig.nc(), kv::WORKLOAD_STATUS);
    let first = eventually(&agent, Duration::from_secs(60), "web running", || {
        status_of(&wl, 1).filter(|w| w.state == WorkloadState::Running)
    });
    let old_id = first.container_id.clone().expect("container id");

    let filler = fs.0.join("fill");
    fill(&filler);
    put_desired(&rig, 2, workload("2"));
    let failed = eventually(
        &agent,
        Duration::from_secs(30),
        "the new spec failed for want of space",
        || status_of(&wl, 2).filter(|w| w.state == WorkloadState::Failed),
    );
    // At once: the status that reports the failure is written after the pass, so the pass is over.
    let now = containers(p);
    assert_eq!(now.len(), 1, "{now:?}");
    let (name, id, state) = &now[0];
    assert_eq!(
        (name.as_str(), state.as_str()),
        ("fleet-web", "running"),
        "{now:?}\n{}",
        agent.log_text()
    );
    assert_eq!(&old_id, id, "the same container");

    let e = failed.error.as_ref().expect("an error").as_str().to_owned();
    assert!(e.starts_with("no space left on device"), "{e}");
    assert!(
        e.ends_with("the container of the previous spec keeps running"),
        "{e}"
    );
    // Space again: the failed spec's retry (after its back-off) replaces the old container.
    std::fs::remove_file(&filler).expect("free the space");
    let s = eventually(
        &agent,
        fleet_agent_retry_bound(),
        "the new spec running once space was freed",
        || status_of(&wl, 2).filter(|w| w.state == WorkloadState::Running),
    );
    assert_eq!(s.spec_digest, Some(workload("2").digest()));
    assert_eq!((s.error, s.failure), (None, None));
    let now = containers(p);
    assert_eq!(now.len(), 1, "{now:?}");
    assert_eq!(now[0].0, "fleet-web");
    assert_ne!(old_id, now[0].1, "replaced");
    agent.sigterm();
    assert!(agent.wait_exit(Duration::from_secs(30)).success());
}

/// The first retry of a failed spec comes after `RETRY_FIRST` (30 s) plus one resync (2 s here); with slack for
/// the pass itself.
fn fleet_agent_retry_bound() -> Duration {
    fleet_agent::reconcile::RETRY_FIRST + Duration::from_secs(20)
}
