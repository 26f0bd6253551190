//! Node-scoped rollouts (`targets.kind: Node`) on kwok nodes: a DaemonSet's pod replaced node by node, in
//! batches of nodes, each node's pod exactly once per revision, also across SIGKILLs of the operator; a node
//! that never gets a Ready pod triggers the failure policy (here: roll back); a node that joins mid-rollout
//! is reported and left to the DaemonSet's own update strategy, handed back afterwards.

use std::time::Duration;

use fleetroll::{
    api::{APPLIED_ANNOTATION, BatchState, Phase},
    core::nodes::{SAVED_STRATEGY_ANNOTATION, SAVED_TEMPLATE_ANNOTATION},
};
use k8s_openapi::api::apps::v1::DaemonSet;
use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams},
};
use serde_json::json;
use testkit::{
    fleet::{NEXT_IMAGE, READY_IMAGE, phase, with_fleet},
    nodes::{self, DAEMONSET, POOL_LABEL, observe_pods, pod_image, pods_by_node, with_pool},
    operator::Operator,
    wait_for,
};

fn node_rollout(pool: &str, batch: u32, extra: serde_json::Value) -> serde_json::Value {
    let mut spec = json!({
        "image": NEXT_IMAGE,
        "targets": {"kind": "Node", "daemonSet": DAEMONSET, "nodeSelector": {"matchLabels": {POOL_LABEL: pool}}},
        "strategy": {"batchSize": batch},
        "health": {"timeout": "60s"},
    });
    for (k, v) in extra.as_object().unwrap() {
        spec[k] = v.clone();
    }
    spec
}

/// The DaemonSet is handed back as it was: RollingUpdate, no saved annotations left.
async fn assert_handed_back(api: &Api<DaemonSet>) -> DaemonSet {
    wait_for(api, DAEMONSET, "the DaemonSet's updates handed back", Duration::from_secs(30), |d| {
        let strategy = d.spec.update_strategy.as_ref().and_then(|s| s.type_.as_deref());
        strategy == Some("RollingUpdate")
            && !d.annotations().contains_key(SAVED_STRATEGY_ANNOTATION)
            && !d.annotations().contains_key(SAVED_TEMPLATE_ANNOTATION)
    })
    .await
}

#[tokio::test]
async fn forty_nodes_in_batches_of_ten_each_pod_replaced_exactly_once() {
    with_fleet("nodes", 0, |fleet| async move {
        let client = fleet.client.clone();
        let pool = fleet.ns.clone();
        with_pool(client.clone(), pool.clone(), 40, |names| async move {
            nodes::daemonset(&client, &fleet.ns, &pool, READY_IMAGE, 40).await;
            let before = pods_by_node(&client, &fleet.ns).await;
            let (log, watch) = observe_pods(&client, &fleet.ns, NEXT_IMAGE);
            let _op = Operator::start(&fleet.ns, &[], &[]);
            fleet.rollout("agents", node_rollout(&pool, 10, json!({}))).await;
            let fr = fleet
                .wait_rollout("agents", "the node rollout to succeed", Duration::from_secs(240), |f| {
                    phase(f) == Phase::Succeeded
                })
                .await;
            let s = fr.status.clone().unwrap();
            assert_eq!(
                (s.counts.total, s.counts.updated, s.counts.healthy, s.counts.failed),
                (40, 40, 40, 0)
            );
            assert_eq!(s.batches.len(), 4);
            assert!(
                s.batches.iter().all(|b| b.state == BatchState::Succeeded && b.size == 10),
                "{:?}",
                s.batches
            );
            // The plan: the pool's nodes in name order, ten per batch.
            let plan = fleet.plan(&fr).await;
            let planned: Vec<String> = plan.batches.iter().flatten().map(|t| t.name.clone()).collect();
            assert_eq!(planned, names);

            let ds_api: Api<DaemonSet> = Api::namespaced(client.clone(), &fleet.ns);
            let ds = assert_handed_back(&ds_api).await;
            let uid = fr.uid().unwrap();
            let tpl_key =
                ds.spec.template.metadata.as_ref().and_then(|m| m.annotations.clone()).unwrap_or_default();
            assert_eq!(tpl_key.get(APPLIED_ANNOTATION), Some(&format!("{uid}/1")));

            let after = pods_by_node(&client, &fleet.ns).await;
            watch.abort();
            let log = log.lock().unwrap();
            let new_pods = log.new_pods_by_node(NEXT_IMAGE);
            for node in &names {
                let pods = &after[node];
                assert_eq!(pods.len(), 1, "{node}: {} pods", pods.len());
                assert_eq!(pod_image(&pods[0]), NEXT_IMAGE, "{node}");
                assert_ne!(pods[0].uid(), before[node][0].uid(), "{node}: the old pod is still there");
                assert_eq!(new_pods.get(node).map(|s| s.len()), Some(1), "{node}: replaced more than once");
            }
            assert!(
                log.deleted_with(NEXT_IMAGE).is_empty(),
                "a new pod was deleted: {:?}",
                log.deleted_with(NEXT_IMAGE)
            );
            assert!(log.max_in_flight <= 10, "{} nodes in flight with batches of 10", log.max_in_flight);
            assert!(log.max_in_flight >= 1, "no node was ever seen in flight: the observation is broken");
        })
        .await;
    })
    .await;
}

