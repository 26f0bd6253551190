//! One implementation per kind of target, behind one trait: how the controller finds a fleet, sees its
//! targets at a step, and carries out the core's changes on them. The kinds form a grid, named alike here
//! and in the edge: workloads (Deployments, StatefulSets, DaemonSets: read from watch caches, patched) or
//! nodes (a DaemonSet's pods replaced node by node, read live), in the rollout's own cluster
//! ([`Workloads`], [`Nodes`]; `edge::workloads`, `edge::nodes`) or in member clusters ([`MemberWorkloads`],
//! [`MemberNodes`]; `edge::members::workloads`, `edge::members::nodes`).

mod member_nodes;
mod member_workloads;
mod nodes;
mod workloads;

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    future::Future,
    sync::Arc,
    time::Duration,
};

use kube::{ResourceExt, runtime::reflector::ObjectRef};

pub(super) use self::{
    member_nodes::{MemberNodes, finalize as finalize_member_nodes},
    member_workloads::MemberWorkloads,
    nodes::Nodes,
    workloads::Workloads,
};
use super::Context;
use crate::{
    api::{FleetRollout, FleetRolloutStatus, PlannedTarget, Unplanned},
    core::{
        Blocked,
        plan::{Discovered, Plan},
        rollout::{Carrier, HeldBy, TargetState},
        scope,
    },
    edge::workloads::{Change, Holder, Outcome},
    error::Result,
};

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
    holder: Holder<'a>,
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

/// Whether the rollout `namespace/name` exists (in this operator's view of the FleetRollouts).
pub(super) fn rollout_known(ctx: &Context, key: &str) -> bool {
    key.split_once('/').is_some_and(|(ns, name)| ctx.rollouts.get(&ObjectRef::new(name).within(ns)).is_some())
}
