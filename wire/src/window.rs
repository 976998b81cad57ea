//! The one maintenance-window type: days of the week, a start and an end time of day, and an IANA time zone. The
//! reboot client (`fleet-reboot`'s `window`) uses it; it is meant for per-group download and apply windows
//! too, which are not built yet.
//!
//! [`WindowSpec`] is the wire form (`{"days": ["mon", "fri"], "start": "22:00", "end": "04:00",
//! "timeZone": "Europe/Berlin"}`), validated when it is built or deserialized. [`Window`] is a spec with its time
//! zone resolved; it answers questions about instants and does no I/O. [`Window::resolve`] (feature `os`)
//! resolves the zone from the system time zone database (`/usr/share/zoneinfo`, or `$TZDIR`; package `tzdata`),
//! the one way every process in the tree gets a zone; [`Window::with_zone`] takes a zone the caller loaded.
//!
//! # What a window is
//!
//! Each listed day `D` (in the window's zone) gives one period, from the local time `D start` to `D end` — or to
//! `D+1 end` when `end` is before `start`: the window crosses midnight, and **the days name the day the window
//! starts on** (`fri 22:00–02:00` is Friday 22:00 to Saturday 02:00; it is not open early on Friday morning, that
//! would be Thursday's window). `start == end` is refused (an empty window, or a whole day: leave the window out
//! for "any time"; a window of a whole day is `00:00`–`23:59`). No days = every day. Periods are half open: open
//! at `start`, closed at `end`.
//!
//! A local time becomes an instant as **the first instant at which the zone's clock shows that time or later**:
//!
//! - a time that happens once is that instant;
//! - a time that happens twice (the hour repeated when the clocks go back) is its first occurrence;
//! - a time that never happens (the hour skipped when the clocks go forward) is the instant the clock jumps.
//!
//! So each period is one stretch of real time, open once and closed once, and on the nights the clocks change it
//! is an hour longer or shorter than on other nights. In `Europe/Berlin` (2026-03-29, 02:00 CET → 03:00 CEST;
//! 2026-10-25, 03:00 CEST → 02:00 CET):
//!
//! - `02:00`–`05:00` on 2026-03-29 opens at the jump (01:00 UTC, shown as 03:00 CEST) and lasts two hours;
//! - `02:00`–`03:00` on 2026-03-29 lies wholly in the skipped hour: **it does not open that night** (the next
//!   listed day's window is the next opening);
//! - `02:00`–`03:00` on 2026-10-25 is open for both 02:00–03:00 hours, two hours of real time (00:00–02:00 UTC);
//! - `02:30`–`05:00` on 2026-10-25 opens at the first 02:30 (CEST) and stays open through the repeated hour.
//!
//! (The reboot client's check before this type compared the clock's local time with `start` and `end`; that gives
//! the same answers except inside a repeated hour, where a window starting or ending in that hour opened twice or
//! closed for a while and opened again.)
//!
//! # Work longer than a window
//!
//! The type answers only questions about times. **The rule for callers: a window gates when work starts, not when
//! it ends.** Work started while the window is open (a reboot, a cutover, a download) runs to its end even if
//! that is after the window closes; nothing new starts once it has closed. Stopping a cutover half-way is worse
//! than finishing it late, and the reboot client has always worked so (it checks the window once, before it
//! takes the lock). A caller that knows how long its work takes may decline to start it when too little of the
//! window is left: [`WindowState::Open`] says when the window closes.

use crate::error::shown;
use crate::{Timestamp, ValidationError};
use jiff::civil::{Date, DateTime, Time};
use jiff::tz::{AmbiguousOffset, TimeZone};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// The days' names, Monday first, as they appear on the wire.
pub const DAY_NAMES: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];
const FULL_DAY_NAMES: [&str; 7] = [
    "monday",
    "tuesday",
    "wednesday",
    "thursday",
    "friday",
    "saturday",
    "sunday",
];

/// How far ahead [`Window::next_open`] looks: four weeks (a listed day's window can only be skipped by a
/// clock change, never four weeks in a row).
pub const LOOKAHEAD_DAYS: i32 = 28;

/// Longest time zone name accepted (the longest in the tzdb has 32 characters).
const MAX_ZONE_NAME: usize = 64;

/// A set of days of the week (never empty).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Days(u8);

impl Days {
    /// Every day of the week.
    pub const EVERY: Days = Days(0x7f);

