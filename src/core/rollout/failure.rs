//! The failure budget and what happens when a batch exceeds it (pause, stop, or roll back), changes the
//! API server refused, and the rollback: which targets it restores and how it ends.

use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;

use super::{Event, Facts, Step, Transition, finish, trim_front, truncate, write};
use crate::{
    api::{
        BatchStatus, DENIED_LISTED, FAILURE_DETAILS, FailurePolicy, FleetRolloutStatus, Phase, PlannedTarget,
        RollbackState, RollbackStatus, TargetFailure, time,
    },
    core::{
        clusters::{self, Count},
        count, plan, reason,
    },
};

pub(super) fn over_budget(f: &Facts<'_>, s: &FleetRolloutStatus) -> bool {
    s.counts.failed > budget(f)
}

pub(super) fn budget(f: &Facts<'_>) -> u32 {
    plan::failure_budget(&f.spec.strategy.max_failures, f.plan.total_targets())
}

pub(super) fn apply_failure_policy(
    f: &Facts<'_>,
    mut s: FleetRolloutStatus,
    b: &BatchStatus,
    mut events: Vec<Event>,
) -> Step {
    let summary = format!(
        "{} targets failed, more than maxFailures allows ({}); last in batch {}",
        s.counts.failed,
        budget(f),
        b.index + 1
    );
    let why = reason::FAILURE_BUDGET_EXCEEDED;
    match f.spec.strategy.on_failure {
        FailurePolicy::Pause => {
            s.phase = Phase::Paused;
            s.reason = Some(why.into());
            let message = format!("{summary}: paused; raise maxFailures to continue, or abort or roll back");
            events.push(Event::warning(why, None, message));
            write(f, s, events)
        }
        FailurePolicy::Abort => {
            s.phase = Phase::Failed;
            s.reason = Some(why.into());
            s.finished_at = Some(time(f.now));
            events.push(Event::warning(why, None, format!("{summary}: stopped (onFailure: Abort)")));
            write(f, s, events)
        }
        FailurePolicy::Rollback => match start_rollback(f, s, why) {
            Step::Write(mut t) => {
                events.append(&mut t.events);
                t.events = events;
                Step::Write(t)
            }
            other => other,
        },
    }
}

pub(super) fn start_rollback(f: &Facts<'_>, mut s: FleetRolloutStatus, why: &'static str) -> Step {
    s.phase = Phase::RollingBack;
    s.reason = Some(why.into());
    s.pending_approval = None;
    // What the rollback restores is what fleetroll changed; targets changed by others since are left alone.
    s.changed_by_others = None;
    s.rollback = Some(RollbackStatus {
        state: RollbackState::Restoring,
        idempotency_key: super::rollback_key(f.uid, s.revision_number()),
        reason: why.into(),
        started_at: time(f.now),
        finished_at: None,
        restored: 0,
        skipped: 0,
    });
    let message =
        format!("rolling back the {} targets changed so far to their previous images", s.counts.updated);
    write(f, s, vec![Event::warning(why, None, message)])
}

/// The targets a rollback owes a restore as far as the status tells (their clusters may not answer, so
/// their annotations cannot say): every target of the batches up to the one in flight, but those whose
/// change the API server refused and those of member clusters a batch never reached.
pub fn owed<'p>(status: &FleetRolloutStatus, plan: &'p plan::Plan) -> Vec<&'p PlannedTarget> {
    let Some(last) = status.current_batch else { return Vec::new() };
    (0..=last)
        .flat_map(|index| {
            let entry = status.batch(index);
            plan.batch(index).iter().filter(move |t| {
                // A batch older than the status keeps was applied; its refusals are in its annotations.
                entry.is_none_or(|b| !b.denied.contains(&t.key()) && !b.unreached.contains(&t.cluster))
            })
        })
        .collect()
}

/// Of the targets owed a restore, those it may restore: those that carry this revision's key. A target
/// that carries none of its keys was never changed by this revision (refused by the scope rules at its
/// batch, or its batch's change never ran) and is left out; so is, reported, one someone else changed
/// since (this revision's key but another image) or another rollout took over (its key): a rollback undoes
/// fleetroll's change, never theirs. A target not seen (gone, or a node rollout's node) is left to the
/// restore, which skips what is gone.
pub(super) fn restorable(
    f: &Facts<'_>,
    targets: Vec<PlannedTarget>,
    batch: u32,
) -> (Vec<PlannedTarget>, Vec<TargetFailure>) {
    let Some(revision) = f.status.revision.as_ref().filter(|_| !super::is_node_rollout(f)) else {
        return (targets, Vec::new());
    };
    let ours = format!("{}/{}/", f.uid, revision.number);
    let mut left = Vec::new();
    let restorable = targets
        .into_iter()
        .filter(|t| {
            let Some(state) = (f.target)(t) else { return true };
            let name = t.key();
            let why = match (state.applied.as_deref(), &state.image) {
                (Some(k), Ok(image)) if k.starts_with(&ours) && *image != revision.inputs.image => (
                    reason::IMAGE_CHANGED,
                    format!(
                        "{name} was changed to {image} by someone else since fleetroll set it; left as it is"
                    ),
                ),
                (Some(k), _) if k.starts_with(&ours) => return true,
                (Some(k), _) if !k.starts_with(&format!("{}/", f.uid)) => (
                    reason::TARGET_HELD,
                    format!("{name} was changed by another rollout since; left as it is"),
                ),
                // Never changed by this revision: nothing to undo.
                _ => return false,
            };
            left.push(super::failure(t, batch, why.0, why.1));
            false
        })
        .collect();
    (restorable, left)
}

