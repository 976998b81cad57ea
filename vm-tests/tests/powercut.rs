//! Repeated power cuts during agent upgrades on one whole device (an nspawn guest, real systemd, updater, agents,
//! rootless Podman with one running workload, NATS with the auth callout, artifacts over HTTPS).
//!
//! Each round asks for an upgrade to another version — a real agent, or a candidate that fails its start (rolled
//! back) or its probe (refused) — waits until the updater is in a randomly drawn step of it (delivery: the intent
//! just written; download, probe, stopping, starting, committed, rolling-back), waits a random delay more, and
//! cuts the power; in a quarter of the rounds the power flickers: it comes back and is cut again a random moment
//! after PID 1 started (mid-boot, during the updater's recovery or the agent's start). After the last boot it
//! checks the device:
//! - the journal parses with the updater's own parser and ended where the recovery table (docs/updater.md) says
//!   for the phase it was in at the last cut, appending to the history the cut left;
//! - exactly one agent is selected: the active link points at the expected versioned binary, a regular
//!   executable file with the expected SHA-256, and no temporary file of an interrupted write is left beside the
//!   link or the journal;
//! - that agent is ready (`Type=notify`) and the only agent binary running;
//! - the updater's socket status and what the agent publishes to NATS (upgrade status, device info from this
//!   boot) agree with the journal and the running binary;
//! - the workload container runs with its image.
//!
//! `FLEET_POWERCUT_ROUNDS` sets the number of rounds (default 4; `scripts/powercut` runs 100),
//! `FLEET_POWERCUT_SEED` replays the draws of a run (its seed is printed first). The rounds share one booted
//! guest: a round costs one upgrade and one boot. The test deletes the unselected versioned binaries before each
//! round so that every upgrade downloads its artifact (the updater never collects them, and a candidate reuses a
//! real version's file name).
//!
//! Limit: the guest's disk is an overlay on the host's file system, whose page cache survives the cut: writes
//! the updater did not sync are not lost here as they could be on real hardware.

use fleet_rig::wait_for;
use fleet_vm_tests::builds::{self, V1, V2, V3};
use fleet_vm_tests::fleet::{desired_one_workload, one_device_at_a_time, TEST_IMAGE};
use fleet_vm_tests::inspect::{self, versioned};
use fleet_vm_tests::local_fleet::kebab;
use fleet_vm_tests::scene::{Scene, LIB};
use fleet_wire::{
    AgentUpgradeAttempt, AgentUpgradeStatus, JournalPhase, UpgradePhase, UpgradeReason,
};
use std::time::{Duration, Instant};

/// Rounds when `FLEET_POWERCUT_ROUNDS` is not set.
const DEFAULT_ROUNDS: u32 = 4;
/// The workload that must keep running.
const WORKLOAD: &str = "web";
/// Where the real agents wrapped by candidates are placed in the guest.
const REAL_DIR: &str = "/opt/fleet-test/powercut";
/// An upgrade on a loaded 2-core machine reaches any step well within this.
const STEP_TIMEOUT: Duration = Duration::from_secs(300);
/// The longest delay of a second cut after the guest's PID 1 started again: its boot, the updater's recovery
/// and the agent's start take about this long here.
const FLICKER_MAX_MS: u64 = 3000;
/// An intent reaches the updater within this when all is well (logs are printed when it takes longer).
const SLOW_ACCEPT: Duration = Duration::from_secs(20);
/// Recovery after a boot (the agent's readiness includes NATS and a desired-state snapshot).
const RECOVERY_TIMEOUT: Duration = Duration::from_secs(240);

/// A small deterministic generator (splitmix64): the same seed draws the same rounds.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn pick<T: Copy>(&mut self, from: &[T]) -> T {
        from[self.below(from.len() as u64) as usize]
    }
}

/// What the round's candidate is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// The real agent of the target version: commits.
    Upgrade,
    /// Probes like the real agent; as a service it exits before readiness: rolled back (`start-failed`).
    StartFails,
    /// Its `--self-test` fails: refused before the cutover (`probe-failed`).
    ProbeFails,
}

/// The step of the upgrade after which the power is cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Right after the intent is written: the agent may not have handed it to the updater yet.
    Delivery,
    Download,
    Probe,
    Stopping,
    Starting,
    Committed,
    RollingBack,
}

