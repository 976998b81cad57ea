//! `test-lanes`, the test phase of `scripts/test`: every test binary `cargo test --no-run` built, run in parallel
//! lanes (most of the suite waits on guests, servers and time-outs, not on the CPU), longest first, each exactly as
//! `cargo test` would run it (working directory, environment), with its output kept in a log file, printed in full
//! when it fails, and a table at the end. The doc-tests run as one more job (`cargo test --doc`).

pub mod args;
pub mod binaries;
pub mod run;
pub mod schedule;

use run::{Options, Spec, Status};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Lanes when `FLEET_TEST_LANES` is unset: on 2 cores 3 lanes were faster than 2 (the binaries mostly wait).
pub const DEFAULT_LANES: usize = 3;

/// Each binary's deadline when `FLEET_TEST_TIMEOUT_SECS` is unset: far above the longest binary (about 5 min).
pub const DEFAULT_TIMEOUT_SECS: u64 = 1800;

/// The plan of measured seconds and groups, relative to the workspace root.
pub const PLAN: &str = "scripts/test-lanes.txt";

/// The doc-test job's name.
pub const DOC_TESTS: &str = "doc-tests";

fn env_number<T: std::str::FromStr>(name: &str, default: T) -> Result<T, String> {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse()
            .map_err(|_| format!("{name}={v:?} is not a number")),
        _ => Ok(default),
    }
}

fn output(cmd: &mut Command) -> Result<String, String> {
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{cmd:?} failed with {}", out.status));
    }
    Ok(String::from_utf8_lossy(&out.stdout).to_string())
}

/// The `CARGO` cargo gives test binaries: the toolchain's cargo itself, not rustup's proxy.
fn cargo_for_tests(cargo: &str) -> String {
    if let Ok(c) = std::env::var("CARGO") {
        return c;
    }
    Command::new("rustup")
        .args(["which", "cargo"])
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| cargo.to_string())
}

/// The rustc sysroot's library directories (`<sysroot>/lib/rustlib/<host>/lib`, `<sysroot>/lib`).
fn sysroot_libs() -> Vec<PathBuf> {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let (Ok(root), Ok(vv)) = (
        output(Command::new(&rustc).args(["--print", "sysroot"])),
        output(Command::new(&rustc).arg("-vV")),
    ) else {
        return vec![];
    };
    let root = PathBuf::from(root.trim());
    let host = vv
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .unwrap_or_default();
    vec![
        root.join("lib/rustlib").join(host).join("lib"),
        root.join("lib"),
    ]
}

/// `scripts/test`'s test phase with `args` (those of `cargo test`); returns the exit code.
pub fn main(args: Vec<String>) -> i32 {
    match run_all(&args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("test-lanes: {e}");
            2
        }
    }
}

