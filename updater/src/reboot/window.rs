//! The reboot window: the reboot config's `window` (YAML keys `timezone`, `days`, `start`, `end`) read as the
//! shared maintenance window, [`fleet_wire::window`], whose docs say what a window means (the days name the day
//! a window starts on; `end` before `start` crosses midnight; clock changes). The zone comes from the system tzdb.

use super::config::WindowConfig;
use fleet_wire::window::{ClockTime, Days, TimeZoneName, WindowSpec};

/// A parsed reboot window.
#[derive(Debug, Clone)]
pub struct Window(fleet_wire::window::Window);

impl Window {
    /// Validates a window config; `Err` names the key (`window.start: …`).
    pub fn from_config(c: &WindowConfig) -> Result<Self, String> {
        fn key(k: &'static str) -> impl Fn(fleet_wire::ValidationError) -> String {
            move |e| format!("window.{k}: {}", e.reason)
        }
        let start: ClockTime = c.start.parse().map_err(key("start"))?;
        let end: ClockTime = c.end.parse().map_err(key("end"))?;
        let spec = WindowSpec::new(
            Days::from_names(&c.days).map_err(key("days"))?,
            start,
            end,
            TimeZoneName::try_from(c.timezone.as_str()).map_err(key("timezone"))?,
        )
        .map_err(|e| format!("window: {}", e.reason))?;
        fleet_wire::window::Window::resolve(&spec)
            .map(Window)
            .map_err(key("timezone"))
    }

    /// Whether `now` is inside the window; `Err` carries the reason to log when it is not, with when it opens.
    pub fn check(&self, now: jiff::Timestamp) -> Result<(), String> {
        let now =
            fleet_wire::Timestamp::from_unix_ms(u64::try_from(now.as_millisecond()).unwrap_or(0));
        if self.0.contains(now) {
            Ok(())
        } else {
            Err(format!(
                "outside the reboot window ({}): it {}",
                self.0.local_text(now),
                self.0.describe(now)
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(tz: &str, days: &[&str], start: &str, end: &str) -> Result<Window, String> {
        Window::from_config(&WindowConfig {
            timezone: tz.into(),
            days: days.iter().map(|d| d.to_string()).collect(),
            start: start.into(),
            end: end.into(),
        })
    }
    fn at(s: &str) -> jiff::Timestamp {
        s.parse().expect("timestamp")
    }

    #[test]
    fn simple_window_edges() {
        let win = w("UTC", &[], "02:00", "05:00").expect("window");
        assert!(win.check(at("2026-11-30T02:00:00Z")).is_ok());
        assert!(win.check(at("2026-11-30T04:59:59Z")).is_ok());
        assert!(win.check(at("2026-11-30T05:00:00Z")).is_err());
        assert!(win.check(at("2026-11-30T01:59:59Z")).is_err());
    }

    #[test]
    fn across_midnight_belongs_to_the_start_day() {
        // Friday 22:00 to Saturday 02:00 only.
        let win = w("UTC", &["fri"], "22:00", "02:00").expect("window");
        assert!(win.check(at("2026-12-04T22:30:00Z")).is_ok()); // Fri
        assert!(win.check(at("2026-12-05T01:30:00Z")).is_ok()); // Sat early
        assert!(win.check(at("2026-12-05T02:00:00Z")).is_err());
        assert!(win.check(at("2026-12-05T22:30:00Z")).is_err()); // Sat late
        assert!(win.check(at("2026-12-04T01:30:00Z")).is_err()); // Fri early: Thu's window
    }

    #[test]
    fn dst_zone() {
        let win = w("Europe/Vienna", &["sun"], "02:00", "05:00").expect("window");
        // 2026-03-29: clocks jump 02:00 CET -> 03:00 CEST. 00:59Z = 01:59 CET (before); 01:00Z = 03:00 CEST.
        assert!(win.check(at("2026-03-29T00:59:00Z")).is_err());
        assert!(win.check(at("2026-03-29T01:00:00Z")).is_ok());
        assert!(win.check(at("2026-03-29T02:59:00Z")).is_ok()); // 04:59 CEST
        assert!(win.check(at("2026-03-29T03:00:00Z")).is_err()); // 05:00 CEST
                                                                 // 2026-10-25: 03:00 CEST -> 02:00 CET; 02:30 local happens twice, both inside.
        assert!(win.check(at("2026-10-25T00:30:00Z")).is_ok()); // 02:30 CEST
        assert!(win.check(at("2026-10-25T01:30:00Z")).is_ok()); // 02:30 CET
        assert!(win.check(at("2026-10-25T03:59:00Z")).is_ok()); // 04:59 CET
        assert!(win.check(at("2026-10-25T04:00:00Z")).is_err()); // 05:00 CET
                                                                 // In summer the window is 00:00-03:00 UTC.
        assert!(win.check(at("2026-07-05T00:00:00Z")).is_ok());
        assert!(win.check(at("2026-07-05T03:00:00Z")).is_err());
    }

    #[test]
    fn the_reason_says_when_it_opens() {
        let win = w("Europe/Vienna", &["sun"], "23:00", "01:00").expect("window");
        assert_eq!(
            win.check(at("2026-11-29T21:59:00Z")).unwrap_err(),
            "outside the reboot window (Sun 2026-11-29 22:59 CET in Europe/Vienna): it opens at Sun 2026-11-29 \
             23:00 CET in Europe/Vienna"
        );
    }

    #[test]
    fn errors_name_the_key() {
        for (tz, days, start, end, says) in [
            (
                "Mars/Base",
                &[][..],
                "02:00",
                "03:00",
                "window.timezone: \"Mars/Base\" is not a time zone",
            ),
            (
                "UTC",
                &[],
                "25:00",
                "03:00",
                "window.start: \"25:00\" is not a time between 00:00 and 23:59",
            ),
            (
                "UTC",
                &[],
                "01:00",
                "24:00",
                "window.end: \"24:00\" is not a time between",
            ),
            (
                "UTC",
                &["someday"],
                "01:00",
                "03:00",
                "window.days: \"someday\" is not a day",
            ),
            (
                "UTC",
                &[],
                "03:00",
                "03:00",
                "window: start and end are both 03:00",
            ),
        ] {
            let e = w(tz, days, start, end).expect_err("refused");
            assert!(e.starts_with(says), "{e}");
        }
    }
}
