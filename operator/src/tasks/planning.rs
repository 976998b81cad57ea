//! Planning a TaskRun, as pure functions: which devices the run freezes (the placement rule of
//! [`crate::fleet::placement::place`] AND the `AptFullUpgradeV1` capability), which of them are canaries, and which devices
//! are authorized right now (re-checked before every release). No I/O; table-tested.

use crate::crd::tasks::{TaskRunSpec, MAX_DEADLINE_SECONDS};
use crate::fleet::placement::{self, GroupError, Labels, PlacementError};
use fleet_wire::taskrun::MAX_PLAN_TARGETS;
use fleet_wire::DeviceId;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use std::collections::{BTreeMap, BTreeSet};

pub use crate::fleet::rollout::CANARY_LABEL;

/// Groups resolved from the DeviceGroup objects, as placement reads them.
pub type Groups = BTreeMap<String, Result<BTreeSet<DeviceId>, GroupError>>;

/// Why a run cannot be planned (now).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The spec is invalid (the run fails with `InvalidSpec`).
    #[error("{0}")]
    InvalidSpec(String),
    /// A group's source failed: planning is retried with backoff, never turned into `NoTargets`.
    #[error("{0}")]
    GroupSource(String),
    /// No authorized, matching device supports the operation (the run fails with `NoTargets`).
    #[error("no device in {groups:?} matches targetSelector and advertises AptFullUpgradeV1")]
    NoTargets {
        /// The allowed groups, for the message.
        groups: Vec<String>,
    },
}

/// The devices a run freezes, canaries apart; both sorted.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Targets {
    /// Devices labelled `canary=true`: released first.
    pub canaries: Vec<DeviceId>,
    /// The rest.
    pub others: Vec<DeviceId>,
}

/// Why `deadlineSeconds` is out of range (1 s up to [`MAX_DEADLINE_SECONDS`]): the CRD schema says so too, but an
/// API server may predate it, or a client may skip it.
pub fn deadline(seconds: u64) -> Result<(), String> {
    match (1..=MAX_DEADLINE_SECONDS).contains(&seconds) {
        true => Ok(()),
        false => Err(format!(
            "must be 1 to {MAX_DEADLINE_SECONDS}, not {seconds}"
        )),
    }
}

fn placement_error(e: PlacementError) -> PlanError {
    match e {
        PlacementError::InvalidSpec(m) => PlanError::InvalidSpec(m),
        PlacementError::GroupSource(g) => PlanError::GroupSource(g.to_string()),
        // place() never gives it (only a deployment's Secrets do).
        PlacementError::Secret(_, m) => PlanError::InvalidSpec(m),
        // place() never gives it: only a deployment's workloads are checked against WorkloadPolicies.
        PlacementError::NotAllowed(m) => PlanError::InvalidSpec(m),
    }
}

/// The run's frozen targets: members of an allowed group AND matching `targetSelector` (the one placement rule)
/// AND `capable` (the device advertises `AptFullUpgradeV1`). Canary membership is read from the labels now and
/// frozen with the plan.
pub fn plan_targets(
    spec: &TaskRunSpec,
    groups: &Groups,
    labels: &BTreeMap<DeviceId, Labels>,
    capable: impl Fn(&DeviceId) -> bool,
) -> Result<Targets, PlanError> {
    // Every problem of the spec at once, as the admission webhook names them.
    let problems = crate::validation::run_spec(spec, "spec");
    if !problems.is_empty() {
        return Err(PlanError::InvalidSpec(problems.join("; ")));
    }
    let placed = placement::place(
        &spec.placement.allowed_groups,
        &spec.placement.target_selector,
        groups,
        labels,
    )
    .map_err(placement_error)?;
    let mut t = Targets::default();
    for id in placed.into_iter().filter(|d| capable(d)) {
        let canary = labels
            .get(&id)
            .and_then(|l| l.get(CANARY_LABEL))
            .is_some_and(|v| v == "true");
        match canary {
            true => t.canaries.push(id),
            false => t.others.push(id),
        }
    }
    let total = t.canaries.len() + t.others.len();
    if total == 0 {
        return Err(PlanError::NoTargets {
            groups: spec.placement.allowed_groups.clone(),
        });
    }
    if total > MAX_PLAN_TARGETS {
        return Err(PlanError::InvalidSpec(format!(
            "{total} devices match, more than the {MAX_PLAN_TARGETS} one run may hold: narrow targetSelector"
        )));
    }
    Ok(t)
}

