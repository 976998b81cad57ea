//! Staged AgentRelease rollouts on three whole devices, every part real: `kubectl apply` an AgentRelease with a
//! `rollout` section → kube-apiserver + etcd → the `fleet-operator` binary → nats-server (with the auth callout) →
//! three nspawn Debian devices installed with device setup, one labelled `canary=true`. The devices are set up
//! once and the scenarios run on them in order:
//!
//! 1. A latent bug: a 3.0.0 build that passes its probe and readiness, commits, then dies 30 s after it started
//!    (SIGKILL, so systemd restarts it). The canary fails its soak (its agent restarted), the release halts with
//!    the canary named (`kubectl get frel`, `kubectl describe frel`), and the other two devices never get an
//!    intent (read from the `agent-upgrade-intent` bucket).
//! 2. A good 2.0.0 release with a soak and `maxUnavailable: 1`, whose artifact is not on the server yet: the
//!    canary's download fails (404), the release halts; the artifact is published and the documented retry (a new
//!    value of the `fleet.nationtech.io/retry` annotation) gives the canary a new attempt; it commits, soaks, then
//!    the others follow one at a time, each only after the one before it soaked (the intents' NATS times against
//!    the devices' commit times), with the progress in `kubectl get frel` at each step.
//!
//! Not here: a device whose updater stops mid-download is stalled only after the `preparing` bound plus one
//! resync (10 min), too long for this suite; the planner's stall rule is table-tested in
//! `operator/src/rollout.rs` and the Device/alert side in `operator/src/mirror.rs` and
//! `operator/src/dashboard/alerts.rs`.

use fleet_rig::nats_client as nats;
use fleet_vm_tests::builds::{self, V2, V3};
use fleet_vm_tests::local_fleet::{group_yaml, release_yaml, LocalFleet, REAL_V3};
use fleet_wire::{kv, AgentUpgradeAttempt, AgentUpgradeStatus, Timestamp, UpgradePhase};
use std::time::{Duration, Instant};

const CANARY: &str = "roll-1";
const OTHERS: [&str; 2] = ["roll-2", "roll-3"];
/// One upgrade (download, probe, cutover, commit) on a loaded 2-core machine, well within this.
const UPGRADE_TIMEOUT: Duration = Duration::from_secs(300);
/// The good release's soak.
const SOAK_SECS: u64 = 15;

/// The latent bug: probes and starts as the real 3.0.0 (so it passes its self-test, becomes ready and commits),
/// then is SIGKILLed 30 s after it started; systemd (`Restart=on-failure`) starts it again, and again.
fn latent_bug() -> String {
    format!(
        "# a {V3} that commits, then dies 30 s after each start\n\
         case \"$1\" in --self-test|--version|--help) exec {REAL_V3} \"$@\" ;; esac\n\
         ( sleep 30; kill -KILL $$ ) &\n\
         exec {REAL_V3} \"$@\""
    )
}

/// `release_yaml` with a `rollout` section (`spec.rollout`, indented as a spec field).
fn staged(yaml: String, soak_secs: u64) -> String {
    format!("{yaml}  rollout:\n    soakSeconds: {soak_secs}\n    maxUnavailable: 1\n")
}

/// The `agent-upgrade-intent` bucket, read as the services' own NATS user.
struct Intents(nats::kv::Store);

impl Intents {
    fn open(fleet: &LocalFleet) -> Self {
        let js = nats::jetstream::new(fleet.nats.connect());
        Self(
            js.key_value(kv::AGENT_UPGRADE_INTENT)
                .unwrap_or_else(|e| panic!("open {}: {e}", kv::AGENT_UPGRADE_INTENT)),
        )
    }

    /// The device's current intent and when NATS stored it.
    fn of(&self, device: &str) -> Option<(AgentUpgradeAttempt, Timestamp)> {
        let e = self.0.entry(device).ok()??;
        let a = serde_json::from_slice(&e.value).ok()?;
        Some((a, Timestamp::from_unix_ms(e.created_unix_ms)))
    }
}

/// `status.rollout` of the release, as numbers: (phase, updated, healthy, soaking, updating, pending, failed).
type Counts = (String, u64, u64, u64, u64, u64, u64);

fn rollout(fleet: &LocalFleet, name: &str) -> Option<Counts> {
    let r = fleet.cluster.get_json(&["frel", name])?;
    let s = &r["status"]["rollout"];
    let n = |k: &str| s[k].as_u64().unwrap_or(0);
    Some((
        s["phase"].as_str()?.to_string(),
        n("updated"),
        n("healthy"),
        n("soaking"),
        n("updating"),
        n("pending"),
        n("failed"),
    ))
}

