//! `fleet-updater --help` names every configuration key docs/updater.md documents, and each of them is one the
//! configuration parser accepts.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use fleet_updater::config::Config;

const BIN: &str = env!("CARGO_BIN_EXE_fleet-updater");

/// The keys of the configuration table in docs/updater.md (rows `| \`key\` | default | meaning |`).
fn documented_keys() -> Vec<String> {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/updater.md"))
        .expect("docs/updater.md");
    let table = doc
        .split("| key | default | meaning |")
        .nth(1)
        .expect("the configuration table");
    table
        .lines()
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .filter_map(|l| l.strip_prefix("| `")?.split('`').next().map(str::to_owned))
        .collect()
}

#[test]
fn help_lists_every_documented_key_and_the_parser_takes_each() {
    let keys = documented_keys();
    assert!(keys.len() >= 7, "{keys:?}");
    let out = std::process::Command::new(BIN)
        .arg("--help")
        .output()
        .expect("run");
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).expect("utf-8");
    let listed = help
        .split("Configuration keys")
        .nth(1)
        .and_then(|s| s.split("Logging").next())
        .expect("the key list");
    for key in &keys {
        assert!(
            listed.split([' ', ',', '.', '\n', ':']).any(|w| w == key),
            "--help does not list {key}:\n{help}"
        );
        // A key the parser does not know would be ignored (parsed fine, with a warning); a known key refuses a list.
        let e = Config::parse(&format!("{key} = []\n"), "test").expect_err("a list is no value");
        assert!(!e.to_string().contains("unknown field"), "{key}: {e}");
    }
}
