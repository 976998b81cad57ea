//! The diagnostics worker: one thread that answers one request at a time. Each request is collected by two
//! helper threads — the agent's items ([`super::collect`]) and the updater's, asked over its socket — within
//! [`DEADLINE`]; what has not arrived by then says so. The bundle is redacted, bounded and written once (the
//! bucket is write-only to devices: it is never read back). The next request starts only after both helpers of
//! the previous one ended (each of their calls is bounded), so there is never more than one collection.

use super::collect::{self, Found, Raw};
use super::redact::Redactor;
use super::Job;
use crate::nats_kv::Buckets;
use crate::podman::Podman;
use crate::updater::UpdaterClient;
use fleet_wire::diagnostics::{
    tail, Collector, DiagnosticsBundle, DiagnosticsRequest, Item, Section, MAX_SECTION_BYTES,
};
use fleet_wire::{DeviceId, Timestamp, WorkloadName};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The whole collection of one request.
pub const DEADLINE: Duration = Duration::from_secs(20);
/// Requests waiting for the worker (more are refused and admitted again on their next change).
const QUEUE: usize = 8;

/// What the worker needs besides the request.
pub struct Context {
    /// This device.
    pub device: DeviceId,
    /// Podman, when enabled.
    pub podman: Option<Podman>,
    /// The updater's socket.
    pub updater: UpdaterClient,
    /// The diagnostics buckets (the bundle is written there).
    pub kv: Buckets,
    /// The values to redact, read for each request ([`super::known_values`]).
    pub values: Box<dyn Fn() -> Result<Vec<String>, String> + Send>,
    /// SIGTERM came: nothing more is written.
    pub draining: Arc<AtomicBool>,
}

/// The worker thread's queue.
pub struct Worker {
    tx: mpsc::SyncSender<Job>,
}

impl Worker {
    /// Starts the thread.
    pub fn spawn(ctx: Context) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::sync_channel::<Job>(QUEUE);
        std::thread::Builder::new()
            .name("diagnostics".into())
            .spawn(move || {
                let mut previous: Vec<std::thread::JoinHandle<()>> = Vec::new();
                for job in rx {
                    // One collection at a time: the last one's helpers end within their own bounds.
                    for h in previous.drain(..) {
                        let _ = h.join();
                    }
                    if ctx.draining.load(Ordering::SeqCst) {
                        return;
                    }
                    previous = answer(&ctx, job);
                }
            })?;
        Ok(Self { tx })
    }

    /// Queues `job`; gives it back when the queue is full.
    pub fn submit(&self, job: Job) -> Result<(), Box<Job>> {
        self.tx.try_send(job).map_err(|e| match e {
            mpsc::TrySendError::Full(j) | mpsc::TrySendError::Disconnected(j) => Box::new(j),
        })
    }
}

/// Collects, redacts and writes the bundle of `job`; returns the helper threads still to be joined.
fn answer(ctx: &Context, job: Job) -> Vec<std::thread::JoinHandle<()>> {
    let started = Instant::now();
    let (sections, helpers, items) = match &job.request {
        Err(why) => (
            vec![Raw {
                item: Item::ALL[0],
                workload: None,
                text: String::new(),
                cut: false,
                error: Some(format!("the request could not be read: {why}")),
            }],
            Vec::new(),
            "none".to_owned(),
        ),
        Ok(r) => {
            let (raws, helpers) = collect_all(ctx, r, &job.desired, started + DEADLINE);
            let names: Vec<&str> = r.items().iter().map(|i| i.name()).collect();
            (raws, helpers, names.join(","))
        }
    };
    let lines = job
        .request
        .as_ref()
        .map_or(fleet_wire::diagnostics::DEFAULT_LINES, |r| r.lines);
    let values = (ctx.values)();
    let redactor = values.as_ref().map(|v| Redactor::new(v.iter().cloned()));
    let (sections, redacted) = finish(sections, lines, redactor.as_ref().map_err(|e| e.as_str()));
    let mut bundle = DiagnosticsBundle {
        device: ctx.device.clone(),
        request: job.request_id,
        collected_at: Timestamp::now(),
        sections,
        redacted,
        cut: false,
    };
    let json = bundle.to_bounded_json();
    if ctx.draining.load(Ordering::SeqCst) {
        return helpers;
    }
    let cut = bundle.cut || bundle.sections.iter().any(|s| s.cut);
    match ctx
        .kv
        .put(fleet_wire::kv::DIAGNOSTICS_BUNDLE, &job.key, &json)
    {
        Ok(_) => log::info!(
            "diagnostics request {}: items {items}; bundle of {} bytes written in {:.1} s (cut: {cut}, redacted: {redacted})",
            job.request_id,
            json.len(),
            started.elapsed().as_secs_f32()
        ),
        Err(e) => log::warn!(
            "diagnostics request {}: items {items}; writing its bundle of {} bytes: {e}",
            job.request_id,
            json.len()
        ),
    }
    helpers
}