impl Kind {
    /// The steps an upgrade of this kind passes through.
    fn steps(self) -> &'static [Step] {
        use Step::*;
        match self {
            Kind::Upgrade => &[Delivery, Download, Probe, Stopping, Starting, Committed],
            Kind::StartFails => &[Delivery, Download, Probe, Stopping, Starting, RollingBack],
            Kind::ProbeFails => &[Delivery, Download, Probe],
        }
    }
}

impl Kind {
    /// How an attempt of this kind ends when nothing interrupts it: journal phase and reason, and whether the
    /// target ends up selected.
    fn natural_end(self) -> (JournalPhase, Option<UpgradeReason>, bool) {
        match self {
            Kind::Upgrade => (JournalPhase::Committed, None, true),
            Kind::StartFails => (
                JournalPhase::Failed,
                Some(UpgradeReason::StartFailed),
                false,
            ),
            Kind::ProbeFails => (
                JournalPhase::Failed,
                Some(UpgradeReason::ProbeFailed),
                false,
            ),
        }
    }
}

impl Step {
    /// The longest random delay after the step is seen, in ms: about the step's length here.
    fn max_delay_ms(self) -> u64 {
        match self {
            Step::Delivery => 15,
            Step::Download => 1500,
            Step::Probe => 1500,
            Step::Stopping => 150,
            Step::Starting => 1500,
            Step::Committed => 1000,
            Step::RollingBack => 1000,
        }
    }

    /// True when the updater's status shows this step.
    fn seen_in(self, s: &AgentUpgradeStatus) -> bool {
        let detail = s.detail.as_ref().map(|d| d.as_str()).unwrap_or_default();
        match self {
            Step::Delivery => true,
            Step::Download => {
                s.phase == UpgradePhase::Preparing && detail.starts_with("downloading")
            }
            Step::Probe => s.phase == UpgradePhase::Preparing && detail.starts_with("probing"),
            Step::Stopping => s.phase == UpgradePhase::Stopping,
            Step::Starting => s.phase == UpgradePhase::Starting,
            Step::Committed => s.phase == UpgradePhase::Complete,
            Step::RollingBack => s.phase == UpgradePhase::RollingBack,
        }
    }
}

/// One round's draw.
#[derive(Debug, Clone, Copy)]
struct Plan {
    kind: Kind,
    target: &'static str,
    step: Step,
    delay_ms: u64,
    /// The power flickers: a second cut this long after the guest's PID 1 started again (mid-boot, during the
    /// updater's recovery or the agent's start).
    flicker_ms: Option<u64>,
}

impl Plan {
    /// Draws a round for a device running `current`: the kind (6 in 10 real upgrades), a target version other
    /// than `current` (candidates wrap a real v2 or v3), a step of that kind and a delay.
    fn draw(rng: &mut Rng, current: &str) -> Self {
        let kind = match rng.below(10) {
            0..=5 => Kind::Upgrade,
            6 | 7 => Kind::StartFails,
            _ => Kind::ProbeFails,
        };
        let versions: &[&'static str] = match kind {
            Kind::Upgrade => &[V1, V2, V3],
            _ => &[V2, V3],
        };
        let others: Vec<&'static str> =
            versions.iter().copied().filter(|v| *v != current).collect();
        let target = rng.pick(&others);
        let step = rng.pick(kind.steps());
        let delay_ms = rng.below(step.max_delay_ms() + 1);
        let flicker_ms = (rng.below(4) == 0).then(|| rng.below(FLICKER_MAX_MS + 1));
        Self {
            kind,
            target,
            step,
            delay_ms,
            flicker_ms,
        }
    }
}

/// What a round found.
struct Row {
    round: u32,
    plan: Plan,
    /// The last step the updater's status showed before the cut.
    seen: String,
    /// The journal's durable phase at each cut (read from the guest's disk after the cut), see [`cut_label`].
    at_cut: Vec<String>,
    /// The journal after recovery, and the version selected and running.
    outcome: String,
    /// From writing the intent to the updater reporting the attempt (when seen before the cut).
    accepted: Option<Duration>,
    recovery: Duration,
    round_time: Duration,
}

/// The device and what the rounds publish, with the version it runs and that binary's digest.
struct Rig {
    scene: Scene,
    current: &'static str,
    current_sha: String,
}

