//! The operator's source layout, as a pure file scan: no product folder (deployments, tasks, dashboard,
//! diagnostics) imports another — what two of them need lives beside them (`fleet/`, `cache`, `conditions`, `kv` …)
//! — the shared `fleet/` imports no product folder, no file in `operator/src` is over 1,000 lines, and `main` is
//! thin. Comment lines are not imports and are not read.

use std::path::{Path, PathBuf};

/// The product folders under `operator/src`.
const PRODUCTS: [&str; 4] = ["deployments", "tasks", "dashboard", "diagnostics"];
/// Longest source file.
const MAX_LINES: usize = 1_000;
/// Longest `fn main` in main.rs (shared/style.md: a thin main, option parsing and wiring only).
const MAX_MAIN_LINES: usize = 80;

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

fn files_under(folder: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    rust_files(&src().join(folder), &mut out);
    out
}

/// The code of a file: every line but comment lines.
fn code(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether `code` names the crate's module `folder` by path: `crate::folder`, `fleet_operator::folder`,
/// `super::folder` (a path climbing out — unless the file's own folder has a module of that name, `sibling`), or
/// `folder` inside a `use crate::{ … }` group.
fn names(code: &str, folder: &str, sibling: bool) -> bool {
    let word_ends = |rest: &str| !rest.starts_with(|c: char| c.is_alphanumeric() || c == '_');
    let prefixes: &[&str] = if sibling {
        &["crate::", "fleet_operator::"]
    } else {
        &["crate::", "fleet_operator::", "super::"]
    };
    for prefix in prefixes {
        let needle = format!("{prefix}{folder}");
        if code
            .match_indices(&needle)
            .any(|(i, _)| word_ends(&code[i + needle.len()..]))
        {
            return true;
        }
    }
    // grouped imports: `use crate::{a, folder::b}`
    code.match_indices("use crate::{").any(|(i, _)| {
        let group = &code[i..];
        let group = &group[..group.find(';').unwrap_or(group.len())];
        group.match_indices(folder).any(|(j, _)| {
            let before = group[..j].chars().last();
            matches!(before, Some('{' | ',' | ' ' | '\n')) && word_ends(&group[j + folder.len()..])
        })
    })
}

/// Every file of `folder` that names one of `others`, as `path: other`.
fn crossings(folder: &str, others: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    let dir = src().join(folder);
    for f in files_under(folder) {
        let c = code(&f);
        for other in others {
            let sibling = dir.join(format!("{other}.rs")).exists() || dir.join(other).is_dir();
            if names(&c, other, sibling) {
                out.push(format!(
                    "{}: {other}",
                    f.strip_prefix(src()).unwrap_or(&f).display()
                ));
            }
        }
    }
    out
}

#[test]
fn no_product_folder_imports_another() {
    let mut found = Vec::new();
    for p in PRODUCTS {
        let others: Vec<&str> = PRODUCTS.iter().copied().filter(|o| *o != p).collect();
        found.extend(crossings(p, &others));
    }
    assert!(
        found.is_empty(),
        "product folders importing another:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_shared_fleet_folder_imports_no_product_folder() {
    assert!(
        src().join("fleet").is_dir(),
        "operator/src/fleet/ is missing"
    );
    let found = crossings("fleet", &PRODUCTS);
    assert!(
        found.is_empty(),
        "fleet/ importing a product folder:\n{}",
        found.join("\n")
    );
}

#[test]
fn no_source_file_is_over_a_thousand_lines() {
    let mut all = Vec::new();
    rust_files(&src(), &mut all);
    let long: Vec<String> = all
        .iter()
        .filter_map(|f| {
            let n = std::fs::read_to_string(f).expect("read").lines().count();
            (n > MAX_LINES).then(|| format!("{}: {n} lines", f.display()))
        })
        .collect();
    assert!(
        long.is_empty(),
        "over {MAX_LINES} lines:\n{}",
        long.join("\n")
    );
}

#[test]
fn main_is_thin() {
    let text = std::fs::read_to_string(src().join("main.rs")).expect("main.rs");
    let lines: Vec<&str> = text.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.starts_with("fn main(") || l.starts_with("async fn main("))
        .expect("fn main in main.rs");
    let len = lines[start..]
        .iter()
        .position(|l| *l == "}")
        .expect("the end of fn main")
        + 1;
    assert!(
        len <= MAX_MAIN_LINES,
        "fn main is {len} lines, over {MAX_MAIN_LINES}"
    );
}

/// The scan itself: it sees each way of naming another folder, and not a module of another crate of that name.
#[test]
fn the_scan_sees_every_path_form() {
    for c in [
        "use crate::deployments::engine;",
        "let x = crate::deployments::engine::run(o);",
        "use fleet_operator::tasks::planning;",
        "use super::super::dashboard::html;",
        "use crate::{conditions, deployments::placement};",
        "use crate::{\n    deployments,\n    kv,\n};",
    ] {
        assert!(PRODUCTS.iter().any(|p| names(c, p, false)), "{c}");
    }
    for c in [
        "use fleet_wire::tasks::TaskRun;",
        "// see crate::deployments::engine",
        "use crate::deployments_extra::x;",
        "use crate::{conditions, kv};",
    ] {
        let c = c
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<String>();
        assert!(!PRODUCTS.iter().any(|p| names(&c, p, false)), "{c}");
    }
    // dashboard/diagnostics.rs is the dashboard's own module, not the diagnostics folder
    assert!(!names("super::diagnostics::select(s)", "diagnostics", true));
    assert!(names("crate::diagnostics::phase", "diagnostics", true));
}
