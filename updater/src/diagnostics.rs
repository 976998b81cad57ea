//! The updater's items of a diagnostics request (`docs/diagnostics.md`): the agent's and the updater's
//! journals, the failed units, the boot watchdog's verdict and the diagnostics files kept before reboots, and the
//! updater's journal state. Read-only and a fixed menu: the programs and their arguments are compiled in, every
//! path is derived from the updater's root, and of the request only `lines` and `sinceSeconds` (numbers, validated)
//! reach a command line. Each item is collected on its own thread under one deadline, so the answer comes well
//! within the agent's status time-out, a slow item saying it timed out instead of holding the others back.

use crate::agent_upgrade::transaction::{Updater, UPDATER_UNIT};
use crate::boot_watchdog::{history, WatchdogPaths};
use crate::child;
use crate::paths::Paths;
use fleet_wire::diagnostics::{Collector, DiagnosticsRequest, Item, Section};
use fleet_wire::limits::SOCKET_STATUS_RESPONSE_TIMEOUT;
use fleet_wire::{ErrorCode, Response, Timestamp, UnitName, UpdaterStatus};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{mpsc, TryLockError};
use std::thread;
use std::time::{Duration, Instant};

/// Bound of each command (`journalctl`, `systemctl`): killed with its process group past it.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);
/// The whole answer's deadline: an item not collected by then is answered as failed. Below the agent's 15 s
/// status time-out with room for writing the answer.
pub const DEADLINE: Duration = Duration::from_secs(10);
const _: () = assert!(DEADLINE.as_secs() + 3 <= SOCKET_STATUS_RESPONSE_TIMEOUT.as_secs());
/// Standard output kept of a command (its newest bytes): more than a section's 32 KiB, so that the section is
/// cut at a line by [`Section::new`] rather than here.
pub const OUTPUT_MAX_BYTES: usize = 256 * 1024;
/// Largest diagnostics file read (a watchdog file has about ten sections of at most 64 KiB each).
pub const FILE_MAX_BYTES: u64 = 1024 * 1024;
/// Bytes of a diagnostics file shown: its head, where the reason, the decision and the stuck jobs are.
pub const FILE_HEAD_BYTES: usize = 12 * 1024;
/// The boot watchdog's unit, whose journal in this boot holds its verdict (an `up` verdict writes no file).
pub const WATCHDOG_UNIT: &str = "fleet-boot-watchdog.service";
/// Lines of the watchdog's journal in this boot (one run per boot: a handful of lines).
const WATCHDOG_LINES: u32 = 20;

/// Answers a `diagnostics` request: `invalid` out of bounds, `busy` while another is being collected, else one
/// section per updater item. Never takes the mutating lock, so it is answered during an upgrade too.
pub fn answer(updater: &Updater, request: &DiagnosticsRequest) -> Response {
    if let Err(e) = request.validate() {
        return Response::error(ErrorCode::Invalid, format!("diagnostics request: {e}"));
    }
    // One request at a time: each runs up to four commands, which a peer must not multiply by the handlers.
    let _one = match updater.diagnostics_lock().try_lock() {
        Ok(g) => g,
        Err(TryLockError::Poisoned(p)) => p.into_inner(),
        Err(TryLockError::WouldBlock) => {
            return Response::error(
                ErrorCode::Busy,
                "another diagnostics request is being collected; try again",
            )
        }
    };
    let started = Instant::now();
    let sources = Sources::new(updater.paths(), updater.agent_unit().clone());
    let sections = sources.collect(request, updater.status());
    // What was collected and how much, never the text (it may hold what the agent redacts later).
    let names: Vec<String> = sections
        .iter()
        .map(|s| match &s.error {
            Some(_) => format!("{} (failed)", s.item.name()),
            None => s.item.name().to_owned(),
        })
        .collect();
    let bytes: usize = sections.iter().map(|s| s.text.len()).sum();
    log::info!(
        "diagnostics: {} ({bytes} bytes of text, {} lines asked) in {} ms",
        if names.is_empty() {
            "no updater item asked".to_owned()
        } else {
            names.join(", ")
        },
        request.lines,
        started.elapsed().as_millis()
    );
    Response::Diagnostics { sections }
}

