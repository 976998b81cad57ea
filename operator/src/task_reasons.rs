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
//! Bounded: per device at most [`MAX_BLOCKING`](crate::blocking::MAX_BLOCKING) entries kept and how many more;
//! only devices of running runs' frozen plans (each at most `MAX_PLAN_TARGETS`) have any.

use crate::blocking::{Blocking, MAX_BLOCKING};
use std::collections::BTreeMap;
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

/// The hand-over between the TaskRun controller (writes) and the Device writer's pass (reads).
#[derive(Default)]
pub struct TaskReasons {
    current: Mutex<Arc<ByDevice>>,
    /// Notified when a publication changed something.
    pub changed: Notify,
}

impl TaskReasons {
    /// Replaces every device's reasons with `reasons` (device name, reason; a device's in order); wakes the Device
    /// writer's pass when that changes anything. Returns whether it did.
    pub fn publish(&self, reasons: impl IntoIterator<Item = (String, Blocking)>) -> bool {
        let mut next = ByDevice::new();
        for (device, b) in reasons {
            let l = next.entry(device).or_default();
            match l.shown.len() < MAX_BLOCKING {
                true => l.shown.push(b),
                false => l.more += 1,
            }
        }
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
    pub fn snapshot(&self) -> Arc<ByDevice> {
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
        assert!(r.publish(many.clone()));
        let snap = r.snapshot();
        assert_eq!(snap["d1"].shown.len(), MAX_BLOCKING);
        assert_eq!(snap["d1"].more, 3);
        assert!(!r.publish(many), "the same reasons again change nothing");
        assert!(r.publish(vec![]));
        assert!(r.snapshot().is_empty());
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
