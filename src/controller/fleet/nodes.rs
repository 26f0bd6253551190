//! Node rollouts in the rollout's own cluster, as the controller drives them: the DaemonSet's nodes read
//! live, its pods replaced node by node (see `edge::nodes`).

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::Duration,
};

use kube::ResourceExt;

use super::{Batch, Context, Fleet, Seen, rollout_key, rollout_known};
use crate::{
    api::{FleetRollout, FleetRolloutStatus, Phase, PlannedTarget, Unplanned},
    core::{
        Blocked,
        plan::{Discovered, Plan},
        rollout::{Carrier, TargetState},
    },
    edge::{
        nodes::{self, At, View},
        workloads::Outcome,
    },
    error::Result,
};

/// How soon a node rollout in progress looks at its nodes and pods again (they are not watched).
const NODE_RECHECK: Duration = Duration::from_secs(2);

/// The nodes of a node rollout, read live while it runs (a cluster-wide pod cache would cost more than
/// the short, small node rollouts it would serve).
pub(in crate::controller) struct Nodes;

pub(in crate::controller) struct NodesSeen {
    /// None while there is nothing to look at: the rollout is finished, or waits for a person (no batch
    /// is in flight then, and a rollout left waiting must not list every node every few seconds).
    view: Option<View>,
    states: HashMap<String, TargetState>,
    /// Another existing rollout holding the DaemonSet: every node is held then.
    daemonset_holder: Option<String>,
}

impl Fleet for Nodes {
    type Seen = NodesSeen;

    async fn discover(ctx: &Context, fr: &FleetRollout) -> Result<Result<Discovered, Blocked>> {
        Ok(nodes::discover(At::home(&ctx.client, fr), fr).await?.map(Discovered::local))
    }

    async fn observe(
        ctx: &Context,
        fr: &Arc<FleetRollout>,
        status: &FleetRolloutStatus,
        _: &Plan,
    ) -> Result<NodesSeen> {
        let waiting = matches!(status.phase, Phase::Paused | Phase::WaitingForApproval);
        if status.phase.is_terminal() || waiting {
            return Ok(NodesSeen { view: None, states: HashMap::new(), daemonset_holder: None });
        }
        let view = View::read(At::home(&ctx.client, fr), fr).await?;
        let states = view.rollout_states(fr, status, status.current_batch);
        let own = rollout_key(fr);
        let daemonset_holder = view
            .daemonset
            .as_ref()
            .and_then(|ds| crate::core::nodes::held_by_other(ds.annotations(), &own))
            .filter(|other| rollout_known(ctx, other))
            .map(String::from);
        Ok(NodesSeen { view: Some(view), states, daemonset_holder })
    }

    async fn apply(ctx: &Context, fr: &FleetRollout, batch: Batch<'_>) -> Result<Outcome> {
        let revision = crate::core::nodes::revision_key(&fr.uid().unwrap_or_default(), batch.revision);
        let writer = match ctx.writer(fr) {
            Ok(w) => w,
            Err(why) => return Ok(Outcome::denied(batch.targets, &why)),
        };
        nodes::apply(
            At::home_as(&ctx.client, &writer, fr),
            &ctx.metrics,
            fr,
            &revision,
            batch.image,
            &rollout_key(fr),
            batch.targets,
        )
        .await
    }

    async fn restore(
        ctx: &Context,
        fr: &FleetRollout,
        _key: &str,
        targets: &[PlannedTarget],
    ) -> Result<Outcome> {
        let writer = match ctx.writer(fr) {
            Ok(w) => w,
            Err(why) => return Ok(Outcome::denied(targets, &why)),
        };
        nodes::restore(At::home_as(&ctx.client, &writer, fr), &ctx.metrics, fr, targets).await
    }

    async fn release(ctx: &Context, fr: &FleetRollout, finished: bool) -> Result<()> {
        if !ctx.daemonset_held(fr) {
            return Ok(());
        }
        // A creator who cannot have it handed back (its rights gone, or never one to act as) leaves it held
        // rather than keeping a finished rollout from ending: said in an event and the log.
        let handed = nodes::hand_back(&ctx.client, &ctx.writer(fr), fr, finished).await?;
        if let nodes::HandBack::Left(why) = handed {
            let message = format!(
                "DaemonSet {} not handed back ({why}); set its updateStrategy back by hand",
                fr.spec.targets.daemon_set.as_deref().unwrap_or_default()
            );
            tracing::warn!(%message, "could not hand the DaemonSet back");
            ctx.rollouts_io.warn(fr, crate::core::reason::CANNOT_ACT_AS_CREATOR, message);
        }
        Ok(())
    }
}

impl Seen for NodesSeen {
    fn target(&self, t: &PlannedTarget) -> Option<TargetState> {
        self.states.get(&t.name).cloned()
    }

    fn probe_url(&self, template: &str, t: &PlannedTarget) -> Option<String> {
        self.view.as_ref().map(|v| v.url_for(template, &t.name))
    }

    fn unplanned(&self, members: &HashSet<(String, String)>) -> Option<Unplanned> {
        self.view.as_ref().map(|v| v.unplanned(members))
    }

    fn held_by(&self, _: &PlannedTarget) -> Option<String> {
        self.daemonset_holder.clone()
    }

    fn recheck(&self) -> Option<Duration> {
        // Pods and nodes are not watched: look again soon (a NotReady node fails, never hangs).
        self.view.as_ref().map(|_| NODE_RECHECK)
    }

    // A node's pod is replaced, not changed in place: nothing carries a key after success to look at.
    fn carrying(&self, _: &str) -> Vec<Carrier> {
        Vec::new()
    }
}
