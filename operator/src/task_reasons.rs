//! The TaskRun controller's per-device reasons ([`crate::tasks::blocking`]), handed to the one Device writer.
//!
//! **Why a hand-over, not a second writer.** A Device's status is written whole by the deployments controller's
//! writer (`deployments/device_writes.rs`: a JSON-patch replace of `/status`, latest wins, decided from the cache
//! plus what it wrote). A second controller patching `status.blocking` would race it: a replace decided from a
//! cache that predates the patch removes it again, and the next patch puts it back. So the TaskRun controller
//! only *publishes* here, after each pass, every running run's reasons by device; the deployments controller's pass
//! reads them ([`TaskReasons::snapshot`]) and lists them after the rollouts' own in the device's one
//! `status.blocking` (each change its own entry, at most [`crate::blocking::MAX_BLOCKING`] with `blockingMore`
//! counting the rest), and writes the Device only when its list changes. A publication that changes something
//! wakes that pass ([`TaskReasons::changed`]), paced like any change a device makes.
//!
//! Not judged is not nothing: until the TaskRun controller has published once (an operator that starts), and for a
//! running run it has not judged yet (its view still reading NATS, or NATS unreachable), the entries a Device already
//! shows for those runs stay as they are ([`Kept`]), so that a restart does not write every Device twice.
//!
//! Bounded: per device at most [`MAX_BLOCKING`](crate::blocking::MAX_BLOCKING) entries kept and how many more;
//! only devices of running runs' frozen plans (each at most `MAX_PLAN_TARGETS`) have any.

use crate::blocking::{Blocking, MAX_BLOCKING};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

/// One device's task reasons: at most [`MAX_BLOCKING`] and how many more.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Listed {
    /// The first reasons, in the order the runs were planned.
    pub shown: Vec<Blocking>,
    /// How many more.
    pub more: u32,
}

/// Every device's task reasons, by Device name.
pub type ByDevice = BTreeMap<String, Listed>;

/// Which TaskRun entries a Device already shows stay as they are, not judged yet.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Kept {
    /// Every one: nothing published yet.
    #[default]
    All,
    /// Those of these changes (`TaskRun/<namespace>/<name>`): running runs not judged yet.
    Changes(BTreeSet<String>),
}

/// What the TaskRun controller published last.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Published {
    /// Its reasons by device.
    pub devices: ByDevice,
    /// The entries it did not judge.
    pub kept: Kept,
}

impl Published {
    /// A device's task entries: those published for it, then those it shows (`shown`: its `status.blocking`) of
    /// the changes not judged yet.
    pub fn of(&self, device: &str, shown: &[Blocking]) -> Option<Listed> {
        let mut l = self.devices.get(device).cloned().unwrap_or_default();
        let kept = shown.iter().filter(|b| {
            b.change.starts_with(TASK_RUN_PREFIX)
                && match &self.kept {
                    Kept::All => true,
                    Kept::Changes(c) => c.contains(&b.change),
                }
        });
        for b in kept {
            match l.shown.len() < MAX_BLOCKING {
                true => l.shown.push(b.clone()),
                false => l.more += 1,
            }
        }
        (l != Listed::default()).then_some(l)
    }
}

/// How every TaskRun entry's `change` starts.
pub const TASK_RUN_PREFIX: &str = "TaskRun/";

/// The hand-over between the TaskRun controller (writes) and the Device writer's pass (reads).
#[derive(Default)]
pub struct TaskReasons {
    current: Mutex<Arc<Published>>,
    /// Notified when a publication changed something.
    pub changed: Notify,
}

impl TaskReasons {
    /// Replaces every device's reasons with `reasons` (device name, reason; a device's in order) and the running
    /// runs not judged with `unjudged` (their change names); wakes the Device writer's pass when that changes
    /// anything. Returns whether it did.
    pub fn publish(
        &self,
        reasons: impl IntoIterator<Item = (String, Blocking)>,
        unjudged: BTreeSet<String>,
    ) -> bool {
        let mut next = ByDevice::new();
        for (device, b) in reasons {
            let l = next.entry(device).or_default();
            match l.shown.len() < MAX_BLOCKING {
                true => l.shown.push(b),
                false => l.more += 1,
            }
        }
        let next = Published {
            devices: next,
            kept: Kept::Changes(unjudged),
        };
        let mut cur = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if **cur == next {
            return false;
        }
        *cur = Arc::new(next);
        drop(cur);
        self.changed.notify_one();
        true
    }

