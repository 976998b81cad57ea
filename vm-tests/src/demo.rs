//! The demo's story (`scripts/demo`): a local fleet of three Debian devices driven by the real operator, told
//! with the kubectl commands a person would type. Every table is read back from the cluster (kubectl) and from
//! the devices themselves (Podman, the active symlink, the boot id), never echoed from what was asked for. In the
//! staged rollouts and the TaskRun every Device's `status.blocking` is read at each poll and must be what the state
//! the fleet is in implies (`Walk`); the Waiting column (`kubectl get fdev -o wide`) is printed once per state.

use crate::builds::{V1, V2, V3};
use crate::demo_state::{self, Record};
use crate::fleet::Device;
use crate::fleetlock::FleetLockServer;
use crate::local_fleet::{
    crash_looping_deployment_yaml, deployment_yaml, group_yaml, kebab, release_yaml, taskrun_yaml,
    DeviceView, LocalFleet, TaskRunView,
};
use crate::tasks::{
    installed, ready_for_reboot_upgrade, HolderWatch, RebootUpgradeReady, Tasks, REBOOT_PKG,
};
use fleet_rig::callout::{self, NatsAuth, NatsTransport};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The demo's devices; the first is the canary.
pub const DEVICES: [&str; 3] = ["demo-1", "demo-2", "demo-3"];
/// How long the demo waits for a whole-fleet upgrade to end.
const UPGRADE_TIMEOUT: Duration = Duration::from_secs(420);
/// How often the timeline asks the cluster.
const TIMELINE_POLL: Duration = Duration::from_millis(700);
/// The demo's TaskRun (namespace `default`).
const TASK: &str = "system-upgrade";
/// The TaskRun's `deadlineSeconds`.
const TASK_DEADLINE_SECS: u64 = 3600;

/// Why the story stopped early.
#[derive(Debug)]
pub enum Stop {
    /// Ctrl-C or SIGTERM.
    Interrupted,
    /// Something did not happen in time; the message says what.
    Failed(String),
}

/// The story's context: the fleet, where manifests go, and the stop flag.
pub struct Demo<'a> {
    fleet: LocalFleet,
    fleetlock: FleetLockServer,
    manifests: PathBuf,
    stop: &'a AtomicBool,
    boot_ids: BTreeMap<String, String>,
    /// Each device's apt repository and FleetLock relay, for step 6.
    _ready: Vec<RebootUpgradeReady>,
}

fn step(n: usize, text: &str) {
    println!("\n== {n}/6 {text}");
}

fn table(header: &[&str], rows: &[Vec<String>]) {
    let mut width: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            width[i] = width[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let padded: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<w$}", w = width[i]))
            .collect();
        println!("   | {} |", padded.join(" | "));
    };
    line(header.iter().map(|h| h.to_string()).collect());
    line(width.iter().map(|w| "-".repeat(*w)).collect());
    for r in rows {
        line(r.clone());
    }
}

/// One device's `status.blocking` as (kind, message) pairs, as [`crate::cluster::Cluster::blocking`] reads them.
type Reasons = [(String, String)];

/// `shows(device, reasons)` of a [`Step`].
type Shows<'s> = Box<dyn Fn(&str, &Reasons) -> bool + 's>;

/// What a Device with no `status.blocking` entry shows in the Waiting column.
const NOTHING: &str = "<none>";

/// What a halted release's other devices say after the why.
const RESUME: &str = "no device gets it until a person acts; to resume, change its spec (a new generation) or set the annotation fleet.nationtech.io/retry=<new value> on it";

/// How a step of a [`Walk`] must be seen.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Seen {
    /// A step the fleet may pass through.
    Maybe,
    /// Every device must show it at some read; printed as each showed it first (a step too short for one read
    /// of all Devices to be sure to catch it: the canary's agent update takes under a second).
    Each,
    /// One read must find every device showing it; printed as that read found them.
    Together,
}

/// One step of a staged rollout as every Device's `status.blocking` shows it: `shows(device, reasons)` holds when
/// `reasons` is exactly what `device` shows at this step.
struct Step<'s> {
    what: String,
    seen: Seen,
    shows: Shows<'s>,
}

impl<'s> Step<'s> {
    fn new(what: &str, seen: Seen, shows: impl Fn(&str, &Reasons) -> bool + 's) -> Self {
        Self {
            what: what.into(),
            seen,
            shows: Box::new(shows),
        }
    }
}

/// Exactly one entry, of `kind`, whose message `message` accepts.
fn one(rs: &Reasons, kind: &str, message: impl Fn(&str) -> bool) -> bool {
    matches!(rs, [(k, m)] if k == kind && message(m))
}

/// Every change of one device's reasons, in order.
type History = Vec<Vec<(String, String)>>;

/// One device in a [`Walk`]: the step it is at, every change of its reasons, and what it first showed at each step.
#[derive(Debug, Default)]
struct Track {
    at: usize,
    history: History,
    first: BTreeMap<usize, Vec<(String, String)>>,
}

/// A staged rollout walked step by step: each device's reasons, read at every poll, must be the step it is at or a
/// later one; each step that is not [`Seen::Maybe`] is printed once seen (the Waiting column).
struct Walk<'s> {
    steps: Vec<Step<'s>>,
    at: BTreeMap<String, Track>,
    printed: Vec<bool>,
}

/// A table to print: what it shows, then (device, the Waiting column).
type Shown = (String, Vec<(String, String)>);

/// The Waiting column of one device: its first reason's message, or what kubectl shows for none.
fn column(rs: Option<&Vec<(String, String)>>) -> String {
    rs.and_then(|rs| rs.first())
        .map(|r| r.1.clone())
        .unwrap_or_else(|| NOTHING.into())
}

impl<'s> Walk<'s> {
    fn new(steps: Vec<Step<'s>>) -> Self {
        let printed = vec![false; steps.len()];
        Self {
            steps,
            at: BTreeMap::new(),
            printed,
        }
    }

