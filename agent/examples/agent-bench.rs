//! Benchmark driver for `scripts/bench.d/40-agent.sh`. With the production intervals, a real nats-server, real
//! rootful Podman and the real `fleet-updater` beside the agent, it prints Markdown tables of:
//! idle RSS, CPU time and wake-ups per idle minute with 10 workloads (agent, updater, nats-server side by side),
//! and again once 5 of the 10 have health checks the agent runs (3 HTTP and 2 TCP probes against the published
//! host ports, where the bench's own server stands in for the containers', which have no network in this rig),
//! and, for information, with 2 of the 5 command checks instead, which the agent runs through Podman's API as
//! this Podman has no systemd for its own timer (every check at the default 30-s interval, or
//! `FLEET_BENCH_HEALTH_INTERVAL` seconds);
//! desired-state put → container running with the step breakdown from the agent's timing marks
//! (`fleet_agent::timing`), with 10 and with 50 unchanged workloads present, against `podman run -d` of the same
//! image and command in the same run (median of 5); the same with a private image (a registry with htpasswd auth
//! over TLS, its credentials delivered in `device-secrets`; each change pulls a new tag) against
//! `podman run -d --authfile` (after `podman login`) of a new tag of the same image; and 50 workloads placed at once against fifty sequential
//! `podman run -d`. Needs `FLEET_AGENT_BIN` and `FLEET_UPDATER_BIN` (release builds) and the parts of the
//! integration tests. `FLEET_BENCH_IDLE_SECS` sets the idle window (default 60).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use fleet_rig::nats_client as nats;
#[path = "../tests/common/mod.rs"]
mod common;
use common::*;
use fleet_agent::podman::Podman;
use fleet_rig::registry::Registry;
use fleet_rig::tls::TestCa;
use fleet_wire::secrets::{DeviceSecrets, Hidden, RegistryAuth};
use fleet_wire::{
    kv, DesiredState, DeviceId, DeviceWorkloadStatus, HealthCheck, HealthProbe, HealthState,
    HttpProbe, PortMapping, Protocol, TcpProbe, WorkloadName, WorkloadSpec,
};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const RUNS: usize = 5;
/// The private registry's user and password (the bench's own; delivered to the agent in `device-secrets`).
const PRIVATE_USER: &str = "bench";
const PRIVATE_PASSWORD: &str = "bench-Pa55word";
/// The private image's repository.
const PRIVATE_REPO: &str = "bench/app";

fn workload(name: &str) -> WorkloadSpec {
    let mut w = WorkloadSpec::new(WorkloadName::try_from(name).unwrap(), IMAGE).unwrap();
    w.command = vec!["sleep".into(), "100000".into()];
    w
}

/// `workload(name)` with a health check of `kind` (`http`, `tcp` or `command`) every `interval` seconds (timeout
/// 2 s); an HTTP or TCP probe targets container port 80, published as `host_port`.
fn checked(name: &str, kind: &str, host_port: u16, interval: u32) -> WorkloadSpec {
    let mut w = workload(name);
    let probe = match kind {
        "http" => HealthProbe::Http(HttpProbe {
            port: 80,
            path: "/healthz".into(),
        }),
        "tcp" => HealthProbe::Tcp(TcpProbe { port: 80 }),
        _ => HealthProbe::Command(vec!["true".into()]),
    };
    if kind != "command" {
        w.ports = vec![PortMapping {
            host_port,
            container_port: 80,
            protocol: Protocol::Tcp,
        }];
    }
    w.health_check = Some(HealthCheck {
        interval_seconds: interval,
        timeout_seconds: 2,
        ..HealthCheck::new(probe)
    });
    w.validate().unwrap();
    w
}

/// An HTTP server on a free port of 127.0.0.1 answering `200 OK` to everything: what a checked container would
/// serve at its published port (this rig's containers have no network).
fn stand_in_server() -> u16 {
    use std::io::{Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { continue };
            let _ = c.set_read_timeout(Some(Duration::from_secs(2)));
            let mut req = [0u8; 1024];
            let _ = c.read(&mut req);
            let _ = c.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
        }
    });
    port
}

