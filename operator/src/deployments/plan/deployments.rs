//! A pass's FleetDeployments: each one's devices, its staged rollout, and its status.

use super::*;

/// FleetDeployment: Degraded=True while some of its workloads failed on their devices (the agent's last reconcile
/// failed or the container exited), with the count and the first failure (devices by name, stable while the same
/// devices fail); the Warning event a person sees in `kubectl describe` comes from it turning True.
fn workloads_degraded_want(h: &WorkloadHealth) -> Want {
    if h.failed == 0 {
        return Want {
            type_: conditions::DEGRADED,
            ok: false,
            reason: conditions::REASON_NO_FAILURES,
            message: "no workload has failed on a targeted device".into(),
        };
    }
    let total = h.running + h.failed + h.pending;
    let first = h
        .latest_error
        .as_deref()
        .unwrap_or("no error text reported");
    Want {
        type_: conditions::DEGRADED,
        ok: true,
        reason: conditions::REASON_WORKLOADS_FAILED,
        message: format!(
            "{} of {total} workloads failed on their devices; first: {first}",
            h.failed
        ),
    }
}

/// What the deployments part hands to their statuses.
pub(super) struct Deployed {
    results: BTreeMap<String, Result<usize, PlacementError>>,
    targets: BTreeMap<String, BTreeSet<DeviceId>>,
    workloads: BTreeMap<String, Vec<WorkloadSpec>>,
    holding: BTreeSet<String>,
    conflicts: BTreeMap<String, Vec<(DeviceId, String, String)>>,
    /// Deployments with a `rollout` section: the pass's outcome.
    rollouts: BTreeMap<String, StagedDeployment>,
    /// Per deployment, the devices its rollout holds back and what they keep.
    held: BTreeMap<String, BTreeMap<DeviceId, Arc<[WorkloadSpec]>>>,
    /// Per deployment, what its `Ready` message says of the targeted devices whose agent cannot honour its spec
    /// ([`capability`]).
    incapable: BTreeMap<String, String>,
}

/// One staged deployment's rollout in this pass.
struct StagedDeployment {
    outcome: rollout::Outcome,
    /// The previous `Halted` condition, kept while the halt holds and nothing fails now.
    kept_halt: Option<Want>,
}