/// Why one section was not collected: its text is the section's `error` in the answer to the agent.
#[derive(Debug, thiserror::Error)]
enum SectionError {
    /// The command could not be run, or ran past its bound.
    #[error(transparent)]
    Child(#[from] child::ChildError),
    /// The command ran and failed: `<program> <args> failed (<status>): <stderr tail>`.
    #[error("{command} failed ({status}): {stderr}")]
    Failed {
        /// The command line.
        command: String,
        /// How it ended.
        status: std::process::ExitStatus,
        /// The end of its standard error.
        stderr: String,
    },
    /// An item the agent collects.
    #[error("collected by the agent, not the updater")]
    AgentItem,
}

impl SectionError {
    fn failed(program: &str, args: &[String], f: &child::Finished) -> Self {
        Self::Failed {
            command: format!("{program} {}", args.join(" ")),
            status: f.status,
            stderr: f.stderr_tail(),
        }
    }
}

/// Where the updater's items come from: its root, the agent's unit, the two programs and the bounds.
#[derive(Debug, Clone)]
pub struct Sources {
    paths: Paths,
    agent_unit: UnitName,
    journalctl: PathBuf,
    systemctl: PathBuf,
    command_timeout: Duration,
    deadline: Duration,
}

impl Sources {
    /// The device's sources: `journalctl` and `systemctl` of the host, the production bounds.
    pub fn new(paths: &Paths, agent_unit: UnitName) -> Self {
        Self {
            paths: paths.clone(),
            agent_unit,
            journalctl: "journalctl".into(),
            systemctl: "systemctl".into(),
            command_timeout: COMMAND_TIMEOUT,
            deadline: DEADLINE,
        }
    }

    /// Other programs in place of `journalctl` and `systemctl` (tests: scripted hosts).
    pub fn with_programs(mut self, journalctl: PathBuf, systemctl: PathBuf) -> Self {
        self.journalctl = journalctl;
        self.systemctl = systemctl;
        self
    }

    /// Other bounds (tests).
    pub fn with_bounds(mut self, command_timeout: Duration, deadline: Duration) -> Self {
        self.command_timeout = command_timeout;
        self.deadline = deadline;
        self
    }

