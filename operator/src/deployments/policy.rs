//! Hardware and privileges under a policy (pure): whether a FleetDeployment's workloads may have what they ask of
//! their devices beyond an ordinary container — device nodes, supplementary groups, added capabilities, host paths
//! as volumes, privileged mode — by the cluster-scoped `WorkloadPolicy` objects that apply to it. A workload that
//! asks for none of these needs no policy. Both the admission webhook and the planner ask [`check`], so a
//! deployment the policies do not allow is refused at admission and, should it get past (webhook missing or
//! bypassed, policy removed later), never placed by the operator.
//!
//! A policy applies to a deployment when the deployment's namespace is among the policy's `namespaces` (absent or
//! empty: any, and cluster-scoped deployments) and every one of its `allowedGroups` is among the policy's `groups`;
//! the policies that apply add up. A policy with unknown fields or an invalid entry allows nothing ([`Policy::of`]).

use crate::crd::policy::{HostPathAllowance, WorkloadPolicy, WorkloadPolicySpec};
use fleet_wire::resources::{check_capability, check_device, check_group};
use fleet_wire::WorkloadSpec;

/// What the check needs of a FleetDeployment.
#[derive(Debug, Clone, Copy)]
pub struct Deployment<'a> {
    /// Its namespace (`None`: cluster-scoped, as FleetDeployments are today).
    pub namespace: Option<&'a str>,
    /// Its `allowedGroups`.
    pub allowed_groups: &'a [String],
    /// Its validated workloads.
    pub workloads: &'a [WorkloadSpec],
}

/// A WorkloadPolicy as the check sees it.
#[derive(Debug, Clone)]
pub struct Policy<'a> {
    /// Its name.
    pub name: &'a str,
    /// Its spec.
    pub spec: &'a WorkloadPolicySpec,
    /// Why it allows nothing (unknown fields, an invalid entry); `None`: it counts.
    pub ignored: Option<String>,
}

impl<'a> Policy<'a> {
    /// A cached policy: ignored when the cache marked unknown fields in it ([`crate::schema::refusal`]) or when
    /// [`validate`] refuses its spec, so that a typo never widens what is allowed.
    pub fn of(p: &'a WorkloadPolicy) -> Self {
        let ignored = crate::schema::refusal(p).or_else(|| validate(&p.spec).err());
        Self {
            name: p.metadata.name.as_deref().unwrap_or_default(),
            spec: &p.spec,
            ignored,
        }
    }
}

/// True when some workload asks for something only a policy allows.
pub fn needs_policy(workloads: &[WorkloadSpec]) -> bool {
    workloads.iter().any(|w| !asks(w).is_empty())
}

