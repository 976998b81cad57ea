//! TaskSchedule timing, as pure functions with the clock passed in: the schedule forms (daily, weekly, yearly,
//! five-field cron; always UTC, no time-zone field), their next and latest ticks (`croner`: POSIX/Vixie cron,
//! day-of-month OR day-of-week), and what a schedule does at `now`. No I/O; table-tested.

use chrono::{DateTime, TimeZone, Utc};
use croner::parser::{CronParser, Seconds, Year};
use croner::Cron;
use fleet_wire::Timestamp;
use serde::Deserialize;

/// When runs start, in UTC. Exactly one form; any other field (a time zone, for instance) makes the spec invalid.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum Form {
    /// Every day at `at`.
    Daily {
        /// `HH:MM`, UTC.
        at: String,
    },
    /// Every week on `day` at `at`.
    Weekly {
        /// `Monday` … `Sunday`.
        day: String,
        /// `HH:MM`, UTC.
        at: String,
    },
    /// Every year on `month`/`day` at `at` (February 29 runs in leap years only).
    Yearly {
        /// 1–12.
        month: u32,
        /// 1–31, and a day that exists in that month.
        day: u32,
        /// `HH:MM`, UTC.
        at: String,
    },
    /// A five-field cron expression (minute hour day-of-month month day-of-week), UTC.
    Cron(String),
}

/// A validated schedule.
#[derive(Debug, Clone)]
pub struct Schedule {
    cron: Cron,
    /// The five-field expression it runs on (for status and messages).
    pub expression: String,
}

fn hh_mm(at: &str) -> Result<(u32, u32), String> {
    let bad = || format!("{at:?} must be HH:MM (UTC, 00:00 to 23:59)");
    let (h, m) = at.split_once(':').ok_or_else(bad)?;
    if h.len() != 2 || m.len() != 2 {
        return Err(bad());
    }
    let (h, m): (u32, u32) = (h.parse().map_err(|_| bad())?, m.parse().map_err(|_| bad())?);
    if h > 23 || m > 59 {
        return Err(bad());
    }
    Ok((h, m))
}

const DAYS: [&str; 7] = [
    "sunday",
    "monday",
    "tuesday",
    "wednesday",
    "thursday",
    "friday",
    "saturday",
];

impl Schedule {
    /// Validates a schedule as written in a TaskSchedule spec (`{daily: {at}}`, `{weekly: {day, at}}`,
    /// `{yearly: {month, day, at}}` or `{cron: "…"}`); the error names the field by its full path
    /// (`spec.schedule.daily.at: …`), as [`check`](Self::check) finds it.
    pub fn parse(value: &serde_json::Value) -> Result<Self, String> {
        Self::check(value).map_err(|(rel, why)| {
            format!("{}: {why}", crate::validation::join("spec.schedule", &rel))
        })
    }

    /// [`parse`](Self::parse), the error as the path below the schedule (`daily.at`; empty: the schedule itself)
    /// and why.
    pub fn check(value: &serde_json::Value) -> Result<Self, (String, String)> {
        // Checked here, not left to serde: its message for this ("invalid value: map, expected map with a single
        // key") speaks of the parser, not of the schedule.
        const FORMS: &str = "must be exactly one of daily, weekly, yearly or cron, always UTC (there is no time-zone field)";
        let whole = |why: String| (String::new(), why);
        match value.as_object() {
            Some(m) if m.len() == 1 => {}
            Some(m) if m.is_empty() => return Err(whole(format!("{FORMS}; it is empty"))),
            Some(m) => {
                let keys: Vec<&str> = m.keys().map(String::as_str).collect();
                return Err(whole(format!("{FORMS}; it has {}", keys.join(", "))));
            }
            None => return Err(whole(format!("{FORMS}; it is {value}"))),
        }
        let form: Form = crate::validation::typed(value).map_err(|(rel, why)| {
            match why.starts_with("unknown field") {
                true => (
                    rel,
                    format!("{why} (a schedule is always UTC: there is no time-zone field)"),
                ),
                false => (rel, why),
            }
        })?;
        let at = |form: &'static str| move |e: String| (format!("{form}.at"), e);
        let expression = match &form {
            Form::Daily { at: t } => {
                let (h, m) = hh_mm(t).map_err(at("daily"))?;
                format!("{m} {h} * * *")
            }
            Form::Weekly { day, at: t } => {
                let (h, m) = hh_mm(t).map_err(at("weekly"))?;
                let d = DAYS
                    .iter()
                    .position(|d| d.eq_ignore_ascii_case(day))
                    .ok_or_else(|| {
                        (
                            "weekly.day".to_owned(),
                            format!("{day:?} must be Monday … Sunday"),
                        )
                    })?;
                format!("{m} {h} * * {d}")
            }
            Form::Yearly { month, day, at: t } => {
                let (h, m) = hh_mm(t).map_err(at("yearly"))?;
                let days_in = match month {
                    1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
                    4 | 6 | 9 | 11 => 30,
                    2 => 29,
                    _ => return Err(("yearly.month".into(), format!("{month} must be 1 to 12"))),
                };
                if !(1..=days_in).contains(day) {
                    return Err((
                        "yearly.day".into(),
                        format!("{day} does not exist in month {month}"),
                    ));
                }
                format!("{m} {h} {day} {month} *")
            }
            Form::Cron(e) => e.trim().to_owned(),
        };
        let cron = CronParser::builder()
            .seconds(Seconds::Disallowed)
            .year(Year::Disallowed)
            .build()
            .parse(&expression)
            .map_err(|e| {
                let rel = match form {
                    Form::Cron(_) => "cron",
                    _ => "",
                };
                (
                    rel.to_owned(),
                    format!("{expression:?}: {e} (five fields: minute hour day-of-month month day-of-week, UTC)"),
                )
            })?;
        Ok(Self { cron, expression })
    }

