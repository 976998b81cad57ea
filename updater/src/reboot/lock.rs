//! The FleetLock client: `pre-reboot` and `steady-state` against the configured server. Anything but a 200 —
//! including an unreachable server — means "no". `status` reads the server's status document (no lock taken).

use fleet_wire::fleetlock::{
    ClientParams, ErrorBody, LockRequest, ServerStatus, PRE_REBOOT_PATH, PROTOCOL_HEADER,
    STATUS_PATH, STEADY_STATE_PATH,
};
use std::time::Duration;

/// Largest status document read, in bytes.
const STATUS_MAX_BYTES: u64 = 1024 * 1024;

/// Who this client is in requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// App-specific machine id (never the raw machine id).
    pub id: String,
    /// Hostname, sent as an extension so the server can match members by name.
    pub hostname: Option<String>,
}

/// A FleetLock server.
pub struct LockClient {
    base: String,
    group: String,
    token: Option<String>,
    agent: ureq::Agent,
}

impl LockClient {
    /// A client for `server` (base URL) and `group`.
    pub fn new(server: &str, group: &str, token: Option<String>, timeout: Duration) -> Self {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(timeout))
            .http_status_as_error(false)
            .build()
            .into();
        Self {
            base: server.trim_end_matches('/').to_string(),
            group: group.to_string(),
            token,
            agent,
        }
    }

    fn post(&self, path: &str, who: &Identity) -> Result<(), String> {
        let body = serde_json::to_vec(&LockRequest {
            client_params: ClientParams {
                id: who.id.clone(),
                group: self.group.clone(),
                hostname: who.hostname.clone(),
            },
        })
        .map_err(|e| e.to_string())?;
        let url = format!("{}{path}", self.base);
        let mut req = self
            .agent
            .post(&url)
            .header(PROTOCOL_HEADER, "true")
            .content_type("application/json");
        if let Some(t) = &self.token {
            req = req.header("authorization", &format!("Bearer {t}"));
        }
        let mut resp = req
            .send(&body[..])
            .map_err(|e| format!("FleetLock server {} unreachable: {e}", self.base))?;
        let code = resp.status().as_u16();
        if code == 200 {
            return Ok(());
        }
        let text = resp
            .body_mut()
            .with_config()
            .limit(64 * 1024)
            .read_to_string()
            .unwrap_or_default();
        match serde_json::from_str::<ErrorBody>(&text) {
            Ok(e) => Err(format!("{}: {} ({})", path, e.kind.as_str(), e.value)),
            Err(_) => Err(format!("{path}: HTTP {code}")),
        }
    }

    /// Asks for a slot.
    pub fn pre_reboot(&self, who: &Identity) -> Result<(), String> {
        self.post(PRE_REBOOT_PATH, who)
    }

    /// Reads `GET /v1/status` with this client's credentials: reaches the server and proves the token without
    /// taking or giving back a slot.
    pub fn status(&self) -> Result<ServerStatus, String> {
        let url = format!("{}{STATUS_PATH}", self.base);
        let mut req = self.agent.get(&url);
        if let Some(t) = &self.token {
            req = req.header("authorization", &format!("Bearer {t}"));
        }
        let mut resp = req
            .call()
            .map_err(|e| format!("FleetLock server {} unreachable: {e}", self.base))?;
        let code = resp.status().as_u16();
        let text = resp
            .body_mut()
            .with_config()
            .limit(STATUS_MAX_BYTES)
            .read_to_string()
            .map_err(|e| format!("{STATUS_PATH}: HTTP {code}, body unreadable: {e}"))?;
        if code != 200 {
            return Err(match serde_json::from_str::<ErrorBody>(&text) {
                Ok(e) => format!("{STATUS_PATH}: {} ({})", e.kind.as_str(), e.value),
                Err(_) => format!(
                    "{STATUS_PATH}: HTTP {code} (is {} a FleetLock server?)",
                    self.base
                ),
            });
        }
        serde_json::from_str(&text).map_err(|e| {
            format!(
                "{STATUS_PATH}: not a FleetLock status document ({e}); is {} a FleetLock server?",
                self.base
            )
        })
    }

    /// Gives the slot back.
    pub fn steady_state(&self, who: &Identity) -> Result<(), String> {
        self.post(STEADY_STATE_PATH, who)
    }
}
