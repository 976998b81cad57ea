//! The fleet's agent versions over the last day: one sample a minute of the devices per version, kept in the
//! operator's memory (a restart starts the chart again), drawn on the overview as a stacked area of each version's
//! share, as inline SVG written with maud (labels escaped).

use super::fleet_counts::{top, OTHER};
use super::overview::{VERSION_COLOURS, VERSION_PARTS};
use fleet_wire::Timestamp;
use maud::{html, Markup};
use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

/// Least time between two samples.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(60);
/// Most samples kept: a day at one a minute.
pub const MAX_SAMPLES: usize = 1440;
/// Versions a sample keeps by name (the most devices first; as many as the overview's bar); the rest are summed
/// as [`OTHER`].
pub const VERSIONS_PER_SAMPLE: usize = VERSION_PARTS;
/// Width and height of the chart in SVG user units; it scales to its container.
const WIDTH: u64 = 1000;
const HEIGHT: u64 = 120;

/// Devices per agent version at one time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    /// When it was taken.
    pub at: Timestamp,
    /// Devices per version, at most [`VERSIONS_PER_SAMPLE`] versions and [`OTHER`].
    pub counts: Vec<(String, u64)>,
}

/// The samples of the last day, oldest first.
#[derive(Debug, Default)]
pub struct VersionHistory {
    samples: VecDeque<Sample>,
}

impl VersionHistory {
    /// Records `versions` at `at` when the last sample is at least [`SAMPLE_EVERY`] old (or there is none);
    /// returns whether it did. The oldest sample goes beyond [`MAX_SAMPLES`].
    pub fn record(&mut self, at: Timestamp, versions: &BTreeMap<String, u64>) -> bool {
        if !self.due(at) {
            return false;
        }
        if self.samples.len() == MAX_SAMPLES {
            self.samples.pop_front();
        }
        self.samples.push_back(Sample {
            at,
            counts: top(versions, VERSIONS_PER_SAMPLE),
        });
        true
    }

    /// Whether a sample taken at `at` would be kept: the caller counts the fleet only then (not on every alert
    /// evaluation, which can come once a second).
    pub fn due(&self, at: Timestamp) -> bool {
        self.samples
            .back()
            .is_none_or(|last| at.since(last.at) >= SAMPLE_EVERY)
    }

    /// The samples, oldest first.
    pub fn samples(&self) -> Vec<Sample> {
        self.samples.iter().cloned().collect()
    }
}

/// The series drawn: the versions with the most devices summed over `samples`, at most [`VERSIONS_PER_SAMPLE`],
/// then [`OTHER`] when anything is left over.
fn series(samples: &[Sample]) -> Vec<String> {
    let mut totals: BTreeMap<String, u64> = BTreeMap::new();
    for s in samples {
        for (v, n) in &s.counts {
            *totals.entry(v.clone()).or_insert(0) += n;
        }
    }
    totals.remove(OTHER);
    top(&totals, VERSIONS_PER_SAMPLE)
        .into_iter()
        .map(|(v, _)| v)
        .collect()
}

/// `sample`'s count of each of `names` (the last one, [`OTHER`], sums everything not named before it).
fn counts(sample: &Sample, names: &[String]) -> Vec<u64> {
    names
        .iter()
        .map(|name| {
            if name == OTHER {
                sample
                    .counts
                    .iter()
                    .filter(|(v, _)| !names[..names.len() - 1].contains(v))
                    .map(|(_, n)| n)
                    .sum()
            } else {
                sample
                    .counts
                    .iter()
                    .find(|(v, _)| v == name)
                    .map_or(0, |(_, n)| *n)
            }
        })
        .collect()
}

/// Series `k`'s colour: the overview bar's, [`OTHER`] grey.
fn colour(k: usize, name: &str) -> &'static str {
    if name == OTHER {
        "#bbb"
    } else {
        VERSION_COLOURS[k % VERSION_COLOURS.len()]
    }
}

/// "1 sample", "3 samples".
fn n_samples(n: usize) -> String {
    if n == 1 {
        "1 sample".into()
    } else {
        format!("{n} samples")
    }
}

