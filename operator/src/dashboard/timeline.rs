//! A horizontal timeline as inline SVG, written with maud (every label escaped): one mark per transition,
//! placed by its time between the first and the last, labelled with its phase, bad phases in red. The device
//! page draws its agent-upgrade transitions with it above their table, which keeps the times and reasons as text.

use fleet_wire::Timestamp;
use maud::{html, Markup};

/// Width of the timeline in SVG user units; the SVG scales to its container (`width="100%"`).
const WIDTH: u64 = 1000;
/// Height in user units: two label rows above the axis, the axis, two label rows below it.
const HEIGHT: u64 = 90;
/// Room kept free at each end, so that a mark's label centred on the first or last mark stays inside.
const MARGIN: u64 = 60;
/// Where the axis runs.
const AXIS_Y: u64 = 45;
/// Mark colours: a bad phase (failed, rolling back) and any other.
const BAD: &str = "#b00";
const OK: &str = "#070";

/// One transition on the timeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mark {
    /// When the phase was entered.
    pub at: Timestamp,
    /// The phase's name as the page prints it.
    pub phase: String,
    /// Drawn in red (a failed or rolled-back phase).
    pub bad: bool,
}

/// The x of each time in user units, in `[MARGIN, WIDTH - MARGIN]`: the earliest at the left end, the latest at
/// the right, the rest by their share of that span. Without a span (one mark, or all at the same time) every
/// mark sits in the middle: there is no order to show but the table's.
fn positions(ats: &[Timestamp]) -> Vec<u64> {
    let ms: Vec<u64> = ats.iter().map(|t| t.unix_ms()).collect();
    let (Some(lo), Some(hi)) = (ms.iter().min(), ms.iter().max()) else {
        return Vec::new();
    };
    let span = hi - lo;
    let inner = WIDTH - 2 * MARGIN;
    ms.iter()
        .map(|m| {
            if span == 0 {
                WIDTH / 2
            } else {
                // u128: (m - lo) * inner cannot overflow for any span of u64 milliseconds.
                MARGIN + (u128::from(m - lo) * u128::from(inner) / u128::from(span)) as u64
            }
        })
        .collect()
}

/// The timeline of `marks` (oldest first), titled `title` (its accessible name). Each mark is a `g` with
/// `data-mark` (its 1-based number, as in the table), `data-phase` and `data-at`, so a test reads them back.
pub fn timeline(title: &str, marks: &[Mark]) -> Markup {
    let xs = positions(&marks.iter().map(|m| m.at).collect::<Vec<_>>());
    html! {
        figure.timeline {
            svg xmlns="http://www.w3.org/2000/svg" role="img" width="100%"
                viewBox={ "0 0 " (WIDTH) " " (HEIGHT) } data-timeline=(marks.len()) {
                title { (title) ": " (marks.len()) " transitions" }
                line x1=(MARGIN) y1=(AXIS_Y) x2=(WIDTH - MARGIN) y2=(AXIS_Y) stroke="#999" stroke-width="2" {}
                @for (i, (m, x)) in marks.iter().zip(&xs).enumerate() {
                    @let colour = if m.bad { BAD } else { OK };
                    // Labels take four rows in turn (two above the axis, two below), so that up to four
                    // neighbours close in time do not overlap (a rollback's three phases come within seconds).
                    @let y = [AXIS_Y - 12, AXIS_Y + 22, AXIS_Y - 28, AXIS_Y + 38][i % 4];
                    g data-mark=(i + 1) data-phase=(m.phase) data-at=(m.at) {
                        title { (i + 1) ". " (m.phase) " at " (m.at) }
                        circle cx=(x) cy=(AXIS_Y) r="6" fill=(colour) {}
                        text x=(x) y=(y) text-anchor="middle" font-size="13" fill=(colour) { (m.phase) }
                    }
                }
            }
        }
    }
}

