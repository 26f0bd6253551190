//! The rollout state machine, as pure functions from facts to the next step.
//!
//! Facts: the spec, the stored status (the checkpoint), the frozen plan, what the targets of the batch in
//! flight look like, and the time. The answer is one step: write a new status, change a batch of targets
//! (whose intent is already written), restore previous images (likewise), or wait. The controller performs
//! the step and asks again; it never decides anything itself.
//!
//! Crash safety rests on the order of steps: a batch is recorded as `Applying`, with its idempotency key,
//! in a status write that must succeed (resourceVersion precondition) before any of its targets changes,
//! and a target that already carries the key is not changed again.

use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};

use crate::{
    api::{
        ApprovalMode, ApprovalRecord, BATCH_WINDOW, BatchState, BatchStatus, DENIED_LISTED, FAILURE_DETAILS,
        FailurePolicy, FleetRolloutSpec, FleetRolloutStatus, HISTORY, PendingApproval, Phase, PlanRef,
        PlannedTarget, Revision, RevisionInputs, RollbackState, RollbackStatus, SupersededRevision,
        TargetFailure, Unplanned, target_key, time,
    },
    core::conditions::{self, Desired},
    core::count,
    core::duration,
    core::plan::{self, Plan},
    core::scope::Refusal,
    core::workload::Readiness,
};

/// Phase reasons (also used as condition and event reasons).
pub mod reason {
    pub const PLANNED: &str = "Planned";
    pub const BATCH_STARTED: &str = "BatchStarted";
    pub const BATCH_APPLIED: &str = "BatchApplied";
    pub const BATCH_SUCCEEDED: &str = "BatchSucceeded";
    pub const BATCH_FAILED: &str = "BatchFailed";
    pub const SOAKING: &str = "Soaking";
    pub const WAITING_BETWEEN_BATCHES: &str = "WaitingBetweenBatches";
    pub const PAUSED_BY_SPEC: &str = "PausedBySpec";
    pub const RESUMED: &str = "Resumed";
    pub const WAITING_FOR_APPROVAL: &str = "WaitingForApproval";
    pub const APPROVED: &str = "Approved";
    pub const SUCCEEDED: &str = "Succeeded";
    pub const FAILURE_BUDGET_EXCEEDED: &str = "FailureBudgetExceeded";
    pub const ABORT_REQUESTED: &str = "AbortRequested";
    pub const ROLLBACK_REQUESTED: &str = "RollbackRequested";
    pub const ROLLED_BACK: &str = "RolledBack";
    pub const SUPERSEDED: &str = "Superseded";
    pub const TIMEOUT: &str = "Timeout";
    pub const TARGET_MISSING: &str = "TargetMissing";
    pub const IMAGE_CHANGED: &str = "ImageChangedByOthers";
    pub const HTTP_CHECK_FAILED: &str = "HttpCheckFailed";
    /// The API server refused the change (RBAC, an admission webhook or policy).
    pub const CHANGE_DENIED: &str = "ChangeDenied";
    pub const INVALID_SPEC: &str = "InvalidSpec";
}

/// A target of the batch in flight, as observed now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetState {
    /// The image of the rolled container, or an error if the container cannot be found.
    pub image: Result<String, String>,
    /// The `fleetroll.dev/applied` annotation.
    pub applied: Option<String>,
    /// The workload's own rollout.
    pub readiness: Readiness,
    /// The HTTP check, when one is configured and the workload is ready: Ok, or what went wrong.
    pub http: Option<Result<(), String>>,
}

/// Everything the state machine decides from.
pub struct Facts<'a> {
    pub now: Timestamp,
    pub uid: &'a str,
    pub generation: i64,
    pub spec: &'a FleetRolloutSpec,
    pub status: &'a FleetRolloutStatus,
    pub plan: &'a Plan,
    /// Looks up a target of the plan; None when it no longer exists.
    pub target: &'a dyn Fn(&PlannedTarget) -> Option<TargetState>,
    /// Matching targets outside the plan (asked only when a batch starts: it scans the cache).
    pub unplanned: &'a dyn Fn() -> Option<Unplanned>,
    /// Whether a target may be changed (or restored) now: see [`crate::core::scope`].
    pub scope: &'a dyn Fn(&PlannedTarget) -> Result<(), Refusal>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    Normal,
    Warning,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub type_: EventType,
    pub reason: &'static str,
    pub message: String,
    /// The batch (0-based) it is about, so events of different batches are not merged into one series.
    pub batch: Option<u32>,
}

