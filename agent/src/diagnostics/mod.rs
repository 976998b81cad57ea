//! Diagnostics on request (docs/diagnostics.md): the agent watches `diagnostics-request/<device>.>`, answers each
//! request it sees once, and writes one redacted, bounded bundle to `diagnostics-bundle/<device>.<request-uid>`.
//! Collecting runs on one worker thread ([`worker`]), never on the event loop; this module decides which
//! requests go there ([`Answering`]) and what the redaction must know ([`known_values`]).

pub mod collect;
pub mod redact;
pub mod system;
pub mod worker;

use crate::config::NatsAuth;
use crate::nats_kv::{Change, Value};
use base64::Engine;
use fleet_wire::diagnostics::DiagnosticsRequest;
use fleet_wire::{AttemptId, DeviceId, WorkloadName};
use std::collections::VecDeque;

/// How many answered request ids are remembered (a request seen again after that is answered again).
pub const ANSWERED_REMEMBERED: usize = 64;

/// One request to answer.
#[derive(Debug, Clone)]
pub struct Job {
    /// `<device>.<request-uid>`: the bundle's key.
    pub key: String,
    /// The request's uid.
    pub request_id: AttemptId,
    /// The request, or why it could not be read (answered with a bundle saying so).
    pub request: Result<DiagnosticsRequest, String>,
    /// The workloads of the desired state when it was seen.
    pub desired: Vec<WorkloadName>,
}

/// Which requests this process has answered.
#[derive(Debug)]
pub struct Answering {
    device: DeviceId,
    answered: VecDeque<AttemptId>,
}

impl Answering {
    /// Nothing answered yet.
    pub fn new(device: DeviceId) -> Self {
        Self {
            device,
            answered: VecDeque::new(),
        }
    }

    /// The job for a change of `diagnostics-request/<key>`, if it is a request of this device not answered yet
    /// (it is then remembered as answered). A removed request needs nothing.
    pub fn admit(&mut self, key: &str, change: &Change, desired: Vec<WorkloadName>) -> Option<Job> {
        let Value::Put(bytes) = &change.value else {
            return None;
        };
        let (device, request_id) = match fleet_wire::kv::parse_run_key(key) {
            Ok(k) => k,
            Err(e) => {
                log::warn!("diagnostics-request/{key}: {e}; ignored");
                return None;
            }
        };
        if device != self.device || self.answered.contains(&request_id) {
            return None;
        }
        self.remember(request_id);
        let request = DiagnosticsRequest::parse(bytes).map_err(|e| e.to_string());
        Some(Job {
            key: key.to_owned(),
            request_id,
            request,
            desired,
        })
    }

    /// Forgets `id` (its job could not be queued: a later change of it is admitted again).
    pub fn forget(&mut self, id: &AttemptId) {
        self.answered.retain(|a| a != id);
    }

    fn remember(&mut self, id: AttemptId) {
        if self.answered.len() >= ANSWERED_REMEMBERED {
            self.answered.pop_front();
        }
        self.answered.push_back(id);
    }
}

