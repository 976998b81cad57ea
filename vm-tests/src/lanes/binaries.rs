//! The test binaries of a `cargo test --no-run --message-format=json` build, each with what `cargo test` gives it
//! when it runs one: the package root as working directory and the environment cargo sets for it (`CARGO`,
//! `CARGO_MANIFEST_DIR`, `CARGO_MANIFEST_PATH`, `CARGO_PKG_*`, `CARGO_BIN_EXE_<bin>` for integration tests, the build
//! script's `OUT_DIR` and `cargo::rustc-env` values, the library search path) — checked against cargo 1.95 by a test
//! that printed its environment under `cargo test`.

use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One test executable and how cargo would run it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestBinary {
    /// `<package>/<kind>/<target>`, e.g. `fleet-auth/test/auth_attacks`, `fleet-wire/lib/fleet_wire`.
    pub name: String,
    /// The executable.
    pub exe: PathBuf,
    /// The package root (cargo's working directory for the binary).
    pub cwd: PathBuf,
    /// The variables cargo sets, in addition to the inherited environment.
    pub env: Vec<(String, String)>,
}

/// What `cargo metadata` says about one workspace package (the `CARGO_PKG_*` values).
#[derive(Debug, Clone, Default)]
struct Package {
    name: String,
    version: String,
    authors: String,
    description: String,
    homepage: String,
    repository: String,
    license: String,
    license_file: String,
    rust_version: String,
    readme: String,
}

