//! Running jobs in lanes: each binary in its own process group with its output in a log file, at most `lanes` at a
//! time, a deadline per binary, a one-line summary per binary as it ends (its whole log when it failed), and the
//! final table. A binary fails when it exits non-zero, dies of a signal or runs past its deadline.

use super::schedule::Job;
use std::collections::VecDeque;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One process to run: a test binary, or the doc-test job.
#[derive(Debug, Clone)]
pub struct Spec {
    /// Its name in summaries and the table.
    pub name: String,
    /// The program.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// Its working directory.
    pub cwd: PathBuf,
    /// Variables set on top of the inherited environment.
    pub env: Vec<(String, String)>,
}

/// How the lanes run.
#[derive(Debug, Clone)]
pub struct Options {
    /// How many binaries run at the same time.
    pub lanes: usize,
    /// Start nothing new after a failure (cargo test's default).
    pub fail_fast: bool,
    /// The deadline of each binary.
    pub timeout: Duration,
    /// Where the logs go (`<name>.log`).
    pub log_dir: PathBuf,
}

/// The tests a binary reported: the sums over its `test result:` lines.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Passed tests.
    pub passed: u64,
    /// Failed tests.
    pub failed: u64,
    /// Ignored tests.
    pub ignored: u64,
    /// Tests left out by a filter.
    pub filtered: u64,
}

/// Sums the `test result: …` lines libtest (and rustdoc, once per crate) prints.
pub fn parse_counts(log: &str) -> Option<Counts> {
    let mut c = Counts::default();
    let mut any = false;
    for line in log.lines() {
        let Some(rest) = line.trim_start().strip_prefix("test result: ") else {
            continue;
        };
        any = true;
        for part in rest.split(';') {
            let part = part.replace("filtered out", "filtered");
            let mut w = part.split_whitespace().rev();
            let (Some(what), Some(n)) = (w.next(), w.next()) else {
                continue;
            };
            let Ok(n) = n.parse::<u64>() else { continue };
            match what {
                "passed" => c.passed += n,
                "failed" => c.failed += n,
                "ignored" => c.ignored += n,
                "filtered" => c.filtered += n,
                _ => {}
            }
        }
    }
    any.then_some(c)
}

/// How a binary ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    /// Exit code 0.
    Passed,
    /// A non-zero exit code.
    Failed(i32),
    /// Killed by a signal it did not ask for.
    Crashed(i32),
    /// Ran past the deadline and was killed.
    TimedOut,
    /// Stopped because the run was interrupted (SIGINT/SIGTERM).
    Interrupted,
    /// Never started (an earlier failure without `--no-fail-fast`, or an interrupt).
    NotRun,
}

impl Status {
    fn word(&self) -> String {
        match self {
            Self::Passed => "ok".into(),
            Self::Failed(c) => format!("FAILED (exit {c})"),
            Self::Crashed(s) => format!("CRASHED (signal {s})"),
            Self::TimedOut => "TIMED OUT".into(),
            Self::Interrupted => "INTERRUPTED".into(),
            Self::NotRun => "not run".into(),
        }
    }

    /// Whether the run fails because of this binary.
    pub fn is_failure(&self) -> bool {
        !matches!(self, Self::Passed | Self::NotRun)
    }
}

/// What one binary did.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Its name.
    pub name: String,
    /// How it ended.
    pub status: Status,
    /// Its tests, when it printed a result line.
    pub counts: Option<Counts>,
    /// Wall seconds.
    pub secs: f64,
    /// Its log file.
    pub log: PathBuf,
}

struct Running {
    job: usize,
    member: usize,
    child: Child,
    started: Instant,
    log: PathBuf,
    alone: bool,
    timed_out: bool,
}

fn log_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{}.log", name.replace(['/', ' '], "_")))
}

fn start(spec: &Spec, log: &Path) -> std::io::Result<Child> {
    use std::os::unix::process::CommandExt;
    let out = std::fs::File::create(log)?;
    let err = out.try_clone()?;
    Command::new(&spec.program)
        .args(&spec.args)
        .current_dir(&spec.cwd)
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        // Its own process group, so that an interrupt of the runner reaches what the binary started, as a
        // terminal's Ctrl-C reaches everything under `cargo test`.
        .process_group(0)
        .spawn()
}

fn signal_group(pid: u32, signal: &str) {
    let _ = Command::new("kill")
        .args(["-s", signal, "--", &format!("-{pid}")])
        .stderr(Stdio::null())
        .status();
}

