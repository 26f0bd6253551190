use k8s_openapi::api::apps::v1::Deployment;
use serde_json::json;

use super::*;
use crate::core::workload::deployment_facts;

#[test]
fn the_cache_keeps_a_hold_but_no_annotation_value_too_long_to_be_ours() {
    let huge = "x".repeat(900 * 1024);
    let d: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "ns", "resourceVersion": "7",
            "annotations": {ROLLOUT_ANNOTATION: huge, SAVED_STRATEGY_ANNOTATION: huge, "other": huge}},
        "spec": {"selector": {}, "template": {"spec": {"containers": [{"name": "web", "image": "web:v1"}]}}},
    }))
    .unwrap();
    let cached = Cached::new(&d, deployment_facts);
    assert_eq!(
        cached.annotations,
        BTreeMap::from([(SAVED_STRATEGY_ANNOTATION.to_string(), String::new())]),
        "the hold is seen, the value too long to be ours is not kept"
    );
    assert_eq!(cached.rollout(), None);
}

#[test]
fn the_cache_keeps_the_facts_and_our_annotations_only() {
    let d: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "ns", "resourceVersion": "7", "generation": 2,
            "labels": {"app": "web"},
            "annotations": {ROLLOUT_ANNOTATION: "fleet/r1", "kubectl.kubernetes.io/last-applied-configuration": "{}"}},
        "spec": {"selector": {}, "template": {"spec": {"containers": [{"name": "web", "image": "web:v1"}]}}},
    }))
    .unwrap();
    let cached = Cached::new(&d, deployment_facts);
    assert_eq!(cached.facts, deployment_facts(&d));
    assert_eq!(cached.annotations.keys().collect::<Vec<_>>(), [ROLLOUT_ANNOTATION]);
    assert_eq!(cached.rollout(), Some(("fleet", "r1")));
    let key = cached.to_object_ref(());
    assert_eq!((key.name.as_str(), key.namespace.as_deref()), ("web", Some("ns")));
    assert_eq!(key.extra.resource_version.as_deref(), Some("7"));
    assert_eq!(<Cached<Deployment> as Lookup>::plural(&()), "deployments");
}

#[test]
fn only_a_change_a_decision_reads_makes_a_workload_decide_differently() {
    let deployment = |rv: &str, note: &str, image: &str| -> Deployment {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "ns", "resourceVersion": rv, "generation": 2,
                "annotations": {ROLLOUT_ANNOTATION: "fleet/r1", "tenant.example/note": note}},
            "spec": {"selector": {}, "template": {"spec": {"containers": [{"name": "web", "image": image}]}}},
        }))
        .unwrap()
    };
    let known = Cached::new(&deployment("7", "a", "web:v1"), deployment_facts);
    let noted = Cached::new(&deployment("8", "b", "web:v1"), deployment_facts);
    assert!(known.decides_as(&noted), "another annotation and a new resourceVersion change no decision");
    let changed = Cached::new(&deployment("9", "b", "web:v2"), deployment_facts);
    assert!(!known.decides_as(&changed), "a new image does");
    let mut ready = Cached::new(&deployment("10", "a", "web:v1"), deployment_facts);
    ready.facts.status.ready = 1;
    assert!(!known.decides_as(&ready), "so does the workload's status");
}
