//! What a rollout holds and when it goes: a node rollout holds its DaemonSet (behind a finalizer) from
//! before it takes it over until it hands it back; a finished rollout with `ttlSecondsAfterFinished` is
//! deleted once that has passed, but never while it still holds a DaemonSet. Also which targets the
//! health check probes at a step.

use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::{Facts, Step, TargetState, is_node_rollout, until};
use crate::{
    api::{BatchState, FleetRolloutSpec, FleetRolloutStatus, Phase, PlannedTarget, TargetKind},
    core::{plan::Plan, workload::Readiness},
};

/// When a finished rollout is due for deletion (`ttlSecondsAfterFinished`), if it is.
pub fn expires_at(spec: &FleetRolloutSpec, status: &FleetRolloutStatus) -> Option<Timestamp> {
    let ttl = spec.ttl_seconds_after_finished?;
    let finished = status.finished_at.as_ref()?.0;
    if !status.phase.is_terminal() {
        return None;
    }
    finished.checked_add(SignedDuration::from_secs(ttl.max(0))).ok()
}

/// A step to take before the targets are even looked at: a node rollout that is not finished holds its
/// DaemonSet first, so that deleting it from then on hands the DaemonSet back.
pub fn before_observing(
    spec: &FleetRolloutSpec,
    status: &FleetRolloutStatus,
    holds_daemonset: bool,
) -> Option<Step> {
    let node_rollout = spec.targets.kind == TargetKind::Node;
    (node_rollout && !status.phase.is_terminal() && !holds_daemonset).then_some(Step::HoldDaemonSet)
}

/// The step of a rollout with nothing else to do, which would otherwise wait `after`.
pub(super) fn when_idle(f: &Facts<'_>, after: Option<Duration>) -> Step {
    // A node rollout that failed or was aborted keeps its DaemonSet on OnDelete, so that no further node
    // changes behind the rollout's back: roll it back, or delete it (which hands the DaemonSet back as it
    // was).
    let handed_back_when_done = matches!(f.status.phase, Phase::Succeeded | Phase::RolledBack);
    if is_node_rollout(f) && handed_back_when_done && f.holds_daemonset {
        return Step::ReleaseDaemonSet;
    }
    // Its TTL waits until it holds nothing.
    if is_node_rollout(f) && f.holds_daemonset {
        return Step::Wait { after };
    }
    match expires_at(f.spec, f.status) {
        // Undelivered notifications hold the deletion a while: they would be gone with the rollout.
        Some(expiry) if f.now >= expiry => match crate::core::notify::holds_deletion(f.status, f.now) {
            Some(recheck) => Step::Wait { after: Some(recheck) },
            None => Step::Delete,
        },
        Some(expiry) => {
            let left = until(f.now, expiry);
            Step::Wait { after: Some(after.map_or(left, |a| a.min(left))) }
        }
        None => Step::Wait { after },
    }
}

/// The targets of the batch in flight whose HTTP check runs now: when one is configured and the batch is
/// being verified, those whose own rollout is complete (the others are not healthy anyway).
pub fn probes(
    spec: &FleetRolloutSpec,
    status: &FleetRolloutStatus,
    plan: &Plan,
    target: &dyn Fn(&PlannedTarget) -> Option<TargetState>,
) -> Vec<PlannedTarget> {
    if spec.health.http.is_none() {
        return Vec::new();
    }
    let Some(batch) = status.current().filter(|b| b.state == BatchState::Verifying) else {
        return Vec::new();
    };
    plan.batch(batch.index)
        .iter()
        .filter(|t| target(t).is_some_and(|s| s.readiness == Readiness::Ready))
        .cloned()
        .collect()
}