/// The journal's phase, with the cutover's step for `activating` (`starting` once the candidate was started).
fn cut_label(j: Option<&fleet_updater::agent_upgrade::journal::Journal>) -> String {
    let Some(j) = j else {
        return "undelivered".into();
    };
    match (j.phase, j.starting_at) {
        (JournalPhase::Activating, None) => "activating/stop".into(),
        (JournalPhase::Activating, Some(_)) => "activating/start".into(),
        (p, _) => kebab(&p),
    }
}

fn describe(s: &AgentUpgradeStatus) -> String {
    let detail = s.detail.as_ref().map(|d| d.as_str()).unwrap_or_default();
    format!("{} ({detail})", kebab(&s.phase))
}

impl Rig {
    /// A v1 device with a running workload, the real v2 and v3 placed for candidates to wrap.
    fn start() -> Self {
        let scene = Scene::v1_with_real_v2();
        let d = &scene.device;
        for v in [V2, V3] {
            d.guest.install_file(
                &builds::agent(v),
                &format!("{REAL_DIR}/fleet-agent-v{v}"),
                0o755,
            );
        }
        d.import_test_image();
        // Candidates are built on the first use: not inside a round's timing.
        let _ = builds::script_candidate("");
        scene
            .operator
            .put_desired(&desired_one_workload(1, WORKLOAD));
        let rig = Self {
            current_sha: inspect::file_sha256(&builds::agent(V1)),
            current: V1,
            scene,
        };
        rig.wait_workload(Duration::from_secs(120));
        rig
    }

    /// Publishes the round's candidate and returns its attempt and the SHA-256 of its bytes.
    fn candidate(&self, round: u32, plan: &Plan) -> (AgentUpgradeAttempt, String) {
        let v = plan.target;
        let real = format!("{REAL_DIR}/fleet-agent-v{v}");
        let file = match plan.kind {
            Kind::Upgrade => builds::agent(v),
            Kind::StartFails => self.scene.wrapper(
                &format!("start-fails-{v}"),
                &format!(
                    "case \"$1\" in --self-test|--version|--help) exec {real} \"$@\" ;; esac\n\
                     sleep 2\nexit 1"
                ),
            ),
            Kind::ProbeFails => self.scene.wrapper(
                &format!("probe-fails-{v}"),
                &format!(
                    "case \"$1\" in --self-test) echo 'powercut: probe refused' >&2; exit 1 ;; esac\n\
                     exec {real} \"$@\""
                ),
            ),
        };
        let name = format!("round-{round}-fleet-agent-v{v}");
        let attempt = self.scene.artifacts.attempt(&file, &name, v);
        (attempt, inspect::file_sha256(&file))
    }

    /// Removes every versioned binary but the selected one, so that this round's upgrade downloads.
    fn remove_unselected(&self) {
        let keep = versioned(self.current);
        self.scene.device.guest.sh(&format!(
            "for f in {LIB}/fleet-agent-v*; do [ \"$f\" = {keep} ] || rm -f \"$f\"; done"
        ));
    }

    fn wait_workload(&self, timeout: Duration) -> serde_json::Value {
        let d = &self.scene.device;
        let name = format!("fleet-{WORKLOAD}");
        let c = wait_for(timeout, || {
            let c = d.container(&name)?;
            (c["State"]["Running"] == true).then_some(c)
        });
        let c = c.unwrap_or_else(|| {
            panic!(
                "container {name} is not running (inspect: {:#?}).\n{}",
                d.container(&name),
                d.logs()
            )
        });
        assert_eq!(c["ImageName"], TEST_IMAGE, "container {name}: {c:#}");
        c
    }

    /// The journal just after a cut, as the next boot's updater will read it (it must load), when it holds
    /// `attempt`; `None` when the updater had not journaled it yet.
    fn journal_at_cut(
        &self,
        n: u32,
        attempt: &AgentUpgradeAttempt,
    ) -> Option<fleet_updater::agent_upgrade::journal::Journal> {
        inspect::journal(&self.scene.device)
            .unwrap_or_else(|e| panic!("round {n}: after the cut the journal does not load: {e}"))
            .filter(|j| j.attempt.attempt_id == attempt.attempt_id)
    }

