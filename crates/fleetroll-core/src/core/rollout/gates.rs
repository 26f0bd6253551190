//! Planning a revision, the gates a batch passes (the end of the plan, a pause, an approval, the pause
//! between batches) and the start of a batch: its intent, written before any of its targets changes.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use super::{
    Event, Facts, Step, Transition, approval, finish, later, summary::set_conditions, total_batches,
    trim_front, until, windows, write, write_if_changed,
};
use crate::{
    api::{
        BATCH_WINDOW, BatchState, BatchStatus, FleetRolloutSpec, FleetRolloutStatus, HISTORY, Phase, PlanRef,
        PolicyHold, Revision, RevisionInputs, SupersededRevision, TROUBLE_LISTED, time,
    },
    core::{
        Blocked,
        clusters::{self, PlannedWave},
        count, duration,
        plan::Plan,
        policy, reason,
    },
};

/// The status for a spec that cannot be acted on. The stored revision (if any) is kept as it is.
pub fn blocked(
    now: Timestamp,
    generation: i64,
    status: &FleetRolloutStatus,
    why: &Blocked,
) -> Option<Transition> {
    blocked_in(Phase::Pending, now, generation, status, why)
}

/// The status saying why the rollout cannot go on, in `phase`; None when the status says so already.
pub(super) fn blocked_in(
    phase: Phase,
    now: Timestamp,
    generation: i64,
    status: &FleetRolloutStatus,
    why: &Blocked,
) -> Option<Transition> {
    let mut s = status.clone();
    s.observed_generation = Some(generation);
    s.phase = phase;
    s.reason = Some(why.reason.to_string());
    s.message = Some(why.message.clone());
    set_conditions(&mut s, generation, now, Some(why));
    (s != *status).then(|| Transition {
        status: s,
        events: vec![Event::warning(why.reason, None, why.message.clone())],
    })
}

/// What planning does about picked member clusters that do not answer.
#[derive(Clone, Debug, PartialEq)]
pub enum ClusterWait {
    /// Plan now, without the clusters that still do not answer (if any).
    Plan,
    /// Wait for them: write this status first, if it changed.
    Wait(Option<Box<Transition>>),
}

/// Member clusters the selector picks that do not answer when a rollout is first planned are waited for,
/// up to the health timeout from when planning first missed one: a member down for a moment when a
/// rollout is created is not left out of it for good, and one that stays down holds it no longer than a
/// batch would wait for it (it is then left out, and listed in `status.clusters.leftOut`). Only before the
/// first revision: a rollout already running keeps its status, and an abort is not held.
pub fn await_clusters(
    now: Timestamp,
    generation: i64,
    spec: &FleetRolloutSpec,
    status: &FleetRolloutStatus,
    unanswered: &[(String, String)],
) -> ClusterWait {
    if unanswered.is_empty() || status.revision.is_some() || spec.abort {
        return ClusterWait::Plan;
    }
    // Whole seconds, as the status stores time; never later than now (the status is read back: input).
    let now_s = Timestamp::from_second(now.as_second()).unwrap_or(now);
    let previous = status.clusters.as_ref();
    let started = previous.and_then(|c| c.planning_since.as_ref()).map(|t| t.0.min(now_s));
    let since = started.unwrap_or(now_s);
    let deadline = later(since, duration::parse(&spec.health.timeout).unwrap_or(Duration::from_secs(600)));
    if now >= deadline {
        return ClusterWait::Plan;
    }
    let mut names: Vec<&str> =
        unanswered.iter().take(TROUBLE_LISTED).map(|(name, _)| name.as_str()).collect();
    let more = unanswered.len().saturating_sub(TROUBLE_LISTED);
    let more = if more > 0 { format!(" and {more} more") } else { String::new() };
    names.sort_unstable();
    let message = format!(
        "planning waits for member clusters that do not answer: {}{more} (until {deadline}; then they are \
         left out of the plan)",
        names.join(", ")
    );
    let mut s = status.clone();
    s.observed_generation = Some(generation);
    s.phase = Phase::Pending;
    s.reason = Some(reason::WAITING_FOR_CLUSTERS.into());
    s.message = Some(message.clone());
    let mut c = status.clusters.clone().unwrap_or_default();
    let listed = previous.map_or(&[][..], |p| p.trouble.as_slice());
    c.trouble = clusters::trouble(listed, &unanswered.iter().cloned().collect(), now);
    // A cluster already listed keeps its first reason: error text that varies is not a status write.
    for t in &mut c.trouble {
        if let Some(p) = listed.iter().find(|p| p.name == t.name) {
            t.message.clone_from(&p.message);
        }
    }
    c.planning_since = Some(time(since));
    s.clusters = Some(c);
    set_conditions(&mut s, generation, now, None);
    let events = match started {
        Some(_) => Vec::new(),
        None => vec![Event::warning(reason::WAITING_FOR_CLUSTERS, None, message)],
    };
    ClusterWait::Wait((s != *status).then(|| Box::new(Transition { status: s, events })))
}