/// Splits targets into those whose cluster answers and those of member clusters that did not answer this
/// step (the scope rules cannot judge those: their namespaces were not seen).
pub(super) fn answering(
    f: &Facts<'_>,
    targets: Vec<PlannedTarget>,
) -> (Vec<PlannedTarget>, Vec<PlannedTarget>) {
    targets.into_iter().partition(|t| t.cluster.is_empty() || !f.unreachable.contains_key(&t.cluster))
}

/// A target a rollback could not restore: its member cluster did not answer.
pub(super) fn not_answering(f: &Facts<'_>, t: &PlannedTarget, batch: u32) -> TargetFailure {
    let why = f.unreachable.get(&t.cluster).map_or("", String::as_str);
    let message = format!("cluster {} did not answer; not restored: {why}", t.cluster);
    super::failure(t, batch, reason::CLUSTER_UNREACHABLE, message)
}

/// Splits targets into those the scope rules let this rollout change now and the refused ones, as failure
/// records of batch `batch`.
pub(super) fn in_scope(
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
                refused.push(super::failure(t, batch, r.reason, r.message));
                false
            }
        })
        .collect();
    (allowed, refused)
}

/// Records, in the status written after a batch was applied, the targets whose change the API server
/// refused: each fails now, with the API server's message, and counts against the failure budget.
pub fn denied(mut after: Transition, batch: u32, denied: Vec<(PlannedTarget, String)>) -> Transition {
    let s = &mut after.status;
    for (t, message) in denied {
        let key = t.key();
        let Some(entry) = s.batch_mut(batch) else { return after };
        if entry.denied.len() >= DENIED_LISTED || entry.denied.contains(&key) {
            continue;
        }
        entry.denied.push(key);
        entry.failed += 1;
        s.counts.failed += 1;
        s.counts.updated = s.counts.updated.saturating_sub(1);
        if let Some(c) = s.clusters.as_mut() {
            clusters::tally(c, batch, [t.cluster.as_str()], Count::Updated, -1);
            clusters::tally(c, batch, [t.cluster.as_str()], Count::Failed, 1);
        }
        after.events.push(Event::warning(reason::CHANGE_DENIED, Some(batch), message.clone()));
        s.failures.push(super::failure(&t, batch, reason::CHANGE_DENIED, message));
    }
    trim_front(&mut s.failures, FAILURE_DETAILS);
    after
}

/// Records, in the status written after a batch was applied, the member clusters the change could not
/// reach (`targets` of theirs were not changed): the batch changes them once the cluster answers, or they
/// fail as ClusterUnreachable at the health timeout (see `verify`).
pub fn unreached(
    mut after: Transition,
    batch: u32,
    targets: &[PlannedTarget],
    why: &BTreeMap<String, String>,
) -> Transition {
    let s = &mut after.status;
    let Some(entry) = s.batch_mut(batch) else { return after };
    let missed: Vec<&str> =
        targets.iter().filter(|t| why.contains_key(&t.cluster)).map(|t| t.cluster.as_str()).collect();
    let mut newly = Vec::new();
    for (cluster, message) in why.iter().filter(|(c, _)| missed.contains(&c.as_str())) {
        if !entry.unreached.contains(cluster) {
            entry.unreached.push(cluster.clone());
            newly.push((cluster, message));
        }
    }
    entry.unreached.sort();
    s.counts.updated = s.counts.updated.saturating_sub(count(missed.len()));
    if let Some(c) = s.clusters.as_mut() {
        clusters::tally(c, batch, missed, Count::Updated, -1);
    }
    for (cluster, message) in newly {
        let message = format!(
            "batch {}: cluster {cluster} could not be reached ({message}); its targets change once it answers",
            batch + 1
        );
        after.events.push(Event::warning(reason::CLUSTER_UNREACHABLE, Some(batch), message));
    }
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
    let message =
        format!("restored the previous image of {restored} targets ({skipped} could not be restored)");
    Transition { status: s, events: vec![Event::normal(reason::ROLLED_BACK, None, message)] }
}
