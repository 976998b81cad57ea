//! The units the package ships say what the docs say: every ordering (`After=`) and time directive (`Timeout*`,
//! `On*Sec`, `RandomizedDelaySec`, `AccuracySec`, `RestartSec`) of each unit file is in the table of
//! docs/device-setup.md ("The units"), and every directive of that table is in the file; the agent's time-outs are
//! the ones the updater's bounds are built on (`fleet_wire::limits`); the health-judging reboot timer never uses
//! `OnBootSec`. Reads the files only (no guest): the package test boots them.

use fleet_wire::limits;
use std::collections::BTreeSet;
use std::path::PathBuf;

const UNITS: [&str; 9] = [
    "agent/systemd/fleet-agent.service",
    "updater/systemd/fleet-updater.service",
    "updater/systemd/fleet-reboot.timer",
    "updater/systemd/fleet-reboot.service",
    "updater/systemd/fleet-reboot-release.service",
    "updater/systemd/fleet-boot-watchdog.timer",
    "updater/systemd/fleet-boot-watchdog.service",
    "updater/systemd/fleet-token.timer",
    "updater/systemd/fleet-token.service",
];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// Whether a directive is about order or time.
fn timing(key: &str) -> bool {
    key == "After"
        || key.starts_with("Timeout")
        || (key.starts_with("On") && key.ends_with("Sec"))
        || matches!(key, "RandomizedDelaySec" | "AccuracySec" | "RestartSec")
}

/// The ordering and time directives of a unit file, as `Key=Value`.
fn file_directives(text: &str) -> BTreeSet<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#') && !l.starts_with('['))
        .filter_map(|l| l.split_once('='))
        .filter(|(k, _)| timing(k.trim()))
        .map(|(k, v)| format!("{}={}", k.trim(), v.trim()))
        .collect()
}

/// The table rows of docs/device-setup.md: unit name → the backticked `Key=Value` directives of its row.
fn documented() -> Vec<(String, BTreeSet<String>)> {
    let doc = read("docs/device-setup.md");
    let table = doc
        .split("| unit | directives |")
        .nth(1)
        .expect("the units table in docs/device-setup.md");
    table
        .lines()
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|row| {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            let unit = cells[1].trim_matches('`').to_string();
            let directives = cells[2]
                .split('`')
                .skip(1)
                .step_by(2)
                .filter(|d| d.split_once('=').is_some_and(|(k, _)| timing(k)))
                .filter(|d| !d.ends_with('='))
                .map(str::to_owned)
                .collect();
            (unit, directives)
        })
        .collect()
}

#[test]
fn unit_files_have_exactly_the_documented_timing() {
    let docs = documented();
    assert_eq!(
        docs.iter().map(|(u, _)| u.as_str()).collect::<Vec<_>>(),
        UNITS
            .iter()
            .map(|p| p.rsplit('/').next().unwrap_or(p))
            .collect::<Vec<_>>(),
        "one row per shipped unit, in this order"
    );
    for (path, (unit, want)) in UNITS.iter().zip(&docs) {
        let have = file_directives(&read(path));
        assert_eq!(
            &have, want,
            "{unit}: the file ({path}) and docs/device-setup.md differ"
        );
    }
}

#[test]
fn the_agent_time_outs_are_the_updaters_and_the_reboot_timer_waits_for_the_boot() {
    let agent = file_directives(&read("agent/systemd/fleet-agent.service"));
    let secs = |d: std::time::Duration| d.as_secs();
    assert!(agent.contains(&format!(
        "TimeoutStopSec={}",
        secs(limits::SYSTEMD_STOP_TIMEOUT)
    )));
    assert!(agent.contains(&format!(
        "TimeoutStartSec={}min",
        secs(limits::SYSTEMD_START_TIMEOUT) / 60
    )));
    assert!(limits::UPDATER_STOP_BOUND > limits::SYSTEMD_STOP_TIMEOUT);
    assert!(limits::UPDATER_START_BOUND > limits::SYSTEMD_START_TIMEOUT);
    let reboot = file_directives(&read("updater/systemd/fleet-reboot.timer"));
    assert!(reboot.contains("After=multi-user.target"), "{reboot:?}");
    assert!(reboot.iter().any(|d| d.starts_with("OnActiveSec=")));
    assert!(!reboot.iter().any(|d| d.starts_with("OnBootSec=")));
    let watchdog = file_directives(&read("updater/systemd/fleet-boot-watchdog.timer"));
    assert!(
        !watchdog.iter().any(|d| d.starts_with("After=")),
        "the watchdog's timer must start before multi-user.target: {watchdog:?}"
    );
}

/// The agent and the updater are the last the kernel's OOM killer picks (containers get `oom_score_adj` 500 from
/// the agent, other processes 0) and keep a protected minimum of memory (docs/crds.md gives the sizing).
#[test]
fn the_agent_and_the_updater_go_last_to_the_oom_killer() {
    for (path, min) in [
        ("agent/systemd/fleet-agent.service", "32M"),
        ("updater/systemd/fleet-updater.service", "16M"),
    ] {
        let text = read(path);
        let service: BTreeSet<&str> = text
            .split("[Service]")
            .nth(1)
            .unwrap_or_else(|| panic!("{path}: no [Service]"))
            .split("\n[")
            .next()
            .unwrap_or_default()
            .lines()
            .map(str::trim)
            .collect();
        assert!(service.contains("OOMScoreAdjust=-900"), "{path}");
        assert!(
            service.contains(format!("MemoryMin={min}").as_str()),
            "{path}"
        );
    }
    const { assert!(fleet_agent::podman::limits::CONTAINER_OOM_SCORE_ADJ > 0) };
}