#[tokio::test]
async fn sigkills_of_the_operator_never_replace_a_pod_twice() {
    let kills = 20;
    with_fleet("nodes-crash", 0, |fleet| async move {
        let client = fleet.client.clone();
        let pool = fleet.ns.clone();
        with_pool(client.clone(), pool.clone(), 60, |names| async move {
            nodes::daemonset(&client, &fleet.ns, &pool, READY_IMAGE, 60).await;
            let (log, watch) = observe_pods(&client, &fleet.ns, NEXT_IMAGE);
            fleet.rollout("crashy", node_rollout(&pool, 2, json!({}))).await;
            let identity = ["--identity", "node-crash-operator"];
            let points = [
                fleetroll::failpoint::AFTER_INTENT,
                fleetroll::failpoint::BETWEEN_PATCHES,
                fleetroll::failpoint::AFTER_APPLY,
            ];
            let mut done = 0;
            while done < kills {
                let point = points[done % points.len()];
                let mut op =
                    Operator::start(&fleet.ns, &identity, &[("FLEETROLL_FAILPOINT", &format!("{point}:1"))]);
                if !op.wait_for_line(&format!("FAILPOINT {point} reached"), Duration::from_secs(60)).await {
                    let fr = fleet.rollouts().get("crashy").await.unwrap();
                    panic!(
                        "failpoint {point} not reached after {done} kills ({:?}); see {}",
                        phase(&fr),
                        op.log.display()
                    );
                }
                op.kill();
                done += 1;
            }
            let _op = Operator::start(&fleet.ns, &identity, &[]);
            let fr = fleet
                .wait_rollout(
                    "crashy",
                    "the rollout to succeed after the kills",
                    Duration::from_secs(300),
                    |f| phase(f) == Phase::Succeeded,
                )
                .await;
            let s = fr.status.clone().unwrap();
            assert_eq!(
                (s.counts.total, s.counts.updated, s.counts.healthy, s.counts.failed),
                (60, 60, 60, 0)
            );
            assert_handed_back(&Api::namespaced(client.clone(), &fleet.ns)).await;
            let after = pods_by_node(&client, &fleet.ns).await;
            watch.abort();
            let log = log.lock().unwrap();
            let new_pods = log.new_pods_by_node(NEXT_IMAGE);
            for node in &names {
                assert_eq!(after[node].len(), 1);
                assert_eq!(pod_image(&after[node][0]), NEXT_IMAGE, "{node}");
                assert_eq!(new_pods.get(node).map(|s| s.len()), Some(1), "{node}: replaced more than once");
            }
            assert!(log.deleted_with(NEXT_IMAGE).is_empty(), "a new pod was deleted after {kills} kills");
            assert!(log.max_in_flight <= 2, "{} nodes in flight with batches of 2", log.max_in_flight);
        })
        .await;
    })
    .await;
}

