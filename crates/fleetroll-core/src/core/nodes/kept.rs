//! What node rollouts keep of the Pods and Nodes they list: only what their decisions read. The rest
//! (volumes, environments, managed fields, images on a node...) is dropped as each is read, so a list of
//! them holds this much whatever the API server sends.

use k8s_openapi::{
    api::core::v1::{Container, Node, NodeStatus, Pod, PodSpec, PodStatus},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};

/// What node rollouts read of a Pod: its identity, our annotations, its
/// controller, the times it was made and deleted, its node, its containers' names and images, its phase,
/// message, Ready condition and addresses. A list of them holds only this, whatever the API server sends.
pub fn kept_pod(pod: Pod) -> Pod {
    let m = pod.metadata;
    Pod {
        metadata: ObjectMeta {
            name: m.name,
            namespace: m.namespace,
            uid: m.uid,
            annotations: m
                .annotations
                .map(|a| a.into_iter().filter(|(k, _)| k.starts_with("fleetroll.dev/")).collect()),
            owner_references: m
                .owner_references
                .map(|o| o.into_iter().filter(|r| r.controller == Some(true)).take(1).collect()),
            creation_timestamp: m.creation_timestamp,
            deletion_timestamp: m.deletion_timestamp,
            ..ObjectMeta::default()
        },
        spec: pod.spec.map(|s| PodSpec {
            node_name: s.node_name,
            containers: s
                .containers
                .into_iter()
                .map(|c| Container { name: c.name, image: c.image, ..Container::default() })
                .collect(),
            ..PodSpec::default()
        }),
        status: pod.status.map(|s| PodStatus {
            phase: s.phase,
            message: s.message,
            conditions: s.conditions.map(|c| c.into_iter().filter(|c| c.type_ == "Ready").take(1).collect()),
            pod_ip: s.pod_ip,
            host_ip: s.host_ip,
            ..PodStatus::default()
        }),
    }
}

/// What node rollouts read of a Node: its name and its Ready condition.
pub fn kept_node(node: Node) -> Node {
    Node {
        metadata: ObjectMeta { name: node.metadata.name, ..ObjectMeta::default() },
        status: node.status.map(|s| NodeStatus {
            conditions: s.conditions.map(|c| c.into_iter().filter(|c| c.type_ == "Ready").take(1).collect()),
            ..NodeStatus::default()
        }),
        ..Node::default()
    }
}

/// About how many bytes of memory a kept Pod holds: what bounds a list of them.
pub fn pod_weight(pod: &Pod) -> usize {
    let containers = pod.spec.as_ref().map_or(0, |s| s.containers.len());
    std::mem::size_of::<Pod>() + containers * std::mem::size_of::<Container>() + text_len(pod)
}

/// About how many bytes of memory a kept Node holds.
pub fn node_weight(node: &Node) -> usize {
    std::mem::size_of::<Node>() + text_len(node)
}

/// The length of what a kept object says (its JSON): about what its strings hold.
fn text_len(kept: &impl serde::Serialize) -> usize {
    serde_json::to_vec(kept).map_or(0, |j| j.len())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::{
        api::APPLIED_ANNOTATION,
        core::nodes::{node_action, pods_by_node, restore_action, target_state},
    };

    /// A Pod as an API server sends it: much more than node rollouts read.
    fn pod(key: Option<&str>, phase: &str, ready: &str, deleting: bool) -> Pod {
        let mut annotations = json!({"example.com/big": "x".repeat(10_000)});
        if let Some(key) = key {
            annotations[APPLIED_ANNOTATION] = json!(key);
        }
        serde_json::from_value(json!({
            "metadata": {
                "name": "agent-x", "namespace": "ops", "uid": "pod-uid", "resourceVersion": "9",
                "labels": {"app": "agent"}, "annotations": annotations,
                "creationTimestamp": "2026-11-29T10:00:00Z",
                "deletionTimestamp": if deleting { json!("2026-11-29T11:00:00Z") } else { json!(null) },
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Other", "name": "o", "uid": "other"},
                    {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "uid": "ds-uid", "controller": true},
                ],
                "managedFields": [{"manager": "kubelet", "fieldsV1": {"f:status": {"f:phase": {}}}}],
            },
            "spec": {
                "nodeName": "n1",
                "containers": [
                    {"name": "agent", "image": "agent:v2", "env": [{"name": "A", "value": "1"}],
                     "volumeMounts": [{"name": "v", "mountPath": "/v"}]},
                    {"name": "sidecar", "image": "side:v1"},
                ],
                "volumes": [{"name": "v", "emptyDir": {}}],
            },
            "status": {
                "phase": phase, "message": "it went wrong", "podIP": "10.0.0.9", "hostIP": "192.168.0.1",
                "conditions": [{"type": "Initialized", "status": "True"}, {"type": "Ready", "status": ready}],
                "containerStatuses": [{"name": "agent", "image": "agent:v2", "imageID": "x", "ready": true,
                                       "restartCount": 0}],
            },
        }))
        .unwrap()
    }

    fn node(ready: &str) -> Node {
        let images: Vec<_> =
            (0..50).map(|i| json!({"names": [format!("image-{i}")], "sizeBytes": i})).collect();
        serde_json::from_value(json!({
            "metadata": {"name": "n1", "labels": {"pool": "a"}, "uid": "node-uid"},
            "spec": {"podCIDR": "10.0.0.0/24"},
            "status": {
                "conditions": [{"type": "MemoryPressure", "status": "False"},
                               {"type": "Ready", "status": ready, "reason": "KubeletNotReady", "message": "m"}],
                "images": images,
            },
        }))
        .unwrap()
    }

    #[test]
    fn what_is_kept_of_pods_and_nodes_decides_as_the_whole_objects_do() {
        for key in [None, Some("u/1"), Some("other/1")] {
            for (phase, ready, deleting) in [
                ("Running", "True", false),
                ("Running", "False", false),
                ("Failed", "False", false),
                ("Running", "True", true),
            ] {
                for node_ready in ["True", "False"] {
                    let (p, n) = (pod(key, phase, ready, deleting), node(node_ready));
                    let (kp, kn) = (kept_pod(p.clone()), kept_node(n.clone()));
                    let case = format!("{key:?} {phase} {ready} {deleting} {node_ready}");
                    for container in [None, Some("agent"), Some("sidecar")] {
                        assert_eq!(
                            target_state(Some(&n), Some(&p), "u/1", "u/1/0", "agent:v3", container),
                            target_state(Some(&kn), Some(&kp), "u/1", "u/1/0", "agent:v3", container),
                            "{case} {container:?}"
                        );
                    }
                    assert_eq!(
                        node_action(Some(&n), Some(&p), "u/1"),
                        node_action(Some(&kn), Some(&kp), "u/1"),
                        "{case}"
                    );
                    assert_eq!(
                        restore_action(Some(&n), Some(&p), "u"),
                        restore_action(Some(&kn), Some(&kp), "u"),
                        "{case}"
                    );
                    let whole = [p.clone()];
                    let kept = [kp.clone()];
                    let by_node = |pods| pods_by_node("ds-uid", pods).keys().cloned().collect::<Vec<_>>();
                    assert_eq!(by_node(&whole), by_node(&kept), "{case}");
                    // And it weighs a fraction of the whole (the 10 kB annotation, the images, the rest).
                    assert!(pod_weight(&kp) < pod_weight(&p) / 2, "{case}");
                    assert!(node_weight(&kn) < node_weight(&n) / 2, "{case}");
                }
            }
        }
    }
}