/// The values a bundle must not carry: every Secret value delivered in `device-secrets` (decoded, as a workload
/// sees it, and base64, as delivered), every registry password there, and the agent's own NATS credential.
pub fn known_values(
    secrets: &crate::device_secrets::Read,
    auth: &NatsAuth,
) -> Result<Vec<String>, String> {
    let mut values = Vec::new();
    match auth {
        NatsAuth::None => {}
        NatsAuth::UserPassword { password, .. } => values.push(password.expose().to_owned()),
        NatsAuth::Token(t) => values.push(t.expose().to_owned()),
        // Read now, as each connection does: the token the agent uses at present.
        NatsAuth::TokenFile(path) => {
            if let Ok(t) = crate::nats_kv::read_token(path) {
                values.push(t);
            }
        }
    }
    if let Some(d) = secrets()?.secrets {
        for r in d.registries.values() {
            values.push(r.password.0.clone());
        }
        for v in &d.values {
            values.push(v.value.0.clone());
            if let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(&v.value.0) {
                if let Ok(text) = String::from_utf8(bytes) {
                    values.push(text);
                }
            }
        }
    }
    Ok(values)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(json: &str) -> Change {
        Change {
            revision: 1,
            value: Value::Put(json.as_bytes().to_vec()),
        }
    }

    #[test]
    fn each_request_of_this_device_is_admitted_once() {
        let dev = DeviceId::try_from("dev-a").expect("id");
        let mut a = Answering::new(dev.clone());
        let id = AttemptId::new_random();
        let key = fleet_wire::kv::run_key(&dev, &id);
        let ok = r#"{"lines":5,"requestedAt":"2026-12-07T10:00:00.000Z"}"#;
        let job = a.admit(&key, &put(ok), vec![]).expect("admitted");
        assert_eq!(
            (job.request_id, job.request.expect("parses").lines),
            (id, 5)
        );
        assert!(a.admit(&key, &put(ok), vec![]).is_none(), "answered once");
        a.forget(&id);
        assert!(
            a.admit(&key, &put(ok), vec![]).is_some(),
            "again once forgotten"
        );
        // A request that does not parse is answered, saying why.
        let bad_key = fleet_wire::kv::run_key(&dev, &AttemptId::new_random());
        let job = a
            .admit(&bad_key, &put(r#"{"lines":0}"#), vec![])
            .expect("admitted");
        assert!(job.request.is_err());
        // Another device's key, a removed request and a malformed key are not.
        let other = fleet_wire::kv::run_key(&DeviceId::try_from("dev-b").expect("id"), &id);
        assert!(Answering::new(dev.clone())
            .admit(&other, &put(ok), vec![])
            .is_none());
        let gone = Change {
            revision: 2,
            value: Value::Absent,
        };
        let fresh = fleet_wire::kv::run_key(&dev, &AttemptId::new_random());
        assert!(a.admit(&fresh, &gone, vec![]).is_none());
        assert!(a.admit("dev-a", &put(ok), vec![]).is_none());
    }

    #[test]
    fn the_answered_ids_are_bounded() {
        let dev = DeviceId::try_from("dev-a").expect("id");
        let mut a = Answering::new(dev.clone());
        let ok = put(r#"{"lines":5,"requestedAt":"2026-12-07T10:00:00.000Z"}"#);
        let first = AttemptId::new_random();
        a.admit(&fleet_wire::kv::run_key(&dev, &first), &ok, vec![]);
        for _ in 0..ANSWERED_REMEMBERED {
            a.admit(
                &fleet_wire::kv::run_key(&dev, &AttemptId::new_random()),
                &ok,
                vec![],
            );
        }
        assert_eq!(a.answered.len(), ANSWERED_REMEMBERED);
        assert!(!a.answered.contains(&first));
    }

    #[test]
    fn known_values_are_the_delivered_secrets_and_the_nats_credential() {
        let dev = DeviceId::try_from("dev-a").expect("id");
        let doc = format!(
            r#"{{"deviceId":"dev-a","registries":{{"r:5000":{{"username":"u","password":"reg-pass"}}}},"values":[{{"secret":"s","key":"k","version":"1","value":"{}"}}]}}"#,
            base64::engine::general_purpose::STANDARD.encode("the-value")
        );
        let parsed = crate::device_secrets::parse(&dev, doc.as_bytes()).expect("parses");
        let read: Box<crate::device_secrets::Read> = Box::new(move || {
            Ok(crate::device_secrets::Delivered {
                revision: 1,
                secrets: Some(parsed.clone()),
            })
        });
        let auth = NatsAuth::None;
        let v = known_values(&read, &auth).expect("read");
        assert!(v.contains(&"reg-pass".to_owned()) && v.contains(&"the-value".to_owned()));
        let failing: Box<crate::device_secrets::Read> = Box::new(|| Err("nats down".into()));
        assert!(known_values(&failing, &auth).is_err());
    }
}