/// The request's sections in [`Item::ALL`]'s order, each as collected by `deadline` or saying it was not.
fn collect_all(
    ctx: &Context,
    request: &DiagnosticsRequest,
    desired: &[WorkloadName],
    deadline: Instant,
) -> (Vec<Raw>, Vec<std::thread::JoinHandle<()>>) {
    enum Msg {
        Agent(Found),
        AgentDone,
        Updater(Result<Vec<Section>, String>),
    }
    let (tx, rx) = mpsc::channel::<Msg>();
    let mut helpers = Vec::new();
    let items = request.items();
    let wants = |c: Collector| items.iter().any(|i| i.collector() == c);
    let mut agent_done = !wants(Collector::Agent);
    let mut updater_done = !wants(Collector::Updater);
    let mut updater: Option<Result<Vec<Section>, String>> = None;
    if !agent_done {
        let (tx, r, p, d) = (
            tx.clone(),
            request.clone(),
            ctx.podman.clone(),
            desired.to_vec(),
        );
        let spawned = std::thread::Builder::new()
            .name("diagnostics-agent".into())
            .spawn(move || {
                collect::agent_items(&r, p.as_ref(), &d, deadline, &mut |f| {
                    let _ = tx.send(Msg::Agent(f));
                });
                let _ = tx.send(Msg::AgentDone);
            });
        match spawned {
            Ok(h) => helpers.push(h),
            Err(e) => {
                log::warn!("diagnostics: starting a collector: {e}");
                agent_done = true;
            }
        }
    }
    if !updater_done {
        let (tx, r, u) = (tx.clone(), request.clone(), ctx.updater.clone());
        let spawned = std::thread::Builder::new()
            .name("diagnostics-updater".into())
            .spawn(move || {
                let _ = tx.send(Msg::Updater(u.diagnostics(r).map_err(|e| e.to_string())));
            });
        match spawned {
            Ok(h) => helpers.push(h),
            Err(e) => {
                updater = Some(Err(format!("no thread to ask it: {e}")));
                updater_done = true;
            }
        }
    }
    drop(tx);
    let mut planned: Option<Vec<WorkloadName>> = None;
    let mut got: Vec<Raw> = Vec::new();
    while !(agent_done && updater_done) {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(Msg::Agent(Found::Planned(w))) => planned = Some(w),
            Ok(Msg::Agent(Found::Section(s))) => got.push(s),
            Ok(Msg::AgentDone) => agent_done = true,
            Ok(Msg::Updater(u)) => {
                updater = Some(u);
                updater_done = true;
            }
            Err(_) => break,
        }
    }
    (assemble(&items, planned, got, updater, DEADLINE), helpers)
}

/// Every section asked for, in order: those collected, the updater's (or why it did not answer), and for the
/// rest `not collected within …`.
fn assemble(
    items: &[Item],
    planned: Option<Vec<WorkloadName>>,
    mut got: Vec<Raw>,
    updater: Option<Result<Vec<Section>, String>>,
    within: Duration,
) -> Vec<Raw> {
    let late = format!("not collected within {} s", within.as_secs());
    let mut out = Vec::new();
    let mut take = |item: Item, workload: Option<&WorkloadName>| {
        got.iter()
            .position(|r| r.item == item && r.workload.as_ref() == workload)
            .map(|i| got.remove(i))
    };
    for &item in items {
        match item.collector() {
            Collector::Agent if item == Item::WorkloadLogs => match &planned {
                Some(ws) if !ws.is_empty() => {
                    for w in ws {
                        out.push(
                            take(item, Some(w))
                                .unwrap_or_else(|| failed(item, Some(w.clone()), &late)),
                        );
                    }
                }
                _ => out.push(take(item, None).unwrap_or_else(|| failed(item, None, &late))),
            },
            Collector::Agent => {
                out.push(take(item, None).unwrap_or_else(|| failed(item, None, &late)))
            }
            Collector::Updater => match &updater {
                None => out.push(failed(item, None, &late)),
                Some(Err(e)) => out.push(failed(
                    item,
                    None,
                    &format!("the updater did not answer: {e}"),
                )),
                Some(Ok(sections)) => {
                    let mine: Vec<&Section> = sections.iter().filter(|s| s.item == item).collect();
                    if mine.is_empty() {
                        out.push(failed(item, None, "the updater sent no section for it"));
                    }
                    for s in mine {
                        out.push(Raw {
                            item,
                            workload: s.workload.clone(),
                            text: s.text.clone(),
                            cut: s.cut,
                            error: s.error.clone(),
                        });
                    }
                }
            },
        }
    }
    out
}

