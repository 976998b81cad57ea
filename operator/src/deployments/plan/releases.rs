//! A pass's AgentReleases: which release owns a device, the agent-upgrade intents to write, each release's status.

use super::*;

/// Agent releases: the newest release (by creation time, then UID) targeting a device owns it, and older ones
/// report the devices it took as `superseded` (no name order enters); each owned device's intent is decided once,
/// counted from that decision, and written only when the release's rollout ([`rollout::plan`]) releases it.
pub(super) fn releases(
    s: &Snapshot,
    fleet: &Fleet,
    plan: &mut Plan,
    now: Timestamp,
    new_id: &mut dyn FnMut() -> AttemptId,
) {
    let mut sorted: Vec<&Arc<AgentRelease>> = s.releases.iter().collect();
    sorted.sort_by(|a, b| {
        let key = |r: &AgentRelease| {
            (
                r.metadata.creation_timestamp.clone(),
                r.metadata.uid.clone(),
            )
        };
        key(b).cmp(&key(a))
    });
    let mut owner: BTreeMap<DeviceId, String> = BTreeMap::new();
    for r in sorted {
        let name = r.name_any();
        let result = release(s, fleet, r, &name, &mut owner, plan, now, new_id);
        let old = r.status.clone().unwrap_or_default();
        let mut next = PlacementStatus {
            observed_generation: r.metadata.generation,
            ..Default::default()
        };
        let mut wants = Vec::new();
        match &result {
            Ok(d) => {
                let c = d.counts;
                wants.push(ready_want(&Ok(format!(
                    "{}, {} up to date, {} failed",
                    devices(c.targeted),
                    c.up_to_date,
                    c.failed
                ))));
                wants.push(degraded_want(&c, &d.failed));
                let [progressing, halted] = rollout_wants(&d.rollout);
                wants.push(progressing);
                wants.push(d.kept_halt.clone().unwrap_or(halted));
                if !d.superseded.is_empty() {
                    wants.push(superseded_want(&d.superseded, d.superseded_total));
                }
                next.targeted_devices = Some(c.targeted);
                next.up_to_date = Some(c.up_to_date);
                next.failed = Some(c.failed);
                next.in_progress = Some(c.in_progress);
                next.superseded = (d.superseded_total > 0).then_some(d.superseded_total);
                next.rollout = Some(d.rollout.status.clone());
            }
            Err(e) => wants.push(ready_want(&Err(e.clone()))),
        }
        plan.releases.push(StatusPlan {
            obj: r.clone(),
            next,
            old,
            wants,
            nats: true,
        });
    }
}

/// `Superseded=True`: some targeted devices belong to newer releases (a few named, with the release).
fn superseded_want(examples: &[String], total: u32) -> Want {
    let more = (total as usize).saturating_sub(examples.len());
    let tail = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    Want {
        type_: conditions::SUPERSEDED,
        ok: true,
        reason: conditions::REASON_NEWER_RELEASE,
        message: format!(
            "{} taken by a newer AgentRelease: {}{tail}",
            devices(total),
            examples.join(", ")
        ),
    }
}

/// What one release's part of a pass found.
struct Released {
    counts: ReleaseCounts,
    failed: Vec<String>,
    rollout: rollout::Outcome,
    /// The previous `Halted` condition, kept while the halt holds and nothing fails now.
    kept_halt: Option<Want>,
    superseded: Vec<String>,
    superseded_total: u32,
}