#[tokio::test]
async fn a_node_that_never_gets_a_ready_pod_triggers_the_failure_policy() {
    with_fleet("nodes-fail", 0, |fleet| async move {
        let client = fleet.client.clone();
        let pool = fleet.ns.clone();
        with_pool(client.clone(), pool.clone(), 4, |names| async move {
            let ds_api: Api<DaemonSet> = Api::namespaced(client.clone(), &fleet.ns);
            let original = nodes::daemonset(&client, &fleet.ns, &pool, READY_IMAGE, 4).await;
            // The third node refuses new pods of the DaemonSet (a taint it does not tolerate); the pod it
            // runs now stays until fleetroll replaces it, and then no new one can come.
            let broken = &names[2];
            let nodes_api: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
            let mut node = nodes_api.get(broken).await.unwrap();
            node.spec.as_mut().unwrap().taints.as_mut().unwrap().push(
                serde_json::from_value(json!({"key": "fleetroll.dev/test-broken", "value": "yes", "effect": "NoSchedule"})).unwrap(),
            );
            nodes_api.replace(broken, &Default::default(), &node).await.unwrap();
            let before = pods_by_node(&client, &fleet.ns).await;
            let _op = Operator::start(&fleet.ns, &[], &[]);
            fleet
                .rollout(
                    "agents",
                    node_rollout(&pool, 1, json!({"health": {"timeout": "5s"}, "strategy": {"batchSize": 1, "onFailure": "Rollback"}})),
                )
                .await;
            let fr = fleet
                .wait_rollout("agents", "the rollout to roll back", Duration::from_secs(180), |f| {
                    phase(f) == Phase::RolledBack
                })
                .await;
            let s = fr.status.clone().unwrap();
            assert_eq!((s.counts.updated, s.counts.healthy, s.counts.failed), (3, 2, 1), "{s:?}");
            assert_eq!(s.failures.len(), 1);
            assert_eq!(&s.failures[0].name, broken);
            assert!(s.failures[0].message.contains("no pod of the DaemonSet"), "{}", s.failures[0].message);
            let rb = s.rollback.clone().unwrap();
            assert_eq!((rb.restored, rb.skipped), (3, 0), "{rb:?}");

            // The template is the one from before, and the DaemonSet is handed back.
            let ds = assert_handed_back(&ds_api).await;
            assert_eq!(ds.spec.template, original.spec.template);
            // Nodes 1 and 2 run a fresh pod of the old image; node 4 was never touched.
            for node in &names[..2] {
                let pods = wait_for_pod(&client, &fleet.ns, node, READY_IMAGE).await;
                assert_ne!(pods.uid(), before[node][0].uid(), "{node} was not replaced");
            }
            let after = pods_by_node(&client, &fleet.ns).await;
            assert_eq!(after[&names[3]][0].uid(), before[&names[3]][0].uid(), "the fourth node was touched");
            assert!(!after.contains_key(broken) || after[broken].iter().all(|p| pod_image(p) == READY_IMAGE));
        })
        .await;
    })
    .await;
}

/// Waits until the DaemonSet's only pod on `node` runs `image` and is Ready.
async fn wait_for_pod(
    client: &kube::Client,
    ns: &str,
    node: &str,
    image: &str,
) -> k8s_openapi::api::core::v1::Pod {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let api: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), ns);
    let mut stream = Box::pin(kube::runtime::watcher(
        api,
        kube::runtime::watcher::Config::default().labels(&format!("app={DAEMONSET}")),
    ));
    use futures::StreamExt;
    loop {
        let pods = pods_by_node(client, ns).await;
        if let Some([p]) = pods.get(node).map(Vec::as_slice) {
            let ready = p
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            if pod_image(p) == image && ready {
                return p.clone();
            }
        }
        match tokio::time::timeout_at(deadline, stream.next()).await {
            Ok(Some(_)) => {}
            _ => panic!(
                "no Ready pod of {image} on {node} in time: {:?}",
                pods.get(node).map(|v| v.iter().map(pod_image).collect::<Vec<_>>())
            ),
        }
    }
}

