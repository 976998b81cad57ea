//! Reboot slot holds as a picture: one bar per hold, from when the slot was taken to when it was given back (or
//! to now, while held), drawn as inline SVG with maud (every label escaped). The holds come from the FleetLock
//! server's status: its current holders and its recent releases, expiries and admin releases. The time axis spans
//! the holds drawn (to now only while one is held), so holds of seconds are not slivers on a page opened an hour
//! later, and every bar has a least width; each is labelled with its device and how long it was held.

use super::holder_devices::Holders;
use super::html::age;
use fleet_wire::fleetlock::{LockEventKind, ServerStatus};
use fleet_wire::Timestamp;
use maud::{html, Markup};

/// Most holds drawn (the newest); the table under the chart lists every recent event.
pub const MAX_HOLDS: usize = 20;
/// Width in SVG user units; the SVG scales to its container.
const WIDTH: u64 = 1000;
/// Room at the left for the labels' start and at the right so a bar ending now stays visible.
const MARGIN: u64 = 10;
/// Height of one hold's row.
const ROW: u64 = 30;
/// Least width of a bar in user units (about 1.2 % of the chart's width: 15 pixels in a 1280-pixel window), so a
/// hold of a second beside one of an hour is still seen.
pub const MIN_BAR: u64 = 12;

/// How a hold ended, or that it has not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// Still held.
    Held,
    /// Given back by the holder.
    Released,
    /// Its time-to-live ran out.
    Expired,
    /// An administrator released it.
    AdminReleased,
}

impl End {
    fn label(self) -> &'static str {
        match self {
            Self::Held => "held",
            Self::Released => "released",
            Self::Expired => "expired",
            Self::AdminReleased => "admin-released",
        }
    }

    fn colour(self) -> &'static str {
        match self {
            Self::Held => "#2a6fb0",
            Self::Released => "#070",
            Self::Expired | Self::AdminReleased => "#b00",
        }
    }
}

/// One slot held by one client in one group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    /// The group.
    pub group: String,
    /// The holder's id.
    pub id: String,
    /// When it took the slot.
    pub from: Timestamp,
    /// When it lost the slot; `None` while held.
    pub to: Option<Timestamp>,
    /// How it ended.
    pub end: End,
}

/// The holds `s` shows, newest first, at most [`MAX_HOLDS`]: every current holder, and every hold a recent
/// event ended (a grant alone adds nothing: its hold is either current or ended by a later event).
pub fn holds(s: &ServerStatus) -> Vec<Hold> {
    let current = s.groups.iter().flat_map(|g| {
        g.holders.iter().map(|h| Hold {
            group: g.name.clone(),
            id: h.id.clone(),
            from: h.taken_at,
            to: None,
            end: End::Held,
        })
    });
    let ended = s.recent.iter().filter_map(|e| {
        let end = match e.kind {
            LockEventKind::Granted => return None,
            LockEventKind::Released => End::Released,
            LockEventKind::Expired => End::Expired,
            LockEventKind::AdminReleased => End::AdminReleased,
        };
        Some(Hold {
            group: e.group.clone(),
            id: e.holder.id.clone(),
            from: e.holder.taken_at,
            to: Some(e.at),
            end,
        })
    });
    let mut all: Vec<Hold> = current.chain(ended).collect();
    all.sort_by_key(|h| std::cmp::Reverse(h.from));
    all.truncate(MAX_HOLDS);
    all
}

/// The x of `t` between `lo` (left) and `hi` (right), in user units.
fn x(t: Timestamp, lo: u64, hi: u64) -> u64 {
    let inner = WIDTH - 2 * MARGIN;
    let span = hi.saturating_sub(lo).max(1);
    let off = t.unix_ms().clamp(lo, hi) - lo;
    // u128: off * inner cannot overflow for any span of u64 milliseconds.
    MARGIN + (u128::from(off) * u128::from(inner) / u128::from(span)) as u64
}

/// The bar from `x0` to `x1` as (x, width): at least [`MIN_BAR`] wide, moved left when that would cross the
/// right margin.
fn bar(x0: u64, x1: u64) -> (u64, u64) {
    let w = x1.saturating_sub(x0).max(MIN_BAR);
    (x0.min(WIDTH - MARGIN - w), w)
}

/// The time axis of `holds` up to `now`, in ms: from the oldest hold's start to now while one is held, else to
/// the latest end.
fn axis(holds: &[Hold], now: Timestamp) -> (u64, u64) {
    let lo = holds.iter().map(|h| h.from.unix_ms()).min().unwrap_or(0);
    let hi = holds
        .iter()
        .map(|h| h.to.unwrap_or(now).unix_ms())
        .max()
        .unwrap_or(lo);
    (lo, hi.max(lo))
}

