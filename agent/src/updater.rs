//! Client of the updater's Unix socket (`fleet_wire::socket`): one request per connection, bounded frames and
//! explicit time-outs (10 s to write, 15 s for a status answer, 20 min for an upgrade answer).

use fleet_wire::limits::{
    SOCKET_FRAME_MAX_BYTES, SOCKET_REQUEST_READ_TIMEOUT, SOCKET_STATUS_RESPONSE_TIMEOUT,
    SOCKET_UPGRADE_RESPONSE_TIMEOUT,
};
use fleet_wire::socket::{read_frame, write_frame, PROTOCOL_VERSION};
use fleet_wire::{
    AgentUpgradeAttempt, Request, RequestFrame, Response, ResponseFrame, SystemUpgradeAttempt,
    UpdaterStatus,
};
use std::io::BufReader;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Why a socket exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum UpdaterError {
    /// Connecting, writing or reading failed (a time-out included).
    #[error("updater socket {path}: {message}")]
    Io {
        /// The socket.
        path: PathBuf,
        /// What failed.
        message: String,
    },
    /// The answer was not a response frame of this protocol.
    #[error("updater socket {path}: bad answer: {message}")]
    Protocol {
        /// The socket.
        path: PathBuf,
        /// What was wrong.
        message: String,
    },
}

/// A client for one socket path.
#[derive(Debug, Clone)]
pub struct UpdaterClient {
    path: PathBuf,
}

impl UpdaterClient {
    /// A client of the socket at `path`.
    pub fn new(path: &Path) -> Self {
        Self {
            path: path.to_owned(),
        }
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn exchange(
        &self,
        request: Request,
        answer_within: Duration,
    ) -> Result<Response, UpdaterError> {
        let io = |what: &str, e: &dyn std::fmt::Display| UpdaterError::Io {
            path: self.path.clone(),
            message: format!("{what}: {e}"),
        };
        let mut s = UnixStream::connect(&self.path).map_err(|e| io("connect", &e))?;
        s.set_write_timeout(Some(SOCKET_REQUEST_READ_TIMEOUT))
            .map_err(|e| io("set time-out", &e))?;
        s.set_read_timeout(Some(answer_within))
            .map_err(|e| io("set time-out", &e))?;
        write_frame(
            &mut s,
            &RequestFrame {
                protocol: PROTOCOL_VERSION,
                request,
            },
        )
        .map_err(|e| io("write request", &e))?;
        let mut r = BufReader::new(s);
        let line = read_frame(&mut r, SOCKET_FRAME_MAX_BYTES)
            .map_err(|e| io("read answer", &e))?
            .ok_or_else(|| UpdaterError::Protocol {
                path: self.path.clone(),
                message: "closed without an answer".into(),
            })?;
        let frame: ResponseFrame =
            serde_json::from_slice(&line).map_err(|e| UpdaterError::Protocol {
                path: self.path.clone(),
                message: e.to_string(),
            })?;
        if frame.protocol != PROTOCOL_VERSION {
            return Err(UpdaterError::Protocol {
                path: self.path.clone(),
                message: format!("protocol {}", frame.protocol),
            });
        }
        Ok(frame.response)
    }

    /// The updater's status (read-only; answered within 15 s).
    pub fn status(&self) -> Result<UpdaterStatus, UpdaterError> {
        match self.exchange(Request::Status {}, SOCKET_STATUS_RESPONSE_TIMEOUT)? {
            Response::Status { status } | Response::Accepted { status } => Ok(status),
            Response::Error { code, message } => Err(UpdaterError::Protocol {
                path: self.path.clone(),
                message: format!("status refused: {code:?}: {message}"),
            }),
            Response::Diagnostics { .. } => Err(UpdaterError::Protocol {
                path: self.path.clone(),
                message: "answered a status request with diagnostics".into(),
            }),
        }
    }

    /// The sections of a diagnostics request that the updater collects (read-only; answered within 15 s).
    pub fn diagnostics(
        &self,
        request: fleet_wire::diagnostics::DiagnosticsRequest,
    ) -> Result<Vec<fleet_wire::diagnostics::Section>, UpdaterError> {
        match self.exchange(
            Request::Diagnostics { request },
            SOCKET_STATUS_RESPONSE_TIMEOUT,
        )? {
            Response::Diagnostics { sections } => Ok(sections),
            Response::Error { code, message } => Err(UpdaterError::Protocol {
                path: self.path.clone(),
                message: format!("diagnostics refused: {code:?}: {message}"),
            }),
            Response::Status { .. } | Response::Accepted { .. } => Err(UpdaterError::Protocol {
                path: self.path.clone(),
                message: "answered a diagnostics request with a status".into(),
            }),
        }
    }

    /// Sends one upgrade request and waits (up to 20 min) for the answer.
    pub fn upgrade(&self, attempt: AgentUpgradeAttempt) -> Result<Response, UpdaterError> {
        self.exchange(
            Request::Upgrade { attempt },
            SOCKET_UPGRADE_RESPONSE_TIMEOUT,
        )
    }

    /// Sends one system-upgrade request (the updater answers once it journaled the attempt, or refuses it).
    pub fn system_upgrade(&self, attempt: SystemUpgradeAttempt) -> Result<Response, UpdaterError> {
        self.exchange(
            Request::SystemUpgrade { attempt },
            SOCKET_UPGRADE_RESPONSE_TIMEOUT,
        )
    }
}