    /// Parses day names: `mon` … `sun` or `monday` … `sunday`, any case. No names = every day.
    pub fn from_names<S: AsRef<str>>(names: &[S]) -> Result<Days, ValidationError> {
        if names.is_empty() {
            return Ok(Days::EVERY);
        }
        let mut bits = 0u8;
        for name in names {
            let name = name.as_ref();
            let lower = name.to_ascii_lowercase();
            let i = DAY_NAMES
                .iter()
                .zip(FULL_DAY_NAMES)
                .position(|(short, full)| lower == *short || lower == full)
                .ok_or_else(|| {
                    ValidationError::new(
                        "window days",
                        format!(
                            "{} is not a day: mon, tue, wed, thu, fri, sat or sun",
                            shown(name)
                        ),
                    )
                })?;
            bits |= 1 << i;
        }
        Ok(Days(bits))
    }

    /// Whether the day `monday_zero` (Monday = 0 … Sunday = 6) is in the set.
    pub fn contains(self, monday_zero: usize) -> bool {
        monday_zero < 7 && self.0 & (1 << monday_zero) != 0
    }

    /// The names, Monday first.
    pub fn names(self) -> Vec<&'static str> {
        (0..7)
            .filter(|i| self.contains(*i))
            .map(|i| DAY_NAMES[i])
            .collect()
    }

    fn contains_date(self, d: Date) -> bool {
        self.contains(usize::from(
            d.weekday().to_monday_zero_offset().unsigned_abs(),
        ))
    }
}

/// A time of day, `HH:MM` from `00:00` to `23:59` (`H:MM` is accepted when parsing).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ClockTime {
    minute_of_day: u16,
}

impl ClockTime {
    /// `hour:minute`; `None` unless 00:00 ≤ it ≤ 23:59.
    pub fn new(hour: u8, minute: u8) -> Option<ClockTime> {
        (hour < 24 && minute < 60).then(|| ClockTime {
            minute_of_day: u16::from(hour) * 60 + u16::from(minute),
        })
    }
    /// The hour, 0–23.
    pub fn hour(self) -> u8 {
        u8::try_from(self.minute_of_day / 60).unwrap_or(0)
    }
    /// The minute, 0–59.
    pub fn minute(self) -> u8 {
        u8::try_from(self.minute_of_day % 60).unwrap_or(0)
    }
    fn civil(self) -> Time {
        Time::constant(
            i8::try_from(self.hour()).unwrap_or(0),
            i8::try_from(self.minute()).unwrap_or(0),
            0,
            0,
        )
    }
}

impl FromStr for ClockTime {
    type Err = ValidationError;
    fn from_str(s: &str) -> Result<Self, ValidationError> {
        let bad = |why: &str| ValidationError::new("window time", format!("{} {why}", shown(s)));
        let (h, m) = s.split_once(':').ok_or_else(|| bad("is not HH:MM"))?;
        let digits = |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
        if !(digits(h) && digits(m) && h.len() <= 2 && m.len() == 2) {
            return Err(bad("is not HH:MM"));
        }
        let (h, m): (u8, u8) = (
            h.parse().map_err(|_| bad("is not HH:MM"))?,
            m.parse().map_err(|_| bad("is not HH:MM"))?,
        );
        ClockTime::new(h, m).ok_or_else(|| {
            bad("is not a time between 00:00 and 23:59 (a window that ends at midnight ends at 00:00)")
        })
    }
}

impl TryFrom<String> for ClockTime {
    type Error = ValidationError;
    fn try_from(s: String) -> Result<Self, ValidationError> {
        s.parse()
    }
}

impl From<ClockTime> for String {
    fn from(t: ClockTime) -> String {
        t.to_string()
    }
}

impl fmt::Display for ClockTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:02}:{:02}", self.hour(), self.minute())
    }
}

/// An IANA time zone name such as `Europe/Berlin` or `UTC` (syntax only: whether the zone exists is known when
/// it is resolved, [`Window::resolve`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct TimeZoneName(String);

impl TimeZoneName {
    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for TimeZoneName {
    type Error = ValidationError;
    fn try_from(s: String) -> Result<Self, ValidationError> {
        let ok = !s.is_empty()
            && s.len() <= MAX_ZONE_NAME
            && s.split('/').all(|part| {
                !part.is_empty()
                    && part != "."
                    && part != ".."
                    && part
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"_+-.".contains(&b))
            });
        if ok {
            Ok(TimeZoneName(s))
        } else {
            Err(ValidationError::new(
                "window time zone",
                format!(
                    "{} is not an IANA time zone name such as Europe/Berlin or UTC",
                    shown(&s)
                ),
            ))
        }
    }
}

impl TryFrom<&str> for TimeZoneName {
    type Error = ValidationError;
    fn try_from(s: &str) -> Result<Self, ValidationError> {
        Self::try_from(s.to_string())
    }
}

impl From<TimeZoneName> for String {
    fn from(n: TimeZoneName) -> String {
        n.0
    }
}