/// What one idle window measured.
struct Idle {
    rss_kib: u64,
    window: f64,
    before: Vec<Sample>,
    after: Vec<Sample>,
    threads_before: std::collections::BTreeMap<String, u64>,
    threads_after: std::collections::BTreeMap<String, u64>,
}

/// Lets the agent settle 5 s, takes its RSS, then samples `pids` over `secs` of idling.
fn idle(agent_pid: u32, pids: &[(&str, u32)], secs: u64) -> Idle {
    std::thread::sleep(Duration::from_secs(5));
    let rss_kib = rss_kib(agent_pid);
    let before: Vec<Sample> = pids.iter().map(|(_, pid)| sample(*pid)).collect();
    let threads_before = per_thread(agent_pid);
    let t = Instant::now();
    std::thread::sleep(Duration::from_secs(secs));
    let window = t.elapsed().as_secs_f64();
    Idle {
        rss_kib,
        window,
        after: pids.iter().map(|(_, pid)| sample(*pid)).collect(),
        before,
        threads_before,
        threads_after: per_thread(agent_pid),
    }
}

/// The idle table (daemon rows named with `suffix`) and the agent's per-thread table.
fn print_idle(title: &str, names: &[&str], suffix: &str, i: &Idle) {
    println!();
    println!("{title}, production intervals, over {:.0} s (wake-ups = voluntary + involuntary context switches of every thread; CPU from schedstat)", i.window);
    println!();
    println!("| daemon | threads | CPU time per idle minute | wake-ups per minute (of which preempted) | wake-ups per second (goal ≤ 1) |");
    println!("|---|---|---|---|---|");
    let per_min = 60.0 / i.window;
    for ((name, a), z) in names.iter().zip(&i.before).zip(&i.after) {
        let cpu = (z.cpu_ns - a.cpu_ns) as f64 / 1e6 * per_min;
        let wakes = (z.switches - a.switches) as f64 * per_min;
        let preempted = (z.preempted - a.preempted) as f64 * per_min;
        println!(
            "| {name}{suffix} | {} | {cpu:.1} ms | {wakes:.0} ({preempted:.0}) | {:.2} |",
            z.threads,
            wakes / 60.0
        );
    }
    println!();
    println!("fleet-agent's idle wake-ups per minute by thread{suffix}");
    println!();
    println!("| thread | wake-ups per minute |");
    println!("|---|---|");
    for (name, n) in &i.threads_after {
        let was = i.threads_before.get(name).copied().unwrap_or(0);
        println!("| {name} | {:.0} |", n.saturating_sub(was) as f64 * per_min);
    }
}

fn names(prefix: &str, n: usize) -> Vec<WorkloadSpec> {
    (0..n).map(|i| workload(&format!("{prefix}{i}"))).collect()
}

fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64
}

fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// CPU time (ns, from each thread's schedstat) and context switches (voluntary + involuntary, every thread's
/// status) of a process. Threads that exited during the window are not counted (none do while idle).
#[derive(Clone, Copy, Default)]
struct Sample {
    cpu_ns: u64,
    switches: u64,
    /// Of `switches`, the involuntary ones (preempted by another task: load on the machine, not a wake-up).
    preempted: u64,
    threads: usize,
}

fn sample(pid: u32) -> Sample {
    let mut s = Sample::default();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return s;
    };
    for t in tasks.flatten() {
        let one = sample_task(&t.path());
        s.threads += 1;
        s.cpu_ns += one.cpu_ns;
        s.switches += one.switches;
        s.preempted += one.preempted;
    }
    s
}

/// One thread's CPU time and context switches.
fn sample_task(dir: &Path) -> Sample {
    let mut s = Sample::default();
    if let Ok(text) = std::fs::read_to_string(dir.join("schedstat")) {
        s.cpu_ns = text
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
    }
    let status = std::fs::read_to_string(dir.join("status")).unwrap_or_default();
    for l in status.lines() {
        let n = || {
            l.split_whitespace()
                .nth(1)
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        if l.starts_with("voluntary_ctxt_switches:") {
            s.switches += n();
        } else if l.starts_with("nonvoluntary_ctxt_switches:") {
            s.switches += n();
            s.preempted += n();
        }
    }
    s
}

/// Context switches per thread name (threads of one name summed).
fn per_thread(pid: u32) -> std::collections::BTreeMap<String, u64> {
    let mut out = std::collections::BTreeMap::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        let one = sample_task(&t.path());
        *out.entry(name.trim().to_owned()).or_insert(0) += one.switches;
    }
    out
}