/// A revision about to start: its inputs, their hash, and its frozen plan (and where that is stored).
#[derive(Clone, Debug)]
pub struct NewRevision<'a> {
    pub inputs: RevisionInputs,
    pub spec_hash: String,
    pub plan: &'a Plan,
    pub plan_ref: PlanRef,
    /// The waves of a rollout across member clusters (empty otherwise).
    pub waves: &'a [PlannedWave],
    /// Member Secrets that could not be used, for people (each a Warning event).
    pub refused: &'a [String],
    /// Member clusters picked but not reachable at planning, with why.
    pub left_out: &'a [(String, String)],
}

/// Starts a new revision with a frozen plan: the old revision (if any) is recorded as superseded, and
/// every counter starts again.
pub fn start_revision(
    now: Timestamp,
    generation: i64,
    spec: &FleetRolloutSpec,
    status: &FleetRolloutStatus,
    new: NewRevision<'_>,
) -> Transition {
    let NewRevision { inputs, spec_hash, plan, plan_ref, waves, refused, left_out } = new;
    let mut s = FleetRolloutStatus { superseded: status.superseded.clone(), ..Default::default() };
    let mut events = Vec::new();
    let number = match &status.revision {
        Some(old) => {
            s.superseded.push(SupersededRevision {
                number: old.number,
                image: old.inputs.image.clone(),
                updated: status.counts.updated,
                superseded_at: time(now),
            });
            trim_front(&mut s.superseded, HISTORY);
            let message = format!(
                "revision {} ({}) superseded after {} of {} targets were updated; re-planning for {}",
                old.number, old.inputs.image, status.counts.updated, status.counts.total, spec.image
            );
            events.push(Event::normal(reason::SUPERSEDED, None, message));
            old.number + 1
        }
        None => 1,
    };
    s.revision = Some(Revision { number, spec_hash, inputs, started_at: time(now) });
    s.counts.total = plan.total_targets();
    s.plan = Some(plan_ref);
    s.started_at = Some(time(now));
    s.phase = Phase::Progressing;
    s.reason = Some(reason::PLANNED.into());
    let message = format!(
        "revision {number}: {} targets in {} batches, plan {}",
        plan.total_targets(),
        plan.total_batches(),
        plan.hash
    );
    events.push(Event::normal(reason::PLANNED, None, message));
    if !waves.is_empty() {
        let mut clusters = clusters::planned_status(waves, &plan.batches);
        events.push(Event::normal(reason::PLANNED, None, clusters::describe(&clusters)));
        // A cluster planning waited for is out of the plan since the wait began.
        let waited = status.clusters.as_ref().map_or(&[][..], |c| c.trouble.as_slice());
        clusters.left_out = clusters::trouble(waited, &left_out.iter().cloned().collect(), now);
        s.clusters = Some(clusters);
    }
    events.extend(refused.iter().map(|m| Event::warning(reason::CLUSTER_REFUSED, None, m.clone())));
    finish(&mut s, generation, now);
    Transition { status: s, events }
}

/// A gate that holds the next batch: Some(the step to take instead of starting it).
pub(super) type Gate = Option<Step>;

