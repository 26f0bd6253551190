//! A new revision: its fleet discovered (in this cluster or across member clusters), its plan frozen
//! with each target's image from before this rollout, and the status that starts it.

use std::{collections::HashMap, time::Duration};

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use tracing::warn;

use super::{Context, fleet::Fleet};
use crate::{
    api::{FleetRollout, FleetRolloutStatus},
    core::{
        Blocked,
        plan::{self, Discovered},
        reason,
        rollout::{self, ClusterWait, NewRevision, Step},
        scope,
    },
    error::Result,
};

/// How often planning looks again for picked member clusters that do not answer.
const CLUSTERS_RETRY: Duration = Duration::from_secs(5);

/// Discovers the fleet and freezes the plan of a new revision: the step that starts it, or the step to
/// take instead. The outer error is an API failure.
pub(super) async fn plan_revision<F: Fleet>(
    ctx: &Context,
    fr: &FleetRollout,
    status: &FleetRolloutStatus,
    now: Timestamp,
) -> Result<Step> {
    let generation = fr.metadata.generation.unwrap_or(0);
    let blocked = |why: Blocked| Ok(rollout::halt(now, generation, status, &why));
    let discovered = match F::discover(ctx, fr).await? {
        Ok(d) => d,
        Err(why) => return blocked(why),
    };
    let namespace = fr.namespace().unwrap_or_default();
    let rollout = scope::Rollout {
        namespace: &namespace,
        kind: fr.spec.targets.kind,
        cross_namespace: fr.spec.targets.namespace_selector.is_some(),
    };
    let daemon_set = fr.spec.targets.daemon_set.as_deref();
    if let Some(r) = ctx.rules.refuse_plan(rollout, daemon_set, &discovered.candidates) {
        return blocked(Blocked { reason: r.reason, message: r.message });
    }
    let unanswered = &discovered.unanswered;
    if let ClusterWait::Wait(t) = rollout::await_clusters(now, generation, &fr.spec, status, unanswered) {
        return Ok(Step::Retry { write: t.map(|t| *t), after: CLUSTERS_RETRY });
    }
    if discovered.candidates.is_empty() {
        let names: Vec<&str> = unanswered.iter().map(|(name, _)| name.as_str()).collect();
        let message = format!("no member cluster with targets answered; not answering: {}", names.join(", "));
        return blocked(Blocked { reason: reason::CLUSTER_UNREACHABLE, message });
    }
    let previous = previous_images(ctx, fr, status).await?;
    let Discovered { candidates, waves, refused, left_out, .. } = discovered;
    let planned = match plan::plan_revision(&fr.spec, candidates, &previous, &waves) {
        Ok(p) => p,
        Err(why) => return blocked(why),
    };
    let plan_ref = match ctx.plans.store(&ctx.client, fr, &planned.plan).await? {
        Ok(r) => r,
        Err(why) => return blocked(why),
    };
    let new = NewRevision {
        inputs: planned.inputs,
        spec_hash: planned.spec_hash,
        plan: &planned.plan,
        plan_ref,
        waves: &waves,
        refused: &refused,
        left_out: &left_out,
    };
    Ok(Step::Write(rollout::start_revision(now, generation, &fr.spec, status, new)))
}

/// A superseded revision's targets keep the image they had before this rollout first changed them. A
/// superseded plan that is not the one frozen is not believed: previous images then come from the targets
/// as they are now (re-planning is how a rollout recovers from a tampered plan).
async fn previous_images(
    ctx: &Context,
    fr: &FleetRollout,
    status: &FleetRolloutStatus,
) -> Result<HashMap<String, String>> {
    let mut previous = HashMap::new();
    let Some(old_ref) = &status.plan else { return Ok(previous) };
    match ctx.plans.load(&ctx.client, fr, old_ref).await? {
        Ok(old) => {
            for t in old.plan.batches.iter().flatten() {
                previous.insert(t.key(), t.previous_image.clone());
            }
        }
        Err(why) => warn!(message = %why.message, "previous images of the superseded revision are not known"),
    }
    Ok(previous)
}
