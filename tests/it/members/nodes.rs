//! Node rollouts across member clusters: in each member, a pool of kwok nodes of the test's own and the
//! DaemonSet `edge-agent` in a namespace opted in there.

use std::{collections::BTreeMap, time::Duration};

use fleetroll::{
    api::{BatchState, Phase},
    core::nodes::{SAVED_STRATEGY_ANNOTATION, SAVED_TEMPLATE_ANNOTATION},
};
use k8s_openapi::api::{apps::v1::DaemonSet, core::v1::Pod};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use super::support::{self, OPERATOR_ACCOUNT, Site, register, site, tidy, unique};
use testkit::{
    fleet::{NEXT_IMAGE, READY_IMAGE, phase, with_fleet},
    nodes::{self, DAEMONSET, POOL_LABEL, observe_pods, pod_image, pods_by_node, with_pool},
    operator::Operator,
    wait_for,
};

/// Pool nodes per member.
const NODES: usize = 3;

/// The DaemonSet of `site` is handed back as it was: RollingUpdate, no saved annotations left.
async fn handed_back(site: &Site) {
    let api: Api<DaemonSet> = Api::namespaced(site.admin.clone(), &site.ns);
    wait_for(&api, DAEMONSET, "the DaemonSet's updates handed back", Duration::from_secs(60), |d| {
        let strategy = d.spec.update_strategy.as_ref().and_then(|s| s.type_.as_deref());
        strategy == Some("RollingUpdate")
            && !d.annotations().contains_key(SAVED_STRATEGY_ANNOTATION)
            && !d.annotations().contains_key(SAVED_TEMPLATE_ANNOTATION)
    })
    .await;
}

/// The one pod of the DaemonSet on each pool node of `client`, with its image.
async fn pods(client: &Client, ns: &str) -> BTreeMap<String, Pod> {
    pods_by_node(client, ns)
        .await
        .into_iter()
        .map(|(node, mut pods)| {
            assert_eq!(pods.len(), 1, "{node}: {} pods of the DaemonSet", pods.len());
            (node, pods.remove(0))
        })
        .collect()
}

fn node_spec(team: &str, pool: &str) -> serde_json::Value {
    json!({
        "image": NEXT_IMAGE,
        "targets": {
            "kind": "Node", "daemonSet": DAEMONSET,
            "nodeSelector": {"matchLabels": {POOL_LABEL: pool}},
            "namespaceSelector": {"matchLabels": {"team": team}},
            "clusters": {"selector": {"matchExpressions": [{"key": "env", "operator": "Exists"}]}},
        },
        "strategy": {
            "batchSize": 2,
            "waves": [
                {"name": "canary", "clusterSelector": {"matchLabels": {"env": "canary"}}},
                {"name": "prod", "clusterSelector": {"matchLabels": {"env": "prod"}}},
            ],
        },
        "health": {"timeout": "60s"},
    })
}