/// The `data-phase` of every mark of the first timeline in a page's HTML (as served, or as a browser's DOM
/// dump), in order; `None` when the page has no timeline. Phases come back as the page wrote them (escaped).
pub fn phases(page: &str) -> Option<Vec<String>> {
    let start = page.find("data-timeline=\"")?;
    let rest = &page[start..];
    let svg = &rest[..rest.find("</svg>")?];
    svg.split("<g ")
        .skip(1)
        .map(|g| {
            let v = g.split("data-phase=\"").nth(1)?;
            Some(v.split('"').next()?.to_owned())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(s: u64) -> Timestamp {
        Timestamp::from_system_time(std::time::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + s))
    }

    fn mark(s: u64, phase: &str) -> Mark {
        Mark {
            at: at(s),
            phase: phase.into(),
            bad: phase == "failed",
        }
    }

    #[test]
    fn positions_follow_time() {
        let xs = positions(&[at(0), at(1), at(3), at(3), at(100), at(10_000)]);
        assert_eq!(xs[0], MARGIN);
        assert_eq!(*xs.last().unwrap(), WIDTH - MARGIN);
        assert!(xs.windows(2).all(|w| w[0] <= w[1]), "{xs:?}");
        assert_eq!(xs[2], xs[3], "equal times, equal places");
        // By time, not by index: 100 s of a 10,000 s span is 1 % of the way.
        assert_eq!(xs[4], MARGIN + (WIDTH - 2 * MARGIN) / 100);
        // Out of order times (a clock stepped back) are still placed by time.
        let xs = positions(&[at(5), at(0), at(10)]);
        assert_eq!(xs, vec![WIDTH / 2, MARGIN, WIDTH - MARGIN]);
    }

    #[test]
    fn a_single_transition_and_equal_times_sit_in_the_middle() {
        assert_eq!(positions(&[at(7)]), vec![WIDTH / 2]);
        assert_eq!(positions(&[at(7), at(7), at(7)]), vec![WIDTH / 2; 3]);
        assert_eq!(positions(&[]), Vec::<u64>::new());
        let s = timeline("t", &[mark(7, "preparing")]).into_string();
        assert!(s.contains("data-timeline=\"1\""), "{s}");
        assert!(s.contains("<circle cx=\"500\""), "{s}");
        assert_eq!(phases(&s), Some(vec!["preparing".into()]));
    }

    #[test]
    fn every_transition_is_a_mark_with_its_phase_and_bad_ones_are_red() {
        let marks = [
            mark(0, "preparing"),
            mark(60, "stopping"),
            mark(61, "failed"),
        ];
        let s = timeline("agent upgrade", &marks).into_string();
        assert_eq!(s.matches("<circle").count(), 3, "{s}");
        assert_eq!(
            phases(&s),
            Some(vec!["preparing".into(), "stopping".into(), "failed".into()])
        );
        assert!(
            s.contains(&format!(
                "<circle cx=\"{}\" cy=\"{AXIS_Y}\" r=\"6\" fill=\"{BAD}\"",
                WIDTH - MARGIN
            )),
            "{s}"
        );
        assert_eq!(
            s.matches(&format!("fill=\"{BAD}\"")).count(),
            2,
            "circle and label of the one failure"
        );
        assert!(s.contains(&format!("data-at=\"{}\"", at(60))), "{s}");
        assert_eq!(phases("<p>no timeline</p>"), None);
    }

    #[test]
    fn phase_and_title_text_is_escaped() {
        let hostile = "<script>alert(1)</script>\"'&";
        let s = timeline(hostile, &[mark(0, hostile)]).into_string();
        assert!(!s.contains("<script"), "{s}");
        assert!(
            s.contains("&lt;script&gt;alert(1)&lt;/script&gt;&quot;'&amp;"),
            "{s}"
        );
        assert_eq!(
            phases(&s),
            Some(vec![
                "&lt;script&gt;alert(1)&lt;/script&gt;&quot;'&amp;".into()
            ])
        );
    }
}
