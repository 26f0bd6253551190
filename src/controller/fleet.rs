//! One implementation per kind of target, behind one trait: how the controller finds a fleet, sees its
//! targets at a step, and carries out the core's changes on them. Workloads (Deployments, StatefulSets,
//! DaemonSets) are read from watch caches and patched; the nodes of a node rollout are read live and their
//! DaemonSet's pods replaced. Workloads and nodes of member clusters are two more (`members`, `member_nodes`).

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    future::Future,
    sync::{Arc, OnceLock},
    time::Duration,
};

use kube::{ResourceExt, runtime::reflector::ObjectRef};

use super::Context;
use crate::{
    api::{FleetRollout, FleetRolloutStatus, Phase, PlannedTarget, TargetKind, Unplanned},
    core::{
        Blocked, nodes,
        plan::{Discovered, Plan},
        rollout::{Carrier, HeldBy, TargetState},
        scope,
    },
    edge::{
        daemonset_pods::{self, At, View},
        discovery,
        targets::{self, Change, Outcome, Stores},
    },
    error::Result,
    runtime::failpoint,
};

/// How soon a node rollout in progress looks at its nodes and pods again (they are not watched).
const NODE_RECHECK: Duration = Duration::from_secs(2);

/// A kind of target, as the controller drives it.
pub(super) trait Fleet {
    /// What one step sees of the targets.
    type Seen: Seen + Send + Sync;

    /// The targets of a new revision, or why there are none to plan. The outer error is an API failure.
    fn discover(
        ctx: &Context,
        fr: &FleetRollout,
    ) -> impl Future<Output = Result<Result<Discovered, Blocked>>> + Send;

    /// What the state machine sees of the targets now (`plan`: the frozen plan, empty for a finished
    /// rollout).
    fn observe(
        ctx: &Context,
        fr: &Arc<FleetRollout>,
        status: &FleetRolloutStatus,
        plan: &Plan,
    ) -> impl Future<Output = Result<Self::Seen>> + Send;

    /// Changes `targets` to `image`, stamping `key`; a target that carries it already is left alone.
    fn apply(
        ctx: &Context,
        fr: &FleetRollout,
        change: Batch<'_>,
    ) -> impl Future<Output = Result<Outcome>> + Send;

    /// Restores the previous image of `targets`, stamping `key`.
    fn restore(
        ctx: &Context,
        fr: &FleetRollout,
        key: &str,
        targets: &[PlannedTarget],
    ) -> impl Future<Output = Result<Outcome>> + Send;

    /// Hands back what the rollout holds besides its targets (a node rollout's DaemonSet) now that it
    /// `finished`; workloads hold nothing.
    fn release(ctx: &Context, fr: &FleetRollout, finished: bool) -> impl Future<Output = Result<()>> + Send {
        let _ = (ctx, fr, finished);
        async { Ok(()) }
    }
}

/// One step's view of the targets.
pub(super) trait Seen {
    /// A target of the plan as it is now (its HTTP check aside); None when it is gone.
    fn target(&self, t: &PlannedTarget) -> Option<TargetState>;
    /// The URL of a target's HTTP check, its placeholders filled in; None when there is nothing to probe.
    fn probe_url(&self, template: &str, t: &PlannedTarget) -> Option<String>;
    /// Matching targets outside the plan; None when not known at this step.
    fn unplanned(&self, members: &HashSet<(String, String)>) -> Option<Unplanned>;
    /// Another rollout, still running, that holds the target (`namespace/name`).
    fn held_by(&self, t: &PlannedTarget) -> Option<String>;
    /// How soon to look again when nothing wakes the rollout (what is not watched).
    fn recheck(&self) -> Option<Duration>;
    /// The targets carrying a key that starts with `prefix`, with their images now.
    fn carrying(&self, prefix: &str) -> Vec<Carrier>;
    /// Member clusters that did not answer this step, with why (none in the rollout's own cluster).
    fn unreachable(&self) -> BTreeMap<String, String> {
        BTreeMap::new()
    }
    /// The labels of a member target's namespace in its cluster; None when not known.
    fn member_namespace(&self, _: &PlannedTarget) -> Option<BTreeMap<String, String>> {
        None
    }
}

/// A batch to change.
pub(super) struct Batch<'a> {
    pub key: &'a str,
    pub image: &'a str,
    pub targets: &'a [PlannedTarget],
    /// The revision being rolled out.
    pub revision: u32,
}

/// The container the rollout's revision changes (None: the targets' only one).
pub(super) fn container(fr: &FleetRollout) -> Option<&str> {
    fr.status.as_ref()?.revision.as_ref()?.inputs.container.as_deref()
}

/// The image change a rollout's batch (or rollback, keyed `key`) makes, `between` its target patches.
pub(super) fn change_of<'a>(
    fr: &'a FleetRollout,
    key: &'a str,
    rollout: &'a str,
    between: &'static str,
    holder: targets::Holder<'a>,
) -> Change<'a> {
    Change { kind: fr.spec.targets.kind, container: container(fr), key, rollout, between, holder }
}

