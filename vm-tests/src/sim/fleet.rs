//! Which devices exist, which connection each uses, and which of them fail.

use fleet_wire::DeviceId;

/// The id of device `i`: `sim-000042` (a valid DNS-1123 label, so also a Device object's name).
pub fn device_id(i: usize) -> DeviceId {
    DeviceId::try_from(format!("sim-{i:06}").as_str()).unwrap_or_else(|_| unreachable!())
}

/// The index of a simulator id (`sim-000042` → 42); `None` for any other name.
pub fn index_of(id: &str) -> Option<usize> {
    let digits = id.strip_prefix("sim-")?;
    (digits.len() >= 6 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

/// Whether device `i` fails its upgrades and workloads: exactly `floor(n × fraction)` of devices `0..n` do, spread
/// evenly (not the first ones), so a run's failures are the same every time.
pub fn fails(i: usize, fraction: f64) -> bool {
    let at = |k: usize| (k as f64 * fraction).floor() as u64;
    at(i + 1) > at(i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip() {
        assert_eq!(device_id(42).as_str(), "sim-000042");
        assert_eq!(index_of("sim-000042"), Some(42));
        assert_eq!(index_of(device_id(1_234_567).as_str()), Some(1_234_567));
        assert_eq!(index_of("sim-42"), None);
        assert_eq!(index_of("pi-000042"), None);
        assert_eq!(index_of("sim-00004x"), None);
    }

    #[test]
    fn failures_are_the_fraction_spread_evenly() {
        let n = 10_000;
        assert_eq!((0..n).filter(|&i| fails(i, 0.05)).count(), 500);
        assert_eq!((0..n).filter(|&i| fails(i, 0.0)).count(), 0);
        assert_eq!((0..n).filter(|&i| fails(i, 1.0)).count(), n);
        // Spread: every block of 100 has its 5.
        assert!((0..100).all(|b| (b * 100..b * 100 + 100).filter(|&i| fails(i, 0.05)).count() == 5));
    }
}
