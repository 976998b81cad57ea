//! Placement, as pure functions: label selectors, group membership, which devices a FleetDeployment or
//! AgentRelease targets, and each device's desired workloads. No I/O; table-tested.

use crate::crd::DeviceGroupSpec;
use fleet_wire::{DeviceId, WorkloadSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

/// Labels of one device.
pub type Labels = BTreeMap<String, String>;

/// A selector the operator cannot evaluate (fails closed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// `matchExpressions` is not implemented; nothing is selected until it is removed.
    #[error(
        "matchExpressions is not supported yet; use matchLabels (nothing is selected until then)"
    )]
    ExpressionsUnsupported,
}

/// Whether `labels` satisfy `sel`: every `matchLabels` pair must be present; an empty selector matches everything;
/// any `matchExpressions` is an error.
pub fn selector_matches(sel: &LabelSelector, labels: &Labels) -> Result<bool, SelectorError> {
    if sel
        .match_expressions
        .as_ref()
        .is_some_and(|e| !e.is_empty())
    {
        return Err(SelectorError::ExpressionsUnsupported);
    }
    Ok(sel
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v)))
}

/// Why a group has no usable member list. Never the same as an empty group.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GroupError {
    /// No DeviceGroup of that name exists.
    #[error("DeviceGroup {0:?} does not exist")]
    NotFound(String),
    /// The group's selector cannot be evaluated.
    #[error("DeviceGroup {group:?} selector: {error}")]
    Selector {
        /// The group.
        group: String,
        /// Why.
        error: SelectorError,
    },
    /// The group names no way of selecting devices: no `selectAll`, no `devices`, an empty or absent selector.
    /// An empty selector used to select every device; it now selects none, and says so.
    #[error("DeviceGroup {0:?} selects no device: its selector is empty and neither selectAll nor devices is given (an empty selector no longer selects every device: set selectAll: true for the whole fleet, or list devices or matchLabels)")]
    SelectsNothing(String),
    /// The group's spec is invalid (bad device ids, `selectAll` combined with another field).
    #[error("DeviceGroup {group:?}: {message}")]
    InvalidSpec {
        /// The group.
        group: String,
        /// Every problem, `; `-separated.
        message: String,
    },
}

impl GroupError {
    /// The reason of the group's own `Ready=False` condition (a deployment relying on the group reports
    /// `GroupSourceError` whatever the cause).
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NotFound(_) | Self::Selector { .. } => "GroupSourceError",
            Self::SelectsNothing(_) => "EmptySelector",
            Self::InvalidSpec { .. } => "InvalidSpec",
        }
    }
}

/// How a DeviceGroup picks its members, validated from its spec by [`membership`].
#[derive(Debug, Clone, PartialEq)]
pub enum Membership<'a> {
    /// `selectAll: true`: every device.
    All,
    /// The listed devices plus those whose labels match `selector` (`None`: no label selection).
    Chosen {
        /// Listed device ids.
        devices: BTreeSet<DeviceId>,
        /// A selector with at least one term.
        selector: Option<&'a LabelSelector>,
    },
}

fn selector_is_empty(sel: &LabelSelector) -> bool {
    sel.match_labels.as_ref().is_none_or(|m| m.is_empty())
        && sel.match_expressions.as_ref().is_none_or(|e| e.is_empty())
}

/// Every problem of a group's spec that makes it invalid (reason `InvalidSpec`), each with its full path:
/// `selectAll` beside a selector or a list, an invalid or repeated device id; empty: valid.
pub fn membership_problems(spec: &DeviceGroupSpec) -> Vec<String> {
    let selector = spec.selector.as_ref().filter(|s| !selector_is_empty(s));
    let mut errors = Vec::new();
    if spec.select_all && (selector.is_some() || !spec.devices.is_empty()) {
        errors.push(
            "spec.selectAll: true selects every device and cannot be combined with selector or devices"
                .to_owned(),
        );
    }
    let mut devices = BTreeSet::new();
    for (i, d) in spec.devices.iter().enumerate() {
        match DeviceId::try_from(d.as_str()) {
            Ok(id) => {
                if !devices.insert(id) {
                    errors.push(format!("spec.devices[{i}]: {d:?} appears twice"));
                }
            }
            Err(e) => errors.push(format!("spec.devices[{i}]: {e}")),
        }
    }
    errors
}