/// Checks a policy's spec; `Err` names every invalid entry by its path (`spec.devices[0]: …`).
pub fn validate(spec: &WorkloadPolicySpec) -> Result<(), String> {
    let errors = problems(spec);
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

/// Every problem of a policy's spec, each with its full path (`spec.capabilities[0]: …`); empty: valid.
pub fn problems(spec: &WorkloadPolicySpec) -> Vec<String> {
    let mut errors = Vec::new();
    if spec.groups.is_empty() {
        errors.push("spec.groups: name at least one DeviceGroup (a policy applies to deployments whose every allowed group it lists)".to_owned());
    }
    for (i, n) in spec.namespaces.iter().enumerate() {
        if !dns_label(n) {
            errors.push(format!(
                "spec.namespaces[{i}]: {n:?} is not a namespace name"
            ));
        }
    }
    for (i, g) in spec.groups.iter().enumerate() {
        if !dns_subdomain(g) {
            errors.push(format!("spec.groups[{i}]: {g:?} is not a DeviceGroup name"));
        }
    }
    for (i, d) in spec.devices.iter().enumerate() {
        if let Err(e) = device_pattern(d) {
            errors.push(format!("spec.devices[{i}]: {e}"));
        }
    }
    for (i, g) in spec.supplemental_groups.iter().enumerate() {
        if let Err(e) = check_group(g) {
            errors.push(format!("spec.supplementalGroups[{i}]: {e}"));
        }
    }
    for (i, c) in spec.capabilities.iter().enumerate() {
        if let Err(e) = check_capability(c) {
            errors.push(format!("spec.capabilities[{i}]: {e}"));
        }
    }
    for (i, h) in spec.host_paths.iter().enumerate() {
        if !host_path(&h.path) {
            errors.push(format!(
                "spec.hostPaths[{i}].path: {:?} must be an absolute path without '..', '.', '//' or a trailing '/'",
                h.path
            ));
        }
    }
    errors
}

/// Whether `policies` allow everything `d`'s workloads ask for. `Err` names, per workload, every refused item
/// and the policies that applied (or that none did), e.g. `spec.workloads[0] (reader): device /dev/ttyS0 and capability
/// NET_ADMIN are not allowed for groups [field]: no WorkloadPolicy applies`.
pub fn check(d: &Deployment, policies: &[Policy]) -> Result<(), String> {
    let applying: Vec<&Policy> = policies.iter().filter(|p| applies(p.spec, d)).collect();
    // Policies for its groups that list other namespaces: named, so that one written for the wrong namespace (or
    // with namespaces for a cluster-scoped deployment) is not a mystery.
    let elsewhere: Vec<&Policy> = policies
        .iter()
        .filter(|p| covers_groups(p.spec, d) && !in_namespace(p.spec, d))
        .collect();
    let (valid, ignored): (Vec<&Policy>, Vec<&Policy>) =
        applying.into_iter().partition(|p| p.ignored.is_none());
    let mut refusals = Vec::new();
    for (i, w) in d.workloads.iter().enumerate() {
        let refused: Vec<Ask> = asks(w)
            .into_iter()
            .filter(|a| !valid.iter().any(|p| allows(p.spec, a)))
            .collect();
        if refused.is_empty() {
            continue;
        }
        let verb = if refused.len() == 1 { "is" } else { "are" };
        let items = shown(refused.iter().map(Ask::to_string).collect(), MAX_NAMED);
        refusals.push(format!(
            "spec.workloads[{i}] ({}): {} {verb} not allowed for {}: {}",
            w.name.as_str(),
            and_list(&items),
            scope(d),
            why(
                &refused,
                &valid,
                &ignored,
                &elsewhere,
                d.namespace.is_none()
            )
        ));
    }
    if refusals.is_empty() {
        return Ok(());
    }
    // Whole workloads, the first always, the next while the message stays within MAX_MESSAGE_CHARS.
    let total = refusals.len();
    let mut named: Vec<String> = Vec::new();
    let mut len = 0;
    for r in refusals {
        if !named.is_empty() && len + r.chars().count() > MAX_MESSAGE_CHARS {
            break;
        }
        len += r.chars().count() + 2;
        named.push(r);
    }
    if named.len() < total {
        named.push(format!("and {} more workloads", total - named.len()));
    }
    Err(format!(
        "{} (see docs/crds.md, WorkloadPolicy)",
        named.join("; ")
    ))
}

/// Length a refusal aims to stay within, in characters: a condition's message holds 1,024
/// ([`crate::conditions::MAX_MESSAGE_CHARS`]) with the planner's tail (`; workloads already placed are kept
/// unchanged`) after it.
pub const MAX_MESSAGE_CHARS: usize = 800;
/// Most refused items of one workload, and entries of one policy list, a message names (the count carries the
/// rest).
pub const MAX_NAMED: usize = 4;

/// `items` bounded to `max`, the rest counted (`… and 4 more`).
fn shown(mut items: Vec<String>, max: usize) -> Vec<String> {
    let more = items.len().saturating_sub(max);
    items.truncate(max);
    if more > 0 {
        items.push(format!("{more} more"));
    }
    items
}

/// One thing a workload asks of its device that needs a policy.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Ask<'a> {
    Device(&'a str),
    Group(&'a str),
    Capability(&'a str),
    HostPath { path: &'a str, read_only: bool },
    Privileged,
}

/// The kinds of [`Ask`], in the order messages name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Devices,
    SupplementalGroups,
    Capabilities,
    HostPaths,
    Privileged,
}

impl Ask<'_> {
    fn kind(&self) -> Kind {
        match self {
            Ask::Device(_) => Kind::Devices,
            Ask::Group(_) => Kind::SupplementalGroups,
            Ask::Capability(_) => Kind::Capabilities,
            Ask::HostPath { .. } => Kind::HostPaths,
            Ask::Privileged => Kind::Privileged,
        }
    }
}

impl std::fmt::Display for Ask<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Ask::Device(p) => write!(f, "device {p}"),
            Ask::Group(g) => write!(f, "supplementary group {g}"),
            Ask::Capability(c) => write!(f, "capability {c}"),
            Ask::HostPath { path, read_only } => write!(
                f,
                "host path {path} ({})",
                if *read_only { "read-only" } else { "writable" }
            ),
            Ask::Privileged => write!(f, "privileged mode"),
        }
    }
}

