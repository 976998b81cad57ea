//! Restarts: holders survive a SIGKILL of the server (file store) and of one NATS-store replica.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use fleet_rig::fleetlock::ServerProcess;
use std::path::Path;

const BIN: &str = env!("CARGO_BIN_EXE_fleetlock-server");

fn holders(s: &ServerProcess) -> Vec<String> {
    s.holder_ids().unwrap()
}

#[test]
fn file_store_holders_survive_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.yaml");
    std::fs::write(
        &cfg,
        format!(
            "store: {{kind: file, dir: {}}}\ndefault_slots: 3\n",
            dir.path().join("store").display()
        ),
    )
    .unwrap();
    let mut s = ServerProcess::start(Path::new(BIN), &cfg).unwrap();
    let mut c = s.conn().unwrap();
    for id in ["a", "b", "c"] {
        assert_eq!(c.fleetlock(true, id, "default").unwrap().status, 200);
    }
    assert_eq!(c.fleetlock(false, "b", "default").unwrap().status, 200);
    // Every 200 was answered after its fsync: a SIGKILL right after loses nothing.
    s.kill();
    s.restart().unwrap();
    assert_eq!(holders(&s), vec!["a", "c"]);
    let mut c = s.conn().unwrap();
    assert_eq!(c.fleetlock(true, "d", "default").unwrap().status, 200);
    assert_eq!(
        c.fleetlock(true, "e", "default").unwrap().kind().as_deref(),
        Some("all-slots-taken")
    );
    // A second server on the same directory refuses to start.
    let err = ServerProcess::start(Path::new(BIN), &cfg).err().unwrap();
    assert!(err.contains("another fleetlock-server"), "{err}");
}

#[test]
fn nats_store_holders_survive_replica_sigkill() {
    let nats = fleet_rig::NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.yaml");
    std::fs::write(
        &cfg,
        format!(
            "store: {{kind: nats, url: \"{}\"}}\ngroups: [{{name: db, slots: 2}}]\n",
            nats.url()
        ),
    )
    .unwrap();
    let mut servers: Vec<ServerProcess> = (0..3)
        .map(|_| ServerProcess::start(Path::new(BIN), &cfg).unwrap())
        .collect();
    let mut c0 = servers[0].conn().unwrap();
    assert_eq!(c0.fleetlock(true, "a", "db").unwrap().status, 200);
    let mut c1 = servers[1].conn().unwrap();
    assert_eq!(c1.fleetlock(true, "b", "db").unwrap().status, 200);
    servers[0].kill();
    for s in &servers[1..] {
        assert_eq!(holders(s), vec!["a", "b"]);
    }
    let mut c2 = servers[2].conn().unwrap();
    assert_eq!(
        c2.fleetlock(true, "c", "db").unwrap().kind().as_deref(),
        Some("all-slots-taken")
    );
    servers[0].restart().unwrap();
    assert_eq!(holders(&servers[0]), vec!["a", "b"]);
    let mut c0 = servers[0].conn().unwrap();
    assert_eq!(c0.fleetlock(false, "a", "db").unwrap().status, 200);
    assert_eq!(c2.fleetlock(true, "c", "db").unwrap().status, 200);
    assert_eq!(holders(&servers[1]), vec!["b", "c"]);
}
