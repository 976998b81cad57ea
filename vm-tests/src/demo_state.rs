//! What the demo started, recorded as it starts it (`<dir>/pids`: PID, start time, name per line), so that a run
//! after a crash stops the leftovers by PID and starts clean, and `scripts/demo --stop` stops a kept demo.
//! The start time (field 22 of `/proc/<pid>/stat`) guards against a PID the kernel has since given to another
//! process. `scripts/demo --add-device` hands its request to the kept demo through `<dir>/requests/`.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// The name the demo records itself under.
const DEMO: &str = "fleet-demo";

/// The open record of one demo run.
pub struct Record {
    path: PathBuf,
}

/// One recorded process.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    pid: u32,
    start: u64,
    name: String,
}

fn parse(text: &str) -> Vec<Entry> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            Some(Entry {
                pid: f.next()?.parse().ok()?,
                start: f.next()?.parse().ok()?,
                name: f.next()?.to_string(),
            })
        })
        .collect()
}

/// The start time of `pid` in clock ticks after boot, while it runs (a zombie counts as gone).
fn start_time(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces; the fields after its closing parenthesis do not.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    if fields.first() == Some(&"Z") {
        return None;
    }
    fields.get(19)?.parse().ok()
}

fn alive(e: &Entry) -> bool {
    start_time(e.pid) == Some(e.start)
}

fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .args([sig, &pid.to_string()])
        .stderr(std::process::Stdio::null())
        .status();
}

fn read(dir: &Path) -> Vec<Entry> {
    parse(&fs::read_to_string(dir.join("pids")).unwrap_or_default())
}