fn asks(w: &WorkloadSpec) -> Vec<Ask<'_>> {
    let mut out: Vec<Ask> = w.devices.iter().map(|d| Ask::Device(d)).collect();
    out.extend(w.groups.iter().map(|g| Ask::Group(g)));
    out.extend(w.capabilities.iter().map(|c| Ask::Capability(c)));
    // The same rule as `WorkloadSpec::host_paths`: an absolute source is a host path, the rest named volumes.
    out.extend(
        w.volumes
            .iter()
            .filter(|v| v.source.starts_with('/'))
            .map(|v| Ask::HostPath {
                path: &v.source,
                read_only: v.read_only,
            }),
    );
    if w.privileged {
        out.push(Ask::Privileged);
    }
    out
}

fn applies(p: &WorkloadPolicySpec, d: &Deployment) -> bool {
    in_namespace(p, d) && covers_groups(p, d)
}

fn in_namespace(p: &WorkloadPolicySpec, d: &Deployment) -> bool {
    p.namespaces.is_empty()
        || d.namespace
            .is_some_and(|n| p.namespaces.iter().any(|m| m == n))
}

fn covers_groups(p: &WorkloadPolicySpec, d: &Deployment) -> bool {
    // No allowed group: such a deployment is invalid anyway, and no policy covers "no group".
    !d.allowed_groups.is_empty() && d.allowed_groups.iter().all(|g| p.groups.contains(g))
}

fn allows(p: &WorkloadPolicySpec, a: &Ask) -> bool {
    match a {
        Ask::Device(d) => p.devices.iter().any(|pat| device_matches(pat, d)),
        Ask::Group(g) => p.supplemental_groups.iter().any(|x| x == g),
        Ask::Capability(c) => p.capabilities.iter().any(|x| x == c),
        Ask::HostPath { path, read_only } => p
            .host_paths
            .iter()
            .any(|h| within(path, &h.path) && (*read_only || !h.read_only)),
        Ask::Privileged => p.privileged,
    }
}

/// `/dev/ttyUSB*` matches every path starting with `/dev/ttyUSB`; anything else only itself.
fn device_matches(pattern: &str, device: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => device.starts_with(prefix),
        None => pattern == device,
    }
}

/// `path` is `base` or below it, by whole components.
fn within(path: &str, base: &str) -> bool {
    base == "/"
        || path == base
        || path
            .strip_prefix(base)
            .is_some_and(|rest| rest.starts_with('/'))
}

fn device_pattern(p: &str) -> Result<(), String> {
    match p.strip_suffix('*') {
        // The prefix must itself lie under /dev/ (`/dev/*` is allowed: every device, said explicitly).
        Some(prefix) if !prefix.contains('*') && prefix.starts_with("/dev/") => {
            check_device(&format!("{prefix}x")).map_err(|_| {
                format!("{p:?} must be a path under /dev/, optionally ending in one '*'")
            })
        }
        Some(_) => Err(format!(
            "{p:?} must be a path under /dev/, optionally ending in one '*'"
        )),
        None => check_device(p),
    }
}

fn host_path(p: &str) -> bool {
    p == "/"
        || (p.starts_with('/')
            && p.len() <= 4096
            && !p.ends_with('/')
            && !p.contains('\0')
            && p[1..]
                .split('/')
                .all(|c| !c.is_empty() && c != "." && c != ".."))
}

fn dns_label(s: &str) -> bool {
    !s.is_empty() && s.len() <= 63 && !s.contains('.') && fleet_wire::secrets::dns_subdomain(s)
}