    /// One round: upgrade, cut at the drawn step, boot, check. Returns the row for the table.
    fn round(&mut self, n: u32, plan: Plan) -> Row {
        let t0 = Instant::now();
        self.remove_unselected();
        let (attempt, candidate_sha) = self.candidate(n, &plan);
        let d = &self.scene.device;
        self.scene.operator.put_intent(&attempt);
        let mine = |s: &AgentUpgradeStatus| s.attempt_id.as_ref() == Some(&attempt.attempt_id);
        let t_intent = Instant::now();
        let mut accepted = None::<Duration>;
        let mut last = None::<AgentUpgradeStatus>;
        let hit = wait_for(STEP_TIMEOUT, || {
            if plan.step == Step::Delivery {
                return Some(());
            }
            let s = inspect::updater_status(d).ok()?.agent_upgrade?;
            if !mine(&s) {
                return None;
            }
            accepted.get_or_insert_with(|| t_intent.elapsed());
            let done = plan.step.seen_in(&s) || s.phase.is_terminal();
            last = Some(s);
            done.then_some(())
        });
        assert!(
            hit.is_some(),
            "round {n}: {plan:?} never reached its step within {STEP_TIMEOUT:?}; last status {last:#?}\n{}",
            d.logs()
        );
        if let (Some(accepted), true) = (accepted, accepted > Some(SLOW_ACCEPT)) {
            eprintln!(
                "round {n}: the updater had the attempt {:.1} s after the intent was written:\n{}",
                accepted.as_secs_f64(),
                d.logs()
            );
        }
        let boot_before = d.guest.boot_id();
        // why: the cut's moment is the plan's (a chosen delay after the intent), not a wait for an event
        std::thread::sleep(Duration::from_millis(plan.delay_ms));
        if let Some(s) = inspect::updater_status(d)
            .ok()
            .and_then(|s| s.agent_upgrade)
        {
            if mine(&s) {
                last = Some(s);
            }
        }
        let seen = last
            .as_ref()
            .map(describe)
            .unwrap_or_else(|| "(not at the updater yet)".into());

        self.scene.device.guest.power_cut();
        let mut at_cut = self.journal_at_cut(n, &attempt);
        let mut cuts = vec![cut_label(at_cut.as_ref())];
        if let Some(ms) = plan.flicker_ms {
            let g = &mut self.scene.device.guest;
            g.power_on_nowait();
            let booting = wait_for(Duration::from_secs(30), || g.pid1());
            assert!(booting.is_some(), "round {n}: no PID 1 after power-on");
            // why: the flicker's length is the plan's (power back for ms, then cut again)
            std::thread::sleep(Duration::from_millis(ms));
            self.scene.device.guest.power_cut();
            at_cut = self.journal_at_cut(n, &attempt);
            cuts.push(cut_label(at_cut.as_ref()));
        }
        let (want_phase, want_reason, want_version) = match &at_cut {
            // Not at the updater before the cut: the agent hands it over after the boot and it runs to its end.
            None => {
                let (phase, reason, target) = plan.kind.natural_end();
                (
                    phase,
                    reason,
                    if target { plan.target } else { self.current },
                )
            }
            Some(j) => {
                assert_eq!(
                    j.previous_link,
                    versioned(self.current),
                    "round {n}: previous link"
                );
                match j.phase {
                    JournalPhase::Committed => (JournalPhase::Committed, None, plan.target),
                    JournalPhase::Failed => (JournalPhase::Failed, j.reason, self.current),
                    JournalPhase::Preparing
                    | JournalPhase::Activating
                    | JournalPhase::RollingBack => (
                        JournalPhase::Failed,
                        Some(UpgradeReason::Interrupted),
                        self.current,
                    ),
                    JournalPhase::RollbackFailed => {
                        panic!("round {n}: rollback-failed at the cut: {j:#?}")
                    }
                }
            }
        };
        let want_sha = if want_version == self.current {
            self.current_sha.clone()
        } else {
            candidate_sha
        };

        let t_on = Instant::now();
        self.scene.device.guest.power_on();
        let d = &self.scene.device;
        let boot = d.guest.boot_id();
        assert_ne!(boot, boot_before, "round {n}: no new boot");
        let ctx = |what: &str| {
            format!(
                "round {n} ({plan:?}, cut in journal phases {cuts:?}, last seen {seen}): {what}\n{}",
                d.logs()
            )
        };

        // The updater recovered and the transaction is over, as the recovery table says.
        let status = wait_for(STEP_TIMEOUT, || {
            let s = inspect::updater_status(d).ok()?;
            let u = s.agent_upgrade.clone()?;
            (!s.recovering && mine(&u) && u.phase.is_terminal()).then_some(s)
        })
        .unwrap_or_else(|| panic!("{}", ctx("the updater did not finish recovery")));
        let journal = inspect::journal(d)
            .unwrap_or_else(|e| panic!("{}", ctx(&format!("the journal does not load: {e}"))))
            .unwrap_or_else(|| panic!("{}", ctx("no journal")));
        assert_eq!(
            (journal.phase, journal.reason),
            (want_phase, want_reason),
            "{}",
            ctx("journal after recovery")
        );
        assert_eq!(journal.attempt.attempt_id, attempt.attempt_id);
        // Recovery only appends to the history the cut left.
        let before = at_cut
            .as_ref()
            .map(|j| j.transitions.as_slice())
            .unwrap_or_default();
        let (before, after) = (before, journal.transitions.as_slice());
        assert!(
            after.starts_with(before),
            "{}",
            ctx(&format!(
                "journal history rewritten: {before:?} then {after:?}"
            ))
        );

        // Exactly one selected agent: the link names the expected versioned binary, which is a whole executable.
        let want_link = versioned(want_version);
        let selected = inspect::selected(d).unwrap_or_else(|e| panic!("{}", ctx(&e)));
        assert_eq!(selected.link, want_link, "{}", ctx("selected agent"));
        let partial = inspect::partial_downloads(d);
        let mut artifacts: Vec<&str> = partial
            .iter()
            .map(|f| f.split('.').next().unwrap_or_default())
            .collect();
        artifacts.sort_unstable();
        artifacts.dedup();
        assert!(
            artifacts.len() <= 1,
            "{}",
            ctx(&format!(
                "more than one artifact's partial download kept: {partial:?}"
            ))
        );
        let leftovers = inspect::interrupted_writes(d);
        assert!(
            leftovers.is_empty(),
            "{}",
            ctx(&format!("left over: {leftovers:?}"))
        );
        assert!(
            selected.executable_file,
            "{}",
            ctx("selected agent is not an executable file")
        );
        assert_eq!(
            selected.sha256.as_deref(),
            Some(want_sha.as_str()),
            "{}",
            ctx("selected agent's bytes")
        );

        // That agent starts and becomes ready; it is the only agent binary running.
        d.guest
            .wait_unit("fleet-agent.service", "active", RECOVERY_TIMEOUT);
        let main_pid = d.agent_pid();
        let procs = wait_for(Duration::from_secs(30), || {
            let p = inspect::agent_processes(d);
            (p.len() == 1).then_some(p)
        })
        .unwrap_or_else(|| {
            panic!(
                "{}",
                ctx(&format!(
                    "agent processes: {:?}",
                    inspect::agent_processes(d)
                ))
            )
        });
        assert_eq!(
            procs,
            vec![(main_pid, want_link.clone())],
            "{}",
            ctx("running agent")
        );
        assert_eq!(d.active_version(), want_version, "{}", ctx("--version"));

        // The socket status is the journal's, and NATS says the same, from this boot.
        let sock = status
            .agent_upgrade
            .clone()
            .unwrap_or_else(|| panic!("{}", ctx("no status")));
        let from_journal = journal.public(None, None, None);
        assert_eq!(
            (sock.phase, sock.reason, sock.transitions.phases()),
            (
                from_journal.phase,
                from_journal.reason,
                from_journal.transitions.phases()
            ),
            "{}",
            ctx("socket status vs journal")
        );
        let published = wait_for(Duration::from_secs(60), || {
            self.scene.operator.status().filter(|s| {
                mine(s)
                    && s.phase == sock.phase
                    && s.reason == sock.reason
                    && s.transitions.phases() == sock.transitions.phases()
            })
        })
        .unwrap_or_else(|| {
            panic!(
                "{}",
                ctx(&format!(
                    "NATS status never matched the socket's {sock:#?}; it is {:#?}",
                    self.scene.operator.status()
                ))
            )
        });
        let boot_hex = boot.replace('-', "");
        let info = wait_for(Duration::from_secs(60), || {
            self.scene.operator.device_info().filter(|i| {
                i.boot_id.as_ref().map(|b| b.to_string().replace('-', "")) == Some(boot_hex.clone())
            })
        })
        .unwrap_or_else(|| panic!("{}", ctx("no device info from this boot")));
        assert_eq!(
            info.agent_version.as_str(),
            want_version,
            "{}",
            ctx("device info")
        );

        // The workload runs again (or still) with its image.
        self.wait_workload(RECOVERY_TIMEOUT);
        let recovery = t_on.elapsed();

        let outcome = format!(
            "{}{} v{want_version}",
            kebab(&journal.phase),
            journal
                .reason
                .map(|r| format!("/{}", kebab(&r)))
                .unwrap_or_default(),
        );
        if at_cut.as_ref().is_none_or(|j| !j.phase.is_terminal()) {
            // The phase changed in this boot: the status says so.
            assert_eq!(
                published
                    .boot_id
                    .as_ref()
                    .map(|b| b.to_string().replace('-', "")),
                Some(boot_hex),
                "{}",
                ctx("published status's boot id")
            );
        }
        self.current = want_version;
        self.current_sha = want_sha;
        Row {
            round: n,
            plan,
            seen,
            at_cut: cuts,
            outcome,
            accepted,
            recovery,
            round_time: t0.elapsed(),
        }
    }
}

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    Some(
        v.trim()
            .parse()
            .unwrap_or_else(|e| panic!("{name}={v:?} is not a whole number: {e}")),
    )
}

