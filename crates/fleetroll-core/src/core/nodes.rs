//! Node-scoped rollouts (`targets.kind: Node`): the targets are nodes, the workload is one DaemonSet, and a
//! batch replaces that DaemonSet's pod on each of its nodes.
//!
//! fleetroll takes over the DaemonSet's updates while the rollout runs (update strategy `OnDelete`, so the
//! DaemonSet controller only ever creates a pod where one is missing), changes the pod template once per
//! revision, and deletes the old pod node by node. The template carries the revision's key, so every new
//! pod does too: a pod that carries it is never deleted again. The strategy and template from before the
//! rollout are saved in annotations on the DaemonSet, to hand updates back afterwards and to roll back.
//!
//! Pure functions over Nodes, Pods and the DaemonSet; the IO is in `edge::nodes`.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::{
    apps::v1::{DaemonSet, DaemonSetUpdateStrategy},
    core::v1::{Node, Pod, PodTemplateSpec},
};
use kube_core::ResourceExt;

use crate::{
    api::{APPLIED_ANNOTATION, ROLLOUT_ANNOTATION},
    core::{
        plan::Candidate,
        reason,
        rollout::TargetState,
        workload::{Readiness, rolled_container},
    },
};

mod kept;
pub use kept::{kept_node, kept_pod, node_weight, pod_weight};

/// The DaemonSet's update strategy before fleetroll took over its updates (JSON).
pub const SAVED_STRATEGY_ANNOTATION: &str = "fleetroll.dev/saved-update-strategy";
/// The DaemonSet's pod template before fleetroll first changed it (JSON), for a rollback.
pub const SAVED_TEMPLATE_ANNOTATION: &str = "fleetroll.dev/saved-template";

/// The key every pod of a revision carries (the batch keys of that revision start with it).
pub fn revision_key(uid: &str, revision: u32) -> String {
    format!("{uid}/{revision}")
}

/// Whether a node's Ready condition is True, or why not.
pub fn node_ready(node: &Node) -> Result<(), String> {
    let ready = node.status.as_ref().and_then(|s| s.conditions.as_ref()).and_then(|cs| {
        cs.iter()
            .find(|c| c.type_ == "Ready")
            .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
    });
    match ready {
        Some((status, _, _)) if status == "True" => Ok(()),
        Some((status, reason, message)) => Err(format!(
            "node {} is not Ready (Ready={status}{}{})",
            node.name_any(),
            reason.map(|r| format!(", {r}")).unwrap_or_default(),
            message.map(|m| format!(": {m}")).unwrap_or_default()
        )),
        None => Err(format!("node {} reports no Ready condition", node.name_any())),
    }
}

/// The DaemonSet's pod on each node: pods controlled by the DaemonSet (by uid), by `spec.nodeName`. When a
/// node has several (an old one terminating, its replacement starting), one not being deleted wins, then
/// the newest.
pub fn pods_by_node<'a>(ds_uid: &str, pods: &'a [Pod]) -> HashMap<String, &'a Pod> {
    let mut by_node: HashMap<String, &Pod> = HashMap::new();
    let rank = |p: &Pod| (p.metadata.deletion_timestamp.is_none(), p.metadata.creation_timestamp.clone());
    for pod in pods.iter().filter(|p| controlled_by(p, ds_uid)) {
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else { continue };
        match by_node.get(&node) {
            Some(other) if rank(other) >= rank(pod) => {}
            _ => {
                by_node.insert(node, pod);
            }
        }
    }
    by_node
}

fn controlled_by(pod: &Pod, uid: &str) -> bool {
    pod.owner_references().iter().any(|o| o.controller == Some(true) && o.uid == uid)
}

/// Whether a pod was created from the template of the revision with key `key`.
pub fn is_of_revision(pod: &Pod, key: &str) -> bool {
    pod.annotations().get(APPLIED_ANNOTATION).map(String::as_str) == Some(key)
}

/// The image of the rolled container of a pod spec's containers: the named one, or the only one.
fn container_image<'a>(
    containers: &'a [k8s_openapi::api::core::v1::Container],
    container: Option<&str>,
) -> Option<&'a str> {
    rolled_container(containers, |c| &c.name, container).and_then(|i| containers.get(i)?.image.as_deref())
}

fn pod_image<'a>(pod: &'a Pod, container: Option<&str>) -> Option<&'a str> {
    pod.spec.as_ref().and_then(|s| container_image(&s.containers, container))
}

