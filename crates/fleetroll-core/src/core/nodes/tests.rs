use serde_json::json;

use super::*;

fn node(name: &str, ready: &str) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"pool": "a"}},
        "status": {"conditions": [{"type": "Ready", "status": ready, "reason": "KubeletNotReady"}]},
    }))
    .unwrap()
}

fn pod(name: &str, node: &str, owner: &str, key: Option<&str>, image: &str, ready: bool) -> Pod {
    let annotations = key.map(|k| json!({APPLIED_ANNOTATION: k})).unwrap_or(json!({}));
    serde_json::from_value(json!({
        "metadata": {
            "name": name, "uid": format!("uid-{name}"), "annotations": annotations,
            "creationTimestamp": "2026-11-29T10:00:00Z",
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "uid": owner, "controller": true}],
        },
        "spec": {"nodeName": node, "containers": [{"name": "agent", "image": image}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]},
    }))
    .unwrap()
}

fn daemonset() -> DaemonSet {
    serde_json::from_value(json!({
        "metadata": {"name": "agent", "namespace": "ops", "uid": "ds-uid"},
        "spec": {
            "selector": {"matchLabels": {"app": "agent"}},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 2}},
            "template": {
                "metadata": {"labels": {"app": "agent"}},
                "spec": {"containers": [{"name": "agent", "image": "agent:v1"}]},
            },
        },
    }))
    .unwrap()
}

#[test]
fn a_node_is_ready_only_with_ready_true() {
    assert_eq!(node_ready(&node("n1", "True")), Ok(()));
    let why = node_ready(&node("n1", "Unknown")).unwrap_err();
    assert!(why.contains("n1 is not Ready (Ready=Unknown, KubeletNotReady)"), "{why}");
    let bare: Node = serde_json::from_value(json!({"metadata": {"name": "n2"}})).unwrap();
    assert!(node_ready(&bare).is_err());
}

#[test]
fn the_pod_of_a_node_is_the_daemonsets_and_the_live_one_wins() {
    let mut old = pod("old", "n1", "ds-uid", None, "agent:v1", true);
    old.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time("2026-11-29T10:01:00Z".parse().unwrap()));
    let new = pod("new", "n1", "ds-uid", Some("u/1"), "agent:v2", false);
    let stranger = pod("stranger", "n2", "other-uid", None, "x", true);
    let pods = [old, new, stranger];
    let by_node = pods_by_node("ds-uid", &pods);
    assert_eq!(by_node.len(), 1);
    assert_eq!(by_node["n1"].name_any(), "new");
}

#[test]
fn a_node_target_is_ready_only_with_a_ready_pod_of_the_revision() {
    let n = node("n1", "True");
    let state = |p: Option<&Pod>| target_state(Some(&n), p, "u/1", "u/1/0", "agent:v2", None).unwrap();
    let none = state(None);
    assert!(matches!(none.readiness, Readiness::NotReady(ref why) if why.contains("no pod")), "{none:?}");
    let old = pod("old", "n1", "ds-uid", None, "agent:v1", true);
    assert!(matches!(state(Some(&old)).readiness, Readiness::NotReady(ref why) if why.contains("old pod")));
    let starting = pod("new", "n1", "ds-uid", Some("u/1"), "agent:v2", false);
    assert!(matches!(state(Some(&starting)).readiness, Readiness::NotReady(_)));
    let ready = pod("new", "n1", "ds-uid", Some("u/1"), "agent:v2", true);
    let s = state(Some(&ready));
    assert_eq!(
        (s.readiness, s.image, s.applied),
        (Readiness::Ready, Ok("agent:v2".into()), Some("u/1/0".into()))
    );
    // Someone changed the template under the rollout: the verdict sees the other image.
    let edited = pod("new", "n1", "ds-uid", Some("u/1"), "agent:v3", true);
    assert_eq!(state(Some(&edited)).image, Ok("agent:v3".into()));
}

