//! Prometheus counters and the text exposition of `/metrics`.

use fleet_wire::fleetlock::{ErrorKind, GroupStatus};
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Counters shared by every connection.
#[derive(Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(&'static str, u16), u64>>,
    errors: [AtomicU64; ErrorKind::ALL.len()],
    /// Config reloads that were rejected.
    pub reload_failures: AtomicU64,
    /// Holders removed because their TTL ran out.
    pub ttl_expired: AtomicU64,
    /// Admin releases done.
    pub admin_releases: AtomicU64,
}

impl Metrics {
    /// Counts one answered request.
    pub fn request(&self, endpoint: &'static str, code: u16) {
        if let Ok(mut m) = self.requests.lock() {
            *m.entry((endpoint, code)).or_default() += 1;
        }
    }

    /// Counts one error answer.
    pub fn error(&self, kind: ErrorKind) {
        if let Some(i) = ErrorKind::ALL.iter().position(|k| *k == kind) {
            self.errors[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Renders the text format.
    pub fn render(
        &self,
        groups: &[GroupStatus],
        config_valid: bool,
        store: &str,
        commits: u64,
        conflicts: u64,
    ) -> String {
        let mut o = String::with_capacity(4096);
        let family = |o: &mut String, name: &str, kind: &str, help: &str| {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
        };
        family(
            &mut o,
            "fleetlock_slots",
            "gauge",
            "Configured slots per group.",
        );
        for g in groups {
            let _ = writeln!(o, "fleetlock_slots{{group=\"{}\"}} {}", g.name, g.slots);
        }
        family(
            &mut o,
            "fleetlock_holders",
            "gauge",
            "Current holders per group.",
        );
        for g in groups {
            let _ = writeln!(
                o,
                "fleetlock_holders{{group=\"{}\"}} {}",
                g.name,
                g.holders.len()
            );
        }
        family(
            &mut o,
            "fleetlock_requests_total",
            "counter",
            "Answered requests by endpoint and HTTP status.",
        );
        if let Ok(m) = self.requests.lock() {
            for ((endpoint, code), n) in m.iter() {
                let _ = writeln!(
                    o,
                    "fleetlock_requests_total{{endpoint=\"{endpoint}\",code=\"{code}\"}} {n}"
                );
            }
        }
        family(
            &mut o,
            "fleetlock_errors_total",
            "counter",
            "Error answers by kind.",
        );
        for (k, n) in ErrorKind::ALL.iter().zip(&self.errors) {
            let _ = writeln!(
                o,
                "fleetlock_errors_total{{kind=\"{}\"}} {}",
                k.as_str(),
                n.load(Ordering::Relaxed)
            );
        }
        family(
            &mut o,
            "fleetlock_config_valid",
            "gauge",
            "1 if the config file on disk is valid; 0 if the last good one is in use.",
        );
        let _ = writeln!(o, "fleetlock_config_valid {}", u8::from(config_valid));
        let counters = [
            (
                "fleetlock_config_reload_failures_total",
                "Config reloads rejected.",
                self.reload_failures.load(Ordering::Relaxed),
            ),
            (
                "fleetlock_ttl_expired_total",
                "Holders removed by the lock TTL.",
                self.ttl_expired.load(Ordering::Relaxed),
            ),
            (
                "fleetlock_admin_releases_total",
                "Admin releases.",
                self.admin_releases.load(Ordering::Relaxed),
            ),
            (
                "fleetlock_store_commits_total",
                "Durable commits (one fsync or one CAS write covers a batch).",
                commits,
            ),
            (
                "fleetlock_store_cas_conflicts_total",
                "Compare-and-set conflicts retried inside the server.",
                conflicts,
            ),
        ];
        for (name, help, v) in counters {
            family(&mut o, name, "counter", help);
            let _ = writeln!(o, "{name}{{store=\"{store}\"}} {v}");
        }
        o
    }

    /// `fleetlock_client_auth` and `fleetlock_connections_refused_total{reason}` (per-client cap, server-wide cap).
    pub fn render_guards(&self, client_auth: bool, (per_client, total): (u64, u64)) -> String {
        format!(
            "# HELP fleetlock_client_auth 1 if pre-reboot and steady-state need client credentials; 0: anyone who \
             reaches the server can take slots.\n# TYPE fleetlock_client_auth gauge\nfleetlock_client_auth {}\n\
             # HELP fleetlock_connections_refused_total Connections closed at accept: per-client or server-wide cap.\n\
             # TYPE fleetlock_connections_refused_total counter\n\
             fleetlock_connections_refused_total{{reason=\"per-client\"}} {per_client}\n\
             fleetlock_connections_refused_total{{reason=\"total\"}} {total}\n",
            u8::from(client_auth)
        )
    }
}