fn median_us(mut v: Vec<i64>) -> i64 {
    v.sort();
    v[v.len() / 2]
}

fn ms(us: i64) -> String {
    format!("{:.0} ms", us as f64 / 1000.0)
}

fn ms1(us: i64) -> String {
    format!("{:.1} ms", us as f64 / 1000.0)
}

/// One timing mark of the agent: step, key text, wall-clock µs.
struct Mark {
    step: String,
    key: String,
    us: i64,
}

fn marks(log: &Path) -> Vec<Mark> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let rest = l.split("] mark ").nth(1)?;
            let (head, us) = rest.rsplit_once(" unix_us=")?;
            let (step, key) = head.split_once(' ')?;
            Some(Mark {
                step: step.to_owned(),
                key: key.to_owned(),
                us: us.trim().parse().ok()?,
            })
        })
        .collect()
}

/// The first mark of `step` whose key contains `key` at or after `after` µs.
fn first(marks: &[Mark], step: &str, key: &str, after: i64) -> Option<i64> {
    marks
        .iter()
        .filter(|m| m.step == step && m.key.split(' ').any(|k| k == key) && m.us >= after)
        .map(|m| m.us)
        .min()
}

/// One measured desired-state change: put time, acknowledgement, revision, the workload it adds.
struct Change {
    put: i64,
    acked: i64,
    rev: u64,
    workload: String,
}

/// The steps of the breakdown, each as (row label, the step mark that ends it, the key it is matched on).
const STEPS: [(&str, &str); 7] = [
    ("KV put acknowledged by JetStream", "acked"),
    ("watch delivery (put → agent's subscription)", "delivered"),
    ("revision read (direct get)", "read"),
    ("decode and validate", "decoded"),
    ("reconcile decision (observe containers, plan)", "decided"),
    ("libpod create (resolves the image)", "created"),
    ("libpod start → running", "started"),
];

/// The steps of a change whose image is pulled: the pull (the device-secrets read and the libpod pull with
/// the credentials) is its own step before the create.
const PULL_STEPS: [(&str, &str); 8] = [
    STEPS[0],
    STEPS[1],
    STEPS[2],
    STEPS[3],
    STEPS[4],
    (
        "image pull (device-secrets read, libpod pull with X-Registry-Auth)",
        "pulled",
    ),
    ("libpod create", "created"),
    STEPS[6],
];

/// Per-step durations of each change (µs), in `table` order ([`STEPS`] or [`PULL_STEPS`]), and the total put →
/// started.
fn breakdown(m: &[Mark], changes: &[Change], table: &[(&str, &str)]) -> (Vec<Vec<i64>>, Vec<i64>) {
    let mut steps = vec![Vec::new(); table.len()];
    let mut totals = Vec::new();
    for c in changes {
        let rev = format!("rev={}", c.rev);
        let w = format!("workload={}", c.workload);
        let bucket = format!("bucket={}", kv::DESIRED_STATE);
        let at: Vec<Option<i64>> = table
            .iter()
            .map(|(_, step)| match *step {
                "acked" => Some(c.acked),
                "delivered" => first(m, step, &bucket, c.put),
                "read" | "decoded" => first(m, step, &rev, c.put),
                _ => first(m, step, &w, c.put),
            })
            .collect();
        let at: Vec<i64> = at
            .iter()
            .zip(table)
            .map(|(t, (_, step))| {
                t.unwrap_or_else(|| {
                    let seen: Vec<String> = m
                        .iter()
                        .filter(|m| m.us >= c.put)
                        .take(20)
                        .map(|m| format!("{} {} {}", m.step, m.key, m.us - c.put))
                        .collect();
                    panic!(
                        "timing mark {step} is missing for {} (rev {}); marks after its put: {seen:?}",
                        c.workload, c.rev
                    )
                })
            })
            .collect();
        // The watch delivery is measured from the put; later steps from the previous mark (the ack is a side
        // branch: the agent's delivery does not wait for it).
        steps[0].push(at[0] - c.put);
        steps[1].push(at[1] - c.put);
        for i in 2..at.len() {
            steps[i].push(at[i] - at[i - 1]);
        }
        totals.push(at[at.len() - 1] - c.put);
    }
    (steps, totals)
}