    /// The sections of the updater's items of `request` (validated by the caller), in [`Item::ALL`]'s order;
    /// `state` is rendered for [`Item::UpdaterState`].
    pub fn collect(&self, request: &DiagnosticsRequest, state: UpdaterStatus) -> Vec<Section> {
        let items: Vec<Item> = request
            .items()
            .into_iter()
            .filter(|i| i.collector() == Collector::Updater)
            .collect();
        let deadline = Instant::now() + self.deadline;
        let (tx, rx) = mpsc::channel::<(usize, Section)>();
        let mut sections: Vec<Option<Section>> = vec![None; items.len()];
        let mut waiting = 0;
        for (i, &item) in items.iter().enumerate() {
            let (me, tx, state) = (self.clone(), tx.clone(), state.clone());
            let (lines, since) = (request.lines, request.since_seconds);
            let spawned = thread::Builder::new()
                .name("diagnostics".into())
                .stack_size(256 * 1024)
                .spawn(move || {
                    let _ = tx.send((i, me.item(item, lines, since, &state)));
                });
            match spawned {
                Ok(_) => waiting += 1,
                Err(e) => {
                    sections[i] = Some(Section::failed(
                        item,
                        None,
                        format!("could not start its collector thread: {e}"),
                    ))
                }
            }
        }
        drop(tx);
        let mut gone = false;
        while waiting > 0 {
            match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok((i, s)) => {
                    sections[i] = Some(s);
                    waiting -= 1;
                }
                Err(mpsc::RecvTimeoutError::Timeout) => break,
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    gone = true;
                    break;
                }
            }
        }
        // A collector still running is left to its own command bound; its item is answered as failed now.
        items
            .into_iter()
            .zip(sections)
            .map(|(item, s)| {
                s.unwrap_or_else(|| {
                    let why = if gone {
                        "its collector stopped without an answer (see the updater's journal)".to_owned()
                    } else {
                        format!(
                            "not collected within the request's {} s deadline; the other items are answered",
                            self.deadline.as_secs_f32()
                        )
                    };
                    Section::failed(item, None, why)
                })
            })
            .collect()
    }

    fn item(&self, item: Item, lines: u32, since: Option<u64>, state: &UpdaterStatus) -> Section {
        let text = match item {
            Item::AgentJournal => self.journal(self.agent_unit.as_str(), lines, since, false),
            Item::UpdaterJournal => self.journal(UPDATER_UNIT, lines, since, false),
            Item::FailedUnits => self.failed_units(),
            Item::BootDiagnostics => Ok(self.boot_diagnostics(lines)),
            Item::UpdaterState => Ok(render_state(state)),
            Item::WorkloadLogs | Item::Containers | Item::Disk | Item::Memory => {
                Err(SectionError::AgentItem)
            }
        };
        match text {
            Ok(t) => Section::new(item, None, &printable(&t), lines),
            Err(e) => Section::failed(item, None, e.to_string()),
        }
    }

    fn run(&self, program: &Path, args: &[String]) -> Result<child::Finished, child::ChildError> {
        let mut cmd = Command::new(program);
        cmd.args(args);
        child::run_bounded_tail(&mut cmd, self.command_timeout, OUTPUT_MAX_BYTES)
    }

    /// The newest `lines` lines of `unit`'s journal (the system manager's: the agent's unit is a system unit
    /// with `User=`, the one the updater stops and starts), or a line saying there are none.
    fn journal(
        &self,
        unit: &str,
        lines: u32,
        since: Option<u64>,
        this_boot: bool,
    ) -> Result<String, SectionError> {
        let args = journal_args(unit, lines, since, this_boot);
        let f = self.run(&self.journalctl, &args)?;
        if !f.status.success() {
            return Err(SectionError::failed("journalctl", &args, &f));
        }
        let out = String::from_utf8_lossy(&f.stdout);
        let body = out.trim_end();
        if !body.is_empty() && body != "-- No entries --" {
            return Ok(body.to_owned());
        }
        let mut none = format!("no journal entries for {unit}");
        if let Some(s) = since {
            let _ = write!(none, " in the last {s} s");
        }
        if this_boot {
            none.push_str(" in this boot");
        }
        // "No journal files were found." and the like: why there are none.
        let said = f.stderr_tail();
        if !said.is_empty() {
            let _ = write!(none, " (journalctl: {said})");
        }
        Ok(none)
    }

    fn failed_units(&self) -> Result<String, SectionError> {
        let args: Vec<String> = [
            "list-units",
            "--state=failed",
            "--no-legend",
            "--plain",
            "--no-pager",
        ]
        .map(String::from)
        .into();
        let f = self.run(&self.systemctl, &args)?;
        if !f.status.success() {
            return Err(SectionError::failed("systemctl", &args, &f));
        }
        let out = String::from_utf8_lossy(&f.stdout);
        Ok(match out.trim_end() {
            "" => "none: no unit is failed".to_owned(),
            units => units.to_owned(),
        })
    }

    /// The newest snapshots fleet-reboot and the boot watchdog keep, the watchdog's reboot record and login
    /// message, then its run in this boot: the oldest evidence first, as a section keeps its newest lines. Each
    /// snapshot shows its head (the reason, the decision, the stuck jobs) in a third of the `lines` asked, so
    /// that the section's cut leaves the heads and the verdict rather than the middle of one file.
    fn boot_diagnostics(&self, lines: u32) -> String {
        let head_lines = (lines as usize / 3).max(4);
        let root = self.paths.root();
        let watchdog = WatchdogPaths::new(root);
        let reboot = crate::reboot::system::Paths::new(root);
        let mut out = String::new();
        newest_snapshot(
            &mut out,
            "fleet-reboot diagnostics (written before each coordinated reboot)",
            &reboot.diagnostics_dir(),
            "reboot",
            head_lines,
        );
        newest_snapshot(
            &mut out,
            "boot watchdog diagnostics (written when a boot did not finish)",
            &watchdog.diagnostics_dir(),
            "boot",
            head_lines,
        );
        let record = watchdog.history();
        match history::load(&record) {
            Ok(h) if h.reboots.is_empty() => {
                let _ = writeln!(out, "== boot watchdog reboots: none recorded");
            }
            Ok(h) => {
                let times: Vec<String> = h.reboots.iter().map(Timestamp::to_string).collect();
                let _ = writeln!(
                    out,
                    "== boot watchdog reboots ({}): {}: {}",
                    record.display(),
                    h.reboots.len(),
                    times.join(", ")
                );
            }
            Err(e) => {
                let _ = writeln!(
                    out,
                    "== boot watchdog reboots: unreadable ({e}); the watchdog counts that as a full cap"
                );
            }
        }
        let motd = watchdog.motd();
        match fleet_wire::bounded::read_text(&motd, 64 * 1024) {
            Ok(t) => {
                let _ = writeln!(
                    out,
                    "== the reboot cap holds in this boot (login message {}):\n{}",
                    motd.display(),
                    t.trim_end()
                );
            }
            Err(e) if e.is_not_found() => {
                let _ = writeln!(
                    out,
                    "== reboot cap: not reached in this boot (no {})",
                    motd.display()
                );
            }
            Err(e) => {
                let _ = writeln!(out, "== reboot cap: login message unreadable ({e})");
            }
        }
        let _ = writeln!(
            out,
            "== this boot's watchdog verdict (journalctl --unit={WATCHDOG_UNIT} --boot):"
        );
        match self.journal(WATCHDOG_UNIT, WATCHDOG_LINES, None, true) {
            Ok(t) => out.push_str(&t),
            Err(e) => out.push_str(&e.to_string()),
        }
        out
    }
}