/// A deployment's rollout: which targeted devices get its spec now, which keep their previous workloads
/// (returned), which failed ones a retry gives the spec again (into `plan.bump`).
#[allow(clippy::too_many_arguments)]
fn stage(
    s: &Snapshot,
    fleet: &Fleet,
    d: &FleetDeployment,
    workloads: &[WorkloadSpec],
    targets: &BTreeSet<DeviceId>,
    incapable: &BTreeMap<DeviceId, Option<String>>,
    policy: &rollout::Policy,
    now: Timestamp,
    plan: &mut Plan,
) -> (StagedDeployment, BTreeMap<DeviceId, Arc<[WorkloadSpec]>>) {
    use crate::deployments::rollout_workloads as rw;
    let old = d.status.as_ref();
    let token = rollout::token(d.annotations().get(release::RETRY_ANNOTATION));
    let retry = rollout::retry_requested(old, token);
    let holds = !retry && rollout::halt_holds(old, d.metadata.generation, token);
    let mut in_rollout = Vec::with_capacity(targets.len());
    for dev in targets {
        let current = s.desired.get(dev.as_str()).map(Arc::as_ref);
        let mut observed = rw::observe(
            workloads,
            current,
            s.workloads.get(dev.as_str()).map(Arc::as_ref),
        );
        // An agent that cannot honour the spec is never given it: a failed device, so that a canary halts the
        // rollout and the rest count against maxFailures (capability.rs); a retry does not change its agent.
        if incapable.contains_key(dev) {
            observed = rollout::Observed::Failed;
        } else if retry
            && matches!(
                observed,
                rollout::Observed::Failed
                    | rollout::Observed::CrashLooping
                    | rollout::Observed::Unhealthy
            )
        {
            plan.bump.insert(dev.clone());
            observed = rollout::Observed::Updating(None);
        }
        let canary = fleet
            .labels
            .get(dev)
            .and_then(|l| l.get(rollout::CANARY_LABEL))
            .is_some_and(|v| v == "true");
        in_rollout.push(rollout::Target {
            last_heartbeat: s.heartbeats.get(dev.as_str()).map(|h| h.at),
            low_space: crate::fleet::usage::low_space(s.usage.get(dev.as_str()).map(Arc::as_ref)),
            id: dev.clone(),
            canary,
            observed,
        });
    }
    // A halt whose only causes were devices silent in their soak that have since left lifts (rollout::left_silent).
    let lifted = holds
        .then(|| {
            rollout::left_silent(old, &|d| {
                DeviceId::try_from(d).is_ok_and(|id| targets.contains(&id))
            })
        })
        .flatten();
    let holds = holds && lifted.is_none();
    if let Some(devices) = &lifted {
        plan.events.push(halt_lifted(d, devices));
    }
    let mut outcome = rollout::plan(&in_rollout, policy, now);
    plan.wake_at(outcome.next_change);
    // A soaking device's next workload report can end its soak (a report that changes nothing else is otherwise
    // recorded quietly): its reports wake the control loop.
    for t in &in_rollout {
        if rollout::standing(t.observed, policy, now) == rollout::Standing::Soaking {
            plan.heartbeat_watch.insert(t.id.clone());
        }
    }
    let kept_halt = held_halt(&mut outcome, holds, old);
    outcome.status.retry = token.map(str::to_owned);
    let change = blocking::change("FleetDeployment", &d.name_any());
    let names: Vec<&str> = workloads.iter().map(|w| w.name.as_str()).collect();
    for (dev, wait) in &outcome.waits {
        let reason = blocking::reason(
            &change,
            *wait,
            || blocking::halt_why(outcome.halt.as_ref(), kept_halt.as_ref()),
            || {
                let report = s.workloads.get(dev.as_str()).map(Arc::as_ref);
                blocking::workload_failure(report, &names, incapable.get(dev))
            },
        );
        plan.blocking.entry(dev.clone()).or_default().push(reason);
    }
    let released: BTreeSet<&DeviceId> = outcome.release.iter().collect();
    // Devices held back mostly keep one and the same previous spec: one shared list each, so that placement
    // shares it too (it shares lists by their objects' addresses).
    let mut lists: Vec<Arc<[WorkloadSpec]>> = Vec::new();
    let held = in_rollout
        .iter()
        .filter(|t| t.observed == rollout::Observed::Pending && !released.contains(&t.id))
        .map(|t| {
            let keep = rw::previous(workloads, s.desired.get(t.id.as_str()).map(Arc::as_ref));
            let list = match lists.iter().find(|l| l[..] == keep[..]) {
                Some(l) => l.clone(),
                None if lists.len() < HELD_LISTS => {
                    lists.push(keep.into());
                    lists[lists.len() - 1].clone()
                }
                None => keep.into(),
            };
            (t.id.clone(), list)
        })
        .collect();
    (StagedDeployment { outcome, kept_halt }, held)
}