fn print_row(r: &Row) {
    eprintln!(
        "{:>5}  {:<11} {:<6} {:<12} {:>11}  {:<54} {:<23} {:<26} {:>7} {:>7.1} {:>7.1}",
        r.round,
        format!("{:?}", r.plan.kind),
        r.plan.target,
        format!("{:?}", r.plan.step),
        format!(
            "{}{}",
            r.plan.delay_ms,
            r.plan
                .flicker_ms
                .map(|f| format!(", {f}"))
                .unwrap_or_default()
        ),
        r.seen,
        r.at_cut.join(">"),
        r.outcome,
        r.accepted
            .map(|a| format!("{:.1}", a.as_secs_f64()))
            .unwrap_or_else(|| "-".into()),
        r.recovery.as_secs_f64(),
        r.round_time.as_secs_f64()
    );
}

#[test]
fn power_cuts_at_random_moments_of_agent_upgrades_leave_one_working_agent() {
    let _one = one_device_at_a_time();
    let rounds = env_u64("FLEET_POWERCUT_ROUNDS").unwrap_or(u64::from(DEFAULT_ROUNDS));
    let rounds = u32::try_from(rounds).expect("FLEET_POWERCUT_ROUNDS fits in 32 bits");
    let seed = env_u64("FLEET_POWERCUT_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    });
    eprintln!(
        "power-cut loop: {rounds} rounds, seed {seed} (replay with FLEET_POWERCUT_SEED={seed})"
    );
    let started = Instant::now();
    let mut rig = Rig::start();
    eprintln!("device ready in {:.1} s", started.elapsed().as_secs_f64());
    eprintln!(
        "{:>5}  {:<11} {:<6} {:<12} {:>11}  {:<54} {:<23} {:<26} {:>7} {:>7} {:>7}",
        "round",
        "kind",
        "target",
        "cut after",
        "+ms, again",
        "last status seen",
        "journal@cut",
        "after boot",
        "sent s",
        "recov s",
        "round s"
    );
    let mut rng = Rng(seed);
    let mut rows = vec![];
    for n in 1..=rounds {
        let plan = Plan::draw(&mut rng, rig.current);
        let row = rig.round(n, plan);
        print_row(&row);
        rows.push(row);
    }
    let mut covered: Vec<(String, usize)> = vec![];
    for r in &rows {
        let k = r.at_cut.join(">");
        match covered.iter_mut().find(|(p, _)| *p == k) {
            Some((_, c)) => *c += 1,
            None => covered.push((k, 1)),
        }
    }
    let total = started.elapsed();
    eprintln!(
        "{rounds} rounds passed in {:.0} s ({:.1} s a round after {:.1} s of set-up); journal phases at the cut: {covered:?}; seed {seed}",
        total.as_secs_f64(),
        rows.iter().map(|r| r.round_time.as_secs_f64()).sum::<f64>() / f64::from(rounds.max(1)),
        total.as_secs_f64() - rows.iter().map(|r| r.round_time.as_secs_f64()).sum::<f64>()
    );
}