impl Record {
    /// Starts a new record in `dir`. Refuses while a recorded demo still runs; otherwise stops what an earlier run
    /// left running (by PID), removes the guests it left (network namespaces, cgroups, overlay mounts) and the
    /// scratch directories `tmp/` and `guests/`, and records this process.
    pub fn begin(dir: &Path) -> Result<Self, String> {
        fs::create_dir_all(dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
        let old = read(dir);
        if let Some(d) = old.iter().find(|e| e.name == DEMO && alive(e)) {
            return Err(format!(
                "a demo is already running (pid {}); stop it with `scripts/demo --stop`",
                d.pid
            ));
        }
        for e in old.iter().filter(|e| alive(e)) {
            println!(
                "   stopping {} (pid {}) left by an earlier run",
                e.name, e.pid
            );
            signal(e.pid, "-KILL");
        }
        fleet_rig::nspawn::sweep_stale();
        let mounts = fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        let prefix = format!("{}/", dir.display());
        for m in mounts.lines().filter_map(|l| l.split_whitespace().nth(1)) {
            if m.starts_with(&prefix) {
                let _ = Command::new("umount").args(["-l", m]).status();
            }
        }
        for sub in ["tmp", "guests"] {
            let p = dir.join(sub);
            if p.exists() {
                fs::remove_dir_all(&p).map_err(|e| format!("remove {}: {e}", p.display()))?;
            }
            fs::create_dir_all(&p).map_err(|e| format!("mkdir {}: {e}", p.display()))?;
        }
        let r = Self {
            path: dir.join("pids"),
        };
        fs::write(&r.path, "").map_err(|e| format!("write {}: {e}", r.path.display()))?;
        r.add(std::process::id(), DEMO);
        Ok(r)
    }

    /// Records `pid` (which must be running) as `name`.
    pub fn add(&self, pid: u32, name: &str) {
        let Some(start) = start_time(pid) else {
            return;
        };
        let line = format!("{pid} {start} {}\n", name.replace(char::is_whitespace, "-"));
        let ok = fs::OpenOptions::new()
            .append(true)
            .open(&self.path)
            .and_then(|mut f| f.write_all(line.as_bytes()));
        if let Err(e) = ok {
            eprintln!("cannot record {name} (pid {pid}): {e}");
        }
    }
}

/// The name a device's guest (its PID 1) is recorded under.
pub fn guest_name(device: &str) -> String {
    format!("guest-{device}")
}

/// The recorded parts of the demo in `dir` that are no longer running (name, PID), in record order.
pub fn dead(dir: &Path) -> Vec<(String, u32)> {
    read(dir)
        .into_iter()
        .filter(|e| e.name != DEMO && !alive(e))
        .map(|e| (e.name, e.pid))
        .collect()
}

/// The command that opens a login shell in `device`'s guest of the demo recorded in `dir` (`nsenter` into every
/// namespace of its current PID 1, found below the recorded wrapper, so it follows the guest's reboots, as root);
/// an error naming the devices there are when it has none, or saying it is rebooting.
pub fn shell(dir: &Path, device: &str) -> Result<Command, String> {
    let entries = read(dir);
    let want = guest_name(device);
    match entries.iter().find(|e| e.name == want && alive(e)) {
        Some(e) => {
            // Right after a reboot the next init takes a moment to start.
            let init = fleet_rig::wait_for(Duration::from_secs(10), || {
                fleet_rig::nspawn::guest_init_below(e.pid)
            })
            .ok_or_else(|| format!("demo device {device} is rebooting: try again in a moment"))?;
            let mut cmd = Command::new("nsenter");
            cmd.args(["-t", &init.to_string(), "-a", "--", "/bin/bash", "-l"])
                // The host's temporary directory (the demo sets its own) does not exist in the guest.
                .env_remove("TMPDIR");
            Ok(cmd)
        }
        None => {
            let running: Vec<&str> = entries
                .iter()
                .filter(|e| alive(e))
                .filter_map(|e| e.name.strip_prefix("guest-"))
                .collect();
            Err(if running.is_empty() {
                "no demo device is running (start one with `scripts/demo --keep`)".into()
            } else {
                format!(
                    "no running demo device {device}; running: {}",
                    running.join(", ")
                )
            })
        }
    }
}

/// Stops the demo recorded in `dir` (SIGTERM: it tears its fleet down itself) and waits for it. Returns what
/// happened, for the user.
pub fn stop(dir: &Path) -> String {
    let Some(d) = read(dir).into_iter().find(|e| e.name == DEMO && alive(e)) else {
        return "no demo is running".into();
    };
    signal(d.pid, "-TERM");
    let gone = fleet_rig::wait_for(Duration::from_secs(120), || (!alive(&d)).then_some(()));
    match gone {
        Some(()) => format!("stopped the demo (pid {})", d.pid),
        None => format!(
            "the demo (pid {}) did not stop within 120 s; the next `scripts/demo` stops what it left",
            d.pid
        ),
    }
}

/// Where `scripts/demo --add-device` leaves its requests for the kept demo, which owns every guest (their relays to
/// NATS and the identity provider run in its process): `<name>.add` asks, `<name>.log` is the demo's narration of
/// that device's enrolment, `<name>.done` its outcome (`ok`, or the reason it failed).
fn requests(dir: &Path) -> PathBuf {
    dir.join("requests")
}

/// How long `--add-device` waits for the demo to enrol the device (a package build, a boot, apt and the first
/// token take about a minute here).
const ADD_TIMEOUT: Duration = Duration::from_secs(600);

/// Asks the demo kept running in `dir` to add device `name` and follows its narration (printed as it comes) until
/// the outcome; an error when no demo runs, the name is taken or refused, or the enrolment failed.
pub fn add_device(dir: &Path, name: &str) -> Result<(), String> {
    fleet_wire::DeviceId::try_from(name).map_err(|e| format!("--add-device {name}: {e}"))?;
    if !read(dir).iter().any(|e| e.name == DEMO && alive(e)) {
        return Err(
            "no demo is running: start one with `scripts/demo --keep` and add the device from another shell".into(),
        );
    }
    if read(dir)
        .iter()
        .any(|e| e.name == guest_name(name) && alive(e))
    {
        return Err(format!("the demo already has a device {name}"));
    }
    let req = requests(dir);
    fs::create_dir_all(&req).map_err(|e| format!("mkdir {}: {e}", req.display()))?;
    for ext in ["log", "done"] {
        let _ = fs::remove_file(req.join(format!("{name}.{ext}")));
    }
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(req.join(format!("{name}.add")))
        .map_err(|e| format!("{name} is already being added ({e})"))?;
    let log = req.join(format!("{name}.log"));
    let done = req.join(format!("{name}.done"));
    let mut shown = 0;
    let start = std::time::Instant::now();
    loop {
        let text = fs::read_to_string(&log).unwrap_or_default();
        if text.len() > shown {
            print!("{}", &text[shown..]);
            shown = text.len();
        }
        if let Ok(outcome) = fs::read_to_string(&done) {
            let text = fs::read_to_string(&log).unwrap_or_default();
            print!("{}", text.get(shown..).unwrap_or_default());
            return match outcome.trim() {
                "ok" => Ok(()),
                why => Err(format!("adding {name} failed: {why}")),
            };
        }
        if !read(dir).iter().any(|e| e.name == DEMO && alive(e)) {
            return Err("the demo stopped before it added the device".into());
        }
        if start.elapsed() > ADD_TIMEOUT {
            return Err(format!(
                "the demo did not add {name} within {ADD_TIMEOUT:?} (see its output)"
            ));
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// A device an `--add-device` asked for, as the kept demo takes it: its name, and where to narrate and answer.
pub struct AddRequest {
    /// The device's name (already a valid device id).
    pub name: String,
    log: PathBuf,
    done: PathBuf,
}

impl AddRequest {
    /// One line of narration, for the demo's output and the asking shell.
    pub fn say(&self, line: &str) {
        println!("   {line}");
        let ok = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .and_then(|mut f| writeln!(f, "   {line}"));
        if let Err(e) = ok {
            eprintln!("cannot write {}: {e}", self.log.display());
        }
    }

    /// The outcome: `Ok` or the reason it failed.
    pub fn finish(self, outcome: Result<(), String>) {
        let text = match outcome {
            Ok(()) => "ok".to_string(),
            Err(why) => why,
        };
        if let Err(e) = fs::write(&self.done, text) {
            eprintln!("cannot write {}: {e}", self.done.display());
        }
    }
}

/// The add requests waiting in `dir` (each taken once: its `.add` file is removed).
pub fn take_add_requests(dir: &Path) -> Vec<AddRequest> {
    let req = requests(dir);
    let Ok(entries) = fs::read_dir(&req) else {
        return vec![];
    };
    let mut out = vec![];
    for e in entries.flatten() {
        let path = e.path();
        let Some(name) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".add"))
            .map(str::to_string)
        else {
            continue;
        };
        if fs::remove_file(&path).is_err() {
            continue;
        }
        let r = AddRequest {
            log: req.join(format!("{name}.log")),
            done: req.join(format!("{name}.done")),
            name,
        };
        if let Err(e) = fleet_wire::DeviceId::try_from(r.name.as_str()) {
            r.finish(Err(e.to_string()));
            continue;
        }
        out.push(r);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lines_and_skips_bad_ones() {
        let got = parse("12 345 fleet-demo\nnot a line\n13 x nats\n14 99 nats-server\n");
        assert_eq!(
            got,
            vec![
                Entry {
                    pid: 12,
                    start: 345,
                    name: "fleet-demo".into()
                },
                Entry {
                    pid: 14,
                    start: 99,
                    name: "nats-server".into()
                },
            ]
        );
    }

    #[test]
    fn shell_enters_the_current_init_below_a_recorded_guest_and_names_the_others() {
        let dir = tempfile::tempdir().unwrap();
        // A guest's shape: a wrapper loop that starts an init in a PID namespace of its own again and again (a
        // guest that reboots every 2 s).
        let wrapper = fleet_rig::nspawn::guest_like_wrapper(2);
        let w = wrapper.0.id();
        let me = std::process::id();
        let (ws, ms) = (start_time(w).unwrap(), start_time(me).unwrap());
        fs::write(
            dir.path().join("pids"),
            format!("{w} {ws} guest-pi-1\n{me} {} guest-pi-gone\n", ms + 1),
        )
        .unwrap();
        let target = |cmd: &Command| -> u32 {
            assert_eq!(cmd.get_program(), "nsenter");
            let args: Vec<String> = cmd
                .get_args()
                .map(|a| a.to_string_lossy().into_owned())
                .collect();
            assert_eq!(args[2..], ["-a", "--", "/bin/bash", "-l"]);
            args[1].parse().unwrap()
        };
        let first = target(&shell(dir.path(), "pi-1").expect("a shell"));
        assert_ne!(first, w, "the wrapper itself is not the guest");
        // After the guest's "reboot" the shell enters the new init, and the guest still counts as running.
        let next = fleet_rig::wait_for(Duration::from_secs(10), || {
            let p = target(&shell(dir.path(), "pi-1").ok()?);
            (p != first).then_some(p)
        });
        assert!(next.is_some(), "the shell did not follow the reboot");
        assert_eq!(
            shell(dir.path(), "pi-gone").err().as_deref(),
            Some("no running demo device pi-gone; running: pi-1")
        );
        assert_eq!(dead(dir.path()), vec![("guest-pi-gone".to_string(), me)]);
    }

    #[test]
    fn add_requests_are_taken_once_and_a_bad_name_is_answered() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            add_device(dir.path(), "trial-1").err().as_deref(),
            Some("no demo is running: start one with `scripts/demo --keep` and add the device from another shell")
        );
        let req = requests(dir.path());
        fs::create_dir_all(&req).unwrap();
        fs::write(req.join("trial-1.add"), "").unwrap();
        fs::write(req.join("Bad_Name.add"), "").unwrap();
        let taken = take_add_requests(dir.path());
        let names: Vec<&str> = taken.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["trial-1"]);
        assert!(fs::read_to_string(req.join("Bad_Name.done"))
            .unwrap()
            .contains("invalid device id"));
        assert!(take_add_requests(dir.path()).is_empty(), "taken twice");
        let r = taken.into_iter().next().unwrap();
        r.say("step one");
        r.finish(Ok(()));
        assert_eq!(
            fs::read_to_string(req.join("trial-1.log")).unwrap(),
            "   step one\n"
        );
        assert_eq!(fs::read_to_string(req.join("trial-1.done")).unwrap(), "ok");
    }

    #[test]
    fn this_process_is_alive_and_a_wrong_start_time_is_not() {
        let me = std::process::id();
        let start = start_time(me).expect("own start time");
        let e = Entry {
            pid: me,
            start,
            name: "x".into(),
        };
        assert!(alive(&e));
        assert!(!alive(&Entry {
            start: start + 1,
            ..e
        }));
    }
}