struct Bench {
    rig: Rig,
    api: Podman,
    store: nats::kv::Store,
    generation: u64,
}

impl Bench {
    fn put(&mut self, ws: &[WorkloadSpec]) -> Change {
        self.generation += 1;
        let d = DesiredState::new(
            DeviceId::try_from(DEVICE).unwrap(),
            self.generation,
            ws.to_vec(),
        )
        .unwrap();
        let bytes = serde_json::to_vec(&d).unwrap();
        let put = now_us();
        let rev = self.store.put(DEVICE, bytes).unwrap();
        let acked = now_us();
        Change {
            put,
            acked,
            rev,
            workload: ws
                .last()
                .map(|w| w.name.as_str().to_owned())
                .unwrap_or_default(),
        }
    }

    fn running(&self) -> Vec<String> {
        self.api
            .list_managed()
            .unwrap_or_default()
            .into_iter()
            .filter(|o| o.state == "running")
            .map(|o| o.name)
            .collect()
    }

    fn wait_running(&self, agent: &Agent, want: &[WorkloadSpec]) {
        eventually(agent, Duration::from_secs(300), "workloads running", || {
            let r = self.running();
            want.iter()
                .all(|w| r.contains(&w.name.container_name()))
                .then_some(())
        });
    }

    /// `podman run -d` of the bench image and command; its wall time in µs.
    fn podman_run(&self, name: &str) -> i64 {
        let p = self.rig.podman.as_ref().unwrap();
        let t = Instant::now();
        p.podman(&["run", "-d", "--name", name, IMAGE, "sleep", "100000"]);
        t.elapsed().as_micros() as i64
    }

    /// `podman run -d --authfile` of `image` (a tag not present: it is pulled with the credentials `podman login`
    /// stored in `authfile`: Podman 4.3's `run` has no `--creds`); its wall time in µs.
    fn podman_run_private(&self, name: &str, image: &str, authfile: &Path) -> i64 {
        let p = self.rig.podman.as_ref().unwrap();
        let authfile = authfile.to_string_lossy();
        let t = Instant::now();
        p.podman(&[
            "run",
            "-d",
            "--authfile",
            &authfile,
            "--name",
            name,
            image,
            "sleep",
            "100000",
        ]);
        t.elapsed().as_micros() as i64
    }

    /// A registry with htpasswd auth over TLS that this Podman trusts, the credentials delivered to the agent
    /// in `device-secrets`, and the image's layer already present (as on a device that ran an earlier version):
    /// each measured pull, the agent's and `podman run`'s alike, fetches a new tag's manifest with credentials.
    fn private_registry(&self) -> (TestCa, Registry, PathBuf) {
        let ca = TestCa::new();
        let reg = Registry::start_with_htpasswd(&ca, PRIVATE_USER, PRIVATE_PASSWORD);
        let host = reg.host();
        let p = self.rig.podman.as_ref().unwrap();
        p.trust_registry(&host, ca.ca_file());
        let nc = self.rig.nc();
        fleet_rig::nats_client::create_buckets(&nc, &[kv::DEVICE_SECRETS]);
        let secrets = DeviceSecrets {
            device_id: DeviceId::try_from(DEVICE).unwrap(),
            registries: [(
                host.clone(),
                RegistryAuth {
                    username: PRIVATE_USER.into(),
                    password: Hidden(PRIVATE_PASSWORD.into()),
                },
            )]
            .into(),
            values: Vec::new(),
        };
        common::store(&nc, kv::DEVICE_SECRETS)
            .put(DEVICE, serde_json::to_vec(&secrets).unwrap())
            .unwrap();
        reg.push_busybox(PRIVATE_REPO, "warm");
        let authfile = self.rig.root.path().join("bench-auth.json");
        let authfile_arg = authfile.to_string_lossy();
        p.podman(&[
            "login",
            "--authfile",
            &authfile_arg,
            "-u",
            PRIVATE_USER,
            "-p",
            PRIVATE_PASSWORD,
            &host,
        ]);
        p.podman(&[
            "pull",
            "--authfile",
            &authfile_arg,
            &format!("{host}/{PRIVATE_REPO}:warm"),
        ]);
        (ca, reg, authfile)
    }

