//! Sets the compiled version: `FLEET_AGENT_VERSION` when set (checked to be a semver-like version), else the
//! package version. Tests build two versions of the agent this way.

fn valid(v: &str) -> bool {
    // The same rule as fleet_wire::Version (MAJOR.MINOR.PATCH[-pre][+build]), repeated here because a build
    // script cannot depend on the crate's own dependencies without a build-dependency on fleet-wire.
    if v.is_empty() || v.len() > 64 {
        return false;
    }
    let (core, rest) = match v.find(['-', '+']) {
        Some(i) => (&v[..i], &v[i..]),
        None => (v, ""),
    };
    let nums: Vec<&str> = core.split('.').collect();
    if nums.len() != 3
        || !nums
            .iter()
            .all(|p| !p.is_empty() && p.len() <= 10 && p.bytes().all(|b| b.is_ascii_digit()))
    {
        return false;
    }
    let ident = |s: &str| {
        s.split('.')
            .all(|i| !i.is_empty() && i.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
    };
    let mut parts = rest.splitn(2, '+');
    let pre = parts.next().unwrap_or("");
    let pre_ok = match pre.strip_prefix('-') {
        Some(p) => ident(p),
        None => pre.is_empty(),
    };
    pre_ok && parts.next().is_none_or(ident)
}

fn main() {
    println!("cargo:rerun-if-env-changed=FLEET_AGENT_VERSION");
    println!("cargo:rerun-if-changed=build.rs");
    let version = match std::env::var("FLEET_AGENT_VERSION") {
        Ok(v) if !v.is_empty() => v,
        _ => std::env::var("CARGO_PKG_VERSION").unwrap_or_else(|_| "0.0.0".into()),
    };
    if !valid(&version) {
        panic!("FLEET_AGENT_VERSION={version:?} is not a version like 1.2.0 (MAJOR.MINOR.PATCH[-pre][+build])");
    }
    println!("cargo:rustc-env=FLEET_AGENT_COMPILED_VERSION={version}");
}
