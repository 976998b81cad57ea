//! Golden files for the FleetLock protocol, status, state and audit shapes (`tests/golden/fleetlock-*.json`).
//! `UPDATE_GOLDEN=1 cargo test -p fleet-wire --test fleetlock` rewrites them; review the diff.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use fleet_wire::fleetlock::*;
use fleet_wire::Timestamp;
use serde::{de::DeserializeOwned, Serialize};
use std::fmt::Debug;
use std::path::PathBuf;

fn check<T: Serialize + DeserializeOwned + PartialEq + Debug>(name: &str, value: &T) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(format!("fleetlock-{name}.json"));
    let json = serde_json::to_string_pretty(value).unwrap() + "\n";
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, &json).unwrap();
    }
    let golden = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run with UPDATE_GOLDEN=1)", path.display()));
    assert_eq!(json, golden, "{name}: serialization changed");
    let back: T = serde_json::from_str(&golden).unwrap();
    assert_eq!(&back, value, "{name}: round trip");
}

fn holder() -> Holder {
    Holder {
        id: "e0f3745b108f471cbd4883c6fbed8cdd".into(),
        hostname: Some("db1".into()),
        ip: "10.0.0.23".into(),
        taken_at: Timestamp::from_unix_ms(1_795_000_000_123),
    }
}

#[test]
fn protocol_shapes() {
    check(
        "request",
        &LockRequest {
            client_params: ClientParams {
                id: "e0f3745b108f471cbd4883c6fbed8cdd".into(),
                group: "default".into(),
                hostname: None,
            },
        },
    );
    check(
        "error",
        &ErrorBody {
            kind: ErrorKind::AllSlotsTaken,
            value: "group db: 1 of 1 slots taken".into(),
        },
    );
    // A Zincati request body parses as is.
    let zincati =
        br#"{"client_params":{"group":"default","id":"e0f3745b108f471cbd4883c6fbed8cdd"}}"#;
    assert_eq!(
        LockRequest::parse(zincati).unwrap().client_params.group,
        "default"
    );
}

#[test]
fn server_shapes() {
    check(
        "group-holders",
        &GroupHolders {
            version: 1,
            holders: vec![holder()],
        },
    );
    check(
        "group-directory",
        &GroupDirectory {
            version: 1,
            groups: vec!["db".into(), "default".into()],
        },
    );
    for key in [
        GROUP_DIRECTORY_KEY,
        "_holder.0123456789abcdef0123456789abcdef",
    ] {
        assert!(
            fleet_wire::fleetlock::validate_group(key).is_err(),
            "no group is named like {key}"
        );
    }
    let mut groups = std::collections::BTreeMap::new();
    groups.insert("db".to_string(), vec![holder()]);
    check("state-file", &StateFile { version: 1, groups });
    check(
        "status",
        &ServerStatus {
            store: "file".into(),
            config_valid: false,
            config_error: Some("groups[0].slots: invalid type".into()),
            ttl_secs: None,
            client_auth: Some(false),
            warnings: vec!["client authentication is off: anyone who reaches this port can take and give back reboot slots".into()],
            groups: vec![GroupStatus {
                name: "db".into(),
                slots: 1,
                holders: vec![holder()],
            }],
            started_at: Some(Timestamp::from_unix_ms(1_794_990_000_000)),
            recent: vec![
                LockEvent {
                    at: Timestamp::from_unix_ms(1_795_000_000_456),
                    kind: LockEventKind::Granted,
                    group: "db".into(),
                    holder: holder(),
                },
                LockEvent {
                    at: Timestamp::from_unix_ms(1_794_999_000_000),
                    kind: LockEventKind::AdminReleased,
                    group: "db".into(),
                    holder: Holder {
                        id: "3c1d0e5f7a9b4c2d8e6f1a3b5c7d9e0f".into(),
                        hostname: None,
                        ip: "10.0.0.24".into(),
                        taken_at: Timestamp::from_unix_ms(1_794_998_000_000),
                    },
                },
            ],
        },
    );
    // A status from a server without the history (older versions) still parses: both fields are optional.
    let old = r#"{"store":"nats","config_valid":true,"groups":[]}"#;
    let s: ServerStatus = serde_json::from_str(old).unwrap();
    assert_eq!((s.started_at, s.recent.len()), (None, 0));
    // Every kind as the dashboard reads it.
    for (k, s) in [
        (LockEventKind::Granted, "\"granted\""),
        (LockEventKind::Released, "\"released\""),
        (LockEventKind::Expired, "\"expired\""),
        (LockEventKind::AdminReleased, "\"admin-released\""),
    ] {
        assert_eq!(serde_json::to_string(&k).unwrap(), s);
    }
    check(
        "admin-release",
        &AdminRelease {
            group: "db".into(),
            id: "e0f3745b108f471cbd4883c6fbed8cdd".into(),
            reason: "host db1 was reinstalled".into(),
        },
    );
    check(
        "audit",
        &AuditRecord {
            at: Timestamp::from_unix_ms(1_795_000_100_000),
            action: AuditAction::AdminRelease,
            group: "db".into(),
            id: "e0f3745b108f471cbd4883c6fbed8cdd".into(),
            removed: true,
            actor: "10.0.0.10".into(),
            reason: "host db1 was reinstalled".into(),
        },
    );
}
