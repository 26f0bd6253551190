//! The rollout state machine, as pure functions from facts to the next step.
//!
//! Facts: the spec, the stored status (the checkpoint), the frozen plan, what the targets of the batch in
//! flight look like, and the time. The answer is one step: write a new status, change a batch of targets
//! (whose intent is already written), restore previous images (likewise), tidy up (hold or hand back a
//! DaemonSet, delete an expired rollout), or wait. The controller performs the step and asks again; it never
//! decides anything itself.
//!
//! Crash safety rests on the order of steps: a batch is recorded as `Applying`, with its idempotency key,
//! in a status write that must succeed (resourceVersion precondition) before any of its targets changes,
//! and a target that already carries the key is not changed again.
//!
//! By concern: [`mod@prepare`] (before the targets are looked at: whether the rollout may run at all,
//! needs a new revision, needs its plan), [`gates`] (planning a revision, the gates before a batch,
//! starting it), [`verify`] (health and soak of the batch in flight), [`failure`] (the failure budget and
//! policies), [`rollback`], [`summary`] (the summary fields and conditions people read), [`housekeeping`]
//! (what a rollout holds and when it goes).

mod analysis;
mod approval;
mod drift;
mod failure;
mod gates;
mod housekeeping;
mod prepare;
mod rollback;
mod summary;
mod verify;
mod windows;

use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::jiff::{SignedDuration, Timestamp};

pub use self::{
    analysis::due_queries,
    failure::{HeldBy, denied, held, unreached},
    gates::{ClusterWait, NewRevision, await_clusters, blocked, start_revision},
    housekeeping::{before_observing, probes},
    prepare::{BLOCKED_RETRY, CLUSTERS_RETRY, Discovery, Prep, discovered, halt, plan_refused, prepare},
    rollback::{owed, restored},
};
use self::{failure::in_scope, gates::next_batch, rollback::start_rollback, summary::finish, verify::verify};
use crate::{
    api::{
        BatchState, BatchStatus, FAILURE_MESSAGE_MAX, FleetRolloutSpec, FleetRolloutStatus, Phase,
        PlannedTarget, RevisionInputs, TargetFailure, TargetKind, Unplanned, time,
    },
    core::{clusters, count, plan::Plan, reason, scope::Refusal, text, workload::Readiness},
};

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
    /// The rollout's namespace.
    pub namespace: &'a str,
    pub spec: &'a FleetRolloutSpec,
    pub status: &'a FleetRolloutStatus,
    /// What the platform policies governing the rollout's creator require.
    pub guardrails: &'a crate::core::policy::Guardrails,
    /// A value drawn at random for this step (16 hex digits), kept when the core needs one no one can
    /// foresee: the nonce of a new approver epoch.
    pub nonce: &'a str,
    /// Why the operator cannot make changes as the rollout's creator (who cannot be impersonated, or was
    /// never recorded); None when it can. Every batch waits until it can.
    pub cannot_act: Option<&'a str>,
    pub plan: &'a Plan,
    /// Whether the rollout carries the finalizer that makes its deletion hand its DaemonSet back.
    pub holds_daemonset: bool,
    /// Looks up a target of the plan; None when it no longer exists.
    pub target: &'a dyn Fn(&PlannedTarget) -> Option<TargetState>,
    /// Matching targets outside the plan (asked only when a batch starts: it scans the cache).
    pub unplanned: &'a dyn Fn() -> Option<Unplanned>,
    /// Whether a target may be changed (or restored) now: see [`crate::core::scope`].
    pub scope: &'a dyn Fn(&PlannedTarget) -> Result<(), Refusal>,
    /// The change windows an owner of targets declares (a namespace's `fleetroll.dev/windows` annotation),
    /// as written; None when it declares none (asked only before a batch starts, of its targets' owners).
    pub declared_windows: &'a dyn Fn(&crate::core::window::Owner) -> Option<String>,
    /// The workloads whose `fleetroll.dev/applied` key starts with the given prefix (asked only of a
    /// succeeded rollout: it scans the cache).
    pub carrying: &'a dyn Fn(&str) -> Vec<Carrier>,
    /// The measurements the edge took this step ([`due_queries`] says which are due).
    pub measured: &'a [crate::core::analysis::Measured],
    /// Member clusters the edge could not reach this step (no answer, or credentials refused), with why.
    /// Only clusters of the batch in flight (rolling back: of the targets still owed a restore) are looked
    /// at.
    pub unreachable: &'a BTreeMap<String, String>,
}

