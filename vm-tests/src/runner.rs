//! The command line of the scenario binaries that run outside `cargo test` (QEMU, arm64): `--help`, the scenarios
//! named on the command line (default: all), one PASS or FAIL line with its time each, exit 1 if any failed.

use std::time::Instant;

/// Runs the scenarios named in the process's arguments (every one of `table` when none is named) and exits 1 when
/// one failed (2 for an unknown name). `label` prefixes each result line, e.g. `scenario` → `PASS scenario a (12 s)`.
pub fn run_scenarios(help: &str, label: &str, table: &[(&str, fn())]) {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{help}");
        return;
    }
    let wanted: Vec<&str> = if args.is_empty() {
        table.iter().map(|(name, _)| *name).collect()
    } else {
        args.iter().map(String::as_str).collect()
    };
    let mut failed = false;
    for name in wanted {
        let Some((_, run)) = table.iter().find(|(n, _)| *n == name) else {
            eprintln!("unknown scenario {name:?}\n\n{help}");
            std::process::exit(2);
        };
        let start = Instant::now();
        let ok = std::panic::catch_unwind(*run).is_ok();
        println!(
            "{} {label} {name} ({:.0} s)",
            if ok { "PASS" } else { "FAIL" },
            start.elapsed().as_secs_f64()
        );
        failed |= !ok;
    }
    if failed {
        std::process::exit(1);
    }
}

/// Prints `msg` on stderr after the time of day (UTC), for the long scenarios' progress lines.
pub fn step(msg: &str) {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    eprintln!(
        "[{:02}:{:02}:{:02}] {msg}",
        secs / 3600 % 24,
        secs / 60 % 60,
        secs % 60
    );
}

/// Times the steps of one long scenario: `== name` on stderr when a step starts, `PASS name (N s)` on stdout when
/// it finished, `FAIL name (N s)` when it panicked (the panic then goes on).
pub struct Steps;

/// Prints the FAIL line of a step that is unwinding.
struct FailLine<'a>(&'a str, Instant);

impl Drop for FailLine<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            println!("FAIL {} ({:.0} s)", self.0, self.1.elapsed().as_secs_f64());
        }
    }
}

impl Steps {
    /// Runs step `name`.
    pub fn run<T>(&mut self, name: &str, f: impl FnOnce() -> T) -> T {
        eprintln!("== {name}");
        let at = Instant::now();
        let guard = FailLine(name, at);
        let v = f();
        drop(guard);
        println!("PASS {name} ({:.0} s)", at.elapsed().as_secs_f64());
        v
    }
}