    /// The first tick strictly after `t`.
    pub fn next_after(&self, t: Timestamp) -> Option<Timestamp> {
        self.cron
            .find_next_occurrence(&utc(t), false)
            .ok()
            .map(timestamp)
    }

    /// The latest tick at or before `t`.
    pub fn latest_at_or_before(&self, t: Timestamp) -> Option<Timestamp> {
        self.cron
            .find_previous_occurrence(&utc(t), true)
            .ok()
            .map(timestamp)
    }
}

/// `t` in whole seconds (ticks fall on whole minutes; croner keeps fractions).
fn utc(t: Timestamp) -> DateTime<Utc> {
    Utc.timestamp_opt((t.unix_ms() / 1000) as i64, 0)
        .single()
        .unwrap_or_default()
}

fn timestamp(d: DateTime<Utc>) -> Timestamp {
    Timestamp::from_unix_ms(d.timestamp_millis().max(0) as u64)
}

/// What a schedule does at `now`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Create the run of this tick (the latest eligible one; earlier missed ticks are not caught up).
    Create(Timestamp),
    /// This tick came while a run is active (or the schedule is suspended): no run; it counts as skipped.
    Skip(Timestamp),
    /// Nothing is due.
    Wait,
}

/// Decides at `now`: the latest tick after `last` (the last tick handled, or the schedule's creation) and at or
/// before `now` is due; it creates a run unless one is active or the schedule is suspended, in which case it is
/// skipped. Ticks missed while the operator was away collapse into that one tick: at most one catch-up run.
pub fn decide(
    schedule: &Schedule,
    last: Timestamp,
    now: Timestamp,
    active: bool,
    suspended: bool,
) -> Decision {
    match schedule.latest_at_or_before(now) {
        Some(t) if t > last => match active || suspended {
            true => Decision::Skip(t),
            false => Decision::Create(t),
        },
        _ => Decision::Wait,
    }
}