/// Validates group `name`'s spec into its [`Membership`], naming every problem at once ([`membership_problems`]).
pub fn membership<'a>(name: &str, spec: &'a DeviceGroupSpec) -> Result<Membership<'a>, GroupError> {
    let selector = spec.selector.as_ref().filter(|s| !selector_is_empty(s));
    let errors = membership_problems(spec);
    if !errors.is_empty() {
        return Err(GroupError::InvalidSpec {
            group: name.to_owned(),
            message: errors.join("; "),
        });
    }
    let devices: BTreeSet<DeviceId> = spec
        .devices
        .iter()
        .filter_map(|d| DeviceId::try_from(d.as_str()).ok())
        .collect();
    if let Some(sel) = selector {
        // A selector that cannot be evaluated is an error even when there are no devices to evaluate it on: an
        // empty fleet must not turn a broken group into a group of 0.
        selector_matches(sel, &Labels::new()).map_err(|error| GroupError::Selector {
            group: name.to_owned(),
            error,
        })?;
    }
    match (spec.select_all, selector, devices.is_empty()) {
        (true, _, _) => Ok(Membership::All),
        (false, None, true) => Err(GroupError::SelectsNothing(name.to_owned())),
        (false, selector, _) => Ok(Membership::Chosen { devices, selector }),
    }
}

/// Resolves a group's members among `devices`.
pub fn resolve_group(
    name: &str,
    spec: &DeviceGroupSpec,
    devices: &BTreeMap<DeviceId, Labels>,
) -> Result<BTreeSet<DeviceId>, GroupError> {
    let (listed, selector) = match membership(name, spec)? {
        Membership::All => return Ok(devices.keys().cloned().collect()),
        Membership::Chosen { devices, selector } => (devices, selector),
    };
    // Collected in key order, so the set is built in bulk rather than by one insert per member.
    devices
        .iter()
        .filter_map(|(id, labels)| {
            if listed.contains(id) {
                return Some(Ok(id.clone()));
            }
            match selector.map(|s| selector_matches(s, labels)) {
                Some(Ok(true)) => Some(Ok(id.clone())),
                None | Some(Ok(false)) => None,
                Some(Err(error)) => Some(Err(GroupError::Selector {
                    group: name.to_owned(),
                    error,
                })),
            }
        })
        .collect()
}

/// Every group resolved among `devices`, by name.
pub fn resolve_groups(
    groups: &[std::sync::Arc<crate::crd::DeviceGroup>],
    devices: &BTreeMap<DeviceId, Labels>,
) -> BTreeMap<String, Result<BTreeSet<DeviceId>, GroupError>> {
    use kube::ResourceExt;
    groups
        .iter()
        .map(|g| {
            let name = g.name_any();
            // Fields the typed spec dropped (`selector: {matchLabel: …}` reads as "no selector"): refused, never
            // resolved into a different group.
            let members = match crate::schema::refusal(g.as_ref()) {
                // with every other problem of its spec, as the webhook names them
                Some(_) => Err(GroupError::InvalidSpec {
                    group: name.clone(),
                    message: crate::validation::refusal_of(
                        g.as_ref(),
                        crate::validation::group_spec(&g.spec),
                    )
                    .unwrap_or_default(),
                }),
                None => resolve_group(&name, &g.spec, devices),
            };
            (name, members)
        })
        .collect()
}

/// The ids a group lists in `devices` that have no Device (yet): shown in the group's condition, so a mistyped id
/// is visible.
pub fn unknown_listed<'a>(
    spec: &'a DeviceGroupSpec,
    devices: &BTreeMap<DeviceId, Labels>,
) -> Vec<&'a str> {
    spec.devices
        .iter()
        .filter(|d| DeviceId::try_from(d.as_str()).is_ok_and(|id| !devices.contains_key(&id)))
        .map(String::as_str)
        .collect()
}

