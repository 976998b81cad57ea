//! The watchdog's two pure decisions: is the host up, and may it be rebooted (the loop cap).

use super::config::WatchdogConfig;
use super::history::History;
use fleet_wire::Timestamp;

/// What the host says about its boot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observation {
    /// `systemctl is-system-running`.
    pub state: String,
    /// `systemctl is-active systemd-user-sessions.service`.
    pub user_sessions: String,
    /// `/run/nologin` exists (removed by systemd-user-sessions.service).
    pub nologin: bool,
}

/// The host's boot, judged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    /// Booted: `running` or `degraded`, user sessions allowed.
    Up,
    /// Shutting down, or a person is at a rescue shell: not the watchdog's business.
    LeaveAlone(String),
    /// Still not up; the reasons, joined.
    NotUp(String),
}

/// Judges an observation.
pub fn health(obs: &Observation) -> Health {
    match obs.state.as_str() {
        "stopping" => return Health::LeaveAlone("the host is shutting down".into()),
        "maintenance" => {
            return Health::LeaveAlone(
                "rescue or emergency mode: a person is at the console".into(),
            )
        }
        _ => {}
    }
    let mut why = vec![];
    if obs.state != "running" && obs.state != "degraded" {
        why.push(format!("is-system-running says {}", obs.state));
    }
    if obs.user_sessions != "active" {
        why.push(format!(
            "systemd-user-sessions.service is {}",
            obs.user_sessions
        ));
    }
    if obs.nologin {
        why.push("/run/nologin exists".to_string());
    }
    if why.is_empty() {
        Health::Up
    } else {
        Health::NotUp(why.join(", "))
    }
}

/// What to do about a host that is not up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Rebooting is off: diagnostics only.
    Diagnose,
    /// Reboot (below the cap).
    Reboot,
    /// The cap holds: `count` watchdog reboots within the window already.
    CapReached {
        /// Watchdog reboots within the window.
        count: usize,
        /// Why, when not the count (an unreadable record).
        note: String,
    },
}

impl Decision {
    /// One line for the diagnostics, the log and the login message.
    pub fn describe(&self, cfg: &WatchdogConfig) -> String {
        match self {
            Decision::Diagnose => "rebooting is off (reboot = false): diagnostics only".into(),
            Decision::Reboot => format!(
                "rebooting: below the cap of {} watchdog reboot(s) in {} h",
                cfg.max_reboots, cfg.window_hours
            ),
            Decision::CapReached { count, note } if note.is_empty() => format!(
                "reboot cap reached: {count} watchdog reboot(s) in the last {} h (max {}); this host stays up for a person",
                cfg.window_hours, cfg.max_reboots
            ),
            Decision::CapReached { note, .. } => format!("reboot cap reached: {note}"),
        }
    }
}

/// The loop cap: reboot only while fewer than `max_reboots` watchdog reboots lie within the window. A record in
/// the future (the clock went back) counts, so a wrong clock can only make the watchdog more careful.
pub fn decide(cfg: &WatchdogConfig, history: &History, now: Timestamp) -> Decision {
    if !cfg.reboot {
        return Decision::Diagnose;
    }
    let window_ms = u64::from(cfg.window_hours) * 3_600_000;
    let count = history
        .reboots
        .iter()
        .filter(|t| t.unix_ms() + window_ms > now.unix_ms())
        .count();
    if count >= cfg.max_reboots as usize {
        Decision::CapReached {
            count,
            note: String::new(),
        }
    } else {
        Decision::Reboot
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(state: &str, sessions: &str, nologin: bool) -> Observation {
        Observation {
            state: state.into(),
            user_sessions: sessions.into(),
            nologin,
        }
    }

    #[test]
    fn health_table() {
        #[derive(Debug, PartialEq)]
        enum Want {
            Up,
            NotUp,
            Alone,
        }
        let table = [
            (obs("running", "active", false), Want::Up),
            (obs("degraded", "active", false), Want::Up),
            (obs("starting", "inactive", true), Want::NotUp),
            (obs("starting", "active", false), Want::NotUp),
            (obs("running", "inactive", false), Want::NotUp),
            (obs("running", "active", true), Want::NotUp),
            (obs("stopping", "inactive", true), Want::Alone),
            (obs("maintenance", "inactive", true), Want::Alone),
        ];
        for (o, want) in table {
            let got = match health(&o) {
                Health::Up => Want::Up,
                Health::NotUp(_) => Want::NotUp,
                Health::LeaveAlone(_) => Want::Alone,
            };
            assert_eq!(got, want, "{o:?}");
        }
        let Health::NotUp(why) = health(&obs("starting", "inactive", true)) else {
            panic!("not up expected")
        };
        assert_eq!(
            why,
            "is-system-running says starting, systemd-user-sessions.service is inactive, /run/nologin exists"
        );
    }

    fn cfg(reboot: bool, max: u32, hours: u32) -> WatchdogConfig {
        WatchdogConfig {
            reboot,
            max_reboots: max,
            window_hours: hours,
            ..WatchdogConfig::default()
        }
    }

    fn at(h: u64) -> Timestamp {
        Timestamp::from_unix_ms(1_800_000_000_000 + h * 3_600_000)
    }

    #[test]
    fn cap_table() {
        let hist = |hours: &[u64]| History {
            reboots: hours.iter().map(|h| at(*h)).collect(),
        };
        let cap = |count| Decision::CapReached {
            count,
            note: String::new(),
        };
        let table = [
            // (config, earlier reboots at hour, now at hour, decision)
            (cfg(true, 2, 24), hist(&[]), 100, Decision::Reboot),
            (cfg(true, 2, 24), hist(&[99]), 100, Decision::Reboot),
            (cfg(true, 2, 24), hist(&[90, 99]), 100, cap(2)),
            // Older than the window: forgotten.
            (cfg(true, 2, 24), hist(&[50, 76, 99]), 100, Decision::Reboot),
            (cfg(true, 1, 24), hist(&[99]), 100, cap(1)),
            // The clock went back: a record in the future still counts.
            (cfg(true, 1, 24), hist(&[120]), 100, cap(1)),
            (cfg(false, 2, 24), hist(&[]), 100, Decision::Diagnose),
            (cfg(false, 1, 24), hist(&[99]), 100, Decision::Diagnose),
        ];
        for (c, h, now, want) in table {
            assert_eq!(decide(&c, &h, at(now)), want, "{c:?} {h:?} now {now}");
        }
    }
}
