//! Node-scoped rollouts, the IO side: reading the DaemonSet, its pods and the nodes (live, from the API
//! server: a node rollout is small and short-lived, and a cluster-wide pod cache would not be), taking over
//! and handing back the DaemonSet's updates, and replacing pods node by node. The decisions are in
//! [`crate::core::nodes`].

use std::collections::{HashMap, HashSet};

use futures::{StreamExt, stream};
use k8s_openapi::api::{
    apps::v1::DaemonSet,
    core::v1::{Node, Pod},
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, PostParams, Preconditions},
    core::Selector,
};
use tracing::{debug, info};

use super::{lists, workloads::Outcome};
use crate::{
    api::{FIELD_MANAGER, FleetRollout, FleetRolloutStatus, PlannedTarget, Unplanned},
    core::{
        Blocked,
        nodes::{self, NodeAction},
        plan::{self, Candidate},
        reason,
        rollout::TargetState,
        workload,
    },
    error::{Error, Result, denial, is_conflict, is_not_found},
    failpoint,
    metrics::Metrics,
};

/// How many pod deletions of one batch are in flight at once.
const DELETE_CONCURRENCY: usize = 16;

/// Where a node rollout's DaemonSet is: the client of its cluster (the rollout's own, or a member's) and
/// the one its DaemonSet and pods are changed with there, its namespace there, and the client of the
/// rollout's own cluster, where the rollouts that may hold it are.
#[derive(Clone, Copy)]
pub struct At<'a> {
    pub client: &'a Client,
    pub writer: &'a Client,
    pub hub: &'a Client,
    pub namespace: &'a str,
}

impl<'a> At<'a> {
    /// The DaemonSet of a rollout in its own cluster, read and changed with `client`.
    pub fn home(client: &'a Client, fr: &'a FleetRollout) -> Self {
        Self::home_as(client, client, fr)
    }

    /// The DaemonSet of a rollout in its own cluster: in the rollout's namespace, read with `client`,
    /// changed with `writer` (the rollout's creator, impersonated).
    pub fn home_as(client: &'a Client, writer: &'a Client, fr: &'a FleetRollout) -> Self {
        let namespace = fr.metadata.namespace.as_deref().unwrap_or_default();
        Self { client, writer, hub: client, namespace }
    }

    /// The DaemonSet in a member cluster, read and changed with the member's credentials.
    pub fn member(client: &'a Client, hub: &'a Client, namespace: &'a str) -> Self {
        Self { client, writer: client, hub, namespace }
    }
}

/// The DaemonSet, the nodes its rollout may target and the DaemonSet's pods, read together.
pub struct View {
    pub daemonset: Option<DaemonSet>,
    nodes: HashMap<String, Node>,
    pods: Vec<Pod>,
}

fn daemonsets(at: At<'_>) -> Api<DaemonSet> {
    Api::namespaced(at.client.clone(), at.namespace)
}

/// The rollout's DaemonSet as it is now, and the API to change it with; None when it is gone.
async fn daemonset(at: At<'_>, fr: &FleetRollout) -> Result<Option<(Api<DaemonSet>, DaemonSet)>> {
    let found = daemonsets(at).get_opt(&daemonset_name(fr)).await?;
    Ok(found.map(|ds| (Api::namespaced(at.writer.clone(), at.namespace), ds)))
}

fn daemonset_name(fr: &FleetRollout) -> String {
    fr.spec.targets.daemon_set.clone().unwrap_or_default()
}

fn node_selector(fr: &FleetRollout) -> Result<Option<Selector>, Blocked> {
    fr.spec.targets.node_selector.clone().map(Selector::try_from).transpose().map_err(|e| Blocked {
        reason: reason::INVALID_SELECTOR,
        message: format!("targets.nodeSelector: {e}"),
    })
}

