//! Workload health checks: what a `WorkloadSpec`'s `healthCheck` asks for (a command run in the container by
//! Podman's native healthcheck, or an HTTP or TCP probe the agent runs against the published host port), its
//! timing with defaults and bounds, and the health a `WorkloadStatus` reports.
//!
//! JSON shape: exactly one of `command`, `http`, `tcp`, plus the timing fields, e.g.
//! `{"http": {"port": 8080, "path": "/healthz"}, "intervalSeconds": 10}`. The timing fields are always written
//! (defaults filled in), so a spec that leaves them out and one that spells the defaults have one digest.

use crate::error::shown;
use crate::workload::{PortMapping, Protocol};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Default seconds between two checks.
pub const HEALTH_INTERVAL_DEFAULT_SECS: u32 = 30;
/// Fewest seconds between two checks: the agent's wake-up budget (at most one a second) holds with 64 checked
/// workloads.
pub const HEALTH_INTERVAL_MIN_SECS: u32 = 5;
/// Most seconds between two checks (an hour).
pub const HEALTH_INTERVAL_MAX_SECS: u32 = 3600;
/// Default seconds one check may take before it counts as failed.
pub const HEALTH_TIMEOUT_DEFAULT_SECS: u32 = 5;
/// Fewest seconds one check may take.
pub const HEALTH_TIMEOUT_MIN_SECS: u32 = 1;
/// Most seconds one check may take (and never more than the interval).
pub const HEALTH_TIMEOUT_MAX_SECS: u32 = 60;
/// Default consecutive failed checks that make a workload unhealthy.
pub const HEALTH_RETRIES_DEFAULT: u32 = 3;
/// Fewest consecutive failed checks that make a workload unhealthy.
pub const HEALTH_RETRIES_MIN: u32 = 1;
/// Most consecutive failed checks that make a workload unhealthy.
pub const HEALTH_RETRIES_MAX: u32 = 10;
/// Default seconds after a container's start during which failed checks do not count (it is `starting`).
pub const HEALTH_START_PERIOD_DEFAULT_SECS: u32 = 0;
/// Most seconds of start period (an hour).
pub const HEALTH_START_PERIOD_MAX_SECS: u32 = 3600;
/// Most arguments of a health-check command.
pub const HEALTH_COMMAND_MAX_ARGS: usize = 32;
/// Longest argument of a health-check command, in bytes.
pub const HEALTH_COMMAND_MAX_ARG_BYTES: usize = 1024;
/// Longest HTTP health-check path, in bytes.
pub const HEALTH_HTTP_PATH_MAX_BYTES: usize = 1024;

/// What one check does.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum HealthProbe {
    /// Run this command (argv, no shell: write `["sh", "-c", "…"]` for one) in the container; exit code 0 is
    /// healthy. Podman runs it (its native healthcheck, shown by `podman ps`).
    Command(Vec<String>),
    /// `GET path` on the host port that publishes `port`; a 2xx or 3xx answer is healthy. The agent runs it.
    Http(HttpProbe),
    /// A TCP connection to the host port that publishes `port` is accepted. The agent runs it.
    Tcp(TcpProbe),
}

/// An HTTP probe.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpProbe {
    /// The container port; the workload must publish it (TCP) in `ports`.
    pub port: u16,
    /// The request path, `/` by default: printable ASCII without spaces, starting with `/`.
    #[serde(default = "root_path")]
    pub path: String,
}

fn root_path() -> String {
    "/".into()
}

/// A TCP probe.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TcpProbe {
    /// The container port; the workload must publish it (TCP) in `ports`.
    pub port: u16,
}

/// A workload's health check, the way Podman runs one: a probe every `interval_seconds`, each bounded by
/// `timeout_seconds`; `retries` consecutive failures make the workload unhealthy; failures within
/// `start_period_seconds` of the container's start do not count. Bounds: [`HealthCheck::check`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "RawHealthCheck", into = "RawHealthCheck")]
pub struct HealthCheck {
    /// What a check does.
    pub probe: HealthProbe,
    /// Seconds between two checks.
    pub interval_seconds: u32,
    /// Seconds one check may take.
    pub timeout_seconds: u32,
    /// Consecutive failures that make the workload unhealthy.
    pub retries: u32,
    /// Seconds after the container's start during which failures do not count.
    pub start_period_seconds: u32,
}