pub(super) fn deployments(
    s: &Snapshot,
    fleet: &Fleet,
    plan: &mut Plan,
    now: Timestamp,
) -> Deployed {
    let mut incapable_of = BTreeMap::new();
    // Per placed deployment: the devices given its spec, its workload names, its pull credentials.
    type Credentials = (
        BTreeSet<DeviceId>,
        BTreeSet<String>,
        BTreeMap<String, RegistryAuth>,
    );
    let mut credentials: BTreeMap<String, Credentials> = BTreeMap::new();
    let mut inputs = Vec::new();
    let mut results = BTreeMap::new();
    let mut targets_of = BTreeMap::new();
    let mut rollouts = BTreeMap::new();
    let policies: Vec<crate::deployments::policy::Policy> = s
        .policies
        .iter()
        .map(|p| crate::deployments::policy::Policy::of(p))
        .collect();
    for d in &s.deployments {
        // Unknown fields (kept by the CRD, dropped by the typed spec) and every other problem make the spec
        // invalid, all named as the webhook names them.
        let workloads = validate::deployment(d);
        // The rollout section is checked like an AgentRelease's: out of range is an invalid spec.
        let policy = rollout::Policy::from_spec(d.spec.rollout.as_ref());
        let workloads = match (workloads, &policy) {
            (Ok(_), Err(e)) => Err(e.clone()),
            (w, _) => w,
        };
        let targets = match &workloads {
            Err(e) => Err(PlacementError::InvalidSpec(e.clone())),
            // Fail closed whatever the webhook did: placed nowhere new, what runs is held (`NotAllowed`).
            Ok(w) => match crate::deployments::policy::check(
                &crate::deployments::policy::Deployment {
                    namespace: d.metadata.namespace.as_deref(),
                    allowed_groups: &d.spec.placement.allowed_groups,
                    workloads: w,
                },
                &policies,
            ) {
                Err(e) => Err(PlacementError::NotAllowed(e)),
                Ok(()) => placement::place(
                    &d.spec.placement.allowed_groups,
                    &d.spec.placement.target_selector,
                    &fleet.groups,
                    &fleet.labels,
                ),
            },
        };
        // Each secret use pinned to its Secret's version, the pull Secrets' credentials read (secrets.rs); a
        // Secret that cannot be used fails the deployment closed, like an invalid spec.
        let resolved = workloads.as_ref().ok().map(|w| {
            let pull: Vec<String> = d
                .spec
                .image_pull_secrets
                .iter()
                .map(|r| r.name.clone())
                .collect();
            secrets::resolve(&s.secrets_namespace, w, &pull, &s.secrets)
        });
        let targets = match (targets, &resolved) {
            (Ok(_), Some(Err(e))) => Err(PlacementError::Secret(e.reason, e.message.clone())),
            (t, _) => t,
        };
        results.insert(
            d.name_any(),
            targets.as_ref().map(|t| t.len()).map_err(Clone::clone),
        );
        if let Ok(t) = &targets {
            targets_of.insert(d.name_any(), t.clone());
        }
        let mut registries = None;
        let workloads = match workloads {
            Ok(w) => match resolved {
                Some(Ok(r)) => {
                    registries = Some(r.registries);
                    r.workloads
                }
                _ => w,
            },
            // Invalid workloads: what is placed under the names the spec gives is held (the placed specs
            // themselves, read back), so a typo never takes running workloads off devices.
            Err(_) => {
                let names = validate::raw_workload_names(&d.spec);
                let mut held: BTreeMap<&str, WorkloadSpec> = BTreeMap::new();
                for w in s.desired.values().flat_map(|s| &s.workloads) {
                    if names.contains(w.name.as_str()) {
                        held.entry(w.name.as_str()).or_insert_with(|| w.clone());
                    }
                }
                held.into_values().collect()
            }
        };
        let incapable = match &targets {
            Ok(t) => capability::incapable(&workloads, t, &s.info),
            Err(_) => BTreeMap::new(),
        };
        let mut held = BTreeMap::new();
        if let (Ok(t), Ok(policy), Some(_)) = (&targets, &policy, &d.spec.rollout) {
            let (staged, h) = stage(s, fleet, d, &workloads, t, &incapable, policy, now, plan);
            rollouts.insert(d.name_any(), staged);
            held = h;
        }
        // A device whose agent cannot honour the spec keeps what it has (capability.rs).
        for dev in incapable.keys() {
            held.entry(dev.clone()).or_insert_with(|| {
                let current = s.desired.get(dev.as_str()).map(Arc::as_ref);
                crate::deployments::rollout_workloads::previous(&workloads, current).into()
            });
        }
        if let Some(m) = capability::message(&workloads, &incapable, FAILED_EXAMPLES) {
            incapable_of.insert(d.name_any(), m);
        }
        if let Ok(t) = &targets {
            let given = t.iter().filter(|d| !incapable.contains_key(*d)).cloned();
            let names = workloads.iter().map(|w| w.name.as_str().to_owned());
            credentials.insert(
                d.name_any(),
                (
                    given.collect(),
                    names.collect(),
                    registries.unwrap_or_default(),
                ),
            );
        }
        inputs.push(DeploymentInput {
            name: d.name_any(),
            workloads,
            targets,
            held,
        });
    }
    // Each device's current workloads: only a deployment whose placement failed reads them (to hold what runs).
    let current: BTreeMap<DeviceId, Vec<WorkloadSpec>> = if inputs.iter().all(|i| i.targets.is_ok())
    {
        BTreeMap::new()
    } else {
        s.desired
            .values()
            .map(|d| (d.device_id.clone(), d.workloads.clone()))
            .collect()
    };
    // Failed deployments that hold something on some device (a new object holds nothing).
    let holding = inputs
        .iter()
        .filter(|i| i.targets.is_err())
        .filter(|i| {
            let names: BTreeSet<&str> = i.workloads.iter().map(|w| w.name.as_str()).collect();
            current
                .values()
                .any(|ws| ws.iter().any(|w| names.contains(w.name.as_str())))
        })
        .map(|i| i.name.clone())
        .collect();
    let device_set: BTreeSet<DeviceId> = fleet.labels.keys().cloned().collect();
    let mut desired = placement::desired_workloads(&device_set, &inputs, &current);
    // A held device (its Device was deleted and recreated) keeps exactly what it has until a person releases it.
    for id in &fleet.held {
        match s.desired.get(id.as_str()) {
            Some(st) => {
                desired
                    .per_device
                    .insert(id.clone(), st.workloads.clone().into());
            }
            None => {
                desired.per_device.remove(id);
            }
        }
    }
    plan.desired = desired.per_device;
    // What each device's device-secrets key holds for the desired states just decided (secrets.rs).
    let placed: Vec<secrets::Placed> = credentials
        .values()
        .map(|(targets, names, registries)| secrets::Placed {
            targets,
            names: names.iter().map(String::as_str).collect(),
            registries,
        })
        .collect();
    plan.device_secrets =
        secrets::deliveries(&plan.desired, &placed, &s.secrets, &s.device_secrets);
    let mut workloads = BTreeMap::new();
    let mut held = BTreeMap::new();
    for i in inputs {
        if !i.held.is_empty() {
            held.insert(i.name.clone(), i.held);
        }
        workloads.insert(i.name, i.workloads);
    }
    Deployed {
        results,
        targets: targets_of,
        workloads,
        holding,
        conflicts: desired.conflicts,
        rollouts,
        held,
        incapable: incapable_of,
    }
}