impl View {
    pub async fn read(at: At<'_>, fr: &FleetRollout) -> Result<Self> {
        let client = at.client;
        let daemonset = daemonsets(at).get_opt(&daemonset_name(fr)).await?;
        let selector = node_selector(fr).ok().flatten();
        let lp = selector.map_or_else(ListParams::default, |s| ListParams::default().labels(&s.to_string()));
        let nodes = lists::kept(client, None, &lp, nodes::kept_node, nodes::node_weight).await?;
        let pods = match daemonset.as_ref().and_then(|d| d.spec.selector.clone().try_into().ok()) {
            Some(selector) => {
                let selector: Selector = selector;
                let lp = ListParams::default().labels(&selector.to_string());
                lists::kept(client, Some(at.namespace), &lp, nodes::kept_pod, nodes::pod_weight).await?
            }
            None => Vec::new(),
        };
        Ok(Self { daemonset, nodes: nodes.into_iter().map(|n| (n.name_any(), n)).collect(), pods })
    }

    fn pods_by_node(&self) -> HashMap<String, &Pod> {
        let uid = self.daemonset.as_ref().and_then(|d| d.uid()).unwrap_or_default();
        nodes::pods_by_node(&uid, &self.pods)
    }

    /// Every node target as the state machine sees it, keyed by node name.
    pub(crate) fn states(
        &self,
        revision: &str,
        batch: &str,
        image: &str,
        container: Option<&str>,
    ) -> HashMap<String, TargetState> {
        let pods = self.pods_by_node();
        self.nodes
            .iter()
            .filter_map(|(name, node)| {
                let state = nodes::target_state(
                    Some(node),
                    pods.get(name).copied(),
                    revision,
                    batch,
                    image,
                    container,
                )?;
                Some((name.clone(), state))
            })
            .collect()
    }

    /// Every node target as the state machine sees it for batch `batch` (by index) of the rollout's revision.
    pub fn rollout_states(
        &self,
        fr: &FleetRollout,
        status: &FleetRolloutStatus,
        batch: Option<u32>,
    ) -> HashMap<String, TargetState> {
        let revision = nodes::revision_key(&fr.uid().unwrap_or_default(), status.revision_number());
        let key = batch.and_then(|i| status.batch(i)).map_or("", |b| b.idempotency_key.as_str());
        let inputs = status.revision.as_ref().map(|r| &r.inputs);
        let image = inputs.map_or(fr.spec.image.as_str(), |i| i.image.as_str());
        self.states(&revision, key, image, inputs.and_then(|i| i.container.as_deref()))
    }

    /// The planned nodes: matching, and running a pod of the DaemonSet.
    fn candidates(&self, container: Option<&str>) -> Vec<Candidate> {
        let nodes: Vec<Node> = self.nodes.values().cloned().collect();
        nodes::candidates(&nodes, &self.pods_by_node(), container)
    }

    /// Matching nodes with a pod of the DaemonSet that the plan does not contain (reported, never added).
    pub fn unplanned(&self, members: &HashSet<(String, String)>) -> Unplanned {
        let extra = self
            .candidates(None)
            .into_iter()
            .filter(|c| !members.contains(&(c.namespace.clone(), c.name.clone())))
            .map(|c| c.name)
            .collect();
        plan::unplanned(extra)
    }

    /// URL placeholders of a node target's HTTP check: `{name}`/`{node}`, `{namespace}`, `{pod}`,
    /// `{podIP}` and `{hostIP}`.
    pub fn url_for(&self, template: &str, node: &str) -> String {
        let pods = self.pods_by_node();
        let pod = pods.get(node);
        let status = pod.and_then(|p| p.status.as_ref());
        let ns = self.daemonset.as_ref().and_then(|d| d.namespace()).unwrap_or_default();
        template
            .replace("{name}", node)
            .replace("{node}", node)
            .replace("{namespace}", &ns)
            .replace("{pod}", &pod.map(|p| p.name_any()).unwrap_or_default())
            .replace("{podIP}", status.and_then(|s| s.pod_ip.as_deref()).unwrap_or_default())
            .replace("{hostIP}", status.and_then(|s| s.host_ip.as_deref()).unwrap_or_default())
    }
}