/// The JSON shape: one of the three kinds, the timing fields optional on input and always written on output.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct RawHealthCheck {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    command: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    http: Option<HttpProbe>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tcp: Option<TcpProbe>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    interval_seconds: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    timeout_seconds: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    retries: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    start_period_seconds: Option<u32>,
}

impl TryFrom<RawHealthCheck> for HealthCheck {
    type Error = String;
    /// The shape only (one kind); bounds are checked by [`HealthCheck::check`] from `WorkloadSpec::validate`,
    /// which knows the published ports.
    fn try_from(r: RawHealthCheck) -> Result<Self, String> {
        let probe = match (r.command, r.http, r.tcp) {
            (Some(c), None, None) => HealthProbe::Command(c),
            (None, Some(h), None) => HealthProbe::Http(h),
            (None, None, Some(t)) => HealthProbe::Tcp(t),
            _ => return Err("needs exactly one of command, http or tcp".into()),
        };
        Ok(HealthCheck {
            probe,
            interval_seconds: r.interval_seconds.unwrap_or(HEALTH_INTERVAL_DEFAULT_SECS),
            timeout_seconds: r.timeout_seconds.unwrap_or(HEALTH_TIMEOUT_DEFAULT_SECS),
            retries: r.retries.unwrap_or(HEALTH_RETRIES_DEFAULT),
            start_period_seconds: r
                .start_period_seconds
                .unwrap_or(HEALTH_START_PERIOD_DEFAULT_SECS),
        })
    }
}

impl From<HealthCheck> for RawHealthCheck {
    fn from(h: HealthCheck) -> Self {
        let (command, http, tcp) = match h.probe {
            HealthProbe::Command(c) => (Some(c), None, None),
            HealthProbe::Http(p) => (None, Some(p), None),
            HealthProbe::Tcp(p) => (None, None, Some(p)),
        };
        RawHealthCheck {
            command,
            http,
            tcp,
            interval_seconds: Some(h.interval_seconds),
            timeout_seconds: Some(h.timeout_seconds),
            retries: Some(h.retries),
            start_period_seconds: Some(h.start_period_seconds),
        }
    }
}

impl HealthCheck {
    /// A check of `probe` with the default timing.
    pub fn new(probe: HealthProbe) -> Self {
        HealthCheck {
            probe,
            interval_seconds: HEALTH_INTERVAL_DEFAULT_SECS,
            timeout_seconds: HEALTH_TIMEOUT_DEFAULT_SECS,
            retries: HEALTH_RETRIES_DEFAULT,
            start_period_seconds: HEALTH_START_PERIOD_DEFAULT_SECS,
        }
    }

