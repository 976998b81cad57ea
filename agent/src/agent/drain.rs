//! The drain on SIGTERM: the acknowledged `stopping` status when an upgrade attempt is in progress, then the
//! final NATS flush and `STOPPING=1`.

use super::{Agent, AgentError, DRAIN_FLUSH_TIMEOUT};
use crate::relay::agent_upgrade;
use fleet_wire::Timestamp;
use std::time::Instant;

impl Agent {
    /// SIGTERM: mutations are no longer admitted (the flag was set by the signal thread) and the current one has
    /// finished (the main loop waited for the workload worker). During a cutover (or with an attempt in progress) publish the
    /// acknowledged `stopping` status; otherwise only log the drain. Then flush, notify, exit.
    pub(super) fn drain(&mut self, signalled: Instant) -> Result<(), AgentError> {
        let drain_ms = u64::try_from(signalled.elapsed().as_millis()).unwrap_or(u64::MAX);
        let current = self
            .updater
            .status()
            .ok()
            .and_then(|st| st.agent_upgrade)
            .filter(|s| s.device_id == self.cfg.device_id);
        let (reason, status) =
            agent_upgrade::stopping_status(current, &self.version, drain_ms, Timestamp::now());
        let Some(s) = status else {
            log::info!(
                "drained in {drain_ms} ms ({reason:?}); no upgrade attempt in progress, agent-upgrade-status left as it is"
            );
            return self.finish_drain();
        };
        match self.put_upgrade_status(&s) {
            // No revision: behind fleet-auth's device API an acknowledgement carries none (docs/auth.md).
            Ok(_) => log::info!("stopping status ({reason:?}, drain {drain_ms} ms) acknowledged"),
            Err(e) => log::warn!("stopping status not acknowledged: {e}"),
        }
        self.finish_drain()
    }

    /// The end of every drain: flush NATS, notify STOPPING=1, exit.
    pub(super) fn finish_drain(&mut self) -> Result<(), AgentError> {
        if let Err(e) = self.nats.flush(DRAIN_FLUSH_TIMEOUT) {
            log::warn!("NATS flush: {e}");
        }
        if let Err(e) = crate::notify::notify("STOPPING=1") {
            log::warn!("STOPPING=1: {e}");
        }
        log::info!("drained; exiting");
        Ok(())
    }
}