impl fmt::Display for TimeZoneName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A weekly window, the wire form: `{"days": ["mon", …], "start": "HH:MM", "end": "HH:MM", "timeZone":
/// "Europe/Berlin"}` (`days` absent or empty = every day; it is always written out). See the module
/// documentation for what the window means.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "RawWindowSpec", into = "RawWindowSpec")]
pub struct WindowSpec {
    days: Days,
    start: ClockTime,
    end: ClockTime,
    time_zone: TimeZoneName,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawWindowSpec {
    #[serde(default)]
    days: Vec<String>,
    start: String,
    end: String,
    time_zone: String,
}

impl WindowSpec {
    /// A window; `Err` when `start == end`.
    pub fn new(
        days: Days,
        start: ClockTime,
        end: ClockTime,
        time_zone: TimeZoneName,
    ) -> Result<WindowSpec, ValidationError> {
        if start == end {
            return Err(ValidationError::new(
                "window",
                format!(
                    "start and end are both {start}: a window must have a length (leave the window out for \
                     any time; a whole day is 00:00 to 23:59)"
                ),
            ));
        }
        Ok(WindowSpec {
            days,
            start,
            end,
            time_zone,
        })
    }

    /// Parses each part as it is written on the wire (see [`Days::from_names`], [`ClockTime`],
    /// [`TimeZoneName`]).
    pub fn parse<S: AsRef<str>>(
        days: &[S],
        start: &str,
        end: &str,
        time_zone: &str,
    ) -> Result<WindowSpec, ValidationError> {
        let start = start
            .parse()
            .map_err(|e: ValidationError| ValidationError {
                field: "window start",
                ..e
            })?;
        let end = end.parse().map_err(|e: ValidationError| ValidationError {
            field: "window end",
            ..e
        })?;
        WindowSpec::new(
            Days::from_names(days)?,
            start,
            end,
            TimeZoneName::try_from(time_zone)?,
        )
    }

    /// The days the window starts on.
    pub fn days(&self) -> Days {
        self.days
    }
    /// When it opens, local time.
    pub fn start(&self) -> ClockTime {
        self.start
    }
    /// When it closes, local time (before `start`: the next day).
    pub fn end(&self) -> ClockTime {
        self.end
    }
    /// The zone of `start` and `end`.
    pub fn time_zone(&self) -> &TimeZoneName {
        &self.time_zone
    }
    /// Whether the window crosses midnight (`end` before `start`).
    pub fn crosses_midnight(&self) -> bool {
        self.end < self.start
    }
}

impl TryFrom<RawWindowSpec> for WindowSpec {
    type Error = ValidationError;
    fn try_from(r: RawWindowSpec) -> Result<Self, ValidationError> {
        WindowSpec::parse(&r.days, &r.start, &r.end, &r.time_zone)
    }
}

impl From<WindowSpec> for RawWindowSpec {
    fn from(w: WindowSpec) -> Self {
        RawWindowSpec {
            days: w.days.names().into_iter().map(String::from).collect(),
            start: w.start.to_string(),
            end: w.end.to_string(),
            time_zone: w.time_zone.0,
        }
    }
}

impl fmt::Display for WindowSpec {
    /// `mon,fri 22:00–04:00 Europe/Berlin` (`every day` for all seven).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let days = if self.days == Days::EVERY {
            "every day".to_string()
        } else {
            self.days.names().join(",")
        };
        write!(f, "{days} {}–{} {}", self.start, self.end, self.time_zone)
    }
}

/// Where an instant stands with respect to a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowState {
    /// Inside the window, which closes at `closes`.
    Open {
        /// When this period of the window ends (the first instant outside it).
        closes: Timestamp,
    },
    /// Outside the window.
    Closed {
        /// When it next opens; `None` if not within [`LOOKAHEAD_DAYS`] days.
        opens: Option<Timestamp>,
    },
}

/// A window with its time zone resolved: answers "is this instant inside", "when does it next open", "when does
/// it close". No I/O.
#[derive(Debug, Clone)]
pub struct Window {
    spec: WindowSpec,
    tz: TimeZone,
}

impl Window {
    /// Resolves the spec's zone from the system time zone database (`/usr/share/zoneinfo` or `$TZDIR`).
    #[cfg(feature = "os")]
    pub fn resolve(spec: &WindowSpec) -> Result<Window, ValidationError> {
        let tz = TimeZone::get(spec.time_zone.as_str()).map_err(|e| {
            ValidationError::new(
                "window time zone",
                format!(
                    "{} is not a time zone in the system tzdb ({e}); install tzdata",
                    shown(spec.time_zone.as_str())
                ),
            )
        })?;
        Ok(Window::with_zone(spec.clone(), tz))
    }

    /// The window with `tz` as its zone (the caller loaded it; [`Window::resolve`] is the usual way).
    pub fn with_zone(spec: WindowSpec, tz: TimeZone) -> Window {
        Window { spec, tz }
    }

    /// The spec.
    pub fn spec(&self) -> &WindowSpec {
        &self.spec
    }