#[test]
fn a_not_ready_node_fails_at_once_and_a_gone_node_is_missing() {
    let n = node("n1", "False");
    let ready = pod("new", "n1", "ds-uid", Some("u/1"), "agent:v2", true);
    let s = target_state(Some(&n), Some(&ready), "u/1", "u/1/0", "agent:v2", None).unwrap();
    assert!(matches!(s.readiness, Readiness::Failed { reason: reason::NODE_NOT_READY, .. }), "{s:?}");
    assert_eq!(target_state(None, Some(&ready), "u/1", "u/1/0", "agent:v2", None), None);
}

#[test]
fn only_an_old_pod_on_a_ready_node_is_deleted() {
    let ready = node("n1", "True");
    let old = pod("old", "n1", "ds-uid", Some("u/0"), "agent:v1", true);
    let new = pod("new", "n1", "ds-uid", Some("u/1"), "agent:v2", false);
    assert_eq!(
        node_action(Some(&ready), Some(&old), "u/1"),
        NodeAction::Delete { pod: "old".into(), uid: "uid-old".into() }
    );
    assert_eq!(node_action(Some(&ready), Some(&new), "u/1"), NodeAction::Nothing);
    assert_eq!(node_action(Some(&ready), None, "u/1"), NodeAction::Nothing);
    assert_eq!(node_action(Some(&node("n1", "False")), Some(&old), "u/1"), NodeAction::Skip);
    assert_eq!(node_action(None, Some(&old), "u/1"), NodeAction::Skip);
}

#[test]
fn taking_control_saves_what_was_there_once_and_release_restores_it() {
    let ds = daemonset();
    let held = take_control(&ds, None, "agent:v2", "u/1", "ops/r").unwrap().unwrap();
    assert_eq!(held.spec.update_strategy.as_ref().and_then(|s| s.type_.as_deref()), Some("OnDelete"));
    let tpl = &held.spec.template;
    assert_eq!(tpl.spec.as_ref().unwrap().containers[0].image.as_deref(), Some("agent:v2"));
    assert_eq!(tpl.metadata.as_ref().unwrap().annotations.as_ref().unwrap()[APPLIED_ANNOTATION], "u/1");
    assert!(is_held(held.annotations()));
    assert_eq!(take_control(&held, None, "agent:v2", "u/1", "ops/r"), Ok(None), "not idempotent");

    // A second revision changes the template again but keeps what was saved before the first.
    let second = take_control(&held, Some("agent"), "agent:v3", "u/2", "ops/r").unwrap().unwrap();
    assert_eq!(
        second.annotations()[SAVED_TEMPLATE_ANNOTATION],
        held.annotations()[SAVED_TEMPLATE_ANNOTATION]
    );

    let restored = restore_template(&second).unwrap();
    assert_eq!(restored.spec.template, ds.spec.template);
    assert_eq!(restore_template(&restored), None);

    let released = release(&restored).unwrap();
    assert_eq!(released.spec.update_strategy, ds.spec.update_strategy);
    assert!(!is_held(released.annotations()));
    assert!(!released.annotations().contains_key(SAVED_TEMPLATE_ANNOTATION));
    assert_eq!(release(&released), None);
}

#[test]
fn a_wrong_container_name_is_an_error_not_a_no_op() {
    let err = take_control(&daemonset(), Some("sidecar"), "agent:v2", "u/1", "ops/r").unwrap_err();
    assert!(err.contains("no container \"sidecar\""), "{err}");
}

#[test]
fn candidates_are_the_nodes_that_run_a_pod() {
    let nodes = [node("n1", "True"), node("n2", "True"), node("n3", "True")];
    let pods = [
        pod("p1", "n1", "ds-uid", None, "agent:v1", true),
        pod("p3", "n3", "ds-uid", None, "agent:v1", true),
    ];
    let by_node = pods_by_node("ds-uid", &pods);
    let found = candidates(&nodes, &by_node, None);
    let names: Vec<&str> = found.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["n1", "n3"]);
    assert!(found.iter().all(|c| c.namespace.is_empty() && c.current_image == "agent:v1"));
}

