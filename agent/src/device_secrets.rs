//! The device's delivered secrets (`device-secrets/<device>`: registry credentials and Secret values) as one
//! reconcile pass sees them: read fresh, at most once per pass and only when the pass needs them (a pull of a
//! missing image, a container that uses secrets), so a rotated credential is used by the next pull. A missing
//! bucket or key means none were delivered. Nothing read here is logged; a document that does not parse is
//! reported by line and column only (serde's message may quote the value).

use fleet_wire::secrets::{DeviceSecrets, RegistryAuth};

/// One read of `device-secrets/<device>`.
#[derive(Debug, Clone, Default)]
pub struct Delivered {
    /// The key's revision (0: never written, or the bucket does not exist).
    pub revision: u64,
    /// The document; `None` when absent.
    pub secrets: Option<DeviceSecrets>,
}

/// Reads the device's secrets (the agent's: a direct get on NATS; a test's: anything).
pub type Read = dyn Fn() -> Result<Delivered, String> + Send + Sync;

/// Parses a `device-secrets/<device>` value of `device`; the error never quotes the value.
pub fn parse(device: &fleet_wire::DeviceId, bytes: &[u8]) -> Result<DeviceSecrets, String> {
    let d: DeviceSecrets = serde_json::from_slice(bytes).map_err(|e| {
        format!(
            "device-secrets/{} does not parse ({:?} error at line {} column {})",
            device.as_str(),
            e.classify(),
            e.line(),
            e.column()
        )
    })?;
    if d.device_id != *device {
        return Err(format!(
            "device-secrets/{} names another device",
            device.as_str()
        ));
    }
    d.check().map_err(|e| e.to_string())?;
    Ok(d)
}

/// The reader the agent uses: a direct get of its own key in the `device-secrets` bucket.
pub fn from_kv(kv: crate::nats_kv::Buckets, device: fleet_wire::DeviceId) -> Box<Read> {
    Box::new(move || {
        let c = kv
            .get_optional(
                fleet_wire::kv::DEVICE_SECRETS,
                &fleet_wire::kv::device_key(&device),
            )
            .map_err(|e| format!("reading device-secrets/{}: {e}", device.as_str()))?;
        let secrets = match c.value {
            crate::nats_kv::Value::Absent => None,
            crate::nats_kv::Value::Put(bytes) => Some(parse(&device, &bytes)?),
        };
        Ok(Delivered {
            revision: c.revision,
            secrets,
        })
    })
}

/// The secrets of one pass: read on first use, then kept for the rest of the pass.
pub struct PassSecrets<'a> {
    read: &'a Read,
    got: Option<Result<Delivered, String>>,
}

impl<'a> PassSecrets<'a> {
    /// Nothing is read until asked.
    pub fn new(read: &'a Read) -> Self {
        Self { read, got: None }
    }

    /// The delivered secrets (read now if this pass has not yet).
    pub fn get(&mut self) -> Result<&Delivered, String> {
        let read = self.read;
        self.got
            .get_or_insert_with(read)
            .as_ref()
            .map_err(Clone::clone)
    }

    /// The revision this pass read, if it read one.
    pub fn revision_read(&self) -> Option<u64> {
        self.got.as_ref()?.as_ref().ok().map(|d| d.revision)
    }

    /// The credentials delivered for registry `host`, if any.
    pub fn registry(&mut self, host: &str) -> Result<Option<RegistryAuth>, String> {
        Ok(self
            .get()?
            .secrets
            .as_ref()
            .and_then(|s| s.registries.get(host).cloned()))
    }
}

/// A reader for a device without secrets (tests, and a pass that needs none).
pub fn none() -> Box<Read> {
    Box::new(|| Ok(Delivered::default()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn a_pass_reads_once_and_only_when_asked() {
        let reads = Arc::new(AtomicUsize::new(0));
        let r = reads.clone();
        let read: Box<Read> = Box::new(move || {
            r.fetch_add(1, Ordering::SeqCst);
            Ok(Delivered {
                revision: 7,
                secrets: None,
            })
        });
        let mut pass = PassSecrets::new(&*read);
        assert_eq!(pass.revision_read(), None);
        assert_eq!(
            reads.load(Ordering::SeqCst),
            0,
            "nothing read before it is needed"
        );
        assert_eq!(pass.registry("r.example").expect("read"), None);
        assert_eq!(pass.get().expect("read").revision, 7);
        assert_eq!(
            (reads.load(Ordering::SeqCst), pass.revision_read()),
            (1, Some(7))
        );
        let mut next = PassSecrets::new(&*read);
        next.get().expect("read");
        assert_eq!(reads.load(Ordering::SeqCst), 2, "each pass reads afresh");
    }

    #[test]
    fn a_bad_document_is_reported_without_its_text() {
        let dev = fleet_wire::DeviceId::try_from("device-1").expect("id");
        let bad = br#"{"deviceId":"device-1","registries":{"r":{"username":"u","password":7}},"values":[]}"#;
        let e = parse(&dev, bad).expect_err("password is not a string");
        assert!(e.contains("line 1") && !e.contains("\"u\""), "{e}");
        let leaky = br#"{"deviceId":"device-1","registries":{"r":{"username":"u","password":"hunter2","x":1}}}"#;
        let e = parse(&dev, leaky).expect_err("unknown field");
        assert!(!e.contains("hunter2"), "{e}");
        let other = br#"{"deviceId":"device-2"}"#;
        assert!(parse(&dev, other)
            .expect_err("other")
            .contains("another device"));
        let ok =
            br#"{"deviceId":"device-1","registries":{"r:5000":{"username":"u","password":"p"}}}"#;
        assert_eq!(parse(&dev, ok).expect("ok").registries.len(), 1);
    }
}
