//! What the device has left (`device-usage/<device>`, [`fleet_wire::usage`]): each filesystem the agent and
//! Podman write (`statvfs` of `/`, of the agent's state directory and of Podman's storage), memory
//! (`/proc/meminfo`, `/proc/pressure/memory`) and load (`/proc/loadavg`); and when a measurement is worth
//! publishing ([`Publisher`]). Measured on the heartbeat's tick, never on a timer of its own: a few small reads
//! and three `statvfs` calls.

use fleet_wire::usage::{FilesystemRole, FilesystemUsage, MemoryUsage, PUBLISH_MIN_INTERVAL};
use fleet_wire::{DeviceId, DeviceUsage, Timestamp};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Largest `/proc` file read here, bytes (`/proc/meminfo` is about 1.5 KB).
const PROC_MAX_BYTES: u64 = 16 * 1024;

/// The paths measured, one per role; a role whose path is not known (Podman's storage before Podman said where
/// it is, or with Podman off) is left out.
#[derive(Debug, Clone)]
pub struct Sources {
    /// `/` (the configured root prefix: `/` on a device).
    pub root: PathBuf,
    /// The agent's state directory.
    pub agent_state: PathBuf,
    /// Podman's storage (`store.graphRoot` of its `info`).
    pub containers: Option<PathBuf>,
    /// Where `meminfo`, `pressure/memory` and `loadavg` are (`/proc`).
    pub proc: PathBuf,
}

/// One measurement, and what could not be measured (the event loop logs each role's failure once).
pub struct Measured {
    /// The usage, when memory could be read (it is not optional in the report).
    pub usage: Result<DeviceUsage, String>,
    /// Roles whose `statvfs` failed, with why.
    pub failed: Vec<(FilesystemRole, String)>,
}

