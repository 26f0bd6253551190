//! What the dashboard shows, as pure functions of what was read: a rollout's line in the list (what it
//! waits for, in one word and a sentence), and the grid of its targets (each one's state from the
//! rollout's checkpoints and, where the user can read them, the targets themselves).

use std::collections::{HashMap, HashSet};

use kube::ResourceExt;
use serde::Serialize;

use crate::{
    api::{
        BatchState, Counts, FleetRollout, FleetRolloutStatus, Phase, PlannedTarget, RollbackState, WindowKind,
    },
    core::{plan::Plan, reason, rollout::owed, workload::Readiness},
};

/// A rollout's line in the list.
#[derive(Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub phase: Phase,
    pub image: String,
    /// 1-based, as `kubectl get fro` shows it; None before the first batch.
    pub batch: Option<u32>,
    pub total_batches: u32,
    pub total_targets: u32,
    pub counts: Counts,
    pub wave: Option<String>,
    pub waiting_for: WaitingFor,
    pub creator: Option<String>,
    pub created_at: Option<String>,
    pub message: Option<String>,
}

/// What a rollout waits for before it can go on, if anything.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct WaitingFor {
    pub kind: Waiting,
    pub message: String,
}

#[derive(Serialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Waiting {
    Approval,
    Analysis,
    Window,
    Budget,
    Policy,
    Paused,
    Creator,
    Rights,
    Clusters,
    None,
}

pub fn summary(fr: &FleetRollout) -> Summary {
    let status = fr.status.clone().unwrap_or_default();
    let wave = status.clusters.as_ref().and_then(|c| {
        let batch = status.current_batch?;
        c.waves.iter().find(|w| (w.first_batch..=w.last_batch).contains(&batch)).map(|w| w.name.clone())
    });
    Summary {
        namespace: fr.namespace().unwrap_or_default(),
        name: fr.name_any(),
        uid: fr.uid().unwrap_or_default(),
        phase: status.phase,
        image: status.revision.as_ref().map_or_else(|| fr.spec.image.clone(), |r| r.inputs.image.clone()),
        batch: status.current_batch.map(|b| b + 1),
        total_batches: status.plan.as_ref().map_or(0, |p| p.total_batches),
        total_targets: status.plan.as_ref().map_or(status.counts.total, |p| p.total_targets),
        counts: status.counts.clone(),
        wave,
        waiting_for: waiting_for(fr),
        creator: fr.spec.creator.as_ref().map(|c| c.username.clone()),
        created_at: fr.metadata.creation_timestamp.as_ref().map(|t| t.0.to_string()),
        message: status.message.clone(),
    }
}

/// The first thing that holds the rollout, in the order a person would have to deal with them.
pub fn waiting_for(fr: &FleetRollout) -> WaitingFor {
    let Some(s) = fr.status.as_ref() else { return none() };
    let said = |kind, message: &str| WaitingFor { kind, message: message.to_string() };
    let message = s.message.as_deref().unwrap_or_default();
    if s.phase.is_terminal() {
        return none();
    }
    if let Some(hold) = &s.creator_hold {
        return said(Waiting::Creator, hold);
    }
    if let Some(hold) = &s.rights_hold {
        return said(Waiting::Rights, &hold.message);
    }
    if s.phase == Phase::WaitingForApproval {
        return said(Waiting::Approval, message);
    }
    if s.phase == Phase::Paused {
        let budget = s.reason.as_deref() == Some(reason::FAILURE_BUDGET_EXCEEDED);
        return said(if budget { Waiting::Budget } else { Waiting::Paused }, message);
    }
    if let Some(hold) = &s.policy_hold {
        return said(Waiting::Policy, &format!("{} ({}): {}", hold.policy, hold.rule, hold.message));
    }
    if let Some(hold) = &s.window_hold {
        let what = match hold.kind {
            WindowKind::Allow => "outside change window",
            WindowKind::Deny => "in freeze",
        };
        let opens = hold.opens_at.as_ref().map(|t| format!(" until {}", t.0)).unwrap_or_default();
        let also =
            if hold.also.is_empty() { String::new() } else { format!(" (and {} more)", hold.also.len()) };
        return said(Waiting::Window, &format!("{what} {} of {}{opens}{also}", hold.window, hold.owner));
    }
    if let Some(hold) = s.current().and_then(|b| b.analysis.as_ref()).and_then(|a| a.hold.as_ref()) {
        return said(Waiting::Analysis, &hold.reason);
    }
    if let Some(trouble) = s.clusters.as_ref().and_then(|c| c.trouble.first()) {
        return said(Waiting::Clusters, &format!("member cluster {}: {}", trouble.name, trouble.message));
    }
    none()
}