/// The nodes of a new revision, or why there are none to plan.
pub async fn discover(at: At<'_>, fr: &FleetRollout) -> Result<Result<Vec<Candidate>, Blocked>> {
    if let Err(b) = node_selector(fr) {
        return Ok(Err(b));
    }
    let view = View::read(at, fr).await?;
    let ns = at.namespace;
    let name = daemonset_name(fr);
    let Some(ds) = &view.daemonset else {
        return Ok(Err(Blocked {
            reason: reason::DAEMONSET_NOT_FOUND,
            message: format!("DaemonSet {ns}/{name} (targets.daemonSet) does not exist; no pod was replaced"),
        }));
    };
    let own = format!("{ns}/{}", fr.name_any());
    if let Some(other) = nodes::held_by_other(ds.annotations(), &own)
        && rollout_exists(at.hub, other).await?
    {
        return Ok(Err(Blocked {
            reason: reason::TARGET_HELD,
            message: format!(
                "DaemonSet {ns}/{name} is held by FleetRollout {other} (it saved the DaemonSet's update strategy \
                 and has not handed it back); no pod was replaced. Roll that one back, or delete it"
            ),
        }));
    }
    if let Err(e) = workload::daemonset_facts(ds).container_image(fr.spec.container.as_deref()) {
        return Ok(Err(Blocked { reason: e.reason(), message: format!("{e}; no pod was replaced") }));
    }
    let found = view.candidates(fr.spec.container.as_deref());
    if found.is_empty() {
        return Ok(Err(Blocked {
            reason: reason::NO_TARGETS,
            message: format!("no node matching targets.nodeSelector runs a pod of DaemonSet {ns}/{name}"),
        }));
    }
    Ok(Ok(found))
}

/// Whether the FleetRollout `namespace/name` exists.
async fn rollout_exists(client: &Client, key: &str) -> Result<bool> {
    let Some((ns, name)) = key.split_once('/') else { return Ok(false) };
    Ok(Api::<FleetRollout>::namespaced(client.clone(), ns).get_opt(name).await?.is_some())
}

/// One batch (or one replay of it): takes control of the DaemonSet and sets its template to the
/// revision (once), then deletes the old pod on each node of the batch. Safe to repeat: a pod of the
/// revision is never deleted, and each delete is conditional on the pod's uid.
pub async fn apply(
    at: At<'_>,
    metrics: &Metrics,
    fr: &FleetRollout,
    revision: &str,
    image: &str,
    rollout: &str,
    targets: &[PlannedTarget],
) -> Result<Outcome> {
    let Some((api, ds)) = daemonset(at, fr).await? else {
        info!("the DaemonSet is gone; the batch is skipped");
        return Ok(Outcome::skipped(targets));
    };
    if let Some(other) = nodes::held_by_other(ds.annotations(), rollout)
        && rollout_exists(at.hub, other).await?
    {
        // Planned while the other rollout had not taken it yet: its batches are refused (see `scope`).
        return Err(Error::Target(format!("DaemonSet {} is held by FleetRollout {other}", ds.name_any())));
    }
    let taken = nodes::take_control(&ds, fr.spec.container.as_deref(), image, revision, rollout)
        .map_err(Error::Target)?;
    if let Some(next) = taken {
        if let Err(e) = api.replace(&ds.name_any(), &post_params(), &next).await {
            return refused(e, targets);
        }
        info!(daemonset = %ds.name_any(), %revision, %image, "took over the DaemonSet's updates; template set");
    }
    let view = View::read(at, fr).await?;
    let pods = view.pods_by_node();
    let actions: Vec<(usize, PlannedTarget, NodeAction)> = targets
        .iter()
        .enumerate()
        .map(|(i, t)| {
            (i, t.clone(), nodes::node_action(view.nodes.get(&t.name), pods.get(&t.name).copied(), revision))
        })
        .collect();
    let results: Vec<(PlannedTarget, NodeAction, Result<()>)> = stream::iter(actions)
        .map(|(i, target, action)| async move {
            if i > 0 {
                failpoint::hit(failpoint::BETWEEN_PATCHES).await;
            }
            let deleted = delete(at, metrics, &target.name, &action).await;
            (target, action, deleted)
        })
        .buffered(DELETE_CONCURRENCY)
        .collect()
        .await;
    let mut outcome = Outcome::default();
    for (target, action, deleted) in results {
        record(&mut outcome, target, &action, deleted)?;
    }
    Ok(outcome)
}

