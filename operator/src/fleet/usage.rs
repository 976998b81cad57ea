//! A device's usage (`device-usage`) as its Device shows it (`status.usage`) and as a staged rollout reads it (the
//! free-space floor), as pure functions. The agent publishes when usage changed enough, at most every 15 s; the
//! shown values move in steps ([`shown`]) so that a few bytes or a busy second never rewrite a status, and only a
//! change of what is shown wakes the control loop ([`wakes`]): 100,000 devices cost writes only as they fill up.

use crate::crd::{FilesystemStatus, UsageStatus};
use crate::fleet::rollout::LowSpace;
use fleet_wire::usage::{
    DeviceUsage, FilesystemRole, FilesystemUsage, DISK_ALERT_PERCENT, FREE_SPACE_FLOOR_BYTES,
};

/// A shown percentage is rewritten when the measured one moves by at least this many points from it.
pub const PERCENT_STEP: f64 = 1.0;
/// The same for memory, which moves all the time.
pub const MEMORY_PERCENT_STEP: f64 = 5.0;
/// A shown size is rewritten when the measured one differs from it by at least this share (10 %).
pub const SIZE_STEP: f64 = 0.1;
/// A shown load is rewritten when the measured one moves by half of it or by 1.0, whichever is more (centi).
pub const LOAD_STEP_CENTI: u32 = 100;

/// The role's wire name (`root`, `agentState`, `containers`, `unknown`).
pub fn role_word(role: FilesystemRole) -> &'static str {
    match role {
        FilesystemRole::Root => "root",
        FilesystemRole::AgentState => "agentState",
        FilesystemRole::Containers => "containers",
        FilesystemRole::Unknown => "unknown",
    }
}

const UNITS: [(&str, u64); 4] = [
    ("TiB", 1 << 40),
    ("GiB", 1 << 30),
    ("MiB", 1 << 20),
    ("KiB", 1 << 10),
];

/// `bytes` in its unit to two significant digits, rounded down: the unit, and the value in tenths of it.
fn in_unit(bytes: u64) -> Option<(&'static str, u64, u64)> {
    let (unit, per) = UNITS.iter().find(|(_, per)| bytes >= *per)?;
    let tenths = bytes / (per / 10).max(1);
    let tenths = if tenths < 100 {
        tenths
    } else {
        let mut whole = tenths / 10;
        let mut scale = 1;
        while whole >= 100 {
            whole /= 10;
            scale *= 10;
        }
        whole * scale * 10
    };
    Some((unit, *per, tenths))
}

/// `bytes` cut to what [`size`] shows of it (two significant digits in its unit, rounded down), so that a status
/// keeps a number that reads back as the same words.
pub fn two_digits(bytes: u64) -> u64 {
    match in_unit(bytes) {
        Some((_, per, tenths)) => (u128::from(tenths) * u128::from(per) / 10) as u64,
        None => bytes,
    }
}

/// `bytes` for a person, two significant digits rounded down: `40 MiB`, `1.2 GiB`, `120 GiB`.
pub fn size(bytes: u64) -> String {
    match in_unit(bytes) {
        Some((unit, _, t)) if t < 100 => format!("{}.{} {unit}", t / 10, t % 10),
        Some((unit, _, t)) => format!("{} {unit}", t / 10),
        None => format!("{bytes} B"),
    }
}

/// Measured used percent, unrounded.
fn used_exact(f: &FilesystemUsage) -> f64 {
    if f.size_bytes == 0 {
        return 0.0;
    }
    f.size_bytes.saturating_sub(f.available_bytes) as f64 * 100.0 / f.size_bytes as f64
}

/// `current` when `exact` is within `step` of it, else `fresh`.
fn stepped<T: Copy>(
    current: Option<T>,
    exact: f64,
    step: f64,
    as_f64: fn(T) -> f64,
    fresh: T,
) -> T {
    match current {
        Some(c) if (exact - as_f64(c)).abs() < step => c,
        _ => fresh,
    }
}

fn memory_available_exact(u: &DeviceUsage) -> f64 {
    let m = u.memory();
    m.available_bytes as f64 * 100.0 / m.total_bytes.max(1) as f64
}

