//! The candidate probe's report: `fleet-agent --self-test` prints exactly one JSON line of this shape on stdout,
//! and the updater parses it to check the compiled version and the result.

use crate::{BoundedText, Version};
use serde::{Deserialize, Serialize};

/// Largest self-test report the updater reads, in bytes.
pub const SELF_TEST_REPORT_MAX_BYTES: usize = 64 * 1024;
/// Most checks in one report.
pub const SELF_TEST_MAX_CHECKS: usize = 32;

/// One check of the probe, in the order the seed's probe paragraph lists them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SelfTestCheck {
    /// A stable name, e.g. `config`, `podman`, `nats`, `buckets`, `device-keys`, `watch`, `updater-socket`,
    /// `snapshot`.
    pub name: String,
    /// Whether it passed.
    pub ok: bool,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<BoundedText>,
}

/// The whole report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SelfTestReport {
    /// The candidate's compiled version; the updater requires it to equal the attempt's target.
    pub version: Version,
    /// True only if every check passed (the process also exits 0 only then).
    pub passed: bool,
    /// The checks run, in order; the first failed one stops the probe.
    pub checks: Vec<SelfTestCheck>,
}

impl SelfTestReport {
    /// The first failed check, if any.
    pub fn first_failure(&self) -> Option<&SelfTestCheck> {
        self.checks.iter().find(|c| !c.ok)
    }

    /// Parses a report line, rejecting oversize input and inconsistent results (`passed` with a failed check).
    pub fn parse(line: &[u8]) -> Result<Self, crate::ValidationError> {
        let err = |why: String| crate::ValidationError::new("self-test report", why);
        if line.len() > SELF_TEST_REPORT_MAX_BYTES {
            return Err(err(format!(
                "longer than {SELF_TEST_REPORT_MAX_BYTES} bytes"
            )));
        }
        let r: SelfTestReport = serde_json::from_slice(line).map_err(|e| err(e.to_string()))?;
        if r.checks.len() > SELF_TEST_MAX_CHECKS {
            return Err(err(format!("more than {SELF_TEST_MAX_CHECKS} checks")));
        }
        if r.passed != r.checks.iter().all(|c| c.ok) || (r.passed && r.checks.is_empty()) {
            return Err(err("`passed` disagrees with the checks".into()));
        }
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_checks_consistency() {
        let ok = r#"{"version":"1.2.0","passed":true,"checks":[{"name":"config","ok":true}]}"#;
        assert!(SelfTestReport::parse(ok.as_bytes()).is_ok());
        let liar = r#"{"version":"1.2.0","passed":true,"checks":[{"name":"nats","ok":false,"error":"refused"}]}"#;
        assert!(SelfTestReport::parse(liar.as_bytes()).is_err());
        let empty = r#"{"version":"1.2.0","passed":true,"checks":[]}"#;
        assert!(SelfTestReport::parse(empty.as_bytes()).is_err());
        let failed = r#"{"version":"1.2.0","passed":false,"checks":[{"name":"nats","ok":false,"error":"refused"}]}"#;
        let r = SelfTestReport::parse(failed.as_bytes()).expect("parses");
        assert_eq!(r.first_failure().map(|c| c.name.as_str()), Some("nats"));
    }
}
