use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use serde_json::json;

use super::*;

/// Wakes that go to `send`, of the rollouts given: `(namespace, name, kind it rolls, across members)`.
fn wakes(
    send: UnboundedSender<ObjectRef<FleetRollout>>,
    rollouts: &[(&str, &str, &str, bool)],
) -> MemberWakes {
    let (store, mut writer) = kube::runtime::reflector::store();
    for (ns, name, kind, across) in rollouts {
        let mut targets = json!({"kind": kind, "selector": {}});
        if *across {
            targets["clusters"] = json!({"selector": {}});
        }
        let fr: FleetRollout = serde_json::from_value(json!({"apiVersion": "fleetroll.dev/v1alpha1",
            "kind": "FleetRollout", "metadata": {"name": name, "namespace": ns},
            "spec": {"image": "web:v2", "targets": targets}}))
        .unwrap();
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(fr));
    }
    MemberWakes::new(send, store)
}

fn deployment(ns: &str, name: &str, rollout: &str, version: &str) -> Deployment {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns, "annotations": {ROLLOUT_ANNOTATION: rollout},
                     "resourceVersion": version},
    }))
    .unwrap()
}

#[tokio::test]
async fn the_watch_of_a_member_no_secret_names_ends_and_drops_its_cache() {
    let (members, _hub) = crate::edge::members::registry_tests::fleet(Vec::new());
    let (wake, _woken) = futures::channel::mpsc::unbounded();
    let watches = MemberWatches::new(members, wakes(wake, &[]));
    let cache = watches.cache("gone", TargetKind::Deployment).unwrap();
    let key = ("gone".to_string(), TargetKind::Deployment);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while watches.caches.lock().unwrap().contains_key(&key) {
        assert!(tokio::time::Instant::now() < deadline, "the watch of a member that is gone still runs");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(!cache.ready(), "a retired cache is never read as current");
}

/// The wakes of member `east`'s watch of Deployments.
fn east(to: &MemberWakes) -> Wake<'_> {
    Wake { to, cluster: "east", kind: TargetKind::Deployment }
}

#[tokio::test]
async fn a_member_cache_weighs_no_more_than_it_may_whatever_the_watch_sends() {
    // Workloads with as many labels as are kept, added without end: the watch fails before the cache
    // is past its weight, and changes and deletions are counted as such.
    let heavy = |name: &str| {
        let mut d = deployment("tenant", name, "fleet/across", "1");
        d.metadata.labels = Some((0..20).map(|i| (format!("k{i:02}"), "x".repeat(100))).collect());
        d
    };
    let one = workload::deployment_facts(&heavy("w0")).weight();
    assert!(workload::deployment_facts(&heavy("w0")).labels.is_some() && one > 4000, "{one}");
    let events = futures::stream::iter((0..).map(move |i| Ok(WatchEvent::Added(heavy(&format!("w{i}"))))));
    let (wake, _woken) = futures::channel::mpsc::unbounded();
    let (cache, wake) = (Cache::default(), wakes(wake, &[]));
    let err = follow(events, &cache, east(&wake), "fleet", workload::deployment_facts).await.unwrap_err();
    assert!(err.to_string().contains("past 64 MiB of facts in one member's cache"), "{err}");
    let held = cache.facts.read().unwrap();
    assert!(
        held.weight <= lists::MAX_FACTS_BYTES && held.all.len() + 1 >= lists::MAX_FACTS_BYTES / (one + 8),
        "{} {}",
        held.weight,
        held.all.len()
    );
    assert_eq!(held.weight, held.all.values().map(WorkloadFacts::weight).sum::<usize>());
    drop(held);
    // The same workload changed again and again weighs once; a deleted one not at all.
    let cache = Cache::default();
    for _ in 0..100 {
        cache.apply(workload::deployment_facts(&deployment("tenant", "web", "fleet/across", "2"))).unwrap();
    }
    let one = cache.facts.read().unwrap().weight;
    assert_eq!(one, cache.get("tenant", "web").unwrap().weight());
    cache.delete("tenant/web");
    assert_eq!(cache.facts.read().unwrap().weight, 0);
}

#[tokio::test]
async fn a_member_workload_wakes_only_a_rollout_across_members_of_its_kind_it_names() {
    let events = futures::stream::iter([
        Ok(WatchEvent::Added(deployment("tenant", "web", "fleet/across", "11"))),
        Ok(WatchEvent::Modified(deployment("tenant", "api", "tenant/victim", "12"))),
        Ok(WatchEvent::Deleted(deployment("tenant", "db", "kube-system/other", "13"))),
        Ok(WatchEvent::Added(deployment("tenant", "odd", "no-slash", "14"))),
        // Rollouts of the fleet namespace that read no member's Deployments, and one that does not exist.
        Ok(WatchEvent::Added(deployment("tenant", "a", "fleet/here", "15"))),
        Ok(WatchEvent::Added(deployment("tenant", "b", "fleet/sets", "16"))),
        Ok(WatchEvent::Added(deployment("tenant", "c", "fleet/none", "17"))),
        // The first one again, with nothing a decision reads changed but its resourceVersion.
        Ok(WatchEvent::Modified(deployment("tenant", "web", "fleet/across", "18"))),
    ]);
    let (send, mut woken) = futures::channel::mpsc::unbounded();
    let rollouts = [
        ("fleet", "across", "Deployment", true),
        ("tenant", "victim", "Deployment", true),
        ("fleet", "here", "Deployment", false),
        ("fleet", "sets", "StatefulSet", true),
    ];
    let (cache, wake) = (Cache::default(), wakes(send, &rollouts));
    let followed = follow(events, &cache, east(&wake), "fleet", workload::deployment_facts).await.unwrap();
    assert_eq!(followed.as_deref(), Some("18"), "the version of the last event");
    drop(wake);
    let woken: Vec<ObjectRef<FleetRollout>> = woken.by_ref().collect().await;
    assert_eq!(woken, [ObjectRef::new("across").within("fleet")], "once: the same facts again wake nothing");
}