/// The release's condition `type_` as (status, reason, message).
fn condition(fleet: &LocalFleet, name: &str, type_: &str) -> Option<(String, String, String)> {
    let r = fleet.cluster.get_json(&["frel", name])?;
    let c = r["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)?
        .clone();
    let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
    Some((s("status"), s("reason"), s("message")))
}

/// The `kubectl get frel` row as a person reads it: NAME DEVICES PHASE UPDATED HEALTHY PENDING FAILED …
fn row(fleet: &LocalFleet, name: &str) -> Vec<String> {
    let table = fleet.cluster.kubectl(&["get", "frel", name]);
    table
        .lines()
        .nth(1)
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// The device's agent-upgrade status as its Device shows it.
fn upgrade(fleet: &LocalFleet, id: &str) -> Option<AgentUpgradeStatus> {
    fleet.view(id)?.upgrade
}

fn logs(fleet: &LocalFleet) -> String {
    fleet.device_logs()
        + &format!(
            "\n--- fleet-operator ---\n{}",
            fleet.cluster.operator_log(60)
        )
}

#[test]
fn staged_rollouts_halt_on_a_latent_bug_retry_and_go_one_at_a_time() {
    let started = Instant::now();
    let ids: Vec<&str> = std::iter::once(CANARY).chain(OTHERS).collect();
    let fleet = LocalFleet::start(&ids);
    eprintln!("three devices set up in {:?}", started.elapsed());
    let cluster = &fleet.cluster;
    cluster.kubectl(&["label", "fdev", CANARY, "canary=true"]);
    cluster.kubectl(&["label", "fdev", "--all", "site=lab"]);
    cluster.apply(&group_yaml("lab", &[("site", "lab")]));
    let intents = Intents::open(&fleet);

    // 1. The latent bug: the canary commits, dies during its soak, and the release halts naming it.
    let (url, sha) = fleet.publish_script("fleet-agent-v3-latent", &latent_bug());
    cluster.apply(&staged(release_yaml("latent", "lab", V3, &url, &sha), 120));
    let committed = cluster.wait(
        "the canary committed the latent bug",
        UPGRADE_TIMEOUT,
        || {
            upgrade(&fleet, CANARY).filter(|u| {
                u.phase == UpgradePhase::Complete
                    && u.target_version.as_ref().map(|v| v.as_str()) == Some(V3)
            })
        },
    );
    let halted = cluster.wait("the release halted", Duration::from_secs(120), || {
        condition(&fleet, "latent", "Halted").filter(|c| c.0 == "True")
    });
    assert_eq!(halted.1, "CanaryFailed", "{halted:?}\n{}", logs(&fleet));
    assert!(
        halted
            .2
            .contains(&format!("{CANARY} (agent restarted during its soak)")),
        "{halted:?}"
    );
    // It halted after the commit, within the 30 s of the bug plus a restart and a pass.
    let halted_at = Timestamp::now();
    assert!(
        halted_at.since(committed.phase_changed_at) >= Duration::from_secs(20),
        "halted {:?} after the commit: before the bug struck?",
        halted_at.since(committed.phase_changed_at)
    );
    let r = row(&fleet, "latent");
    assert_eq!(
        r.get(2).map(String::as_str),
        Some("Halted"),
        "kubectl get frel: {r:?}"
    );
    let described = cluster.kubectl(&["describe", "frel", "latent"]);
    assert!(
        described.contains("CanaryFailed") && described.contains(CANARY),
        "kubectl describe frel:\n{described}"
    );
    // Nobody else was given it, then or a few passes later.
    std::thread::sleep(Duration::from_secs(5));
    for d in OTHERS {
        assert!(
            intents.of(d).is_none(),
            "{d} got an intent from a halted release: {:?}",
            intents.of(d)
        );
        assert_eq!(
            fleet.view(d).and_then(|v| v.agent_version).as_deref(),
            Some(builds::V1),
            "{d} left v1"
        );
    }
    eprintln!(
        "scenario 1 (latent bug halts at the canary) done at {:?}",
        started.elapsed()
    );
    cluster.kubectl(&["delete", "frel", "latent"]);

    // 2. A good 2.0.0 whose artifact is missing at first: the canary's download fails and the release halts.
    let v2 = builds::agent(V2);
    let (url, sha) = fleet.artifacts.planned(&v2, "fleet-agent-v2");
    cluster.apply(&staged(
        release_yaml("good", "lab", V2, &url, sha.as_ref()),
        SOAK_SECS,
    ));
    let halted = cluster.wait(
        "the release halted on the failed download",
        UPGRADE_TIMEOUT,
        || condition(&fleet, "good", "Halted").filter(|c| c.0 == "True"),
    );
    assert_eq!(halted.1, "CanaryFailed", "{halted:?}");
    assert!(
        halted.2.contains(&format!("{CANARY} (attempt failed)")),
        "{halted:?}"
    );
    let first = intents.of(CANARY).expect("the canary's intent").0;
    assert_eq!(first.target_version.as_str(), V2, "{first:?}");
    let failed = upgrade(&fleet, CANARY).expect("status");
    assert_eq!(failed.phase, UpgradePhase::Failed, "{failed:#?}");
    for d in OTHERS {
        assert!(intents.of(d).is_none(), "{d} released past a failed canary");
    }

    // The fix and the documented retry: a new attempt for the canary, then the rollout goes on.
    fleet.artifacts.publish(&v2, "fleet-agent-v2");
    cluster.kubectl(&[
        "annotate",
        "frel",
        "good",
        "fleet.nationtech.io/retry=fixed-artifact",
        "--overwrite",
    ]);
    let retried = cluster.wait(
        "a new attempt for the canary",
        Duration::from_secs(60),
        || {
            intents
                .of(CANARY)
                .filter(|(a, _)| a.attempt_id != first.attempt_id)
        },
    );
    assert_eq!(retried.0.target_version.as_str(), V2, "{retried:?}");

    // Canary, soak, then the others one at a time: watched as a person would, `kubectl get frel` every second.
    let mut rows: Vec<Vec<String>> = vec![];
    let mut most_in_flight = 0;
    let deadline = Instant::now() + UPGRADE_TIMEOUT * 3;
    loop {
        assert!(
            Instant::now() < deadline,
            "the rollout did not complete: {:?}\n{}",
            rollout(&fleet, "good"),
            logs(&fleet)
        );
        let Some(c) = rollout(&fleet, "good") else {
            std::thread::sleep(Duration::from_secs(1));
            continue;
        };
        most_in_flight = most_in_flight.max(c.3 + c.4);
        let r = row(&fleet, "good");
        // NAME DEVICES PHASE UPDATED HEALTHY PENDING FAILED: keep each change
        if rows.last().map(|l| &l[..7.min(l.len())]) != Some(&r[..7.min(r.len())]) {
            eprintln!("kubectl get frel good: {}", r.join(" "));
            rows.push(r);
        }
        if c.0 == "Complete" {
            break;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    assert_eq!(
        most_in_flight, 1,
        "more than one device updating or soaking at once"
    );
    let last = rows.last().expect("rows");
    assert_eq!(
        last.get(1..7).map(|s| s.join(" ")),
        Some("3 Complete 3 3 0 0".to_string()),
        "kubectl get frel: {rows:?}"
    );
    // Each step was visible: one, two, then three devices updated.
    for updated in ["1", "2", "3"] {
        assert!(
            rows.iter()
                .any(|r| r.get(3).map(String::as_str) == Some(updated)),
            "no row with {updated} updated: {rows:?}"
        );
    }
    // The order, from NATS's and the devices' own times: each of the rest was given the release only after the
    // device before it committed and soaked.
    let soak = Duration::from_secs(SOAK_SECS);
    let mut before = CANARY;
    for d in OTHERS {
        let prev = upgrade(&fleet, before).expect("status");
        assert_eq!(prev.phase, UpgradePhase::Complete, "{before}: {prev:#?}");
        let (_, written) = intents.of(d).expect("intent");
        assert!(
            written.since(prev.phase_changed_at) >= soak,
            "{d}'s intent was written {:?} after {before} committed, before its {SOAK_SECS} s soak ended",
            written.since(prev.phase_changed_at)
        );
        let now = fleet.view(d).expect("device");
        assert!(now.committed(V2), "{now:#?}");
        before = d;
    }
    // The retried canary runs the release too.
    assert!(fleet.view(CANARY).expect("canary").committed(V2));
    eprintln!(
        "scenario 2 (retry, then canary, soak and one at a time) done at {:?}",
        started.elapsed()
    );
    fleet.assert_no_secrets_in_logs();
}
