//! The reboot window: days of the week and a start and end time in an IANA time zone read from the system's
//! tzdb (jiff). A window whose end is not after its start crosses midnight; the days name the day it starts on.

use super::config::WindowConfig;
use jiff::tz::TimeZone;

/// A parsed window.
#[derive(Debug, Clone)]
pub struct Window {
    tz: TimeZone,
    tz_name: String,
    /// Monday = 0.
    days: [bool; 7],
    start: u32,
    end: u32,
}

const DAYS: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];

fn minutes(s: &str) -> Result<u32, String> {
    let (h, m) = s
        .split_once(':')
        .ok_or_else(|| format!("{s:?} is not HH:MM"))?;
    let h: u32 = h.parse().map_err(|_| format!("{s:?} is not HH:MM"))?;
    let m: u32 = m.parse().map_err(|_| format!("{s:?} is not HH:MM"))?;
    if h > 23 || m > 59 || s.len() > 5 {
        return Err(format!("{s:?} is not a time between 00:00 and 23:59"));
    }
    Ok(h * 60 + m)
}

impl Window {
    /// Validates a window config.
    pub fn from_config(c: &WindowConfig) -> Result<Self, String> {
        let tz = TimeZone::get(&c.timezone).map_err(|e| {
            format!(
                "window.timezone: {:?} is not a time zone in the system tzdb ({e}); install tzdata",
                c.timezone
            )
        })?;
        let mut days = [c.days.is_empty(); 7];
        for d in &c.days {
            let lower = d.to_ascii_lowercase();
            let i = DAYS
                .iter()
                .position(|p| lower.len() >= 3 && lower.starts_with(p))
                .ok_or_else(|| format!("window.days: {d:?} is not mon…sun"))?;
            days[i] = true;
        }
        Ok(Self {
            tz,
            tz_name: c.timezone.clone(),
            days,
            start: minutes(&c.start).map_err(|e| format!("window.start: {e}"))?,
            end: minutes(&c.end).map_err(|e| format!("window.end: {e}"))?,
        })
    }

    /// Whether `now` is inside the window; `Err` carries the reason to log when it is not.
    pub fn check(&self, now: jiff::Timestamp) -> Result<(), String> {
        let z = now.to_zoned(self.tz.clone());
        let t = u32::from(z.hour().unsigned_abs()) * 60 + u32::from(z.minute().unsigned_abs());
        let d = usize::from(z.weekday().to_monday_zero_offset().unsigned_abs());
        let prev = (d + 6) % 7;
        let inside = if self.start < self.end {
            self.days[d] && self.start <= t && t < self.end
        } else {
            (self.days[d] && t >= self.start) || (self.days[prev] && t < self.end)
        };
        if inside {
            Ok(())
        } else {
            Err(format!(
                "outside the reboot window ({} local time {} {:02}:{:02})",
                self.tz_name,
                DAYS[d],
                t / 60,
                t % 60
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(tz: &str, days: &[&str], start: &str, end: &str) -> Window {
        Window::from_config(&WindowConfig {
            timezone: tz.into(),
            days: days.iter().map(|d| d.to_string()).collect(),
            start: start.into(),
            end: end.into(),
        })
        .expect("window")
    }
    fn at(s: &str) -> jiff::Timestamp {
        s.parse().expect("timestamp")
    }

    #[test]
    fn simple_window_edges() {
        let win = w("UTC", &[], "02:00", "05:00");
        assert!(win.check(at("2026-11-30T02:00:00Z")).is_ok());
        assert!(win.check(at("2026-11-30T04:59:59Z")).is_ok());
        assert!(win.check(at("2026-11-30T05:00:00Z")).is_err());
        assert!(win.check(at("2026-11-30T01:59:59Z")).is_err());
    }

    #[test]
    fn across_midnight_belongs_to_the_start_day() {
        // Friday 22:00 to Saturday 02:00 only.
        let win = w("UTC", &["fri"], "22:00", "02:00");
        assert!(win.check(at("2026-12-04T22:30:00Z")).is_ok()); // Fri
        assert!(win.check(at("2026-12-05T01:30:00Z")).is_ok()); // Sat early
        assert!(win.check(at("2026-12-05T02:00:00Z")).is_err());
        assert!(win.check(at("2026-12-05T22:30:00Z")).is_err()); // Sat late
        assert!(win.check(at("2026-12-04T01:30:00Z")).is_err()); // Fri early: Thu's window
    }

    #[test]
    fn dst_zone() {
        let win = w("Europe/Vienna", &["sun"], "02:00", "05:00");
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
}