/// A status to persist, and the events that announce it.
#[derive(Clone, Debug, PartialEq)]
pub struct Transition {
    pub status: FleetRolloutStatus,
    pub events: Vec<Event>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Persist this status (with a resourceVersion precondition), then ask again.
    Write(Transition),
    /// Change these targets to `image`, stamping `key` (the intent is already persisted), then persist
    /// `after`.
    Apply { key: String, image: String, targets: Vec<PlannedTarget>, after: Transition },
    /// Restore each target's previous image, stamping `key` (the intent is already persisted), then call
    /// [`restored`] with `refused`, the targets the scope rules keep from being restored.
    Restore { key: String, targets: Vec<PlannedTarget>, refused: Vec<TargetFailure> },
    /// Nothing to do until something changes, or until `after` has passed.
    Wait { after: Option<Duration> },
}

/// Whether the spec asks for a revision other than the stored one.
pub fn needs_new_revision(spec: &FleetRolloutSpec, status: &FleetRolloutStatus) -> bool {
    status.revision.as_ref().is_none_or(|r| r.inputs != RevisionInputs::of(spec))
}

/// When a finished rollout is due for deletion (`ttlSecondsAfterFinished`), if it is.
pub fn expires_at(spec: &FleetRolloutSpec, status: &FleetRolloutStatus) -> Option<Timestamp> {
    let ttl = spec.ttl_seconds_after_finished?;
    let finished = status.finished_at.as_ref()?.0;
    if !status.phase.is_terminal() {
        return None;
    }
    finished.checked_add(SignedDuration::from_secs(ttl.max(0))).ok()
}

/// The idempotency key of batch `batch` of revision `revision`.
pub fn batch_key(uid: &str, revision: u32, batch: u32) -> String {
    format!("{uid}/{revision}/{batch}")
}

pub fn rollback_key(uid: &str, revision: u32) -> String {
    format!("{uid}/{revision}/rollback")
}

/// Why a revision cannot be planned; the rollout stays Pending with Degraded=True and nothing changes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Blocked {
    pub reason: &'static str,
    pub message: String,
}

/// The status for a spec that cannot be acted on. The stored revision (if any) is kept as it is.
pub fn blocked(
    now: Timestamp,
    generation: i64,
    status: &FleetRolloutStatus,
    why: &Blocked,
) -> Option<Transition> {
    let mut s = status.clone();
    s.observed_generation = Some(generation);
    s.phase = Phase::Pending;
    s.reason = Some(why.reason.to_string());
    s.message = Some(why.message.clone());
    set_conditions(&mut s, generation, now, Some(why));
    (s != *status).then(|| Transition {
        status: s,
        events: vec![Event {
            batch: None,
            type_: EventType::Warning,
            reason: why.reason,
            message: why.message.clone(),
        }],
    })
}

/// A revision about to start: its inputs, their hash, and its frozen plan (and where that is stored).
#[derive(Clone, Debug)]
pub struct NewRevision<'a> {
    pub inputs: RevisionInputs,
    pub spec_hash: String,
    pub plan: &'a Plan,
    pub plan_ref: PlanRef,
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
    let NewRevision { inputs, spec_hash, plan, plan_ref } = new;
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
            events.push(Event {
                batch: None,
                type_: EventType::Normal,
                reason: reason::SUPERSEDED,
                message: format!(
                    "revision {} ({}) superseded after {} of {} targets were updated; re-planning for {}",
                    old.number, old.inputs.image, status.counts.updated, status.counts.total, spec.image
                ),
            });
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
    events.push(Event {
        batch: None,
        type_: EventType::Normal,
        reason: reason::PLANNED,
        message: format!(
            "revision {number}: {} targets in {} batches, plan {}",
            plan.total_targets(),
            plan.total_batches(),
            plan.hash
        ),
    });
    finish(&mut s, generation, now);
    Transition { status: s, events }
}