/// The stacked-area chart of `samples` (oldest first): each version's share of the devices at each sample, the
/// version with the most devices at the bottom. Each series is a `g` with `data-version` and `data-last-count` (its
/// devices at the newest sample), so a test reads them back.
pub fn chart(samples: &[Sample]) -> Markup {
    let Some(last) = samples.last() else {
        return html! { p.muted { "No sample yet (one a minute, kept for a day in the operator's memory)." } };
    };
    let names = series(samples);
    let per_sample: Vec<Vec<u64>> = samples.iter().map(|s| counts(s, &names)).collect();
    let (lo, hi) = (samples[0].at.unix_ms(), last.at.unix_ms());
    let x = |t: Timestamp| -> u64 {
        if hi == lo {
            return WIDTH;
        }
        (u128::from(t.unix_ms() - lo) * u128::from(WIDTH) / u128::from(hi - lo)) as u64
    };
    // With one sample the area is a band across the whole width.
    let xs: Vec<u64> = if samples.len() == 1 {
        vec![0, WIDTH]
    } else {
        samples.iter().map(|s| x(s.at)).collect()
    };
    let rows: Vec<&Vec<u64>> = if samples.len() == 1 {
        vec![&per_sample[0], &per_sample[0]]
    } else {
        per_sample.iter().collect()
    };
    // y of the stack below series `k` at each point: HEIGHT is 0 devices, 0 all of them.
    let y = |row: &Vec<u64>, k: usize| -> u64 {
        let total: u64 = row.iter().sum();
        let below: u64 = row[..k].iter().sum();
        if total == 0 {
            return HEIGHT;
        }
        HEIGHT - (u128::from(below) * u128::from(HEIGHT) / u128::from(total)) as u64
    };
    let polygon = |k: usize| -> String {
        let top = xs
            .iter()
            .zip(&rows)
            .map(|(x, r)| format!("{x},{}", y(r, k + 1)));
        let bottom = xs
            .iter()
            .zip(&rows)
            .rev()
            .map(|(x, r)| format!("{x},{}", y(r, k)));
        top.chain(bottom).collect::<Vec<_>>().join(" ")
    };
    let newest = per_sample.last().cloned().unwrap_or_default();
    html! {
        figure.history {
            svg xmlns="http://www.w3.org/2000/svg" role="img" width="100%" height="120" preserveAspectRatio="none"
                viewBox={ "0 0 " (WIDTH) " " (HEIGHT) } data-samples=(samples.len()) {
                title { "Devices by agent version, " (n_samples(samples.len())) " from " (samples[0].at) " to " (last.at) }
                @for (k, name) in names.iter().enumerate() {
                    @let colour = colour(k, name);
                    g data-version=(name) data-last-count=(newest[k]) {
                        title { (name) ": " (newest[k]) " at the newest sample" }
                        polygon points=(polygon(k)) fill=(colour) {}
                    }
                }
            }
            figcaption.muted {
                @for (k, name) in names.iter().enumerate() {
                    @let colour = colour(k, name);
                    span style={ "color:" (colour) } { "■" } " " (name) " " b { (newest[k]) } " · "
                }
                (n_samples(samples.len())) ", one a minute, from " (samples[0].at) " to " (last.at)
                " (kept for a day in the operator's memory; a restart starts again)."
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: u64) -> Timestamp {
        Timestamp::from_unix_ms(1_800_000_000_000 + s * 1000)
    }
    fn fleet(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
        pairs.iter().map(|(v, n)| (v.to_string(), *n)).collect()
    }

    #[test]
    fn one_sample_a_minute_for_a_day() {
        let mut h = VersionHistory::default();
        assert!(h.record(at(0), &fleet(&[("1.0", 3)])));
        assert!(
            !h.record(at(59), &fleet(&[("1.0", 2), ("2.0", 1)])),
            "too soon"
        );
        assert!(!h.due(at(59)) && h.due(at(60)));
        assert!(h.record(at(60), &fleet(&[("1.0", 2), ("2.0", 1)])));
        for i in 2..(MAX_SAMPLES as u64 + 10) {
            h.record(at(i * 60), &fleet(&[("2.0", 3)]));
        }
        let s = h.samples();
        assert_eq!(s.len(), MAX_SAMPLES);
        assert_eq!(s[0].at, at(10 * 60), "the oldest went");
        // A sample keeps at most VERSIONS_PER_SAMPLE versions and sums the rest.
        let many: BTreeMap<String, u64> = (0..20).map(|i| (format!("v{i:02}"), 1)).collect();
        h.record(at(100_000), &many);
        let last = h.samples().pop().unwrap();
        assert_eq!(last.counts.len(), VERSIONS_PER_SAMPLE + 1);
        assert_eq!(last.counts.last(), Some(&(OTHER.to_owned(), 12)));
    }

    #[test]
    fn the_chart_stacks_each_versions_share() {
        let samples = vec![
            Sample {
                at: at(0),
                counts: vec![("1.0".into(), 4)],
            },
            Sample {
                at: at(60),
                counts: vec![("1.0".into(), 3), ("2.0".into(), 1)],
            },
        ];
        let svg = chart(&samples).into_string();
        assert!(svg.contains(r#"data-samples="2""#), "{svg}");
        // 1.0 has the most devices over the window: the bottom series, from the axis to its share.
        assert!(
            svg.contains(r#"data-version="1.0" data-last-count="3""#),
            "{svg}"
        );
        assert!(
            svg.contains(r#"<polygon points="0,0 1000,30 1000,120 0,120""#),
            "1.0 fills all at first, 3/4 at the end: {svg}"
        );
        assert!(
            svg.contains(r#"data-version="2.0" data-last-count="1""#),
            "{svg}"
        );
        assert!(
            svg.contains(r#"<polygon points="0,0 1000,0 1000,30 0,0""#),
            "2.0 grows from nothing to the top quarter: {svg}"
        );
        // One sample: a band across the width; none: a sentence.
        let one = chart(&samples[..1]).into_string();
        assert!(
            one.contains(r#"points="0,0 1000,0 1000,120 0,120""#),
            "{one}"
        );
        assert!(chart(&[]).into_string().contains("No sample yet"));
        // Names are escaped.
        let evil = chart(&[Sample {
            at: at(0),
            counts: vec![("<i>".into(), 1)],
        }])
        .into_string();
        assert!(
            !evil.contains("<i>") && evil.contains("&lt;i&gt;"),
            "{evil}"
        );
    }
}
