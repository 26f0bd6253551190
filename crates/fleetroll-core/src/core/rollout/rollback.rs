//! The rollback: which targets it owes a restore (only what this revision changed), restoring them in the
//! clusters that answer, waiting for those that do not, and ending only once nothing is owed any more.
//!
//! A member cluster that does not answer keeps the rollback `RollingBack` (reason ClusterUnreachable,
//! Degraded, the cluster in `status.clusters.trouble` and `rollback.unreached`) for as long as it takes.
//! Unlike a batch, a rollback has no health timeout to give up at: giving up would leave the rolled-out
//! image running under a status that says it was rolled back. A person who gives up on the member deletes
//! the rollout.

use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;

use super::{
    Event, Facts, Step, Transition, failure, finish, is_node_rollout, trim_front, write, write_if_changed,
};
use crate::{
    api::{
        FAILURE_DETAILS, FAILURE_MESSAGE_MAX, FleetRolloutStatus, Phase, PlannedTarget, RollbackState,
        RollbackStatus, TargetFailure, time,
    },
    core::{clusters, count, plan::Plan, reason},
};

pub(super) fn start_rollback(f: &Facts<'_>, mut s: FleetRolloutStatus, why: &'static str) -> Step {
    s.phase = Phase::RollingBack;
    s.reason = Some(why.into());
    s.pending_approval = None;
    // No window holds a rollback: what held the next batch holds nothing now.
    s.window_hold = None;
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
        unreached: Vec::new(),
    });
    let message =
        format!("rolling back the {} targets changed so far to their previous images", s.counts.updated);
    write(f, s, vec![Event::warning(why, None, message)])
}

/// The step of a rollback under way: restore what it owes in the clusters that answer; once only clusters
/// that do not answer are left, wait for them (the controller looks again at its recheck).
pub(super) fn restore(f: &Facts<'_>, mut s: FleetRolloutStatus, rb: &RollbackStatus) -> Step {
    let last = f.status.current_batch.unwrap_or_default();
    let owed: Vec<PlannedTarget> = owed(f.status, f.plan).into_iter().cloned().collect();
    let (reachable, silent) = failure::answering(f, owed);
    let waiting = why_silent(f, &silent);
    if !rb.unreached.is_empty() && reachable.is_empty() && !waiting.is_empty() {
        if let Some(c) = s.clusters.as_mut() {
            c.trouble = clusters::trouble(&c.trouble, &waiting, f.now);
        }
        return write_if_changed(f, s, Vec::new(), None);
    }
    let (targets, mut refused) = restorable(f, reachable, last);
    let (targets, out_of_scope) = failure::in_scope(f, targets, last);
    refused.extend(out_of_scope);
    Step::Restore { key: rb.idempotency_key.clone(), targets, refused, waiting }
}

/// The member clusters of `silent` targets, each with why it did not answer.
fn why_silent(f: &Facts<'_>, silent: &[PlannedTarget]) -> BTreeMap<String, String> {
    silent
        .iter()
        .map(|t| (t.cluster.clone(), f.unreachable.get(&t.cluster).cloned().unwrap_or_default()))
        .collect()
}

/// The targets a rollback owes a restore as far as the status tells (their clusters may not answer, so
/// their annotations cannot say): every target of the batches up to the one in flight, but those whose
/// change the API server refused and those of member clusters a batch never reached. Once the rollback
/// has restored what answered, only the targets of the clusters it still waits for. The controller reads
/// these, and only these, while rolling back.
pub fn owed<'p>(status: &FleetRolloutStatus, plan: &'p Plan) -> Vec<&'p PlannedTarget> {
    let Some(last) = status.current_batch else { return Vec::new() };
    let waits_for = status.rollback.as_ref().map(|rb| rb.unreached.as_slice()).unwrap_or_default();
    (0..=last)
        .flat_map(|index| {
            let entry = status.batch(index);
            plan.batch(index).iter().filter(move |t| {
                // A batch older than the status keeps was applied; its refusals are in its annotations.
                entry.is_none_or(|b| !b.denied.contains(&t.key()) && !b.unreached.contains(&t.cluster))
            })
        })
        .filter(|t| waits_for.is_empty() || waits_for.contains(&t.cluster))
        .collect()
}

