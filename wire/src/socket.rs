//! The updater's Unix socket protocol: one JSON object per line, one request and one response per connection.
//!
//! ```text
//! -> {"protocol":1,"request":{"op":"status"}}
//! <- {"protocol":1,"response":{"kind":"status","status":{...}}}
//! ```
//! Frames are at most [`SOCKET_FRAME_MAX_BYTES`] bytes plus the newline, both ways. `docs/socket-protocol.md` is
//! checked against these types by a test.

use crate::limits::SOCKET_FRAME_MAX_BYTES;
use crate::{
    AgentUpgradeAttempt, AgentUpgradeStatus, BoundedText, Capability, Id128, SystemUpgradeAttempt,
    SystemUpgradeStatus,
};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, Write};

/// The protocol version this build speaks.
pub const PROTOCOL_VERSION: u32 = 1;

/// The updater socket's directory, relative to the device root (`/run/fleet-updater`).
pub const UPDATER_RUN_DIR: &str = "run/fleet-updater";
/// The updater socket's file name in [`UPDATER_RUN_DIR`].
pub const UPDATER_SOCKET_NAME: &str = "updater.sock";

/// `<root>/run/fleet-updater/updater.sock`: where the updater listens and the agent connects (one definition for
/// both processes; `root` is `/` on a device and a temporary directory in tests).
pub fn updater_socket(root: &std::path::Path) -> std::path::PathBuf {
    root.join(UPDATER_RUN_DIR).join(UPDATER_SOCKET_NAME)
}

/// A request line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestFrame {
    /// Must equal [`PROTOCOL_VERSION`].
    pub protocol: u32,
    /// The request.
    pub request: Request,
}

/// What a client asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Request {
    /// Read-only: the current transactions. Always answered, also during preparation and recovery.
    /// (A struct variant so that unknown fields are refused, as for the others.)
    Status {},
    /// Start (or, with the same id and digest, look up) an agent upgrade. Mutating.
    Upgrade {
        /// The attempt, as read from NATS by the agent.
        attempt: AgentUpgradeAttempt,
    },
    /// Start (or look up) a system upgrade. Mutating.
    SystemUpgrade {
        /// The attempt, as read from NATS by the agent.
        attempt: SystemUpgradeAttempt,
    },
    /// Read-only: collect the items of a diagnostics request that the updater collects
    /// ([`crate::diagnostics::Collector::Updater`]); the others are ignored. Answered with
    /// [`Response::Diagnostics`].
    Diagnostics {
        /// The request, as read from NATS by the agent.
        request: crate::diagnostics::DiagnosticsRequest,
    },
}

impl Request {
    /// The `op` names this build understands.
    pub const OPS: [&'static str; 4] = ["status", "upgrade", "system-upgrade", "diagnostics"];

    /// True for requests that change state (one at a time).
    pub fn is_mutating(&self) -> bool {
        !matches!(self, Request::Status {} | Request::Diagnostics { .. })
    }
}

/// A response line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResponseFrame {
    /// The protocol version of the answer.
    pub protocol: u32,
    /// The response.
    pub response: Response,
}

/// The updater's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Response {
    /// The current transactions.
    Status {
        /// What the updater knows.
        status: UpdaterStatus,
    },
    /// The mutating request was accepted (or was already accepted: idempotent); here is the status after it.
    Accepted {
        /// What the updater knows.
        status: UpdaterStatus,
    },
    /// The sections of a [`Request::Diagnostics`], bounded as a bundle's ([`crate::diagnostics::Section::new`]).
    Diagnostics {
        /// One per item the updater collects, in [`crate::diagnostics::Item::ALL`]'s order.
        sections: Vec<crate::diagnostics::Section>,
    },
    /// The request was refused or failed.
    Error {
        /// What kind of error, for the client to branch on.
        code: ErrorCode,
        /// For a person.
        message: BoundedText,
    },
}

impl Response {
    /// An error response.
    pub fn error(code: ErrorCode, message: impl AsRef<str>) -> Self {
        Response::Error {
            code,
            message: BoundedText::lossy(message),
        }
    }
}

/// Error kinds on the socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ErrorCode {
    /// All handlers are busy, or another mutating request is running. Try again later.
    Busy,
    /// The request line exceeded 1 MiB.
    FrameTooLarge,
    /// No complete line arrived within the request-read time-out.
    Timeout,
    /// Not JSON, or not the shape of a request.
    Malformed,
    /// `protocol` is not one this updater speaks.
    UnsupportedProtocol,
    /// `op` is not one this updater knows.
    UnknownRequest,
    /// The peer is not root or a member of the `fleet-agent` group.
    Forbidden,
    /// The attempt failed validation (its message says which field).
    Invalid,
    /// The attempt id was seen before with other content.
    Conflict,
    /// The updater is quarantined (`rollback-failed`) and refuses every new attempt.
    Quarantined,
    /// The attempt's `expiresAt` passed before the updater accepted it: it never starts.
    Expired,
    /// Something failed inside the updater; see the journal.
    Internal,
}

