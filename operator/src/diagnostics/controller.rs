//! The DeviceDiagnostics controller: writes each new object's request for its device when the queue lets it (one
//! open request per device, at most `max_open_requests` across the fleet: [`super::queue`]), keeps its phase
//! current from the Device's `Online` condition (a device that comes back moves Waiting → Pending), copies the
//! device's bundle into status as soon as the bundle watch sees it, deletes the request key and the bundle key once
//! finished, deletes finished objects `ttlSecondsAfterFinished` later, and sweeps request and bundle keys whose
//! object is gone. Woken by the object and Device caches and by the bundle watch; a periodic pass ([`RESYNC`])
//! covers expiries and TTLs.

use super::bundles::{self, Arrived};
use super::phase::{self, Answer, DeviceState};
use super::queue::{self, Candidate, Decision};
use super::request;
use crate::crd::diagnostics::{
    DeviceDiagnostics, DeviceDiagnosticsStatus, DiagnosticsBundleStatus, DiagnosticsPhase,
};
use crate::crd::Device;
use crate::nats_link::{Kept, Link};
use crate::runtime::Runtime;
use async_nats::jetstream::kv::{CreateErrorKind, Store};
use fleet_wire::diagnostics::DiagnosticsBundle;
use fleet_wire::kv::{DIAGNOSTICS_BUNDLE, DIAGNOSTICS_REQUEST};
use fleet_wire::log_summary::Summaries;
use fleet_wire::text::for_log;
use fleet_wire::Timestamp;
use kube::runtime::reflector::{ObjectRef, Store as Cache};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// The longest sleep between passes.
pub const RESYNC: Duration = Duration::from_secs(30);
/// Most API and KV writes of one pass; the next pass follows at once with the rest.
pub const MAX_WRITES_PER_PASS: usize = 100;
/// Longest status message, in characters.
pub const MAX_MESSAGE_CHARS: usize = 1024;

/// What this replica wrote last for an object, so that a pass that runs before the cache has seen its own write
/// does not undo it.
#[derive(Clone)]
struct Shown {
    phase: DiagnosticsPhase,
    message: String,
    completed_at: Option<Timestamp>,
}

struct State {
    arrived: Arc<Arrived>,
    /// Request UIDs whose request key exists as far as this replica knows: listed after each new NATS link
    /// (`listed`), then its own creates (`AlreadyExists` too) and deletes. The queue counts them open.
    written: HashSet<String>,
    /// `written` was listed from the bucket on the current link.
    listed: bool,
    /// At most this many requests are open across the fleet.
    max_open: usize,
    shown: HashMap<String, Shown>,
    unknown: Summaries,
    last_sweep: Option<Instant>,
}