fn summary_line(o: &Outcome, done: usize, total: usize) -> String {
    let counts = match o.counts {
        Some(c) => format!(
            "{} passed, {} failed, {} ignored",
            c.passed, c.failed, c.ignored
        ),
        None => "no test result line".into(),
    };
    format!(
        "[{done:>3}/{total}] {:<18} {:<58} {counts:<38} {:>7.1} s",
        o.status.word(),
        o.name,
        o.secs
    )
}

fn report(o: &Outcome, done: usize, total: usize) {
    println!("{}", summary_line(o, done, total));
    if o.status.is_failure() {
        let text = std::fs::read(&o.log).map(|b| String::from_utf8_lossy(&b).to_string());
        println!(
            "======== {} {}: its whole output ({}):",
            o.name,
            o.status.word(),
            o.log.display()
        );
        match text {
            Ok(t) => print!("{t}"),
            Err(e) => println!("(cannot read the log: {e})"),
        }
        println!("======== end of {}", o.name);
    }
}

/// Runs `jobs` (members index `specs`) in lanes; returns every binary's outcome, run or not.
pub fn run(specs: &[Spec], jobs: &[Job], opts: &Options) -> Vec<Outcome> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        let _ = signal_hook::flag::register(sig, Arc::clone(&stop));
    }
    let total: usize = jobs.iter().map(|j| j.members.len()).sum();
    let mut queue: VecDeque<usize> = (0..jobs.len()).collect();
    let mut running: Vec<Running> = vec![];
    let mut outcomes: Vec<Outcome> = vec![];
    let mut failed = false;
    let lanes = opts.lanes.max(1);
    let launch =
        |job: usize, member: usize, outcomes: &mut Vec<Outcome>, running: &mut Vec<Running>| {
            let spec = &specs[jobs[job].members[member]];
            let log = log_path(&opts.log_dir, &spec.name);
            match start(spec, &log) {
                Ok(child) => running.push(Running {
                    job,
                    member,
                    child,
                    started: Instant::now(),
                    log,
                    alone: jobs[job].alone,
                    timed_out: false,
                }),
                Err(e) => {
                    let _ = std::fs::write(&log, format!("cannot start {:?}: {e}\n", spec.program));
                    let o = Outcome {
                        name: spec.name.clone(),
                        status: Status::Failed(-1),
                        counts: None,
                        secs: 0.0,
                        log,
                    };
                    report(&o, outcomes.len() + 1, total);
                    outcomes.push(o);
                }
            }
        };
    loop {
        let interrupted = stop.load(Ordering::SeqCst);
        let starting = !(interrupted || (failed && opts.fail_fast));
        while starting && running.len() < lanes {
            let Some(&next) = queue.front() else { break };
            if running.iter().any(|r| r.alone) || (jobs[next].alone && !running.is_empty()) {
                break;
            }
            queue.pop_front();
            let before = outcomes.len();
            launch(next, 0, &mut outcomes, &mut running);
            failed |= outcomes.len() > before;
        }
        if running.is_empty() && (queue.is_empty() || !starting) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        let mut i = 0;
        while i < running.len() {
            let r = &mut running[i];
            if stop.load(Ordering::SeqCst) {
                signal_group(r.child.id(), "INT");
            }
            if !r.timed_out && r.started.elapsed() > opts.timeout {
                r.timed_out = true;
                // The binary only: the rig's watchdogs in its group see it gone and stop and remove what it
                // started (servers, temporary directories), as after a crash.
                let _ = r.child.kill();
            }
            let status = match r.child.try_wait() {
                Ok(Some(s)) => s,
                Ok(None) => {
                    i += 1;
                    continue;
                }
                Err(e) => {
                    eprintln!("test-lanes: waiting for {}: {e}", r.log.display());
                    signal_group(r.child.id(), "KILL");
                    let _ = r.child.wait();
                    i += 1;
                    continue;
                }
            };
            let r = running.swap_remove(i);
            let text = std::fs::read(&r.log)
                .map(|b| String::from_utf8_lossy(&b).to_string())
                .unwrap_or_default();
            let counts = parse_counts(&text);
            use std::os::unix::process::ExitStatusExt;
            let status = match (status.code(), status.signal()) {
                _ if r.timed_out => Status::TimedOut,
                (_, Some(_)) if stop.load(Ordering::SeqCst) => Status::Interrupted,
                (Some(0), _) if counts.map(|c| c.failed).unwrap_or(0) == 0 => Status::Passed,
                (Some(0), _) => Status::Failed(0),
                (Some(c), _) => Status::Failed(c),
                (None, Some(s)) => Status::Crashed(s),
                (None, None) => Status::Failed(-1),
            };
            let spec = &specs[jobs[r.job].members[r.member]];
            let o = Outcome {
                name: spec.name.clone(),
                status,
                counts,
                secs: r.started.elapsed().as_secs_f64(),
                log: r.log,
            };
            failed |= o.status.is_failure();
            report(&o, outcomes.len() + 1, total);
            outcomes.push(o);
            let more = r.member + 1 < jobs[r.job].members.len();
            if more && !stop.load(Ordering::SeqCst) && !(failed && opts.fail_fast) {
                let before = outcomes.len();
                launch(r.job, r.member + 1, &mut outcomes, &mut running);
                failed |= outcomes.len() > before;
            }
        }
    }
    let ran: std::collections::BTreeSet<String> = outcomes.iter().map(|o| o.name.clone()).collect();
    for j in jobs {
        for &m in &j.members {
            if !ran.contains(&specs[m].name) {
                outcomes.push(Outcome {
                    name: specs[m].name.clone(),
                    status: Status::NotRun,
                    counts: None,
                    secs: 0.0,
                    log: log_path(&opts.log_dir, &specs[m].name),
                });
            }
        }
    }
    outcomes
}

