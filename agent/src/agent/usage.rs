//! The event loop's part in the device's usage ([`crate::usage`]): on the heartbeat's tick, measure and publish
//! `device-usage/<device>` when [`Publisher`] says so. The bucket is optional (an operator older than this agent
//! has not made it): it is looked for at start and at each resync, and its absence, a refused write (a
//! nats-server whose configuration predates the bucket answers with no responders) or a path that cannot be
//! measured is logged once and never stops the agent.

use super::Agent;
use crate::nats_kv::Buckets;
use crate::usage::{measure, Publisher, Sources};
use fleet_wire::kv;
use fleet_wire::usage::FilesystemRole;
use std::collections::BTreeSet;
use std::time::Instant;

/// The usage state of the agent.
#[derive(Default)]
pub(super) struct Usage {
    /// The bucket, once it exists.
    kv: Option<Buckets>,
    /// Podman's storage, once Podman said where it is.
    containers: Option<std::path::PathBuf>,
    publisher: Publisher,
    /// Said once each until it changes: the bucket missing, a failed write, a role not measured, no memory.
    missing_logged: bool,
    put_failing: bool,
    failed_roles: BTreeSet<FilesystemRole>,
    unmeasured_logged: bool,
}

impl Agent {
    /// Opens the `device-usage` bucket when it exists; called at start and at each resync.
    pub(super) fn open_usage(&mut self) {
        if self.usage.kv.is_some() {
            return;
        }
        let opened = self.nats.open_buckets(&[kv::DEVICE_USAGE]);
        self.usage_opened(opened);
    }

    /// Whether the `device-usage` bucket is still to be looked for.
    pub(super) fn usage_unopened(&self) -> bool {
        self.usage.kv.is_none()
    }

    /// Takes the `device-usage` bucket when it was opened (or says once why not).
    pub(super) fn usage_opened(&mut self, opened: Result<Buckets, crate::nats_kv::NatsError>) {
        if self.usage.kv.is_some() {
            return;
        }
        match opened {
            Ok(b) => {
                if self.usage.missing_logged {
                    log::info!(
                        "the {} bucket exists now: reporting usage",
                        kv::DEVICE_USAGE
                    );
                }
                self.usage.kv = Some(b);
            }
            Err(e) if !self.usage.missing_logged => {
                log::info!("the device's usage is not reported: {e}; looking again at each resync");
                self.usage.missing_logged = true;
            }
            Err(_) => {}
        }
    }

    /// Measures, and publishes when it is due (on the heartbeat's tick and at start).
    pub(super) fn report_usage(&mut self) {
        let Some(bucket) = self.usage.kv.clone() else {
            return;
        };
        if self.usage.containers.is_none() {
            // Asked until Podman answers (once, normally): the path is Podman's to say, not configured.
            if let Some(p) = &self.podman {
                match p.graph_root(std::time::Duration::from_secs(10)) {
                    Ok(root) => self.usage.containers = Some(root.into()),
                    Err(e) => log::debug!("Podman's storage path: {e}"),
                }
            }
        }
        let sources = Sources {
            root: self.cfg.root.clone(),
            agent_state: self.paths.state_dir(),
            containers: self.usage.containers.clone(),
            proc: "/proc".into(),
        };
        let m = measure(&self.cfg.device_id, &sources);
        for (role, why) in m.failed {
            if self.usage.failed_roles.insert(role) {
                log::warn!("usage: {role:?} left out: {why}");
            }
        }
        let u = match m.usage {
            Ok(u) => u,
            Err(e) => {
                if !self.usage.unmeasured_logged {
                    log::warn!("usage not reported: {e}");
                    self.usage.unmeasured_logged = true;
                }
                return;
            }
        };
        let now = Instant::now();
        if !self.usage.publisher.due(&u, now) {
            return;
        }
        let ok = match super::put_json(&bucket, kv::DEVICE_USAGE, &self.key, &u) {
            Ok(_) => {
                if std::mem::take(&mut self.usage.put_failing) {
                    log::info!("usage reported again");
                }
                true
            }
            Err(e) => {
                if !std::mem::replace(&mut self.usage.put_failing, true) {
                    log::warn!("reporting usage: {e}; trying again at most every 15 s");
                }
                false
            }
        };
        self.usage.publisher.attempted(u, now, ok);
    }
}