/// `statvfs` of `path`: (size, available to unprivileged users), bytes. The field types differ between 32- and
/// 64-bit targets, hence the casts.
#[allow(clippy::unnecessary_cast)]
pub fn statvfs(path: &Path) -> Result<(u64, u64), String> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| format!("{}: a NUL in the path", path.display()))?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c` is a NUL-terminated path and `st` is room for one `statvfs`, which the call fills on success.
    let r = unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) };
    if r != 0 {
        return Err(format!(
            "statvfs {}: {}",
            path.display(),
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: the call succeeded, so it filled `st`.
    let st = unsafe { st.assume_init() };
    let frsize = (st.f_frsize as u64).max(1);
    Ok((
        (st.f_blocks as u64).saturating_mul(frsize),
        (st.f_bavail as u64).saturating_mul(frsize),
    ))
}

/// `MemTotal` and `MemAvailable` of `/proc/meminfo`, bytes.
pub fn parse_meminfo(text: &str) -> Option<(u64, u64)> {
    let kib = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().strip_suffix("kB"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(|v| v.saturating_mul(1024))
    };
    Some((kib("MemTotal:")?, kib("MemAvailable:")?))
}

/// `some avg10` of `/proc/pressure/memory` × 100 (`some avg10=1.23 …` → 123).
pub fn parse_pressure(text: &str) -> Option<u32> {
    let line = text.lines().find(|l| l.starts_with("some "))?;
    let v = line
        .split_whitespace()
        .find_map(|f| f.strip_prefix("avg10="))?;
    centi(v).map(|c| c.min(10_000))
}

/// The 1-minute load average of `/proc/loadavg` × 100.
pub fn parse_loadavg(text: &str) -> Option<u32> {
    centi(text.split_whitespace().next()?)
}

/// `12.34` → 1234 (two decimals at most are read; more are cut).
fn centi(v: &str) -> Option<u32> {
    let (int, frac) = v.split_once('.').unwrap_or((v, ""));
    let int: u32 = int.parse().ok()?;
    let frac: String = frac.chars().chain("00".chars()).take(2).collect();
    let frac: u32 = frac.parse().ok()?;
    int.checked_mul(100)?.checked_add(frac)
}

/// Online CPUs (`sysconf(_SC_NPROCESSORS_ONLN)`), at least 1.
fn cpus() -> u32 {
    // SAFETY: sysconf reads a value and has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    u32::try_from(n).unwrap_or(1).max(1)
}

/// Measures `sources` for `device`. A role whose `statvfs` failed is left out (and named in `failed`); no
/// memory reading is no report.
pub fn measure(device: &DeviceId, sources: &Sources) -> Measured {
    let mut filesystems = Vec::new();
    let mut failed = Vec::new();
    let roles = [
        (FilesystemRole::Root, Some(&sources.root)),
        (FilesystemRole::AgentState, Some(&sources.agent_state)),
        (FilesystemRole::Containers, sources.containers.as_ref()),
    ];
    for (role, path) in roles {
        let Some(path) = path else { continue };
        match statvfs(path) {
            Ok((size, available)) if size > 0 => filesystems.push(FilesystemUsage {
                role,
                size_bytes: size,
                available_bytes: available.min(size),
            }),
            Ok(_) => failed.push((role, format!("{}: a file system of size 0", path.display()))),
            Err(e) => failed.push((role, e)),
        }
    }
    let read = |name: &str| {
        fleet_wire::bounded::read_text(&sources.proc.join(name), PROC_MAX_BYTES)
            .map_err(|e| format!("{}: {e}", sources.proc.join(name).display()))
    };
    let usage = read("meminfo").and_then(|t| {
        let (total, available) = parse_meminfo(&t)
            .ok_or_else(|| "meminfo without MemTotal and MemAvailable".to_owned())?;
        let memory = MemoryUsage {
            total_bytes: total,
            available_bytes: available.min(total),
            pressure_some_avg10_centi: read("pressure/memory")
                .ok()
                .and_then(|t| parse_pressure(&t)),
        };
        let load = read("loadavg")
            .ok()
            .and_then(|t| parse_loadavg(&t))
            .unwrap_or(0);
        DeviceUsage::new(
            device.clone(),
            Timestamp::now(),
            filesystems,
            memory,
            load,
            cpus(),
        )
        .map_err(|e| e.to_string())
    });
    Measured { usage, failed }
}

/// Decides when a measurement is published: the first one, then one that changed enough since the last one
/// published — a filesystem's used percent moved a point or more (or crossed [`fleet_wire::usage::DISK_ALERT_PERCENT`] or the
/// free-space floor), memory pressure began or ended, available memory moved 5 points of the total, or the load
/// moved a band (a quarter of the CPUs) — and never sooner than [`PUBLISH_MIN_INTERVAL`] after the last attempt.
#[derive(Debug, Default)]
pub struct Publisher {
    last: Option<DeviceUsage>,
    attempted: Option<Instant>,
}

/// Load bands: a quarter of the CPUs each, capped (a load of 16 per CPU and more is one band).
fn load_band(u: &DeviceUsage) -> u32 {
    (u.load_1m_centi() / (u.cpus().max(1) * 25)).min(64)
}

fn memory_band(u: &DeviceUsage) -> u64 {
    let m = u.memory();
    m.available_bytes.saturating_mul(20) / m.total_bytes.max(1)
}

/// Whether `new` differs from `old` enough to publish.
pub fn changed_enough(old: &DeviceUsage, new: &DeviceUsage) -> bool {
    let roles = |u: &DeviceUsage| -> BTreeSet<FilesystemRole> {
        u.filesystems().iter().map(|f| f.role).collect()
    };
    if roles(old) != roles(new) {
        return true;
    }
    let disk = new.filesystems().iter().any(|f| {
        old.filesystem(f.role).is_none_or(|o| {
            o.used_percent().abs_diff(f.used_percent()) >= 1
                || o.alerting() != f.alerting()
                || o.below_floor() != f.below_floor()
        })
    });
    disk || old.memory().under_pressure() != new.memory().under_pressure()
        || memory_band(old) != memory_band(new)
        || load_band(old) != load_band(new)
}

impl Publisher {
    /// Whether to publish `new` at `now`.
    pub fn due(&self, new: &DeviceUsage, now: Instant) -> bool {
        if self
            .attempted
            .is_some_and(|t| now.saturating_duration_since(t) < PUBLISH_MIN_INTERVAL)
        {
            return false;
        }
        self.last
            .as_ref()
            .is_none_or(|old| changed_enough(old, new))
    }

    /// A publication of `u` was attempted at `now`; `ok` when NATS took it.
    pub fn attempted(&mut self, u: DeviceUsage, now: Instant, ok: bool) {
        self.attempted = Some(now);
        if ok {
            self.last = Some(u);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_wire::usage::DISK_ALERT_PERCENT;
    use std::time::Duration;

    const GIB: u64 = 1 << 30;

    fn usage(
        available: &[(FilesystemRole, u64)],
        mem_avail: u64,
        psi: u32,
        load: u32,
    ) -> DeviceUsage {
        DeviceUsage::new(
            DeviceId::try_from("dev-a").unwrap(),
            Timestamp::from_unix_ms(0),
            available
                .iter()
                .map(|&(role, a)| FilesystemUsage {
                    role,
                    size_bytes: 100 * GIB,
                    available_bytes: a,
                })
                .collect(),
            MemoryUsage {
                total_bytes: 100 * GIB,
                available_bytes: mem_avail,
                pressure_some_avg10_centi: Some(psi),
            },
            load,
            4,
        )
        .unwrap()
    }

    #[test]
    fn proc_files_parse() {
        let meminfo =
            "MemTotal:        4030236 kB\nMemFree:          123 kB\nMemAvailable:    2015118 kB\n";
        assert_eq!(
            parse_meminfo(meminfo),
            Some((4_030_236 * 1024, 2_015_118 * 1024))
        );
        assert_eq!(parse_meminfo("MemTotal: 1 kB\n"), None);
        let psi = "some avg10=12.34 avg60=0.00 avg300=0.00 total=1\nfull avg10=1.00 avg60=0.00 avg300=0.00 total=0\n";
        assert_eq!(parse_pressure(psi), Some(1234));
        assert_eq!(parse_pressure("full avg10=1.00\n"), None);
        assert_eq!(parse_loadavg("0.37 0.20 0.10 1/123 4567\n"), Some(37));
        assert_eq!(parse_loadavg("12.5 1 1 1/1 1\n"), Some(1250));
        assert_eq!(parse_loadavg("x\n"), None);
    }

    #[test]
    fn this_machine_measures() {
        let dir = tempfile::tempdir().unwrap();
        let sources = Sources {
            root: "/".into(),
            agent_state: dir.path().into(),
            containers: Some(dir.path().join("missing")),
            proc: "/proc".into(),
        };
        let m = measure(&DeviceId::try_from("dev-a").unwrap(), &sources);
        let u = m.usage.expect("this machine has /proc/meminfo");
        let roles: Vec<_> = u.filesystems().iter().map(|f| f.role).collect();
        assert_eq!(roles, [FilesystemRole::Root, FilesystemRole::AgentState]);
        assert_eq!(m.failed.len(), 1);
        assert_eq!(m.failed[0].0, FilesystemRole::Containers);
        assert!(m.failed[0].1.contains("missing"), "{}", m.failed[0].1);
        assert!(u.memory().total_bytes > 0 && u.cpus() >= 1);
    }

    #[test]
    fn what_is_worth_publishing() {
        use FilesystemRole::*;
        let half = 50 * GIB + GIB / 2;
        let fs = |root| [(Root, root), (Containers, half)];
        let base = usage(&fs(half), 52 * GIB, 0, 100);
        let same = |u: &DeviceUsage| !changed_enough(&base, u);
        // Less than a point of disk, a little memory, the load within its band: nothing to say.
        assert!(same(&usage(&fs(50 * GIB + GIB / 10), 51 * GIB, 50, 120)));
        // A point of disk.
        assert!(!same(&usage(&fs(49 * GIB), 52 * GIB, 0, 100)));
        // A role appears or goes.
        assert!(!same(&usage(&[(Root, half)], 52 * GIB, 0, 100)));
        // Memory pressure begins; available memory moves 5 points.
        assert!(!same(&usage(&fs(half), 52 * GIB, 1_000, 100)));
        assert!(!same(&usage(&fs(half), 44 * GIB, 0, 100)));
        // The load moves a band (a quarter of 4 CPUs).
        assert!(!same(&usage(&fs(half), 52 * GIB, 0, 200)));

        let t0 = Instant::now();
        let mut p = Publisher::default();
        assert!(p.due(&base, t0), "the first one");
        p.attempted(base.clone(), t0, true);
        let full = usage(&fs(4 * GIB), 52 * GIB, 0, 100);
        assert!(
            !p.due(&full, t0 + Duration::from_secs(14)),
            "not within 15 s"
        );
        assert!(p.due(&full, t0 + PUBLISH_MIN_INTERVAL));
        // A failed write is tried again, 15 s later.
        p.attempted(full.clone(), t0 + PUBLISH_MIN_INTERVAL, false);
        assert!(!p.due(&full, t0 + Duration::from_secs(20)));
        assert!(p.due(&full, t0 + 2 * PUBLISH_MIN_INTERVAL));
        p.attempted(full.clone(), t0 + 2 * PUBLISH_MIN_INTERVAL, true);
        assert!(!p.due(&full, t0 + Duration::from_secs(3600)), "unchanged");
        assert!(full.filesystem(Root).unwrap().used_percent() >= DISK_ALERT_PERCENT);
    }
}