/// The final table, longest first, and the totals.
pub fn table(outcomes: &[Outcome], wall: Duration, lanes: usize) -> String {
    let mut sorted: Vec<&Outcome> = outcomes.iter().collect();
    sorted.sort_by(|a, b| b.secs.total_cmp(&a.secs));
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:>8}  {:<18} {:>6} {:>6} {:>7}  binary",
        "seconds", "status", "passed", "failed", "ignored"
    );
    let mut sum = Counts::default();
    for o in &sorted {
        let c = o.counts.unwrap_or_default();
        sum.passed += c.passed;
        sum.failed += c.failed;
        sum.ignored += c.ignored;
        let n = |v: u64| {
            if o.counts.is_some() {
                v.to_string()
            } else {
                "-".into()
            }
        };
        let _ = writeln!(
            s,
            "{:>8.1}  {:<18} {:>6} {:>6} {:>7}  {}",
            o.secs,
            o.status.word(),
            n(c.passed),
            n(c.failed),
            n(c.ignored),
            o.name
        );
    }
    let bad: Vec<&str> = sorted
        .iter()
        .filter(|o| o.status.is_failure())
        .map(|o| o.name.as_str())
        .collect();
    let not_run = sorted.iter().filter(|o| o.status == Status::NotRun).count();
    let _ = writeln!(
        s,
        "{} binaries ({} failed, {not_run} not run): {} tests passed, {} failed, {} ignored; {:.0} s wall in {lanes} lanes, \
         {:.0} s of binaries",
        sorted.len(),
        bad.len(),
        sum.passed,
        sum.failed,
        sum.ignored,
        wall.as_secs_f64(),
        sorted.iter().map(|o| o.secs).sum::<f64>()
    );
    for b in bad {
        let _ = writeln!(s, "FAILED: {b}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn result_lines_are_summed_and_a_missing_one_is_none() {
        let log = "running 3 tests\ntest a ... ok\n\
            test result: FAILED. 2 passed; 1 failed; 4 ignored; 0 measured; 7 filtered out; finished in 1.5s\n\
            test result: ok. 5 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.01s\n";
        assert_eq!(
            parse_counts(log),
            Some(Counts {
                passed: 7,
                failed: 1,
                ignored: 4,
                filtered: 7
            })
        );
        assert_eq!(parse_counts("thread 'main' panicked\n"), None);
    }

    fn sh(name: &str, script: &str, dir: &Path) -> Spec {
        Spec {
            name: name.into(),
            program: "sh".into(),
            args: vec!["-c".into(), script.into()],
            cwd: dir.to_path_buf(),
            env: vec![("LANES_TEST".into(), name.into())],
        }
    }

    fn job(label: &str, members: Vec<usize>, alone: bool) -> Job {
        Job {
            label: label.into(),
            members,
            secs: 1.0,
            alone,
        }
    }

    fn opts(dir: &Path, lanes: usize, fail_fast: bool) -> Options {
        Options {
            lanes,
            fail_fast,
            timeout: Duration::from_secs(5),
            log_dir: dir.to_path_buf(),
        }
    }

    const OK: &str = "echo \"$LANES_TEST in $PWD\"; echo 'test result: ok. 2 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out'";

    #[test]
    fn lanes_run_side_by_side_and_failures_crashes_and_hangs_are_all_reported() {
        let d = tempfile::tempdir().unwrap();
        let specs = vec![
            sh("p/test/ok", &format!("sleep 1; {OK}"), d.path()),
            sh("p/test/fails", "echo boom; exit 101", d.path()),
            sh("p/test/crashes", "kill -SEGV $$", d.path()),
            sh("p/test/hangs", "sleep 30", d.path()),
        ];
        let jobs: Vec<Job> = (0..4).map(|i| job("j", vec![i], false)).collect();
        let mut o = opts(d.path(), 4, false);
        o.timeout = Duration::from_secs(2);
        let started = Instant::now();
        let out = run(&specs, &jobs, &o);
        // side by side: the 2 s deadline and the 1 s sleep overlap
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        let by = |n: &str| out.iter().find(|x| x.name == n).unwrap().clone();
        assert_eq!(by("p/test/ok").status, Status::Passed);
        assert_eq!(by("p/test/ok").counts.unwrap().passed, 2);
        let log = std::fs::read_to_string(&by("p/test/ok").log).unwrap();
        assert!(
            log.contains(&format!("p/test/ok in {}", d.path().display())),
            "{log}"
        );
        assert_eq!(by("p/test/fails").status, Status::Failed(101));
        assert_eq!(by("p/test/crashes").status, Status::Crashed(11));
        assert_eq!(by("p/test/hangs").status, Status::TimedOut);
        let t = table(&out, started.elapsed(), 4);
        assert!(t.contains("4 binaries (3 failed, 0 not run)"), "{t}");
        assert!(
            t.contains("FAILED: p/test/fails") && t.contains("FAILED: p/test/crashes"),
            "{t}"
        );
    }

    #[test]
    fn a_group_runs_its_members_one_after_another_and_fail_fast_stops_starting() {
        let d = tempfile::tempdir().unwrap();
        let marker = d.path().join("busy");
        // each member fails if another member is running
        let guarded = format!(
            "[ -e {m} ] && exit 3; touch {m}; sleep 0.5; rm {m}; {OK}",
            m = marker.display()
        );
        let specs = vec![
            sh("g/test/a", &guarded, d.path()),
            sh("g/test/b", &guarded, d.path()),
            sh("g/test/c", &guarded, d.path()),
        ];
        let out = run(
            &specs,
            &[job("group g", vec![0, 1, 2], false)],
            &opts(d.path(), 3, true),
        );
        assert!(out.iter().all(|o| o.status == Status::Passed), "{out:?}");

        let specs = vec![
            sh("x/test/fails", "exit 1", d.path()),
            sh("x/test/later", OK, d.path()),
        ];
        let jobs = [job("a", vec![0], false), job("b", vec![1], false)];
        let out = run(&specs, &jobs, &opts(d.path(), 1, true));
        assert_eq!(out[0].status, Status::Failed(1));
        assert_eq!(out[1].status, Status::NotRun);
        let out = run(&specs, &jobs, &opts(d.path(), 1, false));
        assert_eq!(out[1].status, Status::Passed);
    }

    #[test]
    fn an_alone_job_runs_with_nothing_else() {
        let d = tempfile::tempdir().unwrap();
        let marker = d.path().join("alone");
        let alone = format!("touch {m}; sleep 0.5; rm {m}; {OK}", m = marker.display());
        let other = format!(
            "sleep 0.2; [ -e {m} ] && exit 3; {OK}",
            m = marker.display()
        );
        let specs = vec![
            sh("a/test/alone", &alone, d.path()),
            sh("a/test/o1", &other, d.path()),
            sh("a/test/o2", &other, d.path()),
        ];
        let jobs = [
            job("alone", vec![0], true),
            job("o1", vec![1], false),
            job("o2", vec![2], false),
        ];
        let out = run(&specs, &jobs, &opts(d.path(), 3, false));
        assert!(out.iter().all(|o| o.status == Status::Passed), "{out:?}");
    }
}