/// Devices authorized now: members of at least one allowed group (the selector is not re-evaluated: the plan is
/// frozen, only authorization is current). An error when a group cannot be resolved.
pub fn authorized(
    allowed_groups: &[String],
    groups: &Groups,
) -> Result<BTreeSet<DeviceId>, String> {
    // The placement rule with an empty selector is exactly "member of at least one allowed group".
    placement::place(
        allowed_groups,
        &LabelSelector::default(),
        groups,
        &BTreeMap::new(),
    )
    .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::Placement;
    use crate::fleet::placement::SelectorError;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn id(s: &str) -> DeviceId {
        DeviceId::try_from(s).expect("id")
    }
    fn ids(v: &[&str]) -> Vec<DeviceId> {
        v.iter().map(|s| id(s)).collect()
    }
    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }
    fn spec(groups: &[&str], sel: &[(&str, &str)], deadline: u64) -> TaskRunSpec {
        TaskRunSpec {
            placement: Placement {
                allowed_groups: groups.iter().map(|s| s.to_string()).collect(),
                target_selector: LabelSelector {
                    match_labels: Some(labels(sel)),
                    match_expressions: None,
                },
            },
            deadline_seconds: deadline,
            system_upgrade_v1: Default::default(),
        }
    }

    #[test]
    fn planning_table() {
        let devices: BTreeMap<DeviceId, Labels> = [
            ("a", labels(&[("site", "x"), ("canary", "true")])),
            ("b", labels(&[("site", "x")])),
            ("c", labels(&[("site", "y"), ("canary", "false")])),
            ("old", labels(&[("site", "x"), ("canary", "true")])),
        ]
        .into_iter()
        .map(|(k, v)| (id(k), v))
        .collect();
        let mut groups: Groups = BTreeMap::new();
        groups.insert(
            "prod".into(),
            Ok(ids(&["a", "b", "c", "old"]).into_iter().collect()),
        );
        groups.insert("none".into(), Ok(BTreeSet::new()));
        groups.insert(
            "broken".into(),
            Err(GroupError::Selector {
                group: "broken".into(),
                error: SelectorError::ExpressionsUnsupported,
            }),
        );
        // "old" does not advertise AptFullUpgradeV1
        let capable = |d: &DeviceId| d.as_str() != "old";
        let t = |c: &[&str], o: &[&str]| {
            Ok(Targets {
                canaries: ids(c),
                others: ids(o),
            })
        };
        let mut expr = spec(&["prod"], &[], 60);
        expr.placement.target_selector.match_expressions = Some(vec![LabelSelectorRequirement {
            key: "site".into(),
            operator: "Exists".into(),
            values: None,
        }]);
        let cases: Vec<(TaskRunSpec, Result<Targets, &str>)> = vec![
            // empty selector: every authorized capable device; canary=true only
            (spec(&["prod"], &[], 60), t(&["a"], &["b", "c"])),
            (spec(&["prod"], &[("site", "x")], 60), t(&["a"], &["b"])),
            (spec(&["prod"], &[("site", "y")], 60), t(&[], &["c"])),
            (spec(&["prod"], &[("site", "z")], 60), Err("NoTargets")),
            (spec(&["none"], &[], 60), Err("NoTargets")),
            (spec(&["prod", "broken"], &[], 60), Err("GroupSource")),
            (spec(&["missing"], &[], 60), Err("GroupSource")),
            (spec(&[], &[], 60), Err("InvalidSpec")),
            (expr, Err("InvalidSpec")),
            (spec(&["prod"], &[], 0), Err("InvalidSpec")),
            (
                spec(&["prod"], &[], MAX_DEADLINE_SECONDS + 1),
                Err("InvalidSpec"),
            ),
        ];
        for (i, (s, want)) in cases.into_iter().enumerate() {
            let got = plan_targets(&s, &groups, &devices, capable).map_err(|e| match e {
                PlanError::InvalidSpec(_) => "InvalidSpec",
                PlanError::GroupSource(_) => "GroupSource",
                PlanError::NoTargets { .. } => "NoTargets",
            });
            assert_eq!(got, want, "case {i}");
        }
        // every problem at once, each by its path, as the admission webhook names them
        assert_eq!(
            plan_targets(&spec(&[], &[], 0), &groups, &devices, capable),
            Err(PlanError::InvalidSpec(
                "spec.allowedGroups: must name at least one DeviceGroup; spec.deadlineSeconds: must be 1 to \
                 2592000, not 0"
                    .into()
            ))
        );
        assert_eq!(
            authorized(&["prod".into()], &groups).map(|s| s.len()),
            Ok(4)
        );
        assert!(authorized(&["prod".into(), "broken".into()], &groups).is_err());
    }
}
