//! Before the state machine proper: whether the rollout may run at all, whether it needs a new revision
//! (and what the fleet discovered for it leads to), and whether it needs its frozen plan. The controller
//! gathers the facts (what this installation serves, the discovery, the plan as loaded), these decide, and
//! the controller performs the step they return.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use super::{ClusterWait, Step, await_clusters, gates::blocked_in, needs_new_revision};
use crate::{
    api::{FleetRolloutSpec, FleetRolloutStatus, Phase, PlanRef},
    core::{
        Blocked,
        plan::Discovered,
        reason,
        scope::{self, Rules},
    },
};

/// How often a rollout that cannot go on is looked at again: what it waits for (targets or namespaces
/// that may appear, a plan put back) wakes nothing.
pub const BLOCKED_RETRY: Duration = Duration::from_secs(30);
/// How often planning looks again for picked member clusters that do not answer.
pub const CLUSTERS_RETRY: Duration = Duration::from_secs(5);

/// What comes before the targets are looked at.
#[derive(Clone, Debug, PartialEq)]
pub enum Prep<'a> {
    /// Take this step instead: a halt ([`halt`]), or a retry while there is no plan to go on. (Boxed: a
    /// step is large, the other answers are small.)
    Take(Box<Step>),
    /// Discover the fleet and plan a new revision ([`discovered`], then [`super::start_revision`]).
    PlanRevision,
    /// Look at the targets and [`super::decide`], with this frozen plan loaded first; None: the rollout
    /// is finished and needs no plan.
    Proceed { load: Option<&'a PlanRef> },
}

/// What comes before the targets are looked at, from the spec, the stored status and `not_served` (why
/// this installation will not run the spec at all, if it will not): a halt, a new revision, a retry while
/// there is no plan, or on to the targets.
pub fn prepare<'a>(
    now: Timestamp,
    generation: i64,
    spec: &FleetRolloutSpec,
    status: &'a FleetRolloutStatus,
    not_served: Option<&Blocked>,
) -> Prep<'a> {
    let new_revision = needs_new_revision(spec, status);
    let finished = status.phase.is_terminal() && !new_revision;
    // A rollout this installation may not run halts before anything changes. A finished one has nothing
    // left to change, and keeps its phase, unless it is asked to roll back: that rollback is refused, and
    // the phase stays what it was (what it changed is done); a new revision of it halts as any other.
    if let Some(why) = not_served {
        if !finished {
            return Prep::Take(Box::new(halt(now, generation, status, why)));
        }
        if rolls_back(spec, status) {
            return Prep::Take(Box::new(refuse_rollback(now, generation, status, why)));
        }
    }
    if new_revision {
        return Prep::PlanRevision;
    }
    // A revision without a plan is not one the operator wrote: there is nothing to go on.
    let Some(plan) = status.plan.as_ref() else {
        return Prep::Take(Box::new(Step::Retry { write: None, after: BLOCKED_RETRY }));
    };
    // A finished rollout needs its plan only to roll back.
    let needed = !status.phase.is_terminal() || spec.rollback;
    Prep::Proceed { load: needed.then_some(plan) }
}

/// The step of a rollout that cannot go on: record why (Pending, Degraded), unless the status says so
/// already; then look again later.
pub fn halt(now: Timestamp, generation: i64, status: &FleetRolloutStatus, why: &Blocked) -> Step {
    halt_in(Phase::Pending, now, generation, status, why)
}

fn halt_in(
    phase: Phase,
    now: Timestamp,
    generation: i64,
    status: &FleetRolloutStatus,
    why: &Blocked,
) -> Step {
    match blocked_in(phase, now, generation, status, why) {
        Some(t) => Step::Write(t),
        None => Step::Retry { write: None, after: BLOCKED_RETRY },
    }
}

/// Whether a finished rollout is asked to roll back and has not yet (what [`super::decide`] then starts).
pub(super) fn rolls_back(spec: &FleetRolloutSpec, status: &FleetRolloutStatus) -> bool {
    spec.rollback && status.phase != Phase::RolledBack && status.counts.updated > 0
}

/// The step of a finished rollout whose rollback cannot run: say why as a halt does (a Warning, the reason
/// and message, Degraded), keeping the phase it finished in.
fn refuse_rollback(now: Timestamp, generation: i64, status: &FleetRolloutStatus, why: &Blocked) -> Step {
    halt_in(status.phase, now, generation, status, why)
}

/// The step to take when the stored plan is refused (gone, or not the plan frozen): None to go on
/// without it, else a halt. An abort needs no plan, so a halted rollout can still be stopped for good; a
/// rollback restores what the plan names, so it cannot do without one, and an abort asked for beside a
/// rollback yields to it (as it does with a plan): going on without the plan would start the rollback,
/// which halts again, a write loop.
pub fn plan_refused(
    now: Timestamp,
    generation: i64,
    spec: &FleetRolloutSpec,
    status: &FleetRolloutStatus,
    why: &Blocked,
) -> Option<Step> {
    let abort_without_plan = spec.abort && !spec.rollback && status.phase != Phase::RollingBack;
    if abort_without_plan {
        return None;
    }
    // A finished rollout loads its plan only to roll back (see [`prepare`]).
    Some(if status.phase.is_terminal() {
        refuse_rollback(now, generation, status, why)
    } else {
        halt(now, generation, status, why)
    })
}

/// What a new revision's discovery leads to.
#[derive(Clone, Debug, PartialEq)]
pub enum Discovery {
    /// Plan the revision over what was found.
    Plan(Discovered),
    /// Take this step instead: a halt, or a wait for member clusters that do not answer.
    Take(Box<Step>),
}

/// What a new revision's `discovery` leads to: a halt when there is nothing it may plan (discovery
/// found no fleet, the scope `rules` refuse every target, no member cluster with targets answered), a
/// wait for picked member clusters that do not answer yet ([`await_clusters`]), or planning.
pub fn discovered(
    now: Timestamp,
    generation: i64,
    spec: &FleetRolloutSpec,
    status: &FleetRolloutStatus,
    discovery: Result<Discovered, Blocked>,
    rules: &Rules,
    namespace: &str,
) -> Discovery {
    let halted = |why: Blocked| Discovery::Take(Box::new(halt(now, generation, status, &why)));
    let fleet = match discovery {
        Ok(fleet) => fleet,
        Err(why) => return halted(why),
    };
    let rollout = scope::Rollout {
        namespace,
        kind: spec.targets.kind,
        cross_namespace: spec.targets.namespace_selector.is_some(),
    };
    let daemon_set = spec.targets.daemon_set.as_deref();
    if let Some(r) = rules.refuse_plan(rollout, daemon_set, &fleet.candidates) {
        return halted(Blocked { reason: r.reason, message: r.message });
    }
    let unanswered = &fleet.unanswered;
    if let ClusterWait::Wait(t) = await_clusters(now, generation, spec, status, unanswered) {
        let retry = Step::Retry { write: t.map(|t| *t), after: CLUSTERS_RETRY };
        return Discovery::Take(Box::new(retry));
    }
    if fleet.candidates.is_empty() {
        let names: Vec<&str> = unanswered.iter().map(|(name, _)| name.as_str()).collect();
        let message = format!("no member cluster with targets answered; not answering: {}", names.join(", "));
        return halted(Blocked { reason: reason::CLUSTER_UNREACHABLE, message });
    }
    Discovery::Plan(fleet)
}
