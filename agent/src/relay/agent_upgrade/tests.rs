//! Table tests of the relay: each scenario is a list of inputs with the effects each must give, run against an
//! executor that acknowledges every write the way the agent loop does when NATS answers.

use super::*;
use fleet_wire::fixtures;

/// One input to the relay.
#[allow(clippy::large_enum_variant)] // a handful per test
enum Step {
    /// A watched intent value at a revision (`None`: deleted).
    Intent(u64, Option<Vec<u8>>),
    /// The resync's re-read of the intent.
    Reread(u64, Option<Vec<u8>>),
    /// The updater's answer to the request in flight.
    Answer(Box<Result<Response, String>>),
    /// The poll after a lost answer found the updater without the attempt.
    AfterLost(&'static str),
    /// A status poll of the updater.
    Updater(Option<AgentUpgradeStatus>),
    /// The binding write fails: the loop calls `not_sent`.
    SaveFails,
}

fn intent(a: &AgentUpgradeAttempt) -> Option<Vec<u8>> {
    Some(serde_json::to_vec(a).expect("json"))
}

fn updater(phase: UpgradePhase) -> AgentUpgradeStatus {
    let mut s = fixtures::upgrade_status();
    s.enter(phase, fixtures::t(1), None);
    s
}

fn accepted(phase: UpgradePhase) -> Result<Response, String> {
    let mut status = fixtures::updater_status();
    status.agent_upgrade = Some(updater(phase));
    Ok(Response::Accepted { status })
}

fn accepted_box(phase: UpgradePhase) -> Box<Result<Response, String>> {
    Box::new(accepted(phase))
}

/// One scenario: what it shows, the bindings at start, and its steps with the effects each must give.
type Scenario = (&'static str, Bindings, Vec<(Step, &'static [&'static str])>);

/// A short name per effect: what a table row expects.
fn name(e: &Effect) -> String {
    match e {
        Effect::SaveBindings {
            sending: Some(_), ..
        } => "save-before-send".into(),
        Effect::SaveBindings { .. } => "save".into(),
        Effect::Publish(s) => format!("publish {:?} {:?}", s.phase, s.reason),
        Effect::Mirror(s) => format!("mirror {:?}", s.phase),
        Effect::PublishPending(s) => format!("pending {:?}", s.reason),
        Effect::Send(a) if a.attempt_id.to_string() == fixtures::ATTEMPT => "send a".into(),
        Effect::Send(_) => "send b".into(),
        Effect::Recheck { .. } => "recheck".into(),
    }
}

/// Runs `steps` on `relay`, checking each step's effects, and acknowledges them as the agent loop does.
fn run(relay: &mut Relay, steps: Vec<(Step, &'static [&'static str])>) {
    let id = |r: &Relay| r.in_flight.unwrap_or(fixtures::attempt().attempt_id);
    let mut last_sent = None;
    for (i, (step, want)) in steps.into_iter().enumerate() {
        let now = fixtures::t(10 + i as u64);
        let change = |revision, value: Option<Vec<u8>>| Change {
            revision,
            value: value.map_or(Value::Absent, Value::Put),
        };
        let effects = match step {
            Step::Intent(rev, v) => relay.on_intent(&change(rev, v), now),
            Step::Reread(rev, v) => relay.on_intent_reread(&change(rev, v), now),
            Step::Answer(r) => {
                let sent = id(relay);
                relay.on_answer(sent, *r, now)
            }
            Step::AfterLost(e) => relay.after_lost_answer(last_sent.expect("sent"), e, now),
            Step::Updater(s) => relay.on_updater_status(s),
            Step::SaveFails => {
                relay.not_sent(id(relay));
                Vec::new()
            }
        };
        let got: Vec<String> = effects.iter().map(name).collect();
        assert_eq!(got, want, "step {i}");
        for e in effects {
            match e {
                Effect::Mirror(s) => relay.mirrored(*s),
                Effect::PublishPending(s) => relay.pending_published(&s),
                Effect::Send(a) => last_sent = Some(a.attempt_id),
                Effect::Recheck { attempt, .. } => last_sent = Some(attempt),
                _ => {}
            }
        }
    }
}

fn relay_with(bindings: Bindings) -> Relay {
    Relay::new(fixtures::device(), Architecture::Arm64, bindings)
}

#[test]
fn relay_table() {
    use UpgradePhase as P;
    let a = fixtures::attempt();
    let mut b = a.clone();
    b.attempt_id = AttemptId::try_from("1d7c0a55-8d0a-4c55-9a77-3f2e1d0c9b8a").expect("id");
    let mut reused = a.clone();
    reused.target_version = fleet_wire::Version::try_from("9.9.9").expect("v");
    let mut other_device = a.clone();
    other_device.device_id = DeviceId::try_from("device-2").expect("id");
    let new_a: &[&str] = &["save-before-send", "publish Preparing None", "send a"];
    let rejected: &[&str] = &["publish Failed Some(Rejected)"];
    let mut bound = Bindings::default();
    bound.bind(&a.attempt_id, &a.digest(), fixtures::t(0));
    let mut bound_accepted = bound.clone();
    bound_accepted.mark_accepted(&a.attempt_id);

    let table: Vec<Scenario> = vec![
        (
            "a new attempt is bound, published as preparing, sent once and mirrored to the end",
            Bindings::default(),
            vec![
                (Step::Intent(1, intent(&a)), new_a),
                (Step::Intent(1, intent(&a)), &[]),
                (Step::Answer(accepted_box(P::Preparing)), &["save", "mirror Preparing"]),
                (Step::Updater(Some(updater(P::Preparing))), &[]),
                (Step::Updater(Some(updater(P::Complete))), &["mirror Complete"]),
                (Step::Intent(2, intent(&a)), &[]),
            ],
        ),
        (
            "bad intents are rejected and never sent; a deletion does nothing",
            Bindings::default(),
            vec![
                (Step::Intent(1, Some(b"{".to_vec())), rejected),
                (Step::Intent(2, intent(&other_device)), rejected),
                (Step::Intent(3, None), &[]),
                (Step::Intent(2, Some(b"[]".to_vec())), &[]),
            ],
        ),
        (
            "an attempt id reused with other content is rejected",
            bound.clone(),
            vec![(Step::Intent(1, intent(&reused)), rejected)],
        ),
        (
            "a new attempt while one is in flight waits for the resync after the answer",
            Bindings::default(),
            vec![
                (Step::Intent(1, intent(&a)), new_a),
                (Step::Intent(2, intent(&b)), &[]),
                (Step::Reread(2, intent(&b)), &[]),
                (Step::Answer(accepted_box(P::Preparing)), &["save", "mirror Preparing"]),
                (
                    Step::Reread(2, intent(&b)),
                    &["save-before-send", "publish Preparing None", "send b"],
                ),
                (Step::Reread(2, intent(&b)), &[]),
            ],
        ),
        (
            "a refusal fails the attempt with the updater's reason",
            Bindings::default(),
            vec![
                (Step::Intent(1, intent(&a)), new_a),
                (
                    Step::Answer(Box::new(Ok(Response::error(ErrorCode::Busy, "busy")))),
                    &["publish Failed Some(Busy)"],
                ),
                (Step::Intent(2, intent(&a)), &["send a"]),
            ],
        ),
        (
            "an unreachable updater leaves the attempt pending, published once per error, and sends it again",
            Bindings::default(),
            vec![
                (Step::Intent(1, intent(&a)), new_a),
                (Step::Answer(Box::new(Err("no socket".into()))), &["recheck"]),
                (Step::AfterLost("no socket"), &["pending Some(UpdaterUnreachable)"]),
                (Step::Reread(1, intent(&a)), &["send a"]),
                (Step::Answer(Box::new(Err("no socket".into()))), &["recheck"]),
                (Step::AfterLost("no socket"), &[]),
                (Step::Reread(1, intent(&a)), &["send a"]),
                (Step::Answer(Box::new(Err("refused".into()))), &["recheck"]),
                (Step::AfterLost("refused"), &["pending Some(UpdaterUnreachable)"]),
                (Step::Reread(1, intent(&a)), &["send a"]),
                (Step::Answer(accepted_box(P::Preparing)), &["save", "mirror Preparing"]),
                (Step::Reread(1, intent(&a)), &[]),
            ],
        ),
        (
            "a lost answer from an updater that has the attempt is not pending",
            Bindings::default(),
            vec![
                (Step::Intent(1, intent(&a)), new_a),
                (Step::Answer(Box::new(Err("reset".into()))), &["recheck"]),
                (Step::Updater(Some(updater(P::Preparing))), &["mirror Preparing"]),
                (Step::AfterLost("reset"), &[]),
            ],
        ),
        (
            "an attempt whose binding cannot be written is not in flight",
            Bindings::default(),
            vec![
                (Step::Intent(1, intent(&a)), new_a),
                (Step::SaveFails, &[]),
                (Step::Reread(2, intent(&a)), &["send a"]),
            ],
        ),
        (
            "after a restart, a bound attempt never accepted is sent again without a new binding",
            bound,
            vec![(Step::Intent(1, intent(&a)), &["send a"])],
        ),
        (
            "after a restart, an accepted attempt is not sent again",
            bound_accepted,
            vec![(Step::Intent(1, intent(&a)), &[])],
        ),
        (
            "another device's status is not mirrored",
            Bindings::default(),
            vec![(
                Step::Updater(Some({
                    let mut s = updater(P::Preparing);
                    s.device_id = DeviceId::try_from("device-2").expect("id");
                    s
                })),
                &[],
            )],
        ),
    ];
    for (what, bindings, steps) in table {
        eprintln!("{what}");
        run(&mut relay_with(bindings), steps);
    }
}

#[test]
fn activity_follows_the_request_and_the_mirrored_phase() {
    let a = fixtures::attempt();
    let mut r = relay_with(Bindings::default());
    assert!(!r.active() && r.idle());
    let change = Change {
        revision: 1,
        value: Value::Put(serde_json::to_vec(&a).expect("json")),
    };
    r.on_intent(&change, fixtures::t(1));
    assert!(r.active() && !r.idle());
    r.on_answer(
        a.attempt_id,
        accepted(UpgradePhase::Starting),
        fixtures::t(2),
    );
    r.mirrored(updater(UpgradePhase::Starting));
    assert!(r.active() && r.idle());
    r.mirrored(updater(UpgradePhase::Complete));
    assert!(!r.active());
}

#[test]
fn recovery_table() {
    use UpgradePhase as P;
    let stopping_other = {
        let mut s = updater(P::Stopping);
        s.attempt_id =
            Some(AttemptId::try_from("1d7c0a55-8d0a-4c55-9a77-3f2e1d0c9b8a").expect("id"));
        s
    };
    let at = |s: &str| s.parse::<Timestamp>().expect("timestamp");
    let with = |phase, id: &str, started: &str| {
        let mut s = updater(phase);
        s.attempt_id = Some(AttemptId::try_from(id).expect("id"));
        s.attempt_started_at = at(started);
        s
    };
    let (a, b) = (
        "0b7c0a55-8d0a-4c55-9a77-3f2e1d0c9b8a",
        "2e7c0a55-8d0a-4c55-9a77-3f2e1d0c9b8a",
    );
    // (published in NATS, the updater's transaction, written before readiness)
    let table = [
        (None, None, false),
        (None, Some(updater(P::Starting)), true),
        // NATS lost or never got the record: the updater's is the truth.
        (None, Some(updater(P::Complete)), true),
        // An earlier attempt's final record while the updater finished a later one (its `preparing` write
        // failed): replaced.
        (
            Some(with(P::Complete, a, "2026-01-01T00:00:00Z")),
            Some(with(P::Failed, b, "2026-01-02T00:00:00Z")),
            true,
        ),
        // A later attempt's record (rejected after the updater's attempt finished): kept.
        (
            Some({
                let mut r = with(P::Failed, a, "2026-01-03T00:00:00Z");
                r.reason = Some(UpgradeReason::Rejected);
                r
            }),
            Some(with(P::Complete, b, "2026-01-02T00:00:00Z")),
            false,
        ),
        (
            Some(updater(P::Complete)),
            Some(updater(P::Complete)),
            false,
        ),
        (Some(updater(P::Starting)), Some(updater(P::Complete)), true),
        (
            Some(stopping_other.clone()),
            Some(updater(P::Complete)),
            true,
        ),
        (Some(stopping_other), None, false),
    ];
    for (i, (published, recovered, written)) in table.into_iter().enumerate() {
        let mut r = relay_with(Bindings::default());
        let out = r.recover(published.as_ref(), recovered.clone());
        assert_eq!(out.is_some(), written, "row {i}");
        assert_eq!(r.mirrored, recovered, "row {i}");
    }
}
