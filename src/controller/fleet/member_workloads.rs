//! Workloads in member clusters (`targets.clusters`), as the controller drives them: found in every member
//! the selector picks, read per step for the batch in flight (from the member's watch cache once filled,
//! the namespaces live), and changed through each member's own client (see `edge::members::workloads`). A member that does not answer is reported,
//! never mistaken for healthy: the core waits for it until the health timeout.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::Arc,
    time::Duration,
};

use kube::ResourceExt;

use super::{Batch, Context, Fleet, Seen, change_of, container, holder, rollout_key, running_rollouts};
use crate::{
    api::{FleetRollout, FleetRolloutStatus, Phase, PlannedTarget, Unplanned},
    core::{
        Blocked,
        plan::{Discovered, Plan},
        rollout::{self, Carrier, TargetState},
        scope,
    },
    edge::{
        members::workloads::{self as member_workloads, Read},
        workloads::{self, Outcome},
    },
    error::Result,
    failpoint,
};

/// How soon a rollout with a batch in flight looks at its member clusters again while a member does not
/// answer or its watch cache is not filled yet (nothing wakes the rollout then).
const MEMBER_RECHECK: Duration = Duration::from_secs(1);
/// ... and otherwise, when the watches wake it: a safety net only.
const WATCHED_RECHECK: Duration = Duration::from_secs(15);

pub(in crate::controller) struct MemberWorkloads;

pub(in crate::controller) struct MemberWorkloadsSeen {
    container: Option<String>,
    read: Read,
    /// The other rollouts still running, by uid.
    running: HashMap<String, String>,
    looked: bool,
}

impl Fleet for MemberWorkloads {
    type Seen = MemberWorkloadsSeen;

    async fn discover(ctx: &Context, fr: &FleetRollout) -> Result<Result<Discovered, Blocked>> {
        let found =
            member_workloads::discover(ctx.members.members(), &ctx.settings.fleet_namespace, fr).await?;
        // The planned members' watches start now, so that their caches are filled by the first batch.
        if let Ok(d) = &found {
            for cluster in d.waves.iter().flat_map(|w| &w.clusters) {
                ctx.members.cache(cluster, fr.spec.targets.kind);
            }
        }
        Ok(found)
    }

    async fn observe(
        ctx: &Context,
        fr: &Arc<FleetRollout>,
        status: &FleetRolloutStatus,
        plan: &Plan,
    ) -> Result<MemberWorkloadsSeen> {
        let own_uid = fr.uid().unwrap_or_default();
        let mut seen = MemberWorkloadsSeen {
            container: container(fr).map(String::from),
            read: Read::default(),
            running: running_rollouts(&ctx.rollouts, &own_uid),
            looked: false,
        };
        let Some(current) = status.current_batch else { return Ok(seen) };
        // A rollback looks at the targets it still owes a restore; otherwise only the batch in flight matters.
        let targets: Vec<&PlannedTarget> = match status.phase {
            Phase::RollingBack => rollout::owed(status, plan),
            p if p.is_terminal() || p == Phase::WaitingForApproval => return Ok(seen),
            _ => plan.batch(current).iter().collect(),
        };
        seen.read = member_workloads::read(&ctx.members, status, fr.spec.targets.kind, &targets).await;
        seen.looked = true;
        Ok(seen)
    }

    async fn apply(ctx: &Context, fr: &FleetRollout, batch: Batch<'_>) -> Result<Outcome> {
        let new_image = |_: &PlannedTarget| batch.image.to_string();
        patch(ctx, fr, batch.key, failpoint::BETWEEN_PATCHES, batch.targets, new_image).await
    }

    async fn restore(
        ctx: &Context,
        fr: &FleetRollout,
        key: &str,
        targets: &[PlannedTarget],
    ) -> Result<Outcome> {
        let previous = |t: &PlannedTarget| t.previous_image.clone();
        patch(ctx, fr, key, failpoint::BETWEEN_RESTORES, targets, previous).await
    }
}

/// Sets each target's image to `image_of` it (a batch's or a restore's change, keyed `key`), member by
/// member with each member's own client.
async fn patch(
    ctx: &Context,
    fr: &FleetRollout,
    key: &str,
    between: &'static str,
    targets: &[PlannedTarget],
    image_of: impl Fn(&PlannedTarget) -> String + Sync,
) -> Result<Outcome> {
    let (rollout, holder) = (rollout_key(fr), holder(ctx, fr));
    let change = change_of(fr, key, &rollout, between, &holder);
    member_workloads::change(&ctx.members, &ctx.metrics, &change, targets, image_of).await
}

impl Seen for MemberWorkloadsSeen {
    fn target(&self, t: &PlannedTarget) -> Option<TargetState> {
        let facts = self.read.facts.get(&t.key())?;
        Some(workloads::state_of(facts, self.container.as_deref()))
    }

    fn probe_url(&self, template: &str, t: &PlannedTarget) -> Option<String> {
        Some(template.replace("{name}", &t.name).replace("{namespace}", &t.namespace))
    }

    // Matching workloads outside the plan would need every member listed at every batch: not reported.
    fn unplanned(&self, _: &HashSet<(String, String)>) -> Option<Unplanned> {
        None
    }

    fn held_by(&self, t: &PlannedTarget) -> Option<String> {
        let applied = self.read.facts.get(&t.key())?.applied.as_deref()?;
        self.running.get(scope::key_owner(applied)).cloned()
    }

    fn recheck(&self) -> Option<Duration> {
        let blind = self.read.unwatched || !self.read.unreachable.is_empty();
        self.looked.then_some(if blind { MEMBER_RECHECK } else { WATCHED_RECHECK })
    }

    // Drift after success is watched in the rollout's own cluster only.
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