/// Everything the updater reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UpdaterStatus {
    /// The updater's compiled version.
    pub updater_version: String,
    /// The device's current boot id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<Id128>,
    /// True while start-up recovery's stop/start is still running.
    pub recovering: bool,
    /// The current or last agent-upgrade transaction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_upgrade: Option<AgentUpgradeStatus>,
    /// The current or last system-upgrade transaction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_upgrade: Option<SystemUpgradeStatus>,
    /// What this updater can do (the agent advertises these). An older updater sends none: the agent then
    /// advertises only `AgentUpgradeV1`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capabilities: Vec<Capability>,
}

/// Why a request line could not be turned into a [`Request`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code:?}: {message}")]
pub struct RequestError {
    /// The code to answer with.
    pub code: ErrorCode,
    /// What was wrong.
    pub message: String,
}

/// Parses one request line (without its newline). Pure, total and bounded by the frame size already enforced.
pub fn parse_request(line: &[u8]) -> Result<Request, RequestError> {
    let fail = |code, message: String| RequestError { code, message };
    let value: serde_json::Value = serde_json::from_slice(line)
        .map_err(|e| fail(ErrorCode::Malformed, format!("not JSON: {e}")))?;
    let obj = value
        .as_object()
        .ok_or_else(|| fail(ErrorCode::Malformed, "not a JSON object".into()))?;
    match obj.get("protocol").and_then(serde_json::Value::as_u64) {
        Some(v) if v == u64::from(PROTOCOL_VERSION) => {}
        Some(v) => {
            return Err(fail(
                ErrorCode::UnsupportedProtocol,
                format!("protocol {v}; this updater speaks {PROTOCOL_VERSION}"),
            ))
        }
        None => {
            return Err(fail(
                ErrorCode::Malformed,
                "missing numeric \"protocol\"".into(),
            ))
        }
    }
    let op = obj
        .get("request")
        .and_then(|r| r.get("op"))
        .and_then(serde_json::Value::as_str)
        .ok_or_else(|| fail(ErrorCode::Malformed, "missing \"request\".\"op\"".into()))?
        .to_owned();
    if !Request::OPS.contains(&op.as_str()) {
        let shown: String = op.chars().take(64).flat_map(char::escape_debug).collect();
        return Err(fail(
            ErrorCode::UnknownRequest,
            format!("unknown op \"{shown}\"; known: {}", Request::OPS.join(", ")),
        ));
    }
    let frame: RequestFrame = serde_json::from_value(value)
        .map_err(|e| fail(ErrorCode::Invalid, format!("invalid {op} request: {e}")))?;
    Ok(frame.request)
}

/// Why reading a frame failed.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// More than the limit arrived before a newline.
    #[error("frame exceeds {limit} bytes")]
    TooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// The peer closed the connection in the middle of a line.
    #[error("connection closed after {received} bytes of an unfinished line")]
    Truncated {
        /// Bytes received.
        received: usize,
    },
    /// Reading failed (a socket time-out shows up here as `WouldBlock` or `TimedOut`).
    #[error("read failed: {0}")]
    Io(#[from] std::io::Error),
}

/// Reads one newline-terminated frame of at most `limit` bytes (newline excluded). `Ok(None)` on a clean EOF
/// before any byte. Never buffers more than `limit + 1` bytes of one frame.
pub fn read_frame<R: BufRead>(reader: &mut R, limit: usize) -> Result<Option<Vec<u8>>, FrameError> {
    let mut line = Vec::new();
    loop {
        let available = match reader.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        };
        if available.is_empty() {
            return if line.is_empty() {
                Ok(None)
            } else {
                Err(FrameError::Truncated {
                    received: line.len(),
                })
            };
        }
        let (chunk, done) = match available.iter().position(|&b| b == b'\n') {
            Some(i) => (&available[..i], Some(i + 1)),
            None => (available, None),
        };
        if line.len() + chunk.len() > limit {
            return Err(FrameError::TooLarge { limit });
        }
        line.extend_from_slice(chunk);
        let used = done.unwrap_or(chunk.len());
        reader.consume(used);
        if done.is_some() {
            return Ok(Some(line));
        }
    }
}

