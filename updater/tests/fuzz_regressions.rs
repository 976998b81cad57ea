//! The fuzz targets' properties (`updater/fuzz/checks.rs`) in the normal test suite: every seed and every input
//! a fuzzer ever failed on (`updater/fuzz/seeds/<target>/`, `updater/fuzz/regressions/<target>/`) is replayed,
//! so a fixed crash stays fixed without cargo-fuzz. `scripts/fuzz` runs the targets themselves.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../fuzz/checks.rs"]
mod checks;

use std::path::PathBuf;

/// Every file of `seeds/<target>` and `regressions/<target>` (dot files excepted); at least one seed each.
fn inputs(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut out = Vec::new();
    for dir in ["seeds", "regressions"] {
        let dir = root.join(dir).join(target);
        for e in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = e.expect("entry").path();
            if path
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with('.'))
            {
                continue;
            }
            let bytes = std::fs::read(&path).expect("read");
            out.push((path, bytes));
        }
    }
    assert!(
        out.iter()
            .any(|(p, _)| p.to_string_lossy().contains("/seeds/")),
        "no seed for {target}"
    );
    out
}

fn replay(target: &str, check: fn(&[u8])) {
    for (path, bytes) in inputs(target) {
        let r = std::panic::catch_unwind(|| check(&bytes));
        assert!(
            r.is_ok(),
            "{target}: {} fails its properties",
            path.display()
        );
    }
}

#[test]
fn socket_frame_inputs_hold() {
    replay("socket_frame", checks::socket_frame);
}

#[test]
fn journal_inputs_hold() {
    replay("journal", checks::journal);
}

#[test]
fn attempt_inputs_hold() {
    replay("attempt", checks::attempt);
}

#[test]
fn fetch_lines_inputs_hold() {
    replay("fetch_lines", checks::fetch_lines);
}

/// The seeds are accepted by their parsers (so the fuzzer starts from valid shapes, and the checks above do
/// more than refuse garbage).
#[test]
fn seeds_parse() {
    use fleet_updater::agent_upgrade::journal::Journal;
    use fleet_wire::fetch::{FetchFailure, FetchRequest, ResumePoint};
    for (path, b) in inputs("journal") {
        let ok = Journal::parse(&b, "seed").is_ok()
            || fleet_updater::durable::parse_validated::<
                fleet_updater::fetch_runner::partial::PartialState,
            >(&b)
            .is_ok();
        assert!(ok, "{}", path.display());
    }
    for (path, b) in inputs("fetch_lines") {
        let ok = FetchRequest::parse(&b).is_ok()
            || ResumePoint::parse(&b).is_ok()
            || FetchFailure::parse(&b).is_ok();
        assert!(ok, "{}", path.display());
    }
    for (path, b) in inputs("socket_frame")
        .into_iter()
        .filter(|(p, _)| p.to_string_lossy().contains("request"))
    {
        let line = b[1..].strip_suffix(b"\n").expect("a line");
        assert!(
            fleet_wire::socket::parse_request(line).is_ok(),
            "{}",
            path.display()
        );
    }
}