/// Why a placed object targets nothing (fail closed: its previous placement is held, see [`desired_workloads`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    /// The object's spec is invalid (condition reason `InvalidSpec`).
    #[error("{0}")]
    InvalidSpec(String),
    /// A group it relies on could not be resolved (condition reason `GroupSourceError`).
    #[error("{0}")]
    GroupSource(GroupError),
    /// A Secret it names cannot be used (condition reason `SecretMissing`, `SecretInvalid` or `SecretUnreadable`:
    /// [`crate::deployments::secrets`]); the message names the Secret and key, never a value.
    #[error("{1}")]
    Secret(&'static str, String),
    /// Its workloads ask for hardware or privileges no WorkloadPolicy allows (condition reason `NotAllowed`:
    /// [`crate::deployments::policy`]).
    #[error("{0}")]
    NotAllowed(String),
}

impl PlacementError {
    /// The condition reason for this error.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::InvalidSpec(_) => "InvalidSpec",
            Self::GroupSource(_) => "GroupSourceError",
            Self::Secret(reason, _) => reason,
            Self::NotAllowed(_) => crate::conditions::REASON_NOT_ALLOWED,
        }
    }
}

/// Devices targeted: members of at least one of `allowed_groups` AND matching `target`.
pub fn place(
    allowed_groups: &[String],
    target: &LabelSelector,
    groups: &BTreeMap<String, Result<BTreeSet<DeviceId>, GroupError>>,
    devices: &BTreeMap<DeviceId, Labels>,
) -> Result<BTreeSet<DeviceId>, PlacementError> {
    if allowed_groups.is_empty() {
        return Err(PlacementError::InvalidSpec(
            "allowedGroups must name at least one DeviceGroup".into(),
        ));
    }
    if target
        .match_expressions
        .as_ref()
        .is_some_and(|e| !e.is_empty())
    {
        return Err(PlacementError::InvalidSpec(format!(
            "targetSelector: {}",
            SelectorError::ExpressionsUnsupported
        )));
    }
    // Borrowed and merged (each group is sorted already), then cloned once per targeted device.
    let mut authorized: Vec<&DeviceId> = Vec::new();
    for g in allowed_groups {
        match groups.get(g) {
            None => return Err(PlacementError::GroupSource(GroupError::NotFound(g.clone()))),
            Some(Err(e)) => return Err(PlacementError::GroupSource(e.clone())),
            Some(Ok(members)) => authorized.extend(members.iter()),
        }
    }
    authorized.sort_unstable();
    authorized.dedup();
    // An empty `matchLabels` reads no label: skip looking each device up.
    let reads_labels = target.match_labels.as_ref().is_some_and(|m| !m.is_empty());
    let no_labels = Labels::new();
    authorized
        .into_iter()
        .filter_map(|id| {
            let labels = match reads_labels {
                true => devices.get(id).unwrap_or(&no_labels),
                false => &no_labels,
            };
            match selector_matches(target, labels) {
                Ok(true) => Some(Ok(id.clone())),
                Ok(false) => None,
                Err(e) => Some(Err(PlacementError::InvalidSpec(e.to_string()))),
            }
        })
        .collect()
}

/// One FleetDeployment's placement input.
#[derive(Debug, Clone)]
pub struct DeploymentInput {
    /// Its name.
    pub name: String,
    /// Its validated workloads.
    pub workloads: Vec<WorkloadSpec>,
    /// Where it goes, or why that is unknown.
    pub targets: Result<BTreeSet<DeviceId>, PlacementError>,
    /// Targeted devices its rollout has not given the change yet, with what they keep instead of `workloads`
    /// (their previous workloads of this deployment, see [`crate::deployments::rollout_workloads::previous`]).
    pub held: BTreeMap<DeviceId, Arc<[WorkloadSpec]>>,
}