/// The fresh status of `u`, nothing kept.
fn fresh(u: &DeviceUsage) -> UsageStatus {
    let mut filesystems: Vec<FilesystemStatus> = u
        .filesystems()
        .iter()
        .map(|f| FilesystemStatus {
            role: role_word(f.role).to_owned(),
            used_percent: u32::from(f.used_percent()),
            available_bytes: two_digits(f.available_bytes),
            size_bytes: two_digits(f.size_bytes),
        })
        .collect();
    filesystems.sort_by_key(|f| rank(&f.role));
    let m = u.memory();
    finish(UsageStatus {
        filesystems,
        memory_available_percent: memory_available_exact(u).floor() as u32,
        memory_pressure_percent: m.pressure_some_avg10_centi.map(|p| p / 100),
        memory_pressure: m.under_pressure(),
        load1m: load_word(u.load_1m_centi()),
        cpus: u.cpus(),
        disk_full: u.disk_alerts().next().is_some(),
        ..Default::default()
    })
}

fn load_word(centi: u32) -> String {
    format!("{}.{:02}", centi / 100, centi % 100)
}

fn load_centi(word: &str) -> Option<u32> {
    let (whole, frac) = word.split_once('.')?;
    Some(whole.parse::<u32>().ok()? * 100 + frac.parse::<u32>().ok()?)
}

/// The order a person reads filesystems in (and the tie-break of the fullest: the role a change writes to).
fn rank(role: &str) -> u8 {
    match role {
        "root" => 1,
        "agentState" => 2,
        "containers" => 3,
        _ => 4,
    }
}

/// Fills the summary fields (`disk`, `diskUsedPercent`, `diskRole`, `memory`) from the others. `disk` names every
/// filesystem (root, agentState, containers), those at or above the alert threshold with their free space: the
/// fullest alone would hide a full containers filesystem behind a root just as full, or fuller.
fn finish(mut s: UsageStatus) -> UsageStatus {
    let alert = u32::from(DISK_ALERT_PERCENT);
    let words: Vec<String> = s
        .filesystems
        .iter()
        .map(|f| {
            if f.used_percent >= alert {
                format!(
                    "{} {}% ({} free)",
                    f.role,
                    f.used_percent,
                    size(f.available_bytes)
                )
            } else {
                format!("{} {}%", f.role, f.used_percent)
            }
        })
        .collect();
    // Not empty: a 1.20 API server takes "" for null.
    s.disk = if words.is_empty() {
        "no filesystem measured".into()
    } else {
        words.join(", ")
    };
    // The fullest; on a tie the role a change writes to (containers, then agentState).
    match s
        .filesystems
        .iter()
        .max_by_key(|f| (f.used_percent, rank(&f.role)))
    {
        Some(f) => {
            s.disk_used_percent = f.used_percent;
            s.disk_role = f.role.clone();
        }
        None => {
            s.disk_used_percent = 0;
            s.disk_role = "none".into();
        }
    }
    s.memory = match s.memory_pressure_percent.filter(|p| *p > 0) {
        Some(p) => format!("{}% available, pressure {p}%", s.memory_available_percent),
        None => format!("{}% available", s.memory_available_percent),
    };
    s
}

/// What a Device shows for the report `u`, given what it shows now (`current`): each value kept while the
/// measurement stays within its step of it ([`PERCENT_STEP`], [`MEMORY_PERCENT_STEP`], [`SIZE_STEP`],
/// [`LOAD_STEP_CENTI`]); everything fresh when the verdicts (`diskFull`, `memoryPressure`) or the set of
/// filesystems changed, so that what is shown always agrees with them.
pub fn shown(current: Option<&UsageStatus>, u: &DeviceUsage) -> UsageStatus {
    let next = fresh(u);
    let Some(cur) = current else {
        return next;
    };
    let roles = |s: &UsageStatus| {
        s.filesystems
            .iter()
            .map(|f| f.role.clone())
            .collect::<Vec<_>>()
    };
    if cur.disk_full != next.disk_full
        || cur.memory_pressure != next.memory_pressure
        || cur.cpus != next.cpus
        || roles(cur) != roles(&next)
    {
        return next;
    }
    // A filesystem is shown afresh when its percent or its free space moved by a step (near full, 10 % of the
    // free space is less than a point: the free space then moves the finer steps).
    let mut out = next.clone();
    for (o, c) in out.filesystems.iter_mut().zip(&cur.filesystems) {
        let Some(f) = u.filesystems().iter().find(|f| role_word(f.role) == o.role) else {
            continue;
        };
        let percent_kept = (used_exact(f) - f64::from(c.used_percent)).abs() < PERCENT_STEP;
        let free_kept = (f.available_bytes as f64 - c.available_bytes as f64).abs()
            < c.available_bytes as f64 * SIZE_STEP;
        if percent_kept && free_kept && two_digits(f.size_bytes) == c.size_bytes {
            *o = c.clone();
        }
    }
    out.memory_available_percent = stepped(
        Some(cur.memory_available_percent),
        memory_available_exact(u),
        MEMORY_PERCENT_STEP,
        f64::from,
        next.memory_available_percent,
    );
    out.memory_pressure_percent = match (
        cur.memory_pressure_percent,
        u.memory().pressure_some_avg10_centi,
    ) {
        (Some(c), Some(p)) => Some(stepped(
            Some(c),
            f64::from(p) / 100.0,
            MEMORY_PERCENT_STEP,
            f64::from,
            p / 100,
        )),
        (_, p) => p.map(|p| p / 100),
    };
    if let Some(c) = load_centi(&cur.load1m) {
        let step = (c / 2).max(LOAD_STEP_CENTI);
        if u.load_1m_centi().abs_diff(c) < step {
            out.load1m = cur.load1m.clone();
        }
    }
    finish(out)
}

