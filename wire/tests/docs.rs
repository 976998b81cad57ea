//! The operator-facing docs are checked against the types, so they cannot drift: in both directions, so a doc that
//! names a request, error code, phase, KV bucket, CRD or `kubectl` resource the code does not have fails here.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use fleet_wire::socket::{ErrorCode, Request};
use fleet_wire::{kv, JournalPhase, UpgradePhase};

fn doc(name: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../docs")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn json_name<T: serde::Serialize>(v: T) -> String {
    serde_json::to_value(v)
        .unwrap()
        .as_str()
        .unwrap()
        .to_owned()
}

#[test]
fn kv_layout_lists_every_bucket_with_its_key_and_writer() {
    let page = doc("kv-layout.md");
    for b in kv::BUCKETS {
        let row = page
            .lines()
            .find(|l| l.starts_with(&format!("| `{}` |", b.name)))
            .unwrap_or_else(|| panic!("docs/kv-layout.md has no row for bucket {}", b.name));
        assert!(
            row.contains(&format!("`{}`", b.key.pattern())),
            "{}: key {}",
            b.name,
            b.key.pattern()
        );
        assert!(row.contains(b.writer), "{}: writer {}", b.name, b.writer);
        let size = |bytes: u64| {
            if bytes.is_multiple_of(1 << 20) {
                format!("{} MiB", bytes >> 20)
            } else {
                format!("{} KiB", bytes >> 10)
            }
        };
        let limit = kv::max_bytes(b, kv::DEFAULT_FLEET_SIZE) as u64;
        let rollup = if b.allow_rollup { "allowed" } else { "refused" };
        for want in [
            format!("| {} |", size(b.max_value_bytes as u64)),
            format!("| {} MiB | {rollup} |", limit >> 20),
        ] {
            assert!(
                row.contains(&want),
                "{}: docs/kv-layout.md lacks {want:?} in {row}",
                b.name
            );
        }
    }
    let rows = page.lines().filter(|l| l.starts_with("| `")).count();
    assert_eq!(
        rows,
        kv::BUCKETS.len(),
        "docs/kv-layout.md lists buckets that are not in the layout"
    );
}

#[test]
fn socket_protocol_names_every_op_code_and_phase() {
    let page = doc("socket-protocol.md");
    for op in Request::OPS {
        assert!(page.contains(&format!("| `{op}` |")), "op {op}");
    }
    use ErrorCode::*;
    for code in [
        Busy,
        FrameTooLarge,
        Timeout,
        Malformed,
        UnsupportedProtocol,
        UnknownRequest,
        Forbidden,
        Invalid,
        Conflict,
        Quarantined,
        Expired,
        Internal,
    ] {
        let name = json_name(code);
        assert!(page.contains(&format!("| `{name}` |")), "error code {name}");
    }
    for p in JournalPhase::ALL {
        let name = json_name(p);
        assert!(
            page.contains(&format!("| `{name}` |")),
            "journal phase {name}"
        );
    }
    for p in fleet_wire::SystemJournalPhase::ALL {
        let name = json_name(p);
        assert!(
            page.contains(&format!("| `{name}` |")),
            "system journal phase {name}"
        );
    }
    use UpgradePhase::*;
    for p in [
        Preparing,
        Stopping,
        Starting,
        Complete,
        RollingBack,
        Failed,
        RollbackFailed,
    ] {
        assert!(
            page.contains(&format!("`{}`", json_name(p))),
            "public phase"
        );
    }
    let golden: serde_json::Value =
        serde_json::from_str(include_str!("golden/socket-request-upgrade.json")).unwrap();
    let line = page
        .lines()
        .find(|l| l.starts_with(r#"{"protocol":1,"request":{"op":"upgrade""#))
        .expect("upgrade example");
    let shown: serde_json::Value = serde_json::from_str(line).expect("the example is JSON");
    assert_eq!(
        shown, golden,
        "the upgrade example must equal wire/tests/golden/socket-request-upgrade.json"
    );
}

/// Every page a person reads: `docs/*.md` and the README, as (name, text).
fn pages() -> Vec<(String, String)> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    files.push(root.join("README.md"));
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            (p.file_name().unwrap().to_string_lossy().into_owned(), text)
        })
        .collect()
}

