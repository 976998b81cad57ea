//! Which containers the kernel's OOM killer ended. Podman's `State.OOMKilled` is one source, but Debian 12's
//! Podman 4.3 with its conmon never sets it (measured rootful on cgroup v1 and rootless on cgroup v2: conmon
//! writes its `oom` marker into its working directory, where Podman does not look). So the agent also judges from
//! the kernel: a container that ended by SIGKILL (exit 137, or a restart) while the kernel's count of OOM kills
//! (`oom_kill` of /proc/vmstat, every OOM kill: a cgroup's limit or the whole device) rose since it was last seen
//! running was OOM-killed. Containers carry `oom_score_adj` 500, so on a device out of memory they are the
//! killer's first choice too. A kill that coincides with another process's OOM kill is misread as one; an exit
//! before the agent's first look is not judged.

use crate::podman::Observed;
use std::collections::BTreeMap;

/// The kernel's counter of OOM kills since boot.
pub const VMSTAT: &str = "/proc/vmstat";
/// The exit code of a process ended by SIGKILL (128 + 9): what an OOM kill leaves.
pub const SIGKILL_EXIT: i32 = 137;

/// What was known of a container at the previous look.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Last {
    /// The kernel's OOM kill count then.
    kills: Option<u64>,
    restarts: u32,
    /// It was exited by SIGKILL then (that exit is judged already).
    killed: bool,
    /// Judged OOM-killed: stays so while the container exists (Podman may clear its own flag on a restart, as it
    /// does the exit code); a replaced spec is a new container.
    oom: bool,
}

/// The agent's memory of OOM kills, one entry per observed container (bounded by them).
#[derive(Debug, Default)]
pub struct OomWatch {
    last: BTreeMap<String, Last>,
    /// The count at the previous look: the baseline of a container not seen before.
    kills: Option<u64>,
}

impl OomWatch {
    /// Marks `oom_killed` on each observed container the OOM killer ended, given the kernel's count now (`None`
    /// when it cannot be read: only Podman's word counts then). Pure.
    pub fn observe(&mut self, kills: Option<u64>, observed: &mut [Observed]) {
        let mut next = BTreeMap::new();
        for o in observed.iter_mut() {
            let last = self.last.get(&o.id).copied();
            let killed = o.state != "running" && o.exit_code == SIGKILL_EXIT;
            let new_end = (killed && !last.is_some_and(|l| l.killed))
                || last.is_some_and(|l| o.restarts > l.restarts);
            let base = last.map_or(self.kills, |l| l.kills);
            let rose = matches!((base, kills), (Some(b), Some(k)) if k > b);
            o.oom_killed |= (new_end && rose) || last.is_some_and(|l| l.oom);
            next.insert(
                o.id.clone(),
                Last {
                    // A container still running (or not ended anew) keeps its baseline moving with the count;
                    // one that ended keeps the count it was judged at.
                    kills: kills.or(base),
                    restarts: o.restarts,
                    killed,
                    oom: o.oom_killed,
                },
            );
        }
        self.last = next;
        self.kills = kills.or(self.kills);
    }
}

/// The kernel's OOM kill count from /proc/vmstat text (`oom_kill N`).
pub fn parse_vmstat(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|n| n.trim().parse().ok())
}

/// The kernel's OOM kill count now; `None` when /proc/vmstat cannot be read or lacks it (kernel before 4.13).
pub fn read_kills() -> Option<u64> {
    parse_vmstat(&std::fs::read_to_string(VMSTAT).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap as Map;

    fn c(id: &str, state: &str, exit_code: i32, restarts: u32) -> Observed {
        Observed {
            id: id.into(),
            name: format!("fleet-{id}"),
            labels: Map::new(),
            state: state.into(),
            started_at: 1,
            restarts,
            exit_code,
            exited: state != "running",
            created: 1,
            restarts_unknown: false,
            health: None,
            oom_killed: false,
        }
    }

    fn look(w: &mut OomWatch, kills: Option<u64>, mut now: Vec<Observed>) -> Vec<bool> {
        w.observe(kills, &mut now);
        now.iter().map(|o| o.oom_killed).collect()
    }

    #[test]
    fn a_sigkill_while_the_kernel_counted_an_oom_kill_is_one() {
        let mut w = OomWatch::default();
        assert_eq!(
            look(&mut w, Some(5), vec![c("a", "running", 0, 0)]),
            [false]
        );
        // Killed, and the kernel counted a kill since: OOM. It stays so at the next look.
        assert_eq!(
            look(&mut w, Some(6), vec![c("a", "exited", 137, 0)]),
            [true]
        );
        assert_eq!(
            look(&mut w, Some(6), vec![c("a", "exited", 137, 0)]),
            [true]
        );
        // Killed without an OOM kill counted (a person's kill -9), or exited otherwise: not OOM.
        let mut w = OomWatch::default();
        look(
            &mut w,
            Some(5),
            vec![c("b", "running", 0, 0), c("d", "running", 0, 0)],
        );
        assert_eq!(
            look(
                &mut w,
                Some(5),
                vec![c("b", "exited", 137, 0), c("d", "exited", 1, 0)]
            ),
            [false, false]
        );
        // The count rising later does not make an old kill an OOM kill.
        assert_eq!(
            look(&mut w, Some(9), vec![c("b", "exited", 137, 0)]),
            [false]
        );
    }

    #[test]
    fn a_restart_after_an_oom_kill_keeps_it_reported() {
        let mut w = OomWatch::default();
        look(&mut w, Some(0), vec![c("a", "running", 0, 0)]);
        // Podman restarted it (always): the exit is not visible, the restart and the count are.
        assert_eq!(look(&mut w, Some(1), vec![c("a", "running", 0, 1)]), [true]);
        assert_eq!(look(&mut w, Some(1), vec![c("a", "running", 0, 1)]), [true]);
        // Podman's own word counts too; a container gone is forgotten.
        let mut told = c("e", "exited", 137, 0);
        told.oom_killed = true;
        assert_eq!(look(&mut w, None, vec![told]), [true]);
        assert_eq!(w.last.len(), 1);
    }

    #[test]
    fn a_container_first_seen_killed_is_judged_from_the_previous_look() {
        let mut w = OomWatch::default();
        // The first look: no baseline, nothing judged.
        assert_eq!(
            look(&mut w, Some(3), vec![c("a", "exited", 137, 0)]),
            [false]
        );
        // Created and killed between two looks.
        assert_eq!(
            look(
                &mut w,
                Some(4),
                vec![c("a", "exited", 137, 0), c("f", "exited", 137, 0)]
            ),
            [false, true]
        );
        // No count to read: nothing judged from the kernel.
        let mut w = OomWatch::default();
        look(&mut w, None, vec![c("g", "running", 0, 0)]);
        assert_eq!(look(&mut w, None, vec![c("g", "exited", 137, 0)]), [false]);
    }

    #[test]
    fn vmstat_is_read() {
        assert_eq!(parse_vmstat("pgfault 10\noom_kill 7\nfoo 1\n"), Some(7));
        assert_eq!(parse_vmstat("pgfault 10\n"), None);
    }
}
