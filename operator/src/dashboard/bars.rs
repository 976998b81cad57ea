//! Stacked progress bars as inline SVG, written with maud (no built string is passed through unescaped): one
//! bar of named, coloured parts whose widths are their counts' share of the total. The counts are printed next
//! to the bar too, so the numbers read without the picture (and a test can assert them in the DOM).

use maud::{html, Markup};

/// Width of the bar in SVG user units; the SVG scales to its container (`width="100%"`).
const WIDTH: u64 = 1000;
/// Height of the bar in SVG user units.
const HEIGHT: u64 = 24;

/// One part of a bar: what it counts, how many, and its fill colour (a constant from the caller).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// What the part counts, e.g. `updated`.
    pub label: String,
    /// How many.
    pub count: u64,
    /// The fill colour, a CSS colour constant.
    pub colour: &'static str,
}

impl Part {
    /// A part labelled `label` counting `count`, filled with `colour`.
    pub fn new(label: impl Into<String>, count: u64, colour: &'static str) -> Self {
        Part {
            label: label.into(),
            count,
            colour,
        }
    }
}

/// The x offset and width of each part, in user units: widths are the counts' share of `WIDTH`, rounded so
/// that they add up to exactly `WIDTH` when the total is not zero (the last non-empty part takes the rest).
fn layout(parts: &[Part]) -> Vec<(u64, u64)> {
    let total: u64 = parts.iter().map(|p| p.count).sum();
    let last = parts.iter().rposition(|p| p.count > 0);
    let mut x = 0;
    parts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let w = if total == 0 || p.count == 0 {
                0
            } else if Some(i) == last {
                WIDTH - x
            } else {
                // u128: count * WIDTH cannot overflow for any u64 count.
                (u128::from(p.count) * u128::from(WIDTH) / u128::from(total)) as u64
            };
            let at = x;
            x += w;
            (at, w)
        })
        .collect()
}

/// A stacked bar titled `title` (an accessible name), followed by a legend with every part's count.
pub fn bar(title: &str, parts: &[Part]) -> Markup {
    let total: u64 = parts.iter().map(|p| p.count).sum();
    let boxes = layout(parts);
    html! {
        figure.bar {
            svg xmlns="http://www.w3.org/2000/svg" role="img" width="100%" height="24"
                viewBox={ "0 0 " (WIDTH) " " (HEIGHT) } preserveAspectRatio="none" {
                title { (title) ": " (total) " in all" }
                rect x="0" y="0" width=(WIDTH) height=(HEIGHT) fill="#eee" {}
                @for (p, (x, w)) in parts.iter().zip(&boxes) {
                    @if *w > 0 {
                        rect x=(x) y="0" width=(w) height=(HEIGHT) fill=(p.colour)
                            data-part=(p.label) data-count=(p.count) {
                            title { (p.label) ": " (p.count) }
                        }
                    }
                }
            }
            figcaption {
                @for p in parts {
                    span.part data-part=(p.label) data-count=(p.count) {
                        span style={ "color:" (p.colour) } { "■ " } (p.label) " " b { (p.count) } " "
                    }
                }
                span.muted { "of " (total) }
            }
        }
    }
}

/// The legend's `(part, count)` pairs of the bar inside the element marked `data-bar="<id>"` in a page's HTML
/// (as served, or as a browser's DOM dump), in order; `None` when the page has no such bar. Labels come back as
/// the page wrote them (escaped).
pub fn legend(page: &str, id: &str) -> Option<Vec<(String, u64)>> {
    let start = page.find(&format!("data-bar=\"{id}\""))?;
    let rest = &page[start..];
    let figure = &rest[..rest.find("</figure>")?];
    let mut out = Vec::new();
    for span in figure.split("<span class=\"part\" ").skip(1) {
        let attr = |a: &str| {
            let v = span.split(&format!("{a}=\"")).nth(1)?;
            v.split('"').next()
        };
        out.push((
            attr("data-part")?.to_owned(),
            attr("data-count")?.parse().ok()?,
        ));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(counts: &[u64]) -> Vec<Part> {
        counts
            .iter()
            .enumerate()
            .map(|(i, c)| Part::new(format!("p{i}"), *c, "#070"))
            .collect()
    }

    #[test]
    fn widths_are_shares_and_fill_the_bar() {
        let l = layout(&parts(&[1, 1, 1]));
        assert_eq!(l, vec![(0, 333), (333, 333), (666, 334)]);
        let l = layout(&parts(&[3, 0, 1, 0]));
        assert_eq!(l, vec![(0, 750), (750, 0), (750, 250), (1000, 0)]);
        let l = layout(&parts(&[u64::MAX / 2, u64::MAX / 2]));
        assert_eq!(l.iter().map(|(_, w)| w).sum::<u64>(), WIDTH);
    }

    #[test]
    fn empty_bar_has_no_parts_drawn_but_lists_zero_counts() {
        let s = bar("rollout", &parts(&[0, 0])).into_string();
        assert_eq!(s.matches("<rect").count(), 1, "only the background: {s}");
        assert!(s.contains("data-part=\"p0\" data-count=\"0\""), "{s}");
        assert!(s.contains("of 0"), "{s}");
    }

    #[test]
    fn counts_show_in_the_svg_and_the_legend() {
        let s = bar(
            "r",
            &[
                Part::new("updated", 7, "#070"),
                Part::new("pending", 3, "#999"),
            ],
        )
        .into_string();
        assert!(s.contains("<rect x=\"0\" y=\"0\" width=\"700\""), "{s}");
        assert!(s.contains("<title>updated: 7</title>"), "{s}");
        assert!(s.contains("<title>r: 10 in all</title>"), "{s}");
        assert!(s.contains("<b>3</b>"), "{s}");
    }

    #[test]
    fn legend_reads_back_the_counts_of_the_marked_bar() {
        let one = bar("a", &[Part::new("x", 2, "#070"), Part::new("y", 0, "#999")]);
        let two = bar("b", &[Part::new("x", 5, "#070")]);
        let page =
            maud::html! { div data-bar="one" { (one) } div data-bar="two" { (two) } }.into_string();
        assert_eq!(
            legend(&page, "one"),
            Some(vec![("x".into(), 2), ("y".into(), 0)])
        );
        assert_eq!(legend(&page, "two"), Some(vec![("x".into(), 5)]));
        assert_eq!(legend(&page, "three"), None);
    }

    #[test]
    fn labels_are_escaped() {
        let s = bar("<x>", &[Part::new("<script>\"", 1, "#070")]).into_string();
        assert!(!s.contains("<script"), "{s}");
        assert!(!s.contains("<x>"), "{s}");
        assert!(s.contains("&lt;script&gt;&quot;"), "{s}");
    }
}