/// `journalctl`'s arguments: numbers only from the request, the unit from the configuration or compiled in.
pub fn journal_args(unit: &str, lines: u32, since: Option<u64>, this_boot: bool) -> Vec<String> {
    let mut a = vec![format!("--unit={unit}"), format!("--lines={lines}")];
    if let Some(s) = since {
        a.push(format!("--since=-{s}s"));
    }
    if this_boot {
        a.push("--boot".into());
    }
    a.push("--output=short-iso".into());
    a.push("--no-pager".into());
    a
}

/// Appends the newest `<prefix>-<unix ms>.log` of `dir` (its head: at most `lines` lines and [`FILE_HEAD_BYTES`]),
/// or why there is none.
fn newest_snapshot(out: &mut String, what: &str, dir: &Path, prefix: &str, lines: usize) {
    let entries = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let _ = writeln!(out, "== {what}: none ({} does not exist)", dir.display());
            return;
        }
        Err(e) => {
            let _ = writeln!(out, "== {what}: {}: {e}", dir.display());
            return;
        }
    };
    // Ten are kept; the bound only guards against a directory someone filled.
    let mut snapshots: Vec<(u64, PathBuf)> = entries
        .take(10_000)
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name();
            let ms = name
                .to_str()?
                .strip_prefix(prefix)?
                .strip_prefix('-')?
                .strip_suffix(".log")?
                .parse::<u64>()
                .ok()?;
            Some((ms, e.path()))
        })
        .collect();
    snapshots.sort();
    let Some((ms, path)) = snapshots.last() else {
        let _ = writeln!(out, "== {what}: none in {}", dir.display());
        return;
    };
    let _ = writeln!(
        out,
        "== {what}: the newest of {} in {}: {}, written {}",
        snapshots.len(),
        dir.display(),
        path.file_name().unwrap_or_default().to_string_lossy(),
        Timestamp::from_unix_ms(*ms)
    );
    match fleet_wire::bounded::read(path, FILE_MAX_BYTES) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let (head, more) = head(&text, lines, FILE_HEAD_BYTES);
            let _ = writeln!(out, "{}", head.trim_end());
            if more > 0 {
                let _ = writeln!(out, "(… {more} more bytes in {})", path.display());
            }
        }
        Err(e) => {
            let _ = writeln!(out, "(unreadable: {e})");
        }
    }
}