/// Which other rollout changed a target carrying `key`, and whether it still runs, as the store has it when
/// asked (not a snapshot: a rollout that changed a target is in the store before it reconciles). The key of
/// a rollout no longer there is another's all the same: one since deleted.
pub(super) fn holder(ctx: &Context, fr: &FleetRollout) -> impl Fn(&str) -> Option<HeldBy> + Sync {
    let (own, rollouts) = (fr.uid().unwrap_or_default(), ctx.rollouts.clone());
    move |key: &str| {
        let owner = scope::key_owner(key);
        if owner == own || owner.is_empty() {
            return None;
        }
        Some(match rollouts.state().into_iter().find(|r| r.uid().as_deref() == Some(owner)) {
            Some(found) => HeldBy { rollout: rollout_key(&found), running: holds_targets(&found) },
            None => HeldBy {
                rollout: format!("(since deleted, uid {})", crate::core::text::cut(owner, 40)),
                running: false,
            },
        })
    }
}

pub(super) fn rollout_key(fr: &FleetRollout) -> String {
    format!("{}/{}", fr.namespace().unwrap_or_default(), fr.name_any())
}

/// Deployments, StatefulSets and DaemonSets, read from the watch caches.
pub(super) struct Workloads;

pub(super) struct WorkloadsSeen {
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
        let (rollout, holder) = (rollout_key(fr), holder(ctx, fr));
        let change = change_of(fr, batch.key, &rollout, failpoint::BETWEEN_PATCHES, &holder);
        let cached = |t: &PlannedTarget| ctx.stores.facts(change.kind, &t.namespace, &t.name);
        let writer = match ctx.writer(fr) {
            Ok(w) => w,
            Err(why) => return Ok(Outcome::denied(batch.targets, &why)),
        };
        targets::patch_all(&ctx.client, &writer, &cached, &ctx.metrics, &change, batch.targets, |_| {
            batch.image.to_string()
        })
        .await
    }

    async fn restore(
        ctx: &Context,
        fr: &FleetRollout,
        key: &str,
        targets: &[PlannedTarget],
    ) -> Result<Outcome> {
        let (rollout, holder) = (rollout_key(fr), holder(ctx, fr));
        let change = change_of(fr, key, &rollout, failpoint::BETWEEN_RESTORES, &holder);
        let cached = |t: &PlannedTarget| ctx.stores.facts(change.kind, &t.namespace, &t.name);
        let writer = match ctx.writer(fr) {
            Ok(w) => w,
            Err(why) => return Ok(Outcome::denied(targets, &why)),
        };
        let restore = |t: &PlannedTarget| t.previous_image.clone();
        targets::patch_all(&ctx.client, &writer, &cached, &ctx.metrics, &change, targets, restore).await
    }
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

/// Whether a rollout still holds the targets it changed: it runs, and is not being deleted (one whose
/// deletion waits on someone else's finalizer changes nothing any more, and must not hold others off).
fn holds_targets(fr: &FleetRollout) -> bool {
    fr.metadata.deletion_timestamp.is_none() && !fr.status.as_ref().is_some_and(|s| s.phase.is_terminal())
}

/// The other rollouts still running, by uid (`namespace/name`): a target one of them changed last is held.
pub(super) fn running_rollouts(
    rollouts: &kube::runtime::reflector::Store<FleetRollout>,
    own_uid: &str,
) -> HashMap<String, String> {
    rollouts
        .state()
        .iter()
        .filter(|fr| holds_targets(fr))
        .filter_map(|fr| {
            let uid = fr.uid()?;
            (uid != own_uid).then(|| (uid, rollout_key(fr)))
        })
        .collect()
}

/// The nodes of a node rollout, read live while it runs (a cluster-wide pod cache would cost more than
/// the short, small node rollouts it would serve).
pub(super) struct Nodes;

pub(super) struct NodesSeen {
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
        Ok(daemonset_pods::discover(At::home(&ctx.client, fr), fr).await?.map(Discovered::local))
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
            .and_then(|ds| nodes::held_by_other(ds.annotations(), &own))
            .filter(|other| rollout_known(ctx, other))
            .map(String::from);
        Ok(NodesSeen { view: Some(view), states, daemonset_holder })
    }

    async fn apply(ctx: &Context, fr: &FleetRollout, batch: Batch<'_>) -> Result<Outcome> {
        let revision = nodes::revision_key(&fr.uid().unwrap_or_default(), batch.revision);
        let writer = match ctx.writer(fr) {
            Ok(w) => w,
            Err(why) => return Ok(Outcome::denied(batch.targets, &why)),
        };
        daemonset_pods::apply(
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
        daemonset_pods::restore(At::home_as(&ctx.client, &writer, fr), &ctx.metrics, fr, targets).await
    }

    async fn release(ctx: &Context, fr: &FleetRollout, finished: bool) -> Result<()> {
        if !ctx.daemonset_held(fr) {
            return Ok(());
        }
        // A creator who cannot have it handed back (its rights gone, or never one to act as) leaves it held
        // rather than keeping a finished rollout from ending: said in an event and the log.
        let handed = daemonset_pods::hand_back(&ctx.client, &ctx.writer(fr), fr, finished).await?;
        if let daemonset_pods::HandBack::Left(why) = handed {
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

/// Whether the rollout `namespace/name` exists (in this operator's view of the FleetRollouts).
pub(super) fn rollout_known(ctx: &Context, key: &str) -> bool {
    key.split_once('/').is_some_and(|(ns, name)| ctx.rollouts.get(&ObjectRef::new(name).within(ns)).is_some())
}