/// The next step of a rollout whose revision is planned.
pub fn advance(f: &Facts<'_>) -> Step {
    let mut s = f.status.clone();
    s.observed_generation = Some(f.generation);
    let revision = s.revision.as_ref().map_or(0, |r| r.number);

    if s.phase == Phase::RollingBack {
        return match &s.rollback {
            Some(rb) if rb.state == RollbackState::Restoring => {
                let last = f.status.current_batch.unwrap_or_default();
                let (targets, refused) = in_scope(f, changed_targets(f), last);
                Step::Restore { key: rb.idempotency_key.clone(), targets, refused }
            }
            _ => write_if_changed(f, s, Vec::new(), None),
        };
    }
    if s.phase.is_terminal() {
        if f.spec.rollback && s.phase != Phase::RolledBack && s.counts.updated > 0 {
            return start_rollback(f, s, reason::ROLLBACK_REQUESTED, revision);
        }
        return write_if_changed(f, s, Vec::new(), None);
    }
    if f.spec.rollback {
        return start_rollback(f, s, reason::ROLLBACK_REQUESTED, revision);
    }
    if s.phase == Phase::Pending {
        // Halted (a refused plan, say) and now able to go on.
        s.phase = Phase::Progressing;
        s.reason = Some(reason::RESUMED.into());
    }
    if f.spec.abort {
        s.phase = Phase::Aborted;
        s.reason = Some(reason::ABORT_REQUESTED.into());
        s.pending_approval = None;
        s.finished_at = Some(time(f.now));
        let event = Event {
            batch: None,
            type_: EventType::Normal,
            reason: reason::ABORT_REQUESTED,
            message: format!("aborted on request after {} of {} targets", s.counts.updated, s.counts.total),
        };
        return write(f, s, vec![event]);
    }

    let current = s.current_batch.and_then(|i| s.batches.iter().find(|b| b.index == i)).cloned();
    match current {
        Some(b) if b.state == BatchState::Applying => {
            // Refused targets are left alone here and reported when the batch settles (see `verify`).
            let (targets, refused) = in_scope(f, f.plan.batch(b.index).to_vec(), b.index);
            let mut after = s.clone();
            if let Some(entry) = after.batches.iter_mut().find(|x| x.index == b.index) {
                entry.state = BatchState::Verifying;
                entry.applied_at = Some(time(f.now));
            }
            after.counts.updated =
                f.status.counts.updated.saturating_add(b.size.saturating_sub(count(refused.len())));
            after.reason = Some(reason::BATCH_APPLIED.into());
            finish(&mut after, f.generation, f.now);
            let event = Event {
                batch: Some(b.index),
                type_: EventType::Normal,
                reason: reason::BATCH_APPLIED,
                message: format!(
                    "batch {}/{}: {} targets changed to {}",
                    b.index + 1,
                    total_batches(f),
                    b.size,
                    f.spec.image
                ),
            };
            Step::Apply {
                key: b.idempotency_key.clone(),
                image: image(f),
                targets,
                after: Transition { status: after, events: vec![event] },
            }
        }
        Some(b) if b.state == BatchState::Verifying => verify(f, s, b),
        Some(b) if b.state == BatchState::Failed && over_budget(f, &s) => {
            // Held by the Pause policy until the budget is raised, or an abort or rollback arrives.
            write_if_changed(f, s, Vec::new(), None)
        }
        _ => next_batch(f, s, Vec::new()),
    }
}

/// Records, in the status written after a batch was applied, the targets whose change the API server
/// refused: each fails now, with the API server's message, and counts against the failure budget.
pub fn denied(mut after: Transition, batch: u32, denied: Vec<(PlannedTarget, String)>) -> Transition {
    let s = &mut after.status;
    let Some(entry) = s.batches.iter_mut().find(|b| b.index == batch) else { return after };
    for (t, message) in denied {
        let key = target_key(&t.namespace, &t.name);
        if entry.denied.len() >= DENIED_LISTED || entry.denied.contains(&key) {
            continue;
        }
        entry.denied.push(key);
        entry.failed += 1;
        s.counts.failed += 1;
        s.counts.updated = s.counts.updated.saturating_sub(1);
        after.events.push(Event {
            batch: Some(batch),
            type_: EventType::Warning,
            reason: reason::CHANGE_DENIED,
            message: message.clone(),
        });
        s.failures.push(failure(&t, batch, reason::CHANGE_DENIED, message));
    }
    trim_front(&mut s.failures, FAILURE_DETAILS);
    after
}

/// Finishes a rollback once the controller has restored what it could.
pub fn restored(
    now: Timestamp,
    generation: i64,
    status: &FleetRolloutStatus,
    restored: u32,
    skipped: u32,
    refused: Vec<TargetFailure>,
) -> Transition {
    let mut s = status.clone();
    s.observed_generation = Some(generation);
    let skipped = skipped.saturating_add(count(refused.len()));
    s.counts.refused = s.counts.refused.saturating_add(count(refused.len()));
    s.failures.extend(refused.into_iter().map(|f| TargetFailure { message: truncate(f.message, 512), ..f }));
    trim_front(&mut s.failures, FAILURE_DETAILS);
    if let Some(rb) = s.rollback.as_mut() {
        rb.state = RollbackState::Done;
        rb.finished_at = Some(time(now));
        rb.restored = restored;
        rb.skipped = skipped;
    }
    s.phase = Phase::RolledBack;
    s.finished_at = Some(time(now));
    finish(&mut s, generation, now);
    let event = Event {
        batch: None,
        type_: EventType::Normal,
        reason: reason::ROLLED_BACK,
        message: format!(
            "restored the previous image of {restored} targets ({skipped} could not be restored)"
        ),
    };
    Transition { status: s, events: vec![event] }
}