/// The filesystem that keeps `u`'s device from a staged rollout's change: the one with the least available below
/// [`FREE_SPACE_FLOOR_BYTES`] among the roles a change writes to (fleet-wire's `DeviceUsage::below_floor`).
pub fn low_space(u: Option<&DeviceUsage>) -> Option<LowSpace> {
    let f = u?.below_floor()?;
    Some(LowSpace {
        role: role_word(f.role),
        available_bytes: f.available_bytes,
        floor_bytes: FREE_SPACE_FLOOR_BYTES,
    })
}

/// Whether a new report `new` (after `old`) can change what a Device shows or a rollout decides: the shown
/// status moves ([`shown`] from `old`'s), or the free-space floor's verdict changes. Other reports are recorded
/// quietly.
pub fn wakes(old: Option<&DeviceUsage>, new: Option<&DeviceUsage>) -> bool {
    match (old, new) {
        (Some(o), Some(n)) => {
            let before = shown(None, o);
            shown(Some(&before), n) != before || low_space(Some(o)) != low_space(Some(n))
        }
        (None, None) => false,
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_wire::usage::MemoryUsage;
    use fleet_wire::{DeviceId, Timestamp};

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    fn report(
        containers_available: u64,
        mem_available: u64,
        psi: Option<u32>,
        load: u32,
    ) -> DeviceUsage {
        DeviceUsage::new(
            DeviceId::try_from("dev-a").expect("id"),
            Timestamp::from_unix_ms(1),
            vec![
                FilesystemUsage {
                    role: FilesystemRole::Root,
                    size_bytes: 8 * GIB,
                    available_bytes: 6 * GIB,
                },
                FilesystemUsage {
                    role: FilesystemRole::Containers,
                    size_bytes: GIB,
                    available_bytes: containers_available,
                },
            ],
            MemoryUsage {
                total_bytes: 1000 * MIB,
                available_bytes: mem_available,
                pressure_some_avg10_centi: psi,
            },
            load,
            4,
        )
        .expect("valid")
    }

    #[test]
    fn sizes_read_to_two_digits() {
        for (bytes, want) in [
            (0, "0 B"),
            (1023, "1023 B"),
            (40 * MIB, "40 MiB"),
            (40 * MIB + MIB / 2, "40 MiB"),
            (120 * MIB + 900 * 1024, "120 MiB"),
            (256 * MIB, "250 MiB"),
            (600 * MIB, "600 MiB"),
            (GIB + 300 * MIB, "1.2 GiB"),
            (9 * MIB + 999 * 1024, "9.9 MiB"),
            (153 * GIB, "150 GiB"),
        ] {
            assert_eq!(size(bytes), want, "{bytes}");
        }
        assert_eq!(two_digits(99), 99);
        for bytes in [5 * MIB + 12345, 123 * GIB + 7, 999 * MIB] {
            assert_eq!(size(two_digits(bytes)), size(bytes), "{bytes}");
        }
    }

    #[test]
    fn a_full_disk_shows_in_the_summary_and_its_verdict() {
        // containers 96 % used (41 MiB of 1 GiB free)
        let s = shown(None, &report(41 * MIB, 400 * MIB, Some(250), 42));
        assert_eq!(s.disk, "root 25%, containers 96% (41 MiB free)");
        assert_eq!(
            (s.disk_used_percent, s.disk_role.as_str(), s.disk_full),
            (96, "containers", true)
        );
        assert_eq!(s.memory, "40% available, pressure 2%");
        assert!(!s.memory_pressure);
        assert_eq!((s.load1m.as_str(), s.cpus), ("0.42", 4));
        assert_eq!(
            s.filesystems
                .iter()
                .map(|f| (f.role.as_str(), f.used_percent))
                .collect::<Vec<_>>(),
            [("root", 25), ("containers", 96)]
        );
        // 3 % available: pressure, by what is left
        let s = shown(None, &report(GIB / 2, 30 * MIB, None, 0));
        assert_eq!(
            (s.memory.as_str(), s.memory_pressure, s.disk_full),
            ("3% available", true, false)
        );
    }

    /// Small moves write nothing; a step, a verdict or a new filesystem writes.
    #[test]
    fn what_is_shown_moves_in_steps() {
        let first = shown(None, &report(600 * MIB, 400 * MIB, Some(100), 50));
        // a few bytes, a busy second, memory 2 points: nothing changes
        let small = report(600 * MIB - 4096, 420 * MIB, Some(300), 120);
        assert_eq!(shown(Some(&first), &small), first);
        // containers used moves from 42 % to 46 %: that filesystem is shown afresh
        let filling = shown(Some(&first), &report(560 * MIB, 400 * MIB, Some(100), 50));
        assert_eq!(filling.disk, "root 25%, containers 46%");
        // nearly full: 40 MiB free, then 35 MiB (less than a point, more than 10 %) is written, 34 MiB is not
        let near = shown(None, &report(40 * MIB, 400 * MIB, Some(100), 50));
        let less = shown(Some(&near), &report(35 * MIB, 400 * MIB, Some(100), 50));
        assert_eq!(less.disk, "root 25%, containers 97% (35 MiB free)");
        assert_eq!(
            shown(Some(&less), &report(34 * MIB, 400 * MIB, Some(100), 50)),
            less
        );
        // memory from 40 % to 46 %: a write
        let m = shown(Some(&first), &report(600 * MIB, 460 * MIB, Some(100), 50));
        assert_eq!(m.memory_available_percent, 46);
        // load 0.50 to 1.60 (more than 1.0): a write
        let l = shown(Some(&first), &report(600 * MIB, 400 * MIB, Some(100), 160));
        assert_eq!(l.load1m, "1.60");
        // pressure crosses 10 %: everything fresh
        let p = shown(
            Some(&first),
            &report(600 * MIB - 4096, 420 * MIB, Some(1000), 120),
        );
        assert!(p.memory_pressure);
        assert_eq!(
            (p.memory_available_percent, p.load1m.as_str()),
            (42, "1.20")
        );
    }

    #[test]
    fn the_floor_names_the_fullest_role_a_change_writes_to() {
        assert_eq!(low_space(None), None);
        assert_eq!(
            low_space(Some(&report(300 * MIB, 400 * MIB, None, 0))),
            None
        );
        assert_eq!(
            low_space(Some(&report(120 * MIB, 400 * MIB, None, 0))),
            Some(LowSpace {
                role: "containers",
                available_bytes: 120 * MIB,
                floor_bytes: FREE_SPACE_FLOOR_BYTES
            })
        );
    }

    #[test]
    fn only_reports_that_change_something_wake_the_loop() {
        let a = report(600 * MIB, 400 * MIB, Some(100), 50);
        assert!(wakes(None, Some(&a)));
        assert!(wakes(Some(&a), None));
        assert!(!wakes(
            Some(&a),
            Some(&report(600 * MIB - 4096, 410 * MIB, Some(200), 60))
        ));
        assert!(wakes(
            Some(&a),
            Some(&report(100 * MIB, 400 * MIB, Some(100), 50))
        ));
        // just past the floor, inside the size step: still wakes (the rollout's verdict changes)
        let at = report(FREE_SPACE_FLOOR_BYTES, 400 * MIB, None, 0);
        assert!(wakes(
            Some(&at),
            Some(&report(FREE_SPACE_FLOOR_BYTES - 1, 400 * MIB, None, 0))
        ));
    }
}
