//! The limits table of `agent-upgrades.md`, as named constants with their units in the name or type.

use std::time::Duration;

/// HTTPS artifact download: TCP+TLS connect time-out.
pub const HTTPS_CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// HTTPS artifact download: the complete request, headers and body.
pub const HTTPS_REQUEST_TIMEOUT: Duration = Duration::from_secs(5 * 60);
/// Compiled ceiling on an agent artifact, in bytes (100 MiB). An attempt may set a lower limit.
pub const ARTIFACT_MAX_BYTES: u64 = 100 * 1024 * 1024;
/// One NATS connection attempt.
pub const NATS_CONNECT_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(15);
/// The window within which NATS connection attempts are retried before the agent exits.
pub const NATS_RETRY_WINDOW: Duration = Duration::from_secs(3 * 60);
/// The whole candidate `--self-test` probe.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(4 * 60);
/// systemd's `TimeoutStopSec` for `fleet-agent.service`.
pub const SYSTEMD_STOP_TIMEOUT: Duration = Duration::from_secs(60);
/// The updater's bound on `systemctl stop fleet-agent.service`.
pub const UPDATER_STOP_BOUND: Duration = Duration::from_secs(65);
/// systemd's `TimeoutStartSec` for `fleet-agent.service`.
pub const SYSTEMD_START_TIMEOUT: Duration = Duration::from_secs(4 * 60);
/// The updater's bound on `systemctl start fleet-agent.service`.
pub const UPDATER_START_BOUND: Duration = Duration::from_secs(4 * 60 + 15);
/// Time a socket client has to send one complete request line.
pub const SOCKET_REQUEST_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Time within which a status request is answered.
pub const SOCKET_STATUS_RESPONSE_TIMEOUT: Duration = Duration::from_secs(15);
/// Time within which an upgrade request is answered.
pub const SOCKET_UPGRADE_RESPONSE_TIMEOUT: Duration = Duration::from_secs(20 * 60);
/// Largest socket request or response frame in bytes, excluding the terminating newline (1 MiB).
pub const SOCKET_FRAME_MAX_BYTES: usize = 1024 * 1024;
/// Concurrent socket handlers; one more connection gets a `busy` answer.
pub const SOCKET_MAX_HANDLERS: usize = 32;
/// Transitions retained in a journal or status; the oldest are dropped first.
pub const MAX_TRANSITIONS: usize = 16;
/// Characters retained in a detail or error text.
pub const MAX_TEXT_CHARS: usize = 1024;