fn none() -> WaitingFor {
    WaitingFor { kind: Waiting::None, message: String::new() }
}

/// A target's state in the grid.
#[derive(Serialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Cell {
    Pending,
    Changing,
    Soaking,
    Healthy,
    Failed,
    Refused,
    /// Gone since it was planned: the operator skips it, and it does not count as a failure.
    Skipped,
    /// Its previous image put back by a rollback.
    Restored,
}

/// Where the user's own reads found a target: whether it carries the batch's key, and how ready it is.
#[derive(Clone, Debug, PartialEq)]
pub struct Seen {
    pub applied: Option<String>,
    pub readiness: Readiness,
}

/// What the user's own reads say of a target.
#[derive(Clone, Debug, PartialEq)]
pub enum Sight {
    /// Not read: the user may not, not yet, or it is in a member cluster or a node.
    Unread,
    /// A complete read of where it lives has no such target: it was deleted since it was planned.
    Gone,
    Seen(Seen),
}

/// What a target's newest failure record says of it.
#[derive(Clone, Copy, PartialEq)]
enum Recorded {
    /// Changed, then failed its health checks: a rollback puts it back.
    Unhealthy,
    /// Its change was refused by the API server, someone else's change stands, or a rollback passes it over
    /// (a node not ready, no container to set): not known to be put back.
    Unchanged,
    Refused,
    Skipped,
}

impl Recorded {
    fn of(why: &str) -> Self {
        match why {
            reason::TARGET_MISSING => Recorded::Skipped,
            r if reason::REFUSALS.contains(&r) => Recorded::Refused,
            // A node still not ready, or a workload without the container, is passed over by a rollback too.
            reason::CHANGE_DENIED
            | reason::IMAGE_CHANGED
            | reason::NODE_NOT_READY
            | reason::INVALID_SPEC
            | reason::CONTAINER_NOT_FOUND => Recorded::Unchanged,
            _ => Recorded::Unhealthy,
        }
    }
}

/// A run of the grid's targets: one batch in one cluster (in one wave, across member clusters).
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct Group {
    pub wave: Option<String>,
    pub cluster: String,
    pub batch: u32,
    pub start: usize,
    pub count: usize,
}

/// The grid: groups in order (waves, clusters, batches), the targets they index into, and their states.
#[derive(Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Grid {
    pub plan_hash: String,
    pub groups: Vec<Group>,
    pub targets: Vec<String>,
    /// Each target's image before the rollout (as the plan froze it), beside `targets`.
    pub previous_images: Vec<String>,
    pub states: Vec<Cell>,
    /// Why there is no grid, when there is none to show.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl Grid {
    /// No grid, and why (nothing said when `why` is empty).
    pub fn unread(why: &str) -> Self {
        Grid {
            plan_hash: String::new(),
            groups: Vec::new(),
            targets: Vec::new(),
            previous_images: Vec::new(),
            states: Vec::new(),
            note: (!why.is_empty()).then(|| why.to_string()),
        }
    }
}

/// The plan's targets in grid order: batch by batch, and within a batch cluster by cluster (by name).
fn in_grid_order(plan: &Plan) -> impl Iterator<Item = (u32, &str, Vec<&PlannedTarget>)> {
    plan.batches.iter().enumerate().flat_map(|(index, batch)| {
        let mut clusters: Vec<&str> = batch.iter().map(|t| t.cluster.as_str()).collect();
        clusters.sort_unstable();
        clusters.dedup();
        clusters.into_iter().map(move |cluster| {
            (index as u32, cluster, batch.iter().filter(|t| t.cluster == cluster).collect())
        })
    })
}