fn run_all(args: &[String]) -> Result<i32, String> {
    let split = args::split(args)?;
    let lanes: usize = env_number("FLEET_TEST_LANES", DEFAULT_LANES)?;
    let timeout: u64 = env_number("FLEET_TEST_TIMEOUT_SECS", DEFAULT_TIMEOUT_SECS)?;
    let cargo = "cargo".to_string();
    let metadata: Value = serde_json::from_str(&output(Command::new(&cargo).args([
        "metadata",
        "--format-version",
        "1",
        "--no-deps",
        "--locked",
    ]))?)
    .map_err(|e| format!("cargo metadata: {e}"))?;
    let root = PathBuf::from(metadata["workspace_root"].as_str().unwrap_or("."));
    let target = PathBuf::from(metadata["target_directory"].as_str().unwrap_or("target"));

    let mut specs = vec![];
    if split.binaries {
        let messages = build(&cargo, &split.cargo, &root)?;
        let ctx = binaries::Context {
            cargo: cargo_for_tests(&cargo),
            sysroot_libs: sysroot_libs(),
        };
        for b in binaries::from_build(&messages, &metadata, &ctx)? {
            specs.push(Spec {
                name: b.name,
                program: b.exe,
                args: split.binary.clone(),
                cwd: b.cwd,
                env: b.env,
            });
        }
    }
    if split.doc {
        let mut a = vec!["test".to_string()];
        a.extend(split.doc_cargo());
        a.extend(["--doc".to_string(), "--".to_string()]);
        a.extend(split.binary.iter().cloned());
        specs.push(Spec {
            name: DOC_TESTS.into(),
            program: PathBuf::from(&cargo),
            args: a,
            cwd: root.clone(),
            env: vec![],
        });
    }

    let plan_file = root.join(PLAN);
    let plan = match std::fs::read_to_string(&plan_file) {
        Ok(t) => schedule::parse_plan(&t).map_err(|e| format!("{}: {e}", plan_file.display()))?,
        Err(e) => {
            eprintln!(
                "test-lanes: no plan ({}: {e}): every binary counts as long",
                plan_file.display()
            );
            Default::default()
        }
    };
    let names: Vec<String> = specs.iter().map(|s| s.name.clone()).collect();
    let jobs = schedule::jobs(&names, &plan);
    let log_dir = target.join("test-lanes");
    prepare_log_dir(&log_dir)?;
    let unknown: Vec<&String> = names.iter().filter(|n| !plan.contains_key(*n)).collect();
    println!(
        "test-lanes: {} binaries in {lanes} lanes (FLEET_TEST_LANES), longest first; logs in {}",
        specs.len(),
        log_dir.display()
    );
    for n in unknown {
        println!(
            "test-lanes: {n} is not in {PLAN}: started early; add its seconds from the times file"
        );
    }
    let started = Instant::now();
    let outcomes = run::run(
        &specs,
        &jobs,
        &Options {
            lanes,
            fail_fast: !split.no_fail_fast,
            timeout: Duration::from_secs(timeout),
            log_dir: log_dir.clone(),
        },
    );
    println!("\n{}", run::table(&outcomes, started.elapsed(), lanes));
    let times = log_dir.join("times.txt");
    let mut lines: Vec<(f64, String)> = outcomes
        .iter()
        .filter(|o| o.status != Status::NotRun)
        .map(|o| {
            let group = plan.get(&o.name).and_then(|e| e.group.clone());
            (
                o.secs,
                format!(
                    "{:.0} {}{}",
                    o.secs.ceil(),
                    o.name,
                    group.map(|g| format!(" {g}")).unwrap_or_default()
                ),
            )
        })
        .collect();
    lines.sort_by(|a, b| b.0.total_cmp(&a.0));
    let text: String = lines.into_iter().map(|(_, l)| l + "\n").collect();
    if std::fs::write(&times, text).is_ok() {
        println!(
            "measured seconds (the format of {PLAN}): {}",
            times.display()
        );
    }
    Ok(if outcomes.iter().any(|o| o.status.is_failure()) {
        1
    } else {
        0
    })
}

/// `cargo test --no-run` with `cargo_args`: its JSON messages, its diagnostics printed (a compile error included).
fn build(cargo: &str, cargo_args: &[String], root: &Path) -> Result<String, String> {
    let mut cmd = Command::new(cargo);
    // Plain `json`: `json-render-diagnostics` changes rustc's flags, so every workspace crate a plain `cargo test`
    // built would be compiled again.
    cmd.args(["test", "--no-run", "--message-format=json"])
        .args(cargo_args)
        .current_dir(root)
        .stderr(Stdio::inherit());
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    let messages = String::from_utf8_lossy(&out.stdout).to_string();
    for m in messages
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
    {
        if let Some(r) = m["message"]["rendered"].as_str() {
            eprint!("{r}");
        }
    }
    if !out.status.success() {
        return Err(format!("{cmd:?} failed with {}", out.status));
    }
    Ok(messages)
}

fn prepare_log_dir(dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
    for e in std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .flatten()
    {
        if e.path().extension().is_some_and(|x| x == "log") {
            let _ = std::fs::remove_file(e.path());
        }
    }
    Ok(())
}