/// A workload carrying one of this rollout's keys, as observed now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Carrier {
    pub namespace: String,
    pub name: String,
    /// The image of the rolled container, or why it cannot be read.
    pub image: Result<String, String>,
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

impl Event {
    pub fn normal(reason: &'static str, batch: Option<u32>, message: String) -> Self {
        Self { type_: EventType::Normal, reason, message, batch }
    }

    pub fn warning(reason: &'static str, batch: Option<u32>, message: String) -> Self {
        Self { type_: EventType::Warning, reason, message, batch }
    }
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
    /// [`restored`] with `refused`, the targets the scope rules keep from being restored, and `waiting`, the
    /// member clusters (and why) whose owed targets are not in `targets` because they did not answer, with
    /// those the restore itself could not reach added.
    Restore {
        key: String,
        targets: Vec<PlannedTarget>,
        refused: Vec<TargetFailure>,
        waiting: BTreeMap<String, String>,
    },
    /// Add the finalizer that makes deleting this node rollout hand its DaemonSet back, before the rollout
    /// takes the DaemonSet over; then ask again.
    HoldDaemonSet,
    /// Hand the DaemonSet's updates back (the rollout succeeded or was rolled back) and drop the
    /// finalizer; then ask again.
    ReleaseDaemonSet,
    /// Delete the rollout: `ttlSecondsAfterFinished` has passed.
    Delete,
    /// Nothing to do until something changes, or until `after` has passed.
    Wait { after: Option<Duration> },
    /// Persist `write`, if there is one, then look again after `after` (a period, not a deadline): the
    /// rollout cannot go on, and what it waits for wakes nothing. Only before the targets are looked at
    /// ([`fn@prepare`], [`discovered`]).
    Retry { write: Option<Transition>, after: Duration },
}

/// The next step of a rollout whose revision is planned.
pub fn decide(f: &Facts<'_>) -> Step {
    if let Some(step) = before_observing(f.spec, f.status, f.holds_daemonset) {
        return step;
    }
    match advance(f) {
        Step::Wait { after } => housekeeping::when_idle(f, after),
        // A batch begun, or a rollback, before the operator could no longer act as the creator (an upgrade,
        // a restart) changes nothing either: it waits where it is, saying why.
        Step::Apply { .. } | Step::Restore { .. } if f.cannot_act.is_some() => {
            gates::waiting_for_creator(f, f.cannot_act.unwrap_or_default())
        }
        step => step,
    }
}

/// Whether the spec asks for a revision other than the stored one.
pub fn needs_new_revision(spec: &FleetRolloutSpec, status: &FleetRolloutStatus) -> bool {
    status.revision.as_ref().is_none_or(|r| r.inputs != RevisionInputs::of(spec))
}

/// Whether writing `after` over `before` moves a batch to Applying: the intent, persisted before any target
/// of the batch changes.
pub fn is_intent(before: &FleetRolloutStatus, after: &FleetRolloutStatus) -> bool {
    after.current_batch.is_some()
        && after.current_batch != before.current_batch
        && after.batches.last().is_some_and(|b| b.state == BatchState::Applying)
}

/// The idempotency key of batch `batch` of revision `revision`.
pub fn batch_key(uid: &str, revision: u32, batch: u32) -> String {
    format!("{uid}/{revision}/{batch}")
}

pub fn rollback_key(uid: &str, revision: u32) -> String {
    format!("{uid}/{revision}/rollback")
}

fn advance(f: &Facts<'_>) -> Step {
    let mut s = f.status.clone();
    s.observed_generation = Some(f.generation);
    if s.phase == Phase::RollingBack {
        return match s.rollback.clone() {
            Some(rb) if rb.state == crate::api::RollbackState::Restoring => rollback::restore(f, s, &rb),
            _ => write_if_changed(f, s, Vec::new(), None),
        };
    }
    if s.phase.is_terminal() {
        if prepare::rolls_back(f.spec, &s) {
            return start_rollback(f, s, reason::ROLLBACK_REQUESTED);
        }
        let events = drift::recount(f, &mut s);
        return write_if_changed(f, s, events, None);
    }
    if f.spec.rollback {
        return start_rollback(f, s, reason::ROLLBACK_REQUESTED);
    }
    if s.phase == Phase::Pending {
        // Halted (a refused plan, say) and now able to go on.
        s.phase = Phase::Progressing;
        s.reason = Some(reason::RESUMED.into());
    }
    if f.spec.abort {
        return abort(f, s);
    }
    match s.current().cloned() {
        Some(b) if b.state == BatchState::Applying => apply(f, s, b),
        Some(b) if b.state == BatchState::Verifying => verify(f, s, b),
        Some(b) if b.state == BatchState::Failed && b.analysis.as_ref().is_some_and(|a| a.hold.is_some()) => {
            analysis::held_failure(f, s, &b)
        }
        Some(b) if b.state == BatchState::Failed && failure::over_budget(f, &s) => {
            // Held by the Pause policy until the budget is raised, or an abort or rollback arrives.
            write_if_changed(f, s, Vec::new(), None)
        }
        _ => next_batch(f, s, Vec::new()),
    }
}