#[tokio::test]
async fn a_node_rollout_across_two_members_replaces_each_pod_once_canary_cluster_first_and_rolls_back() {
    if !support::members_up() {
        return;
    }
    let _shared = support::FREEZE.read().await;
    with_fleet("member-nodes", 0, |fleet| async move {
        let team = unique("agents");
        let pool = team.clone();
        let sites = [
            site("member-1", &team, &team, 0, READY_IMAGE, true).await,
            site("member-2", &team, &team, 0, READY_IMAGE, true).await,
        ];
        let [one, two] = &sites;
        let (c1, c2) = (one.admin.clone(), two.admin.clone());
        with_pool(c1.clone(), pool.clone(), NODES, |names| async move {
            with_pool(c2.clone(), pool.clone(), NODES, |_| async move {
                for s in [one, two] {
                    nodes::daemonset(&s.admin, &s.ns, &pool, READY_IMAGE, NODES).await;
                }
                let before = [pods(&c1, &one.ns).await, pods(&c2, &two.ns).await];
                let logs = [observe_pods(&c1, &one.ns, NEXT_IMAGE), observe_pods(&c2, &two.ns, NEXT_IMAGE)];
                register(&fleet, &[one, two], OPERATOR_ACCOUNT).await;
                // The example manifest of this mode is one the API server accepts.
                let example = std::fs::read_to_string(testkit::cli::repo_path(
                    "manifests/examples/nodes-across-clusters.yaml",
                ))
                .unwrap()
                .replace("fleetroll-fleet", &fleet.ns);
                let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join(format!("target/test-logs/{}-nodes-example.yaml", fleet.ns));
                std::fs::write(&path, example).unwrap();
                testkit::cli::kubectl(&["apply", "--dry-run=server", "-f", &path.to_string_lossy()])
                    .await
                    .ok();
                let _op = Operator::start(&fleet.ns, &[], &[]);
                fleet.rollout("agents", node_spec(&team, &pool)).await;
                let fr = fleet
                    .wait_rollout("agents", "the node rollout to succeed", support::DEADLINE, |f| {
                        phase(f) == Phase::Succeeded
                    })
                    .await;

                // The canary cluster's nodes first, two per batch, a batch never spanning two clusters.
                let plan = fleet.plan(&fr).await;
                let batches: Vec<Vec<String>> =
                    plan.batches.iter().map(|b| b.iter().map(|t| t.key()).collect()).collect();
                let key = |c: &str, i: usize| format!("{c}/{}/{}", team, names[i]);
                assert_eq!(
                    batches,
                    [
                        vec![key("member-1", 0), key("member-1", 1)],
                        vec![key("member-1", 2)],
                        vec![key("member-2", 0), key("member-2", 1)],
                        vec![key("member-2", 2)],
                    ]
                );
                let s = fr.status.clone().unwrap();
                assert!(s.batches.iter().all(|b| b.state == BatchState::Succeeded), "{:?}", s.batches);
                assert_eq!((s.counts.total, s.counts.updated, s.counts.failed), (6, 6, 0));

                // Each node's pod replaced exactly once, in both members; each DaemonSet handed back.
                for ((site, before), (log, watch)) in [one, two].into_iter().zip(&before).zip(&logs) {
                    let after = pods(&site.admin, &site.ns).await;
                    watch.abort();
                    let log = log.lock().unwrap();
                    let new_pods = log.new_pods_by_node(NEXT_IMAGE);
                    for (node, pod) in &after {
                        let at = format!("{}/{node}", site.member.name);
                        assert_eq!(pod_image(pod), NEXT_IMAGE, "{at}");
                        assert_ne!(pod.uid(), before[node].uid(), "{at}: the old pod is still there");
                        assert_eq!(
                            new_pods.get(node).map(|s| s.len()),
                            Some(1),
                            "{at}: replaced more than once"
                        );
                    }
                    assert!(
                        log.deleted_with(NEXT_IMAGE).is_empty(),
                        "{}: a new pod was deleted",
                        site.member.name
                    );
                }
                for s in [one, two] {
                    handed_back(s).await;
                }

                // Rolled back across both: every node runs the image from before again.
                fleet.patch_spec("agents", json!({"rollback": true})).await;
                fleet
                    .wait_rollout("agents", "the rollback to finish", support::DEADLINE, |f| {
                        phase(f) == Phase::RolledBack
                    })
                    .await;
                for s in [one, two] {
                    let api: Api<Pod> = Api::namespaced(s.admin.clone(), &s.ns);
                    poll_images(&api, READY_IMAGE, &s.member.name).await;
                    handed_back(s).await;
                }
            })
            .await;
        })
        .await;
        tidy(&sites.iter().collect::<Vec<_>>()).await;
    })
    .await;
}

/// Waits (up to the deadline) until every pod of the DaemonSet runs `image` and none other is left.
async fn poll_images(api: &Api<Pod>, image: &str, member: &str) {
    let lp = kube::api::ListParams::default().labels(&format!("app={DAEMONSET}"));
    testkit::poll_until(&format!("{member}: every pod back on {image}"), support::DEADLINE, || async {
        let pods = api.list(&lp).await.map(|l| l.items).unwrap_or_default();
        pods.len() == NODES
            && pods.iter().all(|p| pod_image(p) == image && p.metadata.deletion_timestamp.is_none())
    })
    .await;
}