    /// Checks the bounds, and that an HTTP or TCP probe's port is published (TCP) by `ports`. The error starts
    /// with the failing field's path below `healthCheck` (`intervalSeconds: …`, `http.port: …`). Pure.
    pub fn check(&self, ports: &[PortMapping]) -> Result<(), String> {
        let range = |field: &str, v: u32, min: u32, max: u32| {
            if (min..=max).contains(&v) {
                Ok(())
            } else {
                Err(format!("{field}: {v} is outside {min}–{max}"))
            }
        };
        range(
            "intervalSeconds",
            self.interval_seconds,
            HEALTH_INTERVAL_MIN_SECS,
            HEALTH_INTERVAL_MAX_SECS,
        )?;
        range(
            "timeoutSeconds",
            self.timeout_seconds,
            HEALTH_TIMEOUT_MIN_SECS,
            HEALTH_TIMEOUT_MAX_SECS,
        )?;
        if self.timeout_seconds > self.interval_seconds {
            return Err(format!(
                "timeoutSeconds: {} is longer than intervalSeconds ({}); a check must end before the next one",
                self.timeout_seconds, self.interval_seconds
            ));
        }
        range(
            "retries",
            self.retries,
            HEALTH_RETRIES_MIN,
            HEALTH_RETRIES_MAX,
        )?;
        range(
            "startPeriodSeconds",
            self.start_period_seconds,
            0,
            HEALTH_START_PERIOD_MAX_SECS,
        )?;
        let published = |kind: &str, port: u16| {
            let tcp = |p: &&PortMapping| p.container_port == port && p.protocol == Protocol::Tcp;
            if port == 0 {
                Err(format!("{kind}.port: must be 1–65535"))
            } else if !ports.iter().any(|p| tcp(&p)) {
                Err(format!(
                    "{kind}.port: container port {port} is not published: the agent probes the host port that \
                     publishes it, so add a ports entry with containerPort {port} (tcp)"
                ))
            } else {
                Ok(())
            }
        };
        match &self.probe {
            HealthProbe::Command(argv) => {
                if argv.is_empty() || argv.len() > HEALTH_COMMAND_MAX_ARGS {
                    return Err(format!(
                        "command: needs 1–{HEALTH_COMMAND_MAX_ARGS} arguments, has {}",
                        argv.len()
                    ));
                }
                if argv[0].is_empty() {
                    return Err("command: the program (first argument) is empty".into());
                }
                if let Some((i, a)) = argv
                    .iter()
                    .enumerate()
                    .find(|(_, a)| a.len() > HEALTH_COMMAND_MAX_ARG_BYTES || a.contains('\0'))
                {
                    return Err(format!(
                        "command[{i}]: {} is over {HEALTH_COMMAND_MAX_ARG_BYTES} bytes or has a NUL",
                        shown(a)
                    ));
                }
                Ok(())
            }
            HealthProbe::Http(h) => {
                published("http", h.port)?;
                let ok = h.path.starts_with('/')
                    && h.path.len() <= HEALTH_HTTP_PATH_MAX_BYTES
                    && h.path.bytes().all(|b| (0x21..0x7f).contains(&b));
                if !ok {
                    return Err(format!(
                        "http.path: {} must start with '/' and be at most {HEALTH_HTTP_PATH_MAX_BYTES} printable \
                         ASCII characters without spaces",
                        shown(&h.path)
                    ));
                }
                Ok(())
            }
            HealthProbe::Tcp(t) => published("tcp", t.port),
        }
    }

    /// True when Podman runs the check (a command in the container); false when the agent does (HTTP, TCP).
    pub fn runs_in_podman(&self) -> bool {
        matches!(self.probe, HealthProbe::Command(_))
    }

    /// The interval.
    pub fn interval(&self) -> Duration {
        Duration::from_secs(self.interval_seconds.into())
    }

    /// The bound of one check.
    pub fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout_seconds.into())
    }

    /// The start period.
    pub fn start_period(&self) -> Duration {
        Duration::from_secs(self.start_period_seconds.into())
    }

    /// The container port an HTTP or TCP probe targets.
    pub fn port(&self) -> Option<u16> {
        match &self.probe {
            HealthProbe::Command(_) => None,
            HealthProbe::Http(h) => Some(h.port),
            HealthProbe::Tcp(t) => Some(t.port),
        }
    }
}