/// Why a frame could not be written.
#[derive(Debug, thiserror::Error)]
pub enum WriteFrameError {
    /// The serialized value exceeds the frame limit.
    #[error("frame of {size} bytes exceeds {limit} bytes")]
    TooLarge {
        /// Serialized size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// Serialization failed.
    #[error("serialize: {0}")]
    Json(#[from] serde_json::Error),
    /// Writing failed.
    #[error("write failed: {0}")]
    Io(#[from] std::io::Error),
}

/// Serializes `value` as one line of at most [`SOCKET_FRAME_MAX_BYTES`] and writes it with its newline.
pub fn write_frame<W: Write, T: Serialize>(
    writer: &mut W,
    value: &T,
) -> Result<(), WriteFrameError> {
    let mut bytes = serde_json::to_vec(value)?;
    if bytes.len() > SOCKET_FRAME_MAX_BYTES {
        return Err(WriteFrameError::TooLarge {
            size: bytes.len(),
            limit: SOCKET_FRAME_MAX_BYTES,
        });
    }
    bytes.push(b'\n');
    writer.write_all(&bytes)?;
    writer.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;
    use std::io::BufReader;

    fn frame(request: Request) -> Vec<u8> {
        serde_json::to_vec(&RequestFrame {
            protocol: PROTOCOL_VERSION,
            request,
        })
        .expect("json")
    }

    #[test]
    fn parses_each_request() {
        assert_eq!(
            parse_request(&frame(Request::Status {})),
            Ok(Request::Status {})
        );
        let up = Request::Upgrade {
            attempt: fixtures::attempt(),
        };
        assert_eq!(parse_request(&frame(up.clone())), Ok(up.clone()));
        assert!(up.is_mutating() && !Request::Status {}.is_mutating());
    }

    #[test]
    fn classifies_bad_requests() {
        let code = |s: &str| parse_request(s.as_bytes()).expect_err(s).code;
        assert_eq!(code("{"), ErrorCode::Malformed);
        assert_eq!(code("[]"), ErrorCode::Malformed);
        assert_eq!(code(r#"{"request":{"op":"status"}}"#), ErrorCode::Malformed);
        assert_eq!(
            code(r#"{"protocol":2,"request":{"op":"status"}}"#),
            ErrorCode::UnsupportedProtocol
        );
        assert_eq!(
            code(r#"{"protocol":1,"request":{"op":"reboot"}}"#),
            ErrorCode::UnknownRequest
        );
        assert_eq!(
            code(r#"{"protocol":1,"request":{"op":"status","x":1}}"#),
            ErrorCode::Invalid
        );
        assert_eq!(
            code(r#"{"protocol":1,"request":{"op":"status"},"x":1}"#),
            ErrorCode::Invalid
        );
        assert_eq!(
            code(r#"{"protocol":1,"request":{"op":"upgrade","attempt":{}}}"#),
            ErrorCode::Invalid
        );
    }

    #[test]
    fn frames_are_bounded() {
        let limit = SOCKET_FRAME_MAX_BYTES;
        let mut ok = vec![b'x'; limit];
        ok.push(b'\n');
        let got = read_frame(&mut BufReader::new(&ok[..]), limit).expect("read");
        assert_eq!(got.map(|l| l.len()), Some(limit));
        let mut over = vec![b'x'; limit + 1];
        over.push(b'\n');
        assert!(matches!(
            read_frame(&mut BufReader::new(&over[..]), limit),
            Err(FrameError::TooLarge { .. })
        ));
        assert!(matches!(
            read_frame(&mut BufReader::new(&b"half"[..]), limit),
            Err(FrameError::Truncated { received: 4 })
        ));
        assert!(matches!(
            read_frame(&mut BufReader::new(&b""[..]), limit),
            Ok(None)
        ));
        let mut two = BufReader::with_capacity(3, &b"ab\ncd\n"[..]);
        assert_eq!(read_frame(&mut two, 8).expect("1"), Some(b"ab".to_vec()));
        assert_eq!(read_frame(&mut two, 8).expect("2"), Some(b"cd".to_vec()));
    }

    #[test]
    fn write_frame_refuses_oversize() {
        let big = Response::Status {
            status: UpdaterStatus {
                updater_version: "x".repeat(SOCKET_FRAME_MAX_BYTES),
                boot_id: None,
                recovering: false,
                agent_upgrade: None,
                system_upgrade: None,
                capabilities: Vec::new(),
            },
        };
        let mut out = Vec::new();
        assert!(matches!(
            write_frame(&mut out, &big),
            Err(WriteFrameError::TooLarge { .. })
        ));
        assert!(out.is_empty());
    }
}