/// The nodes a revision plans: those listed (by `targets.nodeSelector`) that run a pod of the DaemonSet now,
/// with that pod's image. Nodes are cluster-scoped, so a node target has no namespace.
pub fn candidates(nodes: &[Node], pods: &HashMap<String, &Pod>, container: Option<&str>) -> Vec<Candidate> {
    nodes
        .iter()
        .filter_map(|n| {
            let pod = pods.get(&n.name_any())?;
            Some(Candidate {
                cluster: String::new(),
                namespace: String::new(),
                name: n.name_any(),
                current_image: pod_image(pod, container).unwrap_or_default().to_string(),
            })
        })
        .collect()
}

/// What the state machine needs of one node target, given the node (None: it is gone) and the
/// DaemonSet's pod on it. `revision` is the revision key, `batch` the key of the batch it belongs to.
pub fn target_state(
    node: Option<&Node>,
    pod: Option<&Pod>,
    revision: &str,
    batch: &str,
    image: &str,
    container: Option<&str>,
) -> Option<TargetState> {
    let node = node?;
    let name = node.name_any();
    let new_pod = pod.filter(|p| is_of_revision(p, revision));
    // A pod of the revision runs what the template says; an old pod is simply not replaced yet.
    let current = new_pod.and_then(|p| pod_image(p, container)).unwrap_or(image).to_string();
    let readiness = match (node_ready(node), pod, new_pod) {
        (Err(why), _, _) => Readiness::Failed { reason: reason::NODE_NOT_READY, message: why },
        (Ok(()), None, _) => Readiness::NotReady(format!("no pod of the DaemonSet on node {name} yet")),
        (Ok(()), Some(old), None) => Readiness::NotReady(format!(
            "the old pod {} is still on node {name}{}",
            old.name_any(),
            if old.metadata.deletion_timestamp.is_some() { " (terminating)" } else { "" }
        )),
        (Ok(()), Some(_), Some(p)) => pod_readiness(p, &name),
    };
    Some(TargetState { image: Ok(current), applied: Some(batch.to_string()), readiness, http: None })
}

fn pod_readiness(pod: &Pod, node: &str) -> Readiness {
    let status = pod.status.clone().unwrap_or_default();
    if status.phase.as_deref() == Some("Failed") {
        return Readiness::Failed {
            reason: reason::POD_FAILED,
            message: format!(
                "pod {} on node {node} failed{}",
                pod.name_any(),
                status.message.map(|m| format!(": {m}")).unwrap_or_default()
            ),
        };
    }
    if pod.metadata.deletion_timestamp.is_some() {
        return Readiness::NotReady(format!("pod {} on node {node} is being deleted", pod.name_any()));
    }
    let ready =
        status.conditions.unwrap_or_default().iter().any(|c| c.type_ == "Ready" && c.status == "True");
    if ready {
        Readiness::Ready
    } else {
        Readiness::NotReady(format!("pod {} on node {node} is not Ready yet", pod.name_any()))
    }
}

/// What to do with one node of a batch being applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeAction {
    /// Delete this pod (by uid, so a replacement is never deleted by mistake).
    Delete { pod: String, uid: String },
    /// Already replaced, being replaced, or no pod to replace (the DaemonSet creates one from the new
    /// template).
    Nothing,
    /// Gone, or NotReady (a delete there would hang in Terminating); the verdict reports it.
    Skip,
}

/// The action for a node of a batch of revision `revision`.
pub fn node_action(node: Option<&Node>, pod: Option<&Pod>, revision: &str) -> NodeAction {
    let Some(node) = node else { return NodeAction::Skip };
    if node_ready(node).is_err() {
        return NodeAction::Skip;
    }
    match pod {
        Some(p) if !is_of_revision(p, revision) && p.metadata.deletion_timestamp.is_none() => {
            NodeAction::Delete { pod: p.name_any(), uid: p.uid().unwrap_or_default() }
        }
        _ => NodeAction::Nothing,
    }
}

/// The action for a node of a rollback by the rollout with uid `uid`: the pod this rollout created there
/// is replaced (from the restored template); a node it never changed is left alone.
pub fn restore_action(node: Option<&Node>, pod: Option<&Pod>, uid: &str) -> NodeAction {
    let ours = format!("{uid}/");
    let made_by_us = pod.is_some_and(|p| {
        p.annotations().get(APPLIED_ANNOTATION).is_some_and(|k| k.starts_with(&ours))
            && p.metadata.deletion_timestamp.is_none()
    });
    match (node, pod) {
        (Some(n), Some(p)) if made_by_us && node_ready(n).is_ok() => {
            NodeAction::Delete { pod: p.name_any(), uid: p.uid().unwrap_or_default() }
        }
        (Some(_), _) if !made_by_us => NodeAction::Nothing,
        _ => NodeAction::Skip,
    }
}