    /// Five changes that each add one workload of a new tag of the private image to `ws`, each followed by a
    /// `podman run -d --authfile` (after `podman login`) of another new tag.
    fn private_changes(
        &mut self,
        agent: &Agent,
        ws: &mut Vec<WorkloadSpec>,
        reg: &Registry,
        authfile: &Path,
        tag: &str,
    ) -> Vec<(Change, i64)> {
        let host = reg.host();
        let mut out = Vec::new();
        let mut plain = Vec::new();
        for i in 0..RUNS {
            reg.push_busybox(PRIVATE_REPO, &format!("{tag}{i}"));
            reg.push_busybox(PRIVATE_REPO, &format!("plain-{tag}{i}"));
            let mut w = workload(&format!("{tag}{i}"));
            w.image = format!("{host}/{PRIVATE_REPO}:{tag}{i}");
            ws.push(w);
            let c = self.put(ws);
            self.wait_running(agent, &ws[ws.len() - 1..]);
            settle();
            let name = format!("plain-{tag}{i}");
            let image = format!("{host}/{PRIVATE_REPO}:plain-{tag}{i}");
            let p = self.podman_run_private(&name, &image, authfile);
            plain.push(name);
            settle();
            out.push((c, p));
        }
        self.podman_rm(&plain);
        out
    }

    fn podman_rm(&self, names: &[String]) {
        let p = self.rig.podman.as_ref().unwrap();
        let mut args = vec!["rm", "-f", "-t", "0"];
        args.extend(names.iter().map(String::as_str));
        p.podman(&args);
    }

    /// Five changes that each add one workload to `ws`, each followed by a `podman run -d`.
    fn changes(
        &mut self,
        agent: &Agent,
        ws: &mut Vec<WorkloadSpec>,
        tag: &str,
    ) -> Vec<(Change, i64)> {
        let mut out = Vec::new();
        let mut plain = Vec::new();
        for i in 0..RUNS {
            ws.push(workload(&format!("{tag}{i}")));
            let c = self.put(ws);
            self.wait_running(agent, &ws[ws.len() - 1..]);
            settle();
            let name = format!("plain-{tag}{i}");
            let p = self.podman_run(&name);
            plain.push(name);
            settle();
            out.push((c, p));
        }
        self.podman_rm(&plain);
        out
    }
}

/// Lets the agent's trailing status publication finish so that measurements do not overlap.
fn settle() {
    std::thread::sleep(Duration::from_millis(400));
}

/// The updater child, killed on drop (also when the bench panics).
struct Updater(Child);

impl Drop for Updater {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_updater(dir: &Path) -> (Updater, PathBuf) {
    let bin = std::env::var_os("FLEET_UPDATER_BIN")
        .map(PathBuf::from)
        .expect("FLEET_UPDATER_BIN (the release fleet-updater) must be set");
    let root = dir.join("updater-root");
    std::fs::create_dir_all(&root).unwrap();
    let cfg = dir.join("updater.toml");
    std::fs::write(&cfg, format!("root = \"{}\"\n", root.display())).unwrap();
    let child = Command::new(bin)
        .arg("--config")
        .arg(&cfg)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("updater.log")).unwrap())
        .spawn()
        .expect("spawn fleet-updater");
    let child = Updater(child);
    let sock = root.join("run/fleet-updater/updater.sock");
    fleet_rig::wait_for(Duration::from_secs(10), || sock.exists().then_some(()))
        .expect("fleet-updater did not open its socket");
    (child, sock)
}

