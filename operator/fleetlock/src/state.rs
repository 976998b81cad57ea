//! Pure lock logic: taking and giving back slots in one or several groups, and expiring holders past a TTL.
//! No I/O: the stores call these functions on the state they loaded and then make the result durable.

use fleet_wire::fleetlock::Holder;
use fleet_wire::Timestamp;
use std::collections::BTreeMap;
use std::time::Duration;

/// A change to the holders of one or more groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Take one slot in every listed group (name, slots), all or nothing.
    Lock {
        /// The groups and their slot counts.
        groups: Vec<(String, u32)>,
        /// The new holder (id, hostname, IP, time).
        holder: Holder,
    },
    /// Give back the slots `id` holds in the listed groups.
    Unlock {
        /// The groups.
        groups: Vec<String>,
        /// The holder's id.
        id: String,
    },
}

/// What an [`Op`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpResult {
    /// The client holds a slot in every group (newly or already).
    Locked,
    /// A group had no free slot; nothing changed.
    Full {
        /// The first full group.
        group: String,
        /// Its holders.
        held: usize,
        /// Its slots.
        slots: u32,
    },
    /// The client holds no slot in the listed groups any more.
    Unlocked {
        /// How many slots were actually freed.
        removed: usize,
    },
}

/// Removes holders older than `ttl` (none when `ttl` is `None`) and returns them.
pub fn expire(holders: &mut Vec<Holder>, ttl: Option<Duration>, now: Timestamp) -> Vec<Holder> {
    let Some(ttl) = ttl else {
        return Vec::new();
    };
    let (gone, kept): (Vec<Holder>, Vec<Holder>) = std::mem::take(holders)
        .into_iter()
        .partition(|h| now.since(h.taken_at) >= ttl);
    *holders = kept;
    gone
}

/// Applies `op` to the holders of every group; all or nothing for a lock. Returns the result and whether the
/// state changed (a store only writes when it did).
pub fn apply(state: &mut BTreeMap<String, Vec<Holder>>, op: &Op) -> (OpResult, bool) {
    match op {
        Op::Lock { groups, holder } => {
            for (name, slots) in groups {
                let holders = state.get(name).map(Vec::as_slice).unwrap_or_default();
                let held = holders.iter().any(|h| h.id == holder.id);
                if !held && holders.len() >= *slots as usize {
                    return (
                        OpResult::Full {
                            group: name.clone(),
                            held: holders.len(),
                            slots: *slots,
                        },
                        false,
                    );
                }
            }
            let mut changed = false;
            for (name, _) in groups {
                let holders = state.entry(name.clone()).or_default();
                if !holders.iter().any(|h| h.id == holder.id) {
                    holders.push(holder.clone());
                    changed = true;
                }
            }
            (OpResult::Locked, changed)
        }
        Op::Unlock { groups, id } => {
            let mut removed = 0;
            for name in groups {
                if let Some(holders) = state.get_mut(name) {
                    let before = holders.len();
                    holders.retain(|h| &h.id != id);
                    removed += before - holders.len();
                    if holders.is_empty() {
                        state.remove(name);
                    }
                }
            }
            (OpResult::Unlocked { removed }, removed > 0)
        }
    }
}