    /// Checks `now` (every Device's reasons, one read) against the steps; returns the tables due now, in order
    /// (each marked printed).
    fn look(
        &mut self,
        now: &BTreeMap<String, Vec<(String, String)>>,
    ) -> Result<Vec<Shown>, String> {
        let none = vec![];
        let mut from = 0;
        for id in DEVICES {
            let rs = now.get(id).unwrap_or(&none);
            let Track {
                at,
                history: seen,
                first,
            } = self.at.entry(id.to_string()).or_default();
            if seen.last() != Some(rs) {
                seen.push(rs.clone());
            }
            match (*at..self.steps.len()).find(|i| (self.steps[*i].shows)(id, rs)) {
                Some(i) => {
                    *at = i;
                    first.entry(i).or_insert_with(|| rs.clone());
                }
                None => {
                    return Err(format!(
                        "{id}'s status.blocking is {rs:?}: not what the step it was at ({}) or a later one implies; \
                         all it showed: {seen:?}",
                        self.steps[*at].what
                    ))
                }
            }
            from = from.max(*at);
        }
        // The first step from the latest any device is at that every device shows in this read.
        let every = (from..self.steps.len()).find(|i| {
            DEVICES
                .iter()
                .all(|id| (self.steps[*i].shows)(id, now.get(*id).unwrap_or(&none)))
        });
        let mut due = vec![];
        // In order: a step this read finds on every device is printed from it; an `Each` step every device showed
        // once the fleet is past it, as each first showed it; a step every device went past unseen is an error.
        let behind = DEVICES
            .iter()
            .map(|id| self.at.get(*id).map_or(0, |t| t.at))
            .min()
            .unwrap_or(0);
        for i in 0..self.steps.len() {
            if self.printed[i] || self.steps[i].seen == Seen::Maybe {
                continue;
            }
            let each = DEVICES
                .iter()
                .map(|id| {
                    let first = self.at.get(*id)?.first.get(&i)?;
                    Some(((*id).to_owned(), column(Some(first))))
                })
                .collect::<Option<Vec<_>>>();
            let later = every.is_some_and(|e| e > i);
            if every == Some(i) {
                let rows = DEVICES
                    .iter()
                    .map(|id| (id.to_string(), column(now.get(*id))));
                due.push((self.steps[i].what.clone(), rows.collect()));
            } else if let (Seen::Each, Some(rows), true) =
                (self.steps[i].seen, each, later || i < behind)
            {
                due.push((self.steps[i].what.clone(), rows));
            } else if i < behind {
                return Err(format!(
                    "every device went past {:?}, not seen on {}: {:?}",
                    self.steps[i].what,
                    if self.steps[i].seen == Seen::Each {
                        "each device"
                    } else {
                        "every device at once"
                    },
                    self.at
                ));
            } else {
                break; // no later step is printed before this one
            }
            self.printed[i] = true;
        }
        Ok(due)
    }

    /// The steps to print not printed yet.
    fn missing(&self) -> Vec<&str> {
        self.steps
            .iter()
            .zip(&self.printed)
            .filter(|(s, p)| s.seen != Seen::Maybe && !**p)
            .map(|(s, _)| s.what.as_str())
            .collect()
    }
}

