//! The README as a front door: short enough to read in two minutes, its two commands real and the ones CI runs, and
//! every path it or a docs page links to present in the repository.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    fleet_rig::util::workspace_root()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The relative link targets of a markdown text (`](target)`), without their `#anchor`.
fn links(text: &str) -> Vec<String> {
    text.split("](")
        .skip(1)
        .filter_map(|rest| rest.split_once(')').map(|(target, _)| target))
        .filter(|t| !t.starts_with("http://") && !t.starts_with("https://") && !t.starts_with('#'))
        .map(|t| t.split('#').next().unwrap_or_default().to_owned())
        .collect()
}

/// Repository paths named in backticks (`scripts/demo`, `docs/crds.md` …): the first word of each span that starts
/// with one of the top-level folders.
fn named_paths(text: &str) -> Vec<String> {
    const TOP: [&str; 8] = [
        "scripts/",
        "docs/",
        "operator/",
        "vm-tests/",
        "wire/",
        "agent/",
        "updater/",
        ".ci/",
    ];
    text.lines()
        .flat_map(|line| line.split('`').skip(1).step_by(2))
        .filter_map(|span| span.split_whitespace().next())
        .filter(|w| TOP.iter().any(|t| w.starts_with(t)))
        .map(|w| w.trim_end_matches(['.', ',', ':', ';']).to_owned())
        .collect()
}

#[test]
fn the_readme_fits_in_120_lines_of_at_most_120_characters() {
    let readme = read(&root().join("README.md"));
    let lines = readme.lines().count();
    assert!(lines <= 120, "README.md has {lines} lines (at most 120)");
    let long: Vec<String> = readme
        .lines()
        .enumerate()
        .filter(|(_, l)| l.chars().count() > 120)
        .map(|(i, l)| format!("line {}: {} characters", i + 1, l.chars().count()))
        .collect();
    assert!(
        long.is_empty(),
        "README.md lines over 120 characters:\n{}",
        long.join("\n")
    );
}

#[test]
fn the_two_commands_exist_and_ci_runs_the_test_command() {
    let root = root();
    let readme = read(&root.join("README.md"));
    let section = readme
        .split("## Two commands")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("README.md has a section \"Two commands\"");
    let rows: Vec<&str> = section
        .lines()
        .filter(|l| l.starts_with('|') && l.contains("`scripts/"))
        .collect();
    assert_eq!(rows.len(), 2, "two commands, one row each: {rows:?}");
    for (row, command) in rows.iter().zip(["scripts/demo", "scripts/test"]) {
        assert!(row.contains(&format!("`{command}`")), "{row}");
        let meta = std::fs::metadata(root.join(command)).expect(command);
        assert!(
            std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o111 != 0,
            "{command} is executable"
        );
    }
    let ci = read(&root.join(".ci/run"));
    assert!(
        ci.lines().any(|l| l.trim() == "exec scripts/test"),
        ".ci/run runs exactly the README's test command"
    );
}

#[test]
fn every_path_the_readme_and_the_docs_name_exists() {
    let root = root();
    let mut pages = vec![root.join("README.md")];
    for e in std::fs::read_dir(root.join("docs")).expect("docs/") {
        let p = e.expect("entry").path();
        if p.extension().is_some_and(|x| x == "md") {
            pages.push(p);
        }
    }
    let mut missing = Vec::new();
    for page in &pages {
        let text = read(page);
        let dir = page.parent().expect("a folder");
        for link in links(&text) {
            if !link.is_empty() && !dir.join(&link).exists() {
                missing.push(format!("{}: link {link}", page.display()));
            }
        }
    }
    let readme = read(&root.join("README.md"));
    for path in named_paths(&readme) {
        if !root.join(&path).exists() {
            missing.push(format!("README.md: `{path}`"));
        }
    }
    assert!(
        missing.is_empty(),
        "named but missing:\n{}",
        missing.join("\n")
    );
}