/// Gates and starts the next batch, or finishes the rollout.
pub(super) fn next_batch(f: &Facts<'_>, mut s: FleetRolloutStatus, mut events: Vec<Event>) -> Step {
    let next = s.current_batch.map_or(0, |i| i + 1);
    if next >= total_batches(f) {
        return succeed(f, s, events);
    }
    let held = acting(f, &mut s, &mut events, next)
        .or_else(|| rights_lost(f, &mut s, &mut events, next))
        .or_else(|| guarded(f, &mut s, &mut events, next))
        .or_else(|| paused(f, &mut s, &mut events, next))
        .or_else(|| approval::approved(f, &mut s, &mut events, next))
        .or_else(|| paced(f, &mut s, &mut events))
        .or_else(|| windows::windowed(f, &mut s, &mut events, next));
    match held {
        Some(step) => step,
        None => start_batch(f, s, events, next),
    }
}

fn succeed(f: &Facts<'_>, mut s: FleetRolloutStatus, mut events: Vec<Event>) -> Step {
    s.phase = Phase::Succeeded;
    s.reason = Some(reason::SUCCEEDED.into());
    s.pending_approval = None;
    s.finished_at = Some(time(f.now));
    let c = &s.counts;
    let message = format!(
        "{} targets on {}: {} healthy, {} failed, {} skipped",
        c.total, f.spec.image, c.healthy, c.failed, c.skipped
    );
    events.push(Event::normal(reason::SUCCEEDED, None, message));
    write(f, s, events)
}

/// A rollout whose creator the operator cannot act as holds every batch (the first one too, so nothing
/// changes): its changes would otherwise be made with rights no one granted it.
fn acting(f: &Facts<'_>, s: &mut FleetRolloutStatus, events: &mut Vec<Event>, next: u32) -> Gate {
    let Some(why) = f.cannot_act else {
        s.creator_hold = None;
        return None;
    };
    let why = crate::core::text::cut(why, 1024);
    if s.creator_hold.as_ref() != Some(&why) {
        let message = format!("batch {}/{} held: {why}", next + 1, total_batches(f));
        events.push(Event::warning(reason::CANNOT_ACT_AS_CREATOR, Some(next), message));
    }
    s.creator_hold = Some(why);
    s.phase = Phase::Paused;
    s.reason = Some(reason::CANNOT_ACT_AS_CREATOR.into());
    Some(write_if_changed(f, s.clone(), std::mem::take(events), None))
}

/// A change under way (a batch begun, a rollback) that the operator cannot make as the creator waits,
/// in the phase it is in, with `status.creatorHold` saying why.
pub(super) fn waiting_for_creator(f: &Facts<'_>, why: &str) -> Step {
    let mut s = f.status.clone();
    let why = crate::core::text::cut(why, 1024);
    let mut events = Vec::new();
    if s.creator_hold.as_ref() != Some(&why) {
        let message = format!("changes wait: fleetroll changes targets as the rollout's creator, and {why}");
        events.push(Event::warning(reason::CANNOT_ACT_AS_CREATOR, s.current_batch, message));
    }
    s.creator_hold = Some(why);
    s.reason = Some(reason::CANNOT_ACT_AS_CREATOR.into());
    write_if_changed(f, s, events, None)
}

/// Changes refused because the creator lost its rights hold every later batch until a person resumes the
/// rollout (a new spec.resumeToken), once the rights are back; or aborts or rolls it back.
fn rights_lost(f: &Facts<'_>, s: &mut FleetRolloutStatus, events: &mut Vec<Event>, next: u32) -> Gate {
    let hold = s.rights_hold.clone()?;
    let total = total_batches(f);
    if f.spec.resume_token != hold.resume_token {
        s.rights_hold = None;
        let message =
            format!("resumed before batch {}/{total} after the creator's changes were refused", next + 1);
        events.push(Event::normal(reason::RESUMED, Some(next), message));
        return None;
    }
    if s.reason.as_deref() != Some(reason::CREATOR_LACKS_RIGHTS) {
        let message = format!(
            "batch {}/{total} held: changes made as the rollout's creator were refused in batch {}: {}",
            next + 1,
            hold.batch + 1,
            hold.message
        );
        events.push(Event::warning(reason::CREATOR_LACKS_RIGHTS, Some(next), message));
    }
    s.phase = Phase::Paused;
    s.reason = Some(reason::CREATOR_LACKS_RIGHTS.into());
    Some(write_if_changed(f, s.clone(), std::mem::take(events), None))
}