impl<'a> Demo<'a> {
    /// Brings up the fleet (every part the real binary), recording each process in `record`.
    pub fn start(dir: &Path, record: &Record, stop: &'a AtomicBool) -> Result<Self, Stop> {
        step(1, "starting the fleet: every part is the real binary");
        let t = Instant::now();
        let mut fleet = LocalFleet::start(&DEVICES);
        for (pid, name) in fleet
            .cluster
            .api
            .pids()
            .into_iter()
            .zip(["etcd", "kube-apiserver"])
        {
            record.add(pid, name);
        }
        if let Some(pid) = fleet.cluster.controller_manager_pid() {
            record.add(pid, "kube-controller-manager");
        }
        // fleetlock-server first: the operator's dashboard (its Reboots page) reads its status with a client token,
        // so the operator is started again with them.
        let fleetlock = FleetLockServer::start();
        if let Some(pid) = fleetlock.pid() {
            record.add(pid, "fleetlock-server");
        }
        fleetlock.show_on_dashboard(&fleet.cluster);
        if let Some(pid) = fleet.cluster.operator_pid() {
            record.add(pid, "fleet-operator");
        }
        if let Some(pid) = fleet.nats.pid() {
            record.add(pid, "nats-server");
        }
        if let Some(pid) = fleet.nats.auth_pid() {
            record.add(pid, "fleet-auth");
        }
        // Each guest's wrapper, which outlives the guest's reboots (its PID 1 does not): `scripts/demo --shell
        // <device>` enters the init below it, and --keep tells when a guest stopped for good.
        for d in &fleet.devices {
            if let Some(pid) = d.guest.wrapper_pid() {
                record.add(pid, &demo_state::guest_name(&d.id));
            }
        }
        // For step 6: fleetlock-server relayed into each guest for its reboots, and an apt repository whose upgrade
        // wants a reboot.
        let lock = &fleetlock;
        let ready: Vec<RebootUpgradeReady> = std::thread::scope(|s| {
            let handles: Vec<_> = fleet
                .devices
                .iter_mut()
                .map(|d| s.spawn(move || ready_for_reboot_upgrade(d, lock)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        });
        let kubeconfig = dir.join("kubeconfig");
        std::fs::copy(fleet.cluster.kubeconfig(), &kubeconfig)
            .map_err(|e| Stop::Failed(format!("copy the kubeconfig: {e}")))?;
        let manifests = dir.join("manifests");
        std::fs::create_dir_all(&manifests)
            .map_err(|e| Stop::Failed(format!("mkdir {}: {e}", manifests.display())))?;
        let pid = |p: Option<u32>| p.map(|p| p.to_string()).unwrap_or_else(|| "-".into());
        let api = fleet.cluster.api.pids();
        table(
            &["part", "where", "pid"],
            &[
                vec![
                    "etcd + kube-apiserver 1.20 (Debian source)".into(),
                    fleet.cluster.api.url(),
                    api.iter()
                        .map(u32::to_string)
                        .collect::<Vec<_>>()
                        .join(", "),
                ],
                vec![
                    format!(
                        "kube-controller-manager 1.20 ({}: owner references are collected)",
                        crate::controller_manager::CONTROLLERS
                    ),
                    "-".into(),
                    pid(fleet.cluster.controller_manager_pid()),
                ],
                vec![
                    "fleet-operator (service account harmony-fleet:fleet-operator)".into(),
                    "-".into(),
                    pid(fleet.cluster.operator_pid()),
                ],
                vec![
                    "its admission webhook (operator/deploy/webhook.yaml): refuses unknown fields and TaskRun spec edits".into(),
                    fleet.cluster.webhook_url().into(),
                    pid(fleet.cluster.operator_pid()),
                ],
                vec![
                    format!(
                        "nats-server (JetStream, {}, {})",
                        match fleet.nats.mode() {
                            NatsAuth::Callout => "auth callout: each device its own token",
                            NatsAuth::Off => "no credentials",
                        },
                        match fleet.nats.transport() {
                            NatsTransport::Tls => "TLS with a private CA",
                            NatsTransport::Plain => "plain TCP (FLEET_NATS_TLS=off)",
                        }
                    ),
                    fleet.nats.url(),
                    pid(fleet.nats.pid()),
                ],
                vec![
                    match fleet.nats.mode() {
                        NatsAuth::Callout => {
                            "fleet-auth (auth callout; JWKS of a local HTTPS Zitadel stand-in)".into()
                        }
                        NatsAuth::Off => format!("fleet-auth: off ({}=off)", callout::SWITCH),
                    },
                    "-".into(),
                    pid(fleet.nats.auth_pid()),
                ],
                vec![
                    "fleetlock-server (file store, clients send a bearer token)".into(),
                    format!("http://127.0.0.1:{}", fleetlock.port()),
                    pid(fleetlock.pid()),
                ],
                vec![
                    format!(
                        "{} Debian devices (systemd-nspawn, scripts/device-setup, agent {V1}, {REBOOT_PKG} 1.0)",
                        DEVICES.len()
                    ),
                    "10.213.x.2".into(),
                    "-".into(),
                ],
            ],
        );
        println!("   up in {:.1} s", t.elapsed().as_secs_f64());
        println!("\n   To follow along in another shell, copy:");
        println!(
            "     export KUBECONFIG={} PATH={}:$PATH",
            kubeconfig.display(),
            fleet
                .cluster
                .kubectl_bin()
                .parent()
                .map(|p| p.display().to_string())
                .unwrap_or_default()
        );
        let boot_ids = fleet
            .devices
            .iter()
            .map(|d| (d.id.clone(), d.guest.boot_id()))
            .collect();
        Ok(Self {
            fleet,
            fleetlock,
            manifests,
            stop,
            boot_ids,
            _ready: ready,
        })
    }

    fn check(&self) -> Result<(), Stop> {
        if self.stop.load(Ordering::SeqCst) {
            Err(Stop::Interrupted)
        } else {
            Ok(())
        }
    }

    /// Prints `$ kubectl <args>` and runs exactly that, printing its output.
    fn kubectl(&self, args: &[&str]) -> Result<String, Stop> {
        println!("\n   $ kubectl {}", args.join(" "));
        let out = self.fleet.cluster.try_kubectl(args).map_err(Stop::Failed)?;
        for l in out.lines() {
            println!("     {l}");
        }
        Ok(out)
    }

    /// Writes `yaml` to `manifests/<name>.yaml` and applies it with kubectl, printed.
    fn apply(&self, name: &str, yaml: &str) -> Result<(), Stop> {
        let path = self.manifests.join(format!("{name}.yaml"));
        std::fs::write(&path, yaml)
            .map_err(|e| Stop::Failed(format!("write {}: {e}", path.display())))?;
        self.kubectl(&["apply", "-f", &path.display().to_string()])
            .map(|_| ())
    }

    /// Waits (checking the stop flag) until `check` holds.
    fn wait<T>(
        &self,
        what: &str,
        timeout: Duration,
        mut check: impl FnMut() -> Option<T>,
    ) -> Result<T, Stop> {
        // A stop (the flag) ends the wait at once, as a value of the check.
        let waited =
            fleet_rig::wait::poll_every(timeout, crate::cluster::POLL, || match self.check() {
                Err(stop) => Ok(Err(stop)),
                Ok(()) => check().map(Ok).ok_or(fleet_rig::wait::Nothing),
            });
        match waited {
            Ok(v) => v,
            Err(t) => {
                let devices: Vec<String> = self
                    .fleet
                    .devices
                    .iter()
                    .map(|d| {
                        format!(
                            "--- {} fleet-agent ---\n{}",
                            d.id,
                            d.guest.journal("fleet-agent.service", 15)
                        )
                    })
                    .collect();
                Err(Stop::Failed(format!(
                    "{}\n--- fleet-operator log ---\n{}\n{}",
                    t.message(what),
                    self.fleet.cluster.operator_log(30),
                    devices.join("\n")
                )))
            }
        }
    }

    /// Reads every Device's `status.blocking` once and checks it against `walk`; prints each step's Waiting column
    /// once it was seen.
    fn look(&self, walk: &mut Walk) -> Result<(), Stop> {
        let now = self.fleet.cluster.blocking();
        if now.is_empty() {
            return Ok(()); // the read failed; the next poll reads again
        }
        let due = walk.look(&now).map_err(|e| {
            Stop::Failed(format!(
                "the Waiting column: {e}\n--- fleet-operator log ---\n{}",
                self.fleet.cluster.operator_log(30)
            ))
        })?;
        for (what, rows) in due {
            println!("\n   {what}:");
            let rows: Vec<Vec<String>> = rows.into_iter().map(|(d, w)| vec![d, w]).collect();
            table(&["device", "Waiting (kubectl get fdev -o wide)"], &rows);
        }
        Ok(())
    }

    /// Looks about every 50 ms (a read takes longer) until every device is at step `step` of `walk` or later, or
    /// it was printed: for steps shorter than a second.
    fn closely(&self, walk: &mut Walk, step: usize) -> Result<(), Stop> {
        let t = Instant::now();
        loop {
            self.check()?;
            self.look(walk)?;
            if walk.printed[step]
                || DEVICES
                    .iter()
                    .all(|id| walk.at.get(*id).is_some_and(|d| d.at >= step))
            {
                return Ok(());
            }
            if t.elapsed() > UPGRADE_TIMEOUT {
                return Err(Stop::Failed(format!(
                    "every Device at {:?}: not within {UPGRADE_TIMEOUT:?}; what each showed: {:?}",
                    walk.steps[step].what, walk.at
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Looks at every poll until every printed step of `walk` was seen.
    fn walked(&self, walk: &mut Walk, timeout: Duration) -> Result<(), Stop> {
        self.wait(
            &format!("every Device showing {:?}", walk.missing()),
            timeout,
            || match self.look(walk) {
                Err(e) => Some(Err(e)),
                Ok(()) => walk.missing().is_empty().then_some(Ok(())),
            },
        )
        .map_err(|e| match e {
            Stop::Failed(m) => Stop::Failed(format!("{m}\nwhat each Device showed: {:?}", walk.at)),
            e => e,
        })?
    }

    /// The devices register themselves; one is labelled the canary.
    pub fn registered(&self) -> Result<(), Stop> {
        step(
            2,
            "the devices registered themselves: the operator made a Device for each",
        );
        self.kubectl(&["get", "fdev"])?;
        self.kubectl(&["label", "fdev", DEVICES[0], "canary=true"])?;
        self.kubectl(&["label", "fdev", "--all", "site=demo"])?;
        Ok(())
    }

    /// The container `fleet-<name>` on `device`: (running, host PID).
    fn container(&self, device: &str, name: &str) -> Option<(bool, u64)> {
        let c = self
            .fleet
            .device(device)
            .container(&format!("fleet-{name}"))?;
        Some((
            c["State"]["Running"] == true,
            c["State"]["Pid"].as_u64().unwrap_or(0),
        ))
    }

    /// DeviceGroup + FleetDeployment → a container on every device.
    pub fn deploy(&self) -> Result<BTreeMap<String, u64>, Stop> {
        step(
            3,
            "a DeviceGroup and a FleetDeployment: one busybox container on every device",
        );
        self.apply("group-demo", &group_yaml("demo", &[("site", "demo")]))?;
        self.apply("deployment-web", &deployment_yaml("web", "demo", "web"))?;
        let t = Instant::now();
        let mut pids = BTreeMap::new();
        println!();
        while pids.len() < DEVICES.len() {
            let (id, pid) = self.wait(
                "a container on every device",
                Duration::from_secs(180),
                || {
                    DEVICES.iter().find_map(|id| {
                        if pids.contains_key(*id) {
                            return None;
                        }
                        match self.container(id, "web") {
                            Some((true, pid)) => Some((id.to_string(), pid)),
                            _ => None,
                        }
                    })
                },
            )?;
            println!(
                "   {:>6.1}s  {id:<8} fleet-web running (pid {pid})",
                t.elapsed().as_secs_f64()
            );
            pids.insert(id, pid);
        }
        self.kubectl(&["get", "fdg,fdep"])?;
        println!("\n   Read from each device's Podman (fleet-agent user, rootless):");
        let rows: Vec<Vec<String>> = DEVICES
            .iter()
            .map(|id| {
                let c = self.fleet.device(id).container("fleet-web");
                vec![
                    id.to_string(),
                    "fleet-web".into(),
                    c.as_ref()
                        .and_then(|c| c["State"]["Status"].as_str().map(str::to_string))
                        .unwrap_or_else(|| "missing".into()),
                    c.as_ref()
                        .and_then(|c| c["ImageName"].as_str().map(str::to_string))
                        .unwrap_or_default(),
                    c.as_ref()
                        .map(|c| c["State"]["Pid"].to_string())
                        .unwrap_or_default(),
                ]
            })
            .collect();
        table(&["device", "container", "state", "image", "pid"], &rows);
        Ok(pids)
    }

    /// Prints each device's phase changes for the attempt at `version` as the cluster shows them (seconds since
    /// `start`), until every device has finished it.
    fn timeline(
        &self,
        version: &str,
        start: fleet_wire::Timestamp,
    ) -> Result<Vec<DeviceView>, Stop> {
        let t = Instant::now();
        let mut seen: BTreeSet<(String, u64, String)> = BTreeSet::new();
        println!();
        loop {
            self.check()?;
            let views = self.fleet.views();
            let mut batch = vec![];
            for v in &views {
                let Some(u) = &v.upgrade else { continue };
                if u.target_version.as_ref().map(|x| x.as_str()) != Some(version) {
                    continue;
                }
                for tr in u.transitions.as_slice() {
                    let key = (
                        v.id.clone(),
                        tr.at.unix_ms(),
                        crate::local_fleet::kebab(&tr.phase),
                    );
                    if seen.insert(key.clone()) {
                        let reason = tr
                            .reason
                            .as_ref()
                            .map(crate::local_fleet::kebab)
                            .unwrap_or_default();
                        batch.push((key.1, v.id.clone(), key.2, reason));
                    }
                }
            }
            batch.sort();
            for (at, id, phase, reason) in batch {
                let secs = at.saturating_sub(start.unix_ms()) as f64 / 1000.0;
                println!("   {secs:>6.1}s  {id:<8} {phase:<13} {reason}");
            }
            let done = views.len() >= DEVICES.len() && views.iter().all(|v| v.finished(version));
            if done {
                return Ok(views);
            }
            if t.elapsed() > UPGRADE_TIMEOUT {
                return Err(Stop::Failed(format!(
                    "not every device finished {version} within {UPGRADE_TIMEOUT:?}"
                )));
            }
            std::thread::sleep(TIMELINE_POLL);
        }
    }

    /// AgentRelease v2 → every device commits; the containers keep running through the cutover.
    pub fn upgrade(&self, web: &BTreeMap<String, u64>) -> Result<(), Stop> {
        step(
            4,
            &format!("AgentRelease {V2}: every device downloads, probes, cuts over and commits"),
        );
        let (url, sha) = self.fleet.publish_agent(V2);
        let start = fleet_wire::Timestamp::now();
        let t = Instant::now();
        self.apply(
            "release",
            &release_yaml("fleet-agent", "demo", V2, &url, &sha),
        )?;
        println!(
            "\n   Timeline (phase changes, from each Device's status.agentUpgrade.transitions):"
        );
        self.timeline(V2, start)?;
        let views = self.wait("every Device reports v2", Duration::from_secs(60), || {
            let v = self.fleet.views();
            v.iter()
                .all(|v| v.agent_version.as_deref() == Some(V2))
                .then_some(v)
        })?;
        println!(
            "   every Device shows {V2} committed {:.1} s after `kubectl apply`",
            t.elapsed().as_secs_f64()
        );
        self.kubectl(&["get", "fdev"])?;
        self.kubectl(&["get", "frel"])?;
        println!(
            "\n   Read from the cluster (Device) and from each device (active symlink, Podman):"
        );
        let rows: Vec<Vec<String>> = views
            .iter()
            .map(|v| {
                let d = self.fleet.device(&v.id);
                let now = self.container(&v.id, "web").map(|c| c.1);
                let before = web.get(&v.id).copied();
                vec![
                    v.id.clone(),
                    v.agent_version.clone().unwrap_or_default(),
                    v.phase(),
                    d.active_link(),
                    format!(
                        "{} -> {} ({})",
                        before.map(|p| p.to_string()).unwrap_or_default(),
                        now.map(|p| p.to_string()).unwrap_or_else(|| "gone".into()),
                        if now.is_some() && now == before {
                            "kept running"
                        } else {
                            "RESTARTED"
                        }
                    ),
                ]
            })
            .collect();
        table(
            &[
                "device",
                "agent (Device)",
                "phase",
                "active binary on the device",
                "fleet-web pid",
            ],
            &rows,
        );
        Ok(())
    }

    /// A crash-looping v3, staged: the canary catches it and the release holds; the fix (2.0.0 again, a new
    /// spec) lifts the halt. Then a crash-looping container, shown as such.
    pub fn broken(&self) -> Result<(), Stop> {
        step(
            5,
            &format!(
                "a crash-looping {V3} (ready and committed, then killed 20 s after every start), staged: the canary catches it and the release holds"
            ),
        );
        let (url, sha) = self.fleet.publish_crash_looping_v3(20);
        let t = Instant::now();
        let staged = |yaml: String| {
            format!("{yaml}  rollout:\n    soakSeconds: 30\n    maxUnavailable: 1\n")
        };
        // What each Device's status.blocking must be at each step (docs/crds.md, "Why a device is not updated").
        let change = "AgentRelease/fleet-agent";
        let canary = DEVICES[0];
        let updating = |rs: &Reasons| {
            one(rs, "updating", |m| {
                m.starts_with(&format!("{change} is on its way: "))
            })
        };
        // The halted canary: its failure as this pass judged it (restarted during its soak, or crash-looping once
        // it restarted 3 times), or nothing on a pass between two starts that finds it past its soak and beating
        // (the halt holds all the same).
        let caught = |rs: &Reasons| {
            rs.is_empty()
                || one(rs, "soakFailed", |m| {
                    m == format!("{change} runs on the device and restarted during its soak: publish a fixed spec")
                })
                || one(rs, "crashLooping", |m| {
                    m == format!(
                        "{change} runs on the device and keeps restarting: publish a fixed spec"
                    )
                })
        };
        let halted_other = |rs: &Reasons| {
            one(rs, "halted", |m| {
                [
                    format!(": {canary} (agent restarted during its soak)"),
                    format!(": {canary} (crash-looping)"),
                    String::new(), // a held halt's message, on a later pass
                ]
                .iter()
                .any(|why| m == format!("{change} is halted (a canary failed{why}): {RESUME}"))
            })
        };
        // The canary's commit of the release, plus its soak: when the others may follow at the earliest.
        let committed = std::cell::Cell::new(None);
        let soak_until = || {
            if committed.get().is_none() {
                committed.set(
                    self.fleet
                        .view(canary)
                        .and_then(|v| v.upgrade)
                        .filter(|u| {
                            u.phase == fleet_wire::UpgradePhase::Complete
                                && u.target_version.as_ref().map(|v| v.as_str()) == Some(V3)
                        })
                        .map(|u| u.phase_changed_at.plus(Duration::from_secs(30))),
                );
            }
            committed.get()
        };
        let mut walk = Walk::new(vec![
            Step::new("before", Seen::Maybe, |_, rs| rs.is_empty()),
            Step::new(
                &format!("Waiting (the column `kubectl get fdev -o wide` adds), while the canary {canary} is given {V3}: the others wait for it"),
                Seen::Each,
                |id, rs| {
                    if id == canary {
                        updating(rs)
                    } else {
                        one(rs, "waitingForCanaries", |m| {
                            m == format!("{change} waits for the canaries: 1 of 1 not updated yet")
                        })
                    }
                },
            ),
            Step::new(
                &format!("{canary} committed {V3} and soaks for 30 s: the others wait for its soak"),
                Seen::Together,
                |id, rs| {
                    if id == canary {
                        rs.is_empty()
                    } else {
                        one(rs, "soaking", |m| {
                            m.starts_with(&format!("{change} waits for the canaries' soak, until "))
                                && soak_until().is_some_and(|u| {
                                    m == format!("{change} waits for the canaries' soak, until {u} at the earliest")
                                })
                        })
                    }
                },
            ),
            Step::new(
                &format!("{canary} restarted during its soak: the release halted, the others say how to resume"),
                Seen::Together,
                |id, rs| if id == canary { caught(rs) } else { halted_other(rs) },
            ),
        ]);
        self.apply(
            "release",
            &staged(release_yaml("fleet-agent", "demo", V3, &url, &sha)),
        )?;
        // The canary's update takes under a second: read closely until it soaks.
        self.closely(&mut walk, 2)?;
        let halted = self.wait("the release halted", UPGRADE_TIMEOUT, || {
            if let Err(e) = self.look(&mut walk) {
                return Some(Err(e));
            }
            self.fleet
                .cluster
                .condition(&["frel", "fleet-agent"], "Halted")
                .filter(|c| c.status == "True")
                .map(Ok)
        })??;
        println!(
            "\n   {:.1} s after `kubectl apply`: Halted ({}): {}",
            t.elapsed().as_secs_f64(),
            halted.reason,
            halted.message
        );
        self.kubectl(&["get", "frel"])?;
        self.kubectl(&["get", "fdev"])?;
        self.walked(&mut walk, Duration::from_secs(60))?;
        // Past the canary's soak window the halt still holds: only a person lifts it. Every Device still says so
        // at every read (the walk's last step allows nothing else).
        let held = Instant::now();
        self.wait("30 s more", Duration::from_secs(60), || {
            if let Err(e) = self.look(&mut walk) {
                return Some(Err(e));
            }
            (held.elapsed() >= Duration::from_secs(30)).then_some(Ok(()))
        })??;
        drop(walk);
        let phase = self
            .fleet
            .cluster
            .get_json(&["frel", "fleet-agent"])
            .and_then(|r| r["status"]["rollout"]["phase"].as_str().map(str::to_owned))
            .unwrap_or_default();
        let others: Vec<String> = self
            .fleet
            .views()
            .into_iter()
            .filter(|v| v.id != DEVICES[0])
            .map(|v| format!("{} {}", v.id, v.agent_version.unwrap_or_default()))
            .collect();
        println!(
            "   {:.1} s after `kubectl apply`, past the soak window: phase {phase}; the others kept theirs: {}",
            t.elapsed().as_secs_f64(),
            others.join(", ")
        );
        if phase != "Halted" {
            return Err(Stop::Failed(format!(
                "the halt lifted by itself: phase {phase}"
            )));
        }
        println!("\n   The fix: the release back to {V2} (a changed spec lifts the halt); the canary leaves the loop.");
        let (url, sha) = self.fleet.publish_agent(V2);
        let mut walk = Walk::new(vec![
            Step::new("halted", Seen::Maybe, |id, rs| {
                if id == canary {
                    caught(rs)
                } else {
                    halted_other(rs)
                }
            }),
            Step::new(
                &format!("{canary} is given {V2}; the others run it already and wait for nothing"),
                Seen::Each,
                |id, rs| {
                    if id == canary {
                        updating(rs)
                    } else {
                        rs.is_empty()
                    }
                },
            ),
            Step::new(
                &format!("every device runs {V2}: nothing waits"),
                Seen::Together,
                |_, rs| rs.is_empty(),
            ),
        ]);
        self.apply(
            "release",
            &staged(release_yaml("fleet-agent", "demo", V2, &url, &sha)),
        )?;
        self.closely(&mut walk, 2)?;
        self.wait("every Device reports v2 again", UPGRADE_TIMEOUT, || {
            if let Err(e) = self.look(&mut walk) {
                return Some(Err(e));
            }
            let v = self.fleet.views();
            v.iter()
                .all(|v| v.agent_version.as_deref() == Some(V2))
                .then_some(Ok(()))
        })??;
        self.walked(&mut walk, Duration::from_secs(60))?;
        self.kubectl(&["get", "frel"])?;

        println!("\n   A container that exits every 5 s under restartPolicy: always:");
        self.apply(
            "deployment-flaky",
            &crash_looping_deployment_yaml("flaky", "demo"),
        )?;
        let t = Instant::now();
        let w = self.wait(
            "the deployment counts its crash-looping containers",
            Duration::from_secs(180),
            || {
                let d = self.fleet.cluster.get_json(&["fdep", "flaky"])?;
                let w = d["status"]["workloads"].clone();
                (w["crashLooping"].as_u64() == Some(DEVICES.len() as u64)).then_some(w)
            },
        )?;
        println!(
            "   {:.1} s after `kubectl apply`: {} of {} crash-looping ({})",
            t.elapsed().as_secs_f64(),
            w["crashLooping"],
            DEVICES.len(),
            w["latestError"].as_str().unwrap_or_default()
        );
        self.kubectl(&["get", "fdev"])?;
        self.kubectl(&["delete", "fdep", "flaky"])?;
        Ok(())
    }

    /// A TaskRun system upgrade: the canary first, then the others, each rebooting through FleetLock in turn.
    pub fn tasks(&self) -> Result<(), Stop> {
        step(
            6,
            "a TaskRun system upgrade: the canary first, then the others, one reboot at a time through FleetLock",
        );
        println!(
            "   Each device has {REBOOT_PKG} 1.0 installed and 2.0 in its apt repository; 2.0 asks for a reboot."
        );
        let watch = HolderWatch::start(&self.fleetlock);
        let start = fleet_wire::Timestamp::now();
        let t = Instant::now();
        let path = self.manifests.join(format!("taskrun-{TASK}.yaml"));
        std::fs::write(&path, taskrun_yaml(TASK, "demo", TASK_DEADLINE_SECS))
            .map_err(|e| Stop::Failed(format!("write {}: {e}", path.display())))?;
        self.kubectl(&["create", "-f", &path.display().to_string()])?;
        println!(
            "\n   Timeline (the TaskRun's phase from the cluster, each device's from system-upgrade-status in NATS):"
        );
        let tasks = Tasks::new(&self.fleet.nats);
        let secs = |at: u64| at.saturating_sub(start.unix_ms()) as f64 / 1000.0;
        let mut seen = BTreeSet::new();
        // What each Device's status.blocking must be at each step (docs/crds.md, "TaskRuns").
        let change = format!("TaskRun/default/{TASK}");
        let canary = DEVICES[0];
        let on_its_way =
            |rs: &Reasons| one(rs, "updating", |m| m.starts_with(&format!("{change} ")));
        let mut walk = Walk::new(vec![
            Step::new("before", Seen::Maybe, |_, rs| rs.is_empty()),
            Step::new(
                &format!("Waiting (the column `kubectl get fdev -o wide` adds), while the canary {canary} upgrades: the others wait for it"),
                Seen::Together,
                |id, rs| {
                    if id == canary {
                        on_its_way(rs)
                    } else {
                        one(rs, "waitingForCanaries", |m| {
                            m == format!("{change} waits for its canaries: 1 of 1 have not succeeded yet")
                        })
                    }
                },
            ),
            Step::new(
                &format!("{canary} succeeded: the others are on their way"),
                Seen::Together,
                |id, rs| if id == canary { rs.is_empty() } else { on_its_way(rs) },
            ),
            Step::new("every device succeeded and was counted: nothing waits", Seen::Together, |_, rs| {
                rs.is_empty()
            }),
        ]);
        let run = loop {
            self.check()?;
            let run = self.fleet.taskrun(TASK).unwrap_or_default();
            let st = &run.status;
            let mut batch = vec![];
            if let Some(at) = st.start_time {
                batch.push((
                    at.unix_ms(),
                    "TaskRun",
                    format!("running: {} targets", st.targets),
                ));
            }
            if let (Some(at), true) = (st.completion_time, run.terminal()) {
                let counts = format!("{} succeeded, {} failed", st.succeeded, st.failed);
                batch.push((
                    at.unix_ms(),
                    "TaskRun",
                    format!("{}: {counts}", run.phase()),
                ));
            }
            for id in DEVICES {
                let Some(s) = tasks.status_of(id, &run.uid) else {
                    continue;
                };
                for tr in s.transitions.as_slice() {
                    batch.push((tr.at.unix_ms(), id, kebab(&tr.phase)));
                }
            }
            batch.retain(|e| seen.insert(e.clone()));
            batch.sort();
            for (at, who, what) in batch {
                println!("   {:>6.1}s  {who:<8} {what}", secs(at));
            }
            // After the timeline's lines of this read: the Waiting column is read after them.
            self.look(&mut walk)?;
            if run.terminal() {
                break run;
            }
            if t.elapsed() > UPGRADE_TIMEOUT {
                return Err(Stop::Failed(format!(
                    "TaskRun {TASK} not finished within {UPGRADE_TIMEOUT:?}: {run:?}\n{}",
                    self.fleet.cluster.operator_log(30)
                )));
            }
            std::thread::sleep(TIMELINE_POLL);
        };
        let (max, order) = watch.stop();
        // Once Complete, the run gives no device anything more (the Device writer's next pass).
        self.walked(&mut walk, Duration::from_secs(60))?;
        println!(
            "   TaskRun {} {:.1} s after `kubectl create`",
            run.phase(),
            t.elapsed().as_secs_f64()
        );
        self.kubectl(&["get", "ftr"])?;
        println!("\n   Read from NATS (system-upgrade-status) and from each device (dpkg-query, boot id):");
        let rows: Vec<Vec<String>> = DEVICES
            .iter()
            .map(|id| {
                let d = self.fleet.device(id);
                let s = tasks.status_of(id, &run.uid);
                vec![
                    id.to_string(),
                    if *id == DEVICES[0] { "yes" } else { "-" }.into(),
                    s.as_ref()
                        .map(|s| kebab(&s.phase))
                        .unwrap_or_else(|| "-".into()),
                    s.as_ref()
                        .map(|s| s.reboot_required.to_string())
                        .unwrap_or_default(),
                    s.as_ref()
                        .and_then(|s| s.first_heartbeat_after_completion)
                        .map(|h| format!("{:.1} s", secs(h.unix_ms())))
                        .unwrap_or_else(|| "-".into()),
                    installed(&d.guest, REBOOT_PKG).0,
                    if self.rebooted(id) { "yes" } else { "no" }.into(),
                ]
            })
            .collect();
        table(
            &[
                "device",
                "canary",
                "status",
                "reboot required",
                "first heartbeat after",
                REBOOT_PKG,
                "rebooted",
            ],
            &rows,
        );
        println!(
            "   FleetLock (GET /v1/status, every 50 ms): {} slot holders one after the other, at most {max} at once",
            order.len()
        );
        if run.status.phase != Some(fleet_wire::TaskRunPhase::Complete) {
            return Err(Stop::Failed(format!("TaskRun {TASK} ended {run:?}")));
        }
        self.reboots_page()
    }

    /// What the dashboard's Reboots page shows of step 6's reboots (the operator reads fleetlock-server every
    /// 15 s): each release as the device it is, with bars that can be seen.
    fn reboots_page(&self) -> Result<(), Stop> {
        let cluster = &self.fleet.cluster;
        let mut last = String::from("no answer from the dashboard");
        let shown = fleet_rig::wait_for(Duration::from_secs(60), || {
            let page = cluster.dashboard_page("/reboots")?;
            let checked = crate::reboots_page::check_released(&page, &DEVICES);
            last = format!("{checked:?}");
            checked.ok()
        });
        match shown {
            Some(s) => {
                println!(
                    "   The dashboard's Reboots page ({}/reboots): {s}",
                    cluster.dashboard_url()
                );
                Ok(())
            }
            None => Err(Stop::Failed(format!(
                "the dashboard's Reboots page within 60 s: {last}"
            ))),
        }
    }

    /// Whether the device booted again since the demo started (its boot id changed).
    fn rebooted(&self, id: &str) -> bool {
        self.boot_ids
            .get(id)
            .is_some_and(|b| *b != self.fleet.device(id).guest.boot_id())
    }

    /// The device's result for the demo's TaskRun, from the cluster (the run's UID) and NATS (its status).
    fn task_result(&self, id: &str) -> String {
        let Some(TaskRunView { uid, .. }) = self.fleet.taskrun(TASK) else {
            return "-".into();
        };
        Tasks::new(&self.fleet.nats)
            .status_of(id, &uid)
            .map(|s| format!("{TASK}: {}", kebab(&s.phase)))
            .unwrap_or_else(|| format!("{TASK}: -"))
    }

    /// The NATS server's URL and CA (copied into the demo's directory), and the identity provider's, for a
    /// person enrolling a device by hand (docs/auth.md).
    fn print_nats(&self, dir: &Path) {
        let nats = &self.fleet.nats;
        let copy = |name: &str, pem: Option<Vec<u8>>| -> Option<PathBuf> {
            let path = dir.join(name);
            std::fs::write(&path, pem?).ok()?;
            Some(path)
        };
        let ca = copy(
            "nats-ca.pem",
            nats.ca_file().and_then(|p| std::fs::read(p).ok()),
        );
        match ca {
            Some(ca) => println!(
                "   NATS: {} (CA: {}; a device names it as [nats] ca_file)",
                nats.url(),
                ca.display()
            ),
            None => println!("   NATS: {} (plain TCP: FLEET_NATS_TLS=off)", nats.url()),
        }
        if let (Some((issuer, _)), Some(ca)) = (
            nats.zitadel(),
            copy("zitadel-ca.pem", nats.zitadel_ca_pem()),
        ) {
            println!(
                "   identity provider (Zitadel stand-in, project id {}): {issuer} (CA: {})",
                callout::AUDIENCE,
                ca.display()
            );
        }
    }

    /// `scripts/demo --add-device NAME`: a new device from the Debian package, enrolled with a machine user of its
    /// own ([`crate::enrol::from_package`]), given the demo's workload image, and recorded for `--shell` and
    /// `--stop`; returns once its Device exists.
    fn add_device(&self, req: &demo_state::AddRequest, record: &Record) -> Result<Device, String> {
        let name = req.name.as_str();
        req.say(&format!(
            "== adding {name}: a Debian device from the package, with its own identity"
        ));
        let debs = std::panic::catch_unwind(|| crate::packages::amd64(V1))
            .map_err(|_| "building the package failed (the message above says why)".to_string())?;
        req.say(&format!(
            "built {} with scripts/package",
            crate::packages::file_name("harmony-fleet-device")
        ));
        let mut say = |l: &str| req.say(l);
        let d = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            crate::enrol::from_package(
                name,
                &self.fleet.nats,
                debs,
                Some(&self.fleet.artifacts),
                &mut say,
            )
        }))
        .map_err(|_| "the device's set-up failed (the message above says why)".to_string())??;
        if let Some(pid) = d.guest.wrapper_pid() {
            record.add(pid, &demo_state::guest_name(name));
        }
        crate::enrol::import_demo_image(&d);
        req.say(&format!(
            "imported the demo's workload image {} into its agent's Podman (the image is in no registry: docs/auth.md)",
            crate::fleet::TEST_IMAGE
        ));
        let t = Instant::now();
        let seen = fleet_rig::wait_for(Duration::from_secs(120), || {
            self.fleet.view(name).filter(|v| v.agent_version.is_some())
        });
        if seen.is_none() {
            return Err(format!(
                "no Device {name} within 120 s:\n{}\n--- fleet-operator log ---\n{}",
                d.logs(),
                self.fleet.cluster.operator_log(30)
            ));
        }
        req.say(&format!(
            "its Device appeared in {:.1} s:",
            t.elapsed().as_secs_f64()
        ));
        let out = self
            .fleet
            .cluster
            .try_kubectl(&["get", "fdev", name])
            .unwrap_or_else(|e| e);
        req.say(&format!("$ kubectl get fdev {name}"));
        for l in out.lines() {
            req.say(&format!("  {l}"));
        }
        req.say(&format!(
            "put it in the demo's group: kubectl label fdev {name} site=demo; a shell: sudo scripts/demo --shell {name}"
        ));
        Ok(d)
    }

    /// The final table, read from the cluster and the devices.
    pub fn summary(&self) -> Result<(), Stop> {
        println!("\n== the fleet now");
        let views = self.fleet.views();
        let rows: Vec<Vec<String>> = views
            .iter()
            .map(|v| {
                let d = self.fleet.device(&v.id);
                let running = self
                    .container(&v.id, "web")
                    .filter(|c| c.0)
                    .map(|_| 1)
                    .unwrap_or(0);
                let rebooted = self.rebooted(&v.id);
                vec![
                    v.id.clone(),
                    v.labels.join(","),
                    v.agent_version.clone().unwrap_or_default(),
                    d.active_version(),
                    format!("{} / {}", v.phase(), v.reason()),
                    format!("{running} running"),
                    self.task_result(&v.id),
                    if rebooted { "yes".into() } else { "no".into() },
                ]
            })
            .collect();
        table(
            &[
                "device",
                "labels",
                "agent (Device)",
                "agent --version (device)",
                "last upgrade / reason",
                "containers",
                "task",
                "reboots",
            ],
            &rows,
        );
        Ok(())
    }

    /// `--keep`: says how to reach the fleet (kubectl, the dashboard, NATS and its CA, a shell in each device) and
    /// waits for Ctrl-C or `scripts/demo --stop`, saying so when a part of the fleet dies meanwhile, and enrolling
    /// the devices `scripts/demo --add-device NAME` asks for (they live until the demo stops).
    pub fn keep(&self, dir: &Path, record: &Record) {
        println!("\n== the fleet keeps running (--keep)");
        println!(
            "   export KUBECONFIG={} PATH={}:$PATH",
            dir.join("kubeconfig").display(),
            self.fleet
                .cluster
                .kubectl_bin()
                .parent()
                .map(|p| p.display().to_string())
                .unwrap_or_default()
        );
        println!("   kubectl get fdev,fdg,fdep,frel,ftr");
        println!("   manifests: {}", self.manifests.display());
        let c = &self.fleet.cluster;
        println!(
            "   dashboard: {}/ (token {}: as a bearer token, or as the password with any user name)",
            c.dashboard_url(),
            c.dashboard_token()
        );
        self.print_nats(dir);
        for d in &self.fleet.devices {
            println!("   a shell in {}: sudo scripts/demo --shell {}", d.id, d.id);
        }
        println!("   Add a device with its own identity: sudo scripts/demo --add-device NAME (docs/auth.md)");
        println!("   Stop it: Ctrl-C here, or `scripts/demo --stop` from another shell.");
        let mut reported = BTreeSet::new();
        let mut checked = Instant::now();
        let mut added: Vec<Device> = vec![];
        while !self.stop.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(200));
            if checked.elapsed() < Duration::from_secs(2) {
                continue;
            }
            for req in demo_state::take_add_requests(dir) {
                let taken = self
                    .fleet
                    .devices
                    .iter()
                    .chain(&added)
                    .any(|d| d.id == req.name);
                let outcome = if taken {
                    Err(format!("the demo already has a device {}", req.name))
                } else {
                    self.add_device(&req, record).map(|d| added.push(d))
                };
                if let Err(why) = &outcome {
                    req.say(&format!("!! {why}"));
                }
                req.finish(outcome);
            }
            checked = Instant::now();
            for (name, pid) in demo_state::dead(dir) {
                if reported.insert(name.clone()) {
                    println!(
                        "   !! {name} (pid {pid}) is no longer running: the fleet is incomplete"
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Read<'r> = &'r [(&'r str, &'r str)];

    fn read(rows: &[(&str, Read)]) -> BTreeMap<String, Vec<(String, String)>> {
        rows.iter()
            .map(|(d, rs)| {
                let rs = rs.iter().map(|(k, m)| (k.to_string(), m.to_string()));
                (d.to_string(), rs.collect())
            })
            .collect()
    }

    fn walk(first: Seen) -> Walk<'static> {
        Walk::new(vec![
            Step::new("before", Seen::Maybe, |_, rs| rs.is_empty()),
            Step::new("the canary updates", first, |id, rs| {
                if id == DEVICES[0] {
                    one(rs, "updating", |m| m.starts_with("R is on its way"))
                } else {
                    one(rs, "waitingForCanaries", |m| m == "R waits")
                }
            }),
            Step::new("done", Seen::Together, |_, rs| rs.is_empty()),
        ])
    }

    const NONE: Read = &[];
    const UP: Read = &[("updating", "R is on its way: preparing")];
    const WAITS: Read = &[("waitingForCanaries", "R waits")];

    fn titles(due: Result<Vec<Shown>, String>) -> Vec<String> {
        due.unwrap().into_iter().map(|t| t.0).collect()
    }

    #[test]
    fn a_step_seen_together_is_printed_from_that_read() {
        let mut w = walk(Seen::Together);
        let [a, b, c] = DEVICES;
        assert_eq!(
            w.look(&read(&[(a, NONE), (b, NONE), (c, NONE)])),
            Ok(vec![])
        );
        // Written one Device at a time: no step is every device's yet.
        assert_eq!(w.look(&read(&[(a, UP), (b, WAITS), (c, NONE)])), Ok(vec![]));
        let due = w.look(&read(&[(a, UP), (b, WAITS), (c, WAITS)])).unwrap();
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].0, "the canary updates");
        assert_eq!(
            due[0].1[0],
            ("demo-1".into(), "R is on its way: preparing".into())
        );
        assert_eq!(due[0].1[2], ("demo-3".into(), "R waits".into()));
        assert_eq!(
            w.look(&read(&[(a, UP), (b, WAITS), (c, WAITS)])),
            Ok(vec![])
        );
        assert_eq!(w.missing(), ["done"]);
        assert_eq!(
            w.look(&read(&[(a, NONE), (b, WAITS), (c, WAITS)])),
            Ok(vec![])
        );
        let due = w.look(&read(&[(a, NONE), (b, NONE), (c, NONE)])).unwrap();
        assert_eq!(due[0].1[0], ("demo-1".into(), NOTHING.into()));
        assert!(w.missing().is_empty());
    }

    #[test]
    fn a_short_step_is_printed_as_each_device_first_showed_it() {
        let [a, b, c] = DEVICES;
        let mut w = walk(Seen::Each);
        assert_eq!(w.look(&read(&[(a, UP), (b, WAITS), (c, NONE)])), Ok(vec![]));
        let due = w.look(&read(&[(a, NONE), (b, WAITS), (c, WAITS)])).unwrap();
        assert!(due.is_empty(), "{due:?}");
        assert_eq!(
            titles(w.look(&read(&[(a, NONE), (b, NONE), (c, NONE)]))),
            ["the canary updates", "done"]
        );
        // As Together, the same reads fail: no read caught every device at that step.
        let mut w = walk(Seen::Together);
        assert_eq!(w.look(&read(&[(a, UP), (b, WAITS), (c, NONE)])), Ok(vec![]));
        assert_eq!(
            w.look(&read(&[(a, NONE), (b, WAITS), (c, WAITS)])),
            Ok(vec![])
        );
        assert!(w.look(&read(&[(a, NONE), (b, NONE), (c, NONE)])).is_err());
    }

    #[test]
    fn an_each_step_is_printed_when_one_read_finds_every_device_at_a_later_step() {
        let [a, b, c] = DEVICES;
        let halted: Read = &[("halted", "R is halted")];
        let mut w = Walk::new(vec![
            Step::new("halted", Seen::Maybe, |id, rs| {
                id == DEVICES[0] && rs.is_empty() || one(rs, "halted", |_| true)
            }),
            Step::new("the canary updates", Seen::Each, |id, rs| {
                if id == DEVICES[0] {
                    one(rs, "updating", |_| true)
                } else {
                    rs.is_empty()
                }
            }),
            Step::new("done", Seen::Together, |_, rs| rs.is_empty()),
        ]);
        assert_eq!(
            w.look(&read(&[(a, NONE), (b, halted), (c, halted)])),
            Ok(vec![])
        );
        assert_eq!(
            w.look(&read(&[(a, NONE), (b, NONE), (c, NONE)])),
            Ok(vec![])
        );
        assert_eq!(
            w.look(&read(&[(a, UP), (b, NONE), (c, NONE)]))
                .map(|d| d.len()),
            Ok(1)
        );
        assert_eq!(
            titles(w.look(&read(&[(a, NONE), (b, NONE), (c, NONE)]))),
            ["done"]
        );
    }

    #[test]
    fn a_walk_refuses_a_step_back_or_a_reason_no_step_has() {
        let [a, b, c] = DEVICES;
        let mut w = walk(Seen::Together);
        assert_eq!(
            w.look(&read(&[(a, UP), (b, WAITS), (c, WAITS)]))
                .map(|d| d.len()),
            Ok(1)
        );
        assert_eq!(
            w.look(&read(&[(a, NONE), (b, NONE), (c, NONE)]))
                .map(|d| d.len()),
            Ok(1)
        );
        let back = w.look(&read(&[(a, NONE), (b, WAITS), (c, NONE)]));
        assert!(
            back.as_ref().is_err_and(|e| e.starts_with("demo-2")),
            "{back:?}"
        );
        let mut w = walk(Seen::Together);
        let halted: Read = &[("halted", "R is halted")];
        let other = w.look(&read(&[(a, NONE), (b, halted), (c, NONE)]));
        assert!(
            other.as_ref().is_err_and(|e| e.contains("halted")),
            "{other:?}"
        );
        // Two entries where one is due is not that step either.
        let mut w = walk(Seen::Together);
        let two: Read = &[("waitingForCanaries", "R waits"), ("halted", "S")];
        assert!(w.look(&read(&[(a, UP), (b, two), (c, WAITS)])).is_err());
    }
}
