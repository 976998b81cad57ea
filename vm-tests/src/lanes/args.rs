//! The arguments of `scripts/test` (those of `cargo test`), split into what goes to cargo (building, selecting
//! packages and targets), what goes to every test binary (a name filter, the arguments after `--`) and the runner's
//! own (`--no-fail-fast`).

/// `cargo test` options that take a value (`-p fleet-wire`): the value is not a test-name filter.
const WITH_VALUE: &[&str] = &[
    "-p",
    "--package",
    "--exclude",
    "--test",
    "--bin",
    "--bench",
    "--example",
    "-F",
    "--features",
    "-j",
    "--jobs",
    "--config",
    "-Z",
    "--color",
];

/// Options that select targets: with any of them, only what they select runs (no doc-tests unless `--doc`).
const SELECT: &[&str] = &[
    "--lib",
    "--bin",
    "--bins",
    "--test",
    "--tests",
    "--bench",
    "--benches",
    "--example",
    "--examples",
    "--all-targets",
    "--doc",
];

/// Options the runner cannot honour (it builds with `--message-format=json` and runs the binaries itself).
const REFUSED: &[&str] = &[
    "--no-run",
    "--message-format",
    "--manifest-path",
    "--target-dir",
    "--release",
    "-r",
    "--profile",
    "--target",
    "-q",
    "--quiet",
];

/// `scripts/test`'s arguments, sorted out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Split {
    /// Passed to `cargo test --no-run` and `cargo test --doc` (after the runner's fixed ones).
    pub cargo: Vec<String>,
    /// Passed to every test binary: the filter first, then everything after `--`.
    pub binary: Vec<String>,
    /// `--no-fail-fast`: start every binary even after one failed.
    pub no_fail_fast: bool,
    /// Whether the test binaries run (false with `--doc` alone).
    pub binaries: bool,
    /// Whether the doc-tests run (no target selection, or `--doc`).
    pub doc: bool,
}

/// Splits `args` (those of `cargo test`); an error names an option the runner cannot honour.
pub fn split(args: &[String]) -> Result<Split, String> {
    let mut s = Split::default();
    let mut filter = vec![];
    let mut after = vec![];
    let mut selected = vec![];
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        let name = a.split('=').next().unwrap_or(a);
        if a == "--" {
            after.extend(args[i + 1..].iter().cloned());
            break;
        }
        if REFUSED.contains(&name) {
            return Err(format!(
                "scripts/test does not take {name} (it builds the test binaries itself and runs them in lanes); \
                 run cargo test directly for that"
            ));
        }
        if SELECT.contains(&name) {
            selected.push(name.to_string());
        }
        if a == "--no-fail-fast" {
            s.no_fail_fast = true;
        } else if WITH_VALUE.contains(&a.as_str()) {
            s.cargo.push(a.clone());
            if let Some(v) = args.get(i + 1) {
                s.cargo.push(v.clone());
            }
            i += 1;
        } else if a.starts_with('-') {
            s.cargo.push(a.clone());
        } else {
            filter.push(a.clone());
        }
        i += 1;
    }
    if filter.len() > 1 {
        return Err(format!(
            "cargo test takes one test-name filter, got {filter:?} (more filters go after --)"
        ));
    }
    s.doc = selected.is_empty() || selected.iter().any(|o| o == "--doc");
    s.binaries = selected.is_empty() || selected.iter().any(|o| o != "--doc");
    // The doc job adds `--doc` itself, and cargo refuses `--doc` with `--no-run`.
    s.cargo.retain(|a| a != "--doc");
    s.binary = filter.into_iter().chain(after).collect();
    Ok(s)
}

impl Split {
    /// The cargo arguments for `cargo test --doc`: those of the build without target selections (cargo refuses
    /// `--doc` beside `--lib`, `--test <name>` and the like).
    pub fn doc_cargo(&self) -> Vec<String> {
        let mut out = vec![];
        let mut it = self.cargo.iter();
        while let Some(a) = it.next() {
            let name = a.split('=').next().unwrap_or(a);
            if SELECT.contains(&name) {
                if WITH_VALUE.contains(&a.as_str()) {
                    it.next();
                }
                continue;
            }
            out.push(a.clone());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn nothing_runs_everything() {
        let s = split(&[]).unwrap();
        assert!(s.binaries && s.doc && !s.no_fail_fast);
        assert!(s.cargo.is_empty() && s.binary.is_empty());
    }

    #[test]
    fn a_filter_and_test_args_go_to_every_binary_and_package_options_to_cargo() {
        let s = split(&v(&[
            "-p",
            "fleet-wire",
            "golden",
            "--no-fail-fast",
            "--",
            "--nocapture",
        ]))
        .unwrap();
        assert_eq!(s.cargo, v(&["-p", "fleet-wire"]));
        assert_eq!(s.binary, v(&["golden", "--nocapture"]));
        assert!(s.no_fail_fast && s.doc && s.binaries);
    }

    #[test]
    fn selecting_targets_drops_the_doc_tests_unless_doc_is_selected() {
        let s = split(&v(&["--test", "boot"])).unwrap();
        assert_eq!(s.cargo, v(&["--test", "boot"]));
        assert!(s.binaries && !s.doc);
        let s = split(&v(&["--doc"])).unwrap();
        assert!(!s.binaries && s.doc && s.cargo.is_empty());
        let s = split(&v(&["--lib", "--doc", "--test", "boot", "-p", "x"])).unwrap();
        assert!(s.binaries && s.doc);
        assert_eq!(s.cargo, v(&["--lib", "--test", "boot", "-p", "x"]));
        assert_eq!(s.doc_cargo(), v(&["-p", "x"]));
    }

    #[test]
    fn options_the_runner_cannot_honour_are_refused() {
        assert!(split(&v(&["--release"])).is_err());
        assert!(split(&v(&["--message-format=short"])).is_err());
        assert!(split(&v(&["a", "b"])).is_err());
        // after `--` everything belongs to the binaries
        assert_eq!(
            split(&v(&["--", "--release"])).unwrap().binary,
            v(&["--release"])
        );
    }
}