fn dns_subdomain(s: &str) -> bool {
    fleet_wire::secrets::dns_subdomain(s)
}

fn scope(d: &Deployment) -> String {
    let groups = format!("groups [{}]", d.allowed_groups.join(", "));
    match d.namespace {
        Some(n) => format!("namespace {n:?} and {groups}"),
        None => groups,
    }
}

/// Why the refused items are refused: what each applying policy allows of their kinds, or that none applies (and
/// which policies would have applied but are ignored, or are for other namespaces).
fn why(
    refused: &[Ask],
    valid: &[&Policy],
    ignored: &[&Policy],
    elsewhere: &[&Policy],
    cluster_scoped: bool,
) -> String {
    let mut kinds: Vec<Kind> = refused.iter().map(Ask::kind).collect();
    kinds.sort();
    kinds.dedup();
    let mut parts: Vec<String> = valid
        .iter()
        .map(|p| {
            let allowed: Vec<String> = kinds.iter().map(|k| allowed_of(p.spec, *k)).collect();
            format!(
                "WorkloadPolicy {:?} allows {} only",
                p.name,
                and_list(&allowed)
            )
        })
        .collect();
    if valid.is_empty() {
        parts.push("no WorkloadPolicy applies".into());
    }
    for p in ignored {
        parts.push(format!(
            "WorkloadPolicy {:?} is ignored: {}",
            p.name,
            p.ignored.as_deref().unwrap_or_default()
        ));
    }
    for p in elsewhere {
        parts.push(format!(
            "WorkloadPolicy {:?} applies only in namespaces [{}]{}",
            p.name,
            p.spec.namespaces.join(", "),
            if cluster_scoped {
                " and this FleetDeployment is cluster-scoped"
            } else {
                ""
            }
        ));
    }
    parts.join(", ")
}

fn allowed_of(p: &WorkloadPolicySpec, k: Kind) -> String {
    let list = |name: &str, items: &[String]| {
        format!("{name} [{}]", shown(items.to_vec(), MAX_NAMED).join(", "))
    };
    match k {
        Kind::Devices => list("devices", &p.devices),
        Kind::SupplementalGroups => list("supplementalGroups", &p.supplemental_groups),
        Kind::Capabilities => list("capabilities", &p.capabilities),
        Kind::HostPaths => {
            let h: Vec<String> = p.host_paths.iter().map(host_path_shown).collect();
            list("hostPaths", &h)
        }
        Kind::Privileged => format!("privileged: {}", p.privileged),
    }
}

fn host_path_shown(h: &HostPathAllowance) -> String {
    if h.read_only {
        format!("{} (read-only)", h.path)
    } else {
        h.path.clone()
    }
}

