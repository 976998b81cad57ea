//! The properties each fuzz target checks on arbitrary bytes, shared by the libFuzzer targets (`fuzz_targets/`)
//! and the normal test suite (`updater/tests/fuzz_regressions.rs` replays the seeds and every input a fuzzer ever
//! crashed on). Each check panics when a property fails: a parser that accepts something must give back a value
//! that serializes and parses again to the same value, and nothing may panic or read past its bound.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use fleet_updater::agent_upgrade::journal::Journal;
use fleet_updater::durable::parse_validated;
use fleet_updater::fetch_runner::partial::PartialState;
use fleet_updater::system::journal::SystemJournal;
use fleet_wire::fetch::{FetchFailure, FetchRequest, ResumePoint};
use fleet_wire::socket::{
    parse_request, read_frame, RequestFrame, ResponseFrame, PROTOCOL_VERSION,
};
use fleet_wire::{AgentUpgradeAttempt, SystemUpgradeAttempt};
use serde::{de::DeserializeOwned, Serialize};
use std::fmt::Debug;

/// Serializes `v`, parses it back with `parse`, and requires the same value.
fn round_trip<T: Serialize + PartialEq + Debug, E: Debug>(
    v: &T,
    parse: impl Fn(&[u8]) -> Result<T, E>,
) {
    let bytes = serde_json::to_vec(v).expect("an accepted value serializes");
    let back = parse(&bytes).unwrap_or_else(|e| {
        panic!(
            "{v:?} serialized as {:?} does not parse again: {e:?}",
            String::from_utf8_lossy(&bytes)
        )
    });
    assert_eq!(&back, v, "round trip changed the value");
}

fn json_round_trip<T: Serialize + DeserializeOwned + PartialEq + Debug>(data: &[u8]) -> Option<T> {
    let v: T = serde_json::from_slice(data).ok()?;
    round_trip(&v, |b| serde_json::from_slice::<T>(b));
    Some(v)
}

/// The updater socket: frames read with the frame limit (a small one chosen by the first byte, so that the
/// bound is exercised), each frame parsed as a request (the updater's side) and as a response (the agent's).
pub fn socket_frame(data: &[u8]) {
    let (limit, stream) = match data.split_first() {
        Some((&b, rest)) if b & 1 == 1 => (usize::from(b >> 1) + 1, rest),
        Some((_, rest)) => (fleet_wire::limits::SOCKET_FRAME_MAX_BYTES, rest),
        None => (16, data),
    };
    let mut reader = std::io::BufReader::with_capacity(7, stream);
    let mut consumed = 0;
    while let Ok(Some(frame)) = read_frame(&mut reader, limit) {
        assert!(
            frame.len() <= limit,
            "a frame of {} bytes passed the {limit}-byte limit",
            frame.len()
        );
        assert!(!frame.contains(&b'\n'), "a frame holds its newline");
        consumed += frame.len() + 1;
        assert!(consumed <= stream.len(), "read more than was sent");
        if let Ok(request) = parse_request(&frame) {
            let line = serde_json::to_vec(&RequestFrame {
                protocol: PROTOCOL_VERSION,
                request: request.clone(),
            })
            .expect("an accepted request serializes");
            let back = parse_request(&line).expect("a serialized request parses again");
            assert_eq!(back, request, "request round trip");
        }
        json_round_trip::<ResponseFrame>(&frame);
    }
}

/// The durable journals (agent upgrade, system upgrade) and the partial-download state: what parses and
/// validates stores and parses again to the same value.
pub fn journal(data: &[u8]) {
    if let Ok(j) = Journal::parse(data, "fuzz") {
        let back = Journal::parse(&j.to_bytes(), "fuzz").expect("a stored journal parses again");
        assert_eq!(back, j, "journal round trip");
    }
    if let Ok(j) = SystemJournal::parse(data, "fuzz") {
        let bytes = serde_json::to_vec_pretty(&j).expect("json");
        let back =
            SystemJournal::parse(&bytes, "fuzz").expect("a stored system journal parses again");
        assert_eq!(back, j, "system journal round trip");
    }
    if let Ok(s) = parse_validated::<PartialState>(data) {
        round_trip(&s, parse_validated::<PartialState>);
    }
}

/// The attempts the agent forwards and the updater accepts: what deserializes round-trips, and its canonical
/// digest does not depend on how the JSON was written.
pub fn attempt(data: &[u8]) {
    if let Some(a) = json_round_trip::<AgentUpgradeAttempt>(data) {
        let again: AgentUpgradeAttempt =
            serde_json::from_slice(&serde_json::to_vec_pretty(&a).expect("json")).expect("parses");
        assert_eq!(
            again.digest(),
            a.digest(),
            "the digest depends on formatting"
        );
        assert!(a.effective_byte_limit() <= fleet_wire::limits::ARTIFACT_MAX_BYTES);
    }
    json_round_trip::<SystemUpgradeAttempt>(data);
}

/// The lines between the updater and its download helper.
pub fn fetch_lines(data: &[u8]) {
    if let Ok(r) = FetchRequest::parse(data) {
        round_trip(&r, FetchRequest::parse);
        if let Some(p) = &r.resume {
            assert!(p.offset <= r.byte_limit.bytes());
        }
    }
    if let Ok(p) = ResumePoint::parse(data) {
        round_trip(&p, ResumePoint::parse);
        assert!(p.validators.total.is_none_or(|t| t >= p.offset));
    }
    if let Ok(f) = FetchFailure::parse(data) {
        round_trip(&f, FetchFailure::parse);
    }
}