/// The first `lines` lines of `text` within `max` bytes (cut at a line end where one falls within, else at a
/// character boundary) and how many bytes were left out.
pub fn head(text: &str, lines: usize, max: usize) -> (&str, usize) {
    let mut end = text.len();
    if let Some((i, _)) = text.match_indices('\n').nth(lines.saturating_sub(1)) {
        end = end.min(i + 1);
    }
    if end > max {
        end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        if let Some(nl) = text[..end].rfind('\n') {
            end = nl + 1;
        }
    }
    (&text[..end], text.len() - end)
}

/// `text` with control characters but newline and tab replaced: no terminal escapes reach a person's screen, and
/// no byte of a section takes more than two bytes of JSON (a quote or a backslash), which keeps the answer of five
/// sections of 32 KiB well within the socket's 1 MiB frame.
pub fn printable(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() && c != '\n' && c != '\t' {
                '\u{fffd}'
            } else {
                c
            }
        })
        .collect()
}

/// The updater's journal state for a person: the updater, then each transaction's fields and its transitions
/// (oldest first). Field names are the status's own (`docs/socket-protocol.md`).
pub fn render_state(s: &UpdaterStatus) -> String {
    let mut out = format!(
        "fleet-updater {}, boot {}, recovering: {}\ncapabilities: {}\n",
        s.updater_version,
        s.boot_id
            .as_ref()
            .map_or_else(|| "unknown".to_owned(), |b| b.to_string()),
        if s.recovering { "yes" } else { "no" },
        if s.capabilities.is_empty() {
            "none".to_owned()
        } else {
            s.capabilities
                .iter()
                .map(|c| json_text(&serde_json::to_value(c).unwrap_or_default()))
                .collect::<Vec<_>>()
                .join(", ")
        }
    );
    transaction(
        &mut out,
        "agent upgrade",
        s.agent_upgrade
            .as_ref()
            .and_then(|a| serde_json::to_value(a).ok()),
    );
    transaction(
        &mut out,
        "system upgrade",
        s.system_upgrade
            .as_ref()
            .and_then(|a| serde_json::to_value(a).ok()),
    );
    out
}

fn transaction(out: &mut String, title: &str, value: Option<serde_json::Value>) {
    let Some(serde_json::Value::Object(fields)) = value else {
        let _ = writeln!(out, "{title}: none journaled");
        return;
    };
    let _ = writeln!(out, "{title}:");
    for (k, v) in &fields {
        if k != "transitions" {
            let _ = writeln!(out, "  {k}: {}", json_text(v).replace('\n', "\n    "));
        }
    }
    if let Some(serde_json::Value::Array(ts)) = fields.get("transitions") {
        let _ = writeln!(out, "  transitions (oldest first):");
        for t in ts {
            let field = |k: &str| t.get(k).map(json_text).unwrap_or_default();
            let reason = field("reason");
            let _ = writeln!(
                out,
                "    {} {}{}",
                field("at"),
                field("phase"),
                if reason.is_empty() {
                    String::new()
                } else {
                    format!(" ({reason})")
                }
            );
        }
    }
}

