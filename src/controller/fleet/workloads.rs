//! Deployments, StatefulSets and DaemonSets in the rollout's own cluster, as the controller drives them:
//! read from the watch caches, patched as the creator.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, OnceLock},
    time::Duration,
};

use kube::ResourceExt;

use super::{Batch, Context, Fleet, Seen, change_of, container, holder, rollout_key, running_rollouts};
use crate::{
    api::{FleetRollout, FleetRolloutStatus, PlannedTarget, TargetKind, Unplanned},
    core::{
        Blocked,
        plan::{Discovered, Plan},
        rollout::{Carrier, TargetState},
        scope,
    },
    edge::{
        discovery,
        workloads::{self, Outcome, Stores},
    },
    error::Result,
    failpoint,
};

/// Deployments, StatefulSets and DaemonSets, read from the watch caches.
pub(in crate::controller) struct Workloads;

pub(in crate::controller) struct WorkloadsSeen {
    kind: TargetKind,
    container: Option<String>,
    stores: Stores,
    fr: Arc<FleetRollout>,
    fleet_namespace: String,
    /// The other rollouts still running, by uid, read once per step and only if asked.
    running: OnceLock<HashMap<String, String>>,
    rollouts: kube::runtime::reflector::Store<FleetRollout>,
}

impl Fleet for Workloads {
    type Seen = WorkloadsSeen;

    async fn discover(ctx: &Context, fr: &FleetRollout) -> Result<Result<Discovered, Blocked>> {
        discovery::discover(&ctx.client, &ctx.settings.fleet_namespace, fr).await
    }

    async fn observe(
        ctx: &Context,
        fr: &Arc<FleetRollout>,
        _: &FleetRolloutStatus,
        _: &Plan,
    ) -> Result<WorkloadsSeen> {
        Ok(WorkloadsSeen {
            kind: fr.spec.targets.kind,
            container: container(fr).map(String::from),
            stores: ctx.stores.clone(),
            fr: fr.clone(),
            fleet_namespace: ctx.settings.fleet_namespace.clone(),
            running: OnceLock::new(),
            rollouts: ctx.rollouts.clone(),
        })
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

/// Sets each target's image to `image_of` it (a batch's or a restore's change, keyed `key`), as the
/// rollout's creator, judged on the cached target first.
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
    let cached = |t: &PlannedTarget| ctx.stores.facts(change.kind, &t.namespace, &t.name);
    let writer = match ctx.writer(fr) {
        Ok(w) => w,
        Err(why) => return Ok(Outcome::denied(targets, &why)),
    };
    workloads::patch_all(&ctx.client, &writer, &cached, &ctx.metrics, &change, targets, image_of).await
}

impl Seen for WorkloadsSeen {
    fn target(&self, t: &PlannedTarget) -> Option<TargetState> {
        self.stores.state(self.kind, self.container.as_deref(), t)
    }

    fn probe_url(&self, template: &str, t: &PlannedTarget) -> Option<String> {
        Some(template.replace("{name}", &t.name).replace("{namespace}", &t.namespace))
    }

    fn unplanned(&self, members: &HashSet<(String, String)>) -> Option<Unplanned> {
        discovery::unplanned(&self.fr, &self.fleet_namespace, &self.stores, members)
    }

    fn held_by(&self, t: &PlannedTarget) -> Option<String> {
        let applied = self.stores.facts(self.kind, &t.namespace, &t.name)?.applied?;
        let own_uid = self.fr.uid().unwrap_or_default();
        let running = self.running.get_or_init(|| running_rollouts(&self.rollouts, &own_uid));
        running.get(scope::key_owner(&applied)).cloned()
    }

    fn recheck(&self) -> Option<Duration> {
        None
    }

    fn carrying(&self, prefix: &str) -> Vec<Carrier> {
        self.stores.carrying(self.kind, self.container.as_deref(), prefix)
    }
}