/// The first backticked name of each table row (`| `name` | …`) in the section that starts with `heading`.
fn table_names(page: &str, heading: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut inside = false;
    for line in page.lines() {
        if line.starts_with("## ") {
            inside = line.starts_with(heading);
            continue;
        }
        if let Some(rest) = line.strip_prefix("| `").filter(|_| inside) {
            if let Some(end) = rest.find('`') {
                names.push(rest[..end].to_owned());
            }
        }
    }
    assert!(!names.is_empty(), "no table under {heading:?}");
    names
}

/// Every `<start>X<end>` in `text`, as X.
fn between<'a>(text: &'a str, start: &str, end: char) -> Vec<&'a str> {
    text.match_indices(start)
        .filter_map(|(i, _)| {
            let rest = &text[i + start.len()..];
            rest.find(end).map(|e| &rest[..e])
        })
        .collect()
}

fn parses_as<T: serde::de::DeserializeOwned>(name: &str) -> bool {
    serde_json::from_value::<T>(serde_json::Value::String(name.to_owned())).is_ok()
}

#[test]
fn no_page_documents_a_request_code_or_phase_the_socket_does_not_have() {
    let page = doc("socket-protocol.md");
    for op in table_names(&page, "## Requests") {
        assert!(
            Request::OPS.contains(&op.as_str()),
            "docs/socket-protocol.md documents request {op:?}, which the socket does not have"
        );
    }
    for (name, text) in pages() {
        for op in between(&text, r#""op":""#, '"') {
            assert!(
                Request::OPS.contains(&op),
                "docs/{name} shows a request with op {op:?}, which the socket does not have"
            );
        }
    }
    for code in table_names(&page, "## Error codes") {
        assert!(
            parses_as::<ErrorCode>(&code),
            "docs/socket-protocol.md documents error code {code:?}, which the socket does not have"
        );
    }
    for phase in table_names(&page, "## Phases") {
        assert!(
            parses_as::<JournalPhase>(&phase) || parses_as::<fleet_wire::SystemJournalPhase>(&phase),
            "docs/socket-protocol.md documents journal phase {phase:?}, which the updater does not have"
        );
    }
}

#[test]
fn no_page_documents_a_bucket_the_layout_does_not_have() {
    let mut seen = 0;
    for (name, text) in pages() {
        // KV keys are written `bucket/<key>`; a bucket is also named as "`x` bucket" or "bucket `x`".
        let mut named: Vec<&str> = between(&text, "`", '/')
            .into_iter()
            .filter(|b| !b.is_empty() && b.chars().all(|c| c.is_ascii_lowercase() || c == '-'))
            .filter(|b| text.contains(&format!("`{b}/<")))
            .collect();
        for (i, _) in text.match_indices("` bucket") {
            let before = &text[..i];
            if let Some(open) = before.rfind('`') {
                named.push(&before[open + 1..]);
            }
        }
        named.extend(between(&text, "bucket `", '`'));
        named.extend(between(&text, "buckets `", '`'));
        for b in named {
            seen += 1;
            assert!(
                kv::bucket(b).is_some(),
                "docs/{name} names the KV bucket {b:?}, which fleet_wire::kv::BUCKETS does not have"
            );
        }
    }
    assert!(
        seen > 10,
        "the bucket scan found only {seen} names: is it still reading the docs?"
    );
}

