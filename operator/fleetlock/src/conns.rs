//! Connection accounting: at most `max_connections_per_client` open connections per client (an IPv4 address, an
//! IPv6 /64) besides the server-wide cap, so one host cannot fill the server; refusals counted for `/metrics` and
//! logged at most once per [`REFUSAL_LOG_INTERVAL`] (a flood of connections is not a flood of log lines).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Shortest time between two log lines about refused connections.
pub const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Why a connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Its client already holds `max_connections_per_client`.
    PerClient,
    /// The server holds [`crate::server::MAX_CONNECTIONS`].
    Total,
}

#[derive(Default)]
struct Pending {
    last_logged: Option<Instant>,
    per_client: u64,
    total: u64,
    latest: Option<IpAddr>,
}

/// Open connections per client and refusals so far.
#[derive(Default)]
pub struct ClientConns {
    open: Mutex<HashMap<IpAddr, usize>>,
    refused_per_client: AtomicU64,
    refused_total: AtomicU64,
    pending: Mutex<Pending>,
}

/// One open connection of a client; dropping it frees its place.
pub struct ClientPermit {
    conns: Arc<ClientConns>,
    key: IpAddr,
}

impl Drop for ClientPermit {
    fn drop(&mut self) {
        if let Ok(mut open) = self.conns.open.lock() {
            if let Some(n) = open.get_mut(&self.key) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    open.remove(&self.key);
                }
            }
        }
    }
}

/// The client a peer address counts as: the IPv4 address (also when mapped into IPv6), or the IPv6 /64 (one
/// host usually owns a whole /64).
pub fn client_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let mut o = v6.octets();
            o[8..].fill(0);
            IpAddr::from(o)
        }
        v4 => v4,
    }
}

impl ClientConns {
    /// A place for one more connection of `ip`'s client, if it holds fewer than `cap`.
    pub fn try_open(self: &Arc<Self>, ip: IpAddr, cap: usize) -> Option<ClientPermit> {
        let key = client_key(ip);
        let mut open = self.open.lock().ok()?;
        let n = open.entry(key).or_default();
        if *n >= cap {
            if *n == 0 {
                open.remove(&key);
            }
            return None;
        }
        *n += 1;
        Some(ClientPermit {
            conns: self.clone(),
            key,
        })
    }

    /// Connections `ip`'s client holds open now.
    pub fn open(&self, ip: IpAddr) -> usize {
        self.open
            .lock()
            .map(|o| o.get(&client_key(ip)).copied().unwrap_or(0))
            .unwrap_or(0)
    }

    /// Counts a refused connection from `ip` and logs the refusals so far, at most once per
    /// [`REFUSAL_LOG_INTERVAL`].
    pub fn refused(&self, why: Refusal, ip: IpAddr, cap: usize, total: usize) {
        match why {
            Refusal::PerClient => &self.refused_per_client,
            Refusal::Total => &self.refused_total,
        }
        .fetch_add(1, Ordering::Relaxed);
        let Ok(mut p) = self.pending.lock() else {
            return;
        };
        match why {
            Refusal::PerClient => p.per_client += 1,
            Refusal::Total => p.total += 1,
        }
        p.latest = Some(client_key(ip));
        let now = Instant::now();
        if p.last_logged
            .is_some_and(|t| now.duration_since(t) < REFUSAL_LOG_INTERVAL)
        {
            return;
        }
        log::warn!(
            "refused {} connection(s) from a client holding {cap} (max_connections_per_client) and {} with \
             {total} open in all, since the last such line (latest from {}); each closed at once",
            p.per_client,
            p.total,
            p.latest.map(|a| a.to_string()).unwrap_or_default()
        );
        *p = Pending {
            last_logged: Some(now),
            ..Pending::default()
        };
    }

    /// Refused connections so far: (per-client cap, server-wide cap).
    pub fn refusals(&self) -> (u64, u64) {
        (
            self.refused_per_client.load(Ordering::Relaxed),
            self.refused_total.load(Ordering::Relaxed),
        )
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_client_holds_at_most_its_cap_and_gets_places_back() {
        let c = Arc::new(ClientConns::default());
        let a: IpAddr = "127.0.0.2".parse().unwrap();
        let b: IpAddr = "127.0.0.1".parse().unwrap();
        let held: Vec<_> = (0..3).map(|_| c.try_open(a, 3).unwrap()).collect();
        assert!(c.try_open(a, 3).is_none());
        assert!(c.try_open(b, 3).is_some(), "another client is not affected");
        drop(held);
        assert_eq!(c.open(a), 0);
        assert!(
            c.open.lock().unwrap().len() <= 1,
            "no entry left for a client"
        );
        assert!(c.try_open(a, 3).is_some());
    }

    #[test]
    fn ipv6_counts_per_64_and_mapped_ipv4_as_ipv4() {
        let one: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let other: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        assert_eq!(client_key(one), client_key(other));
        let mapped: IpAddr = "::ffff:10.0.0.7".parse().unwrap();
        assert_eq!(client_key(mapped), "10.0.0.7".parse::<IpAddr>().unwrap());
    }
}