/// A platform policy the planned rollout breaks holds the next batch (the first one too, so nothing
/// changes) until the spec or the policy changes so that it no longer does.
fn guarded(f: &Facts<'_>, s: &mut FleetRolloutStatus, events: &mut Vec<Event>, next: u32) -> Gate {
    let Some(v) = policy::violation(f.guardrails, f.spec, f.namespace, f.plan, next) else {
        s.policy_hold = None;
        return None;
    };
    let hold = PolicyHold { policy: v.policy, rule: v.rule.into(), message: v.message };
    if s.policy_hold.as_ref() != Some(&hold) {
        let message = format!(
            "batch {}/{} held by FleetRolloutPolicy {} ({}): {}",
            next + 1,
            total_batches(f),
            hold.policy,
            hold.rule,
            hold.message
        );
        events.push(Event::warning(reason::POLICY_VIOLATION, Some(next), message));
    }
    s.policy_hold = Some(hold);
    s.phase = Phase::Paused;
    s.reason = Some(reason::POLICY_VIOLATION.into());
    Some(write_if_changed(f, s.clone(), std::mem::take(events), None))
}

/// `spec.paused` holds the next batch; clearing it lets it go.
fn paused(f: &Facts<'_>, s: &mut FleetRolloutStatus, events: &mut Vec<Event>, next: u32) -> Gate {
    let total = total_batches(f);
    if f.spec.paused {
        if s.phase != Phase::Paused {
            let message = format!("paused before batch {}/{total}", next + 1);
            events.push(Event::normal(reason::PAUSED_BY_SPEC, Some(next), message));
        }
        s.phase = Phase::Paused;
        s.reason = Some(reason::PAUSED_BY_SPEC.into());
        return Some(write_if_changed(f, s.clone(), std::mem::take(events), None));
    }
    if s.phase == Phase::Paused {
        let message = format!("resumed before batch {}/{total}", next + 1);
        events.push(Event::normal(reason::RESUMED, Some(next), message));
    }
    None
}

/// `pauseBetweenBatches`: a timer from the end of the last batch, not a loop.
fn paced(f: &Facts<'_>, s: &mut FleetRolloutStatus, events: &mut Vec<Event>) -> Gate {
    let pause = duration::parse(&f.spec.strategy.pause_between_batches).unwrap_or(Duration::ZERO);
    let last_finished = s.batches.iter().filter_map(|b| b.finished_at.as_ref()).map(|t| t.0).max();
    let done = last_finished.filter(|done| !pause.is_zero() && f.now < later(*done, pause))?;
    s.phase = Phase::Progressing;
    s.reason = Some(reason::WAITING_BETWEEN_BATCHES.into());
    s.pending_approval = None;
    let left = until(f.now, later(done, pause));
    Some(write_if_changed(f, s.clone(), std::mem::take(events), Some(left)))
}

/// Records the intent (batch `next` is Applying, with its key) before any of its targets is touched.
fn start_batch(f: &Facts<'_>, mut s: FleetRolloutStatus, mut events: Vec<Event>, next: u32) -> Step {
    let size = count(f.plan.batch(next).len());
    s.batches.push(BatchStatus {
        index: next,
        size,
        state: BatchState::Applying,
        idempotency_key: super::batch_key(f.uid, s.revision_number(), next),
        started_at: Some(time(f.now)),
        ..Default::default()
    });
    trim_front(&mut s.batches, BATCH_WINDOW);
    s.current_batch = Some(next);
    s.phase = Phase::Progressing;
    s.reason = Some(reason::BATCH_STARTED.into());
    s.pending_approval = None;
    if let Some(u) = (f.unplanned)() {
        s.unplanned = Some(u).filter(|u| u.count > 0);
    }
    let message =
        format!("batch {}/{}: changing {size} targets to {}", next + 1, total_batches(f), f.spec.image);
    events.push(Event::normal(reason::BATCH_STARTED, Some(next), message));
    write(f, s, events)
}
