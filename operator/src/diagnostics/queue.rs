//! Which requests may be written now (pure; the table test below is the specification). A device's agent reads
//! only the newest key of `diagnostics-request/<device>.>`, so two requests open at once for one device would lose
//! the older one: a device has at most one open request (written, not finished). And the `diagnostics-bundle`
//! bucket holds [`fleet_wire::diagnostics::max_open_requests`] bundles of the largest size: at most that many are
//! open across the fleet. The others wait, in creation order, and are written as soon as they may.

use std::collections::HashMap;

/// An unfinished request that would be written (a valid spec, its Device exists), in creation order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate<'a> {
    /// The object's name (named in the message of a request that waits for it).
    pub name: &'a str,
    /// Its device.
    pub device: &'a str,
    /// Its request key is known to exist (written by this replica, or found: listed after a new NATS link, or
    /// `create` answered that it exists).
    pub open: bool,
}

/// Why a request is not written yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Queued {
    /// Request `earlier` of the same device is open (or written before it in this pass).
    Device {
        /// Its name.
        earlier: String,
    },
    /// `open` requests are open across the fleet, at most `max`.
    Fleet {
        /// Open now (with those written before it in this pass).
        open: usize,
        /// [`fleet_wire::diagnostics::max_open_requests`].
        max: usize,
    },
}

/// What to do with one candidate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Already open: nothing to write.
    Open,
    /// Write its request key now.
    Write,
    /// It waits (why).
    Queued(Queued),
}

/// One decision per candidate (same order). Open requests count whatever their order (an existing key is open even
/// when more are open than `max_open`, e.g. after `--fleet-size` shrank); the others are written in order while
/// their device has none open and fewer than `max_open` are open across the fleet.
pub fn decide(candidates: &[Candidate], max_open: usize) -> Vec<Decision> {
    let mut holder: HashMap<&str, &str> = HashMap::new();
    let mut open = 0;
    for c in candidates.iter().filter(|c| c.open) {
        holder.entry(c.device).or_insert(c.name);
        open += 1;
    }
    candidates
        .iter()
        .map(|c| {
            if c.open {
                Decision::Open
            } else if let Some(earlier) = holder.get(c.device) {
                Decision::Queued(Queued::Device {
                    earlier: (*earlier).to_owned(),
                })
            } else if open >= max_open {
                Decision::Queued(Queued::Fleet {
                    open,
                    max: max_open,
                })
            } else {
                holder.insert(c.device, c.name);
                open += 1;
                Decision::Write
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use Decision::*;

    fn dev(earlier: &str) -> Decision {
        Queued(super::Queued::Device {
            earlier: earlier.into(),
        })
    }

    fn fleet(open: usize, max: usize) -> Decision {
        Queued(super::Queued::Fleet { open, max })
    }

    /// (candidates as (name, device, open), max open, decisions)
    type Row<'a> = (Vec<(&'a str, &'a str, bool)>, usize, Vec<Decision>);

    #[test]
    fn queue_table() {
        // (candidates as (name, device, open), max open, decisions)
        let rows: Vec<Row> = vec![
            // Nothing open: the first of each device is written.
            (
                vec![("a", "d1", false), ("b", "d2", false)],
                10,
                vec![Write, Write],
            ),
            // Two for one device: the older is written, the newer waits for it.
            (
                vec![("a", "d1", false), ("b", "d1", false)],
                10,
                vec![Write, dev("a")],
            ),
            // The device's open request holds it, even when it comes later in the order (found after a restart).
            (
                vec![("a", "d1", false), ("b", "d1", true)],
                10,
                vec![dev("b"), Open],
            ),
            // Three for one device: both later ones name the open one.
            (
                vec![("a", "d1", true), ("b", "d1", false), ("c", "d1", false)],
                10,
                vec![Open, dev("a"), dev("a")],
            ),
            // The fleet cap: two may be open; the third device's request waits for the fleet.
            (
                vec![("a", "d1", false), ("b", "d2", false), ("c", "d3", false)],
                2,
                vec![Write, Write, fleet(2, 2)],
            ),
            // An open request later in the order counts before any is written (the count is right after a
            // restart: keys listed as open), so the older one of another device waits.
            (
                vec![("a", "d1", false), ("b", "d2", true)],
                1,
                vec![fleet(1, 1), Open],
            ),
            // More open than the cap (the cap shrank): all stay open, nothing more is written.
            (
                vec![("a", "d1", true), ("b", "d2", true), ("c", "d3", false)],
                1,
                vec![Open, Open, fleet(2, 1)],
            ),
            // A request waiting for its device does not take a fleet slot; the next device's does.
            (
                vec![
                    ("a", "d1", true),
                    ("b", "d1", false),
                    ("c", "d2", false),
                    ("d", "d3", false),
                ],
                2,
                vec![Open, dev("a"), Write, fleet(2, 2)],
            ),
            // The device's wait is told before the fleet's.
            (
                vec![("a", "d1", true), ("b", "d1", false)],
                1,
                vec![Open, dev("a")],
            ),
            // A cap of 0 writes nothing (max_open_requests is at least 1; the decision holds anyway).
            (vec![("a", "d1", false)], 0, vec![fleet(0, 0)]),
        ];
        for (i, (cands, max, want)) in rows.into_iter().enumerate() {
            let cands: Vec<Candidate> = cands
                .into_iter()
                .map(|(name, device, open)| Candidate { name, device, open })
                .collect();
            assert_eq!(decide(&cands, max), want, "row {i}");
        }
    }
}