/// Of the targets owed a restore, those it may restore: those that carry this revision's key (or the
/// rollback's own, restored already: a no-op). A target that carries neither was never changed by this
/// revision (refused by the scope rules at its batch, or its batch's change never ran) and is left out;
/// so is, reported, one someone else changed since (this revision's key but another image) or another
/// rollout took over (its key): a rollback undoes fleetroll's change, never theirs. A target not seen
/// (gone, or a node rollout's node) is left to the restore, which skips what is gone.
fn restorable(
    f: &Facts<'_>,
    targets: Vec<PlannedTarget>,
    batch: u32,
) -> (Vec<PlannedTarget>, Vec<TargetFailure>) {
    let Some(revision) = f.status.revision.as_ref().filter(|_| !is_node_rollout(f)) else {
        return (targets, Vec::new());
    };
    let ours = format!("{}/{}/", f.uid, revision.number);
    let rollback = f.status.rollback.as_ref().map_or("", |rb| rb.idempotency_key.as_str());
    let mut left = Vec::new();
    let restorable = targets
        .into_iter()
        .filter(|t| {
            let Some(state) = (f.target)(t) else { return true };
            let name = t.key();
            let why = match (state.applied.as_deref(), &state.image) {
                (Some(k), Ok(image)) if k == rollback && *image != t.previous_image => (
                    reason::IMAGE_CHANGED,
                    format!("{name} was changed to {image} by someone else since fleetroll restored it"),
                ),
                (Some(k), _) if k == rollback => return true,
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

/// Records what a pass of the rollback restored. `waiting`: the member clusters it could not reach (they
/// did not answer), with why; their targets are restored at a later pass, and the rollback is done, and
/// the rollout RolledBack, only once there are none.
pub fn restored(
    now: Timestamp,
    generation: i64,
    status: &FleetRolloutStatus,
    restored: u32,
    skipped: u32,
    refused: Vec<TargetFailure>,
    waiting: &BTreeMap<String, String>,
) -> Transition {
    let mut s = status.clone();
    s.observed_generation = Some(generation);
    let skipped = skipped.saturating_add(count(refused.len()));
    s.counts.refused = s.counts.refused.saturating_add(count(refused.len()));
    s.failures.extend(
        refused
            .into_iter()
            .map(|f| TargetFailure { message: crate::core::text::cut(&f.message, FAILURE_MESSAGE_MAX), ..f }),
    );
    trim_front(&mut s.failures, FAILURE_DETAILS);
    if let Some(c) = s.clusters.as_mut() {
        c.trouble = clusters::trouble(&c.trouble, waiting, now);
    }
    let Some(rb) = s.rollback.as_mut() else { return Transition { status: s, events: Vec::new() } };
    // Each pass restores targets no earlier pass did: the counts add up.
    rb.restored = rb.restored.saturating_add(restored);
    rb.skipped = rb.skipped.saturating_add(skipped);
    let before = std::mem::replace(&mut rb.unreached, waiting.keys().cloned().collect());
    let mut events = reached_again(&before, waiting);
    if !waiting.is_empty() {
        let image = s.revision.as_ref().map_or("", |r| r.inputs.image.as_str());
        for (cluster, why) in waiting.iter().filter(|(c, _)| !before.contains(c)) {
            let message = format!(
                "rollback: cluster {cluster} did not answer ({why}); its changed targets still run {image} and \
                 are restored once it answers"
            );
            events.push(Event::warning(reason::CLUSTER_UNREACHABLE, None, message));
        }
        s.reason = Some(reason::CLUSTER_UNREACHABLE.into());
        finish(&mut s, generation, now);
        return Transition { status: s, events };
    }
    rb.state = RollbackState::Done;
    rb.finished_at = Some(time(now));
    let message = format!(
        "restored the previous image of {} targets ({} could not be restored)",
        rb.restored, rb.skipped
    );
    s.reason = Some(rb.reason.clone());
    s.phase = Phase::RolledBack;
    s.finished_at = Some(time(now));
    finish(&mut s, generation, now);
    events.push(Event::normal(reason::ROLLED_BACK, None, message));
    Transition { status: s, events }
}

/// Normal events for the clusters a rollback waited for that answered this pass.
fn reached_again(before: &[String], waiting: &BTreeMap<String, String>) -> Vec<Event> {
    before
        .iter()
        .filter(|c| !waiting.contains_key(*c))
        .map(|c| {
            let message = format!("rollback: cluster {c} answers again; its targets were restored");
            Event::normal(reason::CLUSTER_REACHABLE, None, message)
        })
        .collect()
}