/// Result of [`desired_workloads`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DesiredWorkloads {
    /// Each device's workloads, sorted by name. Devices given the same workloads share one list (a deployment
    /// on 10,000 devices is one list, not 10,000 copies).
    pub per_device: BTreeMap<DeviceId, Arc<[WorkloadSpec]>>,
    /// Deployments that lost a workload-name conflict: deployment → (device, workload name, winner).
    pub conflicts: BTreeMap<String, Vec<(DeviceId, String, String)>>,
}

/// Computes every device's workloads from the deployments.
///
/// A deployment whose placement failed fails closed *without* tearing down: on each device, workloads that
/// `current` already has under one of that deployment's workload names are held unchanged (unless a placed
/// deployment claims that name), so a typo or a broken group never stops running workloads. Two placed
/// deployments placing the same workload name on one device conflict: the one whose name sorts first keeps it.
pub fn desired_workloads<'a>(
    devices: &'a BTreeSet<DeviceId>,
    deployments: &'a [DeploymentInput],
    current: &'a BTreeMap<DeviceId, Vec<WorkloadSpec>>,
) -> DesiredWorkloads {
    let mut conflicts: BTreeMap<String, Vec<(DeviceId, String, String)>> = BTreeMap::new();
    // Each device's workloads with the deployment that placed them, borrowed: cloned once, at the end.
    let mut placed: BTreeMap<&DeviceId, Vec<(&WorkloadSpec, &str)>> = BTreeMap::new();
    // Placed deployments claim workload names first (in name order); failed ones only hold what is left.
    let mut sorted: Vec<&DeploymentInput> = deployments.iter().collect();
    sorted.sort_by(|a, b| (a.targets.is_err(), &a.name).cmp(&(b.targets.is_err(), &b.name)));
    for d in &sorted {
        let mut add = |dev: &'a DeviceId, w: &'a WorkloadSpec| {
            let on_device = placed.entry(dev).or_default();
            // A device carries few workloads (a valid desired state at most fleet_wire::workload::MAX_WORKLOADS): a scan
            // of its list is cheaper than a map keyed by (device, name).
            if let Some((_, winner)) = on_device.iter().find(|(x, _)| x.name == w.name) {
                if *winner != d.name && d.targets.is_ok() {
                    conflicts.entry(d.name.clone()).or_default().push((
                        dev.clone(),
                        w.name.as_str().to_owned(),
                        (*winner).to_owned(),
                    ));
                }
                return;
            }
            on_device.push((w, &d.name));
        };
        match &d.targets {
            Ok(targets) => {
                for dev in targets.iter().filter(|t| devices.contains(*t)) {
                    let ws = d.held.get(dev).map_or(&d.workloads[..], |l| &l[..]);
                    for w in ws {
                        add(dev, w);
                    }
                }
            }
            Err(_) => {
                let names: BTreeSet<&str> = d.workloads.iter().map(|w| w.name.as_str()).collect();
                for (dev, ws) in current.iter().filter(|(dev, _)| devices.contains(*dev)) {
                    for w in ws.iter().filter(|w| names.contains(w.name.as_str())) {
                        add(dev, w);
                    }
                }
            }
        }
    }
    // Every device gets an entry (an explicit empty state when nothing is placed), workloads sorted by name;
    // collected in key order, so the map is built in bulk. Lists made of the same workload objects are shared,
    // keyed by the objects' addresses (all borrowed for 'a, so an address names one object throughout).
    let mut shared: HashMap<Vec<*const WorkloadSpec>, Arc<[WorkloadSpec]>> = HashMap::new();
    let per_device = devices
        .iter()
        .map(|dev| {
            let mut ws = placed.remove(dev).unwrap_or_default();
            ws.sort_by(|a, b| a.0.name.cmp(&b.0.name));
            let key: Vec<*const WorkloadSpec> = ws.iter().map(|(w, _)| *w as *const _).collect();
            let list = shared
                .entry(key)
                .or_insert_with(|| ws.iter().map(|(w, _)| (*w).clone()).collect())
                .clone();
            (dev.clone(), list)
        })
        .collect();
    DesiredWorkloads {
        per_device,
        conflicts,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }
    fn sel(pairs: &[(&str, &str)]) -> LabelSelector {
        LabelSelector {
            match_labels: Some(labels(pairs)),
            match_expressions: None,
        }
    }
    fn expr_sel() -> LabelSelector {
        LabelSelector {
            match_labels: None,
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "site".into(),
                operator: "In".into(),
                values: Some(vec!["a".into()]),
            }]),
        }
    }
    fn id(s: &str) -> DeviceId {
        DeviceId::try_from(s).expect("id")
    }
    fn devices() -> BTreeMap<DeviceId, Labels> {
        [
            ("d1", labels(&[("site", "a"), ("role", "cam")])),
            ("d2", labels(&[("site", "a")])),
            ("d3", labels(&[("site", "b"), ("role", "cam")])),
            ("d4", labels(&[])),
        ]
        .into_iter()
        .map(|(k, v)| (id(k), v))
        .collect()
    }
    fn ids(v: &[&str]) -> BTreeSet<DeviceId> {
        v.iter().map(|s| id(s)).collect()
    }

    #[test]
    fn selector_table() {
        let l = labels(&[("site", "a"), ("role", "cam")]);
        let cases: &[(LabelSelector, Result<bool, SelectorError>)] = &[
            (LabelSelector::default(), Ok(true)),
            (sel(&[]), Ok(true)),
            (sel(&[("site", "a")]), Ok(true)),
            (sel(&[("site", "a"), ("role", "cam")]), Ok(true)),
            (sel(&[("site", "a"), ("role", "gw")]), Ok(false)),
            (sel(&[("zone", "a")]), Ok(false)),
            (expr_sel(), Err(SelectorError::ExpressionsUnsupported)),
            (
                LabelSelector {
                    match_labels: None,
                    match_expressions: Some(vec![]),
                },
                Ok(true),
            ),
        ];
        for (i, (s, want)) in cases.iter().enumerate() {
            assert_eq!(&selector_matches(s, &l), want, "case {i}");
        }
    }

    fn group(
        select_all: bool,
        selector: Option<LabelSelector>,
        devices: &[&str],
    ) -> DeviceGroupSpec {
        DeviceGroupSpec {
            select_all,
            selector,
            devices: devices.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn groups_resolve_and_errors_differ_from_empty() {
        let d = devices();
        let by_labels = |s| group(false, Some(s), &[]);
        assert_eq!(
            resolve_group("g", &by_labels(sel(&[("site", "a")])), &d),
            Ok(ids(&["d1", "d2"]))
        );
        assert_eq!(
            resolve_group("g", &by_labels(sel(&[("site", "z")])), &d),
            Ok(BTreeSet::new())
        );
        assert!(matches!(
            resolve_group("g", &by_labels(expr_sel()), &d),
            Err(GroupError::Selector { .. })
        ));
        // with no devices at all, a broken selector is still an error, not an empty group
        assert!(matches!(
            resolve_group("g", &by_labels(expr_sel()), &BTreeMap::new()),
            Err(GroupError::Selector { .. })
        ));
    }

    /// What each shape of DeviceGroup spec selects: nothing is implied by an empty selector.
    #[test]
    fn group_membership_table() {
        let d = devices();
        let cases: Vec<(DeviceGroupSpec, Result<BTreeSet<DeviceId>, &str>)> = vec![
            // a device list beside an empty selector (`selector: {}`, a half-deleted label selector): only the
            // listed device, never every device
            (group(false, Some(sel(&[])), &["d2"]), Ok(ids(&["d2"]))),
            (group(false, None, &["d2", "d9"]), Ok(ids(&["d2"]))),
            // list plus labels: the union
            (
                group(false, Some(sel(&[("site", "b")])), &["d2"]),
                Ok(ids(&["d2", "d3"])),
            ),
            (group(true, None, &[]), Ok(ids(&["d1", "d2", "d3", "d4"]))),
            (
                group(true, Some(sel(&[])), &[]),
                Ok(ids(&["d1", "d2", "d3", "d4"])),
            ),
            // selecting nothing is said, never silently the whole fleet or an empty group
            (
                group(false, Some(LabelSelector::default()), &[]),
                Err("EmptySelector"),
            ),
            (group(false, Some(sel(&[])), &[]), Err("EmptySelector")),
            (group(false, None, &[]), Err("EmptySelector")),
            (
                group(
                    false,
                    Some(LabelSelector {
                        match_labels: None,
                        match_expressions: Some(vec![]),
                    }),
                    &[],
                ),
                Err("EmptySelector"),
            ),
            (
                group(true, Some(sel(&[("site", "a")])), &[]),
                Err("InvalidSpec"),
            ),
            (group(true, None, &["d1"]), Err("InvalidSpec")),
            (group(false, None, &["D_1"]), Err("InvalidSpec")),
            (group(false, None, &["d1", "d1"]), Err("InvalidSpec")),
            (
                group(false, Some(expr_sel()), &["d1"]),
                Err("GroupSourceError"),
            ),
        ];
        for (i, (spec, want)) in cases.into_iter().enumerate() {
            let got = resolve_group("g", &spec, &d).map_err(|e| e.reason());
            assert_eq!(got, want, "case {i}");
        }
        // every problem at once, by index
        let e = resolve_group("g", &group(true, None, &["ok", "Bad_Id", "ok"]), &d)
            .expect_err("invalid");
        let msg = e.to_string();
        assert!(
            msg.contains("selectAll: true")
                && msg.contains("devices[1]")
                && msg.contains("devices[2]: \"ok\" appears twice"),
            "{msg}"
        );
        assert_eq!(
            unknown_listed(&group(false, None, &["d1", "d9"]), &d),
            vec!["d9"]
        );
    }

    #[test]
    fn placement_table() {
        let d = devices();
        let mut groups = BTreeMap::new();
        groups.insert("site-a".to_string(), Ok(ids(&["d1", "d2"])));
        groups.insert("cams".to_string(), Ok(ids(&["d1", "d3"])));
        groups.insert("empty".to_string(), Ok(BTreeSet::new()));
        groups.insert(
            "broken".to_string(),
            Err(GroupError::Selector {
                group: "broken".into(),
                error: SelectorError::ExpressionsUnsupported,
            }),
        );
        let g = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        type Case = (
            Vec<String>,
            LabelSelector,
            Result<BTreeSet<DeviceId>, &'static str>,
        );
        let cases: Vec<Case> = vec![
            // empty selector: every authorized device
            (
                g(&["site-a"]),
                LabelSelector::default(),
                Ok(ids(&["d1", "d2"])),
            ),
            // union of groups AND selector
            (
                g(&["site-a", "cams"]),
                sel(&[("role", "cam")]),
                Ok(ids(&["d1", "d3"])),
            ),
            // matchLabels conjunction
            (
                g(&["site-a", "cams"]),
                sel(&[("role", "cam"), ("site", "b")]),
                Ok(ids(&["d3"])),
            ),
            // a selector never widens beyond the groups
            (g(&["site-a"]), sel(&[("site", "b")]), Ok(ids(&[]))),
            (g(&["empty"]), LabelSelector::default(), Ok(ids(&[]))),
            (g(&[]), LabelSelector::default(), Err("InvalidSpec")),
            (g(&["site-a"]), expr_sel(), Err("InvalidSpec")),
            (
                g(&["site-a", "broken"]),
                LabelSelector::default(),
                Err("GroupSourceError"),
            ),
            (
                g(&["missing"]),
                LabelSelector::default(),
                Err("GroupSourceError"),
            ),
        ];
        for (i, (allowed, target, want)) in cases.into_iter().enumerate() {
            let got = place(&allowed, &target, &groups, &d).map_err(|e| e.reason());
            assert_eq!(got, want, "case {i}");
        }
    }

    fn w(name: &str, image: &str) -> WorkloadSpec {
        serde_json::from_value(serde_json::json!({"name": name, "image": image})).expect("workload")
    }

    #[test]
    fn desired_workloads_table() {
        let devs = ids(&["d1", "d2", "d3"]);
        let ok = |name: &str, ws: Vec<WorkloadSpec>, t: &[&str]| DeploymentInput {
            name: name.into(),
            workloads: ws,
            targets: Ok(ids(t)),
            held: BTreeMap::new(),
        };
        let failed = |name: &str, ws: Vec<WorkloadSpec>| DeploymentInput {
            name: name.into(),
            workloads: ws,
            targets: Err(PlacementError::InvalidSpec("x".into())),
            held: BTreeMap::new(),
        };
        let mut current = BTreeMap::new();
        current.insert(id("d2"), vec![w("web", "old"), w("gone", "x")]);
        current.insert(id("d3"), vec![w("web", "old")]);

        // plain placement; unplaced devices get an explicit empty state; unknown targets are ignored
        let r = desired_workloads(
            &devs,
            &[ok("a", vec![w("web", "v1")], &["d1", "d9"])],
            &current,
        );
        assert_eq!(r.per_device[&id("d1")][..], vec![w("web", "v1")]);
        assert!(r.per_device[&id("d2")].is_empty() && r.per_device[&id("d3")].is_empty());
        assert!(!r.per_device.contains_key(&id("d9")));

        // devices given the same workloads share one list
        let r = desired_workloads(
            &devs,
            &[ok("a", vec![w("web", "v1")], &["d1", "d2"])],
            &BTreeMap::new(),
        );
        assert!(Arc::ptr_eq(
            &r.per_device[&id("d1")],
            &r.per_device[&id("d2")]
        ));
        assert_eq!(r.per_device[&id("d2")][..], vec![w("web", "v1")]);
        assert!(r.per_device[&id("d3")].is_empty());

        // a failed deployment holds what devices already run under its workload names, nothing else
        let r = desired_workloads(&devs, &[failed("a", vec![w("web", "v2")])], &current);
        assert_eq!(r.per_device[&id("d2")][..], vec![w("web", "old")]);
        assert_eq!(r.per_device[&id("d3")][..], vec![w("web", "old")]);
        assert!(r.per_device[&id("d1")].is_empty());

        // conflicts: the first name wins, the loser is reported; workloads are sorted by name
        let r = desired_workloads(
            &devs,
            &[
                ok("b", vec![w("web", "b"), w("aaa", "b")], &["d1"]),
                ok("a", vec![w("web", "a")], &["d1"]),
            ],
            &current,
        );
        assert_eq!(
            r.per_device[&id("d1")][..],
            vec![w("aaa", "b"), w("web", "a")]
        );
        assert_eq!(
            r.conflicts["b"],
            vec![(id("d1"), "web".to_string(), "a".to_string())]
        );
        assert!(!r.conflicts.contains_key("a"));

        // a failed deployment sorting first neither takes over a placed one's workload nor reports a conflict
        let r = desired_workloads(
            &devs,
            &[
                failed("a", vec![w("web", "x")]),
                ok("b", vec![w("web", "v3")], &["d2"]),
            ],
            &current,
        );
        assert_eq!(r.per_device[&id("d2")][..], vec![w("web", "v3")]);
        assert_eq!(r.per_device[&id("d3")][..], vec![w("web", "old")], "held");
        assert!(r.conflicts.is_empty());

        // a rollout holds devices it has not given the change: they get what they had, the rest the new spec
        let mut staged = ok("a", vec![w("web", "v2")], &["d1", "d2", "d3"]);
        staged.held.insert(id("d2"), vec![w("web", "old")].into());
        staged.held.insert(id("d3"), Vec::new().into());
        let r = desired_workloads(&devs, &[staged], &current);
        assert_eq!(r.per_device[&id("d1")][..], vec![w("web", "v2")]);
        assert_eq!(r.per_device[&id("d2")][..], vec![w("web", "old")]);
        assert!(
            r.per_device[&id("d3")].is_empty(),
            "never had it: nothing yet"
        );
    }
}