/// `a`, `a and b`, `a, b and c`.
fn and_list(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn workload(extra: Value) -> WorkloadSpec {
        let mut w = json!({"name": "reader", "image": "busybox:1"});
        for (k, v) in extra.as_object().into_iter().flatten() {
            w[k] = v.clone();
        }
        serde_json::from_value(w).expect("valid workload")
    }

    fn spec(v: Value) -> WorkloadPolicySpec {
        serde_json::from_value(v).expect("policy spec")
    }

    fn groups(g: &[&str]) -> Vec<String> {
        g.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn check_table() {
        let serial = spec(json!({"groups": ["field"], "devices": ["/dev/ttyUSB*"]}));
        let radio = spec(
            json!({"groups": ["field", "lab"], "devices": ["/dev/ttyS0"],
            "capabilities": ["NET_ADMIN"], "supplementalGroups": ["dialout"]}),
        );
        let data = spec(json!({"groups": ["field"],
            "hostPaths": [{"path": "/srv/data", "readOnly": true}, {"path": "/var/log/app", "readOnly": false}]}));
        let sensors_ns = spec(json!({"namespaces": ["sensors"], "groups": ["field"],
            "capabilities": ["NET_ADMIN"], "privileged": true}));
        let typo = policy_object(
            "typo",
            spec(json!({"groups": ["field"], "devices": ["/dev/tty S0"]})),
        );
        let p = |name, spec| Policy {
            name,
            spec,
            ignored: None,
        };
        // (what, namespace, allowedGroups, the workload's extra fields, policies, verdict)
        type Case<'a> = (
            &'a str,
            Option<&'a str>,
            Vec<String>,
            Value,
            Vec<Policy<'a>>,
            Result<(), &'a str>,
        );
        let cases: Vec<Case> = vec![
            ("nothing asked, no policy", None, groups(&["field"]), json!({}), vec![], Ok(())),
            ("a named volume needs none", None, groups(&["field"]), json!({"volumes": [{"source": "data", "target": "/data"}]}), vec![], Ok(())),
            ("no policy at all", None, groups(&["field"]),
                json!({"devices": ["/dev/ttyS0"], "capabilities": ["NET_ADMIN"]}), vec![],
                Err("workloads[0] (reader): device /dev/ttyS0 and capability NET_ADMIN are not allowed for groups [field]: no WorkloadPolicy applies (see docs/crds.md, WorkloadPolicy)")),
            ("with a namespace", Some("sensors"), groups(&["field"]),
                json!({"devices": ["/dev/ttyS0"]}), vec![],
                Err("workloads[0] (reader): device /dev/ttyS0 is not allowed for namespace \"sensors\" and groups [field]: no WorkloadPolicy applies")),
            ("the glob", None, groups(&["field"]), json!({"devices": ["/dev/ttyUSB0", "/dev/ttyUSB12"]}), vec![p("serial", &serial)], Ok(())),
            ("outside the glob", None, groups(&["field"]),
                json!({"devices": ["/dev/ttyS0", "/dev/ttyUSB0"], "capabilities": ["NET_ADMIN"]}), vec![p("serial", &serial)],
                Err("workloads[0] (reader): device /dev/ttyS0 and capability NET_ADMIN are not allowed for groups [field]: WorkloadPolicy \"serial\" allows devices [/dev/ttyUSB*] and capabilities [] only")),
            ("policies add up", None, groups(&["field"]),
                json!({"devices": ["/dev/ttyS0", "/dev/ttyUSB0"], "capabilities": ["NET_ADMIN"], "groups": ["dialout"]}),
                vec![p("serial", &serial), p("radio", &radio)], Ok(())),
            ("every allowed group must be covered", None, groups(&["field", "office"]),
                json!({"devices": ["/dev/ttyUSB0"]}), vec![p("serial", &serial)],
                Err("device /dev/ttyUSB0 is not allowed for groups [field, office]: no WorkloadPolicy applies")),
            ("a subset of the policy's groups is covered", None, groups(&["lab"]),
                json!({"devices": ["/dev/ttyS0"]}), vec![p("radio", &radio), p("serial", &serial)], Ok(())),
            ("no allowed group: nothing applies", None, groups(&[]),
                json!({"devices": ["/dev/ttyS0"]}), vec![p("radio", &radio)],
                Err("no WorkloadPolicy applies")),
            ("a namespaced policy does not apply to a cluster-scoped deployment", None, groups(&["field"]),
                json!({"privileged": true}), vec![p("sensors-ns", &sensors_ns)],
                Err("privileged mode is not allowed for groups [field]: no WorkloadPolicy applies, WorkloadPolicy \"sensors-ns\" applies only in namespaces [sensors] and this FleetDeployment is cluster-scoped")),
            ("it applies in its namespace", Some("sensors"), groups(&["field"]),
                json!({"privileged": true, "capabilities": ["NET_ADMIN"]}), vec![p("sensors-ns", &sensors_ns)], Ok(())),
            ("not in another", Some("office"), groups(&["field"]),
                json!({"privileged": true}), vec![p("sensors-ns", &sensors_ns)],
                Err("privileged mode is not allowed for namespace \"office\" and groups [field]: no WorkloadPolicy applies, WorkloadPolicy \"sensors-ns\" applies only in namespaces [sensors] (see")),
            ("privileged needs privileged: true", None, groups(&["field"]),
                json!({"privileged": true}), vec![p("serial", &serial)],
                Err("privileged mode is not allowed for groups [field]: WorkloadPolicy \"serial\" allows privileged: false only")),
            ("host paths: below a read-only allowance, read-only", None, groups(&["field"]),
                json!({"volumes": [{"source": "/srv/data/in", "target": "/in", "readOnly": true},
                                   {"source": "/var/log/app", "target": "/log"}]}), vec![p("data", &data)], Ok(())),
            ("host paths: writable under read-only, a sibling prefix, no policy", None, groups(&["field"]),
                json!({"volumes": [{"source": "/srv/data", "target": "/in"},
                                   {"source": "/srv/database", "target": "/db", "readOnly": true}]}), vec![p("data", &data)],
                Err("workloads[0] (reader): host path /srv/data (writable) and host path /srv/database (read-only) are not allowed for groups [field]: WorkloadPolicy \"data\" allows hostPaths [/srv/data (read-only), /var/log/app] only")),
            ("an ignored policy is named and allows nothing", None, groups(&["field"]),
                json!({"devices": ["/dev/ttyUSB0"]}),
                vec![Policy { name: "serial", spec: &serial, ignored: Some("unknown field spec.devicez".into()) }],
                Err("no WorkloadPolicy applies, WorkloadPolicy \"serial\" is ignored: unknown field spec.devicez")),
            ("supplementary groups are matched exactly", None, groups(&["field"]),
                json!({"groups": ["20"]}), vec![p("radio", &radio)],
                Err("supplementary group 20 is not allowed for groups [field]: WorkloadPolicy \"radio\" allows supplementalGroups [dialout] only")),
            ("an invalid spec entry as the operator sees it", None, groups(&["field"]),
                json!({"devices": ["/dev/ttyS0"]}), vec![Policy::of(&typo)],
                Err("WorkloadPolicy \"typo\" is ignored: spec.devices[0]: device")),
        ];
        for (what, namespace, allowed_groups, w, policies, want) in cases {
            let workloads = [workload(w)];
            let d = Deployment {
                namespace,
                allowed_groups: &allowed_groups,
                workloads: &workloads,
            };
            let got = check(&d, &policies);
            match (got, want) {
                (Ok(()), Ok(())) => {}
                (Err(m), Err(frag)) => assert!(m.contains(frag), "{what}: {m}"),
                (got, want) => panic!("{what}: got {got:?}, want {want:?}"),
            }
            assert_eq!(
                needs_policy(&workloads),
                what != "nothing asked, no policy" && what != "a named volume needs none",
                "{what}"
            );
        }
    }

    fn policy_object(name: &str, spec: WorkloadPolicySpec) -> WorkloadPolicy {
        WorkloadPolicy::new(name, spec)
    }

    #[test]
    fn every_refused_workload_is_named() {
        let ws = [
            workload(json!({})),
            serde_json::from_value(
                json!({"name": "cam", "image": "x:1", "devices": ["/dev/video0"]}),
            )
            .unwrap(),
            serde_json::from_value(
                json!({"name": "net", "image": "x:1", "capabilities": ["NET_RAW"]}),
            )
            .unwrap(),
        ];
        let g = groups(&["field"]);
        let d = Deployment {
            namespace: None,
            allowed_groups: &g,
            workloads: &ws,
        };
        let m = check(&d, &[]).unwrap_err();
        assert!(
            m.starts_with("spec.workloads[1] (cam): device /dev/video0 is not allowed")
                && m.contains("; spec.workloads[2] (net): capability NET_RAW is not allowed"),
            "{m}"
        );
    }

    #[test]
    fn validate_table() {
        let cases = [
            (json!({"groups": ["field"]}), Ok(())),
            (
                json!({"namespaces": ["sensors"], "groups": ["field", "lab.a"], "devices": ["/dev/ttyUSB*", "/dev/*", "/dev/serial/by-id/usb-1"],
                       "supplementalGroups": ["dialout", "20"], "capabilities": ["NET_ADMIN"],
                       "hostPaths": [{"path": "/", "readOnly": true}, {"path": "/srv/data", "readOnly": false}], "privileged": true}),
                Ok(()),
            ),
            (json!({"groups": []}), Err("spec.groups: name at least one")),
            (json!({"groups": ["Field"]}), Err("spec.groups[0]")),
            (
                json!({"groups": ["g"], "namespaces": ["a.b"]}),
                Err("spec.namespaces[0]"),
            ),
            (
                json!({"groups": ["g"], "devices": ["/etc/*"]}),
                Err("spec.devices[0]"),
            ),
            (
                json!({"groups": ["g"], "devices": ["/dev/*tty*"]}),
                Err("spec.devices[0]"),
            ),
            (
                json!({"groups": ["g"], "devices": ["*"]}),
                Err("spec.devices[0]"),
            ),
            (
                json!({"groups": ["g"], "devices": ["/dev/../etc"]}),
                Err("spec.devices[0]"),
            ),
            (
                json!({"groups": ["g"], "capabilities": ["CAP_NET_ADMIN"]}),
                Err("spec.capabilities[0]: capability \"CAP_NET_ADMIN\" is written without CAP_"),
            ),
            (
                json!({"groups": ["g"], "supplementalGroups": ["Dial Out"]}),
                Err("spec.supplementalGroups[0]"),
            ),
            (
                json!({"groups": ["g"], "hostPaths": [{"path": "srv", "readOnly": true}, {"path": "/srv/", "readOnly": true},
                       {"path": "/srv/../etc", "readOnly": true}]}),
                Err("spec.hostPaths[0].path: \"srv\" must be an absolute path"),
            ),
        ];
        for (i, (v, want)) in cases.into_iter().enumerate() {
            match (validate(&spec(v)), want) {
                (Ok(()), Ok(())) => {}
                (Err(m), Err(frag)) => assert!(m.contains(frag), "case {i}: {m}"),
                (got, want) => panic!("case {i}: got {got:?}, want {want:?}"),
            }
        }
        let m = validate(&spec(
            json!({"groups": ["g"], "hostPaths": [{"path": "srv", "readOnly": true},
            {"path": "/srv/", "readOnly": true}, {"path": "/srv/../etc", "readOnly": true}]}),
        ))
        .unwrap_err();
        assert_eq!(
            m.matches("spec.hostPaths[").count(),
            3,
            "every entry is named: {m}"
        );
    }

    #[test]
    fn matching_rules() {
        assert!(device_matches("/dev/ttyUSB*", "/dev/ttyUSB0"));
        assert!(device_matches("/dev/serial/*", "/dev/serial/by-id/x"));
        assert!(!device_matches("/dev/ttyUSB*", "/dev/ttyS0"));
        assert!(device_matches("/dev/ttyS0", "/dev/ttyS0"));
        assert!(!device_matches("/dev/ttyS0", "/dev/ttyS01"));
        assert!(within("/srv/data", "/srv/data") && within("/srv/data/x/y", "/srv/data"));
        assert!(!within("/srv/database", "/srv/data") && !within("/srv", "/srv/data"));
        assert!(within("/etc/shadow", "/"));
    }

    #[test]
    fn long_refusals_are_bounded() {
        let devices: Vec<String> = (0..20).map(|i| format!("/dev/ttyS{i}")).collect();
        let ws: Vec<WorkloadSpec> = (0..10)
            .map(|i| {
                serde_json::from_value(
                    json!({"name": format!("w{i}"), "image": "x:1", "devices": devices}),
                )
                .unwrap()
            })
            .collect();
        let wide = spec(
            json!({"groups": ["field"], "devices": (0..20).map(|i| format!("/dev/video{i}")).collect::<Vec<_>>()}),
        );
        let g = groups(&["field"]);
        let d = Deployment {
            namespace: None,
            allowed_groups: &g,
            workloads: &ws,
        };
        let m = check(
            &d,
            &[Policy {
                name: "video",
                spec: &wide,
                ignored: None,
            }],
        )
        .unwrap_err();
        assert!(
            m.contains("device /dev/ttyS3 and 16 more are not allowed")
                && m.contains("/dev/video3, 16 more]")
                && m.contains("workloads[1] (w1)")
                && m.contains("; and 7 more workloads (see docs/crds.md"),
            "{m}"
        );
        // room for the condition's tail (`; workloads already placed are kept unchanged`) within 1,024
        assert!(m.chars().count() < 960, "{} chars: {m}", m.chars().count());
    }
}
