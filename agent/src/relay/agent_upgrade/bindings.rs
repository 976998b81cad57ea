//! The durable attempt-UUID → digest bindings: an attempt id is used with one content only, and whether the
//! updater accepted it survives an agent restart.

use fleet_wire::{AttemptId, Sha256Hex, Timestamp};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Most bindings kept; the oldest are dropped first.
pub const MAX_BINDINGS: usize = 256;
/// Largest bindings file read, in bytes.
pub const BINDINGS_MAX_BYTES: u64 = 1024 * 1024;

/// One binding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Binding {
    /// The attempt UUID.
    pub attempt_id: String,
    /// Its canonical digest.
    pub digest: String,
    /// When it was bound.
    pub bound_at: Timestamp,
    /// Whether the updater accepted the request for it.
    #[serde(default)]
    pub accepted: bool,
}

/// The bindings file: `{"version":1,"bindings":[...]}`. Unknown fields are tolerated (an older release must read
/// what a newer one wrote, since rollback changes only the executable).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bindings {
    /// Format version (1).
    #[serde(default = "one")]
    pub version: u32,
    /// Bindings, oldest first.
    #[serde(default)]
    pub bindings: Vec<Binding>,
}

fn one() -> u32 {
    1
}

impl Bindings {
    /// The digest bound to `id`.
    pub fn digest_of(&self, id: &AttemptId) -> Option<&str> {
        let id = id.to_string();
        self.bindings
            .iter()
            .find(|b| b.attempt_id == id)
            .map(|b| b.digest.as_str())
    }

    /// The binding of `id`.
    pub fn get(&self, id: &AttemptId) -> Option<&Binding> {
        let id = id.to_string();
        self.bindings.iter().find(|b| b.attempt_id == id)
    }

    /// Binds `id` to `digest` (no-op when already bound), dropping the oldest beyond [`MAX_BINDINGS`].
    pub fn bind(&mut self, id: &AttemptId, digest: &Sha256Hex, at: Timestamp) {
        if self.digest_of(id).is_some() {
            return;
        }
        self.bindings.push(Binding {
            attempt_id: id.to_string(),
            digest: digest.to_string(),
            bound_at: at,
            accepted: false,
        });
        let excess = self.bindings.len().saturating_sub(MAX_BINDINGS);
        self.bindings.drain(..excess);
    }

    /// Marks `id` accepted by the updater.
    pub fn mark_accepted(&mut self, id: &AttemptId) {
        let id = id.to_string();
        for b in &mut self.bindings {
            if b.attempt_id == id {
                b.accepted = true;
            }
        }
    }

    /// Reads the file; a missing file is empty bindings, an unreadable one an error.
    pub fn load(path: &Path) -> Result<Bindings, String> {
        match std::fs::metadata(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Bindings::default()),
            Err(e) => return Err(format!("{}: {e}", path.display())),
            Ok(m) if m.len() > BINDINGS_MAX_BYTES => {
                return Err(format!(
                    "{} is larger than {BINDINGS_MAX_BYTES} bytes",
                    path.display()
                ))
            }
            Ok(_) => {}
        }
        let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        serde_json::from_slice(&bytes).map_err(|e| format!("{} is corrupt: {e}", path.display()))
    }

    /// Writes the file atomically and durably (the tree's one atomic write, `fleet_wire::durable`).
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let bytes = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        fleet_wire::durable::write_atomic(path, &bytes, 0o640)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleet_wire::fixtures;

    #[test]
    fn bindings_round_trip_and_tolerate_unknown_fields() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("state/upgrade-bindings.json");
        assert_eq!(Bindings::load(&p).expect("missing"), Bindings::default());
        let a = fixtures::attempt();
        let mut b = Bindings::default();
        b.bind(&a.attempt_id, &a.digest(), fixtures::t(0));
        b.mark_accepted(&a.attempt_id);
        b.save(&p).expect("save");
        assert_eq!(Bindings::load(&p).expect("load"), b);
        let newer = r#"{"version":2,"future":1,"bindings":[{"attemptId":"x","digest":"y","boundAt":"2026-11-30T01:00:00Z","extra":true}]}"#;
        std::fs::write(&p, newer).expect("write");
        assert_eq!(Bindings::load(&p).expect("newer").bindings.len(), 1);
        std::fs::write(&p, "{").expect("write");
        assert!(Bindings::load(&p).is_err());
    }
}
