//! The fuzz target's properties (`agent/natsio/fuzz/checks.rs`) in the normal test suite: every seed and every
//! input a fuzzer ever failed on (`agent/natsio/fuzz/seeds/proto/`, `agent/natsio/fuzz/regressions/proto/`) is
//! replayed, so a fixed crash stays fixed without cargo-fuzz. `scripts/fuzz` runs the target itself.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../fuzz/checks.rs"]
mod checks;

use std::path::PathBuf;

/// Every file of `seeds/proto` and `regressions/proto` (dot files excepted); at least one seed.
fn inputs() -> Vec<(PathBuf, Vec<u8>)> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut out = Vec::new();
    for dir in ["seeds", "regressions"] {
        let dir = root.join(dir).join("proto");
        for e in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = e.expect("entry").path();
            if path
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with('.'))
            {
                continue;
            }
            out.push((path.clone(), std::fs::read(&path).expect("read")));
        }
    }
    assert!(out
        .iter()
        .any(|(p, _)| p.to_string_lossy().contains("/seeds/")));
    out
}

#[test]
fn proto_inputs_hold() {
    for (path, bytes) in inputs() {
        let r = std::panic::catch_unwind(|| checks::proto(&bytes));
        assert!(r.is_ok(), "{} fails its properties", path.display());
    }
}

/// The valid seeds parse to frames with no error (so the fuzzer starts from valid shapes); the oversize ones
/// are refused.
#[test]
fn seeds_parse_or_are_refused_as_named() {
    use fleet_nats::proto::{parse, Limits, ProtoError};
    for (path, b) in inputs()
        .into_iter()
        .filter(|(p, _)| p.to_string_lossy().contains("/seeds/"))
    {
        let limits = Limits {
            max_control_line: 8 + usize::from(b[0] & 0x3f) * 4,
            max_payload: usize::from(b[0] >> 6) * 64,
        };
        let mut rest = &b[2..];
        let mut frames = 0;
        let end = loop {
            match parse(rest, &limits) {
                Ok(Some((_, n))) => {
                    frames += 1;
                    rest = &rest[n..];
                }
                Ok(None) => break None,
                Err(e) => break Some(e),
            }
        };
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        match name.as_str() {
            "oversize-msg" => assert!(matches!(end, Some(ProtoError::PayloadTooLarge { .. }))),
            "long-control-line" => {
                assert!(matches!(end, Some(ProtoError::ControlLineTooLong { .. })))
            }
            _ => assert!(
                end.is_none() && rest.is_empty() && frames > 0,
                "{name}: {end:?}"
            ),
        }
    }
}
