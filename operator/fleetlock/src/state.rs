//! Pure lock logic: taking and giving back slots in one or several groups, and expiring holders past a TTL.
//! No I/O: the stores call these functions on the state they loaded and then make the result durable; each call
//! also says what it changed ([`Change`]), which the stores log and record in the history once durable.

use fleet_wire::fleetlock::{Holder, LockEvent, LockEventKind};
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
        /// Who asks: the history tells a holder's own release from an administrator's.
        by: Releaser,
    },
}

/// Who gives a slot back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Releaser {
    /// The holder itself (`steady-state`, or the store giving back what a refused grant took).
    Holder,
    /// An administrator (`/v1/admin/release`).
    Admin,
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

/// One change to one group's holders, not yet durable (a [`LockEvent`] without its time).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// What happened.
    pub kind: LockEventKind,
    /// The group.
    pub group: String,
    /// The holder as granted (for a release or expiry: as it was stored, so `taken_at` is the grant's).
    pub holder: Holder,
}

impl Change {
    /// The event of this change, made durable at `at`.
    pub fn at(self, at: Timestamp) -> LockEvent {
        LockEvent {
            at,
            kind: self.kind,
            group: self.group,
            holder: self.holder,
        }
    }
}

/// What [`apply`] did: the answer, the changes in order and the log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The answer to the client.
    pub result: OpResult,
    /// One per group per holder taken or given back, in the op's group order (empty: nothing changed).
    pub changes: Vec<Change>,
    /// `grant: …` or `release: …` (`None` when nothing changed). Stores log it once the change is durable, in
    /// commit order, so the log never shows a grant before the release it followed.
    pub line: Option<String>,
}