/// A workload's health, as Podman names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HealthState {
    /// Within the start period, or no check has decided yet.
    Starting,
    /// The latest check passed.
    Healthy,
    /// `retries` consecutive checks failed.
    Unhealthy,
    /// A value this reader does not know (written by a newer agent).
    #[serde(other)]
    Unknown,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(container: u16, protocol: Protocol) -> PortMapping {
        PortMapping {
            host_port: 18080,
            container_port: container,
            protocol,
        }
    }

    #[test]
    fn json_shape_defaults_and_kinds() {
        let h: HealthCheck = serde_json::from_str(r#"{"http": {"port": 8080}}"#).expect("http");
        assert_eq!(
            h.probe,
            HealthProbe::Http(HttpProbe {
                port: 8080,
                path: "/".into()
            })
        );
        assert_eq!(
            (
                h.interval_seconds,
                h.timeout_seconds,
                h.retries,
                h.start_period_seconds
            ),
            (30, 5, 3, 0)
        );
        // Defaults are written out: leaving them out and spelling them give one JSON, hence one digest.
        let spelled: HealthCheck = serde_json::from_str(
            r#"{"http": {"port": 8080, "path": "/"}, "intervalSeconds": 30, "timeoutSeconds": 5, "retries": 3, "startPeriodSeconds": 0}"#,
        )
        .expect("spelled");
        assert_eq!(
            serde_json::to_string(&h).expect("json"),
            serde_json::to_string(&spelled).expect("json")
        );
        for bad in [
            r#"{}"#,
            r#"{"command": ["true"], "tcp": {"port": 1}}"#,
            r#"{"tcp": {"port": 1}, "intervall": 3}"#,
            r#"{"tcp": {"port": 1, "host": "x"}}"#,
            r#"{"http": {"port": -1}}"#,
        ] {
            assert!(serde_json::from_str::<HealthCheck>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn bounds_name_the_field() {
        let ports = [port(8080, Protocol::Tcp), port(53, Protocol::Udp)];
        let http = HealthCheck::new(HealthProbe::Http(HttpProbe {
            port: 8080,
            path: "/healthz".into(),
        }));
        assert_eq!(http.check(&ports), Ok(()));
        let cases: Vec<(HealthCheck, &str)> = vec![
            (
                HealthCheck {
                    interval_seconds: 4,
                    ..http.clone()
                },
                "intervalSeconds: 4 is outside 5–3600",
            ),
            (
                HealthCheck {
                    timeout_seconds: 0,
                    ..http.clone()
                },
                "timeoutSeconds: 0 is outside 1–60",
            ),
            (
                HealthCheck {
                    interval_seconds: 10,
                    timeout_seconds: 11,
                    ..http.clone()
                },
                "timeoutSeconds: 11 is longer than intervalSeconds (10)",
            ),
            (
                HealthCheck {
                    retries: 0,
                    ..http.clone()
                },
                "retries: 0 is outside 1–10",
            ),
            (
                HealthCheck {
                    start_period_seconds: 3601,
                    ..http.clone()
                },
                "startPeriodSeconds: 3601",
            ),
            (
                HealthCheck::new(HealthProbe::Http(HttpProbe {
                    port: 9090,
                    path: "/".into(),
                })),
                "http.port: container port 9090 is not published",
            ),
            (
                HealthCheck::new(HealthProbe::Tcp(TcpProbe { port: 53 })),
                "tcp.port: container port 53 is not published",
            ),
            (
                HealthCheck::new(HealthProbe::Tcp(TcpProbe { port: 0 })),
                "tcp.port: must be 1–65535",
            ),
            (
                HealthCheck::new(HealthProbe::Http(HttpProbe {
                    port: 8080,
                    path: "/a b\r\n".into(),
                })),
                "http.path:",
            ),
            (
                HealthCheck::new(HealthProbe::Http(HttpProbe {
                    port: 8080,
                    path: "healthz".into(),
                })),
                "http.path:",
            ),
            (
                HealthCheck::new(HealthProbe::Command(vec![])),
                "command: needs 1–32 arguments, has 0",
            ),
            (
                HealthCheck::new(HealthProbe::Command(vec!["x".into(); 33])),
                "command: needs 1–32 arguments, has 33",
            ),
            (
                HealthCheck::new(HealthProbe::Command(vec!["".into()])),
                "command: the program",
            ),
            (
                HealthCheck::new(HealthProbe::Command(vec!["sh".into(), "a\0".into()])),
                "command[1]:",
            ),
            (
                HealthCheck::new(HealthProbe::Command(vec!["y".repeat(1025)])),
                "command[0]:",
            ),
        ];
        for (h, want) in cases {
            let e = h.check(&ports).expect_err(want);
            assert!(e.starts_with(want), "{e} (wanted {want})");
        }
        let cmd = HealthCheck::new(HealthProbe::Command(vec!["pg_isready".into()]));
        assert_eq!(cmd.check(&[]), Ok(()), "a command needs no port");
        assert!(cmd.runs_in_podman() && !http.runs_in_podman());
        assert_eq!(http.port(), Some(8080));
    }

    #[test]
    fn an_unknown_health_state_is_tolerated() {
        let s: HealthState = serde_json::from_str(r#""degraded""#).expect("tolerant");
        assert_eq!(s, HealthState::Unknown);
        assert_eq!(
            serde_json::to_string(&HealthState::Unhealthy).expect("json"),
            r#""unhealthy""#
        );
    }
}