/// Kind and short names of every CRD the operator installs (`operator/deploy/crds.yaml`, which the operator's
/// `deploy_drift` test keeps equal to the code).
fn crds() -> Vec<(String, String, Vec<String>)> {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../operator/deploy/crds.yaml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut out = Vec::new();
    for d in serde_yaml_ng::Deserializer::from_str(&text) {
        let v: serde_json::Value = serde::Deserialize::deserialize(d).unwrap();
        let names = &v["spec"]["names"];
        let shorts = names["shortNames"]
            .as_array()
            .map(|a| a.iter().map(|s| s.as_str().unwrap().to_owned()).collect())
            .unwrap_or_default();
        out.push((
            names["kind"].as_str().unwrap().to_owned(),
            names["plural"].as_str().unwrap().to_owned(),
            shorts,
        ));
    }
    assert!(out.len() >= 6, "{out:?}");
    out
}

#[test]
fn crds_md_documents_exactly_the_crds_the_operator_installs() {
    let crds = crds();
    let page = doc("crds.md");
    // Each CRD has a section `## Kind (`short`)` (or `(`kubectl get short`)`).
    let mut documented = Vec::new();
    for line in page.lines().filter(|l| l.starts_with("## ")) {
        let Some((kind, rest)) = line[3..].split_once(" (`") else {
            continue;
        };
        let short = rest
            .trim_end_matches("`)")
            .trim_start_matches("kubectl get ");
        let crd = crds.iter().find(|(k, _, _)| k == kind).unwrap_or_else(|| {
            panic!("docs/crds.md documents a CRD {kind:?} that the operator does not install")
        });
        assert!(
            crd.2.iter().any(|s| s == short),
            "docs/crds.md gives {kind} the short name {short:?}; the CRD has {:?}",
            crd.2
        );
        documented.push(kind.to_owned());
    }
    for (kind, _, _) in &crds {
        assert!(
            documented.contains(kind),
            "docs/crds.md has no section for the CRD {kind}"
        );
    }
    // Example manifests of the fleet's API group name installed kinds only.
    for (name, text) in pages() {
        let lines: Vec<&str> = text.lines().collect();
        for (i, l) in lines.iter().enumerate() {
            if !l
                .trim_start()
                .starts_with("apiVersion: fleet.nationtech.io/")
            {
                continue;
            }
            let kind = lines[i + 1..]
                .iter()
                .find_map(|l| l.trim_start().strip_prefix("kind: "))
                .unwrap_or_else(|| panic!("docs/{name}: a manifest without kind"));
            assert!(
                crds.iter().any(|(k, _, _)| k == kind.trim()),
                "docs/{name} shows a {kind} manifest; the operator installs no such CRD"
            );
        }
    }
}

#[test]
fn every_kubectl_resource_in_the_docs_exists() {
    let crds = crds();
    // Core resources the docs may name besides the fleet's own.
    const CORE: &[&str] = &[
        "pods",
        "events",
        "crd",
        "crds",
        "namespaces",
        "deployments",
        "secrets",
    ];
    let mut seen = 0;
    for (name, text) in pages() {
        for verb in [
            "get", "describe", "label", "annotate", "edit", "delete", "create",
        ] {
            for rest in between(&text, &format!("kubectl {verb} "), '\n') {
                let Some(resource) = rest.split_whitespace().next() else {
                    continue;
                };
                let resource = resource.trim_end_matches(['`', ';', ',', ')']);
                if resource.starts_with('-')
                    || resource.is_empty()
                    || resource == "a"
                    || resource == "the"
                {
                    continue;
                }
                seen += 1;
                let known = CORE.contains(&resource)
                    || crds.iter().any(|(kind, plural, shorts)| {
                        resource.eq_ignore_ascii_case(kind)
                            || resource == plural
                            || shorts.iter().any(|s| s == resource)
                    });
                assert!(
                    known,
                    "docs/{name}: `kubectl {verb} {resource}` names a resource the operator does not install"
                );
            }
        }
    }
    assert!(seen > 5, "only {seen} kubectl commands found");
}