#[tokio::test]
async fn a_node_that_joins_mid_rollout_is_reported_and_left_to_the_daemonset() {
    with_fleet("nodes-join", 0, |fleet| async move {
        let client = fleet.client.clone();
        let pool = fleet.ns.clone();
        with_pool(client.clone(), pool.clone(), 3, |_names| async move {
            nodes::daemonset(&client, &fleet.ns, &pool, READY_IMAGE, 3).await;
            let _op = Operator::start(&fleet.ns, &[], &[]);
            fleet
                .rollout(
                    "agents",
                    node_rollout(&pool, 1, json!({"strategy": {"batchSize": 1, "approval": "FirstBatch"}})),
                )
                .await;
            // The plan is frozen; the first batch waits for an approval. Now a node joins the pool.
            let fr = fleet
                .wait_rollout(
                    "agents",
                    "the first batch to wait for approval",
                    Duration::from_secs(60),
                    |f| phase(f) == Phase::WaitingForApproval,
                )
                .await;
            let plan_hash = fr.status.clone().unwrap().plan.unwrap().hash;
            let late = format!("{pool}-late");
            nodes::add_node(&client, &pool, &late, &[]).await;
            wait_for_pod(&client, &fleet.ns, &late, READY_IMAGE).await;
            {
                fleet.approve("agents", &[0], &plan_hash).await;
            }
            let fr = fleet
                .wait_rollout("agents", "the rollout to succeed", Duration::from_secs(120), |f| {
                    phase(f) == Phase::Succeeded
                })
                .await;
            let s = fr.status.clone().unwrap();
            assert_eq!(s.counts.total, 3, "the late node was added to the frozen plan");
            let unplanned = s.unplanned.clone().expect("the late node is reported");
            assert_eq!((unplanned.count, unplanned.sample.clone()), (1, vec![late.clone()]));
            // Handed back to RollingUpdate, the DaemonSet brings the late node to the new image itself.
            assert_handed_back(&Api::namespaced(client.clone(), &fleet.ns)).await;
            wait_for_pod(&client, &fleet.ns, &late, NEXT_IMAGE).await;
        })
        .await;
    })
    .await;
}