/// The grid of `fr`'s plan, each target's state from its batch's checkpoint, its failure if any, the
/// rollback if there is one, and `seen(target)`.
pub fn grid(fr: &FleetRollout, plan: &Plan, seen: &dyn Fn(&PlannedTarget) -> Sight) -> Grid {
    let waves =
        fr.status.as_ref().and_then(|s| s.clusters.as_ref()).map(|c| c.waves.as_slice()).unwrap_or_default();
    let mut grid = Grid { plan_hash: plan.hash.clone(), states: states(fr, plan, seen), ..Grid::unread("") };
    for (index, cluster, run) in in_grid_order(plan) {
        let wave =
            waves.iter().find(|w| (w.first_batch..=w.last_batch).contains(&index)).map(|w| w.name.clone());
        let start = grid.targets.len();
        grid.targets.extend(run.iter().map(|t| t.key()));
        grid.previous_images.extend(run.iter().map(|t| t.previous_image.clone()));
        grid.groups.push(Group { wave, cluster: cluster.to_string(), batch: index, start, count: run.len() });
    }
    grid
}

/// Each target's state, in grid order: what [`grid`] sends whole, and the stream compares tick by tick.
pub fn states(fr: &FleetRollout, plan: &Plan, seen: &dyn Fn(&PlannedTarget) -> Sight) -> Vec<Cell> {
    let none = FleetRolloutStatus::default();
    let status = fr.status.as_ref().unwrap_or(&none);
    // A target is in one batch of a plan, so its key alone finds its records: a rollback files what it
    // could not restore under the batch in flight, not the target's own. The newest record says most.
    let recorded: HashMap<String, Recorded> =
        status.failures.iter().map(|f| (f.key(), Recorded::of(&f.reason))).collect();
    let facts: Vec<(u32, Fact)> = in_grid_order(plan)
        .flat_map(|(index, _, run)| run.into_iter().map(move |t| (index, t)))
        .map(|(index, t)| {
            let key = t.key();
            (index, Fact { recorded: recorded.get(&key).copied(), restored: false, sight: seen(t) })
        })
        .collect();
    let mut facts = facts;
    restored_by_rollback(status, plan, &mut facts);
    facts.into_iter().map(|(index, fact)| cell(status, index, fact)).collect()
}

/// Marks the targets a rollback put back, as far as the status tells of those not read: those it owed a
/// restore, in the clusters it is done with, that no record says it could not put back (their change
/// refused, someone else's since, gone, or no container to set). It is done with every cluster once it is
/// done, and, while it waits for member clusters that did not answer, with every other. Status keeps the
/// newest failures only: the rollback's own counts, shown beside the grid, are exact.
fn restored_by_rollback(status: &FleetRolloutStatus, plan: &Plan, facts: &mut [(u32, Fact)]) {
    let Some(rb) = status.rollback.as_ref() else { return };
    let waiting = rb.state == RollbackState::Restoring && !rb.unreached.is_empty();
    if rb.state != RollbackState::Done && !waiting {
        return;
    }
    // What it owed across every cluster: while it waits, `owed` says only what it still owes.
    let owed: HashSet<String> = if rb.unreached.is_empty() {
        owed(status, plan).into_iter().map(PlannedTarget::key).collect()
    } else {
        let mut all = status.clone();
        all.rollback.iter_mut().for_each(|rb| rb.unreached.clear());
        owed(&all, plan).into_iter().map(PlannedTarget::key).collect()
    };
    let targets = in_grid_order(plan).flat_map(|(index, _, run)| run.into_iter().map(move |t| (index, t)));
    for ((_, fact), (index, t)) in facts.iter_mut().zip(targets) {
        let key = t.key();
        let refused_at_its_batch = status.batch(index).is_some_and(|b| b.refused.contains(&key));
        fact.restored = fact.sight == Sight::Unread
            && matches!(fact.recorded, None | Some(Recorded::Unhealthy))
            && !rb.unreached.contains(&t.cluster)
            && !refused_at_its_batch
            && owed.contains(&key);
    }
}

