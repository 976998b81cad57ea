//! Property tests: validation never admits an unsafe value, parsing never panics, valid values round-trip.
//! `scripts/test` runs them briefly (PROPTEST_CASES); run longer locally with a larger PROPTEST_CASES.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use fleet_wire::socket::{parse_request, read_frame, FrameError};
use fleet_wire::*;
use proptest::prelude::*;
use std::io::BufReader;

proptest! {
    #[test]
    fn accepted_device_ids_are_subject_and_path_safe(s in "\\PC{0,80}|[a-z0-9.*> -]{0,70}") {
        if let Ok(id) = DeviceId::try_from(s.as_str()) {
            prop_assert!(!id.as_str().is_empty() && id.as_str().len() <= 63);
            prop_assert!(id.as_str().bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'));
            let json = serde_json::to_string(&id).unwrap();
            prop_assert_eq!(serde_json::from_str::<DeviceId>(&json).unwrap(), id);
        }
    }

    #[test]
    fn valid_device_ids_are_accepted(s in "[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?") {
        prop_assert!(DeviceId::try_from(s.as_str()).is_ok());
    }

    #[test]
    fn accepted_versions_are_single_safe_path_components(s in "\\PC{0,40}|[0-9./+a-z-]{0,30}") {
        if let Ok(v) = Version::try_from(s.as_str()) {
            prop_assert!(!v.as_str().contains('/') && !v.as_str().contains("..") && !v.as_str().starts_with('.'));
        }
    }

    #[test]
    fn artifacts_parse_without_panicking_and_round_trip(s in "(https|oci|http)://[a-z0-9.:/@_-]{0,60}(:[a-z0-9._-]{1,10})?") {
        if let Ok(a) = s.parse::<Artifact>() {
            prop_assert!(s.starts_with("https://") || s.starts_with("oci://"));
            prop_assert_eq!(a.to_string().parse::<Artifact>().unwrap(), a);
        }
    }

    /// The socket request parser is total: any bytes give a request or a typed error, never a panic.
    #[test]
    fn request_parsing_is_total(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = parse_request(&bytes);
    }

    /// Structured mutations of a valid upgrade request: parse or fail cleanly, and a parsed request re-serializes.
    #[test]
    fn mutated_upgrade_requests(field in "[a-zA-Z]{1,12}", value in "\\PC{0,40}", drop in any::<bool>()) {
        let mut v = serde_json::json!({"protocol": 1, "request": {"op": "upgrade", "attempt": fixtures::attempt()}});
        let attempt = v["request"]["attempt"].as_object_mut().unwrap();
        if drop { attempt.remove(&field); } else { attempt.insert(field, serde_json::Value::String(value)); }
        let bytes = serde_json::to_vec(&v).unwrap();
        if let Ok(req) = parse_request(&bytes) {
            let frame = fleet_wire::RequestFrame { protocol: 1, request: req.clone() };
            prop_assert_eq!(parse_request(&serde_json::to_vec(&frame).unwrap()).unwrap(), req);
        }
    }

    /// Frames: never more than the limit buffered, and every line under the limit comes back intact.
    #[test]
    fn frame_reader_respects_limit(lines in proptest::collection::vec(proptest::collection::vec(1u8..=255, 0..64), 1..5), limit in 1usize..48, cap in 1usize..16) {
        let mut input = Vec::new();
        for l in &lines {
            input.extend(l.iter().map(|&b| if b == b'\n' { b'x' } else { b }));
            input.push(b'\n');
        }
        let mut r = BufReader::with_capacity(cap, &input[..]);
        for l in &lines {
            match read_frame(&mut r, limit) {
                Ok(Some(got)) => { prop_assert!(got.len() <= limit); prop_assert_eq!(got.len(), l.len()); }
                Err(FrameError::TooLarge { .. }) => { prop_assert!(l.len() > limit); break; }
                other => prop_assert!(false, "unexpected {:?}", other.map(|o| o.map(|v| v.len()))),
            }
        }
    }

    #[test]
    fn bounded_text_never_exceeds_the_limit(s in "\\PC{0,1100}|[\\x00-\\x1f]{0,50}") {
        let t = BoundedText::lossy(&s);
        prop_assert!(t.as_str().chars().count() <= limits::MAX_TEXT_CHARS);
        prop_assert!(BoundedText::try_from(t.as_str().to_owned()).is_ok());
    }
}
