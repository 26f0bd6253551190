use super::*;

/// What the facts of one workload weigh at most (see [`WorkloadFacts::weight`]), about 15 KiB.
const MAX_WEIGHT: usize = std::mem::size_of::<WorkloadFacts>()
    + 253 // namespace and name, as the API server bounds them (253 for both: a namespace is a label)
    + 253
    + 24
    + ANNOTATION_KEPT
    + 24
    + 64 // the resourceVersion
    + LABELS_KEPT
    + CONTAINERS_KEPT * (24 + 253 + 24 + IMAGE_KEPT);

fn facts(status: RolloutStatus, generation: i64) -> WorkloadFacts {
    WorkloadFacts {
        namespace: "ns".into(),
        name: "web".into(),
        labels: Some(BTreeMap::new()),
        applied: None,
        containers: vec![("web".into(), Ok("web:v1".into())), ("sidecar".into(), Ok("proxy:v1".into()))],
        containers_cut: 0,
        generation,
        status,
        resource_version: Some("7".into()),
    }
}

fn settled(n: i32) -> RolloutStatus {
    RolloutStatus {
        observed_generation: 2,
        desired: n,
        current: n,
        updated: n,
        ready: n,
        available: n,
        revision_settled: true,
        ..Default::default()
    }
}

#[test]
fn a_fully_rolled_out_workload_is_ready() {
    assert_eq!(facts(settled(3), 2).readiness(), Readiness::Ready);
}

#[test]
fn an_unobserved_generation_is_not_ready_whatever_the_counts() {
    assert!(matches!(facts(settled(3), 3).readiness(), Readiness::NotReady(_)));
}

#[test]
fn old_replicas_or_unready_ones_keep_it_not_ready() {
    let mut s = settled(3);
    s.current = 4;
    assert!(matches!(facts(s, 2).readiness(), Readiness::NotReady(m) if m.contains("old replicas")));
    let mut s = settled(3);
    s.ready = 2;
    assert!(matches!(facts(s, 2).readiness(), Readiness::NotReady(_)));
    let mut s = settled(3);
    s.revision_settled = false;
    assert!(matches!(facts(s, 2).readiness(), Readiness::NotReady(_)));
}

#[test]
fn a_deployment_past_its_progress_deadline_has_failed() {
    let mut s = settled(3);
    s.ready = 0;
    s.deadline_exceeded = true;
    assert!(matches!(facts(s, 2).readiness(), Readiness::Failed { reason: "ProgressDeadlineExceeded", .. }));
}

#[test]
fn zero_replicas_is_trivially_ready() {
    assert_eq!(facts(settled(0), 2).readiness(), Readiness::Ready);
}

#[test]
fn the_container_is_named_or_the_only_one() {
    let f = facts(settled(1), 2);
    assert_eq!(f.container_image(Some("sidecar")), Ok(("sidecar", "proxy:v1")));
    assert!(matches!(f.container_image(None), Err(ContainerError::Ambiguous { .. })));
    let err = f.container_image(Some("nope")).unwrap_err();
    assert_eq!(err.to_string(), "ns/web has no container named \"nope\" (it has: web, sidecar)");
    let mut single = facts(settled(1), 2);
    single.containers.truncate(1);
    assert_eq!(single.container_image(None), Ok(("web", "web:v1")));
}

#[test]
fn the_patch_touches_only_the_image_and_our_annotations() {
    let p = image_patch(TargetKind::StatefulSet, &facts(settled(1), 2), "db", "db:v2", "uid/1/0", "fleet/r");
    assert_eq!(p["kind"], "StatefulSet");
    assert_eq!((&p["metadata"]["name"], &p["metadata"]["namespace"]), (&json!("web"), &json!("ns")));
    assert_eq!(p["metadata"]["resourceVersion"], "7", "applied only to the workload as it was judged");
    assert_eq!(p["metadata"]["annotations"][APPLIED_ANNOTATION], "uid/1/0");
    assert_eq!(p["spec"]["template"]["spec"]["containers"], json!([{"name": "db", "image": "db:v2"}]));
    assert_eq!(p["spec"].as_object().map(|o| o.len()), Some(1));
}

#[test]
fn what_a_tenant_writes_into_a_workload_cannot_make_its_facts_heavy() {
    let huge = "x".repeat(900 * 1024);
    let containers: Vec<_> = (0..40)
        .map(|i| json!({"name": format!("c{i}"), "image": format!("registry.example/{huge}{i}")}))
        .collect();
    let labels: serde_json::Map<String, Value> =
        (0..2000).map(|i| (format!("label-{i}"), json!("v".repeat(63)))).collect();
    let d: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "w".repeat(253), "namespace": "n".repeat(63), "resourceVersion": "7",
            "labels": labels,
            "annotations": {APPLIED_ANNOTATION: huge, ROLLOUT_ANNOTATION: huge,
                crate::core::nodes::SAVED_STRATEGY_ANNOTATION: huge, "other": huge}},
        "spec": {"selector": {}, "template": {"spec": {"containers": containers}}},
    }))
    .unwrap();
    let f = &deployment_facts(&d);
    assert!(f.weight() <= MAX_WEIGHT, "{} > {}", f.weight(), MAX_WEIGHT);
    const { assert!(MAX_WEIGHT < 20 * 1024) };
    assert_eq!((f.labels.as_ref(), f.applied.as_ref()), (None, None));
    assert_eq!((f.containers.len(), f.containers_cut), (CONTAINERS_KEPT, 40 - CONTAINERS_KEPT));
    let err = f.container_image(Some("c3")).unwrap_err();
    assert!(matches!(err, ContainerError::ImageTooLong { bytes, .. } if bytes > 900 * 1024), "{err}");
    assert!(!err.to_string().contains(&huge[..64]), "the message does not carry the image: {err}");
    // Past the containers kept, the container is not there to be rolled; and none is "the only one".
    assert!(matches!(f.container_image(Some("c30")), Err(ContainerError::NotFound { .. })));
    assert!(f.container_image(Some("c30")).unwrap_err().to_string().contains("and 24 more"));
}
