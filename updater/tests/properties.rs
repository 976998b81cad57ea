//! Property targets for the two parsers that read untrusted or possibly damaged input: socket requests and the
//! journal. Run briefly by scripts/test (PROPTEST_CASES); raise PROPTEST_CASES for a longer run.

use fleet_updater::agent_upgrade::journal::Journal;
use fleet_updater::agent_upgrade::machine::Event;
use fleet_wire::socket::{parse_request, RequestFrame, PROTOCOL_VERSION};
use fleet_wire::{fixtures, Request, UpgradeReason};
use proptest::prelude::*;

fn upgrade_line() -> Vec<u8> {
    serde_json::to_vec(&RequestFrame {
        protocol: PROTOCOL_VERSION,
        request: Request::Upgrade {
            attempt: fixtures::attempt(),
        },
    })
    .expect("json")
}

fn journal_after(events: &[Event]) -> Journal {
    let mut j = Journal::begin(
        fixtures::attempt(),
        "/usr/lib/harmony-fleet/fleet-agent-v1.1.0".into(),
        "/usr/lib/harmony-fleet/fleet-agent-v1.2.0".into(),
        vec![],
        fixtures::t(0),
    );
    for (i, e) in events.iter().enumerate() {
        // Illegal events are refused and change nothing.
        let before = j.clone();
        if j.apply(*e, fixtures::t(i as u64 + 1)).is_err() {
            assert_eq!(j, before);
        }
    }
    j
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        Just(Event::Prepared),
        Just(Event::PrepareFailed(UpgradeReason::DownloadFailed)),
        Just(Event::Ready),
        Just(Event::CutoverFailed(UpgradeReason::StartFailed)),
        Just(Event::Interrupted),
        Just(Event::RolledBack(UpgradeReason::Interrupted)),
        Just(Event::RestoreFailed),
    ]
}

proptest! {
    #[test]
    fn request_parsing_is_total(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        if let Ok(r) = parse_request(&bytes) {
            let again = serde_json::to_vec(&RequestFrame { protocol: PROTOCOL_VERSION, request: r.clone() })
                .expect("json");
            prop_assert_eq!(parse_request(&again).expect("round trip"), r);
        }
    }

    #[test]
    fn mutated_requests_never_panic(pos in any::<prop::sample::Index>(), byte in any::<u8>(), cut in any::<prop::sample::Index>()) {
        let mut line = upgrade_line();
        let i = pos.index(line.len());
        line[i] = byte;
        let _ = parse_request(&line);
        let _ = parse_request(&line[..cut.index(line.len())]);
    }

    #[test]
    fn journal_parsing_is_total(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
        if let Ok(j) = Journal::parse(&bytes, "prop") {
            prop_assert!(j.validate().is_ok());
        }
    }

    #[test]
    fn mutated_journals_are_refused_or_valid(
        events in proptest::collection::vec(event(), 0..24),
        pos in any::<prop::sample::Index>(),
        byte in any::<u8>(),
    ) {
        let j = journal_after(&events);
        let mut bytes = j.to_bytes();
        prop_assert_eq!(Journal::parse(&bytes, "prop").expect("valid journal"), j.clone());
        let i = pos.index(bytes.len());
        bytes[i] = byte;
        if let Ok(m) = Journal::parse(&bytes, "prop") {
            prop_assert!(m.validate().is_ok());
            prop_assert_eq!(Journal::parse(&m.to_bytes(), "prop").expect("round trip"), m);
        }
    }
}