/// A DaemonSet change that failed: refused (an admission policy on DaemonSets, or a creator without the
/// right), no node of the batch can change, and each fails with the API server's words; else an error.
fn refused(e: kube::Error, targets: &[PlannedTarget]) -> Result<Outcome> {
    match denial(&e) {
        Some(message) => Ok(Outcome::denied(targets, &message)),
        None => Err(e.into()),
    }
}

/// Adds one node's action to the outcome: a deletion the API server refused fails that node.
fn record(outcome: &mut Outcome, target: PlannedTarget, action: &NodeAction, done: Result<()>) -> Result<()> {
    match done {
        Ok(()) => tally(outcome, action),
        Err(Error::Kube(e)) => match denial(&e) {
            Some(message) => outcome.denied.push((target, message)),
            None => return Err(Error::Kube(e)),
        },
        Err(e) => return Err(e),
    }
    Ok(())
}

async fn delete(at: At<'_>, metrics: &Metrics, node: &str, action: &NodeAction) -> Result<()> {
    let NodeAction::Delete { pod, uid } = action else { return Ok(()) };
    let params = DeleteParams {
        preconditions: Some(Preconditions { uid: Some(uid.clone()), resource_version: None }),
        ..Default::default()
    };
    metrics.target_patches.inc();
    match Api::<Pod>::namespaced(at.writer.clone(), at.namespace).delete(pod, &params).await {
        Ok(_) => {
            debug!(%node, %pod, "old pod deleted");
            Ok(())
        }
        // Gone already, or replaced (the uid precondition failed): either way the old pod is not there.
        Err(e) if is_not_found(&e) => Ok(()),
        Err(e) if is_conflict(&e) => Ok(()),
        Err(e) => Err(Error::Kube(e)),
    }
}

/// A rollback: restores the template from before the rollout, then replaces, node by node, the pods this
/// rollout created on `targets`.
pub async fn restore(
    at: At<'_>,
    metrics: &Metrics,
    fr: &FleetRollout,
    targets: &[PlannedTarget],
) -> Result<Outcome> {
    let Some((api, ds)) = daemonset(at, fr).await? else {
        return Ok(Outcome::skipped(targets));
    };
    let ours = fr.uid().unwrap_or_default();
    let own = format!("{}/{}", fr.namespace().unwrap_or_default(), fr.name_any());
    // Held: its saved template goes back. Handed back already (the rollout had succeeded): taken again.
    let previous = targets.first().map_or("", |t| t.previous_image.as_str());
    let next = match nodes::restore_template(&ds) {
        Some(next) => Some(next),
        None => nodes::take_back(&ds, fr.spec.container.as_deref(), previous, &own, &ours)
            .map_err(Error::Target)?,
    };
    if let Some(next) = next {
        if let Err(e) = api.replace(&ds.name_any(), &post_params(), &next).await {
            return refused(e, targets);
        }
        info!(daemonset = %ds.name_any(), "restored the pod template from before the rollout");
    }
    let view = View::read(at, fr).await?;
    let pods = view.pods_by_node();
    let mut outcome = Outcome::default();
    for (i, t) in targets.iter().enumerate() {
        let action = nodes::restore_action(view.nodes.get(&t.name), pods.get(&t.name).copied(), &ours);
        if i > 0 {
            failpoint::hit(failpoint::BETWEEN_RESTORES).await;
        }
        let deleted = delete(at, metrics, &t.name, &action).await;
        record(&mut outcome, t.clone(), &action, deleted)?;
    }
    Ok(outcome)
}

fn tally(outcome: &mut Outcome, action: &NodeAction) {
    match action {
        NodeAction::Delete { .. } => outcome.changed += 1,
        NodeAction::Nothing => outcome.unchanged += 1,
        NodeAction::Skip => outcome.skipped += 1,
    }
}

fn post_params() -> PostParams {
    PostParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() }
}

mod hand_back;
#[cfg(test)]
mod tests;

pub use hand_back::{HandBack, finalize, hand_back, release};