/// The DaemonSet with fleetroll in control of its updates and its template at revision `revision`, or
/// None when it already is. Saves the strategy and template from before the rollout, once. An error says
/// the container to change is not in the template (any more).
pub fn take_control(
    ds: &DaemonSet,
    container: Option<&str>,
    image: &str,
    revision: &str,
    rollout: &str,
) -> Result<Option<DaemonSet>, String> {
    let template = &ds.spec.template;
    let on_delete = strategy_type(ds.spec.update_strategy.as_ref()) == "OnDelete";
    let current = template.spec.as_ref().and_then(|s| container_image(&s.containers, container));
    let stamped = template
        .metadata
        .as_ref()
        .and_then(|m| m.annotations.as_ref())
        .and_then(|a| a.get(APPLIED_ANNOTATION));
    let saved = ds.annotations().contains_key(SAVED_STRATEGY_ANNOTATION);
    let missing = || match container {
        Some(name) => format!("DaemonSet {} has no container {name:?}", ds.name_any()),
        None => format!("DaemonSet {} has several containers; set spec.container", ds.name_any()),
    };
    if current.is_none() {
        return Err(missing());
    }
    if on_delete && saved && current == Some(image) && stamped.map(String::as_str) == Some(revision) {
        return Ok(None);
    }
    let mut next = ds.clone();
    next.metadata.managed_fields = None;
    let annotations = next.metadata.annotations.get_or_insert_with(BTreeMap::new);
    annotations.insert(ROLLOUT_ANNOTATION.into(), rollout.into());
    if !annotations.contains_key(SAVED_STRATEGY_ANNOTATION) {
        let strategy = ds.spec.update_strategy.clone().unwrap_or_default();
        annotations.insert(SAVED_STRATEGY_ANNOTATION.into(), json(&strategy)?);
    }
    if !annotations.contains_key(SAVED_TEMPLATE_ANNOTATION) {
        annotations.insert(SAVED_TEMPLATE_ANNOTATION.into(), json(template)?);
    }
    next.spec.update_strategy =
        Some(DaemonSetUpdateStrategy { type_: Some("OnDelete".into()), rolling_update: None });
    let tpl = &mut next.spec.template;
    let meta = tpl.metadata.get_or_insert_with(Default::default);
    let tpl_annotations = meta.annotations.get_or_insert_with(BTreeMap::new);
    tpl_annotations.insert(APPLIED_ANNOTATION.into(), revision.into());
    tpl_annotations.insert(ROLLOUT_ANNOTATION.into(), rollout.into());
    let containers = &mut tpl.spec.as_mut().ok_or_else(missing)?.containers;
    let target = rolled_container(containers, |c| &c.name, container)
        .and_then(|i| containers.get_mut(i))
        .ok_or_else(missing)?;
    target.image = Some(image.into());
    Ok(Some(next))
}

/// For the rollback of a rollout that had handed the DaemonSet back (it succeeded, so its saved template
/// is gone): the DaemonSet's updates taken over again and its template set to the one the rollout found —
/// the current template with the targets' image from before (`previous`) and without the rollout's key —
/// saved as the template to hand back. None when the DaemonSet is held (its saved template is restored
/// instead) or when its template is no longer the one this rollout (uid `uid`) set: a later change by
/// someone else is not undone.
pub fn take_back(
    ds: &DaemonSet,
    container: Option<&str>,
    previous: &str,
    rollout: &str,
    uid: &str,
) -> Result<Option<DaemonSet>, String> {
    let template = &ds.spec.template;
    let stamped = template.metadata.as_ref().and_then(|m| m.annotations.as_ref()?.get(APPLIED_ANNOTATION));
    if is_held(ds.annotations()) || !stamped.is_some_and(|k| k.starts_with(&format!("{uid}/"))) {
        return Ok(None);
    }
    let mut found = template.clone();
    if let Some(meta) = found.metadata.as_mut()
        && let Some(a) = meta.annotations.as_mut()
    {
        a.remove(APPLIED_ANNOTATION);
        a.remove(ROLLOUT_ANNOTATION);
        if a.is_empty() {
            meta.annotations = None;
        }
    }
    let missing = || format!("DaemonSet {} has no container to restore", ds.name_any());
    let containers = &mut found.spec.as_mut().ok_or_else(missing)?.containers;
    let target = rolled_container(containers, |c| &c.name, container)
        .and_then(|i| containers.get_mut(i))
        .ok_or_else(missing)?;
    target.image = Some(previous.into());
    let mut next = ds.clone();
    next.metadata.managed_fields = None;
    let annotations = next.metadata.annotations.get_or_insert_with(BTreeMap::new);
    annotations.insert(ROLLOUT_ANNOTATION.into(), rollout.into());
    annotations.insert(
        SAVED_STRATEGY_ANNOTATION.into(),
        json(&ds.spec.update_strategy.clone().unwrap_or_default())?,
    );
    annotations.insert(SAVED_TEMPLATE_ANNOTATION.into(), json(&found)?);
    next.spec.update_strategy =
        Some(DaemonSetUpdateStrategy { type_: Some("OnDelete".into()), rolling_update: None });
    next.spec.template = found;
    Ok(Some(next))
}

