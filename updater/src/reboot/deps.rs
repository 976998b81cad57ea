//! Remote dependency checks, each with a time-out: `host:port` accepts TCP, a URL answers 2xx, and at least
//! `min_up` hosts of a CIDR range accept TCP on a port (bounded: at most 1,024 addresses, 64 probes at once).

use super::config::RangeConfig;
use super::Reason;
use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Most addresses a range may have.
pub const MAX_RANGE_HOSTS: usize = 1024;
/// Most probes in flight.
pub const MAX_PARALLEL: usize = 64;

/// Whether something accepts TCP at `target` (`host:port`).
pub fn tcp(target: &str, timeout: Duration) -> Result<(), Reason> {
    let addrs: Vec<SocketAddr> = target
        .to_socket_addrs()
        .map_err(|e| Reason(format!("{target}: {e}")))?
        .take(8)
        .collect();
    let mut last = format!("{target}: no address");
    for a in addrs {
        match TcpStream::connect_timeout(&a, timeout) {
            Ok(_) => return Ok(()),
            Err(e) => last = format!("{target}: {e}"),
        }
    }
    Err(Reason(last))
}

/// Whether `url` answers a GET with 2xx.
pub fn http_ok(url: &str, timeout: Duration) -> Result<(), Reason> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(timeout))
        .http_status_as_error(false)
        .build()
        .into();
    let resp = agent
        .get(url)
        .call()
        .map_err(|e| Reason(format!("{url}: {e}")))?;
    let code = resp.status().as_u16();
    if (200..300).contains(&code) {
        Ok(())
    } else {
        Err(Reason(format!("{url}: HTTP {code}")))
    }
}

/// Every `require_hosts` entry must pass.
pub fn require_hosts(entries: &[String], timeout: Duration) -> Result<(), Reason> {
    for e in entries {
        let r = if e.starts_with("http://") || e.starts_with("https://") {
            http_ok(e, timeout)
        } else {
            tcp(e, timeout)
        };
        r.map_err(|why| Reason(format!("dependency down: {why}")))?;
    }
    Ok(())
}

/// A `range.cidr` that is not a usable range; the text names the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CidrError {
    /// No `/`.
    #[error("range.cidr: {0:?} is not ADDRESS/PREFIX")]
    NotCidr(String),
    /// The part before `/`.
    #[error("range.cidr: {0:?} is not an IP address")]
    NotAddress(String),
    /// The part after `/`.
    #[error("range.cidr: {0:?} is not a prefix length")]
    NotPrefix(String),
    /// A prefix longer than the address.
    #[error("range.cidr: /{len} is longer than {bits} bits")]
    PrefixTooLong {
        /// The prefix length.
        len: u32,
        /// The address's bits.
        bits: u32,
    },
    /// More than [`MAX_RANGE_HOSTS`] addresses.
    #[error(
        "range.cidr: {0} has more than {MAX_RANGE_HOSTS} addresses (use /22 or longer for IPv4)"
    )]
    TooLarge(String),
}

/// The host addresses of a CIDR (IPv4 without network and broadcast for prefixes up to /30).
pub fn cidr_hosts(cidr: &str) -> Result<Vec<IpAddr>, CidrError> {
    let (addr, len) = cidr
        .split_once('/')
        .ok_or_else(|| CidrError::NotCidr(cidr.to_string()))?;
    let ip: IpAddr = addr
        .parse()
        .map_err(|_| CidrError::NotAddress(addr.to_string()))?;
    let len: u32 = len
        .parse()
        .map_err(|_| CidrError::NotPrefix(len.to_string()))?;
    let bits = if ip.is_ipv4() { 32 } else { 128 };
    if len > bits {
        return Err(CidrError::PrefixTooLong { len, bits });
    }
    let host_bits = bits - len;
    if host_bits > 10 {
        return Err(CidrError::TooLarge(cidr.to_string()));
    }
    let count = 1u128 << host_bits;
    let out: Vec<IpAddr> = match ip {
        IpAddr::V4(v4) => {
            let base = u32::from(v4) & !((1u64 << host_bits) as u32).wrapping_sub(1);
            let (first, last) = if host_bits >= 2 {
                (1, count - 1)
            } else {
                (0, count)
            };
            (first..last)
                .map(|i| IpAddr::from(std::net::Ipv4Addr::from(base + i as u32)))
                .collect()
        }
        IpAddr::V6(v6) => {
            let mask = !((1u128 << host_bits) - 1);
            let base = u128::from(v6) & mask;
            (0..count)
                .map(|i| IpAddr::from(std::net::Ipv6Addr::from(base + i)))
                .collect()
        }
    };
    Ok(out)
}

/// At least `min_up` hosts of the range accept TCP on the port; stops probing once enough answered.
pub fn range(r: &RangeConfig, timeout: Duration) -> Result<usize, Reason> {
    let hosts = Arc::new(cidr_hosts(&r.cidr).map_err(|e| Reason(e.to_string()))?);
    let next = Arc::new(AtomicUsize::new(0));
    let up = Arc::new(AtomicUsize::new(0));
    let need = r.min_up as usize;
    let workers = MAX_PARALLEL.min(hosts.len());
    let handles: Vec<_> = (0..workers)
        .map(|_| {
            let (hosts, next, up, port) = (hosts.clone(), next.clone(), up.clone(), r.port);
            std::thread::spawn(move || loop {
                if up.load(Ordering::Relaxed) >= need {
                    return;
                }
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(ip) = hosts.get(i) else { return };
                if TcpStream::connect_timeout(&SocketAddr::new(*ip, port), timeout).is_ok() {
                    up.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for h in handles {
        let _ = h.join();
    }
    let n = up.load(Ordering::Relaxed);
    if n >= need {
        Ok(n)
    } else {
        Err(Reason(format!(
            "dependency down: only {n} of the required {need} hosts in {} answer on port {}",
            r.cidr, r.port
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidr_expansion() {
        let h = cidr_hosts("10.0.0.0/24").expect("ok");
        assert_eq!(h.len(), 254);
        assert_eq!(h[0].to_string(), "10.0.0.1");
        assert_eq!(cidr_hosts("127.0.0.5/32").expect("ok").len(), 1);
        assert_eq!(cidr_hosts("127.0.0.4/31").expect("ok").len(), 2);
        assert_eq!(
            cidr_hosts("10.0.0.77/30").expect("ok")[0].to_string(),
            "10.0.0.77"
        );
        assert_eq!(cidr_hosts("10.0.0.77/30").expect("ok").len(), 2);
        assert!(cidr_hosts("10.0.0.0/21").is_err());
        assert_eq!(cidr_hosts("::1/128").expect("ok").len(), 1);
        assert!(cidr_hosts("10.0.0.0").is_err());
    }
}