fn json_text(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_wire::diagnostics::MAX_SECTION_BYTES;
    use fleet_wire::limits::SOCKET_FRAME_MAX_BYTES;
    use fleet_wire::{fixtures, Capability};
    use std::os::unix::fs::PermissionsExt;

    fn request(lines: u32, since: Option<u64>) -> DiagnosticsRequest {
        DiagnosticsRequest {
            items: vec![],
            workloads: vec![],
            lines,
            since_seconds: since,
            requested_at: Timestamp::from_unix_ms(1),
        }
    }

    fn status() -> UpdaterStatus {
        UpdaterStatus {
            updater_version: "9.9.9".into(),
            boot_id: None,
            recovering: false,
            agent_upgrade: Some(fixtures::failed_status()),
            system_upgrade: None,
            capabilities: vec![Capability::AgentUpgradeV1],
        }
    }

    /// A scripted program in `dir`: `body` runs under `sh` with the arguments, which it may print.
    fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).expect("write");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        p
    }

    fn sources(root: &Path, journalctl: &str, systemctl: &str) -> Sources {
        Sources::new(
            &Paths::new(root),
            UnitName::try_from("fleet-agent.service").expect("unit"),
        )
        .with_programs(
            script(root, "journalctl", journalctl),
            script(root, "systemctl", systemctl),
        )
    }

    fn by_item(sections: &[Section], item: Item) -> &Section {
        sections
            .iter()
            .find(|s| s.item == item)
            .unwrap_or_else(|| panic!("no {} section in {sections:?}", item.name()))
    }

    #[test]
    fn journal_arguments_carry_numbers_only() {
        assert_eq!(
            journal_args("fleet-agent.service", 200, Some(3600), false),
            [
                "--unit=fleet-agent.service",
                "--lines=200",
                "--since=-3600s",
                "--output=short-iso",
                "--no-pager"
            ]
        );
        assert_eq!(
            journal_args(WATCHDOG_UNIT, 20, None, true),
            [
                "--unit=fleet-boot-watchdog.service",
                "--lines=20",
                "--boot",
                "--output=short-iso",
                "--no-pager"
            ]
        );
    }

    #[test]
    fn only_the_updater_items_each_from_its_source_in_order() {
        let d = tempfile::tempdir().expect("tmp");
        // The scripted journalctl prints its arguments as the journal's lines.
        let s = sources(
            d.path(),
            "for a in \"$@\"; do echo \"$a\"; done",
            "echo 'mnt-hang.mount loaded failed failed /mnt/hang'",
        );
        let sections = s.collect(&request(200, Some(60)), status());
        let items: Vec<Item> = sections.iter().map(|s| s.item).collect();
        assert_eq!(
            items,
            [
                Item::AgentJournal,
                Item::UpdaterJournal,
                Item::FailedUnits,
                Item::BootDiagnostics,
                Item::UpdaterState
            ]
        );
        let agent = by_item(&sections, Item::AgentJournal);
        assert_eq!(
            agent.text,
            "--unit=fleet-agent.service\n--lines=200\n--since=-60s\n--output=short-iso\n--no-pager"
        );
        assert!(by_item(&sections, Item::UpdaterJournal)
            .text
            .starts_with("--unit=fleet-updater.service\n"));
        assert_eq!(
            by_item(&sections, Item::FailedUnits).text,
            "mnt-hang.mount loaded failed failed /mnt/hang"
        );
        // Asked for agent items only: nothing for the updater to collect.
        let agent_only = DiagnosticsRequest {
            items: vec![Item::Disk, Item::WorkloadLogs],
            ..request(10, None)
        };
        assert!(s.collect(&agent_only, status()).is_empty());
    }

    #[test]
    fn empty_and_failing_commands_say_so() {
        let d = tempfile::tempdir().expect("tmp");
        let s = sources(
            d.path(),
            "echo '-- No entries --'; echo 'No journal files were found.' >&2",
            "exit 0",
        );
        let sections = s.collect(
            &DiagnosticsRequest {
                items: vec![Item::AgentJournal, Item::FailedUnits],
                ..request(5, Some(60))
            },
            status(),
        );
        assert_eq!(
            by_item(&sections, Item::AgentJournal).text,
            "no journal entries for fleet-agent.service in the last 60 s (journalctl: No journal files were found.)"
        );
        assert_eq!(
            by_item(&sections, Item::FailedUnits).text,
            "none: no unit is failed"
        );

        let s = sources(d.path(), "echo 'Failed to add match' >&2; exit 1", "exit 0");
        let sections = s.collect(
            &DiagnosticsRequest {
                items: vec![Item::UpdaterJournal],
                ..request(5, None)
            },
            status(),
        );
        assert_eq!(
            sections[0].error.as_deref(),
            Some(
                "journalctl --unit=fleet-updater.service --lines=5 --output=short-iso --no-pager failed \
                 (exit status: 1): Failed to add match"
            )
        );
    }

    #[test]
    fn a_slow_command_is_killed_and_a_late_item_fails_alone() {
        let d = tempfile::tempdir().expect("tmp");
        let only = DiagnosticsRequest {
            items: vec![Item::UpdaterJournal, Item::FailedUnits],
            ..request(5, None)
        };
        // Past its command bound: killed, and the section says so.
        let s = sources(d.path(), "echo line", "sleep 8")
            .with_bounds(Duration::from_secs(1), Duration::from_secs(20));
        let sections = s.collect(&only, status());
        let e = by_item(&sections, Item::FailedUnits)
            .error
            .as_deref()
            .expect("timed out");
        assert!(e.contains("did not finish within 1s and was killed"), "{e}");
        // Past the request's deadline (the command's bound being longer): answered as failed, the others not
        // held back.
        let s = sources(d.path(), "echo line", "sleep 8")
            .with_bounds(Duration::from_secs(6), Duration::from_secs(3));
        let sections = s.collect(&only, status());
        assert_eq!(by_item(&sections, Item::UpdaterJournal).text, "line");
        assert_eq!(
            by_item(&sections, Item::FailedUnits).error.as_deref(),
            Some("not collected within the request's 3 s deadline; the other items are answered")
        );
    }

    #[test]
    fn sections_are_bounded_and_printable() {
        let d = tempfile::tempdir().expect("tmp");
        // 3,000 lines of 100 bytes with an escape sequence in each: the newest lines, within 32 KiB.
        let s = sources(
            d.path(),
            "i=0; while [ $i -lt 3000 ]; do printf '\\033[31m%094d\\n' $i; i=$((i+1)); done",
            "exit 0",
        );
        let only = |lines| DiagnosticsRequest {
            items: vec![Item::AgentJournal],
            ..request(lines, None)
        };
        let few = s.collect(&only(3), status());
        assert_eq!(few[0].text.lines().count(), 3);
        assert!(few[0].cut && few[0].text.ends_with(&format!("{:094}", 2999)));
        assert!(!few[0].text.contains('\u{1b}') && few[0].text.starts_with('\u{fffd}'));
        let many = s.collect(&only(2000), status());
        assert!(many[0].cut && many[0].text.len() <= MAX_SECTION_BYTES);
        assert!(many[0].text.ends_with(&format!("{:094}", 2999)));
    }

    #[test]
    fn the_worst_answer_fits_one_frame() {
        // Every section at its bound in the character that JSON escapes most after `printable`: a quote.
        let worst = printable(&"\"\u{1}".repeat(MAX_SECTION_BYTES));
        let sections: Vec<Section> = Item::ALL
            .into_iter()
            .filter(|i| i.collector() == Collector::Updater)
            .map(|i| Section::new(i, None, &worst, 2_000))
            .collect();
        let frame = serde_json::to_vec(&fleet_wire::ResponseFrame {
            protocol: fleet_wire::socket::PROTOCOL_VERSION,
            response: Response::Diagnostics { sections },
        })
        .expect("json");
        assert!(frame.len() <= SOCKET_FRAME_MAX_BYTES / 2, "{}", frame.len());
    }

    #[test]
    fn boot_diagnostics_show_the_newest_snapshots_the_record_and_the_verdict() {
        let d = tempfile::tempdir().expect("tmp");
        let root = d.path();
        let s = sources(root, "echo \"$1 $5\"", "exit 0");
        let boot_lines = |s: &Sources, lines| {
            by_item(
                &s.collect(
                    &DiagnosticsRequest {
                        items: vec![Item::BootDiagnostics],
                        ..request(lines, None)
                    },
                    status(),
                ),
                Item::BootDiagnostics,
            )
            .text
            .clone()
        };
        let boot = |s: &Sources| boot_lines(s, 2_000);
        let w = WatchdogPaths::new(root);
        assert_eq!(
            boot(&s),
            format!(
                "== fleet-reboot diagnostics (written before each coordinated reboot): none ({root}/var/log/fleet-reboot does not exist)\n\
                 == boot watchdog diagnostics (written when a boot did not finish): none ({root}/var/log/fleet-boot-watchdog does not exist)\n\
                 == boot watchdog reboots: none recorded\n\
                 == reboot cap: not reached in this boot (no {root}/run/motd.d/fleet-boot-watchdog)\n\
                 == this boot's watchdog verdict (journalctl --unit=fleet-boot-watchdog.service --boot):\n\
                 --unit=fleet-boot-watchdog.service --no-pager",
                root = root.display()
            )
        );
        std::fs::create_dir_all(w.diagnostics_dir()).expect("mkdir");
        std::fs::write(
            w.diagnostics_dir().join("boot-1800000000000.log"),
            "old snapshot\n",
        )
        .expect("write");
        let big = format!(
            "fleet-boot-watchdog diagnostics at …\nreason: not up: is-system-running says starting\n{}",
            "x\n".repeat(FILE_HEAD_BYTES)
        );
        std::fs::write(w.diagnostics_dir().join("boot-1800000060000.log"), &big).expect("write");
        std::fs::write(w.diagnostics_dir().join("notes.txt"), "not a snapshot").expect("write");
        let mut h = history::History::default();
        h.record(Timestamp::from_unix_ms(1_800_000_000_000));
        history::save(&w.history(), &h).expect("history");
        std::fs::create_dir_all(w.motd().parent().expect("dir")).expect("mkdir");
        std::fs::write(
            w.motd(),
            "fleet-boot-watchdog: this host did not finish booting\n",
        )
        .expect("motd");
        let text = boot(&s);
        assert!(text.contains(&format!(
            "== boot watchdog diagnostics (written when a boot did not finish): the newest of 2 in {}: boot-1800000060000.log, written 2027-01-15T08:01:00.000Z\n\
             fleet-boot-watchdog diagnostics at …\nreason: not up: is-system-running says starting\nx\n",
            w.diagnostics_dir().display()
        )), "{text}");
        assert!(!text.contains("old snapshot"), "{text}");
        let (_, more) = head(&big, 2_000 / 3, FILE_HEAD_BYTES);
        assert!(
            text.contains(&format!("(… {more} more bytes in ")),
            "{text}"
        );
        assert!(text.contains(&format!(
            "== boot watchdog reboots ({}): 1: 2027-01-15T08:00:00.000Z\n\
             == the reboot cap holds in this boot (login message {}):\nfleet-boot-watchdog: this host did not finish booting\n",
            w.history().display(),
            w.motd().display()
        )), "{text}");
        assert!(text.len() <= MAX_SECTION_BYTES);
        // Few lines asked: the snapshot's head and the verdict still fit, its thousands of lines do not.
        let few = boot_lines(&s, 30);
        assert!(few.lines().count() <= 30, "{few}");
        assert!(
            few.contains("reason: not up: is-system-running says starting\nx\n"),
            "{few}"
        );
        assert!(
            few.ends_with("--unit=fleet-boot-watchdog.service --no-pager"),
            "{few}"
        );
    }

    #[test]
    fn the_state_reads_as_fields_then_transitions() {
        let text = render_state(&status());
        assert!(text.starts_with(
            "fleet-updater 9.9.9, boot unknown, recovering: no\ncapabilities: AgentUpgradeV1\nagent upgrade:\n"
        ), "{text}");
        for line in [
            "  phase: failed\n",
            "  reason: start-failed\n",
            "  error: fleet-agent.service did not become ready within 4min\n",
            "  transitions (oldest first):\n    2026-11-30T01:00:00.000Z preparing\n",
            " rolling-back (start-failed)\n",
        ] {
            assert!(text.contains(line), "{line:?} in {text}");
        }
        assert!(text.ends_with("system upgrade: none journaled\n"), "{text}");
    }

    #[test]
    fn head_cuts_at_a_line_within_the_bound() {
        assert_eq!(head("ab\ncd\nef", 10, 7), ("ab\ncd\n", 2));
        assert_eq!(head("ab\ncd\nef", 1, 100), ("ab\n", 5));
        assert_eq!(head("ab\ncd\nef", 3, 100), ("ab\ncd\nef", 0));
        assert_eq!(head("abc", 5, 3), ("abc", 0));
        assert_eq!(head("ééé", 5, 3), ("é", 4));
    }
}
