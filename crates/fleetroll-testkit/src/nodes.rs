//! Node-scoped rollouts on kwok: a pool of fake nodes of the test's own, a DaemonSet on it, and a watch that
//! records every pod of the DaemonSet the cluster ever shows.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::{
    apps::v1::DaemonSet,
    core::v1::{Node, Pod},
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, PostParams},
    runtime::{WatchStreamExt, watcher},
};
use serde_json::json;

use super::wait_for;

pub const POOL_LABEL: &str = "fleetroll.dev/test-pool";
/// Pool nodes carry this taint so that nothing but the test's DaemonSet lands on them.
pub const POOL_TAINT: &str = "fleetroll.dev/test-pool";
pub const DAEMONSET: &str = "edge-agent";

/// `n` kwok nodes `<pool>-nNN`, labelled and tainted for the pool `pool`; deleted after `body`, whether it
/// passed or panicked.
pub async fn with_pool<F, Fut>(client: Client, pool: String, n: usize, body: F)
where
    F: FnOnce(Vec<String>) -> Fut,
    Fut: Future<Output = ()>,
{
    let names: Vec<String> = (0..n).map(|i| format!("{pool}-n{i:02}")).collect();
    for name in &names {
        add_node(&client, &pool, name, &[]).await;
    }
    let outcome = std::panic::AssertUnwindSafe(body(names.clone())).catch_unwind().await;
    let api: Api<Node> = Api::all(client.clone());
    let _ = api
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels(&format!("{POOL_LABEL}={pool}")),
        )
        .await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

/// Creates one pool node (with extra taints `(key, effect)`) and waits until kwok reports it Ready.
pub async fn add_node(client: &Client, pool: &str, name: &str, taints: &[(&str, &str)]) {
    let mut all_taints = vec![json!({"key": POOL_TAINT, "value": pool, "effect": "NoSchedule"})];
    all_taints.extend(taints.iter().map(|(k, e)| json!({"key": k, "value": "yes", "effect": e})));
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {"kubernetes.io/hostname": name, "type": "kwok", POOL_LABEL: pool},
        },
        "spec": {"taints": all_taints},
        "status": {"allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110"},
                   "capacity": {"cpu": "32", "memory": "256Gi", "pods": "110"}},
    }))
    .expect("a Node");
    let api: Api<Node> = Api::all(client.clone());
    api.create(&PostParams::default(), &node).await.expect("create a node");
    wait_for(&api, name, "the node to be Ready", Duration::from_secs(60), |n| {
        fleetroll::core::nodes::node_ready(n).is_ok()
    })
    .await;
}

/// The DaemonSet `edge-agent` on the pool's nodes (it tolerates the pool taint), RollingUpdate, and waits
/// until its pod is Ready on each of `nodes`.
pub async fn daemonset(client: &Client, ns: &str, pool: &str, image: &str, nodes: usize) -> DaemonSet {
    let ds: DaemonSet = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": DAEMONSET, "labels": {"app": DAEMONSET}},
        "spec": {
            "selector": {"matchLabels": {"app": DAEMONSET}},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
            "template": {
                "metadata": {"labels": {"app": DAEMONSET}},
                "spec": {
                    "nodeSelector": {POOL_LABEL: pool},
                    "tolerations": [{"key": POOL_TAINT, "operator": "Equal", "value": pool, "effect": "NoSchedule"}],
                    "containers": [{"name": "agent", "image": image}],
                },
            },
        },
    }))
    .expect("a DaemonSet");
    let api: Api<DaemonSet> = Api::namespaced(client.clone(), ns);
    api.create(&PostParams::default(), &ds).await.expect("create the DaemonSet");
    let want = i32::try_from(nodes).unwrap();
    wait_for(&api, DAEMONSET, "a Ready pod on every pool node", Duration::from_secs(120), |d| {
        d.status.as_ref().is_some_and(|s| s.desired_number_scheduled == want && s.number_ready == want)
    })
    .await
}