fn verify(f: &Facts<'_>, mut s: FleetRolloutStatus, b: BatchStatus) -> Step {
    let timeout = duration::parse(&f.spec.health.timeout).unwrap_or(Duration::from_secs(600));
    let soak = duration::parse(&f.spec.health.soak).unwrap_or(Duration::ZERO);
    let applied_at = b.applied_at.as_ref().map_or(f.now, |t| t.0);
    let deadline = later(applied_at, timeout);
    let timed_out = f.now >= deadline;
    let want_image = image(f);

    let mut healthy = 0u32;
    let mut failures: Vec<TargetFailure> = Vec::new();
    let mut skipped = 0u32;
    let mut refused: Vec<TargetFailure> = Vec::new();
    let mut waiting: Option<String> = None;
    for t in f.plan.batch(b.index) {
        let http_required = f.spec.health.http.is_some();
        let state = (f.target)(t);
        // A target the batch did not change because the scope rules refused it (its namespace opted out,
        // it is protected, another rollout holds it) is reported as refused, not awaited.
        let ours = state.as_ref().is_some_and(|s| s.applied.as_deref() == Some(b.idempotency_key.as_str()));
        if !ours && b.denied.contains(&target_key(&t.namespace, &t.name)) {
            // Failed when its change was refused; counted then.
            continue;
        }
        if !ours && let Err(r) = (f.scope)(t) {
            refused.push(failure(t, b.index, r.reason, r.message));
            continue;
        }
        match verdict(t, state, &b.idempotency_key, &want_image, http_required, timed_out) {
            Verdict::Healthy => healthy += 1,
            Verdict::Missing => {
                skipped += 1;
                failures.push(failure(
                    t,
                    b.index,
                    reason::TARGET_MISSING,
                    "the target was deleted during the rollout (skipped, not counted as a failure)".into(),
                ));
            }
            Verdict::Failed(reason, message) => failures.push(failure(t, b.index, reason, message)),
            Verdict::Waiting(why) => {
                waiting.get_or_insert_with(|| format!("{}: {why}", target_key(&t.namespace, &t.name)));
            }
        }
    }

    if let Some(why) = waiting {
        // A target waiting only for its first probe is probed at the next step: take it soon.
        let soon = why.ends_with(HTTP_NOT_RUN).then_some(Duration::from_millis(200));
        // Not settled yet. A soak clock that was running stops: not everything is healthy any more.
        let mut events = Vec::new();
        if let Some(entry) = s.batches.iter_mut().find(|x| x.index == b.index)
            && entry.healthy_since.take().is_some()
        {
            events.push(Event {
                batch: Some(b.index),
                type_: EventType::Warning,
                reason: reason::SOAKING,
                message: format!("batch {}: soak restarted, {why}", b.index + 1),
            });
        }
        s.reason = Some(reason::BATCH_APPLIED.into());
        let wait = until(f.now, deadline).max(Duration::from_millis(100));
        return write_if_changed(f, s, events, Some(soon.map_or(wait, |soon| soon.min(wait))));
    }

    let failed = count(failures.len()) - skipped;
    if failed == 0 && !soak.is_zero() {
        let since = s.batches.iter().find(|x| x.index == b.index).and_then(|x| x.healthy_since.clone());
        match since {
            None => {
                if let Some(entry) = s.batches.iter_mut().find(|x| x.index == b.index) {
                    entry.healthy_since = Some(time(f.now));
                }
                s.reason = Some(reason::SOAKING.into());
                let event = Event {
                    batch: Some(b.index),
                    type_: EventType::Normal,
                    reason: reason::SOAKING,
                    message: format!(
                        "batch {}: all targets healthy, soaking for {}",
                        b.index + 1,
                        f.spec.health.soak
                    ),
                };
                return write(f, s, vec![event]);
            }
            Some(since) if f.now < later(since.0, soak) => {
                let left = until(f.now, later(since.0, soak));
                return write_if_changed(f, s, Vec::new(), Some(left));
            }
            Some(_) => {}
        }
    }

    // The batch is settled: count it, then either go on or apply the failure policy.
    s.counts.healthy += healthy;
    s.counts.failed += failed;
    s.counts.skipped += skipped;
    s.counts.refused += count(refused.len());
    s.failures.extend(failures);
    s.failures.extend(refused.iter().cloned());
    trim_front(&mut s.failures, FAILURE_DETAILS);
    let mut events = Vec::new();
    let entry_state = if over_budget(f, &s) { BatchState::Failed } else { BatchState::Succeeded };
    if let Some(entry) = s.batches.iter_mut().find(|x| x.index == b.index) {
        entry.state = entry_state;
        entry.failed = entry.failed.saturating_add(failed);
        entry.finished_at = Some(time(f.now));
    }
    if entry_state == BatchState::Failed {
        events.push(Event {
            batch: Some(b.index),
            type_: EventType::Warning,
            reason: reason::BATCH_FAILED,
            message: format!(
                "batch {}/{}: {} of {} targets failed; {} failed in total, budget {}",
                b.index + 1,
                total_batches(f),
                failed.saturating_add(count(b.denied.len())),
                b.size,
                s.counts.failed,
                budget(f)
            ),
        });
        return apply_failure_policy(f, s, &b, events);
    }
    for r in &refused {
        events.push(Event {
            batch: Some(b.index),
            type_: EventType::Warning,
            reason: static_reason(&r.reason),
            message: r.message.clone(),
        });
    }
    events.push(Event {
        batch: Some(b.index),
        type_: EventType::Normal,
        reason: reason::BATCH_SUCCEEDED,
        message: format!(
            "batch {}/{}: {healthy} healthy, {failed} failed, {skipped} skipped, {} refused",
            b.index + 1,
            total_batches(f),
            refused.len()
        ),
    });
    next_batch(f, s, events)
}