#[test]
fn a_daemonset_held_by_another_rollout_is_recognised() {
    let held = |by: &str| {
        BTreeMap::from([
            (SAVED_STRATEGY_ANNOTATION.to_string(), "{}".to_string()),
            (ROLLOUT_ANNOTATION.to_string(), by.to_string()),
        ])
    };
    assert_eq!(held_by_other(&held("ops/first"), "ops/second"), Some("ops/first"));
    assert_eq!(held_by_other(&held("ops/second"), "ops/second"), None);
    assert!(held_by(&held("ops/second"), "ops/second"));
    assert!(!held_by(&held("ops/first"), "ops/second"));
    // Changed once by a rollout that has handed it back since: not held.
    let released = BTreeMap::from([(ROLLOUT_ANNOTATION.to_string(), "ops/first".to_string())]);
    assert_eq!(held_by_other(&released, "ops/second"), None);
    assert!(!held_by(&released, "ops/first"));
}

#[test]
fn a_daemonset_handed_back_unfinished_gets_its_template_back_too() {
    let ds: DaemonSet = serde_json::from_value(json!({
        "metadata": {"name": "agent", "namespace": "ops"},
        "spec": {
            "selector": {"matchLabels": {"app": "agent"}},
            "updateStrategy": {"type": "RollingUpdate"},
            "template": {"metadata": {"labels": {"app": "agent"}}, "spec": {"containers": [{"name": "a", "image": "agent:v1"}]}}
        }
    }))
    .unwrap();
    let taken = take_control(&ds, None, "agent:v2", "uid/1", "ops/r").unwrap().unwrap();
    assert_eq!(strategy_type(taken.spec.update_strategy.as_ref()), "OnDelete");
    // Released after success: the strategy comes back, the new template stays.
    let released = release(&taken).unwrap();
    assert_eq!(strategy_type(released.spec.update_strategy.as_ref()), "RollingUpdate");
    assert_eq!(
        container_image(&released.spec.template.spec.as_ref().unwrap().containers, None),
        Some("agent:v2")
    );
    // Handed back unfinished: as it was before, template and strategy, and no longer held.
    let back = hand_back(&taken).unwrap();
    assert_eq!(back.spec.template, ds.spec.template);
    assert_eq!(strategy_type(back.spec.update_strategy.as_ref()), "RollingUpdate");
    assert!(!is_held(back.annotations()));
    assert_eq!(hand_back(&ds), None, "not held: nothing to hand back");
}

#[test]
fn a_rollback_after_success_takes_the_daemonset_back_with_the_template_it_found() {
    let original = daemonset();
    let taken = take_control(&original, None, "agent:v2", "uid/1", "ops/r").unwrap().unwrap();
    let succeeded = release(&taken).unwrap();
    assert!(!is_held(succeeded.annotations()), "handed back at success");

    let back = take_back(&succeeded, None, "agent:v1", "ops/r", "uid").unwrap().unwrap();
    assert!(held_by(back.annotations(), "ops/r"));
    assert_eq!(back.spec.template, original.spec.template, "the template as the rollout found it");
    assert_eq!(strategy_type(back.spec.update_strategy.as_ref()), "OnDelete", "pods go back node by node");
    // Replayed: held now, so nothing more; the rollback's end hands back the strategy it had.
    assert_eq!(take_back(&back, None, "agent:v1", "ops/r", "uid"), Ok(None));
    assert_eq!(restore_template(&back), None);
    let done = release(&back).unwrap();
    assert_eq!(done.spec.update_strategy, original.spec.update_strategy);
    assert_eq!(done.spec.template, original.spec.template);
    // A template someone else changed since (not stamped by this rollout) is not undone.
    assert_eq!(take_back(&succeeded, None, "agent:v1", "ops/r", "other-uid"), Ok(None));
    assert_eq!(take_back(&original, None, "agent:v1", "ops/r", "uid"), Ok(None));
}