/// Every pod of the DaemonSet seen so far, by uid: (node, image, Ready, deleted or terminating).
#[derive(Clone, Debug, Default)]
pub struct SeenPod {
    pub node: String,
    pub image: String,
    pub ready: bool,
    pub gone: bool,
}

#[derive(Default)]
pub struct PodLog {
    pub pods: HashMap<String, SeenPod>,
    /// Most nodes at once without a Ready pod of the new image while one of another image was gone.
    pub max_in_flight: usize,
}

impl PodLog {
    /// Uids of pods with `image`, per node.
    pub fn new_pods_by_node(&self, image: &str) -> BTreeMap<String, HashSet<String>> {
        let mut out: BTreeMap<String, HashSet<String>> = BTreeMap::new();
        for (uid, p) in &self.pods {
            if p.image == image {
                out.entry(p.node.clone()).or_default().insert(uid.clone());
            }
        }
        out
    }

    pub fn deleted_with(&self, image: &str) -> Vec<String> {
        self.pods.iter().filter(|(_, p)| p.image == image && p.gone).map(|(u, _)| u.clone()).collect()
    }
}

/// Watches the DaemonSet's pods in `ns`, recording each, and how many nodes were in flight at most (their
/// old pod gone, no Ready pod of `image` yet).
pub fn observe_pods(
    client: &Client,
    ns: &str,
    image: &'static str,
) -> (Arc<Mutex<PodLog>>, tokio::task::JoinHandle<()>) {
    let log = Arc::new(Mutex::new(PodLog::default()));
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let out = log.clone();
    let task = tokio::spawn(async move {
        let mut events = watcher(api, watcher::Config::default().labels(&format!("app={DAEMONSET}")))
            .default_backoff()
            .filter_map(|e| async move { e.ok() })
            .boxed();
        while let Some(event) = events.next().await {
            let (pods, deleted): (Vec<Pod>, bool) = match event {
                watcher::Event::Apply(p) | watcher::Event::InitApply(p) => (vec![p], false),
                watcher::Event::Delete(p) => (vec![p], true),
                _ => continue,
            };
            let mut log = out.lock().unwrap();
            for p in pods {
                let seen = SeenPod {
                    node: p.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default(),
                    image: p
                        .spec
                        .as_ref()
                        .and_then(|s| s.containers.first())
                        .and_then(|c| c.image.clone())
                        .unwrap_or_default(),
                    ready: p
                        .status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")),
                    gone: deleted || p.metadata.deletion_timestamp.is_some(),
                };
                if seen.node.is_empty() {
                    continue;
                }
                let uid = p.uid().unwrap_or_default();
                let entry = log.pods.entry(uid).or_default();
                let was_gone = entry.gone;
                *entry = SeenPod { gone: seen.gone || was_gone, ..seen };
            }
            // In flight: nodes with a gone pod of another image and no Ready pod of `image`.
            let mut nodes: HashMap<&str, (bool, bool)> = HashMap::new();
            for p in log.pods.values() {
                let e = nodes.entry(p.node.as_str()).or_default();
                if p.image != image && p.gone {
                    e.0 = true;
                }
                if p.image == image && p.ready && !p.gone {
                    e.1 = true;
                }
            }
            let in_flight = nodes.values().filter(|(old_gone, new_ready)| *old_gone && !*new_ready).count();
            log.max_in_flight = log.max_in_flight.max(in_flight);
        }
    });
    (log, task)
}

/// The DaemonSet's pods now, by node.
pub async fn pods_by_node(client: &Client, ns: &str) -> BTreeMap<String, Vec<Pod>> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let mut out: BTreeMap<String, Vec<Pod>> = BTreeMap::new();
    for p in
        api.list(&ListParams::default().labels(&format!("app={DAEMONSET}"))).await.expect("list pods").items
    {
        let node = p.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
        out.entry(node).or_default().push(p);
    }
    out
}

pub fn pod_image(p: &Pod) -> String {
    p.spec.as_ref().and_then(|s| s.containers.first()).and_then(|c| c.image.clone()).unwrap_or_default()
}
