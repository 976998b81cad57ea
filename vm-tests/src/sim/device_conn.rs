//! A simulated device's own NATS connection through the fleet-auth callout (`fleet-sim --token-dir`), used as
//! fleet-agent uses its connection with a device token (agent/src/nats_kv.rs): it connects with the token in
//! `<dir>/<device-id>` (read again at every connection, like the agent's token file), subscribes only below its
//! own inbox `_INBOX.device.<id>.<token>`, writes a key by publishing to `$KV.<bucket>.<key>` with a reply there
//! (fleet-auth's device API writes it and answers with JetStream's acknowledgement), registers that inbox with the
//! device API for notices of the keys the operator writes for it (again every `WATCH_REFRESH`), and reads a
//! noticed key with a direct get. After every connection it reads its watched keys, as the agent's watches do.
//! Everything that arrives comes on its one subscription `<inbox>.>`: `<inbox>.ack.<n>` answers write `n`,
//! `<inbox>.get` a direct get, and `<inbox>.<bucket>.<key>` is a notice. (The agent has separate tokens for
//! replies and notices; one inbox for both costs a simulated device one subscription instead of several, and the
//! server the same checks.)
//!
//! This file holds what the group's driver sees of a device (online or not, its writes, whether it is back);
//! the connection itself, its phases and its reconnection live in [`crate::sim::device_io`], on its group's one
//! I/O thread.

use crate::sim::device_io::Mailbox;
use fleet_wire::auth::NATS_TOKEN_MAX_BYTES;
use fleet_wire::DeviceId;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One device: what the driver sees of its connection, and what the I/O thread needs to make one.
pub struct DeviceConn {
    id: DeviceId,
    /// Its index in its group (its I/O thread's slot).
    k: usize,
    token_file: PathBuf,
    mailbox: Arc<Mailbox>,
    /// The running connection's inbox and number (none while it is away).
    live: Mutex<Option<(String, u64)>>,
    /// When it lost its connection, until a heartbeat is acknowledged on a new one.
    lost: Mutex<Option<Instant>>,
    /// Its device info was not written (sent while away, or refused): written again after the next
    /// acknowledged heartbeat, as fleet-agent writes its device info again when it finds it missing.
    info_missing: AtomicBool,
}

impl DeviceConn {
    /// Device `id`, the `k`th of its group whose I/O thread reads `mailbox`, with its token in `dir/<id>`.
    pub fn new(id: DeviceId, k: usize, dir: &Path, mailbox: Arc<Mailbox>) -> DeviceConn {
        DeviceConn {
            token_file: dir.join(id.as_str()),
            id,
            k,
            mailbox,
            live: Mutex::new(None),
            lost: Mutex::new(None),
            info_missing: AtomicBool::new(false),
        }
    }

    /// Its id.
    pub fn id(&self) -> &DeviceId {
        &self.id
    }

    /// A heartbeat of this device was acknowledged: how long after losing its connection, the first time since.
    pub fn heartbeat_acked(&self) -> Option<Duration> {
        self.lost.lock().ok()?.take().map(|t| t.elapsed())
    }

    /// Records whether its device info was written (`false`: not sent, or refused).
    pub fn info_written(&self, ok: bool) {
        self.info_missing.store(!ok, Ordering::SeqCst);
    }

    /// True once when its device info is missing (the caller writes it again).
    pub fn take_info_missing(&self) -> bool {
        self.info_missing.swap(false, Ordering::SeqCst)
    }

    /// Whether it has a connection now.
    pub fn online(&self) -> bool {
        self.live.lock().is_ok_and(|l| l.is_some())
    }

    /// Its connection is running (with this inbox and number), or gone (`None`: lost, counted from now until a
    /// heartbeat is acknowledged again).
    pub(crate) fn set_online(&self, live: Option<(String, u64)>) {
        let gone = live.is_none();
        if let Ok(mut l) = self.live.lock() {
            *l = live;
        }
        if gone {
            if let Ok(mut lost) = self.lost.lock() {
                lost.get_or_insert_with(Instant::now);
            }
        }
    }

    /// Publishes write `n` (a KV put) with its reply on this device's inbox; `NotConnected` while away.
    pub fn publish_put(&self, subject: &str, n: u64, body: &[u8]) -> io::Result<()> {
        let live = self
            .live
            .lock()
            .map_err(|_| io::Error::other("device connection lock poisoned"))?;
        let Some((inbox, conn)) = live.as_ref() else {
            return Err(io::Error::new(
                io::ErrorKind::NotConnected,
                "device is away",
            ));
        };
        let frame =
            fleet_nats::proto::publish(subject, Some(&format!("{inbox}.ack.{n}")), None, body)
                .map_err(io::Error::other)?;
        self.mailbox.send(self.k, *conn, frame)
    }

    /// Its `CONNECT` with the token read from its file now (`tls`: the connection is over TLS).
    pub(crate) fn hello(&self, tls: bool) -> io::Result<Vec<u8>> {
        let v = serde_json::json!({
            "verbose": false,
            "pedantic": false,
            "tls_required": tls,
            "name": format!("fleet-sim-{}", self.id),
            "lang": "rust-fleet-sim",
            "version": env!("CARGO_PKG_VERSION"),
            "protocol": 1,
            "echo": true,
            "headers": true,
            "no_responders": true,
            "auth_token": read_token(&self.token_file)?,
        });
        Ok(format!("CONNECT {v}\r\n").into_bytes())
    }
}
/// The token in `path` (bounded, trimmed, non-empty).
fn read_token(path: &Path) -> io::Result<String> {
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| {
            f.take(NATS_TOKEN_MAX_BYTES as u64 + 1)
                .read_to_string(&mut text)
        })
        // Not the file's own error kind: a file we may not read is not the server refusing the device.
        .map_err(|e| io::Error::other(format!("token file {}: {e}", path.display())))?;
    let token = text.trim();
    if token.is_empty() || text.len() > NATS_TOKEN_MAX_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("token file {}: empty or too large", path.display()),
        ));
    }
    Ok(token.to_owned())
}