/// Runs the controller on the operator's runtime until the process ends.
pub async fn run_with(rt: &Runtime) -> Result<(), String> {
    let notify = Arc::new(Notify::new());
    let objects = rt.caches.diagnostics.subscribe(&notify);
    let devices = rt.caches.devices.subscribe(&notify);
    rt.caches
        .diagnostics
        .ready()
        .await
        .map_err(|e| format!("DeviceDiagnostics cache: {e}"))?;
    rt.caches
        .devices
        .ready()
        .await
        .map_err(|e| format!("Device cache: {e}"))?;
    let mut st = State {
        arrived: Arc::default(),
        written: HashSet::new(),
        listed: false,
        max_open: usize::try_from(fleet_wire::diagnostics::max_open_requests(
            rt.nats.buckets().fleet_size(),
        ))
        .unwrap_or(usize::MAX),
        shown: HashMap::new(),
        unknown: Summaries::new(
            "diagnostics-bundle: ignoring the bundle of an unknown request",
            Duration::from_secs(60),
        ),
        last_sweep: None,
    };
    let mut link: Option<Link> = None;
    loop {
        let arrived = st.arrived.clone();
        let n = notify.clone();
        let kept = Link::keep(&mut link, &rt.nats, "diagnostics", || async {
            let mut l = Link::open(&rt.nats).await?;
            let store = l.store(DIAGNOSTICS_BUNDLE)?.clone();
            l.spawn(bundles::watch(store, arrived, n));
            Ok(l)
        })
        .await;
        if matches!(kept, Kept::Opened) {
            // A new connection: which request keys exist is listed again before anything more is written.
            st.listed = false;
        }
        let wait = match &link {
            Some(l) => pass(rt, l, &objects, &devices, &mut st).await,
            None => Duration::from_secs(2),
        };
        tokio::select! {
            _ = notify.notified() => {}
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

fn ts(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> String {
    Timestamp::from_unix_ms(t.0.as_millisecond().max(0) as u64).to_string()
}

/// The device's liveness as its Device says, for a request created at `created`.
fn device_state(
    devices: &Cache<Device>,
    name: &str,
    created: Timestamp,
    now: Timestamp,
) -> DeviceState {
    let Some(d) = devices.get(&ObjectRef::new(name)) else {
        return if now < created.plus(phase::MISSING_GRACE) {
            DeviceState::NotSeenYet
        } else {
            DeviceState::Missing
        };
    };
    let online = d.status.as_ref().and_then(|s| {
        s.conditions
            .iter()
            .find(|c| c.type_ == crate::conditions::ONLINE)
    });
    match online {
        Some(c) if c.status == "True" => DeviceState::Online,
        Some(c) if c.status == "False" => DeviceState::Offline(ts(&c.last_transition_time)),
        _ => DeviceState::Unjudged,
    }
}

/// Reads the bundle at `key` for `obj`: `None` when there is none (or it could not be read: noted again).
async fn read_bundle(
    bundles: &Store,
    st: &State,
    obj: &DeviceDiagnostics,
    key: &str,
) -> Option<Answer> {
    let (device, uid, _) = request::key(obj)?;
    match bundles.get(key).await {
        Ok(None) => None,
        Ok(Some(bytes)) => Some(match DiagnosticsBundle::parse(&bytes, &device, &uid) {
            Ok(b) => Answer::Bundle(Box::new(DiagnosticsBundleStatus::from(b))),
            // Device text: shown escaped.
            Err(e) => Answer::Invalid(for_log(&e.to_string())),
        }),
        Err(e) => {
            log::warn!("diagnostics: read {DIAGNOSTICS_BUNDLE}/{key}: {e}; retried");
            st.arrived.note(key.to_owned());
            None
        }
    }
}

/// Deletes the bundle at `key` (copied into status, or not wanted: its request finished): the bucket holds only
/// `max_open_requests` bundles. A failure is logged; the bundle watch notes the key again on the next link, and
/// the bucket's age limit removes it at last.
async fn delete_bundle(bundles: &Store, key: &str) {
    match bundles.delete(key).await {
        Ok(()) => log::debug!("diagnostics: deleted {DIAGNOSTICS_BUNDLE}/{key}"),
        Err(e) => log::warn!("diagnostics: delete {DIAGNOSTICS_BUNDLE}/{key}: {e}"),
    }
}

async fn pass(
    rt: &Runtime,
    link: &Link,
    objects: &Cache<DeviceDiagnostics>,
    devices: &Cache<Device>,
    st: &mut State,
) -> Duration {
    let (Ok(requests), Ok(bundles)) = (
        link.store(DIAGNOSTICS_REQUEST),
        link.store(DIAGNOSTICS_BUNDLE),
    ) else {
        return Duration::from_secs(2);
    };
    if !st.listed {
        match super::sweep::keys(requests).await {
            Ok(keys) => {
                st.written = keys.into_iter().map(|(_, uid)| uid).collect();
                st.listed = true;
            }
            Err(e) => {
                log::warn!("diagnostics: {e}; retried");
                return Duration::from_secs(2);
            }
        }
    }
    let now = Timestamp::now();
    let mut objs = objects.state();
    // Creation order (seconds), then name: the queue's order, the same on every replica.
    objs.sort_by(|a, b| {
        (crate::crd::tasks::created_at(a.as_ref()), &a.metadata.name)
            .cmp(&(crate::crd::tasks::created_at(b.as_ref()), &b.metadata.name))
    });
    let by_uid: HashMap<String, Arc<DeviceDiagnostics>> = objs
        .iter()
        .filter_map(|o| Some((o.metadata.uid.clone()?, o.clone())))
        .collect();
    st.shown.retain(|uid, _| by_uid.contains_key(uid));
    st.written.retain(|uid| by_uid.contains_key(uid));
    let phase_of = |st: &State, o: &DeviceDiagnostics| -> Option<DiagnosticsPhase> {
        let uid = o.metadata.uid.as_deref().unwrap_or_default();
        let cached = o.status.as_ref().and_then(|s| s.phase);
        // Finished in the cache: by this replica or another (which may have deleted the bundle this one did not
        // read), and a finished request never changes again.
        if cached.is_some_and(DiagnosticsPhase::finished) {
            return cached;
        }
        st.shown.get(uid).map(|s| s.phase).or(cached)
    };

    // The bundles that arrived, for the open requests they answer.
    let (keys, dropped) = st.arrived.take();
    let mut answers: HashMap<String, Answer> = HashMap::new();
    let mut to_read: Vec<(Arc<DeviceDiagnostics>, String)> = vec![];
    let mut not_wanted: Vec<String> = vec![];
    for key in keys {
        let known = fleet_wire::kv::parse_run_key(&key)
            .ok()
            .and_then(|(device, uid)| {
                by_uid
                    .get(&uid.to_string())
                    .filter(|o| o.spec.device == device.as_str())
            });
        match known {
            None => {
                if let Some(line) = st.unknown.record("any", &key, Instant::now()) {
                    log::warn!("{line}");
                }
            }
            // A bundle of a finished request: copied already (one left by a failed delete, found again when the
            // watch starts over) or too late.
            Some(o) if phase_of(st, o).is_some_and(DiagnosticsPhase::finished) => {
                not_wanted.push(key)
            }
            Some(o) => to_read.push((o.clone(), key)),
        }
    }
    if dropped {
        // Too many keys arrived to note them all: every open request looks for its bundle.
        for o in &objs {
            if !phase_of(st, o).is_some_and(DiagnosticsPhase::finished) {
                if let Some((_, _, key)) = request::key(o) {
                    to_read.push((o.clone(), key));
                }
            }
        }
    }
    for (o, key) in to_read {
        if let Some(a) = read_bundle(bundles, st, &o, &key).await {
            answers.insert(o.metadata.uid.clone().unwrap_or_default(), a);
        }
    }
    for key in &not_wanted {
        delete_bundle(bundles, key).await;
    }

    // Which unfinished requests may be written now (the others wait, saying why).
    let mut candidates = vec![];
    let mut candidate_uids = vec![];
    for o in &objs {
        let Some(uid) = o.metadata.uid.as_deref() else {
            continue;
        };
        if phase_of(st, o).is_some_and(DiagnosticsPhase::finished) || request::key(o).is_none() {
            continue;
        }
        let created = crate::crd::tasks::created_at(o.as_ref());
        if crate::schema::refusal(o.as_ref()).is_some()
            || request::of(&o.spec, created).is_err()
            || matches!(
                device_state(devices, &o.spec.device, created, now),
                DeviceState::Missing | DeviceState::NotSeenYet
            )
        {
            continue; // It fails in this pass.
        }
        let open = st.written.contains(uid);
        if !open && (answers.contains_key(uid) || now >= created.plus(phase::EXPIRES_AFTER)) {
            continue; // It finishes in this pass.
        }
        candidates.push(Candidate {
            name: o.metadata.name.as_deref().unwrap_or_default(),
            device: &o.spec.device,
            open,
        });
        candidate_uids.push(uid.to_owned());
    }
    let mut decisions: HashMap<String, Decision> = candidate_uids
        .into_iter()
        .zip(queue::decide(&candidates, st.max_open))
        .collect();

    let api = kube::Api::<DeviceDiagnostics>::all(rt.client.clone());
    let mut writes = 0;
    let mut wait = RESYNC;
    for o in &objs {
        if writes >= MAX_WRITES_PER_PASS {
            // The bundles read for the objects not reached are read again by the next pass, at once.
            for uid in answers.keys() {
                if let Some(key) = by_uid.get(uid).and_then(|o| request::key(o)) {
                    st.arrived.note(key.2);
                }
            }
            return Duration::ZERO;
        }
        let Some(uid) = o.metadata.uid.clone() else {
            continue;
        };
        let name = o.metadata.name.clone().unwrap_or_default();
        let key = request::key(o).map(|k| k.2);
        let current = phase_of(st, o);
        if current.is_some_and(DiagnosticsPhase::finished) {
            // The request key goes as soon as the request finished (a device can then write no bundle for it).
            if let Some(key) = key.as_ref().filter(|_| st.written.contains(&uid)) {
                match requests.delete(key).await {
                    Ok(()) => {
                        st.written.remove(&uid);
                    }
                    Err(e) => log::warn!("diagnostics: delete {DIAGNOSTICS_REQUEST}/{key}: {e}"),
                }
                writes += 1;
            }
            let completed = st
                .shown
                .get(&uid)
                .and_then(|s| s.completed_at)
                .or_else(|| {
                    o.status
                        .as_ref()
                        .and_then(|s| s.completed_at.as_deref())
                        .and_then(|t| t.parse().ok())
                })
                .unwrap_or(now);
            let due = completed.plus(Duration::from_secs(o.spec.ttl_seconds_after_finished));
            if now >= due {
                let dp = kube::api::DeleteParams {
                    preconditions: Some(kube::api::Preconditions {
                        uid: Some(uid.clone()),
                        resource_version: None,
                    }),
                    ..Default::default()
                };
                match api.delete(&name, &dp).await {
                    Ok(_) => log::info!("diagnostics: deleted {name}: finished {completed}, ttlSecondsAfterFinished passed"),
                    Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
                    Err(e) => log::warn!("diagnostics: delete {name}: {e}"),
                }
                writes += 1;
            } else {
                wait = wait.min(due.since(now).max(Duration::from_millis(100)));
            }
            continue;
        }

        let created = crate::crd::tasks::created_at(o.as_ref());
        // Unknown fields with every other problem of the spec, as the webhook names them.
        let refusal = crate::schema::unknown_problem(o.as_ref()).and_then(|_| {
            crate::validation::refusal_of(o.as_ref(), crate::validation::diagnostics_spec(&o.spec))
        });
        let req = request::of(&o.spec, created);
        let spec_error = refusal.or_else(|| req.as_ref().err().cloned());
        let mut write_error = None;
        let device = device_state(devices, &o.spec.device, created, now);
        if device == DeviceState::NotSeenYet {
            let due = created.plus(phase::MISSING_GRACE);
            wait = wait.min(due.since(now).max(Duration::from_millis(100)));
        }
        let decision = decisions.remove(&uid);
        let queued = match &decision {
            Some(Decision::Queued(q)) => Some(q),
            _ => None,
        };
        // Written only when the queue lets it: never for a device without a Device (the request fails at once).
        if let (Ok(r), Some(key), None) = (&req, &key, &spec_error) {
            if decision == Some(Decision::Write) {
                let bytes = serde_json::to_vec(r).unwrap_or_default();
                writes += 1;
                match requests.create(key, bytes.into()).await {
                    Ok(_) => {
                        log::info!("diagnostics: {name}: wrote {DIAGNOSTICS_REQUEST}/{key}");
                        st.written.insert(uid.clone());
                    }
                    Err(e) if e.kind() == CreateErrorKind::AlreadyExists => {
                        st.written.insert(uid.clone());
                    }
                    Err(e)
                        if link.client.connection_state()
                            == async_nats::connection::State::Connected =>
                    {
                        write_error = Some(e.to_string());
                    }
                    Err(e) => {
                        // The connection went: not the request's fault, tried again on the next link.
                        log::warn!("diagnostics: {name}: write {DIAGNOSTICS_REQUEST}/{key}: {e}");
                        continue;
                    }
                }
            }
        }
        let answer = answers.remove(&uid).unwrap_or(Answer::None);
        let expires = created.plus(phase::EXPIRES_AFTER);
        let expires_at = expires.to_string();
        let facts = phase::Facts {
            device: &o.spec.device,
            current,
            spec_error: spec_error.as_deref(),
            write_error: write_error.as_deref(),
            device_state: device,
            answer: &answer,
            expires_at: &expires_at,
            expired: now >= expires,
            queued,
        };
        let judged = phase::judge(&facts);
        let had_answer = !matches!(answer, Answer::None);
        let Some((next, message)) = judged else {
            continue;
        };
        let message = crate::conditions::bounded(&message, MAX_MESSAGE_CHARS);
        if !next.finished() {
            wait = wait.min(expires.since(now).max(Duration::from_millis(100)));
        }
        let same = st
            .shown
            .get(&uid)
            .map(|s| (s.phase, s.message.as_str()))
            .or_else(|| {
                let s = o.status.as_ref()?;
                Some((s.phase?, s.message.as_deref()?))
            })
            == Some((next, message.as_str()));
        if same {
            continue;
        }
        let completed_at = next.finished().then_some(now);
        let status = DeviceDiagnosticsStatus {
            phase: Some(next),
            message: Some(message.clone()),
            requested_at: Some(
                o.status
                    .as_ref()
                    .and_then(|s| s.requested_at.clone())
                    .unwrap_or_else(|| created.to_string()),
            ),
            completed_at: completed_at.map(|t| t.to_string()),
            bundle: match answer {
                Answer::Bundle(b) => Some(*b),
                _ => None,
            },
        };
        writes += 1;
        let patch = serde_json::json!({ "status": status });
        match api
            .patch_status(
                &name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => {
                log::info!("diagnostics: {name}: {next:?}: {}", for_log(&message));
                st.shown.insert(
                    uid.clone(),
                    Shown {
                        phase: next,
                        message,
                        completed_at,
                    },
                );
                if next.finished() {
                    if let Some(key) = &key {
                        // Whether or not this replica knew it open: another may have written it.
                        writes += 1;
                        match requests.delete(key).await {
                            Ok(()) => {
                                st.written.remove(&uid);
                            }
                            Err(e) => {
                                log::warn!("diagnostics: delete {DIAGNOSTICS_REQUEST}/{key}: {e}")
                            }
                        }
                        if had_answer {
                            // Copied into status (or not wanted): its space in the bucket is freed at once.
                            writes += 1;
                            delete_bundle(bundles, key).await;
                        }
                    }
                    // The next pass writes the requests that waited for this one.
                    wait = Duration::ZERO;
                }
            }
            Err(e) => {
                log::warn!("diagnostics: {name}: status: {e}");
                if had_answer {
                    // Read again on the next pass.
                    if let Some(key) = &key {
                        st.arrived.note(key.clone());
                    }
                }
            }
        }
    }

    if st
        .last_sweep
        .is_none_or(|t| t.elapsed() >= super::sweep::EVERY)
    {
        st.last_sweep = Some(Instant::now());
        let known: HashSet<String> = by_uid.keys().cloned().collect();
        if let Err(e) = super::sweep::run(&rt.client, &[requests, bundles], &known).await {
            log::warn!("diagnostics: sweep: {e}");
        }
    }
    wait
}