/// A release's findings, or why it could not be placed (reason, message).
type ReleaseResult = Result<Released, (&'static str, String)>;

#[allow(clippy::too_many_arguments)]
fn release(
    s: &Snapshot,
    fleet: &Fleet,
    r: &AgentRelease,
    name: &str,
    owner: &mut BTreeMap<DeviceId, String>,
    plan: &mut Plan,
    now: Timestamp,
    new_id: &mut dyn FnMut() -> AttemptId,
) -> ReleaseResult {
    let builds: Arc<[Build]> = validate::release(r)
        .map_err(|e| (conditions::REASON_INVALID_SPEC, e))?
        .into();
    let policy = rollout::Policy::from_spec(r.spec.rollout.as_ref())
        .map_err(|e| (conditions::REASON_INVALID_SPEC, e))?;
    let targets = placement::place(
        &r.spec.placement.allowed_groups,
        &r.spec.placement.target_selector,
        &fleet.groups,
        &fleet.labels,
    )
    .map_err(|e| (e.reason(), e.to_string()))?;
    let uid = r.metadata.uid.clone().unwrap_or_else(|| name.to_owned());
    let token = rollout::token(r.annotations().get(release::RETRY_ANNOTATION));
    let old = r.status.as_ref();
    let holds = !rollout::retry_requested(old, token)
        && rollout::halt_holds(old, r.metadata.generation, token);
    let mut superseded = Vec::new();
    let mut superseded_total = 0u32;
    let mut counts = ReleaseCounts::default();
    let mut failed = Vec::new();
    let mut in_rollout = Vec::new();
    let mut writes: BTreeMap<DeviceId, IntentWrite> = BTreeMap::new();
    for dev in targets {
        if let Some(o) = owner.get(&dev) {
            superseded_total += 1;
            if superseded.len() < CONFLICT_EXAMPLES {
                superseded.push(format!("{dev} (by {o})"));
            }
            continue;
        }
        owner.insert(dev.clone(), name.to_owned());
        let info = s.info.get(dev.as_str()).map(Arc::as_ref);
        let cur = s.intents.get(dev.as_str()).map(Arc::as_ref);
        let decision = release::decide_intent(&dev, info, &builds, cur, &mut *new_id);
        let status = s.upgrades.get(dev.as_str()).map(Arc::as_ref);
        let retry = token.map(|t| release::retry_id(&uid, t, &dev));
        let retried = release::retry_attempt(&decision, cur, status, retry);
        if retried.is_none()
            && release::count_device(&mut counts, &decision, cur, status)
            && failed.len() < FAILED_EXAMPLES
        {
            failed.push(release::describe_failure(&dev, status));
        }
        if retried.is_some() {
            counts.targeted += 1;
            counts.in_progress += 1;
        }
        let mine = cur.filter(|a| builds.iter().any(|b| release::attempt_matches(a, &dev, b)));
        let observed = match &retried {
            Some(_) => Some(rollout::Observed::Pending),
            None => release::observe(
                &decision,
                mine,
                status,
                info,
                s.heartbeats.get(dev.as_str()).map(Arc::as_ref),
            ),
        };
        let Some(observed) = observed else {
            continue;
        };
        let attempt = match (retried, decision) {
            (Some(a), _) | (None, IntentDecision::Write(a)) => Some(a),
            _ => None,
        };
        if let Some(attempt) = attempt {
            writes.insert(
                dev.clone(),
                IntentWrite {
                    device: dev.clone(),
                    attempt,
                    seen: cur.cloned(),
                    info: info.cloned(),
                    builds: builds.clone(),
                },
            );
        }
        let canary = fleet
            .labels
            .get(&dev)
            .and_then(|l| l.get(rollout::CANARY_LABEL))
            .is_some_and(|v| v == "true");
        in_rollout.push(rollout::Target {
            last_heartbeat: s.heartbeats.get(dev.as_str()).map(|h| h.at),
            low_space: crate::fleet::usage::low_space(s.usage.get(dev.as_str()).map(Arc::as_ref)),
            id: dev,
            canary,
            observed,
        });
    }
    let lifted = holds
        .then(|| rollout::left_silent(old, &|d| in_rollout.iter().any(|t| t.id.as_str() == d)))
        .flatten();
    let holds = holds && lifted.is_none();
    if let Some(devices) = &lifted {
        plan.events.push(halt_lifted(r, devices));
    }
    let mut outcome = rollout::plan(&in_rollout, &policy, now);
    plan.wake_at(outcome.next_change);
    let kept_halt = held_halt(&mut outcome, holds, old);
    outcome.status.retry = token.map(str::to_owned);
    let change = blocking::change("AgentRelease", name);
    for (dev, wait) in &outcome.waits {
        let reason = blocking::reason(
            &change,
            *wait,
            || blocking::halt_why(outcome.halt.as_ref(), kept_halt.as_ref()),
            || {
                // The status of the device's current attempt, as the planner judged it failed.
                let attempt = s.intents.get(dev.as_str()).map(|a| a.attempt_id);
                let status = s.upgrades.get(dev.as_str()).map(Arc::as_ref);
                blocking::upgrade_failure(status.filter(|st| st.attempt_id == attempt))
            },
        );
        plan.blocking.entry(dev.clone()).or_default().push(reason);
    }
    for t in &in_rollout {
        if rollout::standing(t.observed, &policy, now) == rollout::Standing::Soaking {
            plan.heartbeat_watch.insert(t.id.clone());
        }
    }
    // Devices the rollout holds back were counted as in progress by their decision: they are not.
    let held = (outcome.status.pending as usize).saturating_sub(outcome.release.len());
    counts.in_progress = counts.in_progress.saturating_sub(held as u32);
    for dev in &outcome.release {
        if let Some(w) = writes.remove(dev) {
            plan.intents.push(w);
        }
    }
    Ok(Released {
        counts,
        failed,
        rollout: outcome,
        kept_halt,
        superseded,
        superseded_total,
    })
}