    /// Whether `now` is inside the window.
    pub fn contains(&self, now: Timestamp) -> bool {
        matches!(self.state(now), WindowState::Open { .. })
    }

    /// Whether `now` is inside (and until when) or outside (and when it next opens).
    pub fn state(&self, now: Timestamp) -> WindowState {
        let at = to_jiff(now);
        let today = at.to_zoned(self.tz.clone()).date();
        // A period starts at most a day before its local date's end; two days back covers any clock change.
        for offset in -2..=0 {
            if let Some((open, close)) = day(today, offset).and_then(|d| self.period(d)) {
                if open <= at && at < close {
                    return WindowState::Open {
                        closes: from_jiff(close),
                    };
                }
            }
        }
        WindowState::Closed {
            opens: self.next_open(now),
        }
    }

    /// The first opening after `now` (strictly later; `None` if not within [`LOOKAHEAD_DAYS`] days).
    pub fn next_open(&self, now: Timestamp) -> Option<Timestamp> {
        let at = to_jiff(now);
        let today = at.to_zoned(self.tz.clone()).date();
        (-1..=LOOKAHEAD_DAYS)
            .filter_map(|offset| day(today, offset).and_then(|d| self.period(d)))
            .map(|(open, _)| open)
            .find(|open| *open > at)
            .map(from_jiff)
    }

    /// When the window closes if `now` is inside it.
    pub fn closes(&self, now: Timestamp) -> Option<Timestamp> {
        match self.state(now) {
            WindowState::Open { closes } => Some(closes),
            WindowState::Closed { .. } => None,
        }
    }

    /// `t` in the window's zone, for people: `Sun 2026-03-29 03:00 CEST in Europe/Berlin` (`… 03:00 UTC` when
    /// the zone is its own abbreviation).
    pub fn local_text(&self, t: Timestamp) -> String {
        let z = to_jiff(t).to_zoned(self.tz.clone());
        let text = z.strftime("%a %Y-%m-%d %H:%M %Z").to_string();
        let name = self.spec.time_zone.as_str();
        if text.ends_with(&format!(" {name}")) {
            text
        } else {
            format!("{text} in {name}")
        }
    }

    /// The state in words: `open until …` or `opens at …` (the "why is nothing happening" reason).
    pub fn describe(&self, now: Timestamp) -> String {
        match self.state(now) {
            WindowState::Open { closes } => format!("open until {}", self.local_text(closes)),
            WindowState::Closed { opens: Some(t) } => format!("opens at {}", self.local_text(t)),
            WindowState::Closed { opens: None } => {
                format!("does not open in the next {LOOKAHEAD_DAYS} days")
            }
        }
    }

    /// The period that starts on local date `d`, if `d` is a listed day and the period is not empty.
    fn period(&self, d: Date) -> Option<(jiff::Timestamp, jiff::Timestamp)> {
        if !self.spec.days.contains_date(d) {
            return None;
        }
        let end_day = if self.spec.crosses_midnight() {
            d.tomorrow().ok()?
        } else {
            d
        };
        let open = self.first_at_or_after(DateTime::from_parts(d, self.spec.start.civil()))?;
        let close = self.first_at_or_after(DateTime::from_parts(end_day, self.spec.end.civil()))?;
        (open < close).then_some((open, close))
    }

    /// The first instant at which the zone's clock shows `dt` or later.
    fn first_at_or_after(&self, dt: DateTime) -> Option<jiff::Timestamp> {
        match self.tz.to_ambiguous_timestamp(dt).offset() {
            AmbiguousOffset::Unambiguous { offset } => offset.to_timestamp(dt).ok(),
            // The first of the two occurrences is the one with the offset in force before the change.
            AmbiguousOffset::Fold { before, .. } => before.to_timestamp(dt).ok(),
            // `dt` is skipped: the clock jumps past it at the transition, which lies between `dt` read with the
            // offset after the change and `dt` read with the offset before it.
            AmbiguousOffset::Gap { before, after } => {
                let earliest = after.to_timestamp(dt).ok()?;
                self.tz
                    .following(earliest)
                    .next()
                    .map(|t| t.timestamp())
                    .or_else(|| before.to_timestamp(dt).ok())
            }
        }
    }
}

fn day(d: Date, offset: i32) -> Option<Date> {
    d.checked_add(jiff::Span::new().days(offset)).ok()
}

fn to_jiff(t: Timestamp) -> jiff::Timestamp {
    i64::try_from(t.unix_ms())
        .ok()
        .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
        .unwrap_or(jiff::Timestamp::MAX)
}

fn from_jiff(t: jiff::Timestamp) -> Timestamp {
    Timestamp::from_unix_ms(u64::try_from(t.as_millisecond()).unwrap_or(0))
}

#[cfg(test)]
mod tests;
