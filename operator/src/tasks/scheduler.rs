//! The TaskSchedule controller: at each tick of a schedule (UTC, [`super::schedule`]) it creates one TaskRun from
//! the template, named after the schedule and the tick and owned by the schedule, unless a run of the schedule is
//! still active or the schedule is suspended (the tick is then skipped, in status and as an Event).
//!
//! Replicas need no leader: a tick's run name is deterministic (a second create gets 409 and changes nothing) and
//! status writes carry the object's resourceVersion. The clock is an option, so tests can move time.

use super::schedule::{self, Decision, Schedule};
use crate::cache::Caches;
use crate::conditions::{self, Want};
use crate::crd::tasks::{created_at, TaskRun, TaskSchedule, TaskScheduleStatus};
use crate::fleet::report;
use fleet_wire::{TaskRunPhase, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::Store as Cache;
use kube::{Client, Resource, ResourceExt};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// The label naming a run's schedule.
pub const SCHEDULE_LABEL: &str = "fleet.nationtech.io/schedule";

/// Longest object name (a DNS subdomain).
pub const MAX_NAME_CHARS: usize = 253;

/// The time source.
pub type Clock = Arc<dyn Fn() -> Timestamp + Send + Sync>;

/// How the controller runs.
#[derive(Clone)]
pub struct Options {
    /// This replica's name for events.
    pub instance: Option<String>,
    /// Only TaskSchedules and TaskRuns with these labels are handled.
    pub label_selector: Option<String>,
    /// The clock ([`Timestamp::now`] outside tests).
    pub clock: Clock,
    /// A pass runs at least this often (besides at every tick and every change).
    pub resync: Duration,
}

impl Options {
    /// Real time, a pass at least every 30 s.
    pub fn new(instance: Option<String>, label_selector: Option<String>) -> Self {
        Self {
            instance,
            label_selector,
            clock: Arc::new(Timestamp::now),
            resync: Duration::from_secs(30),
        }
    }
}

/// Runs the TaskSchedule controller until the task is dropped or aborted.
pub async fn run(
    client: Client,
    opts: Options,
) -> Result<(), kube::runtime::reflector::store::WriterDropped> {
    let caches = Caches::watch(&client, &opts.label_selector);
    run_with(client, &caches, opts).await
}

/// [`run`] with the operator's shared caches (its runtime's).
pub async fn run_with(
    client: Client,
    caches: &Caches,
    opts: Options,
) -> Result<(), kube::runtime::reflector::store::WriterDropped> {
    let notify = Arc::new(Notify::new());
    let schedules = caches.schedules.subscribe(&notify);
    let runs = caches.runs.subscribe(&notify);
    caches.schedules.ready().await?;
    // Never decide "no active run" from a partial view.
    caches.runs.ready().await?;
    log::info!("task schedules: caches synced");
    let recorder = report::recorder(client.clone(), opts.instance.clone());
    loop {
        let now = (opts.clock)();
        let mut wait = opts.resync;
        for s in schedules.state() {
            if let Some(next) = reconcile(&client, &recorder, &runs, &s, now).await {
                let until = Duration::from_millis(next.unix_ms().saturating_sub(now.unix_ms()));
                wait = wait.min(until + Duration::from_millis(20));
            }
        }
        tokio::select! {
            _ = notify.notified() => {}
            _ = tokio::time::sleep(wait) => {}
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One schedule's pass; returns its next tick.
async fn reconcile(
    client: &Client,
    recorder: &Recorder,
    runs: &Cache<TaskRun>,
    s: &TaskSchedule,
    now: Timestamp,
) -> Option<Timestamp> {
    let old = s.status.clone().unwrap_or_default();
    let mut next = TaskScheduleStatus {
        conditions: vec![],
        ..old.clone()
    };
    let uid = s.uid().unwrap_or_default();
    let mut owned: Vec<Arc<TaskRun>> = runs
        .state()
        .into_iter()
        .filter(|r| r.owner_references().iter().any(|o| o.uid == uid))
        .collect();
    owned.sort_by_key(|r| r.creation_timestamp().map(|t| t.0));
    let terminal = |r: &TaskRun| {
        r.status
            .as_ref()
            .and_then(|st| st.run.phase)
            .is_some_and(TaskRunPhase::is_terminal)
    };
    let active = owned.iter().find(|r| !terminal(r)).map(|r| r.name_any());
    next.last_successful_run = owned
        .iter()
        .rev()
        .find(|r| r.status.as_ref().and_then(|st| st.run.phase) == Some(TaskRunPhase::Complete))
        .map(|r| r.name_any())
        .or(old.last_successful_run.clone());
    next.active_run = active.clone();
    let mut events = vec![];
    // A run's name is the schedule's and a tick's: it must stay a valid object name.
    // Unknown fields (`suspended: true` for `suspend`) make the spec invalid: nothing is scheduled from it.
    // Every problem at once (the template's too), as the webhook names them.
    let parsed = match crate::validation::refusal_of(s, crate::validation::schedule_spec(&s.spec)) {
        Some(m) => Err(m),
        None => Schedule::parse(&s.spec.schedule),
    };
    let parsed = parsed.and_then(|sched| {
        match schedule::run_name(&s.name_any(), now).len() > MAX_NAME_CHARS {
            true => Err(format!(
                "the name is too long for its runs' names (<name>-<tick>, at most {MAX_NAME_CHARS} characters)"
            )),
            false => Ok(sched),
        }
    });
    let ready = match parsed {
        Err(e) => {
            next.expression = None;
            next.next_tick = None;
            Want {
                type_: conditions::READY,
                ok: false,
                reason: conditions::REASON_INVALID_SPEC,
                message: e,
            }
        }
        Ok(sched) => {
            next.expression = Some(sched.expression.clone());
            let last = old
                .last_schedule_time
                .as_deref()
                .and_then(|t| t.parse::<Timestamp>().ok())
                .unwrap_or_else(|| created_at(s));
            match schedule::decide(&sched, last, now, active.is_some(), s.spec.suspend) {
                Decision::Wait => {}
                Decision::Skip(tick) => {
                    next.last_schedule_time = Some(tick.to_string());
                    next.skipped_ticks += 1;
                    let why = match &active {
                        Some(a) if !s.spec.suspend => format!("TaskRun {a} is still active"),
                        _ => "the schedule is suspended".to_owned(),
                    };
                    events.push(event(
                        EventType::Normal,
                        "Skipped",
                        format!("tick {tick} skipped: {why}"),
                    ));
                }
                Decision::Create(tick) => match create_run(client, s, tick).await {
                    Ok(name) => {
                        next.last_schedule_time = Some(tick.to_string());
                        next.active_run = Some(name.clone());
                        events.push(event(
                            EventType::Normal,
                            "Created",
                            format!("TaskRun {name} for tick {tick}"),
                        ));
                    }
                    Err(e) => log::warn!("TaskSchedule {}: create run: {e}", s.name_any()),
                },
            }
            next.next_tick = sched.next_after(now).map(|t| t.to_string());
            Want {
                type_: conditions::READY,
                ok: true,
                reason: "Scheduled",
                message: format!("runs at {} (UTC)", sched.expression),
            }
        }
    };
    let time = Time(k8s_openapi::jiff::Timestamp::now());
    next.conditions = conditions::merge(&old.conditions, &[ready], s.metadata.generation, &time);
    for c in conditions::newly_failing(&old.conditions, &next.conditions) {
        events.push(event(EventType::Warning, &c.reason, c.message.clone()));
    }
    let tick = next.next_tick.as_deref().and_then(|t| t.parse().ok());
    if next == old {
        return tick;
    }
    let api: Api<TaskSchedule> =
        Api::namespaced(client.clone(), &s.namespace().unwrap_or_default());
    // Only the differences, with `null` for what the new status lacks: nothing stale stays behind.
    // (An absent status is `null`, not a default one, so the first write carries every field.)
    let (Ok(old_v), Ok(next_v)) = (serde_json::to_value(&s.status), serde_json::to_value(&next))
    else {
        return tick;
    };
    let patch = serde_json::json!({
        "metadata": {"resourceVersion": s.resource_version()},
        "status": report::merge_diff(&old_v, &next_v),
    });
    match api
        .patch_status(&s.name_any(), &PatchParams::default(), &Patch::Merge(patch))
        .await
    {
        Ok(_) => {
            let reference = s.object_ref(&());
            for ev in events {
                if let Err(e) = recorder.publish(&ev, &reference).await {
                    log::warn!("event {} for TaskSchedule {}: {e}", ev.reason, s.name_any());
                }
            }
        }
        // Another replica (or a newer version of the object) got there first: the next pass re-reads.
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => log::warn!("TaskSchedule {}: status write: {e}", s.name_any()),
    }
    tick
}

fn event(type_: EventType, reason: &str, note: String) -> Event {
    Event {
        type_,
        reason: reason.to_owned(),
        note: Some(note),
        action: "Schedule".into(),
        secondary: None,
    }
}

/// Creates the run of `tick` (an existing one of that name is the same run: another replica created it).
async fn create_run(
    client: &Client,
    s: &TaskSchedule,
    tick: Timestamp,
) -> Result<String, kube::Error> {
    let name = schedule::run_name(&s.name_any(), tick);
    let mut run = TaskRun::new(&name, s.spec.template.clone());
    let mut labels = s.labels().clone();
    labels.insert(SCHEDULE_LABEL.into(), s.name_any());
    run.metadata.labels = Some(labels);
    run.metadata.namespace = s.namespace();
    run.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "fleet.nationtech.io/v1alpha1".into(),
        kind: "TaskSchedule".into(),
        name: s.name_any(),
        uid: s.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }]);
    let api: Api<TaskRun> = Api::namespaced(client.clone(), &s.namespace().unwrap_or_default());
    match api.create(&PostParams::default(), &run).await {
        Ok(_) => Ok(name),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(name),
        Err(e) => Err(e),
    }
}
