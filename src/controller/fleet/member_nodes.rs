//! Node rollouts across member clusters, as the controller drives them: the nodes found in every member
//! the selector picks (the DaemonSet in the namespaces the rollout may touch there), read live per step for
//! the batch in flight, their pods replaced through each member's own client (see `edge::members::nodes`).
//! A member that does not answer is reported, never mistaken for healthy, as for workloads.

use std::{
    collections::{BTreeMap, HashSet},
    sync::Arc,
    time::Duration,
};

use kube::ResourceExt;
use tracing::{info, warn};

use super::{Batch, Context, Fleet, Seen, rollout_key, rollout_known};
use crate::{
    api::{FleetRollout, FleetRolloutStatus, Phase, PlannedTarget, Unplanned},
    core::{
        Blocked,
        plan::{Discovered, Plan},
        rollout::{self, Carrier, TargetState},
    },
    edge::{
        members::{
            nodes::{self as member_nodes, Act, Read},
            workloads as member_workloads,
        },
        rollouts,
        workloads::Outcome,
    },
    error::Result,
};

/// How soon a node rollout in progress looks at its members again: nodes and pods are not watched.
const NODE_RECHECK: Duration = Duration::from_secs(2);
/// ... and while a member does not answer.
const UNREACHABLE_RECHECK: Duration = Duration::from_secs(1);

pub(in crate::controller) struct MemberNodes;

pub(in crate::controller) struct MemberNodesSeen {
    read: Read,
    looked: bool,
}

impl Fleet for MemberNodes {
    type Seen = MemberNodesSeen;

    async fn discover(ctx: &Context, fr: &FleetRollout) -> Result<Result<Discovered, Blocked>> {
        member_workloads::discover(ctx.members.members(), &ctx.settings.fleet_namespace, fr).await
    }

    async fn observe(
        ctx: &Context,
        fr: &Arc<FleetRollout>,
        status: &FleetRolloutStatus,
        plan: &Plan,
    ) -> Result<MemberNodesSeen> {
        let mut seen = MemberNodesSeen { read: Read::default(), looked: false };
        let Some(current) = status.current_batch else { return Ok(seen) };
        // A rollback looks at the targets it still owes a restore; otherwise only the batch in flight
        // matters, and nothing while the rollout waits for a person.
        let targets: Vec<&PlannedTarget> = match status.phase {
            Phase::RollingBack => rollout::owed(status, plan),
            p if p.is_terminal() || matches!(p, Phase::WaitingForApproval | Phase::Paused) => {
                return Ok(seen);
            }
            _ => plan.batch(current).iter().collect(),
        };
        seen.read = member_nodes::read(ctx.members.members(), fr, status, &targets).await;
        // A holder that no longer exists holds nothing.
        seen.read.holders.retain(|_, other| rollout_known(ctx, other));
        seen.looked = true;
        Ok(seen)
    }

    async fn apply(ctx: &Context, fr: &FleetRollout, batch: Batch<'_>) -> Result<Outcome> {
        let revision = crate::core::nodes::revision_key(&fr.uid().unwrap_or_default(), batch.revision);
        let rollout = rollout_key(fr);
        let act = Act::Apply { revision: &revision, image: batch.image, rollout: &rollout };
        member_nodes::change(ctx.members.members(), &ctx.metrics, fr, act, batch.targets).await
    }

    async fn restore(
        ctx: &Context,
        fr: &FleetRollout,
        _key: &str,
        targets: &[PlannedTarget],
    ) -> Result<Outcome> {
        member_nodes::change(ctx.members.members(), &ctx.metrics, fr, Act::Restore, targets).await
    }

    async fn release(ctx: &Context, fr: &FleetRollout, finished: bool) -> Result<()> {
        release(ctx, fr, finished, false).await
    }
}

/// Hands back the member DaemonSets the rollout holds (see [`member_nodes::release`]), as the rollout ends
/// or is `deleted`.
async fn release(ctx: &Context, fr: &FleetRollout, finished: bool, deleted: bool) -> Result<()> {
    let Some(plan_ref) = fr.status.as_ref().and_then(|s| s.plan.clone()) else { return Ok(()) };
    let targets: Vec<PlannedTarget> = match ctx.plans.load(&ctx.client, fr, &plan_ref).await? {
        Ok(loaded) => loaded.plan.batches.iter().flatten().cloned().collect(),
        // Without a plan to trust, which members' DaemonSets it holds is not known: said, not guessed.
        Err(why) => {
            warn!(reason = why.reason, message = %why.message, "member DaemonSets not handed back: no plan");
            return Ok(());
        }
    };
    member_nodes::release(ctx.members.members(), fr, &targets, finished, deleted).await
}

/// A node rollout across members being deleted: hands back every member DaemonSet it holds (template too,
/// unless it finished), then lets the rollout go. A member that does not answer keeps it until it does; one
/// no Secret names any more is passed over.
pub(in crate::controller) async fn finalize(ctx: &Context, fr: &FleetRollout) -> Result<()> {
    if !rollouts::holds_daemonset(fr) {
        return Ok(());
    }
    let finished =
        fr.status.as_ref().is_some_and(|s| matches!(s.phase, Phase::Succeeded | Phase::RolledBack));
    release(ctx, fr, finished, true).await?;
    ctx.rollouts_io.set_finalizer(fr, rollouts::FINALIZER, false).await?;
    info!("handed the member DaemonSets back; the rollout may go");
    Ok(())
}

impl Seen for MemberNodesSeen {
    fn target(&self, t: &PlannedTarget) -> Option<TargetState> {
        self.read.states.get(&t.key()).cloned()
    }

    // health.http is refused with targets.clusters (the operator does not reach members' pods).
    fn probe_url(&self, _: &str, _: &PlannedTarget) -> Option<String> {
        None
    }

    // Matching nodes outside the plan would need every member listed at every batch: not reported.
    fn unplanned(&self, _: &HashSet<(String, String)>) -> Option<Unplanned> {
        None
    }

    fn held_by(&self, t: &PlannedTarget) -> Option<String> {
        self.read.holders.get(&(t.cluster.clone(), t.namespace.clone())).cloned()
    }

    fn recheck(&self) -> Option<Duration> {
        let blind = !self.read.unreachable.is_empty();
        self.looked.then_some(if blind { UNREACHABLE_RECHECK } else { NODE_RECHECK })
    }

    // A node's pod is replaced, not changed in place: nothing carries a key after success to look at.
    fn carrying(&self, _: &str) -> Vec<Carrier> {
        Vec::new()
    }

    fn unreachable(&self) -> BTreeMap<String, String> {
        self.read.unreachable.clone()
    }

    fn member_namespace(&self, t: &PlannedTarget) -> Option<BTreeMap<String, String>> {
        self.read.namespaces.get(&(t.cluster.clone(), t.namespace.clone())).cloned()
    }
}