const HTTP_NOT_RUN: &str = "the HTTP check has not run yet";

enum Verdict {
    Healthy,
    Missing,
    Failed(&'static str, String),
    Waiting(String),
}

fn verdict(
    t: &PlannedTarget,
    state: Option<TargetState>,
    key: &str,
    image: &str,
    http_required: bool,
    timed_out: bool,
) -> Verdict {
    let Some(state) = state else {
        return Verdict::Missing;
    };
    let current = match &state.image {
        Ok(i) => i,
        Err(e) => return Verdict::Failed(reason::INVALID_SPEC, e.clone()),
    };
    if current != image {
        if state.applied.as_deref() == Some(key) {
            return Verdict::Failed(
                reason::IMAGE_CHANGED,
                format!(
                    "{} was changed to {current} by someone else after fleetroll set {image}",
                    target_key(&t.namespace, &t.name)
                ),
            );
        }
        // Our change is not in the cache yet.
        return Verdict::Waiting("the change is not visible yet".into());
    }
    let (why, failure_reason) = match state.readiness {
        Readiness::Failed { reason, message } => return Verdict::Failed(reason, message),
        Readiness::NotReady(why) => (why, reason::TIMEOUT),
        Readiness::Ready => match state.http {
            Some(Ok(())) => return Verdict::Healthy,
            None if !http_required => return Verdict::Healthy,
            // Ready only since the probes of this step ran: probed at the next step, never passed unprobed.
            None => (HTTP_NOT_RUN.to_string(), reason::HTTP_CHECK_FAILED),
            Some(Err(e)) => (format!("HTTP check: {e}"), reason::HTTP_CHECK_FAILED),
        },
    };
    if timed_out {
        Verdict::Failed(failure_reason, format!("not healthy within the health timeout: {why}"))
    } else {
        Verdict::Waiting(why)
    }
}

fn failure(t: &PlannedTarget, batch: u32, reason: &str, message: String) -> TargetFailure {
    TargetFailure {
        namespace: t.namespace.clone(),
        name: t.name.clone(),
        batch,
        reason: reason.to_string(),
        message: truncate(message, 512),
    }
}

/// Gates and starts the next batch, or finishes the rollout.
fn next_batch(f: &Facts<'_>, mut s: FleetRolloutStatus, mut events: Vec<Event>) -> Step {
    let next = s.current_batch.map_or(0, |i| i + 1);
    if next >= total_batches(f) {
        s.phase = Phase::Succeeded;
        s.reason = Some(reason::SUCCEEDED.into());
        s.pending_approval = None;
        s.finished_at = Some(time(f.now));
        events.push(Event {
            batch: None,
            type_: EventType::Normal,
            reason: reason::SUCCEEDED,
            message: format!(
                "{} targets on {}: {} healthy, {} failed, {} skipped",
                s.counts.total, f.spec.image, s.counts.healthy, s.counts.failed, s.counts.skipped
            ),
        });
        return write(f, s, events);
    }
    if f.spec.paused {
        if s.phase != Phase::Paused {
            events.push(Event {
                batch: Some(next),
                type_: EventType::Normal,
                reason: reason::PAUSED_BY_SPEC,
                message: format!("paused before batch {}/{}", next + 1, total_batches(f)),
            });
        }
        s.phase = Phase::Paused;
        s.reason = Some(reason::PAUSED_BY_SPEC.into());
        return write_if_changed(f, s, events, None);
    }
    if s.phase == Phase::Paused {
        events.push(Event {
            batch: Some(next),
            type_: EventType::Normal,
            reason: reason::RESUMED,
            message: format!("resumed before batch {}/{}", next + 1, total_batches(f)),
        });
    }
    let plan_hash = f.plan.hash.clone();
    if needs_approval(f.spec.strategy.approval, next) {
        let approval = f.spec.approvals.iter().find(|a| a.batch == next && a.plan_hash == plan_hash);
        match approval {
            None => {
                if s.pending_approval.as_ref().is_none_or(|p| p.batch != next || p.plan_hash != plan_hash) {
                    s.pending_approval = Some(PendingApproval {
                        batch: next,
                        plan_hash: plan_hash.clone(),
                        since: time(f.now),
                    });
                    events.push(Event {
                        batch: Some(next),
                        type_: EventType::Normal,
                        reason: reason::WAITING_FOR_APPROVAL,
                        message: format!(
                            "batch {}/{} waits for an approval of plan {plan_hash}",
                            next + 1,
                            total_batches(f)
                        ),
                    });
                }
                s.phase = Phase::WaitingForApproval;
                s.reason = Some(reason::WAITING_FOR_APPROVAL.into());
                return write_if_changed(f, s, events, None);
            }
            Some(a) => {
                s.approvals.push(ApprovalRecord {
                    batch: next,
                    plan_hash: plan_hash.clone(),
                    approved_by: a.approved_by.clone(),
                    approved_at: time(f.now),
                });
                trim_front(&mut s.approvals, HISTORY);
                events.push(Event {
                    batch: Some(next),
                    type_: EventType::Normal,
                    reason: reason::APPROVED,
                    message: format!(
                        "batch {}/{} approved{}",
                        next + 1,
                        total_batches(f),
                        a.approved_by.as_deref().map(|w| format!(" by {w}")).unwrap_or_default()
                    ),
                });
            }
        }
    }
    let pause = duration::parse(&f.spec.strategy.pause_between_batches).unwrap_or(Duration::ZERO);
    let last_finished = s.batches.iter().filter_map(|b| b.finished_at.as_ref()).map(|t| t.0).max();
    if let Some(done) = last_finished
        && !pause.is_zero()
        && f.now < later(done, pause)
    {
        s.phase = Phase::Progressing;
        s.reason = Some(reason::WAITING_BETWEEN_BATCHES.into());
        s.pending_approval = None;
        let left = until(f.now, later(done, pause));
        return write_if_changed(f, s, events, Some(left));
    }

    // Record the intent (batch k is Applying, with its key) before any of its targets is touched.
    let revision = s.revision.as_ref().map_or(0, |r| r.number);
    let size = count(f.plan.batch(next).len());
    s.batches.push(BatchStatus {
        index: next,
        size,
        state: BatchState::Applying,
        idempotency_key: batch_key(f.uid, revision, next),
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
    events.push(Event {
        batch: Some(next),
        type_: EventType::Normal,
        reason: reason::BATCH_STARTED,
        message: format!(
            "batch {}/{}: changing {size} targets to {}",
            next + 1,
            total_batches(f),
            f.spec.image
        ),
    });
    write(f, s, events)
}

fn apply_failure_policy(
    f: &Facts<'_>,
    mut s: FleetRolloutStatus,
    b: &BatchStatus,
    mut events: Vec<Event>,
) -> Step {
    let revision = s.revision.as_ref().map_or(0, |r| r.number);
    let summary = format!(
        "{} targets failed, more than maxFailures allows ({}); last in batch {}",
        s.counts.failed,
        budget(f),
        b.index + 1
    );
    match f.spec.strategy.on_failure {
        FailurePolicy::Pause => {
            s.phase = Phase::Paused;
            s.reason = Some(reason::FAILURE_BUDGET_EXCEEDED.into());
            events.push(Event {
                batch: None,
                type_: EventType::Warning,
                reason: reason::FAILURE_BUDGET_EXCEEDED,
                message: format!("{summary}: paused; raise maxFailures to continue, or abort or roll back"),
            });
            write(f, s, events)
        }
        FailurePolicy::Abort => {
            s.phase = Phase::Failed;
            s.reason = Some(reason::FAILURE_BUDGET_EXCEEDED.into());
            s.finished_at = Some(time(f.now));
            events.push(Event {
                batch: None,
                type_: EventType::Warning,
                reason: reason::FAILURE_BUDGET_EXCEEDED,
                message: format!("{summary}: stopped (onFailure: Abort)"),
            });
            write(f, s, events)
        }
        FailurePolicy::Rollback => match start_rollback(f, s, reason::FAILURE_BUDGET_EXCEEDED, revision) {
            Step::Write(mut t) => {
                events.append(&mut t.events);
                t.events = events;
                Step::Write(t)
            }
            other => other,
        },
    }
}

fn start_rollback(f: &Facts<'_>, mut s: FleetRolloutStatus, why: &'static str, revision: u32) -> Step {
    s.phase = Phase::RollingBack;
    s.reason = Some(why.into());
    s.pending_approval = None;
    s.rollback = Some(RollbackStatus {
        state: RollbackState::Restoring,
        idempotency_key: rollback_key(f.uid, revision),
        reason: why.into(),
        started_at: time(f.now),
        finished_at: None,
        restored: 0,
        skipped: 0,
    });
    let event = Event {
        batch: None,
        type_: EventType::Warning,
        reason: why,
        message: format!(
            "rolling back the {} targets changed so far to their previous images",
            s.counts.updated
        ),
    };
    write(f, s, vec![event])
}

/// Splits targets into those the scope rules let this rollout change now and the refused ones, as failure
/// records of batch `batch`.
fn in_scope(
    f: &Facts<'_>,
    targets: Vec<PlannedTarget>,
    batch: u32,
) -> (Vec<PlannedTarget>, Vec<TargetFailure>) {
    let mut refused = Vec::new();
    let allowed = targets
        .into_iter()
        .filter(|t| match (f.scope)(t) {
            Ok(()) => true,
            Err(r) => {
                refused.push(failure(t, batch, r.reason, r.message));
                false
            }
        })
        .collect();
    (allowed, refused)
}

/// The event reason for a scope refusal (event reasons are static).
fn static_reason(reason: &str) -> &'static str {
    use crate::core::scope::reason::{ALL, OUT_OF_SCOPE};
    ALL.into_iter().find(|r| *r == reason).unwrap_or(OUT_OF_SCOPE)
}

/// Targets this revision changed: every target of every batch that got past Pending.
fn changed_targets(f: &Facts<'_>) -> Vec<PlannedTarget> {
    match f.status.current_batch {
        Some(last) => f.plan.through(last).cloned().collect(),
        None => Vec::new(),
    }
}

fn over_budget(f: &Facts<'_>, s: &FleetRolloutStatus) -> bool {
    s.counts.failed > budget(f)
}

fn budget(f: &Facts<'_>) -> u32 {
    plan::failure_budget(&f.spec.strategy.max_failures, f.plan.total_targets())
}

fn needs_approval(mode: ApprovalMode, batch: u32) -> bool {
    match mode {
        ApprovalMode::None => false,
        ApprovalMode::FirstBatch => batch == 0,
        ApprovalMode::EveryBatch => true,
    }
}

fn image(f: &Facts<'_>) -> String {
    f.status.revision.as_ref().map_or_else(|| f.spec.image.clone(), |r| r.inputs.image.clone())
}

fn total_batches(f: &Facts<'_>) -> u32 {
    f.plan.total_batches()
}

fn write(f: &Facts<'_>, mut s: FleetRolloutStatus, events: Vec<Event>) -> Step {
    finish(&mut s, f.generation, f.now);
    Step::Write(Transition { status: s, events })
}

/// Writes only when something changed; otherwise waits (never a write while idle).
fn write_if_changed(
    f: &Facts<'_>,
    mut s: FleetRolloutStatus,
    events: Vec<Event>,
    wait: Option<Duration>,
) -> Step {
    finish(&mut s, f.generation, f.now);
    if s == *f.status { Step::Wait { after: wait } } else { Step::Write(Transition { status: s, events }) }
}

/// Derives the summary fields and conditions from the rest of the status.
pub fn finish(s: &mut FleetRolloutStatus, generation: i64, now: Timestamp) {
    s.observed_generation = Some(generation);
    let total_batches = s.plan.as_ref().map_or(0, |p| p.total_batches);
    s.progress = Some(format!("{}/{}", s.counts.updated, s.counts.total));
    s.batch = Some(match s.current_batch {
        Some(i) => format!("{}/{total_batches}", i + 1),
        None => format!("0/{total_batches}"),
    });
    s.message = Some(message(s, total_batches));
    set_conditions(s, generation, now, None);
}

fn message(s: &FleetRolloutStatus, total_batches: u32) -> String {
    let batch = s.current_batch.map_or(0, |i| i + 1);
    let c = &s.counts;
    let tally = format!("{}/{} updated, {} healthy, {} failed", c.updated, c.total, c.healthy, c.failed);
    match s.phase {
        Phase::Pending => "waiting to be planned".into(),
        Phase::Progressing => match s.reason.as_deref() {
            Some(reason::WAITING_BETWEEN_BATCHES) => {
                format!("waiting before batch {}/{total_batches}; {tally}", batch + 1)
            }
            Some(reason::SOAKING) => format!("batch {batch}/{total_batches} soaking; {tally}"),
            _ => format!("batch {batch}/{total_batches} in progress; {tally}"),
        },
        Phase::Paused if s.reason.as_deref() == Some(reason::FAILURE_BUDGET_EXCEEDED) => {
            format!("paused: failure budget exceeded in batch {batch}/{total_batches}; {tally}")
        }
        Phase::Paused => format!("paused before batch {}/{total_batches}; {tally}", batch + 1),
        Phase::WaitingForApproval => match &s.pending_approval {
            Some(p) => {
                format!("batch {}/{total_batches} waits for approval of plan {}", p.batch + 1, p.plan_hash)
            }
            None => "waiting for approval".into(),
        },
        Phase::RollingBack => format!("rolling back {} targets", c.updated),
        Phase::Succeeded => format!("succeeded: {tally}"),
        Phase::Failed => format!("failed: failure budget exceeded; {tally}"),
        Phase::Aborted => format!("aborted on request; {tally}"),
        Phase::RolledBack => match &s.rollback {
            Some(rb) => format!(
                "rolled back ({}): {} targets restored, {} could not be",
                rb.reason, rb.restored, rb.skipped
            ),
            None => "rolled back".into(),
        },
    }
}

fn set_conditions(s: &mut FleetRolloutStatus, generation: i64, now: Timestamp, blocked: Option<&Blocked>) {
    let reason = s.reason.clone().unwrap_or_else(|| s.phase.to_string());
    let message = s.message.clone().unwrap_or_default();
    let phase = s.phase;
    let progressing = matches!(phase, Phase::Progressing | Phase::RollingBack) && blocked.is_none();
    let cs = &mut s.conditions;
    conditions::set(
        cs,
        Desired {
            type_: conditions::PROGRESSING,
            status: progressing,
            reason: &reason,
            message: message.clone(),
        },
        generation,
        now,
    );
    let paused = matches!(phase, Phase::Paused | Phase::WaitingForApproval);
    conditions::set(
        cs,
        Desired {
            type_: conditions::PAUSED,
            status: paused,
            reason: if paused { &reason } else { "NotPaused" },
            message: if paused { message.clone() } else { String::new() },
        },
        generation,
        now,
    );
    let (degraded, degraded_reason, degraded_message) = match blocked {
        Some(b) => (true, b.reason.to_string(), b.message.clone()),
        None if reason == reason::FAILURE_BUDGET_EXCEEDED => (true, reason.clone(), message.clone()),
        None => (false, "AsExpected".to_string(), String::new()),
    };
    conditions::set(
        cs,
        Desired {
            type_: conditions::DEGRADED,
            status: degraded,
            reason: &degraded_reason,
            message: degraded_message,
        },
        generation,
        now,
    );
    let complete = phase == Phase::Succeeded;
    conditions::set(
        cs,
        Desired {
            type_: conditions::COMPLETE,
            status: complete,
            reason: if complete { reason::SUCCEEDED } else { phase.as_str() },
            message: if complete { message } else { String::new() },
        },
        generation,
        now,
    );
}

fn trim_front<T>(v: &mut Vec<T>, keep: usize) {
    if v.len() > keep {
        v.drain(..v.len() - keep);
    }
}

fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}

/// Time from `now` until `then`; zero if it has passed.
fn until(now: Timestamp, then: Timestamp) -> Duration {
    Duration::try_from(then.duration_since(now)).unwrap_or(Duration::ZERO)
}

/// `t + d`, saturating at the end of time: a timestamp read back from the cluster is input too, and no
/// input may make the arithmetic panic.
fn later(t: Timestamp, d: Duration) -> Timestamp {
    let d = SignedDuration::try_from(d).unwrap_or(SignedDuration::MAX);
    t.checked_add(d).unwrap_or(Timestamp::MAX)
}

#[cfg(test)]
mod tests;
