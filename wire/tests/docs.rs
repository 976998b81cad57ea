//! The operator-facing docs are checked against the types, so they cannot drift.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use fleet_wire::socket::{ErrorCode, Request};
use fleet_wire::{kv, JournalPhase, UpgradePhase};

fn doc(name: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../docs")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn json_name<T: serde::Serialize>(v: T) -> String {
    serde_json::to_value(v)
        .unwrap()
        .as_str()
        .unwrap()
        .to_owned()
}

#[test]
fn kv_layout_lists_every_bucket_with_its_key_and_writer() {
    let page = doc("kv-layout.md");
    for b in kv::BUCKETS {
        let row = page
            .lines()
            .find(|l| l.starts_with(&format!("| `{}` |", b.name)))
            .unwrap_or_else(|| panic!("docs/kv-layout.md has no row for bucket {}", b.name));
        assert!(
            row.contains(&format!("`{}`", b.key.pattern())),
            "{}: key {}",
            b.name,
            b.key.pattern()
        );
        assert!(row.contains(b.writer), "{}: writer {}", b.name, b.writer);
    }
    let rows = page.lines().filter(|l| l.starts_with("| `")).count();
    assert_eq!(
        rows,
        kv::BUCKETS.len(),
        "docs/kv-layout.md lists buckets that are not in the layout"
    );
}

#[test]
fn socket_protocol_names_every_op_code_and_phase() {
    let page = doc("socket-protocol.md");
    for op in Request::OPS {
        assert!(page.contains(&format!("| `{op}` |")), "op {op}");
    }
    use ErrorCode::*;
    for code in [
        Busy,
        FrameTooLarge,
        Timeout,
        Malformed,
        UnsupportedProtocol,
        UnknownRequest,
        Forbidden,
        Invalid,
        Conflict,
        Quarantined,
        Expired,
        Internal,
    ] {
        let name = json_name(code);
        assert!(page.contains(&format!("| `{name}` |")), "error code {name}");
    }
    for p in JournalPhase::ALL {
        let name = json_name(p);
        assert!(
            page.contains(&format!("| `{name}` |")),
            "journal phase {name}"
        );
    }
    for p in fleet_wire::SystemJournalPhase::ALL {
        let name = json_name(p);
        assert!(
            page.contains(&format!("| `{name}` |")),
            "system journal phase {name}"
        );
    }
    use UpgradePhase::*;
    for p in [
        Preparing,
        Stopping,
        Starting,
        Complete,
        RollingBack,
        Failed,
        RollbackFailed,
    ] {
        assert!(
            page.contains(&format!("`{}`", json_name(p))),
            "public phase"
        );
    }
    let golden: serde_json::Value =
        serde_json::from_str(include_str!("golden/socket-request-upgrade.json")).unwrap();
    let line = page
        .lines()
        .find(|l| l.starts_with(r#"{"protocol":1,"request":{"op":"upgrade""#))
        .expect("upgrade example");
    let shown: serde_json::Value = serde_json::from_str(line).expect("the example is JSON");
    assert_eq!(
        shown, golden,
        "the upgrade example must equal wire/tests/golden/socket-request-upgrade.json"
    );
}