fn text(v: &Value, key: &str) -> String {
    v.get(key)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

/// The workspace packages of `cargo metadata --format-version 1 --no-deps` output, by package id.
fn packages(metadata: &Value) -> BTreeMap<String, Package> {
    let mut out = BTreeMap::new();
    for p in metadata["packages"].as_array().into_iter().flatten() {
        let authors: Vec<&str> = p["authors"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        out.insert(
            text(p, "id"),
            Package {
                name: text(p, "name"),
                version: text(p, "version"),
                authors: authors.join(":"),
                description: text(p, "description"),
                homepage: text(p, "homepage"),
                repository: text(p, "repository"),
                license: text(p, "license"),
                license_file: text(p, "license_file"),
                rust_version: text(p, "rust_version"),
                readme: text(p, "readme"),
            },
        );
    }
    out
}

/// The `CARGO_PKG_*` variables of `p`.
fn package_env(p: &Package) -> Vec<(String, String)> {
    let (core, pre) = p.version.split_once('-').unwrap_or((&p.version, ""));
    let core = core.split('+').next().unwrap_or(core);
    let mut parts = core.split('.');
    let mut part = || parts.next().unwrap_or_default().to_string();
    let (major, minor, patch) = (part(), part(), part());
    [
        ("CARGO_PKG_NAME", p.name.clone()),
        ("CARGO_PKG_VERSION", p.version.clone()),
        ("CARGO_PKG_VERSION_MAJOR", major),
        ("CARGO_PKG_VERSION_MINOR", minor),
        ("CARGO_PKG_VERSION_PATCH", patch),
        (
            "CARGO_PKG_VERSION_PRE",
            pre.split('+').next().unwrap_or(pre).to_string(),
        ),
        ("CARGO_PKG_AUTHORS", p.authors.clone()),
        ("CARGO_PKG_DESCRIPTION", p.description.clone()),
        ("CARGO_PKG_HOMEPAGE", p.homepage.clone()),
        ("CARGO_PKG_REPOSITORY", p.repository.clone()),
        ("CARGO_PKG_LICENSE", p.license.clone()),
        ("CARGO_PKG_LICENSE_FILE", p.license_file.clone()),
        ("CARGO_PKG_RUST_VERSION", p.rust_version.clone()),
        ("CARGO_PKG_README", p.readme.clone()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// Where the runner finds what it needs besides the build's messages.
#[derive(Debug, Clone)]
pub struct Context {
    /// What `CARGO` is set to (the cargo that built the binaries).
    pub cargo: String,
    /// The rustc sysroot's library directories (cargo puts them on the library search path).
    pub sysroot_libs: Vec<PathBuf>,
}

/// The test binaries of `messages` (one JSON message per line) for the packages of `metadata`, in build order.
pub fn from_build(
    messages: &str,
    metadata: &Value,
    ctx: &Context,
) -> Result<Vec<TestBinary>, String> {
    let pkgs = packages(metadata);
    let mut scripts: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    let mut bins: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    let mut tests = vec![];
    for line in messages.lines().filter(|l| l.starts_with('{')) {
        let m: Value =
            serde_json::from_str(line).map_err(|e| format!("cargo message {line:?}: {e}"))?;
        let id = text(&m, "package_id");
        match m["reason"].as_str() {
            Some("build-script-executed") => {
                let mut env = vec![("OUT_DIR".to_string(), text(&m, "out_dir"))];
                for kv in m["env"].as_array().into_iter().flatten() {
                    if let (Some(k), Some(v)) = (kv[0].as_str(), kv[1].as_str()) {
                        env.push((k.to_string(), v.to_string()));
                    }
                }
                scripts.insert(id, env);
            }
            Some("compiler-artifact") => {
                let Some(exe) = m["executable"].as_str() else {
                    continue;
                };
                let target = &m["target"];
                let kind = target["kind"][0].as_str().unwrap_or("?").to_string();
                let tname = text(target, "name");
                if m["profile"]["test"].as_bool() == Some(true) {
                    tests.push((
                        id,
                        kind,
                        tname,
                        PathBuf::from(exe),
                        text(&m, "manifest_path"),
                    ));
                } else if kind == "bin" {
                    bins.entry(id)
                        .or_default()
                        .push((format!("CARGO_BIN_EXE_{tname}"), exe.to_string()));
                }
            }
            _ => {}
        }
    }
    let mut out = vec![];
    for (id, kind, tname, exe, manifest) in tests {
        let p = pkgs
            .get(&id)
            .ok_or_else(|| format!("{id} is not a workspace package of cargo metadata"))?;
        let manifest = PathBuf::from(manifest);
        let cwd = manifest.parent().unwrap_or(Path::new(".")).to_path_buf();
        let mut env = vec![
            ("CARGO".to_string(), ctx.cargo.clone()),
            ("CARGO_MANIFEST_DIR".to_string(), cwd.display().to_string()),
            (
                "CARGO_MANIFEST_PATH".to_string(),
                manifest.display().to_string(),
            ),
        ];
        env.extend(package_env(p));
        if kind == "test" || kind == "bench" {
            env.extend(bins.get(&id).cloned().unwrap_or_default());
        }
        env.extend(scripts.get(&id).cloned().unwrap_or_default());
        env.push(("LD_LIBRARY_PATH".to_string(), library_path(&exe, ctx)));
        out.push(TestBinary {
            name: format!("{}/{kind}/{tname}", p.name),
            exe,
            cwd,
            env,
        });
    }
    Ok(out)
}

/// cargo's library search path for a binary in `<target>/debug/deps`: `<target>/debug`, `deps`, the sysroot's
/// libraries, then whatever `LD_LIBRARY_PATH` already held.
fn library_path(exe: &Path, ctx: &Context) -> String {
    let deps = exe.parent().unwrap_or(Path::new("."));
    let mut dirs: Vec<PathBuf> = deps.parent().into_iter().map(Path::to_path_buf).collect();
    dirs.push(deps.to_path_buf());
    dirs.extend(ctx.sysroot_libs.iter().cloned());
    let mut s: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    if let Ok(old) = std::env::var("LD_LIBRARY_PATH") {
        if !old.is_empty() {
            s.push(old);
        }
    }
    s.join(":")
}

#[cfg(test)]
mod tests {
    use super::*;

    const META: &str = r#"{"packages":[{"id":"path+file:///w/agent#fleet-agent@1.2.3-rc.1","name":"fleet-agent",
        "version":"1.2.3-rc.1","authors":["a","b"],"description":"d","license":"Apache-2.0",
        "rust_version":"1.89","readme":null,"homepage":null}]}"#;
    const ID: &str = "path+file:///w/agent#fleet-agent@1.2.3-rc.1";

    fn msg(v: serde_json::Value) -> String {
        v.to_string()
    }

    fn build() -> String {
        [
            msg(serde_json::json!({"reason":"build-script-executed","package_id":ID,
                "env":[["FLEET_AGENT_COMPILED_VERSION","1.2.3"]],"out_dir":"/t/debug/build/x/out"})),
            msg(serde_json::json!({"reason":"compiler-artifact","package_id":ID,
                "manifest_path":"/w/agent/Cargo.toml","target":{"kind":["bin"],"name":"fleet-agent"},
                "profile":{"test":false},"executable":"/t/debug/fleet-agent"})),
            msg(serde_json::json!({"reason":"compiler-artifact","package_id":ID,
                "manifest_path":"/w/agent/Cargo.toml","target":{"kind":["test"],"name":"drain"},
                "profile":{"test":true},"executable":"/t/debug/deps/drain-1"})),
            msg(serde_json::json!({"reason":"compiler-artifact","package_id":ID,
                "manifest_path":"/w/agent/Cargo.toml","target":{"kind":["lib"],"name":"fleet_agent"},
                "profile":{"test":true},"executable":"/t/debug/deps/fleet_agent-2"})),
            msg(serde_json::json!({"reason":"compiler-artifact","package_id":ID,
                "manifest_path":"/w/agent/Cargo.toml","target":{"kind":["lib"],"name":"fleet_agent"},
                "profile":{"test":false},"executable":null})),
            "Compiling noise".to_string(),
        ]
        .join("\n")
    }

    fn ctx() -> Context {
        Context {
            cargo: "/tc/bin/cargo".into(),
            sysroot_libs: vec!["/tc/lib".into()],
        }
    }

    fn get<'a>(b: &'a TestBinary, k: &str) -> Option<&'a str> {
        b.env
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.as_str())
    }

    #[test]
    fn each_test_binary_gets_cargos_working_directory_and_environment() {
        let meta: Value = serde_json::from_str(META).unwrap();
        let b = from_build(&build(), &meta, &ctx()).unwrap();
        assert_eq!(b.len(), 2);
        let drain = &b[0];
        assert_eq!(drain.name, "fleet-agent/test/drain");
        assert_eq!(drain.exe, PathBuf::from("/t/debug/deps/drain-1"));
        assert_eq!(drain.cwd, PathBuf::from("/w/agent"));
        for (k, v) in [
            ("CARGO", "/tc/bin/cargo"),
            ("CARGO_MANIFEST_DIR", "/w/agent"),
            ("CARGO_MANIFEST_PATH", "/w/agent/Cargo.toml"),
            ("CARGO_PKG_NAME", "fleet-agent"),
            ("CARGO_PKG_VERSION", "1.2.3-rc.1"),
            ("CARGO_PKG_VERSION_MAJOR", "1"),
            ("CARGO_PKG_VERSION_MINOR", "2"),
            ("CARGO_PKG_VERSION_PATCH", "3"),
            ("CARGO_PKG_VERSION_PRE", "rc.1"),
            ("CARGO_PKG_AUTHORS", "a:b"),
            ("CARGO_PKG_HOMEPAGE", ""),
            ("CARGO_PKG_RUST_VERSION", "1.89"),
            ("CARGO_BIN_EXE_fleet-agent", "/t/debug/fleet-agent"),
            ("OUT_DIR", "/t/debug/build/x/out"),
            ("FLEET_AGENT_COMPILED_VERSION", "1.2.3"),
        ] {
            assert_eq!(get(drain, k), Some(v), "{k}");
        }
        assert!(get(drain, "LD_LIBRARY_PATH")
            .unwrap()
            .starts_with("/t/debug:/t/debug/deps:/tc/lib"));
        // unit tests get no CARGO_BIN_EXE_ (cargo sets those for integration tests and benches only)
        let lib = &b[1];
        assert_eq!(lib.name, "fleet-agent/lib/fleet_agent");
        assert_eq!(get(lib, "CARGO_BIN_EXE_fleet-agent"), None);
        assert_eq!(get(lib, "OUT_DIR"), Some("/t/debug/build/x/out"));
    }

    #[test]
    fn a_binary_of_an_unknown_package_is_an_error() {
        let meta: Value = serde_json::from_str(r#"{"packages":[]}"#).unwrap();
        assert!(from_build(&build(), &meta, &ctx()).is_err());
    }
}