fn abort(f: &Facts<'_>, mut s: FleetRolloutStatus) -> Step {
    s.phase = Phase::Aborted;
    s.reason = Some(reason::ABORT_REQUESTED.into());
    s.pending_approval = None;
    s.window_hold = None;
    s.finished_at = Some(time(f.now));
    let message = format!("aborted on request after {} of {} targets", s.counts.updated, s.counts.total);
    write(f, s, vec![Event::normal(reason::ABORT_REQUESTED, None, message)])
}

/// Changes the batch whose intent is recorded; the status to write afterwards has it Verifying.
fn apply(f: &Facts<'_>, s: FleetRolloutStatus, b: BatchStatus) -> Step {
    let index = b.index;
    // Targets of member clusters that do not answer wait for them (nothing can be judged of them now);
    // refused targets are left alone, and refused now, once, whatever becomes of what refused them.
    let (reachable, waiting) = failure::answering(f, f.plan.batch(index).to_vec());
    let (targets, refused) = in_scope(f, reachable, index);
    let refused_count = count(refused.len());
    let mut after = s;
    if let Some(entry) = after.batch_mut(index) {
        entry.state = BatchState::Verifying;
        entry.applied_at = Some(time(f.now));
    }
    after.counts.updated = f.status.counts.updated.saturating_add(b.size.saturating_sub(refused_count));
    if let Some(c) = after.clusters.as_mut() {
        let counted = targets.iter().chain(&waiting).map(|t| t.cluster.as_str());
        clusters::tally(c, index, counted, clusters::Count::Updated, 1);
    }
    after.reason = Some(reason::BATCH_APPLIED.into());
    finish(&mut after, f.generation, f.now);
    let message =
        format!("batch {}/{}: {} targets changed to {}", index + 1, total_batches(f), b.size, f.spec.image);
    let mut after = Transition {
        status: after,
        events: vec![Event::normal(reason::BATCH_APPLIED, Some(index), message)],
    };
    failure::refused(&mut after, index, refused);
    let mut after = unreached(after, index, &waiting, f.unreachable);
    finish(&mut after.status, f.generation, f.now);
    Step::Apply { key: b.idempotency_key, image: image(f), targets, after }
}

/// The image this revision rolls out.
fn image(f: &Facts<'_>) -> String {
    f.status.revision.as_ref().map_or_else(|| f.spec.image.clone(), |r| r.inputs.image.clone())
}

fn total_batches(f: &Facts<'_>) -> u32 {
    f.plan.total_batches()
}

fn is_node_rollout(f: &Facts<'_>) -> bool {
    f.spec.targets.kind == TargetKind::Node
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

fn failure(t: &PlannedTarget, batch: u32, reason: &str, message: String) -> TargetFailure {
    TargetFailure {
        cluster: t.cluster.clone(),
        namespace: t.namespace.clone(),
        name: t.name.clone(),
        batch,
        reason: reason.to_string(),
        message: text::cut(&message, FAILURE_MESSAGE_MAX),
    }
}

fn trim_front<T>(v: &mut Vec<T>, keep: usize) {
    if v.len() > keep {
        v.drain(..v.len() - keep);
    }
}

/// Time from `now` until `then`; zero if it has passed.
fn until(now: Timestamp, then: Timestamp) -> Duration {
    Duration::try_from(then.duration_since(now)).unwrap_or(Duration::ZERO)
}

/// `t + d`, saturating at the end of time: a timestamp read back from the cluster is input too, and no
/// input may make the arithmetic panic.
pub fn later(t: Timestamp, d: Duration) -> Timestamp {
    let d = SignedDuration::try_from(d).unwrap_or(SignedDuration::MAX);
    t.checked_add(d).unwrap_or(Timestamp::MAX)
}

#[cfg(test)]
mod tests;
