//! A new revision: its fleet discovered (in this cluster or across member clusters), its plan frozen
//! with each target's image from before this rollout, and the status that starts it. What discovery leads
//! to (planning, a halt, a wait for member clusters) is the core's to say (`rollout::discovered`).

use std::collections::HashMap;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use tracing::warn;

use super::{Context, fleet::Fleet};
use crate::{
    api::{FleetRollout, FleetRolloutStatus},
    core::{
        Blocked,
        plan::{self, Discovered},
        rollout::{self, Discovery, NewRevision, Step},
        window,
    },
    error::Result,
};

/// Discovers the fleet and freezes the plan of a new revision: the step that starts it, or (the core
/// says) the step to take instead. The outer error is an API failure.
pub(super) async fn plan_revision<F: Fleet>(
    ctx: &Context,
    fr: &FleetRollout,
    status: &FleetRolloutStatus,
    now: Timestamp,
) -> Result<Step> {
    let generation = fr.metadata.generation.unwrap_or(0);
    let halt = |why: Blocked| Ok(rollout::halt(now, generation, status, &why));
    let discovery = F::discover(ctx, fr).await?;
    let namespace = fr.namespace().unwrap_or_default();
    let decided = rollout::discovered(now, generation, &fr.spec, status, discovery, &ctx.rules, &namespace);
    let fleet = match decided {
        Discovery::Plan(fleet) => fleet,
        Discovery::Take(instead) => return Ok(*instead),
    };
    let previous = previous_images(ctx, fr, status).await?;
    let Discovered { candidates, waves, refused, left_out, .. } = fleet;
    let places = candidates.iter().map(|c| (c.cluster.as_str(), c.namespace.as_str()));
    let members = super::namespaces::member_windows(ctx, fr).await?;
    let declared = |owner: &window::Owner| super::namespaces::declared_windows(ctx, &members, owner);
    let opens = window::openings(places, &declared, now);
    let planned = match plan::plan_revision(&fr.spec, candidates, &previous, &waves, opens) {
        Ok(p) => p,
        Err(why) => return halt(why),
    };
    let plan_ref = match ctx.plans.store(&ctx.client, fr, &planned.plan).await? {
        Ok(r) => r,
        Err(why) => return halt(why),
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