fn json(value: &impl serde::Serialize) -> Result<String, String> {
    serde_json::to_string(value).map_err(|e| format!("cannot encode the DaemonSet's settings: {e}"))
}

/// The DaemonSet with the template from before the rollout restored (a rollback), or None when there is
/// none saved or it is already in place.
pub fn restore_template(ds: &DaemonSet) -> Option<DaemonSet> {
    let saved: PodTemplateSpec =
        serde_json::from_str(ds.annotations().get(SAVED_TEMPLATE_ANNOTATION)?).ok()?;
    if ds.spec.template == saved {
        return None;
    }
    let mut next = ds.clone();
    next.metadata.managed_fields = None;
    next.spec.template = saved;
    Some(next)
}

/// The DaemonSet with its updates handed back: the saved strategy restored and the saved annotations
/// removed; None when fleetroll does not hold it.
pub fn release(ds: &DaemonSet) -> Option<DaemonSet> {
    let saved = ds.annotations().get(SAVED_STRATEGY_ANNOTATION)?;
    let strategy: DaemonSetUpdateStrategy = serde_json::from_str(saved).unwrap_or_default();
    let mut next = ds.clone();
    next.metadata.managed_fields = None;
    next.spec.update_strategy = Some(strategy);
    if let Some(a) = next.metadata.annotations.as_mut() {
        a.remove(SAVED_STRATEGY_ANNOTATION);
        a.remove(SAVED_TEMPLATE_ANNOTATION);
    }
    Some(next)
}

/// The DaemonSet as it was before the rollout took it over: its saved template and strategy restored and
/// the saved annotations removed; None when fleetroll does not hold it. For a rollout that ends without
/// succeeding (deleted while failed, aborted or half-way): handing back only the strategy would let the
/// DaemonSet controller roll the rollout's image to every node, ungated.
pub fn hand_back(ds: &DaemonSet) -> Option<DaemonSet> {
    let mut next = release(ds)?;
    if let Some(saved) = ds.annotations().get(SAVED_TEMPLATE_ANNOTATION)
        && let Ok(template) = serde_json::from_str::<PodTemplateSpec>(saved)
    {
        next.spec.template = template;
    }
    Some(next)
}

/// Whether fleetroll holds the DaemonSet's updates (and so must hand them back).
pub fn is_held(annotations: &BTreeMap<String, String>) -> bool {
    annotations.contains_key(SAVED_STRATEGY_ANNOTATION)
}

/// The rollout (`namespace/name`) holding the DaemonSet's updates, when that is not `own`. Two node
/// rollouts on one DaemonSet would each restore "the" saved strategy behind the other's back.
pub fn held_by_other<'a>(annotations: &'a BTreeMap<String, String>, own: &str) -> Option<&'a str> {
    let holder = annotations.get(ROLLOUT_ANNOTATION)?;
    (is_held(annotations) && holder != own).then_some(holder.as_str())
}

/// Whether this rollout holds the DaemonSet (so its deletion must hand it back).
pub fn held_by(annotations: &BTreeMap<String, String>, own: &str) -> bool {
    is_held(annotations) && annotations.get(ROLLOUT_ANNOTATION).map(String::as_str) == Some(own)
}

fn strategy_type(s: Option<&DaemonSetUpdateStrategy>) -> &str {
    s.and_then(|s| s.type_.as_deref()).unwrap_or("RollingUpdate")
}

#[cfg(test)]
mod tests;