impl Outcome {
    /// Whether the state changed (a store only writes when it did).
    pub fn changed(&self) -> bool {
        !self.changes.is_empty()
    }
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

/// [`expire`] over every group of `state` (groups left empty are dropped): one `Expired` change per holder removed.
pub fn expire_all(
    state: &mut BTreeMap<String, Vec<Holder>>,
    ttl: Option<Duration>,
    now: Timestamp,
) -> Vec<Change> {
    if ttl.is_none() {
        return Vec::new();
    }
    let mut gone = Vec::new();
    for (group, holders) in state.iter_mut() {
        gone.extend(expire(holders, ttl, now).into_iter().map(|holder| Change {
            kind: LockEventKind::Expired,
            group: group.clone(),
            holder,
        }));
    }
    state.retain(|_, v| !v.is_empty());
    gone
}

/// Applies `op` to the holders of every group; all or nothing for a lock.
pub fn apply(state: &mut BTreeMap<String, Vec<Holder>>, op: &Op) -> Outcome {
    match op {
        Op::Lock { groups, holder } => {
            for (name, slots) in groups {
                let holders = state.get(name).map(Vec::as_slice).unwrap_or_default();
                let held = holders.iter().any(|h| h.id == holder.id);
                if !held && holders.len() >= *slots as usize {
                    return Outcome {
                        result: OpResult::Full {
                            group: name.clone(),
                            held: holders.len(),
                            slots: *slots,
                        },
                        changes: Vec::new(),
                        line: None,
                    };
                }
            }
            let mut changes = Vec::new();
            for (name, _) in groups {
                let holders = state.entry(name.clone()).or_default();
                if !holders.iter().any(|h| h.id == holder.id) {
                    holders.push(holder.clone());
                    changes.push(Change {
                        kind: LockEventKind::Granted,
                        group: name.clone(),
                        holder: holder.clone(),
                    });
                }
            }
            // The line names every group of the request, also those the holder already held.
            let line = (!changes.is_empty()).then(|| {
                let names: Vec<&str> = groups.iter().map(|(n, _)| n.as_str()).collect();
                format!(
                    "grant: {} ({}) holds a slot in {}",
                    holder.id,
                    holder.ip,
                    names.join(", ")
                )
            });
            Outcome {
                result: OpResult::Locked,
                changes,
                line,
            }
        }
        Op::Unlock { groups, id, by } => {
            let kind = match by {
                Releaser::Holder => LockEventKind::Released,
                Releaser::Admin => LockEventKind::AdminReleased,
            };
            let mut changes = Vec::new();
            let mut released_from: Vec<&str> = Vec::new();
            for name in groups {
                let Some(holders) = state.get_mut(name) else {
                    continue;
                };
                let (gone, kept): (Vec<Holder>, Vec<Holder>) = std::mem::take(holders)
                    .into_iter()
                    .partition(|h| &h.id == id);
                *holders = kept;
                if holders.is_empty() {
                    state.remove(name);
                }
                if !gone.is_empty() {
                    released_from.push(name);
                }
                changes.extend(gone.into_iter().map(|holder| Change {
                    kind,
                    group: name.clone(),
                    holder,
                }));
            }
            let line = (!changes.is_empty()).then(|| {
                format!(
                    "release: {id} gave back its slot in {}",
                    released_from.join(", ")
                )
            });
            Outcome {
                result: OpResult::Unlocked {
                    removed: changes.len(),
                },
                changes,
                line,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use LockEventKind::{AdminReleased, Expired, Granted, Released};

    fn h(id: &str, at: u64) -> Holder {
        Holder {
            id: id.into(),
            hostname: None,
            ip: "127.0.0.1".into(),
            taken_at: Timestamp::from_unix_ms(at),
        }
    }
    fn lock_at(groups: &[(&str, u32)], id: &str, at: u64) -> Op {
        Op::Lock {
            groups: groups.iter().map(|(g, s)| (g.to_string(), *s)).collect(),
            holder: h(id, at),
        }
    }
    fn lock(groups: &[(&str, u32)], id: &str) -> Op {
        lock_at(groups, id, 0)
    }
    fn unlock_by(groups: &[&str], id: &str, by: Releaser) -> Op {
        Op::Unlock {
            groups: groups.iter().map(|g| g.to_string()).collect(),
            id: id.into(),
            by,
        }
    }
    fn unlock(groups: &[&str], id: &str) -> Op {
        unlock_by(groups, id, Releaser::Holder)
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
            (
                unlock_by(&["c"], "z", Releaser::Admin),
                OpResult::Unlocked { removed: 1 },
                true,
            ),
        ];
        for (i, (op, want, changed)) in table.into_iter().enumerate() {
            let o = apply(&mut s, &op);
            let changed_now = o.changed();
            assert_eq!((o.result, changed_now), (want, changed), "row {i}: {op:?}");
        }
        assert_eq!(s["a"].len(), 1);
        assert_eq!(s["b"][0].id, "z");
        assert!(!s.contains_key("c"));
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
            (
                lock(&[("a", 1)], "y"),
                Some("grant: y (127.0.0.1) holds a slot in a"),
            ),
            // an admin release logs the same line (http.rs adds its own `admin release by …`)
            (
                unlock_by(&["a"], "y", Releaser::Admin),
                Some("release: y gave back its slot in a"),
            ),
        ];
        for (i, (op, want)) in table.into_iter().enumerate() {
            let o = apply(&mut s, &op);
            assert_eq!(o.line.as_deref(), want, "row {i}");
            assert_eq!(o.changed(), want.is_some(), "row {i}: {o:?}");
        }
    }

    /// The table of changes each op reports: (op, [(kind, group, holder id, holder taken_at)]).
    #[test]
    fn changes_table() {
        let mut s = BTreeMap::new();
        type Row = (Op, Vec<(LockEventKind, &'static str, &'static str, u64)>);
        let table: Vec<Row> = vec![
            // one Granted per group newly taken, in the request's order
            (
                lock_at(&[("b", 2), ("a", 1)], "x", 10),
                vec![(Granted, "b", "x", 10), (Granted, "a", "x", 10)],
            ),
            // x asks again (later): nothing new, and the stored taken_at stays
            (lock_at(&[("a", 1)], "x", 20), vec![]),
            // only the group x did not hold yet
            (
                lock_at(&[("a", 1), ("c", 1)], "x", 30),
                vec![(Granted, "c", "x", 30)],
            ),
            (lock_at(&[("a", 1)], "y", 40), vec![]), // full
            (lock_at(&[("b", 2)], "y", 50), vec![(Granted, "b", "y", 50)]),
            // a release names each group the id held, with the holder as stored (taken_at of its grant)
            (
                unlock(&["a", "b", "nowhere", "c"], "x"),
                vec![
                    (Released, "a", "x", 10),
                    (Released, "b", "x", 10),
                    (Released, "c", "x", 30),
                ],
            ),
            (unlock(&["a"], "x"), vec![]), // holds nothing any more
            (unlock_by(&["a"], "y", Releaser::Admin), vec![]), // y holds no slot in a
            (
                unlock_by(&["b"], "y", Releaser::Admin),
                vec![(AdminReleased, "b", "y", 50)],
            ),
        ];
        for (i, (op, want)) in table.into_iter().enumerate() {
            let got: Vec<_> = apply(&mut s, &op)
                .changes
                .into_iter()
                .map(|c| (c.kind, c.group, c.holder.id, c.holder.taken_at.unix_ms()))
                .collect();
            let want: Vec<_> = want
                .into_iter()
                .map(|(k, g, id, at)| (k, g.to_string(), id.to_string(), at))
                .collect();
            assert_eq!(got, want, "row {i}: {op:?}");
        }
        assert!(s.is_empty(), "{s:?}");
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

    #[test]
    fn expiries_are_changes_and_empty_groups_go() {
        let mut s = BTreeMap::from([
            ("a".to_string(), vec![h("old", 0), h("new", 9_000)]),
            ("b".to_string(), vec![h("old", 0)]),
        ]);
        let now = Timestamp::from_unix_ms(10_000);
        assert!(expire_all(&mut s, None, now).is_empty());
        let gone = expire_all(&mut s, Some(Duration::from_secs(5)), now);
        assert_eq!(
            gone,
            [
                Change {
                    kind: Expired,
                    group: "a".into(),
                    holder: h("old", 0)
                },
                Change {
                    kind: Expired,
                    group: "b".into(),
                    holder: h("old", 0)
                },
            ]
        );
        assert_eq!(s.keys().collect::<Vec<_>>(), ["a"]);
        let e = gone[0].clone().at(now);
        assert_eq!(
            (e.at, e.kind, e.holder.taken_at),
            (now, Expired, h("old", 0).taken_at)
        );
    }
}