    /// The reasons as last published.
    pub fn snapshot(&self) -> Arc<Published> {
        self.current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// A device's whole list: the rollouts' reasons, then the task runs', at most [`MAX_BLOCKING`] with how many more.
pub fn merged(rollouts: &[Blocking], tasks: Option<&Listed>) -> (Vec<Blocking>, Option<u32>) {
    let tasks_more = tasks.map_or(0, |t| t.more);
    let all: Vec<&Blocking> = rollouts
        .iter()
        .chain(tasks.into_iter().flat_map(|t| t.shown.iter()))
        .collect();
    let more = all.len().saturating_sub(MAX_BLOCKING) as u32 + tasks_more;
    (
        all.into_iter().take(MAX_BLOCKING).cloned().collect(),
        (more > 0).then_some(more),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blocking::BlockingKind;

    fn b(change: &str) -> Blocking {
        Blocking {
            kind: BlockingKind::WaitingForCanaries,
            change: change.into(),
            message: format!("{change} waits"),
            since: None,
            until: None,
        }
    }

    #[test]
    fn published_reasons_are_bounded_and_wake_only_on_change() {
        let r = TaskReasons::default();
        let many: Vec<(String, Blocking)> = (0..MAX_BLOCKING + 3)
            .map(|i| ("d1".to_owned(), b(&format!("TaskRun/ns/r{i}"))))
            .collect();
        assert_eq!(r.snapshot().kept, Kept::All, "nothing published yet");
        assert!(r.publish(many.clone(), BTreeSet::new()));
        let snap = r.snapshot();
        assert_eq!(snap.devices["d1"].shown.len(), MAX_BLOCKING);
        assert_eq!(snap.devices["d1"].more, 3);
        assert!(
            !r.publish(many, BTreeSet::new()),
            "the same reasons again change nothing"
        );
        assert!(r.publish(vec![], BTreeSet::new()));
        assert!(r.snapshot().devices.is_empty());
        assert!(r.publish(vec![], ["TaskRun/ns/r0".to_owned()].into()));
    }

    /// Entries of runs not judged yet stay as the Device shows them; the rollouts' entries are never kept here.
    #[test]
    fn entries_not_judged_yet_stay_as_shown() {
        let shown = [
            b("FleetDeployment/web"),
            b("TaskRun/ns/judged"),
            b("TaskRun/ns/loading"),
        ];
        let names = |l: Option<Listed>| -> Vec<String> {
            l.map(|l| l.shown.into_iter().map(|b| b.change).collect())
                .unwrap_or_default()
        };
        let start = Published::default();
        assert_eq!(
            names(start.of("d1", &shown)),
            ["TaskRun/ns/judged", "TaskRun/ns/loading"]
        );
        let mut devices = ByDevice::new();
        devices.insert(
            "d1".into(),
            Listed {
                shown: vec![b("TaskRun/ns/new")],
                more: 0,
            },
        );
        let later = Published {
            devices,
            kept: Kept::Changes(["TaskRun/ns/loading".to_owned()].into()),
        };
        assert_eq!(
            names(later.of("d1", &shown)),
            ["TaskRun/ns/new", "TaskRun/ns/loading"]
        );
        assert_eq!(later.of("d2", &[]), None);
    }

    #[test]
    fn rollouts_first_then_tasks_bounded_with_the_rest_counted() {
        let rollouts: Vec<Blocking> = (0..10)
            .map(|i| b(&format!("FleetDeployment/d{i}")))
            .collect();
        let tasks = Listed {
            shown: (0..MAX_BLOCKING)
                .map(|i| b(&format!("TaskRun/ns/r{i}")))
                .collect(),
            more: 2,
        };
        let (shown, more) = merged(&rollouts, Some(&tasks));
        assert_eq!(shown.len(), MAX_BLOCKING);
        assert_eq!(shown[0].change, "FleetDeployment/d0");
        assert_eq!(shown[10].change, "TaskRun/ns/r0");
        // 10 + 16 shown-able, 16 listed, 10 cut, plus the 2 the tasks had cut already.
        assert_eq!(more, Some(12));
        assert_eq!(merged(&[], None), (vec![], None));
        assert_eq!(merged(&rollouts[..1], None), (rollouts[..1].to_vec(), None));
    }
}