/// What is known of one target besides its batch's checkpoint.
struct Fact {
    recorded: Option<Recorded>,
    /// Put back by a rollback, as far as the status tells (it was not read).
    restored: bool,
    sight: Sight,
}

/// A target's state: what a record says the operator could not do (skipped, refused, its change refused
/// or undone by others); else put back by a rollback (it carries the rollback's key, or the status says so
/// of one not read); else failed, as recorded; else skipped when it is gone while its batch is still to
/// settle or a rollback passed over it; else as its batch's checkpoint says.
fn cell(status: &FleetRolloutStatus, batch: u32, fact: Fact) -> Cell {
    match fact.recorded {
        Some(Recorded::Skipped) => return Cell::Skipped,
        Some(Recorded::Refused) => return Cell::Refused,
        Some(Recorded::Unchanged) => return Cell::Failed,
        Some(Recorded::Unhealthy) | None => {}
    }
    let rollback_key = status.rollback.as_ref().map(|rb| rb.idempotency_key.as_str());
    let carries_rollback = matches!(&fact.sight, Sight::Seen(s) if rollback_key.is_some() && s.applied.as_deref() == rollback_key);
    if carries_rollback || fact.restored {
        return Cell::Restored;
    }
    if fact.recorded == Some(Recorded::Unhealthy) {
        return Cell::Failed;
    }
    let seen = match fact.sight {
        Sight::Seen(s) => Some(s),
        // The operator skips a target gone before its batch settles, and a rollback one gone before it; one
        // gone after its batch settled was counted as it was then.
        Sight::Gone if status.rollback.is_some() => return Cell::Skipped,
        Sight::Gone if !status.phase.is_terminal() && !settled(status, batch) => return Cell::Skipped,
        Sight::Gone | Sight::Unread => None,
    };
    match checkpoint(status, batch, seen) {
        // Nothing soaks once the rollout has ended.
        Cell::Soaking if status.phase.is_terminal() => Cell::Healthy,
        cell => cell,
    }
}

/// Whether a batch is done with: succeeded or failed, or behind the one in flight.
fn settled(status: &FleetRolloutStatus, batch: u32) -> bool {
    match status.batch(batch) {
        Some(b) => matches!(b.state, BatchState::Succeeded | BatchState::Failed),
        None => status.current_batch.is_some_and(|c| batch < c),
    }
}

/// A target's state from its batch's checkpoint and what was seen of it.
fn checkpoint(status: &FleetRolloutStatus, batch: u32, seen: Option<Seen>) -> Cell {
    let Some(checkpoint) = status.batch(batch) else {
        // Status keeps the latest batches only: one before them is done (its failures are listed apart).
        let behind = status.current_batch.is_some_and(|c| batch < c) || status.phase == Phase::Succeeded;
        return if behind { Cell::Healthy } else { Cell::Pending };
    };
    let carries = seen.as_ref().map(|s| s.applied.as_deref() == Some(checkpoint.idempotency_key.as_str()));
    let ready = seen.as_ref().is_some_and(|s| s.readiness == Readiness::Ready);
    match checkpoint.state {
        BatchState::Pending => Cell::Pending,
        BatchState::Applying if carries == Some(false) => Cell::Pending,
        BatchState::Applying => Cell::Changing,
        BatchState::Verifying if carries == Some(true) && ready => Cell::Soaking,
        BatchState::Verifying => Cell::Changing,
        BatchState::Succeeded => Cell::Healthy,
        // Status lists the first failures only: one not listed is judged by what was seen of it.
        BatchState::Failed if seen.is_some() && !ready => Cell::Failed,
        BatchState::Failed => Cell::Healthy,
    }
}

/// The cells whose state differs between two grids of the same plan, as (index, new state).
pub fn changes(before: &[Cell], after: &[Cell]) -> Vec<(usize, Cell)> {
    before.iter().zip(after).enumerate().filter(|(_, (b, a))| b != a).map(|(i, (_, a))| (i, *a)).collect()
}

#[cfg(test)]
mod tests;
