//! The failure budget and what happens when a batch exceeds it (pause, stop, or roll back), changes the
//! API server refused or whose member cluster did not answer, and the scope rules applied to a batch.

use std::collections::BTreeMap;

use super::{Event, Facts, Step, Transition, trim_front, write};
use crate::{
    api::{
        BatchStatus, DENIED_LISTED, FAILURE_DETAILS, FailurePolicy, FleetRolloutStatus, Phase, PlannedTarget,
        RightsHold, TargetFailure, time,
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
        FailurePolicy::Rollback => match super::rollback::start_rollback(f, s, why) {
            Step::Write(mut t) => {
                events.append(&mut t.events);
                t.events = events;
                Step::Write(t)
            }
            other => other,
        },
    }
}

/// Splits targets into those whose cluster answers and those of member clusters that did not answer this
/// step (the scope rules cannot judge those: their namespaces were not seen).
pub(super) fn answering(
    f: &Facts<'_>,
    targets: Vec<PlannedTarget>,
) -> (Vec<PlannedTarget>, Vec<PlannedTarget>) {
    targets.into_iter().partition(|t| t.cluster.is_empty() || !f.unreachable.contains_key(&t.cluster))
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

/// Whether the API server refused a change because the user it was made as may not make it (RBAC, as
/// opposed to an admission policy): as `fleetroll::error::denial` words it.
pub fn refused_by_authorization(message: &str) -> bool {
    message.contains("(403 Forbidden)") && message.contains(" cannot ") && message.contains(" resource \"")
}

/// Records, in the status written after a batch was applied, the targets whose change the API server
/// refused: each fails now, with the API server's message, and counts against the failure budget. A
/// refusal of a change in the rollout's own cluster by authorization means the creator, as whom it was
/// made, lost its rights: the later batches wait for a person (`status.rightsHold`, `resume_token` being
/// spec.resumeToken now).
pub fn denied(
    mut after: Transition,
    batch: u32,
    denied: Vec<(PlannedTarget, String)>,
    resume_token: Option<&str>,
) -> Transition {
    let lost = denied.iter().find(|(t, m)| t.cluster.is_empty() && refused_by_authorization(m));
    if let Some((_, message)) = lost.filter(|_| after.status.rights_hold.is_none()) {
        let message = crate::core::text::cut(message, 1024);
        after.status.rights_hold =
            Some(RightsHold { batch, message, resume_token: resume_token.map(String::from) });
    }
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

/// Another rollout that changed a target first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldBy {
    /// `namespace/name`, or what is known of one since deleted.
    pub rollout: String,
    /// It still runs; otherwise it changed the target after this rollout's plan was frozen.
    pub running: bool,
}

impl HeldBy {
    /// Why `key` is not changed (or restored).
    pub fn refusal(&self, key: &str, verb: &str) -> String {
        match self.running {
            true => {
                format!("{key}: FleetRollout {}, still running, changed it first; not {verb}", self.rollout)
            }
            false => format!(
                "{key}: FleetRollout {} changed it after this rollout's plan was made (their plans overlap); \
                 not {verb}",
                self.rollout
            ),
        }
    }
}

/// Records, in the status written after a batch was applied, the targets left alone because another
/// rollout had changed them first (still running, or since this plan was frozen): refused now, as a target
/// the scope rules refuse at the start of a batch is, and never awaited.
pub fn held(mut after: Transition, batch: u32, held: Vec<(PlannedTarget, HeldBy)>) -> Transition {
    let refusals = held
        .into_iter()
        .map(|(t, by)| super::failure(&t, batch, reason::TARGET_HELD, by.refusal(&t.key(), "changed")))
        .collect();
    let recorded = refused(&mut after, batch, refusals);
    let s = &mut after.status;
    for cluster in recorded {
        s.counts.updated = s.counts.updated.saturating_sub(1);
        if let Some(c) = s.clusters.as_mut() {
            clusters::tally(c, batch, [cluster.as_str()], Count::Updated, -1);
        }
    }
    after
}

/// Records targets batch `batch` leaves alone (`refusals`), at most [`DENIED_LISTED`] of them: listed in the
/// batch, in `failures`, in `counts.refused` and in an event each. Returns the clusters of those recorded.
pub(super) fn refused(after: &mut Transition, batch: u32, refusals: Vec<TargetFailure>) -> Vec<String> {
    let s = &mut after.status;
    let mut recorded = Vec::new();
    for r in refusals {
        let key = r.key();
        let Some(entry) = s.batch_mut(batch) else { break };
        if entry.refused.len() >= DENIED_LISTED || entry.refused.contains(&key) {
            continue;
        }
        entry.refused.push(key);
        s.counts.refused += 1;
        after.events.push(Event::warning(reason::refusal(&r.reason), Some(batch), r.message.clone()));
        recorded.push(r.cluster.clone());
        s.failures.push(r);
    }
    trim_front(&mut s.failures, FAILURE_DETAILS);
    recorded
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