fn print_breakdown(
    title: &str,
    reference: &str,
    results: &[(Change, i64)],
    m: &[Mark],
    table: &[(&str, &str)],
) -> (i64, i64) {
    let changes: Vec<Change> = results
        .iter()
        .map(|(c, _)| Change {
            put: c.put,
            acked: c.acked,
            rev: c.rev,
            workload: c.workload.clone(),
        })
        .collect();
    let (steps, totals) = breakdown(m, &changes, table);
    let podman = median_us(results.iter().map(|(_, p)| *p).collect());
    let total = median_us(totals);
    println!();
    println!("{title} (median of {RUNS}; each step from the previous mark)");
    println!();
    println!("| step | median |");
    println!("|---|---|");
    for ((label, _), v) in table.iter().zip(steps) {
        println!("| {label} | {} |", ms1(median_us(v)));
    }
    println!("| **put → running (fleet-agent)** | **{}** |", ms(total));
    println!("| {reference} (same run) | {} |", ms(podman));
    println!(
        "| ratio (goal ≤ 1.2×) | {:.2}× |",
        total as f64 / podman as f64
    );
    (total, podman)
}

fn main() {
    let rig = Rig::new(true, "");
    let dir = tempfile::Builder::new()
        .prefix("fleet-agent-bench-")
        .tempdir()
        .unwrap();
    let (updater, usock) = start_updater(dir.path());
    let p = rig.podman.as_ref().unwrap();
    // Production intervals (heartbeat and status 30 s, resync 60 s, updater poll 2 s while an upgrade is active);
    // stop time-out 0 so that the bench's removals do not wait for busybox's ignored SIGTERM.
    let config = format!(
        "device_id = \"{DEVICE}\"\nroot = \"{}\"\n[nats]\nurls = [\"{}\"]\nconnect_timeout_secs = 2\nretry_window_secs = 120\n[podman]\nsocket = \"{}\"\nstop_timeout_secs = 0\n[updater]\nsocket = \"{}\"\n",
        rig.root.path().display(),
        rig.nats.url(),
        p.socket().display(),
        usock.display()
    );
    std::fs::write(&rig.config, config).unwrap();
    let api = Podman::new(&p.socket(), Duration::from_secs(0));
    let store = store(&rig.nc(), kv::DESIRED_STATE);
    let config_path = rig.config.clone();
    let root = rig.root.path().to_owned();
    let mut b = Bench {
        rig,
        api,
        store,
        generation: 0,
    };

    // Ten workloads, then idle.
    let mut ws = names("w", 10);
    b.put(&ws);
    let mut agent = Agent::spawn_logging(&config_path, &root, "info,fleet_agent::timing=debug");
    agent.wait_ready();
    b.wait_running(&agent, &ws);
    let idle_secs: u64 = std::env::var("FLEET_BENCH_IDLE_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let pids = [
        ("fleet-agent", agent.child.id()),
        ("fleet-updater", updater.0.id()),
        ("nats-server (reference)", b.rig.nats.pid().unwrap()),
    ];
    let plain_idle = idle(agent.child.id(), &pids, idle_secs);

    // Five of them get health checks (a new spec each: replaced), all healthy, then idle again: first every check
    // one the agent runs on a device (HTTP, TCP), then with two command checks, which this Podman (no systemd)
    // leaves to the agent, through its API; on a device Podman's own timer runs those.
    let interval: u32 = std::env::var("FLEET_BENCH_HEALTH_INTERVAL")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(fleet_wire::health::HEALTH_INTERVAL_DEFAULT_SECS);
    let mut checked_idle = Vec::new();
    for kinds in [
        ["http", "http", "http", "tcp", "tcp"],
        ["http", "http", "tcp", "command", "command"],
    ] {
        for (i, kind) in kinds.into_iter().enumerate() {
            let port = if kind == "command" {
                0
            } else {
                stand_in_server()
            };
            ws[i] = checked(&format!("w{i}"), kind, port, interval);
        }
        b.put(&ws);
        let statuses = common::store(&b.rig.nc(), kv::WORKLOAD_STATUS);
        eventually(
            &agent,
            Duration::from_secs(180),
            "five health-checked workloads healthy",
            || {
                let s: DeviceWorkloadStatus = get_json(&statuses, DEVICE)?;
                let healthy = s
                    .workloads
                    .iter()
                    .filter(|w| w.health == Some(HealthState::Healthy))
                    .count();
                (s.generation == b.generation && healthy == 5).then_some(())
            },
        );
        checked_idle.push(idle(agent.child.id(), &pids, idle_secs));
    }

    // One change at a time with 10 unchanged workloads present.
    let ten = b.changes(&agent, &mut ws, "a");

    // The same with a private image, with 15 unchanged workloads present (the ten and the five just added).
    let (_ca, reg, authfile) = b.private_registry();
    let private = b.private_changes(&agent, &mut ws, &reg, &authfile, "p");
    let private_log = agent.log_text();
    assert!(
        !private_log.contains(PRIVATE_PASSWORD),
        "the registry password is in the agent's log"
    );

    // Fifty at once on a device without workloads, against fifty sequential `podman run -d`.
    b.put(&[]);
    eventually(&agent, Duration::from_secs(300), "no workloads", || {
        b.api
            .list_managed()
            .unwrap_or_default()
            .is_empty()
            .then_some(())
    });
    settle();
    let mut ws = names("b", 50);
    let c = b.put(&ws);
    b.wait_running(&agent, &ws);
    let m = marks(&agent.log);
    let fifty_agent = ws
        .iter()
        .map(|w| {
            first(
                &m,
                "started",
                &format!("workload={}", w.name.as_str()),
                c.put,
            )
            .unwrap()
        })
        .max()
        .unwrap()
        - c.put;
    settle();
    let plain: Vec<String> = (0..50).map(|i| format!("plain-seq{i}")).collect();
    let t = Instant::now();
    for n in &plain {
        b.podman_run(n);
    }
    let fifty_podman = t.elapsed().as_micros() as i64;
    b.podman_rm(&plain);
    settle();

    // One change at a time with 50 unchanged workloads present.
    let fifty = b.changes(&agent, &mut ws, "c");

    let m = marks(&agent.log);
    let size = std::fs::metadata(agent_bin()).map(|m| m.len()).unwrap_or(0);
    let mib = |b: u64| format!("{:.2} MiB", b as f64 / 1048576.0);
    println!("| measure | fleet-agent | reference (same run) | goal |");
    println!("|---|---|---|---|");
    println!(
        "| idle RSS with 10 workloads | {} | — | ≤ 6 MiB |",
        mib(plain_idle.rss_kib * 1024)
    );
    println!(
        "| idle RSS with 10 workloads, 5 with health checks | {} | with 2 of the 5 command checks run through Podman's API: {} | ≤ 6 MiB |",
        mib(checked_idle[0].rss_kib * 1024),
        mib(checked_idle[1].rss_kib * 1024)
    );
    println!(
        "| stripped release binary ({}) | {} | — | ≤ 6 MiB (amd64) |",
        std::env::consts::ARCH,
        mib(size)
    );
    println!(
        "| 50 workloads placed at once → all running | {} | fifty sequential `podman run -d`: {} ({:.2}×) | ≤ 1.2× |",
        ms(fifty_agent),
        ms(fifty_podman),
        fifty_agent as f64 / fifty_podman as f64
    );
    let names: Vec<&str> = pids.iter().map(|(n, _)| *n).collect();
    print_idle("Idle with 10 workloads", &names, "", &plain_idle);
    print_idle(
        &format!("Idle with 10 workloads of which 5 have health checks the agent runs (3 HTTP, 2 TCP probes, every {interval} s)"),
        &names,
        ", 5 health checks",
        &checked_idle[0],
    );
    print_idle(
        &format!("For information (no goal): idle with 10 workloads of which 5 have health checks, 2 of them command checks that the agent runs through Podman's API because this Podman has no systemd for its own timer (on a device the timer runs them), 2 HTTP and 1 TCP probe; every {interval} s"),
        &names,
        ", 5 health checks, 2 through Podman's API",
        &checked_idle[1],
    );
    print_breakdown(
        "Desired-state put → container running with 10 unchanged workloads present",
        "`podman run -d`",
        &ten,
        &m,
        &STEPS,
    );
    print_breakdown(
        "Desired-state put → container running with 50 unchanged workloads present",
        "`podman run -d`",
        &fifty,
        &m,
        &STEPS,
    );
    print_breakdown(
        "Desired-state put → container running of a private image (a new tag pulled from a registry with htpasswd auth over TLS, credentials from device-secrets; the layer already present) with 15 unchanged workloads present",
        "`podman run -d --authfile` (after `podman login`) of a new tag",
        &private,
        &m,
        &PULL_STEPS,
    );
    agent.sigterm();
    let _ = agent.wait_exit(Duration::from_secs(120));
}