/// [`apply`], plus the log line of the change it made (`grant: …` or `release: …`; `None` when nothing changed).
/// Stores log the line once the change is durable, in commit order, so the log never shows a grant before the
/// release it followed.
pub fn apply_logged(
    state: &mut BTreeMap<String, Vec<Holder>>,
    op: &Op,
) -> (OpResult, bool, Option<String>) {
    let released_from: Vec<&str> = match op {
        Op::Unlock { groups, id } => groups
            .iter()
            .filter(|g| {
                state
                    .get(*g)
                    .is_some_and(|hs| hs.iter().any(|h| &h.id == id))
            })
            .map(String::as_str)
            .collect(),
        Op::Lock { .. } => Vec::new(),
    };
    let released_from = released_from.join(", ");
    let (result, changed) = apply(state, op);
    let line = match (op, &result, changed) {
        (Op::Lock { groups, holder }, OpResult::Locked, true) => {
            let names: Vec<&str> = groups.iter().map(|(n, _)| n.as_str()).collect();
            Some(format!(
                "grant: {} ({}) holds a slot in {}",
                holder.id,
                holder.ip,
                names.join(", ")
            ))
        }
        (Op::Unlock { id, .. }, OpResult::Unlocked { .. }, true) => Some(format!(
            "release: {id} gave back its slot in {released_from}"
        )),
        _ => None,
    };
    (result, changed, line)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(id: &str, at: u64) -> Holder {
        Holder {
            id: id.into(),
            hostname: None,
            ip: "127.0.0.1".into(),
            taken_at: Timestamp::from_unix_ms(at),
        }
    }
    fn lock(groups: &[(&str, u32)], id: &str) -> Op {
        Op::Lock {
            groups: groups.iter().map(|(g, s)| (g.to_string(), *s)).collect(),
            holder: h(id, 0),
        }
    }
    fn unlock(groups: &[&str], id: &str) -> Op {
        Op::Unlock {
            groups: groups.iter().map(|g| g.to_string()).collect(),
            id: id.into(),
        }
    }

    /// The table of transitions: (op, expected result, expected change).
    #[test]
    fn transition_table() {
        let mut s = BTreeMap::new();
        let full = |g: &str, held, slots| OpResult::Full {
            group: g.into(),
            held,
            slots,
        };
        let table: Vec<(Op, OpResult, bool)> = vec![
            (lock(&[("a", 1)], "x"), OpResult::Locked, true),
            (lock(&[("a", 1)], "x"), OpResult::Locked, false), // holder asks again
            (lock(&[("a", 1)], "y"), full("a", 1, 1), false),
            (lock(&[("b", 1), ("a", 2)], "y"), OpResult::Locked, true),
            (lock(&[("b", 1)], "z"), full("b", 1, 1), false),
            // all or nothing: c is free but b is full, so z gets neither
            (lock(&[("c", 1), ("b", 1)], "z"), full("b", 1, 1), false),
            (
                unlock(&["c"], "z"),
                OpResult::Unlocked { removed: 0 },
                false,
            ), // non-holder
            (
                unlock(&["a", "b"], "y"),
                OpResult::Unlocked { removed: 2 },
                true,
            ),
            (lock(&[("c", 1), ("b", 1)], "z"), OpResult::Locked, true),
            (lock(&[("a", 0)], "w"), full("a", 1, 0), false),
        ];
        for (i, (op, want, changed)) in table.into_iter().enumerate() {
            assert_eq!(apply(&mut s, &op), (want, changed), "row {i}: {op:?}");
        }
        assert_eq!(s["a"].len(), 1);
        assert_eq!(s["c"][0].id, "z");
    }

    #[test]
    fn changes_are_described_once() {
        let mut s = BTreeMap::new();
        let table: Vec<(Op, Option<&str>)> = vec![
            (
                lock(&[("a", 1), ("b", 2)], "x"),
                Some("grant: x (127.0.0.1) holds a slot in a, b"),
            ),
            (lock(&[("a", 1)], "x"), None), // asks again: nothing changed
            (lock(&[("a", 1)], "y"), None), // full
            (
                unlock(&["a", "b", "c"], "x"),
                Some("release: x gave back its slot in a, b"),
            ),
            (unlock(&["a"], "x"), None),
        ];
        for (i, (op, want)) in table.into_iter().enumerate() {
            let (result, changed, line) = apply_logged(&mut s, &op);
            assert_eq!(line.as_deref(), want, "row {i}");
            assert_eq!(changed, want.is_some(), "row {i}: {result:?}");
        }
    }

    #[test]
    fn ttl_expires_only_old_holders() {
        let mut hs = vec![h("old", 0), h("new", 9_000)];
        let now = Timestamp::from_unix_ms(10_000);
        assert!(expire(&mut hs, None, now).is_empty());
        let gone = expire(&mut hs, Some(Duration::from_secs(5)), now);
        assert_eq!(gone.len(), 1);
        assert_eq!(gone[0].id, "old");
        assert_eq!(hs.len(), 1);
    }
}