pub(super) fn deployment_statuses(s: &Snapshot, d: Deployed, plan: &mut Plan) {
    for obj in &s.deployments {
        let name = obj.name_any();
        let result = match d.results.get(&name) {
            Some(Ok(n)) => match d.conflicts.get(&name) {
                Some(c) => Err((
                    conditions::REASON_CONFLICT,
                    format!(
                        "{} workload placements lost to deployments whose name sorts first, e.g. {} on {} (kept by {})",
                        c.len(), c[0].1, c[0].0, c[0].2
                    ),
                )),
                None => Ok(match d.incapable.get(&name) {
                    Some(m) => format!("placed on {}; {m}", devices(*n as u32)),
                    None => format!("placed on {}", devices(*n as u32)),
                }),
            },
            Some(Err(e)) if d.holding.contains(&name) => Err((
                e.reason(),
                format!("{e}; workloads already placed are kept unchanged"),
            )),
            Some(Err(e)) => Err((
                e.reason(),
                format!("{e}; nothing is placed until this is fixed"),
            )),
            None => continue,
        };
        let targeted = d
            .results
            .get(&name)
            .and_then(|r| r.as_ref().ok())
            .map(|n| *n as u32);
        // Health over the workloads each targeted device was actually given (a lost name conflict is not).
        let health = d.targets.get(&name).map(|targets| {
            let mine = d
                .workloads
                .get(&name)
                .map(Vec::as_slice)
                .unwrap_or_default();
            let lost = d.conflicts.contains_key(&name);
            let held = d.held.get(&name);
            health::deployment(targets.iter().flat_map(|dev| {
                let on_device = plan.desired.get(dev);
                let report = s.workloads.get(dev.as_str()).map(Arc::as_ref);
                // A device the rollout holds back is judged on what it keeps.
                let given = held.and_then(|h| h.get(dev)).map_or(mine, |l| &l[..]);
                given
                    .iter()
                    .filter(move |w| !lost || on_device.is_some_and(|l| l.contains(w)))
                    .map(move |w| (dev.as_str(), w, report))
            }))
        });
        let staged = d.rollouts.get(&name);
        let mut wants: Vec<Want> = std::iter::once(ready_want(&result))
            .chain(health.as_ref().map(workloads_degraded_want))
            .collect();
        if let Some(r) = staged {
            let [progressing, halted] = rollout_wants(&r.outcome);
            wants.push(progressing);
            wants.push(r.kept_halt.clone().unwrap_or(halted));
        }
        plan.deployments.push(StatusPlan {
            obj: obj.clone(),
            old: obj.status.clone().unwrap_or_default(),
            next: PlacementStatus {
                observed_generation: obj.metadata.generation,
                targeted_devices: targeted,
                workloads: health.clone(),
                rollout: staged.map(|r| r.outcome.status.clone()),
                ..Default::default()
            },
            wants,
            nats: true,
        });
    }
}
