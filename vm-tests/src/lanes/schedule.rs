//! The order and grouping of the test binaries: `scripts/test-lanes.txt` lists each binary's measured seconds and,
//! for binaries that must not overlap, a group. A job is one binary, or every binary of a group run one after
//! another in one lane; jobs start longest first (a long binary started last would leave the other lanes idle).
//! The group `alone` is special: each of its binaries runs with nothing else running.

use std::collections::BTreeMap;

/// The group whose binaries run with no other binary at the same time.
pub const ALONE: &str = "alone";

/// The estimate for a binary the plan does not list yet: treated as long, so that it starts early.
pub const UNKNOWN_SECS: f64 = 120.0;

/// One line of the plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// Measured seconds of its last full run.
    pub secs: f64,
    /// Its group, if it must not overlap others of the group.
    pub group: Option<String>,
}

/// Parses the plan: `<seconds> <binary> [<group>]` per line, `#` comments.
pub fn parse_plan(text: &str) -> Result<BTreeMap<String, Entry>, String> {
    let mut out = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or_default().trim();
        if line.is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        let bad = || {
            format!(
                "line {}: want `<seconds> <binary> [<group>]`, got {line:?}",
                n + 1
            )
        };
        if f.len() < 2 || f.len() > 3 {
            return Err(bad());
        }
        let secs: f64 = f[0].parse().map_err(|_| bad())?;
        out.insert(
            f[1].to_string(),
            Entry {
                secs,
                group: f.get(2).map(|g| g.to_string()),
            },
        );
    }
    Ok(out)
}

/// Something a lane runs: binaries (indices into the list given to [`jobs`]) one after another.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    /// The binary's name, or `group <name>`.
    pub label: String,
    /// The binaries, in the order they run.
    pub members: Vec<usize>,
    /// The estimated seconds of all of them.
    pub secs: f64,
    /// Runs with no other job running.
    pub alone: bool,
}

/// The jobs for `names` under `plan`, in the order they start: `alone` jobs first (nothing else runs then), then
/// the others longest first. Names the plan does not list are estimated at [`UNKNOWN_SECS`].
pub fn jobs(names: &[String], plan: &BTreeMap<String, Entry>) -> Vec<Job> {
    let est = |i: usize| plan.get(&names[i]).map(|e| e.secs).unwrap_or(UNKNOWN_SECS);
    let mut groups: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    let mut out = vec![];
    for (i, name) in names.iter().enumerate() {
        match plan.get(name).and_then(|e| e.group.clone()) {
            Some(g) if g == ALONE => out.push(Job {
                label: name.clone(),
                members: vec![i],
                secs: est(i),
                alone: true,
            }),
            Some(g) => groups.entry(g).or_default().push(i),
            None => out.push(Job {
                label: name.clone(),
                members: vec![i],
                secs: est(i),
                alone: false,
            }),
        }
    }
    for (g, mut members) in groups {
        members.sort_by(|a, b| est(*b).total_cmp(&est(*a)));
        out.push(Job {
            label: format!("group {g}"),
            secs: members.iter().map(|i| est(*i)).sum(),
            members,
            alone: false,
        });
    }
    out.sort_by(|a, b| b.alone.cmp(&a.alone).then(b.secs.total_cmp(&a.secs)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_reads_seconds_names_and_groups() {
        let p = parse_plan("# comment\n 12.5 a/test/x  guests # why\n3 b/lib/y\n\n").unwrap();
        assert_eq!(
            p["a/test/x"],
            Entry {
                secs: 12.5,
                group: Some("guests".into())
            }
        );
        assert_eq!(
            p["b/lib/y"],
            Entry {
                secs: 3.0,
                group: None
            }
        );
        assert!(parse_plan("x a/test/x").is_err());
        assert!(parse_plan("1 a b c").is_err());
    }

    #[test]
    fn alone_first_then_longest_first_with_groups_as_one_serial_job_and_unknown_binaries_early() {
        let plan =
            parse_plan("10 short\n500 long\n90 g1 nspawn\n80 g2 nspawn\n60 solo alone\n").unwrap();
        let names: Vec<String> = ["short", "g2", "new", "long", "solo", "g1"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let j = jobs(&names, &plan);
        let labels: Vec<&str> = j.iter().map(|j| j.label.as_str()).collect();
        assert_eq!(labels, ["solo", "long", "group nspawn", "new", "short"]);
        assert!(j[0].alone && !j[1].alone);
        // the group's longest member first, its estimate the sum
        assert_eq!(j[2].members, vec![5, 1]);
        assert_eq!(j[2].secs, 170.0);
        assert_eq!(j[3].secs, UNKNOWN_SECS);
    }
}
