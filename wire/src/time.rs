//! UTC timestamps, serialized as RFC 3339 with milliseconds (`2026-11-30T04:39:26.123Z`).

use crate::ValidationError;
use serde::{Deserialize, Serialize};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A point in time in UTC, with millisecond precision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Timestamp {
    unix_ms: u64,
}

impl Timestamp {
    /// The current time from the system clock (clamped to the epoch if the clock is before it).
    pub fn now() -> Self {
        Self::from_system_time(SystemTime::now())
    }

    /// Milliseconds since the Unix epoch.
    pub const fn from_unix_ms(unix_ms: u64) -> Self {
        Self { unix_ms }
    }

    /// Converts a `SystemTime`, truncating to milliseconds.
    pub fn from_system_time(t: SystemTime) -> Self {
        let ms = t.duration_since(UNIX_EPOCH).unwrap_or_default().as_millis();
        Self {
            unix_ms: u64::try_from(ms).unwrap_or(u64::MAX),
        }
    }

    /// Milliseconds since the Unix epoch.
    pub fn unix_ms(self) -> u64 {
        self.unix_ms
    }

    /// This instant as a `SystemTime`.
    pub fn to_system_time(self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(self.unix_ms)
    }

    /// Time from `earlier` to `self`, zero if `earlier` is later.
    pub fn since(self, earlier: Timestamp) -> Duration {
        Duration::from_millis(self.unix_ms.saturating_sub(earlier.unix_ms))
    }

    /// This instant moved forward by `d` (saturating).
    pub fn plus(self, d: Duration) -> Timestamp {
        let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        Timestamp {
            unix_ms: self.unix_ms.saturating_add(ms),
        }
    }
}

impl TryFrom<String> for Timestamp {
    type Error = ValidationError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl std::str::FromStr for Timestamp {
    type Err = ValidationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        // Only UTC ("Z") is accepted: every timestamp on the wire is UTC.
        if s.len() > 40 || !s.ends_with('Z') {
            return Err(ValidationError::new(
                "timestamp",
                format!(
                    "{} is not an RFC 3339 UTC time ending in Z",
                    crate::error::shown(s)
                ),
            ));
        }
        let t = humantime::parse_rfc3339(s).map_err(|e| {
            ValidationError::new("timestamp", format!("{}: {e}", crate::error::shown(s)))
        })?;
        Ok(Self::from_system_time(t))
    }
}

impl From<Timestamp> for String {
    fn from(t: Timestamp) -> String {
        t.to_string()
    }
}

impl std::fmt::Display for Timestamp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}",
            humantime::format_rfc3339_millis(self.to_system_time())
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_local_offsets() {
        let t = Timestamp::from_unix_ms(1_796_013_566_123);
        let s = t.to_string();
        assert_eq!(s, "2026-11-30T04:39:26.123Z");
        assert_eq!(s.parse::<Timestamp>(), Ok(t));
        assert!("2026-11-30T04:39:26+01:00".parse::<Timestamp>().is_err());
        assert!("yesterday".parse::<Timestamp>().is_err());
    }
}