fn failed(item: Item, workload: Option<WorkloadName>, error: &str) -> Raw {
    Raw {
        item,
        workload,
        text: String::new(),
        cut: false,
        error: Some(error.to_owned()),
    }
}

/// Redacts and bounds each section; the count of redactions. Without the values to redact (`Err`: the
/// device's secrets could not be read), no text leaves the device.
fn finish(raws: Vec<Raw>, lines: u32, redactor: Result<&Redactor, &str>) -> (Vec<Section>, u32) {
    let mut count = 0;
    let sections = raws
        .into_iter()
        .map(|r| {
            let Ok(red) = redactor else {
                let why = redactor.err().unwrap_or_default();
                return Section::failed(
                    r.item,
                    r.workload,
                    format!("withheld: the values to redact could not be read: {why}"),
                );
            };
            let (text, n) = red.redact(&r.text);
            count += n;
            let mut s = Section::new(r.item, r.workload, &text, lines);
            // The updater's sections are bounded already; redaction may have lengthened them.
            if s.text.len() > MAX_SECTION_BYTES {
                s.text = tail(&s.text, usize::MAX, MAX_SECTION_BYTES).0;
                s.cut = true;
            }
            s.cut |= r.cut;
            if let Some(e) = r.error {
                let (e, n) = red.redact(&e);
                count += n;
                s.error = Section::failed(s.item, None, e).error;
            }
            s
        })
        .collect();
    (sections, count)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(n: &str) -> WorkloadName {
        WorkloadName::try_from(n).expect("name")
    }

    #[test]
    fn unfinished_sections_say_so_in_menu_order() {
        let items = Item::ALL.to_vec();
        let got = vec![
            Raw {
                item: Item::Memory,
                workload: None,
                text: "MemTotal: 1 GiB".into(),
                cut: false,
                error: None,
            },
            Raw {
                item: Item::WorkloadLogs,
                workload: Some(w("b")),
                text: "hello".into(),
                cut: false,
                error: None,
            },
        ];
        let out = assemble(
            &items,
            Some(vec![w("a"), w("b")]),
            got,
            Some(Err("unknown-request".into())),
            DEADLINE,
        );
        let titles: Vec<String> = out
            .iter()
            .map(|r| {
                format!(
                    "{}{} {}",
                    r.item.name(),
                    r.workload
                        .as_ref()
                        .map(|w| format!(" {}", w.as_str()))
                        .unwrap_or_default(),
                    r.error.as_deref().unwrap_or("ok")
                )
            })
            .collect();
        assert_eq!(
            titles,
            vec![
                "workloadLogs a not collected within 20 s",
                "workloadLogs b ok",
                "containers not collected within 20 s",
                "disk not collected within 20 s",
                "memory ok",
                "agentJournal the updater did not answer: unknown-request",
                "updaterJournal the updater did not answer: unknown-request",
                "failedUnits the updater did not answer: unknown-request",
                "bootDiagnostics the updater did not answer: unknown-request",
                "updaterState the updater did not answer: unknown-request",
            ]
        );
    }

    #[test]
    fn sections_are_redacted_and_counted_or_withheld() {
        let raws = vec![Raw {
            item: Item::WorkloadLogs,
            workload: Some(w("a")),
            text: "a\nprinted the-secret-1\nb\n".into(),
            cut: true,
            error: Some("password=oops".into()),
        }];
        let red = Redactor::new(["the-secret-1".to_owned()]);
        let (s, n) = finish(raws.clone(), 2, Ok(&red));
        assert_eq!(n, 2);
        assert_eq!(s[0].text, "printed [redacted]\nb");
        assert_eq!(s[0].error.as_deref(), Some("password=[redacted]"));
        assert!(s[0].cut);
        let (s, n) = finish(raws, 2, Err("nats down"));
        assert_eq!(n, 0);
        assert!(s[0].text.is_empty());
        assert!(s[0].error.as_deref().unwrap_or("").contains("withheld"));
    }
}