/// The chart of `holds` (newest first) up to `now`, each labelled with its holder as `names` knows it. Each hold is
/// a `g` with `data-hold` (its group and FleetLock id), `data-end` and `data-held-secs`, and its bar a `rect` with
/// `data-bar`, so a test reads them back.
pub fn chart(holds: &[Hold], names: &Holders, now: Timestamp) -> Markup {
    if holds.is_empty() {
        return html! { p.muted { "No holds to draw: no slot is held and the server reported no recent release." } };
    }
    let (lo, hi) = axis(holds, now);
    let held_now = holds.iter().any(|h| h.to.is_none());
    let height = ROW * holds.len() as u64 + 20;
    html! {
        figure.holds {
            svg xmlns="http://www.w3.org/2000/svg" role="img" width="100%"
                viewBox={ "0 0 " (WIDTH) " " (height) } data-holds=(holds.len()) {
                title {
                    "Reboot slot holds: " (holds.len()) ", from " (Timestamp::from_unix_ms(lo)) " to "
                    @if held_now { "now" } @else { (Timestamp::from_unix_ms(hi)) }
                }
                @for (i, h) in holds.iter().enumerate() {
                    @let y = ROW * i as u64 + 4;
                    @let (bx, bw) = bar(x(h.from, lo, hi), x(h.to.unwrap_or(now), lo, hi));
                    @let held = h.to.unwrap_or(now).since(h.from);
                    @let who = names.label(&h.id);
                    g data-hold={ (h.group) "/" (h.id) } data-end=(h.end.label()) data-held-secs=(held.as_secs()) {
                        title {
                            (who) " in " (h.group) ": " (h.end.label()) ", held " (age(held)) " from " (h.from)
                        }
                        rect data-bar="hold" x=(bx) y=(y) width=(bw) height="10" rx="2" fill=(h.end.colour()) {}
                        text x=(MARGIN) y=(y + 23) font-size="12" fill="#222" {
                            (who) " · " (h.group) " · "
                            @if h.end == End::Held { "held for " (age(held)) " so far" }
                            @else { (h.end.label()) " after " (age(held)) }
                            ", from " (h.from)
                        }
                    }
                }
                text x=(MARGIN) y=(height - 2) font-size="11" fill="#777" { (Timestamp::from_unix_ms(lo)) }
                text x=(WIDTH - MARGIN) y=(height - 2) font-size="11" fill="#777" text-anchor="end" {
                    @if held_now { "now" } @else { (Timestamp::from_unix_ms(hi)) }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_wire::fleetlock::{GroupStatus, Holder, LockEvent};

    fn at(s: u64) -> Timestamp {
        Timestamp::from_unix_ms(1_800_000_000_000 + s * 1000)
    }
    fn holder(id: &str, taken: u64) -> Holder {
        Holder {
            id: id.into(),
            hostname: None,
            ip: "10.0.0.1".into(),
            taken_at: at(taken),
        }
    }
    fn event(kind: LockEventKind, group: &str, id: &str, taken: u64, when: u64) -> LockEvent {
        LockEvent {
            at: at(when),
            kind,
            group: group.into(),
            holder: holder(id, taken),
        }
    }

    #[test]
    fn holds_are_current_holders_and_ended_holds_newest_first() {
        let s = ServerStatus {
            store: "file".into(),
            config_valid: true,
            config_error: None,
            ttl_secs: None,
            client_auth: None,
            warnings: Vec::new(),
            groups: vec![GroupStatus {
                name: "db".into(),
                slots: 1,
                holders: vec![holder("now", 300)],
            }],
            started_at: Some(at(0)),
            recent: vec![
                event(LockEventKind::Granted, "db", "now", 300, 300),
                event(LockEventKind::Expired, "db", "ttl", 150, 250),
                event(LockEventKind::AdminReleased, "web", "adm", 120, 200),
                event(LockEventKind::Released, "db", "ok", 100, 130),
                event(LockEventKind::Granted, "db", "ok", 100, 100),
            ],
        };
        let h = holds(&s);
        let got: Vec<(&str, End, Option<u64>)> = h
            .iter()
            .map(|h| {
                (
                    h.id.as_str(),
                    h.end,
                    h.to.map(|t| t.since(h.from).as_secs()),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                ("now", End::Held, None),
                ("ttl", End::Expired, Some(100)),
                ("adm", End::AdminReleased, Some(80)),
                ("ok", End::Released, Some(30)),
            ]
        );
        let svg = chart(&h, &Holders::default(), at(400)).into_string();
        assert!(svg.contains(r#"data-holds="4""#), "{svg}");
        assert!(
            svg.contains(r#"data-hold="db/ok" data-end="released" data-held-secs="30""#),
            "{svg}"
        );
        assert!(
            svg.contains(r#"data-hold="db/now" data-end="held" data-held-secs="100""#),
            "a current hold runs to now: {svg}"
        );
    }

    #[test]
    fn bars_are_placed_by_time_and_bounded() {
        assert_eq!(x(at(0), at(0).unix_ms(), at(100).unix_ms()), MARGIN);
        assert_eq!(
            x(at(100), at(0).unix_ms(), at(100).unix_ms()),
            WIDTH - MARGIN
        );
        assert_eq!(x(at(50), at(0).unix_ms(), at(100).unix_ms()), WIDTH / 2);
        // A clock stepped back (a hold starting before the axis, or after now) stays on the chart.
        assert_eq!(
            x(at(200), at(0).unix_ms(), at(100).unix_ms()),
            WIDTH - MARGIN
        );
        assert_eq!(x(at(0), at(0).unix_ms(), at(0).unix_ms()), MARGIN);
        let many: Vec<LockEvent> = (0..50)
            .map(|i| event(LockEventKind::Released, "g", &format!("h{i}"), i, i + 1))
            .collect();
        let s = ServerStatus {
            store: "file".into(),
            config_valid: true,
            config_error: None,
            ttl_secs: None,
            client_auth: None,
            warnings: Vec::new(),
            groups: vec![],
            started_at: None,
            recent: many,
        };
        let h = holds(&s);
        assert_eq!(h.len(), MAX_HOLDS);
        assert_eq!(h[0].id, "h49", "the newest are kept");
        // A label with markup is escaped.
        let evil = vec![Hold {
            group: "<g>".into(),
            id: "\"><script>".into(),
            from: at(0),
            to: Some(at(1)),
            end: End::Released,
        }];
        let svg = chart(&evil, &Holders::default(), at(2)).into_string();
        assert!(
            !svg.contains("<script>") && svg.contains("&lt;script&gt;"),
            "{svg}"
        );
    }

    /// The `(x, width)` of every hold's bar in `svg`, in order.
    fn bars(svg: &str) -> Vec<(u64, u64)> {
        svg.split(r#"<rect data-bar="hold" "#)
            .skip(1)
            .map(|r| {
                let attr = |a: &str| -> u64 {
                    let v = r.split(&format!("{a}=\"")).nth(1).expect("attribute");
                    v.split('"').next().expect("value").parse().expect("number")
                };
                (attr("x"), attr("width"))
            })
            .collect()
    }

    #[test]
    fn holds_of_seconds_stay_readable_on_a_page_opened_later() {
        // The demo's TaskRun: three reboots of about 16 s, one after another; the page is opened an hour later.
        let h = vec![
            hold("demo-3", 34, Some(50)),
            hold("demo-2", 17, Some(33)),
            hold("demo-1", 0, Some(16)),
        ];
        let svg = chart(&h, &Holders::default(), at(3600)).into_string();
        let b = bars(&svg);
        assert_eq!(b.len(), 3, "{svg}");
        // The axis spans the holds (50 s), not the hour since: each bar is about a third of the chart.
        for (_, w) in &b {
            assert!(*w >= 300, "a 16-s hold is {w} of {WIDTH} units wide: {svg}");
        }
        assert!(b[0].0 > b[1].0 && b[1].0 > b[2].0, "in time order: {b:?}");
        assert!(
            svg.contains("unknown holder demo-1 · g · released after 16s"),
            "labelled with who, where and how long: {svg}"
        );
        assert!(!svg.contains(">now<"), "no hold is current: {svg}");
        // A hold of one second beside one held for an hour (to now) still has a bar, inside the chart.
        let h = vec![hold("short", 3599, Some(3600)), hold("long", 0, None)];
        let svg = chart(&h, &Holders::default(), at(3600)).into_string();
        let b = bars(&svg);
        assert_eq!(b[0].1, MIN_BAR, "{svg}");
        assert!(b[0].0 + b[0].1 <= WIDTH - MARGIN, "{b:?}");
        assert_eq!(b[1], (MARGIN, WIDTH - 2 * MARGIN), "{svg}");
        assert!(svg.contains(">now<"), "{svg}");
    }

    fn hold(id: &str, from: u64, to: Option<u64>) -> Hold {
        Hold {
            group: "g".into(),
            id: id.into(),
            from: at(from),
            to: to.map(at),
            end: if to.is_some() {
                End::Released
            } else {
                End::Held
            },
        }
    }
}
