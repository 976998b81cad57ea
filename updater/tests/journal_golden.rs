//! The journal's persisted format, pinned by a golden file (`UPDATE_GOLDEN=1` rewrites it after a deliberate,
//! versioned format change).

use fleet_updater::agent_upgrade::journal::{EarlierAttempt, Journal, JOURNAL_FORMAT};
use fleet_updater::agent_upgrade::machine::Event;
use fleet_wire::{fixtures, AttemptId, BoundedText, JournalPhase, UpgradeReason};
use std::path::Path;

fn golden_journal() -> Journal {
    let mut j = Journal::begin(
        fixtures::attempt(),
        "/usr/lib/harmony-fleet/fleet-agent-v1.1.0".into(),
        "/usr/lib/harmony-fleet/fleet-agent-v1.2.0".into(),
        vec![EarlierAttempt {
            attempt_id: AttemptId::try_from(fixtures::RUN).expect("id"),
            attempt_digest: fleet_wire::Sha256Hex::from_bytes([7; 32]),
            phase: JournalPhase::Committed,
        }],
        fixtures::t(0),
    );
    j.apply(Event::Prepared, fixtures::t(30)).expect("legal");
    j.drain_duration_ms = Some(840);
    j.apply(
        Event::CutoverFailed(UpgradeReason::StartFailed),
        fixtures::t(271),
    )
    .expect("legal");
    j.detail = Some(BoundedText::lossy("rolling back to the previous agent"));
    j.error = Some(BoundedText::lossy(
        "starting fleet-agent.service with the candidate: Job for fleet-agent.service failed",
    ));
    j
}

#[test]
fn journal_golden_file() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/journal.json");
    let bytes = golden_journal().to_bytes();
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, &bytes).expect("write golden");
    }
    let golden = std::fs::read(&path).expect("golden file (UPDATE_GOLDEN=1 creates it)");
    assert_eq!(
        String::from_utf8_lossy(&bytes),
        String::from_utf8_lossy(&golden),
        "the journal format changed: bump JOURNAL_FORMAT ({JOURNAL_FORMAT}) and keep old journals readable"
    );
    assert_eq!(
        Journal::parse(&golden, "golden").expect("golden parses"),
        golden_journal()
    );
}

#[test]
fn other_formats_and_unknown_fields_are_refused() {
    let mut v: serde_json::Value =
        serde_json::from_slice(&golden_journal().to_bytes()).expect("json");
    v["format"] = serde_json::json!(2);
    let e = Journal::parse(&serde_json::to_vec(&v).expect("json"), "j").expect_err("format 2");
    assert!(e.to_string().contains("format"), "{e}");
    let mut v: serde_json::Value =
        serde_json::from_slice(&golden_journal().to_bytes()).expect("json");
    v["attempt"]["extra"] = serde_json::json!(true);
    assert!(Journal::parse(&serde_json::to_vec(&v).expect("json"), "j").is_err());
    let mut v: serde_json::Value =
        serde_json::from_slice(&golden_journal().to_bytes()).expect("json");
    v["targetLink"] = serde_json::json!("/usr/lib/harmony-fleet/fleet-agent-v6.6.6");
    assert!(Journal::parse(&serde_json::to_vec(&v).expect("json"), "j").is_err());
}