/// The name of the run of `tick`: deterministic, so two operators (or a restart) never create one tick twice.
pub fn run_name(schedule: &str, tick: Timestamp) -> String {
    format!("{schedule}-{}", tick.unix_ms() / 60_000)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ts(s: &str) -> Timestamp {
        s.parse().expect("timestamp")
    }

    #[test]
    fn next_tick_table() {
        let cases: Vec<(serde_json::Value, &str, &str)> = vec![
            (
                json!({"daily": {"at": "03:00"}}),
                "2026-12-01T02:59:59Z",
                "2026-12-01T03:00:00.000Z",
            ),
            // exactly on a tick: the next one
            (
                json!({"daily": {"at": "03:00"}}),
                "2026-12-01T03:00:00Z",
                "2026-12-02T03:00:00.000Z",
            ),
            // minute boundaries and the year end
            (
                json!({"daily": {"at": "23:59"}}),
                "2026-12-31T23:59:00.001Z",
                "2027-01-01T23:59:00.000Z",
            ),
            (
                json!({"weekly": {"day": "Sunday", "at": "04:30"}}),
                "2026-12-01T00:00:00Z",
                "2026-12-06T04:30:00.000Z",
            ),
            (
                json!({"weekly": {"day": "monday", "at": "00:00"}}),
                "2026-12-06T23:59:59Z",
                "2026-12-07T00:00:00.000Z",
            ),
            // month ends: the 31st skips months without one
            (
                json!({"cron": "0 1 31 * *"}),
                "2026-04-01T00:00:00Z",
                "2026-05-31T01:00:00.000Z",
            ),
            // February 29: leap years only
            (
                json!({"yearly": {"month": 2, "day": 29, "at": "12:00"}}),
                "2026-03-01T00:00:00Z",
                "2028-02-29T12:00:00.000Z",
            ),
            (
                json!({"yearly": {"month": 12, "day": 25, "at": "06:00"}}),
                "2026-12-25T06:00:00Z",
                "2027-12-25T06:00:00.000Z",
            ),
            // day-of-month OR day-of-week (POSIX/Vixie)
            (
                json!({"cron": "0 0 13 * 5"}),
                "2026-12-01T00:00:00Z",
                "2026-12-04T00:00:00.000Z",
            ),
            (
                json!({"cron": "*/15 * * * *"}),
                "2026-12-01T10:14:59Z",
                "2026-12-01T10:15:00.000Z",
            ),
        ];
        for (i, (form, now, want)) in cases.into_iter().enumerate() {
            let s = Schedule::parse(&form).unwrap_or_else(|e| panic!("case {i}: {e}"));
            let got = s.next_after(ts(now)).map(|t| t.to_string());
            assert_eq!(got.as_deref(), Some(want), "case {i} ({})", s.expression);
        }
    }

    #[test]
    fn invalid_schedules_table() {
        let cases: Vec<(serde_json::Value, &str)> = vec![
            (
                json!({"daily": {"at": "03:00", "timeZone": "Europe/Paris"}}),
                "time-zone",
            ),
            (json!({"daily": {"at": "3:00"}}), "HH:MM"),
            (json!({"daily": {"at": "24:00"}}), "HH:MM"),
            (
                json!({"weekly": {"day": "Someday", "at": "03:00"}}),
                "Monday",
            ),
            (
                json!({"yearly": {"month": 2, "day": 30, "at": "03:00"}}),
                "does not exist",
            ),
            (
                json!({"yearly": {"month": 13, "day": 1, "at": "03:00"}}),
                "1 to 12",
            ),
            (json!({"cron": "0 0 * * * *"}), "five fields"),
            (json!({"cron": "61 * * * *"}), "five fields"),
            (json!({"cron": ""}), "five fields"),
            (
                json!({"daily": {"at": "03:00"}, "cron": "* * * * *"}),
                "exactly one",
            ),
            (json!({}), "exactly one"),
        ];
        for (i, (form, want)) in cases.into_iter().enumerate() {
            let e = Schedule::parse(&form).expect_err(&format!("case {i} is invalid"));
            assert!(e.contains(want), "case {i}: {e}");
        }
    }

    #[test]
    fn decision_table() {
        let s = Schedule::parse(&json!({"cron": "0 * * * *"})).expect("hourly");
        let (t10, t11, t12) = (
            ts("2026-12-01T10:00:00Z"),
            ts("2026-12-01T11:00:00Z"),
            ts("2026-12-01T12:00:00Z"),
        );
        let cases: Vec<(Timestamp, &str, bool, bool, Decision)> = vec![
            (t10, "2026-12-01T10:30:00Z", false, false, Decision::Wait),
            (
                t10,
                "2026-12-01T11:00:00Z",
                false,
                false,
                Decision::Create(t11),
            ),
            (
                t10,
                "2026-12-01T11:00:30Z",
                true,
                false,
                Decision::Skip(t11),
            ),
            (
                t10,
                "2026-12-01T11:00:30Z",
                false,
                true,
                Decision::Skip(t11),
            ),
            // away across three ticks: one catch-up run, for the latest tick
            (
                t10,
                "2026-12-01T13:20:00Z",
                false,
                false,
                Decision::Create(ts("2026-12-01T13:00:00Z")),
            ),
            (t12, "2026-12-01T12:59:59Z", false, false, Decision::Wait),
        ];
        for (i, (last, now, active, suspended, want)) in cases.into_iter().enumerate() {
            assert_eq!(
                decide(&s, last, ts(now), active, suspended),
                want,
                "case {i}"
            );
        }
        assert_eq!(run_name("nightly", t11), "nightly-29935380");
    }
}