#[tokio::test]
async fn a_not_ready_node_is_a_failure_not_a_hang_and_its_pod_is_left_alone() {
    with_fleet("nodes-notready", 0, |fleet| async move {
        let client = fleet.client.clone();
        let pool = fleet.ns.clone();
        with_pool(client.clone(), pool.clone(), 3, |names| async move {
            nodes::daemonset(&client, &fleet.ns, &pool, READY_IMAGE, 3).await;
            let before = pods_by_node(&client, &fleet.ns).await;
            // The second node goes NotReady (kwok leaves a node with this label as it is told).
            let sick = &names[1];
            let node_api: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
            let label = json!({"metadata": {"labels": {"fleetroll.dev/node-unready": "true"}}});
            node_api.patch(sick, &PatchParams::default(), &Patch::Merge(&label)).await.unwrap();
            let status = json!({"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "TestNotReady",
                "message": "made NotReady by the test", "lastHeartbeatTime": null, "lastTransitionTime": null}]}});
            node_api.patch_status(sick, &PatchParams::default(), &Patch::Strategic(&status)).await.unwrap();
            wait_for(&node_api, sick, "the node to be NotReady", Duration::from_secs(30), |n| {
                fleetroll::core::nodes::node_ready(n).is_err()
            })
            .await;

            let _op = Operator::start(&fleet.ns, &[], &[]);
            // The default health timeout (10m) is far beyond the wait below: only an immediate failure passes.
            fleet
                .rollout("agents", node_rollout(&pool, 1, json!({"health": {"timeout": "10m"}, "strategy": {"batchSize": 1}})))
                .await;
            let fr = fleet
                .wait_rollout("agents", "the failure budget to pause the rollout", Duration::from_secs(60), |f| {
                    phase(f) == Phase::Paused
                })
                .await;
            let s = fr.status.clone().unwrap();
            assert_eq!(s.reason.as_deref(), Some("FailureBudgetExceeded"));
            assert_eq!((s.counts.updated, s.counts.healthy, s.counts.failed), (2, 1, 1), "{s:?}");
            assert_eq!(&s.failures[0].name, sick);
            assert_eq!(s.failures[0].reason, "NodeNotReady");
            let after = pods_by_node(&client, &fleet.ns).await;
            assert_eq!(after[sick][0].uid(), before[sick][0].uid(), "the pod on the NotReady node was deleted");
            assert_eq!(after[&names[2]][0].uid(), before[&names[2]][0].uid(), "a node after the pause was touched");
            assert_ne!(after[&names[0]][0].uid(), before[&names[0]][0].uid());
        })
        .await;
    })
    .await;
}

#[tokio::test]
async fn an_abort_stops_at_once_and_keeps_the_daemonset_held() {
    with_fleet("nodes-abort", 0, |fleet| async move {
        let client = fleet.client.clone();
        let pool = fleet.ns.clone();
        with_pool(client.clone(), pool.clone(), 3, |names| async move {
            nodes::daemonset(&client, &fleet.ns, &pool, READY_IMAGE, 3).await;
            let before = pods_by_node(&client, &fleet.ns).await;
            let _op = Operator::start(&fleet.ns, &[], &[]);
            let spec = json!({"strategy": {"batchSize": 1, "approval": "EveryBatch"}});
            fleet.rollout("agents", node_rollout(&pool, 1, spec)).await;
            let waiting = |batch: u32| {
                move |f: &fleetroll::api::FleetRollout| {
                    f.status
                        .as_ref()
                        .and_then(|s| s.pending_approval.as_ref())
                        .is_some_and(|p| p.batch == batch)
                }
            };
            let fr = fleet
                .wait_rollout("agents", "batch 1 to wait for approval", Duration::from_secs(60), waiting(0))
                .await;
            let hash = fr.status.unwrap().plan.unwrap().hash;
            {
                fleet.approve("agents", &[0], &hash).await;
            }
            fleet
                .wait_rollout("agents", "batch 2 to wait for approval", Duration::from_secs(60), waiting(1))
                .await;
            fleet.patch_spec("agents", json!({"abort": true})).await;
            let fr = fleet
                .wait_rollout("agents", "the rollout to be aborted", Duration::from_secs(60), |f| {
                    phase(f) == Phase::Aborted
                })
                .await;
            assert_eq!(fr.status.unwrap().counts.updated, 1);
            // Held: OnDelete, with what to restore saved, so nothing changes behind the stopped rollout.
            let ds: DaemonSet = Api::namespaced(client.clone(), &fleet.ns).get(DAEMONSET).await.unwrap();
            let strategy = ds.spec.update_strategy.as_ref().and_then(|s| s.type_.as_deref());
            assert_eq!(strategy, Some("OnDelete"));
            assert!(ds.annotations().contains_key(SAVED_STRATEGY_ANNOTATION));
            let after = pods_by_node(&client, &fleet.ns).await;
            assert_ne!(after[&names[0]][0].uid(), before[&names[0]][0].uid());
            for node in &names[1..] {
                assert_eq!(after[node][0].uid(), before[node][0].uid(), "{node} changed after the abort");
            }
        })
        .await;
    })
    .await;
}
